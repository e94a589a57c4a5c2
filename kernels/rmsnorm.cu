/* rmsnorm.cu: RMSNorm, one block per row, fp32 statistic (see rmsnorm.h). */
#include "cuda_common.cuh"
#include "rmsnorm.h"

__global__ void rmsnorm_kernel(float *y, const float *x, const void *w, int dt, int d, float eps) {
    prefetch_l2(w, (size_t)d * td_dtype_size((enum td_dtype)dt));
    PDL_START();
    const float *xr = x + (size_t)blockIdx.x * d;
    float *yr = y + (size_t)blockIdx.x * d;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x)
        ss += xr[i] * xr[i];
    ss = block_sum(ss);
    float r = rsqrtf(ss / d + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float v = xr[i] * r;
        yr[i] = w ? v * ld_f32(w, dt, i) : v;
    }
}

extern "C" void rmsnorm_cuda(float *y, const float *x, const void *w, enum td_dtype t, int n, int d,
                             float eps) {
    if (!n) return;
    int threads = d >= 1024 ? 1024 : (d + 31) / 32 * 32;
    launch_k(rmsnorm_kernel, n, threads, 0, td_cuda_stream(), y, x, w, t, d, eps);
    LAUNCH_CHECK();
}
