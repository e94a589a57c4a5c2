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
/* d (64 x 64, f32) += A (64 x 16, bf16 pairs in registers: mma.sync's A fragment for each warp's
 * 16 rows) . B (64 x 16 at db, K-major)^T */
__device__ __forceinline__ void wg_mma_ra_n64(float (&d)[32], const unsigned (&a)[4],
                                              unsigned long long db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
                 : WG_R8(0), WG_R8(8), WG_R8(16), WG_R8(24)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
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

/* The FP4 experts' tile with the weights as wgmma's A operand, in registers (TD_MOE_WGMMA=2):
 * no stage of decoded bf16 weights in shared memory, so a stage's shared traffic is x's copy
 * and wgmma's reads of it, and every code is decoded once by one thread straight into the
 * fragment that multiplies it.
 *
 * Two warpgroups (WR_THREADS) a block, each 64 weight rows (A: warp w's rows 16 w .. 16 w + 15,
 * a thread's rows g and g + 8) by BM x rows (B: the stage's gathered x rows, K-major, swizzled
 * as wg_tile's A), in instructions of m64 n64 k16 whatever BM, k ascending: an output's bits do
 * not depend on the tile's height. A stage of 64 k: each thread copies 8 code bytes of each of
 * its two rows (chunks 2 t and 2 t + 1 of 8 codes; t = lane % 4) and the rows' scale word into
 * its own slots of a ring, WR_STAGES - 2 stages ahead with x. The fragment wants byte t of every
 * chunk (k 2 t, 2 t + 1 of it), so the quad transposes its bytes (two shuffles, wr_quad_t) and
 * each byte becomes one bf16 pair (wr_q4_pair: the bit placement and power-of-two products of
 * quant.cuh, the same values). The next stage's fragments are decoded while this one's
 * instructions run (two register sets; wgmma.wait_group 1 frees the older).
 *
 * Needs K % 128 == 0 and the codes and scales 4-byte aligned (as wg_tile's register loads do);
 * codes 8-byte aligned take one copy a row, else two.
 * c[nb][4 j + 2 h + e]: weight row 16 w + 8 h + g of the warpgroup, x row 64 nb + 8 j + 2 t + e. */
#define WR_STAGES  6
#define WR_THREADS 256

template <int BM> struct wr_smem {
    __nv_bfloat16 x[WR_STAGES][BM * WG_BK]; /* 16 KB a stage at BM 128 */
    uint4 codes[WR_STAGES][WR_THREADS]; /* the thread's rows' 8 code bytes: a (x, y), b (z, w) */
    uint2 sc[WR_STAGES][WR_THREADS];    /* their scale words (bytes 2 st & ~3 ..) */
    const __nv_bfloat16 *xrow[BM];      /* x's rows (NULL: absent) */
};
template <int BM> constexpr size_t wr_smem_bytes = sizeof(struct wr_smem<BM>) + 1024;

/* the quad's 4 x 4 byte transpose: lane t of the quad holds bytes 0..3 of word r_i of lane i;
 * returns byte t of r_0, r_1, r_2, r_3 (as bytes 0..3) */
__device__ __forceinline__ unsigned wr_quad_t(unsigned r) {
    int i = threadIdx.x & 3;
    unsigned p = __shfl_xor_sync(0xffffffffu, r, 1);
    unsigned n = __byte_perm(r, p, (i & 1) ? 0x3715 : 0x6240);
    unsigned q = __shfl_xor_sync(0xffffffffu, n, 2);
    return __byte_perm(n, q, (i & 2) ? 0x3276 : 0x5410);
}

/* byte i of w (two e2m1 codes, k even in the low nibble) as a bf16 pair times 2^(s - 127):
 * the byte at bits 0 and 12 (one multiply-add) puts the two nibbles where q4_pairs's pair
 * (0, 4) has them */
template <bool ONE> __device__ __forceinline__ unsigned wr_q4_pair(unsigned w, int i, unsigned s) {
    unsigned y = __byte_perm(w, 0, 0x4440 | i) * 0x1001u;
    unsigned r = ((y << 6) & 0x01C001C0u) | ((y << 12) & 0x80008000u);
    if constexpr (ONE)
        return bf16x2_mul(r, ((s + 126) << 7) * 0x10001u);
    else
        return bf16x2_mul(bf16x2_mul(r, ((127 + 126) << 7) * 0x10001u), e8m0_bf16x2(s));
}

/* The block's tile over k = 0 .. K into c: x's rows are sm->xrow (set, then a barrier, before the
 * call); the thread's weight rows a and b: codes ca / cb, scale bytes sa / sb (absent: oa / ob
 * false, read as zeros). any: a valid address for the copies that copy nothing. */
template <int BM>
__device__ __forceinline__ void wr_tile(float (*c)[32], struct wr_smem<BM> *sm, const uint8_t *ca,
                                        const uint8_t *sa, bool oa, const uint8_t *cb,
                                        const uint8_t *sb, bool ob, int K, const void *any) {
    static_assert(BM == 64 || BM == 128, "tiles of 64 or 128 rows");
    constexpr int NB = BM / 64, XU = BM * 8 / WR_THREADS, S = WR_STAGES;
    int tid = threadIdx.x, ch = tid & 7, r0 = tid >> 3, t = tid & 3;
#pragma unroll
    for (int nb = 0; nb < NB; nb++)
#pragma unroll
        for (int i = 0; i < 32; i++)
            c[nb][i] = 0.0f;
    int kt_n = K / WG_BK;
    bool a8 = (uintptr_t)ca % 8 == 0 && (uintptr_t)cb % 8 == 0;
    auto codes_in = [&](unsigned *dst, const uint8_t *src, bool on) {
        if (a8) {
            unsigned d = (unsigned)__cvta_generic_to_shared(dst);
            asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(d),
                         "l"(on ? (const void *)src : any), "r"(on ? 8 : 0));
        } else {
            cp_async4(dst, on ? (const void *)src : any, on);
            cp_async4(dst + 1, on ? (const void *)(src + 4) : any, on);
        }
    };
    auto issue = [&](int st) { // stage st's copies: x rows, the thread's codes and scale words
        int slot = st % S, k = st * WG_BK + 8 * ch;
#pragma unroll
        for (int u = 0; u < XU; u++) {
            int r = r0 + 32 * u;
            const __nv_bfloat16 *p = sm->xrow[r];
            cp_async16(&sm->x[slot][wg_swz(r, ch)], p ? p + k : any, p != NULL);
        }
        unsigned *cw = (unsigned *)&sm->codes[slot][tid];
        codes_in(cw, ca + (size_t)st * 32 + 8 * t, oa);
        codes_in(cw + 2, cb + (size_t)st * 32 + 8 * t, ob);
        int so = (2 * st) & ~3;
        cp_async4(&sm->sc[slot][tid].x, oa ? (const void *)(sa + so) : any, oa);
        cp_async4(&sm->sc[slot][tid].y, ob ? (const void *)(sb + so) : any, ob);
    };
    // stage st's fragments: f[kk] the four registers of its k16 step kk
    auto decode = [&](int st, unsigned(&f)[4][4]) {
        uint4 v = sm->codes[st % S][tid];
        uint2 sw = sm->sc[st % S][tid];
        unsigned ta0 = wr_quad_t(v.x), ta1 = wr_quad_t(v.y), tb0 = wr_quad_t(v.z),
                 tb1 = wr_quad_t(v.w);
        int sh = 16 * (st & 1);
        unsigned s[2][2] = {{(sw.x >> sh) & 0xffu, (sw.x >> (sh + 8)) & 0xffu},
                            {(sw.y >> sh) & 0xffu, (sw.y >> (sh + 8)) & 0xffu}};
        auto fill = [&](auto one) {
            constexpr bool ONE = decltype(one)::value;
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                f[kk][0] = wr_q4_pair<ONE>(ta0, kk, s[0][kk >> 1]);
                f[kk][1] = wr_q4_pair<ONE>(tb0, kk, s[1][kk >> 1]);
                f[kk][2] = wr_q4_pair<ONE>(ta1, kk, s[0][kk >> 1]);
                f[kk][3] = wr_q4_pair<ONE>(tb1, kk, s[1][kk >> 1]);
            }
        };
        if (quant_one(s[0][0] | s[0][1] | s[1][0] | s[1][1]))
            fill(std::true_type{});
        else
            fill(std::false_type{});
    };
    auto mma = [&](int kt, const unsigned(&f)[4][4]) {
        int slot = kt % S;
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
#pragma unroll
            for (int nb = 0; nb < NB; nb++)
                wg_mma_ra_n64(c[nb], f[kk], wg_desc(&sm->x[slot][nb * 64 * WG_BK + 16 * kk]));
        wg_commit();
    };
    // one stage: everyone's x of stage kt (waited for by its copier last stage), the copies of
    // stage kt + S - 2 into stage kt - 2's slots (its instructions done in both warpgroups: each
    // waited for them before the barrier), kt's instructions, then kt + 1's fragments into the
    // registers kt - 1's instructions read
    auto stage = [&](int kt, const unsigned(&f)[4][4], unsigned(&fn)[4][4]) {
        wg_proxy_fence();
        __syncthreads();
        if (kt + S - 2 < kt_n) issue(kt + S - 2);
        cp_async_commit();
        mma(kt, f);
        wg_wait<1>();
        if (kt + 1 < kt_n) {
            cp_async_wait<S - 3>(); // this thread's copies of stage kt + 1
            decode(kt + 1, fn);
        }
    };
#pragma unroll
    for (int st = 0; st < S - 2; st++) {
        if (st < kt_n) issue(st);
        cp_async_commit();
    }
    unsigned f0[4][4], f1[4][4];
    cp_async_wait<S - 3>(); // stage 0
    decode(0, f0);
    for (int kt = 0; kt < kt_n; kt += 2) {
        stage(kt, f0, f1);
        if (kt + 1 < kt_n) stage(kt + 1, f1, f0);
    }
    wg_wait<0>();
    cp_async_wait<0>();
#pragma unroll
    for (int nb = 0; nb < NB; nb++)
        wg_touch(c[nb]);
}

#endif
