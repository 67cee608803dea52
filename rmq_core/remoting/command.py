"""RemotingCommand: one request or response of the RocketMQ 4.x remoting protocol.

Frame (all integers big-endian, docs/protocol.md §1):

    int32 length            = 4 + headerLength + bodyLength (the prefix itself excluded)
    int32 hdrLenAndType     = serializeType << 24 | headerLength
    header                  JSON (type 0) or ROCKETMQ binary (type 1)
    body                    opaque bytes

Interoperability rules this module enforces:
* request ext fields are read leniently: the C++ client mixes JSON numbers and strings, so every
  scalar is normalised to a string on decode and the typed getters parse it;
* every ext field we encode is a JSON string (C++ ignores numbers in responses);
* the JSON header keys are written sorted, like fastjson; any whitespace (C++ ends with "\\n")
  is accepted on decode.
"""
from __future__ import annotations

import enum
import itertools
import json
import struct
from json.encoder import encode_basestring
from typing import Any, Mapping

from rmq_core.errors import RemotingCommandError
from rmq_core.remoting.codes import MQVersion

RESPONSE_FLAG = 0x1  # flag bit 0: this command is a response
ONEWAY_FLAG = 0x2  # flag bit 1: the sender expects no response

_INT32 = struct.Struct(">i")
_PREFIX = struct.Struct(">iI")  # length, hdrLenAndType
_BIN_FIXED = struct.Struct(">hbhii")  # code, language, version, opaque, flag
_INT16 = struct.Struct(">h")

INT32_MAX = 0x7FFFFFFF

_JSON_DECODE = json.JSONDecoder().decode
_esc = encode_basestring  # JSON string literal, non-ASCII kept as is (C-accelerated)


class LanguageCode(enum.IntEnum):
    JAVA = 0
    CPP = 1
    DOTNET = 2
    PYTHON = 3
    DELPHI = 4
    ERLANG = 5
    RUBY = 6
    OTHER = 7
    HTTP = 8
    GO = 9
    PHP = 10
    OMS = 11
    RUST = 12


class SerializeType(enum.IntEnum):
    JSON = 0
    ROCKETMQ = 1


# A process-wide request id; wraps inside int32 because Java and C++ peers hold it in an int.
# (public: the native send pipeline takes its opaques from the same counter, so none repeats)
opaque_counter = itertools.count(1)


def next_opaque() -> int:
    return next(opaque_counter) & INT32_MAX


def ext_value_to_str(value: Any) -> str:
    """How an ext field value travels: str as is, bools as Java prints them, the rest via str()."""
    if type(value) is str:
        return value
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return str(value)


def _ext_to_str(ext_fields: Mapping[str, Any] | None) -> dict[str, str]:
    if not ext_fields:
        return {}
    if _native_copy_if_plain is not None:
        plain = _native_copy_if_plain(ext_fields)  # all str already (a response echoing fields)
        if plain is not None:
            return plain
    return {str(k): ext_value_to_str(v) for k, v in ext_fields.items() if v is not None}


class ManyMessageTransfer:
    """A body of several buffers that go to the socket back to back, never joined (RocketMQ's
    ManyMessageTransfer): a pull answer's records as views of the mapped commit log.  len() is the
    body's size; bytes() joins it (a transport that hands commands over in memory does)."""

    __slots__ = ("buffers", "size")

    def __init__(self, buffers: list, size: int):
        self.buffers = buffers
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __bytes__(self) -> bytes:
        return b"".join(self.buffers)


class RemotingCommand:
    """A mutable request/response.  `ext_fields` values are strings (see the module docstring)."""

    __slots__ = ("code", "language", "version", "opaque", "flag", "remark", "ext_fields", "body",
                 "serialize_type")

    def __init__(self, code: int, *, language: str = "JAVA", version: int = MQVersion.CURRENT,
                 opaque: int = 0, flag: int = 0, remark: str | None = None,
                 ext_fields: dict[str, str] | None = None, body: bytes | None = None,
                 serialize_type: SerializeType = SerializeType.JSON):
        self.code = int(code)
        self.language = language
        self.version = version
        self.opaque = opaque
        self.flag = flag
        self.remark = remark
        self.ext_fields = ext_fields if ext_fields is not None else {}
        self.body = body
        self.serialize_type = serialize_type

    # --- construction ------------------------------------------------------------------------------
    @classmethod
    def create_request(cls, code: int, ext_fields: Mapping[str, Any] | None = None,
                       body: bytes | None = None) -> "RemotingCommand":
        """A request with a fresh opaque; ext values become strings (bools "true"/"false")."""
        return cls(code, opaque=next_opaque(), ext_fields=_ext_to_str(ext_fields), body=body)

    @classmethod
    def create_response(cls, code: int, remark: str | None = None,
                        ext_fields: Mapping[str, Any] | None = None, body: bytes | None = None,
                        opaque: int = 0) -> "RemotingCommand":
        return cls(code, opaque=opaque, flag=RESPONSE_FLAG, remark=remark,
                   ext_fields=_ext_to_str(ext_fields), body=body)

    def make_response(self, code: int, remark: str | None = None,
                      ext_fields: Mapping[str, Any] | None = None,
                      body: bytes | None = None) -> "RemotingCommand":
        """The response to this request: same opaque, same serialize type, flag = response."""
        return new_response(self, code, remark, _ext_to_str(ext_fields), body)

    def copy(self) -> "RemotingCommand":
        """A copy that later mutation of this command cannot reach (the body becomes bytes)."""
        body = self.body
        if body is not None and type(body) is not bytes:
            body = bytes(body)
        return RemotingCommand(self.code, language=self.language, version=self.version,
                               opaque=self.opaque, flag=self.flag, remark=self.remark,
                               ext_fields=dict(self.ext_fields), body=body,
                               serialize_type=self.serialize_type)

    # --- flags -------------------------------------------------------------------------------------
    @property
    def is_response(self) -> bool:
        return bool(self.flag & RESPONSE_FLAG)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & ONEWAY_FLAG)

    def mark_oneway(self) -> None:
        self.flag |= ONEWAY_FLAG

    def mark_response(self) -> None:
        self.flag |= RESPONSE_FLAG

    # --- typed ext field access ----------------------------------------------------------------------
    def get_str(self, name: str, default: str | None = None) -> str | None:
        value = self.ext_fields.get(name)
        if value is None:
            return default
        return value if type(value) is str else ext_value_to_str(value)

    def get_int(self, name: str, default: int | None = None) -> int | None:
        """The field as an int; a missing or empty field gives `default`; garbage raises naming it."""
        value = self.ext_fields.get(name)
        if value is None or value == "":
            return default
        if type(value) is int:
            return value
        try:  # (int() takes the surrounding whitespace a str may have)
            return int(value if type(value) is str else str(value))
        except ValueError:
            raise RemotingCommandError(
                f"bad value {value!r} for header field {name!r} of request code {self.code}: "
                "expected an integer") from None

    def required_str(self, name: str) -> str:
        """The field, which must be there and not empty (else an error naming it)."""
        value = self.get_str(name)
        if value is None or value == "":
            raise RemotingCommandError(f"request code {self.code}: the header field {name!r} is missing or empty")
        return value

    def required_int(self, name: str) -> int:
        """The field as an int, which must be there (else an error naming it)."""
        value = self.get_int(name)
        if value is None:
            raise RemotingCommandError(f"request code {self.code}: the header field {name!r} is missing")
        return value

    def get_bool(self, name: str, default: bool = False) -> bool:
        value = self.ext_fields.get(name)
        if value is None or value == "":
            return default
        if type(value) is bool:
            return value
        return str(value).strip().lower() in ("1", "true")

    # --- encoding ----------------------------------------------------------------------------------
    def _ext_for_wire(self) -> dict[str, str]:
        ext = self.ext_fields
        for v in ext.values():
            if type(v) is not str:
                return _ext_to_str(ext)
        return ext

    def encode_header(self, body_length: int | None = None) -> bytes:
        """Length prefix + hdrLenAndType + header, ready to be followed by the body."""
        if body_length is None:
            body_length = len(self.body) if self.body is not None else 0
        if self.serialize_type is SerializeType.JSON and _native_encode is not None:
            frame_header = _native_encode(self, body_length)
            if frame_header is not None:
                return frame_header
        if self.serialize_type == SerializeType.ROCKETMQ:
            header = self._encode_binary_header()
            stype = 1
        else:
            header = self._encode_json_header()
            stype = 0
        return _PREFIX.pack(4 + len(header) + body_length, (stype << 24) | len(header)) + header

    def encode(self) -> bytes:
        """The whole frame, including the 4-byte length prefix."""
        body = self.body
        if not body:
            return self.encode_header(0)
        return self.encode_header(len(body)) + bytes(body)

    def encode_header_py(self, body_length: int) -> bytes:
        """The pure-Python encoder of encode_header (the reference for the native one)."""
        if self.serialize_type == SerializeType.ROCKETMQ:
            header, stype = self._encode_binary_header(), 1
        else:
            header, stype = self._encode_json_header(), 0
        return _PREFIX.pack(4 + len(header) + body_length, (stype << 24) | len(header)) + header

    def _encode_json_header(self) -> bytes:
        # Written by hand (same bytes as json.dumps with sorted keys, compact separators, no ASCII
        # escaping; ~1/3 faster): keys in fastjson's sorted order, remark and empty extFields
        # omitted as Java omits nulls.
        language = self.language if isinstance(self.language, str) else LanguageCode(self.language).name
        parts = ['{"code":%d' % self.code]
        ext = self._ext_for_wire()
        if ext:
            parts.append(',"extFields":{')
            parts.append(",".join([_esc(k) + ":" + _esc(v) for k, v in ext.items()]))
            parts.append("}")
        parts.append(',"flag":%d,"language":%s,"opaque":%d' % (self.flag, _esc(language), self.opaque))
        if self.remark is not None:
            parts.append(',"remark":' + _esc(self.remark))
        parts.append(',"serializeTypeCurrentRPC":"JSON","version":%d}' % self.version)
        return "".join(parts).encode("utf-8", "replace")

    def _encode_binary_header(self) -> bytes:
        try:
            language = LanguageCode[self.language].value if isinstance(self.language, str) else int(self.language)
        except KeyError:
            language = LanguageCode.OTHER.value
        try:
            parts = [_BIN_FIXED.pack(self.code, language, self.version, self.opaque, self.flag)]
        except struct.error:
            raise RemotingCommandError(
                f"cannot encode a ROCKETMQ binary header: code {self.code}, version {self.version}, "
                f"opaque {self.opaque} or flag {self.flag} is out of range") from None
        if self.remark:
            remark = self.remark.encode("utf-8", "replace")
            parts += [_INT32.pack(len(remark)), remark]
        else:
            parts.append(_INT32.pack(0))
        ext_parts = []
        for k, v in self._ext_for_wire().items():
            kb, vb = k.encode("utf-8", "replace"), v.encode("utf-8", "replace")
            ext_parts += [_INT16.pack(len(kb)), kb, _INT32.pack(len(vb)), vb]
        ext = b"".join(ext_parts)
        parts += [_INT32.pack(len(ext)), ext]
        return b"".join(parts)

    # --- decoding ----------------------------------------------------------------------------------
    @classmethod
    def decode(cls, frame: bytes | bytearray | memoryview) -> "RemotingCommand":
        """Decode a frame WITHOUT its 4-byte length prefix; RemotingCommandError says what is wrong."""
        if _native_decode is not None and cls is RemotingCommand:
            values = _native_decode(frame)  # None: not the common flat JSON shape; decided below
            if values is not None:
                return command_of(values)
        return cls.decode_py(frame)

    @classmethod
    def decode_py(cls, frame: bytes | bytearray | memoryview) -> "RemotingCommand":
        """The pure-Python decoder: the reference the native fast path is tested against."""
        n = len(frame)
        if n < 4:
            raise RemotingCommandError(f"frame of {n} bytes is too short for the header length field")
        (len_and_type,) = struct.unpack_from(">I", frame, 0)
        stype = len_and_type >> 24
        header_length = len_and_type & 0xFFFFFF
        if header_length > n - 4:
            raise RemotingCommandError(
                f"header length {header_length} exceeds the frame ({n - 4} bytes after the length field)")
        header = frame[4:4 + header_length]
        if stype == SerializeType.JSON:
            cmd = cls._decode_json_header(header)
        elif stype == SerializeType.ROCKETMQ:
            cmd = cls._decode_binary_header(header)
        else:
            raise RemotingCommandError(f"unknown serialize type {stype} (expected 0 JSON or 1 ROCKETMQ)")
        if n > 4 + header_length:
            cmd.body = bytes(frame[4 + header_length:])
        return cmd

    @classmethod
    def _decode_json_header(cls, header) -> "RemotingCommand":
        try:
            obj = _JSON_DECODE(bytes(header).decode("utf-8"))
        except (ValueError, RecursionError) as e:
            raise RemotingCommandError(f"bad JSON header: {e}") from None
        if not isinstance(obj, dict):
            raise RemotingCommandError(f"bad JSON header: expected an object, got {type(obj).__name__}")
        get = obj.get
        code, opaque, flag, version = get("code"), get("opaque", 0), get("flag", 0), get("version", 0)
        if type(code) is not int or type(opaque) is not int or type(flag) is not int or type(version) is not int:
            code = _int_field(obj, "code", None)  # slow path: numeric strings, or a precise error
            opaque, flag, version = _int_field(obj, "opaque", 0), _int_field(obj, "flag", 0), _int_field(obj, "version", 0)
        cmd = cls(code, opaque=opaque, flag=flag, version=version)
        language = obj.get("language")
        if language is not None:
            if isinstance(language, str):
                cmd.language = language
            elif type(language) is int and 0 <= language <= 255:
                cmd.language = _language_name(language)
            else:
                raise RemotingCommandError(f"bad header field 'language': {language!r}")
        remark = obj.get("remark")
        if remark is not None:
            cmd.remark = remark if isinstance(remark, str) else ext_value_to_str(remark)
        ext = obj.get("extFields")
        if ext is not None:
            if not isinstance(ext, dict):
                raise RemotingCommandError(f"bad header field 'extFields': expected an object, got {ext!r:.80}")
            for v in ext.values():
                if type(v) is not str:
                    ext = {k: ext_value_to_str(v) for k, v in ext.items() if v is not None}
                    break
            cmd.ext_fields = ext
        return cmd

    @classmethod
    def _decode_binary_header(cls, header) -> "RemotingCommand":
        header = bytes(header)
        try:
            code, language, version, opaque, flag = _BIN_FIXED.unpack_from(header, 0)
            pos = _BIN_FIXED.size
            (remark_len,) = _INT32.unpack_from(header, pos)
            pos += 4
            remark = None
            if remark_len < 0 or pos + remark_len > len(header):
                raise RemotingCommandError(f"bad remark length {remark_len} in binary header")
            if remark_len:
                remark = header[pos:pos + remark_len].decode("utf-8", "replace")
                pos += remark_len
            (ext_len,) = _INT32.unpack_from(header, pos)
            pos += 4
            if ext_len < 0 or pos + ext_len > len(header):
                raise RemotingCommandError(f"bad extFields length {ext_len} in binary header")
            end = pos + ext_len
            ext: dict[str, str] = {}
            while pos < end:
                (klen,) = _INT16.unpack_from(header, pos)
                pos += 2
                if klen < 0 or pos + klen > end:
                    raise RemotingCommandError(f"bad extFields key length {klen} in binary header")
                key = header[pos:pos + klen].decode("utf-8", "replace")
                pos += klen
                (vlen,) = _INT32.unpack_from(header, pos)
                pos += 4
                if vlen < 0 or pos + vlen > end:
                    raise RemotingCommandError(f"bad extFields value length {vlen} for key {key!r} in binary header")
                ext[key] = header[pos:pos + vlen].decode("utf-8", "replace")
                pos += vlen
        except struct.error:
            raise RemotingCommandError(f"truncated binary header ({len(header)} bytes)") from None
        return cls(code, language=_language_name(language), version=version, opaque=opaque, flag=flag,
                   remark=remark, ext_fields=ext, serialize_type=SerializeType.ROCKETMQ)

    def __repr__(self) -> str:
        kind = "response" if self.is_response else "request"
        body = len(self.body) if self.body is not None else 0
        return (f"RemotingCommand({kind} code={self.code} opaque={self.opaque} flag={self.flag} "
                f"remark={self.remark!r} ext={self.ext_fields!r} body={body}B)")


def _language_name(value: int) -> str:
    try:
        return LanguageCode(value).name
    except ValueError:
        return LanguageCode.OTHER.name


_FIELDS = RemotingCommand.__slots__


class FrameCommand(RemotingCommand):
    """A RemotingCommand over an encoded frame (without its length prefix; PrefixedFrameCommand:
    with it), decoded when one of its fields is first read or set - what an RPC hook is handed:
    a hook that reads nothing costs no decoding.  `changed` tells whether the command now differs
    from its frame (then encode() it anew; else the frame stands as it is).  A malformed frame
    raises RemotingCommandError at that first access."""

    __slots__ = ("_src", "_was")  # the frame until decoded, then None; the fields decoded
    _skip = 0  # bytes before the command in the frame

    def __init__(self, frame):  # (the fields stay unset until decoded)
        _set_src(self, frame)

    # (each field is a property over RemotingCommand's slot, defined below the class: the first
    # read or write decodes - a write after it, so a later decoding cannot undo it)

    def _decode(self) -> None:
        frame, skip = self._src, self._skip
        if skip:
            frame = memoryview(frame)[skip:]
        values = _native_decode(frame) if _native_decode is not None else None
        if values is None:  # (the Python codec decides, and names what is wrong)
            c = RemotingCommand.decode_py(frame)
            values = (c.code, c.language, c.version, c.opaque, c.flag, c.remark, c.ext_fields, c.body)
            stype = c.serialize_type
        else:
            stype = _JSON
        for set_slot, value in zip(_SLOT_SETTERS, values):  # (the slots themselves: no __setattr__)
            set_slot(self, value)
        _set_serialize_type(self, stype)
        _set_src(self, None)
        code, language, version, opaque, flag, remark, ext, body = values
        _set_was(self, (code, language, version, opaque, flag, remark, dict(ext), body, stype))

    @property
    def changed(self) -> bool:
        """True once a field differs from the frame's (a body counts as changed when replaced)."""
        if self._src is not None:
            return False
        was = self._was
        return (_get_body(self) is not was[7] or _get_ext(self) != was[6]
                or (_get_code(self), _get_language(self), _get_version(self), _get_opaque(self), _get_flag(self),
                    _get_remark(self)) != was[:6] or _get_serialize_type(self) is not was[8])


class PrefixedFrameCommand(FrameCommand):
    """A FrameCommand over a frame that keeps its 4-byte length prefix (a request as written)."""

    __slots__ = ()
    _skip = 4


def _lazy_field(name: str) -> property:
    slot = getattr(RemotingCommand, name)
    get, put = slot.__get__, slot.__set__

    def read(self):
        if _get_src(self) is not None:
            self._decode()
        return get(self)

    def write(self, value) -> None:
        if _get_src(self) is not None:
            self._decode()
        put(self, value)

    return property(read, write, doc=f"{name}, decoded from the frame on first access")


_get_src = FrameCommand._src.__get__
(_get_code, _get_language, _get_version, _get_opaque, _get_flag, _get_remark, _get_ext, _get_body,
 _get_serialize_type) = (getattr(RemotingCommand, name).__get__ for name in _FIELDS)
_set_src = FrameCommand._src.__set__
_set_was = FrameCommand._was.__set__
_SLOT_SETTERS = tuple(getattr(RemotingCommand, name).__set__ for name in _FIELDS[:8])
_set_serialize_type = RemotingCommand.serialize_type.__set__
assert _FIELDS[8] == "serialize_type" and _FIELDS[:8] == (
    "code", "language", "version", "opaque", "flag", "remark", "ext_fields", "body")
for _name in _FIELDS:
    setattr(FrameCommand, _name, _lazy_field(_name))
del _name

# FrameCommand(frame) in two C calls, without the Python call of __init__ (for the per-message
# paths of the RPC hook step): command = new_command(FrameCommand); set_frame(command, frame)
new_command = object.__new__
set_frame = _set_src


def command_of(values) -> RemotingCommand:
    """The RemotingCommand of a JSON header's values as the native decoder hands them out
    (rmq_core._native.frame.HEADER_FIELDS: code, language, version, opaque, flag, remark,
    ext_fields, body) - without the Python __init__."""
    cmd = new_command(RemotingCommand)
    cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag, cmd.remark, cmd.ext_fields, cmd.body = values
    cmd.serialize_type = _JSON
    return cmd


def new_response(request, code, remark: str | None, ext_fields: dict, body) -> RemotingCommand:
    """make_response without the Python __init__: the response to `request` (its opaque and
    serialize type, flag RESPONSE, language JAVA, our version) with `ext_fields` kept as given
    (the caller hands over a fresh dict of str)."""
    cmd = new_command(RemotingCommand)
    cmd.code = code if type(code) is int else int(code)
    cmd.language = "JAVA"
    cmd.version = _CURRENT_VERSION
    cmd.opaque = request.opaque
    cmd.flag = RESPONSE_FLAG
    cmd.remark = remark
    cmd.ext_fields = ext_fields
    cmd.body = body
    cmd.serialize_type = request.serialize_type
    return cmd


_JSON = SerializeType.JSON
_CURRENT_VERSION = int(MQVersion.CURRENT)


def json_int(value) -> int | None:
    """A JSON value read as an integer as fastjson reads one: an int, or a str int() takes; None
    for anything else (the caller names the field)."""
    if type(value) is int:
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    return None


def _int_field(obj: dict, name: str, default: int | None) -> int:
    value = obj.get(name)
    if value is None:
        if default is None:
            raise RemotingCommandError(f"bad JSON header: field {name!r} is missing")
        return default
    number = json_int(value)
    if number is None:
        raise RemotingCommandError(f"bad JSON header: field {name!r} has value {value!r:.80}, expected an integer")
    return number


# The native JSON header codec (rmq_core/_native/frame.pyx): the common flat header in
# C, handed out as plain values (command_of makes the command); anything unusual comes back as
# None and the Python code above decides.
try:
    from rmq_core._native import frame as _frame_native
except ImportError:  # pragma: no cover - `make build` always builds it
    _native_decode = _native_encode = _native_copy_if_plain = None
    native_decode_frames = native_encode_json_header = None
else:
    _native_decode = _frame_native.decode_frame
    _native_encode = _frame_native.encode_json_frame_header
    _native_copy_if_plain = _frame_native.copy_if_plain
    _native_decode_frames = _frame_native.decode_frames

    def native_decode_frames(data, max_frame_length: int) -> tuple[list, int]:
        """Split and decode in one pass: (items, consumed), each whole frame as its RemotingCommand
        or - where the native codec declined it - its memoryview, for RemotingCommand.decode.
        A bad frame length raises RemotingCommandError naming it."""
        try:
            items, consumed = _native_decode_frames(data, max_frame_length)
        except ValueError as e:
            raise RemotingCommandError(str(e)) from None
        for k, item in enumerate(items):
            if type(item) is tuple:
                items[k] = command_of(item)
        return items, consumed

    # For transports (None when the extension is not built): native_encode_json_header(command,
    # body_length) -> the frame header of a JSON command, or None when encode_header must do it.
    native_encode_json_header = _frame_native.encode_json_frame_header
