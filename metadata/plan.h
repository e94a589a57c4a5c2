/* plan.h: the per-step plan, rebuilt out of place for every forward call and draft sub-step.
 *
 *   struct td_plan_dims d = td_state_plan_dims(&st, 64, 4);   // the state's rings, 64 rows, 4 seqs
 *   struct td_plan p;
 *   if (meta_plan_init(&p, &d, err, sizeof err)) return -1;   // one buffer, fixed layout
 *   struct td_plan_seq seqs[2] = {{.slot = slot0, .len_before = 37, .n_new = 1, .ids = ids0},
 *                                 {.slot = slot3, .len_before = 5, .n_new = 4, .ids = ids3}};
 *   int rc = meta_plan_build(&p, seqs, 2, err, sizeof err) ||   // every array, from seqs alone
 *            td_forward(&model, &st, &p, logits, NULL, err, sizeof err);
 *   meta_plan_free(&p);
 *
 * Capture-stable: every array's capacity and offset in the buffer, and every row stride,
 * come from td_plan_dims (configuration maxima) only, never from the live batch. The live
 * batch is padded to bucket sizes (td_plan.n_tok_pad, n_seq_pad); pad rows are valid rows:
 * zero-length ranges that start and end at the last real end, slot -1, write slot -1.
 * meta_plan_build rewrites every element of every array (pads included) from the sequences
 * it is given, so nothing from an earlier step survives, except in the window keys swa_pos and
 * the block tables, which it rewrites over the step's bucket of n_tok_pad rows and n_seq_pad
 * sequences (the graph of that bucket reads no row or sequence past it), and in `topk`. Consumers
 * never write a plan, except the indexer's output region `topk`, which the builder leaves alone:
 * each CSA layer's indexer writes every entry of every row the step runs (its picks, -1 past them;
 * a pad row's all -1) before that layer's attention reads any. Resetting it on the host cost 8 MB
 * of writes a 4096-row prefill step at V4-Flash's top-512 (plan building 1165 -> 306 us on a 2-core
 * EPYC, bench/plan_time), 786 KB a DSpark verify step of 64 sequences (84 -> 29 us), and no device
 * ever read those bytes (they are past the plan's upload span).
 *
 * Rows are token-major: sequence s owns rows [qo_indptr[s], qo_indptr[s+1]).
 */
#ifndef TD_PLAN_H
#define TD_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/rows.h"

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
    /* the paged history (compressed entries and indexer keys; state.h): */
    int hist_block;        /* tokens a history block holds (B), 0: no compressed layer, no tables */
    int max_blocks;        /* a sequence's block table width: ceil(max_ctx / hist_block), else 0 */
    int n_blocks;          /* blocks in the state's pool: ids 0 .. n_blocks - 1 */
    int slots;             /* the state's sequence slots: the rows of tables */
    const int32_t *tables; /* [slots, max_blocks] the state's block tables (td_state.table), of
                              which each step's builder copies its sequences' rows; NULL: none */
};

/* whether two plans' dims are the same (a plan built for a state fits it) */
int meta_plan_dims_equal(const struct td_plan_dims *a, const struct td_plan_dims *b);

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

/* Every array of the plan's one buffer, in buffer order, written once: X(name, words), where
 * words is the region's capacity in int32 words from T = max_tok, S = max_seq, W = window +
 * block (the keys a row sees at most), K = topk and NB = max_blocks. It generates td_plan's fields,
 * the layout (plan.c), the bindings and the checks of meta_plan_validate; meta_plan_rows resolves
 * the row arrays against either base. Each region starts on a 64-byte boundary. The strided regions
 * come last: a step's part of swa_pos is a prefix, and what a device copy needs ends there; then
 * the step's part of the block tables, a prefix too (meta_plan_spans); topk is the indexer's
 * output. */
#define TD_PLAN_REGIONS(X)                                                                         \
    X(input_ids, T)      /* [max_tok], pad 0 */                                                    \
    X(positions, T)      /* [max_tok], pad 0 */                                                    \
    X(row_seq, T)        /* [max_tok] sequence of each row, pad -1 */                              \
    X(qo_indptr, S + 1)  /* [max_seq + 1], pad = n_tok */                                          \
    X(slot, S)           /* [max_seq] state slot, pad -1 */                                        \
    X(len_before, S)     /* [max_seq] committed length before the step, pad 0 */                   \
    X(kv_indptr, S + 1)  /* [max_seq + 1] CSR of context length after the step, pad = last end */  \
    X(block, S)          /* [max_seq] 1: the sequence's rows are a non-causal block, pad 0 */      \
    X(swa_indptr, T + 1) /* [max_tok + 1] CSR of each row's window keys, pad = last real end */    \
    X(swa_write, T)      /* [max_tok] ring row the row's key is stored at, -1: not stored */       \
    X(vis_csa, T)        /* [max_tok] visible CSA entries floor((pos+1)/m), pad 0 */               \
    X(vis_hca, T)        /* [max_tok] visible HCA entries floor((pos+1)/M), pad 0 */               \
    X(emit_csa, T)       /* [max_tok] CSA entry whose window the row closes, else -1 */            \
    X(emit_hca, T)       /* [max_tok] HCA entry whose window the row closes, else -1 */            \
    X(write_csa, T)      /* [max_tok] CSA compressor ring row, -1: not stored */                   \
    X(write_hca, T)      /* [max_tok] HCA compressor ring row, -1: not stored */                   \
    X(logit_rows, T)     /* [max_tok] rows whose logits the step returns, ascending; -1 pad */     \
    X(logit_indptr, S + 1) /* [max_seq + 1] sequence s's logits are rows [logit_indptr[s],         \
                              logit_indptr[s + 1]) of the step's logits; pad = last real end */    \
    X(swa_pos, T *W) /* [max_tok * (window + block)] key positions, ascending; -1 past end */      \
    X(blocks, S *NB) /* [max_seq * max_blocks] each sequence's block table: the blocks of its */   \
                     /* positions [0, kv length), then -1; a pad sequence's all -1 */              \
    X(topk, T *K)    /* [max_tok * topk] indexer output, row stride dims.topk, -1 pad */

struct td_plan {
    struct td_plan_dims dims;
    int n_tok, n_seq;         /* real rows and sequences */
    int n_tok_pad, n_seq_pad; /* the bucket the batch is padded to */
#define TD_PLAN_FIELD(name, words) int32_t *name;
    TD_PLAN_REGIONS(TD_PLAN_FIELD)
#undef TD_PLAN_FIELD
    int n_logit;    /* logits rows this step (== n_tok when no row is skipped) */
    void *mem;      /* the one buffer behind every array */
    int32_t *owner; /* [dims.n_blocks + dims.max_blocks] the validator's marks, -1 between
                       calls, then a row of -1s (host only) */
    size_t bytes;
};

/* which compressed layer's visible / emit / ring-write rows a rows_view carries */
enum meta_rate { META_RATE_NONE, META_RATE_CSA, META_RATE_HCA };

/* Round n up to the next bucket (1, 2, 4, ... powers of two), capped at cap. */
int meta_bucket(int n, int cap);

/* Of flex rows that may wait (prompt chunks) beside fixed rows that may not (decode and verify
 * rows), how many to run in this step. A step of n rows whose bucket (meta_bucket(n, cap)) is
 * at most graph_rows replays that bucket's graph, padding rows included: a step just past a
 * bucket runs about twice its rows (a 512-row chunk beside 16 decodes: 1024). When fewer flex
 * rows would go over the bucket below than the padding would add, and the bucket is past
 * floor (below it a step's cost is its weights', whatever its rows), the step stops at that
 * bucket and those rows wait for the next; never all of them (at least one flex row runs when
 * any was given). Otherwise flex. */
int meta_bucket_fit(int fixed, int flex, int cap, int graph_rows, int floor);

/* Bytes of the buffer for these dims (the same code as meta_plan_init's layout). */
size_t meta_plan_bytes(const struct td_plan_dims *d);

/* The parts of the buffer a copy of the plan in device memory needs from the host each step:
 * from its start every sequence array and row array, then the step's rows of the window keys;
 * and the step's sequences' block tables (a model with compressed layers). Not the top-k region:
 * that is the indexer's output, and the indexer writes every row of the step's bucket there
 * (pad rows -1) before anything reads it, on the device as on the host. Writes each part's byte
 * offset and length, returns how many (1 or 2): a 6-row verify step of tandem-tiny sends 17 KB
 * of its 209 KB buffer. */
int meta_plan_spans(const struct td_plan *p, size_t off[2], size_t bytes[2]);

/* Allocate the buffer and lay out the arrays. 0, or -1 with a message. */
int meta_plan_init(struct td_plan *p, const struct td_plan_dims *d, char *err, size_t errlen);

/* Rewrite every array from seqs[0..n_seq). 0, or -1 with a message when the step does not fit
 * the dims (too many rows/sequences, context past max_ctx, empty sequence). */
int meta_plan_build(struct td_plan *p, const struct td_plan_seq *seqs, int n_seq, char *err,
                    size_t errlen);

void meta_plan_free(struct td_plan *p);

/* The plan's row arrays as the kernels read them, at the plan's offsets inside `base`: the
 * plan's own buffer (p->mem) or a copy of it (device memory), so one layout serves both. n_tok
 * is the step's real rows; rate picks the compressed layer's vis / emit / write arrays (NONE:
 * NULL). */
struct rows_view meta_plan_rows(const struct td_plan *p, void *base, enum meta_rate rate);

/* Check every invariant: monotone indptrs with no negative length; pad rows and sequences
 * inert (zero length at the last real end, slot -1, write slots -1); row_seq and positions
 * consistent with qo_indptr and len_before; slots distinct; window ranges exactly
 * (pos - window, pos] clipped at 0 (a block's rows: the window before the block and the whole
 * block, nothing written); write slots in range; visible counts and emits consistent
 * with positions; block tables that cover each context with blocks of the pool (-1 after it,
 * pads all -1), no block twice in a table, and no block the step writes (one holding a position
 * at or past its sequence's committed length) in another sequence's table; array offsets equal
 * to the layout the dims fix. 0, or -1 naming the first broken invariant and its row. */
int meta_plan_validate(const struct td_plan *p, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
