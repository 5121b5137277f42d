/* Decode attention over a paged KV cache, read in place (no gather), float32, one thread; the pages
 * are float32 (paged_decode_attention) or float16 (paged_decode_attention_f16: 8 halves loaded and
 * converted to floats, F16C's vcvtph2ps where -march has it, else the compiler's _Float16 conversion;
 * the same math in float32 after the load).
 *
 * Row b has one query token that sees tokens 0 .. ctx_lens[b]-1 of its own sequence; K/V of
 * token t lie in block tables[b * max_blocks + t / block_size] at offset t % block_size.
 * A row is walked in tiles of TILE tokens; each KV head's G = num_heads / num_kv_heads query
 * heads score the tile together while it is in cache, so K and V are read from memory once per
 * row, with the token PREFETCH (64) ahead prefetched (pages lie anywhere; 64 beat 8, 16 and 32
 * on cold KV, and whole-vector prefetches lost). Scores for 8 tokens are summed as 8 vector
 * accumulators and reduced by one transpose (no per-dot horizontal sum); softmax runs over all of
 * a head's scores, then V is summed tile by tile with 64 output lanes in registers. head_dim
 * must be a multiple of 8 (the caller checks).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef __F16C__
#include <immintrin.h>
#endif

typedef float v8 __attribute__((vector_size(32)));
typedef int32_t i8v __attribute__((vector_size(32)));
#define MAX_G 16
#define TILE 64 /* tokens whose K (or V) stays cache-resident across the KV heads */

static inline v8 load8(const float *p) {
    v8 x;
    memcpy(&x, p, sizeof x);
    return x;
}

static inline void store8(float *p, v8 x) { memcpy(p, &x, sizeof x); }

/* 8 float16 values (as bits) converted to floats (exact) */
static inline v8 load_f16x8(const uint16_t *p) {
#ifdef __F16C__
    return (v8)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#else /* GCC >= 12, Clang >= 15 */
    typedef _Float16 h8 __attribute__((vector_size(16)));
    h8 h;
    memcpy(&h, p, sizeof h);
    return __builtin_convertvector(h, v8);
#endif
}

/* 8 K/V elements at element offset i of the pages `base`: float32 (f16 = 0) or float16 (f16 = 1) */
static inline v8 kv8(const void *base, int64_t i, const int f16) {
    return f16 ? load_f16x8((const uint16_t *)base + i) : load8((const float *)base + i);
}

/* exp(x) for 8 lanes, x <= 0 here (scores minus their max); Cephes' expf polynomial, ~1 ulp */
static inline v8 exp8(v8 x) {
    const v8 lo = (v8){0} - 87.0f, magic = (v8){0} + 12582912.0f; /* 1.5 * 2^23: round to nearest */
    const i8v below = x < lo;
    x = (v8)(((i8v)x & ~below) | ((i8v)lo & below));
    const v8 nf = (x * 1.44269504088896341f + magic) - magic;
    const i8v n = __builtin_convertvector(nf, i8v);
    const v8 r = x - nf * 0.693359375f + nf * 2.12194440e-4f;
    v8 y = (v8){0} + 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * r * r + r + 1.0f;
    return y * (v8)((n + 127) << 23);
}

/* s[0..L) <- softmax(s[0..L)) */
static inline void softmax(float *s, int32_t L) {
    float m = s[0], sum = 0.0f;
    for (int32_t t = 1; t < L; t++) m = s[t] > m ? s[t] : m;
    int32_t t = 0;
    v8 acc = {0};
    for (; t + 8 <= L; t += 8) {
        const v8 e = exp8(load8(s + t) - m);
        store8(s + t, e);
        acc += e;
    }
    for (; t < L; t++) {
        s[t] = expf(s[t] - m);
        sum += s[t];
    }
    for (int i = 0; i < 8; i++) sum += acc[i];
    const float inv = 1.0f / sum;
    for (t = 0; t < L; t++) s[t] *= inv;
}

/* the element offset of token t's head vector (at `head` elements into the token), and a prefetch of the
   D elements of the one PREFETCH tokens ahead (its block may lie anywhere) */
#define PREFETCH 64
static inline int64_t token(const void *base, int64_t head, const int32_t *table, int32_t t, int32_t L,
                            int32_t block_size, int64_t block_stride, int64_t token_stride, int32_t D, const int f16) {
    const int32_t esize = f16 ? 2 : 4;
    if (t + PREFETCH < L) {
        const int32_t u = t + PREFETCH;
        const int64_t off = head + table[u / block_size] * block_stride + (u % block_size) * token_stride;
        const char *next = (const char *)base + off * esize;
        for (int32_t i = 0; i < D * esize; i += 64) __builtin_prefetch(next + i);
    }
    return head + table[t / block_size] * block_stride + (t % block_size) * token_stride;
}

/* lane j of the result = sum of the 8 lanes of a[j] */
static inline v8 transpose_sum(const v8 *a) {
    const i8v e1 = {0, 8, 2, 10, 4, 12, 6, 14}, o1 = {1, 9, 3, 11, 5, 13, 7, 15};
    const i8v e2 = {0, 1, 8, 9, 4, 5, 12, 13}, o2 = {2, 3, 10, 11, 6, 7, 14, 15};
    const i8v e3 = {0, 1, 2, 3, 8, 9, 10, 11}, o3 = {4, 5, 6, 7, 12, 13, 14, 15};
    v8 t[4], u[2];
    for (int i = 0; i < 4; i++)
        t[i] = __builtin_shuffle(a[2 * i], a[2 * i + 1], e1) + __builtin_shuffle(a[2 * i], a[2 * i + 1], o1);
    for (int i = 0; i < 2; i++)
        u[i] = __builtin_shuffle(t[2 * i], t[2 * i + 1], e2) + __builtin_shuffle(t[2 * i], t[2 * i + 1], o2);
    return __builtin_shuffle(u[0], u[1], e3) + __builtin_shuffle(u[0], u[1], o3);
}

static inline __attribute__((always_inline)) void attend_row(
    const float *q, float *out, const void *k, const void *v, int64_t block_stride, int64_t token_stride,
    const int32_t *table, int32_t L, int32_t num_kv_heads, const int32_t G, const int32_t D, int32_t block_size,
    float scale, float *scores, const int f16) {
    const int32_t H = num_kv_heads * G;
    /* scores[h * L + t] = q_h . k_t * scale, a tile of tokens at a time: the tile's K stays in cache
       while each KV head's query heads score it */
    for (int32_t t1 = 0; t1 < L; t1 += TILE) {
        const int32_t end = L - t1 < TILE ? L : t1 + TILE;
        for (int32_t g = 0; g < num_kv_heads; g++) {
            const float *qg = q + (int64_t)g * G * D;
            for (int32_t t0 = t1; t0 < end; t0 += 8) {
                const int32_t n = end - t0 < 8 ? end - t0 : 8;
                v8 acc[MAX_G][8];
                for (int32_t h = 0; h < G; h++)
                    for (int32_t j = 0; j < 8; j++) acc[h][j] = (v8){0};
                for (int32_t j = 0; j < n; j++) {
                    const int64_t kt =
                        token(k, g * D, table, t0 + j, L, block_size, block_stride, token_stride, D, f16);
                    for (int32_t i = 0; i < D; i += 8) {
                        const v8 kv = kv8(k, kt + i, f16);
                        for (int32_t h = 0; h < G; h++) acc[h][j] += load8(qg + h * D + i) * kv;
                    }
                }
                for (int32_t h = 0; h < G; h++) {
                    float s[8];
                    store8(s, transpose_sum(acc[h]) * scale);
                    memcpy(scores + (g * G + h) * L + t0, s, n * sizeof(float));
                }
            }
        }
    }
    for (int32_t h = 0; h < H; h++) softmax(scores + h * L, L);
    /* out_h = sum_t p_h,t v_t, a tile at a time, 64 output lanes of a head in registers */
    memset(out, 0, (size_t)H * D * sizeof(float));
    for (int32_t t1 = 0; t1 < L; t1 += TILE) {
        const int32_t end = L - t1 < TILE ? L : t1 + TILE;
        for (int32_t g = 0; g < num_kv_heads; g++)
            for (int32_t h = g * G; h < (g + 1) * G; h++) {
                const float *sh = scores + h * L;
                for (int32_t i0 = 0; i0 < D; i0 += 64) {
                    const int32_t w = D - i0 < 64 ? D - i0 : 64;
                    float *oh = out + h * D + i0;
                    v8 o[8];
                    for (int32_t i = 0; i < w; i += 8) o[i / 8] = load8(oh + i);
                    for (int32_t t = t1; t < end; t++) {
                        const int64_t vt =
                            token(v, g * D + i0, table, t, L, block_size, block_stride, token_stride, w, f16);
                        const v8 p = (v8){0} + sh[t];
                        for (int32_t i = 0; i < w; i += 8) o[i / 8] += p * kv8(v, vt + i, f16);
                    }
                    for (int32_t i = 0; i < w; i += 8) store8(oh + i, o[i / 8]);
                }
            }
    }
}

/* every decode row; f16 a constant in each caller below, so each gets its own unrolled loops */
static inline __attribute__((always_inline)) int32_t decode_rows(
    const float *q, int64_t q_row_stride, float *out, const void *k, const void *v, int64_t block_stride,
    int64_t token_stride, const int32_t *tables, int32_t max_blocks, const int32_t *ctx_lens, int32_t num_rows,
    int32_t num_heads, int32_t num_kv_heads, int32_t head_dim, int32_t block_size, float scale, float *scores,
    const int f16) {
    const int32_t G = num_heads / num_kv_heads;
    if (G > MAX_G || head_dim % 8 != 0 || G * num_kv_heads != num_heads) return -1;
    for (int32_t b = 0; b < num_rows; b++) {
        const float *qb = q + b * q_row_stride;
        float *ob = out + (int64_t)b * num_heads * head_dim;
        const int32_t *tb = tables + (int64_t)b * max_blocks;
        const int32_t L = ctx_lens[b];
        /* the common shapes get constant G and D, so the loops above unroll into registers, and a constant
           block size of 16, so a token's page and offset are a shift and a mask rather than two divisions */
#define ATTEND(G_, D_) \
    (block_size == 16 ? attend_row(qb, ob, k, v, block_stride, token_stride, tb, L, num_kv_heads, G_, D_, 16, scale, \
                                   scores, f16)                                                                       \
                      : attend_row(qb, ob, k, v, block_stride, token_stride, tb, L, num_kv_heads, G_, D_, block_size, \
                                   scale, scores, f16))
        if (G == 3 && head_dim == 64)
            ATTEND(3, 64);
        else if (G == 4 && head_dim == 64)
            ATTEND(4, 64);
        else if (G == 8 && head_dim == 128)
            ATTEND(8, 128);
        else
            attend_row(qb, ob, k, v, block_stride, token_stride, tb, L, num_kv_heads, G, head_dim, block_size, scale,
                       scores, f16);
#undef ATTEND
    }
    return 0;
}

int32_t paged_decode_attention(
    const float *q, int64_t q_row_stride,       /* [B, H, D]: row b at q + b * q_row_stride */
    float *out,                                 /* [B, H * D] contiguous */
    const float *k, const float *v,             /* one layer's pages: block i at k + i * block_stride */
    int64_t block_stride, int64_t token_stride, /* elements between blocks / tokens of a block */
    const int32_t *tables, int32_t max_blocks, const int32_t *ctx_lens, int32_t num_rows, int32_t num_heads,
    int32_t num_kv_heads, int32_t head_dim, int32_t block_size, float scale,
    float *scores /* scratch: num_heads * max(ctx_lens) floats */
) {
    return decode_rows(q, q_row_stride, out, k, v, block_stride, token_stride, tables, max_blocks, ctx_lens, num_rows,
                       num_heads, num_kv_heads, head_dim, block_size, scale, scores, 0);
}

/* paged_decode_attention over float16 pages (k, v: float16 bits; strides in elements) */
int32_t paged_decode_attention_f16(const float *q, int64_t q_row_stride, float *out, const uint16_t *k,
                                   const uint16_t *v, int64_t block_stride, int64_t token_stride,
                                   const int32_t *tables, int32_t max_blocks, const int32_t *ctx_lens,
                                   int32_t num_rows, int32_t num_heads, int32_t num_kv_heads, int32_t head_dim,
                                   int32_t block_size, float scale, float *scores) {
    return decode_rows(q, q_row_stride, out, k, v, block_stride, token_stride, tables, max_blocks, ctx_lens, num_rows,
                       num_heads, num_kv_heads, head_dim, block_size, scale, scores, 1);
}
