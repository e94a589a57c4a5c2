/* matmul.h: y = x W^T with W stored [out, in] in F32, BF16 or F16 (PyTorch Linear layout), or
 * packed as the released FP8 / FP4 (TD_DTYPE_Q8 / Q4, quant.h: the CUDA launchers only; the CPU
 * runs their exact F32 decode). */
#ifndef TD_KERNELS_MATMUL_H
#define TD_KERNELS_MATMUL_H

#include <stddef.h>
#include "dtype.h"
#include "reserve.h"

/* The CUDA launchers read steps of up to this many rows as fp32 (the skinny kernel; Q8 / Q4
 * weights up to 64 rows, and bf16 matrices up to MATMUL_WIDE_ROWS while their bytes times the
 * blocks of 8 rows are at most 16 MiB); wider steps round x to bf16 for cuBLASLt.
 * matmul_cuda_reads_f32 says which. */
#define MATMUL_SKINNY_ROWS 8
#define MATMUL_WIDE_ROWS   512

/* One output of a set of GEMMs that read the same x rows (a layer's projections of its normed
 * input): y[n, out] = x . w^T (+ bias) (+ pos_bias[positions[t] % rate] on row t: the
 * compressor's position bias, added as add_pos_bias_ref adds it). */
#define MATMUL_SET_MAX 8
struct matmul_out {
    float *y;
    const void *w;
    enum td_dtype dtype;
    int out;
    const void *bias;
    enum td_dtype bias_dtype;
    const void *pos_bias; /* [rate, out] or NULL */
    enum td_dtype pos_bias_dtype;
    const int32_t *positions; /* [n] */
    int rate;
};

#ifdef __cplusplus
extern "C" {
#endif

/* At start-up, outside any capture: sizes the CUDA kernels' scratch for the largest step and
 * refuses (-1 + message with the numbers) what they cannot take. Accepts: any shape; sizes the bf16
 * copy of x (rows x gemm_in). */
int matmul_cuda_reserve(const struct td_reserve *r, char *err, size_t errlen);

/* y[n, out] = x[n, in] . w[out, in]^T (+ bias[out] when bias != NULL).
 * Each output element is one dot product accumulated in double in index order,
 * so a row's result does not depend on n (batch invariance). y must not alias x. */
void matmul_ref(float *y, const float *x, const void *w, enum td_dtype w_dtype, int n, int in,
                int out, const void *bias, enum td_dtype bias_dtype);

/* Block-diagonal: for each group j < groups, y[:, j*out .. (j+1)*out) =
 * x[:, j*in .. (j+1)*in) . w[j*out .. (j+1)*out, :]^T; x [n, groups*in], w [groups*out, in]. */
void matmul_grouped_ref(float *y, const float *x, const void *w, enum td_dtype w_dtype, int n,
                        int groups, int in, int out);

/* every output of o[0 .. m) from x[n, in]: the same results as one matmul_ref each. No y may
 * alias x. */
void matmul_set_ref(const float *x, int n, int in, int m, const struct matmul_out *o);

/* CUDA launchers (kernels/<op>.cu): the same contract on device pointers, queued on the
 * backend's stream. Defined only in builds with nvcc. w (and bias) must be a model's weights,
 * written before any step and never by a queued kernel: the skinny kernel starts reading w
 * before the kernel queued before it has finished. */
void matmul_cuda(float *y, const float *x, const void *w, enum td_dtype w_dtype, int n, int in,
                 int out, const void *bias, enum td_dtype bias_dtype);
void matmul_grouped_cuda(float *y, const float *x, const void *w, enum td_dtype w_dtype, int n,
                         int groups, int in, int out);
/* a skinny step of bf16 matrices (m <= MATMUL_SET_MAX) is one launch over all their tiles: the
 * small projections of a layer fill the GPU together, where each alone left it idle */
void matmul_set_cuda(const float *x, int n, int in, int m, const struct matmul_out *o);
/* 0 when a step of n rows of an [out, in] matrix of dtype t rounds x to bf16 (cuBLASLt), 1 when
 * it reads x as fp32 (the skinny kernel, fp32 weights, batch-invariant mode) */
int matmul_cuda_reads_f32(enum td_dtype t, int n, int in, long long out);
/* 1: batch-invariant GEMMs (a fixed reduction order per output, whatever n), slower */
void matmul_cuda_set_deterministic(int on);
/* FP8 skinny steps of 2 to 8 rows: 2 takes two tiles of 16 features a block on the same x
 * terms, 1 one; 0 chooses by the launch's tiles (the default, unless TD_Q8H_NT=1|2 at the
 * start). Either gives the same bits. */
void matmul_cuda_set_q8h_nt(int nt);
/* FP8 skinny steps of 9 to 48 rows: 1 makes x's half-precision terms once a launch for every
 * tile (TD_Q8H_XT=1 at the start), 2 in each block (TD_Q8H_XT=0); 0 chooses by the launch's
 * tiles (the default). The same bits either way. */
void matmul_cuda_set_q8h_xt(int on);
/* 1: FP8 matrices' steps past the skinny kernel's rows run on FP8 tensor cores, x quantized per
 * 128 columns as the reference does (matmul.cu lt_fp8); 0 (the default): on the matrix's bf16
 * copy; -1: as TD_FP8_LT=1 says (unset: 0). Set it before the backend's reservation. */
void matmul_cuda_set_fp8_lt(int on);
/* the order of its scale grids (measuring and tests): bit 1 the weight's k-block fastest, bit 2
 * x's k-block fastest, else the out / token index fastest (0, TD_FP8_LT_LAYOUT unset); -1: as
 * TD_FP8_LT_LAYOUT says */
void matmul_cuda_set_fp8_layout(int bits);

#ifdef __cplusplus
}
#endif
#endif
