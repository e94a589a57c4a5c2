/* tensor.h: the read-only tensor view every module shares.
 *
 * A td_tensor points into a memory-mapped safetensors file (or any buffer the
 * caller owns); it never owns memory. Shapes are outermost dimension first.
 * Dtypes and scalar conversions live in kernels/dtype.h (td_f16_to_f32 is an
 * inline there).
 */
#ifndef TD_TENSOR_H
#define TD_TENSOR_H

#include "kernels/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TD_MAX_DIMS 4

struct td_tensor {
    const void *data; /* NULL when absent */
    enum td_dtype dtype;
    const void *scale; /* F8_E4M3 and F4_E2M1 weights: their F8_E8M0 scales (quant.h), else NULL */
    int ndim;
    int64_t shape[TD_MAX_DIMS]; /* outermost first */
};

const char *td_dtype_name(enum td_dtype t);

/* a * b of non-negative sizes, saturating at INT64_MAX instead of overflowing (a caller that
 * can meet such a size refuses it: see TD_MAX_NUMEL) */
static inline int64_t td_mul_sat(int64_t a, int64_t b) {
    return b && a > INT64_MAX / b ? INT64_MAX : a * b;
}

/* a tensor of more elements has bytes past 64 bits in some dtype: loaders refuse it */
#define TD_MAX_NUMEL (INT64_MAX / 8)

/* elements of t (shapes are non-negative), saturating at INT64_MAX */
static inline int64_t td_tensor_numel(const struct td_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n = td_mul_sat(n, t->shape[i]);
    return n;
}

/* element i of a float tensor (F32, BF16 or F16) as fp32 */
static inline float td_tensor_getf(const struct td_tensor *t, int64_t i) {
    return td_load_f32(t->data, t->dtype, i);
}

/* element i of an integer tensor (I32 or I64) */
static inline int64_t td_tensor_geti(const struct td_tensor *t, int64_t i) {
    const char *b = (const char *)t->data; // possibly unaligned: see td_load_f32
    if (t->dtype == TD_DTYPE_I64) {
        int64_t v;
        memcpy(&v, b + 8 * i, 8);
        return v;
    }
    int32_t v;
    memcpy(&v, b + 4 * i, 4);
    return v;
}

/* fill dst[0..n) with elements [off, off+n) of t as fp32 */
void td_tensor_read_f32(const struct td_tensor *t, int64_t off, int64_t n, float *dst);

#ifdef __cplusplus
}
#endif
#endif
