# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Remoting frames: splitting a read into frames, the JSON header codec of RemotingCommand, and the
producer's send request header writer (SendHeader) and send response reader (read_send_responses).

Frame (docs/protocol.md §1, integers big-endian):

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

Like every native module it imports no Python module of rmq: a decoded header is handed out as
plain values (HEADER_FIELDS, a tuple) that rmq_core.remoting.command makes a RemotingCommand of,
and a bad frame length raises ValueError, which the remoting layer reports as RemotingCommandError.
"""
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.dict cimport PyDict_Next, PyDict_SetItem
from cpython.list cimport PyList_Append
from cpython.object cimport PyObject
from cpython.unicode cimport PyUnicode_DecodeUTF8
cimport cython
from libc.stdint cimport int64_t, uint32_t, uint8_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcmp, memcpy
from cpython.ref cimport Py_INCREF, Py_XDECREF

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object unicode, Py_ssize_t* size) except NULL
    bint PyUnicode_CheckExact(object o)
    bint PyLong_CheckExact(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)
    void* PyUnicode_DATA(object o)

# what decode_frame gives, in this order (a JSON header: its serialize type is JSON)
HEADER_FIELDS = ("code", "language", "version", "opaque", "flag", "remark", "ext_fields", "body")


# --- frame splitting -----------------------------------------------------------------------------
def split_frames(data, Py_ssize_t max_frame_length):
    """(frames, consumed): every whole frame in `data` as a memoryview without its length prefix."""
    return _walk_frames(data, max_frame_length, _SPLIT)


def decode_frames(data, Py_ssize_t max_frame_length):
    """split_frames and decode_frame in one pass: (items, consumed), each whole frame of `data` as
    its header's values (a tuple, see decode_frame) or — when the native decoder declines it — as a
    memoryview of the frame (without its length prefix) for the Python codec to decode or reject.
    A length outside 4..max_frame_length raises ValueError naming it, as split_frames does."""
    return _walk_frames(data, max_frame_length, _DECODE_COMMAND)


cdef enum:
    _SPLIT = 0  # each frame a memoryview
    _DECODE_COMMAND = 1  # its header's values, else a memoryview
    _READ_SEND_RESPONSE = 2  # its SendResponse, else a copy of the frame (the caller may reuse `data`)


cdef tuple _walk_frames(data, Py_ssize_t max_frame_length, int mode):
    """The one walk over length-prefixed frames (frame_at checks each length): (items, consumed)."""
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
            if mode == _DECODE_COMMAND:
                item = _decode_frame(buf + pos + 4, length)
            elif mode == _READ_SEND_RESPONSE:
                item = _read_response(buf + pos + 4, length)
                if item is None:
                    item = PyBytes_FromStringAndSize(<const char*>(buf + pos + 4), length)
            else:
                item = None
            if item is None:
                if view is None:
                    view = memoryview(data)
                item = view[pos + 4:end]
            PyList_Append(items, item)
            pos = end
    finally:
        PyBuffer_Release(&pb)
    if bad:
        raise ValueError(f"frame length {length} outside 4..{max_frame_length}")
    return items, pos


# --- JSON header decoding ------------------------------------------------------------------------


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


ctypedef object (*_FrameReader)(const uint8_t* base, Py_ssize_t n)


cdef object _read_buffer(object data, _FrameReader read):
    """read(the bytes of `data`'s buffer, their count), the buffer held for the call only."""
    cdef Py_buffer pb
    PyObject_GetBuffer(data, &pb, PyBUF_SIMPLE)
    try:
        return read(<const uint8_t*>pb.buf, pb.len)
    finally:
        PyBuffer_Release(&pb)


def decode_frame(frame):
    """The values of a JSON-header frame (WITHOUT its length prefix) - (code, language, version,
    opaque, flag, remark, ext_fields, body), HEADER_FIELDS - or None when the Python codec must
    decide (binary header, an unusual or malformed header, a short frame)."""
    return _read_buffer(frame, _decode_frame)


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
    return (h.code, language, h.version, h.opaque, h.flag, remark, ext,
            PyBytes_FromStringAndSize(<const char*>h.body, h.body_len) if h.body_len else None)


# --- JSON header encoding ------------------------------------------------------------------------
from json_text cimport Out, out_free, out_put as _put, out_put_int, out_reserve as _grow, out_start, rmq_json_escaped


cdef int _put_int(Out* o, object value) except -1:
    cdef long long v = value  # OverflowError for an absurd value: the caller falls back
    return out_put_int(o, v)


cdef int _put_escaped(Out* o, const char* p, Py_ssize_t n) except -1:
    """UTF-8 bytes as the inside of a JSON string literal, escaped as
    json.encoder.encode_basestring does (json_text.h): the one JSON string writer."""
    if o.n + n * 6 > o.cap:
        _grow(o, n * 6)
    o.n = rmq_json_escaped(o.buf + o.n, p, n) - o.buf
    return 0


cdef int _put_str(Out* o, object s) except -1:
    """A str as a JSON string literal (with its quotes)."""
    cdef Py_ssize_t n
    cdef const char* p = PyUnicode_AsUTF8AndSize(s, &n)  # UnicodeEncodeError on a lone surrogate
    _put(o, '"', 1)
    _put_escaped(o, p, n)
    _put(o, '"', 1)
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


# --- a producer's send request (SEND_MESSAGE_V2, SEND_BATCH_MESSAGE, SEND_MESSAGE) ------------------
# The whole request frame built from its fields, no RemotingCommand (docs/protocol.md §1 and §4.3):
#
#     int32 length            = 4 + headerLength + bodyLength
#     int32 hdrLenAndType     = 0 << 24 | headerLength          (JSON header)
#     header                  {"code":310,"extFields":{"a":group,"b":topic,"c":createTopicKey,
#                              "d":defaultQueueNums,"e":queueId,"f":sysFlag,"g":bornTimestamp,
#                              "h":flag,"i":properties,"j":reconsumeTimes,"k":"false","m":batch,
#                              "n":brokerName[,"l":maxReconsumeTimes]},"flag":0,"language":"PYTHON",
#                              "opaque":N,"serializeTypeCurrentRPC":"JSON","version":N}
#     body                    the message body (or a batch body, record_batch.pyx: encode_send_batch)
#
# These are exactly the bytes RemotingCommand.create_request(code, header, body) encodes to with
# language PYTHON (V1 - SEND_MESSAGE - the same with the long field names): ext fields in that
# insertion order, every value a JSON string escaped as _encode_into escapes it.  A SendHeader
# holds what is constant for one (producer, queue); build_frame writes the rest.
from clock cimport epoch_ms
from record_layout cimport MAX_PROPS


def now_ms():
    """Milliseconds since the epoch, as build_frame stamps bornTimestamp (int(time.time() * 1000))."""
    return epoch_ms()


cdef bytes _json_literal(object s):
    """A str as a JSON string literal (with its quotes), UTF-8."""
    cdef char stack[256]
    cdef Out o
    out_start(&o, stack, 256)
    try:
        _put_str(&o, s)
        return PyBytes_FromStringAndSize(o.buf, o.n)
    finally:
        out_free(&o)


cdef tuple _V2_NAMES = (b"a", b"b", b"c", b"d", b"e", b"f", b"g", b"h", b"i", b"j", b"k", b"l", b"m", b"n")
cdef tuple _V1_NAMES = (b"producerGroup", b"topic", b"defaultTopic", b"defaultTopicQueueNums", b"queueId",
                        b"sysFlag", b"bornTimestamp", b"flag", b"properties", b"reconsumeTimes", b"unitMode",
                        b"maxReconsumeTimes", b"batch", b"brokerName")


# --- the request -------------------------------------------------------------------------------------
cdef class SendHeader:
    """The one writer of a producer's send request header (SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE
    with the one-letter names a..n, SEND_MESSAGE with the long ones): what is constant for one
    (producer, queue) made once; build_frame fills in the rest per send (a retry topic's
    reconsume fields included, a oneway request's flag)."""

    def __init__(self, str group, str topic, int queue_id, str broker_name, str create_topic_key="TBW102",
                 int default_topic_queue_nums=4, int code=310, bint batch=False, str language="PYTHON",
                 int version=0, bint v2=True):
        self.code = code
        self.topic = topic
        self.queue_id = queue_id
        self.broker_name = broker_name
        self.language = language
        self.version = version
        self._group, self._create_topic_key = group, create_topic_key
        self._default_topic_queue_nums, self._batch = default_topic_queue_nums, batch
        self._signer = None
        names = _V2_NAMES if v2 else _V1_NAMES
        self._names = names
        self._name_strs = tuple(n.decode() for n in names)
        self._ids = {n: i for i, n in enumerate(self._name_strs)}
        self._raw = [group.encode(), topic.encode(), create_topic_key.encode(), str(default_topic_queue_nums).encode(),
                     str(queue_id).encode(), None, None, None, None, None, b"false", None,
                     b"true" if batch else b"false", broker_name.encode(), None, None]
        self._sign_key = None
        self._head = b"".join([
            b'{"code":', str(code).encode(), b',"extFields":{"', names[0], b'":', _json_literal(group),
            b',"', names[1], b'":', _json_literal(topic), b',"', names[2], b'":', _json_literal(create_topic_key),
            b',"', names[3], b'":', _json_literal(str(default_topic_queue_nums)),
            b',"', names[4], b'":"', str(queue_id).encode(), b'","', names[5], b'":"'])
        self._kg = b'","' + names[6] + b'":"'
        self._kh = b'","' + names[7] + b'":"'
        self._ki = b'","' + names[8] + b'":"'
        self._kj = b'","' + names[9] + b'":"'
        self._kl = b',"' + names[11] + b'":"'
        self._mid = b"".join([b'","', names[10], b'":"false","', names[12], b'":', b'"true"' if batch else b'"false"',
                              b',"', names[13], b'":', _json_literal(broker_name)])
        self._language = b"".join([b',"language":', _json_literal(language), b',"opaque":'])
        self._tail = b',"serializeTypeCurrentRPC":"JSON","version":' + str(version).encode() + b"}"

    def sign_with(self, str access_key, security_token, key, order):
        """Prepare to write the frames of the requests that ask for it (SendRequest.sign_with) signed
        for ACL (rmq_core.acl: AclSigner.prepare_header): AccessKey
        (and SecurityToken) among the ext fields and Signature = the keyed hash of `key` (a
        rmq_core.acl SigningKey: its native HMAC, called without a Python call) over (the signed field
        values joined in order(field names) - the order rmq_core.acl defines, taken once for each
        of this header's two shapes, with and without maxReconsumeTimes - then the body)."""
        cdef list names = [n.decode() for n in self._names] + ["AccessKey"]
        self._raw[14] = access_key.encode()
        acl = b',"AccessKey":' + _json_literal(access_key)
        if security_token is not None:
            names.append("SecurityToken")
            self._raw[15] = str(security_token).encode()
            acl += b',"SecurityToken":' + _json_literal(str(security_token))
        self._acl_json = acl + b',"Signature":"'
        ids = {name: i for i, name in enumerate(names)}
        ids["AccessKey"], ids["SecurityToken"] = 14, 15
        shapes = [n for n in names if n != names[11]]  # (maxReconsumeTimes: only on a retry topic's sends)
        self._order = bytes([ids[n] for n in order(tuple(shapes))])
        self._order_l = bytes([ids[n] for n in order(tuple(names))])
        self._sign_key = key.native

    cdef int prepare_signer(self, signer) except -1:
        """Prepared to sign for `signer` (rmq_core.acl.AclSigner: its prepare_header calls sign_with), once."""
        if self._signer is not signer:
            signer.prepare_header(self)
            self._signer = signer
        return 0

    def build_frame(self, sys_flag, flag, dict properties, opaque, body, born_timestamp=None,
                    reconsume_times=0, max_reconsume_times=None, bint oneway=False):
        """The whole request frame (length prefix included) as bytes, or None when the caller must
        judge it (a number beyond 64 bits, properties over 32767 bytes).  A property the
        properties format cannot hold (record.pyx: put_property) raises a ValueError
        (IllegalArgumentError) naming it; a value that is not a str travels as str() makes it.  born_timestamp None: now."""
        return self._frame(sys_flag, flag, properties, None, opaque, body, born_timestamp, reconsume_times,
                           max_reconsume_times, None, oneway)

    def request(self, sys_flag, flag, dict properties, opaque, body, reconsume_times=0, max_reconsume_times=None,
                bint oneway=False):
        """The request build_frame would write, as a SendRequest: its header values before encoding
        (for the client's request steps); the properties are written (and checked) here."""
        return self.new_request(sys_flag, flag, properties, None, None, opaque, body, reconsume_times,
                                max_reconsume_times, oneway)

    def message_request(self, message, str uniq, opaque):
        """request() of a plain message as build_message_frame takes it; None where that declines."""
        return self.new_request(0, message.flag, None, message, uniq, opaque, message.body, 0, None, False)

    cdef SendRequest new_request(self, sys_flag, flag, dict properties, message, str uniq, opaque, body,
                                 reconsume_times, max_reconsume_times, bint oneway):
        cdef char kstack[512]
        cdef Out keep
        cdef Py_ssize_t raw_n
        cdef SendRequest r
        keep.buf, keep.cap, keep.n, keep.heap = kstack, 512, 0, False
        try:  # the properties string as the frame will hold it (escaped when the frame is written)
            if message is None:
                raw_n = _put_properties(NULL, properties, &keep)
            else:
                raw_n = _put_message_properties(NULL, message, uniq, &keep)
            if raw_n < 0 or raw_n > MAX_PROPS:
                return None
            raw = PyBytes_FromStringAndSize(keep.buf, keep.n)
        finally:
            if keep.heap:
                free(keep.buf)
        r = SendRequest.__new__(SendRequest)
        r.header = self
        r.sys_flag, r.msg_flag, r.opaque, r.body = sys_flag, flag, opaque, body
        r.props = raw
        r.born = epoch_ms()
        r.reconsume, r.max_reconsume, r.oneway = reconsume_times, max_reconsume_times, oneway
        return r

    cdef str _value(self, int k, SendRequest r):
        """Field id k's value (a str) in request r."""
        if k == 0:
            return self._group
        if k == 1:
            return self.topic
        if k == 2:
            return self._create_topic_key
        if k == 3:
            return str(self._default_topic_queue_nums)
        if k == 4:
            return str(self.queue_id)
        if k == 5:
            return str(r.sys_flag)
        if k == 6:
            return str(r.born)
        if k == 7:
            return str(r.msg_flag)
        if k == 8:
            return (<bytes>r.props).decode("utf-8")
        if k == 9:
            return str(r.reconsume)
        if k == 10:
            return "false"
        if k == 11:
            return str(r.max_reconsume)
        if k == 12:
            return "true" if self._batch else "false"
        return self.broker_name

    def build_message_frame(self, message, str uniq, opaque):
        """build_frame for a plain message straight from its fields: the properties are those
        Producer._prepare makes (user properties, TAGS, KEYS, DELAY, WAIT, then UNIQ_KEY = uniq),
        sys flag 0 (no compression), born now.  None where the Python path must do it: a user
        property that is None or UNIQ_KEY, one the properties format cannot hold (the Python path
        raises naming it), or build_frame's cases."""
        return self._frame(0, message.flag, None, message, opaque, message.body, None, 0, None, uniq)

    cdef object _frame(self, sys_flag, flag, properties, message, opaque, body, born_timestamp,
                       reconsume_times, max_reconsume_times, str uniq=None, bint oneway=False, bint sign=False,
                       dict extra=None):
        """build_frame / build_message_frame (the pipeline kernel calls it without a Python call);
        SendRequest.frame: `properties` a bytes of the properties string already written, `extra`
        the fields its steps added (after the builder's), `sign` signed (sign_with)."""
        cdef Py_buffer pb
        cdef char stack[2048]
        cdef Out o
        cdef Py_ssize_t header_length, total, raw_props = 0
        cdef int64_t born, c_sys_flag, c_flag, c_opaque, c_reconsume, c_max_reconsume = 0
        cdef char* out
        try:  # a value beyond 64 bits: the Python encoder writes it (and the broker judges it)
            born = epoch_ms() if born_timestamp is None else born_timestamp
            c_sys_flag, c_flag, c_opaque, c_reconsume = sys_flag, flag, opaque, reconsume_times
            if max_reconsume_times is not None:
                c_max_reconsume = max_reconsume_times
        except OverflowError:
            return None
        cdef char vstack[512]
        cdef Out v  # a signed frame's per-send values, raw: f g h i j l at start[id] .. start[id + 1]
        cdef Out* keep = NULL
        cdef Py_ssize_t start[16]
        cdef bint signing = sign and self._sign_key is not None
        cdef PyObject* ek
        cdef PyObject* ev
        cdef Py_ssize_t epos = 0
        out_start(&o, stack, 2048)
        o.n = 8  # room for the two int32 fields in front
        out_start(&v, vstack, 512)
        try:
            _put(&o, PyBytes_AS_STRING(self._head), len(self._head))
            out_put_int(&o, c_sys_flag)
            _put(&o, PyBytes_AS_STRING(self._kg), len(self._kg))
            out_put_int(&o, born)
            _put(&o, PyBytes_AS_STRING(self._kh), len(self._kh))
            out_put_int(&o, c_flag)
            _put(&o, PyBytes_AS_STRING(self._ki), len(self._ki))
            if signing:
                keep = &v
                start[5] = 0
                out_put_int(&v, c_sys_flag)
                start[6] = v.n
                out_put_int(&v, born)
                start[7] = v.n
                out_put_int(&v, c_flag)
                start[8] = v.n
            if type(properties) is bytes:
                raw_props = len(<bytes>properties)
                _put_escaped(&o, PyBytes_AS_STRING(<bytes>properties), raw_props)
                if keep != NULL:
                    _put(keep, PyBytes_AS_STRING(<bytes>properties), raw_props)
            elif message is None:
                raw_props = _put_properties(&o, <dict?>properties, keep)
            else:
                raw_props = _put_message_properties(&o, message, uniq, keep)
            if raw_props < 0 or raw_props > MAX_PROPS:
                return None
            _put(&o, PyBytes_AS_STRING(self._kj), len(self._kj))
            out_put_int(&o, c_reconsume)
            _put(&o, PyBytes_AS_STRING(self._mid), len(self._mid))
            if max_reconsume_times is not None:
                _put(&o, PyBytes_AS_STRING(self._kl), len(self._kl))
                out_put_int(&o, c_max_reconsume)
                _put(&o, '"', 1)
            if extra:  # (str keys and values: SendRequest's fields take no other)
                while PyDict_Next(extra, &epos, &ek, &ev):
                    _put(&o, ",", 1)
                    _put_str(&o, <object>ek)
                    _put(&o, ":", 1)
                    _put_str(&o, <object>ev)
            if signing:
                start[9] = v.n
                out_put_int(&v, c_reconsume)
                start[10] = v.n
                start[11] = v.n
                out_put_int(&v, c_max_reconsume)
                start[12] = v.n
                self._put_signature(&o, &v, start, max_reconsume_times is not None, body)
            if oneway:  # (flag bit 1: no answer expected)
                _put(&o, '},"flag":2', 10)
            else:
                _put(&o, '},"flag":0', 10)
            _put(&o, PyBytes_AS_STRING(self._language), len(self._language))
            out_put_int(&o, c_opaque)
            _put(&o, PyBytes_AS_STRING(self._tail), len(self._tail))
            header_length = o.n - 8
            PyObject_GetBuffer(body, &pb, PyBUF_SIMPLE)
            try:
                total = 4 + header_length + pb.len
                if total > 0x7FFFFFFF:
                    return None
                frame = PyBytes_FromStringAndSize(NULL, 4 + total)
                out = PyBytes_AS_STRING(frame)
                o.buf[0] = <char>(total >> 24); o.buf[1] = <char>(total >> 16)
                o.buf[2] = <char>(total >> 8); o.buf[3] = <char>total
                o.buf[4] = 0; o.buf[5] = <char>(header_length >> 16)
                o.buf[6] = <char>(header_length >> 8); o.buf[7] = <char>header_length
                memcpy(out, o.buf, o.n)
                if pb.len:
                    memcpy(out + o.n, pb.buf, pb.len)
            finally:
                PyBuffer_Release(&pb)
            return frame
        finally:
            out_free(&o)
            out_free(&v)

    cdef int _put_signature(self, Out* o, Out* v, Py_ssize_t* start, bint with_l, body) except -1:
        """AccessKey[, SecurityToken] and the Signature of this frame's ext fields and body at the
        end of `o`: the content assembled in the signed order from the constant values and the
        per-send ones in `v` (field id k in v.buf[start[k]:start[k + 1]]), one keyed hash."""
        cdef char cstack[1024]
        cdef Out c
        cdef bytes order = self._order_l if with_l else self._order
        cdef const unsigned char* ids = <const unsigned char*>PyBytes_AS_STRING(order)
        cdef Py_ssize_t i, k
        cdef list raw = self._raw
        out_start(&c, cstack, 1024)
        try:
            for i in range(len(order)):
                k = ids[i]
                value = raw[k]
                if value is None:
                    _put(&c, v.buf + start[k], start[k + 1] - start[k])
                else:
                    _put(&c, PyBytes_AS_STRING(<bytes>value), len(<bytes>value))
            signature = self._sign_key.sign(<const unsigned char*>c.buf, c.n, body)
        finally:
            out_free(&c)
        _put(o, PyBytes_AS_STRING(self._acl_json), len(self._acl_json))
        _put(o, PyBytes_AS_STRING(<bytes?>signature), len(<bytes>signature))
        _put(o, '"', 1)
        return 0


from rmq_core._native.record cimport put_property


cdef int _put_raw_escaped(Out* o, Out* raw, Out* keep) except -1:
    """The properties string in `raw` JSON-escaped at the end of `o` (none: not written) and as it
    is at the end of `keep`, when given (a signed frame's content, a SendRequest's); `raw` freed."""
    try:
        if o != NULL:
            _put_escaped(o, raw.buf, raw.n)
        if keep != NULL:
            _put(keep, raw.buf, raw.n)
    finally:
        out_free(raw)
    return 0


cdef Py_ssize_t _put_properties(Out* o, dict properties, Out* keep) except -1:
    """properties_to_bytes(properties) - written by record.pyx's put_property, the one writer of
    the properties format (its checks, its errors) - JSON-escaped; the raw size."""
    cdef char stack[512]
    cdef Out raw
    cdef Py_ssize_t pos = 0
    cdef PyObject* k
    cdef PyObject* v
    out_start(&raw, stack, 512)
    try:
        while PyDict_Next(properties, &pos, &k, &v):
            if v != <PyObject*>None:  # (properties_to_bytes skips None values)
                put_property(&raw, <object>k, <object>v)
    except BaseException:
        out_free(&raw)
        raise
    _put_raw_escaped(o, &raw, keep)
    return raw.n


cdef Py_ssize_t _put_message_properties(Out* o, message, str uniq, Out* keep) except -2:
    """Message.wire_properties() plus UNIQ_KEY as _put_properties writes them; the raw size, or -1
    where the Python path does otherwise (the caller declines): a user property None
    (wire_properties makes "None" of it) or UNIQ_KEY (it keeps its place), or a property
    put_property refuses (the Python path raises naming it)."""
    cdef char stack[512]
    cdef Out raw
    cdef dict user = message.properties
    cdef PyObject* k
    cdef PyObject* v
    cdef Py_ssize_t pos = 0
    out_start(&raw, stack, 512)
    try:
        if user:
            while PyDict_Next(user, &pos, &k, &v):
                if v == <PyObject*>None or (PyUnicode_CheckExact(<object>k) and <object>k == "UNIQ_KEY"):
                    out_free(&raw)
                    return -1
                put_property(&raw, <object>k, <object>v)
        tags = message.tags
        if tags:
            put_property(&raw, "TAGS", tags)
        keys = message.keys
        if keys:
            put_property(&raw, "KEYS", keys)
        delay = message.delay_time_level
        if delay > 0:
            put_property(&raw, "DELAY", str(delay))
        put_property(&raw, "WAIT", "true" if message.wait_store_msg_ok else "false")
        put_property(&raw, "UNIQ_KEY", uniq)
    except ValueError:  # (IllegalArgumentError is one: the Python path raises it, naming the property)
        out_free(&raw)
        return -1
    except BaseException:
        out_free(&raw)
        raise
    _put_raw_escaped(o, &raw, keep)
    return raw.n


# --- a send request before it is written (the client's request steps) ------------------------------
cdef extern from "Python.h":
    Py_ssize_t PyDict_Size(object d)


cdef class SendRequestFields


@cython.final
@cython.freelist(16)
cdef class SendRequest:
    """A producer's send request as its SendHeader has it, before it is written: what the client's
    request steps are handed (rmq_core.remoting.steps.FrameStep.before_request) in place of a
    command decoded from the frame.  code, flag, opaque, language, version, remark and body are its
    own; `ext_fields` is a mapping over the header's values, each made a str only when read.  A
    field a step adds is written after the builder's (no decode, no second encode); a step that
    changes one of the builder's makes `fields()` the request's (the Python codec writes it then:
    frame() gives None).  A signing step asks for the frame signed (sign_with) instead of adding
    AccessKey and Signature itself: SendHeader signs as it writes."""

    @property
    def code(self):
        return self.header.code

    @property
    def flag(self):
        return 2 if self.oneway else 0  # (a request; bit 1: oneway)

    @property
    def language(self):
        return self.header.language

    @property
    def version(self):
        return self.header.version

    @property
    def remark(self):
        return None

    @property
    def ext_fields(self):
        if self._fields is not None:
            return self._fields
        if self._ext is None:
            self._ext = SendRequestFields.__new__(SendRequestFields)
            (<SendRequestFields>self._ext).r = self
        return self._ext

    def is_response(self):
        return False

    def is_oneway(self):
        return self.oneway

    def get_str(self, name, default=None):
        value = self.ext_fields.get(name)
        return default if value is None else value

    def sign_with(self, signer):
        """Have the frame signed for `signer` (rmq_core.acl.AclSigner: its prepare_header prepares
        the header once) when it is written, over the fields as the steps leave them."""
        self.signer = signer

    cdef tuple _ids(self):
        """The builder's field ids in the order the frame writes them (l only on a retry's send)."""
        return _ORDER_L if self.max_reconsume is not None else _ORDER

    def fields(self):
        """Every ext field as a dict (a copy; the ones the steps added last)."""
        if self._fields is not None:
            return dict(self._fields)
        cdef SendHeader h = self.header
        out = {}
        for k in self._ids():
            out[h._name_strs[k]] = h._value(k, self)
        if self._added:
            out.update(self._added)
        return out

    cdef int _materialize(self) except -1:
        """A step changes one of the builder's fields: from now on the fields are a plain dict."""
        if self._fields is None:
            self._fields = self.fields()
            self._ext = None
        return 0

    def frame(self):
        """The whole request frame (length prefix included) as the steps left it, or None when the
        Python codec must write it (a builder field changed; fields added to a signed frame; a
        value build_frame leaves to Python)."""
        cdef SendHeader h = self.header
        signer = self.signer
        if self._fields is not None:
            return None
        if signer is not None:
            if self._added:
                return None  # (the header's signed order knows its own fields only)
            h.prepare_signer(signer)
        return h._frame(self.sys_flag, self.msg_flag, self.props, None, self.opaque, self.body, self.born,
                        self.reconsume, self.max_reconsume, None, self.oneway, signer is not None, self._added)

    def __repr__(self):
        return f"SendRequest(code={self.code}, opaque={self.opaque}, topic={self.header.topic!r})"


cpdef object run_send_steps(list before, str addr, SendRequest request):
    """A send through a client's request steps (each `fn(addr, request)`, in order; one that raises
    raises here) and its frame as they left it: request.frame() - None when the Python codec must
    write it (rmq_core.remoting.steps.encode_send)."""
    for fn in before:
        fn(addr, request)
    request._ext = None  # (the view refers to the request: dropped, no cycle is left for the collector)
    return request.frame()


cdef tuple _ORDER = (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 13)
cdef tuple _ORDER_L = (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 13, 11)


@cython.final
@cython.freelist(16)
cdef class SendRequestFields:
    """SendRequest.ext_fields: a mutable mapping over its header's values (see SendRequest)."""
    cdef SendRequest r

    cdef int _id(self, key) except -2:
        """The builder field id of `key` in this request, or -1."""
        cdef PyObject* found = PyDict_GetItemWithError(self.r.header._ids, key)
        if found == NULL:
            return -1
        k = <int><object>found
        if k == 11 and self.r.max_reconsume is None:
            return -1
        return k

    def __len__(self):
        r = self.r
        return (14 if r.max_reconsume is not None else 13) + (PyDict_Size(r._added) if r._added else 0)

    def __bool__(self):
        return True

    def __contains__(self, key):
        return self._id(key) >= 0 or (self.r._added is not None and key in self.r._added)

    def __getitem__(self, key):
        cdef int k = self._id(key)
        if k >= 0:
            return self.r.header._value(k, self.r)
        if self.r._added is not None:
            return self.r._added[key]
        raise KeyError(key)

    def get(self, key, default=None):
        cdef int k = self._id(key)
        if k >= 0:
            return self.r.header._value(k, self.r)
        if self.r._added is not None:
            return self.r._added.get(key, default)
        return default

    def __iter__(self):
        return iter(self.r.fields())

    def keys(self):
        return self.r.fields().keys()

    def values(self):
        return self.r.fields().values()

    def items(self):
        return self.r.fields().items()

    def __setitem__(self, key, value):
        r = self.r
        if r._fields is not None or self._id(key) >= 0 or not PyUnicode_CheckExact(key) \
                or not PyUnicode_CheckExact(value):
            r._materialize()
            r._fields[key] = value
            return
        if r._added is None:
            r._added = {}
        r._added[key] = value

    def __delitem__(self, key):
        r = self.r
        if r._fields is None and self._id(key) < 0:
            if r._added is None:
                raise KeyError(key)
            del r._added[key]
            return
        r._materialize()
        del r._fields[key]

    def pop(self, key, *default):
        r = self.r
        if r._fields is None and self._id(key) < 0:
            if r._added is None or key not in r._added:
                if default:
                    return default[0]
                raise KeyError(key)
            return r._added.pop(key)
        r._materialize()
        return r._fields.pop(key, *default)

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, other=(), **kw):
        for key, value in dict(other, **kw).items():
            self[key] = value

    def copy(self):
        return self.r.fields()

    def __eq__(self, other):
        return self.r.fields() == other

    def __repr__(self):
        return repr(self.r.fields())


# --- the send response -------------------------------------------------------------------------------
# The JSON header of a SendMessageResponseHeader, read for code, flag, opaque, remark and the ext
# fields msgId, queueId, queueOffset, transactionId and MSG_REGION (the others are skipped without
# building anything).  Whatever is unusual (a binary header, a number or object inside extFields,
# an escaped value in a field we keep, a non-plain integer, a request from the peer, malformed
# JSON) makes the reader decline with None: the caller then decodes the frame with
# RemotingCommand.decode, whose errors name the problem, and reads it with
# SendResponse.from_command.
@cython.freelist(64)
cdef class SendResponse:
    """What a send response says: code, flag, opaque, remark, and the SendMessageResponseHeader
    fields (None where the header lacks them; queue_id / queue_offset None also when empty)."""

    def __init__(self, code, flag=1, opaque=0, remark=None, msg_id=None, queue_id=None, queue_offset=None,
                 transaction_id=None, region_id=None):
        self.code, self.flag, self.opaque, self.remark = code, flag, opaque, remark
        self.msg_id, self.queue_id, self.queue_offset = msg_id, queue_id, queue_offset
        self.transaction_id, self.region_id = transaction_id, region_id

    @staticmethod
    def from_command(cmd):
        """The same reading of a decoded RemotingCommand (the path for frames the native reader
        declines); a garbage queueId / queueOffset raises RemotingCommandError naming it."""
        return SendResponse(cmd.code, cmd.flag, cmd.opaque, cmd.remark, cmd.get_str("msgId"),
                            cmd.get_int("queueId"), cmd.get_int("queueOffset"), cmd.get_str("transactionId"),
                            cmd.get_str("MSG_REGION"))

    def __repr__(self):
        return (f"SendResponse(code={self.code}, opaque={self.opaque}, remark={self.remark!r}, "
                f"msg_id={self.msg_id!r}, queue_id={self.queue_id!r}, queue_offset={self.queue_offset!r})")


from json_read cimport key_is as _is


cdef object _plain_text(const uint8_t* s, Py_ssize_t n, bint escaped, bint* bad):
    """A kept string value: decoded when it has no escapes; None and *bad otherwise (the Python
    codec decodes the rest)."""
    if escaped:
        bad[0] = True
        return None
    try:
        return PyUnicode_DecodeUTF8(<const char*>s, n, NULL)
    except UnicodeDecodeError:
        bad[0] = True
        return None


cdef int _response_field(void* target, const uint8_t* key, Py_ssize_t key_len, bint key_escaped,
                         const uint8_t* value, Py_ssize_t value_len, bint value_escaped) except -1:
    """read_json_header's extFields entry of a send response: the fields SendResponse keeps (an
    int as RemotingCommand.get_int reads it, None when empty); 1 declines the frame."""
    cdef SendResponse r = <SendResponse>target
    cdef int64_t v
    cdef bint bad = False
    if key_escaped:
        return 1
    if _is(key, key_len, "msgId", 5):
        r.msg_id = _plain_text(value, value_len, value_escaped, &bad)
    elif _is(key, key_len, "queueId", 7) or _is(key, key_len, "queueOffset", 11):
        if value_len == 0:
            v_obj = None
        elif value_escaped or not header_int(value, value_len, &v):
            return 1  # " 7", "+7", a huge number: int() may still take it; the Python path decides
        else:
            v_obj = v
        if key_len == 7:
            r.queue_id = v_obj
        else:
            r.queue_offset = v_obj
    elif _is(key, key_len, "transactionId", 13):
        r.transaction_id = _plain_text(value, value_len, value_escaped, &bad)
    elif _is(key, key_len, "MSG_REGION", 10):
        r.region_id = _plain_text(value, value_len, value_escaped, &bad)
    return 1 if bad else 0  # (other entries, TRACE_ON..., are not kept)


cdef object _read_response(const uint8_t* base, Py_ssize_t n):
    """The SendResponse of one frame (without its length prefix) read by the one JSON header
    reader (frame.pxd: read_json_header), or None: declined, or not a response."""
    cdef JsonHeader h
    cdef SendResponse r = SendResponse.__new__(SendResponse)
    cdef bint bad = False
    if read_json_header(base, n, &h, _response_field, <void*>r) != 1:
        return None
    if not (h.flag & RESPONSE_FLAG):
        return None  # a request from the peer: not a send response
    if h.remark != NULL:
        r.remark = _plain_text(h.remark, h.remark_len, h.remark_escaped, &bad)
        if bad:
            return None
    r.code = h.code
    r.flag = h.flag
    r.opaque = h.opaque
    return r


def read_send_response(frame):
    """The SendResponse of one frame WITHOUT its length prefix, or None (see the module doc)."""
    return _read_buffer(frame, _read_response)


def read_send_responses(data, Py_ssize_t max_frame_length):
    """Every whole frame at the start of `data`: (items, consumed), each item the frame's
    SendResponse or, when declined, the frame's bytes without its length prefix.  A length
    outside 4..max_frame_length raises RemotingCommandError naming it (the framing is lost)."""
    return _walk_frames(data, max_frame_length, _READ_SEND_RESPONSE)
