# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Native produce path of the client: the whole SEND_MESSAGE_V2 request frame built from its
fields, and the send response read straight from its frame (no RemotingCommand either way).

Request frame (shared/protocol/REMOTING.md §1 and §5.4, integers big-endian):

    int32 length            = 4 + headerLength + bodyLength
    int32 hdrLenAndType     = 0 << 24 | headerLength          (JSON header)
    header                  {"code":310,"extFields":{"a":group,"b":topic,"c":createTopicKey,
                             "d":defaultQueueNums,"e":queueId,"f":sysFlag,"g":bornTimestamp,
                             "h":flag,"i":properties,"j":reconsumeTimes,"k":"false","m":batch,
                             "n":brokerName[,"l":maxReconsumeTimes]},"flag":0,"language":"PYTHON",
                             "opaque":N,"serializeTypeCurrentRPC":"JSON","version":N}
    body                    the message body (or a batch body)

These are exactly the bytes RemotingCommand.create_request(code, header, body) encodes to with
language PYTHON (V1 - SEND_MESSAGE - the same with the long field names): ext fields in that
insertion order, every value a JSON string escaped as json.encoder.encode_basestring does (UTF-8
kept).  A SendHeader holds what is constant
for one (producer, queue); build_frame writes the rest.

Response frame: the JSON header of a SendMessageResponseHeader, read for code, flag, opaque,
remark and the ext fields msgId, queueId, queueOffset, transactionId and MSG_REGION (the others are
skipped without building anything).  Whatever is unusual (a binary header, a number or object
inside extFields, an escaped value in a field we keep, a non-plain integer, a request from the
peer, malformed JSON) makes the reader decline with None: the caller then decodes the frame with
RemotingCommand.decode, whose errors name the problem, and reads it with
SendResponse.from_command.  Bytes from the network are untrusted: every read is bounds-checked.
"""
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.dict cimport PyDict_Next
from cpython.list cimport PyList_Append
from cpython.object cimport PyObject
from cpython.pythread cimport PyThread_get_thread_ident
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int64_t, uint32_t, uint8_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy

cimport cython

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object unicode, Py_ssize_t* size) except NULL
    bint PyUnicode_CheckExact(object o)
    bint PyLong_CheckExact(object o)

cdef extern from "<time.h>" nogil:
    ctypedef long time_t
    struct timespec:
        time_t tv_sec
        long tv_nsec
    int clock_gettime(int clk_id, timespec* tp)
    int CLOCK_REALTIME

DEF MAX_PROPERTIES_LENGTH = 32767  # what the broker accepts (int16 length in the stored record)


# --- an output buffer ------------------------------------------------------------------------------
from json_text cimport Out, out_put as _put, out_put_int as _put_int, out_reserve as _grow, rmq_json_escaped


cdef int _put_escaped(Out* o, const char* p, Py_ssize_t n) except -1:
    """UTF-8 bytes as the inside of a JSON string literal (json_text.h)."""
    if o.n + n * 6 > o.cap:
        _grow(o, n * 6)
    o.n = rmq_json_escaped(o.buf + o.n, p, n) - o.buf
    return 0


cdef bytes _json_str(object s):
    """A str as a JSON string literal (with its quotes), UTF-8."""
    cdef Py_ssize_t n
    cdef const char* p = PyUnicode_AsUTF8AndSize(s, &n)
    cdef char stack[256]
    cdef Out o
    o.buf = stack
    o.cap = 256
    o.n = 0
    o.heap = False
    try:
        _put(&o, '"', 1)
        _put_escaped(&o, p, n)
        _put(&o, '"', 1)
        return PyBytes_FromStringAndSize(o.buf, o.n)
    finally:
        if o.heap:
            free(o.buf)


cdef inline int64_t _now_ms() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return <int64_t>ts.tv_sec * 1000 + ts.tv_nsec // 1000000


def now_ms():
    """Milliseconds since the epoch, as build_frame stamps bornTimestamp (int(time.time() * 1000))."""
    return _now_ms()


# the header field names, V2 (SendMessageRequestHeaderV2) and V1, in the order they are written
cdef tuple _V2_NAMES = (b"a", b"b", b"c", b"d", b"e", b"f", b"g", b"h", b"i", b"j", b"k", b"l", b"m", b"n")
cdef tuple _V1_NAMES = (b"producerGroup", b"topic", b"defaultTopic", b"defaultTopicQueueNums", b"queueId",
                        b"sysFlag", b"bornTimestamp", b"flag", b"properties", b"reconsumeTimes", b"unitMode",
                        b"maxReconsumeTimes", b"batch", b"brokerName")


# --- the request -------------------------------------------------------------------------------------
@cython.final
cdef class SendHeader:
    """The one writer of a producer's send request header (SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE
    with the one-letter names a..n, SEND_MESSAGE with the long ones): what is constant for one
    (producer, queue) made once; build_frame fills in the rest per send (a retry topic's
    reconsume fields included, a oneway request's flag)."""

    cdef bytes _head  # '{"code":310,"extFields":{"a":..,"b":..,"c":..,"d":..,"e":"<qid>","f":"'
    cdef bytes _mid   # '","k":"false","m":"false","n":<broker>'
    cdef bytes _language  # ',"language":"PYTHON","opaque":'
    cdef bytes _tail  # ',"serializeTypeCurrentRPC":"JSON","version":N}'
    cdef bytes _kg, _kh, _ki, _kj, _kl  # '","g":"' ... (or the V1 names)
    cdef readonly int code
    cdef readonly str topic
    cdef readonly int queue_id
    cdef readonly str broker_name

    def __init__(self, str group, str topic, int queue_id, str broker_name, str create_topic_key="TBW102",
                 int default_topic_queue_nums=4, int code=310, bint batch=False, str language="PYTHON",
                 int version=0, bint v2=True):
        self.code = code
        self.topic = topic
        self.queue_id = queue_id
        self.broker_name = broker_name
        names = _V2_NAMES if v2 else _V1_NAMES
        self._head = b"".join([
            b'{"code":', str(code).encode(), b',"extFields":{"', names[0], b'":', _json_str(group),
            b',"', names[1], b'":', _json_str(topic), b',"', names[2], b'":', _json_str(create_topic_key),
            b',"', names[3], b'":', _json_str(str(default_topic_queue_nums)),
            b',"', names[4], b'":"', str(queue_id).encode(), b'","', names[5], b'":"'])
        self._kg = b'","' + names[6] + b'":"'
        self._kh = b'","' + names[7] + b'":"'
        self._ki = b'","' + names[8] + b'":"'
        self._kj = b'","' + names[9] + b'":"'
        self._kl = b',"' + names[11] + b'":"'
        self._mid = b"".join([b'","', names[10], b'":"false","', names[12], b'":', b'"true"' if batch else b'"false"',
                              b',"', names[13], b'":', _json_str(broker_name)])
        self._language = b"".join([b',"language":', _json_str(language), b',"opaque":'])
        self._tail = b',"serializeTypeCurrentRPC":"JSON","version":' + str(version).encode() + b"}"

    def build_frame(self, sys_flag, flag, dict properties, opaque, body, born_timestamp=None,
                    reconsume_times=0, max_reconsume_times=None, bint oneway=False):
        """The whole request frame (length prefix included) as bytes, or None when the caller must
        judge it (a property that is not a str, a lone surrogate, a number beyond 64 bits,
        properties over 32767 bytes).  born_timestamp None: now."""
        return self._frame(sys_flag, flag, properties, None, opaque, body, born_timestamp, reconsume_times,
                           max_reconsume_times, None, oneway)

    def build_message_frame(self, message, str uniq, opaque):
        """build_frame for a plain message straight from its fields: the properties are those
        Producer._prepare makes (user properties, TAGS, KEYS, DELAY, WAIT, then UNIQ_KEY = uniq),
        sys flag 0 (no compression), born now.  None where the Python path must do it: a user
        property that is not a str or is UNIQ_KEY, a tag that is not a str, or build_frame's cases."""
        return self._frame(0, message.flag, None, message, opaque, message.body, None, 0, None, uniq)

    cdef object _frame(self, sys_flag, flag, dict properties, message, opaque, body, born_timestamp,
                       reconsume_times, max_reconsume_times, str uniq=None, bint oneway=False):
        cdef Py_buffer pb
        cdef char stack[2048]
        cdef Out o
        cdef Py_ssize_t header_length, total, raw_props = 0
        cdef int64_t born, c_sys_flag, c_flag, c_opaque, c_reconsume, c_max_reconsume = 0
        cdef char* out
        try:  # a value beyond 64 bits: the Python encoder writes it (and the broker judges it)
            born = _now_ms() if born_timestamp is None else born_timestamp
            c_sys_flag, c_flag, c_opaque, c_reconsume = sys_flag, flag, opaque, reconsume_times
            if max_reconsume_times is not None:
                c_max_reconsume = max_reconsume_times
        except OverflowError:
            return None
        o.buf = stack
        o.cap = 2048
        o.n = 8  # room for the two int32 fields in front
        o.heap = False
        try:
            _put(&o, PyBytes_AS_STRING(self._head), len(self._head))
            _put_int(&o, c_sys_flag)
            _put(&o, PyBytes_AS_STRING(self._kg), len(self._kg))
            _put_int(&o, born)
            _put(&o, PyBytes_AS_STRING(self._kh), len(self._kh))
            _put_int(&o, c_flag)
            _put(&o, PyBytes_AS_STRING(self._ki), len(self._ki))
            if message is None:
                raw_props = _put_properties(&o, properties, False)
            else:
                raw_props = _put_message_properties(&o, message, uniq)
            if raw_props < 0 or raw_props > MAX_PROPERTIES_LENGTH:
                return None
            _put(&o, PyBytes_AS_STRING(self._kj), len(self._kj))
            _put_int(&o, c_reconsume)
            _put(&o, PyBytes_AS_STRING(self._mid), len(self._mid))
            if max_reconsume_times is not None:
                _put(&o, PyBytes_AS_STRING(self._kl), len(self._kl))
                _put_int(&o, c_max_reconsume)
                _put(&o, '"', 1)
            if oneway:  # (flag bit 1: no answer expected)
                _put(&o, '},"flag":2', 10)
            else:
                _put(&o, '},"flag":0', 10)
            _put(&o, PyBytes_AS_STRING(self._language), len(self._language))
            _put_int(&o, c_opaque)
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
            if o.heap:
                free(o.buf)


cdef Py_ssize_t _put_pair(Out* o, object k, object v) except -2:
    """name\u0001value\u0002 (JSON-escaped); the raw UTF-8 size, or -1 (not two str, or a lone
    surrogate): the caller declines."""
    cdef Py_ssize_t klen, vlen
    cdef const char* kp
    cdef const char* vp
    if not PyUnicode_CheckExact(k) or not PyUnicode_CheckExact(v):
        return -1
    try:
        kp = PyUnicode_AsUTF8AndSize(k, &klen)
        vp = PyUnicode_AsUTF8AndSize(v, &vlen)
    except UnicodeEncodeError:
        return -1
    _put_escaped(o, kp, klen)
    _put(o, "\\u0001", 6)
    _put_escaped(o, vp, vlen)
    _put(o, "\\u0002", 6)
    return klen + vlen + 2


cdef Py_ssize_t _put_properties(Out* o, dict properties, bint no_uniq) except -2:
    """properties_to_string(properties), escaped; the raw size or -1 (decline)."""
    cdef Py_ssize_t pos = 0, n, raw = 0
    cdef PyObject* k
    cdef PyObject* v
    while PyDict_Next(properties, &pos, &k, &v):
        if v == <PyObject*>None:
            continue  # properties_to_string skips None values
        if no_uniq and PyUnicode_CheckExact(<object>k) and <object>k == "UNIQ_KEY":
            return -1
        n = _put_pair(o, <object>k, <object>v)
        if n < 0:
            return -1
        raw += n
    return raw


cdef Py_ssize_t _put_message_properties(Out* o, message, str uniq) except -2:
    """Message.wire_properties() plus UNIQ_KEY, escaped; the raw size or -1 (decline)."""
    cdef Py_ssize_t n, raw
    cdef dict user = message.properties
    cdef PyObject* k
    cdef PyObject* v
    cdef Py_ssize_t pos = 0
    raw = 0
    if user:
        while PyDict_Next(user, &pos, &k, &v):  # str(v) of None would be "None": the Python path's
            if v == <PyObject*>None or (PyUnicode_CheckExact(<object>k) and <object>k == "UNIQ_KEY"):
                return -1
            n = _put_pair(o, <object>k, <object>v)
            if n < 0:
                return -1
            raw += n
    tags = message.tags
    if tags:
        n = _put_pair(o, "TAGS", tags)
        if n < 0:
            return -1
        raw += n
    keys = message.keys
    if keys:
        n = _put_pair(o, "KEYS", keys)
        if n < 0:
            return -1
        raw += n
    delay = message.delay_time_level
    if delay > 0:
        raw += _put_pair(o, "DELAY", str(delay))
    raw += _put_pair(o, "WAIT", "true" if message.wait_store_msg_ok else "false")
    n = _put_pair(o, "UNIQ_KEY", uniq)
    if n < 0:
        return -1
    return raw + n


# --- the response ------------------------------------------------------------------------------------
@cython.final
@cython.freelist(64)
cdef class SendResponse:
    """What a send response says: code, flag, opaque, remark, and the SendMessageResponseHeader
    fields (None where the header lacks them; queue_id / queue_offset None also when empty)."""

    cdef public object code
    cdef public object flag
    cdef public object opaque
    cdef public object remark
    cdef public object msg_id
    cdef public object queue_id
    cdef public object queue_offset
    cdef public object transaction_id
    cdef public object region_id

    def __init__(self, code, flag=1, opaque=0, remark=None, msg_id=None, queue_id=None, queue_offset=None,
                 transaction_id=None, region_id=None):
        self.code = code
        self.flag = flag
        self.opaque = opaque
        self.remark = remark
        self.msg_id = msg_id
        self.queue_id = queue_id
        self.queue_offset = queue_offset
        self.transaction_id = transaction_id
        self.region_id = region_id

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


DEF _RESPONSE_FLAG = 1

from frame cimport JsonHeader, frame_at, header_int, read_json_header
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
    if not (h.flag & _RESPONSE_FLAG):
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
    cdef Py_buffer pb
    PyObject_GetBuffer(frame, &pb, PyBUF_SIMPLE)
    try:
        return _read_response(<const uint8_t*>pb.buf, pb.len)
    finally:
        PyBuffer_Release(&pb)


def read_send_responses(data, Py_ssize_t max_frame_length):
    """Every whole frame at the start of `data`: (items, consumed), each item the frame's
    SendResponse or, when declined, the frame's bytes without its length prefix.  A length
    outside 4..max_frame_length raises RemotingCommandError naming it (the framing is lost)."""
    cdef Py_buffer pb
    cdef const uint8_t* buf
    cdef Py_ssize_t n, pos = 0, end
    cdef int64_t length = 0
    cdef bint bad = False
    cdef int status
    cdef list items = []
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
            item = _read_response(buf + pos + 4, length)
            if item is None:  # a copy, not a view: the caller may reuse `data` at once
                item = PyBytes_FromStringAndSize(<const char*>(buf + pos + 4), length)
            PyList_Append(items, item)
            pos = end
    finally:
        PyBuffer_Release(&pb)
    if bad:
        from rmq_core.errors import RemotingCommandError
        raise RemotingCommandError(f"frame length {length} outside 4..{max_frame_length}")
    return items, pos


# --- the SendResult --------------------------------------------------------------------------------
cdef extern from "Python.h":
    int PyObject_GenericSetAttr(object o, object name, object value) except -1
    PyObject* PyDict_GetItemWithError(object d, object key) except? NULL


@cython.final
cdef class SendResultMaker:
    """SendResults built from SendResponses without the attrs __init__ (which sets each field
    through object.__setattr__ from Python): the same object.__setattr__, from C.  Built for the
    attrs class `send_result_cls` and its field names, in order."""

    cdef object _cls
    cdef object _new
    cdef tuple _names
    cdef object _queue_cls
    cdef dict _status
    cdef object _default_region

    def __init__(self, send_result_cls, tuple field_names, message_queue_cls, dict status_by_code,
                 str default_region="DefaultRegion"):
        if field_names != ("status", "msg_id", "offset_msg_id", "queue", "queue_offset", "transaction_id",
                           "region_id"):
            raise ValueError(f"SendResultMaker: unexpected SendResult fields {field_names!r}")
        self._cls = send_result_cls
        self._new = send_result_cls.__new__
        self._names = field_names
        self._queue_cls = message_queue_cls
        self._status = status_by_code
        self._default_region = default_region

    cpdef object make(self, SendResponse response, mq, str msg_id):
        """The SendResult of a successful answer; None when its code is not a send status (the
        caller raises MQBrokerError)."""
        cdef PyObject* status = PyDict_GetItemWithError(self._status, response.code)
        if status == NULL:
            return None
        queue_id = response.queue_id
        if queue_id is not None and queue_id != mq.queue_id:
            mq = self._queue_cls(mq.topic, mq.broker_name, queue_id)
        queue_offset = response.queue_offset
        region = response.region_id
        result = self._new(self._cls)
        names = self._names
        PyObject_GenericSetAttr(result, names[0], <object>status)
        PyObject_GenericSetAttr(result, names[1], msg_id)
        PyObject_GenericSetAttr(result, names[2], response.msg_id or "")
        PyObject_GenericSetAttr(result, names[3], mq)
        PyObject_GenericSetAttr(result, names[4], -1 if queue_offset is None else queue_offset)
        PyObject_GenericSetAttr(result, names[5], response.transaction_id)
        PyObject_GenericSetAttr(result, names[6], region if region else self._default_region)
        return result


# --- futures ---------------------------------------------------------------------------------------
cdef extern from "Python.h":
    object PyObject_GenericGetDict(object o, void* context)
    int PyDict_SetItem(object d, object key, object value) except -1
    int PyDict_DelItem(object d, object key) except -1
    PyObject* PyDict_GetItem(object d, object key)

cdef object _PENDING = None
cdef object _RUNNING = None
cdef object _FINISHED = None


def init_future_states(pending, running, finished):
    """Bind concurrent.futures' state constants (called once by rmq_core.client.instance)."""
    global _PENDING, _RUNNING, _FINISHED
    _PENDING, _RUNNING, _FINISHED = pending, running, finished


def finish_unwatched(future, result, exception):
    """Finish a LeanFuture nobody waits on or subscribed to yet, in one step no other thread can
    come between (no Python code runs here): when its __dict__ has no `_condition` and its state is
    PENDING or RUNNING, store the result (or exception), set FINISHED and return True.  Anyone who
    comes later makes the Condition first and then reads the final state.  False: the caller takes
    Future.set_result / set_exception (a Condition exists, or the Future is already done)."""
    return _finish_unwatched(future, result, exception)


def lean_result(future, timeout=None):
    """LeanFuture.result: a Future finished without an exception answers from its __dict__ here;
    anything else goes to future._result_slow(timeout) (waiting, raising, cancelled)."""
    cdef PyObject* found
    d = PyObject_GenericGetDict(future, NULL)  # (the public way to an instance's own __dict__)
    found = PyDict_GetItem(d, "_state")
    if found != NULL and <object>found is _FINISHED:
        found = PyDict_GetItem(d, "_exception")
        if found == NULL or <object>found is None:
            found = PyDict_GetItem(d, "_result")
            return None if found == NULL else <object>found
    return future._result_slow(timeout)


def subscribe_unwatched(future, callback):
    """LeanFuture.add_lean_callback: when the Future is pending, has no Condition and no lean
    callback yet, record `callback` (called once with the Future when it finishes, by whoever
    finishes it) in one step no other thread can come between, and return True.  False: the caller
    subscribes the usual way (add_done_callback) or reads the finished Future."""
    cdef PyObject* state
    d = PyObject_GenericGetDict(future, NULL)
    if PyDict_GetItem(d, "_condition") != NULL or PyDict_GetItem(d, "_lean_callback") != NULL:
        return False
    state = PyDict_GetItem(d, "_state")
    if state == NULL or (<object>state is not _PENDING and <object>state is not _RUNNING):
        return False
    PyDict_SetItem(d, "_lean_callback", callback)
    return True


cdef bint _finish_unwatched(future, result, exception) except -1:
    cdef PyObject* state
    cdef PyObject* found
    d = PyObject_GenericGetDict(future, NULL)  # (the public way to an instance's own __dict__)
    if PyDict_GetItem(d, "_condition") != NULL:
        return False
    state = PyDict_GetItem(d, "_state")
    if state == NULL or (<object>state is not _PENDING and <object>state is not _RUNNING):
        return False
    if exception is None:
        PyDict_SetItem(d, "_result", result)
    else:
        PyDict_SetItem(d, "_exception", exception)
    PyDict_SetItem(d, "_state", _FINISHED)
    found = PyDict_GetItem(d, "_lean_callback")  # (recorded before the state changed: see above)
    if found != NULL:
        callback = <object>found
        PyDict_DelItem(d, "_lean_callback")
        try:
            callback(future)
        except Exception:  # a subscriber's failure is not the finisher's (Future._invoke_callbacks)
            _log_callback_error(future)
    return True


cdef _log_callback_error(future):
    import logging
    logging.getLogger("concurrent.futures").exception("exception calling callback for %r", future)


cdef extern from "<time.h>" nogil:
    int CLOCK_MONOTONIC


cdef inline double _monotonic() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)  # what time.monotonic() reads on Linux
    return <double>ts.tv_sec + <double>ts.tv_nsec * 1e-9


cdef object _LOOP_FUTURE = None


def set_loop_future_class(cls):
    """The asyncio Future class of rmq_core.aio's sends (an `inbox` whose `thread` is its loop's):
    PipelinedCompletion sets one's result itself when it reads the answer on that loop's thread,
    and calls its finish(result) elsewhere."""
    global _LOOP_FUTURE
    _LOOP_FUTURE = cls


@cython.final
cdef class PipelinedCompletion:
    """SendAttempts.answered's usual case on the reader thread, natively: a send answered with
    a send status becomes its SendResult, the broker's fault item is noted as SendPolicy.note
    does (a fast answer at most once per millisecond per broker, in the same `noted` table), and the
    LeanFuture is finished.  Anything else (a failure, a refusal, a watched Future) goes to
    `fallback(context, response, error)`, the Python method.  context: the tuple
    (message, uniq, mode, queue, address, timeout, begin, future) PipelinedSender made."""

    cdef SendResultMaker _maker
    cdef object _fault_strategy
    cdef dict _noted
    cdef object _fallback

    def __init__(self, SendResultMaker maker, fault_strategy, dict noted, fallback):
        self._maker = maker
        self._fault_strategy = fault_strategy
        self._noted = noted
        self._fallback = fallback

    def __call__(self, tuple context, response, error):
        self.complete(context, response, error)

    cdef int _note(self, broker, double begin) except -1:
        """SendPolicy.note(broker, begin, False): a fast answer at most once per ms."""
        cdef double now = _monotonic()
        cdef int64_t latency = <int64_t>((now - begin) * 1000.0)
        cdef int64_t now_ms = <int64_t>(now * 1000.0)
        cdef PyObject* last = PyDict_GetItem(self._noted, broker)
        if latency >= 50:
            self._noted.pop(broker, None)
            self._fault_strategy.update_fault_item(broker, latency, False)
        elif last == NULL or <int64_t><object>last != now_ms:
            self._noted[broker] = now_ms
            self._fault_strategy.update_fault_item(broker, latency, False)
        return 0

    cdef int complete(self, tuple context, response, error) except -1:
        if error is None and type(response) is SendResponse and len(context) == 8:
            mq = context[3]
            result = self._maker.make(<SendResponse>response, mq, context[1])
            if result is not None:
                self._note(mq.broker_name, context[6])
                future = context[7]
                if type(future) is _LOOP_FUTURE:
                    if PyThread_get_thread_ident() == future.inbox.thread:  # read on its own loop
                        if not future.done():  # (else its awaiting task was cancelled)
                            future.set_result(result)
                    else:
                        future.finish(result)
                elif not _finish_unwatched(future, result, None):
                    future.finish(result)
                return 0
        self._fallback(context, response, error)
        return 0


# --- UNIQ_KEY ----------------------------------------------------------------------------------------
cdef extern from "Python.h":
    object PyUnicode_New(Py_ssize_t size, Py_UCS4 maxchar)
    void* PyUnicode_DATA(object o)
    int PyUnicode_KIND(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)
    object PyIter_Next(object o)

cdef const char* _UPPER_HEX = "0123456789ABCDEF"


@cython.final
cdef class UniqIds:
    """MessageClientIDSetter.create_uniq_id written natively: the same id from the same state
    (its hex prefix, month bounds and its shared counter, so ids from either never repeat), the
    32 characters formatted in C instead of an f-string."""

    cdef object _setter

    def __init__(self, setter_cls):
        self._setter = setter_cls

    def __call__(self):
        return _uniq_id(self._setter)


cdef str _uniq_id(object setter):
    """One UNIQ_KEY from MessageClientIDSetter's state (UniqIds.__call__, encode_batch)."""
    cdef int64_t now = _now_ms()
    cdef Py_ssize_t n, i
    cdef uint32_t elapsed, counter
    cdef char* out
    if now >= <int64_t>setter._next_month_ms:
        setter._roll_month(now)
    counter = <uint32_t>(<int64_t>PyIter_Next(setter._sequence) & 0xFFFF)
    elapsed = <uint32_t>((now - <int64_t>setter._month_start_ms) & 0xFFFFFFFF)
    prefix = setter._hex_prefix
    n = PyUnicode_GET_LENGTH(prefix)
    if PyUnicode_KIND(prefix) != 1:
        raise ValueError(f"MessageClientIDSetter prefix {prefix!r} is not ASCII hex")
    uniq = PyUnicode_New(n + 12, 127)
    out = <char*>PyUnicode_DATA(uniq)
    memcpy(out, PyUnicode_DATA(prefix), n)
    for i in range(8):
        out[n + i] = _UPPER_HEX[(elapsed >> (28 - 4 * i)) & 15]
    for i in range(4):
        out[n + 8 + i] = _UPPER_HEX[(counter >> (12 - 4 * i)) & 15]
    return uniq


# --- the pipelined connection's writes ----------------------------------------------------------------
@cython.final
cdef class PipelinedWrites:
    """A PipelinedChannel's write side (see rmq_core.remoting.pipelined): the pending table's entries
    made, frames gathered while a write is in progress or answers are due, and who writes them.
    No method calls Python code or lets go of the GIL, so each one is atomic for all the threads
    sharing the channel: no lock.  `writing` marks a thread in a socket write; it takes what
    gathered meanwhile (next_write) before it leaves."""

    cdef readonly dict pending  # opaque -> (deadline, on_done, context)
    cdef list _frames  # gathered for the next write, in order
    cdef Py_ssize_t _bytes
    cdef Py_ssize_t _requests  # requests among them
    cdef readonly Py_ssize_t unanswered  # requests written whose answers have not come (about: never < 0)
    cdef readonly double held_since  # when the first gathered frame came (0: none)
    cdef readonly bint writing
    cdef readonly bint closed
    cdef readonly object error  # what closed it (the first failure)
    cdef public bint closing
    cdef readonly double last_send  # when a request was last offered
    cdef public Py_ssize_t coalesce_bytes
    cdef public double coalesce_delay

    def __init__(self, dict pending, Py_ssize_t coalesce_bytes, double coalesce_delay):
        self.pending = pending
        self._frames = []
        self.coalesce_bytes = coalesce_bytes
        self.coalesce_delay = coalesce_delay

    cdef inline object _take(self):
        cdef list frames = self._frames
        data = frames[0] if len(frames) == 1 else b"".join(frames)
        self.unanswered += self._requests
        self._requests = 0
        self._frames = []
        self._bytes = 0
        self.held_since = 0.0
        return data

    @property
    def gathered(self):
        """True while frames wait to be written."""
        return len(self._frames) > 0

    cpdef object offer(self, frame, opaque, double timeout, on_done, context):
        """A request (its frame, length prefix included): None when it gathered (a write in
        progress or answers due - that writer, the reader, the next caller or a waiter writes it);
        False when the channel is closed or closing (nothing registered); else the bytes to write
        now (what gathered, then this frame) and this thread is the writer (next_write after)."""
        cdef double now
        cdef Py_ssize_t n = len(frame)
        if self.closed or self.closing:
            return False
        now = _monotonic()
        self.last_send = now
        self.pending[opaque] = (now + timeout, on_done, context)
        if self.writing or (self.unanswered > 0 and self._bytes + n <= self.coalesce_bytes
                            and (self.held_since == 0.0 or now - self.held_since < self.coalesce_delay)):
            if not self._frames:
                self.held_since = now
            self._frames.append(frame)
            self._bytes += n
            self._requests += 1
            return None
        self._requests += 1
        if self._frames:  # what gathered goes first, in order
            self._frames.append(frame)
            frame = self._take()
        else:
            self._take()
        self.writing = True
        return frame

    cpdef object next_write(self):
        """The writer's next bytes after a write: what gathered meanwhile (it stays the writer), or
        None - nothing did, or the channel closed - and `writing` is cleared."""
        if not self._frames or self.closed:
            self.writing = False
            return None
        return self._take()

    cpdef object start_flush(self, Py_ssize_t answered=0):
        """`answered` answers came; then what gathered, to write now (this thread is the writer),
        or None: a write is in progress, nothing gathered or the channel is closed."""
        if answered:
            self.unanswered = max(0, self.unanswered - answered)
        if self.writing or not self._frames or self.closed:
            return None
        data = self._take()
        self.writing = True
        return data

    cpdef object end_flush(self, rest):
        """A non-blocking write ended: `rest`, the bytes it could not write (maybe part of a
        frame), goes first next time; `writing` is cleared."""
        self.writing = False
        if rest:
            self._frames.insert(0, rest)
            self._bytes += len(rest)
            if self.held_since == 0.0:
                self.held_since = _monotonic()
        return None

    cpdef object write_failed(self):
        """A write failed: `writing` cleared, what gathered dropped (the connection goes)."""
        self.writing = False
        if self._frames:
            self._take()
        return None

    cpdef object answered(self, Py_ssize_t n):
        """n answers came (or n requests stopped counting on one: timed out)."""
        self.unanswered = max(0, self.unanswered - n)
        return None

    cpdef object add_response(self, response):
        """A frame that is no request of ours (a refusal), written with what gathered."""
        if not self._frames:
            self.held_since = _monotonic()
        self._frames.append(response)
        self._bytes += len(response)
        return None

    cpdef bint mark_closed(self, error):
        """Closed for good by `error` (the first call's is kept in `error`); True for the first call."""
        if self.closed:
            return False
        self.closed = True
        self.error = error
        return True


# --- the pipelined send path -------------------------------------------------------------------------
DEF _INT32_MAX = 0x7FFFFFFF


@cython.final
cdef class PipelinedSender:
    """The first attempt of a plain send (rmq_core.client.producer.SendAttempts.write's usual
    case) natively: the topic's route, a queue picked as MQFaultStrategy.select_one_message_queue
    does (round robin past brokers on the bench), the broker's master address, the cached
    SendHeader, a UNIQ_KEY, the whole frame, the LeanFuture and its context, written on the
    broker's pipelined connection (tcp or in-proc) - the same steps and calls, without a Python
    frame for each.  Its answer is finished by PipelinedCompletion; a failure goes to
    state.failed, which retries as the policy says.

    send(message, timeout, mode, future=None) returns the LeanFuture (or `future`, when given: an
    object with finish(result, error) and a settable `channel`, which the completion finishes);
    None when it declined before picking a queue (the caller's general attempt decides).  Where it declines after picking a queue for a
    reason the Python path handles (no address, no cached native header, a body to compress,
    properties the native writer leaves to Python) it calls
    state.send_general(message, timeout, queue, address, mode) and returns what that returns.

    It works from one rmq_core.client.send_state.SendState - tables, settings and callables the
    Python layer owns and keeps current - never from a Producer or a client instance."""

    cdef object _state  # the rmq_core.client.send_state.SendState it works from (owned by Python)
    cdef dict _publish_info
    cdef object _fault_strategy
    cdef dict _benched
    cdef object _clock
    cdef dict _broker_addrs
    cdef dict _headers
    cdef object _uniq
    cdef object _future_cls
    cdef object _message_cls
    cdef object _check_message
    cdef object _completion
    cdef object _channel_for
    cdef object _opaques
    cdef object _remoting_error
    cdef object _master_id
    cdef object _new_future
    cdef set _checked_topics
    cdef dict _channels  # address -> its one pipelined connection while open (None: not cached)

    def __init__(self, state):
        self._state = state
        self._publish_info = state.publish_info
        self._fault_strategy = state.fault
        self._benched = state.benched
        self._clock = state.clock
        self._broker_addrs = state.broker_addrs
        self._headers = state.headers
        self._uniq = state.uniq
        self._future_cls = state.future_cls
        self._message_cls = state.message_cls
        self._check_message = state.check_message
        self._completion = state.completion
        self._channel_for = state.channel_for
        self._opaques = state.opaques
        self._remoting_error = state.remoting_error
        self._master_id = state.master_id
        # a LeanFuture made without its __init__: its class holds the defaults, only _state is set
        self._new_future = self._future_cls.__new__
        self._checked_topics = state.checked_topics if state.checked_topics is not None else set()
        # with one connection per broker, the one channel_for gave for an address
        # (a tcp or in-proc one) serves until it closes; with more, channel_for takes them in turn
        self._channels = {} if state.one_channel_per_broker else None

    cdef object _publish_info_of(self, message):
        """The cached route of a plain Message's topic when it has queues; else None (the
        Python way decides: a user's Message subclass, a route not fetched yet or empty)."""
        cdef PyObject* found
        if type(message) is not self._message_cls:
            return None
        found = PyDict_GetItem(self._publish_info, message.topic)
        if found == NULL:
            return None
        info = <object>found
        return info if info.queues else None

    cdef object _pick_queue(self, info, queues):
        """The queue MQFaultStrategy.select_one_message_queue picks, its usual case inline."""
        cdef Py_ssize_t n, i, index
        cdef PyObject* found
        fault = self._fault_strategy
        if fault.enabled:
            n = len(queues)
            # TopicPublishInfo.next_index without its lock: this step is atomic under the GIL (a
            # locked Python step interleaved with it may lose one turn of the round robin: harmless)
            index = (info.index + 1) & _INT32_MAX
            info.index = index
            items = self._benched
            now = None
            for i in range(n):
                candidate = queues[(index + i) % n]
                found = PyDict_GetItem(items, candidate.broker_name)
                if found != NULL:
                    item = <object>found  # (a strong reference before any Python code runs)
                    if now is None:
                        now = self._clock()
                    if not now >= item.start_timestamp:
                        continue
                return candidate
        # not enabled, or every broker benched: the strategy's own way
        return fault.select_one_message_queue(info, None)

    cdef object _master_addr(self, broker):
        """MQClientInstance.find_broker_addr_in_publish: the broker's master address, or None."""
        cdef PyObject* found = PyDict_GetItem(self._broker_addrs, broker)
        if found != NULL:
            addrs = <object>found
            if addrs:
                return addrs.get(self._master_id)
        return None

    cdef inline bint _passes_inline(self, message, topic, Py_ssize_t n, Py_ssize_t max_size):
        """True only when check_message surely passes `message` (the usual case, decided
        without a call): a body of fitting size, a topic check_message passed before, no
        properties (their reserved names are check_message's to refuse) and a delay level >= 0.
        Anything else goes through check_message itself, so every send route refuses the same
        messages with the same error."""
        return (0 < n <= max_size and topic in self._checked_topics and not message.properties
                and message.delay_time_level >= 0)

    def send(self, message, double timeout, mode="ASYNC", future=None):
        cdef Py_ssize_t n
        cdef PyObject* found
        state = self._state
        info = self._publish_info_of(message)
        if info is None or not state.pipelined_possible():
            return None
        topic = message.topic
        queues = info.queues
        body = message.body
        n = len(body) if type(body) is bytes else -1
        max_size = state.max_message_size
        if not self._passes_inline(message, topic, n, max_size):
            try:  # (check_message's usual case passed inline: a topic it passed, a body of fitting size)
                self._check_message(message, max_size)
            except Exception:  # the general path fails the Future with it
                return None
        mq = self._pick_queue(info, queues)
        broker = mq.broker_name
        addr = self._master_addr(broker)
        if addr is None:
            return state.send_general(message, timeout, mq, None, mode)
        channel = None
        if self._channels is not None:
            found = PyDict_GetItem(self._channels, addr)
            if found != NULL:
                channel = <object>found
                if channel.closed:
                    channel = None
        found = PyDict_GetItem(self._headers, (mq.topic, broker, mq.queue_id, False))
        if found == NULL or type(<object>found) is not SendHeader or len(message.body) >= state.compress_over:
            return state.send_general(message, timeout, mq, addr, mode)
        header = <SendHeader><object>found
        opaque = next(self._opaques) & _INT32_MAX
        uniq = self._uniq()
        frame = header._frame(0, message.flag, None, message, opaque, message.body, None, 0, None, uniq)
        if frame is None:
            return state.send_general(message, timeout, mq, addr, mode)
        if future is None:
            fut = self._new_future(self._future_cls)
            PyObject_GenericSetAttr(fut, "_state", _PENDING)
        else:  # the caller's own Future (rmq_core.aio's): finished through its finish(result, error)
            fut = future
        context = (message, uniq, mode, mq, addr, timeout, _monotonic(), fut)
        if channel is None:
            try:
                channel = self._channel_for(addr)
            except self._remoting_error as e:  # cannot connect: counted against the broker, retried elsewhere
                state.failed(context, None, e)
                return fut
            if self._channels is not None:
                if len(self._channels) >= 1024:  # brokers come and go with routes: keep it bounded
                    self._channels.clear()
                self._channels[addr] = channel
        fut.channel = channel  # result() reads the answer itself when no other thread does
        writes = getattr(channel, "writes", None)
        if mode == "SYNC":  # this thread waits for the answer at once: it writes and reads it itself
            channel.exchange(frame, opaque, timeout, self._completion, context)
        elif type(writes) is PipelinedWrites:  # PipelinedChannel.send without its Python frame
            if channel.intercepted:  # its RPC hook step first (a step that raises failed the send)
                frame = channel.intercept(frame, opaque, self._completion, context)
                if frame is None:
                    return fut
            data = (<PipelinedWrites>writes).offer(frame, opaque, timeout, self._completion, context)
            if data is not None:
                channel.after_offer(data, opaque, self._completion, context)
        else:
            channel.send(frame, opaque, timeout, self._completion, context)
        return fut


def deliver_responses(list items, dict pending, failed):
    """A PipelinedChannel's usual completions natively: every SendResponse answer among `items`
    whose request waits in `pending` (opaque -> (deadline, on_done, context)) is taken out and
    on_done(context, response, None) called (a PipelinedCompletion directly); an on_done that
    raises is reported to failed(opaque) from inside its except clause (log.exception there) and
    the rest go on.  Returns (answers completed, the other items in order) - frames the channel
    decodes itself, requests, and answers nobody waits for."""
    cdef list rest = []
    cdef Py_ssize_t answers = 0
    cdef SendResponse response
    cdef PyObject* found
    for item in items:
        if type(item) is not SendResponse or not (<SendResponse>item).flag & _RESPONSE_FLAG:
            rest.append(item)
            continue
        response = <SendResponse>item
        key = response.opaque
        found = PyDict_GetItem(pending, key)
        if found == NULL:
            rest.append(item)
            continue
        entry = <tuple>found
        del pending[key]  # (the dict is only popped, never re-filled for an opaque: no race with a sweep)
        answers += 1
        on_done = entry[1]
        try:
            if type(on_done) is PipelinedCompletion:
                (<PipelinedCompletion>on_done).complete(entry[2], item, None)
            else:
                on_done(entry[2], item, None)
        except Exception:  # one bad completion must not stop the others
            failed(key)
    return answers, rest


# --- batch bodies (SEND_BATCH_MESSAGE) ---------------------------------------------------------------
# Producer.send_batch's validation and encoding in one pass, from the Message objects straight to
# the body (codec.encode_batch_body's layout, byte for byte; encode_batch_py in
# tests/client/batch_reference.py is the Python twin the tests compare it with):
#
#     int32 totalSize = 22 + bodyLength + propertiesLength
#     int32 magic = 0,  int32 bodyCRC = 0          (the broker fills them in, as for Java's clients)
#     int32 flag,  int32 bodyLength,  body
#     int16 propertiesLength,  properties           (name\x01value\x02 ..., UTF-8)
#
# An item's properties are Message.wire_properties() (user properties, TAGS, KEYS, WAIT) with
# UNIQ_KEY set: the message's own one where it has it, else a new one (at the end).
from cpython.bytes cimport PyBytes_Check, PyBytes_GET_SIZE
from libc.string cimport memchr

DEF BATCH_ITEM_FIXED = 22


cdef inline void _be32(char* p, uint32_t v) noexcept nogil:
    p[0] = <char>(v >> 24); p[1] = <char>(v >> 16); p[2] = <char>(v >> 8); p[3] = <char>v


cdef object _IllegalArgumentError = None


cdef object _illegal_argument():
    global _IllegalArgumentError
    if _IllegalArgumentError is None:  # (imported on first use: rmq_core.errors imports nothing native)
        from rmq_core.errors import IllegalArgumentError
        _IllegalArgumentError = IllegalArgumentError
    return _IllegalArgumentError


cdef object _batch_error(Py_ssize_t index, str text):
    """The error of item `index` (-1: a message sent on its own, encode_batch_item)."""
    if index < 0:
        return _illegal_argument()(text)
    return _illegal_argument()(f"batch item {index}: {text}")


cdef const char* _utf8(object s, Py_ssize_t* n, Py_ssize_t index, object name) except NULL:
    try:
        return PyUnicode_AsUTF8AndSize(s, n)
    except UnicodeEncodeError:
        raise _batch_error(index, f"property {name!r} is not encodable as UTF-8") from None


cdef Py_ssize_t _put_raw_pair(Out* o, object k, object v, Py_ssize_t index) except -1:
    """name\\x01value\\x02 as raw UTF-8 (a value that is not a str as str() makes it); the bytes
    written.  A name that is not a str, is empty or holds a separator, and a value holding \\x02,
    fail naming the item: they would corrupt the properties string."""
    cdef Py_ssize_t klen, vlen
    cdef const char* kp
    cdef const char* vp
    if not PyUnicode_CheckExact(k):
        if not isinstance(k, str):
            raise _batch_error(index, f"property name {k!r} must be a str")
    if not PyUnicode_CheckExact(v):
        v = str(v)
    kp = _utf8(k, &klen, index, k)
    vp = _utf8(v, &vlen, index, k)
    if klen == 0:
        raise _batch_error(index, f"property name {k!r} is empty (value {v!r})")
    if memchr(kp, 1, klen) != NULL or memchr(kp, 2, klen) != NULL:
        raise _batch_error(index, f"property name {k!r} contains a separator (\\x01 or \\x02)")
    if memchr(vp, 2, vlen) != NULL:
        raise _batch_error(index, f"property {k!r}: the value contains the separator '\\x02'")
    if o.n + klen + vlen + 2 > o.cap:
        _grow(o, klen + vlen + 2)
    memcpy(o.buf + o.n, kp, klen)
    o.buf[o.n + klen] = 1
    memcpy(o.buf + o.n + klen + 1, vp, vlen)
    o.buf[o.n + klen + 1 + vlen] = 2
    o.n += klen + vlen + 2
    return klen + vlen + 2


cdef object _reserved_name(dict props, frozenset reserved):
    """The first (sorted) reserved property name among `props`' names, UNIQ_KEY allowed; None."""
    cdef PyObject* k
    cdef PyObject* v
    cdef Py_ssize_t pos = 0
    first = None
    while PyDict_Next(props, &pos, &k, &v):
        if <object>k in reserved and <object>k != "UNIQ_KEY":
            if first is None or <object>k < first:
                first = <object>k
    return first


cdef str _put_item(Out* o, m, Py_ssize_t i, str topic, Py_ssize_t max_message_size, frozenset reserved,
                   id_setter, Py_ssize_t* item_size):
    """One message as a batch item at the end of `o` after check_message's checks and the batch
    rules (errors name item i); its UNIQ_KEY.  item_size: its size as the batch limit counts it
    (20 + body + properties)."""
    cdef Py_ssize_t start, props_at, raw, body_len
    cdef int64_t c_flag
    cdef dict user
    cdef PyObject* k
    cdef PyObject* v
    cdef Py_ssize_t pos
    cdef bint has_uniq
    body = m.body
    if not PyBytes_Check(body):
        raise _batch_error(i, f"body must be bytes, not {type(body).__name__}")
    body_len = PyBytes_GET_SIZE(body)
    if body_len == 0:
        raise _batch_error(i, f"message to topic {topic!r} has an empty body")
    if body_len > max_message_size:
        raise _batch_error(i, f"message body of {body_len} bytes to topic {topic!r} exceeds "
                              f"max_message_size {max_message_size} bytes")
    delay = m.delay_time_level
    if delay < 0:
        raise _batch_error(i, f"bad delay_time_level {delay!r}: must be >= 0")
    if delay > 0:
        raise _batch_error(i, f"delay messages are not supported in a batch (delay_time_level {delay!r})")
    flag = m.flag
    try:
        c_flag = flag
    except (OverflowError, TypeError):
        c_flag = 1 << 40
    if c_flag < -0x80000000 or c_flag > 0x7FFFFFFF:
        raise _batch_error(i, f"flag {flag!r} is out of range (a 32-bit signed int)")
    user = m.properties
    if user:
        name = _reserved_name(user, reserved)
        if name is not None:
            raise _batch_error(i, f"property name {name!r} is reserved by RocketMQ; use the Message field "
                                  f"instead" if name in ("TAGS", "KEYS", "DELAY") else
                                  f"property name {name!r} is reserved by RocketMQ")
    # the fixed part, the body, then the properties after a 2-byte length slot
    start = o.n
    if o.n + 20 + body_len + 2 > o.cap:
        _grow(o, 20 + body_len + 2)
    _be32(o.buf + start + 4, 0)
    _be32(o.buf + start + 8, 0)
    _be32(o.buf + start + 12, <uint32_t>c_flag)
    _be32(o.buf + start + 16, <uint32_t>body_len)
    memcpy(o.buf + start + 20, PyBytes_AS_STRING(body), body_len)
    props_at = start + 20 + body_len + 2
    o.n = props_at
    raw = 0
    has_uniq = False
    uniq = None
    if user:
        pos = 0
        while PyDict_Next(user, &pos, &k, &v):
            if PyUnicode_CheckExact(<object>k) and <object>k == "UNIQ_KEY":
                uniq = str(<object>v) if <object>v else _uniq_id(id_setter)
                has_uniq = True
                raw += _put_raw_pair(o, "UNIQ_KEY", uniq, i)
            else:
                raw += _put_raw_pair(o, <object>k, <object>v, i)
    tags = m.tags
    if tags:
        raw += _put_raw_pair(o, "TAGS", tags, i)
    keys = m.keys
    if keys:
        raw += _put_raw_pair(o, "KEYS", keys, i)
    raw += _put_raw_pair(o, "WAIT", "true" if m.wait_store_msg_ok else "false", i)
    if not has_uniq:
        uniq = _uniq_id(id_setter)
        raw += _put_raw_pair(o, "UNIQ_KEY", uniq, i)
    if raw > MAX_PROPERTIES_LENGTH:
        raise _batch_error(i, f"properties are {raw} bytes, more than {MAX_PROPERTIES_LENGTH}")
    _be32(o.buf + start, <uint32_t>(BATCH_ITEM_FIXED + body_len + raw))
    o.buf[props_at - 2] = <char>(raw >> 8)
    o.buf[props_at - 1] = <char>raw
    item_size[0] = 20 + body_len + raw
    return uniq


def encode_batch(list msgs, Py_ssize_t max_message_size, message_cls, frozenset reserved, check_topic,
                 id_setter):
    """Validate and encode a batch: (topic, comma-joined UNIQ_KEYs, body, the first message's
    wait_store_msg_ok).  Each message is checked as selector.check_message does (a Message, the
    topic once through check_topic, a bytes body of 1..max_message_size, no reserved property name,
    a delay level >= 0) plus the batch rules (one topic, no delay, no retry topic, a 32-bit flag,
    properties that do not corrupt the encoding and fit 32767 bytes); the encoded batch (20 bytes a
    message plus bodies and properties) must fit max_message_size.  IllegalArgumentError names the
    item and the bad value.  id_setter: MessageClientIDSetter (new UNIQ_KEYs)."""
    cdef Py_ssize_t count = len(msgs), i, item_size = 0, total = 0
    cdef Out o
    cdef list uniqs
    IllegalArgumentError = _illegal_argument()
    if count == 0:
        raise IllegalArgumentError("send_batch needs at least one message")
    uniqs = [None] * count
    topic = None
    o.buf = NULL
    o.cap = 0
    o.n = 0
    o.heap = False
    try:
        for i in range(count):
            m = msgs[i]
            if not isinstance(m, message_cls):
                raise _batch_error(i, f"expected a Message, got {type(m).__name__}")
            if i == 0:
                topic = m.topic
                check_topic(topic)
                if topic.startswith("%RETRY%"):
                    raise IllegalArgumentError(f"retry topic {topic!r} is not supported in a batch")
                # room for every item the size of the first (its body and ~100 bytes of properties)
                _grow(&o, count * (BATCH_ITEM_FIXED + 100 + (PyBytes_GET_SIZE(m.body) if PyBytes_Check(m.body) else 0)))
            else:
                other = m.topic
                if other is not topic and other != topic:
                    raise _batch_error(i, f"all messages of a batch must have the same topic: {other!r} "
                                          f"differs from {topic!r}")
            uniqs[i] = _put_item(&o, m, i, topic, max_message_size, reserved, id_setter, &item_size)
            total += item_size
        if total > max_message_size:
            raise IllegalArgumentError(
                f"batch of {count} messages is {total} bytes encoded, more than max_message_size "
                f"{max_message_size}; split it")
        return topic, ",".join(uniqs), PyBytes_FromStringAndSize(o.buf, o.n), msgs[0].wait_store_msg_ok
    finally:
        if o.heap:
            free(o.buf)


def encode_batch_item(message, Py_ssize_t max_message_size, message_cls, frozenset reserved, check_topic,
                      id_setter):
    """One message sent on its own as a batch item (auto_batch gathers these): (topic, UNIQ_KEY,
    item, wait_store_msg_ok) after encode_batch's checks, its errors naming the bad value without
    an item index; the item is what encode_batch writes for it (a batch body is items end to end)."""
    cdef char stack[1024]
    cdef Out o
    cdef Py_ssize_t item_size = 0
    if not isinstance(message, message_cls):
        raise _illegal_argument()(f"expected a Message, got {type(message).__name__}")
    topic = message.topic
    check_topic(topic)
    if topic.startswith("%RETRY%"):
        raise _illegal_argument()(f"retry topic {topic!r} is not supported in a batch")
    o.buf = stack
    o.cap = 1024
    o.n = 0
    o.heap = False
    try:
        uniq = _put_item(&o, message, -1, topic, max_message_size, reserved, id_setter, &item_size)
        if item_size > max_message_size:
            raise _illegal_argument()(f"message to topic {topic!r} is {item_size} bytes encoded, more than "
                                      f"max_message_size {max_message_size}")
        return topic, uniq, PyBytes_FromStringAndSize(o.buf, o.n), message.wait_store_msg_ok
    finally:
        if o.heap:
            free(o.buf)


def finish_batch(SendResultMaker maker, list batch, status, queue, int64_t base, offset_ids, region):
    """Finish the Futures of a batch the broker took (PipelinedAccumulator): batch holds
    (item, uniq, future, timeout) tuples in sending order; each future gets its SendResult -
    msg_id its uniq, queue offset base + its index (-1 when base is), offset msg id the answer's
    comma-separated one at its index - built and set without Python code per message."""
    cdef Py_ssize_t i, n = len(batch), n_ids
    cdef list ids = offset_ids.split(",") if offset_ids else []
    cdef tuple names = maker._names
    n_ids = len(ids)
    if not region:
        region = maker._default_region
    for i in range(n):
        entry = <tuple>batch[i]
        result = maker._new(maker._cls)
        PyObject_GenericSetAttr(result, names[0], status)
        PyObject_GenericSetAttr(result, names[1], entry[1])
        PyObject_GenericSetAttr(result, names[2], ids[i] if i < n_ids else "")
        PyObject_GenericSetAttr(result, names[3], queue)
        PyObject_GenericSetAttr(result, names[4], base + i if base >= 0 else -1)
        PyObject_GenericSetAttr(result, names[5], None)
        PyObject_GenericSetAttr(result, names[6], region)
        future = entry[2]
        if not _finish_unwatched(future, result, None):
            future.finish(result)
