/* drafter.h: the interface every drafter implements (ngram and random now; MTP and DSpark
 * plug in the same way).
 *
 *   struct td_drafter *d = draft_init("ngram", vocab, err, sizeof err);
 *   int n = d->propose(d, &req, k, drafts, q, &q_onehot);
 *   ... verify ..., then d->observe(d, &req, n_accepted) when the drafter keeps state
 *   draft_free(d);
 *
 * A drafter proposes up to k tokens to follow a request's committed tokens and says which
 * distribution each was drawn from: either one-hot (q_onehot = 1: the draft is certain, as a
 * lookup or a greedy drafter is) or the rows q[k][vocab] it sampled them from. Verification is
 * lossless only if q is exactly that distribution.
 */
#ifndef TD_DRAFTER_H
#define TD_DRAFTER_H

#include <stddef.h>
#include <stdint.h>

#include "verify/sample.h"

#ifdef __cplusplus
extern "C" {
#endif

struct td_draft_req {
    int id;                /* request id */
    const int32_t *tokens; /* [n_tokens] prompt + generated; the last one is the anchor */
    int n_tokens;
    const struct td_sampling *sampling;
};

struct td_drafter {
    const char *name;
    int vocab;
    /* drafts[k]; q[k * vocab] when !*q_onehot. Returns how many were proposed (0 .. k). */
    int (*propose)(struct td_drafter *d, const struct td_draft_req *r, int k, int32_t *drafts,
                   float *q, int *q_onehot);
    /* the first n_accepted proposals were accepted (stateful drafters); may be NULL */
    void (*observe)(struct td_drafter *d, const struct td_draft_req *r, int n_accepted);
    void *impl;
};

/* "ngram" (prompt lookup) or "random" (uniform tokens, a test tool). NULL + message for any
 * other name. "none" is not a drafter: the engine runs without one. */
struct td_drafter *draft_init(const char *name, int vocab, char *err, size_t errlen);

void draft_free(struct td_drafter *d);

#ifdef __cplusplus
}
#endif
#endif
