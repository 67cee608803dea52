"""Bloom prefilter for SQL92 subscriptions (RocketMQ's org.apache.rocketmq.filter.util.BloomFilter).

At dispatch the broker evaluates each registered SQL92 subscription of the topic once and, for the
groups that match, sets the group's k bits in a per-message bit map of m bits stored beside the
consume-queue entry.  A pull then skips entries whose map lacks any of the group's bits without
reading the commit log.  A bloom filter has false positives (a group's bits set by other groups)
but no false negatives, so a miss proves "this group did not match".

Same numbers as RocketMQ, so bit maps mean the same thing on both brokers:
- k = ceil(log_0.5(f)) hash functions and m = ceil(n * log2(1/f) * log2(e)) bits rounded up to a
  whole byte, for an error rate f (percent) and n expected subscriptions;
- the bit positions of a key ("group#topic") come from murmur3_x64_128 of its UTF-8 bytes (seed 0,
  Guava's `asLong()` = the first 64-bit half): hash1 = low 32 bits, hash2 = high 32 bits,
  position i (1..k) = (hash1 + i * hash2 as a Java int, bit-flipped when negative) mod m
  (Kirsch & Mitzenmacher's double hashing);
- bit i lives in byte i >> 3 under mask 1 << (i & 7).
"""
from __future__ import annotations

import math
import struct

import attrs

from rmq_core.errors import IllegalArgumentError

_M64 = (1 << 64) - 1
_C1 = 0x87C37B91114253D5
_C2 = 0x4CF5AD432745937F


def _rotl64(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M64


def _fmix64(k: int) -> int:
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & _M64
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & _M64
    k ^= k >> 33
    return k


# the two halves' block mixes (Guava's mixK1 / mixK2), for the blocks and the tail alike
def _mix_k1(k1: int) -> int:
    return (_rotl64((k1 * _C1) & _M64, 31) * _C2) & _M64


def _mix_k2(k2: int) -> int:
    return (_rotl64((k2 * _C2) & _M64, 33) * _C1) & _M64


def murmur3_x64_128(data: bytes, seed: int = 0) -> tuple[int, int]:
    """MurmurHash3 x64 128-bit: (h1, h2) as unsigned 64-bit ints (Guava's murmur3_128)."""
    length = len(data)
    h1 = h2 = seed & _M64
    nblocks = length // 16
    for k1, k2 in struct.iter_unpack("<QQ", data[: nblocks * 16]):
        h1 ^= _mix_k1(k1)
        h1 = _rotl64(h1, 27)
        h1 = (h1 + h2) & _M64
        h1 = (h1 * 5 + 0x52DCE729) & _M64
        h2 ^= _mix_k2(k2)
        h2 = _rotl64(h2, 31)
        h2 = (h2 + h1) & _M64
        h2 = (h2 * 5 + 0x38495AB5) & _M64
    tail = data[nblocks * 16:]
    if len(tail) > 8:
        h2 ^= _mix_k2(int.from_bytes(tail[8:], "little"))
    if tail:
        h1 ^= _mix_k1(int.from_bytes(tail[:8], "little"))
    h1 ^= length
    h2 ^= length
    h1 = (h1 + h2) & _M64
    h2 = (h2 + h1) & _M64
    h1 = _fmix64(h1)
    h2 = _fmix64(h2)
    h1 = (h1 + h2) & _M64
    h2 = (h2 + h1) & _M64
    return h1, h2


def _int32(x: int) -> int:
    x &= 0xFFFFFFFF
    return x - 0x100000000 if x & 0x80000000 else x


@attrs.frozen
class BloomFilterData:
    """The bit positions of one key and the bit-map size they belong to (RocketMQ's BloomFilterData).

    `mask` is the same positions as one int: bit i of a little-endian int is bit i of the map
    (byte i >> 3, mask 1 << (i & 7)), so `int.from_bytes(map, "little") & mask == mask` is the
    whole test and `(bits | mask).to_bytes(m // 8, "little")` the whole update."""

    bit_pos: tuple = attrs.field(converter=tuple)
    bit_num: int
    mask: int = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self):
        mask = 0
        for bit in self.bit_pos:
            mask |= 1 << bit
        object.__setattr__(self, "mask", mask)

    def to_json(self) -> dict:
        return {"bitNum": self.bit_num, "bitPos": list(self.bit_pos)}

    @classmethod
    def from_json(cls, data: dict) -> "BloomFilterData":
        return cls(tuple(int(b) for b in data["bitPos"]), int(data["bitNum"]))


class BloomFilter:
    """m bits, k hash functions, sized for `expected_count` keys at `error_rate_percent` errors."""

    def __init__(self, expected_count: int = 32, error_rate_percent: int = 20):
        if not isinstance(error_rate_percent, int) or not 1 <= error_rate_percent < 100:
            raise IllegalArgumentError(
                f"bad bloom filter error rate {error_rate_percent!r}: must be a whole percent in 1..99 "
                "(maxErrorRateOfBloomFilter)"
            )
        if not isinstance(expected_count, int) or expected_count < 1:
            raise IllegalArgumentError(
                f"bad bloom filter expected count {expected_count!r}: must be at least 1 "
                "(expectConsumerNumUseFilter)"
            )
        self.error_rate_percent = error_rate_percent
        self.expected_count = expected_count
        error_rate = error_rate_percent / 100.0
        self.k = int(math.ceil(math.log(error_rate) / math.log(0.5)))
        m = int(math.ceil(expected_count * (math.log(1 / error_rate) / math.log(2)) * (math.log(math.e) / math.log(2))))
        self.m = 8 * int(math.ceil(m / 8.0))

    @property
    def byte_length(self) -> int:
        return self.m >> 3

    def calc_bit_positions(self, key: str) -> tuple:
        # Java's String.getBytes(UTF_8) writes '?' for an unpaired surrogate; so does 'replace'.
        h1, _ = murmur3_x64_128(key.encode("utf-8", "replace"))
        hash1 = _int32(h1)
        hash2 = _int32(h1 >> 32)
        positions = []
        for i in range(1, self.k + 1):
            combined = _int32(hash1 + i * hash2)
            if combined < 0:
                combined = ~combined
            positions.append(combined % self.m)
        return tuple(positions)

    def generate(self, key: str) -> BloomFilterData:
        return BloomFilterData(self.calc_bit_positions(key), self.m)

    def is_valid(self, data: BloomFilterData | None) -> bool:
        """True when `data` was generated by a filter of this size (after a config change it is not)."""
        return data is not None and data.bit_num == self.m and len(data.bit_pos) == self.k

    def new_bitmap(self) -> bytearray:
        return bytearray(self.byte_length)

    def _check(self, data: BloomFilterData, bitmap) -> None:
        if not self.is_valid(data):
            raise IllegalArgumentError(
                f"bloom filter data {data!r} does not belong to this filter (m={self.m}, k={self.k})"
            )
        if len(bitmap) != self.byte_length:
            raise IllegalArgumentError(
                f"bit map of {len(bitmap)} bytes does not fit this filter ({self.byte_length} bytes, m={self.m})"
            )

    def hash_to(self, data: BloomFilterData, bitmap: bytearray) -> None:
        """Set `data`'s bits in `bitmap` (a bytearray of `byte_length` bytes)."""
        self._check(data, bitmap)
        for bit in data.bit_pos:
            bitmap[bit >> 3] |= 1 << (bit & 7)

    def is_hit(self, data: BloomFilterData, bitmap) -> bool:
        """True when every bit of `data` is set in `bitmap`: the key may have been added."""
        if len(bitmap) != self.byte_length or data.bit_num != self.m or len(data.bit_pos) != self.k:
            self._check(data, bitmap)  # raises the error naming what does not fit
        mask = data.mask
        return int.from_bytes(bitmap, "little") & mask == mask

    def __eq__(self, other) -> bool:
        return isinstance(other, BloomFilter) and (self.m, self.k) == (other.m, other.k)

    def __hash__(self) -> int:
        return hash((self.m, self.k))

    def __repr__(self) -> str:
        return (
            f"BloomFilter(expected_count={self.expected_count}, error_rate_percent={self.error_rate_percent}, "
            f"k={self.k}, m={self.m})"
        )
