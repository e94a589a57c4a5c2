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
 * Embedded (tests/embed_dspark.h: each fixture's head moved into its target's own files, as
 * V4-Flash-0731 and the -DSpark releases carry it, with the dspark_* keys in the target's
 * config.json): the same config (the stage count from the mtp.<s> prefixes), and bit for bit the
 * same target logits, base logits, drafts and confidences as the folder's; each way the
 * embedded head can be wrong (a stage tensor missing, mis-shaped, of another dtype or extra, an
 * MTP tensor beside it, a stage skipped, keys incomplete, out of range or against the tensors,
 * a compressed stage, keys without stages and stages without keys, MTP asked of it) refused
 * with the tensor or key named, expected and stored dtype and shape; stages quantized as the
 * release quantizes them draft bit for bit as their F32 decode.
 */
#include <jansson.h>
#include <math.h>
#include <stdint.h>

#include "check.h"
#include "draft/dspark.h"
#include "embed_dspark.h"
#include "kernels/quant.h"
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

/* a drafter on the CPU backend for up to max_seqs sequences (512 positions and rows, no graphs;
 * the target's captured rows kept by position in a ring of its window + 16 rows, as the
 * engine's target keeps them), or NULL with the message in err */
static struct draft_dspark *cpu_drafter(const char *ddir, const struct td_model *m, int max_seqs,
                                        float threshold, char *err, size_t errlen) {
    struct draft_dspark *d = NULL;
    int window = m->cfg.sliding_window < 512 ? m->cfg.sliding_window : 512;
    if (draft_dspark_init(&d, ddir, m, m, td_backend_cpu(), max_seqs, 512, 512, window + 16,
                          threshold, 0, (size_t)1 << 30, TD_KV_F32, err, errlen))
        return NULL;
    return d;
}

/* a target step's rows into the drafter as the engine puts them: the step's captured rows
 * (seqs in the order of their rows in the capture buffer, from row 0) kept by position, as the
 * target's forward keeps them (td_forward_io.capture_ring), then the step's insertion
 * (draft_dspark_insert_step: the rows of the sequences that drafted in the last run) */
static int step_insert(struct draft_dspark *d, const struct td_plan_seq *seqs, int n_seq, char *err,
                       size_t errlen) {
    int R, dim = draft_dspark_state(d)->cfg->dim;
    size_t CW = (size_t)draft_dspark_config(d)->n_capture * dim;
    float *ring = draft_dspark_ring(d, &R), *cap = draft_dspark_capture(d);
    for (int s = 0, t = 0; s < n_seq; s++)
        for (int j = 0; j < seqs[s].n_new; j++, t++)
            memcpy(ring + ((size_t)seqs[s].slot * R + (seqs[s].len_before + j) % R) * CW,
                   cap + (size_t)t * CW, CW * sizeof(float));
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
        const struct td_dspark_cfg *dc = draft_dspark_config(d2);
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
                                       .next = next_of(nxA, ids, 0, nA, aA),
                                       .k = g,
                                       .sampling = &greedy,
                                       .drafts = dA,
                                       .q = q,
                                       .conf = cA},
                                      {.slot = 1,
                                       .pos0 = 0,
                                       .n = nB,
                                       .next = next_of(nxB, ids, 0, nB, aB),
                                       .k = g,
                                       .sampling = &greedy,
                                       .drafts = dB,
                                       .q = q,
                                       .conf = cBf}};
        struct td_draft_seq one = {.slot = 0,
                                   .pos0 = 0,
                                   .n = nB,
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
        const struct td_dspark_cfg *dc = draft_dspark_config(dA);
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
        // the prefill step: rows 0 .. pre - 1, all committed; its round drafts (so that the
        // next step's rows go in with the step)
        struct td_plan_seq ps = {.slot = 0, .len_before = 0, .n_new = pre, .ids = zeros};
        struct td_draft_seq s0 = {.slot = 0,
                                  .pos0 = 0,
                                  .n = pre,
                                  .next = nx,
                                  .k = 1,
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

/* An engine-like run over the case's ids: a prefill, then steps that each feed the committed
 * end's row and k draft rows (rows of the target's own run; the drafts past the accepted ones
 * noise, rejected), of which 1 + a are committed, a cycling 0 .. k. Drafter E drafts every
 * round (its step's rows go in with the step); drafter L drafts only now and then (the first
 * rounds, every fifth from step 48, the last ones), falling behind in between by more than its
 * window (it is then caught up from the rows kept by
 * position). Whenever L drafts, its drafts, confidences and base logits are E's, bit for bit. */
static void lazy_rounds_equal_every_round(struct fx *f, const char *ddir, const int32_t *ids,
                                          int n) {
    char err[512], name[160], extra[96];
    case_begin();
    const struct td_model *m = &f->m;
    int V = m->cfg.vocab;
    struct draft_dspark *dE = cpu_drafter(ddir, m, 1, 0.0f, err, sizeof err);
    struct draft_dspark *dL = dE ? cpu_drafter(ddir, m, 1, 0.0f, err, sizeof err) : NULL;
    CHECK(dE && dL, "%s", err);
    int rounds = 0, lazy = 0, caught = 0;
    if (dE && dL) {
        const struct td_dspark_cfg *dc = draft_dspark_config(dE);
        int g = dc->block, W = draft_dspark_state(dE)->window, pre = 5;
        size_t CW = (size_t)dc->n_capture * m->cfg.dim, row = CW * sizeof(float);
        float *last = malloc((size_t)V * sizeof(float)), *q = malloc((size_t)g * V * sizeof(float));
        float *all = malloc((size_t)n * row), *uE = malloc((size_t)g * V * sizeof(float));
        int32_t nx[1024], dEd[DSPARK_MAX_BLOCK], dLd[DSPARK_MAX_BLOCK];
        float cE[DSPARK_MAX_BLOCK], cL[DSPARK_MAX_BLOCK];
        struct td_sampling greedy = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
        // the target's captured rows of every position (its rows do not depend on later ones)
        CHECK(!target_pass(m, dE, ids, n, last, err, sizeof err), "%s", err);
        if (!check_case_failed) memcpy(all, draft_dspark_capture(dE), (size_t)n * row);
        next_of(nx, ids, 0, n - 1, ids[n - 1]);
        // steps: pos0, the rows fed (committed ones first), the rows committed
        int pos0 = 0, fed = pre, kept = pre, step = 0;
        while (!check_case_failed && pos0 + kept < n) {
            for (int r = 0; r < fed; r++) { // the step's captured rows: real, then noise
                float *dst = draft_dspark_capture(dE) + (size_t)r * CW;
                if (r < kept)
                    memcpy(dst, all + (size_t)(pos0 + r) * CW, row);
                else
                    for (size_t i = 0; i < CW; i++)
                        dst[i] = (float)((i + r) % 7) - 3.0f;
            }
            memcpy(draft_dspark_capture(dL), draft_dspark_capture(dE), (size_t)fed * row);
            struct td_plan_seq ps = {.slot = 0, .len_before = pos0, .n_new = fed, .ids = zeros};
            CHECK(!step_insert(dE, &ps, 1, err, sizeof err) &&
                      !step_insert(dL, &ps, 1, err, sizeof err),
                  "step %d: %s", step, err);
            int end = pos0 + kept, k = end + g < n ? g : 0; // (an anchor beyond the ids: none)
            int lk = k && (step < 2 || (step >= 48 && step % 5 == 0) || end + 3 * g >= n) ? k : 0;
            if (lk && draft_dspark_state(dL)->len[0] < end - W) caught++;
            struct td_draft_seq sE = {.slot = 0,
                                      .pos0 = pos0,
                                      .n = kept,
                                      .next = nx + pos0,
                                      .k = k,
                                      .sampling = &greedy,
                                      .drafts = dEd,
                                      .q = q,
                                      .conf = cE},
                                sL = sE;
            sL.k = lk, sL.drafts = dLd, sL.conf = cL;
            // the context rows each makes up: E none once it drafts every round (its steps
            // insert them, their rejected rows too: then it holds more than the committed end),
            // L those its window reaches that it skipped
            int heldE = draft_dspark_state(dE)->len[0], heldL = draft_dspark_state(dL)->len[0];
            int wantE = k && heldE < end ? end - (end - W > heldE ? end - W : heldE) : 0;
            int wantL = lk && heldL < end ? end - (end - W > heldL ? end - W : heldL) : 0;
            int behindL = draft_rows_behind(draft_dspark_state(dL), 0, end); // (what it prices)
            CHECK(!check_case_failed && !draft_dspark_run(dE, &sE, 1, err, sizeof err), "%s", err);
            CHECK(check_case_failed || sE.caught == wantE, "step %d: E caught up %d rows, not %d",
                  step, sE.caught, wantE);
            CHECK(check_case_failed || !step || !k || sE.caught == 0,
                  "step %d: E, drafting every round, caught up %d rows", step, sE.caught);
            if (k && !check_case_failed)
                memcpy(uE, draft_dspark_base_logits(dE), (size_t)g * V * sizeof(float));
            CHECK(!check_case_failed && !draft_dspark_run(dL, &sL, 1, err, sizeof err), "%s", err);
            CHECK(check_case_failed || sL.caught == wantL, "step %d: L caught up %d rows, not %d",
                  step, sL.caught, wantL);
            CHECK(check_case_failed || !lk || sL.caught == behindL,
                  "step %d: L caught up %d rows, draft_rows_behind said %d", step, sL.caught,
                  behindL);
            if (lk && !check_case_failed) {
                CHECK(sL.n_drafts == sE.n_drafts, "step %d: %d drafts, every round %d", step,
                      sL.n_drafts, sE.n_drafts);
                for (int j = 0; j < sL.n_drafts && !check_case_failed; j++)
                    CHECK(dLd[j] == dEd[j] && cL[j] == cE[j],
                          "step %d slot %d: draft %d (%.7f), every round %d (%.7f)", step, j,
                          dLd[j], cL[j], dEd[j], cE[j]);
                CHECK(!check_case_failed &&
                          !memcmp(draft_dspark_base_logits(dL), uE, (size_t)g * V * sizeof(float)),
                      "step %d: the base logits differ", step);
                CHECK(draft_dspark_state(dL)->len[0] == end, "step %d: length %d, committed %d",
                      step, draft_dspark_state(dL)->len[0], end);
                rounds++;
            } else if (!check_case_failed) {
                lazy += draft_dspark_state(dL)->len[0] < end;
            }
            // the next step: the committed end's row and g - 1 drafts, 1 + a of them kept
            pos0 = end, fed = g, kept = 1 + step % g, step++;
            if (pos0 + fed > n) fed = n - pos0;
            if (kept > fed) kept = fed;
        }
        CHECK(!check_case_failed && rounds >= 3 && lazy >= 3 && caught >= 1,
              "%d rounds compared, %d steps behind, %d catch-ups past the window of %d", rounds,
              lazy, caught, W);
        free(last), free(q), free(all), free(uE);
    }
    draft_dspark_free(dE);
    draft_dspark_free(dL);
    snprintf(name, sizeof name, "dspark/%s/lazy_rounds_equal_every_round",
             f->dir + strlen("tests/fixtures/"));
    snprintf(extra, sizeof extra,
             "(%d rounds compared, %d steps behind, %d catch-ups past the window)", rounds, lazy,
             caught);
    case_end(name, extra);
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
    const struct td_dspark_cfg *dc = draft_dspark_config(d);
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

        // the sampled chain of the reference, forced: q and confidences; the context arriving
        // in two steps, each step's rows from capture row 0: the first caught up by a round
        // that drafts one token, the second inserted with its step (the sequence drafted)
        case_begin();
        json_t *chj = json_object_get(c, "chain"), *cc = json_object_get(c, "chain_conf");
        int32_t chain[DSPARK_MAX_BLOCK];
        for (int j = 0; j < g; j++)
            chain[j] = (int32_t)json_integer_value(json_array_get(chj, (size_t)j));
        int cut = n / 3 + 1;
        struct td_draft_seq s1 = {.slot = 0,
                                  .pos0 = 0,
                                  .n = cut,
                                  .next = nx,
                                  .k = 1,
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
                                  .next = nx + cut,
                                  .k = g,
                                  .sampling = &t1,
                                  .drafts = drafts,
                                  .q = q,
                                  .conf = conf};
        CHECK(!check_case_failed && !step_insert(d, &p2, 1, err, sizeof err), "%s", err);
        CHECK(!check_case_failed && draft_dspark_state(d)->len[0] == n,
              "the second step's rows were not inserted with it (length %d, not %d)",
              draft_dspark_state(d)->len[0], n);
        CHECK(!check_case_failed && !draft_dspark_run(d, &s2, 1, err, sizeof err), "%s", err);
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
        snprintf(extra, sizeof extra,
                 "(q worst %.2e, context caught up (%d rows), then %d inserted)", qerr, cut,
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
            lazy_rounds_equal_every_round(&f, ddir ? ddir : dpath, ids, n);
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

// ---------------------------------------------------------------------------------------------
// a checkpoint that carries its head in its own files (tests/embed_dspark.h)

static char root[64]; /* the cases' checkpoints */

/* the target over ids, its rows into d and a greedy round: its drafts, confidences and base
 * logits (into u [block, V]), the target's last logits into last. The drafts made, or -1 */
static int greedy_round(const struct td_model *m, struct draft_dspark *d, const int32_t *ids, int n,
                        float *last, int32_t *drafts, float *conf, float *u, char *err,
                        size_t errlen) {
    int V = m->cfg.vocab, g = draft_dspark_config(d)->block;
    float *q = malloc((size_t)g * V * sizeof(float));
    struct td_sampling greedy = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
    int32_t nx[1024];
    int rc = -1;
    if (q && !target_pass(m, d, ids, n, last, err, errlen)) {
        struct td_draft_seq s = {.slot = 0,
                                 .pos0 = 0,
                                 .n = n,
                                 .next = next_of(nx, ids, 0, n, argmax(last, V)),
                                 .k = g,
                                 .sampling = &greedy,
                                 .drafts = drafts,
                                 .q = q,
                                 .conf = conf};
        struct td_plan_seq all = {.slot = 0, .len_before = 0, .n_new = n, .ids = zeros};
        if (!step_insert(d, &all, 1, err, errlen) && !draft_dspark_run(d, &s, 1, err, errlen)) {
            memcpy(u, draft_dspark_base_logits(d), (size_t)g * V * sizeof(float));
            rc = s.n_drafts;
        }
    }
    free(q);
    return rc;
}

/* the same fixture's head, in a folder and in the checkpoint's own files, drafts the same: the
 * stage count from the prefixes, the config from the target's config.json, and bit for bit the
 * target's logits, the block's base logits, the drafts and the confidences of a greedy round
 * over the long case */
static void embedded_equals_folder(const char *dir) {
    char err[1024] = "", path[512], out[160], name[160], folder[512];
    const char *fx = dir + strlen("tests/fixtures/");
    case_begin();
    snprintf(path, sizeof path, "%s/dspark.json", dir);
    json_t *js = json_load_file(path, 0, NULL);
    const char *model = json_string_value(json_object_get(js, "model"));
    snprintf(folder, sizeof folder, "%s/dspark", strstr(dir, "dspark_tiny") ? model : dir);
    snprintf(out, sizeof out, "%s/embedded_%s", root, fx);
    int32_t ids[1024];
    int n = ids_of(json_object_get(json_object_get(js, "cases"), "long"), ids, 1024);
    struct td_model a = {0}, b = {0};
    struct draft_dspark *da = NULL, *db = NULL;
    CHECK(model && n > 0, "%s unreadable", path);
    CHECK(!check_case_failed &&
              !embed_dspark(out, model, folder, NULL, 0, NULL, NULL, err, sizeof err),
          "%s", err);
    CHECK(!check_case_failed && !td_model_load(&a, model, err, sizeof err) &&
              !td_model_load(&b, out, err, sizeof err),
          "%s", err);
    CHECK(!check_case_failed && td_model_own_drafter(&b) == TD_OWN_DSPARK,
          "the checkpoint's own head is not seen (%d)", td_model_own_drafter(&b));
    if (!check_case_failed) {
        da = cpu_drafter(folder, &a, 1, 0.0f, err, sizeof err);
        db = da ? cpu_drafter(NULL, &b, 1, 0.0f, err, sizeof err) : NULL;
    }
    CHECK(!check_case_failed && da && db, "%s", err);
    if (da && db) {
        const struct td_dspark_cfg *ca = draft_dspark_config(da), *cb = draft_dspark_config(db);
        int same = ca->block == cb->block && ca->noise == cb->noise && ca->rank == cb->rank &&
                   ca->n_stages == cb->n_stages && ca->n_capture == cb->n_capture &&
                   !memcmp(ca->capture, cb->capture, sizeof ca->capture);
        CHECK(same, "config: block %d/%d, noise %d/%d, rank %d/%d, stages %d/%d, capture %d/%d",
              ca->block, cb->block, ca->noise, cb->noise, ca->rank, cb->rank, ca->n_stages,
              cb->n_stages, ca->n_capture, cb->n_capture);
        int V = a.cfg.vocab, g = ca->block;
        float *la = malloc((size_t)V * sizeof(float)), *lb = malloc((size_t)V * sizeof(float));
        float *ua = malloc((size_t)g * V * sizeof(float)),
              *ub = malloc((size_t)g * V * sizeof(float));
        int32_t xa[DSPARK_MAX_BLOCK], xb[DSPARK_MAX_BLOCK];
        float fa[DSPARK_MAX_BLOCK], fb[DSPARK_MAX_BLOCK];
        int na = greedy_round(&a, da, ids, n, la, xa, fa, ua, err, sizeof err);
        int nb = na < 0 ? -1 : greedy_round(&b, db, ids, n, lb, xb, fb, ub, err, sizeof err);
        CHECK(na > 0 && nb >= 0, "%s", err);
        CHECK(check_case_failed || na == nb, "%d drafts from the folder, %d embedded", na, nb);
        CHECK(check_case_failed || !memcmp(la, lb, (size_t)V * sizeof(float)),
              "the target's logits differ");
        CHECK(check_case_failed || !memcmp(ua, ub, (size_t)g * V * sizeof(float)),
              "the base logits differ");
        for (int j = 0; !check_case_failed && j < na; j++)
            CHECK(xa[j] == xb[j] && fa[j] == fb[j],
                  "slot %d: draft %d (confidence %.7f) from the folder, %d (%.7f) embedded", j,
                  xa[j], fa[j], xb[j], fb[j]);
        free(la), free(lb), free(ua), free(ub);
    }
    draft_dspark_free(da);
    draft_dspark_free(db);
    td_model_free(&a);
    td_model_free(&b);
    json_decref(js);
    snprintf(name, sizeof name, "dspark/%s/embedded_head_drafts_as_its_folder", fx);
    case_end(name, "");
}

/* the c fixture (upstream layout, 3 stages) made into a checkpoint with its head embedded */
static const char *const c_target = "tests/fixtures/c_upstream_sharded",
                         *const c_folder = "tests/fixtures/dspark_c/dspark";

/* a checkpoint made from the c fixture with the stages t[n] (NULL: the folder's) and its config
 * patched, loaded on the CPU with its own drafter: 0 (*m and *d held), -1 with the message of
 * whichever step refused it, -2 when it could not be made */
static int embedded_drafter(const char *out, const struct st_tensor *t, int n, const char *patch,
                            const char *del, struct td_model *m, struct draft_dspark **d, char *err,
                            size_t errlen) {
    *d = NULL;
    if (embed_dspark(out, c_target, c_folder, t, n, patch, del, err, errlen)) return -2;
    if (td_model_load(m, out, err, errlen)) return -1;
    if (!(*d = cpu_drafter(NULL, m, 1, 0.0f, err, errlen))) {
        td_model_free(m);
        return -1;
    }
    return 0;
}

/* the checkpoint must be refused with w1 (and w2) in the message */
static void refuses(const char *name, const struct st_tensor *t, int n, const char *patch,
                    const char *del, const char *w1, const char *w2) {
    char err[1024] = "", out[160], full[160];
    static int k;
    snprintf(out, sizeof out, "%s/refuse%d", root, k++);
    struct td_model m;
    struct draft_dspark *d;
    case_begin();
    int rc = embedded_drafter(out, t, n, patch, del, &m, &d, err, sizeof err);
    CHECK(rc != -2, "cannot make the checkpoint: %s", err);
    CHECK(rc != 0, "loaded, expected a refusal naming '%s'", w1);
    CHECK(strstr(err, w1) && (!w2 || strstr(err, w2)), "message '%s' lacks '%s' / '%s'", err, w1,
          w2 ? w2 : "");
    if (getenv("TD_TEST_VERBOSE")) printf("  %s\n", err);
    if (!rc) {
        draft_dspark_free(d);
        td_model_free(&m);
    }
    snprintf(full, sizeof full, "dspark/embedded/refuses_%s", name);
    case_end(full, "");
}

static int find(const struct st_tensor *t, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(t[i].name, name)) return i;
    return -1;
}

/* every way an embedded head can be wrong is refused, by name; each case edits a fresh list of
 * the folder's tensors (views into ds) */
static void embedded_refusals(void) {
    char err[512];
    struct st_set ds;
    int n = 0, i;
    struct st_tensor *t = embed_list(&ds, c_folder, 4, &n, err, sizeof err), *u;
    if (!t) {
        report("dspark/embedded/refusals", err);
        return;
    }
    u = calloc((size_t)n + 4, sizeof *u);
#define FRESH() (memcpy(u, t, (size_t)n * sizeof *t), n)
    int k = FRESH();
    i = find(u, k, "mtp.1.attn.wkv.weight");
    u[i] = u[--k];
    refuses("missing_stage_tensor", u, k, NULL, NULL, "missing tensor",
            "mtp.1.attn.wkv.weight): expected F32/BF16/F16 [32, 64]");
    k = FRESH();
    i = find(u, k, "mtp.2.confidence_head.proj.weight");
    u[i] = u[--k];
    refuses("missing_confidence_head", u, k, NULL, NULL,
            "missing tensor mtp.2.confidence_head.proj.weight", "expected F32/BF16/F16 [1, 80]");
    k = FRESH();
    i = find(u, k, "mtp.2.markov_head.markov_w1.weight");
    u[i].shape[1] = 8, u[i].nbytes /= 2;
    refuses("misshaped_markov_head", u, k, NULL, NULL,
            "tensor mtp.2.markov_head.markov_w1.weight: expected F32/BF16/F16 [384, 16]",
            "got BF16 [384, 8]");
    k = FRESH();
    i = find(u, k, "mtp.0.main_norm.weight");
    u[i].dtype = TD_DTYPE_I32; // the same bytes
    refuses("wrong_dtype", u, k, NULL, NULL,
            "tensor mtp.0.main_norm.weight: expected F32/BF16/F16 [64]", "got I32 [64]");
    k = FRESH();
    u[k] = u[find(u, k, "mtp.1.attn.wq_a.weight")];
    snprintf(u[k].name, sizeof u[k].name, "mtp.1.attn.wq_c.weight");
    k++;
    refuses("extra_tensor", u, k, NULL, NULL,
            "unexpected tensor mtp.1.attn.wq_c.weight (BF16 [32, 64])",
            "not part of a 3-stage DSpark head");
    k = FRESH();
    u[k] = u[find(u, k, "mtp.0.main_proj.weight")];
    snprintf(u[k].name, sizeof u[k].name, "mtp.0.e_proj.weight"); // an MTP layer's, beside
    k++;
    refuses("mtp_tensor_beside_head", u, k, NULL, NULL, "unexpected tensor mtp.0.e_proj.weight",
            "BF16 [64, 192]");
    k = FRESH();
    for (int j = 0; j < k; j++)
        if (!strncmp(u[j].name, "mtp.2.", 6)) u[j].name[4] = '3';
    refuses("skipped_stage", u, k, NULL, NULL,
            "no mtp.2.* in the checkpoint's own files, but mtp.3.*", NULL);
    refuses("stage_count_key", NULL, 0, "{\"dspark_num_stages\": 2}", NULL,
            "dspark_num_stages is 2, but there are 3 (mtp.0 .. mtp.2)", NULL);
    refuses("rank_key_against_tensors", NULL, 0, "{\"dspark_markov_rank\": 8}", NULL,
            "tensor mtp.2.markov_head.markov_w1.weight: expected F32/BF16/F16 [384, 8]",
            "got BF16 [384, 16]");
    refuses("capture_key_against_main_proj", NULL, 0, "{\"dspark_target_layer_ids\": [1, 3]}", NULL,
            "tensor mtp.0.main_proj.weight: expected F32/BF16/F16 [64, 128]", "got BF16 [64, 192]");
    refuses("incomplete_keys", NULL, 0, NULL, "dspark_markov_rank",
            "missing key \"dspark_markov_rank\" beside \"dspark_block_size\"", NULL);
    refuses("capture_key_past_the_target", NULL, 0, "{\"dspark_target_layer_ids\": [1, 2, 4]}",
            NULL, "\"dspark_target_layer_ids[2]\" = 4 is not a layer of the target ([0, 4))", NULL);
    refuses("block_key_range", NULL, 0, "{\"dspark_block_size\": 17}", NULL,
            "\"dspark_block_size\" = 17 is out of range [1, 16]", NULL);
    refuses("compressed_stage", NULL, 0, "{\"compress_ratios\": [0, 4, 128, 4, 4, 0, 0]}", NULL,
            "DSpark stage mtp.0: compress_ratios[4] says csa attention", NULL);
    refuses(
        "keys_without_stages", t, 0, NULL, NULL,
        "no DSpark stages (mtp.<s>.* tensors) in the checkpoint's own files, though config.json "
        "has the dspark_* keys",
        NULL);
    refuses(
        "stages_without_keys", NULL, 0, NULL,
        "dspark_block_size dspark_noise_token_id dspark_markov_rank dspark_target_layer_ids",
        "stores a DSpark head (mtp.0.main_proj.weight), but its config.json has no dspark_* keys",
        NULL);
#undef FRESH
    // and MTP refuses it, naming what it is
    char out[160];
    snprintf(out, sizeof out, "%s/as_mtp", root);
    struct td_model m, mtp;
    case_begin();
    CHECK(!embed_dspark(out, c_target, c_folder, NULL, 0, NULL, NULL, err, sizeof err) &&
              !td_model_load(&m, out, err, sizeof err),
          "%s", err);
    if (!check_case_failed) {
        int rc = td_model_load_mtp(&m, &mtp, err, sizeof err);
        CHECK(rc && strstr(err,
                           "a DSpark head (config.json has the dspark_* keys), not an MTP layer"),
              "MTP on a DSpark head: %s", rc ? err : "loaded");
        if (!rc) td_model_free(&mtp);
        td_model_free(&m);
    }
    case_end("dspark/embedded/refuses_mtp_on_a_dspark_head", "");
    free(u);
    free(t);
    st_set_close(&ds);
}

/* the nearest finite e4m3 code to x, and the nearest e2m1 code (4 bits) */
static uint8_t e4m3_near(float x) {
    int best = 0;
    for (int c = 1; c < 256; c++)
        if ((c & 0x7f) != 0x7f &&
            fabsf(td_e4m3_to_f32((uint8_t)c) - x) < fabsf(td_e4m3_to_f32((uint8_t)best) - x))
            best = c;
    return (uint8_t)best;
}

static uint8_t e2m1_near(float x) {
    int best = 0;
    for (int c = 1; c < 16; c++)
        if (fabsf(td_e2m1_to_f32((uint8_t)c) - x) < fabsf(td_e2m1_to_f32((uint8_t)best) - x))
            best = c;
    return (uint8_t)best;
}

/* w [out, in] in the release's FP8 (fp4 0: q [out, in], scale [ceil(out/128), ceil(in/128)])
 * or FP4 (fp4 1: q [out, in/2], scale [out, in/32]), each block's scale the power of two that
 * brings its largest value under the format's (448, 6) */
static void quantize(const float *w, int out, int in, int fp4, uint8_t *q, uint8_t *s) {
    int bo = fp4 ? 1 : 128, bi = fp4 ? 32 : 128, so = (out + bo - 1) / bo, si = (in + bi - 1) / bi;
    for (int a = 0; a < so; a++)
        for (int b = 0; b < si; b++) {
            float amax = 0;
            for (int o = a * bo; o < out && o < (a + 1) * bo; o++)
                for (int i = b * bi; i < in && i < (b + 1) * bi; i++)
                    amax = fmaxf(amax, fabsf(w[(size_t)o * in + i]));
            int e = amax > 0 ? (int)ceilf(log2f(amax / (fp4 ? 6.0f : 448.0f))) : 0;
            s[a * si + b] = (uint8_t)(127 + e);
            for (int o = a * bo; o < out && o < (a + 1) * bo; o++)
                for (int i = b * bi; i < in && i < (b + 1) * bi; i++) {
                    float x = ldexpf(w[(size_t)o * in + i], -e);
                    if (!fp4) {
                        q[(size_t)o * in + i] = e4m3_near(x);
                        continue;
                    }
                    uint8_t *byte = &q[(size_t)o * (in / 2) + i / 2];
                    *byte = i % 2 ? (uint8_t)((*byte & 0x0f) | e2m1_near(x) << 4)
                                  : (uint8_t)((*byte & 0xf0) | e2m1_near(x));
                }
        }
}

/* Stages quantized as the release quantizes them (FP8 main_proj, attention and shared experts
 * with 128x128 scales, FP4 routed experts with per-32 ones) load through the target's decode
 * and draft, bit for bit, as the same stages stored as the F32 decode; a quantized weight
 * without its scale is refused by name */
static void embedded_quantized(void) {
    char err[1024] = "", oq[160], orf[160];
    struct st_set ds;
    int n = 0;
    struct st_tensor *t = embed_list(&ds, c_folder, 0, &n, err, sizeof err);
    case_begin();
    CHECK(t, "%s", err);
    struct st_tensor *q = t ? calloc(2 * (size_t)n, sizeof *q) : NULL,
                     *r = t ? calloc((size_t)n, sizeof *r) : NULL;
    void **bufs = t ? calloc(3 * (size_t)n, sizeof *bufs) : NULL;
    int nq = 0, nb = 0, n8 = 0, n4 = 0;
    for (int i = 0; t && i < n; i++) {
        const char *nm = t[i].name;
        int fp8 = !strcmp(nm, "mtp.0.main_proj.weight") || !strcmp(nm, "mtp.1.attn.wq_a.weight") ||
                  !strcmp(nm, "mtp.2.attn.wo_a.weight") ||
                  !strncmp(nm, "mtp.2.ffn.shared_experts.", 25);
        int fp4 = !strncmp(nm, "mtp.1.ffn.experts.", 18);
        r[i] = q[nq++] = t[i];
        if (!fp8 && !fp4) continue;
        int out = (int)t[i].shape[0], in = (int)t[i].shape[1];
        size_t nw = (size_t)out * in, ns = fp4 ? (size_t)out * (in / 32)
                                               : (size_t)((out + 127) / 128) * ((in + 127) / 128);
        float *w = malloc(nw * sizeof *w), *dq = malloc(nw * sizeof *dq);
        uint8_t *qb = calloc(fp4 ? nw / 2 : nw, 1), *sb = malloc(ns);
        bufs[nb++] = w, bufs[nb++] = dq, bufs[nb++] = qb, bufs[nb++] = sb;
        struct td_tensor src = {
            .data = t[i].data, .dtype = t[i].dtype, .ndim = 2, .shape = {out, in}};
        td_tensor_read_f32(&src, 0, (int64_t)nw, w);
        quantize(w, out, in, fp4, qb, sb);
        if (fp4)
            dequant_fp4_ref(dq, qb, sb, out, in);
        else
            dequant_fp8_ref(dq, qb, sb, out, in);
        struct st_tensor *qw = &q[nq - 1], *qs = &q[nq++];
        qw->dtype = fp4 ? TD_DTYPE_I8 : TD_DTYPE_F8_E4M3;
        qw->shape[1] = fp4 ? in / 2 : in;
        qw->data = qb;
        qw->nbytes = fp4 ? nw / 2 : nw;
        *qs = *qw;
        snprintf(qs->name, sizeof qs->name, "%.*s.scale", (int)(strlen(nm) - 7), nm);
        qs->dtype = TD_DTYPE_F8_E8M0;
        qs->shape[0] = fp4 ? out : (out + 127) / 128;
        qs->shape[1] = fp4 ? in / 32 : (in + 127) / 128;
        qs->data = sb;
        qs->nbytes = ns;
        r[i].dtype = TD_DTYPE_F32;
        r[i].data = dq;
        r[i].nbytes = nw * sizeof *dq;
        n8 += fp8, n4 += fp4;
    }
    snprintf(oq, sizeof oq, "%s/quantized", root);
    snprintf(orf, sizeof orf, "%s/quantized_ref", root);
    struct td_model mq, mr;
    struct draft_dspark *dq = NULL, *dr = NULL;
    int rq =
        check_case_failed ? -2 : embedded_drafter(oq, q, nq, NULL, NULL, &mq, &dq, err, sizeof err);
    CHECK(!rq, "the quantized stages: %s", err);
    int rr =
        check_case_failed ? -2 : embedded_drafter(orf, r, n, NULL, NULL, &mr, &dr, err, sizeof err);
    CHECK(!rr, "their F32 decode: %s", err);
    if (!check_case_failed) {
        int32_t ids[40], xa[DSPARK_MAX_BLOCK], xb[DSPARK_MAX_BLOCK];
        for (int i = 0; i < 40; i++)
            ids[i] = (i * 37 + 11) % mq.cfg.vocab;
        int V = mq.cfg.vocab, g = draft_dspark_config(dq)->block;
        float *la = malloc((size_t)V * sizeof(float)), *lb = malloc((size_t)V * sizeof(float));
        float *ua = malloc((size_t)g * V * sizeof(float)),
              *ub = malloc((size_t)g * V * sizeof(float));
        float fa[DSPARK_MAX_BLOCK], fb[DSPARK_MAX_BLOCK];
        int na = greedy_round(&mq, dq, ids, 40, la, xa, fa, ua, err, sizeof err);
        int nbr = na < 0 ? -1 : greedy_round(&mr, dr, ids, 40, lb, xb, fb, ub, err, sizeof err);
        CHECK(na > 0 && nbr == na, "%d and %d drafts (%s)", na, nbr, err);
        CHECK(check_case_failed || !memcmp(ua, ub, (size_t)g * V * sizeof(float)),
              "the base logits differ from the F32 decode's");
        for (int j = 0; !check_case_failed && j < na; j++)
            CHECK(xa[j] == xb[j] && fa[j] == fb[j], "slot %d: draft %d (%.7f), decode's %d (%.7f)",
                  j, xa[j], fa[j], xb[j], fb[j]);
        free(la), free(lb), free(ua), free(ub);
    }
    if (!rq) draft_dspark_free(dq), td_model_free(&mq);
    if (!rr) draft_dspark_free(dr), td_model_free(&mr);
    char extra[96];
    snprintf(extra, sizeof extra, "(%d FP8 and %d FP4 weights)", n8, n4);
    case_end("dspark/embedded/quantized_stages_draft_as_their_decode", extra);
    if (q) {
        int i = find(q, nq, "mtp.1.attn.wq_a.scale");
        if (i >= 0) q[i] = q[--nq];
        refuses("quantized_without_scale", q, nq, NULL, NULL, "mtp.1.attn.wq_a.weight",
                "its scale mtp.1.attn.wq_a.scale is missing");
    }
    for (int i = 0; i < nb; i++)
        free(bufs[i]);
    free(bufs), free(q), free(r), free(t);
    if (t) st_set_close(&ds);
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/td_dspark_XXXXXX");
    if (!mkdtemp(root)) return 1;
    run_fixture("tests/fixtures/dspark_b");
    run_fixture("tests/fixtures/dspark_c");
    run_fixture("tests/fixtures/dspark_tiny");
    embedded_equals_folder("tests/fixtures/dspark_b");
    embedded_equals_folder("tests/fixtures/dspark_c");
    embedded_equals_folder("tests/fixtures/dspark_tiny");
    embedded_refusals();
    embedded_quantized();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd)) return 1;
    return check_failures ? 1 : 0;
}
