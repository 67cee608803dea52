"""rmq_core._native.proto_send against protobuf's own serializer and parser: what the native decoder
reads from a SendMessageRequest is what protobuf reads (hypothesis-made messages, their
concatenations - protobuf's merge -, damaged copies), and the response it encodes is byte for byte
protobuf's."""
from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_core._native.proto_send import SEND_FIELDS, decode_send_request, encode_send_response
from rmq_core.proxy.convert import millis
from rmq_core.proxy.proto.apache.rocketmq.v2 import definition_pb2 as pb
from rmq_core.proxy.proto.apache.rocketmq.v2 import service_pb2 as spb

INT32 = st.integers(-2**31, 2**31 - 1)
INT64 = st.integers(-2**63, 2**63 - 1)
TEXT = st.text(max_size=12)


def _reference(request: spb.SendMessageRequest) -> list[tuple]:
    """What the send reads of each message, read through protobuf."""
    out = []
    for m in request.messages:
        sp = m.system_properties
        out.append((m.topic.name, m.body, dict(m.user_properties), sp.tag if sp.HasField("tag") else None,
                    list(sp.keys), sp.message_id, sp.body_encoding, sp.message_type,
                    millis(sp.born_timestamp) if sp.HasField("born_timestamp") else None,
                    sp.message_group if sp.HasField("message_group") else None,
                    millis(sp.delivery_timestamp) if sp.HasField("delivery_timestamp") else None, sp.queue_id,
                    sp.trace_context if sp.HasField("trace_context") else None,
                    sp.orphaned_transaction_recovery_duration.seconds
                    if sp.HasField("orphaned_transaction_recovery_duration") else None))
    return out


@st.composite
def messages(draw) -> pb.Message:
    from google.protobuf import duration_pb2, timestamp_pb2

    sp = pb.SystemProperties(keys=draw(st.lists(TEXT, max_size=3)), message_id=draw(TEXT),
                             body_encoding=draw(st.sampled_from([0, 1, 2]) | INT32),
                             message_type=draw(st.sampled_from([0, 1, 2, 3, 4]) | INT32),
                             born_host=draw(TEXT), store_host=draw(TEXT), queue_id=draw(INT32))
    for name, strategy in (("tag", TEXT), ("message_group", TEXT), ("trace_context", TEXT),
                           ("receipt_handle", TEXT), ("queue_offset", INT64), ("delivery_attempt", INT32)):
        if draw(st.booleans()):
            setattr(sp, name, draw(strategy))
    for name, cls in (("born_timestamp", timestamp_pb2.Timestamp), ("store_timestamp", timestamp_pb2.Timestamp),
                      ("delivery_timestamp", timestamp_pb2.Timestamp), ("invisible_duration", duration_pb2.Duration),
                      ("orphaned_transaction_recovery_duration", duration_pb2.Duration)):
        if draw(st.booleans()):
            getattr(sp, name).CopyFrom(cls(seconds=draw(INT64), nanos=draw(INT32)))
    if draw(st.booleans()):
        sp.body_digest.CopyFrom(pb.Digest(type=draw(st.sampled_from([0, 1, 2, 3])), checksum=draw(TEXT)))
    if draw(st.booleans()):
        sp.dead_letter_queue.CopyFrom(pb.DeadLetterQueue(topic=draw(TEXT), message_id=draw(TEXT)))
    m = pb.Message(topic=pb.Resource(resource_namespace=draw(TEXT), name=draw(TEXT)), body=draw(st.binary(max_size=40)),
                   user_properties=draw(st.dictionaries(TEXT, TEXT, max_size=4)))
    if draw(st.booleans()):
        m.system_properties.CopyFrom(sp)
    return m


requests = st.lists(messages(), max_size=3).map(lambda ms: spb.SendMessageRequest(messages=ms))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests)
def test_the_decoder_reads_what_protobuf_reads(request):
    data = request.SerializeToString()
    assert decode_send_request(data) == _reference(spb.SendMessageRequest.FromString(data))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages(), messages())
def test_a_message_sent_in_two_parts_merges_as_in_protobuf(a, b):
    """One Message's bytes as two concatenated encodings (protobuf: the second merges into the
    first - its scalars win, its repeated fields add, its embedded messages merge)."""
    data = b"\x0a" + _varint(len(a.SerializeToString()) + len(b.SerializeToString())) \
        + a.SerializeToString() + b.SerializeToString()
    assert decode_send_request(data) == _reference(spb.SendMessageRequest.FromString(data))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests, st.data())
def test_a_damaged_request_is_refused_exactly_when_protobuf_refuses_it(request, data):
    wire = bytearray(request.SerializeToString() + data.draw(st.binary(max_size=8)))
    for _ in range(data.draw(st.integers(0, 3))):
        if wire:
            wire[data.draw(st.integers(0, len(wire) - 1))] = data.draw(st.integers(0, 255))
    wire = bytes(wire[:data.draw(st.integers(0, len(wire)))])
    try:
        expected = _reference(spb.SendMessageRequest.FromString(wire))
    except DecodeError:
        with pytest.raises(ValueError):
            decode_send_request(wire)
    else:
        assert decode_send_request(wire) == expected


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="length 16 runs past the end"):
        decode_send_request(b"\x0a\x10\x22")
    with pytest.raises(ValueError, match="truncated varint"):
        decode_send_request(b"\x0a")
    with pytest.raises(ValueError, match="bad field number 0"):
        decode_send_request(b"\x00\x00")
    with pytest.raises(UnicodeDecodeError):
        decode_send_request(b"\x0a\x05\x0a\x03\x12\x01\xff")
    assert SEND_FIELDS[0] == "topic" and len(SEND_FIELDS) == 14


entries = st.lists(st.tuples(st.sampled_from([pb.OK, pb.BAD_REQUEST, pb.TOPIC_NOT_FOUND]) | INT32, TEXT, TEXT, TEXT,
                             INT64), max_size=4)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([pb.OK, pb.MULTIPLE_RESULTS]) | INT32, TEXT, entries)
def test_the_response_is_protobufs_byte_for_byte(code, message, entries):
    expected = spb.SendMessageResponse(status=pb.Status(code=code, message=message), entries=[
        spb.SendResultEntry(status=pb.Status(code=c, message=m), message_id=mid, transaction_id=tid, offset=offset)
        for c, m, mid, tid, offset in entries])
    assert encode_send_response(code, message, entries) == expected.SerializeToString()


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _ld(field: int, data: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(data)) + data


@pytest.mark.parametrize("entry, kept", [
    (_ld(1, b"k") + _ld(2, b"v"), {"k": "v"}),
    (_ld(2, b"v") + _ld(1, b"k"), {"k": "v"}),
    (_ld(1, b"k"), {"k": ""}),
    (b"", {"": ""}),
    (_ld(1, b"a") + _ld(1, b"b") + _ld(2, b"v"), {"b": "v"}),
    # an entry with any other field, or a key / value of another wire type, is no entry: protobuf
    # keeps it among the message's unknown fields
    (_ld(1, b"k") + _ld(3, b"z") + _ld(2, b"v"), {}),
    (_ld(1, b"k") + _varint(7 << 3) + _varint(1) + _ld(2, b"v"), {}),
    (_ld(1, b"k") + _varint(2 << 3) + _varint(5), {}),
    (_varint(1 << 3 | 5) + b"abcd" + _ld(2, b"v"), {}),
    (_ld(1, b"k") + _ld(3, b"\xff\xff"), {}),
])
def test_a_user_property_entry_is_read_as_protobuf_reads_it(entry, kept):
    message = pb.Message(topic=pb.Resource(name="T"), body=b"x").SerializeToString()
    wire = _ld(1, message + _ld(pb.Message.DESCRIPTOR.fields_by_name["user_properties"].number, entry))
    assert dict(spb.SendMessageRequest.FromString(wire).messages[0].user_properties) == kept
    assert decode_send_request(wire)[0][SEND_FIELDS.index("user_properties")] == kept
