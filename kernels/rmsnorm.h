/* rmsnorm.h: RMSNorm over the last dim, weighted (w != NULL) or unweighted. */
#ifndef TD_KERNELS_RMSNORM_H
#define TD_KERNELS_RMSNORM_H

#include "dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y[n, d] = x / sqrt(mean(x^2) + eps) * w; w [d] may be NULL (unweighted). y may alias x. */
void rmsnorm_ref(float *y, const float *x, const void *w, enum td_dtype w_dtype, int n, int d,
                 float eps);

/* CUDA launchers (kernels/<op>.cu): the same contract on device pointers, queued on the
 * backend's stream. Defined only in builds with nvcc. */
void rmsnorm_cuda(float *y, const float *x, const void *w, enum td_dtype w_dtype, int n, int d,
                  float eps);

#ifdef __cplusplus
}
#endif
#endif
