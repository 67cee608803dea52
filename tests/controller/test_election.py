"""The election policy (RocketMQ 5's DefaultElectPolicy) as plain values, and the controller's
decisions over a real etcd: two controllers racing elect one master at one new epoch; a stale
sync-state-set change or a master of an old epoch is refused."""
import threading

import pytest

from rmq_core.controller.etcd import EtcdClient
from rmq_core.controller.manager import ControllerError, ReplicasInfoManager
from rmq_core.controller.state import GroupMeta, ReplicaAlive, elect, elected


def alive(*rows):
    return {r[0]: ReplicaAlive(r[0], f"127.0.0.1:{10000 + r[0]}", epoch=r[1], max_offset=r[2],
                               election_priority=r[3] if len(r) > 3 else 2**31 - 1) for r in rows}


def test_only_alive_sync_state_set_members_by_epoch_then_offset_then_priority_then_id():
    meta = GroupMeta("c", "b", master_broker_id=1, master_epoch=3, sync_state_set=[1, 2, 3])
    # the master (1) is gone; 4 has the most of the log but is not in the sync state set
    assert elect(meta, alive((2, 3, 100), (3, 3, 200), (4, 9, 999))) == 3
    assert elect(meta, alive((2, 4, 100), (3, 3, 200))) == 2  # a newer epoch beats a longer log
    assert elect(meta, alive((2, 3, 200, 5), (3, 3, 200, 1))) == 3  # then the lower priority number
    assert elect(meta, alive((2, 3, 200), (3, 3, 200))) == 2  # then the lower id
    assert elect(meta, alive((4, 9, 999))) is None  # no member alive: no master (no unclean election)
    assert elect(meta, alive((4, 9, 999)), unclean=True) == 4


def test_an_alive_master_stays_unless_another_is_preferred():
    meta = GroupMeta("c", "b", master_broker_id=1, master_epoch=3, sync_state_set=[1, 2])
    assert elect(meta, alive((1, 3, 10), (2, 3, 500))) == 1
    assert elect(meta, alive((1, 3, 10), (2, 3, 500)), preferred=2) == 2
    assert elect(meta, alive((1, 3, 10), (4, 3, 500)), preferred=4) is None  # not a member


def test_a_new_group_takes_any_alive_replica_and_a_new_master_starts_a_set_of_its_own():
    assert elect(GroupMeta("c", "b"), alive((5, 0, 0))) == 5
    new = elected(GroupMeta("c", "b", master_broker_id=1, master_epoch=3, sync_state_set=[1, 2],
                            sync_state_set_epoch=7), 2, "127.0.0.1:10002")
    assert (new.master_broker_id, new.master_epoch, new.sync_state_set, new.sync_state_set_epoch) == (2, 4, [2], 8)


@pytest.fixture
def managers(etcd):
    clients = [EtcdClient(etcd.endpoints) for _ in range(2)]
    yield [ReplicasInfoManager(c, "/rmq-election-test") for c in clients]
    for c in clients:
        c.close()


def _group_with_dead_master(m: ReplicasInfoManager):
    for bid in (1, 2, 3):
        m.apply_broker_id("c", "b", bid, f"127.0.0.1:{10000 + bid};1")
    for bid in (1, 2, 3):
        m.heartbeat("c", ReplicaAlive(bid, f"127.0.0.1:{10000 + bid}", epoch=0, max_offset=(4 - bid) * 10,
                                      heartbeat_timeout_ms=1000, incarnation="x"), "b")
    meta, _alive, did = m.elect_master("c", "b")
    assert did and meta.master_broker_id == 1 and meta.master_epoch == 1  # the group's first master
    meta = m.alter_sync_state_set("c", "b", 1, 1, [1, 2, 3], meta.sync_state_set_epoch)
    lease = ReplicaAlive.from_json(m.etcd.get("/rmq-election-test/b/alive/1")[0]).lease_id
    m.etcd.revoke(lease)  # the master's lease is gone, as if it had run out
    return meta


def test_two_controllers_racing_elect_one_master_at_one_new_epoch(managers):
    a, b = managers
    before = _group_with_dead_master(a)
    results = []
    barrier = threading.Barrier(2)

    def race(m):
        barrier.wait()
        results.append(m.elect_master("c", "b"))

    threads = [threading.Thread(target=race, args=(m,)) for m in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(did for _m, _a, did in results) == [False, True]  # one changed it, the other saw it done
    final = a.read_group("b")[0]
    assert final.master_broker_id == 2  # the alive member with the longest log
    assert final.master_epoch == before.master_epoch + 1
    assert all(m.master_epoch == final.master_epoch for m, _a, _d in results)


def test_stale_requests_are_refused(managers):
    a, _b = managers
    meta = _group_with_dead_master(a)
    new, _alive, _did = a.elect_master("c", "b")
    with pytest.raises(ControllerError, match="is not the master"):  # the old master, old epoch
        a.alter_sync_state_set("c", "b", 1, meta.master_epoch, [1], meta.sync_state_set_epoch)
    with pytest.raises(ControllerError, match="is stale"):
        a.alter_sync_state_set("c", "b", new.master_broker_id, new.master_epoch, [3, 2], 0)
    with pytest.raises(ControllerError, match="not the next free id"):
        a.apply_broker_id("c", "b", 9, "127.0.0.1:1;2")
    with pytest.raises(ControllerError, match="taken by"):
        a.apply_broker_id("c", "b", 2, "127.0.0.1:1;2")
