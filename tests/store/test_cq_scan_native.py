"""The native consume-queue scans (cq_scan, cq_count_matches) against a plain-Python reading of
the same 20-byte entries: every tag-set size (the one-tag kernel steps 16 entries at a time),
unaligned ends, limits by count and bytes, entries below the log's minimum offset."""
from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq_core._native import cq as cq_native

from rmq_core._native import mapped as mapped_native

ENTRY = struct.Struct(">qiq")
TAGS = [0, 1, -1, 0x7FFFFFFF, -0x80000000, 123456789, -987654321]


def entries_buffer(entries) -> bytearray:
    return bytearray(b"".join(ENTRY.pack(*e) for e in entries))


def reference_scan(buf, start, end, codes, max_count, max_bytes, min_phys):
    pos, found, total, removed = start, [], 0, 0
    while pos + 20 <= end:
        phys, size, tag = ENTRY.unpack_from(buf, pos)
        if codes is None or tag in codes:
            if phys < min_phys:
                removed += 1
                pos += 20
                continue
            if found and (len(found) >= max_count or total + size > max_bytes):
                break
            found.append((phys, size, (pos - start) // 20))
            total += size
        pos += 20
    return found, pos, removed


def native_scan(buf, start, end, codes, max_count, max_bytes, min_phys):
    m = mapped_native.NativeMap(buf)
    out = bytearray(max_count * 16)
    tags = None if codes is None else cq_native.TagFilter(codes)
    n, stop, removed = cq_native.cq_scan(m, start, end, tags, max_count, max_bytes, min_phys, out)
    found = [struct.unpack_from("=qii", out, i * 16) for i in range(n)]
    m.release()
    return found, stop, removed


entry_lists = st.lists(
    st.tuples(st.integers(0, 1 << 40), st.integers(1, 5000), st.sampled_from(TAGS)), max_size=400)


@settings(max_examples=300, deadline=None)
@given(entries=entry_lists, data=st.data())
def test_scan_matches_reference(entries, data):
    buf = entries_buffer(entries)
    n = len(entries)
    first = data.draw(st.integers(0, n), label="first entry")
    start = first * 20
    end = data.draw(st.integers(start, len(buf)), label="end byte")  # may cut an entry
    codes = data.draw(st.one_of(st.none(), st.sets(st.sampled_from(TAGS), max_size=4)), label="tags")
    max_count = data.draw(st.integers(1, 64), label="max_count")
    max_bytes = data.draw(st.integers(1, 100_000), label="max_bytes")
    min_phys = data.draw(st.sampled_from([0, 1 << 38, 1 << 39]), label="min_phys")
    assert native_scan(buf, start, end, codes, max_count, max_bytes, min_phys) == \
        reference_scan(buf, start, end, codes, max_count, max_bytes, min_phys)


@settings(max_examples=300, deadline=None)
@given(entries=entry_lists, data=st.data())
def test_count_matches_reference(entries, data):
    buf = entries_buffer(entries)
    start = data.draw(st.integers(0, len(entries)), label="first entry") * 20
    end = data.draw(st.integers(start, len(buf)), label="end byte")
    codes = data.draw(st.sets(st.sampled_from(TAGS), max_size=3), label="tags")
    want = len(reference_scan(buf, start, end, codes, 1 << 30, 1 << 62, 0)[0])
    m = mapped_native.NativeMap(buf)
    try:
        assert cq_native.cq_count_matches(m, start, end, cq_native.TagFilter(codes)) == want
    finally:
        m.release()


@pytest.mark.parametrize("n", [15, 16, 17, 31, 32, 33, 64, 205])
def test_one_tag_hit_at_every_position_of_the_stepped_scan(n):
    """A lone hit anywhere (first, last, either side of a 16-entry step) is found and placed."""
    hit, miss = 424242, -7
    for at in range(n):
        buf = entries_buffer([(1000 + i, 10 + i, hit if i == at else miss) for i in range(n)])
        found, stop, removed = native_scan(buf, 0, len(buf), {hit}, 8, 1 << 20, 0)
        assert found == [(1000 + at, 10 + at, at)] and stop == len(buf) and removed == 0
        m = mapped_native.NativeMap(buf)
        assert cq_native.cq_count_matches(m, 0, len(buf), cq_native.TagFilter([hit])) == 1
        m.release()


def test_one_tag_scan_stops_at_the_match_it_cannot_take():
    hit = 99
    buf = entries_buffer([(i * 100, 100, hit if i % 20 == 19 else 0) for i in range(400)])
    found, stop, _ = native_scan(buf, 0, len(buf), {hit}, 3, 1 << 20, 0)
    assert [f[2] for f in found] == [19, 39, 59]
    assert stop == 79 * 20  # next_begin_offset points at the fourth match, not past it
    found, stop, _ = native_scan(buf, 0, len(buf), {hit}, 10, 250, 0)
    assert [f[2] for f in found] == [19, 39] and stop == 59 * 20


def test_scan_refuses_a_zero_count_and_a_short_output_buffer():
    m = mapped_native.NativeMap(entries_buffer([(0, 1, 5)]))
    with pytest.raises(ValueError, match="max_count must be at least 1, got 0"):
        cq_native.cq_scan(m, 0, 20, None, 0, 100, 0, bytearray())
    with pytest.raises(ValueError, match="too small for 4 matches"):
        cq_native.cq_scan(m, 0, 20, None, 4, 100, 0, bytearray(16))
    m.release()
