# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""CRC-32 (zlib / java.util.zip.CRC32), the one implementation of the store: crc32.h's PCLMUL /
VPCLMUL folding or slicing-by-8 tables, chosen once at import (or by crc32_select).  The other
native modules call `crc32_update` (crc.pxd), so they all use the implementation selected here."""
from libc.stdint cimport uint32_t

cdef extern from "crc32.h":
    void rmq_crc32_init()
    int rmq_crc32_select(int want_pclmul)
    int rmq_crc32_use_pclmul
    uint32_t rmq_crc32(uint32_t crc, const unsigned char *p, size_t n) nogil


rmq_crc32_init()


cdef uint32_t crc32_update(uint32_t crc, const unsigned char *p, size_t n) noexcept nogil:
    return rmq_crc32(crc, p, n)


# --- CRC32 --------------------------------------------------------------------------------------
def crc32(data, unsigned int value=0):
    """zlib.crc32-compatible CRC-32 of any bytes-like object."""
    cdef const unsigned char[::1] v = data
    if v.shape[0] == 0:
        return value
    return rmq_crc32(value, &v[0], v.shape[0])


def crc32_select(bint pclmul, bint vpclmul=True):
    """Use carry-less multiply folding (if the CPU has it) — with 512-bit VPCLMULQDQ when the CPU
    has that too and `vpclmul` — or the slicing-by-8 tables; returns whether folding is used."""
    return bool(rmq_crc32_select((2 if vpclmul else 1) if pclmul else 0))


def crc32_impl():
    """The CRC32 in use: "vpclmul", "pclmul" or "slice8"."""
    return ("slice8", "pclmul", "vpclmul")[rmq_crc32_use_pclmul]
