# A cursor over JSON header bytes, shared by the remoting, client and broker native readers.
# Each reader handles only the plain shapes it knows and declines the rest (`bad`, or a False
# return) so the general Python decoder decides and names what is wrong.
from libc.stdint cimport int64_t, uint8_t, uint32_t


cdef struct Cursor:
    const uint8_t* p
    const uint8_t* end
    bint bad  # something this reader does not handle: decline


cdef inline void skip_ws(Cursor* c) noexcept nogil:
    while c.p < c.end and (c.p[0] == 32 or c.p[0] == 9 or c.p[0] == 10 or c.p[0] == 13):
        c.p += 1


cdef inline bint expect(Cursor* c, uint8_t ch) noexcept nogil:
    """Step over `ch` (after whitespace); sets bad when it is not there."""
    skip_ws(c)
    if c.p < c.end and c.p[0] == ch:
        c.p += 1
        return True
    c.bad = True
    return False


cdef inline int64_t read_int(Cursor* c) noexcept nogil:
    """A JSON integer (no fraction/exponent, no leading zero, at most 18 digits); sets bad otherwise."""
    cdef bint neg = False
    cdef int64_t v = 0
    cdef int digits = 0
    skip_ws(c)
    if c.p < c.end and c.p[0] == 45:  # '-'
        neg = True
        c.p += 1
    if c.p >= c.end or c.p[0] < 48 or c.p[0] > 57:
        c.bad = True
        return 0
    if c.p[0] == 48 and c.p + 1 < c.end and 48 <= c.p[1] <= 57:  # leading zero: not JSON
        c.bad = True
        return 0
    while c.p < c.end and 48 <= c.p[0] <= 57:
        v = v * 10 + (c.p[0] - 48)
        c.p += 1
        digits += 1
        if digits > 18:
            c.bad = True
            return 0
    if c.p < c.end and (c.p[0] == 46 or c.p[0] == 101 or c.p[0] == 69):  # '.', 'e', 'E'
        c.bad = True
        return 0
    return -v if neg else v


cdef inline bint open_json_header(Cursor* c, const uint8_t* frame, Py_ssize_t n) noexcept nogil:
    """Point `c` at a frame's header (`frame`: the bytes after the length prefix, `n` of them):
    False unless the header is JSON (serialize type 0) and fits in the frame."""
    cdef uint32_t len_and_type
    cdef Py_ssize_t header_length
    if n < 4:
        return False
    len_and_type = (<uint32_t>frame[0] << 24) | (<uint32_t>frame[1] << 16) | (<uint32_t>frame[2] << 8) | frame[3]
    if (len_and_type >> 24) != 0:
        return False
    header_length = len_and_type & 0xFFFFFF
    if header_length > n - 4:
        return False
    c.p = frame + 4
    c.end = frame + 4 + header_length
    c.bad = False
    return True


cdef inline int hex_digit(uint8_t ch) noexcept nogil:
    """The value of one hex digit of a \\uXXXX escape; -1 for anything else."""
    if 48 <= ch <= 57:
        return ch - 48
    if 97 <= ch <= 102:
        return ch - 87
    if 65 <= ch <= 70:
        return ch - 55
    return -1


cdef inline bint key_is(const uint8_t* k, Py_ssize_t n, const char* name, Py_ssize_t m) noexcept nogil:
    """Whether the raw key `k` (n bytes) is `name` (m bytes)."""
    cdef Py_ssize_t i
    if n != m:
        return False
    for i in range(n):
        if k[i] != <uint8_t>name[i]:
            return False
    return True


cdef inline bint _scan(Cursor* c, const uint8_t** start, Py_ssize_t* n, bint* escaped,
                       bint ascii_only) noexcept nogil:
    cdef const uint8_t* q
    cdef uint8_t ch
    skip_ws(c)
    if c.p >= c.end or c.p[0] != 34:
        c.bad = True
        return False
    q = c.p + 1
    escaped[0] = False
    while q < c.end:
        ch = q[0]
        if ch == 34:
            start[0] = c.p + 1
            n[0] = q - (c.p + 1)
            c.p = q + 1
            return True
        if ch == 92:
            escaped[0] = True
            q += 2  # the escaped character is checked by whoever unescapes; '"' here must not end it
            continue
        if ch < 32 or (ascii_only and ch >= 128):
            break
        q += 1
    c.bad = True
    return False


cdef inline bint scan_str(Cursor* c, const uint8_t** start, Py_ssize_t* n, bint* escaped) noexcept nogil:
    """A JSON string (cursor before its quote): its raw inside, escapes left in place, and whether
    it holds any; False and c.bad when unterminated or holding a raw control character."""
    return _scan(c, start, n, escaped, False)


cdef inline bint scan_ascii_str(Cursor* c, const uint8_t** start, Py_ssize_t* n, bint* escaped) noexcept nogil:
    """scan_str that also declines any byte >= 0x80 (the general decoder decides those)."""
    return _scan(c, start, n, escaped, True)
