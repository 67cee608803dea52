"""The native group-commit gate (store_group_commit.h) on its own: writers wait without the GIL,
one served round (one fdatasync) releases every writer whose request came before it, and the
serving thread hands back to Python whenever a request lies outside its segment."""
import os
import threading
import time

import pytest

from rmq_core._native import group_commit as group_commit_native
from rmq_core.config import FlushDiskType
from rmq_core.store import PutMessageStatus

from .conftest import msg


@pytest.fixture
def seg_fd(tmp_path):
    fd = os.open(tmp_path / "seg", os.O_RDWR | os.O_CREAT, 0o644)
    os.ftruncate(fd, 1 << 20)
    yield fd
    os.close(fd)


def _waiters(gate, ends, results):
    def wait(end):
        results[end] = gate.await_flushed(end, 1000 + end, 10_000)

    threads = [threading.Thread(target=wait, args=(e,)) for e in ends]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while gate.requested < max(ends) and time.monotonic() < deadline:  # every writer has asked
        time.sleep(0.001)
    return threads


def test_one_round_releases_every_writer_that_asked_before_it(seg_fd):
    gate = group_commit_native.GroupCommitGate()
    results = {}
    threads = _waiters(gate, [100, 200, 300, 400], results)
    code, _ = gate.serve(seg_fd, 0, 1 << 20, 1000, True)  # serving thread = this one
    assert code == group_commit_native.GC_RETURN and gate.rounds == 1
    for t in threads:
        t.join(10)
    assert results == {100: group_commit_native.GC_OK, 200: group_commit_native.GC_OK, 300: group_commit_native.GC_OK, 400: group_commit_native.GC_OK}
    assert gate.flushed == 400 and gate.flushed_timestamp == 1400
    assert gate.await_flushed(250, 0, 0) == group_commit_native.GC_OK  # already durable: no wait


def test_stats_count_the_writers_a_round_carries(seg_fd):
    gate = group_commit_native.GroupCommitGate()
    assert gate.stats == {"rounds": 0, "awaits": 0, "sync_s": 0.0, "idle_s": 0.0}
    results = {}
    threads = _waiters(gate, [100, 200, 300], results)
    deadline = time.monotonic() + 10
    while gate.stats["awaits"] < 3 and time.monotonic() < deadline:  # all three are waiting
        time.sleep(0.001)
    code, _ = gate.serve(seg_fd, 0, 1 << 20, 1000, True)
    for t in threads:
        t.join(10)
    stats = gate.stats
    assert code == group_commit_native.GC_RETURN and set(results.values()) == {group_commit_native.GC_OK}
    assert stats["rounds"] == 1 and stats["awaits"] == 3  # one fdatasync carried three writers
    assert stats["sync_s"] > 0 and stats["idle_s"] >= 0
    assert gate.await_flushed(300, 0, 0) == group_commit_native.GC_OK and gate.stats["awaits"] == 3  # durable: no wait


def test_writers_that_do_not_come_back_still_get_woken_promptly(seg_fd):
    """After a native round one covered writer is woken and wakes the next when it waits again;
    these writers wait once and leave, so the serving thread must wake the rest itself."""
    gate = group_commit_native.GroupCommitGate()
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            gate.serve(seg_fd, 0, 1 << 20, 1000)

    server = threading.Thread(target=serve)
    server.start()
    try:
        results = {}
        t0 = time.monotonic()
        threads = _waiters(gate, list(range(100, 1700, 100)), results)
        for t in threads:
            t.join(10)
        assert all(r == group_commit_native.GC_OK for r in results.values()) and len(results) == 16
        assert time.monotonic() - t0 < 2.0  # not their 10 s timeout
    finally:
        stop.set()
        gate.halt()
        server.join(10)


def test_await_times_out_without_a_round_and_stop_refuses_waiters():
    gate = group_commit_native.GroupCommitGate()
    t0 = time.monotonic()
    assert gate.await_flushed(10, 0, 50) == group_commit_native.GC_TIMEOUT
    assert time.monotonic() - t0 >= 0.045
    results = {}
    threads = _waiters(gate, [20], results)
    gate.stop()
    threads[0].join(10)
    assert results == {20: group_commit_native.GC_STOPPED}
    assert gate.await_flushed(30, 0, 1000) == group_commit_native.GC_STOPPED
    with pytest.raises(ValueError, match="timeout_ms"):
        gate.await_flushed(1, 0, -1)


def test_serve_hands_requests_outside_its_segment_to_python(seg_fd):
    gate = group_commit_native.GroupCommitGate()
    gate.request(5000, 0)
    assert gate.serve(seg_fd, 0, 4096, 1000) == (group_commit_native.GC_NEED_FLUSH, 5000)  # past the segment end
    assert gate.serve(seg_fd, 4096, 8192, 1000)[0] == group_commit_native.GC_NEED_FLUSH  # bytes before it not durable
    assert gate.serve(-1, 0, 1 << 20, 1000)[0] == group_commit_native.GC_NEED_FLUSH  # no descriptor: Python flushes
    gate.complete(5000, 77)  # ... and reports back
    assert gate.flushed == 5000 and gate.flushed_timestamp == 77
    assert gate.serve(seg_fd, 4096, 8192, 20) == (group_commit_native.GC_TIMEOUT, 0)  # idle: budget used up


def test_serve_returns_when_kicked_or_halted(seg_fd):
    gate = group_commit_native.GroupCommitGate()
    out = []
    t = threading.Thread(target=lambda: out.append(gate.serve(seg_fd, 0, 1 << 20, 10_000)[0]))
    t.start()
    time.sleep(0.05)
    gate.kick()
    t.join(10)
    t = threading.Thread(target=lambda: out.append(gate.serve(seg_fd, 0, 1 << 20, 10_000)[0]))
    t.start()
    time.sleep(0.05)
    gate.halt()
    t.join(10)
    assert out == [group_commit_native.GC_OK, group_commit_native.GC_STOPPED]


def test_a_failed_fdatasync_is_reported_not_counted_as_durable():
    gate = group_commit_native.GroupCommitGate()
    r, w = os.pipe()  # fdatasync on a pipe fails with EINVAL
    try:
        gate.request(10, 0)
        assert gate.serve(r, 0, 1 << 20, 1000)[0] == group_commit_native.GC_IO_ERROR
        assert gate.last_errno != 0 and gate.flushed == 0
    finally:
        os.close(r)
        os.close(w)


def test_store_writers_are_served_natively_and_the_checkpoint_follows(sync_store):
    s = sync_store
    svc = s.commit_log.flush_service
    assert s.put_message(msg()).is_ok()
    native_rounds = svc.gate.rounds
    results = []

    def writer(i):
        for k in range(10):
            results.append(s.put_message(msg(queue_id=i % 4, body=b"w%d-%d" % (i, k))))

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 80 and all(r.status is PutMessageStatus.PUT_OK for r in results)
    assert svc.gate.rounds > native_rounds  # fdatasync rounds without Python
    end = max(r.append_result.wrote_offset + r.append_result.wrote_bytes for r in results)
    assert s.commit_log.mapped_file_queue.flushed_where >= end
    last_ts = max(r.append_result.store_timestamp for r in results)
    deadline = time.monotonic() + 5
    while s.checkpoint.physic_msg_timestamp < last_ts and time.monotonic() < deadline:
        time.sleep(0.01)
    assert s.checkpoint.physic_msg_timestamp >= last_ts  # bookkeeping caught up with the native rounds


def test_nowait_futures_of_a_round_resolve_and_segments_roll(store_factory):
    # 64 KiB segments: the puts roll the log several times, so rounds alternate between native
    # ones and flushes through Python across the segment boundary
    s = store_factory(flush_disk_type=FlushDiskType.SYNC_FLUSH)
    futs = []
    for i in range(200):
        r, fut = s.put_message_nowait(msg(queue_id=i % 3, body=b"x" * 900))
        assert r.is_ok()
        futs.append((r, fut))
    assert len({id(f) for _, f in futs}) < len(futs)  # requests share Futures
    for r, fut in futs:
        assert fut.result(timeout=10) is PutMessageStatus.PUT_OK
    assert len(s.commit_log.mapped_file_queue.mapped_files) > 2
    assert s.commit_log.mapped_file_queue.flushed_where >= s.get_max_phy_offset()
