/* fill.cu: deterministic pseudo-random tensors on the GPU (see fill.h): the same bits as
 * fill_uniform_ref, so the tens of GB of a dummy model never pass through the host. */
#include "cuda_common.cuh"
#include "fill.h"
#include "quant.h"

__global__ void fill_uniform_kernel(void *dst, int bf16, long long n, uint64_t seed, float lo,
                                    float hi) {
    PDL_START();
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = fill_value(seed, (uint64_t)i, lo, hi);
    if (bf16)
        ((__nv_bfloat16 *)dst)[i] = __float2bfloat16_rn(v);
    else
        ((float *)dst)[i] = v;
}

extern "C" void fill_uniform_cuda(void *dst, enum td_dtype t, int64_t n, uint64_t seed, float lo,
                                  float hi) {
    if (n <= 0) return;
    launch_k(fill_uniform_kernel, ceil_div((long long)n, 256), 256, 0, td_cuda_stream(), dst,
             t == TD_DTYPE_BF16, (long long)n, seed, lo, hi);
    LAUNCH_CHECK();
}

__global__ void fill_quant_kernel(uint8_t *dst, int t, long long codes, long long all,
                                  uint64_t seed, uint8_t scale) {
    PDL_START();
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < codes)
        dst[i] = fill_quant_code((enum td_dtype)t, seed, (uint64_t)i);
    else if (i < all)
        dst[i] = scale;
}

extern "C" void fill_quant_cuda(void *dst, enum td_dtype t, int64_t rows, int64_t in, uint64_t seed,
                                uint8_t scale) {
    long long codes = (long long)td_quant_code_bytes(t, rows, in);
    long long all = (long long)td_quant_bytes(t, rows, in);
    if (all <= 0) return;
    launch_k(fill_quant_kernel, ceil_div(all, 256), 256, 0, td_cuda_stream(), (uint8_t *)dst, t,
             codes, all, seed, scale);
    LAUNCH_CHECK();
}
