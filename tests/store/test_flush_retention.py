"""Flush modes (ASYNC interval / least pages, SYNC group commit and timeout) and retention
(fileReservedTime at deleteWhen, disk watermarks, disk-full refusal)."""
import os
import threading
import time

import pytest

from tests.codec_oracle import encode_batch_items
from rmq_core.config import FlushDiskType
from rmq_core.errors import DiskFullError
from rmq_core.store import GetMessageStatus, MessageExtBatch, PutMessageStatus

from .conftest import make_config, msg


def wait_until(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.005)
    return cond()


# --- flush ---------------------------------------------------------------------------------------
def test_async_flush_reaches_the_log_end_in_the_background(store_factory):
    # a 1 s thorough flush: an interval round may take the first 4+ dirty pages while the puts
    # are still coming, and what is left (under 4 pages) waits for the thorough round - with the
    # 10 s default that round could fall right at the end of the wait below on a loaded machine
    store = store_factory(flush_commit_log_thorough_interval=1000)
    r = store.put_message(msg(body=b"x" * 100))
    assert store.commit_log.request_flush(r.append_result.wrote_offset) is None
    end = store.get_max_phy_offset()
    # 4 dirty pages are needed per round, but the thorough flush (or the next put) catches up;
    # fill 5 pages so the interval round flushes
    for _ in range(25):
        store.put_message(msg(body=b"y" * 1000))
    end = store.get_max_phy_offset()
    assert wait_until(lambda: store.commit_log.mapped_file_queue.flushed_where >= end)
    assert wait_until(lambda: store.checkpoint.physic_msg_timestamp > 0)


def test_async_flush_waits_for_least_pages(store_factory):
    s = store_factory(flush_interval_commit_log=3_600_000, flush_commit_log_least_pages=4,
                      flush_commit_log_thorough_interval=3_600_000)
    svc = s.commit_log.flush_service
    s.put_message(msg(body=b"x" * 100))
    svc.run_once()
    assert s.commit_log.mapped_file_queue.flushed_where == 0  # under 4 dirty pages: not yet
    for _ in range(20):
        s.put_message(msg(body=b"y" * 1000))
    svc.run_once()
    assert s.commit_log.mapped_file_queue.flushed_where == s.get_max_phy_offset()


def test_shutdown_flushes_everything(store_factory, config_factory):
    cfg = config_factory(flush_interval_commit_log=3_600_000)
    s = store_factory(cfg)
    s.put_message(msg())
    s.shutdown()
    assert s.commit_log.mapped_file_queue.flushed_where == s.get_max_phy_offset()


def test_sync_flush_put_returns_after_its_bytes_are_flushed(sync_store):
    for i in range(20):
        r = sync_store.put_message(msg(body=b"z" * i))
        assert r.status is PutMessageStatus.PUT_OK
        a = r.append_result
        assert sync_store.commit_log.mapped_file_queue.flushed_where >= a.wrote_offset + a.wrote_bytes
    items = [(0, b"b%d" % i, {}) for i in range(10)]
    r = sync_store.put_messages(MessageExtBatch("TopicA", 0, encode_batch_items(items)))
    assert r.status is PutMessageStatus.PUT_OK
    assert sync_store.commit_log.mapped_file_queue.flushed_where >= sync_store.get_max_phy_offset()


def test_group_commit_many_writers_share_one_flush(sync_store, monkeypatch):
    cl = sync_store.commit_log
    real_flush = cl.flush
    flushes = []

    def slow_flush(least_pages=0):
        flushes.append(cl.get_max_offset())
        time.sleep(0.05)  # a slow disk: writers pile up behind the flush in progress
        return real_flush(least_pages)

    monkeypatch.setattr(cl, "flush", slow_flush)
    monkeypatch.setattr(cl.flush_service, "serve_natively", False)  # every round through slow_flush
    results = []
    start = threading.Barrier(16)

    def writer(i):
        start.wait()
        results.append(sync_store.put_message(msg(queue_id=i % 4, body=b"w%d" % i)))

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 16 and all(r.status is PutMessageStatus.PUT_OK for r in results)
    assert len(flushes) <= 4  # 16 durable puts, a handful of flushes
    assert cl.mapped_file_queue.flushed_where == sync_store.get_max_phy_offset()


def test_sync_flush_timeout(store_factory, monkeypatch):
    s = store_factory(flush_disk_type=FlushDiskType.SYNC_FLUSH, sync_flush_timeout=50)
    cl = s.commit_log
    real_flush = cl.flush
    release = threading.Event()

    def stuck_flush(least_pages=0):
        release.wait(5)
        return real_flush(least_pages)

    monkeypatch.setattr(cl, "flush", stuck_flush)
    monkeypatch.setattr(cl.flush_service, "serve_natively", False)  # every round through stuck_flush
    try:
        r = s.put_message(msg())
        assert r.status is PutMessageStatus.FLUSH_DISK_TIMEOUT
        assert r.is_ok()  # stored, only not yet durable
        assert "syncFlushTimeout 50 ms" in r.error
        assert s.get_message("g", "TopicA", 0, 0, 1).status is GetMessageStatus.FOUND
    finally:
        release.set()


def test_put_nowait_returns_a_future_for_sync_flush(sync_store, store_factory, tmp_path):
    store = store_factory(make_config(tmp_path / "async-store"))  # (one store per directory)
    r, fut = sync_store.put_message_nowait(msg())
    assert r.status is PutMessageStatus.PUT_OK
    assert fut.result(timeout=10) is PutMessageStatus.PUT_OK
    assert sync_store.commit_log.mapped_file_queue.flushed_where >= r.append_result.wrote_offset + r.append_result.wrote_bytes
    r, fut = sync_store.put_messages_nowait(MessageExtBatch("TopicA", 1, encode_batch_items([(0, b"a", {})] * 3)))
    assert r.append_result.msg_num == 3 and fut.result(timeout=10) is PutMessageStatus.PUT_OK
    r, fut = store.put_message_nowait(msg())
    assert r.is_ok() and fut is None


# --- retention -----------------------------------------------------------------------------------
def fill_segments(store, n_segments):
    seg = store.config.mapped_file_size_commit_log
    items = [(0, b"r" * 900, {"KEYS": "k"}) for _ in range(60)]
    while store.get_max_phy_offset() < n_segments * seg:
        assert store.put_messages(MessageExtBatch("TopicA", 0, encode_batch_items(items))).is_ok()


def age_segments(store, hours, count=None):
    files = store.commit_log.mapped_file_queue.mapped_files
    old = time.time() - hours * 3600
    for mf in files[:count]:
        os.utime(mf.path, (old, old))


def test_expired_segments_are_deleted_at_delete_when(store_factory):
    hour = time.localtime().tm_hour
    s = store_factory(file_reserved_time=48, delete_when=f"{(hour + 12) % 24:02d}")
    s.disk_usage = lambda path: 0.10
    fill_segments(s, 4)
    n_files = len(s.commit_log.mapped_file_queue.mapped_files)
    age_segments(s, 72, count=2)
    assert s.clean_expired_files() == 0  # not deleteWhen o'clock, disk fine: keep them
    s.config.delete_when = f"{(hour + 12) % 24:02d};{hour:02d}"
    assert s.clean_expired_files() == 2  # only the two old enough
    seg = s.config.mapped_file_size_commit_log
    assert s.get_min_phy_offset() == 2 * seg
    assert sorted(os.listdir(s.config.commit_log_dir))[0] == f"{2 * seg:020d}"
    assert len(s.commit_log.mapped_file_queue.mapped_files) == n_files - 2
    # consume queue trimmed consistently: the min offset points at a record that still exists
    min_off = s.get_min_offset_in_queue("TopicA", 0)
    assert s.get_commit_log_offset_in_queue("TopicA", 0, min_off) >= 2 * seg
    assert s.get_commit_log_offset_in_queue("TopicA", 0, min_off - 1) < 2 * seg if min_off > 0 else True
    g = s.get_message("g", "TopicA", 0, 0, 4)
    assert g.status is GetMessageStatus.OFFSET_TOO_SMALL and g.next_begin_offset == min_off
    cq_dir = os.path.join(s.config.consume_queue_dir, "TopicA", "0")
    first_cq = int(sorted(os.listdir(cq_dir))[0])
    assert first_cq // 20 <= min_off < first_cq // 20 + s.config.mapped_file_size_consume_queue // 20


def test_disk_over_max_used_ratio_cleans_early_and_forcibly(store_factory):
    hour = time.localtime().tm_hour
    s = store_factory(file_reserved_time=48, delete_when=f"{(hour + 12) % 24:02d}", disk_max_used_space_ratio=75,
                      disk_space_clean_forcibly_ratio=0.85, disk_space_warning_level_ratio=0.95)
    fill_segments(s, 4)
    age_segments(s, 72, count=1)
    s.disk_usage = lambda path: 0.80  # over 75%: old files go even outside deleteWhen
    assert s.clean_expired_files() == 1
    s.disk_usage = lambda path: 0.90  # over the forcible ratio: young files go too (never the last)
    deleted = s.clean_expired_files()
    assert deleted >= 1
    assert len(s.commit_log.mapped_file_queue.mapped_files) >= 1
    assert s.put_message(msg()).is_ok()  # under the warning level: still writable


def test_disk_full_refuses_writes_with_a_clear_error(store):
    store.disk_usage = lambda path: 0.97
    store.check_disk_space()
    r = store.put_message(msg())
    assert r.status is PutMessageStatus.DISK_FULL and not r.is_ok()
    assert "97.0% full" in r.error and "diskSpaceWarningLevelRatio 90%" in r.error
    with pytest.raises(DiskFullError, match="97.0% full"):
        store.put_message_or_raise(msg())
    assert store.runtime_info()["diskFull"] == "true"
    store.disk_usage = lambda path: 0.50
    store.check_disk_space()
    assert store.put_message(msg()).is_ok()


def test_runtime_info_and_disk_ratio(store):
    store.put_message(msg())
    info = store.runtime_info()
    assert float(info["commitLogDiskRatio"]) == pytest.approx(store.commit_log_disk_ratio(), abs=0.01)
    assert info["putMessageTimesTotal"] == "1" and info["commitLogMaxOffset"] == str(store.get_max_phy_offset())


def test_a_deleted_segment_stays_readable_for_a_reader_holding_it(store):
    # retention may delete a segment while a pull scans it without the GIL: the unmap waits for
    # the last reference, so the reader never touches unmapped memory
    fill_segments(store, 3)
    mf = store.commit_log.mapped_file_queue.mapped_files[0]
    head = mf.read(0, 64)
    assert store.commit_log.mapped_file_queue.delete_files_before(1) == [mf]
    assert not os.path.exists(mf.path)
    assert mf.read(0, 64) == head
    assert store.get_min_phy_offset() == store.config.mapped_file_size_commit_log


def test_a_failing_segment_creation_is_reported_not_raised(store, monkeypatch):
    def no_space(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store.commit_log.mapped_file_queue, "get_last_mapped_file", no_space)
    r = store.put_message(msg())
    assert r.status is PutMessageStatus.CREATE_MAPPED_FILE_FAILED and "No space left on device" in r.error
