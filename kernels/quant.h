/* quant.h: DeepSeek's released weight formats, decoded exactly to fp32
 * (released_formats.md 1.5-1.7).
 *
 *   FP8 dense    F8_E4M3 weight [out, in], F8_E8M0 scale [ceil(out/128), ceil(in/128)]:
 *                W[o][i] = e4m3(q[o][i]) * 2^(s[o/128][i/128] - 127)
 *   FP4 experts  I8 weight [out, in/2], two e2m1 codes a byte (element 2j in the low nibble of
 *                byte j, 2j+1 in the high one), F8_E8M0 scale [out, in/32]:
 *                W[o][k] = e2m1(nibble(o, k)) * 2^(s[o][k/32] - 127)
 * e4m3 is OCP e4m3fn: bias 7, no infinities, 0x7F/0xFF NaN, largest finite 448, subnormals to
 * 2^-9. An e8m0 byte b is 2^(b - 127): byte 0 the fp32 denormal 2^-127, byte 255 NaN (a loader
 * refuses a tensor that holds one: td_e8m0_find_nan). Every product is exact in fp32 (a code
 * has at most 4 significant bits and the scale is a power of two), except that products below
 * fp32's smallest denormal round as fp32 does.
 *
 * On a device the GEMM ops read a matrix [rows, in] of either kind as one buffer, the codes and
 * then the scales (TD_DTYPE_Q8, TD_DTYPE_Q4): a weight pointer and its dtype say everything, as
 * for BF16, and every op keeps its signature. A kernel dequantizes 8 weights at a time in
 * registers to exact bf16 values (a code times a power of two has at most 4 significant bits),
 * so the tensor-core paths compute with the very values the fp32 reference decodes, for scales
 * from 2^-100 to 2^100 (outside that a product can leave bf16's normal range).
 */
#ifndef TD_KERNELS_QUANT_H
#define TD_KERNELS_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

float td_e8m0_to_f32(uint8_t b);
float td_e4m3_to_f32(uint8_t q);
float td_e2m1_to_f32(uint8_t code); /* the low 4 bits */

/* the e4m3 code nearest v (ties to the even code), saturating at +-448 (the largest finite);
 * NaN: 0x7F */
uint8_t td_f32_to_e4m3(float v);

/* The reference's act_quant (released_formats.md 2.3) on x [n, in], in % 128 == 0: each row's
 * 128 columns as e4m3 codes times a power-of-two scale s = 2^ceil(log2(amax / 448)), amax (the
 * largest |x| of the 128) floored at 1e-4; xq gets their values, code x s (what an FP8 GEMM on
 * the reference's path multiplies) */
void act_quant_ref(float *xq, const float *x, int n, int in);

/* the index of the first NaN scale byte (255) in s[0..n), or -1 */
long td_e8m0_find_nan(const uint8_t *s, size_t n);

/* w[out, in] from an FP8 weight q[out, in] and its scale [ceil(out/128), ceil(in/128)] */
void dequant_fp8_ref(float *w, const uint8_t *q, const uint8_t *scale, int out, int in);

/* w[out, in] from an FP4 weight packed [out, in/2] and its scale [out, in/32]; in % 32 == 0 */
void dequant_fp4_ref(float *w, const uint8_t *packed, const uint8_t *scale, int out, int in);

/* bytes of a packed Q8 or Q4 matrix [rows, in] (codes and scales), 0 for other dtypes */
static inline TD_HOST_DEVICE size_t td_quant_bytes(enum td_dtype t, int64_t rows, int64_t in) {
    if (t == TD_DTYPE_Q8) return (size_t)(rows * in + (rows + 127) / 128 * ((in + 127) / 128));
    if (t == TD_DTYPE_Q4) return (size_t)(rows * in / 2 + rows * (in / 32));
    return 0;
}

/* bytes of the codes of a packed matrix: its scales start there */
static inline TD_HOST_DEVICE size_t td_quant_code_bytes(enum td_dtype t, int64_t rows, int64_t in) {
    return (size_t)(t == TD_DTYPE_Q4 ? rows * in / 2 : rows * in);
}

/* w[rows, in] from a packed Q8 or Q4 matrix (the decode of its codes and scales) */
void dequant_packed_ref(float *w, const void *packed, enum td_dtype t, int rows, int in);

#ifdef __cplusplus
}
#endif
#endif
