/* attention.cu: the sparse MQA-with-sinks entry point on the GPU, one block (or a cluster) per
 * (row, head); each row's keys come from the step metadata through rows.h's rows_key_row, as in
 * attention_rows_ref (see attention.h). fp32 throughout: each warp an online softmax over its
 * groups of the row's keys (their addresses resolved once into shared memory), the warps' parts
 * joined in order. */
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

/* The CUDA kernel splits each row's keys into this many contiguous slices, one block of a
 * cluster each, for models of few heads (tandem-tiny's 8: a batch-1 step would fill 8 blocks)
 * and rows of up to max_keys >= 128 keys. It follows the configuration, never the batch.
 * (With the Flash slice's 64 heads a split of 4 left batch 1 unchanged and cost batch 8 7%.) */
static int attention_splits(int n_heads, int max_keys) {
    return n_heads <= 16 && max_keys >= 128 ? 4 : 1;
}

/* The CUDA kernel's threads a block: a warp per group of keys, 16 of them for the Flash
 * slice's head_dim 512 (a 128-thread block that walked the 512 columns in four passes of
 * dependent key loads took 49 us per layer at batch 1, 24 with 512). It follows d alone, and
 * so does the order in which the block joins its warps' parts. A lane holds d / 32 columns,
 * at most ATTENTION_MAX_D / 32. */
#define ATTENTION_MAX_D 512
static int attention_threads(int d) {
    return d > 256 ? 512 : d > 128 ? 256 : 128;
}

/* Shared memory of the CUDA kernel's block for rows of up to max_keys keys of d floats: its
 * slice's key addresses, its warps' output parts, maxima and sums, its own part, max and sum. */
static size_t attention_smem(int d, int max_keys, int n_heads) {
    int s = attention_splits(n_heads, max_keys), slice = (max_keys + s - 1) / s;
    int nw = attention_threads(d) / 32;
    return (size_t)slice * sizeof(float *) +
           ((size_t)(nw + 1) * d + 2 + 2 * (size_t)nw) * sizeof(float);
}

#define ATT_KEYS       4
#define ATT_MAX_SPLITS 4 /* the most attention_splits gives */

/* A cluster of ks blocks per (row, head) (attention_splits): the heads of a row run side by
 * side, and block r of the cluster takes the r-th contiguous slice of the row's keys. Each
 * block resolves its keys' addresses once into shared memory; then each warp takes groups of
 * ATT_KEYS keys (warp w: keys 4w .. 4w + 3, then 4 (w + nw) ..), all their loads in flight
 * together, and reads each key once: lane l holds columns l, l + 32, .. (NC of them; typed
 * caches: NC l .. NC l + NC - 1, key_lane) of the query, of each key and of its output part, scores
 * the keys (one warp sum each) and keeps the running max m_w, sum l_w of exp(s_j - m_w) and part
 * o_w = sum_j exp(s_j - m_w) k_j, in key order. The block joins its warps' parts in warp order into
 * its own m_r, l_r and o_r. Block 0 then reads the others' (through distributed shared memory when
 * ks > 1) and writes, in block order, out = sum_r exp(m_r - M) o_r / (sum_r exp(m_r - M) l_r +
 * exp(sink - M)),  M = max(m_r, sink). The slices and the warps' keys follow the row's key count,
 * ks the configuration, so a row's result never depends on the rows beside it. (A warp per key
 * group that read each key twice, once to score and once, a thread per column walking every key,
 * for the output, took 17 us a call on the Flash slice at batch 1: the walk was a chain of
 * dependent L2 round trips.) */
template <int NC, int KT>
__global__ void __launch_bounds__(512)
    attention_rows_kernel(struct attn_args a, int max_keys, int ks) {
    prefetch_row_plan(a.rows, blockIdx.x / ks); // (the plan entries the key addresses need)
    PDL_START();
    extern __shared__ float sm[]; // key pointers[slice], the warps' parts [nw][d], o[d], m, l
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
    TD_DEV_ASSERT(nj <= slice); // kp[] holds a slice: the plan's and the rings' sizes promise it
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const kv_fmt f = kv_fmt_or_f32(a.fmt, a.d);
    const void **kp = (const void **)sm;
    float *ow = (float *)(kp + slice), *o = ow + (size_t)nw * a.d, *ml = o + a.d;
    float *mw = ml + 2, *sw = mw + nw; // the warps' maxima, then their scales
    for (int j = threadIdx.x; j < nj; j += blockDim.x)
        kp[j] = key_ptr(a, f, t, j0 + j, n_swa, slot, len, row0);
    const float *qh = a.q + ((size_t)t * a.n_heads + h) * a.d;
    // a lane's columns: lane, lane + 32, .. (fp32 keys: each load a warp's 128 bytes), or NC
    // contiguous ones (typed keys, key_lane: 8-byte loads of a lane's own codes and one scale)
    constexpr bool CONTIG = KT != TD_KV_F32 && NC % 8 == 0;
    auto col = [&](int i) { return CONTIG ? NC * lane + i : lane + 32 * i; };
    float qv[NC], acc[NC];
#pragma unroll
    for (int i = 0; i < NC; i++) {
        int c = col(i);
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
    for (int q0 = warp * ATT_KEYS; q0 < nj; q0 += nw * ATT_KEYS) {
        float kv[ATT_KEYS][NC], sc[ATT_KEYS];
#pragma unroll
        for (int u = 0; u < ATT_KEYS; u++) {
            const void *k = q0 + u < nj ? kp[q0 + u] : NULL;
            if constexpr (CONTIG) {
                if (k)
                    key_lane<NC, KT>(k, f, NC * lane, kv[u]);
                else
#pragma unroll
                    for (int i = 0; i < NC; i++)
                        kv[u][i] = 0.0f;
            } else {
#pragma unroll
                for (int i = 0; i < NC; i++) {
                    int c = col(i);
                    kv[u][i] = k && c < a.d ? key_at<KT>(k, f, c) : 0.0f;
                }
            }
        }
        float mn = m;
#pragma unroll
        for (int u = 0; u < ATT_KEYS; u++) {
            float dot = 0.0f;
#pragma unroll
            for (int i = 0; i < NC; i++)
                dot += qv[i] * kv[u][i];
            dot = warp_sum(dot) * a.scale;
            sc[u] = q0 + u < nj ? dot : -INFINITY;
            mn = fmaxf(mn, sc[u]);
        }
        float cor = m == -INFINITY ? 0.0f : expf(m - mn); // (mn is finite: key q0 is real)
        sum *= cor;
#pragma unroll
        for (int i = 0; i < NC; i++)
            acc[i] *= cor;
#pragma unroll
        for (int u = 0; u < ATT_KEYS; u++) {
            float p = q0 + u < nj ? expf(sc[u] - mn) : 0.0f;
            sum += p;
#pragma unroll
            for (int i = 0; i < NC; i++)
                acc[i] += p * kv[u][i];
        }
        m = mn;
    }
    // the block's part: its warps' parts joined in warp order (a warp without keys adds 0)
#pragma unroll
    for (int i = 0; i < NC; i++) {
        int c = col(i);
        if (c < a.d) ow[(size_t)warp * a.d + c] = acc[i];
    }
    if (lane == 0) mw[warp] = m, sw[warp] = sum;
    __syncthreads();
    float mx = -INFINITY;
    for (int w = 0; w < nw; w++)
        mx = fmaxf(mx, mw[w]);
    float den = 0.0f;
    for (int w = 0; w < nw; w++)
        den += mw[w] == -INFINITY ? 0.0f : expf(mw[w] - mx) * sw[w];
    __syncthreads(); // every thread has read the sums before they become scales
    if (threadIdx.x < nw)
        sw[threadIdx.x] = mw[threadIdx.x] == -INFINITY ? 0.0f : expf(mw[threadIdx.x] - mx);
    __syncthreads();
    for (int c = threadIdx.x; c < a.d; c += blockDim.x) {
        float v = 0.0f;
        for (int w = 0; w < nw; w++)
            v += sw[w] * ow[(size_t)w * a.d + c];
        o[c] = v;
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
    int ks = attention_splits(a->n_heads, max_keys);
    dim3 grid(a->rows.n_tok * ks, a->n_heads);
    by_columns(a->d, [&](auto nc) {
        by_kv(kv_fmt_or_f32(a->fmt, a->d).dtype, [&](auto k) {
            launch_kc(attention_rows_kernel<decltype(nc)::value, decltype(k)::value>, grid,
                      attention_threads(a->d), smem, ks, td_cuda_stream(), *a, max_keys, ks);
        });
    });
    LAUNCH_CHECK();
}
