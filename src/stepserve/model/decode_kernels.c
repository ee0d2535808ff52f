/* Every decoder layer of a decode-only step in one call (fused_decode.py drives it): a
 * batch of B sequences with one new token each, float32, weights as ggml_kernels.c holds
 * them (Q4_1 / Q8_0 groups) or plain float32 rows. Per layer:
 *
 *   h = rms_norm(x) * w_in;  qkv = h @ Wqkv.T;  RoPE on q and k;  k, v -> paged cache;
 *   a = softmax(q . K / sqrt(d)) V over the sequence's cache;  x += a @ Wo.T;
 *   h = rms_norm(x) * w_post;  g, u = h @ Wgu.T;  x += (silu(g) * u) @ Wdown.T
 *
 * The same operations as llama.py's torch path, in the same rounding steps (built with
 * -ffp-contract=off: nothing is fused that torch computes as two roundings); only the
 * order of the sums (norms, attention dots, the softmax denominator) differs, as between
 * any two kernels, and exp is our vectorised one (ggml_groups.h, within 1 ulp; torch's
 * is its own too). What this saves is the ~40 small torch ops and the Python around them
 * per layer: at batch 1 they cost more than the matrix products.
 *
 * Weights, sizes and scratch: one struct decode_layer per layer, struct decode_dims and
 * struct decode_scratch (kernel_abi.h, the layout Python reads from the library).
 * KV cache: [num_layers, 2, num_blocks, block_size, kv_heads, head_dim] (kv_store.py).
 */
#include <math.h>
#include <stdlib.h>

#include <omp.h>

#include "ggml_groups.h"
#include "ggml_team.h"
#include "paged_attend.h"

#ifndef PREFETCH_NEXT
#define PREFETCH_NEXT 16  /* rows of the next product asked for ahead (prefetch_start) */
#endif

/* This thread's share of y [M, N] = x [M, K] @ W.T for a float32 W [N, K] (an orphaned
 * `omp for`, ending with the team's barrier). */
static void matmul_f32(const float *x, int64_t M, int64_t K, const float *w, int64_t N,
                       float *y) {
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; n++)
        for (int64_t i = 0; i < M; i++)
            y[i * N + n] = dot(x + i * K, w + n * K, K);
}

static void project(const struct decode_projection *p, const float *x, int64_t M,
                    int64_t K, int64_t N, float *y, const struct team_buffers *buf) {
    if (p->format == FMT_F32)
        matmul_f32(x, M, K, (const float *)(intptr_t)p->qs, N, y);
    else
        ggml_matmul_team((int)p->format, x, M, K, (const uint8_t *)(intptr_t)p->qs,
                         (const uint16_t *)(intptr_t)p->scales, N, y, buf);
}

/* Hints for the first PREFETCH_NEXT rows of this thread's share of the projection `p`
 * (N rows of K), issued right after the previous product: the weights then stream in
 * while the team syncs and runs the small steps in between, when memory would idle.
 * The share is ggml_matmul_team's: TASK_ROWS-row tasks, split as libgomp's static
 * schedule. */
static void prefetch_start(const struct decode_projection *p, int64_t N, int64_t K) {
    const int64_t tasks = (N + TASK_ROWS - 1) / TASK_ROWS;
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t q = tasks / nt, r = tasks % nt, first = TASK_ROWS * (t * q + (t < r ? t : r));
    const int64_t rows = N - first < PREFETCH_NEXT ? N - first : PREFETCH_NEXT;
    if (rows <= 0)
        return;
    const int fmt = (int)p->format;
    const int64_t row_qs = fmt == FMT_F32 ? 4 * K : K / QK * qs_bytes_per_group(fmt);
    const int64_t row_sc = fmt == FMT_F32 ? 0 : K / QK * scales_per_group(fmt) * 2;  /* fp16 */
    prefetch_bytes((const char *)(intptr_t)p->qs + first * row_qs, rows * row_qs);
    prefetch_bytes((const char *)(intptr_t)p->scales + first * row_sc, rows * row_sc);
}

/* out = w * (x * rsqrt(mean(x^2) + eps)), row by row (the reference's roundings). */
static void rms_norm(const float *x, const float *w, int64_t M, int64_t D, float eps,
                     float *out) {
    for (int64_t i = 0; i < M; i++) {
        const float *xi = x + i * D;
        const float r = 1.0f / sqrtf(dot(xi, xi, D) / (float)D + eps);
        for (int64_t j = 0; j < D; j++)
            out[i * D + j] = w[j] * (xi[j] * r);
    }
}

/* Half-split RoPE in place on `heads` heads of one token: x*cos + rotate(x)*sin. */
static void rope(float *x, int64_t heads, int64_t hd, const float *cos, const float *sin) {
    const int64_t half = hd / 2;
    for (int64_t h = 0; h < heads; h++) {
        float *v = x + h * hd;
        for (int64_t j = 0; j < half; j++) {
            const float a = v[j], b = v[j + half];
            v[j] = a * cos[j] + (-b) * sin[j];
            v[j + half] = b * cos[j + half] + a * sin[j + half];
        }
    }
}

/* This thread's share of act [B, I] = silu(g) * u, gu [B, 2I] = (g, u) per row; I % VLEN
 * == 0 (else the scalar loop), as in torch: g / (1 + exp(-g)), then times u. */
static void silu_mul(const float *gu, int64_t B, int64_t I, float *act) {
    const int64_t per_row = I % VLEN == 0 ? I / VLEN : 0;
    if (per_row) {
#pragma omp for schedule(static)
        for (int64_t t = 0; t < B * per_row; t++) {
            const int64_t b = t / per_row, j = t % per_row * VLEN;
            const vec g = vload(gu + b * 2 * I + j), u = vload(gu + b * 2 * I + I + j);
            const vec e = vexp(vsub(vzero(), g));
            vstore(act + b * I + j, vmul(vdiv(g, vadd(vset1(1.0f), e)), u));
        }
        return;
    }
#pragma omp for schedule(static)
    for (int64_t t = 0; t < B * I; t++) {
        const int64_t b = t / I, j = t % I;
        const float g = gu[b * 2 * I + j];
        act[t] = g / (1.0f + expf(-g)) * gu[b * 2 * I + I + j];
    }
}

static void add_to(float *x, const float *y, int64_t n) {
    for (int64_t j = 0; j < n; j++)
        x[j] = x[j] + y[j];
}

/* x [B, hidden] (the embeddings in, the last layer's output out, residual included).
 * One OpenMP team for the whole call: the matrix products and attention are shared out
 * with `omp for`, the small row-wise steps run on one thread (`omp single`), each ending
 * with the team's barrier: one fork and join a step instead of 120 (four a layer).
 * KERNEL_OUT_OF_MEMORY (nothing written) where a thread's buffers could not be
 * allocated. */
int decode_layers(const struct decode_layer *layers, int64_t num_layers,
                  const struct decode_dims *dims, float eps, float scale, float *x, int64_t B,
                  const float *cos, const float *sin, const int64_t *slots,
                  const int64_t *tables, int64_t table_width, const int64_t *ctx_lens,
                  float *kv, float *scratch, int num_threads) {
    const int64_t D = dims->hidden, heads = dims->heads, kvh = dims->kv_heads;
    const int64_t hd = dims->head_dim, I = dims->intermediate, row = (heads + 2 * kvh) * hd;
    const int64_t cache = dims->num_blocks * dims->block_size * kvh * hd;
    const struct decode_scratch s = decode_scratch_layout(dims, B);
    float *h = scratch + s.h, *qkv = scratch + s.qkv, *att = scratch + s.att;
    float *gu = scratch + s.gu, *act = scratch + s.act, *y = scratch + s.y;
    int64_t longest = 1, widest = D > I ? D : I;
    for (int64_t b = 0; b < B; b++)
        longest = ctx_lens[b] > longest ? ctx_lens[b] : longest;
    widest = widest > heads * hd ? widest : heads * hd;
    int missing = 0;
#pragma omp parallel num_threads(num_threads) if (num_threads > 1)
    {
        struct team_buffers buf = team_buffers_alloc(B, widest);
        float *scores = malloc((size_t)longest * sizeof(float));
        const int lacking = team_buffers_missing(&buf, B, widest) || !scores;
        const int skip = team_any_missing(lacking, &missing);
        for (int64_t l = 0; !skip && l < num_layers; l++) {
            const struct decode_layer *w = layers + l;
            float *k = kv + l * 2 * cache, *v = k + cache;
#pragma omp single
            rms_norm(x, (const float *)(intptr_t)w->input_norm, B, D, eps, h);
            project(&w->qkv, h, B, D, row, qkv, &buf);
            prefetch_start(&w->o, D, heads * hd);
#pragma omp single
            for (int64_t b = 0; b < B; b++) {
                float *t = qkv + b * row;
                rope(t, heads + kvh, hd, cos + b * hd, sin + b * hd);
                float *kd = k + slots[b] * kvh * hd, *vd = v + slots[b] * kvh * hd;
                for (int64_t j = 0; j < kvh * hd; j++) {
                    kd[j] = t[heads * hd + j];
                    vd[j] = t[(heads + kvh) * hd + j];
                }
            }
            attention(qkv, row, k, v, tables, table_width, ctx_lens, B, dims, scale, att,
                      scores);
            project(&w->o, att, B, heads * hd, D, y, &buf);
            prefetch_start(&w->gate_up, 2 * I, D);
#pragma omp single
            {
                add_to(x, y, B * D);
                rms_norm(x, (const float *)(intptr_t)w->post_norm, B, D, eps, h);
            }
            project(&w->gate_up, h, B, D, 2 * I, gu, &buf);
            prefetch_start(&w->down, D, I);
            silu_mul(gu, B, I, act);
            project(&w->down, act, B, I, D, y, &buf);
            if (l + 1 < num_layers)
                prefetch_start(&layers[l + 1].qkv, row, D);
#pragma omp single
            add_to(x, y, B * D);
        }
        free(scores);
        team_buffers_free(&buf);
    }
    return missing ? KERNEL_OUT_OF_MEMORY : KERNEL_OK;
}
