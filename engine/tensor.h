/* tensor.h: dtypes and the read-only tensor view every module shares.
 *
 * A td_tensor points into a memory-mapped safetensors file (or any buffer the
 * caller owns); it never owns memory. Shapes are outermost dimension first.
 */
#ifndef TD_TENSOR_H
#define TD_TENSOR_H

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
};

#define TD_MAX_DIMS 4

struct td_tensor {
    const void *data;           /* NULL when absent */
    enum td_dtype dtype;
    int ndim;
    int64_t shape[TD_MAX_DIMS]; /* outermost first */
};

/* bytes per element, 0 for TD_DTYPE_NONE */
static inline size_t td_dtype_size(enum td_dtype t) {
    switch (t) {
    case TD_DTYPE_F32: case TD_DTYPE_I32: return 4;
    case TD_DTYPE_BF16: case TD_DTYPE_F16: return 2;
    case TD_DTYPE_I64: return 8;
    default: return 0;
    }
}

const char *td_dtype_name(enum td_dtype t);

static inline int64_t td_tensor_numel(const struct td_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

static inline float td_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float td_f16_to_f32(uint16_t h);

/* element i of a float tensor (F32, BF16 or F16) as fp32 */
static inline float td_tensor_getf(const struct td_tensor *t, int64_t i) {
    switch (t->dtype) {
    case TD_DTYPE_F32: return ((const float *)t->data)[i];
    case TD_DTYPE_BF16: return td_bf16_to_f32(((const uint16_t *)t->data)[i]);
    case TD_DTYPE_F16: return td_f16_to_f32(((const uint16_t *)t->data)[i]);
    default: return 0.0f;
    }
}

/* element i of an integer tensor (I32 or I64) */
static inline int64_t td_tensor_geti(const struct td_tensor *t, int64_t i) {
    return t->dtype == TD_DTYPE_I64 ? ((const int64_t *)t->data)[i]
                                    : (int64_t)((const int32_t *)t->data)[i];
}

/* fill dst[0..n) with elements [off, off+n) of t as fp32 */
void td_tensor_read_f32(const struct td_tensor *t, int64_t off, int64_t n, float *dst);

#ifdef __cplusplus
}
#endif
#endif
