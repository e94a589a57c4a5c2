/* attention.cu: the sparse MQA-with-sinks entry point on the GPU, one block per (row, head); each
 * row's keys come from the step metadata exactly as in attention_rows_ref (see attention.h).
 * Two-pass fp32 softmax over the row's keys held in shared memory. */
#include "attention.h"
#include "cuda_common.cuh"

__device__ __forceinline__ const float *key_ptr(const struct attn_args &a, int t, int j, int n_swa,
                                                int slot, int len, int row0) {
    const struct rows_view &r = a.rows;
    if (j < n_swa) {
        int q = r.swa_pos[r.swa_indptr[t] + j];
        return q >= len ? a.kv + (size_t)(row0 + q - len) * a.d
                        : a.swa_ring + ((size_t)slot * a.swa_rows + q % a.swa_rows) * a.d;
    }
    int w = a.use_topk ? r.topk[(size_t)t * r.topk_stride + (j - n_swa)] : j - n_swa;
    return a.entries + ((size_t)slot * a.n_entries + w) * a.d;
}

#define ATT_KEYS 8

/* column c of keys j0 .. j0 + ATT_KEYS - 1 (0 past nk), loaded before any is used */
__device__ __forceinline__ void load_keys(float *kv, const float *const *kp, int j0, int nk,
                                          int c) {
#pragma unroll
    for (int u = 0; u < ATT_KEYS; u++)
        kv[u] = j0 + u < nk ? kp[j0 + u][c] : 0.0f;
}

/* one block per (row, head): the heads of a row run side by side (a batch-1 decode step still
 * fills n_heads blocks). Each block resolves its row's key addresses once into shared memory;
 * every sum runs in the same order as with any other grid, so results do not depend on it. */
__global__ void attention_rows_kernel(struct attn_args a, int max_keys) {
    PDL_START();
    extern __shared__ float sm[]; // key pointers[max_keys], q[d], s[max_keys]
    const struct rows_view &r = a.rows;
    int t = blockIdx.x, h = blockIdx.y;
    if (r.row_seq[t] < 0) return; // a pad row: inert
    int sq = r.row_seq[t], slot = r.slot[sq], len = r.len_before[sq];
    int row0 = r.qo_indptr[sq], n_swa = r.swa_indptr[t + 1] - r.swa_indptr[t], n_ent = 0;
    if (a.entries) {
        if (a.use_topk) {
            const int32_t *pk = r.topk + (size_t)t * r.topk_stride;
            while (n_ent < r.topk_stride && pk[n_ent] >= 0)
                n_ent++;
        } else {
            n_ent = r.vis[t];
        }
    }
    int nk = n_swa + n_ent, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const float **kp = (const float **)sm;
    float *qs = (float *)(kp + max_keys), *s = qs + a.d;
    for (int j = threadIdx.x; j < nk; j += blockDim.x)
        kp[j] = key_ptr(a, t, j, n_swa, slot, len, row0);
    const float *qh = a.q + ((size_t)t * a.n_heads + h) * a.d;
    for (int c = threadIdx.x; c < a.d; c += blockDim.x)
        qs[c] = qh[c];
    __syncthreads();
    // ATT_KEYS keys per warp at a time, their loads in flight together: a warp that finished
    // one key before loading the next waited out a memory latency per key (a batch-1 step of
    // the Flash slice spent 50 us per layer here). Each key's sum runs in the same order.
    for (int j0 = warp * ATT_KEYS; j0 < nk; j0 += nw * ATT_KEYS) {
        float dot[ATT_KEYS];
#pragma unroll
        for (int u = 0; u < ATT_KEYS; u++)
            dot[u] = 0.0f;
#pragma unroll 4
        for (int c = lane; c < a.d; c += 32) {
            float kv[ATT_KEYS];
            load_keys(kv, kp, j0, nk, c);
#pragma unroll
            for (int u = 0; u < ATT_KEYS; u++)
                dot[u] += qs[c] * kv[u];
        }
#pragma unroll
        for (int u = 0; u < ATT_KEYS; u++) {
            float v = warp_sum(dot[u]);
            if (lane == 0 && j0 + u < nk) s[j0 + u] = v * a.scale;
        }
    }
    __syncthreads();
    block_softmax(s, s, nk, a.sinks[h]);
    __syncthreads();
    float *oh = a.out + ((size_t)t * a.n_heads + h) * a.d;
    for (int c = threadIdx.x; c < a.d; c += blockDim.x) { // in key order, ATT_KEYS loads at once
        float acc = 0.0f;
#pragma unroll 2
        for (int j0 = 0; j0 < nk; j0 += ATT_KEYS) {
            float kv[ATT_KEYS];
            load_keys(kv, kp, j0, nk, c);
#pragma unroll
            for (int u = 0; u < ATT_KEYS; u++)
                if (j0 + u < nk) acc += s[j0 + u] * kv[u];
        }
        oh[c] = acc;
    }
}

static size_t smem_set;

static void ensure_smem(size_t smem) {
    if (smem <= 48 * 1024 || smem <= smem_set) return;
    CUDA_CHECK(cudaFuncSetAttribute(attention_rows_kernel,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    smem_set = smem;
}

extern "C" void attention_cuda_reserve(size_t smem) {
    ensure_smem(smem);
}

extern "C" void attention_rows_cuda(const struct attn_args *a) {
    if (!a->rows.n_tok) return;
    // capacity: the window plus every compressed entry a row may see (top-k or all visible)
    int max_keys =
        a->swa_rows + (a->entries ? (a->use_topk ? a->rows.topk_stride : a->n_entries) : 0);
    size_t smem = attention_smem(a->d, max_keys);
    ensure_smem(smem);
    // a thread per output column up to 512 (a 128-thread block walked the 512 columns of a
    // Flash-slice head in four passes of dependent key loads: 49 us per layer at batch 1,
    // 24 with 512; whole batch-1 / batch-8 decode, two runs each: 332, 352 / 658, 672 tokens/s
    // with 512 threads against 327, 309 / 666, 587 with 128). The thread count depends on d
    // alone: the softmax's block sums run in an order it fixes.
    int threads = a->d > 256 ? 512 : a->d > 128 ? 256 : 128;
    dim3 grid(a->rows.n_tok, a->n_heads);
    launch_k(attention_rows_kernel, grid, threads, smem, td_cuda_stream(), *a, max_keys);
    LAUNCH_CHECK();
}
