/* Q4_1 weights times int8 activations (the `q4_1_q8` mode), for CPUs with AVX-512 VNNI:
 * llama.cpp's arithmetic for Q4_1 rather than ours. Each activation row is quantised per
 * group of 32 like llama.cpp's Q8_1 (d = max|x| / 127, q = round(x / d) to nearest even,
 * s = d * sum(q)), and a group's product is
 *
 *     x . w  ~  d_x q_x . (d_w q_w + m_w)  =  (d_w d_x) (q_w . q_x)  +  m_w s_x
 *
 * with q_w . q_x an exact integer dot (vpdpbusd: 64 byte products a step, against 16
 * float FMAs and the dequantisation a group costs the float path). Not the float32
 * reference's arithmetic: rounding x to 8 bits moves the logits, so greedy outputs can
 * differ (docs/benchmarks.md has the agreement rate); the weights are the GGUF's own.
 *
 * Layout of a quantised row (act8_quantize), in blocks of 4 groups so one 512-bit vector
 * covers a block: per block 64 bytes of the groups' elements 0-15 (group after group),
 * then 64 bytes of elements 16-31: the order of the weights' low and high nibbles (byte
 * j of a group holds element j low, j + 16 high; ggml_groups.h). Then per block 16
 * floats d_x and 16 floats s_x / 4, each repeated over the 4 int32 lanes its group's dot
 * lands in (s_x / 4 so that the 4 lanes add up to s_x; / 4 is exact). Groups past the
 * row's end are zero, and so contribute nothing.
 */
#include <stdlib.h>
#include <string.h>

#include "ggml_groups.h"
#include "ggml_team.h"

#ifndef A8_WROWS
#define A8_WROWS 4  /* weight rows per pass over an activation row */
#endif
#ifndef A8_PREFETCH_ROWS
#define A8_PREFETCH_ROWS 16
#endif

int ggml_has_act8(void) {
#ifdef __AVX512VNNI__
    return 1;
#else
    return 0;
#endif
}

#ifdef __AVX512VNNI__
#define GROUPS_PER_BLOCK 4
#define SMALL_ACT8 16384  /* quantised activations up to this size live on the stack */

INLINE int64_t act8_blocks(int64_t K) { return (K / QK + GROUPS_PER_BLOCK - 1) / GROUPS_PER_BLOCK; }

/* Bytes one quantised row takes: 128 of int8 and 2 x 16 floats per block. */
INLINE int64_t act8_row_bytes(int64_t K) { return act8_blocks(K) * (128 + 2 * 16 * 4); }

/* x [M, K] float32 -> `out` (M * act8_row_bytes(K) bytes, 64-aligned) as laid out above. */
static void act8_quantize(const float *x, int64_t M, int64_t K, uint8_t *out) {
    const int64_t blocks = act8_blocks(K), groups = K / QK, row_bytes = act8_row_bytes(K);
    memset(out, 0, (size_t)(M * row_bytes));
    for (int64_t i = 0; i < M; i++) {
        int8_t *q = (int8_t *)(out + i * row_bytes);
        float *dx = (float *)(q + blocks * 128), *sx = dx + blocks * 16;
        for (int64_t g = 0; g < groups; g++) {
            const float *xg = x + i * K + g * QK;
            const __m512 a = _mm512_loadu_ps(xg), b = _mm512_loadu_ps(xg + 16);
            const float amax = _mm512_reduce_max_ps(
                _mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
            const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            /* cvtps_epi32 rounds to nearest even (the default MXCSR), as torch.round. */
            const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(id)));
            const __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, _mm512_set1_ps(id)));
            const int64_t blk = g / GROUPS_PER_BLOCK, slot = g % GROUPS_PER_BLOCK;
            _mm_storeu_si128((__m128i *)(q + blk * 128 + slot * 16), _mm512_cvtepi32_epi8(qa));
            _mm_storeu_si128((__m128i *)(q + blk * 128 + 64 + slot * 16),
                             _mm512_cvtepi32_epi8(qb));
            const float s = d * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
            for (int l = 0; l < 4; l++) {
                dx[blk * 16 + slot * 4 + l] = d;
                sx[blk * 16 + slot * 4 + l] = s * 0.25f;
            }
        }
    }
}

/* The last, partial block of a row (`left` = 1-3 groups), zero past the row's end. Plain
 * loads of exactly its bytes: a masked load that misses the cache stalls the stream on
 * this CPU (measured: half the bandwidth). */
INLINE __m512i load_tail_groups(const uint8_t *p, int64_t left) {
    const __m128i a = _mm_loadu_si128((const __m128i *)p);
    const __m128i b = left > 1 ? _mm_loadu_si128((const __m128i *)(p + 16)) : _mm_setzero_si128();
    const __m128i c = left > 2 ? _mm_loadu_si128((const __m128i *)(p + 32)) : _mm_setzero_si128();
    const __m512i ab = _mm512_zextsi256_si512(_mm256_set_m128i(b, a));
    return _mm512_inserti32x4(ab, c, 2);
}

/* The block's (d, m) fp16 pairs for `left` = 1-3 groups, zero past the row's end. */
INLINE __m128i load_tail_scales(const uint16_t *p, int64_t left) {
    int32_t one;
    if (left == 2)
        return _mm_loadl_epi64((const __m128i *)p);
    __builtin_memcpy(&one, p + 2 * (left - 1), 4);  /* the last pair */
    return left == 1 ? _mm_cvtsi32_si128(one)
                     : _mm_insert_epi32(_mm_loadl_epi64((const __m128i *)p), one, 2);
}

/* y[i * ldy + r] = weight row r (of R consecutive rows at `qs`, `scales`) . quantised
 * activation row i (of MT, row_bytes apart from `xa`); MT * R <= 8 accumulators. Each
 * weight block is unpacked once for all MT rows, each activation block loaded once for
 * all R. */
INLINE void dot_act8(int MT, int R, const uint8_t *xa, int64_t row_bytes, int64_t K,
                     const uint8_t *qs, const uint16_t *scales, float *y, int64_t ldy) {
    const int64_t blocks = act8_blocks(K), groups = K / QK, row_qs = groups * 16;
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    const __m512i d_lanes = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6);
    const __m512i m_lanes = _mm512_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3, 5, 5, 5, 5, 7, 7, 7, 7);
    __m512 acc[8];
    for (int a = 0; a < MT * R; a++)
        acc[a] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t left = groups - b * GROUPS_PER_BLOCK;
        const int full = left >= GROUPS_PER_BLOCK;
        for (int r = 0; r < R; r++) {
            const uint8_t *wp = qs + r * row_qs + b * 64;
            const __m512i w = full ? _mm512_loadu_si512(wp) : load_tail_groups(wp, left);
            const __m512i lo = _mm512_and_si512(w, nibble);
            const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), nibble);
            /* The block's (d, m) pairs, fp16 -> float. */
            const uint16_t *sp = scales + (r * groups + b * GROUPS_PER_BLOCK) * 2;
            const __m512 s = _mm512_castps256_ps512(_mm256_cvtph_ps(
                full ? _mm_loadu_si128((const __m128i *)sp) : load_tail_scales(sp, left)));
            const __m512 dw = _mm512_permutexvar_ps(d_lanes, s);
            const __m512 mw = _mm512_permutexvar_ps(m_lanes, s);
            for (int i = 0; i < MT; i++) {
                const int8_t *xq = (const int8_t *)(xa + i * row_bytes);
                const float *dx = (const float *)(xq + blocks * 128), *sx = dx + blocks * 16;
                const __m512i dot = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(
                    _mm512_setzero_si512(), lo, _mm512_load_si512(xq + b * 128)), hi,
                    _mm512_load_si512(xq + b * 128 + 64));
                __m512 *a = acc + i * R + r;
                *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot),
                                     _mm512_mul_ps(dw, _mm512_loadu_ps(dx + b * 16)), *a);
                *a = _mm512_fmadd_ps(mw, _mm512_loadu_ps(sx + b * 16), *a);
            }
        }
    }
    for (int i = 0; i < MT; i++)
        for (int r = 0; r < R; r++)
            y[i * ldy + r] = _mm512_reduce_add_ps(acc[i * R + r]);
}

#define ACT8_TILE_CASES(mt)                                                             \
    switch (mt) {                                                                       \
    case 1: dot_act8(1, 1, xi, row_bytes, K, w, ws, yi, N); break;                      \
    case 2: dot_act8(2, 1, xi, row_bytes, K, w, ws, yi, N); break;                      \
    case 3: dot_act8(3, 1, xi, row_bytes, K, w, ws, yi, N); break;                      \
    case 4: dot_act8(4, 1, xi, row_bytes, K, w, ws, yi, N); break;                      \
    case 5: dot_act8(5, 1, xi, row_bytes, K, w, ws, yi, N); break;                      \
    case 6: dot_act8(6, 1, xi, row_bytes, K, w, ws, yi, N); break;                      \
    case 7: dot_act8(7, 1, xi, row_bytes, K, w, ws, yi, N); break;                      \
    default: dot_act8(8, 1, xi, row_bytes, K, w, ws, yi, N); break;                     \
    }

/* Rows n0..n1-1 of y [M, N] = x @ W.T from the quantised activations `xa`. One activation
 * row: A8_WROWS weight rows a pass, streamed with prefetching. Several: tiles of up to 8
 * activation rows, each tile against every weight row of the task (TASK_ROWS) before the
 * next, so that the tile (8 x 3 KB at K = 1536) and the rows stay in L1 together. */
static void rows_act8(const uint8_t *xa, int64_t M, int64_t K, const uint8_t *qs,
                      const uint16_t *scales, int64_t n0, int64_t n1, int64_t N, float *y) {
    const int64_t groups = K / QK, row_qs = groups * 16, row_bytes = act8_row_bytes(K);
    if (M > 1) {
        for (int64_t i0 = 0; i0 < M; i0 += 8)
            for (int64_t n = n0; n < n1; n++) {
                const uint8_t *xi = xa + i0 * row_bytes, *w = qs + n * row_qs;
                const uint16_t *ws = scales + n * groups * 2;
                float *yi = y + i0 * N + n;
                ACT8_TILE_CASES(M - i0)
            }
        return;
    }
    for (int64_t n = n0; n < n1;) {
        const int R = n1 - n >= A8_WROWS ? A8_WROWS : 1;
        /* Streaming weights is the limit: ask for the rows A8_PREFETCH_ROWS ahead (past
         * this task's end too: harmless hints). */
        prefetch_bytes(qs + (n + A8_PREFETCH_ROWS) * row_qs, R * row_qs);
        _mm_prefetch((const char *)(scales + (n + A8_PREFETCH_ROWS) * groups * 2), _MM_HINT_T0);
        if (R == A8_WROWS)
            dot_act8(1, A8_WROWS, xa, row_bytes, K, qs + n * row_qs, scales + n * groups * 2,
                     y + n, N);
        else
            dot_act8(1, 1, xa, row_bytes, K, qs + n * row_qs, scales + n * groups * 2, y + n, N);
        n += R;
    }
}

/* The heap buffer (64-aligned) a thread needs for ggml_matmul_act8_team with M rows of K
 * (0: the quantised rows fit on its stack). */
int64_t ggml_act8_heap_bytes(int64_t M, int64_t K) {
    const int64_t bytes = M * act8_row_bytes(K);
    return bytes <= SMALL_ACT8 ? 0 : bytes;
}

/* The calling thread's share of y [M, N] = x [M, K] @ W.T (an orphaned `omp for`, ending
 * with the team's barrier), W Q4_1. Every thread quantises all of x for itself: M * K
 * roundings against the M * K * N / threads products of its share. `heap`: this thread's
 * ggml_act8_heap_bytes(M, K) bytes (or more), where that is not 0. */
void ggml_matmul_act8_team(const float *x, int64_t M, int64_t K, const uint8_t *qs,
                           const uint16_t *scales, int64_t N, float *y, uint8_t *heap) {
    const int64_t bytes = M * act8_row_bytes(K);
    _Alignas(64) uint8_t small[bytes <= SMALL_ACT8 ? bytes : 64];
    uint8_t *xa = bytes <= SMALL_ACT8 ? small : heap;
    act8_quantize(x, M, K, xa);
    const int64_t chunk = TASK_ROWS, tasks = (N + chunk - 1) / chunk;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tasks; t++)
        rows_act8(xa, M, K, qs, scales, t * chunk, t * chunk + chunk < N ? t * chunk + chunk : N,
                  N, y);
}
#else
int64_t ggml_act8_heap_bytes(int64_t M, int64_t K) {
    (void)M; (void)K;
    return 0;
}

void ggml_matmul_act8_team(const float *x, int64_t M, int64_t K, const uint8_t *qs,
                           const uint16_t *scales, int64_t N, float *y, uint8_t *heap) {
    (void)x; (void)M; (void)K; (void)qs; (void)scales; (void)N; (void)y; (void)heap;
    abort();  /* unreachable: the Python side refuses FMT_Q4_1_Q8 where has_act8 is 0 */
}
#endif
