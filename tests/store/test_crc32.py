"""Our CRC32 (PCLMUL folding and slicing-by-8) equals zlib.crc32 for every length and alignment."""
import zlib

import pytest
from hypothesis import given, settings, strategies as st

from rmq_core._native import crc as crc_native


def test_native_store_module_is_compiled():
    # a silently missing extension must not let the suite pass on some fallback
    assert crc_native.__file__.endswith((".so", ".pyd"))


@pytest.fixture(params=[True, False], ids=["pclmul", "slice8"])
def impl(request):
    chosen = crc_native.crc32_select(request.param)
    if request.param and not chosen:
        pytest.skip("CPU without PCLMULQDQ")
    yield chosen
    crc_native.crc32_select(True)


def test_every_length_and_alignment_up_to_4096(impl):
    data = bytes((i * 131 + 7) & 0xFF for i in range(4096 + 16))
    mv = memoryview(data)
    for length in range(0, 4097):
        off = length % 16
        assert crc_native.crc32(mv[off:off + length]) == zlib.crc32(mv[off:off + length]), length


@settings(max_examples=300, deadline=None)
@given(data=st.binary(min_size=0, max_size=5000), offset=st.integers(0, 63), seed=st.integers(0, 2**32 - 1))
def test_random_data_alignments_and_chaining(data, offset, seed):
    buf = bytes(offset) + data
    view = memoryview(buf)[offset:]
    cut = seed % (len(data) + 1)
    try:
        for use_pclmul in (True, False):
            crc_native.crc32_select(use_pclmul)
            assert crc_native.crc32(view) == zlib.crc32(data)
            # chaining with a start value, as zlib.crc32(data, value)
            assert crc_native.crc32(view[cut:], crc_native.crc32(view[:cut])) == zlib.crc32(data)
            assert crc_native.crc32(data, seed) == zlib.crc32(data, seed)
    finally:
        crc_native.crc32_select(True)


def test_known_value():
    assert crc_native.crc32(b"seed-0") & 0x7FFFFFFF == 0x2873287F  # docs/protocol.md §5.1
    assert crc_native.crc32_impl() in ("vpclmul", "pclmul", "slice8")
