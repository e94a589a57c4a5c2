/* ngram.c: prompt-lookup drafting. For n = 3, 2, 1: find the most recent earlier occurrence of
 * the request's last n tokens that is followed by k tokens (else the one followed by the most)
 * and propose the tokens that followed it. Certain (one-hot) drafts:
 * at T > 0 each is accepted with the target's probability of it. Suits editing and retrieval
 * workloads, where the output repeats spans of the prompt. */
#include "drafter.h"

#include <stdlib.h>

#define NGRAM_MAX 3

static int ngram_propose(struct td_drafter *d, const struct td_draft_req *r, int k, int32_t *drafts,
                         float *q, int *q_onehot) {
    (void)d;
    (void)q;
    *q_onehot = 1;
    const int32_t *t = r->tokens;
    int n_tok = r->n_tokens;
    for (int n = NGRAM_MAX; n >= 1; n--) {
        if (n_tok < n + 1) continue;
        const int32_t *tail = t + n_tok - n;
        // most recent earlier occurrence with a full continuation: scan backwards
        int best = -1, best_len = 0;
        for (int st = n_tok - n - 1; st >= 0 && best_len < k; st--) {
            int j = 0;
            while (j < n && t[st + j] == tail[j])
                j++;
            if (j < n) continue;
            int len = n_tok - (st + n) < k ? n_tok - (st + n) : k;
            if (len > best_len) best = st, best_len = len;
        }
        if (best >= 0) {
            for (int m = 0; m < best_len; m++)
                drafts[m] = t[best + n + m];
            return best_len;
        }
    }
    return 0;
}

struct td_drafter *draft_ngram_init(int vocab);
struct td_drafter *draft_ngram_init(int vocab) {
    static const struct td_drafter proto = {.name = "ngram", .propose = ngram_propose};
    return draft_request_new(&proto, vocab);
}
