/* Matrix products on GGUF-quantised weights (Q4_1, Q8_0) for x86-64 with AVX2, FMA and
 * F16C, in float32. Where the CPU has AVX-512 (F, BW, VL, DQ) it is built with it, and
 * the __AVX512F__ sections replace the 8-lane loops with 16-lane ones (the same
 * dequantised weights; only the order of the sums changes). Built on first use by
 * ggml_kernels.py (gcc -O3 -fopenmp) and called through ctypes. The OpenMP runtime is
 * torch's own (same soname, already loaded), so these loops and torch's ops share it.
 *
 * How weights are laid out and why they equal the reference's: ggml_groups.h.
 */
#include <stdlib.h>

#define MAX_ROWS 8   /* activation rows per register block (few-rows path) */
#define PANEL 4      /* weight rows dequantised together (many-rows path) */
#ifndef PANEL_ROWS
/* From this many activation rows on, the many-rows path. Measured on the EPYC (Zen 5),
 * fused decode steps: 9 against 4 took 4-8 rows 15-20% less time in both builds (b=6
 * AVX-512 12.2 -> 10.1 ms, AVX2 17.7 -> 14.6), 16 rows the same. */
#define PANEL_ROWS 9
#endif
#ifndef WROWS
#define WROWS 4      /* weight rows per pass for a single activation row (AVX-512) */
#endif
#ifndef AVX2_WROWS
#define AVX2_WROWS 2  /* the same for AVX2 (16 registers) */
#endif
#ifndef PREFETCH_ROWS
#define PREFETCH_ROWS 16  /* how far ahead that pass asks for its weight rows */
#endif

#include "ggml_groups.h"
#include "ggml_panels.h"
#include "ggml_team.h"

#ifdef __AVX512F__
/* y[i * ldy] = sum_k x[i * ldx + k] * w[k] for `rows` activation rows (<= MAX_ROWS) and
 * one weight row, 16 lanes at a time. With few rows two groups go per iteration, each
 * into accumulators of its own, so that enough independent FMA chains are in flight (the
 * accumulator indices stay compile-time constants: a runtime index spills them). */
INLINE void dot_rows(int fmt, int rows, const float *x, int64_t ldx, const uint8_t *qs,
                     const float *sc, int64_t groups, float *y, int64_t ldy) {
    const int pairs = rows <= 2 ? 2 : 1;
    __m512 acc[MAX_ROWS * 4];
    for (int a = 0; a < rows * 2 * pairs; a++)
        acc[a] = _mm512_setzero_ps();
    int64_t g = 0;
    for (; g + pairs <= groups; g += pairs)
        for (int p = 0; p < pairs; p++) {
            __m512 w[2];
            dequant_group16(fmt, qs, sc, g + p, w);
            const float *xg = x + (g + p) * QK;
            for (int i = 0; i < rows; i++)
                for (int j = 0; j < 2; j++) {
                    __m512 *a = acc + (i * pairs + p) * 2 + j;
                    *a = _mm512_fmadd_ps(_mm512_loadu_ps(xg + i * ldx + 16 * j), w[j], *a);
                }
        }
    for (; g < groups; g++) {  /* an odd group count with pairs == 2 */
        __m512 w[2];
        dequant_group16(fmt, qs, sc, g, w);
        const float *xg = x + g * QK;
        for (int i = 0; i < rows; i++)
            for (int j = 0; j < 2; j++) {
                __m512 *a = acc + i * pairs * 2 + j;
                *a = _mm512_fmadd_ps(_mm512_loadu_ps(xg + i * ldx + 16 * j), w[j], *a);
            }
    }
    for (int i = 0; i < rows; i++) {
        __m512 s = acc[i * pairs * 2];
        for (int a = 1; a < pairs * 2; a++)
            s = _mm512_add_ps(s, acc[i * pairs * 2 + a]);
        y[i * ldy] = _mm512_reduce_add_ps(s);
    }
}
#else
/* y[i * ldy] = sum_k x[i * ldx + k] * w[k] for `rows` activation rows (<= MAX_ROWS) and
 * one weight row. Few rows get several accumulators each, so that enough independent
 * FMA chains are in flight to hide the FMA latency. */
INLINE void dot_rows(int fmt, int rows, const float *x, int64_t ldx, const uint8_t *qs,
                     const float *sc, int64_t groups, float *y, int64_t ldy) {
    const int accs = rows <= 2 ? 4 : rows <= 4 ? 2 : 1;
    __m256 acc[MAX_ROWS * 4];
    for (int a = 0; a < rows * accs; a++)
        acc[a] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        __m256 w[4];
        dequant_group(fmt, qs, sc, g, w);
        const float *xg = x + g * QK;
        for (int i = 0; i < rows; i++)
            for (int j = 0; j < 4; j++) {
                const int a = i * accs + (j % accs);
                acc[a] = _mm256_fmadd_ps(_mm256_loadu_ps(xg + i * ldx + 8 * j), w[j], acc[a]);
            }
    }
    for (int i = 0; i < rows; i++) {
        __m256 s = acc[i * accs];
        for (int a = 1; a < accs; a++)
            s = _mm256_add_ps(s, acc[i * accs + a]);
        y[i * ldy] = hsum(s);
    }
}

/* M activation rows against R weight rows: y[i * ldy + r] (M * R <= 4: two accumulators
 * each). Interleaving the weight rows gives the out-of-order core independent dequant
 * chains to overlap, and each x vector serves all R rows. */
INLINE void dot_mxr(int fmt, int M, int R, const float *x, int64_t ldx, const uint8_t *qs,
                    int64_t row_qs, const float *sc, int64_t row_sc, int64_t groups, float *y,
                    int64_t ldy) {
    __m256 acc[8];
    for (int a = 0; a < 2 * M * R; a++)
        acc[a] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; g++)
        for (int r = 0; r < R; r++) {
            __m256 w[4];
            dequant_group(fmt, qs + r * row_qs, sc + r * row_sc, g, w);
            for (int i = 0; i < M; i++)
                for (int j = 0; j < 4; j++) {
                    __m256 *a = acc + 2 * (i * R + r) + (j & 1);
                    *a = _mm256_fmadd_ps(_mm256_loadu_ps(x + i * ldx + g * QK + 8 * j), w[j], *a);
                }
        }
    for (int i = 0; i < M; i++)
        for (int r = 0; r < R; r++)
            y[i * ldy + r] = hsum(_mm256_add_ps(acc[2 * (i * R + r)], acc[2 * (i * R + r) + 1]));
}

#endif

#define DOT_ROWS_CASES(fmt)                                                             \
    switch (rows) {                                                                     \
    case 1: dot_rows(fmt, 1, xi, K, wq, sc, groups, yi, N); break;                      \
    case 2: dot_rows(fmt, 2, xi, K, wq, sc, groups, yi, N); break;                      \
    case 3: dot_rows(fmt, 3, xi, K, wq, sc, groups, yi, N); break;                      \
    case 4: dot_rows(fmt, 4, xi, K, wq, sc, groups, yi, N); break;                      \
    case 5: dot_rows(fmt, 5, xi, K, wq, sc, groups, yi, N); break;                      \
    case 6: dot_rows(fmt, 6, xi, K, wq, sc, groups, yi, N); break;                      \
    case 7: dot_rows(fmt, 7, xi, K, wq, sc, groups, yi, N); break;                      \
    default: dot_rows(fmt, 8, xi, K, wq, sc, groups, yi, N); break;                     \
    }


#ifdef __AVX512F__
/* M activation rows (x, ldx apart) against R weight rows: y[i * ldy + r]. 2MR independent
 * FMA chains; each x vector loaded once for all R rows and each weight group dequantised
 * once for all M (M * R <= 8: the accumulators, x and w stay in the 32 registers). */
INLINE void dot_mxr(int fmt, int M, int R, const float *x, int64_t ldx, const uint8_t *qs,
                    int64_t row_qs, const float *sc, int64_t row_sc, int64_t groups, float *y,
                    int64_t ldy) {
    __m512 acc[16];
    for (int a = 0; a < 2 * M * R; a++)
        acc[a] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        __m512 xv[8];
        for (int i = 0; i < M; i++) {
            xv[2 * i] = _mm512_loadu_ps(x + i * ldx + g * QK);
            xv[2 * i + 1] = _mm512_loadu_ps(x + i * ldx + g * QK + 16);
        }
        for (int r = 0; r < R; r++) {
            __m512 w[2];
            dequant_group16(fmt, qs + r * row_qs, sc + r * row_sc, g, w);
            for (int i = 0; i < M; i++) {
                __m512 *a = acc + 2 * (i * R + r);
                a[0] = _mm512_fmadd_ps(xv[2 * i], w[0], a[0]);
                a[1] = _mm512_fmadd_ps(xv[2 * i + 1], w[1], a[1]);
            }
        }
    }
    for (int i = 0; i < M; i++)
        for (int r = 0; r < R; r++)
            y[i * ldy + r] = _mm512_reduce_add_ps(
                _mm512_add_ps(acc[2 * (i * R + r)], acc[2 * (i * R + r) + 1]));
}
#endif

/* Rows n0.. of y for M <= 4 activation rows, R weight rows a pass (R * M <= 8), asking
 * for the weight rows PREFETCH_ROWS ahead (past the task's end too: harmless hints);
 * returns the first row not done (fewer than R left). */
INLINE int64_t passes_mxr(int fmt, int M, int R, const float *x, int64_t K,
                          const uint8_t *qs, const uint16_t *scales, int64_t n0, int64_t n1,
                          int64_t N, float *y) {
    const int64_t groups = K / QK, per = scales_per_group(fmt);
    const int64_t row_qs = groups * qs_bytes_per_group(fmt), row_sc = groups * per;
    float scr[8 * groups * per];
    for (; n0 + R <= n1; n0 += R) {
        /* Streaming from memory, not computing, is the limit here. */
        prefetch_bytes(qs + (n0 + PREFETCH_ROWS) * row_qs, R * row_qs);
        _mm_prefetch((const char *)(scales + (n0 + PREFETCH_ROWS) * row_sc), _MM_HINT_T0);
        halves_to_floats(scales + n0 * row_sc, R * row_sc, scr);
        dot_mxr(fmt, M, R, x, K, qs + n0 * row_qs, row_qs, scr, row_sc, groups, y + n0, N);
    }
    return n0;
}

/* Few activation rows: each weight row against all M rows, MAX_ROWS at a time, its
 * groups dequantised in registers (a weight row stays in L1 between row groups). */
INLINE void matmul_rows(int fmt, const float *x, int64_t M, int64_t K, const uint8_t *qs,
                        const uint16_t *scales, int64_t n0, int64_t n1, int64_t N, float *y) {
    const int64_t groups = K / QK;
    const int per = scales_per_group(fmt);
    float sc[groups * per];
#ifdef __AVX512F__
    /* A few sequences' decode: R weight rows a pass, M * R <= 8 (WROWS for one row). */
    if (M == 1)
        n0 = passes_mxr(fmt, 1, WROWS, x, K, qs, scales, n0, n1, N, y);
    else if (M == 2)
        n0 = passes_mxr(fmt, 2, 4, x, K, qs, scales, n0, n1, N, y);
    else if (M == 3)
        n0 = passes_mxr(fmt, 3, 2, x, K, qs, scales, n0, n1, N, y);
    else if (M == 4)
        n0 = passes_mxr(fmt, 4, 2, x, K, qs, scales, n0, n1, N, y);
#else
    /* One sequence's decode: AVX2_WROWS weight rows a pass. */
    if (M == 1)
        n0 = passes_mxr(fmt, 1, AVX2_WROWS, x, K, qs, scales, n0, n1, N, y);
#endif
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *wq = qs + n * groups * qs_bytes_per_group(fmt);
        halves_to_floats(scales + n * groups * per, groups * per, sc);
        for (int64_t i0 = 0; i0 < M; i0 += MAX_ROWS) {
            const int rows = (int)(M - i0 < MAX_ROWS ? M - i0 : MAX_ROWS);
            const float *xi = x + i0 * K;
            float *yi = y + i0 * N + n;
            DOT_ROWS_CASES(fmt)
        }
    }
}

/* The share of y [M, N] = x [M, K] @ W.T that falls to the calling thread of the
 * enclosing OpenMP team (an orphaned `omp for`; alone outside any parallel region), W
 * [N, K] quantised as `fmt`. `buf`: this thread's own buffers (team_buffers_alloc) for
 * at least M rows of K. Ends with the team's barrier. */
void ggml_matmul_team(int fmt, const float *x, int64_t M, int64_t K, const uint8_t *qs,
                      const uint16_t *scales, int64_t N, float *y,
                      const struct team_buffers *buf) {
    float *panel = buf->panel;
    const int64_t chunk = TASK_ROWS, tasks = (N + chunk - 1) / chunk;
    const int panels = M >= PANEL_ROWS;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tasks; t++) {
        const int64_t n0 = t * chunk, n1 = n0 + chunk < N ? n0 + chunk : N;
        if (panels && fmt == FMT_Q4_1)
            matmul_panels(FMT_Q4_1, x, M, K, qs, scales, n0, n1, N, y, panel);
        else if (panels)
            matmul_panels(FMT_Q8_0, x, M, K, qs, scales, n0, n1, N, y, panel);
        else if (fmt == FMT_Q4_1)
            matmul_rows(FMT_Q4_1, x, M, K, qs, scales, n0, n1, N, y);
        else
            matmul_rows(FMT_Q8_0, x, M, K, qs, scales, n0, n1, N, y);
    }
}

/* The panel buffer a thread needs for ggml_matmul_team with M rows of K (0: none). */
int64_t ggml_panel_floats(int64_t M, int64_t K) { return M >= PANEL_ROWS ? PANEL * K : 0; }

/* y [M, N] = x [M, K] @ W.T, W [N, K] quantised as `fmt`, on a team of its own.
 * KERNEL_OUT_OF_MEMORY (y untouched) where a thread's buffers could not be allocated. */
int ggml_matmul(int fmt, const float *x, int64_t M, int64_t K, const uint8_t *qs,
                const uint16_t *scales, int64_t N, float *y, int num_threads) {
    const int needed = team_buffers_needed(M, K);
    int missing = 0;
#pragma omp parallel num_threads(num_threads) if (num_threads > 1)
    {
        struct team_buffers buf = team_buffers_alloc(M, K);
        if (!needed || !team_any_missing(team_buffers_missing(&buf, M, K), &missing))
            ggml_matmul_team(fmt, x, M, K, qs, scales, N, y, &buf);
        team_buffers_free(&buf);
    }
    return missing ? KERNEL_OUT_OF_MEMORY : KERNEL_OK;
}

/* out [count, K] = the float32 weights of rows `rows` of W (rows == NULL: rows 0..count-1).
 * The embedding lookup and the prefill path (dequantise, then a BLAS GEMM) use it. */
void ggml_dequantize(int fmt, const uint8_t *qs, const uint16_t *scales, int64_t K,
                     const int64_t *rows, int64_t count, float *out, int num_threads) {
    const int64_t groups = K / QK;
    const int64_t row_qs = groups * qs_bytes_per_group(fmt), row_sc = groups * scales_per_group(fmt);
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1 && count >= 64)
    for (int64_t r = 0; r < count; r++) {
        const int64_t n = rows ? rows[r] : r;
        if (fmt == FMT_Q4_1)
            dequant_row(FMT_Q4_1, qs + n * row_qs, scales + n * row_sc, K, out + r * K);
        else
            dequant_row(FMT_Q8_0, qs + n * row_qs, scales + n * row_sc, K, out + r * K);
    }
}
