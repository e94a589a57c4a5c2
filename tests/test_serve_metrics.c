/* test_serve_metrics.c: serve/metrics.c, the Prometheus text the server renders.
 *
 *   make NVCC=/nonexistent build/tests/test_serve_metrics && build/tests/test_serve_metrics
 *   make SANITIZER=address,undefined NVCC=/nonexistent build-san/tests/test_serve_metrics
 *
 * checker_rejects_bad_text: the format checker below refuses broken documents (so the cases
 *     that lean on it could fail).
 * format_valid/{fresh,busy,compat}: every rendering passes the checker: each family has one
 *     HELP then one TYPE before its samples, samples are name{labels} value, counters end in
 *     _total, histogram buckets are cumulative and end at le="+Inf" equal to _count.
 * families_present: every family of design/server.md §2.5 that serve/metrics.h lists.
 * buckets_inclusive: a value on a bound lands in that bound's bucket; above the last, +Inf.
 * itl_spread: a gap that brought n tokens is n samples of gap/n.
 * request_counters: finish, reject, disconnect, tokens, gauges, ignored fields.
 * engine_spec_counters: met_engine's copy becomes the spec, steps and nonfinite series.
 * vllm_compat_on_off: the vllm: aliases only with vllm_compat, equal to the tandem_ series.
 * no_drafter: with drafter "none" the per-position and vllm:spec_decode series are left out.
 * label_escaping: backslash, quote and newline in a label value.
 * http_codes: the endpoint table, "other", and codes past MET_HTTP_CODES.
 * concurrent_exact: 4 threads observe 100000 times each while another renders (and checks
 *     every rendering, counters never going back); the counts are exact at the end.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "check.h"
#include "serve/metrics.h"

// ---------------------------------------------------------------------------------------------
// a checker of the text format (version 0.0.4), strict about what we emit

#define MAXF 128  /* families */
#define MAXS 4096 /* samples */

struct doc {
    char fam[MAXF][128];
    int n_fam;
    char *sample[MAXS]; /* name{labels}, for the duplicate check */
    int n_sample;
    /* the histogram series being read: its key (name + labels less le), last le and count */
    char hkey[600];
    int h_state; /* 0 none, 1 in buckets, 2 after +Inf, 3 after _sum */
    double h_le, h_cum, h_inf;
};

static int is_name_start(int c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
}
static int is_name_char(int c) {
    return is_name_start(c) || (c >= '0' && c <= '9');
}

/* a metric name at p: its length, 0 if none */
static size_t name_len(const char *p, int colons) {
    size_t n = 0;
    if (!is_name_start((unsigned char)p[0]) || (!colons && p[0] == ':')) return 0;
    while (is_name_char((unsigned char)p[n]) && (colons || p[n] != ':'))
        n++;
    return n;
}

static int ends_with(const char *s, size_t n, const char *suf) {
    size_t k = strlen(suf);
    return n >= k && memcmp(s + n - k, suf, k) == 0;
}

/* a value as the format writes it: a float, +Inf, -Inf or NaN */
static int parse_value(const char *p, size_t n, double *v) {
    char tmp[64];
    if (n == 0 || n >= sizeof tmp) return -1;
    memcpy(tmp, p, n);
    tmp[n] = 0;
    if (!strcmp(tmp, "+Inf")) return *v = INFINITY, 0;
    if (!strcmp(tmp, "-Inf")) return *v = -INFINITY, 0;
    if (!strcmp(tmp, "NaN")) return *v = NAN, 0;
    for (size_t i = 0; i < n; i++)
        if (!strchr("0123456789+-.eE", tmp[i])) return -1;
    char *end;
    *v = strtod(tmp, &end);
    return *end ? -1 : 0;
}

/* 0, or -1 with why; text is the whole rendering */
static int check_text(const char *text, char *why, size_t wn) {
    struct doc *d = calloc(1, sizeof *d);
    const char *cur = NULL, *cur_type = NULL;
    int expect_type = 0, rc = -1, lineno = 0;
    char cur_name[128] = "";
    size_t tl = strlen(text);
    if (tl == 0 || text[tl - 1] != '\n') {
        snprintf(why, wn, "does not end in a newline");
        goto out;
    }
    for (const char *line = text; *line; line = strchr(line, '\n') + 1) {
        size_t len = (size_t)(strchr(line, '\n') - line);
        lineno++;
#define BAD(...)                                                                                   \
    do {                                                                                           \
        int k_ = snprintf(why, wn, "line %d: ", lineno);                                           \
        if (k_ > 0 && (size_t)k_ < wn) snprintf(why + k_, wn - (size_t)k_, __VA_ARGS__);           \
        goto out;                                                                                  \
    } while (0)
        if (len == 0) BAD("empty line");
        if (line[0] == '#') {
            int help = len > 7 && !strncmp(line, "# HELP ", 7);
            int type = len > 7 && !strncmp(line, "# TYPE ", 7);
            if (!help && !type) BAD("a comment that is neither HELP nor TYPE");
            const char *p = line + 7;
            size_t n = name_len(p, 1);
            if (!n || n >= 128 || (p + n < line + len && p[n] != ' ')) BAD("bad family name");
            if (help) {
                if (expect_type) BAD("HELP of %.*s before TYPE of %s", (int)n, p, cur_name);
                for (int i = 0; i < d->n_fam; i++)
                    if (strlen(d->fam[i]) == n && !memcmp(d->fam[i], p, n))
                        BAD("family %.*s seen twice", (int)n, p);
                if (d->n_fam == MAXF) BAD("too many families");
                if (d->h_state) BAD("histogram %.120s unfinished", d->hkey);
                memcpy(d->fam[d->n_fam], p, n);
                d->fam[d->n_fam][n] = 0;
                cur = d->fam[d->n_fam++];
                snprintf(cur_name, sizeof cur_name, "%s", cur);
                for (const char *q = p + n; q < line + len; q++)
                    if (*q == '\\' && q[1] != '\\' && q[1] != 'n') BAD("bad escape in HELP");
                expect_type = 1;
                cur_type = NULL;
            } else {
                if (!expect_type || strlen(cur) != n || memcmp(cur, p, n))
                    BAD("TYPE of %.*s without its HELP just before", (int)n, p);
                if (p + n >= line + len) BAD("TYPE without a type");
                const char *t = p + n + 1;
                size_t tn = (size_t)(line + len - t);
                if (tn == 7 && !strncmp(t, "counter", 7))
                    cur_type = "counter";
                else if (tn == 5 && !strncmp(t, "gauge", 5))
                    cur_type = "gauge";
                else if (tn == 9 && !strncmp(t, "histogram", 9))
                    cur_type = "histogram";
                else
                    BAD("unknown type %.*s", (int)tn, t);
                if (cur_type[0] == 'c' && !ends_with(p, n, "_total"))
                    BAD("counter %s does not end in _total", cur);
                expect_type = 0;
            }
            continue;
        }
        // a sample: name{labels} value
        if (!cur || expect_type) BAD("a sample before its family's HELP and TYPE");
        size_t n = name_len(line, 1);
        if (!n) BAD("bad sample name");
        const char *suffix = "";
        if (cur_type[0] == 'h') {
            size_t fl = strlen(cur);
            if (n <= fl || memcmp(line, cur, fl)) BAD("sample %.*s outside %s", (int)n, line, cur);
            suffix = line + fl;
            size_t sl = n - fl;
            if (!(sl == 7 && !strncmp(suffix, "_bucket", 7)) &&
                !(sl == 4 && !strncmp(suffix, "_sum", 4)) &&
                !(sl == 6 && !strncmp(suffix, "_count", 6)))
                BAD("sample %.*s outside %s", (int)n, line, cur);
        } else if (strlen(cur) != n || memcmp(line, cur, n)) {
            BAD("sample %.*s outside %s", (int)n, line, cur);
        }
        const char *p = line + n;
        char key[512]; /* labels less le */
        size_t kn = 0;
        double le = NAN;
        int has_le = 0;
        char lnames[16][64];
        int n_l = 0;
        if (*p == '{') {
            p++;
            while (*p != '}') {
                size_t ln = name_len(p, 0);
                if (!ln || ln >= 64) BAD("bad label name");
                for (int i = 0; i < n_l; i++)
                    if (strlen(lnames[i]) == ln && !memcmp(lnames[i], p, ln))
                        BAD("label %.*s twice", (int)ln, p);
                if (n_l == 16) BAD("too many labels");
                memcpy(lnames[n_l], p, ln);
                lnames[n_l++][ln] = 0;
                int is_le = ln == 2 && !strncmp(p, "le", 2);
                const char *lstart = p;
                p += ln;
                if (p[0] != '=' || p[1] != '"') BAD("label without =\"");
                p += 2;
                const char *vstart = p;
                while (*p != '"') {
                    if (*p == '\n' || !*p) BAD("unterminated label value");
                    if (*p == '\\') {
                        if (p[1] != '\\' && p[1] != '"' && p[1] != 'n') BAD("bad escape");
                        p++;
                    }
                    p++;
                }
                if (is_le) {
                    if (parse_value(vstart, (size_t)(p - vstart), &le)) BAD("bad le value");
                    has_le = 1;
                } else {
                    size_t m = (size_t)(p + 1 - lstart);
                    if (kn + m + 2 >= sizeof key) BAD("labels too long");
                    memcpy(key + kn, lstart, m);
                    kn += m;
                    key[kn++] = ',';
                }
                p++;
                if (*p == ',') {
                    p++;
                    if (*p == '}') BAD("trailing comma");
                } else if (*p != '}') {
                    BAD("labels not separated by commas");
                }
            }
            p++;
        }
        key[kn] = 0;
        if (*p != ' ') BAD("no single space before the value");
        p++;
        const char *vend = line + len;
        double val;
        if (parse_value(p, (size_t)(vend - p), &val)) BAD("bad value %.*s", (int)(vend - p), p);
        // duplicates
        size_t sn = (size_t)(p - 1 - line);
        for (int i = 0; i < d->n_sample; i++)
            if (strlen(d->sample[i]) == sn && !memcmp(d->sample[i], line, sn))
                BAD("sample %.*s twice", (int)sn, line);
        if (d->n_sample == MAXS) BAD("too many samples");
        d->sample[d->n_sample] = malloc(sn + 1);
        memcpy(d->sample[d->n_sample], line, sn);
        d->sample[d->n_sample++][sn] = 0;
        if (cur_type[0] == 'c' && !(val >= 0)) BAD("negative counter");
        if (cur_type[0] != 'h') {
            if (has_le) BAD("le outside a histogram");
            continue;
        }
        // histograms: buckets (le increasing, counts non-decreasing), +Inf, _sum, _count
        char hk[600];
        snprintf(hk, sizeof hk, "%s{%s}", cur, key);
        if (suffix[1] == 'b') {
            if (!has_le) BAD("bucket without le");
            if (d->h_state == 0 || strcmp(d->hkey, hk)) {
                if (d->h_state) BAD("histogram %.120s unfinished", d->hkey);
                memcpy(d->hkey, hk, sizeof hk);
                d->h_state = 1;
                d->h_le = -INFINITY;
                d->h_cum = 0;
            } else if (d->h_state != 1) {
                BAD("bucket after +Inf in %.120s", hk);
            }
            if (!(le > d->h_le)) BAD("le not increasing in %.120s", hk);
            if (!(val >= d->h_cum)) BAD("buckets not cumulative in %.120s", hk);
            d->h_le = le;
            d->h_cum = val;
            if (isinf(le)) {
                d->h_state = 2;
                d->h_inf = val;
            }
        } else {
            if (has_le) BAD("le on _sum or _count");
            if (!d->h_state || strcmp(d->hkey, hk)) BAD("%.60s%.10s without buckets", cur, suffix);
            if (suffix[1] == 's') {
                if (d->h_state != 2) BAD("_sum before +Inf in %.120s", hk);
                d->h_state = 3;
            } else {
                if (d->h_state != 3) BAD("_count before _sum in %.120s", hk);
                if (val != d->h_inf)
                    BAD("_count %g != +Inf bucket %g in %.120s", val, d->h_inf, hk);
                d->h_state = 0;
            }
        }
    }
    if (expect_type) {
        snprintf(why, wn, "HELP of %s without TYPE", cur_name);
        goto out;
    }
    if (d->h_state) {
        snprintf(why, wn, "histogram %.120s unfinished", d->hkey);
        goto out;
    }
    rc = 0;
out:
    for (int i = 0; i < d->n_sample; i++)
        free(d->sample[i]);
    free(d);
    return rc;
#undef BAD
}

static int render_ok(struct srv_metrics *m, char **text, char *why, size_t wn) {
    size_t len;
    if (met_render(m, text, &len)) {
        snprintf(why, wn, "met_render failed");
        return -1;
    }
    if (strlen(*text) != len) {
        snprintf(why, wn, "len %zu, strlen %zu", len, strlen(*text));
        return -1;
    }
    return check_text(*text, why, wn);
}

static const struct met_info INFO = {.model = "tiny",
                                     .drafter = "mtp",
                                     .k = 3,
                                     .version = "1.2.3",
                                     .backend = "cpu",
                                     .config_hash = 0xabcdef0123456789ull,
                                     .slots_total = 16,
                                     .vllm_compat = 0};

static struct met_info info_with(int vllm, const char *drafter, int k) {
    struct met_info in = INFO;
    in.vllm_compat = vllm;
    in.drafter = drafter;
    in.k = k;
    return in;
}

/* a bit of everything */
static void observe_some(struct srv_metrics *m) {
    met_received(m);
    met_received(m);
    met_rejected(m, MET_REJECT_QUEUE_FULL);
    struct met_request r = {.finish = MET_FINISH_STOP,
                            .prompt_tokens = 10,
                            .generation_tokens = 20,
                            .queue_s = 0.003,
                            .ttft_s = 0.02,
                            .e2e_s = 0.5};
    met_finished(m, &r);
    met_disconnect(m, MET_PHASE_DECODE);
    met_itl(m, 0.01, 2);
    met_step(m, MET_STEP_MIXED, 0.003, 40);
    struct td_engine_stats s = {0};
    s.steps = 5;
    s.rounds = 4;
    s.drafted = 9;
    s.accepted = 5;
    s.proposed_at[0] = 4, s.proposed_at[1] = 3, s.proposed_at[2] = 2;
    s.accepted_at[0] = 3, s.accepted_at[1] = 2;
    met_engine(m, &s);
    met_accepted_per_step(m, 2);
    met_gauges(m, 1, 2, 3, 4, 5);
    met_http(m, "/v1/completions", 200);
    met_http(m, "/nowhere", 404);
    met_ignored_fields(m, 3);
}

// ---------------------------------------------------------------------------------------------
// cases

static void checker_rejects_bad_text(void) {
    case_begin();
    static const struct {
        const char *what, *text;
    } bad[] = {
        {.what = "no TYPE", .text = "# HELP a_total x\na_total 1\n"},
        {.what = "TYPE before HELP",
         .text = "# TYPE a_total counter\n# HELP a_total x\na_total 1\n"},
        {.what = "twice", .text = "# HELP a x\n# TYPE a gauge\na 1\n# HELP a x\n# TYPE a gauge\n"},
        {.what = "counter name", .text = "# HELP a x\n# TYPE a counter\na 1\n"},
        {.what = "outside", .text = "# HELP a x\n# TYPE a gauge\nb 1\n"},
        {.what = "bad escape", .text = "# HELP a x\n# TYPE a gauge\na{l=\"\\q\"} 1\n"},
        {.what = "raw quote", .text = "# HELP a x\n# TYPE a gauge\na{l=\"x\"y\"} 1\n"},
        {.what = "bad value", .text = "# HELP a x\n# TYPE a gauge\na 1x\n"},
        {.what = "no newline", .text = "# HELP a x\n# TYPE a gauge\na 1"},
        {.what = "not cumulative",
         .text = "# HELP h x\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\n"
                 "h_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n"},
        {.what = "no +Inf",
         .text = "# HELP h x\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n"},
        {.what = "count != +Inf",
         .text = "# HELP h x\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\n"
                 "h_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 2\n"},
        {.what = "le order",
         .text = "# HELP h x\n# TYPE h histogram\nh_bucket{le=\"2\"} 1\nh_bucket{le=\"1\"} 1\n"
                 "h_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n"},
        {.what = "duplicate", .text = "# HELP a x\n# TYPE a gauge\na{l=\"1\"} 1\na{l=\"1\"} 2\n"},
    };
    char why[256];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(check_text(bad[i].text, why, sizeof why) != 0, "accepted: %s", bad[i].what);
    const char *good = "# HELP h x\n# TYPE h histogram\nh_bucket{k=\"a\",le=\"1\"} 1\n"
                       "h_bucket{k=\"a\",le=\"+Inf\"} 2\nh_sum{k=\"a\"} 3.5\nh_count{k=\"a\"} 2\n"
                       "# HELP c_total y\n# TYPE c_total counter\nc_total{l=\"a\\\"\\\\\\n\"} 7\n";
    CHECK(check_text(good, why, sizeof why) == 0, "refused a good text: %s", why);
    case_end("checker_rejects_bad_text", "");
}

static void format_valid(const char *name, int vllm, int busy) {
    case_begin();
    struct met_info in = info_with(vllm, "mtp", 3);
    struct srv_metrics *m = met_new(&in);
    CHECK(m, "met_new");
    char *text = NULL, why[256] = "";
    if (m) {
        if (busy) observe_some(m);
        CHECK(render_ok(m, &text, why, sizeof why) == 0, "%s", why);
    }
    free(text);
    met_free(m);
    char full[64];
    snprintf(full, sizeof full, "format_valid/%s", name);
    case_end(full, "");
}

static void families_present(void) {
    case_begin();
    static const char *fams[] = {"tandem_build_info",
                                 "tandem_requests_running",
                                 "tandem_requests_waiting",
                                 "tandem_slots_total",
                                 "tandem_slots_busy",
                                 "tandem_sse_streams_active",
                                 "tandem_http_connections_active",
                                 "tandem_requests_received_total",
                                 "tandem_requests_rejected_total",
                                 "tandem_requests_finished_total",
                                 "tandem_client_disconnects_total",
                                 "tandem_prompt_tokens_total",
                                 "tandem_generation_tokens_total",
                                 "tandem_ttft_seconds",
                                 "tandem_itl_seconds",
                                 "tandem_e2e_seconds",
                                 "tandem_queue_seconds",
                                 "tandem_step_seconds",
                                 "tandem_step_rows",
                                 "tandem_spec_drafts_total",
                                 "tandem_spec_draft_tokens_total",
                                 "tandem_spec_accepted_tokens_total",
                                 "tandem_spec_accepted_tokens_per_pos_total",
                                 "tandem_spec_draft_tokens_per_pos_total",
                                 "tandem_spec_accepted_per_step",
                                 "tandem_spec_k",
                                 "tandem_nonfinite_rows_total",
                                 "tandem_engine_steps_total",
                                 "tandem_http_requests_total",
                                 "tandem_http_ignored_fields_total"};
    static const char *types[] = {"gauge",     "gauge",     "gauge",     "gauge",     "gauge",
                                  "gauge",     "gauge",     "counter",   "counter",   "counter",
                                  "counter",   "counter",   "counter",   "histogram", "histogram",
                                  "histogram", "histogram", "histogram", "histogram", "counter",
                                  "counter",   "counter",   "counter",   "counter",   "histogram",
                                  "gauge",     "counter",   "counter",   "counter",   "counter"};
    struct srv_metrics *m = met_new(&INFO);
    char *text = NULL;
    if (m && met_render(m, &text, NULL) == 0) {
        for (size_t i = 0; i < sizeof fams / sizeof fams[0]; i++) {
            char want[160];
            snprintf(want, sizeof want, "# TYPE %s %s\n", fams[i], types[i]);
            CHECK(strstr(text, want), "no \"%.*s\"", (int)strlen(want) - 1, want);
        }
        CHECK(met_value(m, "tandem_build_info",
                        "model=\"tiny\",version=\"1.2.3\",drafter=\"mtp\",k=\"3\","
                        "backend=\"cpu\",config_hash=\"abcdef0123456789\"") == 1,
              "build_info labels");
        CHECK(met_value(m, "tandem_slots_total", "") == 16, "slots_total");
        CHECK(met_value(m, "tandem_spec_k", "drafter=\"mtp\"") == 3, "spec_k from info");
        met_spec_k(m, 2);
        CHECK(met_value(m, "tandem_spec_k", "drafter=\"mtp\"") == 2, "met_spec_k");
        CHECK(isnan(met_value(m, "tandem_no_such_thing", NULL)), "absent is not NAN");
        CHECK(isnan(met_value(m, "tandem_spec_k", "")), "wrong labels are not NAN");
        CHECK(!strstr(text, "vllm:"), "vllm: names without vllm_compat");
    } else {
        CHECK(0, "met_new or met_render failed");
    }
    free(text);
    met_free(m);
    case_end("families_present", "");
}

static double bucket(struct srv_metrics *m, const char *fam, const char *labels, const char *le) {
    char name[128], lab[256];
    snprintf(name, sizeof name, "%s_bucket", fam);
    snprintf(lab, sizeof lab, "%s%sle=\"%s\"", labels, *labels ? "," : "", le);
    return met_value(m, name, lab);
}

static void buckets_inclusive(void) {
    case_begin();
    struct srv_metrics *m = met_new(&INFO);
    if (!m) CHECK(0, "met_new");
    if (m) {
        // ttft bounds .005 .01 ... 30 60; queue ttft_s < 0 and NaN are not observed
        double t[] = {0.005, 0.0050001, 0.01, 60, 60.5, -1, NAN};
        for (int i = 0; i < 7; i++) {
            struct met_request r = {.finish = MET_FINISH_STOP,
                                    .prompt_tokens = 1,
                                    .generation_tokens = 1,
                                    .queue_s = -1,
                                    .ttft_s = t[i],
                                    .e2e_s = -1};
            met_finished(m, &r);
        }
        CHECK(bucket(m, "tandem_ttft_seconds", "", "0.005") == 1, "le=0.005 holds 0.005: %g",
              bucket(m, "tandem_ttft_seconds", "", "0.005"));
        CHECK(bucket(m, "tandem_ttft_seconds", "", "0.01") == 3, "le=0.01: %g",
              bucket(m, "tandem_ttft_seconds", "", "0.01"));
        CHECK(bucket(m, "tandem_ttft_seconds", "", "30") == 3, "le=30");
        CHECK(bucket(m, "tandem_ttft_seconds", "", "60") == 4, "le=60 holds 60");
        CHECK(bucket(m, "tandem_ttft_seconds", "", "+Inf") == 5, "+Inf");
        CHECK(met_value(m, "tandem_ttft_seconds_count", "") == 5, "count");
        double sum = met_value(m, "tandem_ttft_seconds_sum", "");
        CHECK(fabs(sum - (0.005 + 0.0050001 + 0.01 + 60 + 60.5)) < 1e-9, "sum %.17g", sum);
        CHECK(met_value(m, "tandem_queue_seconds_count", "") == 0, "queue < 0 observed");
        CHECK(met_value(m, "tandem_e2e_seconds_count", "") == 0, "e2e < 0 observed");
        CHECK(met_value(m, "tandem_requests_finished_total", "reason=\"stop\"") == 7,
              "every request counted");
        // rows: 1 lands in le=1, 3 in le=4, 8192 in le=8192, 8193 past it
        int rows[] = {1, 3, 8192, 8193};
        for (int i = 0; i < 4; i++)
            met_step(m, MET_STEP_PREFILL, 0.0002, rows[i]);
        CHECK(bucket(m, "tandem_step_rows", "kind=\"prefill\"", "1") == 1, "rows le=1");
        CHECK(bucket(m, "tandem_step_rows", "kind=\"prefill\"", "2") == 1, "rows le=2");
        CHECK(bucket(m, "tandem_step_rows", "kind=\"prefill\"", "4") == 2, "rows le=4");
        CHECK(bucket(m, "tandem_step_rows", "kind=\"prefill\"", "8192") == 3, "rows le=8192");
        CHECK(bucket(m, "tandem_step_rows", "kind=\"prefill\"", "+Inf") == 4, "rows +Inf");
        CHECK(bucket(m, "tandem_step_seconds", "kind=\"prefill\"", "0.0002") == 4,
              "step seconds on the first bound");
        CHECK(bucket(m, "tandem_step_rows", "kind=\"decode\"", "+Inf") == 0, "wrong kind");
        // accepted per step: 0 in le=0, 16 in le=16, 17 past it
        int acc[] = {0, 0, 1, 16, 17};
        for (int i = 0; i < 5; i++)
            met_accepted_per_step(m, acc[i]);
        const char *dl = "drafter=\"mtp\"";
        CHECK(bucket(m, "tandem_spec_accepted_per_step", dl, "0") == 2, "accepted le=0");
        CHECK(bucket(m, "tandem_spec_accepted_per_step", dl, "1") == 3, "accepted le=1");
        CHECK(bucket(m, "tandem_spec_accepted_per_step", dl, "15") == 3, "accepted le=15");
        CHECK(bucket(m, "tandem_spec_accepted_per_step", dl, "16") == 4, "accepted le=16");
        CHECK(bucket(m, "tandem_spec_accepted_per_step", dl, "+Inf") == 5, "accepted +Inf");
        CHECK(met_value(m, "tandem_spec_accepted_per_step_sum", dl) == 34, "accepted sum");
        // e2e and queue share the .01 ... 600 bounds
        struct met_request r = {.finish = MET_FINISH_LENGTH,
                                .prompt_tokens = 1,
                                .generation_tokens = 1,
                                .queue_s = 600,
                                .ttft_s = -1,
                                .e2e_s = 600.0001};
        met_finished(m, &r);
        CHECK(bucket(m, "tandem_queue_seconds", "", "600") == 1, "queue le=600 holds 600");
        CHECK(bucket(m, "tandem_e2e_seconds", "", "600") == 0, "e2e 600.0001 in le=600");
        CHECK(bucket(m, "tandem_e2e_seconds", "", "+Inf") == 1, "e2e +Inf");
        char *text = NULL, why[256];
        CHECK(render_ok(m, &text, why, sizeof why) == 0, "%s", why);
        free(text);
    }
    met_free(m);
    case_end("buckets_inclusive", "");
}

static void itl_spread(void) {
    case_begin();
    struct srv_metrics *m = met_new(&INFO);
    if (!m) CHECK(0, "met_new");
    if (m) {
        met_itl(m, 0.009, 3); // 3 samples of 0.003: le=0.004
        met_itl(m, 0.0007, 1);
        met_itl(m, 1.0, 0); // no tokens: nothing
        met_itl(m, -0.5, 2);
        CHECK(met_value(m, "tandem_itl_seconds_count", "") == 4, "count %g",
              met_value(m, "tandem_itl_seconds_count", ""));
        CHECK(bucket(m, "tandem_itl_seconds", "", "0.0005") == 0, "le=0.0005");
        CHECK(bucket(m, "tandem_itl_seconds", "", "0.001") == 1, "le=0.001");
        CHECK(bucket(m, "tandem_itl_seconds", "", "0.002") == 1, "le=0.002");
        CHECK(bucket(m, "tandem_itl_seconds", "", "0.004") == 4, "le=0.004: %g",
              bucket(m, "tandem_itl_seconds", "", "0.004"));
        CHECK(bucket(m, "tandem_itl_seconds", "", "+Inf") == 4, "+Inf");
        double sum = met_value(m, "tandem_itl_seconds_sum", "");
        CHECK(fabs(sum - 0.0097) < 1e-12, "sum %.17g, want 0.0097 (gap, not gap * n)", sum);
        // one 7-token commit after 0.7 s: 7 samples of 0.1 s, all in le=0.1
        met_itl(m, 0.7, 7);
        CHECK(bucket(m, "tandem_itl_seconds", "", "0.05") == 4, "0.1 s samples below 0.1");
        CHECK(bucket(m, "tandem_itl_seconds", "", "0.25") == 11, "le=0.25: %g",
              bucket(m, "tandem_itl_seconds", "", "0.25"));
    }
    met_free(m);
    case_end("itl_spread", "");
}

static void request_counters(void) {
    case_begin();
    struct srv_metrics *m = met_new(&INFO);
    if (!m) CHECK(0, "met_new");
    if (m) {
        static const char *fin[] = {"stop", "length", "abort", "error", "nonfinite", "timeout"};
        static const char *rej[] = {"queue_full",  "context",  "auth",
                                    "bad_request", "draining", "too_large"};
        static const char *ph[] = {"queued", "prefill", "decode"};
        for (int i = 0; i < MET_FINISH_N; i++)
            for (int j = 0; j <= i; j++) {
                struct met_request r = {.finish = (enum met_finish)i,
                                        .prompt_tokens = 5,
                                        .generation_tokens = i,
                                        .queue_s = 0.1,
                                        .ttft_s = 0.2,
                                        .e2e_s = 0.3};
                met_finished(m, &r);
            }
        for (int i = 0; i < MET_REJECT_N; i++)
            for (int j = 0; j < 2 * i + 1; j++)
                met_rejected(m, (enum met_reject)i);
        for (int i = 0; i < MET_PHASE_N; i++)
            for (int j = 0; j < i + 3; j++)
                met_disconnect(m, (enum met_phase)i);
        met_rejected(m, MET_REJECT_N);           // ignored
        met_disconnect(m, (enum met_phase) - 1); // ignored
        char lab[64];
        for (int i = 0; i < MET_FINISH_N; i++) {
            snprintf(lab, sizeof lab, "reason=\"%s\"", fin[i]);
            CHECK(met_value(m, "tandem_requests_finished_total", lab) == i + 1, "finished %s",
                  fin[i]);
        }
        for (int i = 0; i < MET_REJECT_N; i++) {
            snprintf(lab, sizeof lab, "reason=\"%s\"", rej[i]);
            CHECK(met_value(m, "tandem_requests_rejected_total", lab) == 2 * i + 1, "rejected %s",
                  rej[i]);
        }
        for (int i = 0; i < MET_PHASE_N; i++) {
            snprintf(lab, sizeof lab, "phase=\"%s\"", ph[i]);
            CHECK(met_value(m, "tandem_client_disconnects_total", lab) == i + 3, "phase %s", ph[i]);
        }
        // 21 requests of 5 prompt tokens; i generated tokens (i + 1) times: sum i(i+1) = 70
        CHECK(met_value(m, "tandem_prompt_tokens_total", "") == 105, "prompt tokens");
        CHECK(met_value(m, "tandem_generation_tokens_total", "") == 70, "generation tokens");
        CHECK(met_value(m, "tandem_e2e_seconds_count", "") == 21, "e2e count");
        CHECK(bucket(m, "tandem_queue_seconds", "", "0.1") == 21, "queue 0.1 in le=0.1");
        CHECK(bucket(m, "tandem_queue_seconds", "", "0.05") == 0, "queue le=0.05");
        met_gauges(m, 7, 8, 9, 10, 11);
        CHECK(met_value(m, "tandem_requests_running", "") == 7, "running");
        CHECK(met_value(m, "tandem_requests_waiting", "") == 8, "waiting");
        CHECK(met_value(m, "tandem_slots_busy", "") == 9, "slots_busy");
        CHECK(met_value(m, "tandem_sse_streams_active", "") == 10, "streams");
        CHECK(met_value(m, "tandem_http_connections_active", "") == 11, "connections");
        met_ignored_fields(m, 4);
        met_ignored_fields(m, -2);
        CHECK(met_value(m, "tandem_http_ignored_fields_total", "") == 4, "ignored fields");
        met_received(m);
        CHECK(met_value(m, "tandem_requests_received_total", "") == 1, "received");
    }
    met_free(m);
    case_end("request_counters", "");
}

static void engine_spec_counters(void) {
    case_begin();
    struct met_info in = info_with(1, "dspark", 4);
    struct srv_metrics *m = met_new(&in);
    if (!m) CHECK(0, "met_new");
    if (m) {
        struct td_engine_stats s = {0};
        s.steps = 100;
        s.rounds = 90;
        s.drafted = 200;
        s.accepted = 120;
        long prop[4] = {80, 60, 40, 20}, acc[4] = {50, 40, 20, 10};
        for (int j = 0; j < 4; j++)
            s.proposed_at[j] = prop[j], s.accepted_at[j] = acc[j];
        s.proposed_at[4] = 999; // past k: not reported
        s.nan_rows = 2;
        met_engine(m, &s);
        const char *d = "drafter=\"dspark\"";
        CHECK(met_value(m, "tandem_engine_steps_total", "") == 100, "steps");
        CHECK(met_value(m, "tandem_engine_verify_rounds_total", "") == 90, "rounds");
        CHECK(met_value(m, "tandem_spec_drafts_total", d) == 80, "drafts = proposed_at[0]");
        CHECK(met_value(m, "tandem_spec_draft_tokens_total", d) == 200, "draft tokens");
        CHECK(met_value(m, "tandem_spec_accepted_tokens_total", d) == 120, "accepted");
        CHECK(met_value(m, "tandem_nonfinite_rows_total", "where=\"target\"") == 2, "nan rows");
        for (int j = 0; j < 4; j++) {
            char lab[64], vl[64];
            snprintf(lab, sizeof lab, "%s,position=\"%d\"", d, j);
            snprintf(vl, sizeof vl, "model_name=\"tiny\",position=\"%d\"", j);
            CHECK(met_value(m, "tandem_spec_accepted_tokens_per_pos_total", lab) == acc[j],
                  "accepted pos %d", j);
            CHECK(met_value(m, "tandem_spec_draft_tokens_per_pos_total", lab) == prop[j],
                  "proposed pos %d", j);
            CHECK(met_value(m, "vllm:spec_decode_num_accepted_tokens_per_pos_total", vl) == acc[j],
                  "vllm pos %d", j);
        }
        CHECK(isnan(met_value(m, "tandem_spec_draft_tokens_per_pos_total",
                              "drafter=\"dspark\",position=\"4\"")),
              "position k reported");
        const char *mn = "model_name=\"tiny\"";
        CHECK(met_value(m, "vllm:spec_decode_num_drafts_total", mn) == 80, "vllm drafts");
        CHECK(met_value(m, "vllm:spec_decode_num_draft_tokens_total", mn) == 200, "vllm tokens");
        CHECK(met_value(m, "vllm:spec_decode_num_accepted_tokens_total", mn) == 120,
              "vllm accepted");
        // a later copy replaces the earlier one (the engine's counters are cumulative)
        s.drafted = 250;
        met_engine(m, &s);
        CHECK(met_value(m, "tandem_spec_draft_tokens_total", d) == 250, "second copy");
        // what vllm bench serve reads: lines that start vllm:spec_decode, names ending _total
        char *text = NULL, why[256];
        CHECK(render_ok(m, &text, why, sizeof why) == 0, "%s", why);
        int lines = 0;
        for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : p) {
            if (strncmp(p, "vllm:spec_decode", 16)) continue;
            size_t n = strcspn(p, "{ ");
            CHECK(n > 6 && !strncmp(p + n - 6, "_total", 6), "%.*s", (int)n, p);
            lines++;
        }
        CHECK(lines == 3 + 4, "%d vllm:spec_decode lines", lines);
        free(text);
    }
    met_free(m);
    case_end("engine_spec_counters", "");
}

static void vllm_compat_on_off(void) {
    case_begin();
    for (int on = 0; on <= 1; on++) {
        struct met_info in = info_with(on, "mtp", 3);
        struct srv_metrics *m = met_new(&in);
        if (!m) {
            CHECK(0, "met_new");
            continue;
        }
        observe_some(m);
        char *text = NULL, why[256];
        CHECK(render_ok(m, &text, why, sizeof why) == 0, "vllm_compat %d: %s", on, why);
        int has = text && (strncmp(text, "vllm:", 5) == 0 || strstr(text, "\nvllm:"));
        CHECK(has == on, "vllm_compat %d: vllm: lines %s", on, has ? "present" : "absent");
        if (on) {
            const char *mn = "model_name=\"tiny\"";
            static const char *pairs[][3] = {
                {"vllm:num_requests_running", "tandem_requests_running", ""},
                {"vllm:num_requests_waiting", "tandem_requests_waiting", ""},
                {"vllm:prompt_tokens_total", "tandem_prompt_tokens_total", ""},
                {"vllm:generation_tokens_total", "tandem_generation_tokens_total", ""},
                {"vllm:spec_decode_num_drafts_total", "tandem_spec_drafts_total",
                 "drafter=\"mtp\""},
                {"vllm:spec_decode_num_draft_tokens_total", "tandem_spec_draft_tokens_total",
                 "drafter=\"mtp\""},
                {"vllm:spec_decode_num_accepted_tokens_total", "tandem_spec_accepted_tokens_total",
                 "drafter=\"mtp\""}};
            for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
                double a = met_value(m, pairs[i][0], mn),
                       b = met_value(m, pairs[i][1], pairs[i][2]);
                CHECK(a == b && a > 0, "%s %g vs %s %g", pairs[i][0], a, pairs[i][1], b);
            }
            CHECK(strstr(text, "# TYPE vllm:spec_decode_num_drafts_total counter\n"), "TYPE");
        }
        free(text);
        met_free(m);
    }
    case_end("vllm_compat_on_off", "");
}

static void no_drafter(void) {
    case_begin();
    const char *names[] = {"none", NULL, ""};
    for (int i = 0; i < 3; i++) {
        struct met_info in = info_with(1, names[i], 0);
        struct srv_metrics *m = met_new(&in);
        if (!m) {
            CHECK(0, "met_new");
            continue;
        }
        struct td_engine_stats s = {0};
        s.steps = 10;
        s.rounds = 10; // every round without drafts
        met_engine(m, &s);
        char *text = NULL, why[256];
        CHECK(render_ok(m, &text, why, sizeof why) == 0, "%s", why);
        if (text) {
            CHECK(!strstr(text, "_per_pos_total"), "per-position series with no drafter");
            CHECK(!strstr(text, "vllm:spec_decode"), "vllm:spec_decode with no drafter");
            CHECK(strstr(text, "vllm:num_requests_running"), "other vllm: aliases missing");
        }
        CHECK(met_value(m, "tandem_spec_drafts_total", "drafter=\"none\"") == 0,
              "drafts are not rounds");
        CHECK(met_value(m, "tandem_engine_verify_rounds_total", "") == 10, "rounds");
        free(text);
        met_free(m);
    }
    // drafter none with a k: the positions stay out while zero
    struct met_info in = info_with(0, "none", 2);
    struct srv_metrics *m = met_new(&in);
    if (m) {
        char *text = NULL, why[256];
        CHECK(render_ok(m, &text, why, sizeof why) == 0, "%s", why);
        CHECK(text && !strstr(text, "_per_pos_total"), "none, k 2: per-position series");
        free(text);
        met_free(m);
    }
    // and with a drafter the zero positions are shown
    in = info_with(0, "ngram", 2);
    m = met_new(&in);
    if (m) {
        CHECK(met_value(m, "tandem_spec_accepted_tokens_per_pos_total",
                        "drafter=\"ngram\",position=\"1\"") == 0,
              "ngram: position 1 missing");
        met_free(m);
    }
    case_end("no_drafter", "");
}

static void label_escaping(void) {
    case_begin();
    struct met_info in = info_with(1, "mtp", 1);
    in.model = "a\"b\\c\nd";
    in.version = "v\\";
    in.backend = NULL;
    struct srv_metrics *m = met_new(&in);
    if (!m) CHECK(0, "met_new");
    if (m) {
        char *text = NULL, why[256];
        CHECK(render_ok(m, &text, why, sizeof why) == 0, "%s", why);
        if (text) {
            CHECK(strstr(text, "model=\"a\\\"b\\\\c\\nd\",version=\"v\\\\\""), "model label");
            CHECK(strstr(text, "model_name=\"a\\\"b\\\\c\\nd\""), "vllm model_name");
            CHECK(strstr(text, "backend=\"\""), "NULL backend");
        }
        CHECK(met_value(m, "tandem_build_info",
                        "model=\"a\\\"b\\\\c\\nd\",version=\"v\\\\\",drafter=\"mtp\",k=\"1\","
                        "backend=\"\",config_hash=\"abcdef0123456789\"") == 1,
              "build_info read back");
        free(text);
    }
    met_free(m);
    case_end("label_escaping", "");
}

static void http_codes(void) {
    case_begin();
    struct srv_metrics *m = met_new(&INFO);
    if (!m) CHECK(0, "met_new");
    if (m) {
        met_http(m, "/v1/chat/completions", 200);
        met_http(m, "/v1/chat/completions", 200);
        met_http(m, "/v1/chat/completions", 429);
        met_http(m, "/metrics", 200);
        met_http(m, "/v1/chat", 404); // not in the table
        met_http(m, NULL, 404);
        met_http(m, "/health", 0); // 0 cannot take a column
        CHECK(met_value(m, "tandem_http_requests_total",
                        "endpoint=\"/v1/chat/completions\",code=\"200\"") == 2,
              "chat 200");
        CHECK(met_value(m, "tandem_http_requests_total",
                        "endpoint=\"/v1/chat/completions\",code=\"429\"") == 1,
              "chat 429");
        CHECK(met_value(m, "tandem_http_requests_total", "endpoint=\"/metrics\",code=\"200\"") == 1,
              "metrics 200");
        CHECK(met_value(m, "tandem_http_requests_total", "endpoint=\"other\",code=\"404\"") == 2,
              "other 404");
        CHECK(met_value(m, "tandem_http_requests_total", "endpoint=\"/health\",code=\"other\"") ==
                  1,
              "code 0");
        CHECK(
            isnan(met_value(m, "tandem_http_requests_total", "endpoint=\"/metrics\",code=\"429\"")),
            "a zero pair shown");
        // fill the table: 3 codes so far, 29 more take columns, the rest count as "other"
        for (int c = 500; c < 540; c++)
            met_http(m, "/props", c);
        CHECK(met_value(m, "tandem_http_requests_total", "endpoint=\"/props\",code=\"528\"") == 1,
              "the last column");
        CHECK(isnan(met_value(m, "tandem_http_requests_total", "endpoint=\"/props\",code=\"529\"")),
              "a column past MET_HTTP_CODES");
        CHECK(met_value(m, "tandem_http_requests_total", "endpoint=\"/props\",code=\"other\"") ==
                  11,
              "codes past the table");
        met_http(m, "/props", 200); // known codes still have their column
        CHECK(met_value(m, "tandem_http_requests_total", "endpoint=\"/props\",code=\"200\"") == 1,
              "known code after the table filled");
        char *text = NULL, why[256];
        CHECK(render_ok(m, &text, why, sizeof why) == 0, "%s", why);
        free(text);
    }
    met_free(m);
    case_end("http_codes", "");
}

// ---------------------------------------------------------------------------------------------
// concurrency

#define N_THREADS 4
#define N_OBS     100000

struct conc {
    struct srv_metrics *m;
    int id;
    atomic_int done; /* set by the main thread once the observers are joined */
    int renders, bad;
    char why[256];
};

static void *observer(void *arg) {
    struct conc *c = arg;
    struct td_engine_stats s = {0};
    for (int i = 0; i < N_OBS; i++) {
        met_received(c->m);
        struct met_request r = {.finish = (enum met_finish)(i % MET_FINISH_N),
                                .prompt_tokens = 2,
                                .generation_tokens = 3,
                                .queue_s = 0.001,
                                .ttft_s = 0.002,
                                .e2e_s = 0.004};
        met_finished(c->m, &r);
        met_itl(c->m, 0.003, 3);
        met_step(c->m, (enum met_step)(i % MET_STEP_N), 0.001, i % 300);
        met_accepted_per_step(c->m, i % 17);
        met_http(c->m, (i & 1) ? "/v1/completions" : "/metrics", 200 + (i % 3));
        met_gauges(c->m, c->id, i, 1, 2, 3);
        if (c->id == 0) {
            s.steps = i + 1;
            s.drafted = 2L * (i + 1);
            met_engine(c->m, &s);
        }
    }
    return NULL;
}

static void *renderer(void *arg) {
    struct conc *c = arg;
    double last = 0;
    while (!atomic_load(&c->done)) {
        char *text = NULL;
        if (render_ok(c->m, &text, c->why, sizeof c->why)) {
            c->bad = 1;
            free(text);
            break;
        }
        free(text);
        double v = met_value(c->m, "tandem_requests_received_total", "");
        if (!(v >= last)) {
            snprintf(c->why, sizeof c->why, "received went from %g to %g", last, v);
            c->bad = 1;
            break;
        }
        last = v;
        c->renders++;
    }
    return NULL;
}

static void concurrent_exact(void) {
    case_begin();
    struct met_info in = info_with(1, "mtp", 3);
    struct srv_metrics *m = met_new(&in);
    if (!m) {
        CHECK(0, "met_new");
        case_end("concurrent_exact", "");
        return;
    }
    struct conc obs[N_THREADS], rc = {0};
    pthread_t th[N_THREADS], rt;
    rc.m = m;
    pthread_create(&rt, NULL, renderer, &rc);
    for (int i = 0; i < N_THREADS; i++) {
        obs[i] = (struct conc){0};
        obs[i].m = m;
        obs[i].id = i;
        pthread_create(&th[i], NULL, observer, &obs[i]);
    }
    for (int i = 0; i < N_THREADS; i++)
        pthread_join(th[i], NULL);
    atomic_store(&rc.done, 1);
    pthread_join(rt, NULL);
    CHECK(!rc.bad, "during the run: %s", rc.why);
    const double total = (double)N_THREADS * N_OBS;
    CHECK(met_value(m, "tandem_requests_received_total", "") == total, "received %g",
          met_value(m, "tandem_requests_received_total", ""));
    double fin = 0;
    static const char *fn[] = {"stop", "length", "abort", "error", "nonfinite", "timeout"};
    for (int i = 0; i < MET_FINISH_N; i++) {
        char lab[48];
        snprintf(lab, sizeof lab, "reason=\"%s\"", fn[i]);
        double v = met_value(m, "tandem_requests_finished_total", lab);
        // i % 6 == r for N_OBS / 6 values of i, one more for r < N_OBS % 6
        double want = N_THREADS * (double)(N_OBS / MET_FINISH_N + (i < N_OBS % MET_FINISH_N));
        CHECK(v == want, "finished %s %g, want %g", fn[i], v, want);
        fin += v;
    }
    CHECK(fin == total, "finished %g", fin);
    CHECK(met_value(m, "tandem_prompt_tokens_total", "") == 2 * total, "prompt tokens");
    CHECK(met_value(m, "tandem_generation_tokens_total", "") == 3 * total, "generation tokens");
    CHECK(met_value(m, "tandem_ttft_seconds_count", "") == total, "ttft count");
    CHECK(met_value(m, "tandem_itl_seconds_count", "") == 3 * total, "itl count");
    CHECK(bucket(m, "tandem_itl_seconds", "", "0.002") == 3 * total, "itl bucket");
    double steps = 0;
    static const char *kinds[] = {"kind=\"prefill\"", "kind=\"decode\"", "kind=\"mixed\""};
    for (int k = 0; k < MET_STEP_N; k++)
        steps += met_value(m, "tandem_step_rows_count", kinds[k]);
    CHECK(steps == total, "step rows %g", steps);
    CHECK(met_value(m, "tandem_spec_accepted_per_step_count", "drafter=\"mtp\"") == total,
          "accepted per step");
    double http = 0;
    for (int e = 0; e < 2; e++)
        for (int code = 200; code < 203; code++) {
            char lab[96];
            snprintf(lab, sizeof lab, "endpoint=\"%s\",code=\"%d\"",
                     e ? "/v1/completions" : "/metrics", code);
            http += met_value(m, "tandem_http_requests_total", lab);
        }
    CHECK(http == total, "http %g", http);
    CHECK(met_value(m, "tandem_engine_steps_total", "") == N_OBS, "engine copy");
    CHECK(met_value(m, "vllm:spec_decode_num_drafts_total", "model_name=\"tiny\"") == 0,
          "proposed_at[0] stays 0");
    CHECK(met_value(m, "tandem_spec_draft_tokens_total", "drafter=\"mtp\"") == 2 * N_OBS,
          "drafted");
    CHECK(rc.renders > 0, "the renderer never ran");
    met_free(m);
    char extra[48];
    snprintf(extra, sizeof extra, "(%d renders)", rc.renders);
    case_end("concurrent_exact", extra);
}

int main(void) {
    checker_rejects_bad_text();
    format_valid("fresh", 0, 0);
    format_valid("busy", 0, 1);
    format_valid("compat", 1, 1);
    families_present();
    buckets_inclusive();
    itl_spread();
    request_counters();
    engine_spec_counters();
    vllm_compat_on_off();
    no_drafter();
    label_escaping();
    http_codes();
    concurrent_exact();
    return check_failures ? 1 : 0;
}
