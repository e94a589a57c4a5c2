/* indexer.cu: Lightning Indexer scores and top-k on the GPU (see indexer.h): the scores of a
 * row's visible entries over many blocks, then one block per row selects the top-k (radix
 * selection, ties to the lower entry) and writes the picks ascending, exactly the reference's
 * whatever the launch shape; a row that sees no more entries than top-k picks them all without
 * scoring. */
#include "cuda_common.cuh"
#include "indexer.h"

static float *scratch;
static size_t scratch_cap;

/* grid (rows, entry blocks): the scores of IDX_ENTRIES entries of a row, a warp per entry and
 * head in a fixed order (lanes over d, then a butterfly), so an entry's score does not depend on
 * the grid. A row that sees no more entries than top-k needs no scores. */
#define IDX_ENTRIES 32
#define IDX_MAX_D   256 /* the widest indexer key: a lane holds IDX_MAX_D / 32 of its columns */

template <int KT> __global__ void indexer_score_kernel(struct indexer_args a, float *scores) {
    prefetch_row_plan(a.rows, blockIdx.x);
    PDL_START();
    const struct rows_view *r = &a.rows;
    int t = blockIdx.x, w0 = blockIdx.y * IDX_ENTRIES;
    if (r->row_seq[t] < 0) return; // a pad row
    int n_vis = r->vis[t], sq = r->row_seq[t];
    if (n_vis <= a.topk || w0 >= n_vis) return;
    int w1 = min(w0 + IDX_ENTRIES, n_vis);
    float *sc = scores + (size_t)t * a.n_entries;
    const float *q = a.q + (size_t)t * a.n_heads * a.d, *wt = a.w + (size_t)t * a.n_heads;
    kv_fmt f = kv_fmt_or_f32(a.fmt, a.d);
    f.dtype = KT;
    const unsigned char *keys = (const unsigned char *)a.keys;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float kc[IDX_MAX_D / 32]; // the lane's columns of the key, decoded once for every head
    for (int w = w0 + warp; w < w1; w += nw) {
        const unsigned char *k = keys + rows_entry(r, sq, w, a.per) * f.rec;
#pragma unroll
        for (int i = 0; i < IDX_MAX_D / 32; i++) {
            int c = lane + 32 * i;
            kc[i] = c < a.d ? kv_get(k, f, c) : 0.0f;
        }
        float s = 0.0f;
        for (int h = 0; h < a.n_heads; h++) {
            float dot = 0.0f;
#pragma unroll
            for (int i = 0; i < IDX_MAX_D / 32; i++) {
                int c = lane + 32 * i;
                if (c < a.d) dot += q[(size_t)h * a.d + c] * kc[i];
            }
            dot = warp_sum(dot);
            s += fmaxf(dot, 0.0f) * a.scale * wt[h];
        }
        if (lane == 0) sc[w] = s;
    }
}

/* a score's selection key: ordered_key, NaN below every number */
__device__ __forceinline__ unsigned score_key(float v) {
    return v != v ? 0u : ordered_key(v);
}

/* One block per row: the top-k of the row's scores by radix selection, then the picks in entry
 * order. Four passes over 8-bit digits of the score keys, from the top, find the k-th largest
 * key T and how many entries of key T the picks take (need: the lowest-indexed ones, as ties go
 * to the lower entry). One pass in entry order then keeps every entry above T and the first
 * `need` equal to it, each at its prefix count: ascending, with no sort. It replaced k rounds of
 * a block-wide argmax, whose barriers cost a 4k-context batch-1 step of the Flash slice
 * milliseconds. */
#define IDX_SELECT_THREADS 1024

__global__ void __launch_bounds__(IDX_SELECT_THREADS)
    indexer_select_kernel(struct indexer_args a, const float *scores) {
    prefetch_row_plan(a.rows, blockIdx.x);
    PDL_START();
    const struct rows_view *r = &a.rows;
    int t = blockIdx.x;
    int32_t *out = r->topk + (size_t)t * r->topk_stride;
    int n_vis = r->row_seq[t] < 0 ? 0 : r->vis[t]; // a pad row picks nothing: -1s
    if (n_vis <= a.topk) { // every visible entry is picked, already ascending
        for (int j = threadIdx.x; j < a.topk; j += blockDim.x)
            out[j] = j < n_vis ? j : -1;
        return;
    }
    const float *sc = scores + (size_t)t * a.n_entries;
    __shared__ int hist[256];
    __shared__ unsigned s_prefix;
    __shared__ int s_need;
    unsigned prefix = 0, mask = 0;
    int need = a.topk, lane = threadIdx.x & 31;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x)
            hist[i] = 0;
        __syncthreads();
        for (int w = threadIdx.x; w < n_vis; w += blockDim.x) {
            unsigned u = score_key(sc[w]);
            if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 255], 1);
        }
        __syncthreads();
        if (threadIdx.x < 32) { // lane l holds digits 8l .. 8l + 7; the digit where need falls
            int own = 0;
            for (int i = 0; i < 8; i++)
                own += hist[8 * lane + i];
            int above = own; // then: the count of the digits above lane's
            for (int o = 1; o < 32; o <<= 1) {
                int y = __shfl_down_sync(0xffffffffu, above, o);
                if (lane + o < 32) above += y;
            }
            above -= own;
            if (above < need && need <= above + own) {
                int d = 8 * lane + 7;
                for (; d > 8 * lane && above + hist[d] < need; d--)
                    above += hist[d];
                s_prefix = prefix | ((unsigned)d << shift);
                s_need = need - above;
            }
        }
        __syncthreads();
        prefix = s_prefix;
        need = s_need;
        mask |= 255u << shift;
    }
    int base = 0, eq_base = 0; // picks so far, entries of key T so far
    for (int w0 = 0; w0 < n_vis; w0 += blockDim.x) {
        int w = w0 + threadIdx.x, tot;
        unsigned u = w < n_vis ? score_key(sc[w]) : 0;
        int gt = w < n_vis && u > prefix, eq = w < n_vis && u == prefix;
        int eq_rank = eq_base + block_excl_scan(eq, &tot);
        eq_base += tot;
        int pick = gt || (eq && eq_rank < need);
        int pos = base + block_excl_scan(pick, &tot);
        base += tot;
        if (pick) out[pos] = w;
    }
    for (int j = base + threadIdx.x; j < a.topk; j += blockDim.x)
        out[j] = -1; // (base is top-k here)
#ifdef TD_DEBUG
    // postconditions: exactly top-k picks, each a visible entry, strictly ascending (the order
    // the attention reads them in, and what makes a row's result independent of its batch)
    TD_DEV_ASSERT(base == a.topk);
    __syncthreads();
    for (int j = threadIdx.x; j < a.topk; j += blockDim.x)
        TD_DEV_ASSERT(out[j] >= 0 && out[j] < n_vis && (j == 0 || out[j - 1] < out[j]));
#endif
}

extern "C" int indexer_cuda_reserve(const struct td_reserve *r, char *err, size_t errlen) {
    if (r->index_head_dim > IDX_MAX_D)
        return td_errf(err, errlen,
                       "backend cuda: index_head_dim %d is more than the indexer kernel's %d",
                       r->index_head_dim, IDX_MAX_D);
    grow_scratch(&scratch, &scratch_cap, (size_t)r->rows * (r->entries + 1));
    return 0;
}

extern "C" void indexer_topk_cuda(const struct indexer_args *a) {
    if (!a->rows.n_tok) return;
    grow_scratch(&scratch, &scratch_cap, (size_t)a->rows.n_tok * (a->n_entries + 1));
    dim3 grid(a->rows.n_tok, ceil_div(a->n_entries, IDX_ENTRIES));
    if (a->n_entries > a->topk) { // else no row has scores to make
        int kt = kv_fmt_or_f32(a->fmt, a->d).dtype;
        launch_k(kt == TD_KV_FP8    ? indexer_score_kernel<TD_KV_FP8>
                 : kt == TD_KV_BF16 ? indexer_score_kernel<TD_KV_BF16>
                                    : indexer_score_kernel<TD_KV_F32>,
                 grid, 256, 0, td_cuda_stream(), *a, scratch);
        LAUNCH_CHECK();
    }
    launch_k(indexer_select_kernel, a->rows.n_tok, IDX_SELECT_THREADS, 0, td_cuda_stream(), *a,
             (const float *)scratch);
    LAUNCH_CHECK();
}
