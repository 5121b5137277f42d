/* y[N, rows] = x[N, cols] . W^T with W in GGUF Q4_1 or Q8_0 blocks, read as shipped, float32 out.
 *
 * A row of W is cols / 32 blocks. Q4_1: fp16 d, fp16 m, 16 bytes of nibbles (low nibbles are
 * elements 0..15, high nibbles 16..31), w = d * q + m. Q8_0: fp16 d, 32 int8, w = d * q.
 * Exact arithmetic (fp32 activations, fp32 sums): per block and activation row,
 *   x . w_block = d * sum(q_i x_i) + m * sum(x_i),
 * with sum(x_i) computed once per block of each activation row. The 32 products of a block are
 * summed in 8 lanes (4 chunks of 8, chunk c = elements 8c..8c+7), scaled by d into 8 lane
 * accumulators per output, and the lanes are reduced at the row's end in one fixed order; the
 * scalar path follows the same order with fmaf, so both paths give bit-identical results.
 * Each weight block is unpacked once and applied to a tile of up to TILE activation rows.
 * Output rows are claimed in chunks by a persistent pool of threads (the caller's included):
 * workers spin briefly on a generation counter, then sleep on a futex.
 */
/* rounding is spelled out (fmaf where fused): no compiler contraction of a * b + c */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define HAVE_AVX2 1
#else
#define HAVE_AVX2 0
#endif

#define QK 32
#define TYPE_Q4_1 3 /* ggml type ids */
#define TYPE_Q8_0 8
#define TILE 8        /* activation rows sharing one unpacked weight block */
#define MAX_THREADS 64
#define SPIN_NS 200000 /* a worker spins this long for the next call before sleeping */

static int32_t isa = 0; /* the path calls take (gguf_set_isa): 0 scalar, 1 AVX2, 2 AVX-512 */


static inline float fp16_to_fp32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        const float f = (float)man * 5.9604644775390625e-8f; /* man * 2^-24, exact */
        memcpy(&bits, &f, 4);
        bits |= sign;
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    }
    float out;
    memcpy(&out, &bits, 4);
    return out;
}

static inline uint16_t rd16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static inline int64_t block_bytes(int32_t type) { return type == TYPE_Q4_1 ? 20 : type == TYPE_Q8_0 ? 34 : 0; }

/* sx[n * nb + b] = sum of block b of activation row n (only Q4_1 needs it) */
static void block_sums(const float *x, int64_t ldx, int64_t n, int64_t nb, float *sx) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t b = 0; b < nb; b++) {
            const float *p = x + i * ldx + b * QK;
            float s[8];
            for (int l = 0; l < 8; l++) s[l] = p[l] + p[8 + l] + p[16 + l] + p[24 + l];
            sx[i * nb + b] = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
        }
}

/* ---- scalar path: 8 lanes as arrays, same operation order as the vector path ---- */

static inline void unpack_scalar(int32_t type, const uint8_t *blk, float q[QK], float *d, float *m) {
    if (type == TYPE_Q4_1) {
        *d = fp16_to_fp32(rd16(blk));
        *m = fp16_to_fp32(rd16(blk + 2));
        for (int i = 0; i < 16; i++) {
            q[i] = (float)(blk[4 + i] & 0x0f);
            q[16 + i] = (float)(blk[4 + i] >> 4);
        }
    } else {
        *d = fp16_to_fp32(rd16(blk));
        *m = 0.0f;
        for (int i = 0; i < QK; i++) q[i] = (float)(int8_t)blk[2 + i];
    }
}

static inline float lanes_sum(const float a[8]) {
    const float s0 = a[0] + a[4], s1 = a[1] + a[5], s2 = a[2] + a[6], s3 = a[3] + a[7];
    return (s0 + s2) + (s1 + s3);
}

static void rows_scalar(int32_t type, const uint8_t *w, int64_t r0, int64_t r1, int64_t nb, const float *x,
                        int64_t ldx, int64_t n, const float *sx, float *y, int64_t ldy) {
    const int64_t bb = block_bytes(type);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = w + r * nb * bb;
        for (int64_t i0 = 0; i0 < n; i0 += TILE) {
            const int64_t nt = n - i0 < TILE ? n - i0 : TILE;
            float acc[TILE][8], ms[TILE];
            memset(acc, 0, sizeof acc);
            memset(ms, 0, sizeof ms);
            for (int64_t b = 0; b < nb; b++) {
                float q[QK], d, m;
                unpack_scalar(type, wr + b * bb, q, &d, &m);
                for (int64_t i = 0; i < nt; i++) {
                    const float *xb = x + (i0 + i) * ldx + b * QK;
                    for (int l = 0; l < 8; l++) {
                        float t = q[l] * xb[l];
                        t = fmaf(q[8 + l], xb[8 + l], t);
                        t = fmaf(q[16 + l], xb[16 + l], t);
                        t = fmaf(q[24 + l], xb[24 + l], t);
                        acc[i][l] = fmaf(d, t, acc[i][l]);
                    }
                    if (type == TYPE_Q4_1) ms[i] = fmaf(m, sx[(i0 + i) * nb + b], ms[i]);
                }
            }
            for (int64_t i = 0; i < nt; i++) y[(i0 + i) * ldy + r] = lanes_sum(acc[i]) + ms[i];
        }
    }
}

/* ---- AVX2 + FMA path ---- */
#if HAVE_AVX2
static inline float hsum8(__m256 a) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1)); /* l, l+4 */
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));                                   /* (0+2), (1+3) */
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

static inline void unpack_avx2(int32_t type, const uint8_t *blk, __m256 q[4], float *d, float *m) {
    *d = _cvtsh_ss(rd16(blk));
    if (type == TYPE_Q4_1) {
        *m = _cvtsh_ss(rd16(blk + 2));
        const __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 4)));
        const __m256i hi = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 12)));
        const __m256i f = _mm256_set1_epi32(0x0f);
        q[0] = _mm256_cvtepi32_ps(_mm256_and_si256(lo, f));
        q[1] = _mm256_cvtepi32_ps(_mm256_and_si256(hi, f));
        q[2] = _mm256_cvtepi32_ps(_mm256_srli_epi32(lo, 4));
        q[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(hi, 4));
    } else {
        *m = 0.0f;
        for (int c = 0; c < 4; c++)
            q[c] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * c))));
    }
}

static inline __attribute__((always_inline)) void row_tile_avx2(int32_t type, const uint8_t *wr, int64_t nb,
                                                                const float *x, int64_t ldx, const float *sx,
                                                                int64_t sxo, int nt, float *y, int64_t ldy) {
    const int64_t bb = block_bytes(type);
    __m256 acc[TILE];
    float ms[TILE];
    for (int i = 0; i < nt; i++) acc[i] = _mm256_setzero_ps(), ms[i] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        __m256 q[4];
        float d, m;
        unpack_avx2(type, wr + b * bb, q, &d, &m);
        const __m256 dv = _mm256_set1_ps(d);
        for (int i = 0; i < nt; i++) {
            const float *xb = x + i * ldx + b * QK;
            __m256 t = _mm256_mul_ps(q[0], _mm256_loadu_ps(xb));
            t = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(xb + 8), t);
            t = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(xb + 16), t);
            t = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xb + 24), t);
            acc[i] = _mm256_fmadd_ps(dv, t, acc[i]);
            if (type == TYPE_Q4_1) ms[i] = fmaf(m, sx[i * sxo + b], ms[i]);
        }
    }
    for (int i = 0; i < nt; i++) y[i * ldy] = hsum8(acc[i]) + ms[i];
}

/* each weight row r0..r1 (its blocks at wr) against the n activation rows in tiles of up to TILE;
 * CASE(T) handles one tile of T rows starting at i0 (T a constant, so the tile's loops unroll) */
#define ROW_TILES(CASE)                                                                                         \
    for (int64_t r = r0; r < r1; r++) {                                                                         \
        const uint8_t *wr = w + r * nb * bb;                                                                    \
        for (int64_t i0 = 0; i0 < n; i0 += TILE) {                                                              \
            switch (n - i0 < TILE ? n - i0 : TILE) { CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8) } \
        }                                                                                                       \
    }

#define TILE_CASE(T)                                                                                            \
    case T:                                                                                                     \
        row_tile_avx2(type, wr, nb, x + i0 * ldx, ldx, sx + i0 * nb, nb, T, y + i0 * ldy + r, ldy);          \
        break;

static void rows_avx2(int32_t type, const uint8_t *w, int64_t r0, int64_t r1, int64_t nb, const float *x,
                      int64_t ldx, int64_t n, const float *sx, float *y, int64_t ldy) {
    const int64_t bb = block_bytes(type);
    ROW_TILES(TILE_CASE)
}
#endif

/* ---- AVX-512 path: two weight rows per 16-lane register, each half the AVX2 path's 8 lanes ---- */
#if HAVE_AVX2 && defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__AVX512BW__)
#define HAVE_AVX512 1
static inline __m512i pair_bytes(const uint8_t *a, const uint8_t *b, int signed8) {
    const __m128i v = _mm_castpd_si128(_mm_loadh_pd(_mm_castsi128_pd(_mm_loadl_epi64((const __m128i *)a)),
                                                    (const double *)b)); /* 8 bytes of a, then 8 of b */
    return signed8 ? _mm512_cvtepi8_epi32(v) : _mm512_cvtepu8_epi32(v);
}

static inline __m512 pair_set(float lo, float hi) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(lo)), _mm256_set1_ps(hi), 1);
}

static inline __attribute__((always_inline)) void pair_tile_avx512(int32_t type, const uint8_t *w0,
                                                                   const uint8_t *w1, int64_t nb, const float *x,
                                                                   int64_t ldx, const float *sx, int64_t sxo,
                                                                   int nt, float *y, int64_t ldy) {
    const int64_t bb = block_bytes(type);
    __m512 acc[TILE];
    float m0s[TILE], m1s[TILE];
    for (int i = 0; i < nt; i++) acc[i] = _mm512_setzero_ps(), m0s[i] = 0.0f, m1s[i] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *b0 = w0 + b * bb, *b1 = w1 + b * bb;
        __m512 q[4];
        float m0 = 0.0f, m1 = 0.0f;
        const __m512 dv = pair_set(_cvtsh_ss(rd16(b0)), _cvtsh_ss(rd16(b1)));
        if (type == TYPE_Q4_1) {
            m0 = _cvtsh_ss(rd16(b0 + 2)), m1 = _cvtsh_ss(rd16(b1 + 2));
            const __m512i lo = pair_bytes(b0 + 4, b1 + 4, 0), hi = pair_bytes(b0 + 12, b1 + 12, 0);
            const __m512i f = _mm512_set1_epi32(0x0f);
            q[0] = _mm512_cvtepi32_ps(_mm512_and_si512(lo, f));
            q[1] = _mm512_cvtepi32_ps(_mm512_and_si512(hi, f));
            q[2] = _mm512_cvtepi32_ps(_mm512_srli_epi32(lo, 4));
            q[3] = _mm512_cvtepi32_ps(_mm512_srli_epi32(hi, 4));
        } else {
            for (int c = 0; c < 4; c++) q[c] = _mm512_cvtepi32_ps(pair_bytes(b0 + 2 + 8 * c, b1 + 2 + 8 * c, 1));
        }
        for (int i = 0; i < nt; i++) {
            const float *xb = x + i * ldx + b * QK;
            __m512 t = _mm512_mul_ps(q[0], _mm512_broadcast_f32x8(_mm256_loadu_ps(xb)));
            t = _mm512_fmadd_ps(q[1], _mm512_broadcast_f32x8(_mm256_loadu_ps(xb + 8)), t);
            t = _mm512_fmadd_ps(q[2], _mm512_broadcast_f32x8(_mm256_loadu_ps(xb + 16)), t);
            t = _mm512_fmadd_ps(q[3], _mm512_broadcast_f32x8(_mm256_loadu_ps(xb + 24)), t);
            acc[i] = _mm512_fmadd_ps(dv, t, acc[i]);
            if (type == TYPE_Q4_1) {
                m0s[i] = fmaf(m0, sx[i * sxo + b], m0s[i]);
                m1s[i] = fmaf(m1, sx[i * sxo + b], m1s[i]);
            }
        }
    }
    for (int i = 0; i < nt; i++) {
        y[i * ldy] = hsum8(_mm512_castps512_ps256(acc[i])) + m0s[i];
        y[i * ldy + 1] = hsum8(_mm512_extractf32x8_ps(acc[i], 1)) + m1s[i];
    }
}

#define PAIR_CASE(T)                                                                                            \
    case T:                                                                                                     \
        pair_tile_avx512(type, wr, wr + nb * bb, nb, x + i0 * ldx, ldx, sx + i0 * nb, nb, T, y + i0 * ldy + r, \
                         ldy);                                                                                  \
        break;

static void rows_avx512(int32_t type, const uint8_t *w, int64_t r0, int64_t r1, int64_t nb, const float *x,
                        int64_t ldx, int64_t n, const float *sx, float *y, int64_t ldy) {
    const int64_t bb = block_bytes(type);
    int64_t r = r0;
    for (; r + 2 <= r1; r += 2) {
        const uint8_t *wr = w + r * nb * bb;
        for (int64_t i0 = 0; i0 < n; i0 += TILE) {
            switch (n - i0 < TILE ? n - i0 : TILE) {
                PAIR_CASE(1) PAIR_CASE(2) PAIR_CASE(3) PAIR_CASE(4) PAIR_CASE(5) PAIR_CASE(6) PAIR_CASE(7) PAIR_CASE(8)
            }
        }
    }
    if (r < r1) rows_avx2(type, w, r, r1, nb, x, ldx, n, sx, y, ldy);
}
#else
#define HAVE_AVX512 0
#endif

/* ---- int8 activations (llama.cpp's arithmetic for these types) ----
 * Each block of 32 activations is quantised to int8 with one scale, d = max|x| / 127, q = x / d
 * rounded to nearest-even; Q4_1 also keeps s = d * sum(q). A block's product is an exact integer
 * dot in 8 lanes (lane l sums elements 4l..4l+3), scaled by d_w * d_x into 8 float lanes;
 * Q4_1 adds m_w * s. llama.cpp rounds d and s to fp16; here they stay fp32. The scalar and the
 * SIMD paths give bit-identical results (exact integer lanes, the same float operations). */

#if HAVE_AVX2
/* quantize_q8's block in 8-wide registers (the same operations: max, multiply, round to nearest-even) */
static inline void quantize_block_avx2(const float *p, int8_t *q, float *dx, float *sx) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], mx = _mm256_setzero_ps();
    for (int c = 0; c < 4; c++) v[c] = _mm256_loadu_ps(p + 8 * c), mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[c]));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    const __m256 idv = _mm256_set1_ps(id), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
    __m256i r[4];
    for (int c = 0; c < 4; c++)
        r[c] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_round_ps(_mm256_mul_ps(v[c], idv),
                                                                              _MM_FROUND_TO_NEAREST_INT |
                                                                                  _MM_FROUND_NO_EXC),
                                                              lo),
                                                hi));
    const __m256i s32 = _mm256_add_epi32(_mm256_add_epi32(r[0], r[1]), _mm256_add_epi32(r[2], r[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    /* pack to bytes in element order: packs interleave 128-bit halves, the permute undoes it */
    const __m256i w01 = _mm256_packs_epi32(r[0], r[1]), w23 = _mm256_packs_epi32(r[2], r[3]);
    const __m256i b = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, b);
    *dx = d;
    *sx = d * (float)_mm_cvtsi128_si32(s4);
}
#endif

static void quantize_q8(const float *x, int64_t ldx, int64_t n, int64_t nb, int8_t *xq, float *dx, float *sx) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t b = 0; b < nb; b++) {
            const float *p = x + i * ldx + b * QK;
            int8_t *q = xq + (i * nb + b) * QK;
#if HAVE_AVX2
            if (isa >= 1) {
                quantize_block_avx2(p, q, dx + i * nb + b, sx + i * nb + b);
                continue;
            }
#endif
            float amax = 0.0f;
            for (int k = 0; k < QK; k++) amax = fmaxf(amax, fabsf(p[k]));
            const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            int32_t s = 0;
            for (int k = 0; k < QK; k++) {
                float v = nearbyintf(p[k] * id);
                v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
                q[k] = (int8_t)v;
                s += q[k];
            }
            dx[i * nb + b] = d;
            sx[i * nb + b] = d * (float)s;
        }
}

static void rows_q8_scalar(int32_t type, const uint8_t *w, int64_t r0, int64_t r1, int64_t nb, const int8_t *xq,
                           const float *dx, const float *sx, int64_t n, float *y, int64_t ldy) {
    const int64_t bb = block_bytes(type);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = w + r * nb * bb;
        for (int64_t i = 0; i < n; i++) {
            float acc[8] = {0}, ms = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = wr + b * bb;
                const int8_t *q = xq + (i * nb + b) * QK;
                int32_t wq[QK];
                if (type == TYPE_Q4_1)
                    for (int k = 0; k < 16; k++) wq[k] = blk[4 + k] & 0x0f, wq[16 + k] = blk[4 + k] >> 4;
                else
                    for (int k = 0; k < QK; k++) wq[k] = (int8_t)blk[2 + k];
                const float scale = fp16_to_fp32(rd16(blk)) * dx[i * nb + b];
                for (int l = 0; l < 8; l++) {
                    const int32_t lane = wq[4 * l] * q[4 * l] + wq[4 * l + 1] * q[4 * l + 1] +
                                         wq[4 * l + 2] * q[4 * l + 2] + wq[4 * l + 3] * q[4 * l + 3];
                    acc[l] = fmaf(scale, (float)lane, acc[l]);
                }
                if (type == TYPE_Q4_1) ms = fmaf(fp16_to_fp32(rd16(blk + 2)), sx[i * nb + b], ms);
            }
            y[i * ldy + r] = lanes_sum(acc) + ms;
        }
    }
}

#if HAVE_AVX2
/* 8 int32 lanes, lane l = sum of u[4l..4l+3] * s[4l..4l+3] (u unsigned, s signed bytes) */
static inline __m256i dot_us8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

static inline __attribute__((always_inline)) void row_tile_q8_avx2(int32_t type, const uint8_t *wr, int64_t nb,
                                                                   const int8_t *xq, const float *dx,
                                                                   const float *sx, int nt, float *y, int64_t ldy) {
    const int64_t bb = block_bytes(type);
    const __m128i low4 = _mm_set1_epi8(0x0f);
    __m256 acc[TILE];
    float ms[TILE];
    for (int i = 0; i < nt; i++) acc[i] = _mm256_setzero_ps(), ms[i] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = wr + b * bb;
        const float d = _cvtsh_ss(rd16(blk));
        __m256i wv;
        if (type == TYPE_Q4_1) {
            const __m128i raw = _mm_loadu_si128((const __m128i *)(blk + 4));
            wv = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), low4), _mm_and_si128(raw, low4));
        } else {
            wv = _mm256_loadu_si256((const __m256i *)(blk + 2));
        }
        const __m256i wabs = type == TYPE_Q4_1 ? wv : _mm256_sign_epi8(wv, wv);
        const float m = type == TYPE_Q4_1 ? _cvtsh_ss(rd16(blk + 2)) : 0.0f;
        for (int i = 0; i < nt; i++) {
            __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + (i * nb + b) * QK));
            if (type != TYPE_Q4_1) xv = _mm256_sign_epi8(xv, wv);
            const __m256 lanes = _mm256_cvtepi32_ps(dot_us8(wabs, xv));
            acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(d * dx[i * nb + b]), lanes, acc[i]);
            if (type == TYPE_Q4_1) ms[i] = fmaf(m, sx[i * nb + b], ms[i]);
        }
    }
    for (int i = 0; i < nt; i++) y[i * ldy] = hsum8(acc[i]) + ms[i];
}

#define Q8_CASE(T)                                                                                              \
    case T:                                                                                                     \
        row_tile_q8_avx2(type, wr, nb, xq + i0 * nb * QK, dx + i0 * nb, sx + i0 * nb, T, y + i0 * ldy + r, ldy); \
        break;

static void rows_q8_avx2(int32_t type, const uint8_t *w, int64_t r0, int64_t r1, int64_t nb, const int8_t *xq,
                         const float *dx, const float *sx, int64_t n, float *y, int64_t ldy) {
    const int64_t bb = block_bytes(type);
    ROW_TILES(Q8_CASE)
}
#endif

/* ---- the thread pool ----
 * A job is `total` items cut into chunks; the caller and the workers claim chunks from one counter until
 * none is left, so a thread that loses its core (another process on a busy host) leaves its share to the
 * others instead of holding the step up. Every item is computed whole by one thread: the split never
 * changes a result. The caller returns once the job is closed and no worker is inside it; a worker that
 * wakes later sees it closed (checked after it announced itself: the job's memory is the caller's). */

typedef void (*task_fn)(void *arg, int64_t i0, int64_t i1);

typedef struct {
    task_fn fn;
    void *arg;
    int64_t total, chunk;
    int parts; /* threads that may take part (the caller's included) */
} job_t;

static struct {
    pthread_mutex_t lock; /* one caller at a time; a second caller runs alone instead of waiting */
    int workers;
    job_t job;
    _Atomic uint32_t gen;    /* bumped when a job is published */
    _Atomic uint32_t closed; /* the last job whose chunks are all claimed */
    _Atomic int64_t next;    /* the job's next unclaimed item */
    _Atomic int inside;      /* workers inside the job */
    _Atomic int sleepers;
    uint32_t start_gen[MAX_THREADS];
} pool = {PTHREAD_MUTEX_INITIALIZER, 0, {0}, 0, 0, 0, 0, 0, {0}};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void gen_wait(uint32_t seen) {
#ifdef __linux__
    syscall(SYS_futex, &pool.gen, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
#else
    (void)seen;
    sched_yield();
#endif
}

static void gen_wake(void) {
#ifdef __linux__
    syscall(SYS_futex, &pool.gen, FUTEX_WAKE_PRIVATE, MAX_THREADS, NULL, NULL, 0);
#endif
}

static void claim_chunks(const job_t *job) {
    for (;;) {
        const int64_t i0 = atomic_fetch_add(&pool.next, job->chunk);
        if (i0 >= job->total) return;
        job->fn(job->arg, i0, i0 + job->chunk < job->total ? i0 + job->chunk : job->total);
    }
}

static void *worker_main(void *arg) {
    const int part = (int)(intptr_t)arg;
    uint32_t seen = pool.start_gen[part]; /* the call that started us may have bumped gen already */
    for (;;) {
        const int64_t t0 = now_ns();
        int spins = 0;
        while (atomic_load_explicit(&pool.gen, memory_order_acquire) == seen) {
            cpu_relax();
            if (++spins % 256 == 0 && now_ns() - t0 > SPIN_NS) {
                atomic_fetch_add(&pool.sleepers, 1);
                gen_wait(seen);
                atomic_fetch_sub(&pool.sleepers, 1);
            }
        }
        seen = atomic_load(&pool.gen);
        atomic_fetch_add(&pool.inside, 1);
        /* closed first, then gen: a job still open after we announced ourselves makes its caller wait for
           us, so its memory and pool.job stay as published; a later job (gen moved on) is left to the next
           turn of the loop */
        const uint32_t closed = atomic_load(&pool.closed);
        if (closed != seen && atomic_load(&pool.gen) == seen) {
            const job_t job = pool.job;
            if (part < job.parts) claim_chunks(&job);
        }
        atomic_fetch_sub(&pool.inside, 1);
    }
    return NULL;
}

static void pool_after_fork(void) { /* the child has no workers: start over */
    pthread_mutex_init(&pool.lock, NULL);
    pool.workers = 0;
    atomic_store(&pool.inside, 0);
    atomic_store(&pool.sleepers, 0);
}

/* fn(arg, i0, i1) over [0, total) in chunks, on up to `parts` threads (the caller's included) */
static void run_tasks(task_fn fn, void *arg, int64_t total, int64_t chunk, int parts) {
    if (parts > MAX_THREADS) parts = MAX_THREADS;
    if (total <= 0) return;
    if (parts <= 1 || total <= chunk || pthread_mutex_trylock(&pool.lock) != 0) {
        fn(arg, 0, total);
        return;
    }
    static int atfork = 0;
    if (!atfork) {
        pthread_atfork(NULL, NULL, pool_after_fork);
        atfork = 1;
    }
    while (pool.workers < parts - 1) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pool.start_gen[pool.workers + 1] = atomic_load(&pool.gen);
        if (pthread_create(&t, &attr, worker_main, (void *)(intptr_t)(pool.workers + 1)) != 0) {
            pthread_attr_destroy(&attr);
            break;
        }
        pthread_attr_destroy(&attr);
        pool.workers++;
    }
    pool.job = (job_t){fn, arg, total, chunk, parts - 1 < pool.workers ? parts : pool.workers + 1};
    atomic_store(&pool.next, 0);
    const uint32_t gen = atomic_fetch_add(&pool.gen, 1) + 1;
    if (atomic_load(&pool.sleepers) > 0) gen_wake();
    claim_chunks(&pool.job);
    atomic_store(&pool.closed, gen);
    const int64_t t0 = now_ns();
    for (int spins = 0; atomic_load(&pool.inside) > 0; spins++) {
        cpu_relax();
        if (spins > 1024 && now_ns() - t0 > SPIN_NS / 4) sched_yield(); /* a worker lost its core */
    }
    pthread_mutex_unlock(&pool.lock);
}

/* the chunk of `total` rows for `parts` threads: two per thread (one each gave the same speed on a quiet
   host and less slack on a busy one; eight, interleaved, lost 5%), even (AVX-512 rows pair up), >= 16 */
static int64_t chunk_of(int64_t total, int parts) {
    const int64_t per = 2 * (int64_t)(parts < 1 ? 1 : parts), c = (total + per - 1) / per;
    return (c < 16 ? 16 : c + (c & 1));
}

/* ---- entry points ---- */

/* fn(arg, i0, i1) over [0, total) in chunks of `chunk` on up to `parts` threads of the pool, the caller's
   included (decode_step.c's attention) */
void gguf_parallel(task_fn fn, void *arg, int64_t total, int64_t chunk, int32_t parts) {
    run_tasks(fn, arg, total, chunk < 1 ? 1 : chunk, parts);
}

typedef struct {
    int32_t type;
    const uint8_t *w;
    int64_t rows, nb;
    const float *x;
    int64_t ldx, n;
    const float *sx; /* Q4_1: the activation rows' block sums */
    float *y;
} linear_t;

static void linear_rows(void *arg, int64_t r0, int64_t r1) {
    const linear_t *a = arg;
#if HAVE_AVX512
    /* Q8_0 stays on AVX2: the row pairs of its 34-byte blocks ran 3.5x slower than AVX2 on the
     * 30 MB lm_head (AMD EPYC, one thread), and at most 15% faster on shapes that fit in cache */
    if (isa >= 2 && a->type == TYPE_Q4_1) {
        rows_avx512(a->type, a->w, r0, r1, a->nb, a->x, a->ldx, a->n, a->sx, a->y, a->rows);
    } else
#endif
#if HAVE_AVX2
    if (isa >= 1) {
        rows_avx2(a->type, a->w, r0, r1, a->nb, a->x, a->ldx, a->n, a->sx, a->y, a->rows);
    } else
#endif
    {
        rows_scalar(a->type, a->w, r0, r1, a->nb, a->x, a->ldx, a->n, a->sx, a->y, a->rows);
    }
}

static int linear_args_ok(int32_t type, int64_t rows, int64_t cols, int64_t ldx, int64_t n) {
    return block_bytes(type) != 0 && cols % QK == 0 && rows >= 1 && n >= 0 && ldx >= cols;
}

/* how many threads share `rows` output rows: under ~64 rows each a thread costs more than it saves */
static int row_parts(int64_t rows, int32_t threads) {
    int parts = threads < 1 ? 1 : threads;
    if (rows / parts < 64) parts = rows / 64 > 1 ? (int)(rows / 64) : 1;
    return parts;
}

/* y [n, rows] (contiguous) = x [n, cols] (rows ldx apart) . W^T; 0, or -1 for a bad type or shape */
int32_t gguf_linear(int32_t type, const uint8_t *w, int64_t rows, int64_t cols, const float *x, int64_t ldx,
                    int64_t n, float *y, int32_t threads) {
    if (!linear_args_ok(type, rows, cols, ldx, n)) return -1;
    if (n == 0) return 0;
    const int64_t nb = cols / QK, need = type == TYPE_Q4_1 ? n * nb : 1;
    float stack[4096];
    float *sx = need <= 4096 ? stack : malloc((size_t)need * sizeof(float));
    if (sx == NULL) abort();
    if (type == TYPE_Q4_1) block_sums(x, ldx, n, nb, sx);
    linear_t a = {type, w, rows, nb, x, ldx, n, sx, y};
    const int parts = row_parts(rows, threads);
    run_tasks(linear_rows, &a, rows, chunk_of(rows, parts), parts);
    if (sx != stack) free(sx);
    return 0;
}

typedef struct {
    int32_t type;
    const uint8_t *w;
    int64_t rows, nb, n;
    const int8_t *xq;
    const float *dx, *sx;
    float *y;
} linear_q8_t;

static void linear_q8_rows(void *arg, int64_t r0, int64_t r1) {
    const linear_q8_t *a = arg;
#if HAVE_AVX2
    if (isa >= 1) {
        rows_q8_avx2(a->type, a->w, r0, r1, a->nb, a->xq, a->dx, a->sx, a->n, a->y, a->rows);
        return;
    }
#endif
    rows_q8_scalar(a->type, a->w, r0, r1, a->nb, a->xq, a->dx, a->sx, a->n, a->y, a->rows);
}

/* gguf_linear with the activations quantised to int8 blocks first (see quantize_q8) */
int32_t gguf_linear_q8(int32_t type, const uint8_t *w, int64_t rows, int64_t cols, const float *x, int64_t ldx,
                       int64_t n, float *y, int32_t threads) {
    if (!linear_args_ok(type, rows, cols, ldx, n)) return -1;
    if (n == 0) return 0;
    const int64_t nb = cols / QK;
    int8_t *xq = malloc((size_t)(n * cols) + 2 * (size_t)(n * nb) * sizeof(float));
    if (xq == NULL) abort();
    float *dx = (float *)(xq + n * cols), *sx = dx + n * nb; /* n * cols is a multiple of 32: aligned */
    quantize_q8(x, ldx, n, nb, xq, dx, sx);
    linear_q8_t a = {type, w, rows, nb, n, xq, dx, sx, y};
    const int parts = row_parts(rows, threads);
    run_tasks(linear_q8_rows, &a, rows, chunk_of(rows, parts), parts);
    free(xq);
    return 0;
}

typedef struct {
    int32_t type;
    const uint8_t *w;
    int64_t nb;
    const int64_t *ids;
    int64_t first;
    float *out;
} dequant_t;

static void dequant_rows(void *arg, int64_t r0, int64_t r1) {
    const dequant_t *a = arg;
    const int64_t bb = block_bytes(a->type);
    for (int64_t i = r0; i < r1; i++) {
        const int64_t r = a->ids ? a->ids[i] : a->first + i;
        const uint8_t *wr = a->w + r * a->nb * bb;
        float *o = a->out + i * a->nb * QK;
        int64_t b = 0;
#if HAVE_AVX2
        for (; isa >= 1 && b < a->nb; b++) { /* d * q + m rounded twice, as below */
            __m256 q[4];
            float d, m;
            unpack_avx2(a->type, wr + b * bb, q, &d, &m);
            const __m256 dv = _mm256_set1_ps(d), mv = _mm256_set1_ps(m);
            for (int c = 0; c < 4; c++) _mm256_storeu_ps(o + b * QK + 8 * c, _mm256_add_ps(_mm256_mul_ps(dv, q[c]), mv));
        }
#endif
        for (; b < a->nb; b++) {
            float q[QK], d, m;
            unpack_scalar(a->type, wr + b * bb, q, &d, &m);
            for (int k = 0; k < QK; k++) o[b * QK + k] = d * q[k] + m; /* two roundings, as gguf-py and ggml's reference */
        }
    }
}

/* out [count, cols] = the dequantised rows ids[i] (ids NULL: rows first .. first + count - 1) */
int32_t gguf_dequantize(int32_t type, const uint8_t *w, int64_t cols, const int64_t *ids, int64_t first,
                        int64_t count, float *out, int32_t threads) {
    if (block_bytes(type) == 0 || cols % QK != 0 || count < 0) return -1;
    dequant_t a = {type, w, cols / QK, ids, first, out};
    int parts = threads < 1 ? 1 : threads;
    if (count / parts < 16) parts = count / 16 > 1 ? (int)(count / 16) : 1;
    run_tasks(dequant_rows, &a, count, chunk_of(count, parts), parts);
    return 0;
}

/* the widest path compiled in, at most `most` (0 scalar, 1 AVX2, 2 AVX-512) is used from now on; returns it */
int32_t gguf_set_isa(int32_t most) {
    const int32_t built = HAVE_AVX512 ? 2 : HAVE_AVX2 ? 1 : 0;
    isa = most < built ? (most < 0 ? 0 : most) : built;
    return isa;
}
