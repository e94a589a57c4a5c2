/* fill_ref.c: deterministic pseudo-random tensors on the host (see fill.h). */
#include "fill.h"

#include <math.h>

#include "quant.h"

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

void fill_quant_ref(void *dst, enum td_dtype t, int64_t rows, int64_t in, uint64_t seed,
                    uint8_t scale) {
    uint8_t *p = dst;
    size_t codes = td_quant_code_bytes(t, rows, in), all = td_quant_bytes(t, rows, in);
    for (size_t i = 0; i < codes; i++)
        p[i] = fill_quant_code(t, seed, i);
    memset(p + codes, scale, all - codes);
}

uint8_t fill_quant_scale(enum td_dtype t, float rms) {
    double sq = 0.0; // the mean square of a code's value (every byte value equally likely)
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        double v = t == TD_DTYPE_Q8 ? td_e4m3_to_f32(c & 0xBF) : td_e2m1_to_f32(c);
        sq += v * v;
    }
    double e = round(log2(rms / sqrt(sq / 256)));
    return (uint8_t)fmin(fmax(127.0 + e, 0.0), 254.0);
}
