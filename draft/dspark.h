/* dspark.h: the DeepSeek-V4 DSpark drafter (mtp.{0..S-1}.* in <model>/dspark/, or in the
 * checkpoint's own files as V4-Flash-0731 and the -DSpark releases carry it), drafters.md
 * sections 1.5, 1.6, 2 and 3, in the engine.
 *
 *   struct draft_dspark *d;   // target: the loaded model; run: the one on backend b (CPU: target)
 *   if (draft_dspark_init(&d, "models/tandem-tiny/dspark", &target, run, b, 4, 512, 64,
 *                         st.swa_ring, 0.0f, 0, (size_t)1 << 30, TD_KV_F32, err, sizeof err))
 *       return -1;                                    // (st: the target's state)
 *   struct td_forward_io io = {.capture = draft_dspark_capture(d)};     // every step:
 *   int ring_rows;
 *   io.capture_ring = draft_dspark_ring(d, &ring_rows);                 // by position too
 *   io.capture_layers = draft_dspark_capture_layers(d, &io.n_capture);
 *   if (td_forward_ex(run, &st, &plan, &io, logits, NULL, err, sizeof err) ||   // + captured rows
 *       draft_dspark_insert_step(d, &plan, err, sizeof err))   // the rows of those drafting
 *       return -1;
 *   // verify and commit; then per sequence its committed rows and the token after each row
 *   struct td_draft_seq s = {.slot = slot, .pos0 = pos0, .n = n, .next = next, .k = 5,
 *                            .sampling = &sampling, .drafts = drafts, .q = q};
 *   if (draft_dspark_run(d, &s, 1, err, sizeof err)) return -1;   // keep those rows, draft
 *   draft_dspark_free(d);
 *
 * Context: each target row p carries the mean of its HC streams after each capture layer,
 * which the target's forward leaves by position (td_forward_io.capture_ring: the target's
 * window ring's rows, [slots, swa_ring, n_capture, dim]); main_x_p = main_norm(main_proj(those))
 * gives, in every stage, the key (= value) rope(kv_norm(wkv main_x_p)) stored at position p of
 * the stage's sliding-window ring (by position, like the target's own rings). A sequence that
 * drafted in the last run has its step's rows inserted as soon as the step is queued, before
 * the verify (draft_dspark_insert_step), so the insertion runs on the device while the host
 * verifies; draft_dspark_run then moves its length back to the committed one. A rejected row
 * lies at or past the committed length: no block reads there (a block sees only the window
 * before its anchor), and the next step's rows overwrite it, as a rejected row's keys in the
 * target's own rings are. The rings hold window + max(16, block) rows, so those positions
 * never share a ring row with a position the window still reads. A sequence that drafts
 * nothing is not inserted at all: it falls behind, and when it drafts again its run first
 * inserts the rows its window reaches from the committed end, read back by position (the
 * length jumps over the rest, which no block reads): bit for bit an insertion of every row at
 * every step, and a step the policy leaves plain costs the drafter nothing. After each run a
 * drafting sequence's length equals the target's.
 *
 * Round: a non-causal block [anchor, noise x (gamma - 1)] at positions P .. P+gamma-1 (P = the
 * committed length, the anchor's position) runs through the stages (V4 blocks; every block
 * row sees the W ring keys before P and the whole block; nothing is stored) and the target's
 * head: base logits U_k. Then, slot by slot, Z_k = U_k + W2 W1[prev] (prev: the anchor, then
 * each draft), q_k = the request's sampling distribution of Z_k, draft k drawn from q_k with
 * the request's seed at its position (stream TD_RAND_DRAFT); c_k = sigmoid(w . [y_k ; W1[prev]])
 * with y_k the stages' hc_head output. With a threshold t > 0 the round stops before the first
 * slot whose c_k < t: c_k is known before draft k is drawn, so the cut is non-anticipating and
 * verification stays lossless. Every call builds fresh plans and runs through the target's
 * forward and attention entry points.
 */
#ifndef TD_DRAFT_DSPARK_H
#define TD_DRAFT_DSPARK_H

#include <stddef.h>
#include <stdint.h>

#include "draft/drafter.h"
#include "kernels/kv.h"
#include "model/config.h"
#include "verify/sample.h"

#ifdef __cplusplus
extern "C" {
#endif

struct td_model;
struct td_backend;
struct draft_dspark;

#define DSPARK_MAX_CAPTURE TD_DSPARK_MAX_CAPTURE
#define DSPARK_MAX_BLOCK   TD_DSPARK_MAX_BLOCK
#define DSPARK_MAX_RANK    TD_DSPARK_MAX_RANK

/* The drafter's config (model/config.h's struct td_dspark_cfg): DIR/config.json's dspark_*
 * keys checked against the target (layers, vocab, window), or with DIR NULL the target's own
 * (td_config_load read them; the checkpoint carries its head). 0, or -1 with a message naming
 * the file and the key. */
int dspark_config_load(struct td_dspark_cfg *c, const char *dir, const struct td_model *target,
                       char *err, size_t errlen);

/* dir: the drafter's directory, or NULL when the target's own files carry its stages
 * (td_model_load_dspark; V4-Flash-0731 and the -DSpark releases); target_host: the loaded
 * target (config); target_run: the same model resident on backend b (its embedding and head
 * are shared). Rings for max_seqs sequences; insertion calls of up to max_rows rows;
 * stream_ring: the target's window ring rows (td_state.swa_ring), which its captured rows by
 * position keep (at least the stages' window).
 * threshold: the confidence cut (0: off); kv: its key caches' precision (the target's,
 * model/state.h). When target_run is rank 0 of a split model (its split set), the stages'
 * experts are split likewise: each stage's MoE sends its rows to the other ranks, whose
 * draft_dspark_serve run their part (forward.h td_serve). 0, or -1 with a message. */
int draft_dspark_init(struct draft_dspark **out, const char *dir,
                      const struct td_model *target_host, const struct td_model *target_run,
                      const struct td_backend *b, int max_seqs, int max_ctx, int max_rows,
                      int stream_ring, float threshold, int use_graphs, size_t max_bytes,
                      enum td_kv_dtype kv, char *err, size_t errlen);

/* A split model's rank past 0 (target_run: its rank's view): its part of the stages' experts,
 * which rank 0's drafter runs with it, loaded as draft_dspark_init loads them (dir, target_host)
 * and placed on b, for steps of up to max_rows rows (the drafter's widest: the row budget, or a
 * block for every sequence). 0, or -1 with a message. */
struct td_serve;
int draft_dspark_serve(struct td_serve **out, const char *dir, const struct td_model *target_host,
                       const struct td_model *target_run, const struct td_backend *b, int max_rows,
                       char *err, size_t errlen);

/* The target step just queued (plan p: its sequences and positions; their captured rows by
 * position): the rows of each sequence that drafted in the last run and is not behind,
 * inserted at their positions before the verify decides which stay; the next draft_dspark_run
 * keeps the committed ones by moving the length back. The others wait (they catch up when
 * they draft). 0, or -1 with a message. */
struct td_plan;
int draft_dspark_insert_step(struct draft_dspark *d, const struct td_plan *p, char *err,
                             size_t errlen);

/* Deferred greedy rounds (device backends): draft_dspark_run queues the Markov chain and
 * returns without waiting; each drafting sequence's dev_drafts says where its drafts are, so
 * the next verify step can read them from there (td_id_patch) while the host builds its plan.
 * draft_dspark_collect(d, seqs) then brings the drafts to the host (seqs as given to the run;
 * waits). Sampled rounds draft on the host as ever. */
void draft_dspark_defer(struct draft_dspark *d, int on);
int draft_dspark_collect(struct draft_dspark *d, struct td_draft_seq *seqs, char *err,
                         size_t errlen);

/* its config, n_stages the stages it loaded */
const struct td_dspark_cfg *draft_dspark_config(const struct draft_dspark *d);

/* [max_rows, n_capture, dim] in backend memory: where the target forward leaves its captured
 * rows (td_forward_io.capture, a scratch); [max_seqs, *ring_rows, n_capture, dim]: where it
 * keeps them by position (td_forward_io.capture_ring), which the insertions read; and the
 * layers to capture */
float *draft_dspark_capture(struct draft_dspark *d);
float *draft_dspark_ring(struct draft_dspark *d, int *ring_rows);

/* The drafter's own caches (its graphs' counts live there). */
const struct td_state *draft_dspark_state(const struct draft_dspark *d);
const int *draft_dspark_capture_layers(const struct draft_dspark *d, int *n);

/* Every sequence's committed rows, pos0 .. pos0 + n - 1 (their captured rows by position in
 * the target's ring): one its step inserted (draft_dspark_insert_step, the last call before
 * this one) moves its length back to pos0 + n over the rows the verify rejected; one it did
 * not stays behind. Then a round for those with k >= 1, each first caught up if it is behind
 * (the sequences' row fields are not read). 0, or -1 with a message (an engine error). */
int draft_dspark_run(struct draft_dspark *d, struct td_draft_seq *seqs, int n_seq, char *err,
                     size_t errlen);

/* Tests and tools: the last round's base logits U [n_round * block, vocab] (host), and its
 * Markov chain taken from `chain` (n_round * block ids) instead of drawn, when not NULL. */
const float *draft_dspark_base_logits(struct draft_dspark *d);
void draft_dspark_force_chain(struct draft_dspark *d, const int32_t *chain);

void draft_dspark_free(struct draft_dspark *d);

/* the engine's table of d (td_model_drafter; its free frees d) */
struct td_model_drafter draft_dspark_model(struct draft_dspark *d);

#ifdef __cplusplus
}
#endif
#endif
