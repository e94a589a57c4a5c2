/* engine.h: the Tandem engine API: requests in, tokens out, continuous batching with chunked
 * prefill and lossless speculative decoding.
 *
 *   struct td_engine_params ep = td_engine_defaults();
 *   ep.model_dir = "models/tandem-tiny"; ep.draft = "ngram"; ep.max_draft = 3;
 *   struct td_engine *e;
 *   if (td_engine_init(&e, &ep, err, sizeof err)) { puts(err); return -1; }
 *   struct td_request_params rp = {.prompt = prompt, .n_prompt = n_prompt, .max_tokens = 64,
 *                                  .sampling = {.temperature = 0.0f, .top_p = 1.0f}};
 *   int id = td_engine_submit(e, &rp, err, sizeof err);      // -1: err says why
 *   while (td_engine_step(e, err, sizeof err) > 0) {}        // every step appends tokens
 *   const int32_t *out; int n; enum td_req_status status; enum td_finish why;
 *   td_engine_output(e, id, &out, &n, &status, &why, NULL);  // the tokens so far, how it ended
 *   td_engine_free(e);
 *
 * Every step the scheduler packs, within max_batch_tokens rows and max_seqs sequences: first
 * a verify row group [anchor, drafts...] for every decoding request (the drafter proposes up to
 * max_draft tokens; with no drafter a group is the anchor alone), then prefill chunks of
 * queued prompts in arrival order. A fresh plan is built from that, the target runs once,
 * every group is verified (verify/accept.h), the accepted prefix plus one correction or bonus
 * token is committed, and each sequence's committed length moves back over what was rejected.
 * Requests wait for a free sequence slot; they never overcommit the pools sized at init.
 * When the drafts wanted do not fit the row budget, every decoding request still gets its
 * anchor row, prompts waiting to prefill keep up to half of the rows left, and the drafts share
 * the rest a draft position at a time (every request's first draft before any one's second).
 * Prompts take at most prefill_chunk rows a step, so that a long one does not lengthen the
 * steps of the requests decoding beside it beyond that.
 *
 * Dimension names used throughout: n_tok rows in a step, n_seq sequences in a step, vocab,
 * k draft tokens, topk index_topk, window sliding_window, rate compress rate.
 */
#ifndef TD_ENGINE_H
#define TD_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "verify/sample.h"
#include "engine/prefix.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TD_MAX_DRAFT       16
#define TD_POLICY_ADAPTIVE 0
#define TD_POLICY_FIXED    1
#define TD_BATCH_BUCKETS   13 /* decoding sequences 1, 2, 4, ... 4096 */
#define TD_MAX_STOP_IDS    16

struct td_engine_params {
    const char *model_dir;
    const char *backend;    /* "auto" (default: cuda when a GPU is usable), "cpu", "cuda" */
    int max_seqs;           /* sequences decoding at once (state slots), default 16 */
    int max_ctx;            /* tokens per sequence, default 4096 (capped by the model) */
    int max_batch_tokens;   /* rows per step, >= 1 + max_draft; 0 (the default): 256, or a
                               full speculative round of every slot, max_seqs x (1 + draft
                               tokens), when a model drafter is on and that is more
                               (td_engine_rows says which) */
    int prefill_chunk;      /* prompt rows a step takes at most, >= 0; 0 (the default): as many
                               as the row budget leaves */
    const char *draft;      /* "none" (default), "ngram", "random", "mtp", "dspark" or "auto"
                               (draft/drafter.h's registry): auto is, when the backend is a
                               device, dspark when the model has a DSpark drafter (dspark_dir,
                               else its own stages, else model_dir/dspark/), else mtp when it
                               has an MTP layer (with max_draft 0: 3 drafts), else none; on the
                               CPU none; td_engine_draft says which */
    int max_draft;          /* draft tokens per round, 0 .. TD_MAX_DRAFT (dspark: 0 or more
                               than its block size means the block size) */
    const char *dspark_dir; /* the DSpark drafter's directory (default: the stages in the
                               checkpoint's own files when it carries them, else
                               model_dir/dspark) */
    float dspark_threshold; /* DSpark confidence cut: a round stops before the first slot whose
                               confidence is below it (0, the default: every slot is verified) */
    int no_graphs;          /* run every step eagerly (default: decode and verify steps replay
                               a CUDA graph captured once per row bucket) */
    int kv_dtype;           /* the target's key caches (window keys, compressed entries, indexer
                               keys): TD_KV_F32 (0, the default: the HF oracle's precision),
                               TD_KV_BF16 or TD_KV_FP8 (kernels/kv.h; td_kv_dtype_parse) */
    int deterministic;      /* batch-invariant kernels: a request's logits are the same bits
                               alone, in any batch, or as a row of a verify chunk */
    int dummy_weights;      /* generated weights of model_dir/config.json's shapes, made on the
                               backend (td_model_load_dummy; benchmarks) */
    size_t max_cache_bytes; /* cache pools above this are refused at init; 0 (default): on the
                               CPU 3/4 of physical memory less 1 GiB, on a GPU the free device
                               memory after the weights less 10% and 2 GiB of headroom */
    int draft_policy; /* TD_POLICY_ADAPTIVE (0, the default): each step verifies, per sequence,
                         the drafts that maximise committed tokens a second by the measured
                         acceptance and step times (engine/policy.h), and whether a model
                         drafter drafts at all; sampled requests, whose tokens depend on the
                         drafts they verify, verify every draft offered (and keep the drafter
                         on), so that they give the same tokens in any batch; TD_POLICY_FIXED:
                         every draft the row budget holds, as many as max_draft */
    /* lossy benchmarks only: accept draft j with probability synthetic_accept[j - 1] (j <=
       n_synthetic; later positions never) whatever the target says, so that speculation's cost
       is measured on shapes no drafter was trained for. The output is not the model's */
    float synthetic_accept[TD_MAX_DRAFT];
    int n_synthetic;
    int prefix_blocks;  /* the prefix cache: at most this many prompt blocks of the history pool
                           (state.hist_block tokens) stay published, each with a checkpoint of the
                           state windows at its end in backend memory (0, the default: off). A
                           request whose prompt begins with published blocks shares them, loads
                           the last one's checkpoint and prefills only the rest; prompt chunks
                           end at block boundaries. With a model drafter (mtp, dspark) a hit
                           leaves at least its window of the prompt to prefill (its rings
                           rebuilt) */
    int history_blocks; /* the history pool (compressed entries and indexer keys of all layers,
                           model/state.h): blocks of state.hist_block tokens (0, the default:
                           max_seqs x ceil(max_ctx / block), every slot at max_ctx at once). A
                           request is admitted with the blocks its prompt, max_tokens and a
                           round of drafts can reach (within max_ctx), or waits for them;
                           at least one max_ctx sequence's */
    /* NULL or a world of one rank: the engine runs the model whole. Else this engine is rank
       comm->rank of the model split over comm->world ranks, experts first (model/split.h; each
       rank makes its engine with the same params, and td_engine_init is collective): rank 0
       leads (requests, scheduling, verification and the drafters' rounds) and sends each
       target step to the others, which run it in td_engine_follow and serve their part of a
       model drafter's experts (forward.h td_serve). On the
       CPU backend comm sums the experts too; on a GPU nccl must be set. With the prefix
       cache, its state changes go to the followers too (forward.h td_forward_send_op) */
    struct td_comm *comm;
    /* 1: one GPU a rank (the backend cuda:N): the experts' slots are summed by NCCL in the
       device's queue (model/comm.h td_comm_nccl, joined over comm), and steps replay graphs;
       with a world of one rank too (the split path on one GPU: a test). --gpus N */
    int nccl;
    /* test seam: the cost in seconds of a step of rows rows with drafts on offer (drafting) or
       without, instead of the measured one */
    double (*step_cost)(void *ctx, int drafting, int rows);
    void *cost_ctx;
    /* test seam: sees (and may alter) every logits row before verification */
    void (*logits_hook)(void *ctx, int request, long position, float *row, int vocab);
    void *hook_ctx;
};

struct td_request_params {
    const int32_t *prompt; /* [n_prompt], copied */
    int n_prompt;
    int max_tokens; /* tokens to generate at most, >= 1 */
    struct td_sampling sampling;
    int ignore_eos;          /* keep going past EOS tokens (benchmarks) */
    const int32_t *stop_ids; /* [n_stop_ids] tokens that also end it (emitted, as EOS is) */
    int n_stop_ids;          /* 0 .. TD_MAX_STOP_IDS */
    int no_draft;            /* verify no drafts for this request (plain decoding; the engine's
                                drafter still runs for the others) */
};

enum td_req_status {
    TD_REQ_QUEUED = 0,
    TD_REQ_PREFILL,
    TD_REQ_DECODE,
    TD_REQ_FINISHED,
    TD_REQ_FAILED,
};

enum td_finish {
    TD_FINISH_NONE = 0,
    TD_FINISH_EOS,
    TD_FINISH_LENGTH,
    TD_FINISH_CONTEXT,
    TD_FINISH_ERROR,
    TD_FINISH_STOP, /* one of its stop_ids, or td_engine_stop_at */
};

struct td_engine_stats {
    long steps;                           /* forward calls */
    long rows;                            /* rows fed */
    long tokens_out;                      /* tokens emitted */
    long rounds;                          /* verify rounds (decode groups) */
    long drafted;                         /* drafts verified */
    long accepted;                        /* drafts accepted */
    long proposed_at[TD_MAX_DRAFT];       /* drafts verified at draft position j */
    long accepted_at[TD_MAX_DRAFT];       /* drafts accepted at draft position j */
    long reached_at[TD_MAX_DRAFT];        /* rounds whose drafts before j were all accepted and that
                                             verified a draft j: accepted_at / reached_at is the
                                             conditional acceptance P(j accepted | all before were) */
    long accepted_hist[TD_MAX_DRAFT + 1]; /* rounds that verified a draft, by drafts accepted */
    long nan_rows;                        /* non-finite target rows met (each fails its request) */
    /* the draft policy's decisions, by the step's decoding sequences (bucket b: up to 2^b) */
    long batch_steps[TD_BATCH_BUCKETS];  /* steps that decoded */
    long batch_wanted[TD_BATCH_BUCKETS]; /* drafts the drafter offered them */
    long batch_drafts[TD_BATCH_BUCKETS]; /* drafts they verified */
    long plain_steps;                    /* decoding steps the policy ran without a drafter */
    long decisions_queued; /* the policy's decisions made while the next step ran (a plain
                              stretch's: off the host's critical path) */
    long caught_rows;      /* rows a model drafter made up when it drafted again after drafting
                              nothing for its sequences (td_draft_seq.caught) */
    /* host wall time of a step's phases. On a device the model drafter's work is queued at
     * the end of a step and runs before the next step's forward, so its device time counts in
     * t_target and t_draft holds only its set-up and launches (TD_TIMELINE=1 splits device
     * time); on the CPU each phase is computed where it is counted */
    double t_target; /* seconds in plan building, the forward and its wait */
    double t_verify; /* seconds verifying and committing its rows (host) */
    double t_draft;  /* seconds in the model drafter's calls (MTP, DSpark) */
    /* the prefix cache (zeros when it is off): lookups, those that found blocks, the prompt
       tokens they found, cached blocks evicted; blocks held, cached and free now */
    long prefix_lookups, prefix_hits, prefix_hit_tokens, prefix_evictions;
    int prefix_held, prefix_cached, prefix_free;
    /* the history pool (model/state.h; zeros for a model without compressed layers): its
       blocks, the tokens each holds, and the blocks requests hold now */
    int hist_blocks, hist_block, hist_held;
    int graphs;       /* step graphs captured (target and drafter) */
    double t_capture; /* seconds capturing them (at start-up; any made later
                         count inside t_target or t_draft) */
};

/* one request's own numbers; times are td_engine_clock() seconds, -1 until they happen */
struct td_request_stats {
    long rounds;                    /* verify rounds (steps in which it decoded) */
    long spec_rounds;               /* of those, rounds that verified at least one draft */
    long drafted, accepted;         /* drafts verified, accepted (and in its output: a round
                                       cut by EOS or its length counts what it emitted) */
    long proposed_at[TD_MAX_DRAFT]; /* drafts verified at draft position j */
    long accepted_at[TD_MAX_DRAFT]; /* drafts accepted at draft position j (as accepted) */
    double t_submit, t_admit, t_first, t_end; /* submitted, given a slot, first token, ended */
    int cached_tokens; /* prompt tokens the prefix cache gave it (not prefilled) */
};

/* what the engine holds now */
struct td_engine_load {
    int queued, prefill, decode; /* requests waiting for a slot, prefilling, decoding */
    int slots_total, slots_busy;
    int requests_held; /* submitted and not yet released (td_engine_release) */
};

struct td_engine;
struct td_comm;

struct td_engine_params td_engine_defaults(void);

/* Load the model, size and allocate every pool. 0, or -1 with a message (nothing held). */
int td_engine_init(struct td_engine **e, const struct td_engine_params *p, char *err,
                   size_t errlen);

/* Queue a request. Its id (>= 0), or -1 with a message when it can never run (empty prompt,
 * prompt longer than max_ctx, token id out of range, bad sampling values). */
int td_engine_submit(struct td_engine *e, const struct td_request_params *rp, char *err,
                     size_t errlen);

/* One scheduler step. The number of requests still queued or running (0: idle), or -1 with a
 * message on an engine error (requests already finished keep their output). */
int td_engine_step(struct td_engine *e, char *err, size_t errlen);

/* A request's tokens so far and its status; msg (may be NULL) gets its error when failed
 * ("cancelled" when cancelled, else ""). 0, or -1 for an unknown id. The tokens and the message
 * stay where they are until the request is released (or td_engine_free), whatever is submitted,
 * stepped or cancelled after: later steps only append to the tokens (n_tokens grows; only
 * td_engine_stop_at shortens them) and a message is written once, when the request ends. */
int td_engine_output(const struct td_engine *e, int id, const int32_t **tokens, int *n_tokens,
                     enum td_req_status *status, enum td_finish *finish, const char **msg);

/* Where each of a request's tokens came from, src[i] for token i of td_engine_output:
 * TD_SRC_TARGET (0) for the target's own (a prompt's first token, a correction, a bonus), or
 * j >= 1 for a draft accepted at draft position j. 0, or -1 for an unknown id; src stays valid
 * as td_engine_output's tokens do. */
#define TD_SRC_TARGET 0
int td_engine_output_sources(const struct td_engine *e, int id, const uint8_t **src);

/* Stop a request now (queued, prefilling or decoding); its slot is freed, its output kept. */
void td_engine_cancel(struct td_engine *e, int id);

/* End a request at n_keep generated tokens (a stop string found in its text): the tokens after
 * are dropped, the sequence's committed length moves back to the cut and its slot is freed;
 * finish becomes TD_FINISH_STOP (also for a request that had ended, or failed, after the cut).
 * 0, or -1 for an unknown id or n_keep outside [0, tokens generated]. */
int td_engine_stop_at(struct td_engine *e, int id, int n_keep);

/* Forget a request (cancelled first if it is running): its id becomes unknown and its memory is
 * returned, so a long-running process holds only the requests it has not released. Pointers
 * from td_engine_output stay valid until then. (One the last model drafter call still names is
 * freed when the next step collects that call, or here, once no request is left: then that
 * call is collected here, waiting for its queued device work.) */
void td_engine_release(struct td_engine *e, int id);

/* A request's own statistics; 0, or -1 for an unknown id. */
int td_engine_request_stats(const struct td_engine *e, int id, struct td_request_stats *out);

/* Requests queued, prefilling and decoding, and the slots. */
void td_engine_load(const struct td_engine *e, struct td_engine_load *out);

/* The engine's clock (CLOCK_MONOTONIC seconds), the one td_request_stats uses. */
double td_engine_clock(void);

const struct td_engine_stats *td_engine_stats(struct td_engine *e);

/* the prefix cache's counters (engine/prefix.h); -1 when it is off */
int td_engine_prefix_stats(const struct td_engine *e, struct td_prefix_stats *out);

/* test seam: XXH3-64 over every published block's bytes in the pool, in block order (0 when
 * the cache is off or holds none): published blocks never change */
uint64_t td_engine_prefix_checksum(const struct td_engine *e);

/* The model's vocabulary size. */
int td_engine_vocab(const struct td_engine *e);

/* The drafter the engine runs: "none", "ngram", "random", "mtp" or "dspark" (what "auto"
 * picked, when it was given). */
const char *td_engine_draft(const struct td_engine *e);

/* Draft tokens per round at most (the drafter's block size for DSpark; 0 without a drafter). */
int td_engine_draft_tokens(const struct td_engine *e);

/* the rows a step holds: max_batch_tokens as given, or as sized when it was 0 (auto) */
int td_engine_rows(const struct td_engine *e);

/* steps of up to this many rows replay a CUDA graph (where graphs are on): the row budget up to
 * TD_GRAPH_ROWS, and a full verify round of every slot within the budget, at least 128 */
#define TD_GRAPH_ROWS 1024
int td_engine_graph_rows(const struct td_engine *e);

/* The backend the engine runs on ("cpu" or "cuda"). */
const char *td_engine_backend(const struct td_engine *e);

/* bytes the weights take where they were placed (a device, or the CPU's decode of FP8 / FP4
 * weights): the target's and its model drafter's, a split model's rank its part of both; 0
 * when the CPU runs the loaded files in place */
size_t td_engine_weight_bytes(const struct td_engine *e);

/* A model split over ranks: how many (1 when whole), and rank r's placed weights and key-cache
 * bytes (gathered at start-up; r outside the ranks: only the count) */
int td_engine_ranks(const struct td_engine *e, int r, size_t *weights, size_t *caches);

/* the GPUs this process could run on, for --gpus N (0: none, or a build without CUDA) */
int td_engine_gpus(void);

/* The target's key caches: their precision's name, their bytes, and what a token of context
 * costs a sequence in them. */
const char *td_engine_kv_dtype(const struct td_engine *e);
int td_engine_kv_dtype_parse(const char *name); /* "fp32" | "bf16" | "fp8" -> kv_dtype, else -1 */
size_t td_engine_cache_bytes(const struct td_engine *e);
double td_engine_token_bytes(const struct td_engine *e);

/* A follower (params.comm's rank past 0): runs the leader's target steps until the leader's
 * engine is freed (0), or the world fails (-1 with the reason: a rank aborted, died or timed
 * out). Submit nothing to a follower. */
int td_engine_follow(struct td_engine *e, char *err, size_t errlen);

/* Frees everything; a split model's leader first ends its followers' td_engine_follow. */
void td_engine_free(struct td_engine *e);

#ifdef __cplusplus
}
#endif
#endif
