/* greedy.cu: the argmaxes of greedy.h on the GPU: a block per row, each thread's best as an
 * argmax_key (the larger value, then the lower id), folded over the block (block_max_key). */
#include "cuda_common.cuh"
#include "greedy.h"

// the argmax key of r[v0 .. v1) for every thread of the block, and whether an entry there is
// not finite
// (AM_BATCH loads in flight per thread before any is compared: one at a time, a span of 4096
// entries waited out 16 latencies in a row)
#define AM_BATCH 8
__device__ unsigned long long span_argmax(const float *r, int v0, int v1, int *bad_out) {
    unsigned long long best = 0;
    int bad = 0;
    for (int b = v0 + threadIdx.x; b < v1; b += AM_BATCH * blockDim.x) {
        float z[AM_BATCH];
#pragma unroll
        for (int u = 0; u < AM_BATCH; u++) {
            int v = b + u * blockDim.x;
            z[u] = v < v1 ? r[v] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < AM_BATCH; u++) {
            int v = b + u * blockDim.x;
            if (v >= v1) break;
            if (!isfinite(z[u])) bad = 1;
            unsigned long long k = argmax_key(z[u], v);
            best = k > best ? k : best;
        }
    }
    *bad_out = __syncthreads_or(bad);
    return block_max_key(best);
}

// the row's argmax for every thread of the block, or -1 when an entry is not finite
__device__ int row_argmax(const float *r, int V) {
    int bad;
    unsigned long long best = span_argmax(r, 0, V, &bad);
    return bad ? -1 : argmax_key_index(best);
}

/* argmax_rows: grid (spans, rows), each block a span of AR_SPAN entries folded into the row's
 * key (atomicMax: a max, the same in any order) and bad flag; the row's last block to finish
 * (a counter) writes the id and leaves the scratch zero. One block per row took 104 us on the
 * Flash slice's 129280 entries. */
#define AR_SPAN 4096

static unsigned long long *ar_key;
static int *ar_bad, *ar_done;
static int ar_rows;

__global__ void argmax_rows_kernel(int32_t *ids, const float *x, int V, unsigned long long *key,
                                   int *badf, int *done) {
    PDL_START();
    int i = blockIdx.y, v0 = blockIdx.x * AR_SPAN, v1 = min(V, v0 + AR_SPAN);
    int bad;
    unsigned long long best = span_argmax(x + (size_t)i * V, v0, v1, &bad);
    if (!threadIdx.x && fold_argmax_last(&key[i], &badf[i], &done[i], &best, &bad, gridDim.x))
        ids[i] = bad ? -1 : argmax_key_index(best);
}

/* the per-row scratch (zeroed), grown only: sized at start-up by the backend's reserve for the
 * widest step, so a step never allocates; a direct caller past it grows it here (never inside
 * a capture: steps call the op eagerly) */
static void ensure_rows(int rows) {
    if (rows <= ar_rows) return;
    ar_rows = rows > 2 * ar_rows ? rows : 2 * ar_rows;
    CUDA_CHECK(cudaMalloc(&ar_key, (size_t)ar_rows * sizeof *ar_key));
    CUDA_CHECK(cudaMalloc(&ar_bad, (size_t)ar_rows * sizeof *ar_bad));
    CUDA_CHECK(cudaMalloc(&ar_done, (size_t)ar_rows * sizeof *ar_done));
    CUDA_CHECK(cudaMemset(ar_key, 0, (size_t)ar_rows * sizeof *ar_key));
    CUDA_CHECK(cudaMemset(ar_bad, 0, (size_t)ar_rows * sizeof *ar_bad));
    CUDA_CHECK(cudaMemset(ar_done, 0, (size_t)ar_rows * sizeof *ar_done));
}

extern "C" int argmax_rows_cuda_reserve(const struct td_reserve *r, char *err, size_t errlen) {
    (void)err, (void)errlen;
    ensure_rows(r->rows);
    return 0;
}

extern "C" void argmax_rows_cuda(int32_t *ids, const float *x, int n, int V) {
    if (!n) return;
    ensure_rows(n);
    launch_k(argmax_rows_kernel, dim3(ceil_div(V, AR_SPAN), n), 256, 0, td_cuda_stream(), ids, x, V,
             ar_key, ar_bad, ar_done);
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
