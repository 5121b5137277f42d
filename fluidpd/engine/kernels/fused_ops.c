/* The small ops of a decoder layer, fused: residual add + RMSNorm, RoPE on q/k + the KV write into
 * the paged cache, silu(gate) * up. float32, one thread (these ops move a few KiB per decode row).
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

typedef float v8 __attribute__((vector_size(32)));
typedef int32_t i8v __attribute__((vector_size(32)));

static inline v8 load8(const float *p) {
    v8 x;
    memcpy(&x, p, sizeof x);
    return x;
}

static inline void store8(float *p, v8 x) { memcpy(p, &x, sizeof x); }

static inline v8 splat(float x) { return (v8){0} + x; }

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
 * token slot_offsets[r] of block slot_blocks[r] of one layer's K and V pages. */
void rope_kv_write(float *qkv, int64_t qkv_stride, int32_t rows, int32_t heads, int32_t kv_heads, int32_t head_dim,
                   const float *cos, const float *sin, const int64_t *positions, float *k_cache, float *v_cache,
                   int64_t block_stride, int64_t token_stride, const int64_t *slot_blocks,
                   const int64_t *slot_offsets) {
    const int32_t half = head_dim / 2;
    const size_t kv_bytes = (size_t)kv_heads * head_dim * sizeof(float);
    for (int32_t r = 0; r < rows; r++) {
        float *row = qkv + r * qkv_stride;
        const float *c = cos + positions[r] * half, *s = sin + positions[r] * half;
        for (int32_t h = 0; h < heads + kv_heads; h++) rotate(row + h * head_dim, c, s, half);
        const int64_t slot = slot_blocks[r] * block_stride + slot_offsets[r] * token_stride;
        memcpy(k_cache + slot, row + heads * head_dim, kv_bytes);
        memcpy(v_cache + slot, row + (heads + kv_heads) * head_dim, kv_bytes);
    }
}
