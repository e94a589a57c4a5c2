/* test_parallel.c: a model split over ranks, experts first (model/split.h), its ranks threads
 * of this process on the CPU backend (model/comm.h's threads world). parallel.md section 4's L1.
 *
 *   make build/tests/test_parallel && build/tests/test_parallel
 *
 * parallel/logits_equal_one_rank/<model>/W<w>
 *     two sequences through prefill (23 and 9 rows in one step), decode (a row each), verify
 *     chunks (4 and 3 rows), a rollback (2 and 1 rows back) and the rows again: every rank of W
 *     gives the logits (their bytes) of the model unsplit, on the fixtures and tandem-tiny, at
 *     every world size that divides the model's experts; each rank runs a W-th of the routed
 *     experts (the test checks the parts are disjoint and cover them), so a missing or
 *     inexact combine gives other bits
 * parallel/refuses_uneven_split     4 ranks for 6 experts: every rank refuses, with the numbers
 * parallel/manifest_refuses_other_model    rank 1 loaded another checkpoint: every rank
 * parallel/manifest_refuses_other_weights  refuses at start-up, naming it (the manifests'
 *                                   weights fingerprints: names, shapes, first and last bytes)
 * parallel/rank_abort_fails_others  rank 1 aborts before its step: rank 0's step returns -1
 *                                   naming the abort (no hang)
 * parallel/engine/<draft>/W<w>  tandem-tiny's engine split over W ranks (2, 4), rank 0 leading
 *     (scheduling, verification, the drafter's rounds) and the others following its target
 *     steps and serving their part of the drafter's experts:
 *     three requests at once, greedy and sampled, give rank 0 the tokens of an engine on one
 *     rank, with draft none, mtp and dspark (fixed policy: their rounds, rejections and
 *     rollbacks included), and the same drafts verified and accepted
 * parallel/engine/placed_part/<draft>/W2  a dummy model, placed by the engine: each rank
 *     places the replicated weights and its half of the experts (rank 0's bytes less than the
 *     whole model's, more than half; rank 1's, gathered at start-up, the same), and rank 0
 *     gets one rank's tokens; with mtp and dspark the drafter's experts are split too (each
 *     rank's part of the drafter's bytes less than the whole drafter's, the two more)
 * parallel/engine_refuses_other_settings  a rank started with another history pool than rank
 *     0's: every rank's engine refuses to start, naming the rank and the setting
 * parallel/engine_refuses_other_drafter  rank 1 given a DSpark head one byte different (its own
 *     folder): every rank refuses to start, naming the rank and the drafter
 * parallel/diverged_rank_caught  rank 1's weights differ in one byte of a replicated tensor
 *     (past what the manifest reads): the ranks' check of every step's residual streams
 *     fails every rank at the first step, naming rank 1
 * parallel/desync_fails_all         rank 1 is given a plan of one row fewer: every rank's
 *                                   step fails, naming both ranks' calls
 */
#include <pthread.h>

#include "check.h"
#include "model/backend.h"
#include "model/comm.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/split.h"
#include "model/state.h"
#include "engine/engine.h"
#include "tests/engine_run.h"

#define MAXW 8

struct step {
    int n[2];    /* rows of sequences A and B */
    int back[2]; /* rows each rolls back before the step */
};
static const struct step steps[] = {
    {.n = {23, 9}}, {.n = {1, 1}}, {.n = {4, 3}}, {.n = {2, 1}, .back = {2, 1}}, {.n = {1, 1}}};
#define N_STEPS (int)(sizeof steps / sizeof *steps)

/* the steps on model m in a fresh state; the hash of every step's logits bytes; 0 with err set
 * when a step fails. short_by: rows fewer for sequence A of the first step (a desync). */
static uint64_t run_steps(const struct td_model *m, int short_by, char *err, size_t errlen) {
    const struct td_config *c = &m->cfg;
    struct td_state st;
    if (td_state_init(&st, c, 2, 64, 16, (size_t)1 << 30, NULL, err, errlen)) return 0;
    int32_t ids[2][64];
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < 64; i++)
            ids[s][i] = (int32_t)((i * 37 + s * 101 + 11) % c->vocab);
    int slot[2] = {td_state_seq_alloc(&st), td_state_seq_alloc(&st)};
    float *logits = malloc((size_t)64 * c->vocab * sizeof(float));
    uint64_t h = 0xcbf29ce484222325ull;
    for (int k = 0; k < N_STEPS && h; k++) {
        struct td_plan_seq q[2];
        int rows = 0;
        for (int s = 0; s < 2; s++) {
            int len = st.len[slot[s]] - steps[k].back[s];
            if (steps[k].back[s] && td_state_rollback(&st, slot[s], len, err, errlen)) h = 0;
            int n = steps[k].n[s] - (k == 0 && s == 0 ? short_by : 0);
            q[s] = (struct td_plan_seq){
                .slot = slot[s], .len_before = len, .n_new = n, .ids = ids[s] + len};
            rows += n;
        }
        if (h && td_forward_seqs(m, &st, q, 2, logits, NULL, err, errlen)) h = 0;
        if (h) h = fnv1a(h, logits, (size_t)rows * c->vocab * sizeof(float)) | 1;
    }
    free(logits);
    td_state_free(&st);
    return h;
}

struct rank_job {
    const struct td_model *host;
    struct td_comm comm;
    int short_by, abort_first;
    uint64_t hash;
    int lo, hi, owned;
    char err[512];
};

static void *rank_main(void *p) {
    struct rank_job *j = p;
    struct td_split sp;
    j->hash = 0;
    if (td_split_init(&sp, j->host, &j->comm, NULL, NULL, j->err, sizeof j->err)) return NULL;
    j->lo = sp.lo, j->hi = sp.hi;
    for (int e = 0; e < sp.per_layer; e++)
        j->owned += sp.own[e];
    struct td_model m = *j->host; // this rank's view: the host weights, its experts
    sp.check = 1;                 // (every step's residual streams compared across ranks)
    m.split = &sp;
    if (j->abort_first)
        j->comm.ops->abort(&j->comm, "rank 1 lost its GPU");
    else
        j->hash = run_steps(&m, j->short_by, j->err, sizeof j->err);
    td_split_free(&sp);
    return NULL;
}

static const struct td_model *rank1_model; /* rank 1 loads this one instead (a mismatch) */

/* W ranks run the steps; jobs[r] says what rank r saw */
static void run_world(const struct td_model *m, int W, double timeout_s, struct rank_job *jobs,
                      int short_rank, int abort_rank) {
    char err[256];
    struct td_comm_world *w;
    if (td_comm_threads_world(&w, W, timeout_s, err, sizeof err)) {
        case_fail("%s", err);
        return;
    }
    pthread_t th[MAXW];
    for (int r = 0; r < W; r++) {
        jobs[r] = (struct rank_job){.host = r == 1 && rank1_model ? rank1_model : m,
                                    .short_by = r == short_rank ? 1 : 0,
                                    .abort_first = r == abort_rank};
        td_comm_threads(&jobs[r].comm, w, r);
        pthread_create(&th[r], NULL, rank_main, &jobs[r]);
    }
    for (int r = 0; r < W; r++)
        pthread_join(th[r], NULL);
    td_comm_world_free(w);
}

struct model_case {
    const char *dir;
    int worlds[3];
};

static void parity(void) {
    const struct model_case mc[] = {{"tests/fixtures/a_tiny_yarn", {2, 4, 8}},
                                    {"tests/fixtures/b_plain_hc2", {2, 3, 6}},
                                    {"tests/fixtures/d_released", {2, 3, 0}},
                                    {"models/tandem-tiny", {2, 4, 0}}};
    char err[512];
    for (size_t i = 0; i < sizeof mc / sizeof *mc; i++) {
        struct td_model loaded, m;
        int ok = !td_model_load(&loaded, mc[i].dir, err, sizeof err);
        if (ok && loaded.quantized) { // FP8/FP4: its CPU placement, decoded exactly
            ok = !td_model_upload(&loaded, td_backend_cpu(), &m, err, sizeof err);
        } else {
            m = loaded;
        }
        uint64_t one = ok ? run_steps(&m, 0, err, sizeof err) : 0;
        const char *name = strrchr(mc[i].dir, '/') + 1;
        for (int k = 0; k < 3 && mc[i].worlds[k]; k++) {
            case_begin();
            int W = mc[i].worlds[k];
            CHECK(ok && one, "%s: %s", mc[i].dir, err);
            struct rank_job jobs[MAXW];
            memset(jobs, 0, sizeof jobs);
            if (ok && one) run_world(&m, W, 30.0, jobs, -1, -1);
            int E = m.cfg.n_experts, next = 0;
            for (int r = 0; r < W && ok && one; r++) {
                CHECK(jobs[r].hash, "rank %d: %s", r, jobs[r].err);
                CHECK(jobs[r].hash == one, "rank %d's logits differ from one rank's", r);
                CHECK(jobs[r].lo == next && jobs[r].hi - jobs[r].lo == E / W &&
                          jobs[r].owned == E / W + (r == 0),
                      "rank %d runs experts [%d, %d) (%d of layer 0's), not a %d-th after %d", r,
                      jobs[r].lo, jobs[r].hi, jobs[r].owned, W, next);
                next = jobs[r].hi;
            }
            CHECK(!ok || !one || next == E, "the ranks run experts up to %d of %d", next, E);
            char cname[96];
            snprintf(cname, sizeof cname, "parallel/logits_equal_one_rank/%s/W%d", name, W);
            case_end(cname, "");
        }
        if (ok && loaded.quantized) td_model_free(&m);
        if (ok) td_model_free(&loaded);
    }
}

static void failures(void) {
    char err[512];
    struct td_model m;
    case_begin();
    CHECK(!td_model_load(&m, "tests/fixtures/b_plain_hc2", err, sizeof err), "%s", err);
    struct rank_job jobs[MAXW];
    memset(jobs, 0, sizeof jobs);
    run_world(&m, 4, 30.0, jobs, -1, -1); // every rank refuses, none waits for the others
    for (int r = 0; r < 4; r++)
        CHECK(!jobs[r].hash && strstr(jobs[r].err, "4 ranks do not divide the model's 6 routed "
                                                   "experts"),
              "rank %d of 4 for 6 experts: '%s'", r, jobs[r].err);
    case_end("parallel/refuses_uneven_split", "");

    // rank 1 loads another checkpoint (another model; the same shapes with other weights)
    const char *other_dir[2] = {"tests/fixtures/a_tiny_yarn", "tests/fixtures/b_plain_hc2"};
    for (int o = 0; o < 2; o++) {
        case_begin();
        struct td_model other, placed;
        int ok = o ? !td_model_load_dummy(&other, other_dir[o], 7, err, sizeof err) &&
                         !td_model_upload(&other, td_backend_cpu(), &placed, err, sizeof err)
                   : !td_model_load(&other, other_dir[o], err, sizeof err);
        CHECK(ok, "%s", err);
        if (ok) {
            rank1_model = o ? &placed : &other;
            memset(jobs, 0, sizeof jobs);
            run_world(&m, 2, 30.0, jobs, -1, -1);
            rank1_model = NULL;
            for (int r = 0; r < 2; r++)
                CHECK(!jobs[r].hash && strstr(jobs[r].err, "split: rank 1 loaded another model "
                                                           "than rank 0"),
                      "rank %d: '%s'", r, jobs[r].err);
            if (o) td_model_free(&placed);
            td_model_free(&other);
        }
        char extra[600];
        snprintf(extra, sizeof extra, "(%s)", jobs[0].err);
        case_end(o ? "parallel/manifest_refuses_other_weights"
                   : "parallel/manifest_refuses_other_model",
                 extra);
    }

    // rank 1's copy of the weights differs in one replicated byte, in the middle of a tensor
    // (the manifest's fingerprint reads only each tensor's first and last bytes): the ranks'
    // residual check fails every rank at the first step, naming rank 1
    case_begin();
    {
        struct td_model d0, d1, p0, p1;
        int ok = !td_model_load_dummy(&d0, "tests/fixtures/b_plain_hc2", 7, err, sizeof err) &&
                 !td_model_upload(&d0, td_backend_cpu(), &p0, err, sizeof err) &&
                 !td_model_load_dummy(&d1, "tests/fixtures/b_plain_hc2", 7, err, sizeof err) &&
                 !td_model_upload(&d1, td_backend_cpu(), &p1, err, sizeof err);
        CHECK(ok, "%s", err);
        if (ok) {
            const struct td_tensor *t = &p1.layers[1].attn_norm;
            size_t nb = (size_t)td_tensor_numel(t) * td_dtype_size(t->dtype);
            ((unsigned char *)t->data)[nb / 2 + 1] ^= 0x20;
            rank1_model = &p1;
            memset(jobs, 0, sizeof jobs);
            run_world(&p0, 2, 30.0, jobs, -1, -1);
            rank1_model = NULL;
            for (int r = 0; r < 2; r++)
                CHECK(!jobs[r].hash && strstr(jobs[r].err, "rank 1's residual streams differ "
                                                           "from rank 0's at its step 0"),
                      "rank %d: '%s'", r, jobs[r].err);
            td_model_free(&p0), td_model_free(&p1), td_model_free(&d0), td_model_free(&d1);
        }
        char extra[600];
        snprintf(extra, sizeof extra, "(%s)", jobs[0].err);
        case_end("parallel/diverged_rank_caught", extra);
    }

    case_begin();
    memset(jobs, 0, sizeof jobs);
    run_world(&m, 2, 30.0, jobs, -1, 1);
    CHECK(!jobs[0].hash && strstr(jobs[0].err, "rank 1 aborted: rank 1 lost its GPU"),
          "rank 0: hash %llx, '%s'", (unsigned long long)jobs[0].hash, jobs[0].err);
    case_end("parallel/rank_abort_fails_others", "");

    case_begin();
    memset(jobs, 0, sizeof jobs);
    run_world(&m, 3, 30.0, jobs, 1, -1);
    for (int r = 0; r < 3; r++)
        CHECK(!jobs[r].hash && strstr(jobs[r].err, "the ranks disagree at op 2: rank 0 called "
                                                   "all_reduce of"),
              "rank %d: hash %llx, '%s'", r, (unsigned long long)jobs[r].hash, jobs[r].err);
    char extra[600];
    snprintf(extra, sizeof extra, "(%s)", jobs[0].err);
    case_end("parallel/desync_fails_all", extra);
    td_model_free(&m);
}

/* ---- engines ---- */

struct eng_job {
    struct td_comm comm;
    const char *draft;
    int sampled, rank, bad_pool, dummy;
    const char *dspark_dir; /* a rank's own DSpark folder (NULL: the model's) */
    int prefix;             /* 1: the prefix cache on, and requests that find their prefixes there;
                               2: the same requests, the cache off */
    long hit_tokens;        /* the prefix cache's, rank 0's */
    size_t weight_bytes;    /* the engine's placed weights (rank 0, or the whole model) */
    int ranks; /* td_engine_ranks: how many, and rank 1's weights as rank 0 sees them */
    size_t rank1_weights;
    int32_t out[3][16];
    int n_out[3];
    long drafted, accepted; /* the drafts verified and accepted (rank 0's) */
    int rc;
    char err[512];
};

static struct td_engine_params eng_params(const char *draft, struct td_comm *comm, int dummy,
                                          int prefix) {
    struct td_engine_params ep = td_engine_defaults();
    ep.model_dir = "models/tandem-tiny";
    ep.backend = "cpu";
    ep.max_seqs = 3, ep.max_ctx = 256;
    ep.max_cache_bytes = (size_t)1 << 30;
    ep.draft = draft;
    if (strcmp(draft, "none")) ep.max_draft = 3, ep.draft_policy = TD_POLICY_FIXED;
    ep.comm = comm;
    ep.dummy_weights = dummy; // (placed: a split rank places its own experts only)
    if (prefix) ep.max_ctx = 1024, ep.prefix_blocks = prefix == 1 ? 16 : 0; // 2: the cache off
    return ep;
}

/* rank 0 (or the whole model when comm is NULL): three requests to the end */
static void eng_lead(struct eng_job *j, struct td_comm *comm) {
    struct td_engine_params ep = eng_params(j->draft, comm, j->dummy, j->prefix);
    struct td_engine *e;
    j->rc = -1;
    if (td_engine_init(&e, &ep, j->err, sizeof j->err)) return;
    j->weight_bytes = td_engine_weight_bytes(e);
    size_t cb;
    j->ranks = td_engine_ranks(e, -1, &j->rank1_weights, &cb);
    if (j->ranks > 1) td_engine_ranks(e, 1, &j->rank1_weights, &cb);
    int32_t prompts[3][700];
    int ids[3], ok = 1, n = 1, np[3] = {20, 30, 40};
    for (int q = 0; q < 3; q++)
        for (int i = 0; i < 700; i++)
            prompts[q][i] = (int32_t)((q * 977 + i * 131 + i / 3) % 8000 + 2);
    if (j->prefix) { // request 0 alone; then 1: its prompt, its reply and 24 more (a
                     // conversation's next turn: full blocks and a tail), 2: its first 600 and
                     // others (a hit inside a block)
        np[0] = 600, np[1] = 640, np[2] = 640;
        for (int i = 0; i < 600; i++)
            prompts[1][i] = prompts[2][i] = prompts[0][i];
    }
    for (int q = 0; q < 3; q++) {
        if (j->prefix && q == 1) { // request 0 to its end first, its reply into prompt 1
            for (int s = 0; ok && n > 0 && s < 400; s++)
                n = td_engine_step(e, j->err, sizeof j->err);
            const int32_t *t;
            int nt = 0;
            if (ok && !n) td_engine_output(e, ids[0], &t, &nt, NULL, NULL, NULL);
            for (int i = 0; i < nt && i < 16; i++)
                prompts[1][600 + i] = t[i];
            n = 1;
        }
        struct td_request_params rp = {.prompt = prompts[q],
                                       .n_prompt = np[q],
                                       .max_tokens = 16,
                                       .ignore_eos = 1,
                                       .sampling = {.temperature = j->sampled ? 1.0f : 0.0f,
                                                    .top_p = 1.0f,
                                                    .seed = (uint64_t)(5 + q)}};
        ids[q] = td_engine_submit(e, &rp, j->err, sizeof j->err);
        ok &= ids[q] >= 0;
    }
    int rc = engine_drain(e, ok, ids, 3, j->out[0], 16, j->n_out, j->err, sizeof j->err);
    const struct td_engine_stats *es = td_engine_stats(e);
    j->drafted = es->drafted, j->accepted = es->accepted;
    struct td_prefix_stats ps;
    j->hit_tokens = td_engine_prefix_stats(e, &ps) ? 0 : ps.hit_tokens;
    j->rc = rc;
    td_engine_free(e); // (rank 0: ends the followers)
}

static void *eng_rank(void *p) {
    struct eng_job *j = p;
    if (j->rank == 0) {
        eng_lead(j, &j->comm);
        return NULL;
    }
    struct td_engine_params ep = eng_params(j->draft, &j->comm, j->dummy, j->prefix);
    if (j->bad_pool) ep.history_blocks = 1; // under one max_ctx sequence's blocks: refused
    if (j->dspark_dir) ep.dspark_dir = j->dspark_dir;
    struct td_engine *e;
    j->rc = td_engine_init(&e, &ep, j->err, sizeof j->err);
    if (!j->rc) j->rc = td_engine_follow(e, j->err, sizeof j->err), td_engine_free(e);
    return NULL;
}

static const char *rank1_dspark; /* rank 1's own DSpark folder, or NULL */

static void eng_world(int W, struct eng_job *jobs, const char *draft, int sampled, int bad_rank,
                      int dummy, int prefix) {
    char err[256];
    struct td_comm_world *w;
    if (td_comm_threads_world(&w, W, 60.0, err, sizeof err)) {
        case_fail("%s", err);
        return;
    }
    pthread_t th[MAXW];
    for (int r = 0; r < W; r++) {
        jobs[r] = (struct eng_job){.draft = draft,
                                   .sampled = sampled,
                                   .rank = r,
                                   .bad_pool = r == bad_rank,
                                   .dspark_dir = r == 1 ? rank1_dspark : NULL,
                                   .dummy = dummy,
                                   .prefix = prefix};
        td_comm_threads(&jobs[r].comm, w, r);
        pthread_create(&th[r], NULL, eng_rank, &jobs[r]);
    }
    for (int r = 0; r < W; r++)
        pthread_join(th[r], NULL);
    td_comm_world_free(w);
}

static void engines(void) {
    const char *drafts[3] = {"none", "mtp", "dspark"};
    for (int d = 0; d < 3; d++)
        for (int W = 2; W <= 4; W += 2) {
            case_begin();
            for (int sampled = 0; sampled < 2; sampled++) {
                struct eng_job one = {.draft = drafts[d], .sampled = sampled}, jobs[MAXW];
                eng_lead(&one, NULL);
                CHECK(!one.rc, "one rank: %s", one.err);
                eng_world(W, jobs, drafts[d], sampled, -1, 0, 0);
                for (int r = 0; r < W; r++)
                    CHECK(!jobs[r].rc, "rank %d: %s", r, jobs[r].err);
                for (int q = 0; q < 3 && !one.rc && !jobs[0].rc; q++)
                    CHECK(jobs[0].n_out[q] == one.n_out[q] && one.n_out[q] == 16 &&
                              !memcmp(jobs[0].out[q], one.out[q], 16 * sizeof(int32_t)),
                          "%s: request %d's %d tokens differ from one rank's %d",
                          sampled ? "sampled" : "greedy", q, jobs[0].n_out[q], one.n_out[q]);
                // the same drafts too (greedy tokens would hide a drafter gone wrong)
                CHECK(jobs[0].drafted == one.drafted && jobs[0].accepted == one.accepted,
                      "%s: %ld of %ld drafts accepted, one rank %ld of %ld",
                      sampled ? "sampled" : "greedy", jobs[0].accepted, jobs[0].drafted,
                      one.accepted, one.drafted);
            }
            char name[64];
            snprintf(name, sizeof name, "parallel/engine/%s/W%d", drafts[d], W);
            case_end(name, "");
        }
    // weights the engine places (a dummy model's): each rank places its part of the experts,
    // of the target and of a model drafter (which rank 0 alone runs: the other ranks run their
    // experts of its MoE layers on the rows it sends)
    size_t whole_none = 0, part_none = 0, rank1_none = 0;
    for (int d = 0; d < 3; d++) {
        case_begin();
        struct eng_job one = {.draft = drafts[d], .dummy = 1}, jw[MAXW];
        eng_lead(&one, NULL);
        eng_world(2, jw, drafts[d], 0, -1, 1, 0);
        CHECK(!one.rc && !jw[0].rc && !jw[1].rc, "%s / %s / %s", one.err, jw[0].err, jw[1].err);
        for (int q = 0; q < 3 && !one.rc && !jw[0].rc; q++)
            CHECK(jw[0].n_out[q] == 16 && !memcmp(jw[0].out[q], one.out[q], 16 * sizeof(int32_t)),
                  "request %d: other tokens than one rank's", q);
        CHECK(jw[0].weight_bytes < one.weight_bytes && 2 * jw[0].weight_bytes > one.weight_bytes,
              "rank 0 placed %zu bytes of weights, the whole model %zu", jw[0].weight_bytes,
              one.weight_bytes);
        CHECK(one.ranks == 1 && jw[0].ranks == 2, "ranks %d and %d", one.ranks, jw[0].ranks);
        char extra[192];
        if (d == 0) {
            CHECK(jw[0].rank1_weights == jw[0].weight_bytes,
                  "rank 1 placed %zu bytes as rank 0 sees it, rank 0 %zu", jw[0].rank1_weights,
                  jw[0].weight_bytes);
            whole_none = one.weight_bytes, part_none = jw[0].weight_bytes;
            rank1_none = jw[0].rank1_weights;
            snprintf(extra, sizeof extra, "(rank 0 places %zu of the model's %zu bytes)",
                     jw[0].weight_bytes, one.weight_bytes);
        } else { // the drafter's experts split too: each rank holds a part of them
            size_t whole = one.weight_bytes - whole_none, r0 = jw[0].weight_bytes - part_none,
                   r1 = jw[0].rank1_weights - rank1_none;
            CHECK(whole > 0 && r0 < whole && r1 > 0 && r1 < whole && r0 + r1 > whole,
                  "the drafter's weights: %zu whole, rank 0 %zu and rank 1 %zu of them", whole, r0,
                  r1);
            snprintf(extra, sizeof extra,
                     "(the drafter's %zu bytes: rank 0 places %zu, rank 1 %zu: its experts split, "
                     "the rest on both)",
                     whole, r0, r1);
        }
        char name[64];
        snprintf(name, sizeof name, "parallel/engine/placed_part/%s/W2", drafts[d]);
        case_end(name, extra);
    }
    // the prefix cache on a split model: the followers make rank 0's copies and checkpoints,
    // so a request that finds its prefix gives one rank's tokens, which are the cold ones, and
    // every step's residual streams are the same on both ranks (TD_RANK_CHECK)
    setenv("TD_RANK_CHECK", "1", 1);
    for (int d = 0; d < 2; d++) {
        case_begin();
        struct eng_job cold = {.draft = drafts[d], .prefix = 2},
                       one = {.draft = drafts[d], .prefix = 1}, jp[MAXW];
        eng_lead(&cold, NULL);
        eng_lead(&one, NULL);
        eng_world(2, jp, drafts[d], 0, -1, 0, 1);
        CHECK(!cold.rc && !one.rc && !jp[0].rc && !jp[1].rc, "%s / %s / %s / %s", cold.err, one.err,
              jp[0].err, jp[1].err);
        for (int q = 0; q < 3 && !one.rc && !jp[0].rc; q++)
            CHECK(jp[0].n_out[q] == 16 && !memcmp(jp[0].out[q], one.out[q], 16 * sizeof(int32_t)) &&
                      !memcmp(cold.out[q], one.out[q], 16 * sizeof(int32_t)),
                  "request %d: other tokens than one rank's with the cache, or without it", q);
        CHECK(one.hit_tokens > 0 && jp[0].hit_tokens == one.hit_tokens,
              "tokens from the cache: %ld on one rank, %ld on two", one.hit_tokens,
              jp[0].hit_tokens);
        char name[64], extra[96];
        snprintf(name, sizeof name, "parallel/engine/prefix_cache/%s/W2", drafts[d]);
        snprintf(extra, sizeof extra, "(%ld prompt tokens from the cache)", jp[0].hit_tokens);
        case_end(name, extra);
    }
    unsetenv("TD_RANK_CHECK");
    case_begin();
    struct eng_job jobs[MAXW];
    eng_world(2, jobs, "none", 0, 1, 0, 0);
    for (int r = 0; r < 2; r++)
        CHECK(jobs[r].rc && strstr(jobs[r].err, "engine: rank 1's state has 1 history blocks "
                                                "where rank 0's has"),
              "rank %d: rc %d, '%s'", r, jobs[r].rc, jobs[r].err);
    char extra[600];
    snprintf(extra, sizeof extra, "(%s)", jobs[0].err);
    case_end("parallel/engine_refuses_other_settings", extra);
    // rank 1 given another DSpark head (one byte of its weights): every rank refuses to start
    case_begin();
    char dir[] = "/tmp/td_dspark_XXXXXX", cmd[512], path[600];
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(cmd, sizeof cmd, "cp models/tandem-tiny/dspark/* %s/", dir);
    CHECK(!system(cmd), "%s", cmd);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "r+b");
    uint64_t hl = 0;
    unsigned char byte = 0;
    CHECK(f && fread(&hl, 8, 1, f) == 1 && !fseek(f, (long)(8 + hl), SEEK_SET) &&
              fread(&byte, 1, 1, f) == 1 && !fseek(f, (long)(8 + hl), SEEK_SET),
          "%s", path);
    byte ^= 1; // the first tensor's first byte, which the fingerprint reads
    if (f) fwrite(&byte, 1, 1, f), fclose(f);
    rank1_dspark = dir;
    eng_world(2, jobs, "dspark", 0, -1, 0, 0);
    rank1_dspark = NULL;
    for (int r = 0; r < 2; r++)
        CHECK(jobs[r].rc && strstr(jobs[r].err, "loaded another drafter than rank 0"),
              "rank %d: rc %d, '%s'", r, jobs[r].rc, jobs[r].err);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) fprintf(stderr, "%s failed\n", cmd);
    snprintf(extra, sizeof extra, "(%s)", jobs[0].err);
    case_end("parallel/engine_refuses_other_drafter", extra);
}

int main(void) {
    parity();
    failures();
    engines();
    return check_failures ? 1 : 0;
}
