/* The decode rows of a mixed step (decodes riding with a prefill chunk): their attention
 * straight off the paged cache, as the fused decode step does it (paged_attend.h). The
 * torch path would first gather every decode's whole context into a padded copy, twice
 * (K and V) per layer: at 31 decodes of 1,100 tokens that copy alone is ~100 ms a step on
 * two cores, and the padded SDPA as much again. Prefill chunks keep torch's SDPA.
 *
 * q: B rows of q_stride floats (head h at h * head_dim); k, v: one layer's cache, this
 * step's K/V already written; tables [B, table_width]; ctx_lens[b]: keys of sequence b
 * (its new token included); out [B, heads * head_dim]. KERNEL_OUT_OF_MEMORY (nothing
 * written) where a thread's scores could not be allocated. */
#include <stdlib.h>

#include <omp.h>

#include "ggml_team.h"
#include "paged_attend.h"

int paged_decode_attention(const float *q, int64_t q_stride, const float *k, const float *v,
                           const int64_t *tables, int64_t table_width,
                           const int64_t *ctx_lens, int64_t B,
                           const struct decode_dims *dims, float scale, float *out,
                           int num_threads) {
    int64_t longest = 1;
    for (int64_t b = 0; b < B; b++)
        longest = ctx_lens[b] > longest ? ctx_lens[b] : longest;
    int missing = 0;
#pragma omp parallel num_threads(num_threads) if (num_threads > 1 && B * dims->heads > 1)
    {
        float *scores = malloc((size_t)longest * sizeof(float));
        if (!team_any_missing(!scores, &missing))
            attention(q, q_stride, k, v, tables, table_width, ctx_lens, B, dims, scale, out,
                      scores);
        free(scores);
    }
    return missing ? KERNEL_OUT_OF_MEMORY : KERNEL_OK;
}
