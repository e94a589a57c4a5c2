/* test_dspark.c: the engine's DSpark drafter against the PyTorch reference (tools/dspark_ref.py).
 *
 *   make build/tests/test_dspark && build/tests/test_dspark
 *
 * Fixtures (tools/make_dspark_fixtures.py): tests/fixtures/dspark_b (a random drafter over the
 * random target b_plain_hc2: hc 2, window 16, sigmoid routing, shared-expert biases, capture
 * layers 0 and 2, 2 stages, block 4), tests/fixtures/dspark_c (a random drafter over the
 * upstream-layout target c_upstream_sharded: hc 3, capture layers 1-3, 3 stages, block 6, rank
 * 16) and tests/fixtures/dspark_tiny (tandem-tiny's trained drafter), each with a context shorter
 * than the window and one that wraps the rings. The C side runs the target over the case's ids on
 * the CPU (its captured rows feed the drafter, as in the engine), inserts them as a step
 * (draft_dspark_insert_step), and runs a round:
 *   base logits U of the block        max|d| <= 1e-3 * max(1, max|ref row|) (fp32 vs fp32)
 *   greedy drafts                      the same tokens; confidences within 1e-4
 *   a sampled chain (T = 1, forced)    q = softmax(Z_ref) within 1e-5 per entry; confidences
 * Also: a round stores nothing (the committed length stays), rows inserted in pieces give the
 * same round as all at once, a confidence threshold cuts before the first slot under it, a
 * sequence drafted in a batch, its step carrying rows its verify rejected, drafts as it does
 * alone, and a prefill then a verify step with rejected rows give the same round as the
 * committed rows alone.
 */
#include <jansson.h>
#include <math.h>
#include <stdint.h>

#include "check.h"
#include "draft/dspark.h"
#include "model/backend.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/state.h"
#include "metadata/plan.h"

struct fx {
    const char *dir;
    struct td_model m;
    struct st_set ref;
    json_t *js;
};

static int ids_of(json_t *c, int32_t *ids, int cap) {
    json_t *a = json_object_get(c, "ids");
    int n = 0;
    for (size_t i = 0; i < json_array_size(a) && n < cap; i++)
        ids[n++] = (int32_t)json_integer_value(json_array_get(a, i));
    return n;
}

/* the target over ids (one sequence, one call) with the drafter's capture layers: logits of the
 * last row into last[V], captured rows into the drafter's capture buffer */
static int target_pass(const struct td_model *m, struct draft_dspark *d, const int32_t *ids, int n,
                       float *last, char *err, size_t errlen) {
    struct td_state st;
    if (td_state_init(&st, &m->cfg, 1, n + 1, n > 16 ? n : 16, (size_t)1 << 30, td_backend_cpu(),
                      err, errlen))
        return -1;
    float *lg = malloc((size_t)n * m->cfg.vocab * sizeof(float));
    struct td_forward_io io = {.capture = draft_dspark_capture(d)};
    io.capture_layers = draft_dspark_capture_layers(d, &io.n_capture);
    struct td_plan_seq q = {
        .slot = td_state_seq_alloc(&st), .len_before = 0, .n_new = n, .ids = ids};
    int rc = td_forward_seqs_io(m, &st, &q, 1, &io, lg, err, errlen);
    if (!rc) memcpy(last, lg + (size_t)(n - 1) * m->cfg.vocab, m->cfg.vocab * sizeof(float));
    free(lg);
    td_state_free(&st);
    return rc;
}

static int argmax(const float *x, int n) {
    int a = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[a]) a = i;
    return a;
}

/* a sequence's next tokens for a call over rows pos0 .. pos0 + n - 1 of ids: the token after
 * each row, the last one the round's anchor (into buf, [n]) */
static const int32_t *next_of(int32_t *buf, const int32_t *ids, int pos0, int n, int32_t anchor) {
    for (int i = 0; i + 1 < n; i++)
        buf[i] = ids[pos0 + 1 + i];
    buf[n - 1] = anchor;
    return buf;
}

/* a drafter on the CPU backend for up to max_seqs sequences (512 positions and rows, no graphs),
 * or NULL with the message in err */
static struct draft_dspark *cpu_drafter(const char *ddir, const struct td_model *m, int max_seqs,
                                        float threshold, char *err, size_t errlen) {
    struct draft_dspark *d = NULL;
    if (draft_dspark_init(&d, ddir, m, m, td_backend_cpu(), max_seqs, 512, 512, threshold, 0,
                          (size_t)1 << 30, err, errlen))
        return NULL;
    return d;
}

/* a target step's rows into the drafter as the engine puts them (draft_dspark_insert_step):
 * seqs in the order of their rows in the capture buffer, from row 0 */
static int step_insert(struct draft_dspark *d, const struct td_plan_seq *seqs, int n_seq, char *err,
                       size_t errlen) {
    struct td_plan p;
    struct td_plan_dims pd = td_state_plan_dims(draft_dspark_state(d), 512, 2);
    if (meta_plan_init(&p, &pd, err, errlen)) return -1;
    int rc = meta_plan_build(&p, seqs, n_seq, err, errlen) ||
             draft_dspark_insert_step(d, &p, err, errlen);
    meta_plan_free(&p);
    return rc ? -1 : 0;
}

static int32_t zeros[1100]; /* token ids of inserted rows (never read) */

/* two sequences drafted in one call, the second one's step carrying two rows past its
 * committed ones (rejected by its verify), give the second the same greedy drafts and
 * confidences, bit for bit, as drafting it alone (the CPU ops are batch-invariant) */
static void batch_equals_alone(struct fx *f, const char *ddir, const int32_t *ids, int n) {
    char err[512], name[160];
    case_begin();
    const struct td_model *m = &f->m;
    int V = m->cfg.vocab, nA = n / 2, nB = n;
    struct draft_dspark *d2 = cpu_drafter(ddir, m, 2, 0.0f, err, sizeof err);
    struct draft_dspark *d1 = d2 ? cpu_drafter(ddir, m, 1, 0.0f, err, sizeof err) : NULL;
    CHECK(d1 && d2, "%s", err);
    if (d1 && d2) {
        const struct dspark_config *dc = draft_dspark_config(d2);
        int g = dc->block;
        size_t CW = (size_t)dc->n_capture * m->cfg.dim, row = CW * sizeof(float);
        float *last = malloc((size_t)V * sizeof(float));
        float *rows = malloc((size_t)(nA + nB + 2) * row);
        // the step's captured rows: A's, then B's, then B's two rejected rows of noise
        CHECK(!target_pass(m, d2, ids, nA, last, err, sizeof err), "%s", err);
        memcpy(rows, draft_dspark_capture(d2), (size_t)nA * row);
        int aA = argmax(last, V);
        CHECK(!target_pass(m, d2, ids, nB, last, err, sizeof err), "%s", err);
        memcpy(rows + (size_t)nA * CW, draft_dspark_capture(d2), (size_t)nB * row);
        int aB = argmax(last, V);
        for (size_t i = 0; i < 2 * CW; i++)
            rows[(size_t)(nA + nB) * CW + i] = (float)(i % 7) - 3.0f;
        memcpy(draft_dspark_capture(d2), rows, (size_t)(nA + nB + 2) * row);
        memcpy(draft_dspark_capture(d1), rows + (size_t)nA * CW, (size_t)nB * row);
        struct td_plan_seq step2[2] = {{.slot = 0, .len_before = 0, .n_new = nA, .ids = zeros},
                                       {.slot = 1, .len_before = 0, .n_new = nB + 2, .ids = zeros}};
        struct td_plan_seq step1 = {.slot = 0, .len_before = 0, .n_new = nB, .ids = zeros};
        CHECK(!check_case_failed && !step_insert(d2, step2, 2, err, sizeof err) &&
                  !step_insert(d1, &step1, 1, err, sizeof err),
              "%s", err);
        struct td_sampling greedy = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
        int32_t dA[DSPARK_MAX_BLOCK], dB[DSPARK_MAX_BLOCK], d1B[DSPARK_MAX_BLOCK];
        float cA[DSPARK_MAX_BLOCK], cBf[DSPARK_MAX_BLOCK], c1B[DSPARK_MAX_BLOCK];
        float *q = malloc((size_t)g * V * sizeof(float));
        int32_t nxA[1024], nxB[1024];
        struct td_draft_seq two[2] = {{.slot = 0,
                                       .pos0 = 0,
                                       .n = nA,
                                       .row = 0,
                                       .next = next_of(nxA, ids, 0, nA, aA),
                                       .k = g,
                                       .sampling = &greedy,
                                       .drafts = dA,
                                       .q = q,
                                       .conf = cA},
                                      {.slot = 1,
                                       .pos0 = 0,
                                       .n = nB,
                                       .row = nA,
                                       .next = next_of(nxB, ids, 0, nB, aB),
                                       .k = g,
                                       .sampling = &greedy,
                                       .drafts = dB,
                                       .q = q,
                                       .conf = cBf}};
        struct td_draft_seq one = {.slot = 0,
                                   .pos0 = 0,
                                   .n = nB,
                                   .row = 0,
                                   .next = nxB,
                                   .k = g,
                                   .sampling = &greedy,
                                   .drafts = d1B,
                                   .q = q,
                                   .conf = c1B};
        CHECK(!check_case_failed && !draft_dspark_run(d2, two, 2, err, sizeof err), "%s", err);
        CHECK(!check_case_failed && !draft_dspark_run(d1, &one, 1, err, sizeof err), "%s", err);
        CHECK(two[1].n_drafts == one.n_drafts, "%d drafts in the batch, %d alone", two[1].n_drafts,
              one.n_drafts);
        for (int j = 0; j < one.n_drafts && !check_case_failed; j++)
            CHECK(dB[j] == d1B[j] && cBf[j] == c1B[j],
                  "slot %d: draft %d (confidence %.7f) in the batch, %d (%.7f) alone", j, dB[j],
                  cBf[j], d1B[j], c1B[j]);
        free(last), free(rows), free(q);
    }
    draft_dspark_free(d1);
    draft_dspark_free(d2);
    snprintf(name, sizeof name, "dspark/%s/batch_with_rejected_rows_equals_alone",
             f->dir + strlen("tests/fixtures/"));
    case_end(name, "");
}

/* the engine's way: each step's rows go in at once (draft_dspark_insert_step), the verify's
 * rejected ones with them, and the round's run moves the length back. A prefill of n - 3 rows,
 * then a verify step of 6 rows whose first 3 are committed (the context's last rows) and whose
 * last 3 are rejected (noise), against one drafter given the n committed rows alone: the same
 * base logits, drafts and confidences, bit for bit (the rejected rows lie at positions the
 * block never reads, ring rows apart from the window's) */
static void step_insert_equals_committed(struct fx *f, const char *ddir, const int32_t *ids, int n,
                                         int anchor) {
    char err[512], name[160];
    case_begin();
    const struct td_model *m = &f->m;
    int V = m->cfg.vocab, pre = n - 3;
    struct draft_dspark *dA = cpu_drafter(ddir, m, 1, 0.0f, err, sizeof err);
    struct draft_dspark *dB = dA ? cpu_drafter(ddir, m, 1, 0.0f, err, sizeof err) : NULL;
    CHECK(dA && dB, "%s", err);
    if (dA && dB) {
        const struct dspark_config *dc = draft_dspark_config(dA);
        int g = dc->block;
        size_t CW = (size_t)dc->n_capture * m->cfg.dim;
        float *last = malloc((size_t)V * sizeof(float)), *q = malloc((size_t)g * V * sizeof(float));
        float *uB = malloc((size_t)g * V * sizeof(float));
        struct td_sampling greedy = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
        int32_t nx[1024], dAd[DSPARK_MAX_BLOCK], dBd[DSPARK_MAX_BLOCK];
        float cA[DSPARK_MAX_BLOCK], cB[DSPARK_MAX_BLOCK];
        next_of(nx, ids, 0, n, anchor);
        CHECK(!target_pass(m, dB, ids, n, last, err, sizeof err), "%s", err);
        struct td_plan_seq all = {.slot = 0, .len_before = 0, .n_new = n, .ids = zeros};
        CHECK(!check_case_failed && !step_insert(dB, &all, 1, err, sizeof err), "%s", err);
        struct td_draft_seq sB = {.slot = 0,
                                  .pos0 = 0,
                                  .n = n,
                                  .row = 0,
                                  .next = nx,
                                  .k = g,
                                  .sampling = &greedy,
                                  .drafts = dBd,
                                  .q = q,
                                  .conf = cB};
        CHECK(!check_case_failed && !draft_dspark_run(dB, &sB, 1, err, sizeof err), "%s", err);
        if (!check_case_failed)
            memcpy(uB, draft_dspark_base_logits(dB), (size_t)g * V * sizeof(float));
        CHECK(!check_case_failed && !target_pass(m, dA, ids, n, last, err, sizeof err), "%s", err);
        // the prefill step: rows 0 .. pre - 1, all committed
        struct td_plan_seq ps = {.slot = 0, .len_before = 0, .n_new = pre, .ids = zeros};
        struct td_draft_seq s0 = {.slot = 0,
                                  .pos0 = 0,
                                  .n = pre,
                                  .row = 0,
                                  .next = nx,
                                  .k = 0,
                                  .sampling = &greedy,
                                  .drafts = dAd,
                                  .q = q,
                                  .conf = cA};
        CHECK(!check_case_failed && !step_insert(dA, &ps, 1, err, sizeof err) &&
                  !draft_dspark_run(dA, &s0, 1, err, sizeof err),
              "%s", err);
        // the verify step: the context's last 3 rows, then 3 rejected rows of noise
        float *cap = draft_dspark_capture(dA);
        memmove(cap, cap + (size_t)pre * CW, 3 * CW * sizeof(float));
        for (size_t i = 0; i < 3 * CW; i++)
            cap[3 * CW + i] = (float)(i % 5) - 2.0f;
        ps = (struct td_plan_seq){.slot = 0, .len_before = pre, .n_new = 6, .ids = zeros};
        struct td_draft_seq s1 = {.slot = 0,
                                  .pos0 = pre,
                                  .n = 3,
                                  .row = 0,
                                  .next = nx + pre,
                                  .k = g,
                                  .sampling = &greedy,
                                  .drafts = dAd,
                                  .q = q,
                                  .conf = cA};
        CHECK(!check_case_failed && !step_insert(dA, &ps, 1, err, sizeof err), "%s", err);
        CHECK(!check_case_failed && draft_dspark_state(dA)->len[0] == n + 3,
              "the step's insertion left length %d, not %d", draft_dspark_state(dA)->len[0], n + 3);
        CHECK(!check_case_failed && !draft_dspark_run(dA, &s1, 1, err, sizeof err), "%s", err);
        CHECK(!check_case_failed && draft_dspark_state(dA)->len[0] == n,
              "the round left length %d, not the committed %d", draft_dspark_state(dA)->len[0], n);
        CHECK(!check_case_failed && s1.n_drafts == sB.n_drafts, "%d drafts, committed rows only %d",
              s1.n_drafts, sB.n_drafts);
        for (int j = 0; j < s1.n_drafts && !check_case_failed; j++)
            CHECK(dAd[j] == dBd[j] && cA[j] == cB[j],
                  "slot %d: draft %d (confidence %.7f), committed rows only %d (%.7f)", j, dAd[j],
                  cA[j], dBd[j], cB[j]);
        if (!check_case_failed)
            CHECK(!memcmp(draft_dspark_base_logits(dA), uB, (size_t)g * V * sizeof(float)),
                  "the base logits differ");
        free(last), free(q), free(uB);
    }
    draft_dspark_free(dA);
    draft_dspark_free(dB);
    snprintf(name, sizeof name, "dspark/%s/step_insertion_with_rejected_rows_equals_committed",
             f->dir + strlen("tests/fixtures/"));
    case_end(name, "");
}

static void run_fixture(const char *dir) {
    char err[512], path[512], name[160], extra[160];
    struct fx f;
    memset(&f, 0, sizeof f);
    f.dir = dir;
    case_begin();
    snprintf(path, sizeof path, "%s/dspark.json", dir);
    f.js = json_load_file(path, 0, NULL);
    const char *model = json_string_value(json_object_get(f.js, "model"));
    snprintf(path, sizeof path, "%s/dspark.safetensors", dir);
    CHECK(f.js && model, "%s/dspark.json unreadable", dir);
    if (check_case_failed || td_model_load(&f.m, model, err, sizeof err) ||
        st_set_open_file(&f.ref, path, err, sizeof err)) {
        CHECK(0, "%s: %s", dir, err);
        case_end(dir, "");
        json_decref(f.js);
        return;
    }
    const char *ddir = strstr(dir, "dspark_tiny") ? "models/tandem-tiny/dspark" : NULL;
    char dpath[512];
    snprintf(dpath, sizeof dpath, "%s/dspark", dir);
    struct draft_dspark *d = cpu_drafter(ddir ? ddir : dpath, &f.m, 2, 0.0f, err, sizeof err);
    CHECK(d, "%s", err);
    snprintf(name, sizeof name, "dspark/%s/init", dir + strlen("tests/fixtures/"));
    case_end(name, "");
    if (!d) {
        td_model_free(&f.m);
        st_set_close(&f.ref);
        json_decref(f.js);
        return;
    }
    const struct dspark_config *dc = draft_dspark_config(d);
    int V = f.m.cfg.vocab, g = dc->block;
    float *last = malloc((size_t)V * sizeof(float)), *q = malloc((size_t)g * V * sizeof(float));
    float *want = malloc((size_t)g * V * sizeof(float)), conf[DSPARK_MAX_BLOCK];
    int32_t ids[1024], drafts[DSPARK_MAX_BLOCK];
    struct td_sampling greedy = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0},
                       t1 = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = 3};
    json_t *cases = json_object_get(f.js, "cases");
    const char *cname;
    json_t *c;
    json_object_foreach(cases, cname, c) {
        int n = ids_of(c, ids, 1024),
            anchor = (int)json_integer_value(json_object_get(c, "anchor"));
        // the target's anchor, then a greedy round
        case_begin();
        CHECK(!target_pass(&f.m, d, ids, n, last, err, sizeof err), "%s", err);
        CHECK(argmax(last, V) == anchor, "target anchor %d, reference %d", argmax(last, V), anchor);
        int32_t nx[1024];
        struct td_draft_seq s = {.slot = 0,
                                 .pos0 = 0,
                                 .n = n,
                                 .row = 0,
                                 .next = next_of(nx, ids, 0, n, anchor),
                                 .k = g,
                                 .sampling = &greedy,
                                 .drafts = drafts,
                                 .q = q,
                                 .conf = conf};
        struct td_plan_seq all = {.slot = 0, .len_before = 0, .n_new = n, .ids = zeros};
        CHECK(!check_case_failed && !step_insert(d, &all, 1, err, sizeof err) &&
                  !draft_dspark_run(d, &s, 1, err, sizeof err),
              "%s", err);
        snprintf(path, sizeof path, "%s_U", cname);
        const struct st_entry *u = st_set_find(&f.ref, path);
        CHECK(u && u->t.shape[0] == g && u->t.shape[1] == V, "%s missing", path);
        double worst = 0;
        if (!check_case_failed) {
            td_tensor_read_f32(&u->t, 0, (int64_t)g * V, want);
            worst = rel_row_err(draft_dspark_base_logits(d), want, g, V, NULL);
            CHECK(worst <= 1e-3, "base logits off by %.3g relative", worst);
            json_t *gd = json_object_get(c, "greedy_drafts"),
                   *gc = json_object_get(c, "greedy_conf");
            CHECK(s.n_drafts == g, "%d greedy drafts of %d", s.n_drafts, g);
            for (int j = 0; j < s.n_drafts; j++) {
                CHECK(drafts[j] == (int)json_integer_value(json_array_get(gd, (size_t)j)),
                      "greedy draft %d is %d, reference %lld", j, drafts[j],
                      (long long)json_integer_value(json_array_get(gd, (size_t)j)));
                double cr = json_real_value(json_array_get(gc, (size_t)j));
                CHECK(fabs(conf[j] - cr) <= 1e-4, "confidence %d: %.6f, reference %.6f", j, conf[j],
                      cr);
            }
        }
        struct td_plan_seq again = {.slot = 0, .len_before = 1, .n_new = n - 1, .ids = zeros};
        CHECK(step_insert(d, &again, 1, err, sizeof err) && strstr(err, "holds"),
              "rows inserted again at position 1 passed (a round must store nothing, and the "
              "drafter's length is the target's)");
        snprintf(name, sizeof name, "dspark/%s/%s_greedy_round_matches_reference",
                 dir + strlen("tests/fixtures/"), cname);
        snprintf(extra, sizeof extra, "(%d context rows, U worst %.2e)", n, worst);
        case_end(name, extra);

        // the sampled chain of the reference, forced: q and confidences; the context inserted
        // in two steps (the engine inserts a step's rows at a time), each step's rows from
        // capture row 0
        case_begin();
        json_t *chj = json_object_get(c, "chain"), *cc = json_object_get(c, "chain_conf");
        int32_t chain[DSPARK_MAX_BLOCK];
        for (int j = 0; j < g; j++)
            chain[j] = (int32_t)json_integer_value(json_array_get(chj, (size_t)j));
        int cut = n / 3 + 1;
        struct td_draft_seq s1 = {.slot = 0,
                                  .pos0 = 0,
                                  .n = cut,
                                  .row = 0,
                                  .next = nx,
                                  .k = 0,
                                  .sampling = &t1,
                                  .drafts = drafts,
                                  .q = q,
                                  .conf = conf};
        struct td_plan_seq p1 = {.slot = 0, .len_before = 0, .n_new = cut, .ids = zeros},
                           p2 = {.slot = 0, .len_before = cut, .n_new = n - cut, .ids = zeros};
        CHECK(!step_insert(d, &p1, 1, err, sizeof err) &&
                  !draft_dspark_run(d, &s1, 1, err, sizeof err),
              "%s", err);
        size_t CW = (size_t)dc->n_capture * f.m.cfg.dim;
        float *cap = draft_dspark_capture(d);
        memmove(cap, cap + (size_t)cut * CW, (size_t)(n - cut) * CW * sizeof(float));
        draft_dspark_force_chain(d, chain);
        struct td_draft_seq s2 = {.slot = 0,
                                  .pos0 = cut,
                                  .n = n - cut,
                                  .row = 0,
                                  .next = nx + cut,
                                  .k = g,
                                  .sampling = &t1,
                                  .drafts = drafts,
                                  .q = q,
                                  .conf = conf};
        CHECK(!step_insert(d, &p2, 1, err, sizeof err) &&
                  !draft_dspark_run(d, &s2, 1, err, sizeof err),
              "%s", err);
        draft_dspark_force_chain(d, NULL);
        snprintf(path, sizeof path, "%s_Z", cname);
        const struct st_entry *z = st_set_find(&f.ref, path);
        CHECK(z && s2.n_drafts == g, "%s missing or %d drafts", path, s2.n_drafts);
        double qerr = 0;
        if (!check_case_failed) {
            td_tensor_read_f32(&z->t, 0, (int64_t)g * V, want);
            for (int j = 0; j < g; j++) {
                float *zr = want + (size_t)j * V;
                double mx = zr[0], sum = 0;
                for (int v = 1; v < V; v++)
                    mx = zr[v] > mx ? zr[v] : mx;
                for (int v = 0; v < V; v++)
                    sum += exp(zr[v] - mx);
                for (int v = 0; v < V; v++) {
                    double e = fabs(q[(size_t)j * V + v] - exp(zr[v] - mx) / sum);
                    qerr = e > qerr ? e : qerr;
                }
                double cr = json_real_value(json_array_get(cc, (size_t)j));
                CHECK(fabs(conf[j] - cr) <= 1e-4, "chain confidence %d: %.6f, reference %.6f", j,
                      conf[j], cr);
                CHECK(drafts[j] == chain[j], "forced draft %d is %d", j, drafts[j]);
            }
            CHECK(qerr <= 1e-5, "q off by %.3g", qerr);
        }
        snprintf(name, sizeof name, "dspark/%s/%s_sampled_chain_q_matches_reference",
                 dir + strlen("tests/fixtures/"), cname);
        snprintf(extra, sizeof extra, "(q worst %.2e, context inserted as %d + %d rows)", qerr, cut,
                 n - cut);
        case_end(name, extra);

        // a threshold between two slots' confidences cuts before the first slot under it
        case_begin();
        float c2[DSPARK_MAX_BLOCK], th = conf[1] + 1e-3f;
        memcpy(c2, conf, sizeof c2);
        int want_n = 0; // the first slot under the threshold, from this chain's confidences
        while (want_n < g && c2[want_n] >= th)
            want_n++;
        struct draft_dspark *dt = cpu_drafter(ddir ? ddir : dpath, &f.m, 1, th, err, sizeof err);
        CHECK(dt, "%s", err);
        if (dt) {
            CHECK(!target_pass(&f.m, dt, ids, n, last, err, sizeof err), "%s", err);
            draft_dspark_force_chain(dt, chain);
            struct td_draft_seq s3 = {.slot = 0,
                                      .pos0 = 0,
                                      .n = n,
                                      .row = 0,
                                      .next = nx,
                                      .k = g,
                                      .sampling = &t1,
                                      .drafts = drafts,
                                      .q = q,
                                      .conf = conf};
            struct td_plan_seq all = {.slot = 0, .len_before = 0, .n_new = n, .ids = zeros};
            CHECK(!step_insert(dt, &all, 1, err, sizeof err) &&
                      !draft_dspark_run(dt, &s3, 1, err, sizeof err),
                  "%s", err);
            CHECK(s3.n_drafts == want_n, "threshold %.4f: %d drafts, expected %d", th, s3.n_drafts,
                  want_n);
            draft_dspark_free(dt);
        }
        snprintf(name, sizeof name, "dspark/%s/%s_threshold_cuts_before_first_low_slot",
                 dir + strlen("tests/fixtures/"), cname);
        case_end(name, "");
        if (!strcmp(cname, "long")) {
            batch_equals_alone(&f, ddir ? ddir : dpath, ids, n);
            step_insert_equals_committed(&f, ddir ? ddir : dpath, ids, n, anchor);
        }
    }
    free(last);
    free(q);
    free(want);
    draft_dspark_free(d);
    td_model_free(&f.m);
    st_set_close(&f.ref);
    json_decref(f.js);
}

int main(void) {
    run_fixture("tests/fixtures/dspark_b");
    run_fixture("tests/fixtures/dspark_c");
    run_fixture("tests/fixtures/dspark_tiny");
    return check_failures ? 1 : 0;
}
