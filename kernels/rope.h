/* rope.h: interleaved partial RoPE on the trailing rot_dim channels (DeepSeek-V4 layout).
 *
 * Pair i of a vector x of length d is (x[d - rot_dim + 2i], x[d - rot_dim + 2i + 1]);
 * the leading d - rot_dim ("nope") channels are untouched.
 */
#ifndef TD_KERNELS_ROPE_H
#define TD_KERNELS_ROPE_H

#include <stddef.h>
#include <stdint.h>

#include "reserve.h"

#ifdef __cplusplus
extern "C" {
#endif

/* At start-up, outside any capture: sizes the CUDA kernels' scratch for the largest step and
 * refuses (-1 + message with the numbers) what they cannot take. Accepts: rot_dim at most 512. */
int rope_cuda_reserve(const struct td_reserve *r, char *err, size_t errlen);

struct rope_params {
    double theta;           /* base */
    int rot_dim;            /* rotated channels (even) */
    int yarn;               /* 0 default, 1 yarn */
    double factor;          /* yarn */
    double orig_max_pos;    /* yarn */
    double beta_fast;       /* yarn */
    double beta_slow;       /* yarn */
    int truncate;           /* yarn: floor/ceil the correction range */
    float attention_factor; /* cos and sin are multiplied by it */
};

/* inv_freq[rot_dim / 2], computed with the fp32 operations HF uses. */
void rope_inv_freq_ref(float *inv_freq, const struct rope_params *p);

/* cos/sin[rot_dim / 2] at position pos: angle = fp32(pos * inv_freq[i]). */
void rope_cos_sin_ref(float *cos_out, float *sin_out, const float *inv_freq, int half, long pos,
                      float attention_factor);

/* rotate n vectors x[n, stride] (first d channels used) by the pair tables; inverse uses -sin. */
void rope_apply_ref(float *x, int n, int stride, int d, int rot_dim, const float *cos_t,
                    const float *sin_t, int inverse);

/* Rotate row t's n_vec vectors (x[t, v, 0..d)) at position positions[t]; cos/sin from
 * inv_freq exactly as rope_cos_sin_ref. */
void rope_rows_ref(float *x, int n, int n_vec, int d, int rot_dim, const int32_t *positions,
                   const float *inv_freq, float attention_factor, int inverse);

/* CUDA launchers (kernels/<op>.cu): the same contract on device pointers, queued on the
 * backend's stream. Defined only in builds with nvcc. */
void rope_rows_cuda(float *x, int n, int n_vec, int d, int rot_dim, const int32_t *positions,
                    const float *inv_freq, float attention_factor, int inverse);

#ifdef __cplusplus
}
#endif
#endif
