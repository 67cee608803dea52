"""The index builder's native paths against a Python reference on the same records.

`index_native.collect_items` hashes queued single puts and `index_native.collect_span` a batch's
records straight from its commit-log span into a KeyRun, which `IndexMap.put_run` writes.  The
reference decodes each record in Python (`record_fields`, `string_to_properties`) and feeds
`IndexService.build_index` one record at a time: the index files must come out byte for byte the
same, including roll-overs, UNIQ_KEY, multi-word KEYS, unicode keys (the general path, taken in
order) and records without keys."""
from __future__ import annotations

import os
import struct
from collections import deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_core._native import index as index_native
from rmq_core.codec import decode_messages
from tests.codec_oracle import encode_batch_items
from rmq_core.config import MessageStoreConfig
from rmq_core.message import string_to_properties
from rmq_core.store import DefaultMessageStore, MessageExtBatch
from rmq_core.store.index import IndexService, index_key_hash
from rmq_core.store.index import IndexBuildService
from rmq_core.store.types import DispatchRequest, record_fields

from .conftest import make_config, msg
from .test_recovery import crash

T0 = 1_700_000_000_000
TOPIC = "TopicA"

# keys as clients send them: ASCII mostly, some unicode (general path), never the separators
key_text = st.text(st.characters(blacklist_categories=("Cs", "Cc")) | st.sampled_from("abcXYZ019-_#"),
                   min_size=1, max_size=10).map(lambda s: s.replace(" ", "_"))
keys_value = st.lists(key_text, max_size=4).map(" ".join) | st.sampled_from(["", " ", "a  b ", " lead"])


def props_blob(pairs) -> bytes:
    return b"".join(k.encode() + b"\x01" + v.encode() + b"\x02" for k, v in pairs)


def reference_keys(topic: str, props: bytes) -> list[str] | None:
    """The keys IndexService.build_index indexes for these properties (UNIQ_KEY first, then the
    words of KEYS), or None when the record must take the general path (a key that is not plain
    ASCII in its raw bytes)."""
    p = string_to_properties(props)
    raw = dict(pair.split(b"\x01", 1) for pair in props.split(b"\x02") if b"\x01" in pair and pair[:1] != b"\x01")
    keys = []
    if p.get("UNIQ_KEY"):
        keys.append(p["UNIQ_KEY"])
    if p.get("KEYS"):
        keys += [k for k in p["KEYS"].split(" ") if k]
    if any(not raw.get(name, b"").isascii() for name in (b"UNIQ_KEY", b"KEYS")):
        return None
    return keys


def service(root, slots=5, num=7) -> IndexService:
    svc = IndexService(MessageStoreConfig(store_path_root_dir=str(root), max_hash_slot_num=slots,
                                          max_index_num=num, message_index_enable=True))
    svc.load(True)
    return svc


def index_image(root) -> list[bytes]:
    d = os.path.join(str(root), "index")
    names = sorted(os.listdir(d)) if os.path.isdir(d) else []
    return [open(os.path.join(d, n), "rb").read() for n in names]


# --- single puts: collect_items ------------------------------------------------------------------

prop_pairs = st.lists(st.tuples(st.sampled_from(["KEYS", "UNIQ_KEY", "TAGS", "KEY", "UNIQ_KEYS"]), keys_value),
                      max_size=4)
single_props = prop_pairs.map(props_blob) | st.binary(max_size=40)  # raw bytes: invalid UTF-8, no \x01
tx_flags = st.sampled_from([0, 0, 0, 0x4, 0x8, 0xC])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(single_props, tx_flags), min_size=1, max_size=25),
       st.sampled_from([TOPIC, "Tópico", "T𝄞"]), st.integers(1, 30))
def test_single_items_hash_like_the_reference_and_the_previous_native_run(tmp_path_factory, recs, topic, limit):
    items = [(topic, 1000 + i * 100, T0 + i * 10, flag, props) for i, (props, flag) in enumerate(recs)]
    run = index_native.KeyRun()
    q = deque(items)
    handed = index_native.collect_items(q, limit, {}, run)
    # the reference: walk the same items until one needs the general path or the limit is hit
    expected, last_ts, expected_handed, taken = [], 0, None, 0
    for it in items:
        if taken >= limit:
            break
        t, off, ts, flag, props = it
        if flag & 0xC in (0x4, 0xC):
            last_ts, taken = ts, taken + 1
            continue
        keys = reference_keys(t, props)
        if keys is None:
            expected_handed = it
            break
        last_ts, taken = ts, taken + 1
        if keys:
            expected.append((off, ts, [index_key_hash(f"{t}#{k}") for k in keys]))
    assert list(run) == expected and len(run) == len(expected)
    assert handed == expected_handed and run.last_timestamp == last_ts
    assert run.key_count == sum(len(r[2]) for r in expected)
    # the same run written natively (put_run) and as a list (put_hashed / Python) gives equal files
    images = []
    for records in (run, list(run)):
        root = tmp_path_factory.mktemp("singles")
        svc = service(root, slots=3, num=4)
        svc.build_hashed(records)
        svc.build_hashed(records)  # re-dispatch: idempotent
        images.append((index_image(root), svc.indexed_phy_offset))
        svc.shutdown()
    assert images[0] == images[1]


def test_items_that_are_not_single_records_are_handed_back():
    run = index_native.KeyRun()
    batch_item = (TOPIC, b"\0" * 20, 1)
    q = deque([(TOPIC, 5, T0, 0, props_blob([("KEYS", "k")])), batch_item, (TOPIC, 9, T0, 0, b"")])
    assert index_native.collect_items(q, 10, {}, run) is batch_item
    assert list(run) == [(5, T0, [index_key_hash(f"{TOPIC}#k")])] and len(q) == 1
    assert index_native.collect_items(q, 10, {}, run) is None and len(run) == 1 and run.last_timestamp == T0
    run.clear()
    assert len(run) == 0 and run.last_timestamp == 0 and list(run) == []
    with pytest.raises(IndexError, match="record 0 out of a run of 0"):
        run[0]


def test_topic_prefix_hash_seeds_the_key_hash():
    for topic in (TOPIC, "Tópico", "T𝄞", ""):
        seeds = {}
        run = index_native.KeyRun()
        index_native.collect_items(deque([(topic, 1, T0, 0, props_blob([("KEYS", "order-1")]))]), 5, seeds, run)
        assert run[0][2] == [index_key_hash(topic + "#order-1")]
        assert seeds == {topic: index_native.topic_prefix_hash(topic)}


def test_bad_entry_ranges_are_refused_with_the_range():
    run = index_native.KeyRun()
    with pytest.raises(ValueError, match=r"entries 0\.\.2 outside a buffer of 20 bytes"):
        index_native.collect_span(run, b"", b"\0" * 20, 0, 2, 0)
    with pytest.raises(ValueError, match=r"entries 1\.\.1 outside"):
        index_native.adjacent_entries(b"\0" * 20, 1, 1)


def test_adjacent_entries_split_where_records_are_not_back_to_back():
    entries = b"".join(struct.pack(">qiq", off, size, 0) for off, size in
                       ((100, 50), (150, 60), (210, 10), (400, 20), (420, 5)))
    assert index_native.adjacent_entries(entries, 0, 5) == (3, 100, 120)
    assert index_native.adjacent_entries(entries, 3, 5) == (5, 400, 25)
    assert index_native.adjacent_entries(entries, 1, 2) == (2, 150, 60)


# --- batches: collect_span over the commit log -------------------------------------------------


@pytest.fixture(scope="module")
def batch_store(tmp_path_factory):
    cfg = make_config(tmp_path_factory.mktemp("batch_store"), mapped_file_size_commit_log=1024 * 1024)
    s = DefaultMessageStore(cfg)
    assert s.load()
    s.start()
    s.index_build_service.stop()  # the tests take its queued items themselves
    yield s
    s.shutdown()


def put_batch_item(store, items, **kw):
    """Put a batch; return the builder's queued item for it (topic, entries, count)."""
    q = store.index_build_service._queue
    q.clear()
    r = store.put_messages(MessageExtBatch(topic=TOPIC, queue_id=0, body=encode_batch_items(items), **kw))
    assert r.is_ok(), r
    item = q.pop()
    assert len(item) == 3 and item[2] == len(items)
    return item


def reference_build(store, svc, topic, entries, count) -> int:
    """Each record read and decoded in Python, indexed one by one by build_index."""
    ts = 0
    for k in range(count):
        phys, size = struct.unpack_from(">qi", entries, k * 20)
        f = record_fields(store.commit_log.get_data(phys, size))
        assert f["commit_log_offset"] == phys
        svc.build_index(DispatchRequest(topic, 0, phys, size, 0, f["store_timestamp"], 0, f["sys_flag"], 0,
                                        f["properties_bytes"]))
        ts = f["store_timestamp"]
    return ts


def native_build(store, svc, item) -> int:
    builder = IndexBuildService(store)
    builder.index_service = svc
    return builder._build_entries(*item)


batch_record = st.tuples(st.none() | keys_value, st.none() | key_text, st.binary(max_size=40))


@settings(max_examples=40, deadline=None)
@given(st.lists(batch_record, min_size=1, max_size=40), st.booleans(), st.booleans(),
       st.sampled_from([(5, 7), (3, 4), (64, 400)]))
def test_batches_index_like_the_reference(batch_store, tmp_path_factory, recs, born6, store6, geometry):
    items = []
    for keys, uniq, body in recs:
        props = {}
        if keys is not None:
            props["KEYS"] = keys
        if uniq is not None:
            props["UNIQ_KEY"] = uniq
        items.append((0, body or b"-", props))
    kw = {"born_host": ("::1", 5) if born6 else ("127.0.0.1", 5)}
    if store6:
        kw["store_host"] = ("::2", 10911)
    item = put_batch_item(batch_store, items, **kw)
    slots, num = geometry
    images = []
    for build in (native_build, reference_build):
        root = tmp_path_factory.mktemp("batch")
        svc = service(root, slots, num)
        ts = build(batch_store, svc, item) if build is native_build else build(batch_store, svc, *item)
        queries = {k: svc.query_offset(TOPIC, k, 64, 0, 2**62).phy_offsets
                   for keys, uniq, _ in recs for k in ((keys or "").split(" ") + [uniq or ""]) if k}
        images.append((index_image(root), svc.indexed_phy_offset, ts, queries))
        svc.shutdown()
    assert images[0] == images[1]
    last_phys, last_size = struct.unpack_from(">qi", item[1], (item[2] - 1) * 20)
    assert images[0][2] == record_fields(batch_store.commit_log.get_data(last_phys, last_size))["store_timestamp"]


def test_batch_keys_are_found_by_query(store):
    items = [(0, b"m%d" % i, {"KEYS": f"order-{i} user-{i % 3}", "UNIQ_KEY": f"U{i:04d}"}) for i in range(30)]
    items[7] = (0, b"m7", {"KEYS": "clé-7 user-1"})  # unicode: the general path, in order
    items[29] = (0, b"m29", {"KEYS": "键-29"})
    items[12] = (0, b"m12", {"TAGS": "no-keys"})
    r = store.put_messages(MessageExtBatch(topic=TOPIC, queue_id=0, body=encode_batch_items(items)))
    assert r.is_ok()

    def bodies(key):
        found = store.query_message(TOPIC, key, 64, 0, 2**62)
        return sorted(m.body for m in decode_messages(found.buffer)) if found.message_count else []

    assert bodies("order-3") == [b"m3"] and bodies("U0003") == [b"m3"]
    assert bodies("clé-7") == [b"m7"] and bodies("键-29") == [b"m29"]
    assert bodies("user-1") == sorted(b"m%d" % i for i in range(30) if i % 3 == 1 and i not in (12, 29))
    assert bodies("order-12") == [] and bodies("U0012") == []
    assert store.index_build_service.processed_timestamp == r.append_result.store_timestamp


def test_a_batch_without_keys_moves_the_processed_time_only(store):
    r = store.put_messages(MessageExtBatch(topic=TOPIC, queue_id=0,
                                           body=encode_batch_items([(0, b"x%d" % i, {}) for i in range(10)])))
    assert r.is_ok()
    store.index_build_service.drain()
    assert store.index_service.indexed_phy_offset == -1 and store.index_service.files == []
    assert store.index_build_service.processed_timestamp == r.append_result.store_timestamp


def test_a_run_the_commit_log_cannot_give_in_one_piece_is_read_record_by_record(store, monkeypatch):
    real = store.commit_log.get_data
    asked = []

    def one_record_at_most(offset, size):
        asked.append(size)
        # as when the run reaches past a segment's written end: only single records come back
        return real(offset, size) if size < 200 else None

    monkeypatch.setattr(store.commit_log, "get_data", one_record_at_most)
    items = [(0, b"r%d" % i, {"KEYS": f"piece-{i}" if i != 4 else "pièce-4"}) for i in range(9)]
    r = store.put_messages(MessageExtBatch(topic=TOPIC, queue_id=0, body=encode_batch_items(items)))
    assert r.is_ok()
    for i in range(9):
        key = f"piece-{i}" if i != 4 else "pièce-4"
        found = store.query_message(TOPIC, key, 8, 0, 2**62)
        assert [m.body for m in decode_messages(found.buffer)] == [b"r%d" % i]
    assert max(asked) >= 200 and asked.count(max(asked)) == 1  # one try for the whole run


def test_roll_over_inside_a_batch(store_factory):
    s = store_factory(max_hash_slot_num=11, max_index_num=16)  # 15 keys per file
    items = [(0, b"b%d" % i, {"KEYS": f"a-{i} b-{i}", "UNIQ_KEY": f"u-{i}"}) for i in range(40)]
    assert s.put_messages(MessageExtBatch(topic=TOPIC, queue_id=0, body=encode_batch_items(items))).is_ok()
    s.index_build_service.drain()
    files = s.index_service.files
    assert len(files) == 8 and [f.entry_count for f in files] == [15] * 8
    for i in (0, 4, 5, 39):
        for key in (f"a-{i}", f"b-{i}", f"u-{i}"):
            found = s.query_message(TOPIC, key, 8, 0, 2**62)
            assert [m.body for m in decode_messages(found.buffer)] == [b"b%d" % i]


def test_batch_index_work_lost_in_a_crash_is_rebuilt(store_factory, config_factory):
    cfg = config_factory()
    s = store_factory(cfg)
    s.index_build_service.stop()
    for n in range(3):
        items = [(0, b"c%d-%d" % (n, i), {"KEYS": f"crash-{n}-{i}"}) for i in range(20)]
        assert s.put_messages(MessageExtBatch(topic=TOPIC, queue_id=0, body=encode_batch_items(items))).is_ok()
    assert s.index_build_service.pending() == 3
    s.commit_log.flush(0)
    crash(s)
    s2 = DefaultMessageStore(cfg)
    try:
        assert s2.load()
        for n, i in ((0, 0), (1, 13), (2, 19)):
            found = s2.query_message(TOPIC, f"crash-{n}-{i}", 8, 0, 2**62)
            assert [m.body for m in decode_messages(found.buffer)] == [b"c%d-%d" % (n, i)]
    finally:
        s2.shutdown()


def test_singles_and_batches_interleaved_keep_commit_log_order(store):
    store.index_build_service.stop()
    results = []
    for n in range(4):
        results.append(store.put_message(msg(body=b"s%d" % n, keys=f"mix-s{n} mix")))
        items = [(0, b"b%d-%d" % (n, i), {"KEYS": f"mix-b{n}-{i} mix"}) for i in range(3)]
        results.append(store.put_messages(MessageExtBatch(topic=TOPIC, queue_id=0, body=encode_batch_items(items))))
    assert all(r.is_ok() for r in results)
    found = store.query_message(TOPIC, "mix", 64, 0, 2**62)
    assert found.message_count == 16
    assert found.phys_offsets == sorted(found.phys_offsets, reverse=True)  # newest first: built in order
    assert store.index_service.indexed_phy_offset == max(found.phys_offsets)


def test_index_file_sync_and_a_closed_file(tmp_path):
    svc = service(tmp_path, slots=5, num=50)
    run = index_native.KeyRun()
    index_native.collect_items(deque([(TOPIC, i * 10, T0 + i, 0, props_blob([("KEYS", f"s{i}")])) for i in range(20)]),
                               100, {}, run)
    svc.build_hashed(run)
    f = svc.files[-1]
    assert f._dirty
    assert svc.flush() == T0 + 19 and not f._dirty  # msync through the native map
    native_map = f._native
    svc.shutdown()
    with pytest.raises(ValueError, match="index file is closed"):
        native_map.sync()
    again = service(tmp_path, slots=5, num=50)
    assert again.query_offset(TOPIC, "s7", 8, 0, 2**62).phy_offsets == [70]
    again.shutdown()


queue_item = st.tuples(st.booleans(), st.lists(st.tuples(st.none() | keys_value, st.none() | key_text), min_size=1,
                                                 max_size=6))


@settings(max_examples=30, deadline=None)
@given(st.lists(queue_item, min_size=1, max_size=12), st.integers(1, 12))
def test_a_drained_queue_of_singles_and_batches_indexes_like_the_reference(batch_store, tmp_path_factory, plan,
                                                                            run_records):
    """Rounds (IndexBuildService._build_some) over a queue mixing single puts and batches, some
    with keys that take the general path, with runs cut short: the same files as indexing each
    record on its own, and the processed time is the last record's."""
    q = batch_store.index_build_service._queue
    q.clear()
    last_ts = 0
    for single, recs in plan:
        props_list = [{k: v for k, v in (("KEYS", keys), ("UNIQ_KEY", uniq)) if v is not None} for keys, uniq in recs]
        if single:
            for props in props_list:
                r = batch_store.put_message(msg(topic=TOPIC, body=b"s", properties=props))
                assert r.is_ok()
                last_ts = r.append_result.store_timestamp
        else:
            r = batch_store.put_messages(MessageExtBatch(topic=TOPIC, queue_id=0,
                                                         body=encode_batch_items([(0, b"b", p) for p in props_list])))
            assert r.is_ok()
            last_ts = r.append_result.store_timestamp
    items = list(q)
    q.clear()
    images = []
    for native in (True, False):
        root = tmp_path_factory.mktemp("drain")
        svc = service(root, 5, 7)
        if native:
            builder = IndexBuildService(batch_store)
            builder.index_service = svc
            builder.RUN_RECORDS = run_records
            builder._queue.extend(items)
            ts = builder.drain()
        else:
            for item in items:
                if len(item) == 5:
                    topic, phys, ts, sys_flag, props = item
                    svc.build_index(DispatchRequest(topic, 0, phys, 0, 0, ts, 0, sys_flag, 0, props))
                else:
                    ts = reference_build(batch_store, svc, *item)
        images.append((index_image(root), svc.indexed_phy_offset, ts))
        svc.shutdown()
    assert images[0] == images[1]
    assert images[0][2] == last_ts


def test_writing_a_run_lets_other_threads_run(tmp_path):
    """put_run gives the GIL up while it writes: with a switch interval far longer than the
    test, a thread woken just before the call can only run during it if the GIL was released."""
    import sys
    import threading

    words = " ".join(f"w{j}" for j in range(10))
    items = deque((TOPIC, i * 10, T0 + i, 0, props_blob([("KEYS", f"{words} k{i}")])) for i in range(60_000))
    run = index_native.KeyRun()
    index_native.collect_items(items, len(items), {}, run)
    assert run.key_count == 660_000
    svc = service(tmp_path, slots=100_003, num=700_000)
    phase = ["before"]
    seen = []
    go = threading.Event()
    helper = threading.Thread(target=lambda: (go.wait(), seen.append(phase[0])))
    helper.start()
    old = sys.getswitchinterval()
    sys.setswitchinterval(30.0)
    try:
        phase[0] = "during"
        go.set()
        svc.build_hashed(run)
        phase[0] = "after"
    finally:
        sys.setswitchinterval(old)
    helper.join(10)
    assert seen == ["during"]
    assert svc.files[-1].entry_count == 660_000
    assert svc.query_offset(TOPIC, "k59999", 4, 0, 2**62).phy_offsets == [599_990]
    svc.shutdown()


def test_parsing_a_long_span_lets_other_threads_run(batch_store):
    """collect_span gives the GIL up over a long span (the same switch-interval trick as above:
    the woken thread can only run inside a call).  Parsing is short, so on a busy machine the
    woken thread may not get a CPU during one call: parse again until it has run (at most 30 s);
    a call that kept the GIL would leave it waiting until after the last one."""
    import sys
    import threading
    import time

    items = [(0, b"p", {"KEYS": f"gil-{i} other-{i}", "UNIQ_KEY": f"G{i:08d}"}) for i in range(2000)]
    topic, entries, count = put_batch_item(batch_store, items)
    j, phys, length = index_native.adjacent_entries(entries, 0, count)
    assert j == count
    span = batch_store.commit_log.get_data(phys, length)
    seed = index_native.topic_prefix_hash(topic)
    run = index_native.KeyRun()
    phase = ["before"]
    seen = []
    go = threading.Event()
    helper = threading.Thread(target=lambda: (go.wait(), seen.append(phase[0])))
    helper.start()
    old = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)  # longer than the bound below: no switch between two calls
    calls = 0
    try:
        deadline = time.monotonic() + 30
        go.set()
        while not seen and time.monotonic() < deadline:
            run.clear()
            phase[0] = "during"
            result = index_native.collect_span(run, span, entries, 0, count, seed)
            phase[0] = "between"
            calls += 1
            assert result == (count, length)
        phase[0] = "after"
    finally:
        sys.setswitchinterval(old)
    helper.join(10)
    assert seen == ["during"], f"the woken thread ran {seen} after {calls} calls"
    assert len(run) == count and run.key_count == 3 * count
    assert run[5][2] == [index_key_hash(f"{TOPIC}#G00000005"), index_key_hash(f"{TOPIC}#gil-5"),
                         index_key_hash(f"{TOPIC}#other-5")]


def test_colliding_keys_in_a_batch_are_all_candidates(store):
    # "Aa" and "BB" share a Java hash: like RocketMQ, a query returns every record whose key hash
    # matches and the caller checks the real keys
    assert index_key_hash(f"{TOPIC}#Aa") == index_key_hash(f"{TOPIC}#BB")
    items = [(0, b"aa", {"KEYS": "Aa"}), (0, b"mid", {"KEYS": "other"}), (0, b"bb", {"KEYS": "BB"})]
    r = store.put_messages(MessageExtBatch(topic=TOPIC, queue_id=0, body=encode_batch_items(items)))
    assert r.is_ok()
    found = store.query_message(TOPIC, "Aa", 8, 0, 2**62)
    assert sorted(m.body for m in decode_messages(found.buffer)) == [b"aa", b"bb"]
    assert [m.keys for m in decode_messages(found.buffer) if m.keys == "Aa"] == ["Aa"]
