/* markov.cu: DSpark's greedy Markov chain on the GPU (see markov.h), all g slots in one
 * cooperative kernel. Blocks (c, i) over (chunk group, sequence): for each slot, each live
 * sequence's blocks score their chunks of 64 vocabulary entries and fold each chunk's argmax
 * into best[i * g + j] with one 64-bit atomicMax of argmax_key (ties go to the lower id whatever
 * order the blocks run in); a grid-wide barrier; then every block of the sequence reads the
 * slot's fold and computes the confidence (the same sums in the same order, so the same bits in
 * every block) and so knows the draft, the cut and the next slot's previous token; block c = 0
 * writes them. One barrier per slot, one more before the scratch is zeroed: the 5 slots of a
 * round were 5 kernels of 7-9 us, each ending in a last-block pick. */
#include <cooperative_groups.h>

#include "cuda_common.cuh"
#include "markov.h"

namespace cg = cooperative_groups;

#define MK_MAX_R   256
#define MK_THREADS 256
#define MK_CHUNK   MK_THREADS /* vocabulary entries per block */
#define MK_MAX_G   32         /* slots */

/* e . W2[v] for one vocabulary entry, over the rank in order: eight bf16 at a time from one
 * 16-byte load when the rows allow (VEC), else one element at a time (all loads independent) */
template <typename T2, bool VEC>
__device__ __forceinline__ float row_dot(const T2 *w, const float *e, int r) {
    float acc = 0.0f;
    if constexpr (VEC) {
        for (int t0 = 0; t0 < r; t0 += 8) {
            uint4 q = *(const uint4 *)(w + t0);
            const __nv_bfloat162 *h = (const __nv_bfloat162 *)&q;
#pragma unroll
            for (int u = 0; u < 4; u++) {
                float2 f = __bfloat1622float2(h[u]);
                acc += e[t0 + 2 * u] * f.x;
                acc += e[t0 + 2 * u + 1] * f.y;
            }
        }
    } else {
        for (int t = 0; t < r; t++)
            acc += e[t] * as_f32(w[t]);
    }
    return acc;
}

/* the argmax key of chunk c of z = U[row] + W2 . e (e in shared memory; u: the chunk's
 * MK_CHUNK entries of U[row]) over the block, and whether an entry is not finite; valid in
 * thread 0. A thread per entry: its dot needs no shuffles (a warp per 8 entries, lanes over the
 * rank, took 1.4 us a chunk in butterflies) */
template <typename T2, bool VEC>
__device__ unsigned long long chunk_best(const struct markov_args &a, const float *e,
                                         const float *u, int c, int *bad_out) {
    __shared__ unsigned long long wbest[MK_THREADS / 32];
    __shared__ int wbad[MK_THREADS / 32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, v = c * MK_CHUNK + threadIdx.x;
    unsigned long long best = 0;
    int bad = 0;
    if (v < a.V) {
        float z = u[threadIdx.x] + row_dot<T2, VEC>((const T2 *)a.w2 + (size_t)v * a.r, e, a.r);
        bad = !isfinite(z);
        best = argmax_key(z, v);
    }
    best = warp_max_key(best);
    bad = __any_sync(0xffffffffu, bad);
    __syncthreads(); // wbest / wbad of the previous chunk are read
    if (!lane) wbest[warp] = best, wbad[warp] = bad;
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < MK_THREADS / 32; w++) {
            best = wbest[w] > best ? wbest[w] : best;
            bad |= wbad[w];
        }
    *bad_out = bad;
    return best;
}

template <typename T1, typename T2, bool VEC>
__global__ void markov_chain_kernel(struct markov_args a) {
    PDL_START();
    cg::grid_group grid = cg::this_grid();
    __shared__ float e[MK_MAX_R], ydot[MK_MAX_G], us[MK_MAX_G * MK_CHUNK];
    __shared__ int s_tok, s_cut;
    int i = blockIdx.y, chunks = (a.V + MK_CHUNK - 1) / MK_CHUNK, lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5, live = a.k[i] > 0, prev = a.anchor[i];
    int own = gridDim.x >= chunks; // one chunk per block: its U entries of every slot held here
    // before the chain: conf_w[:D] . y of every slot (a warp each), and this block's U entries
    for (int j = warp; j < a.g; j += MK_THREADS / 32) {
        const float *y = a.y + (size_t)(i * a.g + j) * a.D;
        float dot = 0.0f;
        for (int t = lane; t < a.D; t += 32)
            dot += a.conf_w[t] * y[t];
        dot = warp_sum(dot);
        if (!lane) ydot[j] = dot;
    }
    if (own)
        for (int k = threadIdx.x; k < a.g * MK_CHUNK; k += blockDim.x) {
            int j = k / MK_CHUNK, v = blockIdx.x * MK_CHUNK + k % MK_CHUNK;
            us[k] = v < a.V ? a.U[(size_t)(i * a.g + j) * a.V + v] : 0.0f;
        }
    for (int j = 0; j < a.g; j++) {
        int row = i * a.g + j;
        if (live) {
            const T1 *w1 = (const T1 *)a.w1 + (size_t)prev * a.r;
            for (int t = threadIdx.x; t < a.r; t += blockDim.x)
                e[t] = as_f32(w1[t]);
            __syncthreads(); // e, and (slot 0) ydot and us, are made
            unsigned long long best = 0;
            int bad = 0;
            for (int c = blockIdx.x; c < chunks; c += gridDim.x) {
                int b;
                const float *u =
                    own ? us + j * MK_CHUNK : a.U + (size_t)row * a.V + (size_t)c * MK_CHUNK;
                unsigned long long k = chunk_best<T2, VEC>(a, e, u, c, &b);
                best = k > best ? k : best;
                bad |= b;
            }
            if (threadIdx.x == 0) {
                atomicMax(&a.best[row], best);
                if (bad) atomicOr(&a.bad[row], 1);
            }
        }
        grid.sync();
        if (!live) continue; // uniform over the block
        if (warp == 0) {     // the confidence, the cut and the draft: the same bits in every block
            float dot = 0.0f;
            for (int t = lane; t < a.r; t += 32)
                dot += a.conf_w[a.D + t] * e[t];
            dot = warp_sum(dot);
            if (!lane) {
                float conf = 1.0f / (1.0f + expf(-(ydot[j] + dot)));
                int cut =
                    (a.threshold > 0.0f && conf < a.threshold) || *(volatile int32_t *)&a.bad[row];
                int tok = argmax_key_index(*(volatile unsigned long long *)&a.best[row]);
                if (blockIdx.x == 0) {
                    a.conf[row] = conf;
                    if (!cut) a.tok[row] = tok, a.n_drafts[i] = j + 1;
                }
                s_tok = tok, s_cut = cut;
            }
        }
        __syncthreads();
        live = !s_cut && j + 1 < a.k[i];
        prev = s_tok;
        __syncthreads(); // s_tok, s_cut and e are read before the next slot writes them
    }
    grid.sync(); // every block has read the folds: leave the scratch zero
    if (blockIdx.x == 0)
        for (int t = threadIdx.x; t < a.g; t += blockDim.x)
            a.best[i * a.g + t] = 0, a.bad[i * a.g + t] = 0;
}

/* the blocks of the chunk-group dimension: every chunk its own block when the whole grid fits
 * on the GPU at once (a cooperative launch must), else as many as fit per sequence. (With 64
 * entries a chunk and a warp per 8 entries, fewer, fuller blocks were slower: at batch 1 on
 * tandem-tiny, 128 blocks of one chunk 38 us per chain, 32 of four 60 us, 8 of sixteen 149 us.) */
template <typename T1, typename T2, bool VEC> static void launch_vec(const struct markov_args *a) {
    static int resident;
    if (!resident) {
        int dev, sms, per_sm;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &per_sm, markov_chain_kernel<T1, T2, VEC>, MK_THREADS, 0));
        resident = sms * per_sm;
    }
    int groups = ceil_div(a->V, MK_CHUNK), fit = resident / a->n;
    if (fit < 1) {
        fprintf(stderr, "markov_greedy_cuda: %d sequences, at most %d at once\n", a->n, resident);
        abort();
    }
    if (groups > fit) groups = fit;
    // cooperative (the barrier needs every block resident), and with programmatic dependent
    // launch where the runtime takes both
    static int pdl_refused;
    cudaLaunchAttribute at[2];
    at[0].id = cudaLaunchAttributeCooperative;
    at[0].val.cooperative = 1;
    at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[1].val.programmaticStreamSerializationAllowed = td_cuda_pdl();
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(groups, a->n);
    cfg.blockDim = MK_THREADS;
    cfg.stream = td_cuda_stream();
    cfg.attrs = at;
    cfg.numAttrs = pdl_refused ? 1 : 2;
    cudaError_t rc = cudaLaunchKernelEx(&cfg, markov_chain_kernel<T1, T2, VEC>, *a);
    if (rc != cudaSuccess && cfg.numAttrs == 2) {
        (void)cudaGetLastError();
        pdl_refused = 1;
        cfg.numAttrs = 1;
        rc = cudaLaunchKernelEx(&cfg, markov_chain_kernel<T1, T2, VEC>, *a);
    }
    CUDA_CHECK(rc);
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

extern "C" void markov_greedy_cuda(const struct markov_args *a) {
    if (!a->n) return;
    if (a->r > MK_MAX_R || a->g > MK_MAX_G) {
        fprintf(stderr, "markov_greedy_cuda: rank %d and %d slots, at most %d and %d\n", a->r, a->g,
                MK_MAX_R, MK_MAX_G);
        abort();
    }
    if (a->w1_dtype == TD_DTYPE_BF16)
        launch_w2<__nv_bfloat16>(a);
    else if (a->w1_dtype == TD_DTYPE_F16)
        launch_w2<__half>(a);
    else
        launch_w2<float>(a);
}
