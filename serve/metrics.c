/* metrics.c: the server's metrics (serve/metrics.h).
 *
 * Every value lives in one struct met_vals. met_new builds a table of families, each a run of
 * series; a series names its value by its offset in struct met_vals, its kind (a counter, a
 * gauge, an engine counter or a histogram) and its label text, escaped once at creation. So
 * met_render is one loop over that table: it copies struct met_vals under the lock and
 * formats the copy. The only per-family knowledge is in met_new's table.
 */
#include "serve/metrics.h"
#include "serve/text.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---------------------------------------------------------------------------------------------
// histograms

#define MET_HIST_MAX 17 /* bounds at most (tandem_spec_accepted_per_step: 0 .. 16) */

struct met_hist {
    const double *le;                        /* [n] upper bounds, increasing; +Inf implied */
    int n;                                   /* bounds */
    unsigned long long at[MET_HIST_MAX + 1]; /* [n + 1] samples per bucket, not cumulative; at[i]
                                                holds le[i-1] < v <= le[i], at[n] v > le[n-1] */
    unsigned long long count;                /* samples */
    double sum;                              /* of the samples */
};

/* bounds, seconds unless said (design/server.md §2.5) */
static const double LE_TTFT[] = {.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60};
static const double LE_ITL[] = {.0005, .001, .002, .004, .006, .008, .01,
                                .015,  .02,  .03,  .05,  .1,   .25};
static const double LE_E2E[] = {.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
static const double LE_STEP_S[] = {.0002, .0005, .001, .002, .005, .01, .02, .05, .1, .2, .5, 1};
static const double LE_ROWS[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 8192};
static const double LE_ACCEPT[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
#define NB(a) ((int)(sizeof(a) / sizeof((a)[0])))

static void hist_init(struct met_hist *h, const double *le, int n) {
    memset(h, 0, sizeof *h);
    h->le = le;
    h->n = n;
}

/* n samples of value v; le is inclusive (a value on a bound goes in that bound's bucket) */
static void hist_add(struct met_hist *h, double v, unsigned long long n) {
    if (!(v >= 0) || isinf(v) || n == 0) return; // NaN fails v >= 0
    int i = 0;
    while (i < h->n && v > h->le[i])
        i++;
    h->at[i] += n;
    h->count += n;
    h->sum += v * (double)n;
}

// ---------------------------------------------------------------------------------------------
// the values

static const char *const ENDPOINTS[] = {"/v1/completions",
                                        "/v1/chat/completions",
                                        "/v1/models",
                                        "/health",
                                        "/livez",
                                        "/readyz",
                                        "/metrics",
                                        "/tokenize",
                                        "/detokenize",
                                        "/props",
                                        "/slots",
                                        "/version",
                                        "/",
                                        "other"};
#define N_ENDPOINTS     NB(ENDPOINTS)
#define HTTP_OTHER_CODE MET_HTTP_CODES /* the column of codes past the table */

struct met_vals {
    int one; /* tandem_build_info */
    int running, waiting, slots_total, slots_busy, streams, conns, spec_k;
    unsigned long long received, rejected[MET_REJECT_N], finished[MET_FINISH_N];
    unsigned long long disconnects[MET_PHASE_N];
    unsigned long long prompt_tokens, generation_tokens, ignored_fields;
    struct met_hist ttft, itl, e2e, queue, step_s[MET_STEP_N], step_rows[MET_STEP_N];
    struct met_hist accepted_per_step;
    struct td_engine_stats eng;                               /* the latest met_engine copy */
    int http_code[MET_HTTP_CODES];                            /* codes seen, 0: column free */
    unsigned long long http[N_ENDPOINTS][MET_HTTP_CODES + 1]; /* [endpoint][column] */
};

// ---------------------------------------------------------------------------------------------
// the table

enum fam_type { FAM_COUNTER, FAM_GAUGE, FAM_HISTOGRAM };
static const char *const FAM_TYPE_NAME[] = {"counter", "gauge", "histogram"};

enum val_kind {
    VAL_U64,  /* unsigned long long */
    VAL_LONG, /* long (the engine's counters) */
    VAL_INT,  /* int (gauges) */
    VAL_HIST, /* struct met_hist */
};

enum {
    SER_SKIP_ZERO = 1u << 0, /* leave the series out while its value is 0 */
    FAM_OMIT_EMPTY = 1u << 1 /* leave the family out (HELP and TYPE too) when no series shows */
};

struct met_series {
    char *labels;       /* escaped label text without braces, "" for none (owned) */
    enum val_kind kind; /* of the value at off */
    size_t off;         /* of the value in struct met_vals */
    int code_col;       /* >= 0: append code="..." from http_code[code_col] (or "other") */
    unsigned flags;     /* SER_* */
};

struct met_family {
    const char *name; /* the family's exposition name (a counter's ends in _total) */
    const char *help; /* static text: no backslash or newline */
    enum fam_type type;
    unsigned flags; /* FAM_* */
    int first, n;   /* its series: ser[first .. first + n) */
};

struct srv_metrics {
    pthread_mutex_t mu;
    struct met_vals v; /* guarded by mu */
    struct met_family *fam;
    int n_fam, cap_fam;
    struct met_series *ser;
    int n_ser, cap_ser;
    int oom; /* met_new: an allocation failed */
};

// ---------------------------------------------------------------------------------------------
// a growing string (met_new's labels, met_render's output): serve/text.h's sbuf

static void sb_escaped(struct sbuf *b, const char *s) {
    for (; *s; s++) {
        if (*s == '\\')
            sbuf_put(b, "\\\\", 2);
        else if (*s == '"')
            sbuf_put(b, "\\\"", 2);
        else if (*s == '\n')
            sbuf_put(b, "\\n", 2);
        else
            sbuf_put(b, s, 1);
    }
}

/* a sample value: integers as integers, other doubles in the fewest digits that read back */
static void sb_double(struct sbuf *b, double x) {
    char tmp[40];
    if (isnan(x) || isinf(x)) {
        sbuf_puts(b, isnan(x) ? "NaN" : x > 0 ? "+Inf" : "-Inf");
        return;
    }
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*g", prec, x);
        if (strtod(tmp, NULL) == x) break;
    }
    sbuf_puts(b, tmp);
}

// ---------------------------------------------------------------------------------------------
// building the table (met_new only)

static void fam_add(struct srv_metrics *m, const char *name, enum fam_type type, unsigned flags,
                    const char *help) {
    if (m->oom) return;
    if (m->n_fam == m->cap_fam) {
        int cap = m->cap_fam ? 2 * m->cap_fam : 64;
        struct met_family *f = realloc(m->fam, (size_t)cap * sizeof *f);
        if (!f) {
            m->oom = 1;
            return;
        }
        m->fam = f;
        m->cap_fam = cap;
    }
    m->fam[m->n_fam++] = (struct met_family){
        .name = name, .help = help, .type = type, .flags = flags, .first = m->n_ser, .n = 0};
}

/* a series of the family added last; labels: (name, value) pairs ending in NULL, escaped here */
static void ser_add(struct srv_metrics *m, enum val_kind kind, const void *val, int code_col,
                    unsigned flags, ...) {
    if (m->oom) return;
    if (m->n_ser == m->cap_ser) {
        int cap = m->cap_ser ? 2 * m->cap_ser : 256;
        struct met_series *s = realloc(m->ser, (size_t)cap * sizeof *s);
        if (!s) {
            m->oom = 1;
            return;
        }
        m->ser = s;
        m->cap_ser = cap;
    }
    struct sbuf b = {0};
    sbuf_put(&b, "", 0);
    va_list ap;
    va_start(ap, flags);
    for (const char *k; (k = va_arg(ap, const char *));) {
        const char *v = va_arg(ap, const char *);
        if (b.n) sbuf_put(&b, ",", 1);
        sbuf_puts(&b, k);
        sbuf_put(&b, "=\"", 2);
        sb_escaped(&b, v);
        sbuf_put(&b, "\"", 1);
    }
    va_end(ap);
    if (b.oom) {
        free(b.p);
        m->oom = 1;
        return;
    }
    size_t off = (size_t)((const char *)val - (const char *)&m->v);
    m->ser[m->n_ser++] = (struct met_series){
        .labels = b.p, .kind = kind, .off = off, .code_col = code_col, .flags = flags};
    m->fam[m->n_fam - 1].n++;
}

static const char *const REJECT_NAME[MET_REJECT_N] = {"queue_full",  "context",  "auth",
                                                      "bad_request", "draining", "too_large"};
static const char *const FINISH_NAME[MET_FINISH_N] = {"stop",  "length",    "abort",
                                                      "error", "nonfinite", "timeout"};
static const char *const PHASE_NAME[MET_PHASE_N] = {"queued", "prefill", "decode"};
static const char *const STEP_NAME[MET_STEP_N] = {"prefill", "decode", "mixed"};
static const char *const POS_NAME[TD_MAX_DRAFT] = {"0", "1", "2",  "3",  "4",  "5",  "6",  "7",
                                                   "8", "9", "10", "11", "12", "13", "14", "15"};

static const char *or_empty(const char *s) {
    return s ? s : "";
}

static void build_table(struct srv_metrics *m, const struct met_info *in) {
    struct met_vals *v = &m->v;
    const char *dr = in->drafter && *in->drafter ? in->drafter : "none";
    int no_drafter = strcmp(dr, "none") == 0;
    int n_pos = in->k < 0 ? 0 : in->k > TD_MAX_DRAFT ? TD_MAX_DRAFT : in->k;
    /* with no drafter the per-position (and the vllm:spec_decode) series show only if nonzero */
    unsigned pos_fam = no_drafter ? FAM_OMIT_EMPTY : 0, pos_ser = no_drafter ? SER_SKIP_ZERO : 0;
    char k_txt[16], hash_txt[24];
    snprintf(k_txt, sizeof k_txt, "%d", in->k);
    snprintf(hash_txt, sizeof hash_txt, "%016llx", in->config_hash);

    fam_add(m, "tandem_build_info", FAM_GAUGE, 0, "Build and configuration (always 1).");
    ser_add(m, VAL_INT, &v->one, -1, 0, "model", or_empty(in->model), "version",
            or_empty(in->version), "drafter", dr, "k", k_txt, "backend", or_empty(in->backend),
            "config_hash", hash_txt, NULL);
    fam_add(m, "tandem_requests_running", FAM_GAUGE, 0, "Requests prefilling or decoding.");
    ser_add(m, VAL_INT, &v->running, -1, 0, NULL);
    fam_add(m, "tandem_requests_waiting", FAM_GAUGE, 0, "Requests waiting for a slot.");
    ser_add(m, VAL_INT, &v->waiting, -1, 0, NULL);
    fam_add(m, "tandem_slots_total", FAM_GAUGE, 0, "Sequence slots.");
    ser_add(m, VAL_INT, &v->slots_total, -1, 0, NULL);
    fam_add(m, "tandem_slots_busy", FAM_GAUGE, 0, "Sequence slots in use.");
    ser_add(m, VAL_INT, &v->slots_busy, -1, 0, NULL);
    fam_add(m, "tandem_sse_streams_active", FAM_GAUGE, 0, "Open SSE streams.");
    ser_add(m, VAL_INT, &v->streams, -1, 0, NULL);
    fam_add(m, "tandem_http_connections_active", FAM_GAUGE, 0, "Open HTTP connections.");
    ser_add(m, VAL_INT, &v->conns, -1, 0, NULL);

    fam_add(m, "tandem_requests_received_total", FAM_COUNTER, 0, "Generation requests received.");
    ser_add(m, VAL_U64, &v->received, -1, 0, NULL);
    fam_add(m, "tandem_requests_rejected_total", FAM_COUNTER, 0,
            "Requests refused before they were queued, by reason.");
    for (int i = 0; i < MET_REJECT_N; i++)
        ser_add(m, VAL_U64, &v->rejected[i], -1, 0, "reason", REJECT_NAME[i], NULL);
    fam_add(m, "tandem_requests_finished_total", FAM_COUNTER, 0,
            "Requests (choices) finished, by reason.");
    for (int i = 0; i < MET_FINISH_N; i++)
        ser_add(m, VAL_U64, &v->finished[i], -1, 0, "reason", FINISH_NAME[i], NULL);
    fam_add(m, "tandem_client_disconnects_total", FAM_COUNTER, 0,
            "Clients gone before their request finished, by the request's phase then.");
    for (int i = 0; i < MET_PHASE_N; i++)
        ser_add(m, VAL_U64, &v->disconnects[i], -1, 0, "phase", PHASE_NAME[i], NULL);
    fam_add(m, "tandem_prompt_tokens_total", FAM_COUNTER, 0, "Prompt tokens of finished requests.");
    ser_add(m, VAL_U64, &v->prompt_tokens, -1, 0, NULL);
    fam_add(m, "tandem_generation_tokens_total", FAM_COUNTER, 0,
            "Tokens generated by finished requests.");
    ser_add(m, VAL_U64, &v->generation_tokens, -1, 0, NULL);

    fam_add(m, "tandem_ttft_seconds", FAM_HISTOGRAM, 0, "Arrival to first token.");
    ser_add(m, VAL_HIST, &v->ttft, -1, 0, NULL);
    fam_add(m, "tandem_itl_seconds", FAM_HISTOGRAM, 0,
            "Gap per emitted token (a k-token commit counts k gaps of 1/k).");
    ser_add(m, VAL_HIST, &v->itl, -1, 0, NULL);
    fam_add(m, "tandem_e2e_seconds", FAM_HISTOGRAM, 0, "Arrival to finish.");
    ser_add(m, VAL_HIST, &v->e2e, -1, 0, NULL);
    fam_add(m, "tandem_queue_seconds", FAM_HISTOGRAM, 0, "Arrival to admission (prefill start).");
    ser_add(m, VAL_HIST, &v->queue, -1, 0, NULL);
    fam_add(m, "tandem_step_seconds", FAM_HISTOGRAM, 0,
            "Engine step time by kind (prefill only, decode/verify only, mixed).");
    for (int i = 0; i < MET_STEP_N; i++)
        ser_add(m, VAL_HIST, &v->step_s[i], -1, 0, "kind", STEP_NAME[i], NULL);
    fam_add(m, "tandem_step_rows", FAM_HISTOGRAM, 0, "Rows fed per engine step, by kind.");
    for (int i = 0; i < MET_STEP_N; i++)
        ser_add(m, VAL_HIST, &v->step_rows[i], -1, 0, "kind", STEP_NAME[i], NULL);

    fam_add(m, "tandem_engine_steps_total", FAM_COUNTER, 0, "Engine forward calls.");
    ser_add(m, VAL_LONG, &v->eng.steps, -1, 0, NULL);
    fam_add(m, "tandem_engine_verify_rounds_total", FAM_COUNTER, 0,
            "Verify rounds (decode groups), with drafts or without.");
    ser_add(m, VAL_LONG, &v->eng.rounds, -1, 0, NULL);
    fam_add(m, "tandem_spec_drafts_total", FAM_COUNTER, 0,
            "Verify rounds that verified at least one draft token.");
    ser_add(m, VAL_LONG, &v->eng.proposed_at[0], -1, 0, "drafter", dr, NULL);
    fam_add(m, "tandem_spec_draft_tokens_total", FAM_COUNTER, 0, "Draft tokens verified.");
    ser_add(m, VAL_LONG, &v->eng.drafted, -1, 0, "drafter", dr, NULL);
    fam_add(m, "tandem_spec_accepted_tokens_total", FAM_COUNTER, 0, "Draft tokens accepted.");
    ser_add(m, VAL_LONG, &v->eng.accepted, -1, 0, "drafter", dr, NULL);
    fam_add(m, "tandem_spec_draft_tokens_per_pos_total", FAM_COUNTER, pos_fam,
            "Draft tokens verified at each draft position.");
    for (int j = 0; j < n_pos; j++)
        ser_add(m, VAL_LONG, &v->eng.proposed_at[j], -1, pos_ser, "drafter", dr, "position",
                POS_NAME[j], NULL);
    fam_add(m, "tandem_spec_accepted_tokens_per_pos_total", FAM_COUNTER, pos_fam,
            "Draft tokens accepted at each draft position.");
    for (int j = 0; j < n_pos; j++)
        ser_add(m, VAL_LONG, &v->eng.accepted_at[j], -1, pos_ser, "drafter", dr, "position",
                POS_NAME[j], NULL);
    fam_add(m, "tandem_spec_accepted_per_step", FAM_HISTOGRAM, 0,
            "Draft tokens accepted per verify round.");
    ser_add(m, VAL_HIST, &v->accepted_per_step, -1, 0, "drafter", dr, NULL);
    // the draft policy's decisions, by the decoding sequences of the step (up to 2^b)
    static const char *const BATCH_NAME[TD_BATCH_BUCKETS] = {
        "1", "2", "4", "8", "16", "32", "64", "128", "256", "512", "1024", "2048", "4096"};
    const struct {
        const char *name, *help;
        const long *v;
    } pol[3] = {{.name = "tandem_spec_policy_steps_total",
                 .help = "Decoding steps, by decoding sequences (batch: at most that many).",
                 .v = v->eng.batch_steps},
                {.name = "tandem_spec_policy_offered_total",
                 .help = "Draft tokens the drafter offered those steps.",
                 .v = v->eng.batch_wanted},
                {.name = "tandem_spec_policy_verified_total",
                 .help =
                     "Draft tokens the draft policy verified in those steps (drafts per step: this "
                     "over tandem_spec_policy_steps_total).",
                 .v = v->eng.batch_drafts}};
    for (int i = 0; i < 3; i++) {
        fam_add(m, pol[i].name, FAM_COUNTER, FAM_OMIT_EMPTY, pol[i].help);
        for (int b = 0; b < TD_BATCH_BUCKETS; b++)
            ser_add(m, VAL_LONG, &pol[i].v[b], -1, SER_SKIP_ZERO, "batch", BATCH_NAME[b], NULL);
    }
    fam_add(m, "tandem_spec_policy_plain_steps_total", FAM_COUNTER, pos_fam,
            "Decoding steps the adaptive policy ran with the model drafter off.");
    ser_add(m, VAL_LONG, &v->eng.plain_steps, -1, pos_ser, "drafter", dr, NULL);
    fam_add(m, "tandem_spec_k", FAM_GAUGE, 0, "Current draft length.");
    ser_add(m, VAL_INT, &v->spec_k, -1, 0, "drafter", dr, NULL);
    fam_add(m, "tandem_nonfinite_rows_total", FAM_COUNTER, 0,
            "Non-finite logits rows met (each fails its request; must stay 0).");
    ser_add(m, VAL_LONG, &v->eng.nan_rows, -1, 0, "where", "target", NULL);

    // the prefix cache's counters (0 with the cache off) and its blocks by state
    const struct {
        const char *name, *help;
        long *v;
    } pc[] = {{"tandem_prefix_cache_queries_total",
               "Prefix cache lookups (one a request admitted).", &v->eng.prefix_lookups},
              {"tandem_prefix_cache_hits_total",
               "Prefix cache lookups that found published blocks.", &v->eng.prefix_hits},
              {"tandem_prefix_cache_hit_tokens_total",
               "Prompt tokens the prefix cache gave (not prefilled).", &v->eng.prefix_hit_tokens},
              {"tandem_prefix_cache_evictions_total",
               "Cached prefix blocks taken back for new ones.", &v->eng.prefix_evictions}};
    for (size_t i = 0; i < sizeof pc / sizeof *pc; i++) {
        fam_add(m, pc[i].name, FAM_COUNTER, 0, pc[i].help);
        ser_add(m, VAL_LONG, pc[i].v, -1, 0, NULL);
    }
    fam_add(m, "tandem_prefix_cache_blocks", FAM_GAUGE, 0,
            "Prefix cache blocks: held by requests, cached (published, unheld), free.");
    const char *bs[3] = {"held", "cached", "free"};
    int *bv[3] = {&v->eng.prefix_held, &v->eng.prefix_cached, &v->eng.prefix_free};
    for (int i = 0; i < 3; i++)
        ser_add(m, VAL_INT, bv[i], -1, 0, "state", bs[i], NULL);
    // the history pool (every request's compressed history): its blocks, and those held
    fam_add(m, "tandem_history_blocks", FAM_GAUGE, 0,
            "History pool blocks (256 tokens of every layer's compressed history each): the "
            "pool's, and those requests hold (a request waits when too few are left).");
    ser_add(m, VAL_INT, &v->eng.hist_blocks, -1, 0, "state", "total", NULL);
    ser_add(m, VAL_INT, &v->eng.hist_held, -1, 0, "state", "held", NULL);

    fam_add(m, "tandem_http_requests_total", FAM_COUNTER, 0,
            "HTTP responses by endpoint and status code.");
    for (int e = 0; e < N_ENDPOINTS; e++)
        for (int c = 0; c <= MET_HTTP_CODES; c++)
            ser_add(m, VAL_U64, &v->http[e][c], c, SER_SKIP_ZERO, "endpoint", ENDPOINTS[e], NULL);
    fam_add(m, "tandem_http_ignored_fields_total", FAM_COUNTER, 0,
            "Request fields accepted and ignored.");
    ser_add(m, VAL_U64, &v->ignored_fields, -1, 0, NULL);

    if (!in->vllm_compat) return;
    const char *mn = or_empty(in->model);
    fam_add(m, "vllm:num_requests_running", FAM_GAUGE, 0, "Requests running (vLLM's name).");
    ser_add(m, VAL_INT, &v->running, -1, 0, "model_name", mn, NULL);
    fam_add(m, "vllm:num_requests_waiting", FAM_GAUGE, 0, "Requests waiting (vLLM's name).");
    ser_add(m, VAL_INT, &v->waiting, -1, 0, "model_name", mn, NULL);
    fam_add(m, "vllm:prompt_tokens_total", FAM_COUNTER, 0, "Prompt tokens (vLLM's name).");
    ser_add(m, VAL_U64, &v->prompt_tokens, -1, 0, "model_name", mn, NULL);
    fam_add(m, "vllm:generation_tokens_total", FAM_COUNTER, 0, "Generated tokens (vLLM's name).");
    ser_add(m, VAL_U64, &v->generation_tokens, -1, 0, "model_name", mn, NULL);
    fam_add(m, "vllm:spec_decode_num_drafts_total", FAM_COUNTER, pos_fam,
            "Verify rounds with drafts (vLLM's name).");
    ser_add(m, VAL_LONG, &v->eng.proposed_at[0], -1, pos_ser, "model_name", mn, NULL);
    fam_add(m, "vllm:spec_decode_num_draft_tokens_total", FAM_COUNTER, pos_fam,
            "Draft tokens verified (vLLM's name).");
    ser_add(m, VAL_LONG, &v->eng.drafted, -1, pos_ser, "model_name", mn, NULL);
    fam_add(m, "vllm:spec_decode_num_accepted_tokens_total", FAM_COUNTER, pos_fam,
            "Draft tokens accepted (vLLM's name).");
    ser_add(m, VAL_LONG, &v->eng.accepted, -1, pos_ser, "model_name", mn, NULL);
    fam_add(m, "vllm:spec_decode_num_accepted_tokens_per_pos_total", FAM_COUNTER, pos_fam,
            "Draft tokens accepted per position (vLLM's name).");
    for (int j = 0; j < n_pos; j++)
        ser_add(m, VAL_LONG, &v->eng.accepted_at[j], -1, pos_ser, "model_name", mn, "position",
                POS_NAME[j], NULL);
}

struct srv_metrics *met_new(const struct met_info *info) {
    struct srv_metrics *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    if (pthread_mutex_init(&m->mu, NULL)) {
        free(m);
        return NULL;
    }
    struct met_vals *v = &m->v;
    v->one = 1;
    v->slots_total = info->slots_total;
    v->spec_k = info->k;
    hist_init(&v->ttft, LE_TTFT, NB(LE_TTFT));
    hist_init(&v->itl, LE_ITL, NB(LE_ITL));
    hist_init(&v->e2e, LE_E2E, NB(LE_E2E));
    hist_init(&v->queue, LE_E2E, NB(LE_E2E));
    for (int i = 0; i < MET_STEP_N; i++) {
        hist_init(&v->step_s[i], LE_STEP_S, NB(LE_STEP_S));
        hist_init(&v->step_rows[i], LE_ROWS, NB(LE_ROWS));
    }
    hist_init(&v->accepted_per_step, LE_ACCEPT, NB(LE_ACCEPT));
    build_table(m, info);
    if (m->oom) {
        met_free(m);
        return NULL;
    }
    return m;
}

void met_free(struct srv_metrics *m) {
    if (!m) return;
    for (int i = 0; i < m->n_ser; i++)
        free(m->ser[i].labels);
    free(m->ser);
    free(m->fam);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

// ---------------------------------------------------------------------------------------------
// observing

#define LOCKED(m, stmt)                                                                            \
    do {                                                                                           \
        pthread_mutex_lock(&(m)->mu);                                                              \
        stmt;                                                                                      \
        pthread_mutex_unlock(&(m)->mu);                                                            \
    } while (0)

void met_received(struct srv_metrics *m) {
    LOCKED(m, m->v.received++);
}

void met_rejected(struct srv_metrics *m, enum met_reject why) {
    if ((unsigned)why >= MET_REJECT_N) return;
    LOCKED(m, m->v.rejected[why]++);
}

void met_finished(struct srv_metrics *m, const struct met_request *r) {
    if ((unsigned)r->finish >= MET_FINISH_N) return;
    pthread_mutex_lock(&m->mu);
    struct met_vals *v = &m->v;
    v->finished[r->finish]++;
    if (r->prompt_tokens > 0) v->prompt_tokens += (unsigned long long)r->prompt_tokens;
    if (r->generation_tokens > 0) v->generation_tokens += (unsigned long long)r->generation_tokens;
    hist_add(&v->queue, r->queue_s, 1);
    hist_add(&v->ttft, r->ttft_s, 1);
    hist_add(&v->e2e, r->e2e_s, 1);
    pthread_mutex_unlock(&m->mu);
}

void met_disconnect(struct srv_metrics *m, enum met_phase phase) {
    if ((unsigned)phase >= MET_PHASE_N) return;
    LOCKED(m, m->v.disconnects[phase]++);
}

void met_itl(struct srv_metrics *m, double gap_s, int n_tokens) {
    if (n_tokens <= 0) return;
    double each = gap_s / n_tokens;
    LOCKED(m, hist_add(&m->v.itl, each, (unsigned long long)n_tokens));
}

void met_step(struct srv_metrics *m, enum met_step kind, double seconds, int rows) {
    if ((unsigned)kind >= MET_STEP_N) return;
    pthread_mutex_lock(&m->mu);
    hist_add(&m->v.step_s[kind], seconds, 1);
    if (rows >= 0) hist_add(&m->v.step_rows[kind], rows, 1);
    pthread_mutex_unlock(&m->mu);
}

void met_engine(struct srv_metrics *m, const struct td_engine_stats *s) {
    if (!s) return;
    LOCKED(m, m->v.eng = *s);
}

void met_accepted_per_step(struct srv_metrics *m, int accepted) {
    if (accepted < 0) return;
    LOCKED(m, hist_add(&m->v.accepted_per_step, accepted, 1));
}

void met_spec_k(struct srv_metrics *m, int k) {
    LOCKED(m, m->v.spec_k = k);
}

void met_gauges(struct srv_metrics *m, int running, int waiting, int slots_busy, int streams_active,
                int connections_active) {
    pthread_mutex_lock(&m->mu);
    m->v.running = running;
    m->v.waiting = waiting;
    m->v.slots_busy = slots_busy;
    m->v.streams = streams_active;
    m->v.conns = connections_active;
    pthread_mutex_unlock(&m->mu);
}

const char *met_endpoint(const char *url) {
    for (size_t i = 0; i < N_ENDPOINTS - 1; i++)
        if (!strcmp(url, ENDPOINTS[i])) return ENDPOINTS[i];
    return !strcmp(url, "/v1/health") ? "/health" : ENDPOINTS[N_ENDPOINTS - 1];
}

void met_http(struct srv_metrics *m, const char *endpoint, int code) {
    int e = N_ENDPOINTS - 1; // "other"
    for (int i = 0; endpoint && i < N_ENDPOINTS - 1; i++)
        if (strcmp(endpoint, ENDPOINTS[i]) == 0) e = i;
    pthread_mutex_lock(&m->mu);
    int c = HTTP_OTHER_CODE; // code 0 cannot take a column (0 marks a free one)
    if (code) {
        // its column, else the first free one; past a full table c is HTTP_OTHER_CODE
        c = 0;
        while (c < MET_HTTP_CODES && m->v.http_code[c] && m->v.http_code[c] != code)
            c++;
        if (c < MET_HTTP_CODES && !m->v.http_code[c]) m->v.http_code[c] = code;
    }
    m->v.http[e][c]++;
    pthread_mutex_unlock(&m->mu);
}

void met_ignored_fields(struct srv_metrics *m, int n) {
    if (n <= 0) return;
    LOCKED(m, m->v.ignored_fields += (unsigned long long)n);
}

// ---------------------------------------------------------------------------------------------
// rendering

/* name{labels[,extra]} for a sample; extra may be NULL */
static void sb_sample_name(struct sbuf *b, const char *name, const char *suffix, const char *labels,
                           const char *extra) {
    sbuf_puts(b, name);
    sbuf_puts(b, suffix);
    if (!*labels && !extra) return;
    sbuf_put(b, "{", 1);
    sbuf_puts(b, labels);
    if (extra) {
        if (*labels) sbuf_put(b, ",", 1);
        sbuf_puts(b, extra);
    }
    sbuf_put(b, "}", 1);
}

static unsigned long long scalar(const struct met_vals *v, const struct met_series *s) {
    const char *p = (const char *)v + s->off;
    switch (s->kind) {
    case VAL_U64: return *(const unsigned long long *)p;
    case VAL_LONG: return (unsigned long long)*(const long *)p;
    case VAL_INT: return (unsigned long long)*(const int *)p;
    case VAL_HIST: return ((const struct met_hist *)p)->count;
    }
    return 0;
}

static void render_series(struct sbuf *b, const struct met_family *f, const struct met_series *s,
                          const struct met_vals *v) {
    const char *p = (const char *)v + s->off;
    char extra[48];
    const char *ex = NULL;
    if (s->code_col >= 0) {
        if (s->code_col == HTTP_OTHER_CODE)
            snprintf(extra, sizeof extra, "code=\"other\"");
        else
            snprintf(extra, sizeof extra, "code=\"%d\"", v->http_code[s->code_col]);
        ex = extra;
    }
    if (s->kind != VAL_HIST) {
        sb_sample_name(b, f->name, "", s->labels, ex);
        if (s->kind == VAL_INT)
            sbuf_printf(b, " %d\n", *(const int *)p);
        else if (s->kind == VAL_LONG)
            sbuf_printf(b, " %ld\n", *(const long *)p);
        else
            sbuf_printf(b, " %llu\n", *(const unsigned long long *)p);
        return;
    }
    const struct met_hist *h = (const struct met_hist *)p;
    unsigned long long cum = 0;
    for (int i = 0; i <= h->n; i++) {
        char le[40];
        if (i < h->n)
            snprintf(le, sizeof le, "le=\"%g\"", h->le[i]);
        else
            snprintf(le, sizeof le, "le=\"+Inf\"");
        cum += h->at[i];
        sb_sample_name(b, f->name, "_bucket", s->labels, le);
        sbuf_printf(b, " %llu\n", cum);
    }
    sb_sample_name(b, f->name, "_sum", s->labels, NULL);
    sbuf_put(b, " ", 1);
    sb_double(b, h->sum);
    sbuf_put(b, "\n", 1);
    sb_sample_name(b, f->name, "_count", s->labels, NULL);
    sbuf_printf(b, " %llu\n", h->count);
}

static int shown(const struct met_series *s, const struct met_vals *v) {
    return !(s->flags & SER_SKIP_ZERO) || scalar(v, s) != 0;
}

int met_render(struct srv_metrics *m, char **out, size_t *len) {
    *out = NULL;
    if (len) *len = 0;
    struct met_vals *v = malloc(sizeof *v);
    if (!v) return -1;
    pthread_mutex_lock(&m->mu);
    *v = m->v;
    pthread_mutex_unlock(&m->mu);

    struct sbuf b = {0};
    for (int i = 0; i < m->n_fam; i++) {
        const struct met_family *f = &m->fam[i];
        const struct met_series *s = m->ser + f->first;
        int any = 0;
        for (int j = 0; j < f->n && !any; j++)
            any = shown(&s[j], v);
        if (!any && (f->flags & FAM_OMIT_EMPTY)) continue;
        sbuf_printf(&b, "# HELP %s %s\n", f->name, f->help);
        sbuf_printf(&b, "# TYPE %s %s\n", f->name, FAM_TYPE_NAME[f->type]);
        for (int j = 0; j < f->n; j++)
            if (shown(&s[j], v)) render_series(&b, f, &s[j], v);
    }
    free(v);
    if (b.oom || !b.p) {
        free(b.p);
        return -1;
    }
    *out = b.p;
    if (len) *len = b.n;
    return 0;
}

/* the end of a sample's name{labels}: past the closing brace, skipping quoted values */
static const char *labels_end(const char *p) {
    int quoted = 0;
    for (p++; *p && *p != '\n'; p++) {
        if (quoted && *p == '\\' && p[1])
            p++;
        else if (*p == '"')
            quoted = !quoted;
        else if (!quoted && *p == '}')
            return p;
    }
    return NULL;
}

double met_value(struct srv_metrics *m, const char *name, const char *labels) {
    char *text;
    if (met_render(m, &text, NULL)) return NAN;
    if (!labels) labels = "";
    size_t nl = strlen(name), ll = strlen(labels);
    double val = NAN;
    for (const char *line = text; *line; line = strchr(line, '\n') + 1) {
        if (*line != '#' && strncmp(line, name, nl) == 0) {
            const char *p = line + nl, *val_at = NULL;
            if (*p == ' ' && ll == 0)
                val_at = p + 1;
            else if (*p == '{') {
                const char *e = labels_end(p);
                if (e && (size_t)(e - p - 1) == ll && memcmp(p + 1, labels, ll) == 0 && e[1] == ' ')
                    val_at = e + 2;
            }
            if (val_at) {
                if (strncmp(val_at, "+Inf", 4) == 0)
                    val = INFINITY;
                else if (strncmp(val_at, "-Inf", 4) == 0)
                    val = -INFINITY;
                else
                    val = strtod(val_at, NULL);
                break;
            }
        }
        if (!strchr(line, '\n')) break;
    }
    free(text);
    return val;
}
