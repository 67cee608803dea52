# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The message record: decoding (the client's hot path, PULL bodies -> MessageExt), properties (the
one encoder, the one lookup: the last pair of a name wins), hosts and message ids.

The layout is docs/protocol.md §5 (the record) and §5.5 (batch bodies); its constants and field
offsets are record_layout.pxd's, the one definition, cimported here and by every other native reader.

Beside this module: record_batch.pyx (batch bodies, UNIQ_KEYs), record_columns.pyx (a pull body
as Arrow columns), record_store.pyx (the store's encoders and its recovery scan); they share
record.pxd.  The pure-Python twin of every routine lives in tests/codec_oracle.py, the oracle of the
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
from store_bytes cimport rmq_ld16, rmq_ld32, rmq_ld64
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


cdef object record_decode_error(Py_ssize_t offset, str reason):
    return MessageDecodeError(offset, reason)


# (the other record modules raise the Python layer's errors through these: record.pxd)
cdef object illegal_argument(str text):
    return IllegalArgumentError(text)


cdef bint is_illegal_argument(object exc):
    return isinstance(exc, IllegalArgumentError)


cdef object batch_format_error(str text):
    return BatchFormatError(text)


cdef object properties_size_error(str text):
    return PropertiesSizeExceededError(text)


cdef object too_large_error(Py_ssize_t size, Py_ssize_t limit):
    return MessageTooLargeError(size, limit)




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


cdef class BufferView:
    """A contiguous read-only view of any buffer-protocol object (bytes, bytearray, memoryview, mmap)."""

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
    cdef BufferView b = BufferView(data)
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
    cdef BufferView b = BufferView(data)
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
    return encoded_host(value, what)


cdef bytes encoded_host(object value, str what):
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
    cdef Py_ssize_t n = 16 if v6 else 4
    memcpy(host, ip, n)
    _put_u32(host + n, <uint32_t>port)
    out = PyUnicode_New(2 * (n + 4 + 8), 127)  # written in place: one object, no decode
    put_offset_msg_id(<char*>PyUnicode_DATA(out), host, n + 4, offset)
    return out


def offset_msg_id(bytes host, int64_t phys):
    """The offsetMsgId of the record at commit-log offset `phys` whose store host is `host` (8 or
    20 bytes: address + i32 port, as a record holds it)."""
    cdef Py_ssize_t hl = len(host)
    if hl != HOST_V4_LEN and hl != HOST_V6_LEN:
        raise IllegalArgumentError(f"store host of {hl} bytes; it must be {HOST_V4_LEN} or {HOST_V6_LEN}")
    out = PyUnicode_New(2 * (hl + 8), 127)  # (a put's answer: written in place, one object)
    put_offset_msg_id(<char*>PyUnicode_DATA(out), <const unsigned char*><char*>host, hl, phys)
    return out


# --- MessageExt --------------------------------------------------------------------------------------
cdef object decompress_record_body(object body, int32_t sys_flag, Py_ssize_t offset):
    try:
        return _decompress(body, sys_flag)
    except Exception as exc:  # any codec failure becomes a decode error naming the record
        raise record_decode_error(offset, f"compressed body does not decompress: {exc}") from exc


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




cdef int read_record_fields(const unsigned char* p, Py_ssize_t avail, Py_ssize_t at, RecordFields* r) except -1:
    """Check the framing of the record at `p` (`avail` bytes left; `at` names it in errors) and
    fill `r`.  Returns 1 for a message, 0 for a BLANK record (only r.total set)."""
    cdef Py_ssize_t need, q
    cdef uint32_t magic
    cdef int32_t total, sys_flag
    if avail < 8:
        raise record_decode_error(at, f"truncated record: {avail} bytes left, a record header needs 8")
    total = _i32(p)
    magic = _u32(p + MAGIC_CODE_AT)
    r.total = total
    if magic == BLANK_MAGIC_CODE:
        if total < MIN_BLANK or total > avail:
            raise record_decode_error(at, f"BLANK record size {total} is outside 8..{avail} (bytes left)")
        return 0
    if magic != MESSAGE_MAGIC_CODE:
        raise record_decode_error(
            at, f"magic code 0x{magic:08X} is neither a message (0x{MESSAGE_MAGIC_CODE:08X}) nor BLANK (0x{BLANK_MAGIC_CODE:08X})")
    if total < RECORD_FIXED_V4:
        raise record_decode_error(at, f"record size {total} is below the minimum {RECORD_FIXED_V4}")
    if total > avail:
        raise record_decode_error(at, f"record size {total} runs past the end of the buffer ({avail} bytes left)")
    sys_flag = _i32(p + SYS_FLAG_AT)
    # `need` counts every fixed field, the three length fields included; only the variable
    # parts (body, topic, properties) come on top of it.
    need = RECORD_FIXED_V4
    if sys_flag & BORNHOST_V6:
        need += HOST_V6_LEN - HOST_V4_LEN
    if sys_flag & STOREHOST_V6:
        need += HOST_V6_LEN - HOST_V4_LEN
    if total < need:
        raise record_decode_error(at, f"record size {total} is below the minimum {need} for sysFlag 0x{sys_flag:X}")
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
        raise record_decode_error(
            at, f"host port out of 0..65535 (born {r.born_port}, store {r.store_port})")
    r.reconsume_times = _i32(p + q + 4)
    r.prepared_transaction_offset = _i64(p + q + 8)
    r.body_len = _i32(p + q + 16)
    q += 20
    if r.body_len < 0 or r.body_len > total - need:
        raise record_decode_error(at, f"body length {r.body_len} does not fit in record size {total}")
    r.body_pos = q
    q += r.body_len
    r.topic_len = p[q]
    q += 1
    if r.topic_len > 127:
        raise record_decode_error(at, f"topic length {r.topic_len} is over 127 (a 1-byte signed length)")
    if need + r.body_len + r.topic_len > total:
        raise record_decode_error(at, f"topic length {r.topic_len} does not fit in record size {total}")
    r.topic_pos = q
    q += r.topic_len
    r.props_len = _i16(p + q)
    q += 2
    if r.props_len < 0:
        raise record_decode_error(at, f"properties length {r.props_len} is negative")
    if need + r.body_len + r.topic_len + r.props_len != total:
        raise record_decode_error(
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
    cdef RecordFields r
    cdef int32_t sys_flag
    cdef MessageExt m
    if not read_record_fields(p, st.size - pos, at, &r):
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
            m._body = decompress_record_body(
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
    cdef BufferView view
    cdef bytes owner
    if type(buf) is bytes:
        return _DecodeState(buf, 0, PyBytes_GET_SIZE(buf), 0, decompress, read_body, broker_name)
    if isinstance(buf, str):
        raise TypeError("expected bytes-like data, not str")
    if type(buf) is memoryview and type((<memoryview>buf).obj) is bytes and buf.c_contiguous:
        owner = (<memoryview>buf).obj
        view = BufferView(buf)
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
    cdef BufferView b = BufferView(buf)
    cdef Py_ssize_t avail
    cdef int32_t total
    cdef uint32_t magic
    cdef list out = []
    if offset < 0 or offset > b.size:
        raise record_decode_error(offset, f"offset is outside the buffer of {b.size} bytes")
    avail = b.size - offset
    if avail < 8:
        raise record_decode_error(offset, f"truncated record: {avail} bytes left, a record header needs 8")
    total = _i32(b.ptr + offset)
    magic = _u32(b.ptr + offset + 4)
    if magic == BLANK_MAGIC_CODE:
        raise record_decode_error(offset, "a BLANK (end-of-file) record, not a message")
    if magic != MESSAGE_MAGIC_CODE:
        raise record_decode_error(
            offset, f"magic code 0x{magic:08X} is neither a message (0x{MESSAGE_MAGIC_CODE:08X}) nor BLANK (0x{BLANK_MAGIC_CODE:08X})")
    if total < RECORD_FIXED_V4 or total > avail:
        raise record_decode_error(offset, f"record size {total} is outside {RECORD_FIXED_V4}..{avail} (bytes left)")
    cdef _DecodeState st = _DecodeState(
        PyBytes_FromStringAndSize(<const char*>b.ptr + offset, total), 0, total, offset, decompress,
        read_body, broker_name)
    _decode_record(st, 0, out)
    return out[0]


def queue_runs(list msgs, str without):
    """[(topic, queue id, start, stop)]: the runs of consecutive messages of msgs[start:stop] (as
    decode_messages made them) that share topic and queue and lack the property `without`; a
    message that has it is in no run.  A pop answer's messages take their receipt handles per run
    (SimpleConsumer._popped) without a Python step per message."""
    cdef list out = []
    cdef Py_ssize_t i, start = -1, count = len(msgs)
    cdef MessageExt m
    cdef str topic = None
    cdef int32_t queue_id = -1
    for i in range(count):
        m = <MessageExt?>msgs[i]
        if without in _message_props(m):
            if start >= 0:
                out.append((topic, queue_id, start, i))
                start = -1
            continue
        if start >= 0 and m.queue_id == queue_id and (m.topic is topic or m.topic == topic):
            continue
        if start >= 0:
            out.append((topic, queue_id, start, i))
        start, topic, queue_id = i, m.topic, m.queue_id
    if start >= 0:
        out.append((topic, queue_id, start, count))
    return out


def stamp_popped(list msgs, list handles, str handle_name, str first_pop_name, str first_pop, str topic):
    """Each message i of a pop answer given properties[handle_name] = handles[i] (unless that is
    None: it keeps its own), properties[first_pop_name] = first_pop unless it has one, and `topic`
    (a retry message shows the topic it was sent to)."""
    cdef Py_ssize_t i, count = len(msgs)
    cdef MessageExt m
    cdef dict props
    cdef object h
    if len(handles) != count:
        raise ValueError(f"{count} messages but {len(handles)} handles")
    for i in range(count):
        m = <MessageExt?>msgs[i]
        props = _message_props(m)
        h = handles[i]
        if h is not None:
            props[handle_name] = h
        if first_pop_name not in props:
            props[first_pop_name] = first_pop
        m.topic = topic


def record_sizes_and_flags(buf):
    """[(offset, size, sysFlag)] of every record in concatenated records (sysFlag None for a BLANK
    record), with the framing checks of decode_messages but without building a message."""
    cdef BufferView b = BufferView(buf)
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
    cdef BufferView b = BufferView(buf)
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
        raise record_decode_error(pos, f"truncated record: {avail} bytes left, a record header needs 8")
    total = _i32(base + pos)
    magic_out[0] = _u32(base + pos + 4)
    if magic_out[0] == BLANK_MAGIC_CODE:
        if total < 8 or total > avail:
            raise record_decode_error(pos, f"BLANK record size {total} is outside 8..{avail} (bytes left)")
        return total
    if magic_out[0] != MESSAGE_MAGIC_CODE:
        raise record_decode_error(
            pos, f"magic code 0x{magic_out[0]:08X} is neither a message (0x{MESSAGE_MAGIC_CODE:08X}) nor BLANK (0x{BLANK_MAGIC_CODE:08X})")
    if total < RECORD_FIXED_V4 or total > avail:
        raise record_decode_error(pos, f"record size {total} is outside {RECORD_FIXED_V4}..{avail} (bytes left)")
    return total
