"""DefaultMessageStore.truncate_to: a live cut of a running store's log at a record boundary."""
from __future__ import annotations

import os

import pytest

from rmq_core.config import BrokerRole
from rmq_core.errors import StoreError
from rmq_core.store import DefaultMessageStore, GetMessageStatus, PutMessageStatus
from tests.store.conftest import make_config, msg

QUEUES = 4


def _open(root, role, **kw):
    s = DefaultMessageStore(make_config(root, broker_role=role, **kw))
    s.load()
    s.start()
    return s


def _fill(store, n):
    """n messages over QUEUES queues; returns each one's (phys offset, queue id, queue offset)."""
    out = []
    for i in range(n):
        r = store.put(msg(queue_id=i % QUEUES, body=b"%06d" % i + b"z" * 200, keys=f"key{i}"))
        assert r.status is PutMessageStatus.PUT_OK, r
        out.append((r.append_result.wrote_offset, i % QUEUES, r.append_result.logics_offset))
    return out


def _file_bytes(path, start, end):
    with open(path, "rb") as f:
        f.seek(start)
        return f.read(end - start)


def _expect_cut(store, placed, keep):
    """The store holds exactly the first `keep` messages of `placed`."""
    cut = placed[keep][0]
    assert store.get_max_phy_offset() == cut
    assert store.commit_log.visible_offset == cut
    for q in range(QUEUES):
        kept = sum(1 for _, qid, _ in placed[:keep] if qid == q)
        assert store.get_max_offset_in_queue("TopicA", q) == kept
        assert store.commit_log.topic_queue_table[("TopicA", q)] == kept
        assert store.get_message("g", "TopicA", q, kept, 32).status is GetMessageStatus.OFFSET_OVERFLOW_ONE
        if kept:
            got = store.get_message("g", "TopicA", q, kept - 1, 32)
            assert got.status is GetMessageStatus.FOUND and got.message_count == 1
    assert store.query_message("TopicA", f"key{keep - 1}", 10, 0, 2**62).message_count == 1
    assert store.query_message("TopicA", f"key{keep}", 10, 0, 2**62).message_count == 0


def test_truncate_to_cuts_every_part_and_appends_continue(tmp_path):
    root = tmp_path / "store"
    master = _open(root, BrokerRole.ASYNC_MASTER)
    placed = _fill(master, 700)  # about 3.5 segments of 64 KiB
    with pytest.raises(StoreError, match="takes puts"):
        master.truncate_to(placed[10][0])
    end = master.get_max_phy_offset()
    master.shutdown()

    slave = _open(root, BrokerRole.SLAVE)
    keep = 380
    cut = placed[keep][0]
    seg = slave.config.mapped_file_size_commit_log
    assert cut // seg < end // seg  # later segments exist to be deleted
    # the cut bytes, for the append after the cut
    tail, o = b"", cut
    while o < end:
        n = min(end, (o // seg + 1) * seg) - o
        tail += slave.commit_log.get_data(o, n)
        o += n

    with pytest.raises(StoreError, match=rf"truncate_to\({cut + 1}\): not a record boundary"):
        slave.truncate_to(cut + 1)
    with pytest.raises(StoreError, match=rf"ends at {end}"):
        slave.truncate_to(end + 1)
    slave.truncate_to(cut)
    _expect_cut(slave, placed, keep)
    cl_dir = slave.config.commit_log_dir
    names = sorted(os.listdir(cl_dir))
    assert names[-1] == f"{cut - cut % seg:020d}"  # later segments are gone
    # the cut segment's bytes past the cut are zeros on disk
    assert _file_bytes(os.path.join(cl_dir, names[-1]), cut % seg, seg) == bytes(seg - cut % seg)

    # appends continue at the cut: the same bytes again give the same store
    assert slave.append_to_commit_log(cut, tail)
    assert slave.get_max_phy_offset() == end
    for q in range(QUEUES):
        assert slave.get_max_offset_in_queue("TopicA", q) == sum(1 for _, qid, _ in placed if qid == q)
    got = slave.get_message("g", "TopicA", placed[keep][1], placed[keep][2], 1)
    assert got.status is GetMessageStatus.FOUND and b"%06d" % keep in got.buffer

    # a cut at a segment start, then a reload agrees
    keep2 = next(i for i, (p, _, _) in enumerate(placed) if p >= seg)
    assert placed[keep2][0] == seg  # the first record of segment 2 starts at its start
    slave.truncate_to(seg)
    _expect_cut(slave, placed, keep2)
    slave.shutdown()
    slave = _open(root, BrokerRole.SLAVE)
    _expect_cut(slave, placed, keep2)
    slave.shutdown()

    # as a master again: new puts continue at the cut, queue offsets after the kept ones
    master = _open(root, BrokerRole.ASYNC_MASTER)
    r = master.put(msg(queue_id=1, body=b"after the cut"))
    assert r.append_result.wrote_offset == seg
    assert r.append_result.logics_offset == sum(1 for _, qid, _ in placed[:keep2] if qid == 1)
    master.shutdown()


def test_truncate_to_after_a_crash_keeps_the_cut(tmp_path):
    """The zeroed tail is durable at once: a store stopped without its clean shutdown (abort
    marker left) recovers to the cut, not to the old records."""
    root = tmp_path / "store"
    master = _open(root, BrokerRole.ASYNC_MASTER)
    placed = _fill(master, 200)
    master.shutdown()
    slave = _open(root, BrokerRole.SLAVE)
    slave.truncate_to(placed[120][0])
    # an unclean stop: the checkpoint's clean offset is invalid while running, the abort file stays
    slave.shutdown()
    with open(slave.config.abort_file, "w") as f:
        f.write("crash")
    again = _open(root, BrokerRole.SLAVE)
    try:
        _expect_cut(again, placed, 120)
    finally:
        again.shutdown()


def test_truncate_to_below_the_first_offset_empties_the_log(tmp_path):
    root = tmp_path / "store"
    master = _open(root, BrokerRole.ASYNC_MASTER)
    _fill(master, 50)
    master.shutdown()
    slave = _open(root, BrokerRole.SLAVE)
    try:
        slave.truncate_to(0)
        assert slave.get_max_phy_offset() == 0
        assert slave.get_max_offset_in_queue("TopicA", 0) == 0
        assert slave.query_message("TopicA", "key1", 10, 0, 2**62).message_count == 0
    finally:
        slave.shutdown()
