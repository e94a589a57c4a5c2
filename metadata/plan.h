/* plan.h: the per-step plan, rebuilt out of place for every forward call and draft sub-step.
 *
 *   struct td_plan_dims d = meta_plan_dims(&cfg, state.swa_ring, ring_csa, ring_hca, max_ctx,
 *                                          max_tok, max_seq);
 *   struct td_plan p;
 *   meta_plan_init(&p, &d);                       // one buffer, fixed capacity and layout
 *   struct td_plan_seq seqs[2] = {{.slot = slot0, .len_before = 37, .n_new = 1, .ids = ids0},
 *                                 {.slot = slot3, .len_before = 5, .n_new = 4, .ids = ids3}};
 *   meta_plan_build(&p, seqs, 2, err, sizeof err); // every array rewritten from these alone
 *   td_forward(&model, &state, &p, logits, err, sizeof err);
 *   meta_plan_free(&p);
 *
 * Capture-stable: every array's capacity and offset in the buffer, and every row stride,
 * come from td_plan_dims (configuration maxima) only, never from the live batch. The live
 * batch is padded to bucket sizes (td_plan.n_tok_pad, n_seq_pad); pad rows are valid rows:
 * zero-length ranges that start and end at the last real end, slot -1, write slot -1.
 * meta_plan_build rewrites every element of every array (pads included) from the sequences
 * it is given, so nothing from an earlier step survives, except in the two row-strided regions
 * (window keys swa_pos, top-k), which it rewrites over the step's bucket of n_tok_pad rows:
 * the graph of that bucket reads no row past it. Consumers never write a plan, except the
 * indexer's output region `topk`, which the builder resets to -1 over the step's rows.
 *
 * Rows are token-major: sequence s owns rows [qo_indptr[s], qo_indptr[s+1]).
 */
#ifndef TD_PLAN_H
#define TD_PLAN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct td_plan_dims {
    int max_tok;  /* row capacity (largest bucket) */
    int max_seq;  /* sequence capacity */
    int max_ctx;  /* longest context a sequence may reach */
    int window;   /* sliding_window: keys per row at most */
    int topk;     /* stride of a topk row: index_topk, or ceil(max_ctx / rate_csa) when that
                     is less (a row never sees more entries; td_state_plan_dims) */
    int rate_csa; /* 0 when the model has no CSA layer */
    int rate_hca; /* 0 when the model has no HCA layer */
    int swa_ring; /* rows in a sequence's sliding-window ring */
    int ring_csa; /* rows in a sequence's CSA compressor ring */
    int ring_hca; /* rows in a sequence's HCA compressor ring */
    int block;    /* most rows of a non-causal block (a drafter's, e.g. DSpark), 0: none */
};

/* one sequence's part of a step, as the scheduler sees it */
struct td_plan_seq {
    int32_t slot;        /* state slot */
    int32_t len_before;  /* committed length */
    int32_t n_new;       /* rows this step, >= 1 */
    const int32_t *ids;  /* [n_new] */
    int32_t skip_logits; /* leading rows whose logits nobody reads (0: every row's; a prompt
                            chunk that does not end the prompt skips all, the last skips n - 1) */
    int32_t block;       /* 0: causal rows, stored (every target step). 1: a non-causal block
                            of at most dims.block rows: each row sees the window before the
                            block, (len_before - window, len_before), and every row of the
                            block; nothing is stored and the committed length stays. Only for
                            models without compressed layers (a DSpark drafter's stages) */
};

struct td_plan {
    struct td_plan_dims dims;
    int n_tok, n_seq;         /* real rows and sequences */
    int n_tok_pad, n_seq_pad; /* the bucket the batch is padded to */
    int32_t *input_ids;       /* [max_tok], pad 0 */
    int32_t *positions;       /* [max_tok], pad 0 */
    int32_t *row_seq;         /* [max_tok] sequence of each row, pad -1 */
    int32_t *qo_indptr;       /* [max_seq + 1], pad = n_tok */
    int32_t *slot;            /* [max_seq] state slot, pad -1 */
    int32_t *len_before;      /* [max_seq] committed length before the step, pad 0 */
    int32_t *kv_indptr;       /* [max_seq + 1] CSR of context length after the step, pad = last
                                 real end */
    int32_t *block;           /* [max_seq] 1: the sequence's rows are a non-causal block, pad 0 */
    int32_t *swa_indptr;      /* [max_tok + 1] CSR of each row's sliding-window keys, pad = last
                                 real end */
    int32_t *swa_pos;         /* [max_tok * (window + block)] key positions, ascending; -1 past
                                 the end */
    int32_t *swa_write;       /* [max_tok] ring row the row's key is stored at, -1: not stored */
    int32_t *vis_csa;         /* [max_tok] visible CSA entries floor((pos+1)/m), pad 0 */
    int32_t *vis_hca;         /* [max_tok] visible HCA entries floor((pos+1)/M), pad 0 */
    int32_t *emit_csa;        /* [max_tok] CSA entry whose window the row closes, else -1 */
    int32_t *emit_hca;        /* [max_tok] HCA entry whose window the row closes, else -1 */
    int32_t *write_csa;       /* [max_tok] CSA compressor ring row, -1: not stored */
    int32_t *write_hca;       /* [max_tok] HCA compressor ring row, -1: not stored */
    int32_t *topk;            /* [max_tok * topk] indexer output, row stride dims.topk, -1 pad */
    int32_t *logit_rows;      /* [max_tok] rows whose logits the step returns, ascending; -1 pad */
    int32_t *logit_indptr;    /* [max_seq + 1] sequence s's logits are rows [logit_indptr[s],
                                 logit_indptr[s + 1]) of the step's logits; pad = last real end */
    int n_logit;              /* logits rows this step (== n_tok when no row is skipped) */
    void *mem;                /* the one buffer behind every array */
    size_t bytes;
};

/* Round n up to the next bucket (1, 2, 4, ... powers of two), capped at cap. */
int meta_bucket(int n, int cap);

/* Bytes of the buffer for these dims (the same code as meta_plan_init's layout). */
size_t meta_plan_bytes(const struct td_plan_dims *d);

/* The bytes of the buffer a copy of the plan in device memory needs from the host each step,
 * from its start: every sequence array and row array, then the step's rows of the window keys.
 * Not the top-k region: that is the indexer's output, and the indexer writes every row of the
 * step's bucket there (pad rows -1) before anything reads it, on the device as on the host. One
 * copy: a 6-row verify step of tandem-tiny sends 17 KB of its 209 KB buffer. */
size_t meta_plan_span(const struct td_plan *p);

/* Allocate the buffer and lay out the arrays. 0, or -1 with a message. */
int meta_plan_init(struct td_plan *p, const struct td_plan_dims *d, char *err, size_t errlen);

/* Rewrite every array from seqs[0..n_seq). 0, or -1 with a message when the step does not fit
 * the dims (too many rows/sequences, context past max_ctx, empty sequence). */
int meta_plan_build(struct td_plan *p, const struct td_plan_seq *seqs, int n_seq, char *err,
                    size_t errlen);

void meta_plan_free(struct td_plan *p);

/* Check every invariant: monotone indptrs with no negative length; pad rows and sequences
 * inert (zero length at the last real end, slot -1, write slots -1); row_seq and positions
 * consistent with qo_indptr and len_before; slots distinct; window ranges exactly
 * (pos - window, pos] clipped at 0 (a block's rows: the window before the block and the whole
 * block, nothing written); write slots in range; visible counts and emits consistent
 * with positions; array offsets equal to the layout the dims fix. 0, or -1 naming the first
 * broken invariant and its row. */
int meta_plan_validate(const struct td_plan *p, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
