/* A decode-only step's decoder layers in one call: the kernels one layer runs (gguf_linear.c's linear,
 * fused_ops.c's add_rms_norm, rope_kv_write and silu_mul, paged_attention.c's decode attention) called
 * through the pointers the caller passes, with the arguments and in the order DecoderLayer.forward
 * calls them from Python, so the residual stream comes out bit-identical; what goes is the Python and
 * ctypes around some 270 calls a step.
 *
 * One difference of schedule, none of arithmetic: the attention of each (row, KV head) pair is its own
 * unit, claimed by the threads of the linear kernel's pool (`parallel`); a unit is the same kernel called for
 * one row and one KV head (its G query heads), which computes each head exactly as the whole call
 * does (heads never mix in paged_attention.c).
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

typedef int32_t (*linear_fn)(int32_t type, const uint8_t *w, int64_t rows, int64_t cols, const float *x, int64_t ldx,
                             int64_t n, float *y, int32_t threads);
typedef void (*norm_fn)(float *x, int64_t x_stride, const float *res, int64_t res_stride, float *out,
                        int64_t out_stride, const float *w, int32_t rows, int32_t hidden, float eps);
typedef void (*silu_fn)(const float *gu, int64_t gu_stride, float *out, int64_t out_stride, int32_t rows,
                        int32_t inter);
typedef void (*rope_fn)(float *qkv, int64_t qkv_stride, int32_t rows, int32_t heads, int32_t kv_heads,
                        int32_t head_dim, const float *cos, const float *sin, const int64_t *positions, void *k_cache,
                        void *v_cache, int64_t block_stride, int64_t token_stride, const int64_t *slot_blocks,
                        const int64_t *slot_offsets);
typedef int32_t (*attn_fn)(const float *q, int64_t q_row_stride, float *out, const void *k, const void *v,
                           int64_t block_stride, int64_t token_stride, const int32_t *tables, int32_t max_blocks,
                           const int32_t *ctx_lens, int32_t num_rows, int32_t num_heads, int32_t num_kv_heads,
                           int32_t head_dim, int32_t block_size, float scale, float *scores);
typedef void (*parallel_fn)(void (*fn)(void *, int64_t, int64_t), void *arg, int64_t total, int64_t chunk,
                            int32_t parts);

typedef struct {
    linear_fn fn;
    const uint8_t *w;
    int64_t type, rows, cols;
} lin_t;

typedef struct {
    const float *in_norm, *post_norm;
    lin_t qkv, o, gate_up, down;
} layer_t;

typedef struct { /* the model: fixed while its weights live */
    norm_fn norm;
    silu_fn silu;
    parallel_fn parallel;
    int64_t layers, hidden, inter, heads, kv_heads, head_dim;
    float eps, scale;
    const layer_t *layer;
} model_t;

typedef struct { /* one step over one arena */
    rope_fn rope;  /* the KV pages' dtype picks rope_kv_write or its float16 twin */
    attn_fn attn;  /* and paged_decode_attention or its float16 twin */
    void *const *k_pages, *const *v_pages; /* per layer */
    int64_t kv_bytes, block_stride, token_stride, block_size;
    int64_t n, threads, max_blocks;
    const int64_t *positions, *slot_blocks, *slot_offsets;
    const float *cos, *sin;
    const int32_t *tables, *ctx_lens;
    float *qkv, *attn_out, *o_out, *norm_out, *gu, *act, *down; /* scratch rows, contiguous */
} step_t;

typedef struct {
    const model_t *m;
    const step_t *s;
    const float *q;
    int64_t q_stride;
    const char *k, *v;
    _Atomic int32_t rc;
} attend_t;

static void attend_units(void *arg, int64_t u0, int64_t u1) {
    attend_t *a = arg;
    const model_t *m = a->m;
    const step_t *s = a->s;
    const int64_t G = m->heads / m->kv_heads, D = m->head_dim;
    for (int64_t u = u0; u < u1; u++) {
        const int64_t b = u / m->kv_heads, g = u % m->kv_heads, L = s->ctx_lens[b];
        float stack[4096];
        float *scores = G * L <= 4096 ? stack : malloc((size_t)(G * L) * sizeof(float));
        if (scores == NULL) abort();
        const int32_t rc = s->attn(a->q + b * a->q_stride + g * G * D, a->q_stride,
                                   s->attn_out + b * m->heads * D + g * G * D, a->k + g * D * s->kv_bytes,
                                   a->v + g * D * s->kv_bytes, s->block_stride, s->token_stride,
                                   s->tables + b * s->max_blocks, (int32_t)s->max_blocks, s->ctx_lens + b, 1,
                                   (int32_t)G, 1, (int32_t)D, (int32_t)s->block_size, m->scale, scores);
        if (scores != stack) free(scores);
        if (rc != 0) atomic_store(&a->rc, rc);
    }
}

static int32_t linear(const lin_t *l, const float *x, int64_t ldx, float *y, const step_t *s) {
    return l->fn((int32_t)l->type, l->w, l->rows, l->cols, x, ldx, s->n, y, (int32_t)s->threads);
}

/* x [n, hidden] (the embedded tokens) becomes the residual stream after every layer; 0, or the first
   kernel's non-zero return */
int32_t decode_layers(const model_t *m, const step_t *s, float *x) {
    const int64_t n = s->n, hidden = m->hidden, q_dim = m->heads * m->head_dim;
    const int64_t qkv_dim = q_dim + 2 * m->kv_heads * m->head_dim;
    const float *res = NULL;
    for (int64_t i = 0; i < m->layers; i++) {
        const layer_t *l = m->layer + i;
        int32_t rc = 0;
        m->norm(x, hidden, res, hidden, s->norm_out, hidden, l->in_norm, (int32_t)n, (int32_t)hidden, m->eps);
        if ((rc = linear(&l->qkv, s->norm_out, hidden, s->qkv, s))) return rc;
        s->rope(s->qkv, qkv_dim, (int32_t)n, (int32_t)m->heads, (int32_t)m->kv_heads, (int32_t)m->head_dim, s->cos,
                s->sin, s->positions, s->k_pages[i], s->v_pages[i], s->block_stride, s->token_stride,
                s->slot_blocks, s->slot_offsets);
        attend_t a = {m, s, s->qkv, qkv_dim, s->k_pages[i], s->v_pages[i], 0};
        m->parallel(attend_units, &a, n * m->kv_heads, 1, (int32_t)s->threads);
        if ((rc = atomic_load(&a.rc))) return rc;
        if ((rc = linear(&l->o, s->attn_out, q_dim, s->o_out, s))) return rc;
        m->norm(x, hidden, s->o_out, hidden, s->norm_out, hidden, l->post_norm, (int32_t)n, (int32_t)hidden, m->eps);
        if ((rc = linear(&l->gate_up, s->norm_out, hidden, s->gu, s))) return rc;
        m->silu(s->gu, 2 * m->inter, s->act, m->inter, (int32_t)n, (int32_t)m->inter);
        if ((rc = linear(&l->down, s->act, m->inter, s->down, s))) return rc;
        res = s->down;
    }
    if (res != NULL)
        for (int64_t j = 0; j < n * hidden; j++) x[j] += res[j];
    return 0;
}
