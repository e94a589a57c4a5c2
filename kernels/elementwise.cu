/* elementwise.cu: embedding gather and pointwise ops on the GPU (see elementwise.h). */
#include "cuda_common.cuh"
#include "elementwise.h"

__global__ void embed_kernel(float *X, const int32_t *ids, const void *emb, int dt, int n, int nc,
                             int d) {
    PDL_START();
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x, total = (long long)n * nc * d;
    if (i >= total) return;
    int c = (int)(i % d), t = (int)(i / ((long long)nc * d));
    X[i] = ids[t] < 0 ? 0.0f : ld_f32(emb, dt, (long long)ids[t] * d + c);
}

__global__ void add_kernel(float *y, const float *x, size_t n) {
    PDL_START();
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] += x[i];
}

__global__ void scale_kernel(float *x, float s, size_t n) {
    PDL_START();
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

__global__ void swiglu_act_kernel(float *g, const float *u, size_t n, float limit) {
    PDL_START();
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    g[i] = swiglu_clamped(g[i], u[i], limit);
}

__global__ void add_bcast_kernel(float *X, const float *e, int n, int nc, int d,
                                 const int32_t *positions) {
    PDL_START();
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= (long long)n * nc * d) return;
    int c = (int)(i % d), t = (int)(i / ((long long)nc * d));
    if (positions && positions[t] == 0) return;
    X[i] += e[(size_t)t * d + c];
}

/* 16 bytes a thread when both ends allow, else byte by byte */
__global__ void copy_bytes_kernel(char *dst, const char *src, size_t bytes) {
    PDL_START();
    bool vec = !(((uintptr_t)dst | (uintptr_t)src) & 15);
    size_t step = (size_t)gridDim.x * blockDim.x * 16;
    for (size_t i = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) * 16; i < bytes; i += step) {
        if (vec && i + 16 <= bytes)
            *(uint4 *)(dst + i) = *(const uint4 *)(src + i);
        else
            for (size_t j = i; j < i + 16 && j < bytes; j++)
                dst[j] = src[j];
    }
}

extern "C" void copy_bytes_cuda(void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    long long blocks = ceil_div((long long)((bytes + 15) / 16), 256);
    launch_k(copy_bytes_kernel, (int)(blocks < 1024 ? blocks : 1024), 256, 0, td_cuda_stream(),
             (char *)dst, (const char *)src, bytes);
    LAUNCH_CHECK();
}

/* block i: patch i, a thread an id */
__global__ void patch_ids_kernel(int32_t *ids, const struct id_patches p) {
    PDL_START();
    int i = blockIdx.x;
    for (int j = threadIdx.x; j < p.len[i]; j += blockDim.x)
        ids[p.row[i] + j] = p.src[i][j];
}

extern "C" void patch_ids_cuda(int32_t *ids, const struct id_patches *p) {
    if (p->n <= 0) return;
    launch_k(patch_ids_kernel, p->n, 32, 0, td_cuda_stream(), ids, *p);
    LAUNCH_CHECK();
}

extern "C" void add_bcast_cuda(float *X, const float *e, int n, int nc, int d,
                               const int32_t *positions) {
    long long total = (long long)n * nc * d;
    if (!total) return;
    launch_k(add_bcast_kernel, ceil_div(total, 256), 256, 0, td_cuda_stream(), X, e, n, nc, d,
             positions);
    LAUNCH_CHECK();
}

extern "C" void embed_cuda(float *X, const int32_t *ids, const void *emb, enum td_dtype t, int n,
                           int nc, int d) {
    long long total = (long long)n * nc * d;
    if (!total) return;
    launch_k(embed_kernel, ceil_div(total, 256), 256, 0, td_cuda_stream(), X, ids, emb, t, n, nc,
             d);
    LAUNCH_CHECK();
}

extern "C" void add_cuda(float *y, const float *x, size_t n) {
    if (!n) return;
    launch_k(add_kernel, ceil_div(n, 256), 256, 0, td_cuda_stream(), y, x, n);
    LAUNCH_CHECK();
}

extern "C" void scale_cuda(float *x, float s, size_t n) {
    if (!n) return;
    launch_k(scale_kernel, ceil_div(n, 256), 256, 0, td_cuda_stream(), x, s, n);
    LAUNCH_CHECK();
}

extern "C" void swiglu_act_cuda(float *g, const float *u, size_t n, float limit) {
    if (!n) return;
    launch_k(swiglu_act_kernel, ceil_div(n, 256), 256, 0, td_cuda_stream(), g, u, n, limit);
    LAUNCH_CHECK();
}
