# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The wire side of the broker's gRPC server: HTTP/2 (RFC 9113) as a server speaks it, HPACK
(RFC 7541) and gRPC's length-prefixed messages.  rmq_core/proxy/server.py is its one user.

H2Connection is one connection's codec: `feed(bytes)` parses what the client sent and answers
what HTTP/2 answers by itself (SETTINGS ack, PING ack, WINDOW_UPDATE as received data is taken);
it hands out plain events, each a 3-tuple (kind, stream id, value):

    EV_HEADERS  (sid, {name: value})     a request's headers (a new stream)
    EV_MESSAGE  (sid, bytes)             one whole gRPC message of the stream (prefix removed)
    EV_END      (sid, None)              the client half-closed the stream (END_STREAM)
    EV_RESET    (sid, error code)        the client reset the stream (RST_STREAM)
    EV_REFUSED  (sid, (grpc status, text)) a stream this codec refused (a message over the max size,
                                         a compressed one); answer it with trailers, no handler
    EV_GOAWAY   (last sid, error code)   the client is going away
    EV_ERROR    (error code, text)       a connection error: a GOAWAY naming it is in the output,
                                         close the connection after writing it

The answers go the other way: `send_headers`, `send_message` (DATA, held back while the peer's
stream or connection window is closed and sent as WINDOW_UPDATEs open it), `end_stream` (trailers,
after the stream's held-back data), `reset`; `take_output()` gives the bytes to write.  The header
blocks it sends are HPACK-encoded by `encode_headers` (literals without indexing: the peer's
dynamic table is never used, so its size settings do not matter).

Bytes from the network are untrusted: every read is bounds-checked; a frame breaking the protocol
ends the connection with a GOAWAY whose debug data names the problem.  Priority is ignored.
"""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeLatin1
from libc.stdint cimport int64_t, uint8_t, uint32_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcmp, memcpy

cdef extern from "hpack_huffman.h":
    const unsigned int HUFFMAN_CODES[257]
    const unsigned char HUFFMAN_BITS[257]

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object unicode, Py_ssize_t* size) except NULL

# --- constants ---------------------------------------------------------------------------------
EV_HEADERS, EV_MESSAGE, EV_END, EV_RESET, EV_REFUSED, EV_GOAWAY, EV_ERROR = 1, 2, 3, 4, 5, 6, 7
cdef enum:
    _EV_HEADERS = 1
    _EV_MESSAGE = 2
    _EV_END = 3
    _EV_RESET = 4
    _EV_REFUSED = 5
    _EV_GOAWAY = 6
    _EV_ERROR = 7

cdef enum:  # frame types
    DATA = 0
    HEADERS = 1
    PRIORITY = 2
    RST_STREAM = 3
    SETTINGS = 4
    PUSH_PROMISE = 5
    PING = 6
    GOAWAY = 7
    WINDOW_UPDATE = 8
    CONTINUATION = 9

cdef enum:  # flags
    F_END_STREAM = 0x1
    F_ACK = 0x1
    F_END_HEADERS = 0x4
    F_PADDED = 0x8
    F_PRIORITY = 0x20

# error codes (RFC 9113 §7)
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0, 1, 2, 3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 5, 6, 7, 8, 9
ENHANCE_YOUR_CALM = 11
cdef enum:
    E_NO_ERROR = 0
    E_PROTOCOL = 1
    E_FLOW_CONTROL = 3
    E_STREAM_CLOSED = 5
    E_FRAME_SIZE = 6
    E_COMPRESSION = 9
    E_CALM = 11

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
cdef bytes _PREFACE = PREFACE
cdef int64_t _MAX_WINDOW = 0x7FFFFFFF
cdef Py_ssize_t _MAX_FRAME = 16384  # what this side accepts (SETTINGS_MAX_FRAME_SIZE, the default)
# this side's receive windows: a stream's (SETTINGS_INITIAL_WINDOW_SIZE) and the connection's;
# a WINDOW_UPDATE gives back what was received once half a window is taken
cdef int64_t _STREAM_WINDOW = 1 << 20
cdef int64_t _CONN_WINDOW = 1 << 24
cdef Py_ssize_t _MAX_HEADER_BLOCK = 256 * 1024  # a header block (HEADERS + CONTINUATIONs) larger: ENHANCE_YOUR_CALM
# gRPC status codes this codec answers itself
cdef int _GRPC_INTERNAL = 13
cdef int _GRPC_RESOURCE_EXHAUSTED = 8

# --- HPACK: static table (RFC 7541 Appendix A) ---------------------------------------------------
STATIC_TABLE = (
    (":authority", ""), (":method", "GET"), (":method", "POST"), (":path", "/"), (":path", "/index.html"),
    (":scheme", "http"), (":scheme", "https"), (":status", "200"), (":status", "204"), (":status", "206"),
    (":status", "304"), (":status", "400"), (":status", "404"), (":status", "500"), ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"), ("accept-language", ""), ("accept-ranges", ""), ("accept", ""),
    ("access-control-allow-origin", ""), ("age", ""), ("allow", ""), ("authorization", ""),
    ("cache-control", ""), ("content-disposition", ""), ("content-encoding", ""), ("content-language", ""),
    ("content-length", ""), ("content-location", ""), ("content-range", ""), ("content-type", ""),
    ("cookie", ""), ("date", ""), ("etag", ""), ("expect", ""), ("expires", ""), ("from", ""), ("host", ""),
    ("if-match", ""), ("if-modified-since", ""), ("if-none-match", ""), ("if-range", ""),
    ("if-unmodified-since", ""), ("last-modified", ""), ("link", ""), ("location", ""), ("max-forwards", ""),
    ("proxy-authenticate", ""), ("proxy-authorization", ""), ("range", ""), ("referer", ""), ("refresh", ""),
    ("retry-after", ""), ("server", ""), ("set-cookie", ""), ("strict-transport-security", ""),
    ("transfer-encoding", ""), ("user-agent", ""), ("vary", ""), ("via", ""), ("www-authenticate", ""),
)
cdef tuple _STATIC = STATIC_TABLE
cdef dict _STATIC_PAIR = {}
cdef dict _STATIC_NAME = {}
for _i in range(len(STATIC_TABLE) - 1, -1, -1):  # (the lowest index wins)
    _STATIC_PAIR[STATIC_TABLE[_i]] = _i + 1
    _STATIC_NAME[STATIC_TABLE[_i][0]] = _i + 1


# --- HPACK: Huffman decoding, a 4-bit state machine built from the code table ----------------------
cdef short _tree[512][2]  # internal nodes; a child >= 0 is a node, < 0 is -(symbol + 1)
cdef short _fsm_next[256 * 16]
cdef short _fsm_sym[256 * 16]  # the symbol completed on this nibble, -1 none, -2 EOS (an error)
cdef bint _fsm_accept[256]  # may the string end here (padding: < 8 bits, a prefix of EOS)


cdef void _build_huffman():
    cdef int nodes = 1, sym, bit, node, b, c, n, v, cur, s
    for n in range(512):
        _tree[n][0] = 0
        _tree[n][1] = 0
    for sym in range(257):
        node = 0
        for bit in range(HUFFMAN_BITS[sym] - 1, -1, -1):
            b = (HUFFMAN_CODES[sym] >> bit) & 1
            if bit == 0:
                _tree[node][b] = -(sym + 1)
            else:
                if _tree[node][b] == 0:
                    _tree[node][b] = nodes
                    nodes += 1
                node = _tree[node][b]
    for n in range(256):
        _fsm_accept[n] = False
        for v in range(16):
            cur = n
            s = -1
            for bit in range(3, -1, -1):
                c = _tree[cur][(v >> bit) & 1]
                if c < 0:
                    s = -2 if -c - 1 == 256 else -c - 1
                    cur = 0
                    if s == -2:
                        break
                else:
                    cur = c
            _fsm_next[n * 16 + v] = cur
            _fsm_sym[n * 16 + v] = s
    node = 0
    for bit in range(8):  # the all-ones path: up to 7 bits of EOS's prefix
        _fsm_accept[node] = True
        node = _tree[node][1]
        if node <= 0:
            break


_build_huffman()


cdef object _huffman_decode(const uint8_t* p, Py_ssize_t n):
    """The decoded octets as bytes, None when the code is invalid (EOS, bad padding)."""
    cdef uint8_t* out = <uint8_t*> malloc(n * 8 // 5 + 1)
    cdef Py_ssize_t i, k = 0
    cdef int cur = 0, idx, s
    if out == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            idx = cur * 16 + (p[i] >> 4)
            s = _fsm_sym[idx]
            if s == -2:
                return None
            if s >= 0:
                out[k] = <uint8_t> s
                k += 1
            cur = _fsm_next[idx]
            idx = cur * 16 + (p[i] & 0xF)
            s = _fsm_sym[idx]
            if s == -2:
                return None
            if s >= 0:
                out[k] = <uint8_t> s
                k += 1
            cur = _fsm_next[idx]
        if not _fsm_accept[cur]:
            return None
        return PyBytes_FromStringAndSize(<char*> out, k)
    finally:
        free(out)


def huffman_decode(data: bytes) -> bytes:
    """RFC 7541 §5.2's Huffman code decoded; ValueError for an invalid one."""
    r = _huffman_decode(<const uint8_t*> PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))
    if r is None:
        raise ValueError(f"invalid HPACK Huffman string {data!r} (EOS or bad padding)")
    return r


class HpackError(ValueError):
    """A header block this decoder cannot decode (HTTP/2's COMPRESSION_ERROR)."""


# --- HPACK decoder -----------------------------------------------------------------------------
cdef class HpackDecoder:
    """One direction's HPACK decoding context: the dynamic table and its size limit.
    `max_table_size` is what this side announced (SETTINGS_HEADER_TABLE_SIZE; 4096 by default)."""
    cdef list _dyn  # newest first: (name, value, size)
    cdef Py_ssize_t _size, _max, _limit

    def __init__(self, Py_ssize_t max_table_size=4096):
        self._dyn = []
        self._size = 0
        self._max = self._limit = max_table_size

    @property
    def table(self):
        """The dynamic table, newest first, as (name, value)."""
        return [(e[0], e[1]) for e in self._dyn]

    @property
    def size(self):
        return self._size

    def decode(self, data: bytes) -> list:
        """The header list of one complete header block; HpackError names what is wrong."""
        out = []
        self._decode(<const uint8_t*> PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data), out, None)
        return out

    cdef int _evict(self) except -1:
        while self._size > self._max and self._dyn:
            self._size -= (<tuple> self._dyn.pop())[2]
        return 0

    cdef object _string(self, const uint8_t* p, Py_ssize_t n, Py_ssize_t* pos):
        cdef Py_ssize_t length, start
        cdef bint huff
        if pos[0] >= n:
            raise HpackError("header block ends inside a string")
        huff = p[pos[0]] & 0x80
        length = _read_int(p, n, pos, 7)
        start = pos[0]
        if length > n - start:
            raise HpackError(f"string length {length} runs past the header block ({n - start} bytes left)")
        pos[0] = start + length
        if huff:
            b = _huffman_decode(p + start, length)
            if b is None:
                raise HpackError("invalid Huffman-coded string (EOS or bad padding)")
            return PyUnicode_DecodeLatin1(PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b), NULL)
        return PyUnicode_DecodeLatin1(<const char*> (p + start), length, NULL)

    cdef tuple _entry(self, Py_ssize_t index):
        cdef Py_ssize_t d
        if index <= 0:
            raise HpackError("header index 0")
        if index <= 61:
            return <tuple> _STATIC[index - 1]
        d = index - 62
        if d >= len(self._dyn):
            raise HpackError(f"header index {index} is past the dynamic table ({len(self._dyn)} entries)")
        return <tuple> self._dyn[d]

    cdef int _decode(self, const uint8_t* p, Py_ssize_t n, list out, dict into) except -1:
        """Decode into `out` (a list of (name, value)) or `into` (a dict, the last value of a name wins)."""
        cdef Py_ssize_t pos = 0, index, size
        cdef uint8_t b
        cdef bint first = True
        cdef tuple e
        while pos < n:
            b = p[pos]
            if b & 0x80:  # indexed header field
                e = self._entry(_read_int(p, n, &pos, 7))
                name, value = e[0], e[1]
            elif b & 0xE0 == 0x20:  # dynamic table size update (only at the start of a block)
                if not first:
                    raise HpackError("dynamic table size update after a header field")
                size = _read_int(p, n, &pos, 5)
                if size > self._limit:
                    raise HpackError(f"dynamic table size update to {size} exceeds the announced {self._limit}")
                self._max = size
                self._evict()
                continue
            else:
                # literal: with incremental indexing (01), without indexing (0000), never indexed (0001)
                index = _read_int(p, n, &pos, 6 if b & 0x40 else 4)
                if index:
                    name = self._entry(index)[0]
                else:
                    name = self._string(p, n, &pos)
                value = self._string(p, n, &pos)
                if b & 0x40:
                    size = len(<str> name) + len(<str> value) + 32  # (latin-1: one char per octet)
                    if size > self._max:
                        self._dyn.clear()
                        self._size = 0
                    else:
                        self._dyn.insert(0, (name, value, size))
                        self._size += size
                        self._evict()
            first = False
            if into is not None:
                into[name] = value
            else:
                out.append((name, value))
        return 0


cdef Py_ssize_t _read_int(const uint8_t* p, Py_ssize_t n, Py_ssize_t* pos, int prefix) except -1:
    """RFC 7541 §5.1's integer with an N-bit prefix, starting at p[pos]."""
    cdef Py_ssize_t i = pos[0]
    cdef Py_ssize_t mask = (1 << prefix) - 1
    cdef Py_ssize_t value = p[i] & mask
    cdef int shift = 0
    i += 1
    if value == mask:
        while True:
            if i >= n:
                raise HpackError("header block ends inside an integer")
            if shift > 28:
                raise HpackError("HPACK integer too large")
            value += (p[i] & 0x7F) << shift
            shift += 7
            i += 1
            if not p[i - 1] & 0x80:
                break
    pos[0] = i
    return value


# --- HPACK encoder -------------------------------------------------------------------------------
cdef void _put_int(bytearray out, Py_ssize_t value, int prefix, uint8_t first):
    cdef Py_ssize_t mask = (1 << prefix) - 1
    if value < mask:
        out.append(first | value)
        return
    out.append(first | mask)
    value -= mask
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


cdef void _put_str(bytearray out, str s):
    cdef bytes b = s.encode("utf-8")
    _put_int(out, len(b), 7, 0)
    out += b


def encode_headers(headers) -> bytes:
    """An HPACK header block of (name, value) str pairs: a static table match indexed, the rest
    literals without indexing (plain, not Huffman-coded)."""
    cdef bytearray out = bytearray()
    for name, value in headers:
        i = _STATIC_PAIR.get((name, value))
        if i is not None:
            _put_int(out, i, 7, 0x80)
            continue
        i = _STATIC_NAME.get(name)
        if i is not None:
            _put_int(out, i, 4, 0)
        else:
            out.append(0)
            _put_str(out, name)
        _put_str(out, value)
    return bytes(out)


# --- gRPC -------------------------------------------------------------------------------------------
def grpc_message(payload: bytes) -> bytes:
    """One gRPC length-prefixed message (not compressed)."""
    cdef Py_ssize_t n = len(payload)
    return bytes((0, (n >> 24) & 0xFF, (n >> 16) & 0xFF, (n >> 8) & 0xFF, n & 0xFF)) + payload


def percent_encode(str text) -> str:
    """grpc-message's encoding: UTF-8, every octet outside printable ASCII and '%' as %XX."""
    cdef bytes b = text.encode("utf-8", "replace")
    cdef const uint8_t* p = <const uint8_t*> PyBytes_AS_STRING(b)
    cdef Py_ssize_t i, n = len(b)
    for i in range(n):
        if p[i] < 0x20 or p[i] > 0x7E or p[i] == 0x25:
            break
    else:
        return text
    parts = []
    for i in range(n):
        if p[i] < 0x20 or p[i] > 0x7E or p[i] == 0x25:
            parts.append("%%%02X" % p[i])
        else:
            parts.append(chr(p[i]))
    return "".join(parts)


def grpc_timeout(str value) -> float:
    """grpc-timeout (1-8 digits and a unit: H M S m u n) in seconds; ValueError names a bad one."""
    cdef Py_ssize_t i, n = len(value)
    cdef int64_t digits = 0
    cdef Py_UCS4 c, unit
    cdef double scale
    if 2 <= n <= 9:
        for i in range(n - 1):
            c = value[i]
            if not (48 <= <int> c <= 57):  # ('0'..'9')
                break
            digits = digits * 10 + (<int> c - 48)
        else:
            unit = value[n - 1]
            scale = (3600.0 if unit == u'H' else 60.0 if unit == u'M' else 1.0 if unit == u'S' else
                     1e-3 if unit == u'm' else 1e-6 if unit == u'u' else 1e-9 if unit == u'n' else -1.0)
            if scale > 0:
                return digits * scale
    raise ValueError(f"bad grpc-timeout {value!r} (1-8 digits and a unit of H M S m u n)")


# --- HTTP/2 connection ---------------------------------------------------------------------------
cdef class _Stream:
    cdef int64_t send_window
    cdef int64_t recv_taken  # received and not yet given back by a WINDOW_UPDATE
    cdef bint remote_closed
    cdef bint refused  # its data is dropped (EV_REFUSED was given)
    cdef bytearray buf  # a partial gRPC message
    cdef list pending  # DATA held back by flow control: [bytes, offset] ...
    cdef object trailers  # a header block to send (END_STREAM) after pending; None
    cdef bint queued  # in the connection's list of streams with held-back data

    def __cinit__(self):
        self.buf = None
        self.pending = None
        self.trailers = None


cdef inline void _frame_header(bytearray out, Py_ssize_t length, int ftype, int flags, uint32_t sid):
    cdef uint8_t h[9]
    h[0] = (length >> 16) & 0xFF
    h[1] = (length >> 8) & 0xFF
    h[2] = length & 0xFF
    h[3] = ftype
    h[4] = flags
    h[5] = (sid >> 24) & 0x7F
    h[6] = (sid >> 16) & 0xFF
    h[7] = (sid >> 8) & 0xFF
    h[8] = sid & 0xFF
    out += (<char*> h)[:9]


cdef inline bytes _be32(uint32_t v):
    cdef uint8_t b[4]
    b[0] = (v >> 24) & 0xFF
    b[1] = (v >> 16) & 0xFF
    b[2] = (v >> 8) & 0xFF
    b[3] = v & 0xFF
    return PyBytes_FromStringAndSize(<char*> b, 4)


cdef inline uint32_t _u32(const uint8_t* p):
    return (<uint32_t> p[0] << 24) | (<uint32_t> p[1] << 16) | (<uint32_t> p[2] << 8) | p[3]


class _ConnectionError(Exception):
    pass


cdef class H2Connection:
    """One server-side HTTP/2 connection's codec (see the module).  `max_message` bounds one
    received gRPC message (larger: the stream is refused with RESOURCE_EXHAUSTED)."""
    cdef bytearray _in
    cdef bytearray _out
    cdef bint _preface_seen, _settings_seen, _closed
    cdef dict _streams
    cdef list _blocked  # stream ids with held-back DATA, in order
    cdef uint32_t _last_sid
    cdef int64_t _send_window, _recv_taken
    cdef int64_t _peer_initial_window
    cdef Py_ssize_t _peer_max_frame
    cdef Py_ssize_t _max_message
    cdef HpackDecoder _hpack
    cdef uint32_t _cont_sid  # a header block continues on this stream (0: none)
    cdef int _cont_flags
    cdef bytearray _cont_buf

    def __init__(self, Py_ssize_t max_message=4 * 1024 * 1024):
        self._in = bytearray()
        self._out = bytearray()
        self._streams = {}
        self._blocked = []
        self._send_window = 65535
        self._peer_initial_window = 65535
        self._peer_max_frame = 16384
        self._max_message = max_message
        self._hpack = HpackDecoder(4096)
        self._cont_buf = bytearray()
        # the server's preface: its SETTINGS, and the connection's receive window opened up
        _frame_header(self._out, 12, SETTINGS, 0, 0)
        self._out += bytes((0, 4)) + _be32(_STREAM_WINDOW)  # INITIAL_WINDOW_SIZE
        self._out += bytes((0, 5)) + _be32(_MAX_FRAME)  # MAX_FRAME_SIZE
        _frame_header(self._out, 4, WINDOW_UPDATE, 0, 0)
        self._out += _be32((_CONN_WINDOW - 65535))
        self._recv_taken = 0  # (received since the last WINDOW_UPDATE; the window is _CONN_WINDOW)

    @property
    def last_stream_id(self):
        return self._last_sid

    @property
    def open_streams(self):
        return len(self._streams)

    def take_output(self):
        """The bytes to write (None: nothing)."""
        if not self._out:
            return None
        b = bytes(self._out)
        self._out.clear()
        return b

    # --- input ---------------------------------------------------------------------------------
    def feed(self, data) -> list:
        """Parse received bytes; the events (see the module).  After an EV_ERROR the connection
        takes nothing more."""
        cdef list events = []
        cdef const uint8_t* p
        cdef Py_ssize_t n, pos = 0, length
        cdef bytes buf
        if self._closed:
            return events
        if self._in:
            self._in += data
            buf = bytes(self._in)
            self._in.clear()
        else:
            buf = bytes(data) if type(data) is not bytes else data
        p = <const uint8_t*> PyBytes_AS_STRING(buf)
        n = PyBytes_GET_SIZE(buf)
        try:
            if not self._preface_seen:
                length = min(n, 24)
                if memcmp(p, PyBytes_AS_STRING(_PREFACE), length) != 0:
                    raise _ConnectionError(E_PROTOCOL, f"bad connection preface {buf[:24]!r}: not HTTP/2 "
                                           f"(a gRPC client speaks HTTP/2 with prior knowledge)")
                if n < 24:
                    self._in += buf
                    return events
                self._preface_seen = True
                pos = 24
            while n - pos >= 9:
                length = (p[pos] << 16) | (p[pos + 1] << 8) | p[pos + 2]
                if length > _MAX_FRAME:
                    raise _ConnectionError(E_FRAME_SIZE, f"frame of {length} bytes (type {p[pos + 3]}) exceeds "
                                           f"SETTINGS_MAX_FRAME_SIZE {_MAX_FRAME}")
                if n - pos - 9 < length:
                    break
                self._frame(p[pos + 3], p[pos + 4], _u32(p + pos + 5) & 0x7FFFFFFF, p + pos + 9, length, events)
                pos += 9 + length
        except _ConnectionError as e:
            self.goaway(e.args[0], e.args[1])
            self._closed = True
            events.append((_EV_ERROR, e.args[0], e.args[1]))
            return events
        except HpackError as e:
            self.goaway(E_COMPRESSION, f"header block: {e}")
            self._closed = True
            events.append((_EV_ERROR, E_COMPRESSION, f"header block: {e}"))
            return events
        if pos < n:
            self._in += buf[pos:]
        return events

    cdef int _frame(self, int ftype, int flags, uint32_t sid, const uint8_t* p, Py_ssize_t n, list events) except -1:
        cdef Py_ssize_t pad = 0
        cdef _Stream s
        if not self._settings_seen:
            if ftype != SETTINGS or flags & F_ACK:
                raise _ConnectionError(E_PROTOCOL, f"the client's first frame is type {ftype}, not SETTINGS")
            self._settings_seen = True
        if self._cont_sid and ftype != CONTINUATION:
            raise _ConnectionError(E_PROTOCOL, f"frame type {ftype} inside the header block of stream "
                                   f"{self._cont_sid} (CONTINUATION expected)")
        if ftype == DATA:
            if sid == 0:
                raise _ConnectionError(E_PROTOCOL, "DATA on stream 0")
            if flags & F_PADDED:
                if n < 1 or p[0] >= n:
                    raise _ConnectionError(E_PROTOCOL, f"DATA of stream {sid}: padding {p[0] if n else -1} "
                                           f"does not fit its {n} bytes")
                pad = p[0]
            if flags & F_PADDED:
                self._data(sid, flags, p + 1, n - 1 - pad, n, events)
            else:
                self._data(sid, flags, p, n, n, events)
        elif ftype == HEADERS:
            if sid == 0 or not sid & 1:
                raise _ConnectionError(E_PROTOCOL, f"HEADERS on stream {sid} (a client's streams are odd, not 0)")
            if flags & F_PADDED:
                if n < 1:
                    raise _ConnectionError(E_PROTOCOL, f"HEADERS of stream {sid}: PADDED without a pad length")
                pad = p[0]
                p += 1
                n -= 1
                if pad > n:
                    raise _ConnectionError(E_PROTOCOL, f"HEADERS of stream {sid}: padding {pad} exceeds the frame")
                n -= pad
            if flags & F_PRIORITY:  # (ignored)
                if n < 5:
                    raise _ConnectionError(E_FRAME_SIZE, f"HEADERS of stream {sid}: PRIORITY fields cut short")
                p += 5
                n -= 5
            if flags & F_END_HEADERS:
                self._headers(sid, flags, p, n, events)
            else:
                self._cont_sid = sid
                self._cont_flags = flags
                self._cont_buf.clear()
                self._cont_buf += (<char*> p)[:n]
        elif ftype == CONTINUATION:
            if not self._cont_sid or sid != self._cont_sid:
                raise _ConnectionError(E_PROTOCOL, f"CONTINUATION on stream {sid} without a header block open")
            self._cont_buf += (<char*> p)[:n]
            if len(self._cont_buf) > _MAX_HEADER_BLOCK:
                raise _ConnectionError(E_CALM, f"header block of stream {sid} exceeds {_MAX_HEADER_BLOCK} bytes")
            if flags & F_END_HEADERS:
                block = bytes(self._cont_buf)
                self._cont_buf.clear()
                self._cont_sid = 0
                self._headers(sid, self._cont_flags, <const uint8_t*> PyBytes_AS_STRING(block), len(block), events)
        elif ftype == SETTINGS:
            if sid != 0:
                raise _ConnectionError(E_PROTOCOL, f"SETTINGS on stream {sid}")
            if flags & F_ACK:
                if n:
                    raise _ConnectionError(E_FRAME_SIZE, f"SETTINGS ack with {n} bytes of payload")
                return 0
            if n % 6:
                raise _ConnectionError(E_FRAME_SIZE, f"SETTINGS of {n} bytes (not a multiple of 6)")
            self._settings(p, n)
            _frame_header(self._out, 0, SETTINGS, F_ACK, 0)
        elif ftype == WINDOW_UPDATE:
            if n != 4:
                raise _ConnectionError(E_FRAME_SIZE, f"WINDOW_UPDATE of {n} bytes on stream {sid}")
            self._window_update(sid, _u32(p) & 0x7FFFFFFF)
        elif ftype == PING:
            if n != 8 or sid != 0:
                raise _ConnectionError(E_FRAME_SIZE if n != 8 else E_PROTOCOL, f"PING of {n} bytes on stream {sid}")
            if not flags & F_ACK:
                _frame_header(self._out, 8, PING, F_ACK, 0)
                self._out += (<char*> p)[:8]
        elif ftype == RST_STREAM:
            if n != 4 or sid == 0:
                raise _ConnectionError(E_FRAME_SIZE if n != 4 else E_PROTOCOL, f"RST_STREAM of {n} bytes on stream {sid}")
            if sid > self._last_sid:
                raise _ConnectionError(E_PROTOCOL, f"RST_STREAM on idle stream {sid}")
            if self._streams.pop(sid, None) is not None:
                events.append((_EV_RESET, sid, _u32(p)))
        elif ftype == PRIORITY:
            if n != 5:
                raise _ConnectionError(E_FRAME_SIZE, f"PRIORITY of {n} bytes on stream {sid}")
        elif ftype == GOAWAY:
            if n < 8 or sid != 0:
                raise _ConnectionError(E_PROTOCOL, f"GOAWAY of {n} bytes on stream {sid}")
            events.append((_EV_GOAWAY, _u32(p) & 0x7FFFFFFF, _u32(p + 4)))
        elif ftype == PUSH_PROMISE:
            raise _ConnectionError(E_PROTOCOL, "PUSH_PROMISE from a client")
        return 0  # (unknown frame types are ignored)

    cdef int _settings(self, const uint8_t* p, Py_ssize_t n) except -1:
        cdef Py_ssize_t i
        cdef int ident
        cdef int64_t value, delta
        cdef _Stream s
        for i in range(0, n, 6):
            ident = (p[i] << 8) | p[i + 1]
            value = _u32(p + i + 2)
            if ident == 2 and value > 1:
                raise _ConnectionError(E_PROTOCOL, f"SETTINGS_ENABLE_PUSH {value} (0 or 1)")
            elif ident == 4:
                if value > _MAX_WINDOW:
                    raise _ConnectionError(E_FLOW_CONTROL, f"SETTINGS_INITIAL_WINDOW_SIZE {value} exceeds 2^31-1")
                delta = value - self._peer_initial_window
                self._peer_initial_window = value
                for s in self._streams.values():
                    s.send_window += delta
                    if s.send_window > _MAX_WINDOW:
                        raise _ConnectionError(E_FLOW_CONTROL, f"SETTINGS_INITIAL_WINDOW_SIZE {value} overflows a stream's window")
            elif ident == 5:
                if not 16384 <= value <= 16777215:
                    raise _ConnectionError(E_PROTOCOL, f"SETTINGS_MAX_FRAME_SIZE {value} out of [16384, 16777215]")
                self._peer_max_frame = value
        self._flush()
        return 0

    cdef int _window_update(self, uint32_t sid, int64_t inc) except -1:
        cdef _Stream s
        if sid == 0:
            if inc == 0:
                raise _ConnectionError(E_PROTOCOL, "WINDOW_UPDATE of 0 on the connection")
            self._send_window += inc
            if self._send_window > _MAX_WINDOW:
                raise _ConnectionError(E_FLOW_CONTROL, f"WINDOW_UPDATE of {inc} overflows the connection's window")
        else:
            s = self._streams.get(sid)
            if s is None:
                if sid > self._last_sid:
                    raise _ConnectionError(E_PROTOCOL, f"WINDOW_UPDATE on idle stream {sid}")
                return 0
            if inc == 0:
                self._stream_error(sid, E_PROTOCOL)
                return 0
            s.send_window += inc
            if s.send_window > _MAX_WINDOW:
                self._stream_error(sid, E_FLOW_CONTROL)
                return 0
        if self._blocked:
            self._flush()
        return 0

    cdef void _stream_error(self, uint32_t sid, int code):
        self._streams.pop(sid, None)
        _frame_header(self._out, 4, RST_STREAM, 0, sid)
        self._out += _be32(code)

    cdef int _headers(self, uint32_t sid, int flags, const uint8_t* p, Py_ssize_t n, list events) except -1:
        cdef dict headers = {}
        cdef _Stream s
        self._hpack._decode(p, n, None, headers)  # (always: the dynamic table must stay in step)
        s = self._streams.get(sid)
        if s is not None:  # trailers from the client: they end its side
            if not flags & F_END_STREAM:
                raise _ConnectionError(E_PROTOCOL, f"second HEADERS on stream {sid} without END_STREAM")
            if not s.remote_closed:
                s.remote_closed = True
                events.append((_EV_END, sid, None))
            return 0
        if sid <= self._last_sid:
            raise _ConnectionError(E_STREAM_CLOSED, f"HEADERS on closed stream {sid}")
        self._last_sid = sid
        s = _Stream()
        s.send_window = self._peer_initial_window
        self._streams[sid] = s
        events.append((_EV_HEADERS, sid, headers))
        if flags & F_END_STREAM:
            s.remote_closed = True
            events.append((_EV_END, sid, None))
        return 0

    cdef int _data(self, uint32_t sid, int flags, const uint8_t* p, Py_ssize_t n, Py_ssize_t frame_len,
                   list events) except -1:
        cdef _Stream s = self._streams.get(sid)
        cdef Py_ssize_t pos, length, have
        # the connection's window counts every DATA frame (padding too), whatever its stream
        self._recv_taken += frame_len
        if self._recv_taken > _CONN_WINDOW:
            raise _ConnectionError(E_FLOW_CONTROL, f"DATA beyond the connection's receive window ({_CONN_WINDOW})")
        if self._recv_taken >= _CONN_WINDOW // 2:
            _frame_header(self._out, 4, WINDOW_UPDATE, 0, 0)
            self._out += _be32(self._recv_taken)
            self._recv_taken = 0
        if s is None:
            if sid > self._last_sid:
                raise _ConnectionError(E_PROTOCOL, f"DATA on idle stream {sid}")
            return 0  # (a stream this side ended or reset: dropped)
        if s.remote_closed:
            self._stream_error(sid, E_STREAM_CLOSED)
            return 0
        s.recv_taken += frame_len
        if s.recv_taken > _STREAM_WINDOW:
            self._stream_error(sid, E_FLOW_CONTROL)
            events.append((_EV_RESET, sid, E_FLOW_CONTROL))
            return 0
        if flags & F_END_STREAM:
            s.remote_closed = True
        elif s.recv_taken >= _STREAM_WINDOW // 2:
            _frame_header(self._out, 4, WINDOW_UPDATE, 0, sid)
            self._out += _be32(s.recv_taken)
            s.recv_taken = 0
        if not s.refused and n:
            if s.buf is None and n >= 5 and p[0] == 0 and <Py_ssize_t> _u32(p + 1) == n - 5:
                # the common case: one whole message in one frame
                events.append((_EV_MESSAGE, sid, PyBytes_FromStringAndSize(<const char*> (p + 5), n - 5)))
            else:
                if s.buf is None:
                    s.buf = bytearray()
                s.buf += (<const char*> p)[:n]
                self._messages(sid, s, events)
        if flags & F_END_STREAM:
            if not s.refused and s.buf:
                s.refused = True
                events.append((_EV_REFUSED, sid, (_GRPC_INTERNAL, f"the stream ended inside a gRPC message "
                                                  f"({len(s.buf)} bytes of it)")))
            events.append((_EV_END, sid, None))
        return 0

    cdef int _messages(self, uint32_t sid, _Stream s, list events) except -1:
        cdef bytearray buf = s.buf
        cdef Py_ssize_t length, have = len(buf)
        cdef const uint8_t* p
        while have >= 5:
            p = <const uint8_t*> (<char*> buf)
            length = _u32(p + 1)
            if p[0] & 1:
                s.refused = True
                s.buf = None
                events.append((_EV_REFUSED, sid, (_GRPC_INTERNAL, "a compressed gRPC message: rmq's gRPC server "
                                                  "takes uncompressed messages only (no grpc-encoding)")))
                return 0
            if length > self._max_message:
                s.refused = True
                s.buf = None
                events.append((_EV_REFUSED, sid, (_GRPC_RESOURCE_EXHAUSTED, f"received message larger than "
                                                  f"max ({length} vs. {self._max_message})")))
                return 0
            if have - 5 < length:
                return 0
            events.append((_EV_MESSAGE, sid, bytes(buf[5:5 + length])))
            del buf[:5 + length]
            have = len(buf)
        if not have:
            s.buf = None
        return 0

    # --- output --------------------------------------------------------------------------------
    cdef void _header_frames(self, uint32_t sid, bytes block, bint end_stream):
        cdef Py_ssize_t n = len(block), pos = 0, chunk
        cdef int flags = F_END_STREAM if end_stream else 0
        chunk = min(n, self._peer_max_frame)
        _frame_header(self._out, chunk, HEADERS, flags | (F_END_HEADERS if chunk == n else 0), sid)
        self._out += block[:chunk] if chunk < n else block
        pos = chunk
        while pos < n:
            chunk = min(n - pos, self._peer_max_frame)
            _frame_header(self._out, chunk, CONTINUATION, F_END_HEADERS if pos + chunk == n else 0, sid)
            self._out += block[pos:pos + chunk]
            pos += chunk

    def send_headers(self, uint32_t sid, bytes block):
        """A response's headers (not END_STREAM)."""
        if sid in self._streams:
            self._header_frames(sid, block, False)

    def send_message(self, uint32_t sid, bytes payload):
        """One gRPC message on the stream: sent as far as the windows allow, the rest held back."""
        cdef _Stream s = self._streams.get(sid)
        cdef Py_ssize_t n = len(payload)
        cdef uint8_t prefix[5]
        if s is None:
            return
        if s.pending is None and n + 5 <= self._peer_max_frame and n + 5 <= s.send_window and \
                n + 5 <= self._send_window:
            prefix[0] = 0
            prefix[1] = (n >> 24) & 0xFF
            prefix[2] = (n >> 16) & 0xFF
            prefix[3] = (n >> 8) & 0xFF
            prefix[4] = n & 0xFF
            _frame_header(self._out, n + 5, DATA, 0, sid)
            self._out += (<char*> prefix)[:5]
            self._out += payload
            s.send_window -= n + 5
            self._send_window -= n + 5
            return
        if s.pending is None:
            s.pending = []
        s.pending.append([grpc_message(payload), 0])
        if not s.queued:
            s.queued = True
            self._blocked.append(sid)
        self._flush()

    def end_stream(self, uint32_t sid, bytes trailers):
        """The stream's trailers (END_STREAM), after its held-back DATA; a client still sending is
        then told by RST_STREAM(NO_ERROR) that no more is read."""
        cdef _Stream s = self._streams.get(sid)
        if s is None:
            return
        if s.pending:
            s.trailers = trailers
            return
        self._finish(sid, s, trailers)

    def respond(self, uint32_t sid, bytes headers, bytes payload, bytes trailers):
        """A unary answer: headers, one message, trailers."""
        if sid not in self._streams:
            return
        self._header_frames(sid, headers, False)
        self.send_message(sid, payload)
        self.end_stream(sid, trailers)

    cdef void _finish(self, uint32_t sid, _Stream s, bytes trailers):
        self._header_frames(sid, trailers, True)
        del self._streams[sid]
        if not s.remote_closed:
            _frame_header(self._out, 4, RST_STREAM, 0, sid)
            self._out += b"\0\0\0\0"

    def reset(self, uint32_t sid, int code=8):
        """RST_STREAM (CANCEL by default)."""
        if self._streams.pop(sid, None) is not None:
            _frame_header(self._out, 4, RST_STREAM, 0, sid)
            self._out += _be32(code)

    def goaway(self, int code=0, str debug=""):
        """GOAWAY naming the last stream this side took and, in its debug data, why."""
        cdef bytes d = debug.encode("utf-8", "replace")[:1024]
        _frame_header(self._out, 8 + len(d), GOAWAY, 0, 0)
        self._out += _be32(self._last_sid) + _be32(code) + d

    cdef void _flush(self):
        """Send held-back DATA as the windows allow, in the order it was held back."""
        cdef _Stream s
        cdef list still = []
        cdef Py_ssize_t chunk, off, n
        cdef bytes data
        for sid in self._blocked:
            s = self._streams.get(sid)
            if s is None:
                continue
            while s.pending and self._send_window > 0 and s.send_window > 0:
                item = s.pending[0]
                data = item[0]
                off = item[1]
                n = len(data) - off
                chunk = min(n, self._peer_max_frame, s.send_window, self._send_window)
                _frame_header(self._out, chunk, DATA, 0, sid)
                self._out += data[off:off + chunk]
                s.send_window -= chunk
                self._send_window -= chunk
                if chunk == n:
                    s.pending.pop(0)
                else:
                    item[1] = off + chunk
            if s.pending:
                still.append(sid)
            else:
                s.pending = None
                s.queued = False
                if s.trailers is not None:
                    trailers, s.trailers = s.trailers, None
                    self._finish(sid, s, trailers)
        self._blocked = still
