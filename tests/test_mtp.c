/* test_mtp.c: the engine's MTP drafter against the PyTorch reference (tools/mtp_ref.py).
 *
 *   make build/tests/test_mtp && build/tests/test_mtp
 *
 * Fixtures (tools/make_drafter_fixtures.py, HF + the reference in fp32 on the CPU), each a
 * model (a target with its mtp.0.* layer) and a reference directory (ids.txt, mtp.json,
 * mtp.safetensors):
 *   tiny                models/tandem-tiny and its trained MTP layer; tests/fixtures/mtp_tiny
 *                       (a text prompt);
 *   b_plain_hc2         tests/fixtures/mtp_b_plain_hc2, the random target b_plain_hc2 (HF
 *                       layout, HF config: hc 2, window 16, sigmoid routing, F16 shared experts
 *                       with biases, tied head) + a random MTP layer in upstream names;
 *   c_upstream_sharded  tests/fixtures/mtp_c_upstream_sharded, the random target
 *                       c_upstream_sharded (upstream layout, legacy config: hc 3, window 16,
 *                       YaRN) + a random MTP layer.
 * The random ones have a seeded random prompt longer than the window (the MTP's own sliding
 * window over its rows is exercised) and no near ties in the bonus or the drafts.
 * Four cases per fixture, named with the fixture as a suffix ("mtp/target_bonus[tiny]"): the
 * target's greedy bonus token after the prompt; the MTP catch-up logits over the prompt rows
 * (last 8); a k = 3 greedy chain with recycled streams: its drafts and its last step's logits;
 * the same chain after steps that drafted nothing (the MTP falls behind; the last row's call
 * catches the skipped rows up, keys only, as far as the window reaches): the same drafts and the
 * same last logits, bit for bit. And per fixture an engine-like run of one-token steps (with
 * rejected drafts rolled back) in which a drafter that drafts now and then makes the drafts of
 * one that drafts every step. And per fixture a deferred round (the chain on the backend) of
 * two sequences wanting different k: each gets its own k's drafts, those of the host's chain.
 * The C side runs the same on the CPU: fp32 math against fp32 math, so the budget is
 * max|d| <= 1e-3 * max(1, max|ref row|), and the drafts must be the same tokens. A missing
 * fixture fails (its message names the command that makes it).
 */
#include <jansson.h>
#include <stdint.h>

#include "check.h"
#include "draft/mtp.h"
#include "model/backend.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/state.h"

#define MAX_IDS   64 /* prompt rows: one plan step and one MTP catch-up call */
#define LAST_ROWS 8
#define K         3

struct mtp_fixture {
    const char *name;  /* the case names' suffix */
    const char *model; /* config.json + safetensors with the target and mtp.0.* */
    const char *dir;   /* ids.txt, mtp.json, mtp.safetensors */
    const char *make;  /* the command that writes it */
};

static const struct mtp_fixture fixtures[] = {
    {.name = "tiny",
     .model = "models/tandem-tiny",
     .dir = "tests/fixtures/mtp_tiny",
     .make = "python3 tools/make_drafter_fixtures.py --out tests/fixtures/mtp_tiny"},
    {.name = "b_plain_hc2",
     .model = "tests/fixtures/mtp_b_plain_hc2",
     .dir = "tests/fixtures/mtp_b_plain_hc2",
     .make = "python3 tools/make_drafter_fixtures.py --random b_plain_hc2"},
    {.name = "c_upstream_sharded",
     .model = "tests/fixtures/mtp_c_upstream_sharded",
     .dir = "tests/fixtures/mtp_c_upstream_sharded",
     .make = "python3 tools/make_drafter_fixtures.py --random c_upstream_sharded"},
};

static const char *const case_names[4] = {"mtp/target_bonus", "mtp/catchup_logits_match_reference",
                                          "mtp/chain_k3_matches_reference",
                                          "mtp/lazy_catchup_same_bits"};

/* one fixture loaded: the model, the reference tensors and JSON, the prompt */
struct fx {
    struct td_model m;
    struct st_set ref;
    json_t *js;
    int32_t ids[MAX_IDS];
    int n;
};

static void fx_close(struct fx *f) {
    td_model_free(&f->m);
    st_set_close(&f->ref);
    json_decref(f->js);
    memset(f, 0, sizeof *f);
}

/* the prompt of ids.txt: its length, or -1 when unreadable or not LAST_ROWS..MAX_IDS ids */
static int read_ids(const char *path, int32_t *ids) {
    FILE *fp = fopen(path, "r");
    if (!fp) return -1;
    int n = 0, id;
    while (n <= MAX_IDS && fscanf(fp, "%d", &id) == 1)
        if (n++ < MAX_IDS) ids[n - 1] = id;
    fclose(fp);
    return n >= LAST_ROWS && n <= MAX_IDS ? n : -1;
}

/* 0, or -1 with a message (what is missing or malformed, and the command that makes it) */
static int fx_open(struct fx *f, const struct mtp_fixture *x, char *err, size_t errlen) {
    char path[256], why[512] = "";
    memset(f, 0, sizeof *f);
    json_error_t jerr;
    int rc = 0;
    snprintf(path, sizeof path, "%s/mtp.json", x->dir);
    if (!(f->js = json_load_file(path, 0, &jerr))) {
        snprintf(why, sizeof why, "%s", jerr.text);
        rc = -1;
    }
    snprintf(path, sizeof path, "%s/ids.txt", x->dir);
    if (!rc && (f->n = read_ids(path, f->ids)) < 0) {
        snprintf(why, sizeof why, "%s: unreadable, or not %d..%d ids", path, LAST_ROWS, MAX_IDS);
        rc = -1;
    }
    snprintf(path, sizeof path, "%s/mtp.safetensors", x->dir);
    if (!rc && (td_model_load(&f->m, x->model, why, sizeof why) ||
                st_set_open_file(&f->ref, path, why, sizeof why)))
        rc = -1;
    if (!rc) return 0;
    snprintf(err, errlen, "%s (made by: %s)", why, x->make);
    fx_close(f);
    return -1;
}

static int argmax(const float *x, int n) {
    int a = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[a]) a = i;
    return a;
}

/* the three cases on one fixture */
static void run_fixture(const struct mtp_fixture *x) {
    char err[768], name[4][160], extra[128];
    for (int c = 0; c < 4; c++)
        snprintf(name[c], sizeof name[c], "%s[%s]", case_names[c], x->name);
    struct fx f;
    struct td_state st;
    struct draft_mtp *d = NULL;
    struct td_plan p;
    memset(&st, 0, sizeof st);
    memset(&p, 0, sizeof p);
    case_begin();
    if (fx_open(&f, x, err, sizeof err)) {
        CHECK(0, "%s", err);
        case_end(name[0], "");
        for (int c = 1; c < 4; c++) {
            case_begin();
            CHECK(0, "not run: the fixture did not load");
            case_end(name[c], "");
        }
        return;
    }
    const struct td_backend *b = td_backend_cpu();
    int n = f.n, V = f.m.cfg.vocab;
    int st_ok = !td_state_init(&st, &f.m.cfg, 2, 256, 16, (size_t)1 << 30, b, err, sizeof err);
    CHECK(st_ok, "%s", err);
    if (st_ok)
        CHECK(!draft_mtp_init(&d, &f.m, &f.m, b, 2, 256, MAX_IDS, K, st.swa_ring, 0,
                              (size_t)1 << 30, TD_KV_F32, err, sizeof err),
              "%s", err);
    float *lg = malloc((size_t)n * V * sizeof(float)), *qd = malloc((size_t)K * V * sizeof(float));
    float *want = malloc((size_t)LAST_ROWS * V * sizeof(float));
    int slot = -1, bonus = -1, plan_ok = 0;

    // the target over the prompt: its bonus token, and its final streams for the MTP
    if (!check_case_failed) {
        slot = td_state_seq_alloc(&st);
        struct td_plan_seq q = {.slot = slot, .len_before = 0, .n_new = n, .ids = f.ids};
        struct td_plan_dims dims = td_state_plan_dims(&st, MAX_IDS, 2);
        plan_ok = !meta_plan_init(&p, &dims, err, sizeof err);
        CHECK(plan_ok && !meta_plan_build(&p, &q, 1, err, sizeof err), "%s", err);
    }
    if (!check_case_failed) {
        struct td_forward_io io = {.hidden_out = draft_mtp_hidden(d), .hidden_by_position = 1};
        CHECK(!td_forward_ex(&f.m, &st, &p, &io, lg, NULL, err, sizeof err), "%s", err);
    }
    int ready = !check_case_failed; // the MTP cases run on the C target's streams and bonus
    json_t *jb = json_object_get(f.js, "bonus");
    if (ready) {
        bonus = argmax(lg + (size_t)(n - 1) * V, V);
        CHECK(json_is_integer(jb) && bonus == (int)json_integer_value(jb),
              "target bonus %d, reference %lld", bonus, (long long)json_integer_value(jb));
    }
    case_end(name[0], "");

    int32_t next[MAX_IDS], toks[MAX_IDS + 1], drafts[K];
    if (ready) {
        memcpy(next, f.ids + 1, (size_t)(n - 1) * sizeof(int32_t));
        next[n - 1] = bonus;
        toks[0] = f.ids[0]; // toks[p]: the token at position p
        memcpy(toks + 1, next, (size_t)n * sizeof(int32_t));
    }
    struct td_sampling greedy = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
    // catch-up only: the logits of every prompt row
    case_begin();
    double worst = 0;
    CHECK(ready, "not run: the target pass or the MTP setup failed");
    if (!check_case_failed) {
        draft_mtp_set_all_logits(d, 1);
        struct td_draft_seq r = {.slot = slot,
                                 .pos0 = 0,
                                 .n = n,
                                 .next = next,
                                 .toks = toks,
                                 .k = 0,
                                 .sampling = &greedy,
                                 .drafts = drafts,
                                 .q = qd,
                                 .conf = NULL};
        CHECK(!draft_mtp_run(d, &r, 1, err, sizeof err), "%s", err);
    }
    const struct st_entry *cl = st_set_find(&f.ref, "catchup_logits");
    CHECK(cl && cl->t.ndim == 2 && cl->t.shape[0] == LAST_ROWS && cl->t.shape[1] == V,
          "catchup_logits missing or not [%d, %d]", LAST_ROWS, V);
    if (!check_case_failed) {
        td_tensor_read_f32(&cl->t, 0, (int64_t)LAST_ROWS * V, want);
        worst = rel_row_err(draft_mtp_logits(d) + (size_t)(n - LAST_ROWS) * V, want, LAST_ROWS, V,
                            NULL);
        CHECK(worst <= 1e-3, "catch-up logits off by %.3g relative", worst);
    }
    snprintf(extra, sizeof extra, "(worst %.2e over the last %d of %d rows)", worst, LAST_ROWS, n);
    case_end(name[1], extra);

    // a fresh sequence in the slot: catch up and draft k = 3 greedily (the engine's way: only the
    // last catch-up row meets the head)
    case_begin();
    worst = 0;
    struct td_draft_seq r = {.slot = slot,
                             .pos0 = 0,
                             .n = n,
                             .next = next,
                             .toks = toks,
                             .k = K,
                             .sampling = &greedy,
                             .drafts = drafts,
                             .q = qd,
                             .conf = NULL};
    CHECK(ready, "not run: the target pass or the MTP setup failed");
    if (!check_case_failed) {
        draft_mtp_set_all_logits(d, 0);
        CHECK(!draft_mtp_run(d, &r, 1, err, sizeof err), "%s", err);
        CHECK(r.n_drafts == K, "%d drafts", r.n_drafts);
    }
    json_t *jd = json_object_get(f.js, "drafts");
    CHECK(json_array_size(jd) == K, "mtp.json has %zu drafts, want %d", json_array_size(jd), K);
    for (int j = 0; !check_case_failed && j < K; j++)
        CHECK(drafts[j] == (int)json_integer_value(json_array_get(jd, (size_t)j)),
              "draft %d is %d, reference %lld", j, drafts[j],
              (long long)json_integer_value(json_array_get(jd, (size_t)j)));
    const struct st_entry *ch = st_set_find(&f.ref, "chain_logits");
    CHECK(ch && ch->t.ndim == 2 && ch->t.shape[0] == K && ch->t.shape[1] == V,
          "chain_logits missing or not [%d, %d]", K, V);
    if (!check_case_failed) {
        td_tensor_read_f32(&ch->t, (int64_t)(K - 1) * V, V, want);
        worst = rel_row_err(draft_mtp_logits(d), want, 1, V, NULL);
        CHECK(worst <= 1e-3, "last chain step's logits off by %.3g", worst);
    }
    if (ready && r.n_drafts == K)
        snprintf(extra, sizeof extra, "(drafts %d %d %d, last step worst %.2e)", drafts[0],
                 drafts[1], drafts[2], worst);
    else
        extra[0] = 0;
    case_end(name[2], extra);

    // the same chain after steps that draft nothing (the engine's plain steps), then the last
    // row alone: those steps catch nothing up (the MTP falls behind), and the rows they skipped
    // are caught up, keys only, when the last row drafts; the drafts and the chain's logits must
    // be the whole catch-up's, bit for bit. The random fixtures' window of 16 is shorter than
    // their prompts: there the rows before it are never made (td_state_advance)
    case_begin();
    int32_t drafts3[K];
    memcpy(drafts3, drafts, sizeof drafts3);
    int have3 = !check_case_failed && r.n_drafts == K;
    if (have3) memcpy(want, draft_mtp_logits(d), (size_t)V * sizeof(float));
    CHECK(have3, "not run: the k = 3 chain failed");
    if (!check_case_failed) {
        struct td_draft_seq a = r, c = r;
        a.n = 5, a.k = 0; // a prefill chunk, then plain steps of one row
        CHECK(!draft_mtp_run(d, &a, 1, err, sizeof err), "catch-up that drafts nothing: %s", err);
        for (int p = 5; !check_case_failed && p < n - 1; p++) {
            a.pos0 = p, a.n = 1, a.next = next + p;
            CHECK(!draft_mtp_run(d, &a, 1, err, sizeof err), "plain step at %d: %s", p, err);
        }
        CHECK(a.n_drafts == 0, "a step that drafts nothing drafted %d", a.n_drafts);
        CHECK(draft_mtp_state(d)->len[slot] == 0, "the MTP holds %d rows after them, want 0",
              draft_mtp_state(d)->len[slot]);
        c.pos0 = n - 1, c.n = 1, c.next = next + n - 1;
        CHECK(!check_case_failed && !draft_mtp_run(d, &c, 1, err, sizeof err), "%s", err);
        CHECK(c.n_drafts == K, "%d drafts", c.n_drafts);
        CHECK(draft_mtp_state(d)->len[slot] == n, "the MTP holds %d rows after drafting, want %d",
              draft_mtp_state(d)->len[slot], n);
        for (int j = 0; !check_case_failed && j < K; j++)
            CHECK(drafts[j] == drafts3[j], "draft %d is %d, after the whole catch-up %d", j,
                  drafts[j], drafts3[j]);
        CHECK(!check_case_failed && !memcmp(draft_mtp_logits(d), want, (size_t)V * sizeof(float)),
              "the last chain step's logits differ from the whole catch-up's");
    }
    case_end(name[3], "");

    free(lg);
    free(qd);
    free(want);
    if (plan_ok) meta_plan_free(&p);
    draft_mtp_free(d);
    if (st_ok) td_state_free(&st);
    fx_close(&f);
}

/* One engine-like run of STEPS one-token steps after the prompt (every other one with two
 * rejected drafts after its token), on two targets and two MTP drafters: drafter E drafts k = 3 at
 * every step, drafter L only at the steps of a pattern (falling behind in between, by up to more
 * than the window of the random fixtures, then caught up lazily). Whenever L drafts, its drafts are
 * E's at that step, token for token: a draft is a function of the committed tokens alone. */
#define STEPS 40
static int lazy_step(int i) {
    return i == 2 || i == 3 || i == 9 || (i >= 30 && i % 3 == 0);
}

/* a case on fixture x: its name "mtp/<what>[<fixture>]" in name, begun, and x opened in f;
 * 0, or -1 when the fixture fails to open (the case is then failed and ended) */
static int case_open(struct fx *f, const struct mtp_fixture *x, const char *what, char *name,
                     size_t name_len) {
    char err[768];
    snprintf(name, name_len, "mtp/%s[%s]", what, x->name);
    case_begin();
    if (!fx_open(f, x, err, sizeof err)) return 0;
    CHECK(0, "%s", err);
    case_end(name, "");
    return -1;
}

static void lazy_rounds(const struct mtp_fixture *x) {
    char err[768], name[160];
    struct fx f;
    if (case_open(&f, x, "lazy_rounds_equal_every_round", name, sizeof name)) return;
    const struct td_backend *b = td_backend_cpu();
    int V = f.m.cfg.vocab, n0 = f.n, ok = 1, compared = 0, caught_up = 0;
    struct td_state st[2];
    struct td_plan p[2];
    struct draft_mtp *d[2] = {NULL, NULL};
    memset(st, 0, sizeof st), memset(p, 0, sizeof p);
    int32_t toks[MAX_IDS + STEPS + 2], drafts[2][K];
    float *lg = malloc((size_t)MAX_IDS * V * sizeof(float)), *qd = malloc((size_t)K * V * 4);
    memcpy(toks, f.ids, (size_t)n0 * sizeof(int32_t));
    struct td_sampling greedy = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
    for (int r = 0; r < 2 && ok; r++) {
        ok = !td_state_init(&st[r], &f.m.cfg, 2, 256, 16, (size_t)1 << 30, b, err, sizeof err);
        struct td_plan_dims dims = td_state_plan_dims(&st[r], MAX_IDS, 2);
        ok = ok && !meta_plan_init(&p[r], &dims, err, sizeof err);
        // L's calls take at most 8 rows: its catch-ups of skipped rows come in several calls
        ok = ok && !draft_mtp_init(&d[r], &f.m, &f.m, b, 2, 256, r ? 8 : MAX_IDS, K, st[r].swa_ring,
                                   0, (size_t)1 << 30, TD_KV_F32, err, sizeof err);
        ok = ok && td_state_seq_alloc(&st[r]) == 0;
    }
    CHECK(ok, "%s", err);
    int len = 0;
    for (int i = 0; ok && i <= STEPS; i++) {
        // the prompt, then one token a step; every odd step also feeds two rejected drafts
        // after it (their streams reach the ring, and the target rolls them back)
        int rows = i ? 1 : n0, fed = i % 2 ? 3 : rows;
        int32_t row_ids[MAX_IDS];
        memcpy(row_ids, toks + len, (size_t)rows * sizeof(int32_t));
        for (int j = rows; j < fed; j++)
            row_ids[j] = (int32_t)((7 * i + 13 * j) % V);
        for (int r = 0; r < 2 && ok; r++) {
            struct td_plan_seq q = {.slot = 0, .len_before = len, .n_new = fed, .ids = row_ids};
            struct td_forward_io io = {.hidden_out = draft_mtp_hidden(d[r]),
                                       .hidden_by_position = 1};
            ok = !meta_plan_build(&p[r], &q, 1, err, sizeof err) &&
                 !td_forward_ex(&f.m, &st[r], &p[r], &io, lg, NULL, err, sizeof err) &&
                 !td_state_rollback(&st[r], 0, len + rows, err, sizeof err);
        }
        CHECK(ok, "step %d: %s", i, err);
        if (!ok) break;
        toks[len + rows] = argmax(lg + (size_t)(rows - 1) * V, V); // the next token, greedy
        for (int r = 0; r < 2 && ok; r++) {
            struct td_draft_seq s = {.slot = 0,
                                     .pos0 = len,
                                     .n = rows,
                                     .next = toks + len + 1,
                                     .toks = toks,
                                     .k = r == 0 || lazy_step(i) ? K : 0,
                                     .sampling = &greedy,
                                     .drafts = drafts[r],
                                     .q = qd};
            // the rows it makes up before this step's: those it skipped, within the window of
            // the step's last row (E, drafting every step, none)
            int held = draft_mtp_state(d[r])->len[0], w = f.m.cfg.sliding_window;
            int from = len + rows - w > held ? len + rows - w : held;
            int want_caught = s.k && len > from ? len - from : 0;
            ok = !draft_mtp_run(d[r], &s, 1, err, sizeof err);
            CHECK(ok, "step %d, drafter %s: %s", i, r ? "L" : "E", err);
            CHECK(!ok || s.n_drafts == s.k, "step %d: %d drafts of %d", i, s.n_drafts, s.k);
            CHECK(!ok || s.caught == want_caught, "step %d, drafter %s: caught up %d rows, not %d",
                  i, r ? "L" : "E", s.caught, want_caught);
            if (r && s.caught) caught_up++;
        }
        if (ok && lazy_step(i)) {
            compared++;
            for (int j = 0; j < K; j++)
                CHECK(drafts[1][j] == drafts[0][j],
                      "step %d (position %d): draft %d is %d lazily, %d drafting every step", i,
                      len + rows, j + 1, drafts[1][j], drafts[0][j]);
        }
        len += rows;
    }
    CHECK(caught_up > 0, "the lazy drafter never caught up");
    char extra[96];
    snprintf(extra, sizeof extra, "(%d drafting steps of %d compared, %d caught up)", compared,
             STEPS + 1, caught_up);
    for (int r = 0; r < 2; r++) {
        draft_mtp_free(d[r]);
        meta_plan_free(&p[r]);
        td_state_free(&st[r]);
    }
    free(lg), free(qd);
    fx_close(&f);
    case_end(name, extra);
}

/* two sequences (the prompt, and the prompt less its last 4 ids) drafting k = 1 and 3, then
 * 3 and 2, in one call: a drafter whose greedy rounds are deferred (the chain to the largest k
 * on the backend, each keeping its own k) and one that drafts on the host */
static void deferred_mixed_k(const struct mtp_fixture *x) {
    char err[768], name[160];
    struct fx f;
    if (case_open(&f, x, "deferred_mixed_k", name, sizeof name)) return;
    const struct td_backend *b = td_backend_cpu();
    int V = f.m.cfg.vocab, n[2] = {f.n, f.n - 4}, ok = 1;
    const int want[2][2] = {{1, 3}, {3, 2}};
    struct td_state st[2];
    struct td_plan p[2];
    struct draft_mtp *d[2] = {NULL, NULL};
    memset(st, 0, sizeof st), memset(p, 0, sizeof p);
    int32_t toks[2][MAX_IDS + 1], drafts[2][2][K];
    float *lg = malloc((size_t)2 * MAX_IDS * V * sizeof(float)),
          *qd = malloc((size_t)2 * K * V * 4);
    struct td_sampling greedy = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
    for (int c = 0; c < 2 && ok; c++) {     // each k pair from fresh states
        for (int r = 0; r < 2 && ok; r++) { // r 1: deferred
            ok = !td_state_init(&st[r], &f.m.cfg, 2, 256, 16, (size_t)1 << 30, b, err, sizeof err);
            struct td_plan_dims dims = td_state_plan_dims(&st[r], 2 * MAX_IDS, 2);
            ok = ok && !meta_plan_init(&p[r], &dims, err, sizeof err);
            ok = ok && !draft_mtp_init(&d[r], &f.m, &f.m, b, 2, 256, 2 * MAX_IDS, K, st[r].swa_ring,
                                       0, (size_t)1 << 30, TD_KV_F32, err, sizeof err);
            ok = ok && td_state_seq_alloc(&st[r]) == 0 && td_state_seq_alloc(&st[r]) == 1;
            if (ok) draft_mtp_defer(d[r], r);
            struct td_plan_seq q[2];
            for (int s = 0; s < 2; s++)
                q[s] =
                    (struct td_plan_seq){.slot = s, .len_before = 0, .n_new = n[s], .ids = f.ids};
            struct td_forward_io io = {.hidden_out = draft_mtp_hidden(d[r]),
                                       .hidden_by_position = 1};
            ok = ok && !meta_plan_build(&p[r], q, 2, err, sizeof err) &&
                 !td_forward_ex(&f.m, &st[r], &p[r], &io, lg, NULL, err, sizeof err);
            struct td_draft_seq ds[2];
            for (int s = 0; s < 2 && ok; s++) {
                memcpy(toks[s], f.ids, (size_t)n[s] * sizeof(int32_t));
                toks[s][n[s]] = argmax(lg + (size_t)(p[r].logit_indptr[s + 1] - 1) * V, V);
                ds[s] = (struct td_draft_seq){.slot = s,
                                              .pos0 = 0,
                                              .n = n[s],
                                              .next = toks[s] + 1,
                                              .toks = toks[s],
                                              .k = want[c][s],
                                              .sampling = &greedy,
                                              .drafts = drafts[r][s],
                                              .q = qd + (size_t)s * K * V};
            }
            ok = ok && !draft_mtp_run(d[r], ds, 2, err, sizeof err);
            for (int s = 0; s < 2 && ok; s++) // deferred: the drafts are in backend memory
                CHECK(!ds[s].dev_drafts == !r, "k %d, %d, %s: sequence %d's round %s deferred",
                      want[c][0], want[c][1], r ? "deferred" : "host", s, r ? "not" : "");
            ok = ok && !draft_mtp_collect(d[r], ds, err, sizeof err);
            CHECK(ok, "k %d, %d, %s drafter: %s", want[c][0], want[c][1], r ? "deferred" : "host",
                  err);
            for (int s = 0; s < 2 && ok; s++)
                CHECK(ds[s].n_drafts == want[c][s], "k %d, %d, %s: sequence %d made %d drafts",
                      want[c][0], want[c][1], r ? "deferred" : "host", s, ds[s].n_drafts);
            draft_mtp_free(d[r]), d[r] = NULL;
            meta_plan_free(&p[r]);
            td_state_free(&st[r]);
        }
        for (int s = 0; s < 2 && ok; s++)
            for (int j = 0; j < want[c][s]; j++)
                CHECK(drafts[1][s][j] == drafts[0][s][j],
                      "k %d, %d: sequence %d's draft %d is %d deferred, %d on the host", want[c][0],
                      want[c][1], s, j + 1, drafts[1][s][j], drafts[0][s][j]);
    }
    free(lg), free(qd);
    fx_close(&f);
    case_end(name, "");
}

/* the MTP layer's forward makes its input from the streams before its rows: a call that
 * brings none is refused, with the reason */
static void needs_streams(const struct mtp_fixture *x) {
    char err[768], name[160];
    struct fx f;
    if (case_open(&f, x, "forward_without_streams_refused", name, sizeof name)) return;
    struct td_model mtp;
    struct td_state st;
    int loaded = !td_model_load_mtp(&f.m, &mtp, err, sizeof err);
    CHECK(loaded, "%s", err);
    if (loaded) {
        CHECK(!td_state_init(&st, &mtp.cfg, 1, 64, 16, (size_t)1 << 28, td_backend_cpu(), err,
                             sizeof err),
              "%s", err);
        struct td_plan_seq q = {
            .slot = td_state_seq_alloc(&st), .len_before = 0, .n_new = 4, .ids = f.ids};
        float *lg = malloc((size_t)4 * mtp.cfg.vocab * sizeof(float));
        int rc = td_forward_seqs(&mtp, &st, &q, 1, lg, NULL, err, sizeof err);
        CHECK(rc == -1 && strstr(err, "streams before"), "rc %d: %s", rc, err);
        free(lg);
        td_state_free(&st);
        td_model_free(&mtp);
    }
    fx_close(&f);
    case_end(name, "");
}

int main(void) {
    for (size_t i = 0; i < sizeof fixtures / sizeof *fixtures; i++) {
        run_fixture(&fixtures[i]);
        lazy_rounds(&fixtures[i]);
        deferred_mixed_k(&fixtures[i]);
        if (!i) needs_streams(&fixtures[i]);
    }
    return check_failures ? 1 : 0;
}
