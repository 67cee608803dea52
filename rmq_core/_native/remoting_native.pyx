# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Native remoting hot path: frame splitting and the JSON header codec of RemotingCommand.

Frame (shared/protocol/REMOTING.md §1, integers big-endian):

    int32 length            = 4 + headerLength + bodyLength (the prefix itself excluded)
    int32 hdrLenAndType     = serializeType << 24 | headerLength
    header                  JSON (type 0) or ROCKETMQ binary (type 1)
    body                    opaque bytes

The JSON header this module reads and writes is the flat object every RocketMQ 4.x peer sends:

    {"code":N,"extFields":{"k":"v",...},"flag":N,"language":"JAVA","opaque":N,
     "remark":"...","serializeTypeCurrentRPC":"JSON","version":N}

Anything else (a number or boolean inside extFields, a numeric string for code, floats, unknown
nested values, a lone surrogate, invalid UTF-8, trailing garbage...) makes the native routine
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
    cdef list items = []
    view = None
    # A raw buffer, not a typed memoryview: acquiring one of those costs more than the split.
    PyObject_GetBuffer(data, &pb, PyBUF_SIMPLE)
    try:
        buf = <const uint8_t*>pb.buf
        n = pb.len
        while n - pos >= 4:
            length = <int>((<uint32_t>buf[pos] << 24) | (<uint32_t>buf[pos + 1] << 16)
                           | (<uint32_t>buf[pos + 2] << 8) | <uint32_t>buf[pos + 3])
            if length < 4 or length > max_frame_length:
                bad = True
                break
            end = pos + 4 + length
            if end > n:
                break
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
from json_read cimport (Cursor, expect as _expect, hex_digit as _hex, key_is as _key_is, open_json_header,
                        read_int as _read_int, scan_str, skip_ws as _skip_ws)


cdef int _read_u4(Cursor* c) noexcept nogil:
    cdef int v = 0, d, i
    if c.end - c.p < 4:
        c.bad = True
        return -1
    for i in range(4):
        d = _hex(c.p[i])
        if d < 0:
            c.bad = True
            return -1
        v = (v << 4) | d
    c.p += 4
    return v


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


cdef object _read_str(Cursor* c):
    """A JSON string as str (cursor on the opening quote, after whitespace); None and c.bad on trouble."""
    cdef const uint8_t* start
    cdef const uint8_t* q
    cdef uint8_t ch
    cdef char* tmp
    cdef char stack_buf[_STACK_UNESCAPE]
    cdef Py_ssize_t n = 0
    cdef int cp, lo
    _skip_ws(c)
    if c.p >= c.end or c.p[0] != 34:
        c.bad = True
        return None
    c.p += 1
    start = c.p
    q = c.p
    while q < c.end:  # the common case: no escapes, one decode straight from the frame
        ch = q[0]
        if ch == 34:
            c.p = q + 1
            try:
                return _short_str(start, q - start)
            except UnicodeDecodeError:
                c.bad = True
                return None
        if ch == 92 or ch < 32:
            break
        q += 1
    if q >= c.end or q[0] < 32:  # unterminated, or a raw control character (invalid JSON)
        c.bad = True
        return None
    # Escapes: unescape into a UTF-8 buffer (never longer than the escaped text); a header's
    # escaped value (a properties string full of \u0001 / \u0002) usually fits the stack buffer.
    if c.end - start + 1 <= _STACK_UNESCAPE:
        tmp = stack_buf
    else:
        tmp = <char*>malloc(c.end - start + 1)
        if tmp == NULL:
            raise MemoryError()
    try:
        # the plain run before the first escape is copied at once
        n = q - start
        memcpy(tmp, start, n)
        c.p = q
        while True:
            if c.p >= c.end:
                c.bad = True
                return None
            ch = c.p[0]
            if ch == 34:
                c.p += 1
                try:
                    return PyUnicode_DecodeUTF8(tmp, n, NULL)
                except UnicodeDecodeError:
                    c.bad = True
                    return None
            if ch < 32:
                c.bad = True
                return None
            if ch != 92:
                tmp[n] = <char>ch
                n += 1
                c.p += 1
                continue
            c.p += 1
            if c.p >= c.end:
                c.bad = True
                return None
            ch = c.p[0]
            c.p += 1
            if ch == 34 or ch == 92 or ch == 47:
                tmp[n] = <char>ch
                n += 1
            elif ch == 98:
                tmp[n] = 8; n += 1
            elif ch == 102:
                tmp[n] = 12; n += 1
            elif ch == 110:
                tmp[n] = 10; n += 1
            elif ch == 114:
                tmp[n] = 13; n += 1
            elif ch == 116:
                tmp[n] = 9; n += 1
            elif ch == 117:
                cp = _read_u4(c)
                if cp < 0:
                    return None
                if 0xD800 <= cp <= 0xDBFF:  # a surrogate pair must follow
                    if c.end - c.p < 6 or c.p[0] != 92 or c.p[1] != 117:
                        c.bad = True  # a lone surrogate: Python keeps it, UTF-8 cannot
                        return None
                    c.p += 2
                    lo = _read_u4(c)
                    if lo < 0xDC00 or lo > 0xDFFF:
                        c.bad = True
                        return None
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00)
                elif 0xDC00 <= cp <= 0xDFFF:
                    c.bad = True
                    return None
                # \uXXXX (6 escaped bytes) -> at most 3 UTF-8 bytes; a pair (12) -> 4
                if cp < 0x80:
                    tmp[n] = <char>cp; n += 1
                elif cp < 0x800:
                    tmp[n] = <char>(0xC0 | (cp >> 6)); tmp[n + 1] = <char>(0x80 | (cp & 0x3F)); n += 2
                elif cp < 0x10000:
                    tmp[n] = <char>(0xE0 | (cp >> 12)); tmp[n + 1] = <char>(0x80 | ((cp >> 6) & 0x3F))
                    tmp[n + 2] = <char>(0x80 | (cp & 0x3F)); n += 3
                else:
                    tmp[n] = <char>(0xF0 | (cp >> 18)); tmp[n + 1] = <char>(0x80 | ((cp >> 12) & 0x3F))
                    tmp[n + 2] = <char>(0x80 | ((cp >> 6) & 0x3F)); tmp[n + 3] = <char>(0x80 | (cp & 0x3F))
                    n += 4
            else:
                c.bad = True
                return None
    finally:
        if tmp != stack_buf:
            free(tmp)


cdef bint _read_key(Cursor* c, const uint8_t** key, Py_ssize_t* klen) noexcept nogil:
    """A top-level key without escapes (the fixed header names): pointer + length."""
    cdef bint escaped
    if not scan_str(c, key, klen, &escaped):
        return False
    if escaped:
        c.bad = True
        return False
    return True


cdef bint _skip_literal(Cursor* c, const char* word, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    if c.end - c.p < n:
        c.bad = True
        return False
    for i in range(n):
        if c.p[i] != <uint8_t>word[i]:
            c.bad = True
            return False
    c.p += n
    return True


cdef dict _read_ext(Cursor* c):
    """The extFields object with string values only (anything else: c.bad)."""
    cdef dict ext = {}
    _skip_ws(c)
    if c.p >= c.end or c.p[0] != 123:
        c.bad = True
        return None
    c.p += 1
    _skip_ws(c)
    if c.p < c.end and c.p[0] == 125:
        c.p += 1
        return ext
    while True:
        k = _read_str(c)
        if c.bad:
            return None
        if not _expect(c, 58):
            return None
        v = _read_str(c)
        if c.bad:
            return None
        PyDict_SetItem(ext, k, v)
        _skip_ws(c)
        if c.p < c.end and c.p[0] == 44:
            c.p += 1
            continue
        if c.p < c.end and c.p[0] == 125:
            c.p += 1
            return ext
        c.bad = True
        return None


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
    cdef Py_ssize_t header_length
    cdef Cursor c
    cdef const uint8_t* key
    cdef Py_ssize_t klen
    cdef int64_t code = 0, opaque = 0, flag = 0, version = 0
    cdef bint has_code = False
    if not open_json_header(&c, base, n):
        return None
    header_length = c.end - base - 4
    language = None
    remark = None
    ext = None
    if not _expect(&c, 123):
        return None
    _skip_ws(&c)
    if c.p < c.end and c.p[0] == 125:  # "{}": no code; the Python codec names the problem
        return None
    while True:
        if not _read_key(&c, &key, &klen):
            return None
        if not _expect(&c, 58):
            return None
        _skip_ws(&c)
        if c.p >= c.end:
            return None
        if _key_is(key, klen, "code", 4):
            code = _read_int(&c)
            has_code = True
        elif _key_is(key, klen, "opaque", 6):
            opaque = _read_int(&c)
        elif _key_is(key, klen, "flag", 4):
            flag = _read_int(&c)
        elif _key_is(key, klen, "version", 7):
            version = _read_int(&c)
        elif _key_is(key, klen, "language", 8):
            language = _read_str(&c)
        elif _key_is(key, klen, "remark", 6):
            if c.p[0] == 110:  # null
                _skip_literal(&c, "null", 4)
                remark = None
            else:
                remark = _read_str(&c)
        elif _key_is(key, klen, "extFields", 9):
            if c.p[0] == 110:
                _skip_literal(&c, "null", 4)
                ext = None
            else:
                ext = _read_ext(&c)
        elif c.p[0] == 34:  # serializeTypeCurrentRPC and any other string field: not kept
            _read_str(&c)
        elif c.p[0] == 110:
            _skip_literal(&c, "null", 4)
        elif c.p[0] == 116:
            _skip_literal(&c, "true", 4)
        elif c.p[0] == 102:
            _skip_literal(&c, "false", 5)
        else:
            _read_int(&c)
        if c.bad:
            return None
        _skip_ws(&c)
        if c.p < c.end and c.p[0] == 44:
            c.p += 1
            continue
        if c.p < c.end and c.p[0] == 125:
            c.p += 1
            break
        return None
    _skip_ws(&c)
    if c.p != c.end or not has_code:
        return None
    # The slots start empty and are all set below, as RemotingCommand.__init__ would (minus the call).
    cmd = PyType_GenericAlloc(<type>_command_cls, 0)
    cmd.code = code
    cmd.language = language if language is not None else "JAVA"
    cmd.version = version
    cmd.opaque = opaque
    cmd.flag = flag
    cmd.remark = remark
    cmd.ext_fields = ext if ext is not None else {}
    if n > 4 + header_length:
        cmd.body = PyBytes_FromStringAndSize(<const char*>(base + 4 + header_length), n - 4 - header_length)
    else:
        cmd.body = None
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
    cdef Py_ssize_t i, j, slen, n = len(keys)
    cdef PyObject* v
    cdef const char* s
    cdef long long acc
    cdef bint neg
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
                j = 0
                neg = s[0] == 45  # '-'
                if neg:
                    j = 1
                if slen - j < 1 or slen - j > 18:
                    return None
                acc = 0
                while j < slen:
                    if s[j] < 48 or s[j] > 57:
                        return None
                    acc = acc * 10 + (s[j] - 48)
                    j += 1
                val = PyLong_FromLongLong(-acc if neg else acc)
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
