/* norm_rope.h: RMSNorm then RoPE on each head vector of a row, and optionally the row's store
 * into a sliding-window ring: the shared K = V row of an attention layer (weighted norm, one
 * vector, stored) and its queries (unweighted per-head norm, n_vec heads, not stored) in one op
 * instead of a norm, a rope and a ring store. */
#ifndef TD_KERNELS_NORM_ROPE_H
#define TD_KERNELS_NORM_ROPE_H

#include <stddef.h>
#include "dtype.h"
#include "rows.h"
#include "reserve.h"

#ifdef __cplusplus
extern "C" {
#endif

/* At start-up, outside any capture: sizes the CUDA kernels' scratch for the largest step and
 * refuses (-1 + message with the numbers) what they cannot take. Accepts: even widths (head_dim,
 * index_head_dim) of at most 512, an even rot_dim of at most 512 and at most the width. */
int norm_rope_cuda_reserve(const struct td_reserve *r, char *err, size_t errlen);

struct norm_rope_args {
    float *x;        /* [n, n_vec, d], in place */
    int n, n_vec, d; /* rows, vectors per row, vector width (even) */
    const void *w;   /* [d] norm weight, or NULL (unweighted) */
    enum td_dtype w_dtype;
    float eps;
    int rot_dim;              /* RoPE on the trailing rot_dim channels of each vector */
    const int32_t *positions; /* [n] */
    const float *inv_freq;    /* [rot_dim / 2] */
    float attn_factor;
    float *ring;           /* [max_seqs, ring_rows, n_vec * d] ring, or NULL: no store */
    const int32_t *write;  /* [n] ring row of each row or -1 (with ring) */
    struct rows_view rows; /* row_seq and slot (with ring) */
    int ring_rows;
};

/* x[t, v] = rope(rmsnorm(x[t, v]) (* w), positions[t]) for every row t and vector v: exactly
 * rmsnorm_ref over n * n_vec vectors, then rope_rows_ref, then ring_store_ref when ring is set */
void norm_rope_ref(const struct norm_rope_args *a);

/* parts a[0 .. m) (m <= NORM_ROPE_PARTS) over the same n rows, as norm_rope_ref each: an
 * attention layer's queries and its K = V row, one launch on the GPU */
#define NORM_ROPE_PARTS 2
void norm_rope_parts_ref(const struct norm_rope_args *a, int m);

/* CUDA launcher (kernels/norm_rope.cu), queued on the backend's stream; builds with nvcc only. */
void norm_rope_cuda(const struct norm_rope_args *a, int m);

#ifdef __cplusplus
}
#endif
#endif
