"""The one-pass batch encoder (store_batch.h) against the two-step reference encoder.

`encode_batch` without plan_only builds every record into a private buffer (queue offset, physical
offset and store time left zero) with the generic record writer; filling those three fields in
gives exactly the bytes `encode_batch_into` must leave in the segment — including its staged,
streaming-store path for large batches, records larger than its stage, odd destination
alignments, IPv6 hosts and extra properties.  The consume-queue entries are checked the same way.
"""
import struct

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rmq_core._native import commit_log as commit_log_native
from rmq_core._native import record_store

from rmq_core._native import mapped as mapped_native
from rmq_core.codec import decode_messages
from tests.codec_oracle import encode_batch_items
from rmq_core.message import java_string_hash
from rmq_core.store.types import BatchAppendMessageResult, AppendMessageResult

V4_BORN = struct.pack(">4si", bytes([10, 0, 0, 7]), 40000)
V4_STORE = struct.pack(">4si", bytes([127, 0, 0, 1]), 10911)
V6_BORN = struct.pack(">16si", bytes(range(16)), 1234)
V6_STORE = struct.pack(">16si", bytes(range(16, 32)), 10911)


def reference(body, topic, qid, sys_flag, born_ts, born, store, reconsume, extra, phys0, qoff0, store_ts):
    """Records and consume-queue entries as the two-step encoder (then the append) produce them."""
    records, count, tags = record_store.encode_batch(body, topic, qid, sys_flag, born_ts, born, store, reconsume, extra,
                                               4 << 20)
    codes = struct.unpack(f"={count}q", tags)
    ts_pos = 48 + len(born)
    out, cq, pos = bytearray(records), bytearray(), 0
    for i in range(count):
        size = struct.unpack_from(">i", out, pos)[0]
        struct.pack_into(">qq", out, pos + 20, qoff0 + i, phys0 + pos)
        struct.pack_into(">q", out, pos + ts_pos, store_ts)
        cq += struct.pack(">qiq", phys0 + pos, size, codes[i])
        pos += size
    return bytes(out), bytes(cq), count


def run_into(body, topic, qid, sys_flag, born_ts, born, store, reconsume, extra, store_ts, align, seg_from=1 << 40):
    _, count, total = record_store.encode_batch(body, topic, qid, sys_flag, born_ts, born, store, reconsume, extra,
                                          4 << 20, True)
    seg = bytearray(b"\xee" * (align + total + 64))  # a marker around the reserved space
    m = mapped_native.NativeMap(seg)
    cq = bytearray(count * 20)
    try:
        end = commit_log_native.encode_batch_into(m, align, total, body, 0, count, topic, qid, sys_flag, born_ts, born, store,
                                       reconsume, extra, seg_from, 77, store_ts, cq, 0)
    finally:
        m.release()
    assert end == len(body)
    assert seg[:align] == b"\xee" * align and seg[align + total:] == b"\xee" * 64  # nothing outside
    return bytes(seg[align:align + total]), bytes(cq), seg_from + align


props_st = st.one_of(
    st.just(b""),
    st.builds(lambda t: b"TAGS\x01" + t + b"\x02UNIQ_KEY\x017F00000100\x02", st.sampled_from([b"TagA", b"", "Tág".encode()])),
    st.builds(lambda k, t: b"KEYS\x01" + k + b"\x02TAGS\x01" + t, st.binary(max_size=8).filter(lambda b: not set(b) & {1, 2}),
              st.sampled_from([b"TagB", b"x" * 40])),
    st.just(b"WAIT\x01true\x02"),
)
item_st = st.tuples(st.integers(-(2 ** 31), 2 ** 31 - 1), st.integers(0, 3000), props_st)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=st.lists(item_st, min_size=1, max_size=40), v6=st.booleans(), align=st.integers(0, 63),
       extra=st.sampled_from([b"", b"CLUSTER\x01DefaultCluster", b"TAGS\x01FromExtra\x02"]),
       repeat=st.sampled_from([1, 300]))
def test_encode_batch_into_equals_the_reference(items, v6, align, extra, repeat):
    # repeat=300 makes most batches larger than the stage (streaming stores, several copy-outs)
    body = encode_batch_items([(f, bytes([i % 251]) * n, p) for i, (f, n, p) in enumerate(items)] * repeat)
    born, store, sys_flag = (V6_BORN, V6_STORE, 0x30) if v6 else (V4_BORN, V4_STORE, 0)
    args = (body, b"BatchTopic", 3, sys_flag, 1_700_000_000_001, born, store, 2, extra)
    got, got_cq, phys0 = run_into(*args, store_ts=1_700_000_000_999, align=align)
    want, want_cq, count = reference(*args, phys0=phys0, qoff0=77, store_ts=1_700_000_000_999)
    assert got == want
    assert got_cq == want_cq


def test_records_larger_than_the_stage_between_small_ones():
    items = [(0, b"s" * 100, {"TAGS": "Small"})] * 200 + [(1, b"L" * 70_000, {"TAGS": "Large"})] \
        + [(2, b"t" * 50, {})] * 300 + [(3, b"M" * 20_000, {"TAGS": "Mid"})] * 3
    body = encode_batch_items(items)
    for align in (0, 1, 63):
        args = (body, b"T", 0, 0, 5, V4_BORN, V4_STORE, 0, b"")
        got, got_cq, phys0 = run_into(*args, store_ts=6, align=align)
        want, want_cq, _ = reference(*args, phys0=phys0, qoff0=77, store_ts=6)
        assert got == want and got_cq == want_cq


def test_tag_codes_follow_each_items_properties():
    items = [(0, b"a", {"TAGS": "A"}), (0, b"b", {"TAGS": "A"}), (0, b"c", {"TAGS": "B"}), (0, b"d", {}),
             (0, b"e", {"TAGS": "A"})]
    body = encode_batch_items(items)
    _, cq, _ = run_into(body, b"T", 0, 0, 5, V4_BORN, V4_STORE, 0, b"", store_ts=6, align=0)
    codes = [struct.unpack_from(">q", cq, i * 20 + 12)[0] for i in range(5)]
    assert codes == [java_string_hash(t) for t in ("A", "A", "B", "", "A")]


def test_tags_in_the_extra_properties_come_last_and_win():
    # a record's properties are the item's, then the request's extra ones; as in the Java broker
    # (a HashMap filled in order) the later TAGS wins, in the queue entry and in the decoded record
    items = [(0, b"a", {"TAGS": "A"}), (0, b"d", {})]
    body = encode_batch_items(items)
    records, cq, _ = run_into(body, b"T", 0, 0, 5, V4_BORN, V4_STORE, 0, b"TAGS\x01X\x02", store_ts=6, align=0)
    codes = [struct.unpack_from(">q", cq, i * 20 + 12)[0] for i in range(2)]
    assert codes == [java_string_hash("X")] * 2
    assert [m.tags for m in decode_messages(records)] == ["X", "X"]


def test_reserved_space_too_small_is_an_error_not_an_overrun():
    body = encode_batch_items([(0, b"x" * 100, {})] * 3)
    _, count, total = record_store.encode_batch(body, b"T", 0, 0, 5, V4_BORN, V4_STORE, 0, b"", 4 << 20, True)
    seg = bytearray(total)
    m = mapped_native.NativeMap(seg)
    try:
        with pytest.raises(ValueError, match="ends before item 2"):
            commit_log_native.encode_batch_into(m, 0, total - 1, body, 0, count, b"T", 0, 0, 5, V4_BORN, V4_STORE, 0, b"",
                                     0, 0, 6, bytearray(count * 20), 0)
        with pytest.raises(ValueError, match="outside mapped file"):
            commit_log_native.encode_batch_into(m, 1, total, body, 0, count, b"T", 0, 0, 5, V4_BORN, V4_STORE, 0, b"",
                                     0, 0, 6, bytearray(count * 20), 0)
    finally:
        m.release()


def test_fit_batch_splits_where_the_segment_ends():
    body = encode_batch_items([(0, b"x" * 100, {})] * 10)
    _, count, total = record_store.encode_batch(body, b"T", 0, 0, 5, V4_BORN, V4_STORE, 0, b"", 4 << 20, True)
    size = total // 10
    # room for 3 records and the 8-byte blank, not for a 4th
    n, nbytes, next_pos = record_store.fit_batch(body, 0, 10, b"T", 0, V4_BORN, V4_STORE, b"", 1000, 1000 + 4 * size + 7)
    assert (n, nbytes, next_pos) == (3, 3 * size, 3 * (len(body) // 10))
    n, nbytes, _ = record_store.fit_batch(body, next_pos, 7, b"T", 0, V4_BORN, V4_STORE, b"", 0, 1 << 20)
    assert (n, nbytes) == (7, 7 * size)


def test_lazy_batch_result_equals_the_eager_one():
    entries = struct.pack(">qiq", 4096, 300, 0) + struct.pack(">qiq", 4396, 310, 0)
    lazy = BatchAppendMessageResult(4096, 610, 17, 5, 2, entries, V4_STORE)
    eager = AppendMessageResult(4096, 610, lazy.msg_id, 17, 5, 2, (4096, 4396), (5, 6))
    assert lazy.msg_id == "7F00000100002A9F0000000000001000,7F00000100002A9F000000000000112C"
    assert lazy == eager and eager == lazy and hash(lazy) == hash(eager)
    assert repr(lazy) == repr(eager)
    with pytest.raises(AttributeError):
        lazy.msg_num = 3
