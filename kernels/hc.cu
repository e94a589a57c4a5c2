/* hc.cu: mHC pre (mixes, Sinkhorn, collapse), post (expand) and head on the GPU (see hc.h).
 * One block per token for pre/head; the tiny Sinkhorn runs one thread per entry, in fp32. */
#include "cuda_common.cuh"
#include "hc.h"

#define HC_MAX_MIX 288 /* (2 + 16) * 16 */

/* a lane's share of (x / rms) . w over width, in index order. The loads of HC_BATCH steps are
 * made into registers before any is used, so they are in flight together: a loop that loads
 * and adds one element at a time waited out a full memory latency per element. Measured per
 * hc_pre call at batch 1 on tandem-tiny (Nsight Compute): 65 us with a dtype switch per
 * element, 32 with the dtype fixed per row, 17 with batched loads; a form where the whole
 * block shared each output tile (every thread a column of all 24 outputs, then a reduction per
 * output) measured 22 and was taken back. */
#define HC_BATCH 16
template <typename T>
__device__ __forceinline__ float mix_dot(const float *xt, const T *w, int width, float r,
                                         int lane) {
    float acc = 0.0f;
    for (int i0 = lane; i0 < width; i0 += 32 * HC_BATCH) {
        float xv[HC_BATCH], wv[HC_BATCH];
#pragma unroll
        for (int u = 0; u < HC_BATCH; u++) {
            int i = i0 + 32 * u;
            xv[u] = i < width ? xt[i] : 0.0f;
            wv[u] = i < width ? as_f32(w[i]) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < HC_BATCH; u++)
            if (i0 + 32 * u < width) acc += (xv[u] * r) * wv[u];
    }
    return acc;
}

/* mix[m] = fn[m, :] . (x / rms(x)), x the token's nc * d streams; mix in shared memory */
__device__ void hc_mixes(float *mix, const float *xt, const void *fn, int fn_dt, int m, int width,
                         float rms_eps) {
    float ss = 0.0f;
    for (int i0 = threadIdx.x; i0 < width; i0 += blockDim.x * HC_BATCH) {
        float xv[HC_BATCH];
#pragma unroll
        for (int u = 0; u < HC_BATCH; u++) {
            int i = i0 + blockDim.x * u;
            xv[u] = i < width ? xt[i] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < HC_BATCH; u++)
            ss += xv[u] * xv[u];
    }
    ss = block_sum(ss);
    float r = rsqrtf(ss / width + rms_eps);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = warp; o < m; o += nw) {
        size_t off = (size_t)o * width;
        float acc = 0.0f;
        if (fn_dt == TD_DTYPE_F32)
            acc = mix_dot(xt, (const float *)fn + off, width, r, lane);
        else if (fn_dt == TD_DTYPE_BF16)
            acc = mix_dot(xt, (const __nv_bfloat16 *)fn + off, width, r, lane);
        else if (fn_dt == TD_DTYPE_F16)
            acc = mix_dot(xt, (const __half *)fn + off, width, r, lane);
        acc = warp_sum(acc);
        if (lane == 0) mix[o] = acc;
    }
    __syncthreads();
}

__device__ __forceinline__ float sigm(float z) {
    return 1.0f / (1.0f + expf(-z));
}

/* The Sinkhorn's nc x nc comb matrix, one entry per thread. When it fits in a warp (every
 * real configuration: nc = 4) warp 0 holds it in registers and a row's or column's sum is read
 * through shuffles; otherwise the block keeps it in shared memory (cs). Either way every sum
 * runs over the same entries in the same order as the reference's loops. A single-thread
 * Sinkhorn in global memory was most of hc_pre's 65 us per call; with one thread per entry
 * (shared memory or registers alike) hc_pre measured 17 to 24 us, so what remains of its time
 * is not the Sinkhorn (next: time it with 0 iterations). */
__device__ __forceinline__ float comb_set(bool small, float v, float *cs, int e, bool own) {
    if (!small) {
        __syncthreads();
        if (own) cs[e] = v;
        __syncthreads();
    }
    return v;
}

/* the entries base + k * stride, k = 0 .. nc - 1, in k order (of the values last given to
 * comb_set) */
__device__ __forceinline__ float comb_sum(bool small, float v, const float *cs, int base,
                                          int stride, int nc) {
    float s = 0.0f;
    for (int k = 0; k < nc; k++)
        s += small ? __shfl_sync(0xffffffffu, v, base + k * stride) : cs[base + k * stride];
    return s;
}

__device__ __forceinline__ float comb_max(bool small, float v, const float *cs, int base,
                                          int stride, int nc) {
    float m = -INFINITY;
    for (int k = 0; k < nc; k++)
        m = fmaxf(m,
                  small ? __shfl_sync(0xffffffffu, v, base + k * stride) : cs[base + k * stride]);
    return m;
}

/* One block per token: the mixes (all warps), then the comb matrix with one thread per entry
 * (warp 0 when nc * nc <= 32) in shared memory. Each thread forms its row's or column's sum
 * over the same entries in the same order as the reference's loops, so the values are
 * unchanged from a single-thread Sinkhorn (which took 65 us per call: 20 iterations of
 * dependent global-memory round trips). */
__global__ void hc_pre_kernel(float *collapsed, float *post, float *comb, const float *x,
                              struct hc_weights w, int nc, int d, int iters, float hc_eps,
                              float rms_eps) {
    __shared__ float mix[HC_MAX_MIX];
    __shared__ float pre[16];
    __shared__ float cs[256];
    int t = blockIdx.x, m = (2 + nc) * nc, width = nc * d, nn = nc * nc;
    const float *xt = x + (size_t)t * width;
    hc_mixes(mix, xt, w.fn, w.fn_dtype, m, width, rms_eps);
    bool small = nn <= 32;
    int e = threadIdx.x;
    if (!small || e < 32) {
        float s_pre = ld_f32(w.scale, w.scale_dtype, 0), s_post = ld_f32(w.scale, w.scale_dtype, 1);
        float s_comb = ld_f32(w.scale, w.scale_dtype, 2);
        if (e < nc) {
            pre[e] = sigm(mix[e] * s_pre + ld_f32(w.base, w.base_dtype, e)) + hc_eps;
            post[(size_t)t * nc + e] =
                2.0f * sigm(mix[nc + e] * s_post + ld_f32(w.base, w.base_dtype, nc + e));
        }
        bool own = e < nn;
        int i = own ? e / nc : 0, j = own ? e % nc : 0; // other lanes only serve shuffles
        float v = comb_set(
            small, own ? mix[2 * nc + e] * s_comb + ld_f32(w.base, w.base_dtype, 2 * nc + e) : 0.0f,
            cs, e, own);
        float mx = comb_max(small, v, cs, i * nc, 1, nc); // row softmax + eps
        float ex = comb_set(small, expf(v - mx), cs, e, own);
        v = comb_set(small, ex / comb_sum(small, ex, cs, i * nc, 1, nc) + hc_eps, cs, e, own);
        for (int it = 0; it < iters; it++) { // column first, then (row, column) pairs
            if (it > 0)
                v = comb_set(small, v / (comb_sum(small, v, cs, i * nc, 1, nc) + hc_eps), cs, e,
                             own);
            v = comb_set(small, v / (comb_sum(small, v, cs, j, nc, nc) + hc_eps), cs, e, own);
        }
        if (own) comb[(size_t)t * nn + e] = v;
    }
    __syncthreads();
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float acc = 0.0f;
        for (int i = 0; i < nc; i++)
            acc += pre[i] * xt[(size_t)i * d + c];
        collapsed[(size_t)t * d + c] = acc;
    }
}

__global__ void hc_post_kernel(float *x, const float *a, const float *post, const float *comb,
                               int n, int nc, int d) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= (long long)n * d) return;
    int t = (int)(i / d), c = (int)(i % d);
    float old[16], *xt = x + (size_t)t * nc * d;
    const float *ct = comb + (size_t)t * nc * nc, *pt = post + (size_t)t * nc;
    for (int k = 0; k < nc; k++)
        old[k] = xt[(size_t)k * d + c];
    float at = a[(size_t)t * d + c];
    for (int j = 0; j < nc; j++) {
        float acc = 0.0f;
        for (int k = 0; k < nc; k++)
            acc += ct[k * nc + j] * old[k];
        xt[(size_t)j * d + c] = pt[j] * at + acc;
    }
}

__global__ void hc_head_kernel(float *y, const float *x, const void *fn, int fn_dt,
                               const void *base, int base_dt, const void *scale, int scale_dt,
                               int nc, int d, float hc_eps, float rms_eps) {
    __shared__ float mix[16];
    int t = blockIdx.x;
    const float *xt = x + (size_t)t * nc * d;
    hc_mixes(mix, xt, fn, fn_dt, nc, nc * d, rms_eps);
    float s = ld_f32(scale, scale_dt, 0);
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float acc = 0.0f;
        for (int i = 0; i < nc; i++)
            acc += (sigm(mix[i] * s + ld_f32(base, base_dt, i)) + hc_eps) * xt[(size_t)i * d + c];
        y[(size_t)t * d + c] = acc;
    }
}

extern "C" void hc_pre_cuda(float *collapsed, float *post, float *comb, const float *x,
                            const struct hc_weights *w, int n, int nc, int d, int sinkhorn_iters,
                            float hc_eps, float rms_eps) {
    if (!n) return;
    hc_pre_kernel<<<n, 256, 0, td_cuda_stream()>>>(collapsed, post, comb, x, *w, nc, d,
                                                   sinkhorn_iters, hc_eps, rms_eps);
    LAUNCH_CHECK();
}

extern "C" void hc_post_cuda(float *x, const float *a, const float *post, const float *comb, int n,
                             int nc, int d) {
    if (!n) return;
    hc_post_kernel<<<ceil_div((long long)n * d, 256), 256, 0, td_cuda_stream()>>>(x, a, post, comb,
                                                                                  n, nc, d);
    LAUNCH_CHECK();
}

extern "C" void hc_head_cuda(float *y, const float *x, const void *fn, enum td_dtype fn_dtype,
                             const void *base, enum td_dtype base_dtype, const void *scale,
                             enum td_dtype scale_dtype, int n, int nc, int d, float hc_eps,
                             float rms_eps) {
    if (!n) return;
    hc_head_kernel<<<n, 256, 0, td_cuda_stream()>>>(y, x, fn, fn_dtype, base, base_dtype, scale,
                                                    scale_dtype, nc, d, hc_eps, rms_eps);
    LAUNCH_CHECK();
}
