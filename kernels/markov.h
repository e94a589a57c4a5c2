/* markov.h: DSpark's greedy Markov chain for a batch of drafting sequences (drafters.md 2; the
 * caller is draft/dspark.c), so that a greedy round drafts without the host: slots j = 0 .. g-1
 * in order, in one call.
 *
 * Sequence i (its block: rows i * g .. i * g + g - 1) drafts when row_seq[i * g] >= 0 (else
 * it is a pad), slot j when n_drafts[i] == j. Then, with prev = ids[i * g] (the anchor) at
 * j = 0 and tok[i * g + j - 1] after, and row = i * g + j:
 *   e      = W1[prev]                                  (the Markov embedding, rank r)
 *   conf   = sigmoid(conf_w . [y[row]; e])             -> conf[row]
 *   z[v]   = U[row, v] + W2[v] . e                     (v over the vocabulary)
 *   the slot is cut (nothing drafted) when threshold > 0 and conf < threshold, or when z has
 *   a non-finite entry; otherwise tok[row] = argmax z (ties to the lower id), n_drafts[i] = j + 1.
 * A sequence that did not draft slot j drafts no later slot; n_drafts is written for every
 * sequence. ids and row_seq are the block forward's plan rows as its kernels read them, so
 * the chain needs no inputs of its own and can join the block forward's graph
 * (td_forward_tail); a caller that wants fewer than g drafts drops the rest. */
#ifndef TD_KERNELS_MARKOV_H
#define TD_KERNELS_MARKOV_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "reserve.h"

#ifdef __cplusplus
extern "C" {
#endif

/* At start-up, outside any capture: sizes the CUDA kernels' scratch for the largest step and
 * refuses (-1 + message with the numbers) what they cannot take. Accepts: a Markov rank of at most
 * 256 and at most 32 slots. */
int markov_cuda_reserve(const struct td_reserve *r, char *err, size_t errlen);

struct markov_args {
    const float *U; /* [n * g, V] base logits */
    const float *y; /* [n * g, D] the stages' hc_head output */
    const void *w1; /* [V, r] Markov embedding */
    const void *w2; /* [V, r] Markov output */
    enum td_dtype w1_dtype, w2_dtype;
    const float *conf_w; /* [D + r] confidence head */
    float threshold;     /* 0: no cut */
    int n, g, V, D, r;
    const int32_t *ids;     /* [n * g] the block rows' ids: the anchors at i * g */
    const int32_t *row_seq; /* [n * g] the block rows' sequences: < 0 at a pad block */
    int32_t *tok;           /* [n * g] drafts */
    float *conf;            /* [n * g] */
    int32_t *n_drafts;      /* [n] out */
};

void markov_greedy_ref(const struct markov_args *a);

/* CUDA launcher (kernels/markov.cu), queued on the backend's stream; builds with nvcc only.
 * With n = 0 nothing runs and it makes its launch settings for these dtypes and this V, as it
 * must once before the chain is captured in a graph. */
void markov_greedy_cuda(const struct markov_args *a);

#ifdef __cplusplus
}
#endif
#endif
