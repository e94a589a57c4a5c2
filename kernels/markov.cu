/* markov.cu: DSpark's greedy Markov chain on the GPU (see markov.h), all g slots in one kernel.
 * One thread-block cluster per group of sequences (up to 16 blocks of 512 threads, a thread per
 * vocabulary entry at tandem-tiny's 8192): for each slot every block scores its entries for
 * each sequence and folds them to one argmax_key each (ties go to the lower id, whatever the
 * order); a cluster barrier; then a warp per sequence of every block reads the cluster's folds
 * from the others' shared memory (a lane each) and, with the confidence (the same sums in the
 * same order, so the same bits in every block), knows the draft, the cut and the next slot's
 * previous token; block 0 writes them. Measured at batch 1 on tandem-tiny (Nsight Compute, 5
 * slots): 5 kernels of 7-9 us, each ending in a last-block pick; one cooperative kernel of 32
 * blocks with a grid barrier and a global atomicMax per slot, 29 us; this, 21 us (19 with warm
 * caches). Two forms with fewer barriers were slower, both by their cluster shared-memory reads:
 * every warp reading all 256 warp keys of the cluster (30 us), every warp reading the 16 block
 * folds (25 us). With a cluster a sequence the chain took 59.7 us at batch 16 and 110.0 at
 * batch 32 (H100): each cluster re-read W2, and the clusters ran in waves (a block of 512
 * threads at 128 registers fills a multiprocessor); past the clusters that fit at once a cluster
 * drafts several (group_size). */
#include <cooperative_groups.h>

#include "cuda_common.cuh"
#include "markov.h"

namespace cg = cooperative_groups;

#define MK_MAX_R   256
#define MK_THREADS 512
#define MK_WARPS   (MK_THREADS / 32)
#define MK_MAX_CL  16 /* blocks of a cluster (Hopper's largest, a non-portable size) */
#define MK_MAX_G   32 /* slots */
#define MK_REG_R   64 /* ranks up to this keep a thread's W2 row in registers */
#define MK_MAX_S   8  /* sequences a cluster drafts together */

/* acc + e[0 .. 8) . the eight bf16 of q, in order */
__device__ __forceinline__ float dot8(float acc, uint4 q, const float *e) {
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&q;
#pragma unroll
    for (int u = 0; u < 4; u++) {
        float2 f = __bfloat1622float2(h[u]);
        acc += e[2 * u] * f.x;
        acc += e[2 * u + 1] * f.y;
    }
    return acc;
}

/* e . W2[v] for one vocabulary entry, over the rank in order: eight bf16 at a time from one
 * 16-byte load when the rows allow (VEC), else one element at a time (all loads independent) */
template <typename T2, bool VEC>
__device__ __forceinline__ float row_dot(const T2 *w, const float *e, int r) {
    float acc = 0.0f;
    if constexpr (VEC) {
        for (int t0 = 0; t0 < r; t0 += 8)
            acc = dot8(acc, *(const uint4 *)(w + t0), e + t0);
    } else {
        for (int t = 0; t < r; t++)
            acc += e[t] * as_f32(w[t]);
    }
    return acc;
}

/* the same from the row held in registers, in row_dot's order: the same bits */
__device__ __forceinline__ float reg_dot(const uint4 *wq, const float *e, int r) {
    float acc = 0.0f;
#pragma unroll
    for (int q = 0; q < MK_REG_R / 8; q++)
        if (8 * q < r) acc = dot8(acc, wq[q], e + 8 * q);
    return acc;
}

/* Cluster q drafts sequences i0 = q * S .. i0 + ns - 1 (S of them, the last group fewer), each
 * block of it entries v = b * MK_THREADS + thread + m * (cluster * MK_THREADS) for all of them:
 * a thread's W2 row (bf16, rank <= MK_REG_R, one entry a thread: tandem-tiny) is loaded once
 * for the group's chains, not once a sequence, and the group's slots advance together. A
 * sequence's sums are the same in any group (its dot products, folds and confidence in the
 * same order), so its drafts are the same bits at any S. fold[j & 1] holds the block's keys
 * and non-finite flags of slot j (two: a block may write slot j + 1's while a slower one still
 * reads slot j's; it cannot get further ahead, past the next cluster barrier). */
template <typename T1, typename T2, bool VEC>
__global__ void __launch_bounds__(MK_THREADS) markov_chain_kernel(struct markov_args a, int S) {
    PDL_START();
    cg::cluster_group cl = cg::this_cluster();
    __shared__ float e[MK_MAX_S][MK_MAX_R], ydot[MK_MAX_S][MK_MAX_G], s_conf[MK_MAX_S];
    __shared__ float s_u[MK_MAX_S][MK_THREADS];
    __shared__ unsigned long long wbest[MK_MAX_S][MK_WARPS], fold[2][MK_MAX_S];
    __shared__ int wbad[MK_MAX_S][MK_WARPS], fold_bad[2][MK_MAX_S];
    __shared__ int s_prev[MK_MAX_S], s_next[MK_MAX_S], s_live[MK_MAX_S], s_cut[MK_MAX_S];
    int i0 = blockIdx.y * S, ns = min(S, a.n - i0);
    int nb = (int)cl.num_blocks(), rank = (int)cl.block_rank();
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int v0 = rank * MK_THREADS + threadIdx.x, stride = nb * MK_THREADS;
    bool one = stride >= a.V, mine = v0 < a.V; // one: at most one entry per thread (uniform)
    bool cached = VEC && one && mine && a.r <= MK_REG_R;
    uint4 wq[MK_REG_R / 8];
    if (cached) {
        const uint4 *w = (const uint4 *)((const T2 *)a.w2 + (size_t)v0 * a.r);
#pragma unroll
        for (int q = 0; q < MK_REG_R / 8; q++)
            if (8 * q < a.r) wq[q] = w[q];
    }
    if (threadIdx.x < ns) {
        int i = i0 + threadIdx.x;
        s_live[threadIdx.x] = a.row_seq[i * a.g] >= 0;
        s_prev[threadIdx.x] = a.ids[i * a.g];
        if (rank == 0) a.n_drafts[i] = 0;
    }
    // before the chains: conf_w[:D] . y of every sequence's every slot (a warp each)
    for (int q = warp; q < ns * a.g; q += MK_WARPS) {
        int sq = q / a.g, j = q % a.g;
        const float *y = a.y + (size_t)((i0 + sq) * a.g + j) * a.D;
        float dot = 0.0f;
        for (int t = lane; t < a.D; t += 32)
            dot += a.conf_w[t] * y[t];
        dot = warp_sum(dot);
        if (!lane) ydot[sq][j] = dot;
    }
    __syncthreads();
    for (int j = 0; j < a.g; j++) {
        int par = j & 1;
        // each live sequence's U entry (a thread's own slot of s_u), requested beside its
        // embedding's row
        for (int sq = 0; one && mine && sq < ns; sq++)
            if (s_live[sq]) s_u[sq][threadIdx.x] = a.U[(size_t)((i0 + sq) * a.g + j) * a.V + v0];
        for (int q = threadIdx.x; q < ns * a.r; q += blockDim.x) {
            int sq = q / a.r, t = q % a.r;
            if (s_live[sq]) e[sq][t] = as_f32(((const T1 *)a.w1)[(size_t)s_prev[sq] * a.r + t]);
        }
        __syncthreads(); // e is made
#pragma unroll 1
        for (int sq = 0; sq < ns; sq++) {
            if (!s_live[sq]) continue; // uniform over the cluster
            unsigned long long best = 0;
            int bad = 0;
            if (one) {
                if (mine) {
                    float z = s_u[sq][threadIdx.x] +
                              (cached ? reg_dot(wq, e[sq], a.r)
                                      : row_dot<T2, VEC>((const T2 *)a.w2 + (size_t)v0 * a.r, e[sq],
                                                         a.r));
                    bad = !isfinite(z);
                    best = argmax_key(z, v0);
                }
            } else {
                const float *u = a.U + (size_t)((i0 + sq) * a.g + j) * a.V;
                for (int v = v0; v < a.V; v += stride) {
                    float z =
                        u[v] + row_dot<T2, VEC>((const T2 *)a.w2 + (size_t)v * a.r, e[sq], a.r);
                    bad |= !isfinite(z);
                    unsigned long long k = argmax_key(z, v);
                    best = k > best ? k : best;
                }
            }
            best = warp_max_key(best);
            bad = __any_sync(0xffffffffu, bad);
            if (!lane) wbest[sq][warp] = best, wbad[sq][warp] = bad;
        }
        // the confidences, a warp a sequence: the same bits in every block
        for (int sq = warp; sq < ns; sq += MK_WARPS) {
            if (!s_live[sq]) continue;
            float dot = 0.0f;
            for (int t = lane; t < a.r; t += 32)
                dot += a.conf_w[a.D + t] * e[sq][t];
            dot = warp_sum(dot);
            if (!lane) s_conf[sq] = 1.0f / (1.0f + expf(-(ydot[sq][j] + dot)));
        }
        __syncthreads();
        for (int sq = warp; sq < ns; sq += MK_WARPS) { // the block's fold, a warp a sequence
            if (!s_live[sq]) continue;
            unsigned long long best = lane < MK_WARPS ? wbest[sq][lane] : 0;
            int bad = lane < MK_WARPS ? wbad[sq][lane] : 0;
            best = warp_max_key(best);
            bad = __any_sync(0xffffffffu, bad);
            if (!lane) fold[par][sq] = best, fold_bad[par][sq] = bad;
        }
        cl.sync();                                     // every block's folds of slot j are made
        for (int sq = warp; sq < ns; sq += MK_WARPS) { // lane b reads block b's fold
            if (!s_live[sq]) continue;
            unsigned long long best = lane < nb ? *cl.map_shared_rank(&fold[par][sq], lane) : 0;
            int bad = lane < nb ? *cl.map_shared_rank(&fold_bad[par][sq], lane) : 0;
            best = warp_max_key(best);
            bad = __any_sync(0xffffffffu, bad);
            if (!lane) {
                int i = i0 + sq, row = i * a.g + j;
                float conf = s_conf[sq];
                int cut = (a.threshold > 0.0f && conf < a.threshold) || bad;
                int tok = argmax_key_index(best);
                if (rank == 0) {
                    a.conf[row] = conf;
                    if (!cut) a.tok[row] = tok, a.n_drafts[i] = j + 1;
                }
                s_next[sq] = tok, s_cut[sq] = cut;
            }
        }
        __syncthreads();
        if (threadIdx.x < ns && s_live[threadIdx.x]) {
            s_live[threadIdx.x] = !s_cut[threadIdx.x] && j + 1 < a.g;
            s_prev[threadIdx.x] = s_next[threadIdx.x];
        }
        __syncthreads();
    }
    cl.sync(); // no block leaves while another may still read its folds
}

/* the sequences a cluster drafts together: one each while the launch's clusters all fit on the
 * device at once (fit: cudaOccupancyMaxActiveClusters), then as many as keep them to that (at
 * most MK_MAX_S) */
static int group_size(int n, int fit) {
    int S = (n + fit - 1) / fit;
    return S < 1 ? 1 : S > MK_MAX_S ? MK_MAX_S : S;
}

/* one cluster per group of sequences (group_size), of as many blocks as the vocabulary fills
 * (at most 16, or what the device allows), with programmatic dependent launch. n = 0 launches
 * nothing and makes the kernel's cluster settings, which a graph capture cannot (markov.h) */
template <typename T1, typename T2, bool VEC> static void launch_vec(const struct markov_args *a) {
    static int max_cl, fit_nb, fit;
    auto kernel = markov_chain_kernel<T1, T2, VEC>;
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeClusterDimension;
    at.val.clusterDim.y = at.val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.blockDim = MK_THREADS;
    cfg.attrs = &at;
    cfg.numAttrs = 1;
    if (!max_cl) {
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
        at.val.clusterDim.x = MK_MAX_CL;
        cfg.gridDim = dim3(MK_MAX_CL, 1);
        CUDA_CHECK(cudaOccupancyMaxPotentialClusterSize(&max_cl, kernel, &cfg));
        if (max_cl > MK_MAX_CL) max_cl = MK_MAX_CL;
        if (max_cl < 1) {
            TD_ABORT("markov_greedy_cuda: no cluster of %d-thread blocks fits", MK_THREADS);
        }
    }
    int nb = ceil_div(a->V, MK_THREADS);
    if (nb > max_cl) nb = max_cl;
    if (nb >= 1 && fit_nb != nb) { // (the setup call, before any capture, meets the model's first)
        at.val.clusterDim.x = nb;
        cfg.gridDim = dim3(nb, 1);
        CUDA_CHECK(cudaOccupancyMaxActiveClusters(&fit, kernel, &cfg));
        if (fit < 1) fit = 1;
        fit_nb = nb;
    }
    if (!a->n) return; // the setup call
    int S = group_size(a->n, fit);
    launch_kc(kernel, dim3(nb, (a->n + S - 1) / S), MK_THREADS, 0, nb, td_cuda_stream(), *a, S);
    LAUNCH_CHECK();
}

template <typename T1> static void launch_w2(const struct markov_args *a) {
    if (a->w2_dtype == TD_DTYPE_BF16 && a->r % 8 == 0 && (uintptr_t)a->w2 % 16 == 0)
        launch_vec<T1, __nv_bfloat16, true>(a);
    else if (a->w2_dtype == TD_DTYPE_BF16)
        launch_vec<T1, __nv_bfloat16, false>(a);
    else if (a->w2_dtype == TD_DTYPE_F16)
        launch_vec<T1, __half, false>(a);
    else
        launch_vec<T1, float, false>(a);
}

extern "C" int markov_cuda_reserve(const struct td_reserve *r, char *err, size_t errlen) {
    if (r->markov_rank > MK_MAX_R || r->markov_slots > MK_MAX_G)
        return td_errf(err, errlen,
                       "backend cuda: a Markov head of rank %d over %d slots, the kernel takes at "
                       "most rank %d and %d slots",
                       r->markov_rank, r->markov_slots, MK_MAX_R, MK_MAX_G);
    return 0;
}

extern "C" void markov_greedy_cuda(const struct markov_args *a) {
    TD_ASSERT(a->r <= MK_MAX_R && a->g <= MK_MAX_G); // markov_cuda_reserve refuses first
    if (a->w1_dtype == TD_DTYPE_BF16)
        launch_w2<__nv_bfloat16>(a);
    else if (a->w1_dtype == TD_DTYPE_F16)
        launch_w2<__half>(a);
    else
        launch_w2<float>(a);
}
