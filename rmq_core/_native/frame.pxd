# The one reader of a remoting frame's JSON header (docs/protocol.md §1-2):
#
#     {"code":N,"extFields":{"k":"v",...},"flag":N,"language":"JAVA","opaque":N,
#      "remark":"...","serializeTypeCurrentRPC":"JSON","version":N}
#
# read_json_header walks it once: the integers and the spans of language / remark land in a
# JsonHeader, every extFields entry goes, in order, to the caller's `on_field` (raw key and value
# spans, escapes left in place: unescape_json decodes them).  The remoting codec builds a
# RemotingCommand from it (frame.pyx), the broker's send lane reads a SEND_MESSAGE_V2 from it
# without building anything (send_lane.pyx).  Anything it does not handle makes it return 0, and
# the pure-Python codec (rmq_core/remoting/command.py) decides and names the problem.
#
# frame.pyx also holds the producer's send request header writer (SendHeader) and the send
# response (SendResponse, read by read_json_header): declared here for the send pipeline kernel
# (send_pipeline.pyx), which calls them without a Python call.  Cimport this module by its full
# name (rmq_core._native.frame): it declares extension types.
cimport cython
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t

from json_read cimport Cursor, expect, hex_digit, key_is, open_json_header, read_int, scan_str, skip_ws

from json_text cimport Out
from rmq_core._native.hmac_sha1 cimport HmacSha1

# one extFields entry: 0 to go on, 1 to decline the frame (an exception propagates)
ctypedef int (*ext_field_fn)(void* target, const uint8_t* key, Py_ssize_t key_len, bint key_escaped,
                             const uint8_t* value, Py_ssize_t value_len, bint value_escaped) except -1


cdef struct JsonHeader:
    int64_t code, flag, opaque, version
    bint has_code
    const uint8_t* language     # NULL: absent (RemotingCommand's default, JAVA)
    Py_ssize_t language_len
    bint language_escaped
    const uint8_t* remark       # NULL: absent or null
    Py_ssize_t remark_len
    bint remark_escaped
    uint32_t seen               # one bit per known top-level name
    bint repeated               # a known name twice (JSON keeps the last, as this reader does)
    bint other                  # a name beyond the known ones, or a skipped string with escapes
                                # or non-ASCII bytes (not checked here: the reader declines)
    const uint8_t* body
    Py_ssize_t body_len


cdef inline bint plain_ascii(const uint8_t* p, Py_ssize_t n) noexcept nogil:
    """Printable-range ASCII only (no byte >= 0x80; control bytes cannot occur raw in JSON)."""
    cdef Py_ssize_t i
    for i in range(n):
        if p[i] >= 128:
            return False
    return True


cdef inline bint _literal(Cursor* c, const char* word, Py_ssize_t n) noexcept nogil:
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


cdef inline int _read_ext(Cursor* c, ext_field_fn on_field, void* target) except -1:
    """The extFields object, each entry to on_field: 1 read, 0 declined."""
    cdef const uint8_t* k
    cdef const uint8_t* v
    cdef Py_ssize_t kl, vl
    cdef bint kesc, vesc
    if not expect(c, 123):
        return 0
    skip_ws(c)
    if c.p < c.end and c.p[0] == 125:
        c.p += 1
        return 1
    while True:
        if not scan_str(c, &k, &kl, &kesc):
            return 0
        if not expect(c, 58):
            return 0
        if not scan_str(c, &v, &vl, &vesc):  # values are strings (anything else: the Python codec)
            return 0
        if on_field(target, k, kl, kesc, v, vl, vesc) != 0:
            return 0
        skip_ws(c)
        if c.p < c.end and c.p[0] == 44:
            c.p += 1
            continue
        if c.p < c.end and c.p[0] == 125:
            c.p += 1
            return 1
        return 0


cdef inline int read_json_header(const uint8_t* frame, Py_ssize_t n, JsonHeader* h,
                                 ext_field_fn on_field, void* target) except -1:
    """Read the JSON header of `frame` (the bytes after the length prefix, `n` of them) into `h`,
    each extFields entry to `on_field(target, ...)`: 1 when read, 0 when declined (a binary
    header, a value of a shape not handled, malformed or truncated JSON, no code, trailing bytes;
    a repeated extFields object)."""
    cdef Cursor c
    cdef const uint8_t* key
    cdef const uint8_t* v
    cdef Py_ssize_t klen, vlen, header_length
    cdef bint esc
    cdef uint32_t bit
    if not open_json_header(&c, frame, n):
        return 0
    header_length = c.end - frame - 4
    h.code = h.flag = h.opaque = h.version = 0
    h.has_code = False
    h.language = NULL
    h.language_len = 0
    h.language_escaped = False
    h.remark = NULL
    h.remark_len = 0
    h.remark_escaped = False
    h.seen = 0
    h.repeated = False
    h.other = False
    if not expect(&c, 123):
        return 0
    skip_ws(&c)
    if c.p < c.end and c.p[0] == 125:  # "{}": no code
        return 0
    while True:
        if not scan_str(&c, &key, &klen, &esc) or esc:  # the names are plain
            return 0
        if not expect(&c, 58):
            return 0
        skip_ws(&c)
        if c.p >= c.end:
            return 0
        if key_is(key, klen, "code", 4):
            bit = 1
            h.code = read_int(&c)
            h.has_code = True
        elif key_is(key, klen, "flag", 4):
            bit = 2
            h.flag = read_int(&c)
        elif key_is(key, klen, "opaque", 6):
            bit = 4
            h.opaque = read_int(&c)
        elif key_is(key, klen, "version", 7):
            bit = 8
            h.version = read_int(&c)
        elif key_is(key, klen, "language", 8):
            bit = 16
            if not scan_str(&c, &h.language, &h.language_len, &h.language_escaped):
                return 0
        elif key_is(key, klen, "remark", 6):
            bit = 32
            if c.p[0] == 110:
                _literal(&c, "null", 4)
                h.remark = NULL
            elif not scan_str(&c, &h.remark, &h.remark_len, &h.remark_escaped):
                return 0
        elif key_is(key, klen, "extFields", 9):
            bit = 64
            if h.seen & 64:
                return 0  # two objects: JSON keeps the last, entries already given cannot be taken back
            if c.p[0] == 110:
                _literal(&c, "null", 4)
            elif _read_ext(&c, on_field, target) != 1:
                return 0
        elif key_is(key, klen, "serializeTypeCurrentRPC", 23):
            bit = 128
            if not scan_str(&c, &v, &vlen, &esc):
                return 0
            if esc or not plain_ascii(v, vlen):
                h.other = True
        else:  # a name RocketMQ does not send: skipped, and flagged
            bit = 0
            h.other = True
            if c.p[0] == 34:
                scan_str(&c, &v, &vlen, &esc)
            elif c.p[0] == 110:
                _literal(&c, "null", 4)
            elif c.p[0] == 116:
                _literal(&c, "true", 4)
            elif c.p[0] == 102:
                _literal(&c, "false", 5)
            else:
                read_int(&c)
        if c.bad:
            return 0
        if h.seen & bit:
            h.repeated = True
        h.seen |= bit
        skip_ws(&c)
        if c.p < c.end and c.p[0] == 44:
            c.p += 1
            continue
        if c.p < c.end and c.p[0] == 125:
            c.p += 1
            break
        return 0
    skip_ws(&c)
    if c.p != c.end or not h.has_code:
        return 0
    h.body = frame + 4 + header_length
    h.body_len = n - 4 - header_length
    return 1


cdef inline int _u4(const uint8_t* s) noexcept nogil:
    cdef int v = 0, d, i
    for i in range(4):
        d = hex_digit(s[i])
        if d < 0:
            return -1
        v = (v << 4) | d
    return v


cdef inline Py_ssize_t unescape_json(const uint8_t* s, Py_ssize_t n, uint8_t* out) noexcept nogil:
    """The UTF-8 bytes of the inside of a JSON string (`s`, n bytes, escapes in place): escapes
    decoded, other bytes copied; -1 for a bad escape or a lone surrogate.  `out` has room for n
    bytes (no escape decodes longer than it is written)."""
    cdef Py_ssize_t i = 0, w = 0
    cdef int cp, lo
    cdef uint8_t ch
    while i < n:
        ch = s[i]
        if ch != 92:
            out[w] = ch
            w += 1
            i += 1
            continue
        if i + 1 >= n:
            return -1
        ch = s[i + 1]
        i += 2
        if ch == 34 or ch == 92 or ch == 47:
            out[w] = ch
        elif ch == 98:
            out[w] = 8
        elif ch == 102:
            out[w] = 12
        elif ch == 110:
            out[w] = 10
        elif ch == 114:
            out[w] = 13
        elif ch == 116:
            out[w] = 9
        elif ch == 117:
            if i + 4 > n:
                return -1
            cp = _u4(s + i)
            if cp < 0:
                return -1
            i += 4
            if 0xD800 <= cp <= 0xDBFF:  # a surrogate pair must follow
                if i + 6 > n or s[i] != 92 or s[i + 1] != 117:
                    return -1  # a lone surrogate: Python keeps it, UTF-8 cannot
                lo = _u4(s + i + 2)
                if lo < 0xDC00 or lo > 0xDFFF:
                    return -1
                i += 6
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00)
            elif 0xDC00 <= cp <= 0xDFFF:
                return -1
            if cp < 0x80:
                out[w] = <uint8_t>cp
                w += 1
            elif cp < 0x800:
                out[w] = <uint8_t>(0xC0 | (cp >> 6))
                out[w + 1] = <uint8_t>(0x80 | (cp & 0x3F))
                w += 2
            elif cp < 0x10000:
                out[w] = <uint8_t>(0xE0 | (cp >> 12))
                out[w + 1] = <uint8_t>(0x80 | ((cp >> 6) & 0x3F))
                out[w + 2] = <uint8_t>(0x80 | (cp & 0x3F))
                w += 3
            else:
                out[w] = <uint8_t>(0xF0 | (cp >> 18))
                out[w + 1] = <uint8_t>(0x80 | ((cp >> 12) & 0x3F))
                out[w + 2] = <uint8_t>(0x80 | ((cp >> 6) & 0x3F))
                out[w + 3] = <uint8_t>(0x80 | (cp & 0x3F))
                w += 4
            continue
        else:
            return -1
        w += 1
    return w


cdef inline bint header_int(const uint8_t* s, Py_ssize_t n, int64_t* out) noexcept nogil:
    """A header integer as every native reader takes it: optional '-' and 1..18 ASCII digits
    (anything else — " 7", "+7", "7_0", a huge number — is the Python path's to parse or name)."""
    cdef Py_ssize_t j = 0
    cdef int64_t acc = 0
    cdef bint neg = n > 0 and s[0] == 45
    if neg:
        j = 1
    if n - j < 1 or n - j > 18:
        return False
    while j < n:
        if s[j] < 48 or s[j] > 57:
            return False
        acc = acc * 10 + (s[j] - 48)
        j += 1
    out[0] = -acc if neg else acc
    return True


cdef inline int frame_at(const uint8_t* buf, Py_ssize_t n, Py_ssize_t pos, Py_ssize_t max_frame_length,
                         int64_t* length) noexcept nogil:
    """The remoting framing, for every reader of frames: 1 when a whole frame (a 4-byte big-endian
    length, then that many bytes) starts at buf[pos], 0 when more bytes are needed, -1 when the
    length is outside 4..max_frame_length (the framing is lost; *length names it)."""
    if n - pos < 4:
        return 0
    length[0] = <int32_t>((<uint32_t>buf[pos] << 24) | (<uint32_t>buf[pos + 1] << 16)
                          | (<uint32_t>buf[pos + 2] << 8) | <uint32_t>buf[pos + 3])
    if length[0] < 4 or length[0] > max_frame_length:
        return -1
    if pos + 4 + length[0] > n:
        return 0
    return 1


cdef enum:
    RESPONSE_FLAG = 1  # the flag bit of a response (RemotingCommand's RPC_TYPE)


cdef class SendRequest


@cython.final
cdef class SendHeader:
    cdef bytes _head  # '{"code":310,"extFields":{"a":..,"b":..,"c":..,"d":..,"e":"<qid>","f":"'
    cdef bytes _mid   # '","k":"false","m":"false","n":<broker>'
    cdef bytes _language  # ',"language":"PYTHON","opaque":'
    cdef bytes _tail  # ',"serializeTypeCurrentRPC":"JSON","version":N}'
    cdef bytes _kg, _kh, _ki, _kj, _kl  # '","g":"' ... (or the V1 names)
    cdef tuple _names  # the ext field names a..n (or V1's), by field id 0..13
    # signing (sign_with): field id -> its raw value when constant (14: AccessKey, 15: SecurityToken),
    # the ids in the signed order without / with maxReconsumeTimes (l), the key, the JSON written
    cdef list _raw
    cdef bytes _order, _order_l
    cdef HmacSha1 _sign_key
    cdef bytes _acl_json
    cdef readonly int code
    cdef readonly str topic
    cdef readonly int queue_id
    cdef readonly str broker_name
    cdef readonly str language
    cdef readonly int version
    cdef str _group, _create_topic_key
    cdef int _default_topic_queue_nums
    cdef bint _batch
    cdef tuple _name_strs  # the names as str
    cdef dict _ids         # name -> field id
    cdef object _signer  # the key sign_with prepared this header for (its orders and ACL JSON)

    cdef object _frame(self, sys_flag, flag, properties, message, opaque, body, born_timestamp,
                       reconsume_times, max_reconsume_times, str uniq=*, bint oneway=*, bint sign=*,
                       dict extra=*)
    cdef int _put_signature(self, Out* o, Out* v, Py_ssize_t* start, bint with_l, body) except -1
    cdef int prepare_signer(self, signer) except -1
    cdef SendRequest new_request(self, sys_flag, flag, dict properties, message, str uniq, opaque, body,
                                 reconsume_times, max_reconsume_times, bint oneway)
    cdef str _value(self, int k, SendRequest r)


@cython.final
cdef class SendRequest:
    cdef readonly SendHeader header
    cdef readonly object opaque, body
    cdef object sys_flag, msg_flag, props, reconsume, max_reconsume
    cdef int64_t born
    cdef bint oneway
    cdef object _ext       # the ext_fields view (SendRequestFields), made when first read
    cdef dict _added       # fields the steps added (written after the builder's)
    cdef dict _fields      # every field, when a step changed one of the builder's (then the Python codec writes it)
    cdef readonly object signer  # the step that asked for the frame signed (sign_with)

    cdef tuple _ids(self)
    cdef int _materialize(self) except -1


cpdef object run_send_steps(list before, str addr, SendRequest request)


@cython.final
cdef class SendResponse:
    cdef public object code
    cdef public object flag
    cdef public object opaque
    cdef public object remark
    cdef public object msg_id
    cdef public object queue_id
    cdef public object queue_offset
    cdef public object transaction_id
    cdef public object region_id
