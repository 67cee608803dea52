"""Client-side decode benchmarks, each beside the pure-Python baseline measured in the same run.

* decode-100k: a PULL-body-like buffer of N=100k records (128-byte bodies, properties UNIQ_KEY,
  TAGS, KEYS, WAIT) decoded by the pure-Python reference decoder (baseline), by the native decoder
  touching `.properties` of every message ("full"), touching `.properties` and `.body` ("full +
  body"), reading every field a consumer reads (topic, tags, keys, msg_id, queue id and offsets,
  hosts, timestamps, reconsume times, body) off every message ("every field"), and leaving both
  lazy ("lazy").  records/s is attached as extra info and printed.
* batch-decode: a 1000-item SEND_BATCH_MESSAGE body, native vs pure Python.
* tags-code: the consume-queue tag code from a raw properties blob (native scan) vs building the
  dict and hashing in Python.
"""
import pytest

from rmq_core.codec import decode_batch_body, decode_messages, tags_code_from_properties
from tests.codec_oracle import (
    decode_batch_body_py,
    decode_messages_py,
    encode_batch_items,
    encode_message_record,
    tags_code_from_properties_py,
)

N = 100_000


def _properties(i):
    return {"UNIQ_KEY": f"0100007F0000A7E900007ABB{i:08X}", "TAGS": f"Tag{i % 4}",
            "KEYS": f"order-{i % 1000}", "WAIT": "true"}


@pytest.fixture(scope="module")
def pull_buffer():
    return b"".join(
        encode_message_record(topic="BenchTopic", body=bytes([i & 0xFF]) * 128, queue_id=i % 4,
                              queue_offset=i, commit_log_offset=i * 300, born_timestamp=1_700_000_000_000 + i,
                              store_timestamp=1_700_000_000_000 + i, born_host=("10.0.0.7", 50000),
                              store_host=("10.0.0.1", 10911), properties=_properties(i))
        for i in range(N)
    )


def _report(benchmark, label):
    rate = N / benchmark.stats.stats.median
    benchmark.extra_info["records_per_s"] = rate
    print(f"\n{label}: {rate / 1e6:.2f} M records/s")


@pytest.mark.benchmark(group="decode-100k")
def test_decode_baseline_pure_python(benchmark, pull_buffer):
    out = benchmark.pedantic(decode_messages_py, args=(pull_buffer,), rounds=3, iterations=1)
    assert len(out) == N and out[-1].properties == _properties(N - 1)
    _report(benchmark, "pure-Python decode (baseline)")


@pytest.mark.benchmark(group="decode-100k")
def test_decode_native_full(benchmark, pull_buffer):
    def run():
        msgs = decode_messages(pull_buffer)
        for m in msgs:
            m.properties
        return msgs

    out = benchmark.pedantic(run, rounds=10, iterations=1, warmup_rounds=1)
    assert len(out) == N and out[-1].properties == _properties(N - 1)
    _report(benchmark, "native decode, properties touched")


@pytest.mark.benchmark(group="decode-100k")
def test_decode_native_full_with_body(benchmark, pull_buffer):
    def run():
        msgs = decode_messages(pull_buffer)
        for m in msgs:
            m.properties
            m.body
        return msgs

    out = benchmark.pedantic(run, rounds=10, iterations=1, warmup_rounds=1)
    assert out[7].body == bytes([7]) * 128
    _report(benchmark, "native decode, properties and body touched")


@pytest.mark.benchmark(group="decode-100k")
def test_decode_native_every_field(benchmark, pull_buffer):
    def run():
        msgs = decode_messages(pull_buffer)
        for m in msgs:
            (m.topic, m.tags, m.keys, m.msg_id, m.queue_id, m.queue_offset, m.commit_log_offset,
             m.born_host, m.store_host, m.born_timestamp, m.store_timestamp, m.reconsume_times,
             m.properties, m.body)
        return msgs

    out = benchmark.pedantic(run, rounds=10, iterations=1, warmup_rounds=1)
    m = out[9]
    assert (m.topic, m.tags, m.keys, m.msg_id, m.born_host, m.store_host, m.body) == (
        "BenchTopic", "Tag1", "order-9", _properties(9)["UNIQ_KEY"], "10.0.0.7:50000",
        "10.0.0.1:10911", bytes([9]) * 128)
    _report(benchmark, "native decode, every field read")


@pytest.mark.benchmark(group="decode-100k")
def test_decode_native_lazy(benchmark, pull_buffer):
    out = benchmark.pedantic(decode_messages, args=(pull_buffer,), rounds=10, iterations=1, warmup_rounds=1)
    assert len(out) == N and out[5].msg_id == _properties(5)["UNIQ_KEY"]
    _report(benchmark, "native decode, lazy")


@pytest.fixture(scope="module")
def batch_body():
    return encode_batch_items([(0, b"x" * 128, _properties(i)) for i in range(1000)])


@pytest.mark.benchmark(group="batch-decode")
def test_batch_decode_baseline_pure_python(benchmark, batch_body):
    assert len(benchmark(decode_batch_body_py, batch_body)) == 1000


@pytest.mark.benchmark(group="batch-decode")
def test_batch_decode_native(benchmark, batch_body):
    assert len(benchmark(decode_batch_body, batch_body)) == 1000


RAW_PROPS = [encode_batch_items([(0, b"", _properties(i))])[22:] for i in range(1000)]


@pytest.mark.benchmark(group="tags-code")
def test_tags_code_baseline_pure_python(benchmark):
    codes = benchmark(lambda: [tags_code_from_properties_py(p) for p in RAW_PROPS])
    assert codes[:2] == [tags_code_from_properties(p) for p in RAW_PROPS[:2]]


@pytest.mark.benchmark(group="tags-code")
def test_tags_code_native(benchmark):
    codes = benchmark(lambda: [tags_code_from_properties(p) for p in RAW_PROPS])
    assert codes == [tags_code_from_properties_py(p) for p in RAW_PROPS]
