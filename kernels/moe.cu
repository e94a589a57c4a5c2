/* moe.cu: router and routed experts on the GPU (see moe.h). One block per row: the row's picks
 * run in ascending expert order and add into an fp32 accumulator, so a row's result never
 * depends on the other rows (batch-invariant). A grouped-GEMM path for large batches is the
 * next step; this one is the correctness baseline. */
#include <type_traits>

#include "cuda_common.cuh"
#include "gemm_tile.cuh"
#include "mma_tile.cuh"
#include "moe.h"
#include "wgmma_tile.cuh"

__device__ __forceinline__ float score_of(float z, int fn) {
    if (fn == MOE_SCORE_SIGMOID) return 1.0f / (1.0f + expf(-z));
    float sp = z > 20.0f ? z : log1pf(expf(z));
    return sqrtf(sp);
}

__global__ void route_kernel(int32_t *picks, float *weights, const float *logits,
                             const int32_t *ids, int fn, const void *bias, int bias_dt,
                             const void *tid2eid, int tid_dt, int k, int E, float scaling,
                             int shared) {
    prefetch_l2(bias, (size_t)E * td_dtype_size((enum td_dtype)bias_dt));
    PDL_START();
    extern __shared__ float sc[]; // [E] scores, then [E] selection values
    float *sel = sc + E;
    int t = blockIdx.x;
    const float *lg = logits + (size_t)t * E;
    if (fn == MOE_SCORE_SOFTMAX) {
        block_softmax(sc, lg, E, -INFINITY);
    } else {
        for (int e = threadIdx.x; e < E; e += blockDim.x)
            sc[e] = score_of(lg[e], fn);
    }
    for (int e = threadIdx.x; e < E; e += blockDim.x) // selection: score + correction bias
        sel[e] = sc[e] + (bias ? ld_f32(bias, bias_dt, e) : 0.0f);
    __syncthreads();
    // pick j: the block's largest sel among the experts not yet taken, ties to the lower expert
    // (the reference's first strict maximum), as one argmax_key per candidate
    __shared__ int p[64];
    for (int j = 0; j < k; j++) {
        if (tid2eid) {
            if (!threadIdx.x) {
                long long i = (long long)ids[t] * k + j;
                p[j] = tid_dt == TD_DTYPE_I64 ? (int)((const long long *)tid2eid)[i]
                                              : ((const int32_t *)tid2eid)[i];
            }
            continue;
        }
        unsigned long long best = 0;
        for (int e = threadIdx.x; e < E; e += blockDim.x) {
            int taken = 0;
            for (int u = 0; u < j; u++)
                taken |= p[u] == e;
            if (taken) continue;
            unsigned long long key = argmax_key(sel[e], e);
            best = key > best ? key : best;
        }
        best = block_max_key(best);
        if (!threadIdx.x) p[j] = argmax_key_index(best);
        __syncthreads();
    }
    __syncthreads();
    if (threadIdx.x) return;
    float sum = 0.0f;
    for (int j = 0; j < k; j++)
        sum += sc[p[j]];
    int kk = k + shared;
    for (int j = 0; j < k; j++) {
        picks[(size_t)t * kk + j] = p[j];
        weights[(size_t)t * kk + j] = sc[p[j]] / (sum + 1e-20f) * scaling;
    }
    if (shared) picks[(size_t)t * kk + k] = E, weights[(size_t)t * kk + k] = 1.0f;
}

/* The same routing, a warp per row (ROUTE_ROWS rows a block) for up to 32 PER experts: lane l
 * holds experts l, l + 32, .. in registers, every pick is one warp maximum of argmax_key (the
 * block kernel's order: ties to the lower expert), a lane's taken experts a bit mask, and every
 * lane sums the picks' scores in pick order, as route_kernel's thread 0 does: the same bits (the
 * softmax score's own sums run in another order). The block form waited at two barriers a pick
 * (7.8 us a call on the Flash slice at batch 1). */
#define ROUTE_ROWS 4

template <int PER>
__global__ void route_warp_kernel(int32_t *picks, float *weights, const float *logits,
                                  const int32_t *ids, int fn, const void *bias, int bias_dt,
                                  const void *tid2eid, int tid_dt, int k, int E, float scaling,
                                  int shared, int n) {
    prefetch_l2(bias, (size_t)E * td_dtype_size((enum td_dtype)bias_dt));
    PDL_START();
    int lane = threadIdx.x & 31, t = blockIdx.x * ROUTE_ROWS + (threadIdx.x >> 5);
    if (t >= n) return;
    const float *lg = logits + (size_t)t * E;
    float sc[PER], sel[PER];
#pragma unroll
    for (int i = 0; i < PER; i++) {
        int e = lane + 32 * i;
        sc[i] = e < E ? lg[e] : -INFINITY;
        sel[i] = e < E && bias ? ld_f32(bias, bias_dt, e) : 0.0f;
    }
    if (fn == MOE_SCORE_SOFTMAX) { // (block_softmax's terms; its sums' order differs)
        float mx = -INFINITY, den = 0.0f;
#pragma unroll
        for (int i = 0; i < PER; i++)
            mx = fmaxf(mx, sc[i]);
        mx = warp_max(mx);
#pragma unroll
        for (int i = 0; i < PER; i++)
            den += lane + 32 * i < E ? expf(sc[i] - mx) : 0.0f;
        den = warp_sum(den);
#pragma unroll
        for (int i = 0; i < PER; i++)
            sc[i] = expf(sc[i] - mx) / den;
    } else {
#pragma unroll
        for (int i = 0; i < PER; i++)
            sc[i] = score_of(sc[i], fn);
    }
#pragma unroll
    for (int i = 0; i < PER; i++)
        sel[i] += sc[i];
    unsigned taken = 0;
    float sum = 0.0f, mine = 0.0f; // (lane j keeps pick j's score)
    int kk = k + shared;
    for (int j = 0; j < k; j++) {
        int p;
        if (tid2eid) {
            long long i = (long long)ids[t] * k + j;
            p = tid_dt == TD_DTYPE_I64 ? (int)((const long long *)tid2eid)[i]
                                       : ((const int32_t *)tid2eid)[i];
        } else {
            unsigned long long best = 0;
#pragma unroll
            for (int i = 0; i < PER; i++) {
                int e = lane + 32 * i;
                unsigned long long key = argmax_key(sel[i], e);
                if (e < E && !(taken >> i & 1u) && key > best) best = key;
            }
            p = argmax_key_index(warp_max_key(best));
        }
        float ps = 0.0f; // the pick's score, from the lane that holds it
#pragma unroll
        for (int i = 0; i < PER; i++)
            if (p == lane + 32 * i) ps = sc[i], taken |= 1u << i;
        ps = __shfl_sync(0xffffffffu, ps, p & 31);
        sum += ps; // (every lane: the same sum in pick order)
        if (lane == j) picks[(size_t)t * kk + j] = p, mine = ps;
    }
    if (lane < k) weights[(size_t)t * kk + lane] = mine / (sum + 1e-20f) * scaling;
    if (shared && lane == 0) picks[(size_t)t * kk + k] = E, weights[(size_t)t * kk + k] = 1.0f;
}

extern "C" void moe_route_rows_cuda(int32_t *picks, float *weights, const float *logits,
                                    const int32_t *ids, enum moe_score score_fn, const void *bias,
                                    enum td_dtype bias_dtype, const void *tid2eid,
                                    enum td_dtype tid_dtype, int n, int k, int n_experts,
                                    float scaling, int shared) {
    if (!n) return;
    auto warp = [&](auto per) {
        launch_k(route_warp_kernel<decltype(per)::value>, ceil_div(n, ROUTE_ROWS), 32 * ROUTE_ROWS,
                 0, td_cuda_stream(), picks, weights, logits, ids, (int)score_fn, bias,
                 (int)bias_dtype, tid2eid, (int)tid_dtype, k, n_experts, scaling, shared, n);
        LAUNCH_CHECK();
    };
    if (n_experts <= 64 && k <= 32) return warp(std::integral_constant<int, 2>{});
    if (n_experts <= 256 && k <= 32) return warp(std::integral_constant<int, 8>{});
    if (n_experts <= 512 && k <= 32) return warp(std::integral_constant<int, 16>{});
    launch_k(route_kernel, n, 128, 2 * (size_t)n_experts * sizeof(float), td_cuda_stream(), picks,
             weights, logits, ids, score_fn, bias, bias_dtype, tid2eid, tid_dtype, k, n_experts,
             scaling, shared);
    LAUNCH_CHECK();
}

/* ---------------------------------------------------------------------------------------------
 * Routed experts as grouped GEMMs: (1) one block groups the (row, pick) entries by expert and
 * lays out 16-row tiles, each inside one expert; (2) an up GEMM over all tiles at once computes
 * h = silu(clamp(x.w1)) * clamp(x.w3) for every entry (rows gathered from x through the
 * permutation); (3) a down GEMM gives y = h.w2; (4) each row adds its entries' y * weight in
 * ascending expert order. Every output's dot product runs over k in a fixed order inside its
 * tile, so a row's result does not depend on which rows share its tile or its batch. */

#define MOE_MAX_K         31 /* expert picks a row (the limit the launcher has always checked) */
#define TM                16
#define MOE_GROUP_THREADS 256

/* a context's (cuda_ctx.h): the grouping's and the tiles' buffers (ensure_grouped: grown, never
 * freed while it lives: a captured graph keeps the addresses it was captured with), and
 * batch-invariant mode (every step takes the fp32 tiles) */
struct moe_state {
    int32_t *perm, *ord_pos, *tiles, *ntiles;
    float *ord_w, *h, *y;
    int entries, experts, inter, dim;
    uint4 *xt; /* x's terms for XS 2: MOE_MMA_ENTRIES rows of the widest K */
    int deterministic;
};

static void moe_release(void *p) {
    struct moe_state *m = (struct moe_state *)p;
    cudaFree(m->perm), cudaFree(m->ord_pos), cudaFree(m->tiles), cudaFree(m->ntiles);
    cudaFree(m->ord_w), cudaFree(m->h), cudaFree(m->y), cudaFree(m->xt);
}

static struct moe_state &me(void) {
    return td_cuda_ctx_state<struct moe_state>(TD_CTX_MOE, moe_release);
}

extern "C" void moe_cuda_set_deterministic(int on) {
    me().deterministic = on;
}

__global__ void moe_group_kernel(const int32_t *picks, const float *weights,
                                 const unsigned char *own, int m, int k, int E, int tm,
                                 int32_t *perm, int32_t *ord_pos, float *ord_w, int32_t *tiles,
                                 int32_t *n_tiles) {
    PDL_START();
    extern __shared__ int sh[]; // count[E], off[E + 1], cur[E]
    int *count = sh, *off = sh + E, *cur = sh + 2 * E + 1;
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        count[e] = 0, cur[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < m; i += blockDim.x)
        atomicAdd(&count[picks[i]], 1);
    __syncthreads();
    // offsets and tiles in ascending expert order: each thread a run of experts, then a scan
    // of the runs (one thread walking all 256 experts of the Flash slice took 15 us a call)
    int tid = threadIdx.x, per = (E + blockDim.x - 1) / blockDim.x;
    int e0 = tid * per < E ? tid * per : E, e1 = e0 + per < E ? e0 + per : E, c = 0, nt = 0;
    // (a split model's rank tiles only its own experts: the others' entries keep their places
    // and are never computed, so the tiles of the rest are the one-rank step's)
    for (int e = e0; e < e1; e++)
        c += count[e], nt += own && !own[e] ? 0 : (count[e] + tm - 1) / tm;
    int total, o = block_excl_scan(c, &total), t = block_excl_scan(nt, &total);
    for (int e = e0; e < e1; e++) {
        off[e] = o;
        for (int r = 0; r < (own && !own[e] ? 0 : count[e]); r += tm, t++) { // expert, first, rows
            tiles[3 * t] = e;
            tiles[3 * t + 1] = o + r;
            tiles[3 * t + 2] = count[e] - r < tm ? count[e] - r : tm;
        }
        o += count[e];
    }
    if (tid == (int)blockDim.x - 1) off[E] = o, *n_tiles = t;
    __syncthreads();
    // where an entry lands inside its expert does not change any result (rows are independent).
    // The combine's order: entry i is its row's rank-th in ascending expert, then pick position
    for (int i = threadIdx.x; i < m; i += blockDim.x) {
        int e = picks[i], p = off[e] + atomicAdd(&cur[e], 1);
        perm[p] = i;
        const int32_t *row = picks + i / k * k;
        int j = i % k, rank = 0;
        for (int u = 0; u < k; u++)
            rank += row[u] < e || (row[u] == e && u < j);
        ord_pos[i - j + rank] = p;
        ord_w[i - j + rank] = weights ? weights[i] : 0.0f; // (none: the slots' form)
    }
}

/* out[p, 0..N) for the tiles' entries: up (swiglu = 1, x rows gathered by perm / k) or down.
 * One warp per output feature: its lanes stride the weight row (lane l reads k = k0 + 32 j + l,
 * eight independent coalesced loads per step; 16-byte loads of 8 consecutive elements per lane
 * were measured slower on the Flash slice: 1074 -> 815 tokens/s at batch 64), every row of the
 * tile accumulates in registers, then a fixed butterfly. The order of each sum depends on K alone:
 * a row's result does not depend on which rows share its tile or its batch. The grid has one block
 * row per tile the step can have at most: min(entries, entries / 16 + experts + 1); a grid sized by
 * the second alone spent most of a Flash-sized decode step's expert time starting blocks that
 * had nothing to do (257 rows for 6 tiles). Rows past the step's tiles return at once. */
#define MOE_FEATS 8 /* output features (warps) per block */

/* Tiles of up to TM rows hold 16 accumulators per row in registers, which at 16 rows left room
 * for two blocks per multiprocessor: too few loads in flight for a batch-1 step, whose every
 * tile has one row (expert read at 1.07 TB/s on the Flash slice). Steps of at most
 * MOE_SMALL_ENTRIES entries use tiles of TM_SMALL rows, with twice the loads per lane in flight.
 * A lane visits k = lane, lane + 32, ... in the same order with either, so every sum, and a
 * row's result, is the same whatever tile it lands in. */
#define TM_SMALL          4
#define MOE_SMALL_ENTRIES 64

/* Bf16 experts take the tensor-core tiles (moe_mma) in steps of up to MOE_MMA_ENTRIES entries
 * too, and the shared expert is folded into them there: at batch 64 (448 entries) the fp32
 * tiles read the Flash slice's experts at 0.97 TB/s, 9.8 of the step's 12.2 ms (Nsight
 * Compute). Wider steps (prefill) keep the fp32 tiles and the shared expert's own GEMMs, whose
 * 8-row tensor-core tiles would re-read every expert once per 8 of its rows. */
#define MOE_MMA_ENTRIES 1024

/* weight (n, k) of an expert's [N, K] matrix: T one of the float types, or a packed Q8 / Q4
 * matrix (quant.cuh) when T is uint8_t and dt says which */
template <typename T>
__device__ __forceinline__ float moe_w(const T *w, int dt, int N, int K, int n, int k) {
    if constexpr (std::is_same<T, uint8_t>::value)
        return ldw_f32(w, dt, N, K, n, k);
    else
        return as_f32(w[(long long)n * K + k]);
}

template <typename T, int TMR, int J>
__device__ __forceinline__ void
moe_tile(float *out, const float *in, const int32_t *perm, int k_per_row, int swiglu, const T *w1,
         const T *w3, int dt, int p0, int rows, int n, int K, int N, float limit) {
    int lane = threadIdx.x & 31;
    const float *xr[TMR];
#pragma unroll
    for (int r = 0; r < TMR; r++) {
        int p = p0 + (r < rows ? r : 0);
        xr[r] = swiglu ? in + (size_t)(perm[p] / k_per_row) * K : in + (size_t)p * K;
    }
    float a1[TMR], a3[TMR];
#pragma unroll
    for (int r = 0; r < TMR; r++)
        a1[r] = a3[r] = 0.0f;
    for (int k0 = 0; k0 < K; k0 += 32 * J) {
        float v1[J], v3[J];
#pragma unroll
        for (int j = 0; j < J; j++) {
            int k = k0 + 32 * j + lane;
            v1[j] = k < K ? moe_w(w1, dt, N, K, n, k) : 0.0f;
            v3[j] = swiglu && k < K ? moe_w(w3, dt, N, K, n, k) : 0.0f;
        }
#pragma unroll
        for (int r = 0; r < TMR; r++) {
            if (r >= rows) break;
#pragma unroll
            for (int j = 0; j < J; j++) {
                int k = k0 + 32 * j + lane;
                float xv = k < K ? xr[r][k] : 0.0f;
                a1[r] += xv * v1[j];
                a3[r] += xv * v3[j];
            }
        }
    }
#pragma unroll
    for (int r = 0; r < TMR; r++) {
        if (r >= rows) break;
        float g = warp_sum(a1[r]), u = warp_sum(a3[r]);
        if (lane) continue;
        out[(size_t)(p0 + r) * N + n] = swiglu ? swiglu_clamped(g, u, limit) : g;
    }
}

template <typename T, int TMR, int J>
__global__ void moe_gemm_kernel(float *out, const float *in, const int32_t *perm, int k_per_row,
                                int swiglu, const int32_t *tiles, const int32_t *n_tiles,
                                struct expert_set ex, int K, int N, float limit) {
    PDL_START();
    int n = blockIdx.x * MOE_FEATS + (threadIdx.x >> 5);
    if (n >= N) return;
    for (int tile = blockIdx.y; tile < *n_tiles; tile += gridDim.y) {
        int e = tiles[3 * tile], p0 = tiles[3 * tile + 1], rows = tiles[3 * tile + 2];
        const T *w1 = (const T *)(swiglu ? ex.w1[e] : ex.w2[e]), *w3 = (const T *)ex.w3[e];
        moe_tile<T, TMR, J>(out, in, perm, k_per_row, swiglu, w1, w3, ex.dtype, p0, rows, n, K, N,
                            limit);
    }
}

template <typename T>
static void moe_gemm_t(dim3 grid, cudaStream_t s, int tm, float *out, const float *in, int swiglu,
                       int k, const struct expert_set *ex, int K, int N, float limit) {
    if (tm == TM_SMALL)
        launch_k(moe_gemm_kernel<T, TM_SMALL, 16>, grid, 32 * MOE_FEATS, 0, s, out, in, me().perm,
                 k, swiglu, me().tiles, me().ntiles, *ex, K, N, limit);
    else
        launch_k(moe_gemm_kernel<T, TM, 8>, grid, 32 * MOE_FEATS, 0, s, out, in, me().perm, k,
                 swiglu, me().tiles, me().ntiles, *ex, K, N, limit);
    LAUNCH_CHECK();
}

static void moe_gemm(dim3 grid, cudaStream_t s, int tm, float *out, const float *in, int swiglu,
                     int k, const struct expert_set *ex, int K, int N, float limit) {
    switch (ex->dtype) {
    case TD_DTYPE_BF16:
        moe_gemm_t<__nv_bfloat16>(grid, s, tm, out, in, swiglu, k, ex, K, N, limit);
        break;
    case TD_DTYPE_F16: moe_gemm_t<__half>(grid, s, tm, out, in, swiglu, k, ex, K, N, limit); break;
    case TD_DTYPE_Q8:
    case TD_DTYPE_Q4: moe_gemm_t<uint8_t>(grid, s, tm, out, in, swiglu, k, ex, K, N, limit); break;
    default: moe_gemm_t<float>(grid, s, tm, out, in, swiglu, k, ex, K, N, limit);
    }
}

/* The same tiles on tensor cores (mma_tile.cuh), for steps of at most MOE_MMA_ENTRIES entries
 * (quantized experts: every step) outside batch-invariant mode: tiles of up to 8 rows, 16 features
 * a block, KW warps splitting K. The up projection makes the gate (w1) and up (w3) tiles of the
 * same rows and features and applies the SwiGLU in registers. At batch 1 the fp32 form read the
 * Flash slice's experts at about 2.4 TB/s. */
#define MOE_MMA_KW 4
#define MOE_XS_MAX (32u << 10) /* x rows staged in shared memory up to this */

template <int F, bool VEC, bool WIDE, int XS>
__device__ __forceinline__ void moe_mma_tiles(float *out, const float *in, const int32_t *perm,
                                              int k_per_row, int swiglu, const int32_t *tiles,
                                              const int32_t *n_tiles, const struct expert_set &ex,
                                              int K, int N, float limit, const uint4 *xt) {
    PDL_START();
    extern __shared__ uint4 xs[]; // XS 1: the tile's x rows split once (xs_stage_rows)
    __shared__ float part[MOE_MMA_KW - 1][32][4];
    // the down projection of a width that is a multiple of 32 takes two tiles of 16 features
    // a block (pair), as two matrices 16 rows apart: a warp's loads of both in flight at once,
    // as the up projection has its gate and up rows (Flash slice, batch 1: 42.5 us a call
    // with one tile, at 2.8 TB/s, against the up projection's 3.6)
    int pair = !swiglu && N % 32 == 0;
    int g = (threadIdx.x & 31) >> 2, o0 = blockIdx.x * (pair ? 32 : 16);
    for (int tile = blockIdx.y; tile < *n_tiles; tile += gridDim.y) {
        int e = tiles[3 * tile], p0 = tiles[3 * tile + 1], rows = tiles[3 * tile + 2];
        bool live = g < rows;
        int p = p0 + (live ? g : 0);
        size_t xrow = swiglu ? (size_t)(perm[p] / k_per_row) : (size_t)p;
        const float *xr = in + xrow * K;
        const uint4 *xb = XS == 2 ? xt + xrow * (K / 4) : xs; // XS 2: the row's terms (K / 8 x 2)
        if constexpr (XS == 1) {
            __syncthreads(); // the tile before has read its rows
            auto row = [&](int r) {
                return swiglu ? in + (size_t)(perm[p0 + r] / k_per_row) * K
                              : in + (size_t)(p0 + r) * K;
            };
            xs_stage_rows<F>(xs, row, rows, K);
        }
        float c[2][4];
        struct wmat w[2];
        if (swiglu) {
            w[0] = wmat_of(ex.w1[e], ex.dtype, N, K, 0);
            w[1] = wmat_of(ex.w3[e], ex.dtype, N, K, 0);
        } else { // the pair's second tile: the rows 16 further
            w[0] = w[1] = wmat_of(ex.w2[e], ex.dtype, N, K, 0);
            w[1].row0 = 16;
        }
        // two matrices' rows together (gate and up, or the pair's two tiles): their loads in
        // flight at once
        if (swiglu || pair)
            mma_rows<F, VEC, MOE_MMA_KW, 1, 2, WIDE, XS>(c, xr, live, w, o0, N, K, threadIdx.x >> 5,
                                                         MOE_MMA_KW, false, xb, rows);
        else
            mma_rows<F, VEC, MOE_MMA_KW, 1, 1, WIDE, XS>(c, xr, live, w, o0, N, K, threadIdx.x >> 5,
                                                         MOE_MMA_KW, false, xb, rows);
        bool w0 = kw_sum<MOE_MMA_KW>(c[0], part);
        if (swiglu || pair) kw_sum<MOE_MMA_KW>(c[1], part);
        if (!w0) continue;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int o = o0 + mma_feature(j), r = mma_row(j);
            if (o < N && r < rows) {
                float *y = out + (size_t)(p0 + r) * N + o;
                if (swiglu)
                    *y = swiglu_clamped(c[0][j], c[1][j], limit);
                else
                    *y = c[0][j];
                if (pair) y[16] = c[1][j];
            }
        }
    }
}

#define MOE_MMA_ARGS                                                                               \
    float *out, const float *in, const int32_t *perm, int k_per_row, int swiglu,                   \
        const int32_t *tiles, const int32_t *n_tiles, struct expert_set ex, int K, int N,          \
        float limit, const uint4 *xt
template <int F, bool VEC, bool WIDE, int XS>
__global__ void __launch_bounds__(32 * MOE_MMA_KW) moe_mma_kernel(MOE_MMA_ARGS) {
    moe_mma_tiles<F, VEC, WIDE, XS>(out, in, perm, k_per_row, swiglu, tiles, n_tiles, ex, K, N,
                                    limit, xt);
}
/* FP4's XS 2 tiles compiled for 5 blocks a multiprocessor (96 registers, 4 bytes spilled,
 * against 125 and 4 blocks): the released slice's batch-64 expert calls took 4552 against 4686
 * us (session 31, H100, Nsight Compute). The bf16 tiles spill 68 bytes at 96 registers and lost
 * a fifth of the BF16 slice's batch-64 rate (3390 -> 2719 tokens/s); FP8's spill 160. */
template <int F>
__global__ void __launch_bounds__(32 * MOE_MMA_KW, 5) moe_mma_occ_kernel(MOE_MMA_ARGS) {
    moe_mma_tiles<F, true, false, 2>(out, in, perm, k_per_row, swiglu, tiles, n_tiles, ex, K, N,
                                     limit, xt);
}

/* x's B terms made once for the step's rows (XS 2): thread i makes group i % (K / 8) of row
 * i / (K / 8), as x_split and xs_stage_rows make them (the same terms, so the same bits) */
template <int F> __global__ void moe_terms_kernel(uint4 *t, const float *x, int groups) {
    PDL_START();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < groups) x_terms8<F>(t + 2 * (size_t)i, x + (size_t)i * 8);
}

/* rows: the most x rows a tile has (a step's rows, at most 8); xrows: the rows of in (the
 * step's rows for the up projection, its entries for the down one). The tile's x rows are
 * staged in shared memory (XS 1, mma_tile.cuh: split into their bf16 terms once for the block,
 * not once a lane for each of its rows) when they fit: at batch 1 on the released-precision
 * Flash slice the step's 8 expert calls took 278 us against 403 (Nsight Compute). Where they do
 * not (more rows, or deeper x), a step of at most MOE_MMA_ENTRIES entries makes every row's
 * terms once before the tiles (XS 2, moe_terms_kernel) for its lanes to load, where they split
 * x themselves, about 32 instructions a group of 8 values beside about 80 for the weights:
 * the released slice's batch-64 expert calls took 4552 us for 6.31 GB (1.39 TB/s) against
 * 6449 for 6.88 GB (1.07; session 31 against 30, H100, Nsight Compute, with the one-multiply
 * decode of quant_one), and it decoded 5230 tokens/s against 4352. The skinny GEMM does not stage:
 * one tile a block, and its Q8 calls were no faster (460 against 463 us). */
static void moe_mma(bool vec, int rows, int xrows, dim3 grid, cudaStream_t s, float *out,
                    const float *in, int swiglu, int k, const struct expert_set *ex, int K, int N,
                    float limit) {
    int tr = rows < 8 ? rows : 8;
    size_t smem = xs_bytes(tr, K);
    int xs = !vec ? 0 : smem <= MOE_XS_MAX ? 1 : xrows <= MOE_MMA_ENTRIES ? 2 : 0;
    auto go = [&](auto kern) {
        launch_k(kern, grid, 32 * MOE_MMA_KW, xs == 1 ? smem : 0, s, out, in, me().perm, k, swiglu,
                 me().tiles, me().ntiles, *ex, K, N, limit, (const uint4 *)me().xt);
        LAUNCH_CHECK();
    };
    auto by_x = [&](auto f, auto v) {
        constexpr int F = decltype(f)::value;
        constexpr bool V = decltype(v)::value;
        if constexpr (V) {
            if (xs == 2) {
                int groups = xrows * (K / 8);
                launch_k(moe_terms_kernel<F>, ceil_div(groups, 256), 256, 0, s, me().xt, in,
                         groups);
                LAUNCH_CHECK();
                if constexpr (F == WF_Q4)
                    go(moe_mma_occ_kernel<F>);
                else
                    go(moe_mma_kernel<F, V, false, 2>);
            } else if (xs == 1)
                go(moe_mma_kernel<F, V, false, 1>);
            else
                go(moe_mma_kernel<F, V, false, 0>);
        } else
            go(moe_mma_kernel<F, V, false, 0>);
    };
    auto by_v = [&](auto f) { vec ? by_x(f, std::true_type{}) : by_x(f, std::false_type{}); };
    // quantized experts load 8 weights a lane (mma_rows' narrow form): 16-byte loads, as the
    // skinny GEMM makes them, took the Flash slice's batch-1 decode from 746 to 659 tokens/s
    // (two matrices a tile: twice the registers)
    if (ex->dtype == TD_DTYPE_Q4)
        by_v(std::integral_constant<int, WF_Q4>{});
    else if (ex->dtype == TD_DTYPE_Q8)
        by_v(std::integral_constant<int, WF_Q8>{});
    else
        by_v(std::integral_constant<int, WF_BF16>{});
}

/* Wide steps (past MOE_MMA_ENTRIES entries: prefill) of bf16, FP8 and FP4 experts (the latter
 * decoded to bf16 into the tiles' shared memory, exactly; gemm_tile.cuh): an expert's entries meet
 * its weights in tiles of up to 128, so the tensor cores' arithmetic bounds the step and block
 * tiles of 128 entries x 128 weight rows (gemm_tile.cuh) replace the 8-row tiles, which read an
 * expert's weights once for every 8 of its entries. The Flash slice's 4096-token prefill spent
 * 834.7 of its 1023.1 ms in the fp32 tiles these replace (Nsight Compute, H100, session 32).
 * x and h enter as bf16 (the dense GEMMs of such steps round x so for cuBLASLt too; the
 * reference casts h so before w2): x's copy xb lives in y's memory (the up projection reads
 * it before the down one writes y there), h in h's (moe_state). The up projection's tile rows
 * interleave gate and up rows 32 at a time, so a warp holds both of its 32 features and applies the
 * SwiGLU in registers. A row's sums do not depend on the rows beside it. */
/* Quantized experts take the block tiles where a step's entries average at least this many an
 * expert (a 4096-token prefill of the Flash slice: 96; a 512-row prompt chunk: 12; a batch-64
 * DSpark verify step: 9; a 256-row chunk: 6). Session 38 (H100, released slice, a 32k prompt):
 * in chunks of 512, from 8 entries 1.267 s, from 32 (the 8-row tiles, each expert's weights
 * decoded once per 8 of its entries) 1.767 s; in chunks of 256, from 4 1.909 s, from 8 2.194 s
 * (a 256-row step's experts 7.59 ms in the block tiles against 10.37 in the 8-row ones, Nsight
 * Compute). Steps of at most MOE_MMA_ENTRIES entries keep the 8-row tiles whatever this is. */
#define MOE_WIDE_PER_EXPERT 4
/* the entries an expert averages from which quantized experts take the block tiles
 * (TD_MOE_WIDE=N: N instead, read at start-up; A/B of the bound) */
static int wide_per_expert = MOE_WIDE_PER_EXPERT;

__global__ void moe_bf16_kernel(__nv_bfloat16 *y, const float *x, long long n8) {
    PDL_START();
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= n8) return;
    float4 a = ((const float4 *)x)[2 * i], b = ((const float4 *)x)[2 * i + 1];
    ((uint4 *)y)[i] = make_uint4(pack_bf16(a.x, a.y), pack_bf16(a.z, a.w), pack_bf16(b.x, b.y),
                                 pack_bf16(b.z, b.w));
}

template <int F, int BM>
__global__ void __launch_bounds__(GT_THREADS)
    moe_wide_kernel(void *out, const __nv_bfloat16 *in, const int32_t *perm, int k_per_row,
                    int swiglu, const int32_t *tiles, const int32_t *n_tiles, struct expert_set ex,
                    int K, int N, float limit) {
    PDL_START();
    extern __shared__ __align__(16) unsigned char smb[];
    struct gt_smem<BM> &sm = *(struct gt_smem<BM> *)smb;
    int tile = blockIdx.y;
    if (tile >= *n_tiles) return;
    int e = tiles[3 * tile], p0 = tiles[3 * tile + 1], rows = tiles[3 * tile + 2];
    const __nv_bfloat16 *w1 = (const __nv_bfloat16 *)(swiglu ? ex.w1[e] : ex.w2[e]),
                        *w3 = (const __nv_bfloat16 *)ex.w3[e];
    int f0 = blockIdx.x * (swiglu ? GT_BN / 2 : GT_BN);
    struct gt_src<BM> src;
    gt_sources(
        &src,
        [&](int r) -> const __nv_bfloat16 * {
            if (r >= rows) return NULL;
            int p = p0 + r;
            return in + (size_t)(swiglu ? perm[p] / k_per_row : p) * K;
        },
        [&](int r) -> const __nv_bfloat16 * { // (up: 32 gate rows, their 32 up rows, twice)
            int f = swiglu ? f0 + (r >> 6) * 32 + (r & 31) : f0 + r;
            if (f >= N) return NULL;
            return (swiglu && (r & 32) ? w3 : w1) + (size_t)f * K;
        },
        w1);
    gt_qb<F> q;
    if constexpr (F != WF_BF16) { // this thread's row of the tile, as row_b lays them out
        int r = threadIdx.x, f = swiglu ? f0 + (r >> 6) * 32 + (r & 31) : f0 + r;
        q.m = wmat_of(swiglu && (r & 32) ? ex.w3[e]
                      : swiglu           ? ex.w1[e]
                                         : ex.w2[e],
                      (enum td_dtype)ex.dtype, N, K, 0);
        q.row = f < N ? f : -1;
    }
    float c[gt_mi<BM>][8][4];
    gt_tile<F, BM>(c, &sm, &src, q, K);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mi = 0; mi < gt_mi<BM>; mi++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) { // rows g and g + 8 of the 16
            int r = (w & 1) * (BM / 2) + 16 * mi + 8 * hf + g;
            if (r >= rows) continue;
            size_t p = (size_t)(p0 + r);
            if (swiglu) {
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    int f = f0 + (w >> 1) * 32 + 8 * j + 2 * t; // N % 8 == 0: f + 1 < N too
                    if (f >= N) continue;
                    float h0 = swiglu_clamped(c[mi][j][2 * hf], c[mi][j + 4][2 * hf], limit),
                          h1 =
                              swiglu_clamped(c[mi][j][2 * hf + 1], c[mi][j + 4][2 * hf + 1], limit);
                    *(unsigned *)((__nv_bfloat16 *)out + p * N + f) = pack_bf16(h0, h1);
                }
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    int f = f0 + (w >> 1) * 64 + 8 * j + 2 * t;
                    if (f < N)
                        *(float2 *)((float *)out + p * N + f) =
                            make_float2(c[mi][j][2 * hf], c[mi][j][2 * hf + 1]);
                }
            }
        }
}

/* moe_wide_kernel's tile on wgmma (wgmma_tile.cuh): bf16 or Q4 experts, tiles of 64 or 128
 * entries, the same outputs in the same places */
template <int F, int BM>
__global__ void __launch_bounds__(WG_THREADS, 2)
    moe_wg_kernel(void *out, const __nv_bfloat16 *in, const int32_t *perm, int k_per_row,
                  int swiglu, const int32_t *tiles, const int32_t *n_tiles, struct expert_set ex,
                  int K, int N, float limit) {
    PDL_START();
    extern __shared__ __align__(16) unsigned char smb[];
    struct wg_smem<BM> *sm = (struct wg_smem<BM> *)wg_align(smb);
    int tile = blockIdx.y;
    if (tile >= *n_tiles) return;
    int e = tiles[3 * tile], p0 = tiles[3 * tile + 1], rows = tiles[3 * tile + 2];
    const void *w1 = swiglu ? ex.w1[e] : ex.w2[e], *w3 = ex.w3[e];
    int f0 = blockIdx.x * (swiglu ? WG_BN / 2 : WG_BN), tid = threadIdx.x;
    // B row r: the up projection's 32 gate rows, their 32 up rows, twice; the down one's in order
    int f = swiglu ? f0 + (tid >> 6) * 32 + (tid & 31) : f0 + tid;
    const void *wr = swiglu && (tid & 32) ? w3 : w1;
    for (int r = tid; r < BM; r += WG_THREADS)
        sm->arow[r] =
            r < rows ? in + (size_t)(swiglu ? perm[p0 + r] / k_per_row : p0 + r) * K : NULL;
    gt_qb<F> q;
    if constexpr (F == WF_BF16)
        sm->brow[tid] = f < N ? (const __nv_bfloat16 *)wr + (size_t)f * K : NULL;
    else
        q.m = wmat_of(wr, (enum td_dtype)ex.dtype, N, K, 0), q.row = f < N ? f : -1;
    __syncthreads();
    float c[BM / 64][64];
    wg_tile<F, BM>(c, sm, q, K, w1);
    int lane = tid & 31, w = tid >> 5, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mb = 0; mb < BM / 64; mb++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int r = 64 * mb + 16 * w + 8 * h + g;
            if (r >= rows) continue;
            size_t p = (size_t)(p0 + r);
            if (swiglu) {
#pragma unroll
                for (int jj = 0; jj < 8; jj++) { // gate block j, its up block j + 4
                    int j = (jj & 3) + (jj >> 2) * 8,
                        o = f0 + (jj >> 2) * 32 + 8 * (jj & 3) + 2 * t;
                    if (o >= N) continue; // N % 8 == 0: o + 1 < N too
                    float h0 = swiglu_clamped(c[mb][4 * j + 2 * h], c[mb][4 * j + 16 + 2 * h],
                                              limit),
                          h1 = swiglu_clamped(c[mb][4 * j + 2 * h + 1], c[mb][4 * j + 17 + 2 * h],
                                              limit);
                    *(unsigned *)((__nv_bfloat16 *)out + p * N + o) = pack_bf16(h0, h1);
                }
            } else {
#pragma unroll
                for (int j = 0; j < 16; j++) {
                    int o = f0 + 8 * j + 2 * t;
                    if (o < N)
                        *(float2 *)((float *)out + p * N + o) =
                            make_float2(c[mb][4 * j + 2 * h], c[mb][4 * j + 2 * h + 1]);
                }
            }
        }
}

/* FP4 experts' block tiles with the weights in registers (wgmma_tile.cuh wr_tile): the same
 * outputs in the same places as moe_wg_kernel's. The up projection's A rows pair each feature's
 * gate row (g) with its up row (g + 8), so a thread holds both of every output it writes: a
 * block's 64 features are 32 a warpgroup, 8 a warp. */
template <int BM>
__global__ void __launch_bounds__(WR_THREADS, 1)
    moe_wr_kernel(void *out, const __nv_bfloat16 *in, const int32_t *perm, int k_per_row,
                  int swiglu, const int32_t *tiles, const int32_t *n_tiles, struct expert_set ex,
                  int K, int N, float limit) {
    PDL_START();
    extern __shared__ __align__(16) unsigned char smb[];
    struct wr_smem<BM> *sm = (struct wr_smem<BM> *)wg_align(smb);
    int tile = blockIdx.y;
    if (tile >= *n_tiles) return;
    int e = tiles[3 * tile], p0 = tiles[3 * tile + 1], rows = tiles[3 * tile + 2];
    int tid = threadIdx.x, wgi = tid >> 7, w = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2,
        t = lane & 3;
    for (int r = tid; r < BM; r += WR_THREADS)
        sm->xrow[r] =
            r < rows ? in + (size_t)(swiglu ? perm[p0 + r] / k_per_row : p0 + r) * K : NULL;
    // the thread's weight rows: up, feature f's gate and up rows; down, features f and f + 8
    int f =
        swiglu ? blockIdx.x * 64 + 32 * wgi + 8 * w + g : blockIdx.x * 128 + 64 * wgi + 16 * w + g;
    int fb = swiglu ? f : f + 8;
    struct wmat ma = wmat_of(swiglu ? ex.w1[e] : ex.w2[e], TD_DTYPE_Q4, N, K, 0),
                mb = swiglu ? wmat_of(ex.w3[e], TD_DTYPE_Q4, N, K, 0) : ma;
    bool oa = f < N, ob = fb < N;
    const uint8_t *ca = (const uint8_t *)ma.p + (size_t)(oa ? f : 0) * (K / 2),
                  *cb = (const uint8_t *)mb.p + (size_t)(ob ? fb : 0) * (K / 2),
                  *sa = ma.s + (size_t)(oa ? f : 0) * ma.srow,
                  *sb = mb.s + (size_t)(ob ? fb : 0) * mb.srow;
    __syncthreads();
    float c[BM / 64][32];
    wr_tile<BM>(c, sm, ca, sa, oa, cb, sb, ob, K, ma.p);
#pragma unroll
    for (int nb = 0; nb < BM / 64; nb++)
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int q = 0; q < 2; q++) {
                int r = 64 * nb + 8 * j + 2 * t + q;
                if (r >= rows) continue;
                size_t p = (size_t)(p0 + r);
                if (swiglu) {
                    if (oa) {
                        __nv_bfloat16 h = __float2bfloat16_rn(
                            swiglu_clamped(c[nb][4 * j + q], c[nb][4 * j + 2 + q], limit));
                        ((__nv_bfloat16 *)out)[p * N + f] = h;
                    }
                } else {
                    if (oa) ((float *)out)[p * N + f] = c[nb][4 * j + q];
                    if (ob) ((float *)out)[p * N + fb] = c[nb][4 * j + 2 + q];
                }
            }
}

/* out[t, c] = the row's entries' y[p, c] * weight, in ascending expert order (the reference's;
 * the group kernel laid the row's positions and weights out in it): every load first, then the
 * sum. A selection of the next expert inside the loop of dependent loads took 7.7 us a call on
 * the Flash slice at batch 1. */
#define COMBINE_BATCH 8
__global__ void moe_combine_kernel(float *out, const float *y, const int32_t *ord_pos,
                                   const float *ord_w, int n, int k, int d) {
    PDL_START();
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= (long long)n * d) return;
    int t = (int)(i / d), c = (int)(i % d);
    const int32_t *pos = ord_pos + (size_t)t * k;
    const float *w = ord_w + (size_t)t * k;
    float acc = 0.0f;
    for (int r0 = 0; r0 < k; r0 += COMBINE_BATCH) {
        float v[COMBINE_BATCH], wt[COMBINE_BATCH];
#pragma unroll
        for (int u = 0; u < COMBINE_BATCH; u++) {
            bool in = r0 + u < k;
            v[u] = in ? y[(size_t)pos[r0 + u] * d + c] : 0.0f;
            wt[u] = in ? w[r0 + u] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < COMBINE_BATCH; u++)
            if (r0 + u < k) acc += v[u] * wt[u];
    }
    out[i] = acc;
}

static void ensure_grouped(int entries, int experts, int inter, int dim) {
    if (entries <= me().entries && experts <= me().experts && inter <= me().inter &&
        dim <= me().dim)
        return;
    // grow only, and never free: a captured graph keeps the addresses it was captured with
    me().entries = entries > me().entries ? entries : me().entries;
    me().experts = experts > me().experts ? experts : me().experts;
    me().inter = inter > me().inter ? inter : me().inter;
    me().dim = dim > me().dim ? dim : me().dim;
    int max_tiles = me().entries / TM_SMALL + me().experts + 1;
    CUDA_CHECK(cudaMalloc(&me().perm, (size_t)me().entries * sizeof(int32_t)));
    CUDA_CHECK(cudaMalloc(&me().ord_pos, (size_t)me().entries * sizeof(int32_t)));
    CUDA_CHECK(cudaMalloc(&me().ord_w, (size_t)me().entries * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&me().tiles, (size_t)max_tiles * 3 * sizeof(int32_t)));
    CUDA_CHECK(cudaMalloc(&me().ntiles, sizeof(int32_t)));
    CUDA_CHECK(cudaMalloc(&me().h, (size_t)me().entries * me().inter * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&me().y, (size_t)me().entries * me().dim * sizeof(float)));
    size_t xt_rows = me().entries < MOE_MMA_ENTRIES ? me().entries : MOE_MMA_ENTRIES;
    CUDA_CHECK(cudaMalloc(&me().xt, xt_rows * (me().dim > me().inter ? me().dim : me().inter) * 4));
}

/* f(F, BM) for the wide form of experts in format dtype with tiles of BM entries */
template <typename G> static void by_wide(int dtype, int bm, G &&g) {
    auto h = [&](auto f) {
        if (bm == 32)
            g(f, std::integral_constant<int, 32>{});
        else if (bm == 64)
            g(f, std::integral_constant<int, 64>{});
        else
            g(f, std::integral_constant<int, 128>{});
    };
    if (dtype == TD_DTYPE_Q4)
        h(std::integral_constant<int, WF_Q4>{});
    else if (dtype == TD_DTYPE_Q8)
        h(std::integral_constant<int, WF_Q8>{});
    else
        h(std::integral_constant<int, WF_BF16>{});
}

/* bf16 and Q4 experts' block tiles on wgmma (moe_wg_kernel; 0: moe_wide_kernel's mma.sync; 2:
 * Q4 projections of K % 128 == 0 with the weights in registers, moe_wr_kernel; TD_MOE_WGMMA=0|1|2
 * at start-up, moe_cuda_set_wgmma) */
#define MOE_WGMMA 1
static int wg_start = MOE_WGMMA, wg_on = MOE_WGMMA;
static int wg_mode(int v) { // a mode asked for, as one of 0, 1, 2
    return v < 0 ? 0 : v > 2 ? 2 : v;
}

/* the block tiles' dynamic shared memory (51 to 80 KB), once: at start-up (outside any capture),
 * and at the first wide step of a caller that made no reservation (the GPU tests) */
static void wide_allow(void) {
    static bool done;
    if (done) return;
    const char *qa = getenv("TD_Q4_ASYNC"), *pe = getenv("TD_MOE_WIDE");
    if (qa && *qa) moe_cuda_set_q4_async(atoi(qa) != 0);
    if (pe && atoi(pe) > 0) wide_per_expert = atoi(pe);
    const char *wg = getenv("TD_MOE_WGMMA");
    if (wg && *wg) wg_start = wg_on = wg_mode(atoi(wg));
    for (int dt : {TD_DTYPE_BF16, TD_DTYPE_Q8, TD_DTYPE_Q4})
        for (int bm = 32; bm <= 128; bm *= 2)
            by_wide(dt, bm, [&](auto f, auto b) {
                constexpr int F = decltype(f)::value, BM = decltype(b)::value;
                CUDA_CHECK(cudaFuncSetAttribute(moe_wide_kernel<F, BM>,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                (int)sizeof(struct gt_smem<BM>)));
                if constexpr (F != WF_Q8 && BM >= 64)
                    CUDA_CHECK(cudaFuncSetAttribute(moe_wg_kernel<F, BM>,
                                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                    (int)wg_smem_bytes<BM>));
                if constexpr (F == WF_Q4 && BM >= 64)
                    CUDA_CHECK(cudaFuncSetAttribute(moe_wr_kernel<BM>,
                                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                    (int)wr_smem_bytes<BM>));
            });
    done = true;
}

/* The block tiles' height: the least of 32, 64 and 128 that holds an expert's mean entries with
 * a quarter to spare, else 128. An expert's weights are read once a tile and every tile does
 * its full height's arithmetic: a 4096-token prefill of the Flash slice (96 entries an expert)
 * reads them once in tiles of 128, where tiles of 64 read them about 1.4 times; a 512-row chunk
 * (12) in tiles of 128 did 10 times the arithmetic its rows need. A row's bits do not depend
 * on the height (gemm_tile.cuh). */
static int wide_forced; /* moe_cuda_set_wide_height */

extern "C" void moe_cuda_set_wide_height(int bm) {
    wide_forced = bm;
}

extern "C" void moe_cuda_set_wgmma(int on) {
    wide_allow();
    wg_on = on < 0 ? wg_start : wg_mode(on);
}

extern "C" void moe_cuda_set_q4_async(int on) {
    int v = on ? 1 : 0;
    CUDA_CHECK(cudaMemcpyToSymbol(gt_q4_tiles_async, &v, sizeof v));
}

static int wide_height(int entries, int n_experts) {
    if (wide_forced) return wide_forced;
    long long mean4 = 5LL * entries / (4LL * n_experts); // the mean, and a quarter
    return mean4 <= 32 ? 32 : mean4 <= 64 ? 64 : 128;
}

extern "C" int moe_cuda_reserve(const struct td_reserve *r, char *err, size_t errlen) {
    if (r->moe_k > MOE_MAX_K)
        return td_errf(err, errlen,
                       "backend cuda: %d expert picks a row (with a folded shared expert), the "
                       "grouped expert kernels take at most %d",
                       r->moe_k, MOE_MAX_K);
    ensure_grouped(r->rows * r->moe_k, r->moe_experts, r->moe_inter, r->dim);
    wide_allow();
    return 0;
}

extern "C" int moe_cuda_fold_shared(int entries) {
    return me().deterministic || entries <= MOE_MMA_ENTRIES;
}

/* every entry's expert output, unweighted, into y by its place in perm (and the combine's
 * order in ord_pos / ord_w; moe_state): moe_experts_cuda's and moe_experts_slots_cuda's first part
 */
static void experts_y(const float *x, const int32_t *picks, const float *weights,
                      const struct expert_set *ex, int n, int d, int inter, int k, int n_experts,
                      float limit) { // (ex->own: device memory)
    TD_ASSERT(k <= MOE_MAX_K);       // moe_cuda_reserve refuses such models first
    // quantized experts take the 8-row tensor-core tiles at every width but the wide steps'
    // block tiles: their decode in registers needs the fewer, wider loads
    int m = n * k, small = m <= MOE_SMALL_ENTRIES,
        q = ex->dtype == TD_DTYPE_Q8 || ex->dtype == TD_DTYPE_Q4;
    int mma = !me().deterministic && ((m <= MOE_MMA_ENTRIES && ex->dtype == TD_DTYPE_BF16) || q);
    // the block tiles for wide bf16 steps (the alternative is the fp32 tiles), and for quantized
    // ones whose experts average MOE_WIDE_PER_EXPERT entries (their alternative, the 8-row tiles,
    // reads an expert once per 8 of its entries, but a 64-entry tile of a few does 64 rows' work)
    int wide = !me().deterministic && m > MOE_MMA_ENTRIES &&
               (ex->dtype == TD_DTYPE_BF16 || (q && m >= wide_per_expert * n_experts)) &&
               d % 8 == 0 && inter % 8 == 0 && (uintptr_t)x % 16 == 0;
    mma = mma && !wide;
    int bm = wide ? wide_height(m, n_experts) : 0;
    int tm = wide ? bm : mma ? 8 : small ? TM_SMALL : TM;
    int max_tiles = m / tm + n_experts + 1;
    ensure_grouped(m, n_experts, inter, d);
    cudaStream_t s = td_cuda_stream();
    launch_k(moe_group_kernel, 1, MOE_GROUP_THREADS, (size_t)(3 * n_experts + 1) * sizeof(int), s,
             picks, weights, ex->own, m, k, n_experts, tm, me().perm, me().ord_pos, me().ord_w,
             me().tiles, me().ntiles);
    LAUNCH_CHECK();
    int ty = m < max_tiles ? m : max_tiles; // no step has more tiles than entries
    if (wide) {
        wide_allow();
        __nv_bfloat16 *xb = (__nv_bfloat16 *)me().y, *hb = (__nv_bfloat16 *)me().h;
        long long n8 = (long long)n * d / 8;
        launch_k(moe_bf16_kernel, ceil_div(n8, 256), 256, 0, s, xb, x, n8);
        LAUNCH_CHECK();
        // both projections (up: K = d, down: K = inter) on wgmma when it is on and the weights
        // are bf16 or Q4 (moe_wg_kernel's formats; in mode 2, Q4 ones of K % 128 == 0 take
        // moe_wr_kernel); tiles of 32 take 64 there
        by_wide(ex->dtype, bm, [&](auto f, auto b) {
            constexpr int F = decltype(f)::value, BM = decltype(b)::value;
            constexpr int WB = BM < 64 ? 64 : BM;
            for (int up = 1; up >= 0; up--) {
                void *o = up ? (void *)hb : (void *)me().y;
                const __nv_bfloat16 *a = up ? (const __nv_bfloat16 *)xb : hb;
                int K = up ? d : inter, N = up ? inter : d;
                dim3 grid(ceil_div(N, up ? GT_BN / 2 : GT_BN), ty);
                if constexpr (F == WF_Q4) {
                    if (wg_on == 2 && K % 128 == 0) {
                        launch_k(moe_wr_kernel<WB>, grid, WR_THREADS, wr_smem_bytes<WB>, s, o, a,
                                 me().perm, k, up, me().tiles, me().ntiles, *ex, K, N, limit);
                        LAUNCH_CHECK();
                        continue;
                    }
                }
                if constexpr (F != WF_Q8) {
                    if (wg_on) {
                        launch_k(moe_wg_kernel<F, WB>, grid, WG_THREADS, wg_smem_bytes<WB>, s, o, a,
                                 me().perm, k, up, me().tiles, me().ntiles, *ex, K, N, limit);
                        LAUNCH_CHECK();
                        continue;
                    }
                }
                launch_k(moe_wide_kernel<F, BM>, grid, GT_THREADS, sizeof(struct gt_smem<BM>), s, o,
                         a, me().perm, k, up, me().tiles, me().ntiles, *ex, K, N, limit);
                LAUNCH_CHECK();
            }
        });
    } else if (mma) { // x rows and every expert's rows 16-byte aligned when the widths are
                      // multiples of 8
        bool vec = d % 8 == 0 && inter % 8 == 0 && (uintptr_t)x % 16 == 0;
        moe_mma(vec, n, n, dim3(ceil_div(inter, 16), ty), s, me().h, x, 1, k, ex, d, inter, limit);
        moe_mma(vec, n, m, dim3(d % 32 == 0 ? d / 32 : ceil_div(d, 16), ty), s, me().y, me().h, 0,
                k, ex, inter, d, limit);
    } else {
        moe_gemm(dim3(ceil_div(inter, MOE_FEATS), ty), s, tm, me().h, x, 1, k, ex, d, inter, limit);
        moe_gemm(dim3(ceil_div(d, MOE_FEATS), ty), s, tm, me().y, me().h, 0, k, ex, inter, d,
                 limit);
    }
}

extern "C" void moe_experts_cuda(float *out, const float *x, const int32_t *picks,
                                 const float *weights, const struct expert_set *ex, int n, int d,
                                 int inter, int k, int n_experts, float limit) {
    if (!n) return;
    experts_y(x, picks, weights, ex, n, d, inter, k, n_experts, limit);
    launch_k(moe_combine_kernel, ceil_div((long long)n * d, 256), 256, 0, td_cuda_stream(), out,
             me().y, me().ord_pos, me().ord_w, n, k, d);
    LAUNCH_CHECK();
}

/* a split model's slots (moe.h): entry i = perm[p]'s output where its expert is this rank's
 * (own; NULL: every expert), zeros elsewhere (those entries were never computed) */
__global__ void moe_slots_kernel(float *slots, const float *y, const int32_t *perm,
                                 const int32_t *picks, const unsigned char *own, int m, int d) {
    PDL_START();
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= (long long)m * d) return;
    int p = (int)(i / d), c = (int)(i % d), e = perm[p];
    slots[(size_t)e * d + c] = !own || own[picks[e]] ? y[(size_t)p * d + c] : 0.0f;
}

/* out[t, c] = the row's slots times their weights, summed in ascending expert order (then pick
 * position) from 0, as moe_combine_kernel sums (a multiply-add each) */
__global__ void moe_combine_slots_kernel(float *out, const float *slots, const int32_t *picks,
                                         const float *weights, int n, int k, int d) {
    PDL_START();
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= (long long)n * d) return;
    int t = (int)(i / d), c = (int)(i % d), ord[MOE_MAX_K];
    const int32_t *row = picks + (size_t)t * k;
    for (int j = 0; j < k; j++) {
        int rank = 0;
        for (int u = 0; u < k; u++)
            rank += row[u] < row[j] || (row[u] == row[j] && u < j);
        ord[rank] = j;
    }
    float acc = 0.0f;
    for (int r = 0; r < k; r++)
        acc = fmaf(slots[((size_t)t * k + ord[r]) * d + c], weights[(size_t)t * k + ord[r]], acc);
    out[i] = acc;
}

extern "C" void moe_experts_slots_cuda(float *slots, const float *x, const int32_t *picks,
                                       const struct expert_set *ex, int n, int d, int inter, int k,
                                       int n_experts, float limit) {
    if (!n) return;
    cudaStream_t s = td_cuda_stream();
    // (the weights only order the combine, which comes after the all-reduce: any will do)
    experts_y(x, picks, NULL, ex, n, d, inter, k, n_experts, limit);
    launch_k(moe_slots_kernel, ceil_div((long long)n * k * d, 256), 256, 0, s, slots, me().y,
             me().perm, picks, ex->own, n * k, d);
    LAUNCH_CHECK();
}

extern "C" void moe_combine_slots_cuda(float *out, const float *slots, const int32_t *picks,
                                       const float *weights, int n, int d, int k) {
    if (!n) return;
    launch_k(moe_combine_slots_kernel, ceil_div((long long)n * d, 256), 256, 0, td_cuda_stream(),
             out, slots, picks, weights, n, k, d);
    LAUNCH_CHECK();
}
