/* The small ops of a decoder layer, fused: residual add + RMSNorm, RoPE on q/k + the KV write into
 * the paged cache, silu(gate) * up. float32, one thread (these ops move a few KiB per decode row);
 * the KV write stores float32 pages or float16 ones (rope_kv_write_f16: rounded to nearest even, as
 * torch's .half(); F16C's vcvtps2ph where -march has it, else the compiler's _Float16 conversion).
 *
 * Vectors are GCC vector extensions (8 floats): AVX2 registers where -march has them, pairs of SSE
 * registers on any x86-64, plain scalars elsewhere; no intrinsics, so every build has the same
 * arithmetic. fp-contract is off so that no a * b + c becomes an FMA: RoPE and the residual add
 * then round exactly as torch's ops do on every CPU; RMSNorm differs from torch only in the order
 * of its sum of squares, silu only in exp (Cephes' expf, about 1 ulp).
 */
#pragma GCC optimize("fp-contract=off")
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef __F16C__
#include <immintrin.h>
#endif

typedef float v8 __attribute__((vector_size(32)));
typedef int32_t i8v __attribute__((vector_size(32)));

static inline v8 load8(const float *p) {
    v8 x;
    memcpy(&x, p, sizeof x);
    return x;
}

static inline void store8(float *p, v8 x) { memcpy(p, &x, sizeof x); }

static inline v8 splat(float x) { return (v8){0} + x; }

/* dst[0..n) <- src[0..n) as float16 bits, rounded to nearest even */
static inline void store_f16(uint16_t *dst, const float *src, int32_t n) {
    int32_t i = 0;
#ifdef __F16C__
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
#else /* GCC >= 12, Clang >= 15: the conversion inline where the ISA has it, else libgcc's (soft-fp, same rounding) */
    typedef _Float16 h8 __attribute__((vector_size(16)));
    for (; i + 8 <= n; i += 8) {
        const h8 h = __builtin_convertvector(load8(src + i), h8);
        memcpy(dst + i, &h, sizeof h);
    }
    for (; i < n; i++) {
        const _Float16 h = (_Float16)src[i];
        memcpy(dst + i, &h, sizeof h);
    }
#endif
}

/* exp(x) for 8 lanes, x clamped to [-87, 88]; Cephes' expf polynomial, ~1 ulp */
static inline v8 exp8(v8 x) {
    const v8 lo = splat(-87.0f), hi = splat(88.0f), magic = splat(12582912.0f); /* 1.5 * 2^23 */
    const i8v below = x < lo, above = x > hi;
    x = (v8)(((i8v)x & ~(below | above)) | ((i8v)lo & below) | ((i8v)hi & above));
    const v8 nf = (x * 1.44269504088896341f + magic) - magic;
    const i8v n = __builtin_convertvector(nf, i8v);
    const v8 r = x - nf * 0.693359375f + nf * 2.12194440e-4f;
    v8 y = splat(1.9875691500e-4f);
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * r * r + r + 1.0f;
    /* 2^n as two factors: n reaches 128 at x = 88, past a single float exponent */
    const i8v n1 = n >> 1;
    return y * (v8)((n1 + 127) << 23) * (v8)((n - n1 + 127) << 23);
}

/* x[r] += res[r] (res may be NULL), out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, for rows r */
void add_rms_norm(float *x, int64_t x_stride, const float *res, int64_t res_stride, float *out, int64_t out_stride,
                  const float *w, int32_t rows, int32_t hidden, float eps) {
    for (int32_t r = 0; r < rows; r++) {
        float *xr = x + r * x_stride, *o = out + r * out_stride;
        int32_t i = 0;
        v8 acc = {0};
        float ss = 0.0f;
        if (res != NULL) {
            const float *rr = res + r * res_stride;
            for (; i + 8 <= hidden; i += 8) {
                const v8 v = load8(xr + i) + load8(rr + i);
                store8(xr + i, v);
                acc += v * v;
            }
            for (; i < hidden; i++) {
                xr[i] += rr[i];
                ss += xr[i] * xr[i];
            }
        } else {
            for (; i + 8 <= hidden; i += 8) {
                const v8 v = load8(xr + i);
                acc += v * v;
            }
            for (; i < hidden; i++) ss += xr[i] * xr[i];
        }
        for (int j = 0; j < 8; j++) ss += acc[j];
        const float inv = 1.0f / sqrtf(ss / (float)hidden + eps);
        const v8 vinv = splat(inv);
        for (i = 0; i + 8 <= hidden; i += 8) store8(o + i, load8(xr + i) * vinv * load8(w + i));
        for (; i < hidden; i++) o[i] = xr[i] * inv * w[i];
    }
}

/* out[r] = silu(gu[r, :inter]) * gu[r, inter:], silu(g) = g / (1 + exp(-g)) */
void silu_mul(const float *gu, int64_t gu_stride, float *out, int64_t out_stride, int32_t rows, int32_t inter) {
    for (int32_t r = 0; r < rows; r++) {
        const float *g = gu + r * gu_stride, *u = g + inter;
        float *o = out + r * out_stride;
        int32_t i = 0;
        for (; i + 8 <= inter; i += 8) {
            const v8 gv = load8(g + i);
            store8(o + i, gv / (1.0f + exp8(-gv)) * load8(u + i));
        }
        for (; i < inter; i++) {
            float e[8] = {0};
            e[0] = -g[i];
            store8(e, exp8(load8(e)));
            o[i] = g[i] / (1.0f + e[0]) * u[i];
        }
    }
}

/* Rotate one head in place, half-split convention: (x1, x2) <- (x1 c - x2 s, x2 c + x1 s) */
static inline void rotate(float *x, const float *c, const float *s, int32_t half) {
    int32_t i = 0;
    for (; i + 8 <= half; i += 8) {
        const v8 a = load8(x + i), b = load8(x + half + i), cv = load8(c + i), sv = load8(s + i);
        store8(x + i, a * cv - b * sv);
        store8(x + half + i, b * cv + a * sv);
    }
    for (; i < half; i++) {
        const float a = x[i], b = x[half + i];
        x[i] = a * c[i] - b * s[i];
        x[half + i] = b * c[i] + a * s[i];
    }
}

/* Row r of qkv is [q (H heads) | k (KV heads) | v (KV heads)], each head D floats. RoPE at
 * positions[r] (cos/sin tables [max_pos, D/2]) rotates q and k in place, then k and v are copied to
 * token slot_offsets[r] of block slot_blocks[r] of one layer's K and V pages (strides in elements),
 * as float32 (f16 = 0) or rounded to float16 (f16 = 1). */
static inline __attribute__((always_inline)) void rope_kv(
    float *qkv, int64_t qkv_stride, int32_t rows, int32_t heads, int32_t kv_heads, int32_t head_dim, const float *cos,
    const float *sin, const int64_t *positions, void *k_cache, void *v_cache, int64_t block_stride,
    int64_t token_stride, const int64_t *slot_blocks, const int64_t *slot_offsets, const int f16) {
    const int32_t half = head_dim / 2, kv_dim = kv_heads * head_dim;
    for (int32_t r = 0; r < rows; r++) {
        float *row = qkv + r * qkv_stride;
        const float *c = cos + positions[r] * half, *s = sin + positions[r] * half;
        for (int32_t h = 0; h < heads + kv_heads; h++) rotate(row + h * head_dim, c, s, half);
        const int64_t slot = slot_blocks[r] * block_stride + slot_offsets[r] * token_stride;
        const float *k = row + heads * head_dim, *v = k + kv_dim;
        if (f16) {
            store_f16((uint16_t *)k_cache + slot, k, kv_dim);
            store_f16((uint16_t *)v_cache + slot, v, kv_dim);
        } else {
            memcpy((float *)k_cache + slot, k, (size_t)kv_dim * sizeof(float));
            memcpy((float *)v_cache + slot, v, (size_t)kv_dim * sizeof(float));
        }
    }
}

void rope_kv_write(float *qkv, int64_t qkv_stride, int32_t rows, int32_t heads, int32_t kv_heads, int32_t head_dim,
                   const float *cos, const float *sin, const int64_t *positions, float *k_cache, float *v_cache,
                   int64_t block_stride, int64_t token_stride, const int64_t *slot_blocks,
                   const int64_t *slot_offsets) {
    rope_kv(qkv, qkv_stride, rows, heads, kv_heads, head_dim, cos, sin, positions, k_cache, v_cache, block_stride,
            token_stride, slot_blocks, slot_offsets, 0);
}

/* rope_kv_write into float16 pages */
void rope_kv_write_f16(float *qkv, int64_t qkv_stride, int32_t rows, int32_t heads, int32_t kv_heads,
                       int32_t head_dim, const float *cos, const float *sin, const int64_t *positions,
                       uint16_t *k_cache, uint16_t *v_cache, int64_t block_stride, int64_t token_stride,
                       const int64_t *slot_blocks, const int64_t *slot_offsets) {
    rope_kv(qkv, qkv_stride, rows, heads, kv_heads, head_dim, cos, sin, positions, k_cache, v_cache, block_stride,
            token_stride, slot_blocks, slot_offsets, 1);
}
