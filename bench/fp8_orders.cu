/* fp8_orders.cu: what cuBLASLt's block-scaled FP8 GEMM (Hopper: 128 x 128 scales on the weights,
 * 1 x 128 on x) reads, by probing it: the weight's and x's codes all 1.0, one scale grid set to
 * distinct powers of two and the other to 1, so each output is 128 times a sum of distinct powers
 * of two that names the scale entries it used; both operand orders and D in fp32 and bf16. Then
 * which row counts it runs (a plan for the rows, and a plan for 128 or 4096 run at fewer). A
 * standalone program (no Tandem code), built by hand on the GPU machine:
 *
 *   nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a bench/fp8_orders.cu -o /tmp/fp8_orders \
 *       -lcublasLt && /tmp/fp8_orders
 *
 * Session 40 (cuBLASLt 13, H100): the weight grid k-block fastest, x's token fastest (matmul.cu's
 * TD_FP8_LT_LAYOUT 1), either order; rows a multiple of 4 only. bench/RESULTS.md has the output. */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#define CK(x)                                                                                      \
    do {                                                                                           \
        cublasStatus_t s_ = (x);                                                                   \
        if (s_) {                                                                                  \
            printf("%s: status %d\n", #x, (int)s_);                                                \
        }                                                                                          \
    } while (0)
static cublasLtHandle_t lt;
static void *wsp;
static size_t wsb = 32u << 20;
// y[n][out] fp32 = (W[out][in] codes 1.0 * ws) . (x[n][in] codes 1.0 * xs)
static int gemm(float *hy, int out, int in, int n, int plan_n, const float *hws, int nws,
                const float *hxs, int nxs, int dbf16, int swap) {
    uint8_t *w, *x;
    float *ws, *xs;
    void *y;
    cudaMalloc(&w, (size_t)out * in);
    cudaMemset(w, 0x38, (size_t)out * in);
    cudaMalloc(&x, (size_t)n * in);
    cudaMemset(x, 0x38, (size_t)n * in);
    cudaMalloc(&ws, nws * 4);
    cudaMemcpy(ws, hws, nws * 4, cudaMemcpyHostToDevice);
    cudaMalloc(&xs, nxs * 4);
    cudaMemcpy(xs, hxs, nxs * 4, cudaMemcpyHostToDevice);
    cudaMalloc(&y, (size_t)n * out * 4);
    cudaMemset(y, 0, (size_t)n * out * 4);
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    CK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    int32_t blk = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
            vec = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    // swap: A = x (VEC128), B = W (BLK), D = y^T [out cols]
    int32_t am = swap ? vec : blk, bm = swap ? blk : vec;
    const float *ap = swap ? xs : ws, *bp = swap ? ws : xs;
    CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &am, sizeof am));
    CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bm, sizeof bm));
    CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ap, sizeof ap));
    CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &bp, sizeof bp));
    cudaDataType_t dt = dbf16 ? CUDA_R_16BF : CUDA_R_32F;
    int M = swap ? plan_n : out, N = swap ? out : plan_n;
    CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, in, M, in));
    CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, in, N, in));
    CK(cublasLtMatrixLayoutCreate(&lc, dt, M, N, swap ? plan_n : out));
    cublasLtMatmulPreference_t pref;
    CK(cublasLtMatmulPreferenceCreate(&pref));
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                            sizeof wsb));
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &h, &found);
    int rc = 0;
    if (hs || !found) {
        printf("  heuristic: status %d, found %d\n", (int)hs, found);
        rc = -1;
    } else {
        if (plan_n != n) { // the bucketed plan run at n
            uint64_t c = n;
            if (swap) {
                CK(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_COLS, &c, 8));
                CK(cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_ROWS, &c, 8));
                int64_t ld = n;
                CK(cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_LD, &ld, 8));
            } else {
                CK(cublasLtMatrixLayoutSetAttribute(lb, CUBLASLT_MATRIX_LAYOUT_COLS, &c, 8));
                CK(cublasLtMatrixLayoutSetAttribute(lc, CUBLASLT_MATRIX_LAYOUT_COLS, &c, 8));
            }
        }
        float one = 1, zero = 0;
        cublasStatus_t st = cublasLtMatmul(lt, op, &one, swap ? (void *)x : (void *)w, la,
                                           swap ? (void *)w : (void *)x, lb, &zero, y, lc, y, lc,
                                           &h.algo, wsp, wsb, 0);
        cudaError_t ce = cudaDeviceSynchronize();
        if (st || ce) {
            printf("  matmul: status %d, cuda %s\n", (int)st, cudaGetErrorString(ce));
            rc = -1;
        } else if (dbf16) {
            uint16_t *b = (uint16_t *)malloc((size_t)n * out * 2);
            cudaMemcpy(b, y, (size_t)n * out * 2, cudaMemcpyDeviceToHost);
            for (size_t i = 0; i < (size_t)n * out; i++) {
                uint32_t u = (uint32_t)b[i] << 16;
                memcpy(&hy[i], &u, 4);
            }
            free(b);
        } else
            cudaMemcpy(hy, y, (size_t)n * out * 4, cudaMemcpyDeviceToHost);
    }
    cudaFree(w);
    cudaFree(x);
    cudaFree(ws);
    cudaFree(xs);
    cudaFree(y);
    return rc;
}
// the y element of token t, out o, in either D order
static float at(const float *y, int t, int o, int n, int out, int swap) {
    return swap ? y[(size_t)o * n + t] : y[(size_t)t * out + o];
}
static void bits(char *s, float v) { // v / 128 as a set of powers of two
    double d = v / 128.0;
    int k = 0;
    s[0] = 0;
    for (int b = 40; b >= -20; b--)
        if (d >= ldexp(1, b)) {
            d -= ldexp(1, b);
            k += sprintf(s + k, "%d,", b);
        }
    if (d != 0) sprintf(s + k, "+%g", d);
}
int main() {
    cublasLtCreate(&lt);
    cudaMalloc(&wsp, wsb);
    int out = 256, in = 512; // 2 out blocks, 4 k blocks
    for (int swap = 0; swap < 2; swap++)
        for (int dbf = 0; dbf < 2; dbf++) {
            int n = 4;
            float hws[64], hxs[64], y[256 * 128];
            printf("== %s, D %s\n",
                   swap ? "A = x (VEC128), B = W (BLK128x128), D = y^T"
                        : "A = W (BLK128x128), B = x (VEC128), D = y",
                   dbf ? "bf16" : "fp32");
            for (int i = 0; i < 64; i++)
                hws[i] = ldexpf(1, i < 16 ? i : 30), hxs[i] = 1;
            if (!gemm(y, out, in, n, n, hws, 64, hxs, 64, dbf, swap)) {
                char s[256];
                for (int ob = 0; ob < 2; ob++) {
                    bits(s, at(y, 0, ob * 128, n, out, swap));
                    printf("  W scales: out block %d reads ws[%s]\n", ob, s);
                }
            }
            for (int i = 0; i < 64; i++)
                hws[i] = 1, hxs[i] = ldexpf(1, i < 20 ? i : 30);
            for (int nn = 4; nn >= 3; nn--)
                if (!gemm(y, out, in, nn, nn, hws, 64, hxs, 64, dbf, swap)) {
                    char s[256];
                    for (int t = 0; t < nn; t++) {
                        bits(s, at(y, t, 0, nn, out, swap));
                        printf("  x scales (n %d): token %d reads xs[%s]\n", nn, t, s);
                    }
                }
        }
    // which row counts run: a plan for n rows, and a plan for 128 run at n
    float *hy = (float *)malloc(4096 * 4096 * 4), hws[4096], hxs[65536];
    for (int i = 0; i < 4096; i++)
        hws[i] = 1;
    for (int i = 0; i < 65536; i++)
        hxs[i] = 1;
    int ns[] = {1, 2, 3, 8, 17, 98, 100, 128, 129, 255, 4096};
    for (int swap = 0; swap < 2; swap++)
        for (int i = 0; i < 11; i++)
            for (int pl = 0; pl < 2; pl++) {
                int n = ns[i], pn = pl ? (n <= 128 ? 128 : 4096) : n;
                if (pl && pn == n) continue;
                int r = gemm(hy, 1024, 2048, n, pn, hws, 4096, hxs, 65536, 1, swap);
                float e = r ? -1 : fabsf(hy[0] - 2048) + fabsf(hy[(size_t)n * 1024 - 1] - 2048);
                printf("swap %d n %4d plan %4d: %s (error %g)\n", swap, n, pn,
                       r ? "refused" : "ran", e);
            }
    return 0;
}
