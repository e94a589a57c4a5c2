/* greedy.cu: the tokens of greedy.h on the GPU: argmaxes as each thread's best argmax_key (the
 * larger value, then the lower id) folded over the block (block_max_key) and the row's spans;
 * sampled rows by their spans' sums (sample_rows below). */
#include "cuda_common.cuh"
#include "greedy.h"

#include <climits>

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

/* sample_rows: grid (spans, rows), each block a span of AR_SPAN entries. A greedy row's blocks
 * fold their argmax keys (atomicMax: a max, the same in any order) and bad flags; a sampled
 * row's blocks each write their span's largest entry m, its sum of expf((x - m) / T) in fp64 (a
 * thread's entries in order, then the threads in a fixed tree) and a bad flag. The row's last
 * block to finish (a counter) chooses: the argmax, or the sampled span by the spans' sums scaled
 * to the row's largest entry, in span order, then the token in that span by a scan of its
 * entries in order (the first whose cumulative sum passes u times the row's; the span's last
 * entry with mass where rounding leaves none). It leaves the scratch zero. One block per row
 * took 104 us for an argmax of the Flash slice's 129280 entries. */
#define AR_SPAN    4096
#define SR_THREADS 256
#define SR_PER     (AR_SPAN / SR_THREADS)

struct sr_span {
    float m;
    int bad;
    double s;
};

/* a context's (cuda_ctx.h) */
struct greedy_state {
    unsigned long long *ar_key;
    int *ar_bad, *ar_done;
    struct sr_span *sr_spans;
    int ar_rows;
    long long sr_cap;
};

static void greedy_release(void *p) {
    struct greedy_state *g = (struct greedy_state *)p;
    cudaFree(g->ar_key), cudaFree(g->ar_bad), cudaFree(g->ar_done), cudaFree(g->sr_spans);
}

static struct greedy_state &gs(void) {
    return td_cuda_ctx_state<struct greedy_state>(TD_CTX_GREEDY, greedy_release);
}

__device__ __forceinline__ double block_sum_f64(double v) {
    __shared__ double part[32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) part[w] = v;
    __syncthreads();
    double r = 0.0;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++)
        r += part[i];
    return r;
}

/* the inverse CDF over the entries the block's threads hold in order (thread t: [v0, v1), each
 * of mass(v) >= 0 in fp64): the first entry at which base plus the cumulative sum passes
 * target; where rounding leaves none, the last entry with mass; -1 when none has any. The
 * threads' sums are added in thread order (thread 0, NT of them). Every thread calls it and
 * gets the same. */
template <int NT, typename Mass>
__device__ int block_inverse_cdf(int v0, int v1, double base, double target, Mass mass) {
    __shared__ double part[NT];
    __shared__ int found, last_nz;
    double own = 0.0;
    for (int v = v0; v < v1; v++)
        own += mass(v);
    part[threadIdx.x] = own;
    if (!threadIdx.x) found = INT_MAX, last_nz = -1;
    __syncthreads();
    if (!threadIdx.x) {
        double c = base;
        for (int i = 0; i < NT; i++) {
            double x = part[i];
            part[i] = c;
            c += x;
        }
    }
    __syncthreads();
    double c = part[threadIdx.x];
    int first = INT_MAX, nz = -1;
    for (int v = v0; v < v1; v++) {
        double e = mass(v);
        if (e <= 0.0) continue;
        c += e;
        nz = v;
        if (target < c) {
            first = v;
            break;
        }
    }
    if (first != INT_MAX) atomicMin(&found, first);
    if (nz >= 0) atomicMax(&last_nz, nz);
    __syncthreads();
    return found != INT_MAX ? found : last_nz;
}

// the token of a sampled row whose spans' (m, bad, s) are in sp[0 .. nb): -1 when one is bad
__device__ int sample_choose(const float *r, int V, float T, double u, const struct sr_span *sp,
                             int nb) {
    __shared__ int span;
    __shared__ double before, scale, target;
    if (!threadIdx.x) {
        float M = -INFINITY;
        int bad = 0;
        for (int j = 0; j < nb; j++) {
            M = fmaxf(M, __ldcg(&sp[j].m));
            bad |= __ldcg(&sp[j].bad);
        }
        span = -1;
        if (!bad) {
            double S = 0.0;
            for (int j = 0; j < nb; j++)
                S += __ldcg(&sp[j].s) * exp((double)(__ldcg(&sp[j].m) - M) / T);
            double t = u * S, c = 0.0;
            int nz = 0;
            for (int j = 0; j < nb; j++) {
                double cj = __ldcg(&sp[j].s) * exp((double)(__ldcg(&sp[j].m) - M) / T);
                if (cj > 0.0) nz = j;
                if (span < 0 && t < c + cj) span = j, before = c;
                c += cj;
            }
            if (span < 0) span = nz, before = c; // (rounding: the last span with mass)
            target = t;
            scale = exp((double)(__ldcg(&sp[span].m) - M) / T);
        }
    }
    __syncthreads();
    if (span < 0) return -1;
    float m = __ldcg(&sp[span].m);
    double sc = scale, t = target;
    int v0 = span * AR_SPAN + (int)threadIdx.x * SR_PER, v1 = min(V, v0 + SR_PER);
    return block_inverse_cdf<SR_THREADS>(v0, v1, before, t,
                                         [&](int v) { return (double)expf((r[v] - m) / T) * sc; });
}

// whether row s draws from a cut distribution (top-k or top-p): sample_cut_kernel's row
__device__ __forceinline__ bool row_cut(const sample_row &s, int V) {
    return sample_row_cut(s.temperature, s.top_k, s.top_p, V);
}

__global__ void sample_rows_kernel(int32_t *ids, const float *x, int V, const sample_row *sr,
                                   unsigned long long *key, int *badf, int *done,
                                   struct sr_span *spans) {
    PDL_START();
    int i = blockIdx.y, b = blockIdx.x, nb = gridDim.x, v0 = b * AR_SPAN, v1 = min(V, v0 + AR_SPAN);
    const float *r = x + (size_t)i * V;
    float T = sr[i].temperature;
    if (row_cut(sr[i], V)) return; // sample_cut_kernel's
    if (!(T > 0.0f)) {             // the argmax
        int bad;
        unsigned long long best = span_argmax(r, v0, v1, &bad);
        if (!threadIdx.x && fold_argmax_last(&key[i], &badf[i], &done[i], &best, &bad, nb))
            ids[i] = bad ? -1 : argmax_key_index(best);
        return;
    }
    float z[SR_PER], m = -INFINITY;
    int bad = 0;
#pragma unroll
    for (int k = 0; k < SR_PER; k++) {
        int v = v0 + (int)threadIdx.x + k * SR_THREADS;
        z[k] = v < v1 ? r[v] : -INFINITY;
        if (v < v1 && !isfinite(z[k])) bad = 1;
        m = fmaxf(m, z[k]);
    }
    bad = __syncthreads_or(bad);
    m = block_max(m);
    double s = 0.0;
    if (!bad) {
#pragma unroll
        for (int k = 0; k < SR_PER; k++)
            if (v0 + (int)threadIdx.x + k * SR_THREADS < v1) s += (double)expf((z[k] - m) / T);
    }
    s = block_sum_f64(s);
    struct sr_span *sp = spans + (size_t)i * nb;
    __shared__ int last;
    if (!threadIdx.x) {
        sp[b] = sr_span{m, bad, s};
        __threadfence(); // the span is visible before the block counts itself done
        last = atomicAdd(&done[i], 1) == nb - 1;
        if (last) done[i] = 0;
        __threadfence();
    }
    __syncthreads();
    if (!last) return;
    int tok = sample_choose(r, V, T, sr[i].u, sp, nb);
    if (!threadIdx.x) ids[i] = tok;
}

/* A cut row, one block of SC_THREADS: thread t owns the entries [t C, (t + 1) C) (C =
 * ceil(V / SC_THREADS)), so its sums run in id order and the block's in thread order. p(v) is
 * td_probs' (expf of x - max over T, over the row's sum in fp64, rounded to fp32), made again at
 * every pass rather than stored. Ranks are p's bits (p >= 0: their order is p's), ties to the
 * lower id. The top-k candidates: bisection for the k-th largest key tk over the counts, then
 * the ties at tk in id order up to k (ck: the last tie's id). The top-p prefix: bisection for the
 * largest key tp whose candidates at or above it hold top_p of the candidates' mass, then the
 * ties at tp in id order, each adding p(tp), until the sum reaches it (cp). Every count and sum
 * is in a fixed order, so a row draws the same token in any batch; the sums' order is not
 * td_probs' (it differs from the host's only at rounding). Then the draw: the kept p over their
 * sum, the first id at which their cumulative sum (in id order) passes u. */
#define SC_THREADS 1024

__device__ __forceinline__ int block_count(int c) {
    int total;
    block_excl_scan(c, &total);
    return total;
}

// the id of the n-th (from 1) entry of [v0, v1) per thread with keep(v), in id order
template <typename Keep> __device__ int nth_in_order(int v0, int v1, int n, Keep keep) {
    __shared__ int found;
    int own = 0;
    for (int v = v0; v < v1; v++)
        own += keep(v);
    int total, before = block_excl_scan(own, &total);
    if (!threadIdx.x) found = -1;
    __syncthreads();
    if (n > before && n <= before + own) {
        int c = before;
        for (int v = v0; v < v1; v++)
            if (keep(v) && ++c == n) {
                found = v;
                break;
            }
    }
    __syncthreads();
    return found;
}

__global__ void __launch_bounds__(SC_THREADS)
    sample_cut_kernel(int32_t *ids, const float *x, int V, const sample_row *sr) {
    PDL_START();
    int i = blockIdx.x;
    const sample_row s = sr[i];
    if (!row_cut(s, V)) return;
    const float *r = x + (size_t)i * V;
    float T = s.temperature;
    int C = (V + SC_THREADS - 1) / SC_THREADS, v0 = min(V, (int)threadIdx.x * C),
        v1 = min(V, v0 + C);
    float m = -INFINITY;
    int bad = 0;
    for (int v = v0; v < v1; v++) {
        float z = r[v];
        if (!isfinite(z)) bad = 1;
        m = fmaxf(m, z);
    }
    bad = __syncthreads_or(bad);
    m = block_max(m);
    if (bad) {
        if (!threadIdx.x) ids[i] = -1;
        return;
    }
    double S = 0.0;
    for (int v = v0; v < v1; v++)
        S += (double)expf((r[v] - m) / T);
    S = block_sum_f64(S);
    auto pv = [&](int v) { return (float)((double)expf((r[v] - m) / T) / S); };
    auto key = [&](int v) { return __float_as_uint(pv(v)); };
    // the top-k candidates: key > tk, or key == tk with id <= ck (every entry without a cut)
    unsigned tk = 0;
    int ck = V - 1;
    if (s.top_k > 0 && s.top_k < V) {
        unsigned lo = 0, hi = 0x7F800000u; // at least k keys >= lo, fewer than k >= hi
        while (hi - lo > 1) {
            unsigned mid = lo + (hi - lo) / 2;
            int c = 0;
            for (int v = v0; v < v1; v++)
                c += key(v) >= mid;
            if (block_count(c) >= s.top_k)
                lo = mid;
            else
                hi = mid;
        }
        tk = lo;
        int gt = 0;
        for (int v = v0; v < v1; v++)
            gt += key(v) > tk;
        gt = block_count(gt);
        ck = nth_in_order(v0, v1, s.top_k - gt, [&](int v) { return key(v) == tk; });
    }
    auto in_c = [&](int v, unsigned kv) { return kv > tk || (kv == tk && v <= ck); };
    // the top-p prefix of the candidates: key > tp, or key == tp with id <= cp
    unsigned tp = 0;
    int cp = V - 1;
    if (s.top_p > 0.0f && s.top_p < 1.0f) {
        double mass = 0.0;
        for (int v = v0; v < v1; v++) {
            unsigned kv = key(v);
            if (in_c(v, kv)) mass += __uint_as_float(kv);
        }
        double thr = (double)s.top_p * block_sum_f64(mass);
        auto above = [&](unsigned t) { // the candidates' mass at keys >= t
            double a = 0.0;
            for (int v = v0; v < v1; v++) {
                unsigned kv = key(v);
                if (in_c(v, kv) && kv >= t) a += __uint_as_float(kv);
            }
            return block_sum_f64(a);
        };
        unsigned lo = 0, hi = 0x7F800000u; // above(lo) >= thr > above(hi)
        while (hi - lo > 1) {
            unsigned mid = lo + (hi - lo) / 2;
            if (above(mid) >= thr)
                lo = mid;
            else
                hi = mid;
        }
        tp = lo;
        double c = above(tp + 1);
        int ties = 0;
        for (int v = v0; v < v1; v++) {
            unsigned kv = key(v);
            ties += kv == tp && in_c(v, kv);
        }
        ties = block_count(ties);
        int j = 0; // the ties the prefix takes, each adding p(tp) in turn
        while (j < ties && (j == 0 || c < thr))
            c += __uint_as_float(tp), j++;
        cp = nth_in_order(v0, v1, j, [&](int v) {
            unsigned kv = key(v);
            return kv == tp && in_c(v, kv);
        });
    }
    auto kept = [&](int v, unsigned kv) {
        return in_c(v, kv) && (kv > tp || (kv == tp && v <= cp));
    };
    double k_sum = 0.0;
    for (int v = v0; v < v1; v++) {
        unsigned kv = key(v);
        if (kept(v, kv)) k_sum += __uint_as_float(kv);
    }
    k_sum = block_sum_f64(k_sum);
    // the draw: p / k_sum over the kept, in id order
    int tok = block_inverse_cdf<SC_THREADS>(v0, v1, 0.0, s.u, [&](int v) {
        unsigned kv = key(v);
        return kept(v, kv) ? (double)(float)((double)__uint_as_float(kv) / k_sum) : 0.0;
    });
    if (!threadIdx.x) ids[i] = tok;
}

/* the per-row and per-span scratch (zeroed), grown only: sized at start-up by the backend's
 * reserve for the widest step, so a step never allocates; a direct caller past it grows it here
 * (never inside a capture: steps call the op eagerly) */
static void ensure_rows(int rows, int V) {
    long long spans = (long long)rows * ceil_div(V, AR_SPAN);
    if (spans > gs().sr_cap) {
        if (gs().sr_spans) CUDA_CHECK(cudaFree(gs().sr_spans));
        gs().sr_cap = spans > 2 * gs().sr_cap ? spans : 2 * gs().sr_cap;
        CUDA_CHECK(cudaMalloc(&gs().sr_spans, (size_t)gs().sr_cap * sizeof *gs().sr_spans));
    }
    if (rows <= gs().ar_rows) return;
    if (gs().ar_key) {
        CUDA_CHECK(cudaFree(gs().ar_key));
        CUDA_CHECK(cudaFree(gs().ar_bad));
        CUDA_CHECK(cudaFree(gs().ar_done));
    }
    gs().ar_rows = rows > 2 * gs().ar_rows ? rows : 2 * gs().ar_rows;
    CUDA_CHECK(cudaMalloc(&gs().ar_key, (size_t)gs().ar_rows * sizeof *gs().ar_key));
    CUDA_CHECK(cudaMalloc(&gs().ar_bad, (size_t)gs().ar_rows * sizeof *gs().ar_bad));
    CUDA_CHECK(cudaMalloc(&gs().ar_done, (size_t)gs().ar_rows * sizeof *gs().ar_done));
    CUDA_CHECK(cudaMemset(gs().ar_key, 0, (size_t)gs().ar_rows * sizeof *gs().ar_key));
    CUDA_CHECK(cudaMemset(gs().ar_bad, 0, (size_t)gs().ar_rows * sizeof *gs().ar_bad));
    CUDA_CHECK(cudaMemset(gs().ar_done, 0, (size_t)gs().ar_rows * sizeof *gs().ar_done));
}

extern "C" int sample_rows_cuda_reserve(const struct td_reserve *r, char *err, size_t errlen) {
    (void)err, (void)errlen;
    ensure_rows(r->rows, r->vocab);
    return 0;
}

extern "C" void sample_rows_cuda(int32_t *ids, const float *x, int n, int V,
                                 const struct sample_row *s, int cuts) {
    if (!n) return;
    ensure_rows(n, V);
    launch_k(sample_rows_kernel, dim3(ceil_div(V, AR_SPAN), n), SR_THREADS, 0, td_cuda_stream(),
             ids, x, V, s, gs().ar_key, gs().ar_bad, gs().ar_done, gs().sr_spans);
    LAUNCH_CHECK();
    if (!cuts) return;
    launch_k(sample_cut_kernel, n, SC_THREADS, 0, td_cuda_stream(), ids, x, V, s);
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
