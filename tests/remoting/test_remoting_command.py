"""RemotingCommand codec: captured C++ frames, our responses, JSON and ROCKETMQ-binary round trips."""
import glob
import json
import os
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq_core.errors import RemotingCommandError
from rmq_core.remoting.codes import RequestCode, ResponseCode, code_name
from rmq_core.remoting.command import LanguageCode, RemotingCommand, SerializeType, ext_value_to_str

from tests.paths import CAPTURES as _CAPTURES_DIR  # noqa: E402

CAPTURES = str(_CAPTURES_DIR)


def _capture_records():
    records = []
    for path in sorted(glob.glob(os.path.join(CAPTURES, "*.jsonl"))):
        if ".client." in path:
            continue
        with open(path, encoding="utf-8") as f:
            for line in f:
                rec = json.loads(line)
                if "frame_hex" in rec:
                    records.append((os.path.basename(path), rec))
    return records


RECORDS = _capture_records()
CLIENT_FRAMES = [(name, r) for name, r in RECORDS if r["dir"] == "client->server"]
SERVER_FRAMES = [(name, r) for name, r in RECORDS if r["dir"] == "server->client"]

pytestmark = pytest.mark.skipif(not RECORDS, reason="protocol captures not available")


def _decode_hex(frame_hex: str) -> tuple[int, RemotingCommand]:
    raw = bytes.fromhex(frame_hex)
    (length,) = struct.unpack(">i", raw[:4])
    return length, RemotingCommand.decode(raw[4:])


def test_captures_are_present():
    assert len(CLIENT_FRAMES) > 300
    assert len(SERVER_FRAMES) > 300


@pytest.mark.parametrize("name,rec", CLIENT_FRAMES, ids=[f"{n}#{r['seq']}" for n, r in CLIENT_FRAMES])
def test_every_captured_client_frame_decodes(name, rec):
    raw = bytes.fromhex(rec["frame_hex"])
    length, cmd = _decode_hex(rec["frame_hex"])
    assert length == len(raw) - 4
    assert cmd.code == rec["code"]
    assert cmd.opaque == rec["opaque"]
    assert cmd.flag == rec["flag"]
    assert cmd.serialize_type == SerializeType.JSON
    assert cmd.is_response == (rec["kind"] == "response")
    header = json.loads(rec["header_json"]) if "header_json" in rec else rec["header"]
    assert cmd.language == header.get("language", "JAVA")
    assert cmd.version == header.get("version", 0)
    # every ext field reads back as the string form of what the client sent (number or string)
    for key, value in (header.get("extFields") or {}).items():
        assert cmd.get_str(key) == ext_value_to_str(value)
        if type(value) is int:
            assert cmd.get_int(key) == value
    body_len = rec.get("body_len", 0)
    assert (len(cmd.body) if cmd.body else 0) == body_len
    if rec.get("body_text") is not None and body_len:
        assert cmd.body.decode("utf-8") == rec["body_text"]


def test_mixed_number_and_string_ext_fields_from_cpp_send():
    send = next(r for _, r in CLIENT_FRAMES if r["code"] == RequestCode.SEND_MESSAGE)
    _, cmd = _decode_hex(send["frame_hex"])
    raw_ext = send["header"]["extFields"]
    assert type(raw_ext["queueId"]) is int and type(raw_ext["bornTimestamp"]) is str
    assert cmd.get_int("queueId") == raw_ext["queueId"]
    assert cmd.get_int("bornTimestamp") == int(raw_ext["bornTimestamp"])
    assert cmd.get_int("defaultTopicQueueNums") == 4
    assert cmd.get_str("defaultTopic") == "TBW102"
    assert cmd.get_bool("batch") is False
    assert cmd.get_str("properties").endswith("\x02")


def test_cpp_header_has_trailing_newline_and_is_accepted():
    rec = CLIENT_FRAMES[0][1]
    assert rec["header_json"].endswith("\n")
    _, cmd = _decode_hex(rec["frame_hex"])
    assert cmd.code == RequestCode.GET_ROUTEINFO_BY_TOPIC
    assert cmd.get_str("topic") == "CapTopic"
    assert cmd.remark == ""


@pytest.mark.parametrize("name,rec", SERVER_FRAMES[:80], ids=[f"{n}#{r['seq']}" for n, r in SERVER_FRAMES[:80]])
def test_accepted_server_frames_decode(name, rec):
    _, cmd = _decode_hex(rec["frame_hex"])
    assert cmd.code == rec["code"] and cmd.opaque == rec["opaque"] and cmd.flag == rec["flag"]


def test_response_encodes_string_ext_values_flag_1_and_echoed_opaque():
    request = RemotingCommand.decode(bytes.fromhex(CLIENT_FRAMES[0][1]["frame_hex"])[4:])
    request.opaque = 4242
    response = request.make_response(ResponseCode.SUCCESS, ext_fields={
        "queueOffset": 1, "queueId": 3, "flag": True, "msgId": "7F00000100002A9F00000000000007E7",
        "skipped": None})
    response.ext_fields["late"] = 17  # set directly, after construction: still goes out as a string
    frame = response.encode()
    (length, len_and_type) = struct.unpack(">iI", frame[:8])
    assert length == len(frame) - 4
    assert len_and_type >> 24 == 0  # JSON, the only type the C++ client reads
    header = json.loads(frame[8:8 + (len_and_type & 0xFFFFFF)])
    assert header["flag"] == 1 and header["opaque"] == 4242 and header["code"] == 0
    assert header["language"] == "JAVA" and isinstance(header["language"], str)
    assert header["extFields"] == {"queueOffset": "1", "queueId": "3", "flag": "true",
                                   "msgId": "7F00000100002A9F00000000000007E7", "late": "17"}
    assert all(isinstance(v, str) for v in header["extFields"].values())
    assert list(header) == sorted(header)  # fastjson's key order


def test_create_request_converts_ext_values_and_counts_opaque():
    a = RemotingCommand.create_request(RequestCode.PULL_MESSAGE, {"queueId": 1, "b": False, "x": None})
    b = RemotingCommand.create_request(RequestCode.PULL_MESSAGE)
    assert a.ext_fields == {"queueId": "1", "b": "false"}
    assert b.opaque != a.opaque
    assert not a.is_response and not a.is_oneway
    a.mark_oneway()
    assert a.is_oneway and a.flag == 2
    a.mark_response()
    assert a.is_response and a.flag == 3


def test_make_response_keeps_serialize_type():
    req = RemotingCommand.create_request(RequestCode.HEART_BEAT)
    req.serialize_type = SerializeType.ROCKETMQ
    resp = req.make_response(ResponseCode.SUCCESS)
    assert resp.serialize_type == SerializeType.ROCKETMQ and resp.opaque == req.opaque and resp.flag == 1
    frame = resp.encode()
    assert frame[4] == 1  # the type byte


def test_getters():
    cmd = RemotingCommand(1, ext_fields={"n": "12", "neg": "-3", "t": "TRUE", "one": "1", "zero": "0",
                                         "f": "false", "junk": "12a", "empty": ""})
    assert cmd.get_int("n") == 12 and cmd.get_int("neg") == -3
    assert cmd.get_int("missing") is None and cmd.get_int("missing", 5) == 5
    assert cmd.get_int("empty", 7) == 7
    assert cmd.get_bool("t") and cmd.get_bool("one")
    assert not cmd.get_bool("zero") and not cmd.get_bool("f") and not cmd.get_bool("missing")
    assert cmd.get_bool("missing", True)
    with pytest.raises(RemotingCommandError, match="'12a'.*'junk'"):
        cmd.get_int("junk")


def test_decode_lenient_scalar_types():
    header = json.dumps({"code": 11, "opaque": 3, "flag": 0, "language": "CPP", "version": 63,
                         "extFields": {"a": 1, "b": True, "c": None, "d": 1.5, "e": {"x": 1}, "f": "s"}}).encode()
    frame = struct.pack(">I", len(header)) + header
    cmd = RemotingCommand.decode(frame)
    assert cmd.ext_fields == {"a": "1", "b": "true", "d": "1.5", "e": '{"x":1}', "f": "s"}
    with pytest.raises(RemotingCommandError, match="'d'"):
        cmd.get_int("d")


def _json_frame(header: bytes) -> bytes:
    return struct.pack(">I", len(header)) + header


@pytest.mark.parametrize("frame,match", [
    (b"", "too short"),
    (b"\x00\x00", "too short"),
    (struct.pack(">I", 100) + b"{}", "header length 100 exceeds"),
    (struct.pack(">I", 2 << 24) + b"", "unknown serialize type 2"),
    (_json_frame(b"{bad}"), "bad JSON header"),
    (_json_frame(b"[]"), "expected an object"),
    (_json_frame(b"{}"), "'code' is missing"),
    (_json_frame(b'{"code":"x"}'), "'code' has value 'x'"),
    (_json_frame(b'{"code":1,"extFields":[1]}'), "extFields"),
    (_json_frame(b'{"code":1,"language":[1,2]}'), "language"),
    (_json_frame(b'{"code":1,"opaque":1.5}'), "'opaque'"),
    (struct.pack(">I", (1 << 24) | 3) + b"\x00\x01\x02", "truncated binary header"),
    (struct.pack(">I", 2) + b"\xff\xfe", "bad JSON header"),
])
def test_decode_errors_name_the_problem(frame, match):
    with pytest.raises(RemotingCommandError, match=match):
        RemotingCommand.decode(frame)


def test_binary_header_bad_lengths():
    good = RemotingCommand(10, remark="r", ext_fields={"k": "v"}, serialize_type=SerializeType.ROCKETMQ).encode()[4:]
    hl = struct.unpack(">I", good[:4])[0] & 0xFFFFFF
    header = bytearray(good[4:4 + hl])
    header[13:17] = struct.pack(">i", 1000)  # remark length beyond the header
    with pytest.raises(RemotingCommandError, match="remark length"):
        RemotingCommand.decode(struct.pack(">I", (1 << 24) | len(header)) + bytes(header))


def test_binary_encode_out_of_range_names_fields():
    cmd = RemotingCommand(70000, serialize_type=SerializeType.ROCKETMQ)
    with pytest.raises(RemotingCommandError, match="code 70000"):
        cmd.encode()


def test_copy_is_independent():
    body = bytearray(b"abc")
    cmd = RemotingCommand(1, ext_fields={"a": "1"}, body=body)
    dup = cmd.copy()
    cmd.ext_fields["a"] = "2"
    body[0:1] = b"z"
    assert dup.ext_fields == {"a": "1"} and dup.body == b"abc"


def test_code_name():
    assert code_name(105) == "GET_ROUTEINFO_BY_TOPIC(105)"
    assert code_name(17, response=True) == "TOPIC_NOT_EXIST(17)"
    assert code_name(99999) == "99999"
    assert RequestCode.RESET_CONSUMER_OFFSET == RequestCode.INVOKE_BROKER_TO_RESET_OFFSET == 222
    assert RequestCode.SEND_BATCH_MESSAGE == 320 and ResponseCode.FLOW_CONTROL == 215


# --- property tests: both header encodings round-trip ---------------------------------------------------
_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
_commands = st.builds(
    lambda code, language, version, opaque, flag, remark, ext, body: (code, language, version, opaque, flag, remark, ext, body),
    st.integers(-32768, 32767),
    st.sampled_from([m.name for m in LanguageCode]),
    st.integers(-32768, 32767),
    st.integers(-2**31, 2**31 - 1),
    st.integers(-2**31, 2**31 - 1),
    st.one_of(st.none(), _text.filter(bool)),
    st.dictionaries(_text.filter(bool), _text, max_size=8),
    st.one_of(st.none(), st.binary(min_size=1, max_size=300)),
)


@settings(max_examples=300, deadline=None)
@given(_commands, st.sampled_from(list(SerializeType)))
def test_header_round_trip(fields, serialize_type):
    code, language, version, opaque, flag, remark, ext, body = fields
    cmd = RemotingCommand(code, language=language, version=version, opaque=opaque, flag=flag,
                          remark=remark, ext_fields=dict(ext), body=body, serialize_type=serialize_type)
    frame = cmd.encode()
    (length,) = struct.unpack(">i", frame[:4])
    assert length == len(frame) - 4
    back = RemotingCommand.decode(frame[4:])
    assert (back.code, back.language, back.version, back.opaque, back.flag) == (code, language, version, opaque, flag)
    assert back.remark == remark
    assert back.ext_fields == ext
    assert back.body == body
    assert back.serialize_type == serialize_type


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_decode_random_bytes_never_crashes_uncontrolled(data):
    try:
        RemotingCommand.decode(data)
    except RemotingCommandError:
        pass


@settings(max_examples=200, deadline=None)
@given(_commands)
def test_json_header_bytes_equal_fastjson_style_json_dumps(fields):
    code, language, version, opaque, flag, remark, ext, body = fields
    cmd = RemotingCommand(code, language=language, version=version, opaque=opaque, flag=flag, remark=remark,
                          ext_fields=dict(ext))
    frame = cmd.encode()
    header_len = struct.unpack(">I", frame[4:8])[0]
    expected = {"code": code, "flag": flag, "language": language, "opaque": opaque,
                "serializeTypeCurrentRPC": "JSON", "version": version}
    if ext:
        expected["extFields"] = ext
    if remark is not None:
        expected["remark"] = remark
    # top-level keys sorted like fastjson; ext fields keep their insertion order
    reference = json.dumps({k: expected[k] for k in sorted(expected)}, separators=(",", ":"),
                           ensure_ascii=False).encode()
    assert frame[8:8 + header_len] == reference
