/* plan.h: the per-step plan, a value built fresh from scheduler state for every forward call.
 *
 *   int32_t slot[2] = {0, 3}, len[2] = {37, 5}, n_new[2] = {1, 4}, ids[5] = {...};
 *   struct td_plan p;
 *   if (meta_plan_build(&p, 2, slot, len, n_new, ids, err, sizeof err)) ...
 *   td_forward(model, state, &p, logits, ...);
 *   meta_plan_free(&p);
 *
 * Token-major: the n_tok rows are the sequences' new tokens, sequence by sequence. Nothing
 * that reads a plan mutates it; nothing derived from it is cached across steps.
 */
#ifndef TD_PLAN_H
#define TD_PLAN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct td_plan {
    int n_tok;              /* rows this step */
    int n_seq;              /* sequences this step */
    int32_t *input_ids;     /* [n_tok] */
    int32_t *positions;     /* [n_tok] absolute position of each row */
    int32_t *row_seq;       /* [n_tok] index into the plan's sequences */
    int32_t *qo_indptr;     /* [n_seq + 1] rows of sequence s are [qo_indptr[s], qo_indptr[s+1]) */
    int32_t *slot;          /* [n_seq] state slot of each sequence */
    int32_t *len_before;    /* [n_seq] committed length before this step */
    void *mem;              /* one allocation behind every array */
};

/* Build from n_seq sequences: state slot, committed length, new token count (>= 1) and the
 * new tokens concatenated in sequence order. 0, or -1 with a message (no allocation held). */
int meta_plan_build(struct td_plan *p, int n_seq, const int32_t *slot, const int32_t *len_before,
                    const int32_t *n_new, const int32_t *ids, char *err, size_t errlen);

void meta_plan_free(struct td_plan *p);

/* Invariants: monotone qo_indptr from 0 to n_tok, no empty sequence, row_seq and positions
 * consistent with qo_indptr and len_before, distinct slots. 0 or -1 with a message. */
int meta_plan_validate(const struct td_plan *p, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
