"""IndexFile / IndexService on real files: layout, collisions, chains, time ranges, roll-over,
reload, expiry, truncation, idempotent re-dispatch, and a process killed mid-build."""
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq_core.config import MessageStoreConfig
from rmq_core.message import SysFlag, java_string_hash
from rmq_core.store import index
from rmq_core.store.index import INDEX_HEADER_SIZE, IndexFile, IndexService, build_key, index_key_hash
from tests.codec_oracle import java_string_hash_py
from tests.store_index.index_oracle import put_key_py, put_records_py, select_phy_offsets_py

T0 = 1_700_000_000_000  # a store timestamp in ms


@attrs.define
class Req:
    """The fields the index reads from the store's DispatchRequest."""

    topic: str
    keys: str | None
    uniq_key: str | None
    commit_log_offset: int
    store_timestamp: int
    sys_flag: int = 0


def service(tmp_path, slots=64, num=1000, **kw):
    cfg = MessageStoreConfig(store_path_root_dir=str(tmp_path), max_hash_slot_num=slots, max_index_num=num, **kw)
    svc = IndexService(cfg)
    assert svc.load(True)
    return svc


def q(svc, key, topic="T", max_num=100, begin=0, end=2**62):
    return svc.query_offset(topic, key, max_num, begin, end).phy_offsets


def test_layout_is_rocketmqs(tmp_path):
    svc = service(tmp_path, slots=8, num=4)
    svc.build_index(Req("T", "k1", None, 1000, T0 + 2500))
    svc.build_index(Req("T", "k2", None, 2000, T0 + 4100))
    svc.flush()
    [f] = svc.files
    raw = open(f.path, "rb").read()
    assert len(raw) == INDEX_HEADER_SIZE + 8 * 4 + 4 * 20
    assert struct.unpack_from(">qqqqii", raw, 0) == (T0 + 2500, T0 + 4100, 1000, 2000, 2, 3)
    h2 = abs(java_string_hash("T#k2"))
    assert h2 == index_key_hash(build_key("T", "k2"))
    slot = struct.unpack_from(">i", raw, 40 + (h2 % 8) * 4)[0]
    assert slot == 2  # entry 0 is reserved; k1 is entry 1, k2 entry 2
    assert struct.unpack_from(">iqii", raw, 40 + 8 * 4 + 2 * 20) == (h2, 2000, 1, 0)  # 1.6 s -> 1 whole second
    assert len(f.name) == 17 and f.name.isdigit()


def test_keys_and_uniq_key_are_indexed(tmp_path):
    svc = service(tmp_path)
    svc.build_index(Req("T", "order-1 user-7", "UNIQ1", 100, T0))
    svc.build_index(Req("T", "order-2", "UNIQ2", 200, T0 + 1000))
    svc.build_index(Req("U", "order-1", None, 300, T0 + 2000))
    svc.build_index(Req("T", "user-7", None, 400, T0 + 3000))
    assert q(svc, "order-1") == [100]
    assert q(svc, "order-1", topic="U") == [300]
    assert q(svc, "user-7") == [400, 100]  # newest first
    assert q(svc, "UNIQ2") == [200]
    assert q(svc, "nothing") == []
    result = svc.query_offset("T", "user-7", 1, 0, 2**62)
    assert result.phy_offsets == [400]
    assert (result.index_last_update_timestamp, result.index_last_update_phyoffset) == (T0 + 3000, 400)


def test_hash_collisions_return_all_candidates(tmp_path):
    assert java_string_hash("T#Aa") == java_string_hash("T#BB")
    svc = service(tmp_path)
    svc.build_index(Req("T", "Aa", None, 10, T0))
    svc.build_index(Req("T", "BB", None, 20, T0))
    svc.build_index(Req("T", "Ab", None, 30, T0))
    # only hashes are stored: both collide, the caller checks the real KEYS of the records
    assert q(svc, "Aa") == [20, 10]
    assert q(svc, "BB") == [20, 10]
    assert q(svc, "Ab") == [30]


def test_chain_walking_in_a_single_slot(tmp_path):
    svc = service(tmp_path, slots=1)  # every key shares one slot: one long chain
    for i in range(50):
        svc.build_index(Req("T", f"k{i % 5}", None, i * 100, T0 + i * 1000))
    for k in range(5):
        assert q(svc, f"k{k}") == [i * 100 for i in reversed(range(50)) if i % 5 == k]
    assert q(svc, "k3", max_num=3) == [4800, 4300, 3800]


def test_time_range_filtering(tmp_path):
    svc = service(tmp_path)
    for i in range(10):
        svc.build_index(Req("T", "k", None, i, T0 + i * 1000))
    assert q(svc, "k", begin=T0 + 3000, end=T0 + 6000) == [6, 5, 4, 3]
    assert q(svc, "k", begin=T0 + 9500, end=T0 + 20_000) == []
    assert q(svc, "k", begin=T0 - 5000, end=T0) == [0]
    assert q(svc, "k", begin=T0 + 5000, end=T0 + 4000) == []
    assert q(svc, "k", max_num=0) == []


def test_roll_over_to_new_files(tmp_path):
    svc = service(tmp_path, slots=4, num=5)  # 4 entries per file
    for i in range(10):
        svc.build_index(Req("T", f"a{i} b{i}", None, i * 10, T0 + i * 1000))
    assert len(svc.files) == 5
    names = [f.name for f in svc.files]
    assert names == sorted(names) and len(set(names)) == 5
    assert all(f.entry_count == 4 for f in svc.files)
    assert sorted(os.listdir(tmp_path / "index")) == names
    for i in range(10):
        assert q(svc, f"a{i}") == [i * 10] and q(svc, f"b{i}") == [i * 10]
    assert q(svc, "a7", begin=T0 + 7000, end=T0 + 7000) == [70]


def test_reload_after_clean_shutdown(tmp_path):
    svc = service(tmp_path, slots=4, num=5)
    for i in range(9):
        svc.build_index(Req("T", "k", f"U{i}", i, T0 + i * 1000))
    svc.shutdown()
    again = service(tmp_path, slots=4, num=5)
    assert q(again, "k") == list(reversed(range(9)))
    again.build_index(Req("T", "k", None, 9, T0 + 9000))
    assert q(again, "k", max_num=2) == [9, 8]
    assert q(again, "U4") == [4]


def test_delete_expired_files(tmp_path):
    svc = service(tmp_path, slots=4, num=3)  # 2 entries per file
    for i in range(8):
        svc.build_index(Req("T", "k", None, i * 100, T0 + i * 1000))
    assert [f.end_phy_offset for f in svc.files] == [100, 300, 500, 700]
    svc.delete_expired_file(350)
    assert [f.end_phy_offset for f in svc.files] == [500, 700]
    assert len(os.listdir(tmp_path / "index")) == 2
    assert q(svc, "k") == [700, 600, 500, 400]
    svc.delete_expired_file(10**9)  # the newest file always stays
    assert len(svc.files) == 1
    svc.destroy()
    assert os.listdir(tmp_path / "index") == [] and svc.files == []


def test_rollback_and_prepared_records_are_not_indexed(tmp_path):
    svc = service(tmp_path)
    svc.build_index(Req("T", "k", None, 1, T0, SysFlag.TRANSACTION_ROLLBACK_TYPE))
    svc.build_index(Req("T", "k", None, 2, T0, SysFlag.TRANSACTION_PREPARED_TYPE))
    svc.build_index(Req("T", "k", None, 3, T0, SysFlag.TRANSACTION_COMMIT_TYPE))
    svc.build_index(Req("T", "k", None, 4, T0, SysFlag.MULTI_TAGS))
    assert q(svc, "k") == [4, 3]


def test_index_disabled(tmp_path):
    svc = service(tmp_path, message_index_enable=False)
    svc.build_index(Req("T", "k", None, 1, T0))
    assert q(svc, "k") == [] and svc.files == []


def test_redispatch_is_idempotent(tmp_path):
    svc = service(tmp_path, slots=8, num=6)
    reqs = [Req("T", f"k{i} shared", f"U{i}", i * 10, T0 + i * 1000) for i in range(12)]
    for r in reqs:
        svc.build_index(r)
    counts = [f.entry_count for f in svc.files]
    for r in reqs[5:]:  # the store re-dispatches from an older checkpoint
        svc.build_index(r)
    assert [f.entry_count for f in svc.files] == counts
    assert q(svc, "shared") == [i * 10 for i in reversed(range(12))]
    # a newest record whose keys were only partly indexed gets the missing ones
    svc.build_index(Req("T", "x", None, 200, T0 + 20_000))
    svc.build_index(Req("T", "x y", None, 200, T0 + 20_000))
    assert q(svc, "x") == [200] and q(svc, "y") == [200]


def test_truncate_after(tmp_path):
    svc = service(tmp_path, slots=2, num=5)
    for i in range(20):
        svc.build_index(Req("T", f"k{i % 3}", None, i * 10, T0 + i * 1000))
    assert len(svc.files) == 5
    removed = svc.truncate_after(95)  # records at 100.. are gone from the commit log
    assert removed == 10
    assert svc.indexed_phy_offset == 90
    assert len(svc.files) == 3 and len(os.listdir(tmp_path / "index")) == 3
    for k in range(3):
        assert q(svc, f"k{k}") == [i * 10 for i in reversed(range(10)) if i % 3 == k]
    # re-dispatch of the surviving tail changes nothing; new records chain onto the survivors
    for i in range(8, 14):
        svc.build_index(Req("T", f"k{i % 3}", None, i * 10, T0 + i * 1000))
    for k in range(3):
        assert q(svc, f"k{k}") == [i * 10 for i in reversed(range(14)) if i % 3 == k]
    assert svc.truncate_after(0) == 14
    assert q(svc, "k0") == [] and svc.indexed_phy_offset == -1


def test_torn_put_is_repaired_on_unclean_load(tmp_path):
    svc = service(tmp_path, slots=1, num=100)
    for i in range(3):
        svc.build_index(Req("T", "k", None, i, T0 + i * 1000))
    f = svc.files[-1]
    # simulate a kill inside put_key: entry and slot written, header not
    count = f.index_count
    struct.pack_into(">iqii", f._mm, f._entry_pos(count), index_key_hash("T#k"), 3, 3, count - 1)
    struct.pack_into(">i", f._mm, INDEX_HEADER_SIZE, count)
    f._mm.flush()
    f._unmap()  # the process is gone: no header update, no flush
    svc.files.clear()
    again = IndexService(svc.config)
    assert again.load(False)
    assert q(again, "k") == [2, 1, 0]
    again.build_index(Req("T", "k", None, 3, T0 + 3000))
    assert q(again, "k") == [3, 2, 1, 0]


def test_checkpoint_drops_newer_files_after_crash(tmp_path):
    svc = service(tmp_path, slots=4, num=3)
    for i in range(6):
        svc.build_index(Req("T", "k", None, i, T0 + i * 1000))
    ends = [f.end_timestamp for f in svc.files]
    svc.shutdown()

    class Checkpoint:
        index_msg_timestamp = ends[0]
    checkpoint = Checkpoint()
    again = IndexService(svc.config, checkpoint=checkpoint)
    assert again.load(False)
    assert len(again.files) == 1 and q(again, "k") == [1, 0]
    assert again.indexed_phy_offset == 1  # the store re-dispatches from here
    for i in range(2, 6):
        again.build_index(Req("T", "k", None, i, T0 + i * 1000))
    assert again.flush() == T0 + 5000 and checkpoint.index_msg_timestamp == T0 + 5000
    assert q(again, "k") == [5, 4, 3, 2, 1, 0]


def test_config_mismatch_fails_load_with_clear_message(tmp_path, caplog):
    svc = service(tmp_path, slots=4, num=3)
    svc.build_index(Req("T", "k", None, 1, T0))
    svc.shutdown()
    other = IndexService(MessageStoreConfig(store_path_root_dir=str(tmp_path), max_hash_slot_num=8, max_index_num=3))
    assert other.load(True) is False
    assert "maxHashSlotNum=8" in caplog.text


def test_zero_length_file_from_a_crash_is_reused(tmp_path):
    (tmp_path / "index").mkdir()
    (tmp_path / "index" / "20240101000000000").write_bytes(b"")
    (tmp_path / "index" / "notes.txt").write_text("not an index file")
    svc = service(tmp_path, slots=4, num=3)
    assert len(svc.files) == 1 and svc.files[0].entry_count == 0
    svc.build_index(Req("T", "k", None, 5, T0))
    assert q(svc, "k") == [5]


@settings(max_examples=40, deadline=None)
@given(
    records=st.lists(st.tuples(st.lists(st.sampled_from(["Aa", "BB", "k1", "k2", "k3"]), min_size=1, max_size=3),
                               st.integers(0, 3)), min_size=1, max_size=40),
    slots=st.integers(1, 5), num=st.integers(2, 7), cut=st.integers(0, 45),
    begin=st.integers(0, 60), width=st.integers(0, 60), max_num=st.integers(1, 50))
def test_matches_a_model(tmp_path_factory, records, slots, num, cut, begin, width, max_num):
    svc = service(tmp_path_factory.mktemp("idx"), slots=slots, num=num)
    model = []  # (hash, offset, ts) in build order
    ts = T0
    for offset, (keys, gap) in enumerate(records):
        ts += gap * 1000  # whole seconds, so second-precision times are exact
        svc.build_index(Req("T", " ".join(keys), None, offset, ts))
        for k in keys:
            model.append((index_key_hash(f"T#{k}"), offset, ts))

    def expect(key, entries):
        h = index_key_hash(f"T#{key}")
        lo, hi = T0 + begin * 1000, T0 + (begin + width) * 1000
        out = []
        for eh, off, t in reversed(entries):
            if eh == h and lo <= t <= hi and off not in out:
                out.append(off)
        return out[:max_num]

    for key in ["Aa", "k1", "k2", "k3", "zz"]:
        got = q(svc, key, max_num=max_num, begin=T0 + begin * 1000, end=T0 + (begin + width) * 1000)
        assert got == expect(key, model)
    svc.truncate_after(cut)
    kept = [e for e in model if e[1] < cut]
    for key in ["BB", "k1", "k3"]:
        got = q(svc, key, max_num=max_num, begin=T0 + begin * 1000, end=T0 + (begin + width) * 1000)
        assert got == expect(key, kept)
    svc.shutdown()


def test_process_killed_while_building(tmp_path):
    """A real SIGKILL in the middle of building; the reloaded index answers correctly for
    everything up to indexed_phy_offset and re-dispatch from an old point adds no duplicates."""
    root = str(tmp_path)
    code = textwrap.dedent(f"""
        import sys
        from rmq_core.config import MessageStoreConfig
        from rmq_core.store.index import IndexService
        class Req:
            def __init__(self, i):
                self.topic, self.keys, self.uniq_key = "T", f"k{{i % 7}} all", f"U{{i}}"
                self.commit_log_offset, self.store_timestamp, self.sys_flag = i * 100, {T0} + i * 10, 0
        svc = IndexService(MessageStoreConfig(store_path_root_dir={root!r}, max_hash_slot_num=16, max_index_num=500))
        svc.load(True)
        i = 0
        while True:
            svc.build_index(Req(i))
            i += 1
            if i == 300:
                print("ready", flush=True)
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        time.sleep(0.05)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        child.stdout.close()
    cfg = MessageStoreConfig(store_path_root_dir=root, max_hash_slot_num=16, max_index_num=500)
    svc = IndexService(cfg)
    assert svc.load(False)
    last = svc.indexed_phy_offset // 100
    assert last >= 299

    class Req:
        def __init__(self, i):
            self.topic, self.keys, self.uniq_key = "T", f"k{i % 7} all", f"U{i}"
            self.commit_log_offset, self.store_timestamp, self.sys_flag = i * 100, T0 + i * 10, 0

    for i in range(last - 50, last + 20):  # re-dispatch from a checkpoint behind the index
        svc.build_index(Req(i))
    n = last + 20
    assert q(svc, "all", max_num=10**6) == [i * 100 for i in reversed(range(n))]
    for k in range(7):
        assert q(svc, f"k{k}", max_num=10**6) == [i * 100 for i in reversed(range(n)) if i % 7 == k]
    assert q(svc, f"U{last}") == [last * 100]
    assert sum(f.entry_count for f in svc.files) == 3 * n


def test_index_file_rejects_bad_config(tmp_path):
    from rmq_core.errors import StoreError
    with pytest.raises(StoreError, match="maxIndexNum"):
        IndexService(MessageStoreConfig(store_path_root_dir=str(tmp_path), max_index_num=1))
    f = IndexFile(str(tmp_path / "20240101000000000"), 4, 3)
    assert f.put_key(1, 1, T0) and f.put_key(2, 2, T0) and not f.put_key(3, 3, T0)
    f.close()


@settings(max_examples=30, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=30))
def test_native_and_python_write_identical_files(tmp_path_factory, keys):
    """The native put and select kernels against the pure-Python reference: the same files byte
    for byte, and the same answers to the same queries (time ranges, limits, collisions)."""
    images, answers = [], []
    for reference in (False, True):
        root = tmp_path_factory.mktemp("same")
        with pytest.MonkeyPatch.context() as mp:
            if reference:
                mp.setattr(IndexFile, "put_key", put_key_py)
                mp.setattr(IndexFile, "put_records", put_records_py)
                mp.setattr(IndexFile, "select_phy_offsets", select_phy_offsets_py)
            svc = service(root, slots=7, num=9)
            for i, k in enumerate(keys):
                svc.build_index(Req("T", k.replace(" ", "_"), f"U{i}", i * 50, T0 + i * 700))
            answers.append([(q(svc, k.replace(" ", "_")), q(svc, k.replace(" ", "_"), max_num=2),
                             q(svc, k.replace(" ", "_"), begin=T0 + 3000, end=T0 + 9000)) for k in keys])
            svc.shutdown()
        names = sorted(os.listdir(root / "index"))
        images.append([open(root / "index" / n, "rb").read() for n in names])
    assert images[0] == images[1]
    assert answers[0] == answers[1]
    for k in keys:
        h = java_string_hash_py(k)
        assert index_key_hash(k) == (0 if h == -2**31 else abs(h))


def test_file_names_keep_creation_order_when_the_clock_steps_back(tmp_path, monkeypatch):
    import rmq_core.store.index as index_mod
    clock = iter([T0 + 5000, T0 + 5000, T0 - 3_600_000, T0 - 3_600_000, T0 + 1])
    monkeypatch.setattr(index_mod.time, "time", lambda: next(clock) / 1000)
    svc = service(tmp_path, slots=4, num=2)  # one entry per file: every record makes a file
    for i in range(5):
        svc.build_index(Req("T", "k", None, i, T0 + i))
    names = [f.name for f in svc.files]
    assert names == sorted(names) and len(set(names)) == 5
    svc.shutdown()
    again = service(tmp_path, slots=4, num=2)
    assert q(again, "k") == [4, 3, 2, 1, 0]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2**31 - 1), max_size=4), min_size=1, max_size=40),
       st.integers(0, 39), st.integers(1, 40))
def test_runs_of_records_and_redispatch_write_identical_files(tmp_path_factory, key_lists, redo_from, chunk):
    """build_hashed over runs (the store's index builder), re-dispatching a tail as recovery does,
    leaves the same files with the native put and the reference."""
    records = [(i * 100, T0 + i * 300, hashes) for i, hashes in enumerate(key_lists)]
    images = []
    for reference in (False, True):
        root = tmp_path_factory.mktemp("runs")
        with pytest.MonkeyPatch.context() as mp:
            if reference:
                mp.setattr(IndexFile, "put_key", put_key_py)
                mp.setattr(IndexFile, "put_records", put_records_py)
            svc = service(root, slots=5, num=7)
            for a in range(0, len(records), chunk):
                svc.build_hashed(records[a:a + chunk])
            svc.build_hashed(records[min(redo_from, len(records) - 1):])  # idempotent re-dispatch
            indexed = svc.indexed_phy_offset
            svc.shutdown()
        names = sorted(os.listdir(root / "index")) if (root / "index").exists() else []
        images.append(([open(root / "index" / n, "rb").read() for n in names], indexed))
    assert images[0] == images[1]
    with_keys = [r[0] for r in records if r[2]]
    assert images[0][1] == (with_keys[-1] if with_keys else -1)
