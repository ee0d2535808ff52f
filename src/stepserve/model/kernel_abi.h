/* The kernel library's interface with Python, defined once: the weight formats, the
 * status codes its entry points return, and the structs decode_layers reads (the model's
 * dimensions, one layer's weights, and how its scratch buffer is carved).
 *
 * Python (ggml_kernels.py) reads the enums and the version below from this file, and the
 * structs' sizes and field offsets from the built library (stepserve_abi_entry,
 * kernel_abi.c), so a field can move here without a matching edit in Python; a library
 * whose version, formats or fields differ from what Python fills is refused with the
 * reason. Bump STEPSERVE_ABI_VERSION when an entry point's arguments change meaning.
 * Enum members stay one per line as `NAME = value,` (ggml_kernels.py reads them so).
 */
#ifndef STEPSERVE_KERNEL_ABI_H
#define STEPSERVE_KERNEL_ABI_H
#include <stdint.h>

#ifndef STEPSERVE_ABI_VERSION
#define STEPSERVE_ABI_VERSION 1
#endif

/* How a weight matrix [N, K] is held (ggml_groups.h has the GGUF layouts). */
enum kernel_format {
    FMT_Q4_1 = 0,
    FMT_Q8_0 = 1,
    FMT_F32 = 2,  /* decode_layers only: float32 rows [N, K], no scales */
};

/* What an entry point returns. */
enum kernel_status {
    KERNEL_OK = 0,
    KERNEL_OUT_OF_MEMORY = 1,  /* a thread's buffer could not be allocated: nothing computed */
};

/* The model's sizes and the paged cache's, as decode_layers reads them. */
struct decode_dims {
    int64_t hidden, heads, kv_heads, head_dim, intermediate;
    int64_t num_blocks, block_size;
    int64_t window;  /* sliding-window length; 0: none */
};

/* One projection's weights: a kernel_format and the addresses of its quants (FMT_F32: the
 * float32 rows) and fp16 scales (FMT_F32: unused). */
struct decode_projection {
    int64_t format, qs, scales;
};

/* One decoder layer's weights (addresses as int64: Python packs them into a tensor). */
struct decode_layer {
    int64_t input_norm, post_norm;  /* float32 [hidden] */
    struct decode_projection qkv, o, gate_up, down;
};

/* decode_layers' scratch for B rows: float32 buffers [B, width] one after another,
 * offsets in floats (`floats`: the total, linear in B). */
struct decode_scratch {
    int64_t h, qkv, att, gu, act, y, floats;
};

static inline struct decode_scratch decode_scratch_layout(const struct decode_dims *d,
                                                          int64_t B) {
    struct decode_scratch s;
    s.h = 0;
    s.qkv = s.h + B * d->hidden;
    s.att = s.qkv + B * (d->heads + 2 * d->kv_heads) * d->head_dim;
    s.gu = s.att + B * d->heads * d->head_dim;
    s.act = s.gu + B * 2 * d->intermediate;
    s.y = s.act + B * d->intermediate;
    s.floats = s.y + B * d->hidden;
    return s;
}

#endif
