"""Each CRC32 folding level the CPU offers (512-bit VPCLMULQDQ, 128-bit PCLMULQDQ, tables) equals
zlib.crc32 for every length, alignment and start value that reaches its folding loops."""
import zlib

import pytest

from rmq_core._native import crc as crc_native

DATA = bytes(((i * 131 + 7) ^ (i >> 7)) & 0xFF for i in range(4300))


@pytest.fixture(params=[("vpclmul", True, True), ("pclmul", True, False), ("slice8", False, False)],
                ids=lambda p: p[0])
def level(request):
    name, pclmul, vpclmul = request.param
    crc_native.crc32_select(pclmul, vpclmul)
    try:
        if crc_native.crc32_impl() != name:
            pytest.skip(f"CPU without {name}")
        yield name
    finally:
        crc_native.crc32_select(True)


def test_every_length_up_to_4200_at_three_alignments(level):
    mv = memoryview(DATA)
    for off in (0, 5, 17):
        for n in range(0, 4201):
            assert crc_native.crc32(mv[off:off + n], 0x1234) == zlib.crc32(mv[off:off + n], 0x1234), (level, off, n)


def test_default_is_the_widest_the_cpu_has():
    if not crc_native.crc32_select(True):
        pytest.skip("CPU without PCLMULQDQ")
    assert crc_native.crc32_impl() in ("vpclmul", "pclmul")
    crc_native.crc32_select(True, False)
    try:
        assert crc_native.crc32_impl() == "pclmul"
    finally:
        crc_native.crc32_select(True)
