/* mtp.h: the DeepSeek-V4 MTP drafter (mtp.0.*), drafters.md 4.2-4.3, in the engine.
 *
 *   struct draft_mtp *d;   // target: the loaded model (mtp.0.* in its files); run: it on backend b
 *   if (draft_mtp_init(&d, &target, run, b, 4, 512, 64, 3, st.swa_ring, 0, (size_t)1 << 30,
 *                      TD_KV_F32, err, sizeof err))
 *       return -1;
 *   struct td_forward_io io = {.hidden_out = draft_mtp_hidden(d), .hidden_by_position = 1};
 *   if (td_forward_ex(run, &st, &plan, &io, logits, NULL, err, sizeof err)) return -1; // each step
 *   // verify and commit; then per sequence its committed rows, the token after each
 *   struct td_draft_seq s = {.slot = slot, .pos0 = pos0, .n = n, .next = next, .toks = toks,
 *                            .k = 3, .sampling = &sampling, .drafts = drafts, .q = q};
 *   if (draft_mtp_run(d, &s, 1, err, sizeof err)) return -1;   // catch up, then draft
 *   draft_mtp_free(d);
 *
 * One MTP row at position q reads the target's final residual streams H_q and the token after
 * q: X = h_proj(hnorm(H_q)) + e_proj(enorm(embed(t_{q+1}))) (the token term is zero at q = 0),
 * runs the MTP block (one V4 decoder layer, sliding-window attention over the MTP's own rows,
 * stored by position like the target's), then head(norm(hc_head(.))) gives the distribution of
 * the token at q + 2. After each target step the rows it committed are caught up in one
 * batched call (their next tokens are all known by then; a sequence that does not draft is
 * caught up only when it drafts again, from the streams the target keeps by position); the last
 * one drafts token 1. Token j
 * (j >= 2) comes from one more row at the next position whose streams are the previous step's
 * output (recycled) and whose token is draft j - 1. Those chain rows are rolled back at once:
 * the MTP's committed length always equals the target's. Every call builds a fresh plan and
 * runs through the same forward and attention entry points as the target.
 */
#ifndef TD_DRAFT_MTP_H
#define TD_DRAFT_MTP_H

#include <stddef.h>
#include <stdint.h>

#include "draft/drafter.h"
#include "kernels/kv.h"
#include "verify/sample.h"

#ifdef __cplusplus
extern "C" {
#endif

struct td_model;
struct td_backend;
struct draft_mtp;

/* target_host: the loaded checkpoint (holds mtp.0.*); target_run: the same model resident on
 * backend b (== target_host on the CPU). Pools for max_seqs sequences of max_ctx tokens;
 * catch-up calls of up to max_rows rows; its key caches in kv's precision (the target's,
 * model/state.h); stream_ring: the target state's swa_ring (its streams are kept by position
 * in rings of that many rows, draft_mtp_hidden). When target_run is rank 0 of a split model
 * (its split set), the layer's experts are split likewise: its MoE layer sends its rows to the
 * other ranks, whose draft_mtp_serve run their part (forward.h td_serve). 0, or -1 with a
 * message. */
int draft_mtp_init(struct draft_mtp **out, const struct td_model *target_host,
                   const struct td_model *target_run, const struct td_backend *b, int max_seqs,
                   int max_ctx, int max_rows, int max_k, int stream_ring, int use_graphs,
                   size_t max_bytes, enum td_kv_dtype kv, char *err, size_t errlen);

/* A split model's rank past 0 (target_run: its rank's view): its part of the MTP layer's
 * experts, which rank 0's drafter runs with it, loaded from target_host and placed on b, for
 * steps of up to max_rows rows (the engine's row budget). 0, or -1 with a message. */
struct td_serve;
int draft_mtp_serve(struct td_serve **out, const struct td_model *target_host,
                    const struct td_model *target_run, const struct td_backend *b, int max_rows,
                    char *err, size_t errlen);

/* Deferred greedy rounds, as DSpark's: when every drafting sequence of a call is greedy (the
 * others, k = 0, fall behind), draft_mtp_run queues the whole chain, to the largest k (each
 * step's ids come from the last step's greedy_slot in backend memory), and returns without
 * waiting; each sequence keeps its own k's drafts: dev_drafts says where they are, for the next
 * verify step (td_id_patch), and draft_mtp_collect(d, seqs) brings them to the host (waits).
 * Other rounds draft as ever. */
void draft_mtp_defer(struct draft_mtp *d, int on);
int draft_mtp_collect(struct draft_mtp *d, struct td_draft_seq *seqs, char *err, size_t errlen);

/* [max_seqs, stream_ring, hc_mult, dim] in backend memory: where the target forward leaves its
 * streams, by position (td_forward_io.hidden_by_position) */
float *draft_mtp_hidden(struct draft_mtp *d);

/* The drafter's own caches (its graphs' counts live there). */
const struct td_state *draft_mtp_state(const struct draft_mtp *d);

/* Catch up the committed rows and draft. A sequence at pos0 == 0 starts afresh in its slot. A
 * sequence that drafts nothing (k = 0) is not caught up while the MTP layer's window fits the
 * target's ring (and draft_mtp_set_all_logits is off): when it drafts again, the rows it
 * skipped that its window reaches are caught up first, keys only, from the target's streams
 * by position and its toks. 0, or -1 with a message (an engine error). */
int draft_mtp_run(struct draft_mtp *d, struct td_draft_seq *seqs, int n_seq, char *err,
                  size_t errlen);

/* [rows, vocab] the logits of the last MTP call (host; tests and tools): one row per sequence
 * (its last), or every row after draft_mtp_set_all_logits(d, 1) */
const float *draft_mtp_logits(const struct draft_mtp *d);
void draft_mtp_set_all_logits(struct draft_mtp *d, int on);

void draft_mtp_free(struct draft_mtp *d);

/* the engine's table of d (td_model_drafter; its free frees d) */
struct td_model_drafter draft_mtp_model(struct draft_mtp *d);

#ifdef __cplusplus
}
#endif
#endif
