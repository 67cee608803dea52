/* Batch encoding of SEND_BATCH_MESSAGE items into commit-log records (the 4.x v1 layout of
 * docs/protocol.md §5), straight into space reserved in a mapped segment.
 *
 * Why a C header: the loop runs once per record with a budget of ~20-30 ns besides the copy, so
 * it must be plain C the compiler can schedule freely:
 *   - everything constant for the batch (magic, queue id, sys flag, born time, hosts, store time,
 *     reconsume times, prepared offset, topic) is laid out once in a template; a record is the
 *     template copied with fixed-size moves, then the few varying fields patched in;
 *   - the tag hash of TAGS is computed once per distinct properties string (a batch usually
 *     repeats the same one);
 *   - the consume-queue entry is written next to the record, so the caller needs no second pass.
 * The caller has validated the whole batch (record.encode_batch, plan mode) before the put
 * lock; this code trusts item sizes and only stops when the reserved space ends.
 */
#ifndef RMQ_STORE_BATCH_H
#define RMQ_STORE_BATCH_H

#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include "store_bytes.h"  /* rmq_find_prop: the one property lookup */

/* The body CRC-32: crc.pyx's (the one implementation and its selected variant), set by
   commit_log.pyx when it is imported. */
typedef uint32_t (*rmq_crc_fn)(uint32_t, const unsigned char *, size_t);
static rmq_crc_fn rmq_batch_crc32;

#define RMQ_MAX_HEAD 112      /* 72 + 20 + 20: both hosts IPv6 */
#define RMQ_HEAD_V4 88        /* 72 + 8 + 8 */
#define RMQ_MAX_TOPIC_TAIL 128

typedef struct {
    unsigned char head[RMQ_MAX_HEAD];  /* bytes 0 .. head_len of every record */
    size_t head_len;                   /* up to and including BODYLENGTH */
    unsigned char tail[RMQ_MAX_TOPIC_TAIL + 8]; /* TOPICLENGTH u8 + topic */
    size_t tail_len;
    const unsigned char *extra;        /* properties appended to every item's own */
    size_t extra_len;
    size_t fixed;                      /* record length without body and properties */
} rmq_batch_tmpl;

static inline void rmq_bst32(unsigned char *p, uint32_t v) { v = __builtin_bswap32(v); memcpy(p, &v, 4); }
static inline void rmq_bst64(unsigned char *p, uint64_t v) { v = __builtin_bswap64(v); memcpy(p, &v, 8); }
static inline uint32_t rmq_bld32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return __builtin_bswap32(v); }
static inline uint16_t rmq_bld16(const unsigned char *p) { uint16_t v; memcpy(&v, p, 2); return __builtin_bswap16(v); }

/* born_host / store_host: 8 (IPv4) or 20 (IPv6) encoded bytes, as sys_flag says; magic: the
   message magic code, passed in so that record_layout.pxd stays its one definition. */
static void rmq_batch_tmpl_init(rmq_batch_tmpl *t, uint32_t magic, int32_t queue_id, int32_t sys_flag, int64_t born_ts,
                                const unsigned char *born_host, size_t bh_len,
                                const unsigned char *store_host, size_t sh_len,
                                int32_t reconsume, int64_t store_ts,
                                const unsigned char *topic, size_t topic_len,
                                const unsigned char *extra, size_t extra_len)
{
    unsigned char *q = t->head;
    memset(t->head, 0, sizeof(t->head));
    q += 4;                                   /* TOTALSIZE: per record */
    rmq_bst32(q, magic); q += 4;              /* MAGICCODE (record_layout.pxd's) */
    q += 4;                                   /* BODYCRC: per record */
    rmq_bst32(q, (uint32_t)queue_id); q += 4;
    q += 4;                                   /* FLAG: per item */
    q += 16;                                  /* QUEUEOFFSET, PHYSICALOFFSET: per record */
    rmq_bst32(q, (uint32_t)sys_flag); q += 4;
    rmq_bst64(q, (uint64_t)born_ts); q += 8;
    memcpy(q, born_host, bh_len); q += bh_len;
    rmq_bst64(q, (uint64_t)store_ts); q += 8;
    memcpy(q, store_host, sh_len); q += sh_len;
    rmq_bst32(q, (uint32_t)reconsume); q += 4;
    q += 8;                                   /* PREPARED_TRANSACTION_OFFSET: 0 for a batch */
    q += 4;                                   /* BODYLENGTH: per item */
    t->head_len = (size_t)(q - t->head);
    t->tail[0] = (unsigned char)topic_len;
    memcpy(t->tail + 1, topic, topic_len);
    t->tail_len = 1 + topic_len;
    t->extra = extra;
    t->extra_len = extra_len;
    t->fixed = t->head_len + t->tail_len + 2;
}

/* Remembers the last properties string and its tag code: items of a batch mostly repeat it. */
typedef struct {
    const unsigned char *props;
    size_t len;
    int64_t code;
} rmq_tag_cache;

/* Java String.hashCode of UTF-8 text; the callback is java_hash.pxd's java_hash_utf8. */
typedef int32_t (*rmq_hash_fn)(const unsigned char *, ptrdiff_t);

static inline int64_t rmq_item_tags_code(rmq_tag_cache *c, const unsigned char *props, size_t plen,
                                         const rmq_batch_tmpl *t, rmq_hash_fn hash)
{
    size_t vs = 0, vl = 0;
    int64_t code;
    if (c->props != NULL && c->len == plen && memcmp(c->props, props, plen) == 0)
        return c->code;
    /* the record's properties are the item's, then the extra ones: the last TAGS wins */
    code = 0;
    if (t->extra_len && rmq_find_prop(t->extra, t->extra_len, "TAGS", 4, &vs, &vl)) {
        if (vl > 0) code = hash(t->extra + vs, (ptrdiff_t)vl);
    } else if (rmq_find_prop(props, plen, "TAGS", 4, &vs, &vl) && vl > 0) {
        code = hash(props + vs, (ptrdiff_t)vl);
    }
    c->props = props;
    c->len = plen;
    c->code = code;
    return code;
}

/* Encode items from s + *body_pos (the batch body) into dst[0 .. dst_len) with ordinary stores,
 * and their 20-byte consume-queue entries into cq.  phys0 is the commit-log offset of dst[0], qoff0
 * the queue offset of the first item.  Returns the records written (stops when the next one does
 * not fit dst_len) and advances *body_pos past them; *wrote gets their bytes. */
static size_t rmq_batch_encode_plain(const rmq_batch_tmpl *t, const unsigned char *s, size_t *body_pos, size_t n_items,
                               unsigned char *dst, size_t dst_len, int64_t phys0, int64_t qoff0,
                               unsigned char *cq, rmq_tag_cache *tc, rmq_hash_fn hash, size_t *wrote)
{
    size_t i, pos = 0, bp = *body_pos;
    const size_t head_len = t->head_len, tail_len = t->tail_len, exl = t->extra_len;
    const size_t fixed = t->fixed;
    const int v4 = head_len == RMQ_HEAD_V4;
    for (i = 0; i < n_items; i++) {
        const unsigned char *item = s + bp;
        uint32_t item_total = rmq_bld32(item);
        uint32_t flag = rmq_bld32(item + 12);
        size_t blen = rmq_bld32(item + 16);
        const unsigned char *body = item + 20;
        size_t plen = (int16_t)rmq_bld16(body + blen);
        const unsigned char *props = body + blen + 2;
        int sep = plen > 0 && exl > 0 && props[plen - 1] != 2;
        size_t all_props = plen + exl + (size_t)sep;
        size_t rlen = fixed + blen + all_props;
        unsigned char *d, *q;
        int64_t phys = phys0 + (int64_t)pos;
        if (pos + rlen > dst_len) break;
        d = dst + pos;
        if (v4) memcpy(d, t->head, RMQ_HEAD_V4);  /* fixed size: a few vector moves */
        else memcpy(d, t->head, head_len);
        rmq_bst32(d, (uint32_t)rlen);
        rmq_bst32(d + 8, rmq_batch_crc32(0, body, blen) & 0x7FFFFFFFu);
        rmq_bst32(d + 16, flag);
        rmq_bst64(d + 20, (uint64_t)(qoff0 + (int64_t)i));
        rmq_bst64(d + 28, (uint64_t)phys);
        rmq_bst32(d + head_len - 4, (uint32_t)blen);
        q = d + head_len;
        memcpy(q, body, blen); q += blen;
        memcpy(q, t->tail, tail_len); q += tail_len;
        q[0] = (unsigned char)(all_props >> 8);
        q[1] = (unsigned char)all_props;
        q += 2;
        memcpy(q, props, plen); q += plen;
        if (sep) *q++ = 2;
        if (exl) memcpy(q, t->extra, exl);
        rmq_bst64(cq, (uint64_t)phys);
        rmq_bst32(cq + 8, (uint32_t)rlen);
        rmq_bst64(cq + 12, (uint64_t)rmq_item_tags_code(tc, props, plen, t, hash));
        cq += 20;
        pos += rlen;
        bp += item_total;
    }
    *body_pos = bp;
    *wrote = pos;
    return i;
}

#include <emmintrin.h>

/* Copy n bytes to d, whose address is 64-byte aligned, with non-temporal stores (n a multiple of 64).
 * s may be unaligned (loadu costs nothing more than load on an aligned s since Nehalem). */
static inline void rmq_stream_lines(unsigned char *d, const unsigned char *s, size_t n)
{
    while (n) {
        __m128i a = _mm_loadu_si128((const __m128i *)s), b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + 32)), e = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_stream_si128((__m128i *)d, a);
        _mm_stream_si128((__m128i *)(d + 16), b);
        _mm_stream_si128((__m128i *)(d + 32), c);
        _mm_stream_si128((__m128i *)(d + 48), e);
        d += 64; s += 64; n -= 64;
    }
}

/* memcpy for a large copy into a mapped file (a batch's consume-queue entries): the whole 64-byte
 * lines of dst by streaming stores, the partial first and last lines ordinarily.  The lines are
 * fresh (beyond the file's write position), so ordinary stores would first read each of them from
 * memory only to overwrite it.  Ends with a store fence: the caller publishes the bytes after. */
static void rmq_stream_copy(unsigned char *d, const unsigned char *s, size_t n)
{
    size_t head = (64 - ((uintptr_t)d & 63)) & 63, lines;
    if (head > n) head = n;
    memcpy(d, s, head);
    d += head; s += head; n -= head;
    lines = n & ~(size_t)63;
    rmq_stream_lines(d, s, lines);
    d += lines; s += lines; n -= lines;
    memcpy(d, s, n);
    _mm_sfence();
}

#define RMQ_STAGE 16384

/* rmq_batch_encode_plain through a small staging buffer that stays in L1: records are built there
 * and reach the segment in whole 64-byte lines with streaming stores.  Ordinary stores to the
 * segment would first read every destination line from memory (read-for-ownership) only to
 * overwrite it: twice the memory traffic of the copy itself, which is what bounds this loop.
 * A line never gets both streaming and ordinary stores from here (the partial first and last lines
 * are written ordinarily, whole lines only by streaming); the caller publishes the records after a
 * lock operation, which orders the streaming stores before it (and an sfence ends this call). */
static size_t rmq_batch_encode(const rmq_batch_tmpl *t, const unsigned char *s, size_t *body_pos, size_t n_items,
                               unsigned char *dst, size_t dst_len, int64_t phys0, int64_t qoff0,
                               unsigned char *cq, rmq_tag_cache *tc, rmq_hash_fn hash)
{
    /* stage[0 .. used) holds the bytes for dst[flushed .. flushed + used) */
    unsigned char stage[RMQ_STAGE + 64] __attribute__((aligned(64)));
    size_t done = 0, flushed = 0, used = 0, wrote, k, head, lines;
    unsigned char *stage_base, *d;
    int drain;
    if (dst_len < 4 * RMQ_STAGE)
        return rmq_batch_encode_plain(t, s, body_pos, n_items, dst, dst_len, phys0, qoff0, cq, tc, hash, &wrote);
    /* stage_base is as far into a line as dst + flushed, so whole lines are aligned on both sides */
    stage_base = stage + ((uintptr_t)dst & 63);
    while (done < n_items) {
        size_t room = RMQ_STAGE - used;
        if (flushed + used + room > dst_len) room = dst_len - flushed - used;
        k = rmq_batch_encode_plain(t, s, body_pos, n_items - done, stage_base + used, room,
                                   phys0 + (int64_t)(flushed + used), qoff0 + (int64_t)done, cq + done * 20, tc, hash,
                                   &wrote);
        used += wrote;
        done += k;
        if (k == 0 && used == 0) {
            /* a record larger than the stage (or one past dst_len): written in place */
            k = rmq_batch_encode_plain(t, s, body_pos, 1, dst + flushed, dst_len - flushed,
                                       phys0 + (int64_t)flushed, qoff0 + (int64_t)done, cq + done * 20, tc, hash,
                                       &wrote);
            if (k == 0) break;
            done += k;
            flushed += wrote;
            stage_base = stage + ((uintptr_t)(dst + flushed) & 63);
            continue;
        }
        drain = k == 0 || done == n_items;
        if (!drain && used < RMQ_STAGE / 2) continue;  /* fill the stage further first */
        /* copy out: the partial line up to dst's next line boundary ordinarily, whole lines by
         * streaming; the rest (< 64 bytes) moves to the front of the stage, or out as well when
         * draining */
        d = dst + flushed;
        head = (64 - ((uintptr_t)d & 63)) & 63;
        if (head > used) head = used;
        memcpy(d, stage_base, head);
        lines = (used - head) & ~(size_t)63;
        rmq_stream_lines(d + head, stage_base + head, lines);
        flushed += head + lines;
        used -= head + lines;
        if (used && drain) {
            memcpy(dst + flushed, stage_base + head + lines, used);
            flushed += used;
            used = 0;
        }
        d = stage + ((uintptr_t)(dst + flushed) & 63);
        if (used) memmove(d, stage_base + head + lines, used);
        stage_base = d;
    }
    _mm_sfence();
    return done;
}

/* Validate and size a whole batch body s[0 .. n) (docs/protocol.md §5.5) in one tight pass: every item
 * header consistent with its body and properties lengths, no record's properties (with the extra
 * ones) over max_props, no record over max_record.  Returns 0 with *count and *total (bytes of all
 * records, each `fixed` + body + properties), or -1 at the first problem: the caller then walks the
 * batch again to name it (commit_log.encode_batch), so this loop carries no error reporting. */
static int rmq_batch_plan(const unsigned char *s, size_t n, size_t fixed, size_t extra_len, size_t max_props,
                          size_t max_record, size_t *count, size_t *total)
{
    size_t pos = 0, k = 0, sum = 0;
    while (pos < n) {
        size_t left = n - pos, props, rlen;
        int64_t item_total, blen, plen;
        if (left < 20) return -1;
        /* each item's position comes from the previous item's header: a chain of loads that runs at
         * cache latency unless the lines ahead are already on their way (prefetch never faults) */
        __builtin_prefetch(s + pos + 2048);
        __builtin_prefetch(s + pos + 2112);
        __builtin_prefetch(s + pos + 2176);
        __builtin_prefetch(s + pos + 2240);
        item_total = (int32_t)rmq_bld32(s + pos);
        blen = (int32_t)rmq_bld32(s + pos + 16);
        if (blen < 0 || (uint64_t)blen + 22 > left) return -1;
        plen = (int16_t)rmq_bld16(s + pos + 20 + blen);
        if (plen < 0 || (uint64_t)(blen + plen) + 22 > left || item_total != 22 + blen + plen) return -1;
        props = (size_t)plen + extra_len;
        if (plen > 0 && extra_len > 0 && s[pos + 22 + blen + plen - 1] != 2) props++;  /* separator */
        rlen = fixed + (size_t)blen + props;
        if (props > max_props || rlen > max_record) return -1;
        sum += rlen;
        k++;
        pos += (size_t)item_total;
    }
    *count = k;
    *total = sum;
    return 0;
}

/* How many items from s + body_pos fit a segment whose write position is write_pos (each record
 * must leave 8 bytes for the end-of-file blank): the count, their bytes and the next body position. */
static size_t rmq_batch_fit(const rmq_batch_tmpl *t, const unsigned char *s, size_t body_pos, size_t n_items,
                            size_t write_pos, size_t file_size, size_t *nbytes, size_t *next_body_pos)
{
    size_t i, pos = write_pos, bp = body_pos;
    for (i = 0; i < n_items; i++) {
        const unsigned char *item = s + bp;
        size_t blen = rmq_bld32(item + 16);
        size_t plen = (int16_t)rmq_bld16(item + 20 + blen);
        int sep = plen > 0 && t->extra_len > 0 && item[20 + blen + 2 + plen - 1] != 2;
        size_t rlen = t->fixed + blen + plen + t->extra_len + (size_t)sep;
        if (pos + rlen + 8 > file_size) break;
        pos += rlen;
        bp += rmq_bld32(item);
    }
    *nbytes = pos - write_pos;
    *next_body_pos = bp;
    return i;
}

#endif
