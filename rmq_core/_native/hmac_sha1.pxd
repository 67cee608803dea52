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
