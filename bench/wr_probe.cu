/* wr_probe.cu: checks wgmma_tile.cuh's wr_tile (the FP4 experts' tile with the weights decoded
 * into wgmma's register operand, TD_MOE_WGMMA=2) alone, one block, against a host reference,
 * and when it is wrong says where: where a single code lands.
 *
 *   1. random codes, scales and x, tiles of 64 and 128 x rows, K 128 and 384: the worst error
 *      over each output's sum of |terms|, at most 1e-4 (the decode is exact and the products
 *      too, so only the fp32 sums' order differs, about 1e-7; a misplaced code gives about 1)
 *   2. placement: every code of weight rows {0, 1, 7, 8, 9, 15, 16, 63, 64, 127} at k 0 .. 127
 *      alone set to 1.0, x's row 0 = k + 1 at k: output row r' col 0 = k' + 1 names the weight
 *      row r' and the k' it was multiplied at; prints how many landed right and the first wrong
 *   3. scales: row 5's first 32 codes 1.0 under scale bytes 1, 120, 127, 128, 140, 254 (both
 *      decode paths, quant_one's and the two-product one)
 *
 *   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I. bench/wr_probe.cu kernels/err.c \
 *       kernels/quant_ref.c -o build/bench/wr_probe && build/bench/wr_probe
 * Exits 1 when anything is wrong. (bench/gpu_pack.sh builds it; bench/gpu_check.sh runs it.)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/quant.h"
#include "kernels/wgmma_tile.cuh"

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "wr_probe: %s: %s\n", #x, cudaGetErrorString(e_));                     \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

/* one block: weight rows 0 .. 127 (thread rows a = 64 wgi + 16 w + g, b = a + 8, as the down
 * projection's), x rows 0 .. BM - 1; out[row][x row] */
template <int BM>
__global__ void __launch_bounds__(WR_THREADS, 1)
    probe_kernel(float *out, const uint8_t *codes, const uint8_t *scales, const __nv_bfloat16 *x,
                 int K) {
    extern __shared__ __align__(16) unsigned char smb[];
    struct wr_smem<BM> *sm = (struct wr_smem<BM> *)wg_align(smb);
    int tid = threadIdx.x, wgi = tid >> 7, w = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2,
        t = lane & 3;
    for (int r = tid; r < BM; r += WR_THREADS)
        sm->xrow[r] = x + (size_t)r * K;
    int ra = 64 * wgi + 16 * w + g, rb = ra + 8;
    const uint8_t *ca = codes + (size_t)ra * (K / 2), *cb = codes + (size_t)rb * (K / 2),
                  *sa = scales + (size_t)ra * (K / 32), *sb = scales + (size_t)rb * (K / 32);
    __syncthreads();
    float c[BM / 64][32];
    wr_tile<BM>(c, sm, ca, sa, true, cb, sb, true, K, codes);
    for (int nb = 0; nb < BM / 64; nb++)
        for (int j = 0; j < 8; j++)
            for (int q = 0; q < 2; q++) {
                int n = 64 * nb + 8 * j + 2 * t + q;
                out[(size_t)ra * BM + n] = c[nb][4 * j + q];
                out[(size_t)rb * BM + n] = c[nb][4 * j + 2 + q];
            }
}

static float bf16_round(float f) { // the x the kernel reads
    return __bfloat162float(__float2bfloat16(f));
}
static uint64_t rs = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return rs;
}

struct tile {
    int K, BM;
    uint8_t *codes, *scales; /* host: 128 rows */
    float *x;                /* host: BM x K, bf16 values */
    float *out;              /* host: 128 x BM */
    float *w;                /* the weights, decoded by the CPU reference (dequant_fp4_ref) */
};

static void run(struct tile *tl) {
    int K = tl->K, BM = tl->BM;
    size_t cb = (size_t)128 * K / 2, sb = (size_t)128 * K / 32;
    uint8_t *dq;
    __nv_bfloat16 *dx, *hx = (__nv_bfloat16 *)malloc((size_t)BM * K * 2);
    float *dout;
    CK(cudaMalloc(&dq, cb + sb));
    CK(cudaMalloc(&dx, (size_t)BM * K * 2));
    CK(cudaMalloc(&dout, (size_t)128 * BM * 4));
    for (size_t i = 0; i < (size_t)BM * K; i++)
        hx[i] = __float2bfloat16(tl->x[i]);
    CK(cudaMemcpy(dq, tl->codes, cb, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dq + cb, tl->scales, sb, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dx, hx, (size_t)BM * K * 2, cudaMemcpyHostToDevice));
    CK(cudaMemset(dout, 0xff, (size_t)128 * BM * 4)); // NaN: an output never written shows
    if (BM == 64) {
        CK(cudaFuncSetAttribute(probe_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)wr_smem_bytes<64>));
        probe_kernel<64><<<1, WR_THREADS, (size_t)(wr_smem_bytes<64>)>>>(dout, dq, dq + cb, dx, K);
    } else {
        CK(cudaFuncSetAttribute(probe_kernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)wr_smem_bytes<128>));
        probe_kernel<128>
            <<<1, WR_THREADS, (size_t)(wr_smem_bytes<128>)>>>(dout, dq, dq + cb, dx, K);
    }
    CK(cudaGetLastError());
    CK(cudaMemcpy(tl->out, dout, (size_t)128 * BM * 4, cudaMemcpyDeviceToHost));
    CK(cudaFree(dq));
    CK(cudaFree(dx));
    CK(cudaFree(dout));
    free(hx);
}

static struct tile make(int K, int BM) {
    struct tile tl;
    tl.K = K, tl.BM = BM;
    tl.codes = (uint8_t *)calloc((size_t)128 * K / 2, 1);
    tl.scales = (uint8_t *)malloc((size_t)128 * K / 32);
    memset(tl.scales, 127, (size_t)128 * K / 32);
    tl.x = (float *)calloc((size_t)BM * K, sizeof(float));
    tl.out = (float *)malloc((size_t)128 * BM * sizeof(float));
    tl.w = (float *)malloc((size_t)128 * K * sizeof(float));
    return tl;
}
static void drop(struct tile *tl) {
    free(tl->codes), free(tl->scales), free(tl->x), free(tl->out), free(tl->w);
}

/* 1: random tiles; 0 when every output is within tol of the reference */
static int random_case(int K, int BM) {
    struct tile tl = make(K, BM);
    for (size_t i = 0; i < (size_t)128 * K / 2; i++)
        tl.codes[i] = (uint8_t)rnd();
    for (size_t i = 0; i < (size_t)128 * K / 32; i++)
        tl.scales[i] = (uint8_t)(120 + rnd() % 11);
    for (size_t i = 0; i < (size_t)BM * K; i++)
        tl.x[i] = bf16_round((float)((double)(rnd() >> 11) * 0x1p-53 * 2.0 - 1.0));
    run(&tl);
    dequant_fp4_ref(tl.w, tl.codes, tl.scales, 128, K);
    double worst = 0;
    int wr = 0, wn = 0;
    for (int r = 0; r < 128; r++)
        for (int n = 0; n < BM; n++) {
            double ref = 0, mag = 1e-30;
            for (int k = 0; k < K; k++) {
                double p = (double)tl.w[(size_t)r * K + k] * tl.x[(size_t)n * K + k];
                ref += p, mag += fabs(p);
            }
            double e = fabs(tl.out[(size_t)r * BM + n] - ref) / mag;
            if (!(e <= worst)) worst = e, wr = r, wn = n; // (a NaN is the worst)
        }
    int bad = !(worst < 1e-4);
    printf("%s wr_probe/random K %d BM %d: worst %.3g of the terms' magnitude at weight row %d, x "
           "row %d\n",
           bad ? "FAIL" : "OK", K, BM, worst, wr, wn);
    drop(&tl);
    return bad;
}

/* 2: where single codes land */
static int placement_case(void) {
    const int K = 128, BM = 64, rows[] = {0, 1, 7, 8, 9, 15, 16, 63, 64, 127};
    int right = 0, wrong = 0;
    for (size_t ri = 0; ri < sizeof rows / sizeof *rows; ri++)
        for (int k = 0; k < K; k++) {
            struct tile tl = make(K, BM);
            int r = rows[ri];
            tl.codes[(size_t)r * (K / 2) + k / 2] = (uint8_t)(k & 1 ? 0x20 : 0x02); // 1.0
            for (int kk = 0; kk < K; kk++)
                tl.x[kk] = (float)(kk + 1); // x row 0
            run(&tl);
            int got_r = -1, got_k = -1, n_nz = 0;
            for (int rr = 0; rr < 128; rr++) {
                float v = tl.out[(size_t)rr * BM];
                if (v != 0.0f) n_nz++, got_r = rr, got_k = (int)v - 1;
            }
            if (n_nz == 1 && got_r == r && got_k == k)
                right++;
            else if (wrong++ < 12)
                printf("  code at weight row %d, k %d: %d outputs non-zero, the last at row %d as "
                       "k %d\n",
                       r, k, n_nz, got_r, got_k);
            drop(&tl);
        }
    printf("%s wr_probe/placement: %d of %d single codes where they belong\n",
           wrong ? "FAIL" : "OK", right, right + wrong);
    return wrong != 0;
}

/* 3: the scale's two decode paths */
static int scale_case(void) {
    const int K = 128, BM = 64, sc[] = {1, 120, 127, 128, 140, 254};
    int bad = 0;
    for (size_t i = 0; i < sizeof sc / sizeof *sc; i++) {
        struct tile tl = make(K, BM);
        for (int k = 0; k < 32; k++)
            tl.codes[(size_t)5 * (K / 2) + k / 2] |= (uint8_t)(k & 1 ? 0x20 : 0x02);
        tl.scales[(size_t)5 * (K / 32)] = (uint8_t)sc[i];
        for (int n = 0; n < BM; n++)
            for (int k = 0; k < K; k++)
                tl.x[(size_t)n * K + k] = n == 0 ? 1.0f : 0.0f;
        run(&tl);
        double want = 32.0 * ldexp(1.0, sc[i] - 127);
        float got = tl.out[(size_t)5 * BM];
        if ((double)got != (float)want) {
            printf("  scale byte %d: row 5 gives %.9g, want %.9g\n", sc[i], got, want);
            bad = 1;
        }
        drop(&tl);
    }
    printf("%s wr_probe/scales: 1, 120, 127, 128, 140, 254\n", bad ? "FAIL" : "OK");
    return bad;
}

int main(void) {
    int bad = 0;
    bad |= random_case(128, 64);
    bad |= random_case(384, 64);
    bad |= random_case(128, 128);
    bad |= random_case(384, 128);
    bad |= placement_case();
    bad |= scale_case();
    return bad;
}
