# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The message record, the one owner of its format: decoding (the client's hot path, PULL bodies ->
MessageExt), properties (the one encoder, the one lookup: the last pair of a name wins), batch
bodies, the store's record encoders (one message, a batch's items) and the recovery scan.

The layout is docs/protocol.md §5 (the record) and §5.5 (batch bodies); its constants and field
offsets are record_layout.pxd's, the one definition, cimported here and by every other native reader.

The pure-Python twin of every routine here lives in tests/codec_oracle.py, the oracle of the
property tests.  Bytes from the network are untrusted: every length is checked against the bytes
that are really there before anything is read.
"""
cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.dict cimport PyDict_Copy, PyDict_GetItem, PyDict_Next, PyDict_SetItem
from cpython.list cimport PyList_Append
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.object cimport PyObject
from cpython.ref cimport Py_DECREF, Py_INCREF
from cpython.tuple cimport PyTuple_GET_ITEM
from cpython.unicode cimport PyUnicode_AsUTF8String, PyUnicode_DecodeUTF8
from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free
from libc.string cimport memchr, memcmp, memcpy, memset

import socket as _socket


cdef extern from "Python.h":
    # For ASCII strings the character data is the UTF-8 bytes, so a cached str can be compared
    # with raw bytes by memcmp.
    bint PyUnicode_IS_ASCII(object o)
    void* PyUnicode_DATA(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)
    int PyUnicode_KIND(object o)
    Py_UCS4 PyUnicode_READ(int kind, void* data, Py_ssize_t index)
    const char* PyUnicode_AsUTF8AndSize(object o, Py_ssize_t* size) except NULL
    bint PyUnicode_CheckExact(object o)
    object PyIter_Next(object o)
    str PyUnicode_New(Py_ssize_t size, Py_UCS4 maxchar)
    void PyObject_GC_UnTrack(object o)

# --- the layout's constants: record_layout.pxd -----------------------------------------------------
from record_layout cimport (BATCH_ITEM_FIXED, BLANK_MAGIC_CODE, BODY_CRC_AT, BORN_HOST_AT, BORN_TIMESTAMP_AT,
                            BORNHOST_V6, COMPRESSED, COMPRESSION_TYPE_MASK, FLAG_AT, HOST_V4_LEN, HOST_V6_LEN,
                            MAGIC_CODE_AT, MAX_PROPS, MAX_TOPIC, MESSAGE_MAGIC_CODE, MIN_BLANK,
                            PHYSICAL_OFFSET_AT, QUEUE_ID_AT, QUEUE_OFFSET_AT, RECORD_FIXED_NO_HOSTS,
                            RECORD_FIXED_V4, STOREHOST_V6, SYS_FLAG_AT, body_length_at, born_host_len,
                            record_len, store_host_len, store_timestamp_at)


# --- big-endian integers: store_bytes.h's loads and stores (one memcpy + bswap each) ---------------
cdef inline uint32_t _u32(const unsigned char* p) noexcept nogil:
    return rmq_ld32(p)


cdef inline int32_t _i32(const unsigned char* p) noexcept nogil:
    return <int32_t>rmq_ld32(p)


cdef inline int64_t _i64(const unsigned char* p) noexcept nogil:
    return <int64_t>rmq_ld64(p)


cdef inline int16_t _i16(const unsigned char* p) noexcept nogil:
    return <int16_t>rmq_ld16(p)


cdef inline void _put_u32(unsigned char* p, uint32_t v) noexcept nogil:
    rmq_st32(p, v)


cdef inline void _put_u64(unsigned char* p, uint64_t v) noexcept nogil:
    rmq_st64(p, v)


# --- errors ----------------------------------------------------------------------------------------
# The error types belong to the Python layer (rmq_core.errors); this module imports nothing of rmq,
# so rmq_core.message hands them in when it loads this module (use_python_layer), together with the
# body decompressor.  Until then plain ValueErrors with the same texts stand in.
IllegalArgumentError = ValueError
PropertiesSizeExceededError = ValueError
BatchFormatError = ValueError


def _plain_decode_error(offset, reason):
    return ValueError(f"bad message data at offset {offset}: {reason}")


def _plain_too_large(size, limit):
    return ValueError(f"message size {size} bytes exceeds maxMessageSize {limit} bytes")


def _no_decompressor(body, sys_flag):
    raise ValueError("no decompressor: rmq_core.message has not handed one in")


MessageDecodeError = _plain_decode_error
MessageTooLargeError = _plain_too_large
cdef object _decompress = _no_decompressor


def use_python_layer(*, illegal_argument, properties_size_exceeded, batch_format, decode_error,
                     too_large, decompress):
    """The Python layer's error types (each called as its constructor: decode_error(offset, reason),
    too_large(size, limit), the others with the message) and decompress(body, sys_flag)."""
    global IllegalArgumentError, PropertiesSizeExceededError, BatchFormatError, MessageDecodeError
    global MessageTooLargeError, _decompress
    IllegalArgumentError, PropertiesSizeExceededError = illegal_argument, properties_size_exceeded
    BatchFormatError, MessageDecodeError, MessageTooLargeError = batch_format, decode_error, too_large
    _decompress = decompress


cdef object _decode_error(Py_ssize_t offset, str reason):
    return MessageDecodeError(offset, reason)




# --- short-string cache ------------------------------------------------------------------------------
# Property names ("UNIQ_KEY", "TAGS", "WAIT"), tag values and "true" repeat in every record of a
# pull; decoding them once and handing out the same immutable str saves an allocation per string.
# Direct-mapped, ASCII-only (so the bytes compare exactly), short strings only (unique ids would
# just thrash the slots).  4096 slots keep a working set of about a thousand distinct short values
# (keys such as order ids cycling through a pull) mostly collision-free.
cdef enum:
    _SCACHE_BITS = 12
    _SCACHE_SIZE = 1 << _SCACHE_BITS
    _SCACHE_MAX_LEN = 24
cdef PyObject* _scache[_SCACHE_SIZE]  # static storage: starts all NULL


cdef inline void _load_short(const char* p, Py_ssize_t n, uint64_t* w) noexcept nogil:
    """Three words that together hold every byte of p[:n] (n <= 24), at positions fixed by n:
    start/middle/end words from 8 bytes up, two overlapping 4-byte loads from 4, single bytes
    below.  Two strings of the same length are equal exactly when their words are, and the words
    give the ASCII check (any bit 7 set) and the cache hash without another pass over the bytes."""
    cdef uint32_t x = 0, y = 0
    w[0] = 0
    w[1] = 0
    w[2] = 0
    if n >= 8:
        memcpy(&w[0], p, 8)
        memcpy(&w[1], p + n - 8, 8)
        if n > 16:
            memcpy(&w[2], p + 8, 8)
    elif n >= 4:
        memcpy(&x, p, 4)
        memcpy(&y, p + n - 4, 4)
        w[0] = x
        w[1] = y
    elif n > 0:
        w[0] = (<uint64_t><uint8_t>p[0]) | ((<uint64_t><uint8_t>p[n >> 1]) << 8) | ((<uint64_t><uint8_t>p[n - 1]) << 16)


cdef inline uint32_t _short_hash(const uint64_t* w, Py_ssize_t n) noexcept nogil:
    # A collision only costs a cache miss, never a wrong string (the words are compared first).
    cdef uint64_t a = (w[0] ^ (w[2] * 0x94D049BB133111EBull)) * 0x9E3779B97F4A7C15ull
    a ^= (w[1] + <uint64_t>n) * 0xC2B2AE3D27D4EB4Full
    return <uint32_t>(a >> (64 - _SCACHE_BITS))


cdef inline bint _is_ascii(const char* p, Py_ssize_t n) noexcept nogil:
    # Eight bytes per step; the tail is folded in with one overlapping word when n >= 8.
    cdef uint64_t acc = 0, w
    cdef Py_ssize_t i = 0
    cdef uint8_t c = 0
    if n >= 8:
        while i + 8 <= n:
            memcpy(&w, p + i, 8)
            acc |= w
            i += 8
        if i < n:
            memcpy(&w, p + n - 8, 8)
            acc |= w
        return (acc & 0x8080808080808080ull) == 0
    while i < n:
        c |= <uint8_t>p[i]
        i += 1
    return c < 0x80


cdef inline str _new_str(const char* p, Py_ssize_t n, bint ascii):
    cdef str s
    if ascii:
        s = PyUnicode_New(n, 127)
        memcpy(PyUnicode_DATA(s), p, n)
        return s
    return PyUnicode_DecodeUTF8(p, n, "replace")


cdef str _decode_str(const char* p, Py_ssize_t n):
    """UTF-8 bytes -> str (invalid sequences replaced, as Java's new String(bytes, UTF_8) does);
    short ASCII strings go through the cache."""
    cdef uint64_t w[3]
    cdef uint64_t c[3]
    cdef uint32_t h
    cdef PyObject* cached
    cdef str s
    if n > _SCACHE_MAX_LEN:
        return _new_str(p, n, _is_ascii(p, n))
    _load_short(p, n, w)
    if ((w[0] | w[1] | w[2]) & 0x8080808080808080ull) != 0:
        return PyUnicode_DecodeUTF8(p, n, "replace")
    h = _short_hash(w, n)
    cached = _scache[h]
    if cached != NULL:
        if PyUnicode_GET_LENGTH(<object>cached) == n:
            _load_short(<const char*>PyUnicode_DATA(<object>cached), n, c)
            if ((w[0] ^ c[0]) | (w[1] ^ c[1]) | (w[2] ^ c[2])) == 0:
                return <str><object>cached
        Py_DECREF(<object>cached)
    s = _new_str(p, n, True)
    Py_INCREF(s)
    _scache[h] = <PyObject*>s
    return s


# --- properties ------------------------------------------------------------------------------------
# A pull's records nearly always carry the same property names in the same order (UNIQ_KEY, TAGS,
# KEYS, WAIT, ...), often with some values repeating too.  A "shape" remembers one such record: its
# raw properties bytes, where each name and value sits in them, and the dict built from them (the
# template).  A record that has the shape's names in the shape's order gets a copy of the template
# (one clone of the dict's table, no hashing, no probing) with only the values that differ set;
# its names are never decoded.  Anything else takes the general parse below.  Shapes are immutable
# once built; a few recent ones are kept so records alternating between layouts all hit.
cdef enum:
    _SHAPE_MAX_PAIRS = 16
    _SHAPE_SLOTS = 4
    _SHAPE_MISS_SIGS = 8


@cython.final
@cython.no_gc
cdef class _PropertiesShape:
    # Holds only bytes, a tuple of str and a dict of str: nothing that can form a cycle.
    cdef bytes raw                  # the template record's properties bytes
    cdef dict template              # dict(raw), never handed out, only copied
    cdef tuple names                # the name str of each pair, in order (entry i of template)
    cdef Py_ssize_t n
    cdef Py_ssize_t name_off[_SHAPE_MAX_PAIRS]
    cdef Py_ssize_t name_len[_SHAPE_MAX_PAIRS]
    cdef Py_ssize_t value_off[_SHAPE_MAX_PAIRS]
    cdef Py_ssize_t value_len[_SHAPE_MAX_PAIRS]


cdef PyObject* _shapes[_SHAPE_SLOTS]  # owned references (or NULL); static storage starts NULL
cdef Py_ssize_t _shape_last = 0     # the slot that matched last: tried first
cdef Py_ssize_t _shape_next = 0     # the slot a new shape replaces (round robin)
# Name-sequence signatures of recent records that matched no shape: a shape is built only for a
# layout seen twice among them, so records whose names never repeat do not pay for building one.
cdef uint64_t _shape_miss_sigs[_SHAPE_MISS_SIGS]
cdef Py_ssize_t _shape_miss_next = 0


cdef inline bint _same_bytes(const char* a, const char* b, Py_ssize_t n) noexcept nogil:
    # Property names and values are short: word loads inline beat a call into libc's memcmp.
    cdef uint64_t x, y
    cdef uint32_t u, w
    cdef Py_ssize_t i = 0
    if n > 32:
        return memcmp(a, b, n) == 0
    if n >= 8:
        while i + 8 < n:
            memcpy(&x, a + i, 8)
            memcpy(&y, b + i, 8)
            if x != y:
                return False
            i += 8
        memcpy(&x, a + n - 8, 8)
        memcpy(&y, b + n - 8, 8)
        return x == y
    if n >= 4:
        memcpy(&u, a, 4)
        memcpy(&w, b, 4)
        if u != w:
            return False
        memcpy(&u, a + n - 4, 4)
        memcpy(&w, b + n - 4, 4)
        return u == w
    if n > 0:
        return a[0] == b[0] and a[n >> 1] == b[n >> 1] and a[n - 1] == b[n - 1]
    return True


cdef dict _props_from_shape(_PropertiesShape s, const char* p, Py_ssize_t n):
    """dict of p[:n] when its pairs carry exactly the shape's names in the shape's order (no empty
    or nameless pieces in between), else None."""
    cdef const char* raw = PyBytes_AS_STRING(s.raw)
    cdef const char* cur = p
    cdef const char* end = p + n
    cdef const char* v
    cdef const char* e
    cdef Py_ssize_t i, kl, vl
    cdef dict out = None
    for i in range(s.n):
        kl = s.name_len[i]
        # The name is the text up to the first \x01 and holds no \x01 or \x02, so the same bytes
        # followed by \x01 (compared along with the template's own \x01) are the same name.
        if end - cur <= kl or not _same_bytes(cur, raw + s.name_off[i], kl + 1):
            return None
        v = cur + kl + 1
        vl = s.value_len[i]
        if end - v >= vl and (v + vl == end or v[vl] == 2) and _same_bytes(v, raw + s.value_off[i], vl):
            cur = v + vl + 1  # the template's value: nothing to do
            continue
        e = <const char*>memchr(v, 2, end - v)
        if e == NULL:
            e = end
        if out is None:
            out = PyDict_Copy(s.template)
        PyDict_SetItem(out, <object>PyTuple_GET_ITEM(s.names, i), _decode_str(v, e - v))
        cur = e + 1
    if cur < end:
        return None  # more pieces than the shape has (a copy made so far is dropped)
    if out is None:
        out = PyDict_Copy(s.template)
    return out


cdef inline uint64_t _sig_step(uint64_t h, const char* p, Py_ssize_t n) noexcept nogil:
    # FNV-1a over the name bytes, with the length folded in so "AB","C" differs from "A","BC".
    cdef Py_ssize_t i
    h = (h ^ <uint64_t>n) * 0x100000001B3ull
    for i in range(n):
        h = (h ^ <uint8_t>p[i]) * 0x100000001B3ull
    return h


cdef dict _parse_properties(const char* p, Py_ssize_t n):
    """Split on \x02, then on the first \x01; pairs without \x01 or with an empty name are dropped
    (the same rule as rmq_core.message.string_to_properties).  A record shaped like a recent one
    is copied from that one's template."""
    global _shape_last
    cdef _PropertiesShape s
    cdef dict out
    cdef Py_ssize_t i, j
    if n == 0:
        return {}
    for j in range(_SHAPE_SLOTS):
        i = _shape_last + j
        if i >= _SHAPE_SLOTS:
            i -= _SHAPE_SLOTS
        if _shapes[i] != NULL:
            # An owned local reference: allocating below may run a finalizer that decodes too and
            # replaces this slot.
            s = <_PropertiesShape>_shapes[i]
            out = _props_from_shape(s, p, n)
            if out is not None:
                _shape_last = i
                return out
    return _parse_properties_general(p, n)


cdef dict _parse_properties_general(const char* p, Py_ssize_t n):
    """The general parse: memchr finds both separators (a vectorised scan in libc) and pieces
    become str straight from the buffer, no temporary bytes.  A layout seen twice in a row of
    misses becomes a shape."""
    global _shape_last, _shape_next, _shape_miss_next
    cdef dict out
    cdef _PropertiesShape s
    cdef Py_ssize_t j, npairs = 0
    cdef const char* cur = p
    cdef const char* end = p + n
    cdef const char* e
    cdef const char* k
    cdef uint64_t sig = 0xCBF29CE484222325ull
    cdef bint shapeable = True
    cdef Py_ssize_t name_off[_SHAPE_MAX_PAIRS]
    cdef Py_ssize_t name_len[_SHAPE_MAX_PAIRS]
    cdef Py_ssize_t value_off[_SHAPE_MAX_PAIRS]
    cdef Py_ssize_t value_len[_SHAPE_MAX_PAIRS]
    out = {}
    while cur < end:
        e = <const char*>memchr(cur, 2, end - cur)
        if e == NULL:
            e = end  # a missing trailing \x02 ends the last pair all the same
        k = <const char*>memchr(cur, 1, e - cur)
        if k != NULL and k > cur:
            PyDict_SetItem(out, _decode_str(cur, k - cur), _decode_str(k + 1, e - k - 1))
            if npairs < _SHAPE_MAX_PAIRS:
                name_off[npairs] = cur - p
                name_len[npairs] = k - cur
                value_off[npairs] = k + 1 - p
                value_len[npairs] = e - k - 1
                sig = _sig_step(sig, cur, k - cur)
            npairs += 1
        else:
            shapeable = False  # an empty or nameless piece: the shape's strict walk would not match it
        cur = e + 1
    # Shape only plain layouts: at most _SHAPE_MAX_PAIRS pairs, no repeated name (a repeated name
    # keeps one dict entry, so pair i would no longer be entry i).
    if not shapeable or npairs == 0 or npairs > _SHAPE_MAX_PAIRS or len(out) != npairs:
        return out
    for j in range(_SHAPE_MISS_SIGS):
        if _shape_miss_sigs[j] == sig:
            break
    else:
        _shape_miss_sigs[_shape_miss_next] = sig
        _shape_miss_next = (_shape_miss_next + 1) % _SHAPE_MISS_SIGS
        return out
    _shape_miss_sigs[j] = 0
    s = _PropertiesShape.__new__(_PropertiesShape)
    s.raw = PyBytes_FromStringAndSize(p, n)
    s.template = PyDict_Copy(out)
    s.names = tuple(out)
    s.n = npairs
    memcpy(s.name_off, name_off, npairs * sizeof(Py_ssize_t))
    memcpy(s.name_len, name_len, npairs * sizeof(Py_ssize_t))
    memcpy(s.value_off, value_off, npairs * sizeof(Py_ssize_t))
    memcpy(s.value_len, value_len, npairs * sizeof(Py_ssize_t))
    Py_INCREF(s)
    if _shapes[_shape_next] != NULL:
        Py_DECREF(<object>_shapes[_shape_next])
    _shapes[_shape_next] = <PyObject*>s
    _shape_last = _shape_next
    _shape_next = (_shape_next + 1) % _SHAPE_SLOTS
    return out


cdef class _Bytes:
    """A contiguous read-only view of any buffer-protocol object (bytes, bytearray, memoryview, mmap)."""
    cdef Py_buffer view
    cdef bint held
    cdef const unsigned char* ptr
    cdef Py_ssize_t size

    def __cinit__(self, obj):
        if isinstance(obj, str):
            raise TypeError("expected bytes-like data, not str")
        PyObject_GetBuffer(obj, &self.view, PyBUF_SIMPLE)
        self.held = True
        self.ptr = <const unsigned char*>self.view.buf
        self.size = self.view.len

    def __dealloc__(self):
        if self.held:
            PyBuffer_Release(&self.view)


def string_to_properties(data):
    """Parse a properties string (`name\\x01value\\x02...`, bytes or str) into a dict."""
    cdef bytes raw
    if data is None:
        return {}
    if isinstance(data, str):
        raw = PyUnicode_AsUTF8String(data)
        return _parse_properties(PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw))
    if type(data) is bytes:
        return _parse_properties(PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))
    cdef _Bytes b = _Bytes(data)
    return _parse_properties(<const char*>b.ptr, b.size)


cdef inline void _check_no_sep(const char* p, Py_ssize_t n, int sep, object key, str what) except *:
    if memchr(p, sep, n) != NULL:
        raise IllegalArgumentError(
            f"property {key!r}: {what} contains the separator {chr(sep)!r}, which would corrupt "
            f"the properties string"
        )


def properties_to_bytes(props):
    """Encode a mapping as `name\\x01value\\x02...` UTF-8 bytes, in the mapping's order (RocketMQ's
    messageProperties2String).

    Pairs whose value is None are skipped; other values are converted with str().  A name that is
    empty or holds \\x01/\\x02, or a value holding \\x02, is refused (it would not read back)."""
    return encode_properties(props)


cdef inline int _check_pair(object key, const char* kp, Py_ssize_t kn, const char* vp, Py_ssize_t vn,
                            object value) except -1:
    if kn == 0:
        raise IllegalArgumentError(f"property name {key!r} is empty (value {value!r})")
    _check_no_sep(kp, kn, 1, key, "the name")
    _check_no_sep(kp, kn, 2, key, "the name")
    _check_no_sep(vp, vn, 2, key, "the value")
    return 0


from json_text cimport Out, out_free, out_reserve, out_start


cdef Py_ssize_t put_property(Out* o, object key, object value) except -1:
    """`name\\x01value\\x02` at the end of `o` (a value that is not a str as str() makes it): the one
    writer of a properties pair (encode_properties, the batch items).  A name that is not a str, is
    empty or holds a separator, a value holding \\x02, or text that UTF-8 cannot hold (a lone
    surrogate) raise IllegalArgumentError naming the property: it would not read back.  Returns
    the bytes written."""
    cdef Py_ssize_t kn, vn
    cdef const char* kp
    cdef const char* vp
    if not PyUnicode_CheckExact(key) and not isinstance(key, str):
        raise IllegalArgumentError(f"property name {key!r} must be a str")
    if not PyUnicode_CheckExact(value):
        value = str(value)
    try:
        kp = PyUnicode_AsUTF8AndSize(key, &kn)
        vp = PyUnicode_AsUTF8AndSize(value, &vn)
    except UnicodeEncodeError:
        raise IllegalArgumentError(f"property {key!r} is not encodable as UTF-8") from None
    _check_pair(key, kp, kn, vp, vn, value)
    if o.n + kn + vn + 2 > o.cap:
        out_reserve(o, kn + vn + 2)
    memcpy(o.buf + o.n, kp, kn)
    o.buf[o.n + kn] = 1
    memcpy(o.buf + o.n + kn + 1, vp, vn)
    o.buf[o.n + kn + 1 + vn] = 2
    o.n += kn + vn + 2
    return kn + vn + 2


cdef bytes encode_properties(object props):
    """The one properties encoder (properties_to_bytes; the store's single put calls it natively):
    every pair whose value is not None, in the mapping's order, through put_property."""
    cdef char stack[512]
    cdef Out o
    cdef PyObject* k
    cdef PyObject* v
    cdef Py_ssize_t pos = 0
    if props is None:
        return b""
    out_start(&o, stack, 512)
    try:
        if type(props) is dict:
            while PyDict_Next(<dict>props, &pos, &k, &v):
                if v != <PyObject*>None:
                    put_property(&o, <object>k, <object>v)
        else:
            for key, value in (props.items() if hasattr(props, "items") else props):
                if value is not None:
                    put_property(&o, key, value)
        return PyBytes_FromStringAndSize(o.buf, o.n)
    finally:
        out_free(&o)


# --- Java String.hashCode (java_hash.pxd) ---------------------------------------------------------------
from java_hash cimport java_hash_str, java_hash_utf8


def java_string_hash(s):
    """Java String.hashCode() (UTF-16 code units, int32 wrap-around), signed; None and "" give 0."""
    if s is None:
        return 0
    if not isinstance(s, str):
        raise TypeError(f"java_string_hash expects a str, not {type(s).__name__}: {s!r}")
    return <int32_t>java_hash_str(0, s)


cdef inline int64_t _tags_code(const char* p, Py_ssize_t n) noexcept:
    return tags_code_of(<const unsigned char*>p, n)


def tags_code_from_properties(data):
    """The consume-queue tag code (Java hash of the TAGS value) read straight from a raw properties
    blob, without building a dict; 0 when there is no TAGS pair."""
    if data is None:
        return 0
    if isinstance(data, str):
        data = PyUnicode_AsUTF8String(data)
    if type(data) is bytes:
        return _tags_code(PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))
    cdef _Bytes b = _Bytes(data)
    return _tags_code(<const char*>b.ptr, b.size)


# --- hosts -------------------------------------------------------------------------------------------
# The messages of a pull share a handful of hosts (one store host, a few producers), so each
# rendered IPv4 "ip:port" is kept in a small direct-mapped cache keyed by address and port.
cdef enum:
    _HOST_CACHE_BITS = 6
    _HOST_CACHE_SIZE = 1 << _HOST_CACHE_BITS
cdef uint64_t _host_keys[_HOST_CACHE_SIZE]   # (1 << 63) | ip << 16 | port; 0 = empty
cdef PyObject* _host_strs[_HOST_CACHE_SIZE]  # owned references


cdef inline Py_ssize_t _put_decimal(char* out, uint32_t v) noexcept nogil:
    cdef char tmp[10]
    cdef Py_ssize_t n = 0, i
    while True:
        tmp[n] = <char>(48 + v % 10)
        n += 1
        v //= 10
        if v == 0:
            break
    for i in range(n):
        out[i] = tmp[n - 1 - i]
    return n


cdef str _format_host(const unsigned char* ip, bint v6, int32_t port):
    cdef uint64_t key
    cdef uint32_t h
    cdef char text[24]
    cdef Py_ssize_t n = 0, i
    cdef str s
    if v6:
        return f"{_socket.inet_ntop(_socket.AF_INET6, PyBytes_FromStringAndSize(<const char*>ip, 16))}:{port}"
    key = (1ull << 63) | ((<uint64_t>_u32(ip)) << 16) | (<uint64_t>(<uint32_t>port & 0xFFFF))
    h = <uint32_t>((key * 0x9E3779B97F4A7C15ull) >> (64 - _HOST_CACHE_BITS))
    if _host_keys[h] == key and <uint32_t>port <= 65535:
        return <str>_host_strs[h]
    for i in range(4):
        n += _put_decimal(text + n, ip[i])
        text[n] = 46 if i < 3 else 58  # '.' between the octets, ':' before the port
        n += 1
    if port < 0:
        text[n] = 45  # '-': a port set out of range in Python (decoded ports are checked)
        n += 1
        n += _put_decimal(text + n, <uint32_t>(-(<int64_t>port)))
    else:
        n += _put_decimal(text + n, <uint32_t>port)
    s = _new_str(text, n, True)
    if 0 <= port <= 65535:
        Py_INCREF(s)
        if _host_strs[h] != NULL:
            Py_DECREF(<object>_host_strs[h])
        _host_strs[h] = <PyObject*>s
        _host_keys[h] = key
    return s


def ip_bytes(host):
    """The 4 bytes of an IPv4 or the 16 of an IPv6 address `host` (a str), or None when it is
    neither."""
    try:
        return _socket.inet_pton(_socket.AF_INET, host)
    except OSError:
        try:
            return _socket.inet_pton(_socket.AF_INET6, host)
        except OSError:
            return None


cdef int _parse_host(object value, str what, unsigned char* ip, bint* v6, int32_t* port) except -1:
    """The one host parser (MessageExt's hosts, `host_bytes`, `encode_record`): "ip:port" (IPv6 with
    or without brackets), (ip, port), or None / "" for no host (address 0.0.0.0, port 0).  A host
    name, a port outside 0..65535 or anything else is refused with an error naming the value."""
    cdef bytes raw
    memset(ip, 0, 16)
    v6[0] = False
    port[0] = 0
    if value is None or (isinstance(value, str) and not value):
        return 0
    if isinstance(value, tuple) and len(value) == 2:
        host, p = value
    elif isinstance(value, str):
        host, sep, p = value.rpartition(":")
        if not sep:
            raise IllegalArgumentError(f"bad {what} {value!r}: expected ip:port")
    else:
        raise IllegalArgumentError(f"bad {what} {value!r}: expected 'ip:port' or (ip, port)")
    if isinstance(host, str) and host.startswith("[") and host.endswith("]"):
        host = host[1:len(host) - 1]
    try:
        pn = int(p)
    except (TypeError, ValueError):
        raise IllegalArgumentError(f"bad {what} {value!r}: port {p!r} is not a number") from None
    if not 0 <= pn <= 65535:
        raise IllegalArgumentError(f"bad {what} {value!r}: port {pn} is out of 0..65535")
    if not isinstance(host, str):
        raise IllegalArgumentError(f"bad {what} {value!r}: host must be a str")
    raw = ip_bytes(host)
    if raw is None:
        raise IllegalArgumentError(f"bad {what} {value!r}: {host!r} is not an IPv4 or IPv6 address")
    v6[0] = PyBytes_GET_SIZE(raw) == 16
    memcpy(ip, PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw))
    port[0] = <int32_t>pn
    return 0


def host_bytes(value, str what="host"):
    """A host as a record holds it: the 4 (IPv4) or 16 (IPv6) address bytes then the i32 port
    (8 or 20 bytes), from what `_parse_host` accepts; `what` names it in the error."""
    cdef unsigned char ip[16]
    cdef bint v6
    cdef int32_t port
    cdef unsigned char raw[HOST_V6_LEN]
    _parse_host(value, what, ip, &v6, &port)
    cdef Py_ssize_t n = 16 if v6 else 4
    memcpy(raw, ip, n)
    _put_u32(raw + n, <uint32_t>port)
    return PyBytes_FromStringAndSize(<const char*>raw, n + 4)


cdef str _offset_msg_id(const unsigned char* ip, bint v6, int32_t port, int64_t offset):
    """offsetMsgId of a decoded message: its store host encoded as the record holds it."""
    cdef unsigned char host[HOST_V6_LEN]
    cdef char text[2 * (HOST_V6_LEN + 8)]
    cdef Py_ssize_t n = 16 if v6 else 4
    memcpy(host, ip, n)
    _put_u32(host + n, <uint32_t>port)
    return text[:put_offset_msg_id(text, host, n + 4, offset)].decode("ascii")


def offset_msg_id(bytes host, int64_t phys):
    """The offsetMsgId of the record at commit-log offset `phys` whose store host is `host` (8 or
    20 bytes: address + i32 port, as a record holds it)."""
    cdef Py_ssize_t hl = len(host)
    cdef char text[2 * (HOST_V6_LEN + 8)]
    if hl != HOST_V4_LEN and hl != HOST_V6_LEN:
        raise IllegalArgumentError(f"store host of {hl} bytes; it must be {HOST_V4_LEN} or {HOST_V6_LEN}")
    return text[:put_offset_msg_id(text, <const unsigned char*><char*>host, hl, phys)].decode("ascii")


# --- MessageExt --------------------------------------------------------------------------------------
cdef object _decompress_body(object body, int32_t sys_flag, Py_ssize_t offset):
    try:
        return _decompress(body, sys_flag)
    except Exception as exc:  # any codec failure becomes a decode error naming the record
        raise _decode_error(offset, f"compressed body does not decompress: {exc}") from exc


@cython.final
@cython.no_gc
@cython.freelist(512)
cdef class MessageExt:
    """A received message (RocketMQ MessageExt).  Created by `decode_messages` on the client's hot
    path: properties stay raw bytes until first used; host strings and ids are computed on access.

    Not tracked by the cyclic GC (a pull creates thousands of these; tracking them made the
    collector the biggest cost of decoding).  Its fields hold strings, bytes and a dict of
    strings, which cannot form a cycle; storing the message itself inside its own properties
    dict would leak it."""

    # Declared widest first so the struct has no padding (a pull allocates thousands of these).
    cdef public str topic
    cdef public str broker_name
    cdef str _born_host        # rendered "ip:port", cached
    cdef str _store_host
    cdef bytes _src            # the decoded buffer (a whole pull body, shared by its messages)
    cdef object _body          # bytes, or None when read_body=False
    cdef dict _properties      # decoded on first use
    cdef str _msg_id           # explicit override (Java setMsgId)
    cdef public int64_t queue_offset
    cdef public int64_t commit_log_offset
    cdef public int64_t born_timestamp
    cdef public int64_t store_timestamp
    cdef public int64_t prepared_transaction_offset
    cdef Py_ssize_t _body_off  # while _body_len >= 0 the body is still only a slice of _src
    cdef Py_ssize_t _props_off
    cdef public int32_t flag
    cdef public int32_t queue_id
    cdef public int32_t store_size
    cdef public int32_t body_crc
    cdef public int32_t sys_flag
    cdef public int32_t reconsume_times
    cdef int32_t _born_port
    cdef int32_t _store_port
    cdef int32_t _body_len     # body lengths are int32 on the wire
    cdef int32_t _props_len    # int16 on the wire
    cdef unsigned char _born_ip[16]
    cdef unsigned char _store_ip[16]
    cdef bint _born_v6
    cdef bint _store_v6

    def __init__(self, *, topic="", body=b"", int32_t flag=0, int32_t queue_id=0,
                 int64_t queue_offset=0, int64_t commit_log_offset=0, int32_t store_size=0,
                 int32_t body_crc=0, int32_t sys_flag=0, int64_t born_timestamp=0, born_host=None,
                 int64_t store_timestamp=0, store_host=None, int32_t reconsume_times=0,
                 int64_t prepared_transaction_offset=0, broker_name=None, properties=None,
                 msg_id=None):
        if not isinstance(topic, str):
            raise IllegalArgumentError(f"topic must be a str, not {type(topic).__name__}: {topic!r}")
        self.topic = topic
        self._body = _body_bytes(body)
        self._body_len = -1
        self.flag = flag
        self.queue_id = queue_id
        self.queue_offset = queue_offset
        self.commit_log_offset = commit_log_offset
        self.store_size = store_size
        self.body_crc = body_crc
        self.sys_flag = sys_flag
        self.born_timestamp = born_timestamp
        self.store_timestamp = store_timestamp
        self.reconsume_times = reconsume_times
        self.prepared_transaction_offset = prepared_transaction_offset
        self.broker_name = broker_name
        _parse_host(born_host, "born host", self._born_ip, &self._born_v6, &self._born_port)
        _parse_host(store_host, "store host", self._store_ip, &self._store_v6, &self._store_port)
        if self._born_v6:
            self.sys_flag |= BORNHOST_V6
        if self._store_v6:
            self.sys_flag |= STOREHOST_V6
        self.properties = properties
        self._msg_id = msg_id

    # -- hosts --
    @property
    def born_host(self):
        """Where the producer sent from, "ip:port"."""
        if self._born_host is None:
            self._born_host = _format_host(self._born_ip, self._born_v6, self._born_port)
        return self._born_host

    @born_host.setter
    def born_host(self, value):
        _parse_host(value, "born host", self._born_ip, &self._born_v6, &self._born_port)
        self._born_host = None
        self.sys_flag = (self.sys_flag | BORNHOST_V6) if self._born_v6 else (self.sys_flag & ~BORNHOST_V6)

    @property
    def store_host(self):
        """The broker that stored the message, "ip:port" (send-back goes there)."""
        if self._store_host is None:
            self._store_host = _format_host(self._store_ip, self._store_v6, self._store_port)
        return self._store_host

    @store_host.setter
    def store_host(self, value):
        _parse_host(value, "store host", self._store_ip, &self._store_v6, &self._store_port)
        self._store_host = None
        self.sys_flag = (self.sys_flag | STOREHOST_V6) if self._store_v6 else (self.sys_flag & ~STOREHOST_V6)

    # -- body --
    @property
    def body(self):
        """The plain body (bytes; None when decoded with read_body=False)."""
        if self._body_len >= 0:
            self._body = PyBytes_FromStringAndSize(PyBytes_AS_STRING(self._src) + self._body_off,
                                                   self._body_len)
            self._body_len = -1
            if self._properties is not None:
                self._src = None  # nothing points into the shared buffer any more
        return self._body

    @body.setter
    def body(self, value):
        self._body = _body_bytes(value)
        self._body_len = -1

    # -- properties --
    @property
    def properties(self):
        """All properties as a dict (decoded on first access, then cached; mutate it freely)."""
        return _message_props(self)

    @properties.setter
    def properties(self, value):
        if value is None:
            self._properties = {}
        elif isinstance(value, (str, bytes, bytearray, memoryview)):
            self._properties = string_to_properties(value)
        else:
            self._properties = dict(value)

    @property
    def raw_properties(self):
        """The properties as they travel (`name\\x01value\\x02...` bytes)."""
        if self._properties is None and self._src is not None:
            return PyBytes_FromStringAndSize(PyBytes_AS_STRING(self._src) + self._props_off, self._props_len)
        return properties_to_bytes(_message_props(self))

    def get_property(self, name, default=None):
        """One property.  The first property read builds the properties dict (cheap for a record
        shaped like its neighbours); later reads are dict lookups, never a new scan of the raw
        bytes."""
        return _message_props(self).get(name, default)

    def get_user_property(self, name, default=None):
        return self.get_property(name, default)

    def put_property(self, name, value):
        """Set a property (value converted with str(); None removes it)."""
        if not isinstance(name, str) or not name:
            raise IllegalArgumentError(f"property name {name!r} must be a non-empty str")
        if value is None:
            _message_props(self).pop(name, None)
        else:
            _message_props(self)[name] = value if isinstance(value, str) else str(value)

    def put_user_property(self, name, value):
        if name in _SYSTEM_KEYS:
            raise IllegalArgumentError(f"property name {name!r} is reserved by RocketMQ")
        self.put_property(name, value)

    def clear_property(self, name):
        _message_props(self).pop(name, None)

    @property
    def tags(self):
        return _message_prop(self, "TAGS") or None

    @tags.setter
    def tags(self, value):
        if value:
            self.put_property("TAGS", value)
        else:
            self.clear_property("TAGS")

    @property
    def keys(self):
        """Keys separated by spaces, or None."""
        return _message_prop(self, "KEYS") or None

    @keys.setter
    def keys(self, value):
        if value and not isinstance(value, str):
            value = " ".join(str(k) for k in value)
        if value:
            self.put_property("KEYS", value)
        else:
            self.clear_property("KEYS")

    @property
    def delay_time_level(self):
        """DELAY property as an int; 0 when absent or not a number (a received message never fails)."""
        v = _message_prop(self, "DELAY")
        if not v:
            return 0
        try:
            return int(v)
        except ValueError:
            return 0

    @delay_time_level.setter
    def delay_time_level(self, value):
        if value:
            self.put_property("DELAY", str(int(value)))
        else:
            self.clear_property("DELAY")

    # -- pop consumption (RocketMQ 5: a message received by a SimpleConsumer) --
    @property
    def receipt_handle(self):
        """What acks this received message or changes its invisible duration: its POP_CK property
        (the pop check point, rmq_core.common.pop_extra_info); None for a pulled message."""
        return _message_prop(self, "POP_CK")

    @receipt_handle.setter
    def receipt_handle(self, value):
        self.put_property("POP_CK", value)

    @property
    def delivery_attempt(self):
        """1 for a first delivery, then one more each time it is delivered again."""
        return self.reconsume_times + 1

    # -- ids --
    @property
    def offset_msg_id(self):
        """Broker-side id: store host address + port + commit-log offset, upper-case hex (docs/protocol.md §5.4)."""
        return _offset_msg_id(self._store_ip, self._store_v6, self._store_port, self.commit_log_offset)

    @property
    def msg_id(self):
        """The application-visible id: UNIQ_KEY when present, else the offsetMsgId."""
        if self._msg_id is not None:
            return self._msg_id
        uniq = _message_prop(self, "UNIQ_KEY")
        if uniq:
            return uniq
        return self.offset_msg_id

    @msg_id.setter
    def msg_id(self, value):
        self._msg_id = value

    # -- python protocol --
    def to_dict(self):
        """The constructor's keyword arguments (properties copied) — MessageExt(**m.to_dict()) == m."""
        return {
            "topic": self.topic, "body": self.body, "flag": self.flag, "queue_id": self.queue_id,
            "queue_offset": self.queue_offset, "commit_log_offset": self.commit_log_offset,
            "store_size": self.store_size, "body_crc": self.body_crc, "sys_flag": self.sys_flag,
            "born_timestamp": self.born_timestamp, "born_host": self.born_host,
            "store_timestamp": self.store_timestamp, "store_host": self.store_host,
            "reconsume_times": self.reconsume_times,
            "prepared_transaction_offset": self.prepared_transaction_offset,
            "broker_name": self.broker_name, "properties": dict(_message_props(self)),
        }

    def __reduce__(self):
        return (_message_ext_from_state, (self.to_dict(), self._msg_id))

    def __repr__(self):
        body = self.body
        return (
            f"MessageExt(topic={self.topic!r}, broker_name={self.broker_name!r}, "
            f"queue_id={self.queue_id}, queue_offset={self.queue_offset}, msg_id={self.msg_id!r}, "
            f"tags={self.tags!r}, keys={self.keys!r}, flag={self.flag}, sys_flag={self.sys_flag}, "
            f"store_size={self.store_size}, commit_log_offset={self.commit_log_offset}, "
            f"born_timestamp={self.born_timestamp}, born_host={self.born_host!r}, "
            f"store_timestamp={self.store_timestamp}, store_host={self.store_host!r}, "
            f"reconsume_times={self.reconsume_times}, "
            f"body_len={len(body) if body is not None else None}, properties={_message_props(self)!r})"
        )


cdef dict _message_props(MessageExt m):
    # A module function rather than a cdef method: MessageExt then needs no vtable pointer.
    if m._properties is None:
        if m._src is None:
            m._properties = {}
        else:
            m._properties = _parse_properties(PyBytes_AS_STRING(m._src) + m._props_off, m._props_len)
            if m._body_len < 0:
                m._src = None  # the dict is the truth from now on; release the buffer
    return m._properties




cdef inline object _message_prop(MessageExt m, str name):
    # The tags / keys / msg_id getters: one dict lookup, no Python-level method call.
    cdef PyObject* v = PyDict_GetItem(_message_props(m), name)
    return <object>v if v != NULL else None


_SYSTEM_KEYS = frozenset({
    "KEYS", "TAGS", "WAIT", "DELAY", "RETRY_TOPIC", "REAL_TOPIC", "REAL_QID", "TRAN_MSG", "PGROUP",
    "MIN_OFFSET", "MAX_OFFSET", "BUYER_ID", "ORIGIN_MESSAGE_ID", "TRANSFER_FLAG", "CORRECTION_FLAG",
    "MQ2_FLAG", "RECONSUME_TIME", "MSG_REGION", "TRACE_ON", "UNIQ_KEY", "MAX_RECONSUME_TIMES",
    "CONSUME_START_TIME", "TRAN_PREPARED_QUEUE_OFFSET", "TRANSACTION_CHECK_TIMES",
    "CHECK_IMMUNITY_TIME_IN_SECONDS",
})


def _message_ext_from_state(state, msg_id):
    cdef MessageExt m = MessageExt(**state)
    m._msg_id = msg_id
    return m


cdef object _body_bytes(object body):
    if body is None or type(body) is bytes:
        return body
    if isinstance(body, str):
        return PyUnicode_AsUTF8String(body)
    if isinstance(body, (bytearray, memoryview)):
        return bytes(body)
    raise IllegalArgumentError(f"message body must be bytes or str, not {type(body).__name__}")


# --- record decoding ------------------------------------------------------------------------------------
@cython.final
cdef class _DecodeState:
    """One decode call: the immutable source buffer and the last topic seen (records of one pull
    nearly always share a topic, so its str is reused instead of decoded again)."""
    cdef bytes src
    cdef Py_ssize_t shift          # where the decoded range starts inside src
    cdef const unsigned char* base
    cdef Py_ssize_t size
    cdef Py_ssize_t report_base   # added to offsets in error messages
    cdef bint decompress
    cdef bint read_body
    cdef str broker_name
    cdef str last_topic
    cdef const unsigned char* last_topic_ptr
    cdef Py_ssize_t last_topic_len

    def __cinit__(self, bytes src, Py_ssize_t shift, Py_ssize_t size, Py_ssize_t report_base,
                  bint decompress, bint read_body, broker_name):
        if broker_name is not None and not isinstance(broker_name, str):
            raise TypeError(f"broker_name must be a str, not {type(broker_name).__name__}")
        self.src = src
        self.shift = shift
        self.base = <const unsigned char*>PyBytes_AS_STRING(src) + shift
        self.size = size
        self.report_base = report_base
        self.decompress = decompress
        self.read_body = read_body
        self.broker_name = broker_name
        self.last_topic = None
        self.last_topic_ptr = NULL
        self.last_topic_len = -1


cdef struct _Record:
    # one v1 record's fields and the positions of its variable parts (relative to the record)
    int32_t total
    int32_t body_crc
    int32_t queue_id
    int32_t flag
    int64_t queue_offset
    int64_t commit_log_offset
    int32_t sys_flag
    int64_t born_timestamp
    Py_ssize_t born_ip_pos
    int32_t born_port
    int64_t store_timestamp
    Py_ssize_t store_ip_pos
    int32_t store_port
    int32_t reconsume_times
    int64_t prepared_transaction_offset
    Py_ssize_t body_pos
    Py_ssize_t body_len
    Py_ssize_t topic_pos
    Py_ssize_t topic_len
    Py_ssize_t props_pos
    Py_ssize_t props_len


cdef int _read_record(const unsigned char* p, Py_ssize_t avail, Py_ssize_t at, _Record* r) except -1:
    """Check the framing of the record at `p` (`avail` bytes left; `at` names it in errors) and
    fill `r`.  Returns 1 for a message, 0 for a BLANK record (only r.total set)."""
    cdef Py_ssize_t need, q
    cdef uint32_t magic
    cdef int32_t total, sys_flag
    if avail < 8:
        raise _decode_error(at, f"truncated record: {avail} bytes left, a record header needs 8")
    total = _i32(p)
    magic = _u32(p + MAGIC_CODE_AT)
    r.total = total
    if magic == BLANK_MAGIC_CODE:
        if total < MIN_BLANK or total > avail:
            raise _decode_error(at, f"BLANK record size {total} is outside 8..{avail} (bytes left)")
        return 0
    if magic != MESSAGE_MAGIC_CODE:
        raise _decode_error(
            at, f"magic code 0x{magic:08X} is neither a message (0x{MESSAGE_MAGIC_CODE:08X}) nor BLANK (0x{BLANK_MAGIC_CODE:08X})")
    if total < RECORD_FIXED_V4:
        raise _decode_error(at, f"record size {total} is below the minimum {RECORD_FIXED_V4}")
    if total > avail:
        raise _decode_error(at, f"record size {total} runs past the end of the buffer ({avail} bytes left)")
    sys_flag = _i32(p + SYS_FLAG_AT)
    # `need` counts every fixed field, the three length fields included; only the variable
    # parts (body, topic, properties) come on top of it.
    need = RECORD_FIXED_V4
    if sys_flag & BORNHOST_V6:
        need += HOST_V6_LEN - HOST_V4_LEN
    if sys_flag & STOREHOST_V6:
        need += HOST_V6_LEN - HOST_V4_LEN
    if total < need:
        raise _decode_error(at, f"record size {total} is below the minimum {need} for sysFlag 0x{sys_flag:X}")
    r.sys_flag = sys_flag
    r.body_crc = _i32(p + BODY_CRC_AT)
    r.queue_id = _i32(p + QUEUE_ID_AT)
    r.flag = _i32(p + FLAG_AT)
    r.queue_offset = _i64(p + QUEUE_OFFSET_AT)
    r.commit_log_offset = _i64(p + PHYSICAL_OFFSET_AT)
    r.born_timestamp = _i64(p + BORN_TIMESTAMP_AT)
    # a host is its address (4 or 16 bytes) and an i32 port
    q = BORN_HOST_AT
    r.born_ip_pos = q
    q += born_host_len(sys_flag) - 4
    r.born_port = _i32(p + q)
    r.store_timestamp = _i64(p + q + 4)
    q += 12
    r.store_ip_pos = q
    q += store_host_len(sys_flag) - 4
    r.store_port = _i32(p + q)
    if <uint32_t>r.born_port > 65535 or <uint32_t>r.store_port > 65535:
        # Java's decoder fails on these too (InetSocketAddress rejects the port).
        raise _decode_error(
            at, f"host port out of 0..65535 (born {r.born_port}, store {r.store_port})")
    r.reconsume_times = _i32(p + q + 4)
    r.prepared_transaction_offset = _i64(p + q + 8)
    r.body_len = _i32(p + q + 16)
    q += 20
    if r.body_len < 0 or r.body_len > total - need:
        raise _decode_error(at, f"body length {r.body_len} does not fit in record size {total}")
    r.body_pos = q
    q += r.body_len
    r.topic_len = p[q]
    q += 1
    if r.topic_len > 127:
        raise _decode_error(at, f"topic length {r.topic_len} is over 127 (a 1-byte signed length)")
    if need + r.body_len + r.topic_len > total:
        raise _decode_error(at, f"topic length {r.topic_len} does not fit in record size {total}")
    r.topic_pos = q
    q += r.topic_len
    r.props_len = _i16(p + q)
    q += 2
    if r.props_len < 0:
        raise _decode_error(at, f"properties length {r.props_len} is negative")
    if need + r.body_len + r.topic_len + r.props_len != total:
        raise _decode_error(
            at, f"record size {total} does not match its parts: {need} fixed + body {r.body_len} + "
                f"topic {r.topic_len} + properties {r.props_len}")
    r.props_pos = q
    return 1


cdef inline str _record_topic(_DecodeState st, const unsigned char* t, Py_ssize_t topic_len):
    # records of one pull nearly always share a topic: its str is reused instead of decoded again
    if st.last_topic_len == topic_len and _same_bytes(<const char*>st.last_topic_ptr, <const char*>t, topic_len):
        return st.last_topic
    st.last_topic = PyUnicode_DecodeUTF8(<const char*>t, topic_len, "replace")
    st.last_topic_ptr = t
    st.last_topic_len = topic_len
    return st.last_topic


cdef Py_ssize_t _decode_record(_DecodeState st, Py_ssize_t pos, list out) except -1:
    """Decode the record at `pos` and append it to `out` (a BLANK record is skipped).
    Returns the record's size."""
    cdef const unsigned char* p = st.base + pos
    cdef Py_ssize_t at = st.report_base + pos
    cdef _Record r
    cdef int32_t sys_flag
    cdef MessageExt m
    if not _read_record(p, st.size - pos, at, &r):
        return r.total
    sys_flag = r.sys_flag
    m = MessageExt.__new__(MessageExt)
    m.store_size = r.total
    m.body_crc = r.body_crc
    m.queue_id = r.queue_id
    m.flag = r.flag
    m.queue_offset = r.queue_offset
    m.commit_log_offset = r.commit_log_offset
    m.born_timestamp = r.born_timestamp
    m._born_v6 = (sys_flag & BORNHOST_V6) != 0
    memcpy(m._born_ip, p + r.born_ip_pos, 16 if m._born_v6 else 4)
    m._born_port = r.born_port
    m.store_timestamp = r.store_timestamp
    m._store_v6 = (sys_flag & STOREHOST_V6) != 0
    memcpy(m._store_ip, p + r.store_ip_pos, 16 if m._store_v6 else 4)
    m._store_port = r.store_port
    m.reconsume_times = r.reconsume_times
    m.prepared_transaction_offset = r.prepared_transaction_offset
    m.topic = _record_topic(st, p + r.topic_pos, r.topic_len)
    m._src = st.src
    m._props_off = st.shift + pos + r.props_pos
    m._props_len = r.props_len
    m._body_len = -1
    if st.read_body:
        if st.decompress and (sys_flag & COMPRESSED):
            # Inflated now, not on first access, so bad compressed data fails the decode.
            m._body = _decompress_body(
                PyBytes_FromStringAndSize(<const char*>p + r.body_pos, r.body_len), sys_flag, at)
            sys_flag &= ~(COMPRESSED | COMPRESSION_TYPE_MASK)
        else:
            # Copied out of the shared buffer on first access (a tag-filtering consumer may
            # drop the message without ever reading it).
            m._body_off = st.shift + pos + r.body_pos
            m._body_len = r.body_len
    m.sys_flag = sys_flag
    m.broker_name = st.broker_name
    PyList_Append(out, m)
    return r.total


cdef _DecodeState _decode_state(object buf, bint decompress, bint read_body, broker_name):
    # Lazily decoded bodies and properties point into the buffer, so it must be immutable: bytes,
    # and a contiguous memoryview slice of bytes (a frame's body), are used in place; anything else
    # (bytearray, a view of a reused receive buffer, mmap) is copied once.
    cdef _Bytes view
    cdef bytes owner
    if type(buf) is bytes:
        return _DecodeState(buf, 0, PyBytes_GET_SIZE(buf), 0, decompress, read_body, broker_name)
    if isinstance(buf, str):
        raise TypeError("expected bytes-like data, not str")
    if type(buf) is memoryview and type((<memoryview>buf).obj) is bytes and buf.c_contiguous:
        owner = (<memoryview>buf).obj
        view = _Bytes(buf)
        return _DecodeState(owner, <const char*>view.ptr - PyBytes_AS_STRING(owner), view.size, 0,
                            decompress, read_body, broker_name)
    owner = bytes(buf)
    return _DecodeState(owner, 0, PyBytes_GET_SIZE(owner), 0, decompress, read_body, broker_name)


def decode_messages(buf, *, bint decompress=True, bint read_body=True, broker_name=None):
    """Decode concatenated v1 records (a PULL body) into MessageExt objects; BLANK records are skipped.

    decompress: inflate compressed bodies (zlib / LZ4 frame / ZSTD by sysFlag) and clear the
    compression bits on the result.  read_body=False leaves `body` None.  Raises MessageDecodeError
    naming the offset and the reason for a bad magic, a size running past the buffer, or parts
    that do not add up.

    The list is not tracked by the cyclic GC: as returned it holds only MessageExt objects, which
    are not tracked either, so no cycle runs through it — and every collection that found it young
    would read the header of each of its messages (two passes over a 100k-message pull cost as
    much as building the properties dicts).  Reference counting still frees it and whatever it
    holds; only a reference cycle through it that the caller builds (an object appended to the
    list that refers back to it, or the list stored in one of its messages' properties) would not
    be collected."""
    cdef _DecodeState st = _decode_state(buf, decompress, read_body, broker_name)
    cdef Py_ssize_t pos = 0
    cdef list out = []
    PyObject_GC_UnTrack(out)
    while pos < st.size:
        pos += _decode_record(st, pos, out)
    return out


def decode_message(buf, Py_ssize_t offset=0, *, bint decompress=True, bint read_body=True,
                   broker_name=None):
    """Decode the one record at `offset` of `buf` (bytes-like, e.g. a memoryview of a mapped
    commit-log segment: only that record is copied).  A BLANK record there is an error."""
    cdef _Bytes b = _Bytes(buf)
    cdef Py_ssize_t avail
    cdef int32_t total
    cdef uint32_t magic
    cdef list out = []
    if offset < 0 or offset > b.size:
        raise _decode_error(offset, f"offset is outside the buffer of {b.size} bytes")
    avail = b.size - offset
    if avail < 8:
        raise _decode_error(offset, f"truncated record: {avail} bytes left, a record header needs 8")
    total = _i32(b.ptr + offset)
    magic = _u32(b.ptr + offset + 4)
    if magic == BLANK_MAGIC_CODE:
        raise _decode_error(offset, "a BLANK (end-of-file) record, not a message")
    if magic != MESSAGE_MAGIC_CODE:
        raise _decode_error(
            offset, f"magic code 0x{magic:08X} is neither a message (0x{MESSAGE_MAGIC_CODE:08X}) nor BLANK (0x{BLANK_MAGIC_CODE:08X})")
    if total < RECORD_FIXED_V4 or total > avail:
        raise _decode_error(offset, f"record size {total} is outside {RECORD_FIXED_V4}..{avail} (bytes left)")
    cdef _DecodeState st = _DecodeState(
        PyBytes_FromStringAndSize(<const char*>b.ptr + offset, total), 0, total, offset, decompress,
        read_body, broker_name)
    _decode_record(st, 0, out)
    return out[0]


def record_sizes_and_flags(buf):
    """[(offset, size, sysFlag)] of every record in concatenated records (sysFlag None for a BLANK
    record), with the framing checks of decode_messages but without building a message."""
    cdef _Bytes b = _Bytes(buf)
    cdef Py_ssize_t pos = 0
    cdef int32_t total
    cdef uint32_t magic
    cdef list out = []
    while pos < b.size:
        total = _check_record(b.ptr, b.size, pos, &magic)
        out.append((pos, total, _i32(b.ptr + pos + SYS_FLAG_AT) if magic == MESSAGE_MAGIC_CODE else None))
        pos += total
    return out


def has_compression_type_bits(buf):
    """True when any message record in `buf` carries sysFlag compression-type bits (0x700): the
    fast check in front of the 4.x re-compression.  No object is built per record."""
    cdef _Bytes b = _Bytes(buf)
    cdef Py_ssize_t pos = 0
    cdef int32_t total
    cdef uint32_t magic
    while pos < b.size:
        total = _check_record(b.ptr, b.size, pos, &magic)
        if magic == MESSAGE_MAGIC_CODE and (_i32(b.ptr + pos + SYS_FLAG_AT) & COMPRESSION_TYPE_MASK):
            return True
        pos += total
    return False


cdef int32_t _check_record(const unsigned char* base, Py_ssize_t n, Py_ssize_t pos,
                           uint32_t* magic_out) except -1:
    cdef Py_ssize_t avail = n - pos
    cdef int32_t total
    if avail < 8:
        raise _decode_error(pos, f"truncated record: {avail} bytes left, a record header needs 8")
    total = _i32(base + pos)
    magic_out[0] = _u32(base + pos + 4)
    if magic_out[0] == BLANK_MAGIC_CODE:
        if total < 8 or total > avail:
            raise _decode_error(pos, f"BLANK record size {total} is outside 8..{avail} (bytes left)")
        return total
    if magic_out[0] != MESSAGE_MAGIC_CODE:
        raise _decode_error(
            pos, f"magic code 0x{magic_out[0]:08X} is neither a message (0x{MESSAGE_MAGIC_CODE:08X}) nor BLANK (0x{BLANK_MAGIC_CODE:08X})")
    if total < RECORD_FIXED_V4 or total > avail:
        raise _decode_error(pos, f"record size {total} is outside {RECORD_FIXED_V4}..{avail} (bytes left)")
    return total


# --- batch bodies -------------------------------------------------------------------------------------
def decode_batch_body(buf):
    """Split a SEND_BATCH_MESSAGE body into [(flag, body, raw properties bytes)].

    The body comes from the network: every length is checked before it is used, and truncated or
    inconsistent input raises MessageDecodeError naming the item's offset."""
    cdef _Bytes b = _Bytes(buf)
    cdef const unsigned char* p = b.ptr
    cdef Py_ssize_t n = b.size, pos = 0, avail, body_len, props_len, total
    cdef int32_t flag
    cdef list out = []
    while pos < n:
        avail = n - pos
        if avail < BATCH_ITEM_FIXED:
            raise _decode_error(pos, f"truncated batch item: {avail} bytes left, an item needs at least {BATCH_ITEM_FIXED}")
        total = _i32(p + pos)
        flag = _i32(p + pos + 12)
        body_len = _i32(p + pos + 16)
        if total < BATCH_ITEM_FIXED or total > avail:
            raise _decode_error(pos, f"batch item size {total} is outside {BATCH_ITEM_FIXED}..{avail} (bytes left)")
        if body_len < 0 or body_len > total - BATCH_ITEM_FIXED:
            raise _decode_error(pos, f"batch item body length {body_len} does not fit in item size {total}")
        props_len = _i16(p + pos + 20 + body_len)
        if props_len < 0 or BATCH_ITEM_FIXED + body_len + props_len != total:
            raise _decode_error(
                pos, f"batch item size {total} does not match 20 + body {body_len} + 2 + properties {props_len}")
        out.append((
            flag,
            PyBytes_FromStringAndSize(<const char*>p + pos + 20, body_len),
            PyBytes_FromStringAndSize(<const char*>p + pos + 22 + body_len, props_len),
        ))
        pos += total
    return out


# A batch body written from Message objects (Producer.send_batch, auto_batch's items), validated and
# encoded in one pass; decode_batch_body reads it back (encode_batch_py in
# tests/client/batch_reference.py is the Python twin the tests compare it with).  Each item:
#
#     int32 totalSize = 22 + bodyLength + propertiesLength
#     int32 magic = 0,  int32 bodyCRC = 0          (the broker fills them in, as for Java's clients)
#     int32 flag,  int32 bodyLength,  body
#     int16 propertiesLength,  properties           (put_property's pairs)
#
# An item's properties are Message.wire_properties() (user properties, TAGS, KEYS, WAIT) with
# UNIQ_KEY set: the message's own one where it has it, else a new one (at the end).
cdef object _batch_error(Py_ssize_t index, str text):
    """The error of item `index` (-1: a message sent on its own, encode_batch_item)."""
    if index < 0:
        return IllegalArgumentError(text)
    return IllegalArgumentError(f"batch item {index}: {text}")


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


cdef str _put_item_properties(Out* o, m, dict user, UniqIds uniq_ids, Py_ssize_t* size):
    """An item's properties through put_property; its UNIQ_KEY (*size: the properties' size)."""
    cdef PyObject* k
    cdef PyObject* v
    cdef Py_ssize_t pos = 0, raw = 0
    cdef bint has_uniq = False
    cdef str uniq = None
    if user:
        while PyDict_Next(user, &pos, &k, &v):
            if PyUnicode_CheckExact(<object>k) and <object>k == "UNIQ_KEY":
                uniq = str(<object>v) if <object>v else uniq_ids.next_id()
                has_uniq = True
                raw += put_property(o, "UNIQ_KEY", uniq)
            elif v != <PyObject*>None:  # (None: skipped, as properties_to_bytes and a single send do)
                raw += put_property(o, <object>k, <object>v)
    tags = m.tags
    if tags:
        raw += put_property(o, "TAGS", tags)
    keys = m.keys
    if keys:
        raw += put_property(o, "KEYS", keys)
    raw += put_property(o, "WAIT", "true" if m.wait_store_msg_ok else "false")
    if not has_uniq:
        uniq = uniq_ids.next_id()
        raw += put_property(o, "UNIQ_KEY", uniq)
    size[0] = raw
    return uniq


cdef str _put_item(Out* o, m, Py_ssize_t i, str topic, Py_ssize_t max_message_size, frozenset reserved,
                   UniqIds uniq_ids, Py_ssize_t* item_size):
    """One message as a batch item at the end of `o` after check_message's checks and the batch
    rules (errors name item i); its UNIQ_KEY.  item_size: its size as the batch limit counts it
    (20 + body + properties)."""
    cdef Py_ssize_t start, props_at, raw = 0, body_len
    cdef int64_t c_flag
    cdef dict user
    cdef unsigned char* at
    body = m.body
    if type(body) is not bytes:
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
        out_reserve(o, 20 + body_len + 2)
    at = <unsigned char*>o.buf + start
    _put_u32(at + 4, 0)
    _put_u32(at + 8, 0)
    _put_u32(at + 12, <uint32_t>c_flag)
    _put_u32(at + 16, <uint32_t>body_len)
    memcpy(at + 20, PyBytes_AS_STRING(body), body_len)
    props_at = start + 20 + body_len + 2
    o.n = props_at
    try:
        uniq = _put_item_properties(o, m, user, uniq_ids, &raw)
    except IllegalArgumentError as e:
        raise _batch_error(i, str(e)) from None
    if raw > MAX_PROPS:
        raise _batch_error(i, f"properties are {raw} bytes, more than {MAX_PROPS}")
    at = <unsigned char*>o.buf + start  # (the buffer may have moved)
    _put_u32(at, <uint32_t>(BATCH_ITEM_FIXED + body_len + raw))
    o.buf[props_at - 2] = <char>(raw >> 8)
    o.buf[props_at - 1] = <char>raw
    item_size[0] = 20 + body_len + raw
    return uniq


def encode_batch_body(list msgs, Py_ssize_t max_message_size, message_cls, frozenset reserved, check_topic,
                      UniqIds uniq_ids):
    """Validate and encode a batch: (topic, comma-joined UNIQ_KEYs, body, the first message's
    wait_store_msg_ok).  Each message is checked as selector.check_message does (a Message, the
    topic once through check_topic, a bytes body of 1..max_message_size, no reserved property name,
    a delay level >= 0) plus the batch rules (one topic, no delay, no retry topic, a 32-bit flag,
    properties that do not corrupt the encoding and fit 32767 bytes); the encoded batch (20 bytes a
    message plus bodies and properties) must fit max_message_size.  IllegalArgumentError names the
    item and the bad value.  uniq_ids: the UNIQ_KEY maker (new UNIQ_KEYs)."""
    cdef Py_ssize_t count = len(msgs), i, item_size = 0, total = 0
    cdef Out o
    cdef list uniqs
    if count == 0:
        raise IllegalArgumentError("send_batch needs at least one message")
    uniqs = [None] * count
    topic = None
    out_start(&o, NULL, 0)
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
                out_reserve(&o, count * (BATCH_ITEM_FIXED + 100 + (PyBytes_GET_SIZE(m.body) if type(m.body) is bytes else 0)))
            else:
                other = m.topic
                if other is not topic and other != topic:
                    raise _batch_error(i, f"all messages of a batch must have the same topic: {other!r} "
                                          f"differs from {topic!r}")
            uniqs[i] = _put_item(&o, m, i, topic, max_message_size, reserved, uniq_ids, &item_size)
            total += item_size
        if total > max_message_size:
            raise IllegalArgumentError(
                f"batch of {count} messages is {total} bytes encoded, more than max_message_size "
                f"{max_message_size}; split it")
        return topic, ",".join(uniqs), PyBytes_FromStringAndSize(o.buf, o.n), msgs[0].wait_store_msg_ok
    finally:
        out_free(&o)


def encode_batch_item(message, Py_ssize_t max_message_size, message_cls, frozenset reserved, check_topic,
                      UniqIds uniq_ids):
    """One message sent on its own as a batch item (auto_batch gathers these): (topic, UNIQ_KEY,
    item, wait_store_msg_ok) after encode_batch_body's checks, its errors naming the bad value
    without an item index; the item is what encode_batch_body writes for it (a batch body is items
    end to end)."""
    cdef char stack[1024]
    cdef Out o
    cdef Py_ssize_t item_size = 0
    if not isinstance(message, message_cls):
        raise IllegalArgumentError(f"expected a Message, got {type(message).__name__}")
    topic = message.topic
    check_topic(topic)
    if topic.startswith("%RETRY%"):
        raise IllegalArgumentError(f"retry topic {topic!r} is not supported in a batch")
    out_start(&o, stack, 1024)
    try:
        uniq = _put_item(&o, message, -1, topic, max_message_size, reserved, uniq_ids, &item_size)
        if item_size > max_message_size:
            raise IllegalArgumentError(f"message to topic {topic!r} is {item_size} bytes encoded, more than "
                                       f"max_message_size {max_message_size}")
        return topic, uniq, PyBytes_FromStringAndSize(o.buf, o.n), message.wait_store_msg_ok
    finally:
        out_free(&o)


# --- UNIQ_KEY -----------------------------------------------------------------------------------------
from clock cimport epoch_ms

cdef const char* _UPPER_HEX = "0123456789ABCDEF"


@cython.final
cdef class UniqIds:
    """The UNIQ_KEY maker (MessageClientIDSetter.create_uniq_id): 32 upper-case hex digits - the
    fixed part (IP, pid, a random number: 20 digits, from `prefix()`, asked once), the milliseconds
    since the start of this month (8; `month_bounds(now_ms)` gives (month start, next month start)
    in ms, asked when a month begins) and a counter from the iterator `sequence` (4).  Called from
    many threads: each step is atomic under the GIL, and racing month look-ups agree."""

    cdef object _prefix_of
    cdef object _month_bounds
    cdef object _sequence
    cdef str _prefix
    cdef int64_t _month_start
    cdef int64_t _next_month

    def __init__(self, prefix, month_bounds, sequence):
        self._prefix_of = prefix
        self._month_bounds = month_bounds
        self._sequence = sequence
        self._prefix = None
        self._month_start = 0
        self._next_month = 0

    def __call__(self):
        return self.next_id()

    cdef str next_id(self):
        cdef int64_t now = epoch_ms()
        cdef Py_ssize_t n, i
        cdef uint32_t elapsed, counter
        cdef char* out
        if now >= self._next_month:
            if self._prefix is None:
                prefix = self._prefix_of()
                if type(prefix) is not str or not (<str>prefix).isascii():
                    raise ValueError(f"UNIQ_KEY prefix {prefix!r} is not ASCII hex")
                self._prefix = prefix
            start, following = self._month_bounds(now)
            self._month_start, self._next_month = start, following
        counter = <uint32_t>(<int64_t>PyIter_Next(self._sequence) & 0xFFFF)
        elapsed = <uint32_t>((now - self._month_start) & 0xFFFFFFFF)
        prefix = self._prefix
        n = PyUnicode_GET_LENGTH(prefix)
        uniq = PyUnicode_New(n + 12, 127)
        out = <char*>PyUnicode_DATA(uniq)
        memcpy(out, PyUnicode_DATA(prefix), n)
        for i in range(8):
            out[n + i] = _UPPER_HEX[(elapsed >> (28 - 4 * i)) & 15]
        for i in range(4):
            out[n + 8 + i] = _UPPER_HEX[(counter >> (12 - 4 * i)) & 15]
        return uniq


# --- columns: a pull body in Arrow's memory layout --------------------------------------------------
# Spark's "rmq" data source hands Arrow record batches to the JVM.  Building them from MessageExt
# objects costs a Python object per message and per field; this decoder writes each field of every
# record straight into column buffers laid out as Arrow wants them (little-endian fixed-width
# values; int32 offsets + data for strings and binaries; a validity bitmap where a value may be
# missing).  It returns bytes only; the caller wraps them (pyarrow stays out of rmq_core).
@cython.final
cdef class _Buf:
    cdef char* p
    cdef Py_ssize_t n
    cdef Py_ssize_t cap

    def __cinit__(self, Py_ssize_t cap):
        self.cap = cap if cap > 16 else 16
        self.p = <char*>PyMem_Malloc(self.cap)
        if self.p == NULL:
            raise MemoryError()
        self.n = 0

    def __dealloc__(self):
        PyMem_Free(self.p)

    cdef int reserve(self, Py_ssize_t extra) except -1:
        cdef Py_ssize_t cap = self.cap
        cdef char* q
        if self.n + extra <= cap:
            return 0
        while cap < self.n + extra:
            cap *= 2
        q = <char*>PyMem_Realloc(self.p, cap)
        if q == NULL:
            raise MemoryError()
        self.p = q
        self.cap = cap
        return 0

    cdef inline int put(self, const void* src, Py_ssize_t size) except -1:
        if self.n + size > self.cap:
            self.reserve(size)
        memcpy(self.p + self.n, src, size)
        self.n += size
        return 0

    cdef inline int put_i32(self, int32_t v) except -1:
        return self.put(&v, 4)

    cdef inline int put_i64(self, int64_t v) except -1:
        return self.put(&v, 8)

    cdef bytes take(self):
        return PyBytes_FromStringAndSize(self.p, self.n)


@cython.final
cdef class _VarColumn:
    """A string / binary column: int32 offsets (rows + 1), data, and a validity bitmap."""
    cdef _Buf offsets
    cdef _Buf data
    cdef _Buf validity
    cdef Py_ssize_t rows
    cdef Py_ssize_t nulls

    def __cinit__(self, Py_ssize_t rows_hint, Py_ssize_t data_hint):
        self.offsets = _Buf((rows_hint + 1) * 4)
        self.data = _Buf(data_hint)
        self.validity = _Buf(rows_hint // 8 + 1)
        self.rows = 0
        self.nulls = 0
        self.offsets.put_i32(0)

    cdef int add(self, const void* src, Py_ssize_t size, bint valid) except -1:
        cdef Py_ssize_t byte = self.rows >> 3
        if byte >= self.validity.n:
            self.validity.reserve(1)
            self.validity.p[byte] = 0
            self.validity.n = byte + 1
        if valid:
            self.validity.p[byte] |= <char>(1 << (self.rows & 7))
            if size:
                self.data.put(src, size)
        else:
            self.nulls += 1
        if self.data.n > 0x7FFFFFFF:
            raise OverflowError("a column of one pull is over 2 GiB")
        self.offsets.put_i32(<int32_t>self.data.n)
        self.rows += 1
        return 0

    cdef tuple take(self):
        return (self.validity.take() if self.nulls else None, self.offsets.take(), self.data.take(), self.nulls)


cdef inline Py_ssize_t _prop_value(const unsigned char* props, Py_ssize_t plen, const char* name,
                                   Py_ssize_t nlen, Py_ssize_t* vlen) noexcept nogil:
    # position of the value of `name` (the one lookup, record.pxd), -1 when absent
    cdef Py_ssize_t vs = 0
    if find_property(props, plen, name, nlen, &vs, vlen):
        return vs
    return -1


def decode_columns(buf, str broker_name, int64_t until_offset=-1, tuple skip_properties=()):
    """Decode concatenated v1 records (a PULL body) into column buffers; records whose queue
    offset is >= until_offset (when >= 0) and BLANK records are left out.  Framing is checked as
    decode_messages checks it; compressed bodies are inflated.

    Returns a dict of bytes: "rows"; fixed-width little-endian "queue_id" (int32),
    "queue_offset" (int64), "born_timestamp" / "store_timestamp" (int64 microseconds since the
    epoch), "reconsume_times" (int32); variable-width (validity or None, offsets, data, null count)
    "topic", "broker_name", "msg_id" (UNIQ_KEY, else the offset message id), "tags", "keys",
    "body"; and "properties" as a map: (entry offsets, key column, value column) of every property
    whose name is not in skip_properties (at most 64 names, str)."""
    cdef _Bytes b = _Bytes(buf)
    cdef const unsigned char* base = b.ptr
    cdef const unsigned char* p
    cdef const unsigned char* props
    cdef Py_ssize_t size = b.size, pos = 0, rows_hint = size // 200 + 1, i, k, v, vlen = 0, entries = 0
    cdef _Record r
    cdef bytes bn = PyUnicode_AsUTF8String(broker_name)
    cdef bytes body
    cdef char mid_text[2 * (HOST_V6_LEN + 8)]
    cdef _Buf queue_id = _Buf(rows_hint * 4), queue_offset = _Buf(rows_hint * 8)
    cdef _Buf born = _Buf(rows_hint * 8), stored = _Buf(rows_hint * 8), reconsume = _Buf(rows_hint * 4)
    cdef _Buf entry_offsets = _Buf((rows_hint + 1) * 4)
    cdef _VarColumn topic = _VarColumn(rows_hint, 64), broker = _VarColumn(rows_hint, rows_hint * 8)
    cdef _VarColumn msg_id = _VarColumn(rows_hint, rows_hint * 32), tags = _VarColumn(rows_hint, rows_hint * 8)
    cdef _VarColumn keys = _VarColumn(rows_hint, rows_hint * 8), bodies = _VarColumn(rows_hint, size)
    cdef _VarColumn pkeys = _VarColumn(rows_hint * 4, rows_hint * 32), pvalues = _VarColumn(rows_hint * 4, rows_hint * 32)
    cdef const char* skip_ptr[64]
    cdef Py_ssize_t skip_len[64]
    cdef Py_ssize_t n_skip = len(skip_properties), j
    cdef list skip_names = [PyUnicode_AsUTF8String(name) for name in skip_properties]  # (owns the bytes)
    cdef bint skipped
    if n_skip > 64:
        raise ValueError(f"skip_properties holds {n_skip} names; at most 64")
    for j in range(n_skip):
        skip_ptr[j] = PyBytes_AS_STRING(skip_names[j])
        skip_len[j] = PyBytes_GET_SIZE(skip_names[j])
    entry_offsets.put_i32(0)
    while pos < size:
        p = base + pos
        if not _read_record(p, size - pos, pos, &r):
            pos += r.total
            continue
        pos += r.total
        if until_offset >= 0 and r.queue_offset >= until_offset:
            continue
        queue_id.put_i32(r.queue_id)
        queue_offset.put_i64(r.queue_offset)
        born.put_i64(r.born_timestamp * 1000)
        stored.put_i64(r.store_timestamp * 1000)
        reconsume.put_i32(r.reconsume_times)
        topic.add(p + r.topic_pos, r.topic_len, True)
        broker.add(PyBytes_AS_STRING(bn), PyBytes_GET_SIZE(bn), True)
        props = p + r.props_pos
        # TAGS / KEYS / UNIQ_KEY have columns of their own; every property is in the map as well
        v = _prop_value(props, r.props_len, "TAGS", 4, &vlen)
        tags.add(props + v, vlen, v >= 0)
        v = _prop_value(props, r.props_len, "KEYS", 4, &vlen)
        keys.add(props + v, vlen, v >= 0)
        v = _prop_value(props, r.props_len, "UNIQ_KEY", 8, &vlen)
        if v >= 0:
            msg_id.add(props + v, vlen, True)
        else:
            # the store host's address and port lie together in the record, as the id wants them
            msg_id.add(mid_text, put_offset_msg_id(mid_text, p + r.store_ip_pos, store_host_len(r.sys_flag),
                                                   r.commit_log_offset), True)
        if r.sys_flag & COMPRESSED:
            body = _decompress_body(PyBytes_FromStringAndSize(<const char*>p + r.body_pos, r.body_len),
                                    r.sys_flag, pos - r.total)
            bodies.add(PyBytes_AS_STRING(body), PyBytes_GET_SIZE(body), True)
        else:
            bodies.add(p + r.body_pos, r.body_len, True)
        i = 0
        while i < r.props_len:
            k = i
            while i < r.props_len and props[i] != 1:
                i += 1
            if i >= r.props_len:
                break  # a trailing name without a value (never written by RocketMQ): ignored
            v = i + 1
            i = v
            while i < r.props_len and props[i] != 2:
                i += 1
            skipped = False
            for j in range(n_skip):
                if skip_len[j] == v - 1 - k and memcmp(skip_ptr[j], props + k, v - 1 - k) == 0:
                    skipped = True
                    break
            if not skipped:
                pkeys.add(props + k, v - 1 - k, True)
                pvalues.add(props + v, i - v, True)
                entries += 1
            i += 1
        entry_offsets.put_i32(<int32_t>entries)
    return {
        "rows": topic.rows,
        "queue_id": queue_id.take(), "queue_offset": queue_offset.take(),
        "born_timestamp": born.take(), "store_timestamp": stored.take(),
        "reconsume_times": reconsume.take(),
        "topic": topic.take(), "broker_name": broker.take(), "msg_id": msg_id.take(),
        "tags": tags.take(), "keys": keys.take(), "body": bodies.take(),
        "properties": (entry_offsets.take(), pkeys.take(), pvalues.take()),
    }


# === The commit-log record: encode (one message, a batch body's items), verify (the recovery scan) ===
# Layout in the module doc; the inline helpers shared with commit_log.pyx (write_record, record_len,
# tags_code_of, the batch template) are in record.pxd, so the single put writes records in place
# with the same code.
from cpython.bytearray cimport PyByteArray_FromStringAndSize, PyByteArray_AS_STRING, PyByteArray_Resize
from rmq_core._native.crc cimport crc32_update
from rmq_core._native.mapped cimport NativeMap
from store_bytes cimport CQ_UNIT, rmq_ld16, rmq_ld32, rmq_ld64

# verify_records stop reasons
STOP_END = 0        # reached `end` or a zero header (nothing written there)
STOP_BLANK = 1      # end-of-segment blank record
STOP_CORRUPT = 2    # bad magic / size / crc / physical offset / structure



# --- record encoding ---------------------------------------------------------------------------
cdef check_hosts(const unsigned char[::1] born_host, const unsigned char[::1] store_host, int32_t sys_flag):
    cdef Py_ssize_t bh = born_host_len(sys_flag)
    cdef Py_ssize_t sh = store_host_len(sys_flag)
    if born_host.shape[0] != bh:
        raise IllegalArgumentError(f"born host must be {bh} encoded bytes for sysFlag {sys_flag:#x}, got {born_host.shape[0]}")
    if store_host.shape[0] != sh:
        raise IllegalArgumentError(f"store host must be {sh} encoded bytes for sysFlag {sys_flag:#x}, got {store_host.shape[0]}")


def encode_record(str topic, bytes body, int32_t queue_id=0, int32_t flag=0, int64_t queue_offset=0,
                  int64_t commit_log_offset=0, int32_t sys_flag=0, int64_t born_timestamp=0, born_host=None,
                  int64_t store_timestamp=0, store_host=None, int32_t reconsume_times=0,
                  int64_t prepared_transaction_offset=0, properties=None):
    """One whole record, every field as given (a stored record as the broker sends it back, e.g. in
    CHECK_TRANSACTION_STATE): the hosts as `_parse_host` takes them, which also set sysFlag's
    host-v6 bits; BODYCRC over `body` as given; `properties` a dict (or pairs)."""
    cdef bytes t = PyUnicode_AsUTF8String(topic)
    cdef bytes props = encode_properties(properties)
    cdef bytes bh = host_bytes(born_host, "born host"), sh = host_bytes(store_host, "store host")
    cdef Py_ssize_t tl = len(t), bl = len(body), pl = len(props)
    if tl == 0 or tl > MAX_TOPIC:
        raise IllegalArgumentError(f"bad topic name {topic!r}: {tl} bytes; it must be 1..{MAX_TOPIC}")
    if pl > MAX_PROPS:
        raise IllegalArgumentError(f"message properties are {pl} bytes, more than {MAX_PROPS}")
    sys_flag &= ~(BORNHOST_V6 | STOREHOST_V6)
    if len(bh) == HOST_V6_LEN:
        sys_flag |= BORNHOST_V6
    if len(sh) == HOST_V6_LEN:
        sys_flag |= STOREHOST_V6
    cdef Py_ssize_t total = record_len(len(bh), len(sh), bl, tl, pl)
    out = PyBytes_FromStringAndSize(NULL, total)
    cdef unsigned char *d = <unsigned char *>PyBytes_AS_STRING(out)
    cdef const unsigned char *bp = <const unsigned char *><char *>body
    write_record(d, <int32_t>total, crc32_update(0, bp, bl), queue_id, flag, sys_flag, born_timestamp,
                 <const unsigned char *><char *>bh, len(bh), <const unsigned char *><char *>sh, len(sh),
                 reconsume_times, prepared_transaction_offset, bp, bl, <const unsigned char *><char *>t, tl,
                 <const unsigned char *><char *>props, pl, NULL, 0, False)
    _put_u64(d + QUEUE_OFFSET_AT, <uint64_t>queue_offset)
    _put_u64(d + PHYSICAL_OFFSET_AT, <uint64_t>commit_log_offset)
    _put_u64(d + store_timestamp_at(sys_flag), <uint64_t>store_timestamp)
    return out


def encode_batch(body, bytes topic, int32_t queue_id, int32_t sys_flag, int64_t born_ts, bytes born_host,
                 bytes store_host, int32_t reconsume_times, extra_properties, Py_ssize_t max_message_size,
                 bint plan_only=False):
    """A SEND_BATCH_MESSAGE body (docs/protocol.md §5.5) -> (bytearray records, count, bytearray tags codes
    as native int64).  Every item becomes a full record with the request's topic, queue, hosts and
    `extra_properties` appended to its own properties (as the Java broker does).

    plan_only: validate and size only -> (None, count, total record bytes), for `fit_batch` and
    `encode_batch_into`, which encode straight into the segment."""
    cdef const unsigned char[::1] src = body
    cdef const unsigned char[::1] ex = extra_properties
    cdef const unsigned char[::1] bh = born_host
    cdef const unsigned char[::1] sh = store_host
    cdef Py_ssize_t n = src.shape[0]
    cdef Py_ssize_t tl = len(topic)
    cdef Py_ssize_t exl = ex.shape[0]
    if tl > MAX_TOPIC or tl == 0:
        raise IllegalArgumentError(f"topic {topic.decode('utf-8', 'replace')!r} is {tl} bytes; it must be 1..{MAX_TOPIC}")
    check_hosts(bh, sh, sys_flag)
    if n == 0:
        raise BatchFormatError("batch body is empty")
    cdef const unsigned char *s = &src[0]
    cdef const unsigned char *exp = ptr_or_empty(ex)
    cdef Py_ssize_t fixed = record_len(bh.shape[0], sh.shape[0], 0, tl, 0)
    # pass 1: validate and size (the C pass; this loop only runs again to name a problem it found)
    cdef Py_ssize_t pos = 0, count = 0, out_len = 0, item_total, blen, plen, rlen, ppos
    cdef bint sep
    cdef size_t planned_count = 0, planned_total = 0
    cdef int planned
    planned = rmq_batch_plan(s, n, fixed, exl, MAX_PROPS, max_message_size if max_message_size > 0 else 0,
                             &planned_count, &planned_total)
    if planned == 0:
        count = planned_count
        out_len = planned_total
        pos = n
    while pos < n:
        if n - pos < 20:
            raise BatchFormatError(f"batch body truncated at byte {pos}: {n - pos} bytes left, an item header needs 20")
        item_total = <int32_t>rmq_ld32(s + pos)
        blen = <int32_t>rmq_ld32(s + pos + 16)
        if blen < 0 or pos + 20 + blen + 2 > n:
            raise BatchFormatError(f"batch item {count} at byte {pos}: body length {blen} runs past the end ({n} bytes)")
        plen = <int16_t>rmq_ld16(s + pos + 20 + blen)
        if plen < 0 or pos + 22 + blen + plen > n:
            raise BatchFormatError(f"batch item {count} at byte {pos}: properties length {plen} runs past the end ({n} bytes)")
        if item_total != 22 + blen + plen:
            raise BatchFormatError(f"batch item {count} at byte {pos}: total size {item_total} != 22 + body {blen} + properties {plen}")
        ppos = pos + 22 + blen
        sep = plen > 0 and exl > 0 and s[ppos + plen - 1] != 2
        if plen + exl + (1 if sep else 0) > MAX_PROPS:
            raise PropertiesSizeExceededError(
                f"batch item {count}: properties are {plen + exl + (1 if sep else 0)} bytes, more than {MAX_PROPS}")
        rlen = fixed + blen + plen + exl + (1 if sep else 0)
        if rlen > max_message_size:
            raise MessageTooLargeError(rlen, max_message_size)
        out_len += rlen
        count += 1
        pos += item_total
    if plan_only:
        return None, count, out_len
    out = PyByteArray_FromStringAndSize(NULL, out_len)
    tags = PyBytes_FromStringAndSize(NULL, count * 8)  # fresh: filled below, then immutable
    cdef unsigned char *d = <unsigned char *>PyByteArray_AS_STRING(out)
    cdef int64_t *tg = <int64_t *><char *>(<bytes>tags)
    cdef const unsigned char *tp = <const unsigned char *><char *>topic
    cdef const unsigned char *bhp = &bh[0]
    cdef const unsigned char *shp = &sh[0]
    cdef Py_ssize_t i = 0, vs, vl
    cdef int32_t flag
    cdef int64_t code
    with nogil:
        pos = 0
        while i < count:
            item_total = <int32_t>rmq_ld32(s + pos)
            flag = <int32_t>rmq_ld32(s + pos + 12)
            blen = <int32_t>rmq_ld32(s + pos + 16)
            plen = <int16_t>rmq_ld16(s + pos + 20 + blen)
            ppos = pos + 22 + blen
            sep = plen > 0 and exl > 0 and s[ppos + plen - 1] != 2
            rlen = fixed + blen + plen + exl + (1 if sep else 0)
            write_record(d, <int32_t>rlen, crc32_update(0, s + pos + 20, blen), queue_id, flag, sys_flag, born_ts,
                         bhp, bh.shape[0], shp, sh.shape[0], reconsume_times, 0,
                         s + pos + 20, blen, tp, tl, s + ppos, plen, exp, exl, sep)
            # the record's properties are the item's then the extra ones: the last TAGS wins
            if exl and find_property(exp, exl, b"TAGS", 4, &vs, &vl):
                code = java_hash_utf8(exp + vs, vl) if vl > 0 else 0
            else:
                code = tags_code_of(s + ppos, plen)
            tg[i] = code
            d += rlen
            pos += item_total
            i += 1
    return out, count, tags


def fit_batch(body, Py_ssize_t body_pos, Py_ssize_t n_items, bytes topic, int32_t sys_flag, bytes born_host,
              bytes store_host, extra_properties, Py_ssize_t write_pos, Py_ssize_t file_size):
    """How many of the (validated) batch items from body[body_pos:] fit a segment at write_pos, each
    record leaving 8 bytes for the end-of-file blank: (records, bytes, next body position)."""
    cdef const unsigned char[::1] src = body
    cdef const unsigned char[::1] ex = extra_properties
    cdef rmq_batch_tmpl t
    cdef size_t nbytes = 0, next_pos = 0, k
    batch_template(&t, topic, 0, sys_flag, 0, born_host, store_host, 0, ex, 0)
    if body_pos < 0 or body_pos > src.shape[0] or n_items < 0 or write_pos < 0:
        raise ValueError(f"body position {body_pos} / item count {n_items} / write position {write_pos} out of range")
    if n_items == 0:
        return 0, 0, body_pos
    k = rmq_batch_fit(&t, &src[0], body_pos, n_items, write_pos, file_size, &nbytes, &next_pos)
    return k, nbytes, next_pos



# --- recovery scan ---------------------------------------------------------------------------------
cdef inline bint valid_topic_byte(unsigned char c) noexcept nogil:
    return (c >= 48 and c <= 57) or (c >= 65 and c <= 90) or (c >= 97 and c <= 122) or c == 37 or c == 124 or c == 95 or c == 45


cdef inline bint valid_properties(const unsigned char *p, Py_ssize_t n) noexcept nogil:
    """Properties are "name\\x01value\\x02" pairs of UTF-8 text without NULs.  A torn write that left
    random bytes in this part of a record (which the body CRC does not cover) fails this check."""
    cdef Py_ssize_t i = 0, need = 0
    cdef bint in_name = True
    cdef Py_ssize_t name_len = 0
    cdef unsigned char c
    if n == 0:
        return True
    if p[n - 1] != 2:
        return False
    while i < n:
        c = p[i]
        if need:
            if (c & 0xC0) != 0x80:
                return False
            need -= 1
        elif c == 0:
            return False
        elif c == 1:
            if not in_name or name_len == 0:
                return False
            in_name = False
        elif c == 2:
            if in_name:
                return False
            in_name = True
            name_len = 0
        elif c >= 0x80:
            if (c & 0xE0) == 0xC0 and c >= 0xC2:
                need = 1
            elif (c & 0xF0) == 0xE0:
                need = 2
            elif (c & 0xF8) == 0xF0 and c <= 0xF4:
                need = 3
            else:
                return False
            if in_name:
                name_len += 1
        elif in_name:
            name_len += 1
        i += 1
    return need == 0


cdef inline int check_record(const unsigned char *p, Py_ssize_t pos, Py_ssize_t end, int64_t phys, bint check_crc,
                             Py_ssize_t *out_size) noexcept nogil:
    """0 = good message record, 1 = blank, 2 = nothing (zero header / too short), 3 = corrupt."""
    cdef Py_ssize_t avail = end - pos
    cdef uint32_t size, magic, bl, tl, pl, sysf
    cdef Py_ssize_t bo, to, po
    cdef uint32_t i
    if avail < 8:
        return 2
    size = rmq_ld32(p + pos)
    magic = rmq_ld32(p + pos + MAGIC_CODE_AT)
    if size == 0 and magic == 0:
        return 2
    if magic == BLANK_MAGIC_CODE:
        if size >= MIN_BLANK and <Py_ssize_t>size == avail:
            out_size[0] = size
            return 1
        return 3
    if magic != MESSAGE_MAGIC_CODE or size < RECORD_FIXED_V4 or <Py_ssize_t>size > avail:
        return 3
    if <int64_t>rmq_ld64(p + pos + PHYSICAL_OFFSET_AT) != phys:
        return 3
    sysf = rmq_ld32(p + pos + SYS_FLAG_AT)
    bo = body_length_at(sysf) + 4  # the body
    if bo + 4 > <Py_ssize_t>size:
        return 3
    bl = rmq_ld32(p + pos + bo - 4)
    if <int64_t>bo + <int32_t>bl + 3 > <int64_t>size or <int32_t>bl < 0:
        return 3
    to = bo + bl
    tl = p[pos + to]
    if tl == 0 or tl > MAX_TOPIC or to + 1 + tl + 2 > <Py_ssize_t>size:
        return 3
    for i in range(tl):
        if not valid_topic_byte(p[pos + to + 1 + i]):
            return 3
    po = to + 1 + tl
    pl = rmq_ld16(p + pos + po)
    if po + 2 + <Py_ssize_t>pl != <Py_ssize_t>size:
        return 3
    if not valid_properties(p + pos + po + 2, pl):
        return 3
    if check_crc and (crc32_update(0, p + pos + bo, bl) & 0x7FFFFFFF) != rmq_ld32(p + pos + 8):
        return 3
    out_size[0] = size
    return 0


cdef inline int64_t schedule_tags_code(const unsigned char *props, Py_ssize_t n, int64_t store_ts,
                                       const int64_t *levels, Py_ssize_t nlevels, int64_t fallback) noexcept nogil:
    """SCHEDULE_TOPIC_XXXX entries carry the delivery time as their tag code (RocketMQ)."""
    cdef Py_ssize_t vs = 0, vl = 0, i
    cdef int64_t level = 0
    if nlevels == 0 or not find_property(props, n, b"DELAY", 5, &vs, &vl) or vl == 0 or vl > 9:
        return fallback
    for i in range(vl):
        if props[vs + i] < 48 or props[vs + i] > 57:
            return fallback
        level = level * 10 + (props[vs + i] - 48)
    if level <= 0:
        return fallback
    if level > nlevels:
        level = nlevels
    return store_ts + levels[level - 1]


def verify_records(NativeMap m, Py_ssize_t start, Py_ssize_t end, int64_t file_from_offset, bint check_crc,
                   bint collect=True, delay_levels_ms=None):
    """Walk records in [start, end) of one segment, checking magic, size, physical offset,
    structure and (optionally) body CRC.

    Returns (stop_pos, stop_reason, count, last_store_timestamp, runs).  stop_reason is STOP_END,
    STOP_BLANK or STOP_CORRUPT; stop_pos is where the walk stopped (the end of the last good record,
    or the segment end after a blank).  With `collect`, runs lists consecutive records of one
    (topic, queue) with consecutive queue offsets as (topic, queue_id, first_queue_offset, count,
    memoryview of its 20-byte consume-queue entries, max_store_timestamp) — so re-dispatch costs one
    Python object per run, not per record."""
    cdef unsigned char *p = m.check(start, end)
    cdef Py_ssize_t pos = start, size = 0
    cdef int r = 2
    cdef Py_ssize_t count = 0
    cdef int64_t last_ts = 0, ts, qoff, run_next = -1
    cdef int32_t qid, run_qid = -1
    cdef uint32_t sysf, tl, pl, bl
    cdef Py_ssize_t bo, to, po
    cdef const unsigned char *run_topic = NULL
    cdef uint32_t run_tl = 0
    cdef int64_t code
    cdef int64_t run_max_ts = 0
    cdef Py_ssize_t run_start_count = 0
    cdef bint sched
    cdef const int64_t *lv = NULL
    cdef Py_ssize_t nlv = 0
    cdef const unsigned char[::1] lvv
    if delay_levels_ms is not None and len(delay_levels_ms):
        import array
        lvv = array.array("q", delay_levels_ms).tobytes()
        lv = <const int64_t *>&lvv[0]
        nlv = len(delay_levels_ms)
    runs = []
    # every entry of this segment goes into one growing buffer; a run is a slice of it
    cdef Py_ssize_t cap = 65536, used = 0, run_byte = 0
    allbuf = PyByteArray_FromStringAndSize(NULL, cap)
    cdef unsigned char *entry
    cdef int64_t run_first = 0
    while True:
        r = check_record(p, pos, end, file_from_offset + pos, check_crc, &size)
        if r != 0:
            break
        sysf = rmq_ld32(p + pos + SYS_FLAG_AT)
        ts = <int64_t>rmq_ld64(p + pos + store_timestamp_at(sysf))
        if ts > last_ts:
            last_ts = ts
        count += 1
        if collect:
            qid = <int32_t>rmq_ld32(p + pos + QUEUE_ID_AT)
            qoff = <int64_t>rmq_ld64(p + pos + QUEUE_OFFSET_AT)
            bo = body_length_at(sysf) + 4
            bl = rmq_ld32(p + pos + bo - 4)
            to = bo + bl
            tl = p[pos + to]
            po = to + 1 + tl
            pl = rmq_ld16(p + pos + po)
            code = tags_code_of(p + pos + po + 2, pl)
            sched = tl == 19 and memcmp(p + pos + to + 1, b"SCHEDULE_TOPIC_XXXX", 19) == 0
            if sched:
                code = schedule_tags_code(p + pos + po + 2, pl, ts, lv, nlv, code)
            if not (run_topic != NULL and qid == run_qid and qoff == run_next and tl == run_tl
                    and memcmp(run_topic, p + pos + to + 1, tl) == 0):
                if run_topic != NULL:
                    runs.append((PyBytes_FromStringAndSize(<char *>run_topic, run_tl).decode("utf-8"), run_qid,
                                 run_first, count - 1 - run_start_count, run_byte, run_max_ts))
                    run_byte = used
                run_topic = p + pos + to + 1
                run_tl = tl
                run_qid = qid
                run_first = qoff
                run_start_count = count - 1
                run_max_ts = 0
            run_next = qoff + 1
            if ts > run_max_ts:
                run_max_ts = ts
            if used + CQ_UNIT > cap:
                cap *= 2
                PyByteArray_Resize(allbuf, cap)
            entry = <unsigned char *>PyByteArray_AS_STRING(allbuf) + used
            rmq_st64(entry, <uint64_t>(file_from_offset + pos))
            rmq_st32(entry + 8, <uint32_t>size)
            rmq_st64(entry + 12, <uint64_t>code)
            used += CQ_UNIT
        pos += size
    if collect and run_topic != NULL:
        runs.append((PyBytes_FromStringAndSize(<char *>run_topic, run_tl).decode("utf-8"), run_qid,
                     run_first, count - run_start_count, run_byte, run_max_ts))
    if runs:
        PyByteArray_Resize(allbuf, used)
        view = memoryview(allbuf)
        runs = [(t, q, f, c, view[b:b + c * CQ_UNIT], ts) for (t, q, f, c, b, ts) in runs]
    if r == 1:
        return end, STOP_BLANK, count, last_ts, runs
    return pos, (STOP_CORRUPT if r == 3 else STOP_END), count, last_ts, runs
