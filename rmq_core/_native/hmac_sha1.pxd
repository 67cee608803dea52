# HMAC-SHA1 with a secret's pads hashed once (rmq_core.acl.SigningKey's keyed hash), over OpenSSL's
# SHA-1 (libcrypto): frame.pyx's SendHeader calls it without a Python call.
cdef extern from *:
    """
    /* SHA1_Init/Update/Final: deprecated in OpenSSL 3 for EVP, kept: a state copied as a struct */
    #define OPENSSL_SUPPRESS_DEPRECATED
    """

cdef extern from "openssl/sha.h":
    ctypedef struct SHA_CTX:
        pass


cdef class HmacSha1:
    cdef SHA_CTX _inner  # SHA-1 state after the key XOR ipad block
    cdef SHA_CTX _outer  # ... after the key XOR opad block

    cdef bytes sign(self, const unsigned char* content, Py_ssize_t content_len, body)
    # a keyed hash fed in pieces (the broker lane's check of a signed send, send_lane.pyx):
    # begin, update per piece, then matches(the Base64 signature it came with)
    cdef void begin(self, SHA_CTX* c) noexcept nogil
    cdef void update(self, SHA_CTX* c, const void* data, size_t n) noexcept nogil
    cdef int finish(self, SHA_CTX* c, unsigned char* out) noexcept nogil
    cdef bint matches(self, SHA_CTX* c, const char* signature, Py_ssize_t n) noexcept nogil
