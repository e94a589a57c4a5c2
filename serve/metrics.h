/* metrics.h: the counters, gauges and histograms of `tandem serve`, rendered for GET /metrics
 * in the Prometheus text format, version 0.0.4 (design/server.md §2).
 *
 *   struct met_info mi = {.model = "tiny", .drafter = "mtp", .k = 3, .slots_total = 16};
 *   struct srv_metrics *m = met_new(&mi);                 // NULL: out of memory
 *   met_received(m);                                      // HTTP thread: a request parsed
 *   met_step(m, MET_STEP_DECODE, 0.004, 12);              // engine thread: one step
 *   met_engine(m, td_engine_stats(e));                    // engine thread: cumulative counters
 *   char *text; size_t len;
 *   if (met_render(m, &text, &len) == 0) { fwrite(text, 1, len, out); free(text); }
 *   met_free(m);
 *
 * Threads: every function may be called from any thread; one mutex inside guards the values.
 * An observation takes the lock for a few additions; met_render takes it only to copy the
 * values and formats the copy unlocked, so a scrape never holds up the engine thread for long.
 * Everything is sized in met_new: observing never allocates, rendering allocates its output.
 *
 * Families (tandem_ names, §2.5; counters end in _total, histograms have cumulative
 * _bucket{le=...} up to le="+Inf", then _sum and _count):
 *   tandem_build_info{model,version,drafter,k,backend,config_hash}   gauge, always 1
 *   tandem_requests_running, tandem_requests_waiting, tandem_slots_total, tandem_slots_busy,
 *   tandem_sse_streams_active, tandem_http_connections_active        gauges (met_gauges)
 *   tandem_requests_received_total                                   met_received
 *   tandem_requests_rejected_total{reason}                           met_rejected
 *   tandem_requests_finished_total{reason}                           met_finished
 *   tandem_client_disconnects_total{phase}                           met_disconnect
 *   tandem_prompt_tokens_total, tandem_generation_tokens_total       met_finished
 *   tandem_ttft_seconds, tandem_e2e_seconds, tandem_queue_seconds    histograms, met_finished
 *   tandem_itl_seconds                                               histogram, met_itl
 *   tandem_step_seconds{kind}, tandem_step_rows{kind}                histograms, met_step
 *   tandem_engine_steps_total                                        engine: steps
 *   tandem_engine_verify_rounds_total                                engine: rounds (every
 *                                                                    verify group, drafts or not)
 *   tandem_spec_drafts_total{drafter}                                engine: proposed_at[0],
 *                                                                    the rounds that verified
 *                                                                    at least one draft
 *   tandem_spec_draft_tokens_total{drafter}                          engine: drafted
 *   tandem_spec_accepted_tokens_total{drafter}                       engine: accepted
 *   tandem_spec_draft_tokens_per_pos_total{drafter,position}         engine: proposed_at[j]
 *   tandem_spec_accepted_tokens_per_pos_total{drafter,position}      engine: accepted_at[j]
 *   tandem_spec_accepted_per_step{drafter}                           histogram 0..16,
 *                                                                    met_accepted_per_step
 *   tandem_spec_k{drafter}                                           gauge, met_spec_k
 *   tandem_spec_policy_steps_total{batch}                            engine: batch_steps[b]
 *   tandem_spec_policy_offered_total{batch}                          engine: batch_wanted[b]
 *   tandem_spec_policy_verified_total{batch}                         engine: batch_drafts[b]
 *   tandem_spec_policy_plain_steps_total{drafter}                    engine: plain_steps
 *   tandem_nonfinite_rows_total{where="target"}                      engine: nan_rows
 *   tandem_prefix_cache_{queries,hits,hit_tokens,evictions}_total     engine: prefix_*
 *   tandem_prefix_cache_blocks{state="held|cached|free"}             engine: prefix_held ..
 *   tandem_http_requests_total{endpoint,code}                        met_http (pairs seen)
 *   tandem_http_ignored_fields_total                                 met_ignored_fields
 * Positions run 0 .. k-1 (k of met_info, at most TD_MAX_DRAFT). With drafter "none" (or no
 * drafter named) the per-position series are left out while they are zero.
 * With vllm_compat, also vLLM's names (label model_name): vllm:num_requests_running,
 * vllm:num_requests_waiting, vllm:prompt_tokens_total, vllm:generation_tokens_total and
 * vllm:spec_decode_num_drafts_total, vllm:spec_decode_num_draft_tokens_total,
 * vllm:spec_decode_num_accepted_tokens_total, vllm:spec_decode_num_accepted_tokens_per_pos_total
 * {position} (`vllm bench serve` sums the lines starting vllm:spec_decode; with drafter "none"
 * those are left out while zero, so it reports no speculation rather than a 0/0 rate).
 * Label values are escaped (backslash, double quote, newline).
 */
#ifndef TD_SERVE_METRICS_H
#define TD_SERVE_METRICS_H

#include <stddef.h>

#include "engine/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

enum met_reject {
    MET_REJECT_QUEUE_FULL,  /* 429: the waiting queue is full */
    MET_REJECT_CONTEXT,     /* 400: prompt + max_tokens past the context */
    MET_REJECT_AUTH,        /* 401 */
    MET_REJECT_BAD_REQUEST, /* 400: anything else malformed or unsupported */
    MET_REJECT_DRAINING,    /* 503: shutting down */
    MET_REJECT_TOO_LARGE,   /* 413: body too large */
    MET_REJECT_N
};

enum met_finish {
    MET_FINISH_STOP,      /* EOS, a stop string or stop token */
    MET_FINISH_LENGTH,    /* max_tokens or the context */
    MET_FINISH_ABORT,     /* the client went away or cancelled */
    MET_FINISH_ERROR,     /* engine error */
    MET_FINISH_NONFINITE, /* a non-finite logits row */
    MET_FINISH_TIMEOUT,   /* a server-side deadline */
    MET_FINISH_N
};

enum met_phase { MET_PHASE_QUEUED, MET_PHASE_PREFILL, MET_PHASE_DECODE, MET_PHASE_N };

/* prefill-only, decode/verify-only, both */
enum met_step { MET_STEP_PREFILL, MET_STEP_DECODE, MET_STEP_MIXED, MET_STEP_N };

struct met_info {
    const char *model;              /* served model name; may be NULL ("") */
    const char *drafter;            /* "mtp", "dspark", "ngram", ..., "none"; NULL means "none" */
    int k;                          /* draft tokens per round at most: the positions reported,
                                       clamped to 0 .. TD_MAX_DRAFT; also tandem_spec_k at start */
    const char *version;            /* build version; may be NULL */
    const char *backend;            /* "cpu" or "cuda"; may be NULL */
    unsigned long long config_hash; /* of the effective configuration, printed as 16 hex digits */
    int slots_total;                /* sequence slots (tandem_slots_total) */
    int vllm_compat;                /* nonzero: also the vllm: aliases */
};

struct met_request { /* one finished request (one choice), times in seconds */
    enum met_finish finish;
    int prompt_tokens, generation_tokens; /* added to the token counters as given (pass the
                                             prompt on one choice of an n > 1 request) */
    double queue_s;                       /* arrival -> admitted (prefill started); < 0 unknown */
    double ttft_s;                        /* arrival -> first token; < 0 none */
    double e2e_s;                         /* arrival -> finish; < 0 unknown */
};

struct srv_metrics;

/* Everything sized here; the strings are copied (into the label texts). NULL: out of memory. */
struct srv_metrics *met_new(const struct met_info *info);
void met_free(struct srv_metrics *m); /* NULL is fine */

/* The observers. Out-of-range enums are ignored, and so are negative or non-finite times and
 * counts: a histogram only ever holds finite values >= 0. */
void met_received(struct srv_metrics *m);
void met_rejected(struct srv_metrics *m, enum met_reject why);
void met_finished(struct srv_metrics *m, const struct met_request *r);
void met_disconnect(struct srv_metrics *m, enum met_phase phase);
/* a gap between two emissions that brought n_tokens tokens: n_tokens samples of
 * gap_s / n_tokens (a k-token commit is spread over its k tokens; the sum grows by gap_s) */
void met_itl(struct srv_metrics *m, double gap_s, int n_tokens);
void met_step(struct srv_metrics *m, enum met_step kind, double seconds, int rows);
/* the latest cumulative engine counters (copied): the spec counters, steps, verify rounds and
 * non-finite rows come from here */
void met_engine(struct srv_metrics *m, const struct td_engine_stats *s);
/* one verify round that accepted this many drafts (histogram buckets 0 .. 16) */
void met_accepted_per_step(struct srv_metrics *m, int accepted);
void met_spec_k(struct srv_metrics *m, int k); /* the current (adaptive) draft length */
void met_gauges(struct srv_metrics *m, int running, int waiting, int slots_busy, int streams_active,
                int connections_active);
/* The endpoint a URL names, as the server routes and counts it: one of "/v1/completions",
 * "/v1/chat/completions", "/v1/models", "/health" (also for "/v1/health"), "/livez", "/readyz",
 * "/metrics", "/tokenize", "/detokenize", "/props", "/slots", "/version", "/" (the chat page),
 * else "other". */
const char *met_endpoint(const char *url);
/* one HTTP response. endpoint: met_endpoint's name; anything else (and NULL) counts as "other".
 * The first MET_HTTP_CODES distinct codes get their own series; later new codes count as
 * code="other". */
#define MET_HTTP_CODES 32
void met_http(struct srv_metrics *m, const char *endpoint, int code);
void met_ignored_fields(struct srv_metrics *m, int n); /* request fields accepted and ignored */

/* Render everything: *out is malloc'd and NUL-terminated, *len its length without the NUL
 * (len may be NULL). 0, or -1 out of memory (*out NULL). */
int met_render(struct srv_metrics *m, char **out, size_t *len);

/* For tests and the soak: one sample's value read back from a rendering, by its exposition
 * name and label text exactly as printed between the braces ("" or NULL: no labels), e.g.
 *   met_value(m, "tandem_requests_finished_total", "reason=\"stop\"")
 *   met_value(m, "tandem_ttft_seconds_bucket", "le=\"0.5\"")
 * NAN when absent (or out of memory). */
double met_value(struct srv_metrics *m, const char *name, const char *labels);

#ifdef __cplusplus
}
#endif
#endif
