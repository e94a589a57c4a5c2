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

#include <type_traits>

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

/* 8 values of x from p (16-byte aligned) as their B terms: t[0] the hi pairs, t[1] the lo
 * pairs (x_split), as the staged and the made-before forms keep them */
template <int F> __device__ __forceinline__ void x_terms8(uint4 *t, const float *p) {
    float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
    float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    unsigned hi[4], lo[4];
    x_split<F>(v, hi, lo);
    t[0] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    t[1] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
}

template <int F, typename Row>
__device__ __forceinline__ void xs_stage_rows(uint4 *xs, Row row, int rows, int in) {
    int n = in / 8 * rows;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        int G = i / rows, r = i - G * rows;
        x_terms8<F>(xs + 2 * i, row(r) + 8 * G);
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

/* Q8 in half precision: the skinny GEMM's form for FP8 weights (matmul.cu). Hopper converts
 * two e4m3 codes to two exact f16 values in one instruction (cvt.rn.f16x2.e4m3x2), so the codes
 * enter an f16 mma as they are and their block's scale multiplies each chunk's sums afterwards,
 * where the bf16 decode (q8_pairs) took about 28 instructions for 8 codes and bound the GEMM
 * (bench/RESULTS.md, session 27). x enters as two f16 terms of y = x 2^e, e per x row and chunk
 * of 64 k such that the chunk's largest |x| lands in [2^14, 2^15) (so f16's range holds any x:
 * hi = f16(y), lo = f16(y - hi), about 22 bits of y), and each chunk's sums are multiplied by
 * 2^-e and by the weight row's scale in fp32 (exact) and added in chunk order.
 * The warp makes the terms together: its lanes are split over XR rows (1 or 8; 64 / (32 / XR)
 * values of a row a lane). At XR 1 (a step of one row) the 64 values of a chunk are converted
 * once, not eight rows' worth, and pass through the warp's q8h_xw, from which lane (g, t) reads
 * row g's terms of k 16t .. 16t + 15; at XR 8 lane (g, t) converts just those, and keeps them
 * in registers (through shared memory the head took 326 us at 8 rows, in registers 276). A
 * row's terms are a function of its own values (the largest |x| is exact in any order) and an
 * mma's columns are independent, so a row has the same bits at either XR and beside any rows.
 * Lane (g, t) loads 16 codes of rows g and g + 8 at k 16t .. 16t + 15 (qraw_load); mma m of a
 * chunk takes their word m: codes 16t + 4m, + 1 as logical k (2t, 2t + 1) and 16t + 4m + 2, + 3
 * as (2t + 8, 2t + 9), and x's terms of the same k. */
struct q8h_xw {
    uint4 hi[8][9]; // row r, k 8j .. 8j + 7 as f16 (a row of 9: conflict-free 16-byte reads)
    uint4 lo[8][9];
    float inv[8]; // 2^-e of each row
};

__device__ __forceinline__ unsigned e4m3x2_f16x2(unsigned v) { // the low 16 bits of v
    unsigned r;
    unsigned short h = (unsigned short)v;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(h));
    return r;
}

__device__ __forceinline__ void mma_f16(float *c, unsigned a0, unsigned a1, unsigned a2,
                                        unsigned a3, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// 2^(s - 127) as fp32 (s = 0: the subnormal 2^-127)
__device__ __forceinline__ float e8m0_f32(unsigned s) {
    return __uint_as_float(s ? s << 23 : 0x00400000u);
}

/* the half-precision forms' x scale: m, the largest |x| of a row's chunk (exponent E), times
 * sc = 2^e lands in [2^14, 2^15) (e = 141 - E, at least -113 for any finite or infinite m, at
 * most 126 for m = 0); inv = 2^(g - e), the factor back, with g the weights' own power of two
 * (FP4: 14). Both normal for g up to 14. */
__device__ __forceinline__ void xh_scale(float m, int g, float *sc, float *inv) {
    int e = min(max(141 - (int)(__float_as_uint(m) >> 23), -126), 126);
    *sc = __uint_as_float((unsigned)(e + 127) << 23);
    *inv = __uint_as_float((unsigned)(127 + g - e) << 23);
}

/* y0, y1 (scaled x) as two f16 terms each: h = f16(y), l = f16(y - h); y0 in the low halves */
__device__ __forceinline__ void xh_terms(float y0, float y1, unsigned *h, unsigned *l) {
    __half2 a = __floats2half2_rn(y0, y1);
    float2 af = __half22float2(a);
    __half2 b = __floats2half2_rn(y0 - af.x, y1 - af.y);
    *h = *(unsigned *)&a, *l = *(unsigned *)&b;
}

/* the inv of x rows 2t and 2t + 1 (this lane's sums), from lanes 8t and 8t + 4, where lane
 * (g, t) holds row g's: zero past rows. Every lane of the warp calls it. */
__device__ __forceinline__ void xh_inv_rows(float inv, int rows, float *i0, float *i1) {
    int t = threadIdx.x & 3;
    float j0 = __shfl_sync(0xffffffffu, inv, 8 * t), j1 = __shfl_sync(0xffffffffu, inv, 8 * t + 4);
    *i0 = 2 * t < rows ? j0 : 0.0f, *i1 = 2 * t + 1 < rows ? j1 : 0.0f;
}

/* a chunk's sums s (mma layout) into c: times the rows' inv (i0, i1) and the weight rows' scale
 * bytes (sa: row g, sb: row g + 8) */
__device__ __forceinline__ void xh_promote(float *c, const float *s, float i0, float i1,
                                           unsigned sa, unsigned sb) {
    float a = e8m0_f32(sa), b = e8m0_f32(sb);
    c[0] = fmaf(s[0] * i0, a, c[0]);
    c[1] = fmaf(s[1] * i1, a, c[1]);
    c[2] = fmaf(s[2] * i0, b, c[2]);
    c[3] = fmaf(s[3] * i1, b, c[3]);
}

// V values of an x row from k (zeros past in, or all zeros for a row that is not live)
template <bool VEC, int V>
__device__ __forceinline__ void x_vals(float *v, const float *xr, bool live, int in, int k) {
    if (live && VEC && k + V <= in) {
        if constexpr (V == 2) {
            float2 p = *(const float2 *)(xr + k);
            v[0] = p.x, v[1] = p.y;
        } else {
#pragma unroll
            for (int j = 0; j < V; j += 4) {
                float4 p = *(const float4 *)(xr + k + j);
                v[j] = p.x, v[j + 1] = p.y, v[j + 2] = p.z, v[j + 3] = p.w;
            }
        }
        return;
    }
#pragma unroll
    for (int j = 0; j < V; j++)
        v[j] = live && k + j < in ? xr[k + j] : 0.0f;
}

/* a chunk's 8 mma a tile (a chain for hi, one for lo) on the 16-byte code loads wr and this
 * lane's x terms hb, lb (row g, k 16t .. 16t + 15), promoted into c with the inv of rows 2t and
 * 2t + 1 */
template <int NT>
__device__ __forceinline__ void q8h_mma(float (*c)[4], const qraw *wr, const unsigned *hb,
                                        const unsigned *lb, float i0, float i1) {
#pragma unroll
    for (int n = 0; n < NT; n++) { // each tile on the same terms
        float s[2][4] = {};
#pragma unroll
        for (int q = 0; q < 4; q++) {
            unsigned wa = u4_word(wr[n].a, q), wb = u4_word(wr[n].b, q);
            unsigned a0 = e4m3x2_f16x2(wa), a2 = e4m3x2_f16x2(wa >> 16);
            unsigned a1 = e4m3x2_f16x2(wb), a3 = e4m3x2_f16x2(wb >> 16);
            mma_f16(s[0], a0, a1, a2, a3, hb[2 * q], hb[2 * q + 1]);
            mma_f16(s[1], a0, a1, a2, a3, lb[2 * q], lb[2 * q + 1]);
        }
        float sum[4] = {s[0][0] + s[1][0], s[0][1] + s[1][1], s[0][2] + s[1][2], s[0][3] + s[1][3]};
        xh_promote(c[n], sum, i0, i1, wr[n].sa, wr[n].sb);
    }
}

/* x's terms for the 8-row form made once a launch (q8h_terms, matmul.cu) instead of by every
 * tile's warps: row r's chunk c at t + (r chunks + c) 64, its 32 words of hi pairs (word w: k
 * 2w, 2w + 1 of the chunk) then 32 of lo, and its inv at inv[r chunks + c]; the same values
 * q8h_chunk makes, so the same bits. t NULL: made in the kernel. */
struct q8h_xt {
    const unsigned *t;
    const float *inv;
    int chunks;
};

/* one chunk: this lane's V values v of row cr (lanes cj of 32 / XR) as terms in xw, then the
 * tile's 8 mma (a chain for hi, one for lo) on the 16-byte code loads wr, into c */
template <int XR, int NT>
__device__ __forceinline__ void q8h_chunk(float (*c)[4], const qraw *wr, const float *v, int rows,
                                          q8h_xw &xw) {
    constexpr int L = 32 / XR, V = 64 / L;
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, cr = lane / L, cj = lane % L;
    float m = 0.0f;
#pragma unroll
    for (int j = 0; j < V; j++)
        m = fmaxf(m, fabsf(v[j]));
#pragma unroll
    for (int o = 1; o < L; o <<= 1)
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float sc, inv;
    xh_scale(m, 0, &sc, &inv);
    unsigned hw[V / 2], lw[V / 2];
#pragma unroll
    for (int p = 0; p < V / 2; p++)
        xh_terms(v[2 * p] * sc, v[2 * p + 1] * sc, &hw[p], &lw[p]);
    unsigned hb[8], lb[8];
    float i0, i1;
    if constexpr (XR == 8) {
        // lane (g, t) made row g's k 16t .. 16t + 15, the very terms its mma take: they stay in
        // registers, and the 2^-e of rows 2t and 2t + 1 (the lane's sums) come from lanes 8t
        // and 8t + 4
#pragma unroll
        for (int p = 0; p < 8; p++)
            hb[p] = hw[p], lb[p] = lw[p];
        xh_inv_rows(inv, rows, &i0, &i1);
    } else {
        unsigned *hr = (unsigned *)&xw.hi[cr][0] + cj * (V / 2);
        unsigned *lr = (unsigned *)&xw.lo[cr][0] + cj * (V / 2);
#pragma unroll
        for (int p = 0; p < V / 2; p += V / 2 < 4 ? V / 2 : 4) {
            if constexpr (V / 2 == 1)
                hr[p] = hw[p], lr[p] = lw[p];
            else if constexpr (V / 2 == 2)
                *(uint2 *)(hr + p) = make_uint2(hw[p], hw[p + 1]),
                                *(uint2 *)(lr + p) = make_uint2(lw[p], lw[p + 1]);
            else
                *(uint4 *)(hr + p) = make_uint4(hw[p], hw[p + 1], hw[p + 2], hw[p + 3]),
                                *(uint4 *)(lr + p) =
                                    make_uint4(lw[p], lw[p + 1], lw[p + 2], lw[p + 3]);
        }
        if (cj == 0) xw.inv[cr] = inv;
        __syncwarp();
        uint4 h[2] = {}, l[2] = {};
        if (g < rows)
            h[0] = xw.hi[g][2 * t], h[1] = xw.hi[g][2 * t + 1], l[0] = xw.lo[g][2 * t],
            l[1] = xw.lo[g][2 * t + 1];
        i0 = 2 * t < rows ? xw.inv[2 * t] : 0.0f, i1 = 2 * t + 1 < rows ? xw.inv[2 * t + 1] : 0.0f;
        __syncwarp(); // every lane has read before the next chunk's terms are written
#pragma unroll
        for (int p = 0; p < 8; p++)
            hb[p] = u4_word(h[p / 4], p % 4), lb[p] = u4_word(l[p / 4], p % 4);
    }
    q8h_mma<NT>(c, wr, hb, lb, i0, i1);
}

/* this warp's share (chunks first, first + stride, ... of 64 k) of the NT tiles of weight rows
 * o0 + 16n .. o0 + 16n + 15 of the Q8 matrix w times the x rows x0 + r x_stride, r < rows (at
 * most XR), into c[n] (mma_feature / mma_row say where). NT 2 converts each chunk's x terms once
 * for two tiles (at 8 rows the terms cost about what the codes do); its loads of MT_U / NT
 * chunks keep the bytes in flight, and a row's sums keep their chunk order, so its bits are
 * those of NT 1. early: as mma_rows. */
template <bool VEC, int XR, int NT = 1>
__device__ __forceinline__ void
mma_rows_q8h(float (*c)[4], const float *x0, int x_stride, int rows, const struct wmat &w, int o0,
             int out, int in, int first, int stride, bool early, q8h_xw &xw, q8h_xt xt = {}) {
    constexpr int L = 32 / XR, V = 64 / L, MU = MT_U / NT;
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, cr = lane / L, cj = lane % L;
    const float *xc = x0 + (size_t)cr * x_stride;
    bool clive = cr < rows;
#pragma unroll
    for (int n = 0; n < NT; n++)
        c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.0f;
    int chunks = (in + 63) / 64;
    for (int c0 = first; c0 < chunks; c0 += stride * MU) {
        qraw wr[MU][NT];
#pragma unroll
        for (int u = 0; u < MU; u++) {
            int cu = c0 + u * stride;
#pragma unroll
            for (int n = 0; n < NT; n++)
                qraw_load<WF_Q8, VEC>(wr[u][n], w, o0 + 16 * n + g, cu < chunks ? out : 0, in,
                                      cu * 64 + 16 * t);
        }
        if (early && c0 == first) PDL_START(); // the first weights are on their way
        // the launch's terms (steps of more than 8 rows, so NT 1 alone: the two-tile forms'
        // registers stay theirs): row g's words 8t .. 8t + 7, hi and lo
        if constexpr (XR == 8 && NT == 1) {
            if (xt.t) {
#pragma unroll
                for (int u = 0; u < MU; u++) {
                    int cu = c0 + u * stride;
                    if (cu >= chunks) break; // (the same for the whole warp)
                    uint4 h[2] = {}, l[2] = {};
                    float inv = 0.0f;
                    if (g < rows) {
                        const uint4 *q = (const uint4 *)(xt.t + ((size_t)g * xt.chunks + cu) * 64);
                        h[0] = q[2 * t], h[1] = q[2 * t + 1], l[0] = q[8 + 2 * t],
                        l[1] = q[9 + 2 * t];
                        inv = xt.inv[(size_t)g * xt.chunks + cu];
                    }
                    unsigned hb[8], lb[8];
#pragma unroll
                    for (int p = 0; p < 8; p++)
                        hb[p] = u4_word(h[p / 4], p % 4), lb[p] = u4_word(l[p / 4], p % 4);
                    float i0, i1;
                    xh_inv_rows(inv, rows, &i0, &i1);
                    q8h_mma<NT>(c, wr[u], hb, lb, i0, i1);
                }
                continue;
            }
        }
        float xv[2][V]; // x of chunk u + 1 requested before u's mma
        x_vals<VEC, V>(xv[0], xc, clive && c0 < chunks, in, c0 * 64 + cj * V);
#pragma unroll
        for (int u = 0; u < MU; u++) {
            int cu = c0 + u * stride;
            if (u + 1 < MU)
                x_vals<VEC, V>(xv[(u + 1) & 1], xc, clive && cu + stride < chunks, in,
                               (cu + stride) * 64 + cj * V);
            if (cu >= chunks) continue; // (the same for the whole warp)
            q8h_chunk<XR, NT>(c, wr[u], xv[u & 1], rows, xw);
        }
    }
}

/* the narrow loads (8 weights of rows g and g + 8 a lane, k 8t .. 8t + 7 of a chunk of 32) of
 * chunks c0, c0 + stride, ... (MT_U of them, zeros past chunks) of NW matrices; narrow_x: the
 * lane's x row's 8 values of the same k */
template <int F, bool VEC, int NW>
__device__ __forceinline__ void narrow_w(wraw<F> (*wr)[MT_U], const struct wmat *w, int o0, int out,
                                         int in, int c0, int stride, int chunks) {
    int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
    for (int u = 0; u < MT_U; u++) {
        int k = (c0 + u * stride) * 32 + 8 * t;
        bool in_k = c0 + u * stride < chunks;
#pragma unroll
        for (int m = 0; m < NW; m++)
            wraw_load<F, VEC>(wr[m][u], w[m], o0 + g, in_k ? out : 0, in, k);
    }
}

template <bool VEC>
__device__ __forceinline__ void narrow_x(float (*xv)[8], const float *xr, bool live, int in, int c0,
                                         int stride, int chunks) {
    int t = threadIdx.x & 3;
#pragma unroll
    for (int u = 0; u < MT_U; u++)
        sk_x8<VEC>(xv[u], xr, live && c0 + u * stride < chunks, in, (c0 + u * stride) * 32 + 8 * t);
}

/* XS 2: the lane's x row's B terms already made (moe.cu, moe_terms_kernel: group G's hi pairs
 * at xb[2 G], its lo pairs at xb[2 G + 1]), for the same k as narrow_x; zeros past in and for a
 * row that is not live */
__device__ __forceinline__ void narrow_xt(uint4 (*xq)[2], const uint4 *xb, bool live, int in,
                                          int c0, int stride, int chunks) {
    int t = threadIdx.x & 3;
#pragma unroll
    for (int u = 0; u < MT_U; u++) {
        int G = (c0 + u * stride) * 4 + t;
        xq[u][0] = xq[u][1] = make_uint4(0, 0, 0, 0);
        if (live && c0 + u * stride < chunks && 8 * G < in)
            xq[u][0] = xb[2 * G], xq[u][1] = xb[2 * G + 1];
    }
}

// a group's loaded terms (narrow_xt) as the mma's hi and lo pairs
__device__ __forceinline__ void xq_terms(const uint4 *q, unsigned *hi, unsigned *lo) {
    hi[0] = q[0].x, hi[1] = q[0].y, hi[2] = q[0].z, hi[3] = q[0].w;
    lo[0] = q[1].x, lo[1] = q[1].y, lo[2] = q[1].z, lo[3] = q[1].w;
}

/* this warp's share of the tiles of weight rows o0 .. o0 + 15 of NW matrices w[m] [out, in] of
 * format F (quant.cuh: bf16, or FP8 / FP4 codes decoded to bf16 in registers)
 * (the same rows: an expert's gate and up projections) times x rows (this lane's: xr, read
 * when live), over chunks first, first + stride, ... of k (stride: the warps sharing the tile,
 * KW or more), into cout[m]. The loads of MT_U chunks of every matrix are made before the
 * first mma. ACC = 4: one accumulator per (first / second mma, hi / lo term), four short
 * chains of dependent mma summed in a fixed order at the end, for short k; ACC = 1 keeps the
 * registers (and more loads in flight) for the weight-bound shapes.
 * XS: where x's B terms come from: 0, split here from xr's values; 1, staged in shared memory
 * (xs_stage_rows; xs, xrows); 2, made before the kernel (narrow_xt; xs is the lane's row of
 * them). Every form gives the same terms, so the same bits.
 * A warp whose MT_U chunks' scale bytes are all below 128 decodes them with one multiplication
 * a pair (quant_one), the same values.
 * early: the caller has not waited for the grid before (PDL_START); the first weights are
 * requested before that wait, the x rows after it. Weights are written only when a model is
 * placed, never by a step's kernels, so they may be read before the wait; the caller calls
 * PDL_START again before it writes (a warp with no chunk never waited here). */
template <int F, bool VEC, int KW, int ACC, int NW = 1, bool WIDE = true, int XS = 0>
__device__ __forceinline__ void
mma_rows(float (*cout)[4], const float *xr, bool live, const struct wmat *w, int o0, int out,
         int in, int first, int stride, bool early, const uint4 *xs = nullptr, int xrows = 0) {
    // WIDE: quantized weights in 16-byte loads (mma_rows_q); else 8 weights a load, as bf16
    if constexpr (F != WF_BF16 && WIDE) {
        static_assert(XS < 2, "mma_rows_q stages x or splits it itself");
        mma_rows_q<F, VEC, KW, ACC, NW, XS == 1>(cout, xr, live, w, o0, out, in, first, stride,
                                                 early, xs, xrows);
        return;
    }
    int t = threadIdx.x & 3;
    float c[NW][ACC][4] = {};
    int chunks = (in + 31) / 32;
    for (int c0 = first; c0 < chunks; c0 += stride * MT_U) {
        wraw<F> wr[NW][MT_U];
        float xv[MT_U][8];
        uint4 xq[MT_U][2];
        narrow_w<F, VEC, NW>(wr, w, o0, out, in, c0, stride, chunks);
        if (early && c0 == first) PDL_START(); // the first weights are on their way
        if constexpr (XS == 0) narrow_x<VEC>(xv, xr, live, in, c0, stride, chunks);
        if constexpr (XS == 2) narrow_xt(xq, xs, live, in, c0, stride, chunks);
        unsigned sor = 0;
#pragma unroll
        for (int u = 0; u < MT_U; u++)
#pragma unroll
            for (int m = 0; m < NW; m++)
                sor |= wraw_sor<F>(wr[m][u]);
        auto mul = [&](auto one) {
#pragma unroll
            for (int u = 0; u < MT_U; u++) {
                if (c0 + u * stride >= chunks) break;
                // pairs 0 and 1 of k 8t .. 8t + 7 (in F's order, quant.cuh) are logical
                // (2t, 2t + 1, 2t + 8, 2t + 9) of the first mma, pairs 2 and 3 the same of the
                // second
                unsigned hi[4], lo[4];
                if constexpr (XS == 1)
                    xs_terms(xs, xrows, in, (c0 + u * stride) * 4 + t, hi, lo);
                else if constexpr (XS == 2)
                    xq_terms(xq[u], hi, lo);
                else
                    x_split<F>(xv[u], hi, lo);
                constexpr bool ONE = decltype(one)::value;
#pragma unroll
                for (int m = 0; m < NW; m++)
                    mma_8k<ACC>(c[m], wraw_a<F, ONE>(wr[m][u]), wraw_b<F, ONE>(wr[m][u]), hi, lo);
            }
        };
        if constexpr (F == WF_BF16)
            mul(std::false_type{});
        else if (quant_one(sor))
            mul(std::true_type{});
        else
            mul(std::false_type{});
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
