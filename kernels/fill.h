/* fill.h: deterministic pseudo-random tensors (the weights of --dummy-weights models).
 *
 *   x[i] = lo + (hi - lo) * u(seed, i),   u in [0, 1): the top 24 bits of splitmix64(seed, i)
 *
 * stored as F32 or BF16 (round to nearest even). Every backend writes the same bits, so a
 * dummy model is the same model on the CPU and the GPU; lo == hi gives a constant. */
#ifndef TD_KERNELS_FILL_H
#define TD_KERNELS_FILL_H

#include <stdint.h>

#include "dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __CUDACC__
#define TD_FILL_HD __host__ __device__
#else
#define TD_FILL_HD
#endif

static inline TD_FILL_HD float fill_u01(uint64_t seed, uint64_t i) {
    uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f);
}

/* lo + (hi - lo) * u with one rounding per operation on every compiler (no fused multiply-add) */
static inline TD_FILL_HD float fill_value(uint64_t seed, uint64_t i, float lo, float hi) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(lo, __fmul_rn(hi - lo, fill_u01(seed, i)));
#else
    volatile float p = (hi - lo) * fill_u01(seed, i);
    return lo + p;
#endif
}

/* dst[n] of dtype t (F32 or BF16) */
void fill_uniform_ref(void *dst, enum td_dtype t, int64_t n, uint64_t seed, float lo, float hi);

/* A packed Q8 or Q4 matrix [rows, in] (quant.h) of random codes and one scale byte: byte i of
 * the codes is the low 8 bits of splitmix64(seed, i), for Q8 with bit 6 cleared
 * (exponents up to 7: magnitudes below 2, never NaN), and every scale byte
 * is `scale`. fill_quant_scale gives the byte that makes the weights' root mean square about
 * `rms` (1/sqrt(fan-in) for a dummy model's matrices). */
void fill_quant_ref(void *dst, enum td_dtype t, int64_t rows, int64_t in, uint64_t seed,
                    uint8_t scale);
uint8_t fill_quant_scale(enum td_dtype t, float rms);

static inline TD_FILL_HD uint8_t fill_quant_code(enum td_dtype t, uint64_t seed, uint64_t i) {
    uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    uint8_t b = (uint8_t)z;
    return t == TD_DTYPE_Q8 ? (uint8_t)(b & 0xBF) : b; // Q8: sign and 6 bits (E <= 7)
}

/* CUDA launchers (kernels/fill.cu): the same contracts on a device pointer, queued on the
 * backend's stream. Defined only in builds with nvcc. */
void fill_uniform_cuda(void *dst, enum td_dtype t, int64_t n, uint64_t seed, float lo, float hi);
void fill_quant_cuda(void *dst, enum td_dtype t, int64_t rows, int64_t in, uint64_t seed,
                     uint8_t scale);

#ifdef __cplusplus
}
#endif
#endif
