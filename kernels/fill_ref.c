/* fill_ref.c: deterministic pseudo-random tensors on the host (see fill.h). */
#include "fill.h"

static uint16_t to_bf16(float f) { // round to nearest even (finite values)
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

void fill_uniform_ref(void *dst, enum td_dtype t, int64_t n, uint64_t seed, float lo, float hi) {
    for (int64_t i = 0; i < n; i++) {
        float v = fill_value(seed, (uint64_t)i, lo, hi);
        if (t == TD_DTYPE_BF16)
            ((uint16_t *)dst)[i] = to_bf16(v);
        else
            ((float *)dst)[i] = v;
    }
}
