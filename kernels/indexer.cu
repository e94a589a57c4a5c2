/* indexer.cu: Lightning Indexer scores and top-k on the GPU, one block per row (see indexer.h).
 * Selection is repeated block-wide argmax with ties to the lower entry, then an ascending sort,
 * so the picks are exactly the reference's whatever the launch shape; a row that sees no more
 * entries than top-k picks them all without scoring. (The k rounds of block argmax are slow for
 * long contexts: a block-wide sort is the next step.) */
#include "cuda_common.cuh"
#include "indexer.h"

static float *scratch;
static size_t scratch_cap;

__global__ void indexer_topk_kernel(struct indexer_args a, float *scores) {
    PDL_START();
    const struct rows_view *r = &a.rows;
    if (r->row_seq[blockIdx.x] < 0) return; // a pad row: its picks stay -1
    int t = blockIdx.x, n_vis = r->vis[t], slot = r->slot[r->row_seq[t]];
    if (n_vis <= a.topk) { // every visible entry is picked, already ascending: no scores needed
        for (int j = threadIdx.x; j < a.topk; j += blockDim.x)
            r->topk[(size_t)t * r->topk_stride + j] = j < n_vis ? j : -1;
        return;
    }
    float *sc = scores + (size_t)t * a.n_entries;
    const float *q = a.q + (size_t)t * a.n_heads * a.d, *wt = a.w + (size_t)t * a.n_heads;
    const float *keys = a.keys + (size_t)slot * a.n_entries * a.d;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int w = warp; w < n_vis; w += nw) {
        const float *k = keys + (size_t)w * a.d;
        float s = 0.0f;
        for (int h = 0; h < a.n_heads; h++) {
            float dot = 0.0f;
            for (int c = lane; c < a.d; c += 32)
                dot += q[(size_t)h * a.d + c] * k[c];
            dot = warp_sum(dot);
            s += fmaxf(dot, 0.0f) * a.scale * wt[h];
        }
        if (lane == 0) sc[w] = s;
    }
    __syncthreads();
    __shared__ int picks[1024];
    __shared__ float bv[32];
    __shared__ int bi[32];
    int k = n_vis < a.topk ? n_vis : a.topk;
    for (int j = 0; j < k; j++) {
        float best = -INFINITY;
        int idx = 0x7fffffff;
        for (int w = threadIdx.x; w < n_vis; w += blockDim.x) {
            float v = sc[w];
            if (v > best || (v == best && w < idx)) best = v, idx = w;
        }
        for (int o = 16; o > 0; o >>= 1) { // (value desc, index asc)
            float ov = __shfl_xor_sync(0xffffffffu, best, o);
            int oi = __shfl_xor_sync(0xffffffffu, idx, o);
            if (ov > best || (ov == best && oi < idx)) best = ov, idx = oi;
        }
        if (lane == 0) bv[warp] = best, bi[warp] = idx;
        __syncthreads();
        if (threadIdx.x == 0) {
            float b = bv[0];
            int i = bi[0];
            for (int u = 1; u < nw; u++)
                if (bv[u] > b || (bv[u] == b && bi[u] < i)) b = bv[u], i = bi[u];
            picks[j] = i;
            sc[i] = -INFINITY; // taken
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) { // ascending
        for (int i = 1; i < k; i++) {
            int v = picks[i], j = i - 1;
            while (j >= 0 && picks[j] > v)
                picks[j + 1] = picks[j], j--;
            picks[j + 1] = v;
        }
    }
    __syncthreads();
    for (int j = threadIdx.x; j < a.topk; j += blockDim.x)
        r->topk[(size_t)t * r->topk_stride + j] = j < k ? picks[j] : -1;
}

extern "C" void indexer_cuda_reserve(size_t score_elems) {
    grow_scratch(&scratch, &scratch_cap, score_elems);
}

extern "C" void indexer_topk_cuda(const struct indexer_args *a) {
    if (!a->rows.n_tok) return;
    if (a->topk > 1024) {
        fprintf(stderr, "indexer_topk_cuda: index_topk %d, at most 1024\n", a->topk);
        abort();
    }
    grow_scratch(&scratch, &scratch_cap, (size_t)a->rows.n_tok * (a->n_entries + 1));
    launch_k(indexer_topk_kernel, a->rows.n_tok, 256, 0, td_cuda_stream(), *a, scratch);
    LAUNCH_CHECK();
}
