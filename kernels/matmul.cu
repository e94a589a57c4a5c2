/* matmul.cu: y = x W^T on the GPU. BF16 weights: steps of up to SKINNY_ROWS rows (decode and
 * verify) take the skinny kernel below, which reads the fp32 rows and the weights directly
 * (tensor cores, x as two bf16 terms);
 * wider steps go through cuBLASLt (x rounded to bf16, fp32 accumulation and output). Other
 * weight dtypes take a plain fp32 kernel (only small tensors stay fp32 on the device; see
 * td_model_upload). */
#include <cublasLt.h>

#include "cuda_common.cuh"
#include "matmul.h"

#define CUBLAS_CHECK(x)                                                                            \
    do {                                                                                           \
        cublasStatus_t st_ = (x);                                                                  \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                                        \
            fprintf(stderr, "cuBLAS error %d at %s:%d: %s\n", (int)st_, __FILE__, __LINE__, #x);   \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static cublasLtHandle_t lt;
static int deterministic; /* batch-invariant mode: no cuBLASLt, fixed-order dots */

extern "C" void matmul_cuda_set_deterministic(int on) {
    deterministic = on;
}
static void *lt_ws;
static const size_t lt_ws_bytes = (size_t)32 << 20;
static __nv_bfloat16 *xbuf;
static size_t xbuf_cap;

static void ensure_lt(size_t x_elems) {
    if (!lt) {
        CUBLAS_CHECK(cublasLtCreate(&lt));
        CUDA_CHECK(cudaMalloc(&lt_ws, lt_ws_bytes));
    }
    if (x_elems > xbuf_cap) { // grow only, never free: captured graphs keep the old address
        xbuf_cap = x_elems + (x_elems >> 1);
        CUDA_CHECK(cudaMalloc(&xbuf, xbuf_cap * sizeof(__nv_bfloat16)));
    }
}

__global__ void to_bf16_kernel(__nv_bfloat16 *y, const float *x, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2bfloat16(x[i]);
}

__global__ void matmul_f32_kernel(float *y, const float *x, const void *w, int dt, int n, int in,
                                  int out, int x_stride, int y_stride) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= (long long)n * out) return;
    int t = (int)(i / out), o = (int)(i % out);
    float acc = 0.0f;
    for (int k = 0; k < in; k++)
        acc += x[(size_t)t * x_stride + k] * ld_f32(w, dt, (long long)o * in + k);
    y[(size_t)t * y_stride + o] = acc;
}

/* one warp per output element: lanes stride the reduction dim, then a fixed butterfly; the
 * order of every sum depends on `in` alone, never on n (batch-invariant mode) */
__global__ void matmul_warp_kernel(float *y, const float *x, const void *w, int dt, int n, int in,
                                   int out, int x_stride, int y_stride) {
    long long e = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (e >= (long long)n * out) return;
    int t = (int)(e / out), o = (int)(e % out);
    const float *xr = x + (size_t)t * x_stride;
    float acc = 0.0f;
    for (int k = lane; k < in; k += 32)
        acc += __bfloat162float(__float2bfloat16(xr[k])) * ld_f32(w, dt, (long long)o * in + k);
    acc = warp_sum(acc);
    if (lane == 0) y[(size_t)t * y_stride + o] = acc;
}

/* Skinny GEMM, steps of 1 to SKINNY_ROWS rows (decode batches, verify steps), on tensor cores:
 * a warp computes a tile of 16 features x 8 rows with mma.m16n8k16 (bf16 in, fp32
 * accumulate). The x rows enter as two bf16 terms, x = hi + lo (hi = bf16(x), lo = bf16(x -
 * hi)), so the products keep about 16 bits of x (an fp32 dot keeps 24; the bf16 weights have
 * 8). The reduction over k is a sum, so any order of k works when the weights and x agree on
 * it: lane (g, t) loads 8 consecutive k (one 16-byte load per weight row g and g + 8, two
 * float4 of x row g) and the fragments put them where mma expects logical k (2t, 2t + 1,
 * 2t + 8, 2t + 9) of two instructions. The KW warps of a block take every KW-th 32-wide chunk
 * of k and their tiles are summed in warp order: the order of every sum depends on the shape
 * alone, and a row's sums never on the rows beside it (each column of an mma is its own), so a
 * row has the same bits alone and in a verify step.
 *
 * It replaced an fp32 kernel with one warp per feature, whose 8-row form re-read x from L1 for
 * every feature: at 8 rows the Flash head took 1270 us against 242 at 1 row; here 261 to 266 us
 * at 1 to 8 rows (bench/gemm_time). */

__device__ __forceinline__ unsigned pack_bf16(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b); // a in the low half
    return *(unsigned *)&h;
}

__device__ __forceinline__ void mma_bf16(float *c, unsigned a0, unsigned a1, unsigned a2,
                                         unsigned a3, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// 8 weights of row o from k (zeros past in or past out), as four bf16 pairs
template <bool VEC>
__device__ __forceinline__ uint4 sk_w8(const __nv_bfloat16 *w, int o, int out, int in, int k) {
    if (o >= out) return make_uint4(0, 0, 0, 0);
    const __nv_bfloat16 *r = w + (size_t)o * in + k;
    if (VEC && k + 8 <= in) return *(const uint4 *)r;
    unsigned short h[8];
    for (int j = 0; j < 8; j++)
        h[j] = k + j < in ? *(const unsigned short *)(r + j) : 0;
    return make_uint4(h[0] | (unsigned)h[1] << 16, h[2] | (unsigned)h[3] << 16,
                      h[4] | (unsigned)h[5] << 16, h[6] | (unsigned)h[7] << 16);
}

template <bool VEC>
__device__ __forceinline__ void sk_x8(float *v, const float *xr, bool live, int in, int k) {
    if (live && VEC && k + 8 <= in) {
        float4 p = *(const float4 *)(xr + k), q = *(const float4 *)(xr + k + 4);
        v[0] = p.x, v[1] = p.y, v[2] = p.z, v[3] = p.w, v[4] = q.x, v[5] = q.y, v[6] = q.z,
        v[7] = q.w;
        return;
    }
    for (int j = 0; j < 8; j++)
        v[j] = live && k + j < in ? xr[k + j] : 0.0f;
}

#define SKINNY_ROWS MATMUL_SKINNY_ROWS
#define SK_U        4 /* chunks of 32 k each warp loads before it multiplies */

template <bool VEC, int SK_KW, int ACC>
__global__ void __launch_bounds__(32 * SK_KW)
    skinny_mma_kernel(float *y, const float *x, const __nv_bfloat16 *w, int n, int in, int out,
                      int x_stride, int y_stride, const void *bias, int bias_dt) {
    __shared__ float part[SK_KW - 1][32][4];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    int o0 = blockIdx.x * 16, t0 = blockIdx.y * 8, grp = blockIdx.z;
    int rows = min(8, n - t0);
    const __nv_bfloat16 *wg = w + (size_t)grp * out * in;
    const float *xr = x + (size_t)(t0 + g) * x_stride + (size_t)grp * in;
    bool live = g < rows;
    // ACC = 4: one accumulator per (first / second mma, hi / lo term), four short chains of
    // dependent mma summed in a fixed order at the end, for short k; ACC = 1 keeps the
    // registers (and more loads in flight) for the weight-bound shapes
    float c[ACC][4] = {};
    int chunks = (in + 31) / 32;
    for (int c0 = warp; c0 < chunks; c0 += SK_KW * SK_U) {
        uint4 wa[SK_U], wb[SK_U];
        float xv[SK_U][8];
#pragma unroll
        for (int u = 0; u < SK_U; u++) {
            int k = (c0 + u * SK_KW) * 32 + 8 * t;
            bool in_k = c0 + u * SK_KW < chunks;
            wa[u] = in_k ? sk_w8<VEC>(wg, o0 + g, out, in, k) : make_uint4(0, 0, 0, 0);
            wb[u] = in_k ? sk_w8<VEC>(wg, o0 + g + 8, out, in, k) : make_uint4(0, 0, 0, 0);
            sk_x8<VEC>(xv[u], xr, live && in_k, in, k);
        }
#pragma unroll
        for (int u = 0; u < SK_U; u++) {
            if (c0 + u * SK_KW >= chunks) break;
            unsigned hi[4], lo[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float a = xv[u][2 * j], b = xv[u][2 * j + 1];
                float ha = __bfloat162float(__float2bfloat16_rn(a));
                float hb = __bfloat162float(__float2bfloat16_rn(b));
                hi[j] = pack_bf16(ha, hb);
                lo[j] = pack_bf16(a - ha, b - hb);
            }
            // k 8t .. 8t + 3 are logical (2t, 2t + 1, 2t + 8, 2t + 9) of the first mma,
            // 8t + 4 .. 8t + 7 the same of the second
            mma_bf16(c[0], wa[u].x, wb[u].x, wa[u].y, wb[u].y, hi[0], hi[1]);
            mma_bf16(c[1 % ACC], wa[u].x, wb[u].x, wa[u].y, wb[u].y, lo[0], lo[1]);
            mma_bf16(c[2 % ACC], wa[u].z, wb[u].z, wa[u].w, wb[u].w, hi[2], hi[3]);
            mma_bf16(c[3 % ACC], wa[u].z, wb[u].z, wa[u].w, wb[u].w, lo[2], lo[3]);
        }
    }
    if (ACC == 4) {
#pragma unroll
        for (int j = 0; j < 4; j++)
            c[0][j] = (c[0][j] + c[2 % ACC][j]) + (c[1 % ACC][j] + c[3 % ACC][j]);
    }
    if (warp) {
#pragma unroll
        for (int j = 0; j < 4; j++)
            part[warp - 1][lane][j] = c[0][j];
    }
    __syncthreads();
    if (warp) return;
#pragma unroll
    for (int q = 0; q < SK_KW - 1; q++)
#pragma unroll
        for (int j = 0; j < 4; j++)
            c[0][j] += part[q][lane][j];
    // c0, c1: feature g, rows 2t and 2t + 1; c2, c3: feature g + 8, the same rows
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int o = o0 + g + (j >> 1) * 8, r = 2 * t + (j & 1);
        if (o < out && r < rows)
            y[(size_t)(t0 + r) * y_stride + (size_t)grp * out + o] =
                c[0][j] + (bias ? ld_f32(bias, bias_dt, o) : 0.0f);
    }
}

template <bool VEC, int KW, int ACC>
static void skinny_mma_kw(float *y, const float *x, const void *w, int n, int groups, int in,
                          int out, const void *bias, enum td_dtype bias_dtype) {
    dim3 grid(ceil_div(out, 16), ceil_div(n, 8), groups);
    skinny_mma_kernel<VEC, KW, ACC><<<grid, 32 * KW, 0, td_cuda_stream()>>>(
        y, x, (const __nv_bfloat16 *)w, n, in, out, groups * in, groups * out, bias, bias_dtype);
    LAUNCH_CHECK();
}

/* The form follows the shape alone (so does the order of the sums): 16 warps split k when there
 * are few tiles of features for a long k (a 4096 x 1024 projection has 64 tiles for 132
 * multiprocessors), else 4; one accumulator for matrices of 16 MB and more (bound by the weight
 * reads: the head ran at 261 us with one, 280 with four), else four. */
template <bool VEC>
static void skinny_mma_v(float *y, const float *x, const void *w, int n, int groups, int in,
                         int out, const void *bias, enum td_dtype bias_dtype) {
    bool wide = (long long)ceil_div(out, 16) * groups < 256 && in >= 2048;
    bool big = (long long)groups * out * in * 2 >= (16ll << 20);
    if (wide && big)
        skinny_mma_kw<VEC, 16, 1>(y, x, w, n, groups, in, out, bias, bias_dtype);
    else if (wide)
        skinny_mma_kw<VEC, 16, 4>(y, x, w, n, groups, in, out, bias, bias_dtype);
    else if (big)
        skinny_mma_kw<VEC, 4, 1>(y, x, w, n, groups, in, out, bias, bias_dtype);
    else
        skinny_mma_kw<VEC, 4, 4>(y, x, w, n, groups, in, out, bias, bias_dtype);
}

static void skinny_mma(float *y, const float *x, const void *w, int n, int groups, int in, int out,
                       const void *bias, enum td_dtype bias_dtype) {
    int xs = groups * in;
    if (in % 8 == 0 && xs % 4 == 0 && (uintptr_t)w % 16 == 0 && (uintptr_t)x % 16 == 0)
        skinny_mma_v<true>(y, x, w, n, groups, in, out, bias, bias_dtype);
    else
        skinny_mma_v<false>(y, x, w, n, groups, in, out, bias, bias_dtype);
}


__global__ void add_bias_kernel(float *y, const void *b, int dt, int n, int out) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < (long long)n * out) y[i] += ld_f32(b, dt, i % out);
}

/* one GEMM shape's descriptors and algorithm, made once: the heuristic query is a host-side
 * search that cost more than the GEMM itself on small steps, on every call */
struct lt_plan {
    int n, in, out, ldb, ldc;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
};
#define LT_PLANS 512
static struct lt_plan lt_plans[LT_PLANS];
static int n_lt_plans;

static const struct lt_plan *lt_plan_for(int n, int in, int out, int ldb, int ldc) {
    for (int i = 0; i < n_lt_plans; i++) {
        const struct lt_plan *q = &lt_plans[i];
        if (q->n == n && q->in == in && q->out == out && q->ldb == ldb && q->ldc == ldc) return q;
    }
    static struct lt_plan spare; // a full table: the spare is remade for each new shape
    struct lt_plan *q = n_lt_plans < LT_PLANS ? &lt_plans[n_lt_plans] : &spare;
    if (q == &spare && spare.op) {
        cublasLtMatrixLayoutDestroy(spare.la);
        cublasLtMatrixLayoutDestroy(spare.lb);
        cublasLtMatrixLayoutDestroy(spare.lc);
        cublasLtMatmulDescDestroy(spare.op);
    }
    *q = (struct lt_plan){n, in, out, ldb, ldc};
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&q->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(q->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(q->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&q->la, CUDA_R_16BF, in, out, in));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&q->lb, CUDA_R_16BF, in, n, ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&q->lc, CUDA_R_32F, out, n, ldc));
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &lt_ws_bytes, sizeof lt_ws_bytes));
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    CUBLAS_CHECK(
        cublasLtMatmulAlgoGetHeuristic(lt, q->op, q->la, q->lb, q->lc, q->lc, pref, 1, &h, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    if (!found) {
        fprintf(stderr, "cuBLASLt: no algorithm for %d x %d x %d\n", out, n, in);
        abort();
    }
    q->algo = h.algo;
    if (q != &spare) n_lt_plans++;
    return q;
}

/* C[out, n] (col-major, ldc) = W[out, in] . B, B = bf16 x rows (col-major in x n, ldb) */
static void lt_gemm(float *y, int ldc, const __nv_bfloat16 *xb, int ldb, const void *w, int n,
                    int in, int out) {
    const struct lt_plan *q = lt_plan_for(n, in, out, ldb, ldc);
    float alpha = 1.0f, beta = 0.0f;
    CUBLAS_CHECK(cublasLtMatmul(lt, q->op, &alpha, w, q->la, xb, q->lb, &beta, y, q->lc, y, q->lc,
                                &q->algo, lt_ws, lt_ws_bytes, td_cuda_stream()));
}

extern "C" void matmul_cuda_reserve(size_t x_elems) {
    ensure_lt(x_elems);
}

static const __nv_bfloat16 *x_as_bf16(const float *x, size_t elems) {
    ensure_lt(elems);
    to_bf16_kernel<<<ceil_div(elems, 256), 256, 0, td_cuda_stream()>>>(xbuf, x, elems);
    LAUNCH_CHECK();
    return xbuf;
}

extern "C" void matmul_cuda(float *y, const float *x, const void *w, enum td_dtype w_dtype, int n,
                            int in, int out, const void *bias, enum td_dtype bias_dtype) {
    if (!n || !out) return;
    if (deterministic) {
        matmul_warp_kernel<<<ceil_div((long long)n * out * 32, 256), 256, 0, td_cuda_stream()>>>(
            y, x, w, w_dtype, n, in, out, in, out);
        LAUNCH_CHECK();
    } else if (w_dtype == TD_DTYPE_BF16 && n <= SKINNY_ROWS) {
        skinny_mma(y, x, w, n, 1, in, out, bias, bias_dtype);
        return; // bias added
    } else if (w_dtype == TD_DTYPE_BF16) {
        const __nv_bfloat16 *xb = x_as_bf16(x, (size_t)n * in);
        lt_gemm(y, out, xb, in, w, n, in, out);
    } else {
        matmul_f32_kernel<<<ceil_div((long long)n * out, 128), 128, 0, td_cuda_stream()>>>(
            y, x, w, w_dtype, n, in, out, in, out);
        LAUNCH_CHECK();
    }
    if (bias) {
        add_bias_kernel<<<ceil_div((long long)n * out, 256), 256, 0, td_cuda_stream()>>>(
            y, bias, bias_dtype, n, out);
        LAUNCH_CHECK();
    }
}

extern "C" void matmul_grouped_cuda(float *y, const float *x, const void *w, enum td_dtype w_dtype,
                                    int n, int groups, int in, int out) {
    if (!n) return;
    size_t esz = td_dtype_size(w_dtype);
    if (deterministic) {
        for (int j = 0; j < groups; j++) {
            matmul_warp_kernel<<<ceil_div((long long)n * out * 32, 256), 256, 0,
                                 td_cuda_stream()>>>(y + (size_t)j * out, x + (size_t)j * in,
                                                     (const char *)w + (size_t)j * out * in * esz,
                                                     w_dtype, n, in, out, groups * in,
                                                     groups * out);
            LAUNCH_CHECK();
        }
        return;
    }
    if (w_dtype == TD_DTYPE_BF16 && n <= SKINNY_ROWS) {
        skinny_mma(y, x, w, n, groups, in, out, NULL, TD_DTYPE_F32);
        return;
    }
    if (w_dtype == TD_DTYPE_BF16) {
        const __nv_bfloat16 *xb = x_as_bf16(x, (size_t)n * groups * in);
        for (int j = 0; j < groups; j++)
            lt_gemm(y + (size_t)j * out, groups * out, xb + (size_t)j * in, groups * in,
                    (const char *)w + (size_t)j * out * in * esz, n, in, out);
        return;
    }
    for (int j = 0; j < groups; j++) {
        matmul_f32_kernel<<<ceil_div((long long)n * out, 128), 128, 0, td_cuda_stream()>>>(
            y + (size_t)j * out, x + (size_t)j * in, (const char *)w + (size_t)j * out * in * esz,
            w_dtype, n, in, out, groups * in, groups * out);
        LAUNCH_CHECK();
    }
}
