# Java's String.hashCode, the one native implementation (consume-queue tag codes, index key hashes,
# subscription tag codes): h = 31*h + unit over the string's UTF-16 code units, wrapping at 32 bits.
# The reference is rmq_core.message.java_string_hash; the property tests compare against it.
from libc.stdint cimport int32_t, uint32_t


cdef extern from "Python.h":
    void* PyUnicode_DATA(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)
    int PyUnicode_KIND(object o)
    Py_UCS4 PyUnicode_READ(int kind, void* data, Py_ssize_t index) nogil


cdef inline uint32_t java_hash_unit(uint32_t h, uint32_t cp) noexcept nogil:
    """Continue the hash with one code point (a non-BMP one counts as its surrogate pair)."""
    if cp > 0xFFFF:
        cp -= 0x10000
        h = 31u * h + (0xD800u + (cp >> 10))
        return 31u * h + (0xDC00u + (cp & 0x3FFu))
    return 31u * h + cp


cdef inline uint32_t java_hash_str(uint32_t h, str s):
    """Continue the hash over `s` (`h` = 0 starts it; a topic's "topic#" hash seeds its keys)."""
    cdef Py_ssize_t i, n = PyUnicode_GET_LENGTH(s)
    cdef int kind = PyUnicode_KIND(s)
    cdef void* data = PyUnicode_DATA(s)
    for i in range(n):
        h = java_hash_unit(h, PyUnicode_READ(kind, data, i))
    return h


cdef inline uint32_t java_hash_ascii(uint32_t h, const unsigned char* p, Py_ssize_t n) noexcept nogil:
    """Continue the hash over ASCII bytes (each one UTF-16 code unit of the same value)."""
    cdef Py_ssize_t i
    for i in range(n):
        h = 31u * h + p[i]
    return h


cdef inline int32_t java_hash_utf8(const unsigned char* p, Py_ssize_t n) noexcept nogil:
    """The hash of UTF-8 bytes as decoded with errors="replace" (Python's decoder, which is also
    Java's): each maximal invalid subsequence counts as one U+FFFD."""
    cdef uint32_t h = 0, cp, c
    cdef unsigned char lo, hi
    cdef Py_ssize_t i = 0
    cdef int need
    while i < n:
        c = p[i]
        i += 1
        if c < 0x80:
            h = 31u * h + c
            continue
        # the lead byte fixes the length and the range of the first continuation byte
        lo, hi = 0x80, 0xBF
        if 0xC2 <= c <= 0xDF:
            need, cp = 1, c & 0x1F
        elif 0xE0 <= c <= 0xEF:
            need, cp = 2, c & 0x0F
            if c == 0xE0:
                lo = 0xA0  # no overlong forms
            elif c == 0xED:
                hi = 0x9F  # no surrogates
        elif 0xF0 <= c <= 0xF4:
            need, cp = 3, c & 0x07
            if c == 0xF0:
                lo = 0x90
            elif c == 0xF4:
                hi = 0x8F  # nothing above U+10FFFF
        else:
            h = 31u * h + 0xFFFDu
            continue
        while need > 0:
            if i >= n or p[i] < lo or p[i] > hi:
                break
            cp = (cp << 6) | (p[i] & 0x3F)
            i += 1
            need -= 1
            lo, hi = 0x80, 0xBF
        h = java_hash_unit(h, 0xFFFDu if need > 0 else cp)
    return <int32_t>h


cdef inline int32_t abs_index_hash(uint32_t h) noexcept nogil:
    """IndexService's keyHash: abs(hashCode), with abs(Integer.MIN_VALUE) mapped to 0."""
    cdef int32_t s = <int32_t>h
    if s == <int32_t>0x80000000:
        return 0
    return -s if s < 0 else s
