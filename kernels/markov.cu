/* markov.cu: one slot of DSpark's greedy Markov chain on the GPU (see markov.h). Two kernels:
 * blocks over (vocabulary chunk, sequence) score z and fold each chunk's argmax into best[i]
 * with one 64-bit atomicMax (value's order-preserving bits above the complemented id, so ties
 * go to the lower id whatever order the blocks run in); then one block per sequence computes
 * the confidence, applies the cut and writes the draft. */
#include "cuda_common.cuh"
#include "markov.h"

#define MK_CHUNK   1024 /* vocabulary entries per block */
#define MK_MAX_R   256
#define MK_THREADS 256

__device__ __forceinline__ bool mk_live(const struct markov_args &a, int i, int j) {
    return a.n_drafts[i] == j && j < a.k[i];
}

__device__ __forceinline__ int32_t mk_prev(const struct markov_args &a, int i, int j) {
    return j ? a.tok[i * a.g + j - 1] : a.anchor[i];
}

__device__ __forceinline__ unsigned long long mk_key(float z, int v) {
    unsigned u = __float_as_uint(z);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)u << 32) | (unsigned)(~v);
}

template <typename T1, typename T2>
__global__ void markov_scores_kernel(struct markov_args a, int j) {
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
    unsigned long long best = 0;
    int bad = 0;
    int v0 = blockIdx.x * MK_CHUNK, v1 = min(v0 + MK_CHUNK, a.V);
    for (int v = v0 + threadIdx.x; v < v1; v += blockDim.x) {
        const T2 *w = (const T2 *)a.w2 + (size_t)v * a.r;
        float acc = 0.0f;
#pragma unroll 8
        for (int t = 0; t < a.r; t++)
            acc += e[t] * as_f32(w[t]);
        float z = u[v] + acc;
        bad |= !isfinite(z);
        unsigned long long key = mk_key(z, v);
        best = key > best ? key : best;
    }
    for (int o = 16; o; o >>= 1) {
        unsigned long long other = __shfl_xor_sync(0xffffffffu, best, o);
        best = other > best ? other : best;
        bad |= __shfl_xor_sync(0xffffffffu, bad, o);
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (!lane) wbest[warp] = best, wbad[warp] = bad;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++) {
            best = wbest[w] > best ? wbest[w] : best;
            bad |= wbad[w];
        }
        atomicMax(&a.best[i], best);
        if (bad) atomicOr(&a.bad[i], 1);
    }
}

template <typename T1> __global__ void markov_pick_kernel(struct markov_args a, int j) {
    int i = blockIdx.x;
    if (!mk_live(a, i, j)) return;
    int prev = mk_prev(a, i, j), row = i * a.g + j;
    const T1 *w1 = (const T1 *)a.w1 + (size_t)prev * a.r;
    const float *y = a.y + (size_t)row * a.D;
    float dot = 0.0f;
    for (int t = threadIdx.x; t < a.D; t += blockDim.x)
        dot += a.conf_w[t] * y[t];
    for (int t = threadIdx.x; t < a.r; t += blockDim.x)
        dot += a.conf_w[a.D + t] * as_f32(w1[t]);
    dot = block_sum(dot);
    if (threadIdx.x) return;
    float conf = 1.0f / (1.0f + expf(-dot));
    a.conf[row] = conf;
    unsigned long long best = a.best[i];
    int bad = a.bad[i];
    a.best[i] = 0; // scratch left zero for the next slot
    a.bad[i] = 0;
    if ((a.threshold > 0.0f && conf < a.threshold) || bad) return; // cut: no draft at slot j
    a.tok[row] = (int32_t)(~(unsigned)(best & 0xffffffffu));
    a.n_drafts[i] = j + 1;
}

template <typename T1, typename T2> static void launch(const struct markov_args *a, int j) {
    dim3 grid(ceil_div(a->V, MK_CHUNK), a->n);
    markov_scores_kernel<T1, T2><<<grid, MK_THREADS, 0, td_cuda_stream()>>>(*a, j);
    LAUNCH_CHECK();
    markov_pick_kernel<T1><<<a->n, MK_THREADS, 0, td_cuda_stream()>>>(*a, j);
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
