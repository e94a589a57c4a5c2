/* indexer.h: Lightning Indexer scoring and top-k selection (CSA layers).
 *
 *   score[w] = sum_h weight[h] * relu(q[h] . key[w]) * scale     for w < n_keys
 *
 * Selection keeps the k = min(topk, n_keys) highest scores, ties broken toward the lower
 * entry index, and writes the picks sorted ascending, padded with -1 to topk. */
#ifndef TD_KERNELS_INDEXER_H
#define TD_KERNELS_INDEXER_H

#include <stddef.h>
#include "kv.h"
#include "rows.h"
#include "reserve.h"

#ifdef __cplusplus
extern "C" {
#endif

/* At start-up, outside any capture: sizes the CUDA kernels' scratch for the largest step and
 * refuses (-1 + message with the numbers) what they cannot take. Accepts: index_head_dim of at
 * most 256 (a lane holds 8 of its columns); sizes the scores (rows x (entries + 1)). */
int indexer_cuda_reserve(const struct td_reserve *r, char *err, size_t errlen);

/* Rows a block of the CUDA scores takes: 1, 2 (the default) or 4, the same scores bit for bit
 * (measuring and tests); 0: the default again. Call outside any capture; TD_INDEXER_ROWS=R sets
 * the default at the first step. */
void indexer_cuda_set_rows(int rows);

/* The CUDA scores of the last indexer_topk_cuda call: [rows, entries] on the device, row t's
 * entries below its visible count written (tests). */
const float *indexer_cuda_scores(void);

/* score[n_keys]; q[n_heads, d], weight[n_heads], keys[n_keys, d] contiguous. */
void indexer_score_ref(float *score, const float *q, const float *weight, const float *keys,
                       int n_keys, int n_heads, int d, float scale);

/* idx[topk] <- sorted ascending picks, -1 padded; returns the number of picks. */
int topk_select_ref(int *idx, const float *score, int n_keys, int topk);

struct indexer_args {
    struct rows_view rows; /* uses row_seq, slot, vis, topk (output) */
    const float *q;        /* [n_tok, n_heads, d] roped indexer queries */
    const float *w;        /* [n_tok, n_heads] head weights, scaled by n_heads^-1/2 */
    const void *keys;      /* [n_blocks * per] indexer keys, fmt records, paged: key w of row
                              t's sequence s is row rows_entry(&rows, s, w, per) */
    struct kv_fmt fmt;     /* their precision (kv.h); zero: fp32 */
    int n_entries;         /* keys a sequence reaches at most */
    int per;               /* keys a history block holds */
    int n_heads, d, topk;
    float scale; /* d^-1/2 */
};

/* rows.topk[t] <- the top-k of row t's scores over its visible entries (sorted, -1 padded),
 * for every row t < rows.n_tok, a pad row all -1: the region is this op's output alone (a
 * plan's device copy does not carry it, meta_plan_span). */
void indexer_topk_ref(const struct indexer_args *a);

/* CUDA launchers (kernels/<op>.cu): the same contract on device pointers, queued on the
 * backend's stream. Defined only in builds with nvcc. */
void indexer_topk_cuda(const struct indexer_args *a);

#ifdef __cplusplus
}
#endif
#endif
