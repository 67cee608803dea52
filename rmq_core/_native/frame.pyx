# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Remoting frames: splitting a read into frames, and the JSON header codec of RemotingCommand.

Frame (shared/protocol/REMOTING.md §1, integers big-endian):

    int32 length            = 4 + headerLength + bodyLength (the prefix itself excluded)
    int32 hdrLenAndType     = serializeType << 24 | headerLength
    header                  JSON (type 0) or ROCKETMQ binary (type 1)
    body                    opaque bytes

The JSON header this module reads and writes is the flat object every RocketMQ 4.x peer sends:

    {"code":N,"extFields":{"k":"v",...},"flag":N,"language":"JAVA","opaque":N,
     "remark":"...","serializeTypeCurrentRPC":"JSON","version":N}

The header is read by frame.pxd's read_json_header (the one reader, which the broker's send lane
uses too).  Anything else (a number or boolean inside extFields, a numeric string for code, floats,
a top-level name RocketMQ does not send, a lone surrogate, invalid UTF-8, trailing garbage...) makes the native routine
return None and the pure-Python codec in rmq_core/remoting/command.py — the reference, and the
oracle of the tests — decides, with its precise error messages.  The encoder writes exactly the
bytes of the Python encoder (sorted keys, compact separators, non-ASCII kept, json escapes).
Bytes from the network are untrusted: every read is bounds-checked against the real length.
"""
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.dict cimport PyDict_Next, PyDict_SetItem
from cpython.list cimport PyList_Append
from cpython.object cimport PyObject
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int64_t, uint32_t, uint8_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcmp, memcpy
from cpython.ref cimport Py_INCREF, Py_XDECREF

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object unicode, Py_ssize_t* size) except NULL
    bint PyUnicode_CheckExact(object o)
    bint PyLong_CheckExact(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)
    object PyType_GenericAlloc(type t, Py_ssize_t nitems)
    void* PyUnicode_DATA(object o)

cdef object _command_cls = None
cdef object _json_type = None
cdef object _cls_new = None
cdef object _current_version = 0


def init(command_cls, json_serialize_type, current_version=0):
    """Bind the RemotingCommand class, SerializeType.JSON and the version our commands carry
    (called once by command.py)."""
    global _command_cls, _json_type, _cls_new, _current_version
    _command_cls = command_cls
    _json_type = json_serialize_type
    _cls_new = command_cls.__new__
    _current_version = int(current_version)


# --- frame splitting -----------------------------------------------------------------------------
def split_frames(data, Py_ssize_t max_frame_length):
    """(frames, consumed): every whole frame in `data` as a memoryview without its length prefix."""
    return _walk_frames(data, max_frame_length, False)


def decode_frames(data, Py_ssize_t max_frame_length):
    """split_frames and decode_frame in one pass: (items, consumed), each whole frame of `data` as
    its RemotingCommand or — when the native decoder declines it — as a memoryview of the frame
    (without its length prefix) for the Python codec to decode or reject.  A length outside
    4..max_frame_length raises RemotingCommandError naming it, as split_frames does."""
    return _walk_frames(data, max_frame_length, True)


cdef tuple _walk_frames(data, Py_ssize_t max_frame_length, bint decode):
    cdef Py_buffer pb
    cdef const uint8_t* buf
    cdef Py_ssize_t n
    cdef Py_ssize_t pos = 0, end
    cdef int64_t length = 0
    cdef bint bad = False
    cdef int status
    cdef list items = []
    view = None
    # A raw buffer, not a typed memoryview: acquiring one of those costs more than the split.
    PyObject_GetBuffer(data, &pb, PyBUF_SIMPLE)
    try:
        buf = <const uint8_t*>pb.buf
        n = pb.len
        while True:
            status = frame_at(buf, n, pos, max_frame_length, &length)
            if status <= 0:
                bad = status < 0
                break
            end = pos + 4 + length
            item = _decode_frame(buf + pos + 4, length) if decode else None
            if item is None:
                if view is None:
                    view = memoryview(data)
                item = view[pos + 4:end]
            PyList_Append(items, item)
            pos = end
    finally:
        PyBuffer_Release(&pb)
    if bad:
        from rmq_core.errors import RemotingCommandError
        raise RemotingCommandError(f"frame length {length} outside 4..{max_frame_length}")
    return items, pos


# --- JSON header decoding ------------------------------------------------------------------------
from frame cimport JsonHeader, header_int, read_json_header, unescape_json


# Header keys and many values repeat on every request ("topic", "JAVA", "false", a group name):
# a small direct-mapped cache of short ASCII strings hands out the same str objects (hash already
# computed, no allocation) instead of decoding them afresh each time.
cdef enum:
    _CACHE_SLOTS = 1024
    _CACHE_MAX_LEN = 24
cdef PyObject* _str_cache[_CACHE_SLOTS]


cdef object _short_str(const uint8_t* p, Py_ssize_t n):
    cdef uint32_t h = 2166136261u
    cdef Py_ssize_t i
    cdef PyObject* cur
    if n > _CACHE_MAX_LEN:
        return PyUnicode_DecodeUTF8(<const char*>p, n, NULL)
    for i in range(n):
        if p[i] >= 128:  # non-ASCII: decode normally (and let a bad sequence raise)
            return PyUnicode_DecodeUTF8(<const char*>p, n, NULL)
        h = (h ^ p[i]) * 16777619u
    cur = _str_cache[h & (_CACHE_SLOTS - 1)]
    if cur != NULL and PyUnicode_GET_LENGTH(<object>cur) == n and (
            n == 0 or memcmp(PyUnicode_DATA(<object>cur), p, n) == 0):
        return <object>cur
    s = PyUnicode_DecodeUTF8(<const char*>p, n, NULL)
    hash(s)  # cached inside the str: dict inserts of it are cheaper from now on
    Py_XDECREF(cur)
    Py_INCREF(s)
    _str_cache[h & (_CACHE_SLOTS - 1)] = <PyObject*>s
    return s


cdef enum:
    _STACK_UNESCAPE = 1024


cdef object _json_str(const uint8_t* p, Py_ssize_t n, bint escaped):
    """The str of a JSON string's inside (escapes in place), or None when it is not one this
    decoder takes (a lone surrogate, invalid UTF-8): the Python codec decides."""
    cdef char stack_buf[_STACK_UNESCAPE]
    cdef char* tmp
    cdef Py_ssize_t m
    if not escaped:
        try:
            return _short_str(p, n)
        except UnicodeDecodeError:
            return None
    # a header's escaped value (a properties string full of \u0001 / \u0002) usually fits the stack
    if n <= _STACK_UNESCAPE:
        tmp = stack_buf
    else:
        tmp = <char*>malloc(n)
        if tmp == NULL:
            raise MemoryError()
    try:
        m = unescape_json(p, n, <uint8_t*>tmp)
        if m < 0:
            return None
        try:
            return PyUnicode_DecodeUTF8(tmp, m, NULL)
        except UnicodeDecodeError:
            return None
    finally:
        if tmp != stack_buf:
            free(tmp)


cdef int _ext_entry(void* target, const uint8_t* k, Py_ssize_t kl, bint kesc,
                    const uint8_t* v, Py_ssize_t vl, bint vesc) except -1:
    key = _json_str(k, kl, kesc)
    if key is None:
        return 1
    value = _json_str(v, vl, vesc)
    if value is None:
        return 1
    PyDict_SetItem(<dict>target, key, value)
    return 0


def decode_frame(frame):
    """The RemotingCommand of a JSON-header frame (WITHOUT its length prefix), or None when the
    Python codec must decide (binary header, an unusual or malformed header, a short frame)."""
    cdef Py_buffer pb
    PyObject_GetBuffer(frame, &pb, PyBUF_SIMPLE)
    try:
        return _decode_frame(<const uint8_t*>pb.buf, pb.len)
    finally:
        PyBuffer_Release(&pb)


cdef object _decode_frame(const uint8_t* base, Py_ssize_t n):
    cdef JsonHeader h
    cdef dict ext = {}
    if read_json_header(base, n, &h, _ext_entry, <void*>ext) != 1 or h.other:
        return None
    if h.language == NULL:
        language = "JAVA"
    else:
        language = _json_str(h.language, h.language_len, h.language_escaped)
        if language is None:
            return None
    if h.remark == NULL:
        remark = None
    else:
        remark = _json_str(h.remark, h.remark_len, h.remark_escaped)
        if remark is None:
            return None
    # The slots start empty and are all set below, as RemotingCommand.__init__ would (minus the call).
    cmd = PyType_GenericAlloc(<type>_command_cls, 0)
    cmd.code = h.code
    cmd.language = language
    cmd.version = h.version
    cmd.opaque = h.opaque
    cmd.flag = h.flag
    cmd.remark = remark
    cmd.ext_fields = ext
    cmd.body = PyBytes_FromStringAndSize(<const char*>h.body, h.body_len) if h.body_len else None
    cmd.serialize_type = _json_type
    return cmd


# --- JSON header encoding ------------------------------------------------------------------------
from json_text cimport Out, out_put as _put, out_put_int, out_reserve as _grow, rmq_json_escaped


cdef int _put_int(Out* o, object value) except -1:
    cdef long long v = value  # OverflowError for an absurd value: the caller falls back
    return out_put_int(o, v)


cdef int _put_str(Out* o, object s) except -1:
    """A JSON string literal, escaped as json.encoder.encode_basestring does (json_text.h)."""
    cdef Py_ssize_t n
    cdef const char* p = PyUnicode_AsUTF8AndSize(s, &n)  # UnicodeEncodeError on a lone surrogate
    cdef char* w
    if o.n + n * 6 + 2 > o.cap:
        _grow(o, n * 6 + 2)
    w = o.buf + o.n
    w[0] = 34
    w = rmq_json_escaped(w + 1, p, n)
    w[0] = 34
    o.n = w + 1 - o.buf
    return 0


cdef int _encode_into(Out* o, cmd, dict ext) except -1:
    cdef Py_ssize_t pos = 0
    cdef PyObject* k
    cdef PyObject* v
    cdef bint first = True
    _put(o, '{"code":', 8)
    _put_int(o, cmd.code)
    if ext:
        _put(o, ',"extFields":{', 14)
        while PyDict_Next(ext, &pos, &k, &v):
            if not first:
                _put(o, ",", 1)
            first = False
            _put_str(o, <object>k)
            _put(o, ":", 1)
            _put_str(o, <object>v)
        _put(o, "}", 1)
    _put(o, ',"flag":', 8)
    _put_int(o, cmd.flag)
    _put(o, ',"language":', 12)
    _put_str(o, cmd.language)
    _put(o, ',"opaque":', 10)
    _put_int(o, cmd.opaque)
    remark = cmd.remark
    if remark is not None:
        _put(o, ',"remark":', 10)
        _put_str(o, remark)
    _put(o, ',"serializeTypeCurrentRPC":"JSON","version":', 44)
    _put_int(o, cmd.version)
    _put(o, "}", 1)
    return 0


cdef bint _plain(dict ext):
    """Every key and value an exact str: the only shape the native encoder writes."""
    cdef Py_ssize_t pos = 0
    cdef PyObject* k
    cdef PyObject* v
    while PyDict_Next(ext, &pos, &k, &v):
        if not PyUnicode_CheckExact(<object>k) or not PyUnicode_CheckExact(<object>v):
            return False
    return True


def copy_if_plain(ext):
    """A copy of `ext` when it is a dict of str -> str (the usual ext fields), else None."""
    if type(ext) is not dict or not _plain(<dict>ext):
        return None
    return dict(<dict>ext)


def encode_json_frame_header(cmd, Py_ssize_t body_length):
    """Length prefix + hdrLenAndType + JSON header of `cmd`, or None when the Python encoder must
    do it (non-str fields, a lone surrogate, an integer beyond 64 bits)."""
    cdef Out o
    cdef Py_ssize_t header_length, total
    cdef char* b
    ext = cmd.ext_fields
    if type(ext) is not dict or not _plain(<dict>ext):
        return None
    language = cmd.language
    remark = cmd.remark
    if not PyUnicode_CheckExact(language) or (remark is not None and not PyUnicode_CheckExact(remark)):
        return None
    o.cap = 512
    o.n = 8  # room for the two int32 fields in front
    o.buf = <char*>malloc(o.cap)
    if o.buf == NULL:
        raise MemoryError()
    o.heap = True
    try:
        try:
            _encode_into(&o, cmd, <dict>ext)
        except (OverflowError, UnicodeEncodeError, TypeError):
            return None
        header_length = o.n - 8
        total = 4 + header_length + body_length
        if header_length > 0xFFFFFF or total > 0x7FFFFFFF:
            return None
        b = o.buf
        b[0] = <char>(total >> 24); b[1] = <char>(total >> 16); b[2] = <char>(total >> 8); b[3] = <char>total
        b[4] = 0; b[5] = <char>(header_length >> 16); b[6] = <char>(header_length >> 8); b[7] = <char>header_length
        return PyBytes_FromStringAndSize(o.buf, o.n)
    finally:
        free(o.buf)


# --- typed header fields -------------------------------------------------------------------------
cdef extern from "Python.h":
    PyObject* PyDict_GetItemWithError(object d, object key) except? NULL
    object PyTuple_New(Py_ssize_t n)
    void PyTuple_SET_ITEM(object t, Py_ssize_t i, object o)
    object PyLong_FromLongLong(long long v)


def header_ints(dict ext, tuple keys, tuple defaults):
    """The integer ext fields `keys` of a request as a tuple: a missing or empty field gives its
    entry in `defaults`, an int stays as it is, a str of optional '-' and 1..18 ASCII digits is
    parsed.  None when any value is something else (" 7", "+7", "7_0", "x", 1e3, a huge number):
    the caller's Python path then parses it as int() would, or names the bad field."""
    cdef Py_ssize_t i, slen, n = len(keys)
    cdef PyObject* v
    cdef const char* s
    cdef int64_t iv
    if len(defaults) != n:
        raise ValueError(f"header_ints: {n} keys but {len(defaults)} defaults")
    out = PyTuple_New(n)
    for i in range(n):
        v = PyDict_GetItemWithError(ext, keys[i])
        if v == NULL:
            val = defaults[i]
        elif PyUnicode_CheckExact(<object>v):
            if PyUnicode_GET_LENGTH(<object>v) == 0:
                val = defaults[i]
            else:
                s = PyUnicode_AsUTF8AndSize(<object>v, &slen)
                if not header_int(<const uint8_t*>s, slen, &iv):
                    return None
                val = PyLong_FromLongLong(iv)
        elif PyLong_CheckExact(<object>v):
            val = <object>v
        else:
            return None
        Py_INCREF(val)  # PyTuple_SET_ITEM steals a reference
        PyTuple_SET_ITEM(out, i, val)
    return out


# --- responses -----------------------------------------------------------------------------------
def new_response(request, code, remark, dict ext_fields, body):
    """RemotingCommand.make_response without the Python __init__: the response to `request` (its
    opaque and serialize type, flag RESPONSE, language JAVA, our version) with `ext_fields` kept as
    given (the caller hands over a fresh dict of str)."""
    if not PyLong_CheckExact(code):
        code = int(code)
    cmd = PyType_GenericAlloc(<type>_command_cls, 0)
    cmd.code = code
    cmd.language = "JAVA"
    cmd.version = _current_version
    cmd.opaque = request.opaque
    cmd.flag = 1  # RESPONSE_FLAG
    cmd.remark = remark
    cmd.ext_fields = ext_fields
    cmd.body = body
    cmd.serialize_type = request.serialize_type
    return cmd
