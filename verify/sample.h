/* sample.h: the request's sampling distribution and counter-based randomness.
 *
 * Randomness is a pure function of (request seed, position, stream): a request draws the same
 * numbers whatever else shares its batch, and a failing case replays bit-exactly.
 */
#ifndef TD_SAMPLE_H
#define TD_SAMPLE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct td_sampling {
    float temperature; /* 0: greedy (argmax, lowest id among ties) */
    int top_k;         /* 0: off */
    float top_p;       /* 1: off; in (0, 1] */
    uint64_t seed;
};

enum td_rand_stream { TD_RAND_SAMPLE = 1, TD_RAND_ACCEPT = 2, TD_RAND_DRAFT = 3 };

/* uniform in [0, 1) from (seed, position, stream) */
double td_rand_uniform(uint64_t seed, uint64_t position, uint32_t stream);

/* p[vocab] <- the distribution a token is sampled from: softmax(logits / T) restricted to the
 * top_k most likely, then to the smallest prefix (by probability, ties to the lower id) whose
 * sum reaches top_p of the candidates' mass (the row's sum in id order without top-k, the k
 * candidates' in rank order with it), renormalised. Greedy: one-hot at the argmax. Returns 0,
 * or -1 when the row holds a NaN or infinity. */
int td_probs(float *p, const float *logits, int vocab, const struct td_sampling *s);

/* the token at which the cumulative distribution first exceeds u (inverse CDF); the last token
 * with non-zero mass when rounding leaves u above the total */
int td_sample(const float *p, int vocab, double u);

/* index of the largest value, lowest index among ties */
int td_argmax(const float *x, int n);

/* td_argmax, or -1 when x has a non-finite entry, in one pass (td_probs, greedy verification) */
int td_argmax_finite(const float *x, int n);

#ifdef __cplusplus
}
#endif
#endif
