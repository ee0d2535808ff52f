/* The layout this library was built with (kernel_abi.h), for Python to read at load time
 * (ggml_kernels.py): the version, every enum value, and each struct's size and field
 * offsets in bytes, by name ("decode_dims" is a size, "decode_dims.hidden" an offset). */
#include <stddef.h>

#include "kernel_abi.h"

struct abi_entry {
    const char *name;
    int64_t value;
};

#define CONST(c) {#c, c}
#define SIZE(s) {#s, (int64_t)sizeof(struct s)}
#define FIELD(s, f) {#s "." #f, (int64_t)offsetof(struct s, f)}
#define PROJECTION(p) FIELD(decode_layer, p.format), FIELD(decode_layer, p.qs), \
                      FIELD(decode_layer, p.scales)

static const struct abi_entry ENTRIES[] = {
    CONST(STEPSERVE_ABI_VERSION),
    CONST(FMT_Q4_1), CONST(FMT_Q8_0), CONST(FMT_F32),
    CONST(KERNEL_OK), CONST(KERNEL_OUT_OF_MEMORY),
    SIZE(decode_dims),
    FIELD(decode_dims, hidden), FIELD(decode_dims, heads), FIELD(decode_dims, kv_heads),
    FIELD(decode_dims, head_dim), FIELD(decode_dims, intermediate),
    FIELD(decode_dims, num_blocks), FIELD(decode_dims, block_size),
    FIELD(decode_dims, window),
    SIZE(decode_layer),
    FIELD(decode_layer, input_norm), FIELD(decode_layer, post_norm),
    PROJECTION(qkv), PROJECTION(o), PROJECTION(gate_up), PROJECTION(down),
};

/* Entry i: its name and value, and 1; 0 past the last. */
int stepserve_abi_entry(int64_t i, const char **name, int64_t *value) {
    if (i < 0 || i >= (int64_t)(sizeof(ENTRIES) / sizeof(ENTRIES[0])))
        return 0;
    *name = ENTRIES[i].name;
    *value = ENTRIES[i].value;
    return 1;
}

/* The floats decode_layers' scratch needs for `rows` rows. */
int64_t decode_scratch_floats(const struct decode_dims *dims, int64_t rows) {
    return decode_scratch_layout(dims, rows).floats;
}
