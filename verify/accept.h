/* accept.h: lossless verification of a draft chain against the target (drafters.md 3.3, 3.4).
 *
 * The verify forward fed [x_0 (anchor), x_1 .. x_L] at positions pos0 .. pos0 + L; target row
 * j is the distribution of the token at pos0 + j + 1 and judges draft x_{j+1}. Greedy accepts
 * while x_{j+1} = argmax p_j; sampled accepts while u < p_j(x) / q_j(x), then draws the
 * correction from normalise(max(p_a - q_{a+1}, 0)) (p_a when that mass is ~0), or the bonus
 * from p_L when all L were accepted.
 */
#ifndef TD_ACCEPT_H
#define TD_ACCEPT_H

#include <stdint.h>

#include "sample.h"

#ifdef __cplusplus
extern "C" {
#endif

enum verify_status { VERIFY_OK = 0, VERIFY_NAN_TARGET = 1 };

struct verify_result {
    int n_accepted; /* drafts accepted, a prefix of the chain: 0 .. L */
    int32_t token;  /* the correction or bonus token; -1 when status != OK */
    enum verify_status status;
    long nan_position; /* status NAN_TARGET: the position whose distribution was not finite */
    int n_drafts_used; /* L after dropping drafts whose q row was not finite */
};

/* logits[L + 1][vocab] target rows; drafts[L]; q[j] -> the vocab-sized distribution draft j was
 * drawn from, or NULL for a one-hot draft (greedy / lookup drafters). Scratch: p[vocab],
 * r[vocab]. accept_scale must be 1 (tests pass other values to prove their power). */
void verify_chain(struct verify_result *res, const float *logits, int vocab, const int32_t *drafts,
                  const float *const *q, int L, const struct td_sampling *s, long pos0, float *p,
                  float *r, double accept_scale);

/* verify_chain at temperature 0 (drafts one-hot) from the target rows' argmaxes alone: ids[j]
 * the argmax of row j, ties to the lower id, or -1 for a row with a non-finite entry (a device
 * computes them where the logits are: kernels/greedy.h argmax_rows). The same result as
 * verify_chain over those rows. */
void verify_greedy(struct verify_result *res, const int32_t *ids, int vocab, const int32_t *drafts,
                   int L, long pos0);

#ifdef __cplusplus
}
#endif
#endif
