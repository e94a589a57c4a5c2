/* gemm_tile.cuh: a block's tile of C = A . B^T on tensor cores for wide steps (prefill), where
 * every weight row meets many rows of A and the arithmetic, not the weights' bytes, bounds the
 * step (mma_tile.cuh is the other end: a few rows, the bytes).
 *
 * A: BM rows of bf16 (32, 64 or 128), K contiguous, each row from its own address (gathered:
 * an expert's rows); B: GT_BN rows of bf16 weights [N, K], each from its own address too (the
 * caller maps a tile row to a weight row: the gate and up matrices interleave). Stages of GT_BK k
 * go from global to shared memory by cp.async (16 bytes a copy, zeros past a row's end or for a
 * row that is not there), GT_STAGES of them in flight; ldmatrix brings 8 x 8 blocks to
 * mma.m16n8k16 fragments. Four warps: warp w takes A rows BM / 2 (w & 1) .. + BM / 2 and B
 * rows 64 (w >> 1) .. + 64, as gt_mi x 8 tiles of 16 x 8 accumulators (c[mi][j]: rows
 * BM / 2 (w & 1) + 16 mi + g and + 8, B rows 64 (w >> 1) + 8 j + 2 t and + 1, with g = lane / 4,
 * t = lane % 4). Each output's sum runs over k in ascending 16-wide steps whatever the rows beside
 * it, so a row gets the same bits in any tile, of any height. The caller picks the height from
 * the rows a weight tile meets (moe.cu: an expert's entries): a tile reads its weights once,
 * so taller tiles read them fewer times and shorter ones waste fewer rows of arithmetic. The
 * shared memory (51 to 80 KB) is dynamic. */
#ifndef TD_KERNELS_GEMM_TILE_CUH
#define TD_KERNELS_GEMM_TILE_CUH

#include "mma_tile.cuh"

#include <type_traits>

/* a shared row (GT_LD): 32 k and 8 of padding, 80 bytes, so ldmatrix's 8 rows fall on distinct
 * banks */
#define GT_BN      128
#define GT_BK      32
#define GT_LD      40
#define GT_STAGES  4
#define GT_THREADS 128
/* a tile of BM A rows (32, 64 or 128): a warp's BM / 2 rows are gt_mi<BM> tiles of 16 */
template <int BM> constexpr int gt_mi = BM / 32;

template <int BM> struct gt_smem {
    __nv_bfloat16 a[GT_STAGES][BM][GT_LD];
    __nv_bfloat16 b[GT_STAGES][GT_BN][GT_LD];
};

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool full) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem),
                 "r"(full ? 16 : 0));
}

/* 4 bytes (src 4-byte aligned), zeros when !full */
__device__ __forceinline__ void cp_async4(void *smem, const void *gmem, bool full) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(s), "l"(gmem),
                 "r"(full ? 4 : 0));
}

__device__ __forceinline__ void cp_async_commit(void) {
    asm volatile("cp.async.commit_group;");
}

template <int N> __device__ __forceinline__ void cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix4(unsigned *r, const void *smem) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

/* the same, each 8 x 8 block transposed (B fragments of a [k][n] matrix in shared memory) */
__device__ __forceinline__ void ldmatrix4_trans(unsigned *r, const void *smem) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

/* A thread's copies of a stage: A chunks (row, 8 k) i + 128 u of 128 x 4, B chunks i + 128 u
 * of 128 x 4. a[u] / b[u]: the row's start (any valid address when the row is absent, for a
 * zero fill). */
#define GT_BU (GT_BN * 4 / GT_THREADS)
template <int BM> struct gt_src {
    static constexpr int AU = BM * 4 / GT_THREADS;
    const __nv_bfloat16 *a[AU], *b[GT_BU];
    bool a_on[AU], b_on[GT_BU];
};

/* rows of A and B: row_a(r) / row_b(r) the address of tile row r, or NULL when it is not there */
template <int BM, typename RowA, typename RowB>
__device__ __forceinline__ void gt_sources(struct gt_src<BM> *s, RowA row_a, RowB row_b,
                                           const __nv_bfloat16 *any) {
#pragma unroll
    for (int u = 0; u < gt_src<BM>::AU; u++) {
        const __nv_bfloat16 *p = row_a((threadIdx.x + GT_THREADS * u) >> 2);
        s->a_on[u] = p != NULL, s->a[u] = p ? p : any;
    }
#pragma unroll
    for (int u = 0; u < GT_BU; u++) {
        const __nv_bfloat16 *p = row_b((threadIdx.x + GT_THREADS * u) >> 2);
        s->b_on[u] = p != NULL, s->b[u] = p ? p : any;
    }
}

/* a stage's copies: A, and B when its weights are bf16 (B_BF16) */
template <bool B_BF16, int BM>
__device__ __forceinline__ void gt_load(struct gt_smem<BM> *sm, int stage,
                                        const struct gt_src<BM> *s, int k0, int K) {
    int ch = (threadIdx.x & 3) * 8, k = k0 + ch; // K % 8 == 0: a chunk is all in or all out
    bool in = k < K;
#pragma unroll
    for (int u = 0; u < gt_src<BM>::AU; u++) {
        int r = (threadIdx.x + GT_THREADS * u) >> 2;
        bool on = s->a_on[u] && in;
        cp_async16(&sm->a[stage][r][ch], on ? s->a[u] + k : s->a[u], on);
    }
    if constexpr (B_BF16)
#pragma unroll
        for (int u = 0; u < GT_BU; u++) {
            int r = (threadIdx.x + GT_THREADS * u) >> 2;
            bool on = s->b_on[u] && in;
            cp_async16(&sm->b[stage][r][ch], on ? s->b[u] + k : s->b[u], on);
        }
}

/* Quantized B (Q8 / Q4, quant.cuh): thread i holds tile row i (a matrix row, or none: row < 0).
 * A stage's 32 codes of the row (four groups of 8, one scale byte: a stage lies in one scale
 * block of either format) are loaded into registers a stage ahead and decoded to bf16 into shared
 * memory once the stage before is multiplied (wraw_row: exact). K % 32 == 0 for Q4 (its rows
 * are), % 8 for Q8. */
template <int F> struct gt_qb {
    struct wmat m;
    int row;
    typename std::conditional<F == WF_Q8, uint2, unsigned>::type bits[4];
    unsigned s;
};

template <int F> __device__ __forceinline__ void gt_qload(gt_qb<F> &q, int k0, int K) {
#pragma unroll
    for (int u = 0; u < 4; u++) {
        int k = k0 + 8 * u;
        if constexpr (F == WF_Q8) {
            q.bits[u] = make_uint2(0, 0);
            if (q.row >= 0 && k < K) q.bits[u] = q8_w8<true>(q.m, q.row, K, k, &q.s);
        } else {
            q.bits[u] = 0;
            if (q.row >= 0 && k < K) q.bits[u] = q4_w8(q.m, q.row, K, k, &q.s);
        }
    }
    if (q.row < 0 || k0 >= K) q.s = 127; // (2^0: zeros stay zeros)
}

template <int F, int BM>
__device__ __forceinline__ void gt_qstore(struct gt_smem<BM> *sm, int stage, const gt_qb<F> &q) {
#pragma unroll
    for (int u = 0; u < 4; u++)
        *(uint4 *)&sm->b[stage][threadIdx.x][8 * u] =
            pairs_in_order<F>(wraw_row<F>(q.bits[u], q.s));
}

/* Q4 weights streamed as bf16 ones are: a stage's 32 codes of the thread's row (16 bytes) and,
 * every fourth stage, the row's next four scale bytes go to shared memory by cp.async
 * GT_STAGES - 1 stages ahead, with the stage's A rows; after the block's multiplication of a
 * stage each thread decodes its row of the next one (waiting for its own copies only) into one
 * of two bf16 stages. gt_qload's register loads were issued a stage ahead, which the tensor
 * cores waited for: the released slice's 4096-token prefill spent 50.4 ms in the FP4 expert
 * tiles against 30.5 ms for the bf16 ones (H100, session 35). The ring lies over b[2 ..]: the
 * bf16 stages are b[0] and b[1]. The same decode as gt_qstore's: the same bits. */
/* 1 (the default): Q4 tiles take gt_tile_q4 where they can; 0: gt_qload's register loads
 * (moe_cuda_set_q4_async, TD_Q4_ASYNC=0 at start-up: A/B and tests). The released slice's
 * 4096-token prefill: 0.089 s with the register loads, 0.065 and 0.067 s copied ahead (H100,
 * session 36, generate --max-tokens 1, twice each in one call; the BF16 slice 0.068 s). */
static __device__ int gt_q4_tiles_async = 1;

struct gt_q4_ring {
    uint4 codes[GT_STAGES][GT_THREADS];
    unsigned scales[2][GT_THREADS]; /* stages 4 j .. 4 j + 3: word j % 2 */
};

/* K % 128 == 0 (a row's scale words are whole), codes 16-byte and scales 4-byte aligned */
__device__ __forceinline__ bool gt_q4_async_ok(const gt_qb<WF_Q4> &q, int K) {
    return K % 128 == 0 && (uintptr_t)q.m.p % 16 == 0 && (uintptr_t)q.m.s % 4 == 0;
}

template <int BM>
__device__ __forceinline__ void gt_tile_q4(float (*c)[8][4], struct gt_smem<BM> *sm,
                                           const struct gt_src<BM> *s, const gt_qb<WF_Q4> &q,
                                           int K) {
    static_assert(2 * sizeof(sm->b[0]) >= sizeof(struct gt_q4_ring), "the ring fits b[2 ..]");
    constexpr int MI = gt_mi<BM>;
    struct gt_q4_ring *rg = (struct gt_q4_ring *)&sm->b[2][0][0];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, wm = (w & 1) * (BM / 2), wn = (w >> 1) * 64;
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int j = 0; j < 8; j++)
            c[mi][j][0] = c[mi][j][1] = c[mi][j][2] = c[mi][j][3] = 0.0f;
    int kt_n = K / GT_BK;
    bool on = q.row >= 0; // (an absent row: zeros, any valid address)
    const uint8_t *codes = (const uint8_t *)q.m.p + (size_t)(on ? q.row : 0) * (K / 2);
    const uint8_t *scl = q.m.s + (size_t)(on ? q.row : 0) * q.m.srow;
    auto issue = [&](int st) { // stage st's A rows, the row's codes, every fourth its scales
        gt_load<false, BM>(sm, st % GT_STAGES, s, st * GT_BK, K);
        cp_async16(&rg->codes[st % GT_STAGES][threadIdx.x], codes + (size_t)st * 16, on);
        if (st % 4 == 0) cp_async4(&rg->scales[(st / 4) % 2][threadIdx.x], scl + st, on);
    };
    auto decode = [&](int st) { // the row of stage st, from the ring into b[st % 2]
        uint4 v = rg->codes[st % GT_STAGES][threadIdx.x];
        unsigned sc = on ? (rg->scales[(st / 4) % 2][threadIdx.x] >> (8 * (st % 4))) & 0xffu : 127u;
        unsigned g[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int u = 0; u < 4; u++)
            *(uint4 *)&sm->b[st % 2][threadIdx.x][8 * u] =
                pairs_in_order<WF_Q4>(wraw_row<WF_Q4>(g[u], sc));
    };
#pragma unroll
    for (int st = 0; st < GT_STAGES - 1; st++) {
        if (st < kt_n) issue(st);
        cp_async_commit();
    }
    cp_async_wait<GT_STAGES - 2>(); // this thread's copies of stage 0
    decode(0);
    int ar = lane & 15, ak = (lane >> 4) * 8, br = (lane & 7) + (lane >> 4) * 8,
        bk = ((lane >> 3) & 1) * 8;
    for (int kt = 0; kt < kt_n; kt++) {
        cp_async_wait<GT_STAGES - 2>();
        __syncthreads(); // A of stage kt and b[kt % 2] from every thread; kt - 1's slots free
        int nx = kt + GT_STAGES - 1;
        if (nx < kt_n) issue(nx);
        cp_async_commit();
        int st = kt % GT_STAGES, sb = kt % 2;
#pragma unroll
        for (int kk = 0; kk < GT_BK; kk += 16) {
            unsigned a[MI][4], b[4][4];
#pragma unroll
            for (int mi = 0; mi < MI; mi++)
                ldmatrix4(a[mi], &sm->a[st][wm + 16 * mi + ar][kk + ak]);
#pragma unroll
            for (int jp = 0; jp < 4; jp++)
                ldmatrix4(b[jp], &sm->b[sb][wn + 16 * jp + br][kk + bk]);
#pragma unroll
            for (int mi = 0; mi < MI; mi++)
#pragma unroll
                for (int j = 0; j < 8; j++)
                    mma_bf16(c[mi][j], a[mi][0], a[mi][1], a[mi][2], a[mi][3],
                             b[j >> 1][2 * (j & 1)], b[j >> 1][2 * (j & 1) + 1]);
        }
        if (kt + 1 < kt_n) { // (b[(kt + 1) % 2]: stage kt - 1's, read before this barrier)
            cp_async_wait<GT_STAGES - 2>(); // this thread's copies of stage kt + 1
            decode(kt + 1);
        }
    }
    cp_async_wait<0>();
    __syncthreads(); // (the shared memory is the next tile's)
}

/* the block's BM x 128 tile over k = 0 .. K (K a multiple of 8) into c; B's weights of format
 * F: bf16 rows (s's B rows) or quantized ones (q) */
template <int F, int BM>
__device__ __forceinline__ void gt_tile(float (*c)[8][4], struct gt_smem<BM> *sm,
                                        const struct gt_src<BM> *s, gt_qb<F> &q, int K) {
    if constexpr (F == WF_Q4)
        if (gt_q4_tiles_async && gt_q4_async_ok(q, K)) {
            gt_tile_q4<BM>(c, sm, s, q, K);
            return;
        }
    constexpr bool BB = F == WF_BF16;
    constexpr int MI = gt_mi<BM>;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, wm = (w & 1) * (BM / 2), wn = (w >> 1) * 64;
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int j = 0; j < 8; j++)
            c[mi][j][0] = c[mi][j][1] = c[mi][j][2] = c[mi][j][3] = 0.0f;
    int kt_n = (K + GT_BK - 1) / GT_BK;
#pragma unroll
    for (int st = 0; st < GT_STAGES - 1; st++) {
        if (st < kt_n) {
            gt_load<BB, BM>(sm, st, s, st * GT_BK, K);
            if constexpr (!BB) gt_qload<F>(q, st * GT_BK, K), gt_qstore<F, BM>(sm, st, q);
        }
        cp_async_commit();
    }
    // ldmatrix's lane addresses: A rows lane & 15, k (lane >> 4) 8; B rows (lane & 7) +
    // (lane >> 4) 8, k ((lane >> 3) & 1) 8 (blocks: j's k 0-7, j's k 8-15, j + 1's, j + 1's)
    int ar = lane & 15, ak = (lane >> 4) * 8, br = (lane & 7) + (lane >> 4) * 8,
        bk = ((lane >> 3) & 1) * 8;
    for (int kt = 0; kt < kt_n; kt++) {
        cp_async_wait<GT_STAGES - 2>();
        __syncthreads(); // stage kt landed for every thread; stage kt - 1 is free to refill
        int nx = kt + GT_STAGES - 1;
        if (nx < kt_n) {
            gt_load<BB, BM>(sm, nx % GT_STAGES, s, nx * GT_BK, K);
            if constexpr (!BB) gt_qload<F>(q, nx * GT_BK, K); // (decoded after this stage)
        }
        cp_async_commit();
        int st = kt % GT_STAGES;
#pragma unroll
        for (int kk = 0; kk < GT_BK; kk += 16) {
            unsigned a[MI][4], b[4][4];
#pragma unroll
            for (int mi = 0; mi < MI; mi++)
                ldmatrix4(a[mi], &sm->a[st][wm + 16 * mi + ar][kk + ak]);
#pragma unroll
            for (int jp = 0; jp < 4; jp++)
                ldmatrix4(b[jp], &sm->b[st][wn + 16 * jp + br][kk + bk]);
#pragma unroll
            for (int mi = 0; mi < MI; mi++)
#pragma unroll
                for (int j = 0; j < 8; j++)
                    mma_bf16(c[mi][j], a[mi][0], a[mi][1], a[mi][2], a[mi][3],
                             b[j >> 1][2 * (j & 1)], b[j >> 1][2 * (j & 1) + 1]);
        }
        if constexpr (!BB)
            if (nx < kt_n) gt_qstore<F, BM>(sm, nx % GT_STAGES, q); // (stage kt - 1's slot: free)
    }
    cp_async_wait<0>();
    __syncthreads(); // (the shared memory is the next tile's)
}

#endif
