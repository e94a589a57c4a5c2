/* moe.h: DeepSeek-V4 MoE pieces: router (learned top-k or hash) and a clamped SwiGLU expert. */
#ifndef TD_KERNELS_MOE_H
#define TD_KERNELS_MOE_H

#include "dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

enum moe_score { MOE_SCORE_SQRTSOFTPLUS = 0, MOE_SCORE_SIGMOID, MOE_SCORE_SOFTMAX };

/* One token. scores = score_fn(logits[n_experts]).
 * Learned (hash_row == NULL): picks = top-k of scores + bias (bias may be NULL), ties to the
 * lower expert id. Hash: picks = hash_row[0..k). weight_j = scores[pick_j] /
 * (sum + 1e-20) * scaling. Picks are written in selection order. */
void moe_route_ref(int *picks, float *weights, const float *logits, enum moe_score score_fn,
                   const void *bias, enum td_dtype bias_dtype, const int64_t *hash_row, int k,
                   int n_experts, float scaling);

/* y[n, d] = w2 . (silu(min(x.w1, limit)) * clamp(x.w3, -limit, limit)); w1, w3 [inter, d],
 * w2 [d, inter]; optional biases (NULL) b1, b3 [inter], b2 [d]. */
struct swiglu_weights {
    const void *w1, *w3, *w2, *b1, *b3, *b2;
    enum td_dtype w1_dtype, w3_dtype, w2_dtype, b1_dtype, b3_dtype, b2_dtype;
};
void swiglu_ref(float *y, const float *x, const struct swiglu_weights *w, int n, int d, int inter,
                float limit);

#ifdef __cplusplus
}
#endif
#endif
