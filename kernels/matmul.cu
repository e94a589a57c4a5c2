/* matmul.cu: y = x W^T on the GPU. BF16 weights: steps of up to SKINNY_ROWS rows (decode and
 * verify) take the skinny kernel below, which reads the fp32 rows and the weights directly;
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

/* Skinny GEMM: one warp per output feature for up to SKINNY_TM rows of x, so each weight row is
 * read once from memory for all of them; lanes take 8 consecutive elements at a time (one
 * 16-byte load of bf16 weights where the row and x are aligned) and the loads of SKINNY_UNROLL
 * steps are made before any is used. fp32 x (no bf16 rounding), fp32 sums, bias fused. The
 * order of every sum depends on `in` alone. Grid (features / SKINNY_FEATS, row tiles, groups):
 * group g reads x columns [g in, (g + 1) in) and weight block g, writes y columns of block g. */
#define SKINNY_ROWS   MATMUL_SKINNY_ROWS
#define SKINNY_TM     8 /* the epilogue's butterfly is written for 8 */
#define SKINNY_FEATS  8
#define SKINNY_UNROLL 2

/* A one-row step (batch-1 decode) runs a variant with one accumulator (TMR = 1), which leaves
 * registers for twice the loads in flight (U = 4) and more blocks per multiprocessor. A lane
 * visits k = 8 lane, 8 lane + 256, ... in the same order in both, so a row's sums are the same.
 * (At 136 registers, one 8-row block per multiprocessor, the batch-1 step of the Flash slice
 * read its head at a quarter of the speed of the 96-register form.) */
template <typename T, bool VEC, int TMR, int U>
__global__ void skinny_kernel(float *y, const float *x, const T *w, int n, int in, int out,
                              int x_stride, int y_stride, const void *bias, int bias_dt) {
    int lane = threadIdx.x & 31, o = blockIdx.x * SKINNY_FEATS + (threadIdx.x >> 5);
    int t0 = blockIdx.y * TMR, g = blockIdx.z;
    if (o >= out) return;
    int rows = min(TMR, n - t0);
    const T *wr = w + ((size_t)g * out + o) * in;
    const float *xb = x + (size_t)t0 * x_stride + (size_t)g * in;
    float acc[SKINNY_TM];
#pragma unroll
    for (int r = 0; r < SKINNY_TM; r++)
        acc[r] = 0.0f;
    for (int k0 = 8 * lane; k0 < in; k0 += 256 * U) {
        float wv[U][8];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (k0 + 256 * u < in) load8_f32<T, VEC>(wv[u], wr, k0 + 256 * u, in);
#pragma unroll
        for (int u = 0; u < U; u++) {
            int k = k0 + 256 * u;
            if (k >= in) break;
            // every row's loads before any sum (a loop that loaded and summed row after row
            // waited out one memory latency per row: 8-row steps took twice a 1-row step)
            float xv[TMR][8];
#pragma unroll
            for (int r = 0; r < TMR; r++) {
                if (r < rows) {
                    load8_f32<float, VEC>(xv[r], xb + (size_t)r * x_stride, k, in);
                } else {
#pragma unroll
                    for (int j = 0; j < 8; j++)
                        xv[r][j] = 0.0f;
                }
            }
#pragma unroll
            for (int r = 0; r < TMR; r++)
#pragma unroll
                for (int j = 0; j < 8; j++)
                    acc[r] += xv[r][j] * wv[u][j];
        }
    }
    float b = bias ? ld_f32(bias, bias_dt, o) : 0.0f;
    float *yo = y + (size_t)t0 * y_stride + (size_t)g * out + o;
    if (TMR == 1 || rows == 1) {
        float v = warp_sum(acc[0]);
        if (!lane) yo[0] = v + b;
        return;
    }
    // the 8 rows' sums at once: each butterfly step halves the values a lane carries (9
    // shuffles instead of 8 x 5); lane l ends with row 4 b4 + 2 b3 + b2 of its bits
    const unsigned all = 0xffffffffu;
#pragma unroll
    for (int r = 0; r < 4; r++) {
        bool hi = lane & 16;
        float send = hi ? acc[r] : acc[r + 4], keep = hi ? acc[r + 4] : acc[r];
        acc[r] = keep + __shfl_xor_sync(all, send, 16);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        bool hi = lane & 8;
        float send = hi ? acc[r] : acc[r + 2], keep = hi ? acc[r + 2] : acc[r];
        acc[r] = keep + __shfl_xor_sync(all, send, 8);
    }
    {
        bool hi = lane & 4;
        float send = hi ? acc[0] : acc[1], keep = hi ? acc[1] : acc[0];
        acc[0] = keep + __shfl_xor_sync(all, send, 4);
    }
    acc[0] += __shfl_xor_sync(all, acc[0], 2);
    acc[0] += __shfl_xor_sync(all, acc[0], 1);
    int r = ((lane >> 4) & 1) * 4 + ((lane >> 3) & 1) * 2 + ((lane >> 2) & 1);
    if (!(lane & 3) && r < rows) yo[(size_t)r * y_stride] = acc[0] + b;
}

template <typename T, bool VEC>
static void skinny_v(float *y, const float *x, const void *w, int n, int groups, int in, int out,
                     const void *bias, enum td_dtype bias_dtype) {
    int xs = groups * in, ys = groups * out;
    dim3 grid(ceil_div(out, SKINNY_FEATS), ceil_div(n, SKINNY_TM), groups);
    if (n == 1)
        skinny_kernel<T, VEC, 1, 2 * SKINNY_UNROLL>
            <<<grid, 32 * SKINNY_FEATS, 0, td_cuda_stream()>>>(y, x, (const T *)w, n, in, out, xs,
                                                               ys, bias, bias_dtype);
    else
        skinny_kernel<T, VEC, SKINNY_TM, SKINNY_UNROLL>
            <<<grid, 32 * SKINNY_FEATS, 0, td_cuda_stream()>>>(y, x, (const T *)w, n, in, out, xs,
                                                               ys, bias, bias_dtype);
    LAUNCH_CHECK();
}

template <typename T>
static void skinny(float *y, const float *x, const void *w, int n, int groups, int in, int out,
                   const void *bias, enum td_dtype bias_dtype) {
    if (in % 8 == 0 && (uintptr_t)w % 16 == 0 && (uintptr_t)x % 16 == 0)
        skinny_v<T, true>(y, x, w, n, groups, in, out, bias, bias_dtype);
    else
        skinny_v<T, false>(y, x, w, n, groups, in, out, bias, bias_dtype);
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
        skinny<__nv_bfloat16>(y, x, w, n, 1, in, out, bias, bias_dtype);
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
        skinny<__nv_bfloat16>(y, x, w, n, groups, in, out, NULL, TD_DTYPE_F32);
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
