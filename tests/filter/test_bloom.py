"""Bloom prefilter: RocketMQ's sizing, Guava's murmur3 bit positions, the bit layout."""
import mmh3
import pytest
from hypothesis import given, strategies as st

from rmq_core.errors import IllegalArgumentError
from rmq_core.filtering import MessageFilter
from rmq_core.bloom import BloomFilter, BloomFilterData, murmur3_x64_128


def test_murmur3_matches_guava_vectors():
    # Guava Murmur3Hash128Test: hashes of "hell" and of the fox sentence with seed 0.
    assert murmur3_x64_128(b"hell") == (0x629942693E10F867, 0x92DB0B82BAEB5347)
    assert murmur3_x64_128(b"The quick brown fox jumps over the lazy dog") == (
        0xE34BBC7BBC071B6C, 0x7A433CA9C49A9347,
    )


@given(st.binary(max_size=100), st.integers(min_value=0, max_value=2**32 - 1))
def test_murmur3_matches_reference_implementation(data, seed):
    assert murmur3_x64_128(data, seed) == mmh3.hash64(data, seed=seed, x64arch=True, signed=False)


@pytest.mark.parametrize(
    "n,f,k,m",
    [(32, 20, 3, 112), (64, 20, 3, 216), (1, 50, 1, 8), (128, 10, 4, 616), (10, 1, 7, 96)],
)
def test_sizing_follows_rocketmq(n, f, k, m):
    # k = ceil(log_0.5(f)), m = ceil(n * log2(1/f) * log2(e)) rounded up to whole bytes
    bf = BloomFilter(expected_count=n, error_rate_percent=f)
    assert (bf.k, bf.m) == (k, m)
    assert bf.byte_length == m // 8


@pytest.mark.parametrize("n,f", [(0, 20), (32, 0), (32, 100), (32, 20.5), ("32", 20)])
def test_bad_sizes_are_refused(n, f):
    with pytest.raises(IllegalArgumentError):
        BloomFilter(n, f)


@given(st.text(max_size=30))
def test_positions_are_k_values_below_m_and_deterministic(key):
    bf = BloomFilter(32, 20)
    pos = bf.calc_bit_positions(key)
    assert len(pos) == bf.k and all(0 <= p < bf.m for p in pos)
    assert bf.generate(key) == BloomFilterData(pos, bf.m) == bf.generate(key)


def test_bit_layout_is_byte_i_shift_3_mask_1_shift_i_and_7():
    bf = BloomFilter(32, 20)
    data = BloomFilterData((0, 9, 111), bf.m)
    bitmap = bf.new_bitmap()
    bf.hash_to(data, bitmap)
    assert bitmap[0] == 0x01 and bitmap[1] == 0x02 and bitmap[13] == 0x80
    assert sum(bin(b).count("1") for b in bitmap) == 3
    assert bf.is_hit(data, bitmap)
    assert not bf.is_hit(BloomFilterData((0, 9, 110), bf.m), bitmap)
    # the store's contract test reads the same bits
    f = MessageFilter()
    f.bloom_bits = data.bit_pos
    assert f.is_matched_by_consume_queue(0, bytes(bitmap))
    assert not f.is_matched_by_consume_queue(0, bytes(bf.m // 8 - 1) + b"\x80")


@given(st.lists(st.text(max_size=10), max_size=40), st.text(max_size=10))
def test_no_false_negatives(added, probe):
    bf = BloomFilter(32, 20)
    bitmap = bf.new_bitmap()
    for key in added:
        bf.hash_to(bf.generate(key), bitmap)
    for key in added:
        assert bf.is_hit(bf.generate(key), bitmap)
    if not any(bitmap):
        assert not bf.is_hit(bf.generate(probe), bitmap)


def test_false_positive_rate_is_near_the_configured_rate():
    bf = BloomFilter(32, 20)
    bitmap = bf.new_bitmap()
    for i in range(32):
        bf.hash_to(bf.generate(f"group{i}#topic"), bitmap)
    hits = sum(bf.is_hit(bf.generate(f"other{i}#topic"), bitmap) for i in range(2000))
    assert hits / 2000 < 0.35  # configured 20% at the expected count; generous bound for one sample


def test_foreign_data_and_wrong_bitmap_size_are_refused():
    bf = BloomFilter(32, 20)
    other = BloomFilter(64, 20)
    with pytest.raises(IllegalArgumentError):
        bf.is_hit(other.generate("g#t"), bf.new_bitmap())
    with pytest.raises(IllegalArgumentError):
        bf.hash_to(bf.generate("g#t"), bytearray(3))
    assert not bf.is_valid(other.generate("g#t")) and not bf.is_valid(None)
    assert bf.is_valid(bf.generate("g#t"))


def test_json_round_trip():
    data = BloomFilter(32, 20).generate("g#t")
    assert BloomFilterData.from_json(data.to_json()) == data
    assert data.to_json()["bitNum"] == 112
