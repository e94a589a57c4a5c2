/* mma_tile.cuh: a warp's tile of 16 weight rows (output features) x 8 x rows on tensor cores,
 * for the skinny GEMM (matmul.cu) and the expert GEMMs of small steps (moe.cu).
 *
 * mma.m16n8k16 (bf16 in, fp32 accumulate). The x rows enter as two bf16 terms, x = hi + lo
 * (hi = bf16(x), lo = bf16(x - hi): x_split), so the products keep about 16 bits of x (an
 * fp32 dot keeps 24; the bf16 weights have 8). The reduction over k is a sum, so any order of k
 * works when the weights and x agree on it: lane (g, t) loads 8 consecutive k (one 16-byte load per
 * weight row g and g + 8, two float4 of x row g) and the fragments put them where mma expects
 * logical k (2t, 2t + 1, 2t + 8, 2t + 9) of two instructions. The KW warps of a block take every
 * KW-th 32-wide chunk of k and their tiles are summed in warp order (kw_sum): the order of every
 * sum depends on the shape alone, and a row's sums never on the rows beside it (each column of an
 * mma is its own). A lane's results c[4] land where mma_feature and mma_row say. */
#ifndef TD_KERNELS_MMA_TILE_CUH
#define TD_KERNELS_MMA_TILE_CUH

#include "cuda_common.cuh"
#include "quant.cuh"

#define MT_U 4 /* chunks of 32 k each warp loads before it multiplies */

__device__ __forceinline__ unsigned pack_bf16(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b); // a in the low half
    return *(unsigned *)&h;
}

__device__ __forceinline__ void mma_bf16(float *c, unsigned a0, unsigned a1, unsigned a2,
                                         unsigned a3, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// 8 values of x row xr from k (zeros past in, or all zeros for a row that is not live)
template <bool VEC>
__device__ __forceinline__ void sk_x8(float *v, const float *xr, bool live, int in, int k) {
    if (live && VEC && k + 8 <= in) {
        float4 p = *(const float4 *)(xr + k), q = *(const float4 *)(xr + k + 4);
        v[0] = p.x, v[1] = p.y, v[2] = p.z, v[3] = p.w, v[4] = q.x, v[5] = q.y, v[6] = q.z,
        v[7] = q.w;
        return;
    }
    for (int j = 0; j < 8; j++)
        v[j] = live && k + j < in ? xr[k + j] : 0.0f;
}

/* where this lane's results c[j] of a tile belong: feature o0 + mma_feature(j), x row
 * mma_row(j) (c0, c1: feature g, rows 2t and 2t + 1; c2, c3: feature g + 8, the same rows) */
__device__ __forceinline__ int mma_feature(int j) {
    return ((threadIdx.x & 31) >> 2) + (j >> 1) * 8;
}

__device__ __forceinline__ int mma_row(int j) {
    return 2 * (threadIdx.x & 3) + (j & 1);
}

/* 8 x values as the two bf16 terms of each (hi = bf16(x), lo = bf16(x - hi)), paired as
 * format F pairs its weights (quant.cuh: wpair_a / wpair_b) */
template <int F>
__device__ __forceinline__ void x_split(const float *xv, unsigned *hi, unsigned *lo) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float a = xv[wpair_a<F>(i)], b = xv[wpair_b<F>(i)];
        float ha = __bfloat162float(__float2bfloat16_rn(a));
        float hb = __bfloat162float(__float2bfloat16_rn(b));
        hi[i] = pack_bf16(ha, hb);
        lo[i] = pack_bf16(a - ha, b - hb);
    }
}

/* x staged in shared memory as the mma's B terms, split once for the block instead of once a
 * lane for every tile (the expert GEMMs of small steps, moe.cu): for 8-k group G and x row
 * r < rows, xs[2 (G rows + r)] holds the four hi pairs and xs[2 (G rows + r) + 1] the four lo
 * pairs, paired as F pairs its weights. Row r of x at row(r), in % 8 == 0 and 16-byte aligned
 * rows; every thread of the block calls it (it ends with __syncthreads). xs_bytes: the shared
 * memory it takes. */
__host__ __device__ constexpr size_t xs_bytes(int rows, int in) {
    return (size_t)rows * in * 4;
}

template <int F, typename Row>
__device__ __forceinline__ void xs_stage_rows(uint4 *xs, Row row, int rows, int in) {
    int n = in / 8 * rows;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        int G = i / rows, r = i - G * rows;
        const float4 *p = (const float4 *)(row(r) + 8 * G);
        float4 a = p[0], b = p[1];
        float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        unsigned hi[4], lo[4];
        x_split<F>(v, hi, lo);
        xs[2 * i] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
        xs[2 * i + 1] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    }
    __syncthreads();
}

// the staged B terms of group G (of in / 8) for this lane's x row g (zeros past rows or in)
__device__ __forceinline__ void xs_terms(const uint4 *xs, int rows, int in, int G, unsigned *hi,
                                         unsigned *lo) {
    int g = (threadIdx.x & 31) >> 2;
    uint4 h = make_uint4(0, 0, 0, 0), l = h;
    if (g < rows && 8 * G < in) h = xs[2 * (G * rows + g)], l = xs[2 * (G * rows + g) + 1];
    hi[0] = h.x, hi[1] = h.y, hi[2] = h.z, hi[3] = h.w;
    lo[0] = l.x, lo[1] = l.y, lo[2] = l.z, lo[3] = l.w;
}

/* a lane's 8 k of rows g (A) and g + 8 (B) times its x terms: the four mma, into ACC chains */
template <int ACC>
__device__ __forceinline__ void mma_8k(float (*c)[4], uint4 A, uint4 B, const unsigned *hi,
                                       const unsigned *lo) {
    mma_bf16(c[0], A.x, B.x, A.y, B.y, hi[0], hi[1]);
    mma_bf16(c[1 % ACC], A.x, B.x, A.y, B.y, lo[0], lo[1]);
    mma_bf16(c[2 % ACC], A.z, B.z, A.w, B.w, hi[2], hi[3]);
    mma_bf16(c[3 % ACC], A.z, B.z, A.w, B.w, lo[2], lo[3]);
}

/* the ACC chains of each matrix summed in a fixed order */
template <int NW, int ACC>
__device__ __forceinline__ void acc_out(float (*cout)[4], float (*c)[ACC][4]) {
#pragma unroll
    for (int m = 0; m < NW; m++)
#pragma unroll
        for (int j = 0; j < 4; j++)
            cout[m][j] =
                ACC == 4 ? (c[m][0][j] + c[m][2 % ACC][j]) + (c[m][1 % ACC][j] + c[m][3 % ACC][j])
                         : c[m][0][j];
}

/* mma_rows for the quantized formats (quant.cuh): a lane loads 16 bytes of each of its two rows
 * a step (8 * QR weights, QR = 2 for Q8, 4 for Q4), so a chunk of k is 32 * QR wide and lane t
 * holds k 8 QR t .. 8 QR t + 8 QR - 1 of it; every weight load of MT_U chunks is made first, and
 * x is read (from L1: the rows are the block's) as each group of 8 is multiplied, which keeps
 * 8 * QR floats of x out of the registers the loads need. Same accumulators and order rules
 * as mma_rows. */
template <int F, bool VEC, int KW, int ACC, int NW, bool XS>
__device__ __forceinline__ void mma_rows_q(float (*cout)[4], const float *xr, bool live,
                                           const struct wmat *w, int o0, int out, int in, int first,
                                           int stride, bool early, const uint4 *xs, int xrows) {
    constexpr int R = qr<F>::R, CW = 32 * R;
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    float c[NW][ACC][4] = {};
    int chunks = (in + CW - 1) / CW;
    for (int c0 = first; c0 < chunks; c0 += stride * MT_U) {
        qraw wr[NW][MT_U];
#pragma unroll
        for (int u = 0; u < MT_U; u++) {
            int k = (c0 + u * stride) * CW + 8 * R * t;
            bool in_k = c0 + u * stride < chunks;
#pragma unroll
            for (int m = 0; m < NW; m++)
                qraw_load<F, VEC>(wr[m][u], w[m], o0 + g, in_k ? out : 0, in, k);
        }
        if (early && c0 == first) PDL_START(); // the first weights are on their way
        // x of chunk u + 1 is requested before chunk u is multiplied (two chunks in registers):
        // the rows come from L2, and a load made only as its group is reached stalled every
        // group (the quantized GEMMs ran at the bf16 GEMM's time on a half or a quarter of the
        // bytes)
        float xv[2][R][8];
        if constexpr (!XS) {
#pragma unroll
            for (int j = 0; j < R; j++)
                sk_x8<VEC>(xv[0][j], xr, live && c0 < chunks, in, c0 * CW + 8 * R * t + 8 * j);
        }
#pragma unroll
        for (int u = 0; u < MT_U; u++) {
            int cu = c0 + u * stride;
            if (!XS && u + 1 < MT_U) {
                int cn = cu + stride;
#pragma unroll
                for (int j = 0; j < R; j++)
                    sk_x8<VEC>(xv[(u + 1) & 1][j], xr, live && cn < chunks, in,
                               cn * CW + 8 * R * t + 8 * j);
            }
            if (cu >= chunks) continue; // (its loads were zeros)
#pragma unroll
            for (int j = 0; j < R; j++) {
                unsigned hi[4], lo[4];
                if constexpr (XS)
                    xs_terms(xs, xrows, in, cu * (CW / 8) + R * t + j, hi, lo);
                else
                    x_split<F>(xv[u & 1][j], hi, lo);
#pragma unroll
                for (int m = 0; m < NW; m++)
                    mma_8k<ACC>(c[m], q16_pairs<F>(wr[m][u].a, j, wr[m][u].sa),
                                q16_pairs<F>(wr[m][u].b, j, wr[m][u].sb), hi, lo);
            }
        }
    }
    acc_out<NW, ACC>(cout, c);
}

/* this warp's share of the tiles of weight rows o0 .. o0 + 15 of NW matrices w[m] [out, in] of
 * format F (quant.cuh: bf16, or FP8 / FP4 codes decoded to bf16 in registers)
 * (the same rows: an expert's gate and up projections) times x rows (this lane's: xr, read
 * when live), over chunks first, first + stride, ... of k (stride: the warps sharing the tile,
 * KW or more), into cout[m]. The loads of MT_U chunks of every matrix are made before the
 * first mma. ACC = 4: one accumulator per (first / second mma, hi / lo term), four short
 * chains of dependent mma summed in a fixed order at the end, for short k; ACC = 1 keeps the
 * registers (and more loads in flight) for the weight-bound shapes.
 * early: the caller has not waited for the grid before (PDL_START); the first weights are
 * requested before that wait, the x rows after it. Weights are written only when a model is
 * placed, never by a step's kernels, so they may be read before the wait; the caller calls
 * PDL_START again before it writes (a warp with no chunk never waited here). */
template <int F, bool VEC, int KW, int ACC, int NW = 1, bool WIDE = true, bool XS = false>
__device__ __forceinline__ void
mma_rows(float (*cout)[4], const float *xr, bool live, const struct wmat *w, int o0, int out,
         int in, int first, int stride, bool early, const uint4 *xs = nullptr, int xrows = 0) {
    // WIDE: quantized weights in 16-byte loads (mma_rows_q); else 8 weights a load, as bf16
    if constexpr (F != WF_BF16 && WIDE) {
        mma_rows_q<F, VEC, KW, ACC, NW, XS>(cout, xr, live, w, o0, out, in, first, stride, early,
                                            xs, xrows);
        return;
    }
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    float c[NW][ACC][4] = {};
    int chunks = (in + 31) / 32;
    for (int c0 = first; c0 < chunks; c0 += stride * MT_U) {
        wraw<F> wr[NW][MT_U];
        float xv[MT_U][8];
#pragma unroll
        for (int u = 0; u < MT_U; u++) {
            int k = (c0 + u * stride) * 32 + 8 * t;
            bool in_k = c0 + u * stride < chunks;
#pragma unroll
            for (int m = 0; m < NW; m++)
                wraw_load<F, VEC>(wr[m][u], w[m], o0 + g, in_k ? out : 0, in, k);
        }
        if (early && c0 == first) PDL_START(); // the first weights are on their way
        if constexpr (!XS) {
#pragma unroll
            for (int u = 0; u < MT_U; u++) {
                int k = (c0 + u * stride) * 32 + 8 * t;
                sk_x8<VEC>(xv[u], xr, live && c0 + u * stride < chunks, in, k);
            }
        }
#pragma unroll
        for (int u = 0; u < MT_U; u++) {
            if (c0 + u * stride >= chunks) break;
            // pairs 0 and 1 of k 8t .. 8t + 7 (in F's order, quant.cuh) are logical
            // (2t, 2t + 1, 2t + 8, 2t + 9) of the first mma, pairs 2 and 3 the same of the second
            unsigned hi[4], lo[4];
            if constexpr (XS)
                xs_terms(xs, xrows, in, (c0 + u * stride) * 4 + t, hi, lo);
            else
                x_split<F>(xv[u], hi, lo);
#pragma unroll
            for (int m = 0; m < NW; m++)
                mma_8k<ACC>(c[m], wraw_a<F>(wr[m][u]), wraw_b<F>(wr[m][u]), hi, lo);
        }
    }
    acc_out<NW, ACC>(cout, c);
}

/* the width of a chunk of k (a warp-step) for weights of format F */
__host__ __device__ constexpr int mma_chunk(int f) {
    return f == WF_Q8 ? 64 : f == WF_Q4 ? 128 : 32;
}

/* the KW warps' tiles summed in warp order into warp 0's c (every thread of the block calls
 * it; part: KW - 1 tiles of shared memory, free again when it returns). True in warp 0. */
template <int KW> __device__ __forceinline__ bool kw_sum(float *c, float (*part)[32][4]) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (KW == 1) return true;
    __syncthreads(); // an earlier call's reads are done
    if (warp) {
#pragma unroll
        for (int j = 0; j < 4; j++)
            part[warp - 1][lane][j] = c[j];
    }
    __syncthreads();
    if (warp) return false;
#pragma unroll
    for (int q = 0; q < KW - 1; q++)
#pragma unroll
        for (int j = 0; j < 4; j++)
            c[j] += part[q][lane][j];
    return true;
}

#endif
