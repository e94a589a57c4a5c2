/* hc.cu: mHC pre (mixes, Sinkhorn, collapse), post (expand) and head on the GPU (see hc.h).
 * One block per token for pre/head; the tiny Sinkhorn runs one thread per entry, in fp32. */
#include "cuda_common.cuh"
#include "hc.h"

#define HC_MAX_MIX 288 /* (2 + 16) * 16 */

/* mix[m] = fn[m, :] . (x / rms(x)), x the token's nc * d streams; mix in shared memory. The
 * whole block works on HC_TILE outputs at once: each thread takes columns i, i + blockDim, ...
 * and loads x[i] and the HC_TILE weights of column i together, so a column's loads are in
 * flight at the same time (per-warp dot products, one output after another, waited out a
 * memory latency per step: hc_pre took 65 us per call at batch 1, then 32, then 17; 40% of a
 * decode step's GPU time on tandem-tiny at first). Then the tile's sums: a butterfly in each
 * warp, the warps' partials added in warp order; the same order for every batch. */
#define HC_TILE 24
template <typename T>
__device__ void hc_mixes_t(float *mix, const float *xt, const T *fn, int m, int width,
                           float rms_eps) {
    __shared__ float part[HC_TILE][32];
    __shared__ float ssp[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float ss = 0.0f;
    for (int o0 = 0; o0 < m; o0 += HC_TILE) {
        float acc[HC_TILE];
#pragma unroll
        for (int t = 0; t < HC_TILE; t++)
            acc[t] = 0.0f;
#pragma unroll 2
        for (int i = threadIdx.x; i < width; i += blockDim.x) {
            float xv = xt[i], wv[HC_TILE];
#pragma unroll
            for (int t = 0; t < HC_TILE; t++)
                wv[t] = o0 + t < m ? as_f32(fn[(size_t)(o0 + t) * width + i]) : 0.0f;
            if (o0 == 0) ss += xv * xv;
#pragma unroll
            for (int t = 0; t < HC_TILE; t++)
                acc[t] += xv * wv[t];
        }
#pragma unroll
        for (int t = 0; t < HC_TILE; t++) {
            float v = warp_sum(acc[t]);
            if (!lane) part[t][warp] = v;
        }
        if (o0 == 0) {
            ss = warp_sum(ss);
            if (!lane) ssp[warp] = ss;
        }
        __syncthreads();
        int t = threadIdx.x;
        if (t < HC_TILE && o0 + t < m) {
            float v = 0.0f;
            for (int w = 0; w < nw; w++)
                v += part[t][w];
            mix[o0 + t] = v;
        }
        __syncthreads();
    }
    float s = 0.0f;
    for (int w = 0; w < nw; w++)
        s += ssp[w];
    float r = rsqrtf(s / width + rms_eps);
    for (int o = threadIdx.x; o < m; o += blockDim.x)
        mix[o] *= r;
    __syncthreads();
}

__device__ void hc_mixes(float *mix, const float *xt, const void *fn, int fn_dt, int m, int width,
                         float rms_eps) {
    if (fn_dt == TD_DTYPE_BF16)
        hc_mixes_t(mix, xt, (const __nv_bfloat16 *)fn, m, width, rms_eps);
    else if (fn_dt == TD_DTYPE_F16)
        hc_mixes_t(mix, xt, (const __half *)fn, m, width, rms_eps);
    else
        hc_mixes_t(mix, xt, (const float *)fn, m, width, rms_eps);
}

__device__ __forceinline__ float sigm(float z) {
    return 1.0f / (1.0f + expf(-z));
}

/* The Sinkhorn's nc x nc comb matrix, one entry per thread. When it fits in a warp (every
 * real configuration: nc = 4) warp 0 holds it in registers and a row's or column's sum is read
 * through shuffles; otherwise the block keeps it in shared memory (cs). Either way every sum
 * runs over the same entries in the same order as the reference's loops, so the values are
 * unchanged from a single-thread Sinkhorn, which took 65 us per call (20 iterations of
 * dependent global-memory round trips); in shared memory with a barrier per phase it still took
 * most of hc_pre's 17 to 22 us. */
__device__ __forceinline__ float comb_set(bool small, float v, float *cs, int e, bool own) {
    if (!small) {
        __syncthreads();
        if (own) cs[e] = v;
        __syncthreads();
    }
    return v;
}

/* the entries base + k * stride, k = 0 .. nc - 1, in k order; fresh: the value to read is
 * this phase's v (in shared memory only after comb_set) */
__device__ __forceinline__ float comb_sum(bool small, float v, float *cs, int base, int stride,
                                          int nc, bool fresh) {
    float s = 0.0f;
    if (!small && fresh) { // the block path reads shared memory: publish v first
        __syncthreads();
        cs[threadIdx.x < 256 ? threadIdx.x : 0] = v;
        __syncthreads();
    }
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
        float ex = expf(v - mx);
        v = comb_set(small, ex / comb_sum(small, ex, cs, i * nc, 1, nc, true) + hc_eps, cs, e, own);
        for (int it = 0; it < iters; it++) { // column first, then (row, column) pairs
            if (it > 0)
                v = comb_set(small, v / (comb_sum(small, v, cs, i * nc, 1, nc, false) + hc_eps), cs,
                             e, own);
            v = comb_set(small, v / (comb_sum(small, v, cs, j, nc, nc, false) + hc_eps), cs, e,
                         own);
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
