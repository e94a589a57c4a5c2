/* hc.cu: mHC pre (mixes, Sinkhorn, collapse), post (expand) and head on the GPU (see hc.h).
 * One block per token for pre/head, after the mixes of wide tokens in tiles of tokens by
 * column chunks on tensor cores; the Sinkhorn in warp 0's registers (nc <= 4) or the block's
 * shared memory, all fp32. The weights are asked into L2 before each kernel waits for the one
 * before it. */
#include <type_traits>

#include "cuda_common.cuh"
#include "gemm_tile.cuh"
#include "hc.h"

/* The GPU forms the mixes of a wide token (nc * d > HC_SPLIT_MIN) in column chunks of
 * HC_CHUNK, one block each, and sums the chunks' parts in chunk order: a batch-1 step of the
 * Flash slice (width 16384) read 1.5 MB of fn through one block per token (73 us per call).
 * The split depends on the width alone, so a token's mixes do not depend on its batch. */
#define HC_CHUNK     512
#define HC_SPLIT_MIN 4096
static int hc_mix_splits(int width) {
    return width > HC_SPLIT_MIN ? (width + HC_CHUNK - 1) / HC_CHUNK : 1;
}
/* floats of scratch the parts of n tokens need (0 when the width is not split) */
static size_t hc_mix_parts(int n, int nc, int d) {
    int s = hc_mix_splits(nc * d);
    return s > 1 ? (size_t)n * s * ((2 + nc) * nc + 1) : 0;
}

#define HC_MAX_MIX 288 /* (2 + 16) * 16 */

#define HC_BATCH 16
/* threads per block, at most: 1024 for wide tokens (one warp per output over a chunk), 256
 * otherwise. Measured per call, graph-replayed, nc = 4: d = 4096, hc_pre 11.4 us with 1024,
 * 14.2 with 256, hc_head 9.7 and 19.9; d = 256, hc_pre 9.4 and 9.1, hc_head 4.4 and 3.0 */
#define HC_THREADS 1024
static int hc_threads(int width) {
    return width > HC_SPLIT_MIN ? HC_THREADS : 256;
}

/* a lane's share of x . w over columns [c0, c1), in index order. The loads of HC_BATCH steps
 * are made into registers before any is used, so they are in flight together: a loop that
 * loads and adds one element at a time waited out a full memory latency per element. Measured
 * per hc_pre call at batch 1 on tandem-tiny (Nsight Compute): 65 us with a dtype switch per
 * element, 32 with the dtype fixed per row, 17 with batched loads; a form where the whole
 * block shared each output tile measured 22 and was taken back. */
template <typename T>
__device__ __forceinline__ float mix_dot(const float *xt, const T *w, int c0, int c1, int lane) {
    float acc = 0.0f;
    for (int i0 = c0 + lane; i0 < c1; i0 += 32 * HC_BATCH) {
        float xv[HC_BATCH], wv[HC_BATCH];
#pragma unroll
        for (int u = 0; u < HC_BATCH; u++) {
            int i = i0 + 32 * u;
            xv[u] = i < c1 ? xt[i] : 0.0f;
            wv[u] = i < c1 ? as_f32(w[i]) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < HC_BATCH; u++)
            if (i0 + 32 * u < c1) acc += xv[u] * wv[u];
    }
    return acc;
}

/* the block's part of the mixes over columns [c0, c1): mix[o] = fn[o, c0:c1] . x[c0:c1] for
 * o < m and mix[m] = x[c0:c1] . x[c0:c1], in shared memory, one warp per output */
__device__ void mix_part(float *mix, const float *xt, const void *fn, int fn_dt, int m, int width,
                         int c0, int c1) {
    float ss = 0.0f;
    for (int i0 = c0 + threadIdx.x; i0 < c1; i0 += blockDim.x * HC_BATCH) {
        float xv[HC_BATCH];
#pragma unroll
        for (int u = 0; u < HC_BATCH; u++) {
            int i = i0 + blockDim.x * u;
            xv[u] = i < c1 ? xt[i] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < HC_BATCH; u++)
            ss += xv[u] * xv[u];
    }
    ss = block_sum(ss);
    if (threadIdx.x == 0) mix[m] = ss;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = warp; o < m; o += nw) {
        size_t off = (size_t)o * width;
        float acc = 0.0f;
        if (fn_dt == TD_DTYPE_F32)
            acc = mix_dot(xt, (const float *)fn + off, c0, c1, lane);
        else if (fn_dt == TD_DTYPE_BF16)
            acc = mix_dot(xt, (const __nv_bfloat16 *)fn + off, c0, c1, lane);
        else if (fn_dt == TD_DTYPE_F16)
            acc = mix_dot(xt, (const __half *)fn + off, c0, c1, lane);
        acc = warp_sum(acc);
        if (lane == 0) mix[o] = acc;
    }
    __syncthreads();
}

/* The mixes on the fp32 pipes (hc_mix_f32_kernel), for narrow steps and batch-invariant mode:
 * a warp an output over the chunk, every load of a lane in flight at once (a decode step's
 * floor: the tensor-core form below, whose stages wait in turn, took the Flash slice's batch-1
 * decode from 606.9 to 550.7 tokens/s, H100, session 34). Steps of at least HC_MIX_WIDE
 * tokens give a block HC_MIX_PER tokens, one after another, so the chunk of fn it reads comes
 * from L1 after the first; each token's sums are the same sums in the same order either way:
 * the same bits at any width. */
#define HC_MIX_WIDE 256 /* (TD_HC_MIX_WIDE=N: the tensor-core form from N tokens, measuring) */
#define HC_MIX_PER  16
static int hc_mix_wide(void) {
    static int w = -1;
    if (w < 0)
        w = getenv("TD_HC_MIX_WIDE") && atoi(getenv("TD_HC_MIX_WIDE")) > 0
                ? atoi(getenv("TD_HC_MIX_WIDE"))
                : HC_MIX_WIDE;
    return w;
}
static int hc_mix_per(int n) {
    return n >= HC_MIX_WIDE ? HC_MIX_PER : 1;
}

/* grid (splits, ceil(n / per)): chunk b of tokens per y .. per y + per - 1's parts into
 * part[t, b, 0 .. m] */
__global__ void __launch_bounds__(HC_THREADS)
    hc_mix_f32_kernel(float *part, const float *x, const void *fn, int fn_dt, int m, int width,
                      int splits, int n, int per) {
    __shared__ float mix[HC_MAX_MIX + 1];
    int b = blockIdx.x, c0 = b * HC_CHUNK;
    int c1 = c0 + HC_CHUNK < width ? c0 + HC_CHUNK : width;
    prefetch_l2_cols(fn, td_dtype_size((enum td_dtype)fn_dt), m, width, c0, c1);
    PDL_START();
    for (int t = blockIdx.y * per; t < n && t < (int)(blockIdx.y + 1) * per; t++) {
        mix_part(mix, x + (size_t)t * width, fn, fn_dt, m, width, c0, c1);
        float *p = part + ((size_t)t * splits + b) * (m + 1);
        for (int o = threadIdx.x; o <= m; o += blockDim.x)
            p[o] = mix[o];
        __syncthreads(); // (mix is the next token's)
    }
}

/* The mixes of wide tokens on tensor cores (hc_mix_kernel): block (chunk b, tile y, group z)
 * makes, for tokens HC_TT y .. + HC_TT and outputs HC_TO z .. + HC_TO, the parts
 * fn[o, c0:c1] . x[c0:c1] over chunk b's columns (and, in group 0, x[c0:c1] . x[c0:c1]) as
 * mma.m16n8k16 tiles, HC_KS columns a stage, each operand as two bf16 terms (hi = bf16(v),
 * lo = bf16(v - hi)) and each product as hi.hi + lo.hi + hi.lo: about 16 bits of either
 * operand, fp32 sums. Warp w takes tokens 16 w .. + 16 and the group's 32 outputs (4 tiles of
 * 8); the loads split x (two threads a token, HC_KS / 2 columns each, summing its squares as
 * they go) and fn (four threads an output) into shared memory. Every sum of a token runs in an
 * order fixed by the width alone (k ascending in each mma chain; x . x as two threads' runs,
 * then their sum), so a token's parts are the same bits in any wide step, at any place in a
 * tile. Steps of HC_MIX_WIDE tokens or more take it outside batch-invariant mode: the fp32 form
 * took 2.5 ms a call of a 4096-token prefill of the Flash slice (22.5 ms of its 115; Nsight
 * Compute, H100, session 32). */
#define HC_TT          64 /* tokens a tile */
#define HC_TO          32 /* outputs a group */
#define HC_KS          64 /* columns a stage */
#define HC_LD          (HC_KS + 8)
#define HC_MIX_THREADS 128

/* v[0 .. 3] <- p[c .. c + 3] of a row whose columns end at c1 (zeros past it, or when dead) */
template <typename T>
__device__ __forceinline__ void hc_ld4(float *v, const T *p, int c, int c1, bool live) {
    if constexpr (std::is_same<T, float>::value) {
        if (live && c + 4 <= c1 && ((uintptr_t)(p + c) & 15) == 0) {
            float4 y = *(const float4 *)(p + c);
            v[0] = y.x, v[1] = y.y, v[2] = y.z, v[3] = y.w;
            return;
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
        v[i] = live && c + i < c1 ? as_f32(p[c + i]) : 0.0f;
}

/* 4 values as hi and lo bf16 pairs at dh and dl (8-byte aligned) */
__device__ __forceinline__ void hc_split4(__nv_bfloat16 *dh, __nv_bfloat16 *dl, const float *v) {
    float h[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
        h[i] = __bfloat162float(__float2bfloat16_rn(v[i]));
    *(uint2 *)dh = make_uint2(pack_bf16(h[0], h[1]), pack_bf16(h[2], h[3]));
    *(uint2 *)dl =
        make_uint2(pack_bf16(v[0] - h[0], v[1] - h[1]), pack_bf16(v[2] - h[2], v[3] - h[3]));
}

template <typename T>
__global__ void __launch_bounds__(HC_MIX_THREADS)
    hc_mix_kernel(float *part, const float *x, const T *fn, int m, int width, int splits, int n) {
    __shared__ __align__(16) __nv_bfloat16 xh[HC_TT][HC_LD], xl[HC_TT][HC_LD];
    __shared__ __align__(16) __nv_bfloat16 fh[HC_TO][HC_LD], fl[HC_TO][HC_LD];
    __shared__ float ssp[2][HC_TT];
    int b = blockIdx.x, t0 = blockIdx.y * HC_TT, o0 = blockIdx.z * HC_TO;
    int c0 = b * HC_CHUNK, c1 = c0 + HC_CHUNK < width ? c0 + HC_CHUNK : width;
    int n_out = m - o0 < HC_TO ? m - o0 : HC_TO;
    prefetch_l2_cols(fn + (size_t)o0 * width, sizeof(T), n_out, width, c0, c1);
    PDL_START();
    int tid = threadIdx.x, lane = tid & 31, wp = tid >> 5, g = lane >> 2, tq = lane & 3;
    int xr = tid >> 1, xc = (tid & 1) * (HC_KS / 2); // loader: token row, first column
    int fr = tid >> 2, fc = (tid & 3) * (HC_KS / 4); // loader: output row, first column
    bool xlive = t0 + xr < n, flive = fr < n_out, live = t0 + 16 * wp < n;
    const float *xrow = x + (size_t)(xlive ? t0 + xr : 0) * width;
    const T *frow = fn + (size_t)(o0 + (flive ? fr : 0)) * width;
    int ar = lane & 15, ak = (lane >> 4) * 8, br = (lane & 7) + (lane >> 4) * 8,
        bk = ((lane >> 3) & 1) * 8;
    float ss = 0.0f, acc[HC_TO / 8][4] = {};
    // a stage's x and fn in registers, the next one's loads in flight while this one multiplies
    float xv[HC_KS / 2], fv[HC_KS / 4];
    auto fetch = [&](int k0) {
#pragma unroll
        for (int j = 0; j < HC_KS / 2; j += 4)
            hc_ld4(&xv[j], xrow, k0 + xc + j, c1, xlive);
#pragma unroll
        for (int j = 0; j < HC_KS / 4; j += 4)
            hc_ld4(&fv[j], frow, k0 + fc + j, c1, flive);
    };
    fetch(c0);
    for (int k0 = c0; k0 < c1; k0 += HC_KS) {
#pragma unroll
        for (int j = 0; j < HC_KS / 2; j += 4) {
#pragma unroll
            for (int i = 0; i < 4; i++)
                ss += xv[j + i] * xv[j + i];
            hc_split4(&xh[xr][xc + j], &xl[xr][xc + j], &xv[j]);
        }
#pragma unroll
        for (int j = 0; j < HC_KS / 4; j += 4)
            hc_split4(&fh[fr][fc + j], &fl[fr][fc + j], &fv[j]);
        __syncthreads();
        if (k0 + HC_KS < c1) fetch(k0 + HC_KS);
        if (live) {
#pragma unroll
            for (int kk = 0; kk < HC_KS; kk += 16) {
                unsigned ah[4], al[4];
                ldmatrix4(ah, &xh[16 * wp + ar][kk + ak]);
                ldmatrix4(al, &xl[16 * wp + ar][kk + ak]);
#pragma unroll
                for (int jp = 0; jp < HC_TO / 16; jp++) {
                    unsigned bh[4], bl[4];
                    ldmatrix4(bh, &fh[16 * jp + br][kk + bk]);
                    ldmatrix4(bl, &fl[16 * jp + br][kk + bk]);
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        float *c = acc[2 * jp + h];
                        mma_bf16(c, ah[0], ah[1], ah[2], ah[3], bh[2 * h], bh[2 * h + 1]);
                        mma_bf16(c, al[0], al[1], al[2], al[3], bh[2 * h], bh[2 * h + 1]);
                        mma_bf16(c, ah[0], ah[1], ah[2], ah[3], bl[2 * h], bl[2 * h + 1]);
                    }
                }
            }
        }
        __syncthreads();
    }
    ssp[tid & 1][xr] = ss;
    __syncthreads();
#pragma unroll
    for (int j = 0; j < HC_TO / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int t = t0 + 16 * wp + g + 8 * (e >> 1), o = 8 * j + 2 * tq + (e & 1);
            if (t < n && o < n_out) part[((size_t)t * splits + b) * (m + 1) + o0 + o] = acc[j][e];
        }
    if (o0 == 0 && tid < HC_TT && t0 + tid < n)
        part[((size_t)(t0 + tid) * splits + b) * (m + 1) + m] = ssp[0][tid] + ssp[1][tid];
}

/* this block's token's mixes before the norm, fn[o, :] . x, into mix[0 .. m - 1], and x . x in
 * mix[m]: summed from the chunk parts when the width is split (a warp per output, its lanes
 * over the chunks, one fixed butterfly: one round of loads, where a thread per output walking
 * the chunks in batches of HC_BATCH made two), else made here over the whole width. Returns
 * 1 / rms(x), by which the callers scale each mix where they read it (mix * r, as the stored
 * product was): two barriers fewer than scaling them here. */
__device__ float hc_mixes(float *mix, const float *part, int splits, const float *xt,
                          const void *fn, int fn_dt, int m, int width, float rms_eps) {
    if (splits == 1) {
        mix_part(mix, xt, fn, fn_dt, m, width, 0, width);
    } else {
        const float *p = part + (size_t)blockIdx.x * splits * (m + 1);
        int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
        for (int o = threadIdx.x >> 5; o <= m; o += nw) {
            float acc = 0.0f;
            for (int b = lane; b < splits; b += 32)
                acc += p[(size_t)b * (m + 1) + o];
            acc = warp_sum(acc);
            if (lane == 0) mix[o] = acc;
        }
        __syncthreads();
    }
    return rsqrtf(mix[m] / width + rms_eps);
}

__device__ __forceinline__ float sigm(float z) {
    return 1.0f / (1.0f + expf(-z));
}

/* The Sinkhorn of an NC x NC comb matrix, NC <= 4 (every real configuration), in registers:
 * every lane of warp 0 holds the whole matrix, a row's or a column's sum is (e0 + e1) + (e2 + e3)
 * (the reference's pairs) of its own registers, and each pass takes one approximate reciprocal
 * per row or column, which the row's entries multiply by (as __fdividef(v, s) multiplies v by
 * an approximate 1 / s). Lane 0 writes it. hc_pre per call on the Flash slice (Nsight Compute):
 * one lane per entry with shuffled sums, 11 us; a division per entry in registers, 20 us (one
 * warp issuing 16 divisions a pass); graph-replayed (bench/hc_time), the shuffled form 10.1 us
 * and this one, beside the collapse, 8.35. */
__device__ __forceinline__ float rcp_approx(float s) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(s));
    return r;
}

template <int NC>
__device__ void sinkhorn_regs(float *out, const float *mix, float r, const struct hc_weights &w,
                              float s_comb, int iters, float eps) {
    float v[4][4] = {};
#pragma unroll
    for (int i = 0; i < NC; i++)
#pragma unroll
        for (int j = 0; j < NC; j++)
            v[i][j] = mix[2 * NC + i * NC + j] * r * s_comb +
                      ld_f32(w.base, w.base_dtype, 2 * NC + i * NC + j);
#pragma unroll
    for (int i = 0; i < NC; i++) {
        float mx = v[i][0];
#pragma unroll
        for (int j = 1; j < NC; j++)
            mx = fmaxf(mx, v[i][j]);
#pragma unroll
        for (int j = 0; j < NC; j++)
            v[i][j] = expf(v[i][j] - mx);
        float r = rcp_approx((v[i][0] + v[i][1]) + (v[i][2] + v[i][3]));
#pragma unroll
        for (int j = 0; j < NC; j++)
            v[i][j] = v[i][j] * r + eps;
    }
    for (int it = 0; it < iters; it++) { // column first, then (row, column) pairs
        if (it > 0)
#pragma unroll
            for (int i = 0; i < NC; i++) {
                float r = rcp_approx((v[i][0] + v[i][1]) + (v[i][2] + v[i][3]) + eps);
#pragma unroll
                for (int j = 0; j < NC; j++)
                    v[i][j] *= r;
            }
#pragma unroll
        for (int j = 0; j < NC; j++) {
            float r = rcp_approx((v[0][j] + v[1][j]) + (v[2][j] + v[3][j]) + eps);
#pragma unroll
            for (int i = 0; i < NC; i++)
                v[i][j] *= r;
        }
    }
    if ((threadIdx.x & 31) == 0)
#pragma unroll
        for (int i = 0; i < NC; i++)
#pragma unroll
            for (int j = 0; j < NC; j++)
                out[i * NC + j] = v[i][j];
}

__device__ void sinkhorn_warp(float *out, const float *mix, float r, const struct hc_weights &w,
                              float s_comb, int nc, int iters, float eps) {
    if (nc == 4)
        sinkhorn_regs<4>(out, mix, r, w, s_comb, iters, eps);
    else if (nc == 3)
        sinkhorn_regs<3>(out, mix, r, w, s_comb, iters, eps);
    else if (nc == 2)
        sinkhorn_regs<2>(out, mix, r, w, s_comb, iters, eps);
    else
        sinkhorn_regs<1>(out, mix, r, w, s_comb, iters, eps);
}

/* the same for larger nc: one thread per entry in shared memory cs, the block in step */
__device__ void sinkhorn_shared(float *out, float *cs, const float *mix, float r,
                                const struct hc_weights &w, float s_comb, int nc, int iters,
                                float eps) {
    int e = threadIdx.x, nn = nc * nc;
    bool own = e < nn;
    int i = own ? e / nc : 0, j = own ? e % nc : 0;
    float v = own ? mix[2 * nc + e] * r * s_comb + ld_f32(w.base, w.base_dtype, 2 * nc + e) : 0.0f;
    float s;
#define PUBLISH(val)                                                                               \
    do {                                                                                           \
        __syncthreads();                                                                           \
        if (own) cs[e] = (val);                                                                    \
        __syncthreads();                                                                           \
    } while (0)
    PUBLISH(v);
    s = -INFINITY;
    for (int k = 0; k < nc; k++)
        s = fmaxf(s, cs[i * nc + k]);
    v = expf(v - s);
    PUBLISH(v);
    s = 0.0f;
    for (int k = 0; k < nc; k++)
        s += cs[i * nc + k];
    v = v / s + eps;
    PUBLISH(v);
    for (int it = 0; it < iters; it++) {
        if (it > 0) {
            s = 0.0f;
            for (int k = 0; k < nc; k++)
                s += cs[i * nc + k];
            v /= s + eps;
            PUBLISH(v);
        }
        s = 0.0f;
        for (int k = 0; k < nc; k++)
            s += cs[k * nc + j];
        v /= s + eps;
        PUBLISH(v);
    }
#undef PUBLISH
    if (own) out[e] = v;
}

/* One block per token: the mixes (or their chunk sums), pre and post, then the Sinkhorn (warp 0
 * when nc <= 4, the block in shared memory otherwise) beside the collapse, which needs only
 * pre. HC_THREADS: one warp per mix output over the width (24 of them for nc = 4). */
__global__ void __launch_bounds__(HC_THREADS)
    hc_pre_kernel(float *collapsed, float *post, float *comb, const float *x, const float *part,
                  int splits, struct hc_weights w, int nc, int d, int iters, float hc_eps,
                  float rms_eps, const void *norm, int norm_dt) {
    __shared__ float mix[HC_MAX_MIX + 1];
    __shared__ float pre[16];
    __shared__ float cs[256];
    int t = blockIdx.x, m = (2 + nc) * nc, width = nc * d, e = threadIdx.x;
    prefetch_l2(w.base, (size_t)m * td_dtype_size((enum td_dtype)w.base_dtype));
    prefetch_l2(w.scale, 3 * td_dtype_size((enum td_dtype)w.scale_dtype));
    prefetch_l2(norm, (size_t)d * td_dtype_size((enum td_dtype)norm_dt));
    if (splits == 1)
        prefetch_l2(w.fn, (size_t)m * width * td_dtype_size((enum td_dtype)w.fn_dtype));
    PDL_START();
    const float *xt = x + (size_t)t * width;
    float rx = hc_mixes(mix, part, splits, xt, w.fn, w.fn_dtype, m, width, rms_eps);
    if (e < nc) {
        float s_pre = ld_f32(w.scale, w.scale_dtype, 0), s_post = ld_f32(w.scale, w.scale_dtype, 1);
        pre[e] = sigm(mix[e] * rx * s_pre + ld_f32(w.base, w.base_dtype, e)) + hc_eps;
        post[(size_t)t * nc + e] =
            2.0f * sigm(mix[nc + e] * rx * s_post + ld_f32(w.base, w.base_dtype, nc + e));
    }
    float s_comb = ld_f32(w.scale, w.scale_dtype, 2);
    if (nc > 4)
        sinkhorn_shared(comb + (size_t)t * nc * nc, cs, mix, rx, w, s_comb, nc, iters, hc_eps);
    __syncthreads();
    // nc <= 4: warp 0 makes the Sinkhorn while the other warps collapse and normalise, so the
    // kernel takes the longer of the two, not their sum
    int first = nc <= 4 ? 32 : 0;
    if (e < first) {
        sinkhorn_warp(comb + (size_t)t * nc * nc, mix, rx, w, s_comb, nc, iters, hc_eps);
        return;
    }
    float ss = 0.0f, *ct = collapsed + (size_t)t * d;
    for (int c = e - first; c < d; c += blockDim.x - first) {
        float acc = 0.0f;
        for (int i = 0; i < nc; i++)
            acc += pre[i] * xt[(size_t)i * d + c];
        ct[c] = acc;
        ss += acc * acc;
    }
    if (!norm) return; // uniform over the block
    // the layer's norm on the collapsed row (each thread rescales the entries it wrote)
    float r = rsqrtf(block_sum_from(ss, first / 32) / d + rms_eps);
    for (int c = e - first; c < d; c += blockDim.x - first)
        ct[c] = ct[c] * r * ld_f32(norm, norm_dt, c);
}

/* V columns c .. c + V - 1 of token t a thread (V = 4 where d % 4 == 0: 16-byte loads and
 * stores, and each comb and post value loaded once for four columns; one column a thread took
 * 5.1 ms of a 4096-token prefill of the Flash slice, about a third of the copy bandwidth; Nsight
 * Compute, H100, session 32), its old streams in registers for nc <= NC (4: 16 registers, where
 * room for 16 streams took 145 and one block a multiprocessor: 3.4 ms). Every column's sums are
 * the same whatever V and NC. */
template <int V, int NC>
__global__ void hc_post_kernel(float *x, const float *a, const float *post, const float *comb,
                               int n, int nc, int d, float *mean, int mean_stride) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    int dv = d / V, t = (int)(i / dv), c = (int)(i % dv) * V;
    // the streams this thread's columns read, and the token's post and comb: written by the
    // previous hc_post and this layer's hc_pre, since pushed out of L2 by the block's weights
    if (i < (long long)n * dv) {
        if (c % 32 == 0)
            for (int k = 0; k < nc; k++)
                prefetch_l2_line(x + ((size_t)t * nc + k) * d + c);
        if (c == 0)
            prefetch_l2_line(post + (size_t)t * nc), prefetch_l2_line(comb + (size_t)t * nc * nc);
    }
    PDL_START();
    if (i >= (long long)n * dv) return;
    float old[NC][V], *xt = x + (size_t)t * nc * d; // unrolled to NC: old stays in registers
    const float *ct = comb + (size_t)t * nc * nc, *pt = post + (size_t)t * nc;
    auto ld = [&](float *v, const float *p) {
        if constexpr (V == 4) {
            float4 y = *(const float4 *)p;
            v[0] = y.x, v[1] = y.y, v[2] = y.z, v[3] = y.w;
        } else {
            v[0] = *p;
        }
    };
#pragma unroll
    for (int k = 0; k < NC; k++)
        if (k < nc) ld(old[k], xt + (size_t)k * d + c);
    float at[V], sum[V];
    ld(at, a + (size_t)t * d + c);
#pragma unroll
    for (int u = 0; u < V; u++)
        sum[u] = 0.0f;
    for (int j = 0; j < nc; j++) {
        float acc[V], v[V];
#pragma unroll
        for (int u = 0; u < V; u++)
            acc[u] = 0.0f;
#pragma unroll
        for (int k = 0; k < NC; k++)
            if (k < nc) {
                float w = ct[k * nc + j];
#pragma unroll
                for (int u = 0; u < V; u++)
                    acc[u] += w * old[k][u];
            }
        float p = pt[j];
#pragma unroll
        for (int u = 0; u < V; u++) {
            v[u] = p * at[u] + acc[u];
            sum[u] += v[u]; // the new streams in order, as mean_streams_ref sums them
        }
        float *o = xt + (size_t)j * d + c;
        if constexpr (V == 4)
            *(float4 *)o = make_float4(v[0], v[1], v[2], v[3]);
        else
            o[0] = v[0];
    }
    if (mean)
#pragma unroll
        for (int u = 0; u < V; u++)
            mean[(size_t)t * mean_stride + c + u] = sum[u] / (float)nc;
}

__global__ void __launch_bounds__(HC_THREADS)
    hc_head_kernel(float *y, const float *x, const float *part, int splits, const void *fn,
                   int fn_dt, const void *base, int base_dt, const void *scale, int scale_dt,
                   int nc, int d, float hc_eps, float rms_eps) {
    __shared__ float mix[17];
    int t = blockIdx.x;
    prefetch_l2(base, (size_t)nc * td_dtype_size((enum td_dtype)base_dt));
    prefetch_l2(scale, td_dtype_size((enum td_dtype)scale_dt));
    if (splits == 1) prefetch_l2(fn, (size_t)nc * nc * d * td_dtype_size((enum td_dtype)fn_dt));
    PDL_START();
    const float *xt = x + (size_t)t * nc * d;
    float r = hc_mixes(mix, part, splits, xt, fn, fn_dt, nc, nc * d, rms_eps);
    float s = ld_f32(scale, scale_dt, 0);
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float acc = 0.0f;
        for (int i = 0; i < nc; i++)
            acc +=
                (sigm(mix[i] * r * s + ld_f32(base, base_dt, i)) + hc_eps) * xt[(size_t)i * d + c];
        y[(size_t)t * d + c] = acc;
    }
}

/* a context's (cuda_ctx.h): the chunk parts, and batch-invariant mode (the fp32 mixes at every
 * width) */
struct hc_state {
    float *parts;
    size_t parts_cap;
    int deterministic;
};

static void hc_release(void *p) {
    cudaFree(((struct hc_state *)p)->parts);
}

static struct hc_state &hs(void) {
    return td_cuda_ctx_state<struct hc_state>(TD_CTX_HC, hc_release);
}

extern "C" void hc_cuda_set_deterministic(int on) {
    hs().deterministic = on;
}

extern "C" int hc_cuda_reserve(const struct td_reserve *r, char *err, size_t errlen) {
    (void)err, (void)errlen;
    grow_scratch(&hs().parts, &hs().parts_cap, hc_mix_parts(r->rows, r->hc_mult, r->dim));
    return 0;
}

/* the chunk parts of n tokens' m mixes when the width is split (returns the split count) */
static int mix_parts(const float *x, const void *fn, int fn_dt, int n, int m, int width) {
    int splits = hc_mix_splits(width);
    if (splits > 1 && (n < hc_mix_wide() || hs().deterministic)) {
        grow_scratch(&hs().parts, &hs().parts_cap, (size_t)n * splits * (m + 1));
        int per = hc_mix_per(n);
        launch_k(hc_mix_f32_kernel, dim3(splits, ceil_div(n, per)), hc_threads(width), 0,
                 td_cuda_stream(), hs().parts, x, fn, fn_dt, m, width, splits, n, per);
        LAUNCH_CHECK();
    } else if (splits > 1) {
        grow_scratch(&hs().parts, &hs().parts_cap, (size_t)n * splits * (m + 1));
        dim3 grid(splits, ceil_div(n, HC_TT), ceil_div(m, HC_TO));
        if (fn_dt == TD_DTYPE_BF16)
            launch_k(hc_mix_kernel<__nv_bfloat16>, grid, HC_MIX_THREADS, 0, td_cuda_stream(),
                     hs().parts, x, (const __nv_bfloat16 *)fn, m, width, splits, n);
        else if (fn_dt == TD_DTYPE_F16)
            launch_k(hc_mix_kernel<__half>, grid, HC_MIX_THREADS, 0, td_cuda_stream(), hs().parts,
                     x, (const __half *)fn, m, width, splits, n);
        else
            launch_k(hc_mix_kernel<float>, grid, HC_MIX_THREADS, 0, td_cuda_stream(), hs().parts, x,
                     (const float *)fn, m, width, splits, n);
        LAUNCH_CHECK();
    }
    return splits;
}

extern "C" void hc_pre_cuda(float *collapsed, float *post, float *comb, const float *x,
                            const struct hc_weights *w, int n, int nc, int d, int sinkhorn_iters,
                            float hc_eps, float rms_eps, const void *norm,
                            enum td_dtype norm_dtype) {
    if (!n) return;
    int splits = mix_parts(x, w->fn, w->fn_dtype, n, (2 + nc) * nc, nc * d);
    launch_k(hc_pre_kernel, n, hc_threads(nc * d), 0, td_cuda_stream(), collapsed, post, comb, x,
             hs().parts, splits, *w, nc, d, sinkhorn_iters, hc_eps, rms_eps, norm, norm_dtype);
    LAUNCH_CHECK();
}

extern "C" void hc_post_cuda(float *x, const float *a, const float *post, const float *comb, int n,
                             int nc, int d, float *mean, int mean_stride) {
    if (!n) return;
    auto go = [&](auto v) {
        constexpr int V = decltype(v)::value;
        if (nc <= 4)
            launch_k(hc_post_kernel<V, 4>, ceil_div((long long)n * d / V, 256), 256, 0,
                     td_cuda_stream(), x, a, post, comb, n, nc, d, mean, mean_stride);
        else
            launch_k(hc_post_kernel<V, 16>, ceil_div((long long)n * d / V, 256), 256, 0,
                     td_cuda_stream(), x, a, post, comb, n, nc, d, mean, mean_stride);
    };
    if (d % 4 == 0 && (uintptr_t)x % 16 == 0 && (uintptr_t)a % 16 == 0)
        go(std::integral_constant<int, 4>{});
    else
        go(std::integral_constant<int, 1>{});
    LAUNCH_CHECK();
}

extern "C" void hc_head_cuda(float *y, const float *x, const void *fn, enum td_dtype fn_dtype,
                             const void *base, enum td_dtype base_dtype, const void *scale,
                             enum td_dtype scale_dtype, int n, int nc, int d, float hc_eps,
                             float rms_eps) {
    if (!n) return;
    int splits = mix_parts(x, fn, fn_dtype, n, nc, nc * d);
    launch_k(hc_head_kernel, n, hc_threads(nc * d), 0, td_cuda_stream(), y, x, hs().parts, splits,
             fn, fn_dtype, base, base_dtype, scale, scale_dtype, nc, d, hc_eps, rms_eps);
    LAUNCH_CHECK();
}
