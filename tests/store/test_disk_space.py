"""Files written through a mapping get real blocks at creation, a full disk is a DISK_FULL refusal
(never a SIGBUS), recovery cuts a segment's tail without reading it, one store per directory."""
import os

import pytest

from tests.codec_oracle import encode_batch_items
from rmq_core.store import DefaultMessageStore, MessageExtBatch, PutMessageStatus
from rmq_core.store.lock_file import StoreLockedError
from tests.servers import Tmpfs

from .conftest import make_config, msg
from .test_recovery import all_bodies, crash, reopen


def _allocated(path: str) -> bool:
    st = os.stat(path)
    return st.st_blocks * 512 >= st.st_size


def test_every_mapped_file_is_allocated_at_creation(store):
    for i in range(300):  # rolls commit-log and consume-queue segments
        assert store.put_message(msg(queue_id=i % 2, body=b"b" * 400, keys=f"k{i}")).is_ok()
    store.index_build_service.drain()
    cfg = store.config
    files = [mf.path for mf in store.commit_log.mapped_file_queue.mapped_files]
    files += [mf.path for qs in store.consume_queue_table.values() for cq in qs.values()
              for mf in cq.mapped_file_queue.mapped_files]
    files += [os.path.join(cfg.index_dir, n) for n in os.listdir(cfg.index_dir)]
    files.append(cfg.checkpoint_file)
    assert len(store.commit_log.mapped_file_queue.mapped_files) > 1
    sparse = [f for f in files if not _allocated(f)]
    assert not sparse, sparse


def test_no_room_for_a_segment_is_a_disk_full_refusal_and_writes_resume(tmp_path):
    disk = Tmpfs.mount(tmp_path / "disk", "2m")
    try:
        ballast = os.path.join(disk.path, "ballast")
        with open(ballast, "wb") as f:
            f.write(b"\x01" * (512 * 1024))
        cfg = make_config(os.path.join(disk.path, "store"), mapped_file_size_commit_log=256 * 1024,
                          max_hash_slot_num=100, max_index_num=400)
        s = DefaultMessageStore(cfg)
        s.load()
        s.start()
        try:
            stored, refused = [], None
            batch = encode_batch_items([(0, b"x" * 900, {})] * 20)
            for i in range(200):
                r = s.put_messages(MessageExtBatch("TopicA", 0, batch))
                if not r.is_ok():
                    refused = r
                    break
                stored.append(r)
            assert refused is not None and refused.status is PutMessageStatus.DISK_FULL
            assert cfg.commit_log_dir in refused.error and "bytes free" in refused.error, refused.error
            assert s.put_message(msg(body=b"single")).status is PutMessageStatus.DISK_FULL
            assert len(all_bodies(s)) == 20 * len(stored)  # what was acknowledged is all there, nothing more
            os.remove(ballast)
            s._disk_checked_at = 0  # (the put path looks again after DISK_RECHECK_INTERVAL)
            assert s.put_message(msg(body=b"after")).is_ok()
            assert all_bodies(s)[-1] == b"after"
        finally:
            s.shutdown()
    finally:
        disk.close()


def test_recovery_cuts_a_torn_tail_without_reading_the_rest_of_the_segment(config_factory):
    cfg = config_factory(mapped_file_size_commit_log=8 * 1024 * 1024)
    s = reopen(cfg)
    for i in range(20):
        assert s.put_message(msg(body=b"m%d" % i)).is_ok()
    end = s.get_max_phy_offset()
    mf = s.commit_log.mapped_file_queue.mapped_files[-1]
    mf.native.write(end, b"\x00\x00\x01\x00" + b"\xee" * 600)  # a torn record after the last good one
    mf.native.write(5 * 1024 * 1024, b"\xab" * 4096)  # stale bytes far behind it
    path = mf.path
    crash(s)
    s2 = reopen(cfg)
    try:
        assert s2.get_max_phy_offset() == end
        assert all_bodies(s2) == [b"m%d" % i for i in range(20)]
        with open(path, "rb") as f:
            f.seek(end)
            assert f.read(4096).strip(b"\x00") == b""
            f.seek(5 * 1024 * 1024)
            assert f.read(4096).strip(b"\x00") == b""  # dropped by cutting the file, not by reading it
        assert _allocated(path)
        assert s2.put_message(msg(body=b"next")).is_ok()
    finally:
        s2.shutdown()


def test_one_store_per_directory(config_factory):
    cfg = config_factory()
    s = reopen(cfg)
    with pytest.raises(StoreLockedError, match=f"in use by pid {os.getpid()}.*{cfg.store_path_root_dir}/lock"):
        DefaultMessageStore(cfg).load()
    assert s.put_message(msg()).is_ok()  # the refused second store left the first alone
    crash(s)  # a killed process's lock goes with it
    s2 = reopen(cfg)
    s2.shutdown()
    s3 = reopen(cfg)  # and a clean stop releases it
    s3.shutdown()
