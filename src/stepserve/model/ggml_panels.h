/* The many-rows path of ggml_kernels.c (from PANEL_ROWS activation rows on: prefill
 * chunks, large decode batches): PANEL weight rows at a time dequantised once into a
 * float32 panel, then multiplied by every activation row in 4 x 2 register tiles.
 * Included by ggml_kernels.c after its PANEL definition. */
#ifndef STEPSERVE_GGML_PANELS_H
#define STEPSERVE_GGML_PANELS_H
#include "ggml_groups.h"

/* y[i * ldy + c] = x[i] . w[c] for `rows` (<= 4) activation rows and `cols` (<= 2) float
 * weight rows (K % VLEN == 0): 8 accumulators, enough independent FMA chains to keep
 * both FMA pipes busy, and nothing but loads and FMAs in the loop. */
INLINE void tile_dot(int rows, int cols, const float *x, int64_t K, const float *w,
                     float *y, int64_t ldy) {
    vec acc[4][2];
    for (int i = 0; i < rows; i++)
        for (int c = 0; c < cols; c++)
            acc[i][c] = vzero();
    for (int64_t k = 0; k < K; k += VLEN) {
        vec wv[2];
        for (int c = 0; c < cols; c++)
            wv[c] = vload(w + c * K + k);
        for (int i = 0; i < rows; i++) {
            const vec xv = vload(x + i * K + k);
            for (int c = 0; c < cols; c++)
                acc[i][c] = vfmadd(xv, wv[c], acc[i][c]);
        }
    }
    for (int i = 0; i < rows; i++)
        for (int c = 0; c < cols; c++)
            y[i * ldy + c] = vsum(acc[i][c]);
}

#define TILE_CASES(cols)                                                                \
    switch (rows) {                                                                     \
    case 1: tile_dot(1, cols, xi, K, wc, yi, N); break;                                 \
    case 2: tile_dot(2, cols, xi, K, wc, yi, N); break;                                 \
    case 3: tile_dot(3, cols, xi, K, wc, yi, N); break;                                 \
    default: tile_dot(4, cols, xi, K, wc, yi, N); break;                                \
    }

/* Many activation rows: PANEL weight rows at a time are dequantised once into `panel`
 * (float32, L1-sized) and multiplied by every activation row in 4 x 2 tiles. */
INLINE void matmul_panels(int fmt, const float *x, int64_t M, int64_t K, const uint8_t *qs,
                          const uint16_t *scales, int64_t n0, int64_t n1, int64_t N,
                          float *y, float *panel) {
    const int64_t row_qs = K / QK * qs_bytes_per_group(fmt);
    const int64_t row_sc = K / QK * scales_per_group(fmt);
    for (int64_t n = n0; n < n1; n += PANEL) {
        const int64_t np = n1 - n < PANEL ? n1 - n : PANEL;
        for (int64_t r = 0; r < np; r++)
            dequant_row(fmt, qs + (n + r) * row_qs, scales + (n + r) * row_sc, K, panel + r * K);
        for (int64_t i0 = 0; i0 < M; i0 += 4) {
            const int rows = (int)(M - i0 < 4 ? M - i0 : 4);
            const float *xi = x + i0 * K;
            for (int64_t c = 0; c < np; c += 2) {
                const float *wc = panel + c * K;
                float *yi = y + i0 * N + n + c;
                if (np - c >= 2) {
                    TILE_CASES(2)
                } else {
                    TILE_CASES(1)
                }
            }
        }
    }
}

#endif
