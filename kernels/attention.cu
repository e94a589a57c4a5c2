/* attention.cu: the sparse MQA-with-sinks entry point on the GPU, one block (or a cluster) per
 * (row, group of heads); each row's keys come from the step metadata through rows.h's
 * rows_key_row, as in attention_rows_ref (see attention.h). fp32 throughout: the block stages
 * its keys in shared memory once for all its heads, a warp per head runs an online softmax
 * over them, and the blocks' parts are joined in order. */
#include <cooperative_groups.h>
#include <type_traits>

#include "attention.h"
#include "cuda_common.cuh"
#include "gemm_tile.cuh"
#include "kv_lane.cuh"
#include "wgmma_tile.cuh"

namespace cg = cooperative_groups;

/* key j of row t: its record (fmt) in the window ring, this step's rows or the entries */
__device__ __forceinline__ const void *key_ptr(const struct attn_args &a, const kv_fmt &f, int t,
                                               int j, int n_swa, int slot, int len, int row0) {
    const struct rows_view &r = a.rows;
    if (j < n_swa) {
        int in_ring;
        long long row =
            rows_where(r.swa_pos[r.swa_indptr[t] + j], len, row0, slot, a.swa_rows, &in_ring);
        return (const unsigned char *)(in_ring ? a.swa_ring : a.kv) + row * f.rec;
    }
    int w = a.use_topk ? r.topk[(size_t)t * r.topk_stride + (j - n_swa)] : j - n_swa;
    return (const unsigned char *)a.entries + rows_entry(&r, r.row_seq[t], w, a.per) * f.rec;
}

/* The CUDA kernel's blocks. MQA: every head of a row reads the same keys, so a block takes
 * attention_heads heads of one row, a warp each, and reads each of its keys once for all of
 * them (a block per (row, head) read every key once per head: a verify step of 96 rows on
 * tandem-tiny took 30 us a call against 10 at 16 rows, its 3072 blocks each resolving and
 * loading the same keys). It follows the configuration, never the batch. */
#define ATT_MAX_HEADS 16
static int attention_heads(int n_heads) { // the largest divisor of n_heads up to 16
    for (int g = n_heads < ATT_MAX_HEADS ? n_heads : ATT_MAX_HEADS; g > 1; g--)
        if (n_heads % g == 0) return g;
    return 1;
}

/* The blocks of a cluster that split each row's keys into contiguous slices of about
 * ATT_SLICE keys (so a step of one row still fills some multiprocessors): from max_keys, the
 * widest row the model gives, never the row's own count. */
#define ATT_SLICE      64
#define ATT_MAX_SPLITS 8 /* a portable cluster */
static int attention_splits(int max_keys) {
    int s = (max_keys + ATT_SLICE - 1) / ATT_SLICE;
    return s < 1 ? 1 : s > ATT_MAX_SPLITS ? ATT_MAX_SPLITS : s;
}

#define ATTENTION_MAX_D 512
/* f(NC) with NC, the columns a lane holds, a compile-time constant: d <= 32 NC */
template <typename F> static void by_columns(int d, F &&f) {
    if (d <= 32)
        f(std::integral_constant<int, 1>{});
    else if (d <= 64)
        f(std::integral_constant<int, 2>{});
    else if (d <= 128)
        f(std::integral_constant<int, 4>{});
    else if (d <= 256)
        f(std::integral_constant<int, 8>{});
    else
        f(std::integral_constant<int, 16>{});
}

/* the columns a warp's lanes cover, 32 NC (by_columns) */
static int attention_cols(int d) {
    int cw = 0;
    by_columns(d, [&](auto nc) { cw = 32 * decltype(nc)::value; });
    return cw;
}

#define ATT_KEYS 4  /* keys a warp scores together (their loads and sums in flight at once) */
#define ATT_TILE 16 /* keys staged in shared memory at a time */

/* Shared memory of the CUDA kernel's block for rows of up to max_keys keys of d floats: its
 * slice's key addresses, a tile of keys (ATT_TILE x cw floats), its heads' output parts
 * (heads x cw) and their maxima and sums. */
static size_t attention_smem(int d, int max_keys, int n_heads) {
    int s = attention_splits(max_keys), slice = (max_keys + s - 1) / s;
    size_t cw = (size_t)attention_cols(d), hg = (size_t)attention_heads(n_heads);
    return (((size_t)slice * sizeof(void *) + 15) & ~(size_t)15) +
           (ATT_TILE * cw + hg * cw + 2 * hg) * sizeof(float);
}

/* a real row t's place and its keys: the window's, then the compressed entries it sees (the
 * picks come first, then -1s: their count, every thread of the block counting together, since a
 * thread walking up to top-k picks alone made as many dependent loads; or all visible ones).
 * Every thread of the block calls it. */
struct row_keys {
    int slot, len, row0, n_swa, nk;
};
__device__ __forceinline__ struct row_keys row_keys_of(const struct attn_args &a, int t) {
    const struct rows_view &r = a.rows;
    int sq = r.row_seq[t], n_ent = 0;
    struct row_keys w;
    w.slot = r.slot[sq], w.len = r.len_before[sq], w.row0 = r.qo_indptr[sq];
    w.n_swa = r.swa_indptr[t + 1] - r.swa_indptr[t];
    if (a.entries) {
        if (a.use_topk) {
            const int32_t *pk = r.topk + (size_t)t * r.topk_stride;
            for (int j0 = 0; j0 < r.topk_stride; j0 += blockDim.x) {
                int j = j0 + threadIdx.x;
                n_ent += __syncthreads_count(j < r.topk_stride && pk[j] >= 0);
            }
        } else {
            n_ent = r.vis[t];
        }
    }
    w.nk = w.n_swa + n_ent;
    return w;
}

/* Block (row t, slice rank, head group y) of a cluster of ks: it resolves its slice's key
 * addresses once into shared memory, then stages ATT_TILE keys at a time (its warps loading
 * them: fp32 keys a lane's columns l, l + 32, ..; typed caches NC contiguous ones, key_lane),
 * and warp w, head y hg + w, holding its query's columns l, l + 32, .. (NC of them), scores the
 * tile's keys ATT_KEYS at a time (one warp sum each) and keeps the running max m, sum l of
 * exp(s_j - m) and part o = sum_j exp(s_j - m) k_j, in key order. Each block writes its heads'
 * parts to shared memory; head w is then finished by warp w of block w % ks, which reads the
 * ks parts (through distributed shared memory when ks > 1) in block order and writes
 * out = sum_r exp(m_r - M) o_r / (sum_r exp(m_r - M) l_r + exp(sink - M)),  M = max(m_r, sink).
 * The slices and tiles follow the row's key count, ks and hg the configuration, so a row's
 * result never depends on the rows beside it. */
template <int NC, int KT>
__global__ void __launch_bounds__(32 * ATT_MAX_HEADS)
    attention_rows_kernel(struct attn_args a, int max_keys, int ks) {
    prefetch_row_plan(a.rows, blockIdx.x / ks); // (the plan entries the key addresses need)
    PDL_START();
    constexpr int CW = 32 * NC;
    extern __shared__ __align__(16) unsigned char smb[];
    const struct rows_view &r = a.rows;
    int t = blockIdx.x / ks, rank = blockIdx.x % ks;
    if (r.row_seq[t] < 0) return; // a pad row: inert (the whole cluster returns)
    const struct row_keys rk = row_keys_of(a, t);
    int slot = rk.slot, len = rk.len, row0 = rk.row0, n_swa = rk.n_swa;
    int nk = rk.nk, per = (nk + ks - 1) / ks;
    int j0 = min(nk, rank * per), nj = min(nk, j0 + per) - j0;
    int slice = (max_keys + ks - 1) / ks;
    TD_DEV_ASSERT(nj <= slice); // kp[] holds a slice: the plan's and the rings' sizes promise it
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, hg = blockDim.x >> 5;
    int h = blockIdx.y * hg + warp; // this warp's head
    const kv_fmt f = kv_fmt_or_f32(a.fmt, a.d);
    const void **kp = (const void **)smb;
    float *tile = (float *)(smb + (((size_t)slice * sizeof(void *) + 15) & ~(size_t)15));
    float *part = tile + ATT_TILE * CW, *ml = part + (size_t)hg * CW; // [hg][CW], [hg][2]
    for (int j = threadIdx.x; j < nj; j += blockDim.x)
        kp[j] = key_ptr(a, f, t, j0 + j, n_swa, slot, len, row0);
    const float *qh = a.q + ((size_t)t * a.n_heads + h) * a.d;
    constexpr bool CONTIG = KT != TD_KV_F32 && NC % 8 == 0;
    float qv[NC], acc[NC];
#pragma unroll
    for (int i = 0; i < NC; i++) {
        int c = lane + 32 * i;
        qv[i] = c < a.d ? qh[c] : 0.0f;
        acc[i] = 0.0f;
    }
    __syncthreads();
    // every line of the slice's keys asked at once: the rings were written a step ago and the
    // step's weights have pushed them out of L2
    int lines = (f.rec + 127) / 128;
    for (int i = threadIdx.x; i < nj * lines; i += blockDim.x)
        prefetch_l2_line((const char *)kp[i / lines] + (size_t)(i % lines) * 128);
    float m = -INFINITY, sum = 0.0f;
    for (int b0 = 0; b0 < nj; b0 += ATT_TILE) {
        int nt = min(ATT_TILE, nj - b0);
        __syncthreads();                      // the tile before is scored
        for (int u = warp; u < nt; u += hg) { // a tile row: the key's CW columns, 0 past d
            const void *k = kp[b0 + u];
            float *row = tile + (size_t)u * CW;
            if constexpr (CONTIG) {
                float v[NC];
                key_lane<NC, KT>(k, f, NC * lane, v);
#pragma unroll
                for (int j = 0; j < NC / 4; j++)
                    ((float4 *)(row + NC * lane))[j] =
                        make_float4(v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]);
            } else {
#pragma unroll
                for (int i = 0; i < NC; i++) {
                    int c = lane + 32 * i;
                    row[c] = c < a.d ? key_at<KT>(k, f, c) : 0.0f;
                }
            }
        }
        __syncthreads();
        for (int u0 = 0; u0 < nt; u0 += ATT_KEYS) {
            float kv[ATT_KEYS][NC], sc[ATT_KEYS];
#pragma unroll
            for (int u = 0; u < ATT_KEYS; u++)
#pragma unroll
                for (int i = 0; i < NC; i++) // (rows past nt hold an older tile's keys)
                    kv[u][i] = u0 + u < nt ? tile[(size_t)(u0 + u) * CW + lane + 32 * i] : 0.0f;
            float mn = m;
#pragma unroll
            for (int u = 0; u < ATT_KEYS; u++) {
                float dot = 0.0f;
#pragma unroll
                for (int i = 0; i < NC; i++)
                    dot += qv[i] * kv[u][i];
                dot = warp_sum(dot) * a.scale;
                sc[u] = u0 + u < nt ? dot : -INFINITY;
                mn = fmaxf(mn, sc[u]);
            }
            float cor = m == -INFINITY ? 0.0f : expf(m - mn); // (mn is finite: key u0 is real)
            sum *= cor;
#pragma unroll
            for (int i = 0; i < NC; i++)
                acc[i] *= cor;
#pragma unroll
            for (int u = 0; u < ATT_KEYS; u++) {
                float p = u0 + u < nt ? expf(sc[u] - mn) : 0.0f;
                sum += p;
#pragma unroll
                for (int i = 0; i < NC; i++)
                    acc[i] += p * kv[u][i];
            }
            m = mn;
        }
    }
    // the block's part for each of its heads
#pragma unroll
    for (int i = 0; i < NC; i++)
        part[(size_t)warp * CW + lane + 32 * i] = acc[i];
    if (lane == 0) ml[2 * warp] = m, ml[2 * warp + 1] = sum;
    cg::cluster_group cl = cg::this_cluster();
    if (ks > 1)
        cl.sync();
    else
        __syncthreads();
    // head w is finished by warp w of block w % ks: the parts joined in block order, each
    // part's scale exp(m_r - M) taken once, not per column
    if (warp % ks == rank) {
        const float *mq[ATT_MAX_SPLITS], *oq[ATT_MAX_SPLITS];
        float scq[ATT_MAX_SPLITS], sink = a.sinks[h], M = sink, tot = 0.0f;
#pragma unroll
        for (int q = 0; q < ATT_MAX_SPLITS; q++) { // unrolled: the parts stay in registers
            if (q >= ks) break;
            mq[q] = (ks > 1 ? cl.map_shared_rank(ml, q) : ml) + 2 * warp;
            oq[q] = (ks > 1 ? cl.map_shared_rank(part, q) : part) + (size_t)warp * CW;
            M = fmaxf(M, mq[q][0]);
        }
#pragma unroll
        for (int q = 0; q < ATT_MAX_SPLITS; q++) { // an empty slice (m_r = -inf) adds nothing
            if (q >= ks) break;
            scq[q] = mq[q][0] == -INFINITY ? 0.0f : expf(mq[q][0] - M);
            tot += mq[q][1] * scq[q];
        }
        tot += expf(sink - M);
        float *oh = a.out + ((size_t)t * a.n_heads + h) * a.d;
        int p0 = a.inv_freq ? a.d - a.rot_dim : a.d; // the rotated dims start here (even)
#pragma unroll
        for (int i = 0; i < NC; i++) {
            int c = lane + 32 * i;
            float o = 0.0f;
#pragma unroll
            for (int q = 0; q < ATT_MAX_SPLITS; q++)
                if (q < ks) o += oq[q][c] * scq[q];
            float v = M == -INFINITY ? 0.0f : o / tot;
            // the trailing dims rotated back at the row's position, as rope_rows: column c's
            // pair partner c ^ 1 is lane ^ 1's at the same i
            float w = __shfl_xor_sync(0xffffffffu, v, 1);
            if (c >= p0 && c < a.d) {
                float cs, sn;
                rope_cos_sin((float)r.positions[t], a.inv_freq, (c - p0) >> 1, a.attn_factor, &cs,
                             &sn);
                float2 y = c & 1 ? rope_pair(w, v, cs, -sn) : rope_pair(v, w, cs, -sn);
                v = c & 1 ? y.y : y.x;
            }
            if (c < a.d) oh[c] = v;
        }
    }
    if (ks > 1) cl.sync(); // the other blocks' parts stay until their heads are finished
}

/* Wide steps (prefill) on tensor cores (attention_mma_kernel): a block per row holds its heads'
 * queries as the 64-row A of two GEMMs, S = Q K^T and O += P V, over chunks of AM_KEYS keys
 * (K = V), with bf16 operands and fp32 accumulators and the same online softmax (running max,
 * sum, output rescaled by exp(m_old - m)). The block-per-row-and-head-group kernel above runs
 * its dots on the fp32 pipes: a 4096-token prefill of the Flash slice spent 120.5 of its 232 ms
 * there (Nsight Compute, H100, session 32). Shared memory: Q [64][D + 8] bf16, two key chunks
 * [AM_KEYS][D + 8] (8 of padding: ldmatrix rows on distinct banks), S fp32 [64][AM_KEYS + 1],
 * P bf16 [64][AM_KEYS + 8], each head's m, l and correction, the chunk's key addresses.
 * Eight warps: for S, warp w takes heads 16 (w >> 1) .. + 16 and keys 16 (w & 1) .. + 16;
 * for O, heads 16 (w & 3) and columns (w >> 2) D / 2 .. + D / 2 (32 tiles of 8: 128
 * accumulators a lane). Each row's keys and sums follow its own key list: a row's result does
 * not depend on the rows beside it. Batch-invariant mode keeps the fp32 kernel at every width
 * (its results do not depend on the step's width either). */
#define AM_HEADS   64
#define AM_KEYS    32
#define AM_THREADS 256
/* Steps of at least AM_ROWS rows take it (attention_cuda_set_wide; TD_ATT_WIDE_ROWS=N: from N
 * rows, measuring only). Session 38 (H100, released Flash slice, tandem bench on distinct
 * prompts, tokens/s, the fp32-pipe kernel below against this one from 16 rows): batch 8 2833.5,
 * 2825.8 against 2758.2, 2751.9 (from 8); batch 16 3530.9, 3520.7 against 3568.5, 3576.4; batch
 * 32 4283.4, 4273.1 against 4491.0, 4458.7; batch 64 5584.8, 5570.5 against 6034.6, 6028.8 (from
 * 64). It was 256: prefill only. */
#define AM_ROWS 16

template <int D> struct am_smem {
    static constexpr int LD = D + 8, LS = AM_KEYS + 1, LP = AM_KEYS + 8;
    __nv_bfloat16 q[AM_HEADS][LD];
    __nv_bfloat16 k[2][AM_KEYS][LD];
    float s[AM_HEADS][LS];
    __nv_bfloat16 p[AM_HEADS][LP];
    float m[AM_HEADS], l[AM_HEADS], cor[AM_HEADS];
    const void *kp[AM_KEYS];
    /* the row's key records (NULL: past its keys), AM_THREADS keys (8 chunks) a batch, batch bt
       in half bt % 2: resolved by every thread at once, one key each, a batch ahead */
    const void *kr[2][AM_THREADS];
};

/* STAGE (attention_cuda_set_stage, TD_ATT_STAGE=1; off until run on a GPU): a chunk's key
 * records are copied into shared memory by cp.async two chunks ahead (st, a chunk's records),
 * and made bf16 from there, so their loads wait behind the chunks before them instead of between
 * S and the softmax; the same records made bf16 the same way: the same bits */
template <int KT> constexpr int am_stage_bytes = KT == TD_KV_F32 ? 4 * 512 : 2 * 512;
template <int D, int KT> struct am_stage_smem {
    am_smem<D> m;
    __align__(16) unsigned char st[AM_KEYS][am_stage_bytes<KT>];
};

static int am_mode;       /* 0: by the step's rows; 1: every step; 2: never (tests, A/B) */
static int am_stage = -1; /* TD_ATT_STAGE */
/* the row's key records resolved a batch ahead (am_smem kr; TD_ATT_RING=1,
 * attention_cuda_set_ring; off until run on a GPU), else a chunk's by one warp before its
 * conversion: the same records, the same bits */
static int am_ring = -1;

extern "C" void attention_cuda_set_ring(int on) {
    am_ring = on < 0 ? -1 : on ? 1 : 0; // (-1: TD_ATT_RING's again)
}

extern "C" void attention_cuda_set_stage(int on) {
    am_stage = on < 0 ? -1 : on ? 1 : 0; // (-1: TD_ATT_STAGE's again)
}
/* a context's (cuda_ctx.h): batch-invariant mode (the wide form never) */
struct am_state {
    int deterministic;
};

static struct am_state &as(void) {
    return td_cuda_ctx_state<struct am_state>(TD_CTX_ATTENTION);
}

extern "C" void attention_cuda_set_wide(int mode) {
    am_mode = mode;
}

extern "C" void attention_cuda_set_deterministic(int on) {
    as().deterministic = on;
}

__device__ __forceinline__ void cp_async8(void *smem, const void *gmem) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(s), "l"(gmem));
}

/* the tensor-core kernels' output pair at columns cc, cc + 1 of a head's row oh: o sc / tot
 * (zeros when neither a key nor the sink counts: dead), the columns from p0 on rotated back at
 * row t's position (pairs (c, c + 1), c even) */
__device__ __forceinline__ void am_pair_out(const struct attn_args &a, int t, float *oh, int cc,
                                            float o0, float o1, float sc, float tot, bool dead,
                                            int p0) {
    float v0 = dead ? 0.0f : o0 * sc / tot, v1 = dead ? 0.0f : o1 * sc / tot;
    if (cc >= p0) {
        float cs, sn;
        rope_cos_sin((float)a.rows.positions[t], a.inv_freq, (cc - p0) >> 1, a.attn_factor, &cs,
                     &sn);
        float2 y = rope_pair(v0, v1, cs, -sn);
        v0 = y.x, v1 = y.y;
    }
    *(float2 *)(oh + cc) = make_float2(v0, v1);
}

template <int D, int KT, bool STAGE>
__global__ void __launch_bounds__(AM_THREADS, 1)
    attention_mma_kernel(struct attn_args a, int ring) {
    prefetch_row_plan(a.rows, blockIdx.x);
    PDL_START();
    extern __shared__ __align__(16) unsigned char smb[];
    am_smem<D> &sm = *(am_smem<D> *)smb;
    unsigned char(*st)[am_stage_bytes<KT>] = ((am_stage_smem<D, KT> *)smb)->st; // (STAGE)
    const struct rows_view &r = a.rows;
    int t = blockIdx.x, tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    if (r.row_seq[t] < 0) return; // a pad row: inert
    const struct row_keys rk = row_keys_of(a, t);
    int slot = rk.slot, len = rk.len, row0 = rk.row0, n_swa = rk.n_swa;
    int nk = rk.nk;
    const kv_fmt f = kv_fmt_or_f32(a.fmt, a.d);
    // the queries (heads past n_heads zero), the running statistics
    for (int i = tid; i < AM_HEADS * D / 4; i += AM_THREADS) {
        int h = i / (D / 4), c = 4 * (i % (D / 4));
        float4 x = h < a.n_heads
                       ? __ldg((const float4 *)(a.q + ((size_t)t * a.n_heads + h) * D + c))
                       : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        *(uint2 *)&sm.q[h][c] = make_uint2(pack_bf16(x.x, x.y), pack_bf16(x.z, x.w));
    }
    if (tid < AM_HEADS) sm.m[tid] = -INFINITY, sm.l[tid] = 0.0f;
    // batch bt of the key records: a chain of dependent loads each (the plan's picks and pages),
    // so one wait for 8 chunks, where a warp resolving a chunk's 32 held every chunk up
    static_assert(AM_THREADS % AM_KEYS == 0, "a batch of whole chunks");
    auto resolve = [&](int bt) {
        int j = bt * AM_THREADS + tid;
        sm.kr[bt & 1][tid] = j < nk ? key_ptr(a, f, t, j, n_swa, slot, len, row0) : NULL;
    };
    auto rec = [&](int c, int u) -> const void * { // chunk c's key u (ring: resolved a barrier
        int j = c * AM_KEYS + u;                   // before; else now, by the caller)
        if (ring) return sm.kr[(j / AM_THREADS) & 1][j % AM_THREADS];
        return j < nk ? key_ptr(a, f, t, j, n_swa, slot, len, row0) : NULL;
    };
    // without the ring: chunk c's records into kp by the first warp, then a barrier (the form
    // before the ring, kept to measure it against)
    auto chunk_kp = [&](int c) {
        if (tid < AM_KEYS) sm.kp[tid] = rec(c, tid);
        __syncthreads();
    };
    // chunk c's keys into buffer b: kp (the key's record, or NULL), made bf16 by 8 threads a key
    auto convert = [&](int c, int b) {
        int u = tid >> 3, sub = tid & 7;
        const void *p = STAGE || !ring ? sm.kp[u] : rec(c, u);
        uint4 hi[D / 128][2]; // columns 16 sub + 128 i, every load before the stores
        key16_terms_n<KT, false, D / 128, STAGE>(hi, NULL, p, f, 16 * sub, 128);
#pragma unroll
        for (int i = 0; i < D / 128; i++) {
            uint4 *dst = (uint4 *)&sm.k[b][u][16 * sub + 128 * i];
            dst[0] = hi[i][0], dst[1] = hi[i][1];
        }
    };
    // STAGE: chunk c's records into st (8 threads a key; sm.kp: its staged record or NULL)
    auto issue = [&](int c) {
        int u = tid >> 3, sub = tid & 7;
        const unsigned char *src = (const unsigned char *)rec(c, u);
        if (sub == 0) sm.kp[u] = src ? (const void *)st[u] : NULL;
        if constexpr (KT == TD_KV_FP8) { // (records of 8-byte multiples)
            for (int o = 8 * sub; src && o < f.rec; o += 64)
                cp_async8(&st[u][o], src + o);
        } else {
            for (int o = 16 * sub; src && o < f.rec; o += 128)
                cp_async16(&st[u][o], src + o, true);
        }
        cp_async_commit();
    };
    int n_chunks = (nk + AM_KEYS - 1) / AM_KEYS;
    constexpr int CB = AM_THREADS / AM_KEYS; // chunks a batch
    if (ring) {
        resolve(0);
        if (n_chunks > CB) resolve(1);
        __syncthreads();
    }
    if (STAGE && n_chunks) {
        issue(0);
        cp_async_wait<0>();
        __syncthreads();
        convert(0, 0);
        __syncthreads(); // (st and kp free)
        if (n_chunks > 1) issue(1);
    } else if (n_chunks) {
        if (!ring) chunk_kp(0);
        convert(0, 0);
    }
    constexpr int NT = D / 16; // O's tiles of 8 columns a warp (D / 2 columns)
    float o[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
        o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    int g = lane >> 2, tq = lane & 3;
    int ar = lane & 15, ak = (lane >> 4) * 8, br = (lane & 7) + (lane >> 4) * 8,
        bk = ((lane >> 3) & 1) * 8;
    for (int c = 0; c < n_chunks; c++) {
        int b = c & 1;
        __syncthreads(); // chunk c's keys and the queries are in; S and P are free
        // batch c / CB + 1 into the half of batch c / CB - 1, whose chunks are all read (the
        // last, c - 1, before this barrier; STAGE's copies run a chunk further ahead)
        if (ring && c % CB == 0 && c >= CB && c + CB < n_chunks) resolve(c / CB + 1);
        // S = Q K^T: heads 16 (w >> 1), keys 16 (w & 1) .. + 16
        {
            int hm = (w >> 1) * 16, kn = (w & 1) * 16;
            float sc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll 8
            for (int kk = 0; kk < D; kk += 16) {
                unsigned qa[4], kb[4];
                ldmatrix4(qa, &sm.q[hm + ar][kk + ak]);
                ldmatrix4(kb, &sm.k[b][kn + br][kk + bk]);
                mma_bf16(sc[0], qa[0], qa[1], qa[2], qa[3], kb[0], kb[1]);
                mma_bf16(sc[1], qa[0], qa[1], qa[2], qa[3], kb[2], kb[3]);
            }
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int col = kn + 8 * j + 2 * tq + (e & 1), h = hm + g + 8 * (e >> 1);
                    sm.s[h][col] = c * AM_KEYS + col < nk ? sc[j][e] * a.scale : -INFINITY;
                }
        }
        if (STAGE && c + 1 < n_chunks) {
            cp_async_wait<0>(); // chunk c + 1's records, copied while chunk c - 1 was multiplied
            __syncthreads();    // (every thread's: also orders S before the softmax)
            convert(c + 1, b ^ 1);
            __syncthreads(); // (st and kp free)
            if (c + 2 < n_chunks) issue(c + 2);
        } else {
            // S before the softmax (and k[b ^ 1]: chunk c - 1's, done); without the ring
            // chunk_kp's barrier is that one
            if (ring || c + 1 >= n_chunks) __syncthreads();
            if (c + 1 < n_chunks) {
                if (!ring) chunk_kp(c + 1);
                convert(c + 1, b ^ 1);
            }
        }
        { // the online softmax: 4 threads a head, 8 keys each
            int h = tid >> 2, q = tid & 3;
            float sv[8], mx = -INFINITY;
#pragma unroll
            for (int i = 0; i < 8; i++)
                sv[i] = sm.s[h][8 * q + i], mx = fmaxf(mx, sv[i]);
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            float mo = sm.m[h], mn = fmaxf(mo, mx);
            float cor = mn == -INFINITY ? 1.0f : mo == -INFINITY ? 0.0f : expf(mo - mn), sum = 0.0f;
            float pv[8];
#pragma unroll
            for (int i = 0; i < 8; i++)
                pv[i] = sv[i] == -INFINITY ? 0.0f : expf(sv[i] - mn), sum += pv[i];
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            *(uint4 *)&sm.p[h][8 * q] =
                make_uint4(pack_bf16(pv[0], pv[1]), pack_bf16(pv[2], pv[3]),
                           pack_bf16(pv[4], pv[5]), pack_bf16(pv[6], pv[7]));
            __syncwarp();
            if (q == 0) sm.m[h] = mn, sm.l[h] = sm.l[h] * cor + sum, sm.cor[h] = cor;
        }
        __syncthreads();
        { // O = O cor + P V: heads 16 (w & 3), columns (w >> 2) D / 2 ..
            int hm = (w & 3) * 16, cn = (w >> 2) * (D / 2);
            float c0 = sm.cor[hm + g], c1 = sm.cor[hm + g + 8];
#pragma unroll
            for (int j = 0; j < NT; j++)
                o[j][0] *= c0, o[j][1] *= c0, o[j][2] *= c1, o[j][3] *= c1;
#pragma unroll
            for (int ks = 0; ks < AM_KEYS; ks += 16) {
                unsigned pa[4];
                ldmatrix4(pa, &sm.p[hm + ar][ks + ak]);
                int kr = ks + (lane & 7) + ((lane >> 3) & 1) * 8, kc = (lane >> 4) * 8;
#pragma unroll
                for (int jp = 0; jp < NT / 2; jp++) {
                    unsigned vb[4];
                    ldmatrix4_trans(vb, &sm.k[b][kr][cn + 16 * jp + kc]);
                    mma_bf16(o[2 * jp], pa[0], pa[1], pa[2], pa[3], vb[0], vb[1]);
                    mma_bf16(o[2 * jp + 1], pa[0], pa[1], pa[2], pa[3], vb[2], vb[3]);
                }
            }
        }
    }
    __syncthreads();
    // out = O exp(m - M) / (l exp(m - M) + exp(sink - M)), M = max(m, sink); the trailing
    // rot_dim columns rotated back at the row's position (pairs (c, c + 1), c even)
    int hm = (w & 3) * 16, cn = (w >> 2) * (D / 2), p0 = a.inv_freq ? D - a.rot_dim : D;
#pragma unroll
    for (int e2 = 0; e2 < 2; e2++) {
        int h = hm + g + 8 * e2;
        if (h >= a.n_heads) continue;
        float m = sm.m[h], sink = a.sinks[h], M = fmaxf(m, sink);
        float sc = m == -INFINITY ? 0.0f : expf(m - M), tot = sm.l[h] * sc + expf(sink - M);
        float *oh = a.out + ((size_t)t * a.n_heads + h) * D;
#pragma unroll
        for (int j = 0; j < NT; j++) {
            am_pair_out(a, t, oh, cn + 8 * j + 2 * tq, o[j][2 * e2], o[j][2 * e2 + 1], sc, tot,
                        M == -INFINITY, p0);
        }
    }
}

/* The same on wgmma (attention_cuda_set_wg, TD_ATT_WGMMA=1; off until run on a GPU): a block
 * per row, two warpgroups, chunks of AW_KEYS keys. Shared memory holds the queries (64 heads x
 * 512, bf16) and two chunks of keys (64 x 512), each as 8 blocks of 64 columns, every row of a
 * block 128 bytes in the 128-byte swizzle (wgmma_tile.cuh), and P (64 heads x 64 keys). For S
 * = Q K^T warpgroup g takes keys 32 g .. + 32 (m64 n32, k over the 512 columns), K read
 * K-major; the softmax joins the two halves' row maxima and sums through shared memory (both
 * warpgroups hold every head's running max and sum, the same values); for O += P V warpgroup g
 * takes columns 256 g .. + 256 (m64 n256 over the chunk's keys), the same key buffer read
 * MN-major as V. The next chunk's keys are made bf16 while S runs. A row's result follows its
 * own keys only. */
#define AW_KEYS    64
#define AW_THREADS 256
struct aw_smem {
    __nv_bfloat16 q[8][64 * 64];         /* column block kb: heads x 64 columns */
    __nv_bfloat16 k[2][8][AW_KEYS * 64]; /* chunk buffer, column block: keys x 64 columns */
    __nv_bfloat16 p[64 * AW_KEYS];       /* heads x keys */
    float mx[2][64], sum[2][64];         /* each warpgroup's row maxima and sums of a chunk */
    const void *kp[2][AW_KEYS];          /* a chunk's key records (NULL: none) */
};
static constexpr size_t aw_smem_bytes = sizeof(struct aw_smem) + 1024;

static int aw_mode = -1; /* TD_ATT_WGMMA, attention_cuda_set_wg */
/* V's descriptor offsets swapped (tests: which order wgmma reads them in), passed to each launch
 * (a __device__ flag set by cudaMemcpyToSymbol failed on an H100: cudaErrorInvalidAddressSpace) */
static int aw_v_swap;

extern "C" void attention_cuda_set_wg(int on) {
    aw_mode = on < 0 ? -1 : on ? 1 : 0;
}

extern "C" void attention_cuda_set_wg_v_swap(int on) {
    aw_v_swap = on;
}

template <int KT>
__global__ void __launch_bounds__(AW_THREADS, 1)
    attention_wg_kernel(struct attn_args a, int v_swap) {
    prefetch_row_plan(a.rows, blockIdx.x);
    PDL_START();
    extern __shared__ __align__(16) unsigned char smb[];
    struct aw_smem &sm = *(struct aw_smem *)wg_align(smb);
    const struct rows_view &r = a.rows;
    int t = blockIdx.x, tid = threadIdx.x, lane = tid & 31, wg = tid >> 7, w = (tid >> 5) & 3;
    if (r.row_seq[t] < 0) return; // a pad row: inert
    const struct row_keys rk = row_keys_of(a, t);
    int slot = rk.slot, len = rk.len, row0 = rk.row0, n_swa = rk.n_swa;
    int nk = rk.nk, n_chunks = (nk + AW_KEYS - 1) / AW_KEYS;
    const kv_fmt f = kv_fmt_or_f32(a.fmt, a.d);
    // the queries (heads past n_heads zero), 8 columns a store
    for (int i = tid; i < 64 * 64; i += AW_THREADS) {
        int h = i >> 6, c = 8 * (i & 63);
        float4 x0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), x1 = x0;
        if (h < a.n_heads) {
            const float4 *src = (const float4 *)(a.q + ((size_t)t * a.n_heads + h) * 512 + c);
            x0 = __ldg(src), x1 = __ldg(src + 1); // (ld.global.nc: not held behind the stores)
        }
        *(uint4 *)&sm.q[c >> 6][wg_swz(h, (c & 63) >> 3)] =
            make_uint4(pack_bf16(x0.x, x0.y), pack_bf16(x0.z, x0.w), pack_bf16(x1.x, x1.y),
                       pack_bf16(x1.z, x1.w));
    }
    auto addrs = [&](int c) { // chunk c's key records into kp[c % 2], by the first 64 threads
        if (tid < AW_KEYS) {
            int j = c * AW_KEYS + tid;
            sm.kp[c & 1][tid] = j < nk ? key_ptr(a, f, t, j, n_swa, slot, len, row0) : NULL;
        }
    };
    auto convert = [&](int c) { // chunk c's keys as bf16 into k[c % 2]: 4 threads a key
        int u = tid >> 2, sub = tid & 3;
        const void *p = sm.kp[c & 1][u];
#pragma unroll
        for (int h = 0; h < 2; h++) { // columns 16 sub + 64 i, i < 8: two passes of four loads
            uint4 hi[4][2];
            key16_terms_n<KT, false, 4>(hi, NULL, p, f, 16 * sub + 256 * h, 64);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int c0 = 16 * sub + 256 * h + 64 * i; // columns c0 .. + 15: block c0 / 64
                __nv_bfloat16 *blk = sm.k[c & 1][c0 >> 6];
                int ch = (c0 & 63) >> 3;
                *(uint4 *)&blk[wg_swz(u, ch)] = hi[i][0];
                *(uint4 *)&blk[wg_swz(u, ch + 1)] = hi[i][1];
            }
        }
    };
    if (n_chunks) addrs(0);
    __syncthreads();
    if (n_chunks) convert(0);
    if (n_chunks > 1) addrs(1);
    wg_proxy_fence();
    __syncthreads();
    // this thread's rows: heads 16 w + g and + 8 (the same in both warpgroups)
    int g = lane >> 2, tq = lane & 3;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; i++)
        o[i] = 0.0f;
    unsigned v_lbo = v_swap ? 1024u : 64u * 128u, v_sbo = v_swap ? 64u * 128u : 1024u;
    for (int c = 0; c < n_chunks; c++) {
        int b = c & 1;
        float s[16];
#pragma unroll
        for (int i = 0; i < 16; i++)
            s[i] = 0.0f;
        wg_fence();
#pragma unroll
        for (int kb = 0; kb < 8; kb++)
#pragma unroll
            for (int kk = 0; kk < 4; kk++)
                wg_mma_n32(s, wg_desc(&sm.q[kb][16 * kk]),
                           wg_desc(&sm.k[b][kb][32 * wg * 64 + 16 * kk]));
        wg_commit();
        if (c + 1 < n_chunks) convert(c + 1); // (k[b ^ 1]: chunk c - 1's, done)
        if (c + 2 < n_chunks) addrs(c + 2);   // (kp[b]: chunk c's, converted)
        wg_proxy_fence();
        wg_wait<0>();
        wg_touch(s);
        // S: s[4 j + 2 e2 + e] is head 16 w + g + 8 e2, key 32 wg + 8 j + 2 tq + e
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = c * AW_KEYS + 32 * wg + 8 * j + 2 * tq + (e & 1);
                float v = key < nk ? s[4 * j + e] * a.scale : -INFINITY;
                s[4 * j + e] = v, mx[e >> 1] = fmaxf(mx[e >> 1], v);
            }
#pragma unroll
        for (int e2 = 0; e2 < 2; e2++) {
            mx[e2] = fmaxf(mx[e2], __shfl_xor_sync(0xffffffffu, mx[e2], 1));
            mx[e2] = fmaxf(mx[e2], __shfl_xor_sync(0xffffffffu, mx[e2], 2));
            if (tq == 0) sm.mx[wg][16 * w + g + 8 * e2] = mx[e2];
        }
        __syncthreads();
        float mn[2], cor[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int e2 = 0; e2 < 2; e2++) {
            int h = 16 * w + g + 8 * e2;
            mn[e2] = fmaxf(m[e2], fmaxf(sm.mx[0][h], sm.mx[1][h]));
            cor[e2] = mn[e2] == -INFINITY ? 1.0f : m[e2] == -INFINITY ? 0.0f : expf(m[e2] - mn[e2]);
        }
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e2 = 0; e2 < 2; e2++) {
                float p0 = s[4 * j + 2 * e2], p1 = s[4 * j + 2 * e2 + 1];
                p0 = p0 == -INFINITY ? 0.0f : expf(p0 - mn[e2]);
                p1 = p1 == -INFINITY ? 0.0f : expf(p1 - mn[e2]);
                sum[e2] += p0 + p1;
                int h = 16 * w + g + 8 * e2, key = 32 * wg + 8 * j + 2 * tq;
                *(unsigned *)&sm.p[h * 64 + (((key >> 3) ^ (h & 7)) << 3) + (key & 7)] =
                    pack_bf16(p0, p1);
            }
#pragma unroll
        for (int e2 = 0; e2 < 2; e2++) {
            sum[e2] += __shfl_xor_sync(0xffffffffu, sum[e2], 1);
            sum[e2] += __shfl_xor_sync(0xffffffffu, sum[e2], 2);
            if (tq == 0) sm.sum[wg][16 * w + g + 8 * e2] = sum[e2];
        }
        wg_proxy_fence();
        __syncthreads();
#pragma unroll
        for (int e2 = 0; e2 < 2; e2++) {
            int h = 16 * w + g + 8 * e2;
            l[e2] = l[e2] * cor[e2] + (sm.sum[0][h] + sm.sum[1][h]), m[e2] = mn[e2];
        }
#pragma unroll
        for (int j = 0; j < 32; j++)
            o[4 * j] *= cor[0], o[4 * j + 1] *= cor[0], o[4 * j + 2] *= cor[1],
                o[4 * j + 3] *= cor[1];
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < AW_KEYS / 16; ks++)
            wg_mma_n256t(o, wg_desc(&sm.p[16 * ks]),
                         wg_desc_mn(&sm.k[b][4 * wg][16 * ks * 64], v_lbo, v_sbo));
        wg_commit();
        wg_wait<0>();
        wg_touch(o);
        __syncthreads(); // k[b], p, mx and sum free
    }
    // out = O exp(m - M) / (l exp(m - M) + exp(sink - M)), M = max(m, sink); the trailing
    // rot_dim columns rotated back at the row's position (pairs (c, c + 1), c even)
    int p0 = a.inv_freq ? 512 - a.rot_dim : 512;
#pragma unroll
    for (int e2 = 0; e2 < 2; e2++) {
        int h = 16 * w + g + 8 * e2;
        if (h >= a.n_heads) continue;
        float sink = a.sinks[h], M = fmaxf(m[e2], sink);
        float sc = m[e2] == -INFINITY ? 0.0f : expf(m[e2] - M), tot = l[e2] * sc + expf(sink - M);
        float *oh = a.out + ((size_t)t * a.n_heads + h) * 512;
#pragma unroll
        for (int j = 0; j < 32; j++) {
            am_pair_out(a, t, oh, 256 * wg + 8 * j + 2 * tq, o[4 * j + 2 * e2],
                        o[4 * j + 2 * e2 + 1], sc, tot, M == -INFINITY, p0);
        }
    }
}

static size_t smem_set;

static void ensure_smem(size_t smem) {
    if (smem <= 48 * 1024 || smem <= smem_set) return;
    for (int d = 32; d <= ATTENTION_MAX_D; d *= 2)
        for (int kt = TD_KV_F32; kt <= TD_KV_FP8; kt++)
            by_columns(d, [&](auto nc) {
                by_kv(kt, [&](auto k) {
                    CUDA_CHECK(cudaFuncSetAttribute(
                        attention_rows_kernel<decltype(nc)::value, decltype(k)::value>,
                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
                });
            });
    smem_set = smem;
}

/* the tensor-core kernel's shared memory (past 48 KB) allowed once, at start-up for heads of 512
 * (attention_cuda_reserve: outside any capture) */
static void am_allow(void) {
    static bool done;
    if (done) return;
    for (int kt = TD_KV_F32; kt <= TD_KV_FP8; kt++)
        by_kv(kt, [&](auto k) {
            constexpr int KT = decltype(k)::value;
            CUDA_CHECK(cudaFuncSetAttribute(attention_mma_kernel<512, KT, false>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)sizeof(am_smem<512>)));
            CUDA_CHECK(cudaFuncSetAttribute(attention_mma_kernel<512, KT, true>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)sizeof(am_stage_smem<512, KT>)));
            CUDA_CHECK(cudaFuncSetAttribute(attention_wg_kernel<KT>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)aw_smem_bytes));
        });
    done = true;
}

/* the widest rows a model gives the kernel, checked and allowed once before any step: a head
 * wider than a block's lanes hold, or key addresses past a block's shared memory, is refused
 * with the numbers (rather than failing at the first step) */
extern "C" int attention_cuda_reserve(const struct td_reserve *r, char *err, size_t errlen) {
    if (r->head_dim > ATTENTION_MAX_D)
        return td_errf(err, errlen,
                       "backend cuda: head_dim %d is more than the attention kernel's %d",
                       r->head_dim, ATTENTION_MAX_D);
    size_t smem = attention_smem(r->head_dim, r->max_keys, r->n_heads);
    int most = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    if (smem > (size_t)most)
        return td_errf(err, errlen,
                       "backend cuda: the attention needs %zu bytes of shared memory a block (the "
                       "keys of the widest row: %d), the GPU has %d",
                       smem, r->max_keys, most);
    ensure_smem(smem);
    if (r->head_dim == 512) am_allow();
    return 0;
}

extern "C" void attention_rows_cuda(const struct attn_args *a) {
    if (!a->rows.n_tok) return;
    TD_ASSERT(a->d <= ATTENTION_MAX_D); // attention_cuda_reserve refuses such models first
    static int from = -1;               // (TD_ATT_WIDE_ROWS, read once)
    if (from < 0) from = getenv("TD_ATT_WIDE_ROWS") ? atoi(getenv("TD_ATT_WIDE_ROWS")) : AM_ROWS;
    bool wide = am_mode == 1 || (am_mode == 0 && a->rows.n_tok >= (from > 0 ? from : AM_ROWS));
    if (wide && !as().deterministic && a->d == 512 && a->n_heads <= AM_HEADS &&
        (!a->inv_freq || (a->d - a->rot_dim) % 2 == 0)) {
        am_allow();
        if (am_stage < 0) am_stage = td_env_on("TD_ATT_STAGE");
        if (am_ring < 0) am_ring = td_env_on("TD_ATT_RING");
        if (aw_mode < 0) aw_mode = td_env_on("TD_ATT_WGMMA");
        kv_fmt f = kv_fmt_or_f32(a->fmt, a->d);
        by_kv(f.dtype, [&](auto k) {
            constexpr int KT = decltype(k)::value;
            if (aw_mode)
                launch_k(attention_wg_kernel<KT>, a->rows.n_tok, AW_THREADS, aw_smem_bytes,
                         td_cuda_stream(), *a, aw_v_swap);
            else if (am_stage && f.rec <= am_stage_bytes<KT>)
                launch_k(attention_mma_kernel<512, KT, true>, a->rows.n_tok, AM_THREADS,
                         sizeof(am_stage_smem<512, KT>), td_cuda_stream(), *a, am_ring);
            else
                launch_k(attention_mma_kernel<512, KT, false>, a->rows.n_tok, AM_THREADS,
                         sizeof(am_smem<512>), td_cuda_stream(), *a, am_ring);
        });
        LAUNCH_CHECK();
        return;
    }
    // capacity: the window plus every compressed entry a row may see (top-k or all visible);
    // the configuration's, not the ring's (whose slack an engine sets: with a drafter and the
    // prefix cache it holds 129 rows more, and the split of a row's keys must not move with it)
    int max_keys =
        a->swa_keys + (a->entries ? (a->use_topk ? a->rows.topk_stride : a->n_entries) : 0);
    size_t smem = attention_smem(a->d, max_keys, a->n_heads);
    ensure_smem(smem);
    // V's rope pairs columns (p0 + 2i, p0 + 2i + 1): the kernel finds a partner at lane ^ 1
    TD_ASSERT(!a->inv_freq || (a->d - a->rot_dim) % 2 == 0);
    int ks = attention_splits(max_keys), hg = attention_heads(a->n_heads);
    dim3 grid(a->rows.n_tok * ks, a->n_heads / hg);
    by_columns(a->d, [&](auto nc) {
        by_kv(kv_fmt_or_f32(a->fmt, a->d).dtype, [&](auto k) {
            launch_kc(attention_rows_kernel<decltype(nc)::value, decltype(k)::value>, grid, 32 * hg,
                      smem, ks, td_cuda_stream(), *a, max_keys, ks);
        });
    });
    LAUNCH_CHECK();
}
