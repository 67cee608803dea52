/* Big-endian loads and stores of the store's binary formats (commit-log records, consume-queue
   entries) and the one-tag consume-queue scans, shared by the store's native modules. */
#ifndef RMQ_STORE_BYTES_H
#define RMQ_STORE_BYTES_H
#include <stdint.h>
#include <string.h>
static inline uint32_t rmq_ld32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return __builtin_bswap32(v); }
static inline uint64_t rmq_ld64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return __builtin_bswap64(v); }
static inline uint16_t rmq_ld16(const unsigned char *p) { uint16_t v; memcpy(&v, p, 2); return __builtin_bswap16(v); }
static inline void rmq_st32(unsigned char *p, uint32_t v) { v = __builtin_bswap32(v); memcpy(p, &v, 4); }
static inline void rmq_st64(unsigned char *p, uint64_t v) { v = __builtin_bswap64(v); memcpy(p, &v, 8); }
static inline void rmq_st16(unsigned char *p, uint16_t v) { v = __builtin_bswap16(v); memcpy(p, &v, 2); }
static inline uint64_t rmq_bswap64(uint64_t v) { return __builtin_bswap64(v); }
static inline uint64_t rmq_ldu64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }

/* The value of the LAST "name\x01value\x02" pair named key: later pairs win, as in the Java broker
   (MessageDecoder.string2messageProperties fills a HashMap) and in record.pyx's decoded dict.  A
   piece without \x01 is no pair; the value runs to the next \x02 or the end.  Sets *vs / *vl
   (value start and length) and returns 1, or returns 0 when there is no such pair. */
static inline int rmq_find_prop(const unsigned char *p, size_t n, const char *key, size_t klen,
                                size_t *vs, size_t *vl) {
    size_t i = 0, end;
    int found = 0;
    const unsigned char *e, *k;
    if (klen == 0) return 0;
    while (i < n) {
        e = (const unsigned char *)memchr(p + i, 2, n - i);
        end = e ? (size_t)(e - p) : n;
        k = (const unsigned char *)memchr(p + i, 1, end - i);
        if (k && (size_t)(k - p) - i == klen && memcmp(p + i, key, klen) == 0) {
            *vs = (size_t)(k - p) + 1;
            *vl = end - *vs;
            found = 1;
        }
        i = end + 1;
    }
    return found;
}

/* One-tag consume-queue scans.  `code` is the tag code's big-endian image, so an entry's
   bytes 12..20 are compared as loaded (no byte swap per entry).  The scan is bound by memory
   bandwidth: 16 entries (320 bytes, five cache lines) per step, each line prefetched 4 KiB
   ahead (the hardware prefetcher stops at page boundaries; a prefetch never faults), and one
   branch per step, taken only when the step holds a hit. */
#define RMQ_CQ_UNIT 20
#define RMQ_CQ_STEP (16 * RMQ_CQ_UNIT)
#define RMQ_CQ_AHEAD 4096
static inline void rmq_cq_prefetch_step(const unsigned char *p) {
    __builtin_prefetch(p + RMQ_CQ_AHEAD);
    __builtin_prefetch(p + RMQ_CQ_AHEAD + 64);
    __builtin_prefetch(p + RMQ_CQ_AHEAD + 128);
    __builtin_prefetch(p + RMQ_CQ_AHEAD + 192);
    __builtin_prefetch(p + RMQ_CQ_AHEAD + 256);
}
/* Entries in [pos, end) whose tag image is `code` (pos and end relative to p). */
static inline Py_ssize_t rmq_cq_count1(const unsigned char *p, Py_ssize_t pos, Py_ssize_t end, uint64_t code) {
    Py_ssize_t found = 0;
    while (pos + RMQ_CQ_STEP <= end) {
        const unsigned char *q = p + pos + 12;
        Py_ssize_t f = 0;
        int k;
        rmq_cq_prefetch_step(p + pos);
        for (k = 0; k < 16; k++) f += rmq_ldu64(q + k * RMQ_CQ_UNIT) == code;
        found += f;
        pos += RMQ_CQ_STEP;
    }
    for (; pos + RMQ_CQ_UNIT <= end; pos += RMQ_CQ_UNIT) found += rmq_ldu64(p + pos + 12) == code;
    return found;
}
/* Byte position of the first entry at or after pos whose tag image is `code`; when there is
   none, the first position past the last whole entry (pos + RMQ_CQ_UNIT > end). */
static inline Py_ssize_t rmq_cq_next1(const unsigned char *p, Py_ssize_t pos, Py_ssize_t end, uint64_t code) {
    while (pos + RMQ_CQ_STEP <= end) {
        const unsigned char *q = p + pos + 12;
        int hit = 0, k;
        rmq_cq_prefetch_step(p + pos);
        for (k = 0; k < 16; k++) hit |= rmq_ldu64(q + k * RMQ_CQ_UNIT) == code;
        if (__builtin_expect(hit, 0)) break;
        pos += RMQ_CQ_STEP;
    }
    for (; pos + RMQ_CQ_UNIT <= end; pos += RMQ_CQ_UNIT)
        if (rmq_ldu64(p + pos + 12) == code) return pos;
    return pos;
}
#endif
