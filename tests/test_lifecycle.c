/* test_lifecycle.c: the engine as an API user drives it: requests submitted and cancelled
 * between steps, failures part-way through a round, extreme request values, tight row budgets.
 *
 *   make build/tests/test_lifecycle && build/tests/test_lifecycle
 *
 * submit_cancel_between_steps/<drafter>/<greedy|sampled>: on tandem-tiny, requests arrive and
 *     are cancelled at random between steps (queued, prefilling and decoding; past the 16th
 *     and 32nd submit), with every drafter. Each request that ran to its end gives the tokens
 *     it gives when every request is submitted up front; a cancelled one a prefix of them. A
 *     message pointer taken early stays readable (the sanitizer run checks every access).
 * nan_after_accepted_drafts/<drafter>/<greedy|sampled>: a non-finite target row at position P
 *     fails the request with exactly the tokens before P, whatever the drafter accepted before
 *     the row in its round (greedy: the very tokens of plain decoding).
 * max_tokens_int_max: max_tokens up to INT_MAX is accepted and ends at the context.
 * every_decode_advances/<drafter>: with a row budget smaller than the drafts wanted, every
 *     decoding request gets its anchor row every step (no head-of-line blocking), and prompts
 *     that wait still get rows.
 * release_many/<drafter>: requests released as they end or while they run; memory held is
 *     only the unreleased ones (a long-running server's).
 * release_last/<drafter>: the one request released while it decodes is freed at once (the last
 *     drafter call named it, and no step is left to collect that call).
 * stop_at/<drafter>: a stop found in committed text cuts the request back, frees its slot; the
 *     others are unchanged; stop token ids end a request at the token.
 * request_stats/<drafter>: per-request counters sum to the engine's; times in order.
 * TD_TEST_BACKEND=cuda runs them on the GPU (deterministic mode). TD_TEST_QUICK=1 (sanitizer
 * run): fewer requests, and the drafters whose rounds outlive a step (mtp, dspark). An argument
 * runs the cases whose names it begins.
 */
#include <limits.h>
#include <stdint.h>

#include "check.h"
#include "engine/engine.h"

#define MODEL   "models/tandem-tiny"
#define N_REQ   40
#define MAX_OUT 32

static int32_t prompts[N_REQ][48];
static int prompt_len[N_REQ], max_tok[N_REQ];

static uint64_t rng_state = 88172645463325252ull;
static uint32_t rnd(uint32_t n) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

static void make_prompts(void) {
    for (int r = 0; r < N_REQ; r++) {
        prompt_len[r] = 2 + (r * 7) % 13;
        max_tok[r] = 3 + (r * 5) % 9;
        for (int i = 0; i < prompt_len[r]; i++) // repeating spans, so ngram finds matches
            prompts[r][i] = (int32_t)(100 + ((i % (2 + r % 5)) * 37 + r * 13) % 4000);
    }
}

static struct td_engine *open_engine(const char *draft, int k, int max_seqs, int budget,
                                     struct td_engine_params *tune) {
    char err[512];
    struct td_engine_params ep = tune ? *tune : td_engine_defaults();
    ep.model_dir = MODEL;
    // TD_TEST_BACKEND=cuda: the same cases on the GPU, batch-invariant (a request's tokens must
    // not depend on what runs beside it, which only deterministic mode promises there)
    const char *bk = getenv("TD_TEST_BACKEND");
    ep.backend = bk ? bk : "cpu";
    ep.deterministic = bk && strcmp(bk, "cpu") != 0;
    ep.draft = draft;
    ep.max_draft = k;
    ep.max_seqs = max_seqs;
    ep.max_batch_tokens = budget;
    ep.max_ctx = 128;
    ep.max_cache_bytes = (size_t)1 << 30;
    struct td_engine *e;
    if (td_engine_init(&e, &ep, err, sizeof err)) {
        case_fail("engine init: %s", err);
        return NULL;
    }
    return e;
}

static int submit(struct td_engine *e, int r, const struct td_sampling *s) {
    char err[256];
    struct td_sampling si = *s;
    si.seed = s->seed + (uint64_t)r;
    struct td_request_params rp = {.prompt = prompts[r],
                                   .n_prompt = prompt_len[r],
                                   .max_tokens = max_tok[r],
                                   .sampling = si,
                                   .ignore_eos = 1};
    int id = td_engine_submit(e, &rp, err, sizeof err);
    if (id < 0) case_fail("submit %d: %s", r, err);
    return id;
}

struct outs {
    int32_t tok[N_REQ][MAX_OUT];
    int n[N_REQ];
    enum td_req_status st[N_REQ];
};

static void collect(struct td_engine *e, const int *ids, int n_req, struct outs *o) {
    for (int r = 0; r < n_req; r++) {
        const int32_t *t;
        td_engine_output(e, ids[r], &t, &o->n[r], &o->st[r], NULL, NULL);
        if (o->n[r] > MAX_OUT) o->n[r] = MAX_OUT;
        memcpy(o->tok[r], t, (size_t)o->n[r] * sizeof(int32_t));
    }
}

static void submit_cancel(const char *draft, int sampled) {
    char name[96], err[512];
    int n_req = quick_mode() ? 18 : N_REQ;
    struct td_sampling s =
        sampled
            ? (struct td_sampling){.temperature = 0.9f, .top_k = 40, .top_p = 0.95f, .seed = 500}
            : (struct td_sampling){.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
    int k = !strcmp(draft, "none") ? 0 : 2;
    static struct outs ref, got;
    int ids[N_REQ], cancelled[N_REQ] = {0}, n_sub = 0, n_cancel = 0, steps = 0, live = 1;
    case_begin();
    // every request up front
    struct td_engine *e = open_engine(draft, k, 8, 256, NULL);
    if (!e) goto done;
    for (int r = 0; r < n_req; r++)
        ids[r] = submit(e, r, &s);
    while (td_engine_step(e, err, sizeof err) > 0) {
    }
    collect(e, ids, n_req, &ref);
    td_engine_free(e);
    // the same requests arriving between steps, some cancelled in whatever state they are in
    if (!(e = open_engine(draft, k, 8, 256, NULL))) goto done;
    rng_state = 88172645463325252ull + (uint64_t)sampled * 7 + strlen(draft);
    const char *early_msg = NULL;
    while ((live > 0 || n_sub < n_req) && steps++ < 20000) {
        for (int j = rnd(4); j > 0 && n_sub < n_req; j--) {
            ids[n_sub] = submit(e, n_sub, &s);
            n_sub++;
        }
        if (n_sub > 0 && rnd(5) == 0) {
            int r = (int)rnd((uint32_t)n_sub);
            enum td_req_status st;
            td_engine_output(e, ids[r], NULL, NULL, &st, NULL, NULL);
            if (st != TD_REQ_FINISHED && st != TD_REQ_FAILED) {
                td_engine_cancel(e, ids[r]);
                cancelled[r] = 1, n_cancel++;
                if (!early_msg) td_engine_output(e, ids[r], NULL, NULL, NULL, NULL, &early_msg);
            }
        }
        if ((live = td_engine_step(e, err, sizeof err)) < 0) {
            case_fail("step: %s", err);
            break;
        }
    }
    collect(e, ids, n_req, &got);
    CHECK(!early_msg || !strcmp(early_msg, "cancelled"), "a cancelled request's message: '%s'",
          early_msg);
    td_engine_free(e);
    for (int r = 0; r < n_req; r++) {
        int prefix = cancelled[r] ? got.n[r] <= ref.n[r] : got.n[r] == ref.n[r];
        CHECK(prefix && !memcmp(got.tok[r], ref.tok[r], (size_t)got.n[r] * sizeof(int32_t)),
              "request %d%s: %d tokens against %d submitted up front", r,
              cancelled[r] ? " (cancelled)" : "", got.n[r], ref.n[r]);
        CHECK(cancelled[r] || got.st[r] == TD_REQ_FINISHED, "request %d status %d", r, got.st[r]);
    }
done:
    snprintf(name, sizeof name, "submit_cancel_between_steps/%s/%s", draft,
             sampled ? "sampled" : "greedy");
    char extra[64];
    snprintf(extra, sizeof extra, "(%d requests, %d cancelled, %d steps)", n_req, n_cancel, steps);
    case_end(name, extra);
}

/* the logits hook: a NaN in request `request`'s row at position `position` */
struct nan_at {
    int request;
    long position;
};
static void nan_hook(void *ctx, int request, long position, float *row, int vocab) {
    const struct nan_at *h = ctx;
    (void)vocab;
    if (request == h->request && position == h->position) row[7] = NAN;
}

static void nan_after_drafts(const char *draft, int sampled) {
    char name[96], err[512];
    struct td_sampling s =
        sampled
            ? (struct td_sampling){.temperature = 0.9f, .top_k = 40, .top_p = 0.95f, .seed = 900}
            : (struct td_sampling){.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
    int k = !strcmp(draft, "dspark") ? 0 : 3;
    static struct outs ref, got;
    int ids[2], r = 1, checked = 0;
    case_begin();
    max_tok[r] = 14;
    struct td_engine *e = open_engine("none", 0, 2, 256, NULL);
    if (!e) goto done;
    for (int i = 0; i < 2; i++)
        ids[i] = submit(e, i, &s);
    while (td_engine_step(e, err, sizeof err) > 0) {
    }
    collect(e, ids, 2, &ref);
    td_engine_free(e);
    // the row at position P predicts the token at P + 1: the tokens at P and before stay
    for (int off = 2; off < 12; off += quick_mode() ? 6 : 3) {
        struct nan_at h = {.request = ids[r], .position = prompt_len[r] + off};
        struct td_engine_params ep = td_engine_defaults();
        ep.logits_hook = nan_hook;
        ep.hook_ctx = &h;
        if (!(e = open_engine(draft, k, 2, 256, &ep))) goto done;
        for (int i = 0; i < 2; i++)
            ids[i] = submit(e, i, &s);
        while (td_engine_step(e, err, sizeof err) > 0) {
        }
        collect(e, ids, 2, &got);
        const char *msg;
        td_engine_output(e, ids[r], NULL, NULL, NULL, NULL, &msg);
        long want = h.position - prompt_len[r] + 1;
        char pos[48];
        snprintf(pos, sizeof pos, "position %ld", h.position + 1);
        CHECK(got.st[r] == TD_REQ_FAILED && strstr(msg, pos), "NaN at %ld: status %d, '%s'",
              h.position, got.st[r], msg);
        CHECK(got.n[r] == want, "NaN at %ld: %d tokens kept, plain decoding keeps %ld", h.position,
              got.n[r], want);
        if (!sampled)
            CHECK(!memcmp(got.tok[r], ref.tok[r], (size_t)got.n[r] * sizeof(int32_t)),
                  "NaN at %ld: the kept tokens are not plain decoding's", h.position);
        CHECK(sampled || (got.n[0] == ref.n[0] && !memcmp(got.tok[0], ref.tok[0], 4 * ref.n[0])),
              "the other request changed");
        CHECK(td_engine_stats(e)->nan_rows == 1, "nan_rows %ld", td_engine_stats(e)->nan_rows);
        td_engine_free(e);
        checked++;
    }
done:
    max_tok[r] = 3 + (r * 5) % 9;
    snprintf(name, sizeof name, "nan_after_accepted_drafts/%s/%s", draft,
             sampled ? "sampled" : "greedy");
    char extra[48];
    snprintf(extra, sizeof extra, "(%d positions)", checked);
    case_end(name, extra);
}

static void max_tokens_int_max(void) {
    char err[512];
    case_begin();
    struct td_engine *e = open_engine("ngram", 3, 2, 256, NULL);
    if (e) {
        struct td_sampling g = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
        int ids[2];
        for (int i = 0; i < 2; i++) {
            struct td_request_params rp = {.prompt = prompts[i],
                                           .n_prompt = prompt_len[i],
                                           .max_tokens = INT_MAX - 3 * i,
                                           .sampling = g,
                                           .ignore_eos = 1};
            ids[i] = td_engine_submit(e, &rp, err, sizeof err);
            CHECK(ids[i] >= 0, "max_tokens %d refused: %s", INT_MAX - 3 * i, err);
        }
        while (td_engine_step(e, err, sizeof err) > 0) {
        }
        for (int i = 0; i < 2; i++) {
            int n;
            enum td_finish why;
            if (ids[i] < 0) continue;
            td_engine_output(e, ids[i], NULL, &n, NULL, &why, NULL);
            CHECK(why == TD_FINISH_CONTEXT && prompt_len[i] + n == 129,
                  "request %d: finish %d after %d tokens (context 128)", i, why, n);
        }
        td_engine_free(e);
    }
    case_end("max_tokens_int_max", "");
}

/* a row budget of 1 + k for 4 sequences drafting k tokens each, greedy (random drafts: rarely
 * accepted; DSpark's: often) */
static void every_decode_advances(const char *draft, int k) {
    char name[96], err[512];
    case_begin();
    int n_req = 6, ids[6], prev[6] = {0}, starved = 0, waited = 0, steps = 0;
    struct td_engine *e = open_engine(draft, k, 4, 1 + k, NULL);
    if (!e) goto done;
    struct td_sampling g = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
    for (int r = 0; r < n_req; r++)
        max_tok[r] = 16;
    for (int r = 0; r < n_req; r++)
        ids[r] = submit(e, r, &g);
    for (int live = 1; live > 0 && steps < 5000; steps++) {
        enum td_req_status before[6];
        for (int r = 0; r < n_req; r++)
            td_engine_output(e, ids[r], NULL, NULL, &before[r], NULL, NULL);
        if ((live = td_engine_step(e, err, sizeof err)) < 0) {
            case_fail("step: %s", err);
            break;
        }
        for (int r = 0; r < n_req; r++) {
            int n;
            td_engine_output(e, ids[r], NULL, &n, NULL, NULL, NULL);
            if (before[r] == TD_REQ_DECODE && n == prev[r]) starved++;
            if (before[r] == TD_REQ_PREFILL) waited++;
            prev[r] = n;
        }
    }
    CHECK(starved == 0, "%d times a decoding request got no row in its step", starved);
    static struct outs spec, plain_out;
    collect(e, ids, n_req, &spec);
    td_engine_free(e);
    // and the run takes about the steps of no drafter (prompts then get every row the anchors
    // leave, with drafts competing at least half of them: before anchors came first, the
    // youngest requests waited behind the oldest ones' drafts, 3.5x the steps)
    if (!(e = open_engine("none", 0, 4, 1 + k, NULL))) goto done;
    for (int r = 0; r < n_req; r++)
        ids[r] = submit(e, r, &g);
    int plain = 0;
    while (td_engine_step(e, err, sizeof err) > 0)
        plain++;
    collect(e, ids, n_req, &plain_out);
    td_engine_free(e);
    // drafts cut short by the budget (a deferred round's too) are still verified losslessly
    for (int r = 0; r < n_req; r++)
        CHECK(spec.n[r] == plain_out.n[r] &&
                  !memcmp(spec.tok[r], plain_out.tok[r], (size_t)spec.n[r] * sizeof(int32_t)),
              "request %d differs from plain decoding", r);
    CHECK(2 * steps <= 3 * plain, "%d steps with %s drafts, %d without a drafter", steps, draft,
          plain);
done:
    for (int r = 0; r < n_req; r++)
        max_tok[r] = 3 + (r * 5) % 9;
    snprintf(name, sizeof name, "every_decode_advances/%s", draft);
    char extra[80];
    snprintf(extra, sizeof extra, "(%d steps, %d request-steps waiting to prefill)", steps, waited);
    case_end(name, extra);
}

/* release_many/<drafter>: requests keep arriving; each is released as soon as it ends, and some
 * while they still run (queued, prefilling, decoding: with MTP and DSpark a released request may
 * still be held by the drafter's deferred round). Every finished one gives its up-front output,
 * a released id is unknown, and the engine holds only the requests not yet released. */
static void release_many(const char *draft) {
    char name[96], err[512];
    struct td_sampling g = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
    int k = !strcmp(draft, "none") ? 0 : 2, total = quick_mode() ? 80 : 200;
    static struct outs ref;
    int ids[N_REQ], held_max = 0, released_running = 0, checked = 0, done_n = 0;
    case_begin();
    struct td_engine *e = open_engine(draft, k, 8, 256, NULL);
    if (!e) goto done;
    for (int r = 0; r < N_REQ; r++)
        ids[r] = submit(e, r, &g);
    while (td_engine_step(e, err, sizeof err) > 0) {
    }
    collect(e, ids, N_REQ, &ref);
    td_engine_free(e);
    if (!(e = open_engine(draft, k, 8, 256, NULL))) goto done;
    rng_state = 1234567 + strlen(draft);
    int live_ids[64], live_r[64], n_live = 0, n_sub = 0;
    for (int steps = 0; (n_sub < total || n_live) && steps < 100000; steps++) {
        while (n_sub < total && n_live < 24 && rnd(3)) {
            int r = n_sub % N_REQ;
            live_r[n_live] = r;
            live_ids[n_live++] = submit(e, r, &g);
            n_sub++;
        }
        if (td_engine_step(e, err, sizeof err) < 0) {
            case_fail("step: %s", err);
            break;
        }
        for (int i = 0; i < n_live; i++) {
            const int32_t *t;
            int n;
            enum td_req_status st;
            td_engine_output(e, live_ids[i], &t, &n, &st, NULL, NULL);
            int ended = st == TD_REQ_FINISHED || st == TD_REQ_FAILED;
            if (!ended && rnd(40)) continue;
            if (ended) {
                int r = live_r[i];
                CHECK(n == ref.n[r] && !memcmp(t, ref.tok[r], (size_t)n * sizeof(int32_t)),
                      "request %d (prompt %d) differs from its up-front output", live_ids[i], r);
                checked++;
            } else {
                released_running++;
            }
            td_engine_release(e, live_ids[i]);
            CHECK(td_engine_output(e, live_ids[i], NULL, NULL, NULL, NULL, NULL) == -1,
                  "released id %d still known", live_ids[i]);
            done_n++;
            live_ids[i] = live_ids[n_live - 1], live_r[i] = live_r[n_live - 1];
            n_live--, i--;
        }
        struct td_engine_load ld;
        td_engine_load(e, &ld);
        if (ld.requests_held > held_max) held_max = ld.requests_held;
        CHECK(ld.requests_held <= n_live + 64, "%d requests held, %d not released",
              ld.requests_held, n_live);
    }
    struct td_engine_load ld;
    td_engine_load(e, &ld);
    CHECK(ld.requests_held == 0 && ld.slots_busy == 0 && ld.queued == 0,
          "at the end %d requests held, %d slots busy, %d queued", ld.requests_held, ld.slots_busy,
          ld.queued);
    CHECK(done_n == total, "%d of %d requests released", done_n, total);
    td_engine_free(e);
done:
    snprintf(name, sizeof name, "release_many/%s", draft);
    char extra[96];
    snprintf(extra, sizeof extra, "(%d requests, %d released while running, at most %d held)",
             total, released_running, held_max);
    case_end(name, extra);
}

/* release_last/<drafter>: the one request, released while it decodes (the last drafter call
 * names it), is freed there and then: with nothing left to step for, no step would */
static void release_last(const char *draft) {
    char name[96], err[512];
    struct td_sampling g = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
    case_begin();
    struct td_engine *e = open_engine(draft, 3, 2, 256, NULL);
    if (!e) goto done;
    int id = submit(e, 20, &g); // (a prompt of 10 ids, 11 tokens out)
    int n = 0, steps = 0;
    enum td_req_status st = TD_REQ_QUEUED;
    while (steps++ < 64 && n < 2 && td_engine_step(e, err, sizeof err) > 0)
        td_engine_output(e, id, NULL, &n, &st, NULL, NULL);
    CHECK(n >= 2 && st == TD_REQ_DECODE, "not decoding after %d steps: %d tokens", steps, n);
    td_engine_release(e, id);
    struct td_engine_load ld;
    td_engine_load(e, &ld);
    CHECK(ld.requests_held == 0 && ld.slots_busy == 0, "released: %d requests held, %d slots busy",
          ld.requests_held, ld.slots_busy);
    // and the engine takes the next one as usual
    id = submit(e, 21, &g);
    while (td_engine_step(e, err, sizeof err) > 0) {
    }
    td_engine_output(e, id, NULL, &n, &st, NULL, NULL);
    CHECK(st == TD_REQ_FINISHED && n == max_tok[21], "the next request: %d tokens of %d", n,
          max_tok[21]);
    td_engine_free(e);
done:
    snprintf(name, sizeof name, "release_last/%s", draft);
    case_end(name, "");
}

/* stop_at/<drafter>: a stop string found after a step that committed several tokens ends the
 * request at the cut (its tokens are the first n_keep of its full output), frees its slot at
 * once, and the requests beside it and after it give their own outputs */
static void stop_at(const char *draft) {
    char name[96], err[512];
    struct td_sampling g = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
    int k = !strcmp(draft, "none") ? 0 : 3;
    static struct outs ref, got;
    int ids[4], cut_seen = 0, stopped = 0;
    case_begin();
    for (int r = 0; r < 4; r++)
        max_tok[r] = 20;
    struct td_engine *e = open_engine(draft, k, 4, 256, NULL);
    if (!e) goto done;
    for (int r = 0; r < 4; r++)
        ids[r] = submit(e, r, &g);
    while (td_engine_step(e, err, sizeof err) > 0) {
    }
    collect(e, ids, 4, &ref);
    td_engine_free(e);
    if (!(e = open_engine(draft, k, 4, 256, NULL))) goto done;
    for (int r = 0; r < 3; r++)
        ids[r] = submit(e, r, &g);
    int after = -1;
    for (int steps = 0; steps < 1000; steps++) {
        int live = td_engine_step(e, err, sizeof err);
        int n;
        enum td_req_status st;
        td_engine_output(e, ids[1], NULL, &n, &st, NULL, NULL);
        if (!stopped && n >= 6) { // cut back into what the last step committed
            int keep = n - 2;
            struct td_engine_load before, now_l;
            td_engine_load(e, &before);
            CHECK(td_engine_stop_at(e, ids[1], keep) == 0, "stop_at refused");
            CHECK(td_engine_stop_at(e, ids[1], keep + 1) == -1, "stop_at past the tokens taken");
            td_engine_load(e, &now_l);
            CHECK(now_l.slots_busy == before.slots_busy - (st == TD_REQ_DECODE),
                  "slots busy %d -> %d", before.slots_busy, now_l.slots_busy);
            stopped = keep;
            cut_seen = n;
            ids[3] = submit(e, 3, &g); // a request after the cut reuses the slot
            after = 3;
        }
        if (live <= 0 && stopped) break;
    }
    while (td_engine_step(e, err, sizeof err) > 0) {
    }
    collect(e, ids, 4, &got);
    enum td_finish why;
    td_engine_output(e, ids[1], NULL, NULL, NULL, &why, NULL);
    CHECK(stopped && got.n[1] == stopped && why == TD_FINISH_STOP,
          "stopped request: %d tokens (cut at %d), finish %d", got.n[1], stopped, why);
    CHECK(!memcmp(got.tok[1], ref.tok[1], (size_t)got.n[1] * sizeof(int32_t)),
          "the kept tokens are not its output's first");
    for (int r = 0; r < 4; r++)
        if (r != 1)
            CHECK(got.n[r] == ref.n[r] &&
                      !memcmp(got.tok[r], ref.tok[r], (size_t)got.n[r] * sizeof(int32_t)),
                  "request %d changed", r);
    CHECK(after == 3, "no request after the cut");
    // stop ids: a token of request 0's output ends it there, the token kept (as EOS is)
    int32_t stop_tok = ref.tok[0][4];
    int first = 0;
    while (ref.tok[0][first] != stop_tok)
        first++;
    struct td_request_params rp = {.prompt = prompts[0],
                                   .n_prompt = prompt_len[0],
                                   .max_tokens = max_tok[0],
                                   .sampling = g,
                                   .ignore_eos = 1,
                                   .stop_ids = &stop_tok,
                                   .n_stop_ids = 1};
    int id = td_engine_submit(e, &rp, err, sizeof err);
    while (td_engine_step(e, err, sizeof err) > 0) {
    }
    const int32_t *t;
    int n;
    td_engine_output(e, id, &t, &n, NULL, &why, NULL);
    CHECK(n == first + 1 && why == TD_FINISH_STOP && !memcmp(t, ref.tok[0], 4 * (size_t)n),
          "stop id %d: %d tokens (want %d), finish %d", stop_tok, n, first + 1, why);
    td_engine_free(e);
done:
    for (int r = 0; r < 4; r++)
        max_tok[r] = 3 + (r * 5) % 9;
    snprintf(name, sizeof name, "stop_at/%s", draft);
    char extra[64];
    snprintf(extra, sizeof extra, "(cut %d tokens to %d)", cut_seen, stopped);
    case_end(name, extra);
}

/* request_stats/<drafter>: each request's own counters add up to the engine's, and its times
 * are in order */
static void request_stats(const char *draft) {
    char name[96], err[512];
    struct td_sampling g = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
    int ids[12];
    case_begin();
    struct td_engine *e = open_engine(draft, !strcmp(draft, "none") ? 0 : 3, 4, 256, NULL);
    if (!e) goto done;
    for (int r = 0; r < 12; r++)
        ids[r] = submit(e, r, &g);
    while (td_engine_step(e, err, sizeof err) > 0) {
    }
    long drafted = 0, accepted = 0, rounds = 0, at[TD_MAX_DRAFT] = {0};
    for (int r = 0; r < 12; r++) {
        struct td_request_stats rs;
        CHECK(td_engine_request_stats(e, ids[r], &rs) == 0, "no stats");
        drafted += rs.drafted, accepted += rs.accepted, rounds += rs.rounds;
        for (int j = 0; j < TD_MAX_DRAFT; j++)
            at[j] += rs.accepted_at[j];
        CHECK(rs.t_submit > 0 && rs.t_submit <= rs.t_admit && rs.t_admit <= rs.t_first &&
                  rs.t_first <= rs.t_end,
              "request %d: times %.6f %.6f %.6f %.6f out of order", r, rs.t_submit, rs.t_admit,
              rs.t_first, rs.t_end);
    }
    const struct td_engine_stats *s = td_engine_stats(e);
    CHECK(drafted == s->drafted && accepted == s->accepted && rounds == s->rounds,
          "requests' sums %ld/%ld/%ld, engine %ld/%ld/%ld", drafted, accepted, rounds, s->drafted,
          s->accepted, s->rounds);
    for (int j = 0; j < TD_MAX_DRAFT; j++)
        CHECK(at[j] == s->accepted_at[j], "position %d: %ld vs %ld", j, at[j], s->accepted_at[j]);
    long hist = 0, hist_acc = 0;
    for (int j = 0; j <= TD_MAX_DRAFT; j++)
        hist += s->accepted_hist[j], hist_acc += j * s->accepted_hist[j];
    CHECK(hist_acc == s->accepted && hist <= s->rounds, "accepted histogram %ld/%ld", hist_acc,
          hist);
    CHECK(td_engine_request_stats(e, 999, &(struct td_request_stats){0}) == -1, "unknown id");
    td_engine_free(e);
done:
    snprintf(name, sizeof name, "request_stats/%s", draft);
    case_end(name, "");
}

/* argv[1], when given: run only the cases whose name begins with it */
static int wanted(int argc, char **argv, const char *name) {
    return argc < 2 || !strncmp(name, argv[1], strlen(argv[1]));
}

int main(int argc, char **argv) {
    make_prompts();
    // the sanitizer run (quick) keeps the drafters whose rounds outlive a step
    const char *drafters[5] = {"none", "ngram", "random", "mtp", "dspark"};
    int quick = quick_mode();
    for (int d = quick ? 3 : 0; d < 5 && wanted(argc, argv, "submit_cancel"); d++)
        for (int sampled = 0; sampled < 2; sampled++)
            submit_cancel(drafters[d], sampled);
    for (int d = quick ? 3 : 1; d < 5 && wanted(argc, argv, "nan_after"); d++)
        for (int sampled = 0; sampled < 2 - quick; sampled++)
            nan_after_drafts(drafters[d], sampled);
    if (wanted(argc, argv, "max_tokens")) max_tokens_int_max();
    if (wanted(argc, argv, "every_decode")) {
        if (!quick) every_decode_advances("random", 3);
        every_decode_advances("dspark", 5);
    }
    for (int d = quick ? 3 : 0; d < 5 && wanted(argc, argv, "release_many"); d += quick ? 1 : 4)
        release_many(drafters[d]);
    for (int d = 3; d < 5 && wanted(argc, argv, "release_last"); d++)
        release_last(drafters[d]);
    for (int d = quick ? 3 : 0; d < 5 && wanted(argc, argv, "stop_at"); d++)
        stop_at(drafters[d]);
    for (int d = 0; d < 5 && wanted(argc, argv, "request_stats"); d += 2)
        request_stats(drafters[d]);
    return check_failures ? 1 : 0;
}
