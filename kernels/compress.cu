/* compress.cu: compressor position bias, entry emission (pool, norm, rope) and ring stores on
 * the GPU (see compress.h). One block per row for emission; rows that close no window exit. */
#include "compress.h"
#include "cuda_common.cuh"

#define MAX_SLOTS    512
#define EMIT_BATCH   8
#define EMIT_THREADS 128
#define EMIT_PAIRS   4 /* channel pairs per thread: entries of up to 1024 channels */

__global__ void add_pos_bias_kernel(float *x, const void *bias, int dt, const int32_t *positions,
                                    int rate, int n, int width) {
    PDL_START();
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= (long long)n * width) return;
    int t = (int)(i / width), j = (int)(i % width);
    x[i] += ld_f32(bias, dt, (long long)(positions[t] % rate) * width + j);
}

__global__ void compress_emit_kernel(struct compress_args a) {
    prefetch_row_plan(a.rows, blockIdx.x);
    prefetch_l2(a.norm, (size_t)a.d * td_dtype_size((enum td_dtype)a.norm_dtype));
    if (threadIdx.x == 0) prefetch_l2_line(a.inv_freq);
    PDL_START();
    const struct rows_view *r = &a.rows;
    int t = blockIdx.x, w = r->emit[t];
    if (w < 0) return;
    __shared__ long long off_kv[MAX_SLOTS];
    __shared__ unsigned char from_ring[MAX_SLOTS];
    __shared__ int n_slots;
    __shared__ float cs[256], sn[256];
    extern __shared__ float e[]; // [d]
    // the entry's rope at position w * rate first: it needs nothing of the window, so its
    // double sincos is off the chain of loads below
    int half = a.rot_dim / 2;
    float pos = (float)((long long)w * a.rate);
    for (int i = blockDim.x - 1 - threadIdx.x; i < half; i += blockDim.x) // the last warps
        rope_cos_sin(pos, a.inv_freq, i, a.attn_factor, &cs[i], &sn[i]);
    float wn[2 * EMIT_PAIRS]; // this thread's channel pairs' norm weights, loaded early too
#pragma unroll
    for (int k = 0; k < EMIT_PAIRS; k++) {
        int p = threadIdx.x + k * blockDim.x;
        wn[2 * k] = p < a.d / 2 ? ld_f32(a.norm, a.norm_dtype, 2 * p) : 0.0f;
        wn[2 * k + 1] = p < a.d / 2 ? ld_f32(a.norm, a.norm_dtype, 2 * p + 1) : 0.0f;
    }
    int sq = r->row_seq[t], slot = r->slot[sq], len = r->len_before[sq], row0 = r->qo_indptr[sq];
    // the window's slots, one thread each: CSA takes the previous window's Ca half (absent for
    // w = 0), then the own Cb half; slot q is this step's row or the ring's
    int first_half = a.overlap ? 0 : 1, skip = (a.overlap && w == 0) ? a.rate : 0;
    int ns = (2 - first_half) * a.rate - skip;
    for (int i = threadIdx.x; i < ns; i += blockDim.x) {
        int j = i + skip, half = first_half + j / a.rate, s = j % a.rate;
        int q = (w - (half == 0)) * a.rate + s, off = (a.overlap && half) ? a.d : 0;
        int in_ring;
        off_kv[i] = rows_where(q, len, row0, slot, a.ring, &in_ring) * a.width + off;
        from_ring[i] = in_ring;
    }
    if (threadIdx.x == 0) n_slots = ns;
    __syncthreads();
    // softmax over the slots per channel: the max, then one exp per slot for both sums. The
    // loads of EMIT_BATCH slots are made before any is used, so they are in flight together: a
    // loop that loaded and used one slot at a time waited out a memory round trip per slot
    // (7 us per emitting call on tandem-tiny's CSA layers, against 2 for a call that emits none)
    for (int c = threadIdx.x; c < a.d; c += blockDim.x) {
        float mx = -INFINITY;
        for (int s0 = 0; s0 < n_slots; s0 += EMIT_BATCH) {
            float g[EMIT_BATCH];
#pragma unroll
            for (int u = 0; u < EMIT_BATCH; u++) {
                int s = s0 + u;
                g[u] =
                    s < n_slots ? (from_ring[s] ? a.ring_gate : a.gate)[off_kv[s] + c] : -INFINITY;
            }
#pragma unroll
            for (int u = 0; u < EMIT_BATCH; u++)
                mx = fmaxf(mx, g[u]);
        }
        float den = 0.0f, num = 0.0f;
        for (int s0 = 0; s0 < n_slots; s0 += EMIT_BATCH) {
            float g[EMIT_BATCH], k[EMIT_BATCH];
#pragma unroll
            for (int u = 0; u < EMIT_BATCH; u++) {
                int s = s0 + u;
                g[u] = s < n_slots ? (from_ring[s] ? a.ring_gate : a.gate)[off_kv[s] + c] : 0.0f;
                k[u] = s < n_slots ? (from_ring[s] ? a.ring_kv : a.raw)[off_kv[s] + c] : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < EMIT_BATCH; u++)
                if (s0 + u < n_slots) {
                    float p = expf(g[u] - mx);
                    den += p;
                    num += p * k[u];
                }
        }
        e[c] = num / den;
    }
    __syncthreads();
    float ss = 0.0f;
    for (int c = threadIdx.x; c < a.d; c += blockDim.x)
        ss += e[c] * e[c];
    ss = block_sum(ss);
    float rr = rsqrtf(ss / a.d + a.eps);
    // norm, rope and store, a channel pair per thread: the pair is in no other thread's way
    float *dst = a.entries + (a.by_row ? (long long)t : rows_entry(&a.rows, sq, w, a.per)) * a.d;
    int p0 = (a.d - a.rot_dim) / 2;
#pragma unroll
    for (int k = 0; k < EMIT_PAIRS; k++) {
        int p = threadIdx.x + k * blockDim.x;
        if (p >= a.d / 2) break;
        float x0 = e[2 * p] * rr * wn[2 * k], x1 = e[2 * p + 1] * rr * wn[2 * k + 1];
        float2 y = p >= p0 ? rope_pair(x0, x1, cs[p - p0], sn[p - p0]) : make_float2(x0, x1);
        dst[2 * p] = y.x, dst[2 * p + 1] = y.y;
    }
}

/* one thread per (row, column of all parts): part i owns columns off[i] .. off[i + 1] - 1 */
struct ring_cols {
    struct ring_parts p;
    int off[RING_PARTS_MAX + 1];
};

__global__ void ring_store_kernel(const __grid_constant__ struct ring_cols c, const int32_t *write,
                                  struct rows_view r, int ring_rows) {
    PDL_START();
    int total = c.off[c.p.m];
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= (long long)r.n_tok * total) return;
    int t = (int)(i / total), j = (int)(i % total), k = 0;
    if (write[t] < 0) return;
    while (k + 1 < c.p.m && j >= c.off[k + 1])
        k++;
    int w = c.p.width[k], col = j - c.off[k];
    int slot = r.slot[r.row_seq[t]];
    c.p.ring[k][((size_t)slot * ring_rows + write[t]) * w + col] = c.p.rows[k][(size_t)t * w + col];
}

/* one thread per (row, column) */
__global__ void ring_load_kernel(float *rows, const float *ring, struct rows_view r, int ring_rows,
                                 int width) {
    PDL_START();
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= (long long)r.n_tok * width) return;
    int t = (int)(i / width), j = (int)(i % width), s = r.row_seq[t];
    rows[i] = s < 0
                  ? 0.0f
                  : ring[((size_t)r.slot[s] * ring_rows + r.positions[t] % ring_rows) * width + j];
}

extern "C" void add_pos_bias_cuda(float *x, const void *bias, enum td_dtype bias_dtype,
                                  const int32_t *positions, int rate, int n, int width) {
    if (!n) return;
    launch_k(add_pos_bias_kernel, ceil_div((long long)n * width, 256), 256, 0, td_cuda_stream(), x,
             bias, bias_dtype, positions, rate, n, width);
    LAUNCH_CHECK();
}

/* an entry width and rotary dims the emit kernel takes: even, a thread's pairs hold it */
static bool emit_width_ok(int d, int rot_dim) {
    return d % 2 == 0 && rot_dim % 2 == 0 && rot_dim <= d && rot_dim <= 512 &&
           d <= 2 * EMIT_PAIRS * EMIT_THREADS;
}

extern "C" int compress_cuda_reserve(const struct td_reserve *r, char *err, size_t errlen) {
    if (!r->comp_slots) return 0; // no compressed layer
    if (r->comp_slots > MAX_SLOTS)
        return td_errf(err, errlen,
                       "backend cuda: a compressor window pools %d rows, the kernel at most %d",
                       r->comp_slots, MAX_SLOTS);
    return reserve_widths(r, emit_width_ok, "compressed entries", 2 * EMIT_PAIRS * EMIT_THREADS,
                          err, errlen);
}

extern "C" void compress_emit_cuda(const struct compress_args *a) {
    if (!a->rows.n_tok) return;
    // compress_cuda_reserve refuses such models first
    TD_ASSERT((1 + a->overlap) * a->rate <= MAX_SLOTS && emit_width_ok(a->d, a->rot_dim));
    launch_k(compress_emit_kernel, a->rows.n_tok, EMIT_THREADS, (size_t)a->d * sizeof(float),
             td_cuda_stream(), *a);
    LAUNCH_CHECK();
}

extern "C" void ring_store_parts_cuda(const struct ring_parts *p, const int32_t *write,
                                      const struct rows_view *r, int ring_rows) {
    struct ring_cols c = {};
    c.p = *p;
    for (int i = 0; i < p->m; i++)
        c.off[i + 1] = c.off[i] + p->width[i];
    if (!r->n_tok || !c.off[p->m]) return;
    launch_k(ring_store_kernel, ceil_div((long long)r->n_tok * c.off[p->m], 256), 256, 0,
             td_cuda_stream(), c, write, *r, ring_rows);
    LAUNCH_CHECK();
}

extern "C" void ring_load_cuda(float *rows, const float *ring, const struct rows_view *r,
                               int ring_rows, int width) {
    if (!r->n_tok || !width) return;
    launch_k(ring_load_kernel, ceil_div((long long)r->n_tok * width, 256), 256, 0, td_cuda_stream(),
             rows, ring, *r, ring_rows, width);
    LAUNCH_CHECK();
}
