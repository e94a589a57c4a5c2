/* attention.h: shared-KV multi-query attention with per-head sinks (DeepSeek-V4).
 *
 * For one query token with H heads: keys are n_keys rows of d floats (K = V); for head h
 *   s_j = q_h . k_j * scale,   p_j = exp(s_j - M) / (sum_j exp(s_j - M) + exp(sink_h - M)),
 *   out_h = sum_j p_j k_j,     M = max(max_j s_j, sink_h).
 * The sink is a raw logit with no value. n_keys may be 0 (out = 0). */
#ifndef TD_KERNELS_ATTENTION_H
#define TD_KERNELS_ATTENTION_H

#ifdef __cplusplus
extern "C" {
#endif

/* out[n_heads, d], q[n_heads, d]; keys[j] -> d floats; sinks[n_heads] fp32. */
void attention_sink_ref(float *out, const float *q, const float *const *keys, int n_keys,
                        const float *sinks, int n_heads, int d, float scale);

#ifdef __cplusplus
}
#endif
#endif
