/* plan.c: build and validate the per-step plan (one allocation, token-major arrays). */
#include "plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int meta_plan_build(struct td_plan *p, int n_seq, const int32_t *slot, const int32_t *len_before,
                    const int32_t *n_new, const int32_t *ids, char *err, size_t errlen) {
    memset(p, 0, sizeof *p);
    if (n_seq <= 0) {
        snprintf(err, errlen, "plan: no sequences");
        return -1;
    }
    long n_tok = 0;
    for (int s = 0; s < n_seq; s++) {
        if (n_new[s] <= 0 || len_before[s] < 0) {
            snprintf(err, errlen, "plan: sequence %d has %d new tokens after %d", s, n_new[s],
                     len_before[s]);
            return -1;
        }
        n_tok += n_new[s];
    }
    if (n_tok > (1L << 30)) {
        snprintf(err, errlen, "plan: %ld tokens in one step", n_tok);
        return -1;
    }
    size_t words = (size_t)n_tok * 3 + (size_t)n_seq * 3 + 1;
    int32_t *m = malloc(words * sizeof(int32_t));
    if (!m) {
        snprintf(err, errlen, "plan: out of memory for %ld tokens", n_tok);
        return -1;
    }
    p->mem = m;
    p->n_tok = (int)n_tok;
    p->n_seq = n_seq;
    p->input_ids = m;
    p->positions = m + n_tok;
    p->row_seq = m + 2 * n_tok;
    p->qo_indptr = m + 3 * n_tok;
    p->slot = p->qo_indptr + n_seq + 1;
    p->len_before = p->slot + n_seq;
    int t = 0;
    p->qo_indptr[0] = 0;
    for (int s = 0; s < n_seq; s++) {
        p->slot[s] = slot[s];
        p->len_before[s] = len_before[s];
        for (int j = 0; j < n_new[s]; j++, t++) {
            p->input_ids[t] = ids[t];
            p->positions[t] = len_before[s] + j;
            p->row_seq[t] = s;
        }
        p->qo_indptr[s + 1] = t;
    }
    return 0;
}

void meta_plan_free(struct td_plan *p) {
    free(p->mem);
    memset(p, 0, sizeof *p);
}

int meta_plan_validate(const struct td_plan *p, char *err, size_t errlen) {
    if (p->n_seq <= 0 || p->qo_indptr[0] != 0 || p->qo_indptr[p->n_seq] != p->n_tok) {
        snprintf(err, errlen, "plan: qo_indptr does not span [0, %d)", p->n_tok);
        return -1;
    }
    for (int s = 0; s < p->n_seq; s++) {
        if (p->qo_indptr[s + 1] <= p->qo_indptr[s]) {
            snprintf(err, errlen, "plan: sequence %d has no rows (qo_indptr %d..%d)", s,
                     p->qo_indptr[s], p->qo_indptr[s + 1]);
            return -1;
        }
        for (int r = 0; r < s; r++)
            if (p->slot[r] == p->slot[s]) {
                snprintf(err, errlen, "plan: sequences %d and %d share slot %d", r, s, p->slot[s]);
                return -1;
            }
        for (int t = p->qo_indptr[s]; t < p->qo_indptr[s + 1]; t++)
            if (p->row_seq[t] != s || p->positions[t] != p->len_before[s] + t - p->qo_indptr[s]) {
                snprintf(err, errlen, "plan: row %d has sequence %d position %d, expected %d/%d",
                         t, p->row_seq[t], p->positions[t], s,
                         p->len_before[s] + t - p->qo_indptr[s]);
                return -1;
            }
    }
    return 0;
}
