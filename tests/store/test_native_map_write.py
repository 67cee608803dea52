"""NativeMap.write: small writes copy plainly, large ones (a batch's consume-queue entries) stream
whole lines; either way exactly the given bytes land at the given position and nothing around them."""
import os

import pytest

from rmq_core._native import mapped as mapped_native


@pytest.mark.parametrize("n", [0, 1, 63, 64, 65_535, 65_536, 65_537, 163_840, 200_003])
@pytest.mark.parametrize("pos", [0, 1, 20, 63, 64, 4095])
@pytest.mark.parametrize("kind", [bytearray, bytes, memoryview])
def test_write_puts_exactly_the_bytes_at_pos(n, pos, kind):
    target = bytearray(b"\xa5" * (pos + n + 128))
    data = os.urandom(n)
    m = mapped_native.NativeMap(target)
    try:
        m.write(pos, kind(data))
    finally:
        m.release()
    assert target[pos:pos + n] == data
    assert target[:pos] == b"\xa5" * pos and target[pos + n:] == b"\xa5" * 128


def test_write_past_the_end_is_refused_and_writes_nothing():
    target = bytearray(100_000)
    m = mapped_native.NativeMap(target)
    try:
        with pytest.raises(ValueError, match="range 40000..110000 outside mapped file of 100000 bytes"):
            m.write(40_000, bytearray(b"\x01" * 70_000))
    finally:
        m.release()
    assert target == bytearray(100_000)
