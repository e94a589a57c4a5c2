/* attention.cu: the sparse MQA-with-sinks entry point on the GPU, one block (or a cluster) per
 * (row, head); each row's keys come from the step metadata exactly as in attention_rows_ref
 * (see attention.h). fp32 softmax over slices of the row's keys held in shared memory. */
#include <cooperative_groups.h>

#include "attention.h"
#include "cuda_common.cuh"

namespace cg = cooperative_groups;

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

#define ATT_KEYS       8
#define ATT_MAX_SPLITS 4 /* the most attention_splits gives */

/* column c of keys j0 .. j0 + ATT_KEYS - 1 (0 past nk), loaded before any is used */
__device__ __forceinline__ void load_keys(float *kv, const float *const *kp, int j0, int nk,
                                          int c) {
#pragma unroll
    for (int u = 0; u < ATT_KEYS; u++)
        kv[u] = j0 + u < nk ? kp[j0 + u][c] : 0.0f;
}

/* A cluster of ks blocks per (row, head) (attention_splits): the heads of a row run side by
 * side, and block r of the cluster takes the r-th contiguous slice of the row's keys. Each
 * block resolves its keys' addresses once into shared memory, scores them, and keeps its max
 * m_r, its sum l_r of exp(s_j - m_r) and its output part o_r = sum_j exp(s_j - m_r) k_j (keys
 * in order). Block 0 then reads the others' (through distributed shared memory when ks > 1)
 * and writes, in block order,
 *   out = sum_r exp(m_r - M) o_r / (sum_r exp(m_r - M) l_r + exp(sink - M)),  M = max(m_r, sink).
 * The slices follow the row's key count and ks the configuration, so a row's result never
 * depends on the rows beside it. */
__global__ void attention_rows_kernel(struct attn_args a, int max_keys, int ks) {
    prefetch_row_plan(a.rows, blockIdx.x / ks); // (the plan entries the key addresses need)
    PDL_START();
    extern __shared__ float sm[]; // key pointers[slice], s[slice], q[d], o[d], m, l
    const struct rows_view &r = a.rows;
    int t = blockIdx.x / ks, rank = blockIdx.x % ks, h = blockIdx.y;
    if (r.row_seq[t] < 0) return; // a pad row: inert (the whole cluster returns)
    int sq = r.row_seq[t], slot = r.slot[sq], len = r.len_before[sq];
    int row0 = r.qo_indptr[sq], n_swa = r.swa_indptr[t + 1] - r.swa_indptr[t], n_ent = 0;
    if (a.entries) {
        if (a.use_topk) { // the picks come first, then -1s: their count, the block counting
            // together (a thread walking up to top-k picks alone made as many dependent loads)
            const int32_t *pk = r.topk + (size_t)t * r.topk_stride;
            for (int j0 = 0; j0 < r.topk_stride; j0 += blockDim.x) {
                int j = j0 + threadIdx.x;
                n_ent += __syncthreads_count(j < r.topk_stride && pk[j] >= 0);
            }
        } else {
            n_ent = r.vis[t];
        }
    }
    int nk = n_swa + n_ent, per = (nk + ks - 1) / ks;
    int j0 = min(nk, rank * per), nj = min(nk, j0 + per) - j0;
    int slice = (max_keys + ks - 1) / ks;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const float **kp = (const float **)sm;
    float *s = (float *)(kp + slice), *qs = s + slice, *o = qs + a.d, *ml = o + a.d;
    for (int j = threadIdx.x; j < nj; j += blockDim.x)
        kp[j] = key_ptr(a, t, j0 + j, n_swa, slot, len, row0);
    const float *qh = a.q + ((size_t)t * a.n_heads + h) * a.d;
    for (int c = threadIdx.x; c < a.d; c += blockDim.x)
        qs[c] = qh[c];
    __syncthreads();
    // every line of the slice's keys asked at once: the rings were written a step ago and the
    // step's weights have pushed them out of L2, so the scoring loop's rounds of loads would
    // each wait out a DRAM latency
    int lines = (a.d * (int)sizeof(float) + 127) / 128;
    for (int i = threadIdx.x; i < nj * lines; i += blockDim.x)
        prefetch_l2_line(kp[i / lines] + (size_t)(i % lines) * (128 / sizeof(float)));
    // ATT_KEYS keys per warp at a time, their loads in flight together: a warp that finished
    // one key before loading the next waited out a memory latency per key (a batch-1 step of
    // the Flash slice spent 50 us per layer here). Each key's sum runs in the same order.
    for (int q0 = warp * ATT_KEYS; q0 < nj; q0 += nw * ATT_KEYS) {
        float dot[ATT_KEYS];
#pragma unroll
        for (int u = 0; u < ATT_KEYS; u++)
            dot[u] = 0.0f;
#pragma unroll 4
        for (int c = lane; c < a.d; c += 32) {
            float kv[ATT_KEYS];
            load_keys(kv, kp, q0, nj, c);
#pragma unroll
            for (int u = 0; u < ATT_KEYS; u++)
                dot[u] += qs[c] * kv[u];
        }
#pragma unroll
        for (int u = 0; u < ATT_KEYS; u++) {
            float v = warp_sum(dot[u]);
            if (lane == 0 && q0 + u < nj) s[q0 + u] = v * a.scale;
        }
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < nj; j += blockDim.x)
        mx = fmaxf(mx, s[j]);
    mx = block_max(mx);
    float den = 0.0f;
    for (int j = threadIdx.x; j < nj; j += blockDim.x) {
        float p = expf(s[j] - mx);
        s[j] = p;
        den += p;
    }
    den = block_sum(den);                                 // (its barriers also publish s)
    for (int c = threadIdx.x; c < a.d; c += blockDim.x) { // in key order, ATT_KEYS loads at once
        float acc = 0.0f;
#pragma unroll 2
        for (int q0 = 0; q0 < nj; q0 += ATT_KEYS) {
            float kv[ATT_KEYS];
            load_keys(kv, kp, q0, nj, c);
#pragma unroll
            for (int u = 0; u < ATT_KEYS; u++)
                if (q0 + u < nj) acc += s[q0 + u] * kv[u];
        }
        o[c] = acc;
    }
    if (threadIdx.x == 0) ml[0] = mx, ml[1] = den;
    // block 0 joins the blocks' parts in block order (its own alone when ks == 1); each
    // part's scale exp(m_r - M) is taken once, not per column
    cg::cluster_group cl = cg::this_cluster();
    if (ks > 1)
        cl.sync();
    else
        __syncthreads();
    if (rank == 0) {
        const float *mq[ATT_MAX_SPLITS], *oq[ATT_MAX_SPLITS];
        float sc[ATT_MAX_SPLITS], sink = a.sinks[h], M = sink, tot = 0.0f;
#pragma unroll
        for (int q = 0; q < ATT_MAX_SPLITS; q++) { // unrolled: the parts stay in registers
            if (q >= ks) break;
            mq[q] = ks > 1 ? cl.map_shared_rank(ml, q) : ml;
            oq[q] = ks > 1 ? cl.map_shared_rank(o, q) : o;
            M = fmaxf(M, mq[q][0]);
        }
#pragma unroll
        for (int q = 0; q < ATT_MAX_SPLITS; q++) { // an empty slice (m_r = -inf) adds nothing
            if (q >= ks) break;
            sc[q] = mq[q][0] == -INFINITY ? 0.0f : expf(mq[q][0] - M);
            tot += mq[q][1] * sc[q];
        }
        tot += expf(sink - M);
        float *oh = a.out + ((size_t)t * a.n_heads + h) * a.d;
        int p0 = a.inv_freq ? a.d - a.rot_dim : a.d; // the rotated dims start here
        for (int c = threadIdx.x; c < a.d; c += blockDim.x) {
            float acc = 0.0f;
#pragma unroll
            for (int q = 0; q < ATT_MAX_SPLITS; q++)
                if (q < ks) acc += oq[q][c] * sc[q];
            float v = M == -INFINITY ? 0.0f : acc / tot;
            if (c < p0)
                oh[c] = v;
            else
                o[c] = v; // (column c of this block's part was read by this thread alone)
        }
        if (p0 < a.d) { // the trailing dims rotated back at the row's position, as rope_rows
            __syncthreads();
            for (int i = threadIdx.x; i < a.rot_dim / 2; i += blockDim.x) {
                float cs, sn;
                rope_cos_sin((float)r.positions[t], a.inv_freq, i, a.attn_factor, &cs, &sn);
                float2 y = rope_pair(o[p0 + 2 * i], o[p0 + 2 * i + 1], cs, -sn);
                oh[p0 + 2 * i] = y.x;
                oh[p0 + 2 * i + 1] = y.y;
            }
        }
    }
    if (ks > 1) cl.sync(); // the other blocks' parts stay until block 0 has read them
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
    size_t smem = attention_smem(a->d, max_keys, a->n_heads);
    ensure_smem(smem);
    // a thread per output column up to 512 (a 128-thread block walked the 512 columns of a
    // Flash-slice head in four passes of dependent key loads: 49 us per layer at batch 1,
    // 24 with 512; whole batch-1 / batch-8 decode, two runs each: 332, 352 / 658, 672 tokens/s
    // with 512 threads against 327, 309 / 666, 587 with 128). The thread count depends on d
    // alone: the softmax's block sums run in an order it fixes.
    int threads = a->d > 256 ? 512 : a->d > 128 ? 256 : 128;
    int ks = attention_splits(a->n_heads, max_keys);
    dim3 grid(a->rows.n_tok * ks, a->n_heads);
    launch_kc(attention_rows_kernel, grid, threads, smem, ks, td_cuda_stream(), *a, max_keys, ks);
    LAUNCH_CHECK();
}
