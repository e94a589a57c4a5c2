/* forward.h: the DeepSeek-V4 target forward over one step plan (CPU reference backend).
 *
 *   struct td_plan_dims dims = td_state_plan_dims(&st, 64, 4);   // <= 64 rows, 4 sequences
 *   struct td_plan p;
 *   if (meta_plan_init(&p, &dims, err, sizeof err)) return -1;
 *   struct td_plan_seq seq = {.slot = slot, .len_before = st.len[slot], .n_new = n, .ids = ids};
 *   int rc = meta_plan_build(&p, &seq, 1, err, sizeof err) ||         // every step
 *            td_forward(&model, &st, &p, logits, NULL, err, sizeof err); // logits [n, vocab]
 *   meta_plan_free(&p);                                                  // st.len[slot] += n
 *
 * Reads each sequence's caches at positions < len_before, appends the plan's rows, and
 * commits them: state->len[slot] = len_before + rows. Rows of different sequences never
 * interact, and every row's arithmetic is independent of which other rows share the call,
 * so a sequence gives bit-identical logits alone, batched, or fed in any chunking.
 */
#ifndef TD_FORWARD_H
#define TD_FORWARD_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "model/state.h"
#include "metadata/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* logits[n_logit, vocab]: the rows p->logit_rows (every row unless the plan's sequences skip
 * some: then the head runs only on the rows kept). topk_trace, when not NULL, receives the
 * indexer's selection of every CSA layer: [n_layers, n_tok, index_topk], ascending, -1 padded (rows
 * of other layers untouched). Returns 0, or -1 with a message (state unchanged) when the plan does
 * not match the state (slot not live, len_before != committed length, context full, token id out of
 * range). */
int td_forward(const struct td_model *m, struct td_state *st, const struct td_plan *p,
               float *logits, int32_t *topk_trace, char *err, size_t errlen);

/* what a drafter reads from or feeds to a forward; every pointer in backend memory, any NULL */
/* A step replayed from a CUDA graph runs every row of its padded bucket, pad rows included, so
 * each buffer here holds the plan's widest bucket (dims.max_tok rows), not the live rows: a
 * graph writes, and reads, the same sizes at every replay. */
/* plan rows row .. row + n - 1 take their input ids from src, in backend memory: drafts a
 * drafter left there, which the host has not seen (their plan rows hold placeholders) */
struct td_id_patch {
    int row, n;
    const int32_t *src;
};

/* An op queued after the pass's head, in the step's graph when it has one, so that it starts
 * as the head ends (DSpark's Markov chain): run(ctx, rows) with the pass's rows as the kernels
 * read them (a graph's whole bucket, pad rows included; input_ids and row_seq in backend
 * memory on a device). The same tail gives the same graph: ctx's buffers stay put. */
struct rows_view;
struct td_forward_tail {
    void (*run)(void *ctx, const struct rows_view *rows);
    void *ctx;
};

/* what a keys-only pass (td_forward_store_kv) makes its keys from; 0: a whole forward */
enum td_keys { TD_KEYS_NONE, TD_KEYS_CONTEXT, TD_KEYS_STREAMS };

struct td_forward_io {
    const float *x_in;         /* [max_tok, hc_mult, dim] replaces the embedding as the input
                                  (an MTP model: the streams its input is made from, with the
                                  plan's ids) */
    float *hidden_out;         /* [max_tok, hc_mult, dim] the final streams, before hc_head (MTP);
                                  rows n_tok .. n_tok_pad - 1 get the pad rows' streams */
    int hidden_by_position;    /* hidden_out is [slots, swa_ring, hc_mult, dim] instead: row t
                                  goes to its slot's ring row swa_write[t], as its window key
                                  does (rows the ring does not keep and pad rows go nowhere), so
                                  the streams of a sequence's last positions stay there */
    float *hc_out;             /* [max_tok, dim] hc_head's rows, the final norm's input (DSpark's
                                  Markov and confidence heads read them), pad rows likewise */
    float *capture;            /* [max_tok, n_capture, dim] the mean of the streams after each of
                                  capture_layers (DSpark's context), pad rows likewise */
    float *capture_ring;       /* [slots, swa_ring, n_capture, dim] or NULL: capture's rows by
                                  position as well, as hidden_by_position keeps the streams
                                  (rows the ring does not keep and pad rows go nowhere), so that
                                  a drafter that drafts nothing need not take them each step */
    const int *capture_layers; /* [n_capture] ascending layer indices */
    int n_capture;
    const struct td_id_patch *id_patches; /* copied into the plan's device copy before the
                                             step runs (backends with a device plan only) */
    int n_id_patches;
    enum td_keys keys_only; /* td_forward_store_kv's pass (x_in: its rows); for prepare */
    const float *x_ring;    /* DSpark's insertion (TD_KEYS_CONTEXT) and an MTP model: the rows
                               by position instead of x_in, [slots, x_ring_rows, width]: row t
                               is its slot's ring row positions[t] % x_ring_rows (the target's
                               capture_ring or streams by position), loaded first */
    int x_ring_rows;
    const struct td_forward_tail *tail; /* queued after the head, or NULL */
};

/* td_forward with a drafter's inputs and outputs (io may be NULL). logits NULL: the step's
 * logits stay in the backend for td_forward_logits and the call returns without waiting for
 * the step (a fault surfaces at the backend's next finish). */
int td_forward_ex(const struct td_model *m, struct td_state *st, const struct td_plan *p,
                  const struct td_forward_io *io, float *logits, int32_t *topk_trace, char *err,
                  size_t errlen);

/* The last forward's logits rows [n_logit, vocab] in backend memory (until the next forward on
 * this state); NULL before the first. */
const float *td_forward_logits(const struct td_state *st);

/* Capture now the step graphs of every row bucket from min_rows to max_rows (at most
 * td_state.graph_rows, 128 unless set) for steps
 * that will pass io and plans of dims d, so that no request waits while one is made: call at
 * start-up. Nothing runs; without graphs (CPU, use_graphs off) it does nothing. 0, or -1 with
 * a message. */
int td_forward_prepare(const struct td_model *m, struct td_state *st, const struct td_plan_dims *d,
                       const struct td_forward_io *io, int min_rows, int max_rows, char *err,
                       size_t errlen);

/* Store keys in every layer's sliding-window ring, nothing else: for each plan row,
 * rope(kv_norm(wkv x_row)) at its position, written where the plan says, and the committed
 * length advances as after a forward. Where x_row comes from (io->keys_only; x = io->x_in in
 * backend memory, rows n_tok .. n_tok_pad - 1 read, since a graph serves the bucket, and
 * stored nowhere):
 *   TD_KEYS_CONTEXT: outside rows. A DSpark drafter's context insertion: its stages' keys come
 *     from the captured target rows, x [max_tok, n_capture * dim], fused and normalised first
 *     (main_proj, main_norm); a model without that projection takes x [max_tok, dim] as they
 *     are. With io->x_ring the rows are read by position from there instead (the target's
 *     capture_ring).
 *   TD_KEYS_STREAMS: the layer's own input streams x [max_tok, hc_mult, dim] (an MTP model:
 *     made from the streams before, x or io->x_ring, and the plan's ids, as the whole forward
 *     makes them), through its hc_pre and attn_norm as the whole forward would: the same keys,
 *     bit for bit, without the attention, the experts or the head. One-layer models (MTP's
 *     catch-up of rows it drafts nothing from).
 * Sliding-window-only models. Queued: nothing waits (a fault surfaces at the backend's next
 * finish); 0, or -1 with a message. */
int td_forward_store_kv(const struct td_model *m, struct td_state *st, const struct td_plan *p,
                        const struct td_forward_io *io, char *err, size_t errlen);

/* A change of the state outside a step that every rank makes where rank 0 makes it, in the
 * order of the steps (the engine's prefix cache: a published block's copy into a request's own,
 * a checkpoint of a slot's windows and its load). The values are the engine's (blocks of the
 * history pool, slots, checkpoint numbers of its checkpoint pool, which every rank sizes
 * alike). */
struct td_state_op {
    int32_t kind; /* TD_OP_* */
    int32_t a, b, c;
};
enum {
    TD_OP_BLOCK_COPY = 1, /* block a <- block b */
    TD_OP_WINDOW_SAVE,    /* slot a's windows into checkpoint b */
    TD_OP_WINDOW_LOAD
}; /* slot a, taken fresh, from checkpoint b at length c */
struct td_serve;
/* a follower's part: apply(ctx, op) makes each op rank 0 sends (0, or -1 with a message); serve
 * runs this rank's experts of rank 0's drafter (NULL: it has none) */
struct td_follow_ops {
    int (*apply)(void *ctx, const struct td_state_op *op, char *err, size_t errlen);
    void *ctx;
    struct td_serve *serve;
};

/* A drafter's experts over the ranks of a split target (split.h td_split_serve): rank 0 alone runs
 * the drafter (its state, rounds and drafts); each of its MoE layers sends the layer's normed rows
 * and picks to the other ranks, each rank runs its part of the experts into the slots and one sum
 * combines them, as the target's layers do, so the drafts are the same bits at every world size.
 * A rank past 0 holds a server: the drafter's model, loaded (host, taken by the call: freed with
 * the server, also on failure), placed on b as td_model_place_drafter places a drafter of
 * target_run (a split model's rank: its experts of the drafter only), and buffers for max_rows
 * rows (rank 0's drafter plan's widest step). td_forward_follow runs td_serve_step for each of
 * rank 0's drafter steps (n rows): every MoE layer's rows and picks from rank 0, this rank's
 * experts, the sum. 0, or -1 with a message. */
int td_serve_init(struct td_serve **out, struct td_model *host, const struct td_model *target_run,
                  const struct td_backend *b, int max_rows, char *err, size_t errlen);
int td_serve_step(struct td_serve *s, int n, char *err, size_t errlen);
size_t td_serve_weight_bytes(const struct td_serve *s); /* the drafter's weights placed here */
const struct td_model *td_serve_model(const struct td_serve *s); /* the drafter as loaded */
void td_serve_free(struct td_serve *s);

/* A model split over ranks (split.h) with a leader and followers (parallel.md 5.4): on rank 0
 * every td_forward_ex of the split model first sends the step to the other ranks (its plan's
 * dims, counts and the parts of its buffer the step reads, draft ids patched in), and each
 * follower runs td_forward_follow: it takes each step into a plan of its own, sets its state's
 * lengths from the plan's (a rollback is only the length: state by position), and runs the same
 * forward (no drafter outputs, no logits read), and makes each state op rank 0 sends between
 * them (ops->apply; ops may be NULL where none come), until rank 0 calls td_forward_stop. The
 * followers' state must be made as the leader's (the same dims). 0 when stopped, -1 with a
 * message when the world failed (a follower's own failure aborts the world, so the leader's step
 * fails with its reason). */
int td_forward_follow(const struct td_model *m, struct td_state *st,
                      const struct td_follow_ops *ops, char *err, size_t errlen);
/* rank 0: the followers' td_forward_follow returns (nothing when the model is not split) */
void td_forward_stop(const struct td_model *m);

/* rank 0 leading a split model: op to the followers, before the next step (0 when the model is
 * not split). A failure fails the world (the next step reports it): -1 with the reason. */
int td_forward_send_op(const struct td_model *m, const struct td_state_op *op, char *err,
                       size_t errlen);

/* Convenience for one-off calls (CLI, tests): build a plan for seqs (bucketed capacity),
 * run td_forward, free the plan. Same return contract. */
int td_forward_seqs(const struct td_model *m, struct td_state *st, const struct td_plan_seq *seqs,
                    int n_seq, float *logits, int32_t *topk_trace, char *err, size_t errlen);

/* td_forward_seqs with a drafter's inputs and outputs (io may be NULL). */
int td_forward_seqs_io(const struct td_model *m, struct td_state *st,
                       const struct td_plan_seq *seqs, int n_seq, const struct td_forward_io *io,
                       float *logits, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
