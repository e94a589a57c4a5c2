/* moe.cu: router and routed experts on the GPU (see moe.h). One block per row: the row's picks
 * run in ascending expert order and add into an fp32 accumulator, so a row's result never
 * depends on the other rows (batch-invariant). A grouped-GEMM path for large batches is the
 * next step; this one is the correctness baseline. */
#include "cuda_common.cuh"
#include "moe.h"

__device__ __forceinline__ float score_of(float z, int fn) {
    if (fn == MOE_SCORE_SIGMOID) return 1.0f / (1.0f + expf(-z));
    float sp = z > 20.0f ? z : log1pf(expf(z));
    return sqrtf(sp);
}

__global__ void route_kernel(int32_t *picks, float *weights, const float *logits,
                             const int32_t *ids, int fn, const void *bias, int bias_dt,
                             const void *tid2eid, int tid_dt, int k, int E, float scaling) {
    extern __shared__ float sc[]; // [E]
    int t = blockIdx.x;
    const float *lg = logits + (size_t)t * E;
    if (fn == MOE_SCORE_SOFTMAX) {
        float mx = -INFINITY;
        for (int e = threadIdx.x; e < E; e += blockDim.x)
            mx = fmaxf(mx, lg[e]);
        mx = block_max(mx);
        float den = 0.0f;
        for (int e = threadIdx.x; e < E; e += blockDim.x)
            den += expf(lg[e] - mx);
        den = block_sum(den);
        for (int e = threadIdx.x; e < E; e += blockDim.x)
            sc[e] = expf(lg[e] - mx) / den;
    } else {
        for (int e = threadIdx.x; e < E; e += blockDim.x)
            sc[e] = score_of(lg[e], fn);
    }
    __syncthreads();
    if (threadIdx.x) return;
    int p[64];
    for (int j = 0; j < k; j++) {
        if (tid2eid) {
            long long i = (long long)ids[t] * k + j;
            p[j] = tid_dt == TD_DTYPE_I64 ? (int)((const long long *)tid2eid)[i]
                                          : ((const int32_t *)tid2eid)[i];
            continue;
        }
        int best = -1;
        float bv = 0.0f;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int u = 0; u < j; u++)
                taken |= p[u] == e;
            if (taken) continue;
            float v = sc[e] + (bias ? ld_f32(bias, bias_dt, e) : 0.0f);
            if (best < 0 || v > bv) best = e, bv = v;
        }
        p[j] = best;
    }
    float sum = 0.0f;
    for (int j = 0; j < k; j++)
        sum += sc[p[j]];
    for (int j = 0; j < k; j++) {
        picks[(size_t)t * k + j] = p[j];
        weights[(size_t)t * k + j] = sc[p[j]] / (sum + 1e-20f) * scaling;
    }
}

extern "C" void moe_route_rows_cuda(int32_t *picks, float *weights, const float *logits,
                                    const int32_t *ids, enum moe_score score_fn, const void *bias,
                                    enum td_dtype bias_dtype, const void *tid2eid,
                                    enum td_dtype tid_dtype, int n, int k, int n_experts,
                                    float scaling) {
    if (!n) return;
    route_kernel<<<n, 128, (size_t)n_experts * sizeof(float), td_cuda_stream()>>>(
        picks, weights, logits, ids, score_fn, bias, bias_dtype, tid2eid, tid_dtype, k, n_experts,
        scaling);
    LAUNCH_CHECK();
}

/* ---------------------------------------------------------------------------------------------
 * Routed experts as grouped GEMMs: (1) one block groups the (row, pick) entries by expert and
 * lays out 16-row tiles, each inside one expert; (2) an up GEMM over all tiles at once computes
 * h = silu(clamp(x.w1)) * clamp(x.w3) for every entry (rows gathered from x through the
 * permutation); (3) a down GEMM gives y = h.w2; (4) each row adds its entries' y * weight in
 * ascending expert order. Every output's dot product runs over k in a fixed order inside its
 * tile, so a row's result does not depend on which rows share its tile or its batch. */

#define TM 16
#define TN 64
#define TK 32

static int32_t *g_perm, *g_inv, *g_tiles, *g_ntiles;
static float *g_h, *g_y;
static int g_entries, g_experts, g_inter, g_dim;

__global__ void moe_group_kernel(const int32_t *picks, int m, int E, int32_t *perm, int32_t *inv,
                                 int32_t *tiles, int32_t *n_tiles) {
    extern __shared__ int sh[]; // count[E], off[E + 1], cur[E]
    int *count = sh, *off = sh + E, *cur = sh + 2 * E + 1;
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        count[e] = 0, cur[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < m; i += blockDim.x)
        atomicAdd(&count[picks[i]], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        int o = 0, nt = 0;
        for (int e = 0; e < E; e++) {
            off[e] = o;
            for (int r = 0; r < count[e]; r += TM) { // tile: expert, first entry, rows
                tiles[3 * nt] = e;
                tiles[3 * nt + 1] = o + r;
                tiles[3 * nt + 2] = count[e] - r < TM ? count[e] - r : TM;
                nt++;
            }
            o += count[e];
        }
        off[E] = o;
        *n_tiles = nt;
    }
    __syncthreads();
    // where an entry lands inside its expert does not change any result (rows are independent)
    for (int i = threadIdx.x; i < m; i += blockDim.x) {
        int e = picks[i], p = off[e] + atomicAdd(&cur[e], 1);
        perm[p] = i;
        inv[i] = p;
    }
}

/* out[p, 0..N) for the tile's entries: up (swiglu = 1, x rows gathered by perm / k) or down */
__global__ void moe_gemm_kernel(float *out, const float *in, const int32_t *perm, int k_per_row,
                                int swiglu, const int32_t *tiles, const int32_t *n_tiles,
                                struct expert_set ex, int K, int N, float limit) {
    __shared__ float xs[TM][TK];
    __shared__ float w1s[TN][TK + 1];
    __shared__ float w3s[TN][TK + 1];
    int tile = blockIdx.y;
    if (tile >= *n_tiles) return;
    int e = tiles[3 * tile], p0 = tiles[3 * tile + 1], rows = tiles[3 * tile + 2];
    int n0 = blockIdx.x * TN, tid = threadIdx.x;
    int c = tid % TN, r0 = (tid / TN) * 4; // 256 threads: 64 features x 4 groups of 4 rows
    const void *w1 = swiglu ? ex.w1[e] : ex.w2[e], *w3 = ex.w3[e];
    float a1[4] = {0, 0, 0, 0}, a3[4] = {0, 0, 0, 0};
    for (int k0 = 0; k0 < K; k0 += TK) {
        for (int i = tid; i < TM * TK; i += blockDim.x) {
            int r = i / TK, kk = i % TK;
            float v = 0.0f;
            if (r < rows && k0 + kk < K) {
                int p = p0 + r;
                const float *src =
                    swiglu ? in + (size_t)(perm[p] / k_per_row) * K : in + (size_t)p * K;
                v = src[k0 + kk];
            }
            xs[r][kk] = v;
        }
        for (int i = tid; i < TN * TK; i += blockDim.x) {
            int nn = i / TK, kk = i % TK;
            int ok = n0 + nn < N && k0 + kk < K;
            long long wi = (long long)(n0 + nn) * K + k0 + kk;
            w1s[nn][kk] = ok ? ld_f32(w1, ex.dtype, wi) : 0.0f;
            if (swiglu) w3s[nn][kk] = ok ? ld_f32(w3, ex.dtype, wi) : 0.0f;
        }
        __syncthreads();
        for (int kk = 0; kk < TK; kk++) {
            float wv1 = w1s[c][kk], wv3 = swiglu ? w3s[c][kk] : 0.0f;
            for (int j = 0; j < 4; j++) {
                a1[j] += xs[r0 + j][kk] * wv1;
                if (swiglu) a3[j] += xs[r0 + j][kk] * wv3;
            }
        }
        __syncthreads();
    }
    if (n0 + c >= N) return;
    for (int j = 0; j < 4; j++) {
        if (r0 + j >= rows) break;
        float v = a1[j];
        if (swiglu) {
            float g = fminf(a1[j], limit), u = fminf(fmaxf(a3[j], -limit), limit);
            v = g / (1.0f + expf(-g)) * u;
        }
        out[(size_t)(p0 + r0 + j) * N + n0 + c] = v;
    }
}

__global__ void moe_combine_kernel(float *out, const float *y, const int32_t *picks,
                                   const float *weights, const int32_t *inv, int n, int k, int d) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= (long long)n * d) return;
    int t = (int)(i / d), c = (int)(i % d);
    const int32_t *pk = picks + (size_t)t * k;
    float acc = 0.0f;
    int done = 0; // ascending expert, then pick position: the reference's order
    for (int u = 0; u < k; u++) {
        int best = -1;
        for (int j = 0; j < k; j++) {
            if (done & (1 << j)) continue;
            if (best < 0 || pk[j] < pk[best]) best = j;
        }
        done |= 1 << best;
        acc += y[(size_t)inv[(size_t)t * k + best] * d + c] * weights[(size_t)t * k + best];
    }
    out[i] = acc;
}

static void ensure_grouped(int entries, int experts, int inter, int dim) {
    if (entries <= g_entries && experts <= g_experts && inter <= g_inter && dim <= g_dim) return;
    // grow only, and never free: a captured graph keeps the addresses it was captured with
    g_entries = entries > g_entries ? entries : g_entries;
    g_experts = experts > g_experts ? experts : g_experts;
    g_inter = inter > g_inter ? inter : g_inter;
    g_dim = dim > g_dim ? dim : g_dim;
    int max_tiles = g_entries / TM + g_experts + 1;
    CUDA_CHECK(cudaMalloc(&g_perm, (size_t)g_entries * sizeof(int32_t)));
    CUDA_CHECK(cudaMalloc(&g_inv, (size_t)g_entries * sizeof(int32_t)));
    CUDA_CHECK(cudaMalloc(&g_tiles, (size_t)max_tiles * 3 * sizeof(int32_t)));
    CUDA_CHECK(cudaMalloc(&g_ntiles, sizeof(int32_t)));
    CUDA_CHECK(cudaMalloc(&g_h, (size_t)g_entries * g_inter * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&g_y, (size_t)g_entries * g_dim * sizeof(float)));
}

extern "C" void moe_cuda_reserve(int entries, int experts, int inter, int dim) {
    ensure_grouped(entries, experts, inter, dim);
}

extern "C" void moe_experts_cuda(float *out, const float *x, const int32_t *picks,
                                 const float *weights, const struct expert_set *ex, int n, int d,
                                 int inter, int k, int n_experts, float limit) {
    if (!n) return;
    if (k > 31) {
        fprintf(stderr, "moe_experts_cuda: %d experts per token, at most 31\n", k);
        abort();
    }
    int m = n * k, max_tiles = m / TM + n_experts + 1;
    ensure_grouped(m, n_experts, inter, d);
    cudaStream_t s = td_cuda_stream();
    moe_group_kernel<<<1, 256, (size_t)(3 * n_experts + 1) * sizeof(int), s>>>(
        picks, m, n_experts, g_perm, g_inv, g_tiles, g_ntiles);
    LAUNCH_CHECK();
    moe_gemm_kernel<<<dim3(ceil_div(inter, TN), max_tiles), 256, 0, s>>>(
        g_h, x, g_perm, k, 1, g_tiles, g_ntiles, *ex, d, inter, limit);
    LAUNCH_CHECK();
    moe_gemm_kernel<<<dim3(ceil_div(d, TN), max_tiles), 256, 0, s>>>(
        g_y, g_h, g_perm, k, 0, g_tiles, g_ntiles, *ex, inter, d, limit);
    LAUNCH_CHECK();
    moe_combine_kernel<<<ceil_div((long long)n * d, 256), 256, 0, s>>>(out, g_y, picks, weights,
                                                                       g_inv, n, k, d);
    LAUNCH_CHECK();
}
