"""Recovery after a clean and an unclean stop, against real files."""
import os
import shutil
import struct

import pytest
from rmq_core.codec import decode_messages
from rmq_core.store import DefaultMessageStore, GetMessageStatus
from rmq_core._native import record_store
from rmq_core.store import commit_log as commit_log_module

from .conftest import msg


def crash(store: DefaultMessageStore) -> None:
    """Stop a store the way a killed process stops: no final flush, no checkpoint, abort marker
    left behind.  (Written bytes stay in the page cache, as they do when a process is killed.)"""
    store._shutdown = True
    for svc in (store.clean_commit_log_service, store.commit_log.flush_service, store.flush_consume_queue_service):
        svc._stopped.set()
        svc._wake.set()
    store.allocator._pool.shutdown(wait=True)
    if store.index_build_service is not None:
        store.index_build_service.stop()  # what it had not built yet is lost, as in a kill
    for qs in store.consume_queue_table.values():
        for cq in qs.values():
            cq.shutdown()
    store.commit_log.mapped_file_queue.shutdown()
    if store.index_service is not None:
        store.index_service.shutdown()
    store.checkpoint.shutdown()
    store.store_lock.release()  # the kernel drops a killed process's flock with its descriptors


def all_bodies(store, topic="TopicA", queue_id=0):
    out = []
    off = store.get_min_offset_in_queue(topic, queue_id)
    while True:
        g = store.get_message("g", topic, queue_id, off, 32)
        if g.status is not GetMessageStatus.FOUND:
            return out
        out += [m.body for m in decode_messages(g.buffer)]
        off = g.next_begin_offset


def reopen(config) -> DefaultMessageStore:
    s = DefaultMessageStore(config)
    assert s.load()
    s.start()
    return s


def test_clean_stop_restarts_without_scanning_the_log(store_factory, config_factory, monkeypatch):
    cfg = config_factory()
    s = store_factory(cfg)
    for i in range(500):
        assert s.put_message(msg(queue_id=i % 2, body=b"m%d" % i, tags="A")).is_ok()
    end = s.get_max_phy_offset()
    s.shutdown()
    assert not os.path.exists(cfg.abort_file)

    def no_scan(*a, **k):
        raise AssertionError("a clean restart must not scan the commit log")

    monkeypatch.setattr(record_store, "verify_records", no_scan)
    s2 = store_factory(cfg)
    assert s2.get_max_phy_offset() == end
    assert s2.get_max_offset_in_queue("TopicA", 0) == 250
    assert all_bodies(s2, queue_id=1) == [b"m%d" % i for i in range(1, 500, 2)]
    r = s2.put_message(msg(queue_id=1, body=b"next"))
    assert r.append_result.wrote_offset == end and r.append_result.logics_offset == 250


def test_unclean_stop_rebuilds_consume_queues_and_index_from_the_log(store_factory, config_factory):
    cfg = config_factory()
    s = store_factory(cfg)
    for i in range(400):
        assert s.put_message(msg(queue_id=i % 4, body=b"m%d" % i, tags="T%d" % (i % 3), keys="key-%d" % i)).is_ok()
    end = s.get_max_phy_offset()
    crash(s)
    assert os.path.exists(cfg.abort_file)
    # lose the consume queues and the index entirely, and the checkpoint says nothing was flushed
    shutil.rmtree(cfg.consume_queue_dir)
    shutil.rmtree(cfg.index_dir, ignore_errors=True)  # the builder thread may not have run yet
    os.remove(cfg.checkpoint_file)
    s2 = store_factory(cfg)
    assert s2.get_max_phy_offset() == end
    for q in range(4):
        assert s2.get_max_offset_in_queue("TopicA", q) == 100
        assert all_bodies(s2, queue_id=q) == [b"m%d" % i for i in range(q, 400, 4)]
    found = s2.query_message("TopicA", "key-123", 10, 0, 2**62)
    assert found.message_count == 1 and decode_messages(found.buffer)[0].body == b"m123"
    assert s2.put_message(msg(queue_id=3, body=b"after")).append_result.logics_offset == 100


def _segment_of(cfg, offset):
    seg = cfg.mapped_file_size_commit_log
    return os.path.join(cfg.commit_log_dir, f"{offset - offset % seg:020d}"), offset % seg


def test_unclean_stop_cuts_the_log_at_a_corrupt_record(store_factory, config_factory):
    cfg = config_factory()
    s = store_factory(cfg)
    results = [s.put_message(msg(queue_id=0, body=b"body-%03d" % i * 20)).append_result for i in range(300)]
    crash(s)
    victim = results[150]
    path, pos = _segment_of(cfg, victim.wrote_offset)
    with open(path, "r+b") as f:  # flip one byte of the body: the CRC no longer matches
        f.seek(pos + 100)
        b = f.read(1)
        f.seek(pos + 100)
        f.write(bytes([b[0] ^ 0xFF]))
    s2 = store_factory(cfg)
    assert s2.get_max_phy_offset() == victim.wrote_offset
    assert s2.get_max_offset_in_queue("TopicA", 0) == 150
    assert all_bodies(s2) == [b"body-%03d" % i * 20 for i in range(150)]
    # later segments are gone, and the tail of the cut segment is zeroed
    seg = cfg.mapped_file_size_commit_log
    assert sorted(os.listdir(cfg.commit_log_dir))[-1] == f"{victim.wrote_offset - victim.wrote_offset % seg:020d}"
    with open(path, "rb") as f:
        f.seek(pos)
        assert f.read() == bytes(seg - pos)
    r = s2.put_message(msg(queue_id=0, body=b"new"))
    assert r.append_result.wrote_offset == victim.wrote_offset and r.append_result.logics_offset == 150


def test_unclean_stop_with_a_truncated_segment_file(store_factory, config_factory):
    cfg = config_factory()
    s = store_factory(cfg)
    results = [s.put_message(msg(body=b"x" * 300)).append_result for i in range(100)]
    crash(s)
    last = results[-1]
    path, pos = _segment_of(cfg, last.wrote_offset)
    os.truncate(path, pos + 50)  # the last record is torn
    s2 = store_factory(cfg)
    assert s2.get_max_phy_offset() == last.wrote_offset
    assert s2.get_max_offset_in_queue("TopicA", 0) == 99
    assert os.path.getsize(path) == cfg.mapped_file_size_commit_log


def test_consume_queue_entries_past_the_log_end_are_dropped(store_factory, config_factory):
    cfg = config_factory()
    s = store_factory(cfg)
    results = [s.put_message(msg(queue_id=i % 2, body=b"y" * 100)).append_result for i in range(60)]
    crash(s)
    cut = results[40].wrote_offset
    path, pos = _segment_of(cfg, cut)
    with open(path, "r+b") as f:  # zero the log from record 40 on (as if never written)
        f.seek(pos)
        f.write(bytes(cfg.mapped_file_size_commit_log - pos))
    s2 = store_factory(cfg)
    assert s2.get_max_phy_offset() == cut
    assert s2.get_max_offset_in_queue("TopicA", 0) == 20 and s2.get_max_offset_in_queue("TopicA", 1) == 20
    g = s2.get_message("g", "TopicA", 0, 19, 32)
    assert g.status is GetMessageStatus.FOUND and g.message_count == 1 and g.next_begin_offset == 20


def test_checkpoint_file_layout(store_factory, config_factory):
    cfg = config_factory()
    s = store_factory(cfg)
    r = s.put_message(msg())
    s.shutdown()
    with open(cfg.checkpoint_file, "rb") as f:
        physic, logics, index, clean_end, magic = struct.unpack(">qqqqI", f.read(36))
    assert physic == r.append_result.store_timestamp == logics
    assert index > 0
    assert clean_end == s.get_max_phy_offset() and magic == 0x524D5143


def test_recovery_keeps_store_timestamps_monotonic_after_restart(store_factory, config_factory):
    cfg = config_factory()
    s = store_factory(cfg)
    t1 = s.put_message(msg()).append_result.store_timestamp
    crash(s)
    s2 = store_factory(cfg)
    assert s2.commit_log.last_store_timestamp >= t1
    assert s2.put_message(msg()).append_result.store_timestamp >= t1


def test_long_recovery_reports_progress(store_factory, config_factory, monkeypatch, caplog):
    """Recovering a big log prints a periodic progress line (a clock that jumps 3 s per segment)."""
    cfg = config_factory()
    s = store_factory(cfg)
    body = b"x" * 2000
    while len(s.commit_log.mapped_file_queue.mapped_files) < 4:
        assert s.put_message(msg(body=body)).is_ok()
    crash(s)
    os.remove(cfg.checkpoint_file)  # walk from the first segment
    ticks = iter(range(0, 10_000, 3))
    monkeypatch.setattr(commit_log_module.time, "monotonic", lambda: float(next(ticks)))
    with caplog.at_level("INFO", logger="rmq.progress"):
        s2 = store_factory(cfg)
    lines = [r.getMessage() for r in caplog.records if r.name == "rmq.progress"]
    assert lines and all("recovering commit log: segment" in line and "MiB verified" in line for line in lines)
    assert s2.get_max_phy_offset() > 0
