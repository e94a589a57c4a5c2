/* wgmma_tile.cuh: gemm_tile.cuh's block tile (C = A . B^T over gathered bf16 rows of A and a
 * weight tile of 128 rows) on Hopper's warpgroup MMA (wgmma), which reads both operands from
 * shared memory itself: the four warps issue one instruction for a 64 x 128 x 16 product where
 * mma.sync needs 32 per warp and every fragment through ldmatrix first.
 *
 * One warpgroup (128 threads) a block, tiles of BM = 64 or 128 rows of A (one or two m64
 * instructions a k16 step) by WG_BN = 128 weight rows. Stages of WG_BK = 64 k: every row of a
 * stage is 128 bytes, stored in the 128-byte swizzle wgmma reads (16-byte chunk c of row r at
 * chunk c ^ (r % 8) of the row; 8 rows an atom of 1024 bytes, each stage 1024-byte aligned).
 * A comes by cp.async WG_STAGES - 1 stages ahead; B too when its weights are bf16; Q4 weights
 * (thread i holds weight row i, as gemm_tile.cuh's gt_tile_q4) copy their codes and scale bytes
 * ahead into a ring and are decoded to bf16 into one of two stages (the same decode, so the same
 * values). A stage's instructions run while the threads copy and decode the next ones.
 *
 * Each output's sum runs over k in ascending 16-wide steps whatever the rows beside it, so a row
 * gets the same bits in a tile of 64 rows as in one of 128 (not necessarily mma.sync's bits).
 *
 * c[mb][4 j + 2 h + e]: tile row 64 mb + 16 w + 8 h + g, weight row 8 j + 2 t + e (w the warp,
 * g = lane / 4, t = lane % 4; j < 16), wgmma's accumulator layout. */
#ifndef TD_KERNELS_WGMMA_TILE_CUH
#define TD_KERNELS_WGMMA_TILE_CUH

#include "gemm_tile.cuh"

#define WG_BN      128
#define WG_BK      64
#define WG_STAGES  3
#define WG_THREADS 128
static_assert(WG_BN == GT_BN, "both block tiles cover 128 weight rows: one grid for either");

template <int BM> struct wg_smem {
    __nv_bfloat16 a[WG_STAGES][BM * WG_BK];    /* 16 KB a stage at BM 128 */
    __nv_bfloat16 b[WG_STAGES][WG_BN * WG_BK]; /* bf16 weights: a ring; Q4: b[0], b[1] decoded,
                                                  the codes' ring over b[2] */
    const __nv_bfloat16 *arow[BM];             /* A's rows (NULL: absent) */
    const __nv_bfloat16 *brow[WG_BN];          /* bf16 B's rows (NULL: absent) */
};
/* dynamic shared memory a tile asks for: the struct and room to align it to 1024 bytes */
template <int BM> constexpr size_t wg_smem_bytes = sizeof(struct wg_smem<BM>) + 1024;

/* p moved to the next 1024-byte boundary of the shared window (a dynamic buffer asks for 1024
 * bytes more) */
__device__ __forceinline__ unsigned char *wg_align(unsigned char *p) {
    uintptr_t s = (uintptr_t)__cvta_generic_to_shared(p), a = (s + 1023) & ~(uintptr_t)1023;
    return p + (a - s);
}

struct wg_q4_ring {
    uint4 codes[WG_STAGES][WG_THREADS][2]; /* a stage's 64 codes of the thread's row */
    unsigned scales[2][WG_THREADS];        /* stages 2 j, 2 j + 1: word j % 2 */
};
static_assert(sizeof(struct wg_q4_ring) <= WG_BN * WG_BK * 2, "the Q4 ring fits a stage of b");

/* element offset of chunk c (8 k) of row r in a stage */
__device__ __forceinline__ int wg_swz(int r, int c) {
    return r * WG_BK + ((c ^ (r & 7)) << 3);
}

/* a shared-memory matrix descriptor: K-major rows of 128 bytes, 128-byte swizzle, 8-row groups
 * 1024 bytes apart */
__device__ __forceinline__ unsigned long long wg_desc(const void *smem) {
    unsigned a = (unsigned)__cvta_generic_to_shared(smem);
    return (unsigned long long)((a & 0x3FFFF) >> 4) | (1ull << 16) | ((1024ull >> 4) << 32) |
           (1ull << 62);
}

/* the same with the two byte offsets given: lbo, the leading dimension's (for an MN-major
 * operand, between atoms of 64 elements along MN), and sbo, between groups of 8 rows */
__device__ __forceinline__ unsigned long long wg_desc_mn(const void *smem, unsigned lbo,
                                                         unsigned sbo) {
    unsigned a = (unsigned)__cvta_generic_to_shared(smem);
    return (unsigned long long)((a & 0x3FFFF) >> 4) | ((unsigned long long)(lbo >> 4) << 16) |
           ((unsigned long long)(sbo >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wg_fence(void) {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_commit(void) {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void wg_wait(void) {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* generic-proxy writes of shared memory (stores, cp.async) made visible to wgmma's reads */
__device__ __forceinline__ void wg_proxy_fence(void) {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
/* the accumulators are written here as far as the compiler knows: no read of them moves above */
template <int N> __device__ __forceinline__ void wg_touch(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++)
        asm volatile("" : "+f"(d[i])::"memory");
}

#define WG_R8(i)                                                                                   \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]),    \
        "+f"(d[i + 6]), "+f"(d[i + 7])
/* d (64 x 128, f32) += A (64 x 16 at da) . B (128 x 16 at db)^T */
__device__ __forceinline__ void wg_mma(float (&d)[64], unsigned long long da,
                                       unsigned long long db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
                 "%64, %65, p, 1, 1, 0, 0;\n}\n"
                 : WG_R8(0), WG_R8(8), WG_R8(16), WG_R8(24), WG_R8(32), WG_R8(40), WG_R8(48),
                   WG_R8(56)
                 : "l"(da), "l"(db), "r"(1));
}
/* d (64 x 32, f32) += A (64 x 16 at da) . B (32 x 16 at db, K-major)^T */
__device__ __forceinline__ void wg_mma_n32(float (&d)[16], unsigned long long da,
                                           unsigned long long db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
                 "%16, %17, p, 1, 1, 0, 0;\n}\n"
                 : WG_R8(0), WG_R8(8)
                 : "l"(da), "l"(db), "r"(1));
}
/* d (64 x 256, f32) += A (64 x 16 at da) . B (16 x 256 at db, MN-major: a row of k holds
 * 256 n) */
__device__ __forceinline__ void wg_mma_n256t(float (&d)[128], unsigned long long da,
                                             unsigned long long db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
                 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
                 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
                 "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, "
                 "%110, %111, "
                 "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, "
                 "%125, %126, %127}, "
                 "%128, %129, p, 1, 1, 0, 1;\n}\n"
                 : WG_R8(0), WG_R8(8), WG_R8(16), WG_R8(24), WG_R8(32), WG_R8(40), WG_R8(48),
                   WG_R8(56), WG_R8(64), WG_R8(72), WG_R8(80), WG_R8(88), WG_R8(96), WG_R8(104),
                   WG_R8(112), WG_R8(120)
                 : "l"(da), "l"(db), "r"(1));
}
#undef WG_R8

/* The block's BM x 128 tile over k = 0 .. K (K a multiple of 8; of 128 for Q4) into c. A's rows
 * are sm->arow, bf16 B's sm->brow (both set, then a barrier, before the call); Q4's the
 * thread's q (gemm_tile.cuh's gt_qb). any: a valid address for the copies that copy nothing. */
template <int F, int BM>
__device__ __forceinline__ void wg_tile(float (*c)[64], struct wg_smem<BM> *sm, const gt_qb<F> &q,
                                        int K, const void *any) {
    static_assert(F == WF_BF16 || F == WF_Q4, "bf16 or Q4 weights");
    static_assert(BM == 64 || BM == 128, "tiles of 64 or 128 rows");
    constexpr int MB = BM / 64, AU = BM * 8 / WG_THREADS, BU = WG_BN * 8 / WG_THREADS;
    int tid = threadIdx.x, ch = tid & 7, r0 = tid >> 3;
#pragma unroll
    for (int mb = 0; mb < MB; mb++)
#pragma unroll
        for (int i = 0; i < 64; i++)
            c[mb][i] = 0.0f;
    int kt_n = (K + WG_BK - 1) / WG_BK;
    struct wg_q4_ring *rg = (struct wg_q4_ring *)&sm->b[2][0];
    const uint8_t *codes = NULL, *scl = NULL;
    bool on = false, async = false;
    if constexpr (F == WF_Q4) {
        on = q.row >= 0;
        async = gt_q4_tiles_async && gt_q4_async_ok(q, K);
        codes = (const uint8_t *)q.m.p + (size_t)(on ? q.row : 0) * (K / 2);
        scl = q.m.s + (size_t)(on ? q.row : 0) * q.m.srow;
    }
    // chunk ch of rows r0, r0 + 16, .. of a stage: 16 bytes of k each, zeros past K or a row
    auto rows_in = [&](__nv_bfloat16 *dst, const __nv_bfloat16 *const *rowp, int units, int k) {
        for (int u = 0; u < units; u++) {
            int r = r0 + 16 * u;
            const __nv_bfloat16 *p = rowp[r];
            bool ok = p && k < K;
            cp_async16(&dst[wg_swz(r, ch)], ok ? p + k : any, ok);
        }
    };
    auto issue = [&](int st) { // stage st's copies
        int slot = st % WG_STAGES, k = st * WG_BK + 8 * ch;
        rows_in(sm->a[slot], sm->arow, AU, k);
        if constexpr (F == WF_BF16) {
            rows_in(sm->b[slot], sm->brow, BU, k);
        } else if (async) {
            cp_async16(&rg->codes[slot][tid][0], codes + (size_t)st * 32, on);
            cp_async16(&rg->codes[slot][tid][1], codes + (size_t)st * 32 + 16, on);
            if (st % 2 == 0) cp_async4(&rg->scales[(st / 2) % 2][tid], scl + 2 * st, on);
        }
    };
    auto decode = [&](int st) { // Q4: the thread's row of stage st into b[st % 2]
        if constexpr (F == WF_Q4) {
            unsigned w[8], s[2];
            if (async) {
                uint4 v0 = rg->codes[st % WG_STAGES][tid][0],
                      v1 = rg->codes[st % WG_STAGES][tid][1];
                unsigned sw = rg->scales[(st / 2) % 2][tid] >> (16 * (st % 2));
                w[0] = v0.x, w[1] = v0.y, w[2] = v0.z, w[3] = v0.w;
                w[4] = v1.x, w[5] = v1.y, w[6] = v1.z, w[7] = v1.w;
                s[0] = on ? sw & 0xffu : 127u, s[1] = on ? (sw >> 8) & 0xffu : 127u;
            } else { // (codes not 16-byte aligned: the register loads of gt_qload)
                s[0] = s[1] = 127u;
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    int k = st * WG_BK + 8 * u;
                    w[u] = on && k < K ? q4_w8(q.m, q.row, K, k, &s[u / 4]) : 0u;
                }
            }
#pragma unroll
            for (int u = 0; u < 8; u++)
                *(uint4 *)&sm->b[st % 2][wg_swz(tid, u)] =
                    pairs_in_order<WF_Q4>(wraw_row<WF_Q4>(w[u], s[u / 4]));
        }
    };
#pragma unroll
    for (int st = 0; st < WG_STAGES - 1; st++) {
        if (st < kt_n) issue(st);
        cp_async_commit();
    }
    cp_async_wait<WG_STAGES - 2>(); // this thread's copies of stage 0
    decode(0);
    wg_proxy_fence();
    __syncthreads();
    for (int kt = 0; kt < kt_n; kt++) {
        int slot = kt % WG_STAGES, bs = F == WF_Q4 ? kt % 2 : slot;
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < WG_BK / 16; kk++)
#pragma unroll
            for (int mb = 0; mb < MB; mb++)
                wg_mma(c[mb], wg_desc(&sm->a[slot][mb * 64 * WG_BK + 16 * kk]),
                       wg_desc(&sm->b[bs][16 * kk]));
        wg_commit();
        int nx = kt + WG_STAGES - 1; // into stage kt - 1's slot: its instructions are done
        if (nx < kt_n) issue(nx);
        cp_async_commit();
        cp_async_wait<WG_STAGES - 2>();    // this thread's copies of stage kt + 1
        if (kt + 1 < kt_n) decode(kt + 1); // (b[(kt + 1) % 2]: stage kt - 1's, done)
        wg_proxy_fence();
        wg_wait<0>();
        __syncthreads(); // stage kt + 1 everyone's; stage kt's slots free
    }
    cp_async_wait<0>();
#pragma unroll
    for (int mb = 0; mb < MB; mb++)
        wg_touch(c[mb]);
}

#endif
