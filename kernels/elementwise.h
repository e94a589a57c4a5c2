/* elementwise.h: embedding gather into the residual streams, and small pointwise ops. */
#ifndef TD_KERNELS_ELEMENTWISE_H
#define TD_KERNELS_ELEMENTWISE_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* X[t, i, :] = emb[ids[t], :] for each of the nc streams i; zeros where ids[t] < 0 (a pad row's
 * -1: the forward gathers the rows whose logits a step returns so) */
void embed_ref(float *X, const int32_t *ids, const void *emb, enum td_dtype emb_dtype, int n,
               int nc, int d);

/* y[i] += x[i] */
void add_ref(float *y, const float *x, size_t n);

/* x[i] *= s */
void scale_ref(float *x, float s, size_t n);

/* X[t, i, :] += e[t, :] for each of the nc streams i (a row vector broadcast over streams);
 * with positions, not for the rows at position 0 (MTP's token term there is zero) */
void add_bcast_ref(float *X, const float *e, int n, int nc, int d, const int32_t *positions);

/* y[t * y_stride + c] = mean over the nc streams of X[t, i, c] (summed in stream order, / nc) */
void mean_streams_ref(float *y, const float *X, int n, int nc, int d, int y_stride);

/* a step's id patches, one launch for up to ID_PATCH_MAX of them (passed by value):
 * ids[row[i] .. row[i] + len[i]) = src[i][0 .. len[i]) for i < n, src in backend memory (the
 * drafts a drafter left there). A step of 32 DSpark rounds copied them with 32 kernels before
 * its graph, about 3 us each. */
#define ID_PATCH_MAX 64
struct id_patches {
    int n;
    int row[ID_PATCH_MAX], len[ID_PATCH_MAX];
    const int32_t *src[ID_PATCH_MAX];
};
void patch_ids_ref(int32_t *ids, const struct id_patches *p);

/* g[i] = silu(min(g[i], limit)) * clamp(u[i], -limit, limit) (DeepSeek-V4 SwiGLU clamp) */
void swiglu_act_ref(float *g, const float *u, size_t n, float limit);

/* CUDA launchers (kernels/<op>.cu): the same contract on device pointers, queued on the
 * backend's stream. Defined only in builds with nvcc. */
void embed_cuda(float *X, const int32_t *ids, const void *emb, enum td_dtype emb_dtype, int n,
                int nc, int d);
void add_cuda(float *y, const float *x, size_t n);
void scale_cuda(float *x, float s, size_t n);
void swiglu_act_cuda(float *g, const float *u, size_t n, float limit);
void add_bcast_cuda(float *X, const float *e, int n, int nc, int d, const int32_t *positions);
/* dst[0 .. bytes) = src[0 .. bytes) (no overlap) by a kernel, not a copy engine: src is device
 * memory or pinned host memory the device reads over the bus. Between two kernels of a step a
 * copy engine's copy waited for the one before and was waited for (about 9 us for a 10 KB plan
 * upload on the H200, TD_TIMELINE); a kernel stays on the compute engine. */
void copy_bytes_cuda(void *dst, const void *src, size_t bytes);
void patch_ids_cuda(int32_t *ids, const struct id_patches *p);

#ifdef __cplusplus
}
#endif
#endif
