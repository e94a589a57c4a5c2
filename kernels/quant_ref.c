/* quant_ref.c: the released formats decoded to fp32 (quant.h). */
#include "quant.h"

#include <math.h>
#include <string.h>

float td_e8m0_to_f32(uint8_t b) {
    if (b == 255) return NAN;
    uint32_t bits = b ? (uint32_t)b << 23 : 0x00400000u; // byte 0: the denormal 2^-127
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

float td_e4m3_to_f32(uint8_t q) {
    int sign = q >> 7, e = (q >> 3) & 15, m = q & 7;
    if (e == 15 && m == 7) return NAN;                                      // 0x7F, 0xFF
    float v = e ? ldexpf((float)(8 + m), e - 7 - 3) : ldexpf((float)m, -9); // normal, subnormal
    return sign ? -v : v;
}

float td_e2m1_to_f32(uint8_t code) {
    static const float lut[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = lut[code & 7];
    return code & 8 ? -v : v;
}

uint8_t td_f32_to_e4m3(float v) {
    if (isnan(v)) return 0x7F;
    uint8_t sign = signbit(v) ? 0x80 : 0;
    float a = fabsf(v);
    if (a >= 448.0f) return sign | 0x7E;
    int lo = 0, hi = 0x7E; // the positive codes' values rise with the code: the last at or below a
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (td_e4m3_to_f32((uint8_t)mid) <= a)
            lo = mid;
        else
            hi = mid - 1;
    }
    float below = td_e4m3_to_f32((uint8_t)lo), above = td_e4m3_to_f32((uint8_t)(lo + 1));
    int up = a - below > above - a || (a - below == above - a && (lo & 1));
    return sign | (uint8_t)(lo + up);
}

void act_quant_ref(float *xq, const float *x, int n, int in) {
    for (int t = 0; t < n; t++)
        for (int k0 = 0; k0 < in; k0 += 128) {
            const float *r = x + (size_t)t * in + k0;
            float m = 1e-4f;
            for (int k = 0; k < 128; k++)
                m = fmaxf(m, fabsf(r[k]));
            int e;
            float f = frexpf(m / 448.0f, &e); // m / 448 = f 2^e, f in [0.5, 1)
            float sc = ldexpf(1.0f, f == 0.5f ? e - 1 : e);
            for (int k = 0; k < 128; k++)
                xq[(size_t)t * in + k0 + k] = td_e4m3_to_f32(td_f32_to_e4m3(r[k] / sc)) * sc;
        }
}

long td_e8m0_find_nan(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] == 255) return (long)i;
    return -1;
}

void dequant_fp8_ref(float *w, const uint8_t *q, const uint8_t *scale, int out, int in) {
    int sc = (in + 127) / 128; // scale columns
    for (int o = 0; o < out; o++)
        for (int i = 0; i < in; i++)
            w[(size_t)o * in + i] = td_e4m3_to_f32(q[(size_t)o * in + i]) *
                                    td_e8m0_to_f32(scale[(size_t)(o / 128) * sc + i / 128]);
}

void dequant_fp4_ref(float *w, const uint8_t *packed, const uint8_t *scale, int out, int in) {
    for (int o = 0; o < out; o++)
        for (int k = 0; k < in; k++) {
            uint8_t byte = packed[(size_t)o * (in / 2) + k / 2];
            uint8_t code = k % 2 ? byte >> 4 : byte & 15;
            w[(size_t)o * in + k] =
                td_e2m1_to_f32(code) * td_e8m0_to_f32(scale[(size_t)o * (in / 32) + k / 32]);
        }
}

void dequant_packed_ref(float *w, const void *packed, enum td_dtype t, int rows, int in) {
    const uint8_t *q = packed, *s = q + td_quant_code_bytes(t, rows, in);
    if (t == TD_DTYPE_Q4)
        dequant_fp4_ref(w, q, s, rows, in);
    else
        dequant_fp8_ref(w, q, s, rows, in);
}
