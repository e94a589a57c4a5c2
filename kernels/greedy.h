/* greedy.h: argmaxes of logits rows that stay on the backend.
 *
 * argmax_rows: ids[i] = argmax x[i] (ties to the lower id), or -1 when row i has a non-finite
 * entry: a greedy step's verification reads these n ints instead of n x V logits.
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

#include "reserve.h"

#ifdef __cplusplus
extern "C" {
#endif

/* At start-up, outside any capture: sizes the CUDA kernels' scratch for the largest step and
 * refuses (-1 + message with the numbers) what they cannot take. Accepts: any shape; sizes the
 * per-row scratch of argmax_rows. */
int argmax_rows_cuda_reserve(const struct td_reserve *r, char *err, size_t errlen);

void argmax_rows_ref(int32_t *ids, const float *x, int n, int V);
void greedy_slot_ref(int32_t *tok, int32_t *n_drafts, int32_t *next, const float *x, int n, int V,
                     int g, int j);

/* CUDA launchers (kernels/greedy.cu): the same contracts on device pointers, queued. */
void argmax_rows_cuda(int32_t *ids, const float *x, int n, int V);
void greedy_slot_cuda(int32_t *tok, int32_t *n_drafts, int32_t *next, const float *x, int n, int V,
                      int g, int j);

#ifdef __cplusplus
}
#endif
#endif
