# cython: language_level=3
"""HMAC-SHA1 (RFC 2104) for ACL signatures, natively: rmq_core.acl.SigningKey's keyed hash.

The secret's inner and outer pads are hashed once when the key is made; a signature copies those
two SHA-1 states (a struct copy), hashes the content and the body, and Base64-encodes the digest
- OpenSSL's SHA-1 and Base64 (libcrypto), no Python call.  What is signed (the content) is
rmq_core.acl's to define; this only hashes the bytes it is given."""
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize

cdef extern from "openssl/sha.h":
    int SHA1_Init(SHA_CTX* c) nogil
    int SHA1_Update(SHA_CTX* c, const void* data, size_t n) nogil
    int SHA1_Final(unsigned char* md, SHA_CTX* c) nogil

cdef extern from "openssl/evp.h":
    int EVP_EncodeBlock(unsigned char* t, const unsigned char* f, int n) nogil

cdef extern from "openssl/crypto.h":
    int CRYPTO_memcmp(const void* a, const void* b, size_t n) nogil


cdef class HmacSha1:
    """One secret key's HMAC-SHA1, pads hashed once: signature(content, body) -> Base64 bytes."""

    def __init__(self, bytes key):
        cdef unsigned char block[64]
        cdef unsigned char digest[20]
        cdef SHA_CTX c
        cdef Py_ssize_t i, n = len(key)
        cdef const unsigned char* k = <const unsigned char*>PyBytes_AS_STRING(key)
        if n > 64:  # a long key is its SHA-1 (RFC 2104)
            SHA1_Init(&c)
            SHA1_Update(&c, k, n)
            SHA1_Final(digest, &c)
            k, n = digest, 20
        for i in range(64):
            block[i] = (k[i] if i < n else 0) ^ 0x36
        SHA1_Init(&self._inner)
        SHA1_Update(&self._inner, block, 64)
        for i in range(64):
            block[i] = (k[i] if i < n else 0) ^ 0x5C
        SHA1_Init(&self._outer)
        SHA1_Update(&self._outer, block, 64)

    cdef void begin(self, SHA_CTX* c) noexcept nogil:
        c[0] = self._inner

    cdef void update(self, SHA_CTX* c, const void* data, size_t n) noexcept nogil:
        SHA1_Update(c, data, n)

    cdef int finish(self, SHA_CTX* c, unsigned char* out) noexcept nogil:
        """The Base64 signature of what `c` hashed into out[0:28]; its length."""
        cdef unsigned char digest[20]
        SHA1_Final(digest, c)
        c[0] = self._outer
        SHA1_Update(c, digest, 20)
        SHA1_Final(digest, c)
        return EVP_EncodeBlock(out, digest, 20)

    cdef bint matches(self, SHA_CTX* c, const char* signature, Py_ssize_t n) noexcept nogil:
        """finish() compared with `signature` in constant time (CRYPTO_memcmp)."""
        cdef unsigned char out[32]
        return self.finish(c, out) == n and CRYPTO_memcmp(signature, out, n) == 0

    cdef bytes sign(self, const unsigned char* content, Py_ssize_t content_len, body):
        cdef SHA_CTX c
        cdef unsigned char out[32]
        cdef Py_buffer pb
        self.begin(&c)
        SHA1_Update(&c, content, content_len)
        if body is not None:
            PyObject_GetBuffer(body, &pb, PyBUF_SIMPLE)
            try:
                SHA1_Update(&c, pb.buf, pb.len)
            finally:
                PyBuffer_Release(&pb)
        return PyBytes_FromStringAndSize(<char*>out, self.finish(&c, out))

    def verify(self, bytes signature, content, body=None):
        """True when `signature` (Base64 ASCII bytes) is signature(content, body): compared in
        constant time (CRYPTO_memcmp)."""
        cdef Py_buffer cb
        PyObject_GetBuffer(content, &cb, PyBUF_SIMPLE)
        try:
            expected = self.sign(<const unsigned char*>cb.buf, cb.len, body)
        finally:
            PyBuffer_Release(&cb)
        return len(signature) == len(<bytes>expected) and CRYPTO_memcmp(
            PyBytes_AS_STRING(signature), PyBytes_AS_STRING(<bytes>expected), len(signature)) == 0

    def signature(self, content, body=None):
        """Base64(HMAC-SHA1(key, content + body)) as ASCII bytes (content: bytes-like)."""
        cdef Py_buffer cb
        PyObject_GetBuffer(content, &cb, PyBUF_SIMPLE)
        try:
            return self.sign(<const unsigned char*>cb.buf, cb.len, body)
        finally:
            PyBuffer_Release(&cb)
