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
        for (int e = threadIdx.x; e < E; e += blockDim.x) mx = fmaxf(mx, lg[e]);
        mx = block_max(mx);
        float den = 0.0f;
        for (int e = threadIdx.x; e < E; e += blockDim.x) den += expf(lg[e] - mx);
        den = block_sum(den);
        for (int e = threadIdx.x; e < E; e += blockDim.x) sc[e] = expf(lg[e] - mx) / den;
    } else {
        for (int e = threadIdx.x; e < E; e += blockDim.x) sc[e] = score_of(lg[e], fn);
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
            for (int u = 0; u < j; u++) taken |= p[u] == e;
            if (taken) continue;
            float v = sc[e] + (bias ? ld_f32(bias, bias_dt, e) : 0.0f);
            if (best < 0 || v > bv) best = e, bv = v;
        }
        p[j] = best;
    }
    float sum = 0.0f;
    for (int j = 0; j < k; j++) sum += sc[p[j]];
    for (int j = 0; j < k; j++) {
        picks[(size_t)t * k + j] = p[j];
        weights[(size_t)t * k + j] = sc[p[j]] / (sum + 1e-20f) * scaling;
    }
}

__global__ void experts_kernel(float *out, const float *x, const int32_t *picks,
                               const float *weights, struct expert_set ex, int d, int inter, int k,
                               float limit) {
    extern __shared__ float sm[]; // x[d], acc[d], h[inter]
    float *xs = sm, *acc = sm + d, *h = sm + 2 * d;
    __shared__ int order[64];
    int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        xs[c] = x[(size_t)t * d + c];
        acc[c] = 0.0f;
    }
    if (threadIdx.x == 0) { // picks by (expert, position): the reference's summation order
        for (int j = 0; j < k; j++) order[j] = j;
        for (int i = 1; i < k; i++) {
            int v = order[i], u = i - 1;
            while (u >= 0 && picks[(size_t)t * k + order[u]] > picks[(size_t)t * k + v])
                order[u + 1] = order[u], u--;
            order[u + 1] = v;
        }
    }
    __syncthreads();
    for (int jj = 0; jj < k; jj++) {
        int j = order[jj], e = picks[(size_t)t * k + j];
        float wgt = weights[(size_t)t * k + j];
        const void *w1 = ex.w1[e], *w3 = ex.w3[e], *w2 = ex.w2[e];
        for (int i = warp; i < inter; i += nw) {
            float g = 0.0f, u = 0.0f;
            for (int c = lane; c < d; c += 32) {
                g += xs[c] * ld_f32(w1, ex.dtype, (long long)i * d + c);
                u += xs[c] * ld_f32(w3, ex.dtype, (long long)i * d + c);
            }
            g = warp_sum(g);
            u = warp_sum(u);
            if (lane == 0) {
                g = fminf(g, limit);
                u = fminf(fmaxf(u, -limit), limit);
                h[i] = g / (1.0f + expf(-g)) * u;
            }
        }
        __syncthreads();
        for (int c = warp; c < d; c += nw) {
            float y = 0.0f;
            for (int i = lane; i < inter; i += 32) y += h[i] * ld_f32(w2, ex.dtype, (long long)c * inter + i);
            y = warp_sum(y);
            if (lane == 0) acc[c] += y * wgt;
        }
        __syncthreads();
    }
    for (int c = threadIdx.x; c < d; c += blockDim.x) out[(size_t)t * d + c] = acc[c];
}

extern "C" void moe_route_rows_cuda(int32_t *picks, float *weights, const float *logits,
                                    const int32_t *ids, enum moe_score score_fn, const void *bias,
                                    enum td_dtype bias_dtype, const void *tid2eid,
                                    enum td_dtype tid_dtype, int n, int k, int n_experts,
                                    float scaling) {
    if (!n) return;
    route_kernel<<<n, 128, (size_t)n_experts * sizeof(float), td_cuda_stream()>>>(
        picks, weights, logits, ids, score_fn, bias, bias_dtype, tid2eid, tid_dtype, k,
        n_experts, scaling);
    LAUNCH_CHECK();
}

static size_t experts_smem_set;

static void ensure_experts_smem(size_t smem) {
    if (smem <= 48 * 1024 || smem <= experts_smem_set) return;
    CUDA_CHECK(cudaFuncSetAttribute(experts_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)smem));
    experts_smem_set = smem;
}

extern "C" void moe_cuda_reserve(size_t smem) { ensure_experts_smem(smem); }

extern "C" void moe_experts_cuda(float *out, const float *x, const int32_t *picks,
                                 const float *weights, const struct expert_set *ex, int n, int d,
                                 int inter, int k, int n_experts, float limit) {
    (void)n_experts;
    if (!n) return;
    size_t smem = ((size_t)2 * d + inter) * sizeof(float);
    ensure_experts_smem(smem);
    experts_kernel<<<n, 256, smem, td_cuda_stream()>>>(out, x, picks, weights, *ex, d, inter, k,
                                                       limit);
    LAUNCH_CHECK();
}
