/* markov.cu: one slot of DSpark's greedy Markov chain on the GPU (see markov.h), one kernel:
 * blocks over (64 vocabulary entries, sequence) score z and fold each chunk's argmax into best[i]
 * with one 64-bit atomicMax of argmax_key (ties go to the lower id whatever order the blocks
 * run in); the sequence's last block to finish (a counter, done[i]) then computes the
 * confidence, applies the cut and writes the draft. */
#include "cuda_common.cuh"
#include "markov.h"

#define MK_VPW     8 /* vocabulary entries per warp: 64 per block */
#define MK_MAX_R   256
#define MK_THREADS 256

__device__ __forceinline__ bool mk_live(const struct markov_args &a, int i, int j) {
    return a.n_drafts[i] == j && j < a.k[i];
}

__device__ __forceinline__ int32_t mk_prev(const struct markov_args &a, int i, int j) {
    return j ? a.tok[i * a.g + j - 1] : a.anchor[i];
}

template <typename T1, typename T2>
__global__ void markov_scores_kernel(struct markov_args a, int j) {
    PDL_START();
    __shared__ float e[MK_MAX_R];
    __shared__ unsigned long long wbest[MK_THREADS / 32];
    __shared__ int wbad[MK_THREADS / 32];
    int i = blockIdx.y;
    if (!mk_live(a, i, j)) return;
    int prev = mk_prev(a, i, j), row = i * a.g + j;
    const T1 *w1 = (const T1 *)a.w1 + (size_t)prev * a.r;
    for (int t = threadIdx.x; t < a.r; t += blockDim.x)
        e[t] = as_f32(w1[t]);
    __syncthreads();
    const float *u = a.U + (size_t)row * a.V;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    // each warp scores MK_VPW entries: lanes stride W2's rows (coalesced), and the loads of all
    // MK_VPW rows are made before the first sum
    int v0 = (blockIdx.x * (MK_THREADS / 32) + warp) * MK_VPW;
    float acc[MK_VPW];
#pragma unroll
    for (int q = 0; q < MK_VPW; q++)
        acc[q] = 0.0f;
    for (int t0 = 0; t0 < a.r; t0 += 32) {
        int t = t0 + lane;
        float w[MK_VPW];
#pragma unroll
        for (int q = 0; q < MK_VPW; q++)
            w[q] = t < a.r && v0 + q < a.V ? as_f32(((const T2 *)a.w2)[(size_t)(v0 + q) * a.r + t])
                                           : 0.0f;
        float et = t < a.r ? e[t] : 0.0f;
#pragma unroll
        for (int q = 0; q < MK_VPW; q++)
            acc[q] += et * w[q];
    }
    unsigned long long best = 0;
    int bad = 0;
#pragma unroll
    for (int q = 0; q < MK_VPW; q++) {
        float dot = warp_sum(acc[q]);
        if (v0 + q < a.V) {
            float z = u[v0 + q] + dot;
            bad |= !isfinite(z);
            unsigned long long key = argmax_key(z, v0 + q);
            best = key > best ? key : best;
        }
    }
    if (!lane) wbest[warp] = best, wbad[warp] = bad;
    __syncthreads();
    __shared__ int last;
    if (threadIdx.x == 0) {
        for (int w = 1; w < MK_THREADS / 32; w++) {
            best = wbest[w] > best ? wbest[w] : best;
            bad |= wbad[w];
        }
        last = fold_argmax_last(&a.best[i], &a.bad[i], &a.done[i], &best, &bad, gridDim.x);
    }
    __syncthreads();
    if (!last) return;
    // the sequence's last block (thread 0 holds the whole fold): the confidence, the cut, the
    // draft
    const float *y = a.y + (size_t)row * a.D;
    float dot = 0.0f;
    for (int t = threadIdx.x; t < a.D; t += blockDim.x)
        dot += a.conf_w[t] * y[t];
    for (int t = threadIdx.x; t < a.r; t += blockDim.x)
        dot += a.conf_w[a.D + t] * e[t];
    dot = block_sum(dot);
    if (threadIdx.x) return;
    float conf = 1.0f / (1.0f + expf(-dot));
    a.conf[row] = conf;
    if ((a.threshold > 0.0f && conf < a.threshold) || bad) return; // cut: no draft at slot j
    a.tok[row] = argmax_key_index(best);
    a.n_drafts[i] = j + 1;
}

template <typename T1, typename T2> static void launch(const struct markov_args *a, int j) {
    dim3 grid(ceil_div(a->V, MK_VPW * MK_THREADS / 32), a->n);
    launch_k(markov_scores_kernel<T1, T2>, grid, MK_THREADS, 0, td_cuda_stream(), *a, j);
    LAUNCH_CHECK();
}

template <typename T1> static void launch_w2(const struct markov_args *a, int j) {
    if (a->w2_dtype == TD_DTYPE_BF16)
        launch<T1, __nv_bfloat16>(a, j);
    else if (a->w2_dtype == TD_DTYPE_F16)
        launch<T1, __half>(a, j);
    else
        launch<T1, float>(a, j);
}

extern "C" void markov_greedy_cuda(const struct markov_args *a, int j) {
    if (!a->n || a->r > MK_MAX_R) return;
    if (a->w1_dtype == TD_DTYPE_BF16)
        launch_w2<__nv_bfloat16>(a, j);
    else if (a->w1_dtype == TD_DTYPE_F16)
        launch_w2<__half>(a, j);
    else
        launch_w2<float>(a, j);
}
