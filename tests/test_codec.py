"""Message codec: captured vectors from the real C++ client, native vs pure-Python twins, bad input."""
import json
import mmap
import pickle
import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rmq_core
import rmq_core._native.record as native
from rmq_core import codec, compression, message
from rmq_core.codec import (
    MessageDecodeError,
    MessageExt,
    decode_batch_body,
    decode_message,
    decode_messages,
    java_string_hash,
    properties_to_bytes,
    string_to_properties,
    tags_code_from_properties,
)
from tests.codec_oracle import (
    decode_batch_body_py,
    decode_messages_py,
    encode_batch_items,
    encode_message_record,
    java_string_hash_py,
    properties_to_bytes_py,
    string_to_properties_py,
    tags_code_from_properties_py,
)
from rmq_core.errors import IllegalArgumentError
from tests.paths import CAPTURES


DECODERS = {"native": decode_messages, "python": decode_messages_py}
BATCH_DECODERS = {"native": decode_batch_body, "python": decode_batch_body_py}


def _frames(scenario):
    for line in (CAPTURES / f"{scenario}.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "frame_hex" in rec:
            yield rec


def _frame_body(rec) -> bytes:
    frame = bytes.fromhex(rec["frame_hex"])
    (header_len,) = struct.unpack_from(">i", frame, 4)
    return frame[8 + header_len:]


def _pull_bodies(scenario):
    """(body bytes, pull_body_decoded) of every PULL response carrying records."""
    return [(_frame_body(r), r["pull_body_decoded"]) for r in _frames(scenario) if r.get("pull_body_decoded")]


def _fields(m: MessageExt) -> dict:
    d = m.to_dict()
    d.update(msg_id=m.msg_id, tags=m.tags, keys=m.keys, offset_msg_id=m.offset_msg_id)
    return d


# --- the extension really is native -----------------------------------------------------------------
def test_native_extension_is_compiled():
    assert native.__file__.endswith((".so", ".pyd")), native.__file__
    assert type(MessageExt.__init__).__name__ in ("wrapper_descriptor", "cython_function_or_method")
    assert message.MessageExt is MessageExt and rmq_core.MessageExt is MessageExt


# --- captured vectors ----------------------------------------------------------------------------------
def test_encoder_reproduces_the_181_byte_record_of_remoting_6_1():
    body, decoded = _pull_bodies("pull")[0]
    expected = body[:181]
    first = decoded[0]
    record = encode_message_record(
        topic="CapTopic", body=b"seed-0", queue_id=0, queue_offset=0, commit_log_offset=0,
        born_timestamp=first["bornTimestamp"], born_host=("127.0.0.1", 40000),
        store_timestamp=first["storeTimestamp"], store_host=("127.0.0.1", 10911),
        properties="KEYS\x01seedkey0\x02TAGS\x01TagA\x02UNIQ_KEY\x0100000000000000000000C0FFEE000000"
                   "\x02WAIT\x01true\x02",
    )
    assert len(record) == 181
    assert record == expected
    assert record[8:12] == bytes.fromhex("2873287f")  # CRC32("seed-0") & 0x7fffffff, as in docs/protocol.md §5.1


@pytest.mark.parametrize("impl", DECODERS)
@pytest.mark.parametrize("scenario", ["pull", "push_cluster", "push_orderly", "push_tagfilter"])
def test_captured_pull_bodies_decode_field_for_field(scenario, impl):
    decode = DECODERS[impl]
    bodies = _pull_bodies(scenario)
    assert bodies
    for body, expected in bodies:
        messages = decode(body, broker_name="broker-a")
        assert len(messages) == len(expected)
        for m, e in zip(messages, expected):
            assert m.store_size == e["totalSize"]
            assert m.body_crc == e["bodyCRC"]
            assert (m.queue_id, m.flag, m.queue_offset) == (e["queueId"], e["flag"], e["queueOffset"])
            assert m.commit_log_offset == e["physicalOffset"]
            assert m.sys_flag == e["sysFlag"] & ~0x701  # the compression bits are cleared once inflated
            assert (m.born_timestamp, m.born_host) == (e["bornTimestamp"], e["bornHost"])
            assert (m.store_timestamp, m.store_host) == (e["storeTimestamp"], e["storeHost"])
            assert m.reconsume_times == e["reconsumeTimes"]
            assert m.prepared_transaction_offset == e["preparedTransactionOffset"]
            assert m.topic == e["topic"]
            assert m.properties == e["properties"]
            assert m.broker_name == "broker-a"
            preview = e["body_preview"]
            if preview.startswith("zlib-inflated:"):
                assert e["sysFlag"] & 1
                assert m.body.decode().startswith(preview[len("zlib-inflated:"):].split("...")[0])
                assert len(m.body) == int(preview.rsplit("(", 1)[1].split()[0])
            else:
                assert m.body.decode() == preview


def test_captured_records_reencode_byte_for_byte():
    """Decode without inflating, re-encode every field: the record comes back identical."""
    seen = 0
    for scenario in ("pull", "push_cluster", "push_orderly", "push_broadcast", "pull_bad_compressed"):
        for body, _ in _pull_bodies(scenario):
            pos = 0
            for m in decode_messages(body, decompress=False):
                d = m.to_dict()
                d["properties"] = m.raw_properties
                for k in ("store_size", "body_crc", "broker_name"):
                    del d[k]
                assert encode_message_record(**d) == body[pos:pos + m.store_size]
                pos += m.store_size
                seen += 1
            assert pos == len(body)
    assert seen > 50


def test_what_the_real_client_saw_in_the_pull_scenario():
    """pull.client.jsonl: every attribute the C++ client reported for each pulled message."""
    decoded = {}
    for body, _ in _pull_bodies("pull"):
        for m in decode_messages(body):
            decoded[(m.queue_id, m.queue_offset)] = m
    pulled = [json.loads(x) for x in (CAPTURES / "pull.client.jsonl").read_text().splitlines()]
    pulled = [p for p in pulled if p["kind"] in ("pulled", "pulled_tagA")]
    assert len(pulled) >= 13
    for p in pulled:
        m = decoded[(p["queue_id"], p["queue_offset"])]
        assert m.topic == p["topic"]
        assert m.tags == (p["tags"] or None)
        assert m.keys == (p["keys"] or None)
        assert m.commit_log_offset == p["commit_log_offset"]
        assert m.store_size == p["store_size"]
        assert (m.born_timestamp, m.store_timestamp) == (p["born_timestamp"], p["store_timestamp"])
        assert m.reconsume_times == p["reconsume_times"]
        assert m.delay_time_level == p["delay_time_level"]
        assert m.prepared_transaction_offset == p["prepared_transaction_offset"]
        assert len(m.body) == p["body_len"]
        assert m.body.decode().startswith(p["body_preview"])
        for key, value in p.items():
            if key.startswith("prop_"):
                assert m.get_user_property(key[5:]) == value
        if m.get_property("UNIQ_KEY"):
            assert m.msg_id == p["id"]
        else:
            # No UNIQ_KEY: the id is the offsetMsgId.  We give Java's byte order; the C++ client
            # shows the IPv4 bytes reversed (docs/protocol.md §5.4) — same id otherwise.
            assert m.msg_id == m.offset_msg_id == "7F00000100002A9F00000000000007E7"
            assert p["id"] == "0100007F" + m.msg_id[8:]
    by_id = {m.msg_id: m for m in decoded.values()}
    zipped = by_id["00000000000000000000C0FFEE0000FF"]
    assert zipped.body == b"compressed-body-" * 400 and zipped.sys_flag == 0
    utf8 = by_id["00000000000000000000C0FFEE0000FE"]
    assert utf8.body.decode() == "ünïcödé-消息" and utf8.get_user_property("userProp") == "v"
    assert utf8.keys == "k1 k2"
    no_uniq = by_id["7F00000100002A9F00000000000007E7"]
    assert (no_uniq.flag, no_uniq.reconsume_times, no_uniq.born_host) == (7, 2, "10.1.2.3:51234")


def test_bad_compressed_capture_is_a_decode_error_not_garbage():
    body, decoded = _pull_bodies("pull_bad_compressed")[0]
    assert decoded[0]["sysFlag"] == 0x101
    for decode in DECODERS.values():
        with pytest.raises(MessageDecodeError) as err:
            decode(body)
        assert err.value.offset == 0 and "LZ4" in str(err.value)
    raw = decode_messages(body, decompress=False)[0]
    assert raw.sys_flag == 0x101 and raw.body == b"this-is-not-zlib-data"


@pytest.mark.parametrize("impl", BATCH_DECODERS)
def test_captured_batch_bodies(impl):
    decode = BATCH_DECODERS[impl]
    batches = [r for r in _frames("producer") if r.get("batch_decoded")]
    assert len(batches) == 2
    for r in batches:
        body = _frame_body(r)
        if r.get("batch_body_was_zlib_compressed"):
            body = compression.decompress(body, int(r["header"]["extFields"]["sysFlag"]))
        items = decode(body)
        assert len(items) == len(r["batch_decoded"])
        for (flag, item_body, props), e in zip(items, r["batch_decoded"]):
            assert flag == e["flag"]
            assert len(item_body) == e["bodyLen"]
            assert item_body.decode().startswith(e["body"].split("...")[0])
            assert props.decode() == e["propertiesRaw"]
            assert string_to_properties(props) == e["properties"]
        # The client's own encoding, reproduced byte for byte.
        assert encode_batch_items(items) == body


# --- records: native vs pure Python ----------------------------------------------------------------
_ipv4 = st.tuples(*[st.integers(0, 255)] * 4).map(lambda t: ".".join(map(str, t)))
_ipv6 = st.binary(min_size=16, max_size=16).map(lambda b: message.socket.inet_ntop(message.socket.AF_INET6, b))
_host = st.tuples(st.one_of(_ipv4, _ipv6), st.integers(0, 65535))
_prop_text = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), max_size=12)
_props = st.dictionaries(_prop_text.filter(bool), _prop_text, max_size=6)
_topic = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40).filter(
    lambda t: len(t.encode()) <= 127)
_i32 = st.integers(-(2**31), 2**31 - 1)
_i64 = st.integers(-(2**63), 2**63 - 1)


@st.composite
def record_fields(draw):
    return dict(
        topic=draw(_topic), body=draw(st.binary(max_size=300)), queue_id=draw(_i32), flag=draw(_i32),
        queue_offset=draw(_i64), commit_log_offset=draw(_i64),
        sys_flag=draw(_i32) & ~0x701,  # uncompressed bodies here; compression has its own tests
        born_timestamp=draw(_i64), born_host=draw(_host), store_timestamp=draw(_i64),
        store_host=draw(_host), reconsume_times=draw(_i32), prepared_transaction_offset=draw(_i64),
        properties=draw(_props),
    )


def _check_decoded(m, f, size):
    assert m.topic == f["topic"] and m.body == f["body"]
    for k in ("queue_id", "flag", "queue_offset", "commit_log_offset", "born_timestamp",
              "store_timestamp", "reconsume_times", "prepared_transaction_offset"):
        assert getattr(m, k) == f[k], k
    assert m.properties == f["properties"]
    assert m.store_size == size
    assert m.body_crc == zlib.crc32(f["body"]) & 0x7FFFFFFF
    for attr, bit in (("born_host", 0x10), ("store_host", 0x20)):
        host, port = f[attr]
        assert m.to_dict()[attr] == f"{host}:{port}"
        assert bool(m.sys_flag & bit) == (":" in host)
    assert m.sys_flag & ~0x30 == f["sys_flag"] & ~0x30


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(record_fields(), min_size=1, max_size=4), st.lists(st.integers(8, 40), max_size=2))
def test_records_round_trip_native_and_python(fields, blanks):
    records = [encode_message_record(**f) for f in fields]
    blank_records = [struct.pack(">iI", n, 0xCBD43194) + bytes(n - 8) for n in blanks]
    buf = b"".join(records[:1] + blank_records + records[1:])
    nat, py = decode_messages(buf), decode_messages_py(buf)
    assert [_fields(m) for m in nat] == [_fields(m) for m in py]
    for m, f, rec in zip(nat, fields, records):
        _check_decoded(m, f, len(rec))
        again = dict(m.to_dict(), properties=m.raw_properties)
        for k in ("store_size", "body_crc", "broker_name"):
            del again[k]
        assert encode_message_record(**again) == rec
    # one record at a time, from a memoryview, at its offset
    pos = 0
    for rec in records[:1]:
        one = decode_message(memoryview(bytearray(buf)), pos)
        assert _fields(one) == _fields(nat[0])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_never_crash_the_decoders(data):
    for decode in (decode_messages, decode_messages_py, decode_batch_body, decode_batch_body_py):
        try:
            decode(data)
        except MessageDecodeError:
            pass


@settings(max_examples=100, deadline=None)
@given(record_fields(), st.data())
def test_every_truncation_and_corruption_is_a_decode_error(fields, data):
    rec = encode_message_record(**fields)
    for cut in range(0, len(rec), max(1, len(rec) // 25)):
        if cut == 0:
            assert decode_messages(rec[:0]) == []
            continue
        for decode in DECODERS.values():
            with pytest.raises(MessageDecodeError) as err:
                decode(rec + rec[:cut])
            assert err.value.offset == len(rec)
    # Flip one byte anywhere: either a valid (different) record or a decode error — never a crash.
    i = data.draw(st.integers(0, len(rec) - 1))
    bad = bytearray(rec)
    bad[i] ^= data.draw(st.integers(1, 255))
    results = []
    for decode in DECODERS.values():
        try:
            results.append([_fields(m) for m in decode(bytes(bad))])
        except MessageDecodeError as exc:
            results.append(("error", exc.offset))
    assert results[0] == results[1]


def test_decode_errors_name_offset_and_reason():
    rec = encode_message_record(topic="T", body=b"x", properties={"A": "1"})
    with pytest.raises(MessageDecodeError, match=r"offset %d: magic code 0x12345678" % len(rec)):
        decode_messages(rec + struct.pack(">iI", 100, 0x12345678) + bytes(92))
    with pytest.raises(MessageDecodeError, match=r"offset 0: record size 500 runs past the end"):
        decode_messages(struct.pack(">i", 500) + rec[4:])
    with pytest.raises(MessageDecodeError, match="truncated record: 3 bytes left"):
        decode_messages(rec + b"abc")
    bad_topic = bytearray(rec)
    bad_topic[88 + 1] = 200  # topic length byte after the 1-byte body
    with pytest.raises(MessageDecodeError, match="topic length 200"):
        decode_messages(bytes(bad_topic))
    with pytest.raises(MessageDecodeError, match="BLANK"):
        decode_message(struct.pack(">iI", 16, 0xCBD43194) + bytes(8))
    with pytest.raises(MessageDecodeError, match="outside the buffer"):
        decode_message(rec, len(rec) + 1)
    assert issubclass(MessageDecodeError, ValueError)
    with pytest.raises(TypeError):
        decode_messages("not bytes")


def test_decode_options_and_buffer_kinds(tmp_path):
    recs = [encode_message_record(topic="TopicA", body=b"body-%d" % i, queue_offset=i,
                                  properties={"TAGS": "T%d" % i}) for i in range(3)]
    buf = b"".join(recs)
    assert [m.body for m in decode_messages(buf, read_body=False)] == [None] * 3
    assert [m.body for m in decode_messages(bytearray(buf))] == [b"body-0", b"body-1", b"body-2"]
    # a reused receive buffer may be overwritten after decoding: messages must not see it
    scratch = bytearray(buf)
    msgs = decode_messages(memoryview(scratch))
    scratch[:] = bytes(len(scratch))
    assert [m.tags for m in msgs] == ["T0", "T1", "T2"] and msgs[2].body == b"body-2"
    # a slice of a received frame (memoryview over bytes) is decoded in place, lazily read parts
    # included; a view with another item format reads the same bytes
    frame = b"HEADER" + buf + b"TRAILER"
    in_place = decode_messages(memoryview(frame)[6:6 + len(buf)])
    assert [(m.body, m.tags, m.raw_properties) for m in in_place] == \
           [(b"body-%d" % i, "T%d" % i, b"TAGS\x01T%d\x02" % i) for i in range(3)]
    if len(buf) % 4 == 0:
        assert [m.body for m in decode_messages(memoryview(buf).cast("i"))] == [m.body for m in in_place]
    with pytest.raises(MessageDecodeError, match="offset 0"):
        decode_messages(memoryview(frame)[:len(buf)])
    # decode_message over a memory-mapped file: only the record at the offset is read
    path = tmp_path / "segment"
    path.write_bytes(buf + struct.pack(">iI", 64, 0xCBD43194) + bytes(56))
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
        m = decode_message(mm, len(recs[0]))
        assert (m.queue_offset, m.body, m.tags) == (1, b"body-1", "T1")
        assert len(decode_messages(mm[:])) == 3  # the trailing BLANK is skipped


@pytest.mark.parametrize("kind", ["zlib", "lz4", "zstd"])
@pytest.mark.parametrize("impl", DECODERS)
def test_compressed_records_are_inflated_and_flags_cleared(kind, impl):
    plain = b"compressible body " * 500
    body, bits = compression.compress(plain, kind)
    rec = encode_message_record(topic="Z", body=body, sys_flag=bits | 0x8, properties={"TAGS": "z"})
    (m,) = DECODERS[impl](rec)
    assert m.body == plain and m.sys_flag == 0x8
    assert m.body_crc == zlib.crc32(body) & 0x7FFFFFFF  # CRC of the stored (compressed) body
    (raw,) = DECODERS[impl](rec, decompress=False)
    assert raw.body == body and raw.sys_flag == bits | 0x8


# --- MessageExt ------------------------------------------------------------------------------------------
def test_message_ext_from_keywords_and_derived_attributes():
    m = MessageExt(topic="T", body="héllo", queue_id=3, commit_log_offset=0x7E7,
                   store_host="127.0.0.1:10911", born_host=("10.0.0.1", 5),
                   properties={"TAGS": "TagA", "KEYS": "k1 k2", "DELAY": "3", "u": "v"})
    assert m.body == "héllo".encode()
    assert (m.tags, m.keys, m.delay_time_level) == ("TagA", "k1 k2", 3)
    assert m.offset_msg_id == "7F00000100002A9F00000000000007E7" == m.msg_id
    assert m.born_host == "10.0.0.1:5" and m.store_host == "127.0.0.1:10911"
    m.put_property("UNIQ_KEY", "ABC")
    assert m.msg_id == "ABC"
    m.msg_id = "explicit"
    assert m.msg_id == "explicit"
    m.tags, m.keys, m.delay_time_level = "TagB", ["a", "b"], 0
    assert m.properties == {"TAGS": "TagB", "KEYS": "a b", "u": "v", "UNIQ_KEY": "ABC"}
    m.put_user_property("color", 7)
    assert m.get_user_property("color") == "7" and m.get_property("missing", "d") == "d"
    m.put_property("color", None)
    assert "color" not in m.properties
    with pytest.raises(IllegalArgumentError, match="non-empty str"):
        m.put_property("", "x")
    with pytest.raises(IllegalArgumentError, match="'UNIQ_KEY' is reserved"):
        m.put_user_property("UNIQ_KEY", "x")
    m.properties = "A\x01b\x02"
    assert m.properties == {"A": "b"} and m.raw_properties == b"A\x01b\x02"
    m.queue_offset, m.reconsume_times, m.broker_name = 9, 2, "broker-b"
    assert (m.queue_offset, m.reconsume_times, m.broker_name) == (9, 2, "broker-b")
    with pytest.raises(OverflowError):
        m.queue_id = 2**31
    text = repr(m)
    assert text.startswith("MessageExt(topic='T'") and "broker_name='broker-b'" in text
    assert MessageExt().born_host == "0.0.0.0:0" and MessageExt().properties == {}


def test_message_ext_hosts_ipv6_and_bad_values():
    m = MessageExt(store_host="[::1]:10911", commit_log_offset=1)
    assert m.store_host == "::1:10911" and m.sys_flag & 0x20
    assert m.offset_msg_id == "0" * 31 + "1" + "00002A9F" + "0000000000000001"
    m.store_host = "127.0.0.1:1"
    assert not m.sys_flag & 0x20 and len(m.offset_msg_id) == 32
    for bad, needle in [("nohost", "expected ip:port"), ("1.2.3.4:x", "port 'x'"),
                        ("1.2.3.4:70000", "70000"), ("host.example:1", "not an IPv4 or IPv6")]:
        with pytest.raises(IllegalArgumentError, match=needle):
            MessageExt(born_host=bad)
    with pytest.raises(IllegalArgumentError, match="body must be bytes or str"):
        MessageExt(body=12)


def test_message_ext_lazy_parts_and_pickle():
    recs = b"".join(encode_message_record(topic="Lazy", body=b"b%d" % i, store_host=("10.0.0.9", 10911),
                                          properties={"UNIQ_KEY": "U%d" % i, "TAGS": "t"})
                    for i in range(2))
    a, b = decode_messages(recs, broker_name="bn")
    # read without building the dict, then build it: same answers
    assert (a.msg_id, a.tags, a.get_property("nope")) == ("U0", "t", None)
    assert a.properties == {"UNIQ_KEY": "U0", "TAGS": "t"}
    assert a.properties is a.properties  # cached
    a.properties["X"] = "y"
    assert a.get_property("X") == "y" and b"X\x01y\x02" in a.raw_properties
    assert b.raw_properties == b"UNIQ_KEY\x01U1\x02TAGS\x01t\x02"
    b.body = b"new"
    assert b.body == b"new"
    for m in (a, b):
        clone = pickle.loads(pickle.dumps(m))
        assert _fields(clone) == _fields(m)


# --- batch bodies ------------------------------------------------------------------------------------
_batch_item = st.tuples(_i32, st.binary(max_size=200), _props)


@settings(max_examples=200, deadline=None)
@given(st.lists(_batch_item, max_size=5))
def test_batch_bodies_round_trip(items):
    body = encode_batch_items(items)
    for decode in BATCH_DECODERS.values():
        out = decode(body)
        assert [(f, b) for f, b, _ in out] == [(f, b) for f, b, _ in items]
        assert [string_to_properties(p) for _, _, p in out] == [p for _, _, p in items]
    boundaries, pos = set(), 0
    for _, b, p in items:
        pos += 22 + len(b) + len(properties_to_bytes(p))
        boundaries.add(pos)
    for cut in range(1, len(body), max(1, len(body) // 20)):
        for decode in BATCH_DECODERS.values():
            if cut in boundaries:  # a shorter batch, still well formed
                assert len(decode(body[:cut])) < len(items)
                continue
            with pytest.raises(MessageDecodeError):
                decode(body[:cut])


def test_batch_errors_name_the_item():
    good = encode_batch_items([(0, b"a", {"K": "v"}), (1, b"bb", "")])
    first = struct.unpack_from(">i", good)[0]
    lying = bytearray(good)
    struct.pack_into(">i", lying, first + 16, 10**6)  # second item's body length
    with pytest.raises(MessageDecodeError, match=f"offset {first}: batch item body length 1000000"):
        decode_batch_body(bytes(lying))
    with pytest.raises(MessageDecodeError, match="truncated batch item: 5 bytes left"):
        decode_batch_body(good + b"12345")
    with pytest.raises(IllegalArgumentError, match="batch item 0 must be"):
        encode_batch_items([b"oops"])


# --- properties and hashes -----------------------------------------------------------------------------
@settings(max_examples=400, deadline=None)
@given(st.one_of(st.binary(max_size=120),
                 st.lists(st.sampled_from([b"\x01", b"\x02", b"TAGS", b"k", b"\xe6\xb6", b"\xff", b"v",
                                          b"\xed\xa0\x80", b"\xe0\x80", b"\xf4\x90", b"\xc0\xaf", b"\xf0\x9f\x98"]),
                          max_size=30).map(b"".join)))
def test_string_to_properties_native_equals_python(raw):
    assert string_to_properties(raw) == string_to_properties_py(raw)
    assert string_to_properties(bytearray(raw)) == string_to_properties_py(raw)
    assert tags_code_from_properties(raw) == tags_code_from_properties_py(raw)


def test_string_cache_tells_apart_strings_differing_in_one_byte():
    # The native decoder hands out cached str objects for short ASCII pieces and compares them with
    # overlapping word loads; a one-byte difference anywhere, at every length up to past the cache
    # limit, must still give the right string (never a neighbour's cached one).
    for n in range(0, 30):
        base = bytes(65 + (i % 26) for i in range(n))
        variants = [base] + [base[:i] + b"#" + base[i + 1:] for i in range(n)]
        for _ in range(2):  # the second pass reads back through the cache
            for v in variants:
                raw = b"K" + v[:1] + b"\x01" + v + b"\x02"
                assert string_to_properties(raw) == {"K" + v[:1].decode(): v.decode()}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.text(min_size=1, max_size=30).filter(lambda s: "\x01" not in s and "\x02" not in s),
                          st.text(max_size=40).filter(lambda s: "\x02" not in s)), max_size=8))
def test_string_to_properties_reads_back_encoded_pairs(pairs):
    raw = b"".join(k.encode() + b"\x01" + v.encode() + b"\x02" for k, v in pairs)
    assert string_to_properties(raw) == dict(pairs) == string_to_properties_py(raw)


@settings(max_examples=300, deadline=None)
@given(_props)
def test_properties_to_bytes_native_equals_python(props):
    raw = properties_to_bytes(props)
    assert raw == properties_to_bytes_py(props)
    assert string_to_properties(raw) == props
    assert string_to_properties(raw.decode()) == props


def test_properties_encoding_rules_and_errors():
    assert properties_to_bytes({"A": 1, "B": None, "C": ""}) == b"A\x011\x02C\x01\x02"
    assert properties_to_bytes(None) == b"" and string_to_properties(None) == {}
    assert string_to_properties(b"A\x01b\x01c\x02\x01x\x02noval\x02B\x01") == {"A": "b\x01c", "B": ""}
    for fn in (properties_to_bytes, properties_to_bytes_py):
        with pytest.raises(IllegalArgumentError, match="property 'A\\\\x02'"):
            fn({"A\x02": "v"})
        with pytest.raises(IllegalArgumentError, match="the value contains the separator"):
            fn({"A": "v\x02"})
        with pytest.raises(IllegalArgumentError, match="is empty"):
            fn({"": "v"})
        with pytest.raises(IllegalArgumentError, match="must be a str"):
            fn({1: "v"})


@pytest.mark.parametrize("text, code", [
    ("TagA", 2598919), ("TagB", 2598920), ("*", 42), ("", 0), ("消息", 893927), ("Aa", 2112),
    ("BB", 2112), ("polygenelubricants", -2147483648), ("😀", 0xD83D * 31 + 0xDE00), (None, 0),
])
def test_java_string_hash_examples(text, code):
    assert java_string_hash(text) == code == java_string_hash_py(text)


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_java_string_hash_native_equals_python(text):
    assert java_string_hash(text) == java_string_hash_py(text)
    raw = properties_to_bytes({"TAGS": text}) if "\x02" not in text else b""
    if raw:
        assert tags_code_from_properties(raw) == java_string_hash_py(text)


def test_tags_code_uses_the_last_tags_pair_and_exact_names():
    assert tags_code_from_properties(b"TAGS\x01TagA\x02XTAGS\x01zz\x02TAGS\x01TagB\x02") == 2598920
    assert tags_code_from_properties(b"ATAGS\x01TagA\x02") == 0
    assert tags_code_from_properties("TAGS\x01TagA") == 2598919
    with pytest.raises(TypeError):
        java_string_hash(b"bytes")


def test_encoder_refuses_bad_values():
    with pytest.raises(IllegalArgumentError, match="more than 127"):
        encode_message_record(topic="t" * 128, body=b"")
    with pytest.raises(IllegalArgumentError, match="more than 32767"):
        encode_message_record(topic="t", body=b"", properties={"k": "v" * 40000})
    with pytest.raises(IllegalArgumentError, match="queue_id=4294967296"):
        encode_message_record(topic="t", body=b"", queue_id=2**32)
    with pytest.raises(IllegalArgumentError, match="store host 'localhost:1'"):
        encode_message_record(topic="t", body=b"", store_host="localhost:1")
    ipv6 = encode_message_record(topic="t", body=b"x", born_host=("::1", 1), store_host=("::2", 2))
    assert len(ipv6) == 115 + 1 + 1
    (m,) = decode_messages(ipv6)
    assert m.sys_flag == 0x30 and m.born_host == "::1:1" and m.store_host == "::2:2"


def test_codec_module_exports():
    for name in codec.__all__:
        assert hasattr(codec, name), name
