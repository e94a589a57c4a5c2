/* attention.cu: the sparse MQA-with-sinks entry point on the GPU, one block (or a cluster) per
 * (row, group of heads); each row's keys come from the step metadata through rows.h's
 * rows_key_row, as in attention_rows_ref (see attention.h). fp32 throughout: the block stages
 * its keys in shared memory once for all its heads, a warp per head runs an online softmax
 * over them, and the blocks' parts are joined in order. */
#include <cooperative_groups.h>
#include <type_traits>

#include "attention.h"
#include "cuda_common.cuh"

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
    return (const unsigned char *)a.entries + ((size_t)slot * a.n_entries + w) * f.rec;
}

/* column c of key p (key_ptr), the cache's precision KT known at compile time */
template <int KT> __device__ __forceinline__ float key_at(const void *p, const kv_fmt &f, int c) {
    kv_fmt g = f;
    g.dtype = KT;
    return kv_get(p, g, c);
}

/* A lane's NC contiguous columns c0 .. c0 + NC - 1 of a bf16 or fp8 key p (KT), as the
 * kernel reads typed caches: 8-byte loads (records are 8-byte multiples), a main key's codes
 * within one block of 64 and so one scale byte a lane. e4m3 s.eeee.mmm goes to fp32 bits
 * s.0000eeee.mmm0..., the code times 2^-120 (subnormal codes to fp32 denormals, exactly), then
 * times 2^120 and the block's scale: kv_get's values, bit for bit. A NaN code (low 7 bits all
 * set) and a lane's columns across the codes' end or d take kv_get column by column. */
template <int NC, int KT>
__device__ __forceinline__ void key_lane(const void *p, const kv_fmt &f, int c0, float *v) {
    const unsigned char *b = (const unsigned char *)p;
    if (c0 + NC <= f.d) {
        if (KT == TD_KV_BF16 || c0 >= f.n8) { // bf16 columns (fp8: the tail, 8-byte aligned)
            const unsigned char *q =
                KT == TD_KV_BF16 ? b + 2 * c0 : b + f.tail_at + 2 * (c0 - f.n8);
            if (((uintptr_t)q & 7) == 0) {
#pragma unroll
                for (int j = 0; j < NC / 4; j++) {
                    uint2 w = ((const uint2 *)q)[j];
                    v[4 * j] = __uint_as_float(w.x << 16),
                          v[4 * j + 1] = __uint_as_float(w.x & 0xFFFF0000u);
                    v[4 * j + 2] = __uint_as_float(w.y << 16),
                              v[4 * j + 3] = __uint_as_float(w.y & 0xFFFF0000u);
                }
                return;
            }
        } else if (c0 + NC <= f.n8 && c0 / KV_FP8_BLOCK == (c0 + NC - 1) / KV_FP8_BLOCK) {
            const uint2 *q = (const uint2 *)(b + c0);
            float sc = kv_fp8_scale_val(b[f.n8 + c0 / KV_FP8_BLOCK]);
            unsigned nan = 0;
            uint2 w[NC / 8];
#pragma unroll
            for (int j = 0; j < NC / 8; j++) {
                w[j] = q[j];
                nan |=
                    ((w[j].x & 0x7F7F7F7Fu) + 0x01010101u) | ((w[j].y & 0x7F7F7F7Fu) + 0x01010101u);
            }
            if (!(nan & 0x80808080u)) {
#pragma unroll
                for (int j = 0; j < NC; j++) {
                    unsigned c = ((j & 7) < 4 ? w[j / 8].x : w[j / 8].y) >> (8 * (j & 3));
                    float e = __uint_as_float(((c & 0x80u) << 24) | ((c & 0x7Fu) << 20));
                    v[j] = e * 0x1p120f * sc;
                }
                return;
            }
        }
    }
#pragma unroll
    for (int j = 0; j < NC; j++)
        v[j] = c0 + j < f.d ? key_at<KT>(p, f, c0 + j) : 0.0f;
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

/* f(KT) with KT, the key cache's precision, a compile-time constant */
template <typename F> static void by_kv(int kt, F &&f) {
    if (kt == TD_KV_BF16)
        f(std::integral_constant<int, TD_KV_BF16>{});
    else if (kt == TD_KV_FP8)
        f(std::integral_constant<int, TD_KV_FP8>{});
    else
        f(std::integral_constant<int, TD_KV_F32>{});
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
    return 0;
}

extern "C" void attention_rows_cuda(const struct attn_args *a) {
    if (!a->rows.n_tok) return;
    TD_ASSERT(a->d <= ATTENTION_MAX_D); // attention_cuda_reserve refuses such models first
    // capacity: the window plus every compressed entry a row may see (top-k or all visible)
    int max_keys =
        a->swa_rows + (a->entries ? (a->use_topk ? a->rows.topk_stride : a->n_entries) : 0);
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
