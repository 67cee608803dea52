"""The client's native send codec (rmq_core._native.frame: SendHeader, read_send_response; and
send_pipeline's SendResultMaker and PipelinedCompletion) against a Python reference written from
the protocol (tests/client/send_reference.py).

SendHeader.build_frame must write exactly the bytes RemotingCommand encodes for the send request
(language PYTHON), V2, V1 and oneway alike, for any header values, properties and body;
build_message_frame exactly what _prepare + build_frame make of a plain message.  read_send_response must read exactly what SendResponse.from_command reads of the decoded
frame, and decline (None) whatever it does not handle, so RemotingCommand's errors still name a
malformed frame.
"""
import re
import struct

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_core._native import frame as frame_native
from rmq_core._native import send_pipeline
from rmq_core.client import producer as producer_module
from rmq_core.remoting.frames import read_send_responses
from rmq_core.client.producer import Producer, SendAttempts
from rmq_core.errors import IllegalArgumentError, MQBrokerError, RemotingCommandError
from rmq_core.message import Message, MessageQueue, SendResult, SendStatus
from rmq_core.remoting.codes import MQVersion, RequestCode, ResponseCode
from rmq_core.remoting.command import RESPONSE_FLAG, RemotingCommand, SerializeType
from tests.codec_oracle import properties_to_bytes_py
from tests.client.send_reference import parse_send_response, read_send_response_frame, request_frame, send_header

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)  # no lone surrogates
name = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)
# what the properties format holds: no separator in a name, no \x02 in a value
prop_name = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02"), min_size=1,
                    max_size=12)
prop_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x02"), max_size=12)


def test_the_native_extension_is_the_one_the_producer_uses():
    # a silently missing extension must not let the producer fall back unnoticed
    assert producer_module.SendHeader is frame_native.SendHeader
    assert producer_module.read_send_response_frames.native is frame_native.read_send_responses
    assert isinstance(producer_module._RESULTS, send_pipeline.SendResultMaker)


def _producer(group="PG", **kw) -> Producer:
    return Producer(group, namesrv="127.0.0.1:9876", **kw)


def _reference_frame(p: Producer, mq: MessageQueue, sys_flag, born, flag, props, body, opaque, reconsume=0,
                     max_reconsume=None, batch=False, v2=True, oneway=False) -> bytes:
    header = send_header(group=p.group, topic=mq.topic, queue_id=mq.queue_id, sys_flag=sys_flag, born_timestamp=born,
                         flag=flag, properties=properties_to_bytes_py(props).decode(), reconsume_times=reconsume,
                         max_reconsume_times=max_reconsume, batch=batch, broker_name=mq.broker_name,
                         default_topic=p.create_topic_key, default_topic_queue_nums=p.default_topic_queue_nums, v2=v2)
    return request_frame(header, body, opaque, batch, v2, oneway)


def _native_header(p: Producer, mq: MessageQueue, batch=False, v2=True) -> frame_native.SendHeader:
    return frame_native.SendHeader(p.group, mq.topic, mq.queue_id, mq.broker_name, p.create_topic_key,
                                    p.default_topic_queue_nums,
                                    RequestCode.SEND_BATCH_MESSAGE if batch else
                                    RequestCode.SEND_MESSAGE_V2 if v2 else RequestCode.SEND_MESSAGE,
                                    batch, "PYTHON", MQVersion.CURRENT, v2)


@SETTINGS
@given(group=name, topic=name, broker=name, queue_id=st.integers(0, 1 << 20), sys_flag=st.integers(0, 1 << 20),
       born=st.integers(0, 1 << 62), flag=st.integers(-(1 << 31), (1 << 31) - 1),
       props=st.dictionaries(prop_name, prop_text, max_size=6), body=st.binary(max_size=300),
       opaque=st.integers(0, (1 << 31) - 1), reconsume=st.integers(0, 100),
       max_reconsume=st.none() | st.integers(-1, 100), batch=st.booleans(), queue_nums=st.integers(1, 64),
       v2=st.booleans(), oneway=st.booleans())
def test_build_frame_writes_the_bytes_of_the_python_encoder(group, topic, broker, queue_id, sys_flag, born, flag,
                                                            props, body, opaque, reconsume, max_reconsume, batch,
                                                            queue_nums, v2, oneway):
    p = _producer("PG", default_topic_queue_nums=queue_nums)
    p.group = group  # (any text: the builder escapes what it must)
    mq = MessageQueue(topic, broker, queue_id)
    v2 = v2 or batch
    want = _reference_frame(p, mq, sys_flag, born, 0 if batch else flag, props, body, opaque, reconsume,
                            max_reconsume, batch, v2, oneway)
    got = _native_header(p, mq, batch, v2).build_frame(sys_flag, 0 if batch else flag, props, opaque, body, born,
                                                       reconsume, max_reconsume, oneway)
    assert got == want
    decoded = RemotingCommand.decode(got[4:])
    assert decoded.ext_fields["i" if v2 else "properties"] == properties_to_bytes_py(props).decode()
    assert (decoded.body or b"") == body and decoded.is_oneway == oneway


def test_control_characters_quotes_and_non_ascii_are_escaped_as_json_does():
    p = _producer()
    mq = MessageQueue("T\u00e9\u4e2d", "broker-\U0001F600", 2)
    props = {'q"uote': "back\\slash", "ctl\x00\x1f\x7f": "\n\r\t\b\f", "\u00e9": "\U0001F600"}
    want = _reference_frame(p, mq, 0, 1700000000000, 0, props, b"b", 7)
    assert _native_header(p, mq).build_frame(0, 0, props, 7, b"b", 1700000000000) == want


def test_an_empty_and_a_big_body_travel_whole():
    p = _producer()
    mq = MessageQueue("BigT", "broker-a", 0)
    header = _native_header(p, mq)
    for body in (b"", bytes(range(256)) * 4096):  # 1 MiB
        got = header.build_frame(0, 0, {"WAIT": "true"}, 9, body, 1)
        assert got == _reference_frame(p, mq, 0, 1, 0, {"WAIT": "true"}, body, 9)
        assert struct.unpack(">i", got[:4])[0] == len(got) - 4


def test_a_header_past_the_stack_buffer_grows_onto_the_heap():
    """Properties of ~30 KB (under the 32767-byte limit) with characters JSON escapes: the frame
    outgrows the builder's stack buffer several times and still matches the reference."""
    p = _producer()
    mq = MessageQueue("GrowT", "broker-a", 0)
    props = {f"k{i}": "q\"b\\n\nt\t\u00e9\u20ac" * 12 for i in range(160)}
    got = _native_header(p, mq).build_frame(0, 0, props, 11, b"x", 1)
    assert got is not None and len(got) > 20_000
    assert got == _reference_frame(p, mq, 0, 1, 0, props, b"x", 11)


def test_born_timestamp_defaults_to_now():
    p = _producer()
    mq = MessageQueue("T", "b", 0)
    before = frame_native.now_ms()
    frame = _native_header(p, mq).build_frame(0, 0, {}, 1, b"x")
    born = int(RemotingCommand.decode(frame[4:]).ext_fields["g"])
    assert before <= born <= frame_native.now_ms()


def test_build_frame_declines_oversize_properties_for_its_caller_to_name():
    p = _producer()
    assert _native_header(p, MessageQueue("T", "b", 0)).build_frame(0, 0, {"k": "v" * 40000}, 1, b"x", 1) is None


def test_a_value_that_is_not_a_str_travels_as_its_text():
    p = _producer()
    mq = MessageQueue("T", "b", 0)
    got = _native_header(p, mq).build_frame(0, 0, {"a": 1}, 3, b"x", 5)
    assert got == _reference_frame(p, mq, 0, 5, 0, {"a": "1"}, b"x", 3)


@pytest.mark.parametrize("props, error", [
    ({"a": "\ud800"}, "property 'a' is not encodable as UTF-8"),
    ({"a": "v\x02"}, "property 'a': the value contains the separator"),
    ({"a\x01": "v"}, "property 'a\\x01': the name contains the separator"),
    ({"": "v"}, "property name '' is empty"),
    ({1: "v"}, "property name 1 must be a str"),
])
def test_properties_the_format_cannot_hold_fail_naming_the_property(props, error):
    """The header's properties are written by the one properties writer (record.pyx: put_property),
    with its checks: a send fails as a batch item or a stored record would."""
    header = _native_header(_producer(), MessageQueue("T", "b", 0))
    with pytest.raises(IllegalArgumentError, match=re.escape(error)):
        header.build_frame(0, 0, props, 1, b"x", 1)


def test_build_frame_declines_numbers_beyond_64_bits():
    header = _native_header(_producer(), MessageQueue("T", "b", 0))
    assert header.build_frame(0, 1 << 70, {}, 1, b"x", 1) is None


def test_none_valued_properties_are_skipped_as_the_properties_codec_does():
    p = _producer()
    mq = MessageQueue("T", "b", 0)
    got = _native_header(p, mq).build_frame(0, 0, {"a": None, "b": "2"}, 3, b"x", 5)
    assert got == _reference_frame(p, mq, 0, 5, 0, {"b": "2"}, b"x", 3)


def _normalise_born(frame: bytes) -> bytes:
    # the born timestamps differ (now, twice): compare the frames with it zeroed, lengths fixed up
    header_len = struct.unpack(">I", frame[4:8])[0] & 0xFFFFFF
    header = re.sub(rb'"g":"\d+"', b'"g":"0"', frame[8:8 + header_len])
    body = frame[8 + header_len:]
    return struct.pack(">iI", 4 + len(header) + len(body), len(header)) + header + body


@SETTINGS
@given(tags=st.none() | prop_name, keys=st.none() | st.lists(prop_name.filter(lambda k: " " not in k), max_size=3),
       user=st.dictionaries(name.filter(lambda k: k.isalnum() and k.islower()), prop_text, max_size=4),
       delay=st.integers(0, 18), wait=st.booleans(), flag=st.integers(0, 1 << 20), body=st.binary(min_size=1, max_size=200))
def test_build_message_frame_equals_prepare_then_build_frame(tags, keys, user, delay, wait, flag, body):
    p = _producer()
    msg = Message("T", body, tags=tags, keys=keys or None, properties=user, flag=flag, delay_time_level=delay,
                  wait_store_msg_ok=wait)
    uniq, prepared_body, sys_flag, props = p._prepare(msg)
    mq = MessageQueue("T", "broker-a", 1)
    header = _native_header(p, mq)
    got = header.build_message_frame(msg, uniq, 11)
    want = header.build_frame(sys_flag, msg.flag, props, 11, prepared_body)
    assert _normalise_born(got) == _normalise_born(want)
    assert p._prepared_with(msg, uniq) == (uniq, prepared_body, sys_flag, props)


@pytest.mark.parametrize("msg", [
    Message("T", b"x", properties={"UNIQ_KEY": "MINE"}),  # a UNIQ_KEY of its own keeps its place: Python
    Message("T", b"x", properties={"n": None}),          # wire_properties makes "None" of it: Python
    Message("T", b"x", properties={"n": "v\x02"}),       # the Python path raises naming it
])
def test_build_message_frame_declines_what_prepare_must_do(msg):
    header = _native_header(_producer(), MessageQueue("T", "b", 0))
    assert header.build_message_frame(msg, "U" * 32, 1) is None


@pytest.mark.parametrize("msg", [Message("T", b"x", properties={"n": 5}), Message("T", b"x", tags=7)])
def test_build_message_frame_writes_values_that_are_not_str_as_prepare_does(msg):
    p = _producer()
    header = _native_header(p, MessageQueue("T", "b", 0))
    props = msg.wire_properties()
    props["UNIQ_KEY"] = "U" * 32
    want = header.build_frame(0, msg.flag, props, 1, msg.body)
    assert _normalise_born(header.build_message_frame(msg, "U" * 32, 1)) == _normalise_born(want)


# --- responses -------------------------------------------------------------------------------------
def _response(code=0, remark=None, ext=None, opaque=5, flag=RESPONSE_FLAG) -> RemotingCommand:
    cmd = RemotingCommand.create_response(code, remark, ext, opaque=opaque)
    cmd.flag = flag
    return cmd


def _fields(r) -> tuple:
    return (r.code, r.flag, r.opaque, r.remark, r.msg_id, r.queue_id, r.queue_offset, r.transaction_id, r.region_id)


plain = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters='"\\'), max_size=20).filter(
    lambda s: all(ord(c) >= 32 for c in s))
digits = st.integers(-(10 ** 17), 10 ** 17).map(str)


@SETTINGS
@given(code=st.sampled_from([0, 1, 10, 11, 12, 14, 17, 205, 215]), remark=st.none() | plain,
       msg_id=st.none() | plain, queue_id=st.none() | digits | st.just(""), queue_offset=st.none() | digits | st.just(""),
       txid=st.none() | plain, region=st.none() | plain, extra=st.dictionaries(plain.filter(bool), plain, max_size=3),
       opaque=st.integers(0, (1 << 31) - 1))
def test_read_send_response_reads_what_the_python_decoder_reads(code, remark, msg_id, queue_id, queue_offset, txid,
                                                                region, extra, opaque):
    ext = dict(extra)
    for key, value in (("msgId", msg_id), ("queueId", queue_id), ("queueOffset", queue_offset),
                       ("transactionId", txid), ("MSG_REGION", region), ("TRACE_ON", "true")):
        if value is not None:
            ext[key] = value
    frame = _response(code, remark, ext, opaque).encode()[4:]
    native = frame_native.read_send_response(frame)
    reference = frame_native.SendResponse.from_command(RemotingCommand.decode(frame))
    assert native is not None
    assert _fields(native) == _fields(reference)
    assert _fields(read_send_response_frame(frame)) == _fields(reference)


def _json_frame(header: bytes, body: bytes = b"", stype: int = 0) -> bytes:
    return struct.pack(">I", (stype << 24) | len(header)) + header + body


@pytest.mark.parametrize("header", [
    b'{"code":0,"extFields":{"queueId":3},"flag":1,"opaque":1}',              # a number in extFields
    b'{"code":0,"extFields":{"msgId":"A\\u0041"},"flag":1,"opaque":1}',      # an escaped kept value
    b'{"code":1,"flag":1,"opaque":1,"remark":"line\\nbreak"}',                # an escaped remark
    b'{"code":0,"extFields":{"queueId":" 7"},"flag":1,"opaque":1}',          # int() may take it: Python decides
    b'{"code":"0","flag":1,"opaque":1}',                                      # a numeric string code
    b'{"code":0,"flag":1,"opaque":1,"x":[1]}',                                # an array where none belongs
])
def test_unusual_headers_are_declined_and_read_the_python_way(header):
    frame = _json_frame(header)
    assert frame_native.read_send_response(frame) is None
    got = read_send_response_frame(frame)
    assert _fields(got) == _fields(frame_native.SendResponse.from_command(RemotingCommand.decode(frame)))


def test_a_binary_header_is_declined_and_read_the_python_way():
    cmd = _response(0, None, {"msgId": "ID", "queueId": "2", "queueOffset": "9"})
    cmd.serialize_type = SerializeType.ROCKETMQ
    frame = cmd.encode()[4:]
    assert frame_native.read_send_response(frame) is None
    got = read_send_response_frame(frame)
    assert (got.msg_id, got.queue_id, got.queue_offset) == ("ID", 2, 9)


def test_a_request_from_the_peer_comes_back_as_its_command():
    request = RemotingCommand.create_request(RequestCode.CHECK_TRANSACTION_STATE, {"x": "1"})
    frame = request.encode()[4:]
    assert frame_native.read_send_response(frame) is None
    got = read_send_response_frame(frame)
    assert isinstance(got, RemotingCommand) and got.code == RequestCode.CHECK_TRANSACTION_STATE


@pytest.mark.parametrize("frame, error", [
    (_json_frame(b'{"code":0,"flag":1'), "bad JSON header"),
    (_json_frame(b'{"flag":1,"opaque":2}'), "'code' is missing"),
    (b"\x00\x00\x00\x40{}", "header length 64 exceeds the frame"),
    (b"\x00\x00", "too short"),
    (_json_frame(b'{"code":0,"extFields":{"queueId":"seven"},"flag":1,"opaque":1}'),
     "bad value 'seven' for header field 'queueId'"),
])
def test_malformed_response_frames_give_a_clear_error(frame, error):
    assert frame_native.read_send_response(frame) is None
    with pytest.raises(RemotingCommandError, match=error):
        read_send_response_frame(frame)


def test_read_send_responses_splits_frames_and_keeps_a_partial_tail():
    a = _response(0, None, {"msgId": "A", "queueId": "1", "queueOffset": "7"}, opaque=1).encode()
    inner = _json_frame(b'{"code":0,"extFields":{"queueId":3},"flag":1,"opaque":2}')
    b = struct.pack(">i", len(inner)) + inner  # a number in extFields: declined, comes back as its bytes
    c = _response(14, "busy", None, opaque=3).encode()
    data = a + b + c[:10]
    items, consumed = read_send_responses(bytearray(data), 1 << 20)
    assert consumed == len(a) + len(b)
    assert items[0].opaque == 1 and items[0].queue_offset == 7
    assert items[1] == b[4:]
    items, consumed = read_send_responses(c, 1 << 20)
    assert consumed == len(c) and items[0].code == 14 and items[0].remark == "busy"


@pytest.mark.parametrize("length", [-5, 0, 3, 1 << 21])
def test_read_send_responses_names_a_bad_frame_length(length):
    with pytest.raises(RemotingCommandError, match=f"frame length {length} outside 4..{1 << 20}"):
        read_send_responses(struct.pack(">i", length) + b"\x00" * 8, 1 << 20)


# --- SendResult ------------------------------------------------------------------------------------
@SETTINGS
@given(code=st.sampled_from([0, 10, 11, 12]), msg_id=st.none() | plain, queue_id=st.none() | st.integers(0, 8),
       queue_offset=st.none() | st.integers(0, 1 << 40), txid=st.none() | plain, region=st.none() | plain,
       uniq=plain)
def test_send_result_maker_equals_parse_send_response(code, msg_id, queue_id, queue_offset, txid, region, uniq):
    mq = MessageQueue("T", "broker-a", 3)
    ext = {k: str(v) for k, v in (("msgId", msg_id), ("queueId", queue_id), ("queueOffset", queue_offset),
                                  ("transactionId", txid), ("MSG_REGION", region)) if v is not None}
    cmd = _response(code, None, ext)
    try:
        want = parse_send_response(cmd, mq, uniq, "addr")
    except MQBrokerError:
        want = None  # (a refusal: the SendResultMaker makes none)
    got = producer_module._RESULTS.make(frame_native.read_send_response(cmd.encode()[4:]), mq, uniq)
    if want is None:
        assert got is None
        return
    assert got == want and type(got) is SendResult
    assert attrs.asdict(got, recurse=False) == attrs.asdict(want, recurse=False)


def test_send_result_maker_refuses_a_changed_send_result():
    with pytest.raises(ValueError, match="unexpected SendResult fields"):
        send_pipeline.SendResultMaker(SendResult, ("status",), MessageQueue, {0: SendStatus.SEND_OK})


def test_oversize_properties_still_fail_naming_the_size():
    p = _producer()
    msg = Message("T", b"x", properties={"k": "v" * 40000})
    s = SendAttempts(p, msg, producer_module.CommunicationMode.SYNC, 3.0, None, None, None)
    s.set_prepared(p._prepare(msg))
    with pytest.raises(IllegalArgumentError, match="message properties are 40[0-9]+ bytes, more than 32767"):
        s.write(MessageQueue("T", "b", 0), "127.0.0.1:1")


# --- the reader's completion of a pipelined send --------------------------------------------------
class _Strategy:
    """A real fault strategy whose clock counts its fault-item updates (each reads it once)."""

    def __init__(self):
        import time

        from rmq_core.client.fault import MQFaultStrategy

        self.updates = 0

        def clock():
            self.updates += 1
            return time.monotonic() * 1000.0
        self.fault = MQFaultStrategy(clock=clock)

    def item(self, broker):
        return self.fault.tolerance.items.get(broker)


def _context(mq, future, begin):
    return (Message("T", b"x"), "UNIQ", "ASYNC", mq, "127.0.0.1:10911", 3.0, begin, future)


def test_pipelined_completion_finishes_the_future_as_the_python_path_would():
    import time

    from rmq_core.client.futures import LeanFuture

    strategy, noted, fallback_calls = _Strategy(), {}, []
    completion = send_pipeline.PipelinedCompletion(maker=producer_module._RESULTS, fault=strategy.fault, noted=noted,
                                                   fallback=lambda *a: fallback_calls.append(a))
    mq = MessageQueue("T", "broker-a", 1)
    response = frame_native.read_send_response(
        _response(0, None, {"msgId": "OFF", "queueId": "1", "queueOffset": "12"}).encode()[4:])
    futures = [LeanFuture() for _ in range(50)]
    begin = time.monotonic()
    for f in futures:
        completion(_context(mq, f, begin), response, None)
    want = producer_module._RESULTS.make(response, mq, "UNIQ")
    assert all(f.result(0) == want for f in futures) and not fallback_calls
    # fast answers: noted at most once per millisecond for the broker (50 answers in a few ms)
    assert 1 <= strategy.updates <= 10 and set(strategy.fault.tolerance.items) == {"broker-a"}
    assert strategy.item("broker-a").current_latency < 50 and strategy.fault.tolerance.is_available("broker-a")
    assert int(begin * 1000) <= noted["broker-a"] <= int(time.monotonic() * 1000)  # the last one noted
    # a slow answer (>= 50 ms) is always noted, with its latency
    strategy.updates = 0
    f = LeanFuture()
    completion(_context(mq, f, time.monotonic() - 0.2), response, None)
    assert f.result(0) == want and strategy.updates and strategy.item("broker-a").current_latency >= 200
    assert "broker-a" not in noted


def test_pipelined_completion_hands_failures_and_refusals_to_the_fallback():
    from rmq_core.client.futures import LeanFuture

    calls = []
    completion = send_pipeline.PipelinedCompletion(maker=producer_module._RESULTS, fault=_Strategy().fault, noted={},
                                                   fallback=lambda *a: calls.append(a))
    mq = MessageQueue("T", "broker-a", 1)
    refusal = frame_native.SendResponse(ResponseCode.SYSTEM_BUSY, remark="busy")
    ctx = _context(mq, LeanFuture(), 0.0)
    error = RemotingCommandError("x")
    completion(ctx, refusal, None)
    completion(ctx, None, error)
    assert calls == [(ctx, refusal, None), (ctx, None, error)] and not ctx[7].done()
