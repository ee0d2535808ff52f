/* A matrix product run by an OpenMP team (ggml_matmul, decode_layers): each thread's
 * buffers, allocated by the entry point that opens the team and checked there, and the
 * team functions the C files share. */
#ifndef STEPSERVE_GGML_TEAM_H
#define STEPSERVE_GGML_TEAM_H
#include <stdlib.h>

#include "ggml_groups.h"

/* One thread's buffers for ggml_matmul_team: the dequantised panel (many-rows path);
 * NULL where unneeded. */
struct team_buffers {
    float *panel;
};

int64_t ggml_panel_floats(int64_t M, int64_t K);
void ggml_matmul_team(int fmt, const float *x, int64_t M, int64_t K, const uint8_t *qs,
                      const uint16_t *scales, int64_t N, float *y,
                      const struct team_buffers *buf);

/* Whether the team needs any buffer for products of up to M rows of up to K columns (the
 * same answer on every thread). */
INLINE int team_buffers_needed(int64_t M, int64_t K) { return ggml_panel_floats(M, K) > 0; }

/* This thread's buffers for products of up to M rows of up to K columns; a failed
 * allocation leaves its pointer NULL (team_buffers_missing). */
INLINE struct team_buffers team_buffers_alloc(int64_t M, int64_t K) {
    struct team_buffers b = {NULL};
    const int64_t floats = ggml_panel_floats(M, K);
    if (floats)
        b.panel = aligned_alloc(64, (size_t)floats * sizeof(float));
    return b;
}

INLINE int team_buffers_missing(const struct team_buffers *b, int64_t M, int64_t K) {
    return ggml_panel_floats(M, K) && !b->panel;
}

INLINE void team_buffers_free(struct team_buffers *b) { free(b->panel); }

/* Whether any thread of the team lacks a buffer: each thread passes its own `missing`
 * and gets the team's answer through `team_missing` (shared, 0 before the team starts).
 * Every thread gets the same answer, so all skip the work or all do it: one that skipped
 * a worksharing loop would leave the others waiting at its barrier. A barrier: every
 * thread of the team calls it. */
INLINE int team_any_missing(int missing, int *team_missing) {
    if (missing) {
#pragma omp atomic write
        *team_missing = 1;
    }
#pragma omp barrier
    int any;
#pragma omp atomic read
    any = *team_missing;
    return any;
}

#endif
