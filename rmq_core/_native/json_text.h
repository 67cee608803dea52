/* JSON text written byte for byte as Python's json encoder writes it (RemotingCommand's JSON
   header).  Shared by the remoting, client and broker native modules, which build headers
   straight into their own output buffers; the caller reserves the room named below. */
#ifndef RMQ_JSON_TEXT_H
#define RMQ_JSON_TEXT_H

#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A growing output buffer.  `buf` may start as the caller's stack buffer (heap == 0: copied to the
   heap on first growth) or NULL with cap 0 (a zeroed struct works). */
typedef struct {
    char *buf;
    Py_ssize_t n;
    Py_ssize_t cap;
    int heap;
} rmq_out;

/* Room for `extra` more bytes: capacity doubles (from 4 KiB when empty).  -1 with MemoryError set. */
static inline int rmq_out_reserve(rmq_out *o, Py_ssize_t extra) {
    Py_ssize_t cap;
    char *nb;
    if (o->n + extra <= o->cap)
        return 0;
    cap = o->cap ? o->cap : 4096;
    while (o->n + extra > cap)
        cap *= 2;
    if (o->heap) {
        nb = (char *)realloc(o->buf, (size_t)cap);
    } else {
        nb = (char *)malloc((size_t)cap);
        if (nb != NULL && o->n)
            memcpy(nb, o->buf, (size_t)o->n);
    }
    if (nb == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    o->buf = nb;
    o->cap = cap;
    o->heap = 1;
    return 0;
}

/* A decimal integer (no quotes).  Needs room for 20 bytes. */
static inline char *rmq_json_int(char *w, int64_t v) {
    char tmp[24];
    int i = 24;
    int neg = v < 0;
    unsigned long long u = neg ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    if (u == 0)
        tmp[--i] = '0';
    while (u) {
        tmp[--i] = (char)('0' + u % 10);
        u /= 10;
    }
    if (neg)
        tmp[--i] = '-';
    memcpy(w, tmp + i, (size_t)(24 - i));
    return w + (24 - i);
}

/* UTF-8 bytes as the inside of a JSON string literal (no quotes), escaped as
   json.encoder.encode_basestring does: quote, backslash and control characters; non-ASCII kept.
   Runs needing no escape (nearly all of a header) are copied with memcpy.  Needs room for 6 * n. */
static inline char *rmq_json_escaped(char *w, const char *p, Py_ssize_t n) {
    static const char hex[] = "0123456789abcdef";
    Py_ssize_t i, run = 0;
    for (i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)p[i];
        if (ch >= 32 && ch != '"' && ch != '\\')
            continue;
        if (i > run) {
            memcpy(w, p + run, (size_t)(i - run));
            w += i - run;
        }
        run = i + 1;
        *w++ = '\\';
        switch (ch) {
        case '"': case '\\': *w++ = (char)ch; break;
        case '\n': *w++ = 'n'; break;
        case '\r': *w++ = 'r'; break;
        case '\t': *w++ = 't'; break;
        case '\b': *w++ = 'b'; break;
        case '\f': *w++ = 'f'; break;
        default:
            *w++ = 'u'; *w++ = '0'; *w++ = '0';
            *w++ = hex[ch >> 4];
            *w++ = hex[ch & 15];
        }
    }
    if (n > run) {
        memcpy(w, p + run, (size_t)(n - run));
        w += n - run;
    }
    return w;
}

#endif
