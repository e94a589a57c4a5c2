/* random.c: uniform random drafts, a test tool: it exercises every rejection path, and at T > 0
 * its q is the uniform distribution it really samples from, so verification stays lossless. */
#include "drafter.h"

#include <stdlib.h>

static int random_propose(struct td_drafter *d, const struct td_draft_req *r, int k,
                          int32_t *drafts, float *q, int *q_onehot) {
    *q_onehot = 0;
    for (int j = 0; j < k; j++) {
        // keyed by the position the draft would take, so a request's drafts are reproducible
        double u = td_rand_uniform(r->sampling->seed, (uint64_t)(r->n_tokens + j), TD_RAND_DRAFT);
        drafts[j] = (int32_t)(u * d->vocab);
        if (drafts[j] >= d->vocab) drafts[j] = d->vocab - 1;
        for (int v = 0; v < d->vocab; v++)
            q[(size_t)j * d->vocab + v] = 1.0f / d->vocab;
    }
    return k;
}

struct td_drafter *draft_random_init(int vocab);
struct td_drafter *draft_random_init(int vocab) {
    static const struct td_drafter proto = {.name = "random", .propose = random_propose};
    return draft_request_new(&proto, vocab);
}
