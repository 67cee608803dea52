# The CRC-32 of crc.pyx for the other native modules (one implementation, one selection).
from libc.stdint cimport uint32_t

cdef uint32_t crc32_update(uint32_t crc, const unsigned char *p, size_t n) noexcept nogil
