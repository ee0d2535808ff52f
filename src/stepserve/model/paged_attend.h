/* Decode attention over the paged KV cache, shared by the fused decode step
 * (decode_kernels.c) and the decode rows of a mixed step (decode_attention.c): one query
 * token per sequence against its own cached context, walked a block at a time.
 * Cache layout [num_blocks, block_size, kv_heads, head_dim] per layer and K or V. */
#ifndef STEPSERVE_PAGED_ATTEND_H
#define STEPSERVE_PAGED_ATTEND_H
#include <math.h>

#include "ggml_groups.h"

static float dot(const float *a, const float *b, int64_t n) {
    vec acc0 = vzero(), acc1 = vzero();
    int64_t i = 0;
    for (; i + 2 * VLEN <= n; i += 2 * VLEN) {
        acc0 = vfmadd(vload(a + i), vload(b + i), acc0);
        acc1 = vfmadd(vload(a + i + VLEN), vload(b + i + VLEN), acc1);
    }
    for (; i + VLEN <= n; i += VLEN)
        acc0 = vfmadd(vload(a + i), vload(b + i), acc0);
    float r = vsum(vadd(acc0, acc1));
    for (; i < n; i++)
        r += a[i] * b[i];
    return r;
}

/* e[i] = exp(e[i] - mx) for i < n, and their sum. */
static float exp_shifted(float *e, int64_t n, float mx) {
    vec acc = vzero();
    int64_t i = 0;
    for (; i + VLEN <= n; i += VLEN) {
        const vec t = vexp(vadd(vload(e + i), vset1(-mx)));
        vstore(e + i, t);
        acc = vadd(acc, t);
    }
    float sum = vsum(acc);
    if (i < n) {  /* the tail through one padded vector: the same exp */
        float tail[VLEN] = {0};
        for (int64_t j = i; j < n; j++)
            tail[j - i] = e[j] - mx;
        vstore(tail, vexp(vload(tail)));
        for (int64_t j = i; j < n; j++) {
            e[j] = tail[j - i];
            sum += e[j];
        }
    }
    return sum;
}

/* o[j] += w * v[j], j < n (the softmax-weighted sum of V rows). */
static void axpy(float *restrict o, const float *restrict v, float w, int64_t n) {
    int64_t j = 0;
    for (; j + VLEN <= n; j += VLEN)
        vstore(o + j, vadd(vload(o + j), vmul(vset1(w), vload(v + j))));
    for (; j < n; j++)
        o[j] += w * v[j];
}

/* out [hd] = softmax(q . k_p * scale) . v_p over positions lo..hi-1 of one sequence's
 * paged cache (kv head `g`); `scores` holds hi - lo floats. The cache is walked a block
 * at a time (no division per position). */
static void attend(const float *q, const float *k, const float *v, const int64_t *table,
                   int64_t lo, int64_t hi, int64_t g, const struct decode_dims *dims,
                   float scale, float *scores, float *out) {
    const int64_t bs = dims->block_size, kvh = dims->kv_heads, hd = dims->head_dim;
    const int64_t stride = kvh * hd;  /* floats from one cache slot to the next */
    float mx = -INFINITY;
    for (int64_t p = lo; p < hi;) {
        const int64_t off = p % bs, n = bs - off < hi - p ? bs - off : hi - p;
        const int64_t first = (table[p / bs] * bs + off) * kvh + g;
        const float *kp = k + first * hd;
        /* The cache is cold by now (a step streams every layer's weights in between):
         * ask for the next block's K rows and this block's V rows ahead of use. */
        const int64_t next = p + n < hi ? (table[(p + n) / bs] * bs) * kvh + g : -1;
        for (int64_t j = 0; j < n; j++) {
            if (next >= 0)
                prefetch_bytes(k + (next + j * kvh) * hd, hd * (int64_t)sizeof(float));
            prefetch_bytes(v + (first + j * kvh) * hd, hd * (int64_t)sizeof(float));
            const float s = dot(q, kp + j * stride, hd) * scale;
            scores[p - lo + j] = s;
            mx = s > mx ? s : mx;
        }
        p += n;
    }
    const float sum = exp_shifted(scores, hi - lo, mx);
    for (int64_t j = 0; j < hd; j++)
        out[j] = 0.0f;
    for (int64_t p = lo; p < hi;) {
        const int64_t off = p % bs, n = bs - off < hi - p ? bs - off : hi - p;
        const float *vp = v + ((table[p / bs] * bs + off) * kvh + g) * hd;
        for (int64_t i = 0; i < n; i++)
            axpy(out, vp + i * stride, scores[p - lo + i] / sum, hd);
        p += n;
    }
}

/* This thread's share of the step's attention: one (sequence, head) pair a task, each
 * over its own context (`scores`: room for the longest). Head h of sequence b's query
 * is at q + b * q_stride + h * hd. Ends with the team's barrier. */
static void attention(const float *q, int64_t q_stride, const float *k, const float *v,
                      const int64_t *tables, int64_t table_width, const int64_t *ctx_lens,
                      int64_t B, const struct decode_dims *dims, float scale, float *out,
                      float *scores) {
    const int64_t heads = dims->heads, kvh = dims->kv_heads, hd = dims->head_dim;
    const int64_t window = dims->window;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < B * heads; t++) {
        const int64_t b = t / heads, h = t % heads, hi = ctx_lens[b];
        const int64_t lo = window > 0 && hi > window ? hi - window : 0;
        attend(q + b * q_stride + h * hd, k, v, tables + b * table_width, lo, hi,
               h / (heads / kvh), dims, scale, scores, out + (b * heads + h) * hd);
    }
}

#endif
