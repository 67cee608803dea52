"""Planning a SEND_BATCH body (commit_log.encode_batch, plan_only): the C pass that validates and
sizes every item, and the loop that runs only to name the first item that pass rejected."""
import struct

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rmq_core._native import commit_log as commit_log_native
from rmq_core._native import record as record_native
from rmq_core._native import record_store
from rmq_core.errors import MessageTooLargeError

V4_BORN = struct.pack(">4si", bytes([10, 0, 0, 7]), 40000)
V4_STORE = struct.pack(">4si", bytes([127, 0, 0, 1]), 10911)
props_st = st.one_of(
    st.just(b""),
    st.builds(lambda t: b"TAGS\x01" + t + b"\x02UNIQ_KEY\x017F00000100\x02", st.sampled_from([b"TagA", b"", "Tág".encode()])),
    st.binary(max_size=40).filter(lambda b: not set(b) & {1, 2}).map(lambda v: b"K\x01" + v),
)


def _item(body, props, total_delta=0):
    return struct.pack(">iiiii", 22 + len(body) + len(props) + total_delta, 0, 0, 0, len(body)) + body + \
        struct.pack(">h", len(props)) + props


def _plan(body, extra=b"", limit=4 << 20):
    return record_store.encode_batch(body, b"T", 0, 0, 1, V4_BORN, V4_STORE, 0, extra, limit, True)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=st.lists(st.tuples(st.binary(max_size=300), props_st), min_size=1, max_size=30),
       extra=st.sampled_from([b"", b"CLUSTER\x01c\x02", b"A\x01b"]))
def test_plan_counts_and_sizes_every_record(items, extra):
    body = b"".join(_item(b, p) for b, p in items)
    _, count, total = _plan(body, extra)
    records, n, _ = record_store.encode_batch(body, b"T", 0, 0, 1, V4_BORN, V4_STORE, 0, extra, 4 << 20)
    assert (count, total) == (n, len(records)) == (len(items), len(records))


@pytest.mark.parametrize("body, error, match", [
    (_item(b"x" * 10, b"") + b"\x00" * 7, record_native.BatchFormatError, "truncated at byte 32: 7 bytes left"),
    (_item(b"x" * 10, b"", total_delta=1), record_native.BatchFormatError, "item 0 at byte 0: total size 33 != 22"),
    (_item(b"ok", b"") + struct.pack(">iiiii", 40, 0, 0, 0, 500), record_native.BatchFormatError,
     "item 1 at byte 24: body length 500 runs past the end"),
    (_item(b"ok", b"") + struct.pack(">iiiii", 30, 0, 0, 0, 2) + b"ab" + struct.pack(">h", 90), record_native.BatchFormatError,
     "item 1 at byte 24: properties length 90 runs past the end"),
    (_item(b"x" * 2000, b""), MessageTooLargeError, "2"),
])
def test_plan_names_the_first_bad_item(body, error, match):
    with pytest.raises(error, match=match):
        _plan(body, limit=1000)


def test_plan_refuses_properties_over_32767_bytes_with_the_extra_ones():
    body = _item(b"b", b"K\x01" + b"v" * 32700 + b"\x02")
    assert _plan(body)[1] == 1
    with pytest.raises(record_native.PropertiesSizeExceededError, match="batch item 0: properties are 32803 bytes"):
        _plan(body, extra=b"E\x01" + b"w" * 98)
