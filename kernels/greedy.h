/* greedy.h: the tokens of logits rows that stay on the backend.
 *
 * argmax_rows: ids[i] = argmax x[i] (ties to the lower id), or -1 when row i has a non-finite
 * entry: a greedy step's verification reads these n ints instead of n x V logits.
 *
 * sample_rows: ids[i] = the token row i draws with s[i]: its argmax when s[i].temperature is 0
 * (argmax_rows), else the first token at which the cumulative distribution of
 * softmax(x[i] / temperature), cut to its top_k most likely and then to the shortest prefix
 * reaching top_p (probs_cut_ref), passes s[i].u (the inverse CDF: td_probs and td_sample,
 * verify/sample.h); -1 when the row has a non-finite entry. A step brings these n ints to the
 * host instead of n x V logits.
 *
 * greedy_slot: one slot of a greedy draft chain (the MTP's k-step recursion; drafters.md 4.3),
 * so that a greedy round drafts without the host.
 * For each row i of x [n, V]: a = argmax x[i] (ties to the lower id); when n_drafts[i] == j
 * and the row is finite, tok[i * g + j] = a and n_drafts[i] = j + 1, so a chain stops at its
 * first non-finite row (as td_probs refuses one). next[i] = a, or 0 for a non-finite row, either
 * way: the id the chain's next step embeds (its rows past the stop are dropped later). */
#ifndef TD_KERNELS_GREEDY_H
#define TD_KERNELS_GREEDY_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "reserve.h"

#ifdef __cplusplus
extern "C" {
#endif

/* At start-up, outside any capture: sizes the CUDA kernels' scratch for the largest step and
 * refuses (-1 + message with the numbers) what they cannot take. Accepts: any shape; sizes the
 * per-row and per-span scratch of sample_rows (r->rows, r->vocab). */
int sample_rows_cuda_reserve(const struct td_reserve *r, char *err, size_t errlen);

struct sample_row {
    float temperature; /* 0: the argmax */
    int32_t top_k;     /* 0 (or >= V): no cut */
    float top_p;       /* 1: no cut */
    int32_t pad_;
    double u; /* uniform in [0, 1) */
};

/* whether a draw is cut (a sampled one with top-k below V or top-p below 1): the rows
 * sample_rows' cut pass takes, and the engine's test for them, one definition */
static inline TD_HOST_DEVICE int sample_row_cut(float temperature, int top_k, float top_p, int V) {
    return temperature > 0.0f && ((top_k > 0 && top_k < V) || (top_p > 0.0f && top_p < 1.0f));
}

void argmax_rows_ref(int32_t *ids, const float *x, int n, int V);
/* cuts: whether a row may carry top-k or top-p (the device then runs their pass; the reference
 * reads each row's own) */
void sample_rows_ref(int32_t *ids, const float *x, int n, int V, const struct sample_row *s,
                     int cuts);
/* the two halves of a sampled row on the host (verify/sample.c's td_probs and td_sample are
 * built on them): p[V] <- softmax(x / temperature) (temperature > 0; exp of x - max in fp32,
 * summed in fp64, each p its quotient rounded to fp32), -1 (p untouched) when x has a
 * non-finite entry; and the first token whose cumulative p (summed in fp64) passes u, or the
 * last with p > 0 when rounding leaves u above the total */
int softmax_t_ref(float *p, const float *x, int V, float temperature);
int cdf_draw_ref(const float *p, int V, double u);
/* p (a softmax row) cut to its top_k most likely (0 or >= V: all) and then to the shortest
 * prefix of them, by probability with ties to the lower id, whose sum reaches top_p (>= 1: no
 * cut) of the candidates' mass (the row's sum in id order without top-k, the k candidates' in
 * rank order with it), renormalised; the rest 0. Ranks only as far as the cut needs. */
void probs_cut_ref(float *p, int V, int top_k, float top_p);
void greedy_slot_ref(int32_t *tok, int32_t *n_drafts, int32_t *next, const float *x, int n, int V,
                     int g, int j);

/* CUDA launchers (kernels/greedy.cu): the same contracts on device pointers, queued. */
void sample_rows_cuda(int32_t *ids, const float *x, int n, int V, const struct sample_row *s,
                      int cuts);
void greedy_slot_cuda(int32_t *tok, int32_t *n_drafts, int32_t *next, const float *x, int n, int V,
                      int g, int j);

#ifdef __cplusplus
}
#endif
#endif
