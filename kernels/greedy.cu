/* greedy.cu: the argmaxes of greedy.h on the GPU: a block per row, each thread's best as an
 * argmax_key (the larger value, then the lower id), folded over the block (block_max_key). */
#include "cuda_common.cuh"
#include "greedy.h"

// the row's argmax for every thread of the block, or -1 when an entry is not finite
__device__ int row_argmax(const float *r, int V) {
    unsigned long long best = 0;
    int bad = 0;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        float z = r[v];
        if (!isfinite(z)) bad = 1;
        unsigned long long k = argmax_key(z, v);
        best = k > best ? k : best;
    }
    bad = __syncthreads_or(bad);
    best = block_max_key(best);
    return bad ? -1 : argmax_key_index(best);
}

__global__ void argmax_rows_kernel(int32_t *ids, const float *x, int V) {
    PDL_START();
    int a = row_argmax(x + (size_t)blockIdx.x * V, V);
    if (!threadIdx.x) ids[blockIdx.x] = a;
}

extern "C" void argmax_rows_cuda(int32_t *ids, const float *x, int n, int V) {
    if (!n) return;
    launch_k(argmax_rows_kernel, n, 512, 0, td_cuda_stream(), ids, x, V);
    LAUNCH_CHECK();
}

__global__ void greedy_slot_kernel(int32_t *tok, int32_t *n_drafts, int32_t *next, const float *x,
                                   int V, int g, int j) {
    PDL_START();
    int i = blockIdx.x;
    int a = row_argmax(x + (size_t)i * V, V), bad = a < 0;
    if (threadIdx.x) return;
    next[i] = bad ? 0 : a;
    if (!bad && n_drafts[i] == j) {
        tok[(size_t)i * g + j] = a;
        n_drafts[i] = j + 1;
    }
}

extern "C" void greedy_slot_cuda(int32_t *tok, int32_t *n_drafts, int32_t *next, const float *x,
                                 int n, int V, int g, int j) {
    if (!n) return;
    launch_k(greedy_slot_kernel, n, 256, 0, td_cuda_stream(), tok, n_drafts, next, x, V, g, j);
    LAUNCH_CHECK();
}
