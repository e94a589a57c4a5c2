/* tensor.c: dtype names and bulk reads of tensor views.
 *
 * Nothing here allocates; see tensor.h for the td_tensor view itself.
 */
#include "tensor.h"

const char *td_dtype_name(enum td_dtype t) {
    switch (t) {
    case TD_DTYPE_F32: return "F32";
    case TD_DTYPE_BF16: return "BF16";
    case TD_DTYPE_F16: return "F16";
    case TD_DTYPE_I32: return "I32";
    case TD_DTYPE_I64: return "I64";
    case TD_DTYPE_F8_E4M3: return "F8_E4M3";
    case TD_DTYPE_F8_E8M0: return "F8_E8M0";
    case TD_DTYPE_I8: return "I8";
    case TD_DTYPE_F4_E2M1: return "FP4 (I8 pairs)";
    case TD_DTYPE_Q8: return "Q8 (FP8 + 128x128 scales)";
    case TD_DTYPE_Q4: return "Q4 (FP4 + 1x32 scales)";
    default: return "NONE";
    }
}

void td_tensor_read_f32(const struct td_tensor *t, int64_t off, int64_t n, float *dst) {
    for (int64_t i = 0; i < n; i++) {
        switch (t->data ? t->dtype : TD_DTYPE_NONE) {
        case TD_DTYPE_F32:
        case TD_DTYPE_BF16:
        case TD_DTYPE_F16: dst[i] = td_tensor_getf(t, off + i); break;
        case TD_DTYPE_I32:
        case TD_DTYPE_I64: dst[i] = (float)td_tensor_geti(t, off + i); break;
        default: dst[i] = 0.0f; break;
        }
    }
}
