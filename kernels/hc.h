/* hc.h: manifold-constrained hyper-connections (mHC): collapse nc residual streams into one
 * block input, expand the block output back, and the final head collapse.
 * All math fp32 (double for the long RMS and mixing sums), as dsv4.md section 3.2. */
#ifndef TD_KERNELS_HC_H
#define TD_KERNELS_HC_H

#include <stddef.h>
#include "dtype.h"
#include "reserve.h"

#ifdef __cplusplus
extern "C" {
#endif

/* At start-up, outside any capture: sizes the CUDA kernels' scratch for the largest step and
 * refuses (-1 + message with the numbers) what they cannot take. Accepts: any shape; sizes the
 * mixes' chunk parts when the width (hc_mult x dim) is split. */
int hc_cuda_reserve(const struct td_reserve *r, char *err, size_t errlen);

/* Batch-invariant mode (the backend's set_deterministic): the mixes of wide steps on the fp32
 * pipes, as narrow steps make them, instead of tensor-core tiles (hc.cu). */
void hc_cuda_set_deterministic(int on);

struct hc_weights {
    const void *fn;    /* [(2 + nc) * nc, nc * d] rows: pre | post | comb (row-major nc x nc) */
    const void *base;  /* [(2 + nc) * nc] */
    const void *scale; /* [3] (pre, post, comb) */
    enum td_dtype fn_dtype, base_dtype, scale_dtype;
};

/* For n tokens with streams x[n, nc, d]: collapsed[n, d] = sum_i pre_i x_i, post[n, nc],
 * comb[n, nc, nc] (Sinkhorn-normalised; new stream j uses column j). With norm not NULL the
 * collapsed rows are then RMS-normalised and weighted by norm [d] (rms_eps): the layer's
 * attn_norm / ffn_norm, exactly rmsnorm_ref after the collapse. */
void hc_pre_ref(float *collapsed, float *post, float *comb, const float *x,
                const struct hc_weights *w, int n, int nc, int d, int sinkhorn_iters, float hc_eps,
                float rms_eps, const void *norm, enum td_dtype norm_dtype);

/* x[n, nc, d] <- post_j * a + sum_i comb[i][j] * x_i  (in place), a[n, d] the block output;
 * then, when mean is not NULL, mean[t * mean_stride + c] = the mean of the nc new streams at c
 * (DSpark's capture of a target layer; mean_streams_ref's sums). */
void hc_post_ref(float *x, const float *a, const float *post, const float *comb, int n, int nc,
                 int d, float *mean, int mean_stride);

/* y[n, d] = sum_i (sigmoid(mix_i * scale + base_i) + eps) x_i, mix = fn . rms(x) (hc_head). */
void hc_head_ref(float *y, const float *x, const void *fn, enum td_dtype fn_dtype, const void *base,
                 enum td_dtype base_dtype, const void *scale, enum td_dtype scale_dtype, int n,
                 int nc, int d, float hc_eps, float rms_eps);

/* CUDA launchers (kernels/<op>.cu): the same contract on device pointers, queued on the
 * backend's stream. Defined only in builds with nvcc. */
void hc_pre_cuda(float *collapsed, float *post, float *comb, const float *x,
                 const struct hc_weights *w, int n, int nc, int d, int sinkhorn_iters, float hc_eps,
                 float rms_eps, const void *norm, enum td_dtype norm_dtype);
void hc_post_cuda(float *x, const float *a, const float *post, const float *comb, int n, int nc,
                  int d, float *mean, int mean_stride);
void hc_head_cuda(float *y, const float *x, const void *fn, enum td_dtype fn_dtype,
                  const void *base, enum td_dtype base_dtype, const void *scale,
                  enum td_dtype scale_dtype, int n, int nc, int d, float hc_eps, float rms_eps);

#ifdef __cplusplus
}
#endif
#endif
