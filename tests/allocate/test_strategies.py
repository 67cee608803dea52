"""Allocation strategies: RocketMQ 4.9.7 results on known inputs, and properties (hypothesis)."""
import hashlib
import logging
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq_core.errors import IllegalArgumentError
from rmq_core.message import MessageQueue
from rmq_core.plugins import available, get_allocate_strategy
from rmq_plugins.allocate.strategies import (
    AllocateMachineRoomNearby,
    AllocateMessageQueueAveragely,
    AllocateMessageQueueByMachineRoom,
    AllocateMessageQueueConsistentHash,
    MachineRoomResolver,
    java_queue_string,
    java_sorted_ids,
    md5_hash,
)

GROUP = "GID_test"


def queues(n, topic="T", broker="broker-a"):
    return [MessageQueue(topic, broker, i) for i in range(n)]


def full_assignment(strategy, mqs, cids):
    """What every consumer computes for itself, with the same inputs: {queue: [owners]}."""
    owners = {}
    for cid in cids:
        for mq in strategy.allocate(GROUP, cid, mqs, cids):
            owners.setdefault(mq, []).append(cid)
    return owners


def test_registry_has_all_builtins():
    assert {"averagely", "by_circle", "consistent_hash", "by_config", "by_machine_room",
            "machine_room_nearby", "sticky"} <= set(available("allocate strategy"))
    for name, strategy in available("allocate strategy").items():
        assert strategy.name == name


# --- RocketMQ results on known inputs -------------------------------------------------------------
def test_averagely_matches_rocketmq_blocks():
    s = get_allocate_strategy("averagely")
    mqs, cids = queues(10), ["c0", "c1", "c2"]
    got = [[mq.queue_id for mq in s.allocate(GROUP, c, mqs, cids)] for c in cids]
    assert got == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    # more consumers than queues: the first Q consumers get one each, the rest nothing
    got = [[mq.queue_id for mq in s.allocate(GROUP, c, queues(2), ["a", "b", "c"])] for c in "abc"]
    assert got == [[0], [1], []]


def test_by_circle_matches_rocketmq_round_robin():
    s = get_allocate_strategy("by_circle")
    mqs, cids = queues(10), ["c0", "c1", "c2"]
    got = [[mq.queue_id for mq in s.allocate(GROUP, c, mqs, cids)] for c in cids]
    assert got == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]


def test_md5_hash_is_javas_first_four_digest_bytes():
    assert md5_hash("a") == 0x0CC175B9  # md5("a") = 0cc175b9...
    assert md5_hash("127.0.0.1@1-0") == int(hashlib.md5(b"127.0.0.1@1-0").hexdigest()[:8], 16)


def test_java_queue_string_has_javas_spacing():
    assert java_queue_string(MessageQueue("T", "b", 3)) == "MessageQueue [topic=T, brokerName=b, queueId=3]"


def _java_consistent_hash_oracle(current, mqs, cids, vnodes=10):
    # Written the way Java's TreeMap behaves: a later put with an equal key replaces the value;
    # routeNode takes the smallest key >= hash, wrapping to the smallest key.
    ring = {}
    for cid in cids:
        for i in range(vnodes):
            ring[md5_hash(f"{cid}-{i}")] = cid
    out = []
    if not ring:  # zero virtual nodes: routeNode returns null, nobody owns anything
        return out
    for mq in mqs:
        h = md5_hash(java_queue_string(mq))
        at_or_after = [k for k in ring if k >= h]
        owner = ring[min(at_or_after)] if at_or_after else ring[min(ring)]
        if owner == current:
            out.append(mq)
    return out


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 40), st.lists(st.text("abcdef0123456789.@", min_size=1, max_size=12), min_size=1,
                                    max_size=8, unique=True), st.integers(0, 20))
def test_consistent_hash_matches_java_router(nq, cids, vnodes):
    s = AllocateMessageQueueConsistentHash(vnodes)
    mqs = sorted(queues(nq, broker="broker-a") + queues(nq // 2, broker="broker-b"))
    cids = java_sorted_ids(cids)
    for cid in cids:
        assert s.allocate(GROUP, cid, mqs, cids) == _java_consistent_hash_oracle(cid, mqs, cids, vnodes)


def test_consistent_hash_factory_and_bad_virtual_node_count():
    s = get_allocate_strategy("consistent_hash")(virtual_node_count=50)
    assert s.virtual_node_count == 50
    with pytest.raises(IllegalArgumentError, match="-1"):
        AllocateMessageQueueConsistentHash(-1)


def test_by_config_returns_configured_queues():
    wanted = [MessageQueue("T", "b", 3), MessageQueue("T", "b", 1)]
    registered = get_allocate_strategy("by_config")
    assert registered.allocate(GROUP, "c", queues(4), ["c"]) == []
    for s in (registered.with_queues(wanted), registered(message_queues=wanted)):
        assert s.allocate(GROUP, "anyone", queues(8), ["x", "y"]) == wanted
    with pytest.raises(IllegalArgumentError, match="'T'"):
        registered.with_queues(["T"])


def test_by_machine_room_matches_rocketmq():
    s = get_allocate_strategy("by_machine_room").with_idcs(["hz", "sh"])
    mqs = sorted(queues(4, broker="hz@broker-a") + queues(3, broker="sh@broker-b")
                 + queues(4, broker="bj@broker-c") + queues(2, broker="plain"))
    cids = ["c0", "c1", "c2"]
    got = {c: s.allocate(GROUP, c, mqs, cids) for c in cids}
    eligible = [mq for mq in mqs if mq.broker_name.split("@")[0] in ("hz", "sh")]  # 7 queues, sorted
    # Java: blocks of 7 // 3 = 2 from the front, then the remainder (1) to consumer 0 from the tail
    assert got["c0"] == [eligible[0], eligible[1], eligible[6]]
    assert got["c1"] == [eligible[2], eligible[3]]
    assert got["c2"] == [eligible[4], eligible[5]]
    assert s.allocate(GROUP, "stranger", mqs, cids) == []
    assert AllocateMessageQueueByMachineRoom().allocate(GROUP, "c0", mqs, cids) == []  # no idcs configured


class RoomResolver(MachineRoomResolver):
    def broker_deploy_in(self, mq):
        return mq.broker_name.split("-")[0]

    def consumer_deploy_in(self, client_id):
        return client_id.split("-")[0]


def test_machine_room_nearby_prefers_own_room_and_shares_orphans():
    s = AllocateMachineRoomNearby(AllocateMessageQueueAveragely(), RoomResolver())
    mqs = sorted(queues(4, broker="hz-a") + queues(4, broker="sh-b") + queues(3, broker="bj-c"))
    cids = ["hz-1", "hz-2", "sh-1"]
    got = {c: s.allocate(GROUP, c, mqs, cids) for c in cids}
    hz, sh, bj = ([mq for mq in mqs if mq.broker_name.startswith(r)] for r in ("hz", "sh", "bj"))
    # own room first (averagely among the room's consumers), then the consumer-less room bj shared by all
    assert got["hz-1"] == hz[:2] + bj[:1]
    assert got["hz-2"] == hz[2:] + bj[1:2]
    assert got["sh-1"] == sh + bj[2:]
    # the registered instance uses the `room@...` naming convention
    reg = get_allocate_strategy("machine_room_nearby")
    mqs2 = sorted(queues(2, broker="hz@a") + queues(2, broker="sh@b"))
    assert reg.allocate(GROUP, "hz@10.0.0.1@1", mqs2, ["hz@10.0.0.1@1", "sh@10.0.0.2@1"]) == mqs2[:2]


def test_machine_room_nearby_rejects_empty_room():
    class Blank(RoomResolver):
        def broker_deploy_in(self, mq):
            return ""
    with pytest.raises(IllegalArgumentError, match="Machine room is null for mq"):
        AllocateMachineRoomNearby(AllocateMessageQueueAveragely(), Blank()).allocate(GROUP, "a-1", queues(2), ["a-1"])


@pytest.mark.parametrize("name", ["averagely", "by_circle", "consistent_hash", "machine_room_nearby", "sticky"])
def test_validation_like_rocketmq(name, caplog):
    s = get_allocate_strategy(name)
    with pytest.raises(IllegalArgumentError, match="currentCID is empty"):
        s.allocate(GROUP, "", queues(2), ["a"])
    with pytest.raises(IllegalArgumentError, match="mqAll"):
        s.allocate(GROUP, "a", [], ["a"])
    with pytest.raises(IllegalArgumentError, match="cidAll"):
        s.allocate(GROUP, "a", queues(2), [])
    with caplog.at_level(logging.WARNING, logger="rmq.client.rebalance"):
        assert s.allocate(GROUP, "ghost", queues(2), ["a", "b"]) == []
    assert "ghost" in caplog.text and "not in cidAll" in caplog.text


# --- properties ------------------------------------------------------------------------------------
queue_lists = st.lists(
    st.builds(MessageQueue, st.sampled_from(["TopicA", "TopicB"]),
              st.sampled_from(["broker-a", "broker-b", "hz@broker-c", "sh@broker-d"]), st.integers(0, 15)),
    min_size=1, max_size=40, unique=True)
cid_lists = st.lists(st.from_regex(r"(hz|sh)@10\.0\.0\.[0-9]{1,3}@[0-9]{1,5}", fullmatch=True),
                     min_size=1, max_size=9, unique=True)

BALANCED = ["averagely", "by_circle", "sticky"]
ALL_PARTITIONING = BALANCED + ["consistent_hash", "machine_room_nearby"]


@pytest.mark.parametrize("name", ALL_PARTITIONING)
@settings(max_examples=60, deadline=None)
@given(mqs=queue_lists, cids=cid_lists, seed=st.integers(0, 2**32))
def test_each_queue_owned_once_and_order_independent(name, mqs, cids, seed):
    s = get_allocate_strategy(name)
    owners = full_assignment(s, sorted(mqs), sorted(cids))
    assert sorted(owners) == sorted(mqs), "every queue is owned"
    assert all(len(o) == 1 for o in owners.values()), "by exactly one consumer"
    # callers are supposed to sort; a caller that does not gets the same answer (we sort inside)
    rnd = random.Random(seed)
    shuffled_mqs, shuffled_cids = mqs[:], cids[:]
    rnd.shuffle(shuffled_mqs)
    rnd.shuffle(shuffled_cids)
    for cid in cids:
        assert s.allocate(GROUP, cid, shuffled_mqs, shuffled_cids) == s.allocate(GROUP, cid, sorted(mqs), sorted(cids))


@pytest.mark.parametrize("name", BALANCED)
@settings(max_examples=60, deadline=None)
@given(mqs=queue_lists, cids=cid_lists)
def test_sizes_differ_by_at_most_one(name, mqs, cids):
    s = get_allocate_strategy(name)
    sizes = [len(s.allocate(GROUP, c, mqs, cids)) for c in cids]
    assert max(sizes) - min(sizes) <= 1
    assert sum(sizes) == len(mqs)


@settings(max_examples=60, deadline=None)
@given(mqs=queue_lists, cids=cid_lists)
def test_by_machine_room_partitions_the_chosen_rooms(mqs, cids):
    s = AllocateMessageQueueByMachineRoom(["hz"])
    owners = full_assignment(s, sorted(mqs), sorted(cids))
    assert sorted(owners) == sorted(mq for mq in mqs if mq.broker_name.startswith("hz@"))
    assert all(len(o) == 1 for o in owners.values())
    sizes = [len(s.allocate(GROUP, c, mqs, cids)) for c in cids]
    assert max(sizes) - min(sizes) <= 1


def _moves(strategy, mqs, before, after):
    a = {mq: o[0] for mq, o in full_assignment(strategy, mqs, before).items()}
    b = {mq: o[0] for mq, o in full_assignment(strategy, mqs, after).items()}
    return sum(a[mq] != b[mq] for mq in mqs)


def _ceil(a, b):
    return -(-a // b)


# The bound is empirical (see AllocateMessageQueueSticky): 30,000 random cases in this range never
# exceeded it; derandomized so a rare outlier cannot make the suite flaky.
@settings(max_examples=80, deadline=None, derandomize=True)
@given(nq=st.integers(1, 64), cids=st.lists(st.from_regex(r"10\.0\.[0-9]\.[0-9]{1,3}@[0-9]{1,5}", fullmatch=True),
                                            min_size=1, max_size=12, unique=True),
       newcomer=st.from_regex(r"10\.9\.[0-9]\.[0-9]{1,3}@[0-9]{1,5}", fullmatch=True))
def test_sticky_moves_few_queues_on_join_and_leave(nq, cids, newcomer):
    s = get_allocate_strategy("sticky")
    mqs = queues(nq)
    before, joined = sorted(cids), sorted(cids + [newcomer])
    # the newcomer's share must move; balancing adds a short chain of displacements
    assert _moves(s, mqs, before, joined) <= 3 * _ceil(nq, len(joined)) + 4
    if len(cids) > 1:
        left = sorted(before[1:])
        assert _moves(s, mqs, before, left) <= 3 * _ceil(nq, len(before)) + 4


def test_sticky_moves_far_fewer_than_averagely(capsys):
    sticky, avg = get_allocate_strategy("sticky"), get_allocate_strategy("averagely")
    rnd = random.Random(2024)
    rows, totals = [], {"sticky": 0, "averagely": 0, "minimum": 0}
    for nq, n in [(8, 3), (16, 4), (32, 5), (64, 8), (100, 7), (128, 16), (256, 10)]:
        cids = sorted(f"10.0.{rnd.randrange(256)}.{rnd.randrange(256)}@{rnd.randrange(99999)}" for _ in range(n))
        newcomer = f"10.9.{rnd.randrange(256)}.{rnd.randrange(256)}@{rnd.randrange(99999)}"
        joined = sorted(cids + [newcomer])
        leaver = cids[rnd.randrange(n)]
        left = [c for c in cids if c != leaver]
        mqs = sorted(queues(nq // 2, broker="broker-a") + queues(nq - nq // 2, broker="broker-b"))
        row = (nq, n, _moves(sticky, mqs, cids, joined), _moves(avg, mqs, cids, joined), nq // (n + 1),
               _moves(sticky, mqs, cids, left), _moves(avg, mqs, cids, left), nq // n)
        rows.append(row)
        totals["sticky"] += row[2] + row[5]
        totals["averagely"] += row[3] + row[6]
        totals["minimum"] += row[4] + row[7]
    with capsys.disabled():
        print("\nqueues consumers | join: sticky averagely minimum | leave: sticky averagely minimum")
        for r in rows:
            print(f"{r[0]:6} {r[1]:9} | {r[2]:13} {r[3]:9} {r[4]:7} | {r[5]:14} {r[6]:9} {r[7]:7}")
        print("totals:", totals)
    assert totals["sticky"] * 2 < totals["averagely"]
    assert totals["sticky"] <= 2 * totals["minimum"] + len(rows) * 2


def test_sticky_is_the_same_in_another_process():
    # the assignment must not depend on PYTHONHASHSEED or anything process-local
    import subprocess
    import sys
    code = ("from rmq_core.message import MessageQueue as M; from rmq_core.plugins import get_allocate_strategy as g;"
            "print([q.queue_id for q in g('sticky').allocate('g','b',[M('T','x',i) for i in range(20)],['a','b','c'])])")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": seed, "PATH": ""}).stdout for seed in ("1", "2")}
    assert len(outs) == 1
    here = [q.queue_id for q in get_allocate_strategy("sticky").allocate("g", "b", queues(20, broker="x"), ["a", "b", "c"])]
    assert outs == {f"{here}\n"}
