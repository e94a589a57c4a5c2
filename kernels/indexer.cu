/* indexer.cu: Lightning Indexer scores and top-k on the GPU (see indexer.h): the scores of a
 * row's visible entries over many blocks, then one block per row selects the top-k (radix
 * selection, ties to the lower entry) and writes the picks ascending, exactly the reference's
 * whatever the launch shape; a row that sees no more entries than top-k picks them all without
 * scoring. */
#include <type_traits>

#include "cuda_common.cuh"
#include "gemm_tile.cuh"
#include "indexer.h"
#include "kv_lane.cuh"

#define IDX_MAX_D 256 /* the widest indexer key (by_width) */

/* a context's (cuda_ctx.h): the scores */
struct idx_state {
    float *scratch;
    size_t scratch_cap;
};

static void idx_release(void *p) {
    cudaFree(((struct idx_state *)p)->scratch);
}

static struct idx_state &is(void) {
    return td_cuda_ctx_state<struct idx_state>(TD_CTX_INDEXER, idx_release);
}

/* The scores on tensor cores (indexer_mma_kernel). Block (row t, span y) scores the row's
 * visible entries y IM_SPAN .. + IM_SPAN, IM_ENT at a time: its heads' queries are the 64-row A
 * and the chunk's keys the B of S = Q K^T (mma.m16n8k16, fp32 sums), then each entry's column
 * of S becomes sum_h relu(S[h]) scale w[h]. The operands enter as two bf16 terms, x = hi + lo
 * (hi = bf16(x), lo = bf16(x - hi)), and each product as hi.hi + lo.hi (+ hi.lo for fp32 keys;
 * bf16 and fp8 keys are exact in hi): about 16 bits of each operand, near the fp32 dot the
 * fp32-pipe kernel made before (a 4096-token prefill of the Flash slice spent 14.5 ms in it, 4.7
 * TFLOP/s, and a 512-row chunk at 32k context about as much). Warp w takes heads 16 w .. + 16
 * and all IM_ENT entries of the chunk (8 tiles of 8); a lane sums its two heads of an entry,
 * the warp its 16 (butterfly over g), the block its warps in warp order: every score's sums
 * run in an order fixed by the shape alone, so a row gets the same scores in any batch and
 * from any span. Heads past n_heads and columns past d are zeros. Shared memory: the queries
 * [64][DP + 8] hi and lo, a chunk's keys [IM_ENT][DP + 8] hi and lo (8 of padding: ldmatrix
 * rows on distinct banks), the warps' sums. */
#define IM_HEADS   64 /* heads a block takes: the most an indexer may have */
#define IM_ENT     64 /* entries a chunk */
#define IM_THREADS 128

template <int DP> struct im_smem {
    static constexpr int LD = DP + 8;
    __nv_bfloat16 qh[IM_HEADS][LD], ql[IM_HEADS][LD];
    __nv_bfloat16 kh[IM_ENT][LD], kl[IM_ENT][LD];
    float part[IM_THREADS / 32][IM_ENT];
};

/* a warp's chunk: its 16 heads (query rows qr .. qr + 15 of qh / ql) against the chunk's IM_ENT
 * keys, s[j] the 16 x 8 tile of entries 8 j .. + 8; each product as hi.hi + lo.hi (+ hi.lo for
 * fp32 keys: KLO) in that order, k ascending; zeros when !on (heads all past n_heads) */
template <int DP, bool KLO, int LD>
__device__ __forceinline__ void
im_chunk(float (*s)[4], const __nv_bfloat16 (*qh)[LD], const __nv_bfloat16 (*ql)[LD],
         const __nv_bfloat16 (*kh)[LD], const __nv_bfloat16 (*kl)[LD], int qr, bool on, int lane) {
    int ak = (lane >> 4) * 8, br = (lane & 7) + (lane >> 4) * 8, bk = ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int j = 0; j < IM_ENT / 8; j++)
        s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
    if (!on) return;
#pragma unroll 2
    for (int kk = 0; kk < DP; kk += 16) {
        unsigned qa[4], qb[4];
        ldmatrix4(qa, &qh[qr + (lane & 15)][kk + ak]);
        ldmatrix4(qb, &ql[qr + (lane & 15)][kk + ak]);
#pragma unroll
        for (int jp = 0; jp < IM_ENT / 16; jp++) {
            unsigned kb[4];
            ldmatrix4(kb, &kh[16 * jp + br][kk + bk]);
            mma_bf16(s[2 * jp], qa[0], qa[1], qa[2], qa[3], kb[0], kb[1]);
            mma_bf16(s[2 * jp + 1], qa[0], qa[1], qa[2], qa[3], kb[2], kb[3]);
            mma_bf16(s[2 * jp], qb[0], qb[1], qb[2], qb[3], kb[0], kb[1]);
            mma_bf16(s[2 * jp + 1], qb[0], qb[1], qb[2], qb[3], kb[2], kb[3]);
            if constexpr (KLO) {
                ldmatrix4(kb, &kl[16 * jp + br][kk + bk]);
                mma_bf16(s[2 * jp], qa[0], qa[1], qa[2], qa[3], kb[0], kb[1]);
                mma_bf16(s[2 * jp + 1], qa[0], qa[1], qa[2], qa[3], kb[2], kb[3]);
            }
        }
    }
}

/* the warp's score parts of the chunk: entry 8 j + 2 tq + e summed over its heads, this lane's
 * g and g + 8 (weights wg0, wg1) first, then across the warp, into part[IM_ENT] */
__device__ __forceinline__ void im_parts(const float (*s)[4], float wg0, float wg1, float scale,
                                         float *part, int lane) {
    int g = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int j = 0; j < IM_ENT / 8; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            float v = fmaxf(s[j][e], 0.0f) * scale * wg0 + fmaxf(s[j][2 + e], 0.0f) * scale * wg1;
            v += __shfl_xor_sync(0xffffffffu, v, 4);
            v += __shfl_xor_sync(0xffffffffu, v, 8);
            v += __shfl_xor_sync(0xffffffffu, v, 16);
            if (g == 0) part[8 * j + 2 * tq + e] = v;
        }
}

template <int DP, int KT>
__global__ void __launch_bounds__(IM_THREADS)
    indexer_mma_kernel(struct indexer_args a, int span, float *scores) {
    prefetch_row_plan(a.rows, blockIdx.x);
    PDL_START();
    extern __shared__ __align__(16) unsigned char smb[];
    im_smem<DP> &sm = *(im_smem<DP> *)smb;
    const struct rows_view *r = &a.rows;
    int t = blockIdx.x, w0 = blockIdx.y * span, tid = threadIdx.x, lane = tid & 31, wp = tid >> 5;
    if (r->row_seq[t] < 0) return; // a pad row
    int n_vis = r->vis[t], sq = r->row_seq[t];
    if (n_vis <= a.topk || w0 >= n_vis) return;
    int w1 = min(w0 + span, n_vis);
    float *sc = scores + (size_t)t * a.n_entries;
    const float *q = a.q + (size_t)t * a.n_heads * a.d, *wt = a.w + (size_t)t * a.n_heads;
    kv_fmt f = kv_fmt_or_f32(a.fmt, a.d);
    f.dtype = KT;
    constexpr bool KLO = KT == TD_KV_F32;
    // the queries as hi and lo terms, pairs of columns a thread at a time
    for (int i = tid; i < IM_HEADS * DP / 2; i += IM_THREADS) {
        int h = i / (DP / 2), c = 2 * (i % (DP / 2));
        float x0 = 0.0f, x1 = 0.0f;
        if (h < a.n_heads) {
            const float *qh = q + (size_t)h * a.d;
            x0 = c < a.d ? __ldg(qh + c) : 0.0f; // (ld.global.nc, kv_lane.cuh key_ld)
            x1 = c + 1 < a.d ? __ldg(qh + c + 1) : 0.0f;
        }
        float h0 = __bfloat162float(__float2bfloat16_rn(x0)),
              h1 = __bfloat162float(__float2bfloat16_rn(x1));
        *(unsigned *)&sm.qh[h][c] = pack_bf16(h0, h1);
        *(unsigned *)&sm.ql[h][c] = pack_bf16(x0 - h0, x1 - h1);
    }
    int g = lane >> 2, hm = 16 * wp;
    bool live = hm < a.n_heads; // a warp whose heads are all past n_heads adds zeros
    float wg0 = 0.0f, wg1 = 0.0f;
    if (hm + g < a.n_heads) wg0 = wt[hm + g];
    if (hm + g + 8 < a.n_heads) wg1 = wt[hm + g + 8];
    const unsigned char *keys = (const unsigned char *)a.keys;
    for (int c0 = w0; c0 < w1; c0 += IM_ENT) {
        __syncthreads(); // the chunk before is summed: keys and parts are free
        {                // the chunk's keys: two threads an entry, DP / 2 columns each
            int u = tid >> 1, w = c0 + u;
            const void *p = w < w1 ? keys + rows_entry(r, sq, w, a.per) * f.rec : NULL;
            int c1 = (tid & 1) * (DP / 2);
            uint4 hi[DP / 32][2], lo[DP / 32][2]; // every load before the stores
            key16_terms_n<KT, KLO, DP / 32>(hi, lo, p, f, c1, 16);
#pragma unroll
            for (int i = 0; i < DP / 32; i++) {
                uint4 *dh = (uint4 *)&sm.kh[u][c1 + 16 * i], *dl = (uint4 *)&sm.kl[u][c1 + 16 * i];
                dh[0] = hi[i][0], dh[1] = hi[i][1];
                if (KLO) dl[0] = lo[i][0], dl[1] = lo[i][1];
            }
        }
        __syncthreads();
        float s[IM_ENT / 8][4];
        im_chunk<DP, KLO>(s, sm.qh, sm.ql, sm.kh, sm.kl, hm, live, lane);
        im_parts(s, wg0, wg1, a.scale, sm.part[wp], lane);
        __syncthreads();
        if (tid < IM_ENT && c0 + tid < w1) {
            float v = sm.part[0][tid];
#pragma unroll
            for (int k = 1; k < IM_THREADS / 32; k++)
                v += sm.part[k][tid];
            sc[c0 + tid] = v;
        }
    }
}

/* The same scores, R rows a block (indexer_mma_rows_kernel): the rows of a prompt chunk share
 * their sequence's keys, which the kernel above loads and splits into hi and lo terms once a row;
 * here once for the block's R rows (4 R warps: warp w takes row w / 4's heads 16 (w % 4) ..
 * + 16). The block's rows may belong to several sequences (a step's last rows of one and first
 * of the next, pad rows): it takes them a sequence at a time, its chunks of keys for the rows
 * of that sequence. Every score's products and sums run in the kernel above's order (the same
 * mma steps into the same accumulators, the same butterfly, the warps summed in head order), so
 * a row's scores are the same bits either way, in any block. */
template <int DP, int R> struct imr_smem {
    static constexpr int LD = DP + 8;
    __nv_bfloat16 qh[R * IM_HEADS][LD], ql[R * IM_HEADS][LD];
    __nv_bfloat16 kh[IM_ENT][LD], kl[IM_ENT][LD];
    float part[R * (IM_THREADS / 32)][IM_ENT];
};

template <int DP, int KT, int R>
__global__ void __launch_bounds__(IM_THREADS *R)
    indexer_mma_rows_kernel(struct indexer_args a, int span, float *scores) {
    prefetch_row_plan(a.rows, blockIdx.x * R); // (the lines hold its R rows)
    PDL_START();
    extern __shared__ __align__(16) unsigned char smb[];
    imr_smem<DP, R> &sm = *(imr_smem<DP, R> *)smb;
    constexpr int NT = IM_THREADS * R, WR = IM_THREADS / 32; // threads, warps a row
    const struct rows_view *r = &a.rows;
    int t0 = blockIdx.x * R, w0 = blockIdx.y * span, tid = threadIdx.x, lane = tid & 31,
        wp = tid >> 5;
    // the block's rows: sequence (-1: none to score) and the end of the span's entries it scores
    int seq[R], end[R];
    bool any = false;
#pragma unroll
    for (int i = 0; i < R; i++) {
        int t = t0 + i, n_vis = t < r->n_tok && r->row_seq[t] >= 0 ? r->vis[t] : 0;
        bool on = n_vis > a.topk && w0 < n_vis;
        seq[i] = on ? r->row_seq[t] : -1;
        end[i] = on ? min(w0 + span, n_vis) : w0;
        any |= on;
    }
    if (!any) return;
    kv_fmt f = kv_fmt_or_f32(a.fmt, a.d);
    f.dtype = KT;
    constexpr bool KLO = KT == TD_KV_F32;
    // every row's queries as hi and lo terms (a row not scored: zeros, never read from q)
    for (int i = tid; i < R * IM_HEADS * DP / 2; i += NT) {
        int rr = i / (IM_HEADS * DP / 2), h = (i / (DP / 2)) % IM_HEADS, c = 2 * (i % (DP / 2));
        float x0 = 0.0f, x1 = 0.0f;
        if (seq[rr] >= 0 && h < a.n_heads) {
            const float *qh = a.q + ((size_t)(t0 + rr) * a.n_heads + h) * a.d;
            x0 = c < a.d ? __ldg(qh + c) : 0.0f; // (ld.global.nc, kv_lane.cuh key_ld)
            x1 = c + 1 < a.d ? __ldg(qh + c + 1) : 0.0f;
        }
        float h0 = __bfloat162float(__float2bfloat16_rn(x0)),
              h1 = __bfloat162float(__float2bfloat16_rn(x1));
        *(unsigned *)&sm.qh[rr * IM_HEADS + h][c] = pack_bf16(h0, h1);
        *(unsigned *)&sm.ql[rr * IM_HEADS + h][c] = pack_bf16(x0 - h0, x1 - h1);
    }
    int my = wp / WR, g = lane >> 2, hm = 16 * (wp % WR);
    bool heads = hm < a.n_heads; // a warp whose heads are all past n_heads adds zeros
    float wg0 = 0.0f, wg1 = 0.0f;
    if (seq[my] >= 0) {
        const float *wt = a.w + (size_t)(t0 + my) * a.n_heads;
        if (hm + g < a.n_heads) wg0 = wt[hm + g];
        if (hm + g + 8 < a.n_heads) wg1 = wt[hm + g + 8];
    }
    const unsigned char *keys = (const unsigned char *)a.keys;
    for (int i0 = 0; i0 < R; i0++) { // a sequence at a time, at its first row in the block
        int sq = seq[i0], w1 = w0;
        bool first = sq >= 0;
#pragma unroll
        for (int i = 0; i < R; i++) {
            if (i < i0 && seq[i] == sq) first = false;
            if (seq[i] == sq) w1 = max(w1, end[i]);
        }
        if (!first) continue; // (block-uniform: every thread knows every row)
        bool mine = seq[my] == sq;
        for (int c0 = w0; c0 < w1; c0 += IM_ENT) {
            __syncthreads(); // the chunk before is summed: keys and parts are free
            for (int i = tid; i < IM_ENT * (DP / 16); i += NT) { // 16 columns a copy
                int u = i / (DP / 16), cc = 16 * (i % (DP / 16)), w = c0 + u;
                const void *p = w < w1 ? keys + rows_entry(r, sq, w, a.per) * f.rec : NULL;
                key16_bf16<KT, KLO>(&sm.kh[u][0], &sm.kl[u][0], p, f, cc);
            }
            __syncthreads();
            if (mine) { // (the rows of other sequences wait for their own pass)
                float s[IM_ENT / 8][4];
                im_chunk<DP, KLO>(s, sm.qh, sm.ql, sm.kh, sm.kl, my * IM_HEADS + hm, heads, lane);
                im_parts(s, wg0, wg1, a.scale, sm.part[wp], lane);
            }
            __syncthreads();
            for (int i = tid; i < R * IM_ENT; i += NT) { // each row of the sequence: its warps
                int rr = i / IM_ENT, e = i % IM_ENT;
                if (seq[rr] != sq || c0 + e >= end[rr]) continue;
                float v = sm.part[rr * WR][e];
#pragma unroll
                for (int k = 1; k < WR; k++)
                    v += sm.part[rr * WR + k][e];
                scores[(size_t)(t0 + rr) * a.n_entries + c0 + e] = v;
            }
        }
    }
}

/* rows a block of the scores takes (indexer_cuda_set_rows, TD_INDEXER_ROWS=R at the first
 * launch): 1, the kernel above; 2 or 4, indexer_mma_rows_kernel (2 for keys of more than 128
 * columns: four rows' queries pass the shared memory). Session 38 (H100, released slice, a 32k
 * prompt in chunks of 512): 1.260, 1.261 s one row a block; 1.233 s two; 1.236, 1.235 s four
 * (the same first token); the 4096-token prefill 0.067 s against 0.066 (four). */
#define IDX_ROWS 2
static int idx_rows = -1;

extern "C" void indexer_cuda_set_rows(int rows) {
    idx_rows = rows == 2 || rows == 4 ? rows : rows == 1 ? 1 : -1; // (-1: the default, below)
}

static int rows_a_block(int d) {
    if (idx_rows < 0)
        idx_rows = getenv("TD_INDEXER_ROWS") ? atoi(getenv("TD_INDEXER_ROWS")) : IDX_ROWS;
    if (idx_rows != 2 && idx_rows != 4) idx_rows = 1;
    return d > 128 && idx_rows > 2 ? 2 : idx_rows;
}

/* f(DP) with DP, the padded key width, a compile-time constant: d <= DP */
template <typename F> static void by_width(int d, F &&f) {
    if (d <= 32)
        f(std::integral_constant<int, 32>{});
    else if (d <= 128)
        f(std::integral_constant<int, 128>{});
    else
        f(std::integral_constant<int, 256>{});
}

/* a score's selection key: ordered_key, NaN below every number */
__device__ __forceinline__ unsigned score_key(float v) {
    return v != v ? 0u : ordered_key(v);
}

/* One block per row: the top-k of the row's scores by radix selection, then the picks in entry
 * order. Four passes over 8-bit digits of the score keys, from the top, find the k-th largest
 * key T and how many entries of key T the picks take (need: the lowest-indexed ones, as ties go
 * to the lower entry). One pass in entry order then keeps every entry above T and the first
 * `need` equal to it, each at its prefix count: ascending, with no sort. It replaced k rounds of
 * a block-wide argmax, whose barriers cost a 4k-context batch-1 step of the Flash slice
 * milliseconds. */
#define IDX_SELECT_THREADS 1024

__global__ void __launch_bounds__(IDX_SELECT_THREADS)
    indexer_select_kernel(struct indexer_args a, const float *scores) {
    prefetch_row_plan(a.rows, blockIdx.x);
    PDL_START();
    const struct rows_view *r = &a.rows;
    int t = blockIdx.x;
    int32_t *out = r->topk + (size_t)t * r->topk_stride;
    int n_vis = r->row_seq[t] < 0 ? 0 : r->vis[t]; // a pad row picks nothing: -1s
    if (n_vis <= a.topk) { // every visible entry is picked, already ascending
        for (int j = threadIdx.x; j < a.topk; j += blockDim.x)
            out[j] = j < n_vis ? j : -1;
        return;
    }
    const float *sc = scores + (size_t)t * a.n_entries;
    __shared__ int hist[256];
    __shared__ unsigned s_prefix;
    __shared__ int s_need;
    unsigned prefix = 0, mask = 0;
    int need = a.topk, lane = threadIdx.x & 31;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x)
            hist[i] = 0;
        __syncthreads();
        for (int w = threadIdx.x; w < n_vis; w += blockDim.x) {
            unsigned u = score_key(sc[w]);
            if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 255], 1);
        }
        __syncthreads();
        if (threadIdx.x < 32) { // lane l holds digits 8l .. 8l + 7; the digit where need falls
            int own = 0;
            for (int i = 0; i < 8; i++)
                own += hist[8 * lane + i];
            int above = own; // then: the count of the digits above lane's
            for (int o = 1; o < 32; o <<= 1) {
                int y = __shfl_down_sync(0xffffffffu, above, o);
                if (lane + o < 32) above += y;
            }
            above -= own;
            if (above < need && need <= above + own) {
                int d = 8 * lane + 7;
                for (; d > 8 * lane && above + hist[d] < need; d--)
                    above += hist[d];
                s_prefix = prefix | ((unsigned)d << shift);
                s_need = need - above;
            }
        }
        __syncthreads();
        prefix = s_prefix;
        need = s_need;
        mask |= 255u << shift;
    }
    int base = 0, eq_base = 0; // picks so far, entries of key T so far
    for (int w0 = 0; w0 < n_vis; w0 += blockDim.x) {
        int w = w0 + threadIdx.x, tot;
        unsigned u = w < n_vis ? score_key(sc[w]) : 0;
        int gt = w < n_vis && u > prefix, eq = w < n_vis && u == prefix;
        int eq_rank = eq_base + block_excl_scan(eq, &tot);
        eq_base += tot;
        int pick = gt || (eq && eq_rank < need);
        int pos = base + block_excl_scan(pick, &tot);
        base += tot;
        if (pick) out[pos] = w;
    }
    for (int j = base + threadIdx.x; j < a.topk; j += blockDim.x)
        out[j] = -1; // (base is top-k here)
#ifdef TD_DEBUG
    // postconditions: exactly top-k picks, each a visible entry, strictly ascending (the order
    // the attention reads them in, and what makes a row's result independent of its batch)
    TD_DEV_ASSERT(base == a.topk);
    __syncthreads();
    for (int j = threadIdx.x; j < a.topk; j += blockDim.x)
        TD_DEV_ASSERT(out[j] >= 0 && out[j] < n_vis && (j == 0 || out[j - 1] < out[j]));
#endif
}

/* the kernels' dynamic shared memory past 48 KB, once: at start-up (outside any capture), and
 * at the first launch of a caller that made no reservation (the GPU tests) */
static void im_allow(void) {
    static bool done;
    if (done) return;
    for (int kt = TD_KV_F32; kt <= TD_KV_FP8; kt++)
        for (int d = 32; d <= IDX_MAX_D; d *= 2)
            by_width(d, [&](auto dp) {
                by_kv(kt, [&](auto k) {
                    constexpr int DP = decltype(dp)::value, KT = decltype(k)::value;
                    CUDA_CHECK(cudaFuncSetAttribute(indexer_mma_kernel<DP, KT>,
                                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                    (int)sizeof(im_smem<DP>)));
                    CUDA_CHECK(cudaFuncSetAttribute(indexer_mma_rows_kernel<DP, KT, 2>,
                                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                    (int)sizeof(imr_smem<DP, 2>)));
                    if constexpr (DP <= 128)
                        CUDA_CHECK(cudaFuncSetAttribute(indexer_mma_rows_kernel<DP, KT, 4>,
                                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                        (int)sizeof(imr_smem<DP, 4>)));
                });
            });
    done = true;
}

extern "C" int indexer_cuda_reserve(const struct td_reserve *r, char *err, size_t errlen) {
    if (r->index_head_dim > IDX_MAX_D)
        return td_errf(err, errlen,
                       "backend cuda: index_head_dim %d is more than the indexer kernel's %d",
                       r->index_head_dim, IDX_MAX_D);
    if (r->index_n_heads > IM_HEADS)
        return td_errf(err, errlen,
                       "backend cuda: index_n_heads %d is more than the indexer kernel's %d",
                       r->index_n_heads, IM_HEADS);
    im_allow();
    grow_scratch(&is().scratch, &is().scratch_cap, (size_t)r->rows * (r->entries + 1));
    return 0;
}

/* the entries a block scores: IM_ENT when the step has few rows (a decode step's blocks spread
 * its rows' entries over the device), four chunks when it has many (each block splits its
 * row's queries once for more entries); the scores do not depend on it */
static int indexer_span(int rows) {
    return rows >= 64 ? 4 * IM_ENT : IM_ENT;
}

extern "C" void indexer_topk_cuda(const struct indexer_args *a) {
    if (!a->rows.n_tok) return;
    TD_ASSERT(a->n_heads <= IM_HEADS && a->d <= IDX_MAX_D); // the reservation refuses more first
    grow_scratch(&is().scratch, &is().scratch_cap, (size_t)a->rows.n_tok * (a->n_entries + 1));
    if (a->n_entries > a->topk) { // else no row has scores to make
        im_allow();
        int span = indexer_span(a->rows.n_tok), R = rows_a_block(a->d);
        dim3 grid(ceil_div(a->rows.n_tok, R), ceil_div(a->n_entries, span));
        by_width(a->d, [&](auto dp) {
            by_kv(kv_fmt_or_f32(a->fmt, a->d).dtype, [&](auto k) {
                constexpr int DP = decltype(dp)::value, KT = decltype(k)::value;
                if (R == 1)
                    launch_k(indexer_mma_kernel<DP, KT>, grid, IM_THREADS, sizeof(im_smem<DP>),
                             td_cuda_stream(), *a, span, is().scratch);
                else if (R == 2)
                    launch_k(indexer_mma_rows_kernel<DP, KT, 2>, grid, 2 * IM_THREADS,
                             sizeof(imr_smem<DP, 2>), td_cuda_stream(), *a, span, is().scratch);
                else if constexpr (DP <= 128)
                    launch_k(indexer_mma_rows_kernel<DP, KT, 4>, grid, 4 * IM_THREADS,
                             sizeof(imr_smem<DP, 4>), td_cuda_stream(), *a, span, is().scratch);
            });
        });
        LAUNCH_CHECK();
    }
    launch_k(indexer_select_kernel, a->rows.n_tok, IDX_SELECT_THREADS, 0, td_cuda_stream(), *a,
             (const float *)is().scratch);
    LAUNCH_CHECK();
}

extern "C" const float *indexer_cuda_scores(void) {
    return is().scratch;
}
