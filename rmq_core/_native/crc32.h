/* CRC-32 (zlib / java.util.zip.CRC32: reflected polynomial 0xEDB88320, init and final xor ~0).
 *
 * Two implementations chosen once at run time:
 *   - PCLMULQDQ carry-less multiply folding (4 x 128-bit lanes, then Barrett reduction), compiled
 *     with a per-function target attribute so the module still loads on CPUs without PCLMUL
 *     (setup.py never passes -march=native);
 *   - slicing-by-8 tables (portable fallback, and the tail for the folding path).
 * rmq_crc32(crc, buf, len) has zlib.crc32's calling convention: pass the previous result (0 first).
 */
#ifndef RMQ_CRC32_H
#define RMQ_CRC32_H

#include <stdint.h>
#include <stddef.h>
#include <string.h>

static uint32_t rmq_crc32_table[8][256];
static int rmq_crc32_use_pclmul = 0;   /* 0: tables, 1: PCLMULQDQ, 2: VPCLMULQDQ (AVX-512) */

static uint32_t rmq_crc32_slice8(uint32_t crc, const unsigned char *p, size_t n)
{
    /* crc is the running (already inverted) register. */
    while (n && ((uintptr_t)p & 7)) {
        crc = rmq_crc32_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
        n--;
    }
    while (n >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        lo = __builtin_bswap32(lo);
        hi = __builtin_bswap32(hi);
#endif
        lo ^= crc;
        crc = rmq_crc32_table[7][lo & 0xff] ^ rmq_crc32_table[6][(lo >> 8) & 0xff] ^
              rmq_crc32_table[5][(lo >> 16) & 0xff] ^ rmq_crc32_table[4][lo >> 24] ^
              rmq_crc32_table[3][hi & 0xff] ^ rmq_crc32_table[2][(hi >> 8) & 0xff] ^
              rmq_crc32_table[1][(hi >> 16) & 0xff] ^ rmq_crc32_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) crc = rmq_crc32_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define RMQ_HAVE_PCLMUL_PATH 1

/* The last step of both folding CRCs: fold the remaining 16-byte blocks of p into the 128-bit
 * remainder x1, then reduce it 128 -> 64 -> 32 bits (Barrett reduction). */
__attribute__((target("pclmul,sse4.1")))
static inline uint32_t rmq_crc32_fold_16(__m128i x1, const unsigned char *p, size_t n)
{
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
    const __m128i k5k0 = _mm_set_epi64x(0, 0x0163cd6124LL);
    const __m128i poly = _mm_set_epi64x(0x01f7011641LL, 0x01db710641LL);
    const __m128i mask32 = _mm_setr_epi32(~0, 0, ~0, 0);
    __m128i x2, x5;

    while (n >= 16) {
        x2 = _mm_loadu_si128((const __m128i *)p);
        x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
        x1 = _mm_clmulepi64_si128(x1, k3k4, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
        p += 16;
        n -= 16;
    }
    x2 = _mm_clmulepi64_si128(x1, k3k4, 0x10);
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2);
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_clmulepi64_si128(_mm_and_si128(x1, mask32), k5k0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    x2 = _mm_clmulepi64_si128(_mm_and_si128(x1, mask32), poly, 0x10);
    x2 = _mm_clmulepi64_si128(_mm_and_si128(x2, mask32), poly, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}

/* Folding constants for the reflected polynomial: x^(k) mod P(x), bit-reflected and shifted as the
 * Intel "Fast CRC Computation Using PCLMULQDQ" paper derives them (k1/k2 fold 512 bits, k3/k4 fold
 * 128 bits, k5 folds 64->32; poly/mu drive the Barrett reduction). */
__attribute__((target("pclmul,sse4.1")))
static uint32_t rmq_crc32_pclmul(uint32_t crc, const unsigned char *p, size_t n)
{
    /* Needs n >= 64; processes a multiple of 16 bytes, the caller finishes the tail. */
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596LL, 0x0154442bd4LL);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
    __m128i x1, x2, x3, x4, x5, x6, x7, x8;

    x1 = _mm_loadu_si128((const __m128i *)(p + 0x00));
    x2 = _mm_loadu_si128((const __m128i *)(p + 0x10));
    x3 = _mm_loadu_si128((const __m128i *)(p + 0x20));
    x4 = _mm_loadu_si128((const __m128i *)(p + 0x30));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)crc));
    p += 64;
    n -= 64;
    while (n >= 64) {
        x5 = _mm_clmulepi64_si128(x1, k1k2, 0x00);
        x6 = _mm_clmulepi64_si128(x2, k1k2, 0x00);
        x7 = _mm_clmulepi64_si128(x3, k1k2, 0x00);
        x8 = _mm_clmulepi64_si128(x4, k1k2, 0x00);
        x1 = _mm_clmulepi64_si128(x1, k1k2, 0x11);
        x2 = _mm_clmulepi64_si128(x2, k1k2, 0x11);
        x3 = _mm_clmulepi64_si128(x3, k1k2, 0x11);
        x4 = _mm_clmulepi64_si128(x4, k1k2, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), _mm_loadu_si128((const __m128i *)(p + 0x00)));
        x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), _mm_loadu_si128((const __m128i *)(p + 0x10)));
        x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), _mm_loadu_si128((const __m128i *)(p + 0x20)));
        x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), _mm_loadu_si128((const __m128i *)(p + 0x30)));
        p += 64;
        n -= 64;
    }
    /* 4 lanes -> 1 */
    x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
    x1 = _mm_clmulepi64_si128(x1, k3k4, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
    x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
    x1 = _mm_clmulepi64_si128(x1, k3k4, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x3), x5);
    x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
    x1 = _mm_clmulepi64_si128(x1, k3k4, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x4), x5);
    return rmq_crc32_fold_16(x1, p, n);
}

/* The same folding with 512-bit carry-less multiplies (VPCLMULQDQ + AVX-512), for CPUs that have
 * them: one instruction folds all four 16-byte lanes of a 64-byte block, and the four lanes are
 * folded into one in parallel (each by its own distance to the block's end: 48, 32, 16 bytes)
 * instead of one after another.  A 128-byte body takes 9 multiplies instead of 19.  Constants:
 * x^(8d+32) mod P and x^(8d-32) mod P, bit-reflected and shifted left once, for a distance of d
 * bytes (d = 64 and 16 give k1/k2 and k3/k4 above).  Needs n >= 64, a multiple of 16. */
__attribute__((target("avx512f,avx512vl,avx2,vpclmulqdq,pclmul,sse4.1")))
static uint32_t rmq_crc32_vpclmul(uint32_t crc, const unsigned char *p, size_t n)
{
    const __m512i k64 = _mm512_broadcast_i32x4(_mm_set_epi64x(0x01c6e41596LL, 0x0154442bd4LL));
    /* lane 0 folds 48 bytes, lane 1 32, lane 2 16; lane 3 is the block's last lane (kept as is) */
    const __m512i k_lanes = _mm512_set_epi64(0, 0, 0x00ccaa009eLL, 0x01751997d0LL,
                                             0x015a546366LL, 0x00f1da05aaLL, 0x0174359406LL, 0x003db1ecdcLL);
    __m512i z, t;
    __m256i h;
    __m128i x1;

    z = _mm512_xor_si512(_mm512_loadu_si512((const void *)p), _mm512_castsi128_si512(_mm_cvtsi32_si128((int)crc)));
    p += 64;
    n -= 64;
    while (n >= 64) {
        z = _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(z, k64, 0x00), _mm512_clmulepi64_epi128(z, k64, 0x11),
                                      _mm512_loadu_si512((const void *)p), 0x96);  /* a ^ b ^ c */
        p += 64;
        n -= 64;
    }
    /* 4 lanes -> 1: lanes 0..2 moved onto lane 3's place, then everything xored */
    t = _mm512_xor_si512(_mm512_clmulepi64_epi128(z, k_lanes, 0x00), _mm512_clmulepi64_epi128(z, k_lanes, 0x11));
    h = _mm256_xor_si256(_mm512_castsi512_si256(t), _mm512_extracti64x4_epi64(t, 1));
    x1 = _mm_xor_si128(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    x1 = _mm_xor_si128(x1, _mm512_extracti32x4_epi32(z, 3));
    return rmq_crc32_fold_16(x1, p, n);
}
#endif

/* Choose the implementation: 2 = VPCLMULQDQ if the CPU has it (else as 1), 1 = PCLMUL if the CPU
 * has it (else tables), 0 = tables.  Returns the one in use. */
static int rmq_crc32_select(int want_pclmul)
{
#ifdef RMQ_HAVE_PCLMUL_PATH
    int pclmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
    int vpclmul = pclmul && __builtin_cpu_supports("vpclmulqdq") && __builtin_cpu_supports("avx512f") &&
                  __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2");
    rmq_crc32_use_pclmul = want_pclmul >= 2 && vpclmul ? 2 : want_pclmul >= 1 && pclmul ? 1 : 0;
#else
    (void)want_pclmul;
    rmq_crc32_use_pclmul = 0;
#endif
    return rmq_crc32_use_pclmul;
}

static void rmq_crc32_init(void)
{
    uint32_t i, j, c;
    for (i = 0; i < 256; i++) {
        c = i;
        for (j = 0; j < 8; j++) c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
        rmq_crc32_table[0][i] = c;
    }
    for (i = 0; i < 256; i++) {
        c = rmq_crc32_table[0][i];
        for (j = 1; j < 8; j++) {
            c = rmq_crc32_table[0][c & 0xff] ^ (c >> 8);
            rmq_crc32_table[j][i] = c;
        }
    }
#ifdef RMQ_HAVE_PCLMUL_PATH
    __builtin_cpu_init();
#endif
    rmq_crc32_select(2);
}

static inline uint32_t rmq_crc32(uint32_t crc, const unsigned char *p, size_t n)
{
    crc = ~crc;
#ifdef RMQ_HAVE_PCLMUL_PATH
    if (rmq_crc32_use_pclmul && n >= 64) {
        size_t bulk = n & ~(size_t)15;
        crc = rmq_crc32_use_pclmul == 2 ? rmq_crc32_vpclmul(crc, p, bulk) : rmq_crc32_pclmul(crc, p, bulk);
        p += bulk;
        n -= bulk;
    }
#endif
    return ~rmq_crc32_slice8(crc, p, n);
}

#endif
