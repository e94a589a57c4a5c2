/* greedy.cu: one slot of a greedy draft chain on the GPU (see greedy.h): a block per row, each
 * thread's best as an argmax_key (the larger value, then the lower id), folded over the block
 * (block_max_key). */
#include "cuda_common.cuh"
#include "greedy.h"

__global__ void greedy_slot_kernel(int32_t *tok, int32_t *n_drafts, int32_t *next, const float *x,
                                   int V, int g, int j) {
    int i = blockIdx.x;
    const float *r = x + (size_t)i * V;
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
    if (threadIdx.x) return;
    int a = argmax_key_index(best);
    next[i] = bad ? 0 : a;
    if (!bad && n_drafts[i] == j) {
        tok[(size_t)i * g + j] = a;
        n_drafts[i] = j + 1;
    }
}

extern "C" void greedy_slot_cuda(int32_t *tok, int32_t *n_drafts, int32_t *next, const float *x,
                                 int n, int V, int g, int j) {
    if (!n) return;
    greedy_slot_kernel<<<n, 256, 0, td_cuda_stream()>>>(tok, n_drafts, next, x, V, g, j);
    LAUNCH_CHECK();
}
