"""The native remoting codec (rmq_core._native.frame) against its pure-Python reference.

The native decoder must give exactly what the Python decoder gives for every header it accepts,
and must decline (None) whatever it does not handle, so the Python decoder's errors still apply;
the native encoder must write exactly the Python encoder's bytes.
"""
import json
import re
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_core._native import frame as frame_native
from rmq_core.errors import RemotingCommandError
from rmq_core.remoting import frames
from rmq_core.remoting import command as command_module
from rmq_core.remoting.command import RemotingCommand, SerializeType, _native_encode, command_of

SLOTS = RemotingCommand.__slots__


def test_native_extension_is_loaded():
    # A silently missing extension would make every test below compare Python with Python.
    assert command_module._native_decode is frame_native.decode_frame
    assert _native_encode is frame_native.encode_json_frame_header
    assert frames.split_frames.native is frame_native.split_frames


def _native_decode(frame):
    """The native decoder's plain values made a command, as RemotingCommand.decode makes it."""
    values = frame_native.decode_frame(frame)
    return None if values is None else command_of(values)


def test_the_native_codec_hands_out_plain_values():
    frame = RemotingCommand.create_request(310, {"a": "1"}, b"body").encode()[4:]
    values = frame_native.decode_frame(frame)
    assert type(values) is tuple and dict(zip(frame_native.HEADER_FIELDS, values))["ext_fields"] == {"a": "1"}
    assert type(RemotingCommand.decode(frame)) is RemotingCommand


def _same(a: RemotingCommand, b: RemotingCommand) -> None:
    for name in SLOTS:
        assert getattr(a, name) == getattr(b, name), name
        assert type(getattr(a, name)) is type(getattr(b, name)), name


def _frame(header: bytes, body: bytes = b"", stype: int = 0) -> bytes:
    return struct.pack(">I", (stype << 24) | len(header)) + header + body


text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)  # no lone surrogates
any_text = st.text(max_size=8)  # lone surrogates too: the native side must decline, not break
ints = st.integers(-2**31, 2**31 - 1)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(code=ints, opaque=ints, flag=ints, version=ints, language=text, remark=st.none() | text,
       ext=st.dictionaries(text, text, max_size=5), body=st.none() | st.binary(min_size=1, max_size=20))
def test_encode_is_byte_identical_and_decode_round_trips(code, opaque, flag, version, language, remark, ext, body):
    cmd = RemotingCommand(code, language=language, version=version, opaque=opaque, flag=flag, remark=remark,
                          ext_fields=ext, body=body)
    n = len(body) if body else 0
    native = _native_encode(cmd, n)
    assert native == cmd.encode_header_py(n)
    wire = cmd.encode()[4:]
    decoded = _native_decode(wire)
    assert decoded is not None
    _same(decoded, RemotingCommand.decode_py(wire))
    assert decoded.ext_fields == ext and decoded.remark == remark and decoded.body == body


# Property strings: long runs of plain text between control characters (RocketMQ's \x01 / \x02
# separators), quotes and backslashes; long enough to cross the decoder's stack buffer (1 KiB).
_pieces = st.sampled_from(["\x01", "\x02", '"', "\\", "\n", "\x1f", "é", "😀", "/"])
long_text = st.lists(st.one_of(_pieces, st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)),
                     max_size=120).map("".join)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ext=st.dictionaries(st.sampled_from(["i", "properties", "k", "x" * 30]), long_text, max_size=3),
       remark=st.none() | long_text)
def test_long_escaped_values_encode_identically_and_round_trip(ext, remark):
    cmd = RemotingCommand(310, opaque=7, remark=remark, ext_fields=ext)
    native = _native_encode(cmd, 0)
    assert native == cmd.encode_header_py(0)
    decoded = _native_decode(native[4:])
    assert decoded is not None
    assert decoded.ext_fields == ext and decoded.remark == remark


@pytest.mark.parametrize("length", [1, 1000, 1023, 1024, 1025, 5000])
def test_escaped_value_around_the_stack_buffer_size(length):
    value = ("a\x01" * length)[:length]
    cmd = RemotingCommand(11, ext_fields={"properties": value, "tail": "z\x02"})
    wire = _native_encode(cmd, 0)
    assert wire == cmd.encode_header_py(0)
    assert _native_decode(wire[4:]).ext_fields == {"properties": value, "tail": "z\x02"}


def test_new_response_is_make_response():
    from rmq_core.remoting.codes import ResponseCode
    from rmq_core.remoting.command import new_response

    req = RemotingCommand.create_request(310, {"a": "1"})
    req.serialize_type = SerializeType.ROCKETMQ
    resp = new_response(req, ResponseCode.FLUSH_DISK_TIMEOUT, "slow disk", {"queueId": "3"}, b"b")
    ref = RemotingCommand(ResponseCode.FLUSH_DISK_TIMEOUT, opaque=req.opaque, flag=1, remark="slow disk",
                          ext_fields={"queueId": "3"}, body=b"b", serialize_type=SerializeType.ROCKETMQ)
    _same(resp, ref)
    assert type(resp) is RemotingCommand and type(resp.code) is int and resp.body == b"b"
    assert resp.serialize_type is SerializeType.ROCKETMQ and resp.language == "JAVA"
    assert resp.version == ref.version


@settings(max_examples=200, deadline=None)
@given(language=any_text, remark=st.none() | any_text, ext=st.dictionaries(any_text, any_text, max_size=3))
def test_encode_with_lone_surrogates_declines_or_matches(language, remark, ext):
    cmd = RemotingCommand(10, language=language, remark=remark, ext_fields=ext)
    native = _native_encode(cmd, 0)
    assert native is None or native == cmd.encode_header_py(0)
    assert cmd.encode_header(0) == cmd.encode_header_py(0)


json_scalar = st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats(allow_nan=False) | text
header_dicts = st.fixed_dictionaries(
    {"code": st.integers(-2**40, 2**40) | st.sampled_from(["12", "x", None, 1.5, True])},
    optional={
        "opaque": ints | st.sampled_from(["7", "", None]),
        "flag": ints,
        "version": ints | st.just(1.0),
        "language": text | st.integers(0, 300) | st.none(),
        "remark": text | st.none() | st.integers(),
        "extFields": st.none() | st.dictionaries(text, text | json_scalar, max_size=4) | st.just([1]),
        "serializeTypeCurrentRPC": st.just("JSON"),
        "unknown": json_scalar | st.lists(st.integers(), max_size=2) | st.dictionaries(text, text, max_size=2),
    })


def _python_result(frame):
    try:
        return RemotingCommand.decode_py(frame)
    except RemotingCommandError as e:
        return e


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obj=header_dicts, indent=st.sampled_from([None, 1, "\t"]), ascii_only=st.booleans(),
       trailer=st.sampled_from(["", "\n", " \r\n", "x", "}"]), body=st.binary(max_size=10))
def test_decode_matches_python_or_declines(obj, indent, ascii_only, trailer, body):
    header = (json.dumps(obj, indent=indent, ensure_ascii=ascii_only) + trailer).encode()
    frame = _frame(header, body)
    native = _native_decode(frame)
    reference = _python_result(frame)
    if native is None:  # declined: RemotingCommand.decode falls back to the reference
        try:
            decoded = RemotingCommand.decode(frame)
        except RemotingCommandError as e:
            assert isinstance(reference, RemotingCommandError) and str(e) == str(reference)
        else:
            _same(decoded, reference)
    else:
        assert not isinstance(reference, Exception), reference
        _same(native, reference)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_decode_never_crashes_on_garbage(data):
    native = _native_decode(_frame(data))
    reference = _python_result(_frame(data))
    if native is not None:
        _same(native, reference)
    assert _native_decode(data) is None or not isinstance(_python_result(data), Exception)


@pytest.mark.parametrize("header, why", [
    (b'{"code":1,"extFields":{"a":1}}', "number inside extFields"),
    (b'{"code":"1"}', "numeric string code"),
    (b'{"code":1.0}', "float code"),
    (b'{"code":01}', "leading zero"),
    (b'{"code":1,"remark":"\\ud800"}', "lone surrogate escape"),
    (b'{"code":1,"remark":"\xff"}', "invalid UTF-8"),
    (b'{"code":1}x', "trailing garbage"),
    (b'{"code":1,"x":[1]}', "nested unknown value"),
    (b'{"code":12345678901234567890}', "integer beyond 18 digits"),
    (b'{"code":1,"language":3}', "numeric language"),
])
def test_unusual_headers_are_left_to_python(header, why):
    frame = _frame(header)
    assert _native_decode(frame) is None, why
    reference = _python_result(frame)
    if isinstance(reference, Exception):
        with pytest.raises(RemotingCommandError, match=re.escape(str(reference))):
            RemotingCommand.decode(frame)
    else:
        _same(RemotingCommand.decode(frame), reference)


def test_escapes_and_whitespace_the_fast_path_handles():
    header = ('{ "code" : 310 ,\n "extFields" : { "k\\u00e9" : "a\\"b\\\\c\\/d\\b\\f\\n\\r\\t\\ud83d\\ude00" } ,'
              '"flag":-0,"language":"CPP","opaque":-7,"remark":null,"version":63}\n').encode()
    frame = _frame(header, b"payload")
    native = _native_decode(frame)
    assert native is not None
    _same(native, RemotingCommand.decode_py(frame))
    assert native.ext_fields == {"ké": 'a"b\\c/d\b\f\n\r\t\U0001F600'}
    assert native.serialize_type is SerializeType.JSON and native.body == b"payload"


def test_binary_header_frames_are_left_to_python():
    cmd = RemotingCommand.create_request(10, {"a": "b"}, b"x")
    cmd.serialize_type = SerializeType.ROCKETMQ
    frame = cmd.encode()[4:]
    assert _native_decode(frame) is None
    assert _native_encode(cmd, 1) is not None  # the encoder is only called for JSON ...
    assert cmd.encode_header(1) == cmd.encode_header_py(1)  # ... so binary stays binary
    assert RemotingCommand.decode(frame).serialize_type is SerializeType.ROCKETMQ


def test_encode_declines_non_str_fields_and_huge_ints():
    cmd = RemotingCommand(10, ext_fields={"n": 5})
    assert _native_encode(cmd, 0) is None
    assert cmd.encode_header(0) == cmd.encode_header_py(0)
    big = RemotingCommand(10, opaque=2**70)
    assert _native_encode(big, 0) is None
    assert big.encode_header(0) == big.encode_header_py(0)


# --- frame splitting ----------------------------------------------------------------------------
SPLITTERS = [frames.split_frames_py, frames.split_frames]


@pytest.mark.parametrize("split", SPLITTERS, ids=["python", "native"])
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payloads=st.lists(st.binary(min_size=4, max_size=40), max_size=6), cut=st.integers(0, 300))
def test_split_frames_finds_whole_frames_only(split, payloads, cut):
    stream = b"".join(struct.pack(">i", len(p)) + p for p in payloads)
    data = stream[:cut]
    got, consumed = split(data, 1000)
    whole = []
    pos = 0
    for p in payloads:
        if pos + 4 + len(p) > len(data):
            break
        whole.append(p)
        pos += 4 + len(p)
    assert [bytes(f) for f in got] == whole and consumed == pos
    assert split(bytearray(data), 1000)[1] == pos


@pytest.mark.parametrize("split", SPLITTERS, ids=["python", "native"])
@pytest.mark.parametrize("length", [-1, 0, 3, 1001, 0x7FFFFFFF])
def test_split_frames_rejects_lengths_naming_them(split, length):
    with pytest.raises(RemotingCommandError, match=f"frame length {length} outside 4..1000"):
        split(struct.pack(">i", length) + b"abcd", 1000)


def _json_frame(ext, body) -> bytes:
    return RemotingCommand.create_request(310, ext, body).encode()[4:]


def _binary_header_frame(code) -> bytes:  # left to the Python codec
    cmd = RemotingCommand.create_request(code, {"k": "v"})
    cmd.serialize_type = SerializeType.ROCKETMQ
    return cmd.encode()[4:]


_frame_payloads = st.one_of(
    st.builds(_json_frame, st.dictionaries(text, text, max_size=3), st.none() | st.binary(min_size=1, max_size=8)),
    st.builds(_binary_header_frame, st.integers(0, 400)),
    st.binary(min_size=0, max_size=30),  # garbage: the Python codec decides (decodes or refuses)
)


@settings(max_examples=200, deadline=None)
@given(payloads=st.lists(_frame_payloads, max_size=5), cut=st.integers(0, 600))
def test_decode_frames_is_split_then_decode(payloads, cut):
    stream = b"".join(struct.pack(">i", len(p)) + p for p in payloads if len(p) >= 4)
    data = stream[:cut]
    items, consumed = command_module.native_decode_frames(data, 10_000)
    whole, split_consumed = frames.split_frames_py(data, 10_000)
    assert consumed == split_consumed and len(items) == len(whole)
    for item, frame in zip(items, whole):
        if type(item) is RemotingCommand:
            _same(item, RemotingCommand.decode_py(frame))
            assert item.body == RemotingCommand.decode_py(frame).body
        else:  # declined: exactly the frame, and the native single-frame decoder declines it too
            assert type(item) is memoryview and bytes(item) == bytes(frame)
            assert _native_decode(frame) is None
    assert command_module.native_decode_frames(bytearray(data), 10_000)[1] == consumed


@pytest.mark.parametrize("length", [-1, 0, 3, 1001, 0x7FFFFFFF])
def test_decode_frames_rejects_lengths_naming_them(length):
    good = RemotingCommand.create_request(10).encode()
    with pytest.raises(RemotingCommandError, match=f"frame length {length} outside 4..1000"):
        command_module.native_decode_frames(good + struct.pack(">i", length) + b"abcd", 1000)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(text, text | st.none() | st.integers() | st.booleans(), max_size=5))
def test_ext_fields_conversion_matches_the_python_rule(ext):
    from rmq_core.remoting.command import _ext_to_str, ext_value_to_str

    expected = {str(k): ext_value_to_str(v) for k, v in ext.items() if v is not None}
    got = _ext_to_str(ext)
    assert got == expected and got is not ext  # always a copy: the caller may mutate its dict
    assert all(type(v) is str for v in got.values())
