/* dtype.h: storage dtypes the kernels read, and scalar conversions to fp32.
 * Kernels depend on nothing else in the project; model/tensor.h builds on this.
 */
#ifndef TD_DTYPE_H
#define TD_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

enum td_dtype {
    TD_DTYPE_NONE = 0,
    TD_DTYPE_F32,
    TD_DTYPE_BF16,
    TD_DTYPE_F16,
    TD_DTYPE_I32,
    TD_DTYPE_I64,
    /* the released checkpoints' stored formats (kernels/quant.h). A loaded weight's view of
     * F8_E4M3 or F4_E2M1 carries its scale (td_tensor.scale); placing the model decodes it (the
     * CPU) or packs it into Q8/Q4 (a device). No op reads these as they are. */
    TD_DTYPE_F8_E4M3, /* FP8 weights */
    TD_DTYPE_F8_E8M0, /* their power-of-two scales */
    TD_DTYPE_I8,      /* FP4 weights as stored: two e2m1 codes a byte */
    TD_DTYPE_F4_E2M1, /* a loaded FP4 weight: logical shape [out, in], bytes as I8 */
    /* block-quantized weights as the GEMM ops read them (quant.h): one buffer, the codes, then
     * the scales. td_dtype_size is 0 for these: td_quant_bytes gives a matrix's bytes. */
    TD_DTYPE_Q8, /* e4m3 [rows, in], then e8m0 [ceil(rows / 128), ceil(in / 128)] */
    TD_DTYPE_Q4, /* e2m1 pairs [rows, in / 2], then e8m0 [rows, in / 32] */
};

/* on the host and, in CUDA sources, on the device too */
#ifdef __CUDACC__
#define TD_HOST_DEVICE __host__ __device__
#else
#define TD_HOST_DEVICE
#endif

/* bytes per element, 0 for TD_DTYPE_NONE */
static inline TD_HOST_DEVICE size_t td_dtype_size(enum td_dtype t) {
    switch (t) {
    case TD_DTYPE_F32:
    case TD_DTYPE_I32: return 4;
    case TD_DTYPE_BF16:
    case TD_DTYPE_F16: return 2;
    case TD_DTYPE_I64: return 8;
    case TD_DTYPE_F8_E4M3:
    case TD_DTYPE_F8_E8M0:
    case TD_DTYPE_I8: return 1;
    default: return 0;
    }
}

static inline float td_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* exact IEEE binary16 -> binary32: normals and inf/nan by re-biasing the bit fields,
 * subnormals as mant * 2^-24, which fp32 represents exactly */
static inline float td_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, u;
    float f;
    if (exp == 0) {
        f = (float)mant * 0x1p-24f;
        return sign ? -f : f;
    }
    u = exp == 0x1f ? (sign | 0x7f800000u | (mant << 13))
                    : (sign | ((exp + 112) << 23) | (mant << 13));
    memcpy(&f, &u, 4);
    return f;
}

/* element i of a float array of dtype t as fp32 */
static inline float td_load_f32(const void *p, enum td_dtype t, int64_t i) {
    // memcpy: a safetensors file need not align its tensors to their element size
    const char *b = (const char *)p;
    float f;
    uint16_t h;
    switch (t) {
    case TD_DTYPE_F32: memcpy(&f, b + 4 * i, 4); return f;
    case TD_DTYPE_BF16: memcpy(&h, b + 2 * i, 2); return td_bf16_to_f32(h);
    case TD_DTYPE_F16: memcpy(&h, b + 2 * i, 2); return td_f16_to_f32(h);
    default: return 0.0f;
    }
}

/* dst[0..n) = elements [off, off+n) of a float array of dtype t */
static inline void td_load_row_f32(float *dst, const void *p, enum td_dtype t, int64_t off,
                                   int64_t n) {
    if (t == TD_DTYPE_F32) { // byte offsets: p need not be float-aligned (see td_load_f32)
        memcpy(dst, (const char *)p + 4 * off, (size_t)n * 4);
        return;
    }
    if (t == TD_DTYPE_BF16) { // the common case on the host, as a loop the compiler vectorizes
        const char *b = (const char *)p + 2 * off;
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, b + 2 * i, 2);
            uint32_t u = (uint32_t)h << 16;
            memcpy(dst + i, &u, 4);
        }
        return;
    }
    for (int64_t i = 0; i < n; i++)
        dst[i] = td_load_f32(p, t, off + i);
}

#ifdef __cplusplus
}
#endif
#endif
