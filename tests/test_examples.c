/* test_examples.c: the usage sketch at the top of every API header, compiled here and run where
 * the tiny models let it, so that a header's sketch and the API cannot drift apart (review
 * change 11).
 *
 *   make build/tests/test_examples && build/tests/test_examples      (from the repo root)
 *
 * Each sketch is copied into a function below, between a line "// sketch: <header>" and a line
 * "// end sketch"; a sketch may come in pieces, in order, with the test's own code between them
 * (what the sketch leaves to a comment: "verify and commit"). Variables a sketch uses but does
 * not declare are set up before it.
 *
 * examples/<header>/text   those pieces, read from this file, equal the sketch in the header
 *     (the first run of lines indented three or more after " *" in its opening comment), token
 *     for token: whitespace is dropped except between two identifier characters. Editing the
 *     header's sketch without this file, or this file without the header, fails it; an API
 *     change the sketch no longer fits fails the build.
 * examples/<header>/runs   the sketch ran on the CPU and did what it says (serve/server.h is
 *     compiled only: srv_run serves until a signal).
 * examples/every_sketch_is_here   every header of model/ engine/ draft/ metadata/ verify/
 *     tokenizer/ serve/ whose opening comment has a sketch (an indented run holding a ';') is
 *     in the table below.
 */
#include <ctype.h>
#include <dirent.h>
#include <jansson.h>
#include <stdint.h>

#include "check.h"
#include "draft/drafter.h"
#include "draft/dspark.h"
#include "draft/mtp.h"
#include "engine/engine.h"
#include "engine/policy.h"
#include "metadata/plan.h"
#include "model/backend.h"
#include "model/comm.h"
#include "model/config.h"
#include "model/fileio.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/split.h"
#include "model/state.h"
#include "serve/config.h"
#include "serve/metrics.h"
#include "serve/server.h"
#include "serve/text.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

#define TINY "models/tandem-tiny"         /* the default model: tokenizer, MTP, DSpark */
#define YARN "tests/fixtures/a_tiny_yarn" /* a four-layer oracle fixture: CSA and HCA layers */

static char err[512];       /* the sketches' message buffer where they do not declare one */
static char ex_why[512];    /* why a run failed after its sketch */
static struct td_config tc; /* models/tandem-tiny's config, loaded by main */

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ex_why, sizeof ex_why, fmt, ap);
    va_end(ap);
    return -1;
}

static int all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

/* ids[i] = start + 3 i mod vocab: a prompt for the fixtures */
static void ramp(int32_t *ids, int n, int start, int vocab) {
    for (int i = 0; i < n; i++)
        ids[i] = (start + 3 * i) % vocab;
}

/* ---- the sketches ---- */

static int ex_config(void) {
    // sketch: model/config.h
    struct td_config cfg;
    char err[512];
    if (td_config_load(&cfg, "models/tandem-tiny/config.json", err, sizeof err)) return -1;
    // end sketch
    if (cfg.vocab != tc.vocab || cfg.n_layers != tc.n_layers || cfg.vocab < 1)
        return fail("vocab %d, %d layers", cfg.vocab, cfg.n_layers);
    return 0;
}

static int ex_fileio(const char *dir) {
    // sketch: model/fileio.h
    char path[TD_PATH_MAX], err[512];
    if (td_path_join(path, sizeof path, dir, "config.json", err, sizeof err)) return -1;
    json_t *root = td_json_load(path, 0, err, sizeof err); // NULL: err says why
    if (!root) return -1;
    json_int_t vocab = json_integer_value(json_object_get(root, "vocab_size"));
    json_decref(root);
    // end sketch
    if (vocab != tc.vocab) return fail("vocab_size %lld, the config says %d", vocab, tc.vocab);
    return 0;
}

static int ex_safetensors(void) {
    // sketch: model/safetensors.h
    struct st_set set;
    char err[512];
    if (st_set_open(&set, "models/tandem-tiny", err, sizeof err) != 0) {
        puts(err);
        return -1;
    }
    const struct st_entry *e = st_set_find(&set, "norm.weight"); // NULL: no such tensor
    int64_t dim = e ? e->t.shape[0] : -1;                        // e->t: a view into the mapping
    st_set_close(&set);
    // end sketch
    if (dim != tc.dim) return fail("norm.weight has %lld rows, dim is %d", (long long)dim, tc.dim);
    return 0;
}

static int ex_model(void) {
    // sketch: model/model.h
    struct td_model m;
    char err[512];
    if (td_model_load(&m, "tests/fixtures/a_tiny_yarn", err, sizeof err)) {
        puts(err);
        return -1;
    }
    int64_t q_lora = m.layers[3].wq_a.shape[0]; // [q_lora_rank, dim], in the mapped file
    td_model_free(&m);
    // end sketch
    struct td_config c;
    if (td_config_load(&c, YARN "/config.json", err, sizeof err)) return fail("%s", err);
    if (q_lora != c.q_lora_rank) return fail("wq_a has %lld rows", (long long)q_lora);
    return 0;
}

static int ex_backend(void) {
    struct td_model model, dev;
    if (td_model_load(&model, YARN, err, sizeof err)) return fail("%s", err);
    struct td_state st;
    int n = 6, V = model.cfg.vocab;
    int32_t ids[6];
    ramp(ids, n, 3, V);
    float *logits = malloc((size_t)n * V * sizeof *logits);
    // sketch: model/backend.h
    const struct td_backend *b = td_backend_get("cpu", err, sizeof err); // or "cuda", "auto"
    if (!b) return -1;
    const struct td_model *run = &model; // the CPU runs the loaded weights where they are
    if (b->on_device && td_model_upload(&model, b, &dev, err, sizeof err)) return -1;
    if (b->on_device) run = &dev; // weights resident on b
    if (td_state_init(&st, &model.cfg, 4, 256, 16, (size_t)1 << 30, b, err, sizeof err))
        return -1; // pools live on b
    struct td_plan_seq seq = {.slot = td_state_seq_alloc(&st), .n_new = n, .ids = ids};
    if (td_forward_seqs(run, &st, &seq, 1, logits, NULL, err, sizeof err)) return -1;
    // end sketch
    int rc = 0;
    if (st.len[seq.slot] != n)
        rc = fail("committed %d of %d rows", st.len[seq.slot], n);
    else if (!all_finite(logits, (size_t)n * V))
        rc = fail("non-finite logits");
    else if (strcmp(b->name, "cpu") || st.backend != b)
        rc = fail("the state is not on cpu");
    free(logits);
    td_state_free(&st);
    if (run == &dev) td_model_free(&dev);
    td_model_free(&model);
    return rc;
}

/* a_tiny_yarn on the CPU with a state of 4 sequences of 64 rows; -1 with err set */
static int load_yarn(struct td_model *model, struct td_state *st) {
    if (td_model_load(model, YARN, err, sizeof err)) return -1;
    if (!td_state_init(st, &model->cfg, 4, 64, 64, (size_t)1 << 30, td_backend_cpu(), err,
                       sizeof err))
        return 0;
    td_model_free(model);
    return -1;
}

/* a step over a sequence that holds 3 rows gives the bits a one-shot pass gives its rows 3..4 */
static int ex_forward(void) {
    struct td_model model;
    struct td_state st;
    if (load_yarn(&model, &st)) return fail("%s", err);
    int V = model.cfg.vocab, n = 2;
    int32_t all[5], *ids = all + 3;
    ramp(all, 5, 7, V);
    int slot = td_state_seq_alloc(&st), alone = td_state_seq_alloc(&st);
    float *logits = malloc((size_t)2 * V * sizeof *logits),
          *one = malloc((size_t)5 * V * sizeof *one);
    struct td_plan_seq first = {.slot = slot, .n_new = 3, .ids = all},
                       whole = {.slot = alone, .n_new = 5, .ids = all};
    if (td_forward_seqs(&model, &st, &first, 1, one, NULL, err, sizeof err) ||
        td_forward_seqs(&model, &st, &whole, 1, one, NULL, err, sizeof err))
        return fail("%s", err);
    // sketch: model/forward.h
    struct td_plan_dims dims = td_state_plan_dims(&st, 64, 4); // <= 64 rows, 4 sequences
    struct td_plan p;
    if (meta_plan_init(&p, &dims, err, sizeof err)) return -1;
    struct td_plan_seq seq = {.slot = slot, .len_before = st.len[slot], .n_new = n, .ids = ids};
    int rc = meta_plan_build(&p, &seq, 1, err, sizeof err) ||            // every step
             td_forward(&model, &st, &p, logits, NULL, err, sizeof err); // logits [n, vocab]
    meta_plan_free(&p);                                                  // st.len[slot] += n
    // end sketch
    if (rc)
        rc = fail("%s", err);
    else if (st.len[slot] != 5)
        rc = fail("length %d after the step, want 5", st.len[slot]);
    else if (memcmp(logits, one + (size_t)3 * V, (size_t)2 * V * sizeof *logits))
        rc = fail("the step's logits differ from the one-shot pass's rows 3..4");
    free(logits), free(one), td_state_free(&st), td_model_free(&model);
    return rc;
}

/* a world of one rank (threads): the sum over one rank is its own buffer */
static int ex_comm(void) {
    int world = 1, r = 0;
    size_t n = 2;
    float buf[2] = {1.5f, -2.0f};
    // sketch: model/comm.h
    struct td_comm_world *w; // W ranks as threads of one process (the CPU tests)
    if (td_comm_threads_world(&w, world, 10.0, err, sizeof err)) return -1;
    struct td_comm c; // in rank r's thread (each rank its own)
    td_comm_threads(&c, w, r);
    if (c.ops->all_reduce_sum_f32(&c, buf, n)) c.ops->poll_error(&c, err, sizeof err);
    td_comm_world_free(w); // once every rank's thread is done
    // end sketch
    if (buf[0] != 1.5f || buf[1] != -2.0f) return fail("the sum over one rank changed its buffer");
    return 0;
}

/* one rank's split (td_comm_self) runs every expert: the logits of the model unsplit */
static int ex_split(void) {
    struct td_model model;
    struct td_state st;
    if (load_yarn(&model, &st)) return fail("%s", err);
    int V = model.cfg.vocab;
    int32_t ids[4];
    ramp(ids, 4, 5, V);
    int a = td_state_seq_alloc(&st), b = td_state_seq_alloc(&st);
    float *logits = malloc((size_t)4 * V * sizeof *logits), *whole = malloc((size_t)4 * V * 4);
    struct td_plan_seq seq = {.slot = a, .n_new = 4, .ids = ids},
                       ref = {.slot = b, .n_new = 4, .ids = ids};
    if (td_forward_seqs(&model, &st, &ref, 1, whole, NULL, err, sizeof err)) return fail("%s", err);
    struct td_comm comm;
    td_comm_self(&comm);
    // sketch: model/split.h
    struct td_split sp; // this rank's experts (comm: its rank and the world)
    if (td_split_init(&sp, &model, &comm, NULL, NULL, err, sizeof err)) return -1;
    struct td_model rank_model = model; // this rank's view: the weights shared, its experts
    rank_model.split = &sp;             // the same plans on every rank:
    int rc = td_forward_seqs(&rank_model, &st, &seq, 1, logits, NULL, err, sizeof err);
    td_split_free(&sp);
    // end sketch
    if (rc)
        rc = fail("%s", err);
    else if (memcmp(logits, whole, (size_t)4 * V * sizeof *logits))
        rc = fail("one rank's split gave other logits than the model");
    free(logits), free(whole), td_state_free(&st), td_model_free(&model);
    return rc;
}

/* two sequences already holding 37 and 5 rows take 1 and 4 more in one step */
static int ex_plan(void) {
    struct td_model model;
    struct td_state st;
    if (load_yarn(&model, &st)) return fail("%s", err);
    int V = model.cfg.vocab;
    int slot0 = td_state_seq_alloc(&st), slot1 = td_state_seq_alloc(&st);
    int slot2 = td_state_seq_alloc(&st), slot3 = td_state_seq_alloc(&st);
    (void)slot1, (void)slot2;
    int32_t pre0[37], pre3[5], ids0[1], ids3[4];
    ramp(pre0, 37, 1, V), ramp(pre3, 5, 2, V), ramp(ids0, 1, 9, V), ramp(ids3, 4, 11, V);
    float *logits = malloc((size_t)37 * V * sizeof *logits);
    struct td_plan_seq a = {.slot = slot0, .n_new = 37, .ids = pre0},
                       c = {.slot = slot3, .n_new = 5, .ids = pre3};
    if (td_forward_seqs(&model, &st, &a, 1, logits, NULL, err, sizeof err) ||
        td_forward_seqs(&model, &st, &c, 1, logits, NULL, err, sizeof err))
        return fail("%s", err);
    // sketch: metadata/plan.h
    struct td_plan_dims d = td_state_plan_dims(&st, 64, 4); // the state's rings, 64 rows, 4 seqs
    struct td_plan p;
    if (meta_plan_init(&p, &d, err, sizeof err)) return -1; // one buffer, fixed layout
    struct td_plan_seq seqs[2] = {{.slot = slot0, .len_before = 37, .n_new = 1, .ids = ids0},
                                  {.slot = slot3, .len_before = 5, .n_new = 4, .ids = ids3}};
    int rc = meta_plan_build(&p, seqs, 2, err, sizeof err) || // every array, from seqs alone
             td_forward(&model, &st, &p, logits, NULL, err, sizeof err);
    meta_plan_free(&p);
    // end sketch
    if (rc)
        rc = fail("%s", err);
    else if (st.len[slot0] != 38 || st.len[slot3] != 9)
        rc = fail("lengths %d and %d after the step, want 38 and 9", st.len[slot0], st.len[slot3]);
    else if (!all_finite(logits, (size_t)5 * V))
        rc = fail("non-finite logits");
    free(logits), td_state_free(&st), td_model_free(&model);
    return rc;
}

static int ex_engine(void) {
    int32_t prompt[24];
    int n_prompt = 24;
    for (int i = 0; i < n_prompt; i++) // spans that repeat: the lookup drafter finds them
        prompt[i] = (int32_t)(100 + 37 * (i % 7));
    // sketch: engine/engine.h
    struct td_engine_params ep = td_engine_defaults();
    ep.model_dir = "models/tandem-tiny";
    ep.draft = "ngram";
    ep.max_draft = 3;
    struct td_engine *e;
    if (td_engine_init(&e, &ep, err, sizeof err)) {
        puts(err);
        return -1;
    }
    struct td_request_params rp = {.prompt = prompt,
                                   .n_prompt = n_prompt,
                                   .max_tokens = 64,
                                   .sampling = {.temperature = 0.0f, .top_p = 1.0f}};
    int id = td_engine_submit(e, &rp, err, sizeof err); // -1: err says why
    while (td_engine_step(e, err, sizeof err) > 0) {
    } // every step appends tokens
    const int32_t *out;
    int n;
    enum td_req_status status;
    enum td_finish why;
    td_engine_output(e, id, &out, &n, &status, &why, NULL); // the tokens so far, how it ended
    td_engine_free(e);
    // end sketch
    if (id < 0 || status != TD_REQ_FINISHED || n < 1 || n > 64 || (n < 64 && why != TD_FINISH_EOS))
        return fail("request %d: status %d after %d tokens, finish %d", id, status, n, why);
    return 0;
}

static int ex_policy(void) {
    int kmax[2] = {3, 2}, stride = 4, rows = 6;
    float m[8] = {0.9f, 0.8f, 0.7f, 0, 0.6f, 0.3f, 0, 0};
    double seconds = 0.01;
    // sketch: engine/policy.h
    struct td_policy p;
    policy_init(&p);
    policy_observe(&p, 1, rows, seconds);   // after each step: drafted?, its rows, its wall time
    int d[2];                               // n = 2 sequences, m[s * stride + j], kmax[s]
    struct policy_step st = POLICY_STEP(0); // no prompt rows, nothing else in the step
    if (policy_drafting(&p, 2, kmax, m, stride, &st))  // a model drafter: draft?
        policy_choose(&p, 2, kmax, m, stride, &st, d); // how many each verifies
    policy_free(&p);
    // end sketch
    // one step seen, its warm-up: nothing measured, so every draft
    if (d[0] != 3 || d[1] != 2) return fail("chose %d and %d drafts, want 3 and 2", d[0], d[1]);
    return 0;
}

static int ex_drafter(void) {
    int vocab = 64, id = 0, n = 8, rc = 0;
    int32_t tokens[8] = {5, 6, 7, 8, 9, 5, 6, 7}; // the tail 5 6 7 came before, then 8 9 5 6
    struct td_sampling s = {.temperature = 0.0f, .top_p = 1.0f};
    float q[4 * 64];
    // sketch: draft/drafter.h
    struct td_drafter *d = draft_init("ngram", vocab, err, sizeof err); // NULL: err says why
    if (!d) return -1;
    struct td_draft_req req = {.id = id, .tokens = tokens, .n_tokens = n, .sampling = &s};
    int32_t drafts[4];
    int q_onehot, k = d->propose(d, &req, 4, drafts, q, &q_onehot); // q [4, vocab], or one-hot
    // verify drafts[0 .. k): n_accepted of them are accepted
    // end sketch
    int n_accepted = k;
    if (k != 4 || !q_onehot || drafts[0] != 8 || drafts[1] != 9 || drafts[2] != 5 || drafts[3] != 6)
        rc = fail("%d drafts (one-hot %d) %d %d ..., want 8 9 5 6", k, q_onehot, drafts[0],
                  drafts[1]);
    // sketch: draft/drafter.h
    if (d->observe) d->observe(d, &req, n_accepted); // stateful drafters
    draft_free(d);
    // end sketch
    return rc;
}

/* a model drafter's first target step, on the CPU: target loaded, its state st holding slot,
 * plan over the prompt ids[n] (a prefill that commits every row), logits [n, vocab] */
static int target_open(struct td_model *target, struct td_state *st, struct td_plan *plan,
                       int *slot, int32_t *ids, int n, float **logits) {
    if (td_model_load(target, TINY, err, sizeof err) ||
        td_state_init(st, &target->cfg, 4, 512, 64, (size_t)1 << 30, td_backend_cpu(), err,
                      sizeof err))
        return fail("%s", err);
    *slot = td_state_seq_alloc(st);
    ramp(ids, n, 40, target->cfg.vocab);
    struct td_plan_dims d = td_state_plan_dims(st, 64, 4);
    struct td_plan_seq q = {.slot = *slot, .n_new = n, .ids = ids};
    if (meta_plan_init(plan, &d, err, sizeof err) || meta_plan_build(plan, &q, 1, err, sizeof err))
        return fail("%s", err);
    *logits = malloc((size_t)n * target->cfg.vocab * sizeof **logits);
    return 0;
}

/* the step committed every row: the token after each, the last one the greedy bonus */
static void next_tokens(const int32_t *ids, int n, const float *logits, int vocab, int32_t *next) {
    memcpy(next, ids + 1, (size_t)(n - 1) * sizeof *next);
    next[n - 1] = td_argmax(logits + (size_t)(n - 1) * vocab, vocab);
}

static int drafts_ok(const int32_t *drafts, int n_drafts, int k, int vocab) {
    if (n_drafts != k) return fail("%d drafts, want %d", n_drafts, k);
    for (int j = 0; j < k; j++)
        if (drafts[j] < 0 || drafts[j] >= vocab) return fail("draft %d is %d", j, drafts[j]);
    return 0;
}

static int ex_dspark(void) {
    struct td_model target;
    struct td_state st;
    struct td_plan plan;
    int32_t ids[12], next[12], drafts[DSPARK_MAX_BLOCK];
    int slot, n = 12, pos0 = 0;
    float *logits;
    if (target_open(&target, &st, &plan, &slot, ids, n, &logits)) return -1;
    const struct td_model *run = &target; // the CPU runs the loaded model itself
    const struct td_backend *b = td_backend_cpu();
    struct td_sampling sampling = {.temperature = 0.0f, .top_p = 1.0f};
    float *q = malloc((size_t)DSPARK_MAX_BLOCK * target.cfg.vocab * sizeof *q);
    // sketch: draft/dspark.h
    struct draft_dspark *d; // target: the loaded model; run: the one on backend b (CPU: target)
    if (draft_dspark_init(&d, "models/tandem-tiny/dspark", &target, run, b, 4, 512, 64, st.swa_ring,
                          0.0f, 0, (size_t)1 << 30, TD_KV_F32, err, sizeof err))
        return -1;                                                  // (st: the target's state)
    struct td_forward_io io = {.capture = draft_dspark_capture(d)}; // every step:
    int ring_rows;
    io.capture_ring = draft_dspark_ring(d, &ring_rows); // by position too
    io.capture_layers = draft_dspark_capture_layers(d, &io.n_capture);
    if (td_forward_ex(run, &st, &plan, &io, logits, NULL, err, sizeof err) || // + captured rows
        draft_dspark_insert_step(d, &plan, err, sizeof err)) // the rows of those drafting
        return -1;
    // verify and commit; then per sequence its committed rows and the token after each row
    // end sketch
    next_tokens(ids, n, logits, target.cfg.vocab, next);
    // sketch: draft/dspark.h
    struct td_draft_seq s = {.slot = slot,
                             .pos0 = pos0,
                             .n = n,
                             .next = next,
                             .k = 5,
                             .sampling = &sampling,
                             .drafts = drafts,
                             .q = q};
    if (draft_dspark_run(d, &s, 1, err, sizeof err)) return -1; // keep those rows, draft
    draft_dspark_free(d);
    // end sketch
    int rc = drafts_ok(drafts, s.n_drafts, 5, target.cfg.vocab);
    free(q), free(logits), meta_plan_free(&plan), td_state_free(&st), td_model_free(&target);
    return rc;
}

static int ex_mtp(void) {
    struct td_model target;
    struct td_state st;
    struct td_plan plan;
    int32_t ids[12], next[12], drafts[3], toks[13];
    int slot, n = 12, pos0 = 0;
    float *logits;
    if (target_open(&target, &st, &plan, &slot, ids, n, &logits)) return -1;
    const struct td_model *run = &target; // the CPU runs the loaded model itself
    const struct td_backend *b = td_backend_cpu();
    struct td_sampling sampling = {.temperature = 0.0f, .top_p = 1.0f};
    float *q = malloc((size_t)3 * target.cfg.vocab * sizeof *q);
    // sketch: draft/mtp.h
    struct draft_mtp *d; // target: the loaded model (mtp.0.* in its files); run: it on backend b
    if (draft_mtp_init(&d, &target, run, b, 4, 512, 64, 3, st.swa_ring, 0, (size_t)1 << 30,
                       TD_KV_F32, err, sizeof err))
        return -1;
    struct td_forward_io io = {.hidden_out = draft_mtp_hidden(d), .hidden_by_position = 1};
    if (td_forward_ex(run, &st, &plan, &io, logits, NULL, err, sizeof err)) return -1; // each step
    // verify and commit; then per sequence its committed rows, the token after each
    // end sketch
    next_tokens(ids, n, logits, target.cfg.vocab, next);
    toks[0] = ids[0];
    memcpy(toks + 1, next, (size_t)n * sizeof *toks);
    // sketch: draft/mtp.h
    struct td_draft_seq s = {.slot = slot,
                             .pos0 = pos0,
                             .n = n,
                             .next = next,
                             .toks = toks,
                             .k = 3,
                             .sampling = &sampling,
                             .drafts = drafts,
                             .q = q};
    if (draft_mtp_run(d, &s, 1, err, sizeof err)) return -1; // catch up, then draft
    draft_mtp_free(d);
    // end sketch
    int rc = drafts_ok(drafts, s.n_drafts, 3, target.cfg.vocab);
    free(q), free(logits), meta_plan_free(&plan), td_state_free(&st), td_model_free(&target);
    return rc;
}

static int ex_tokenizer(void) {
    const char *text = "Tokens go in, and the same text comes out.";
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    if (!out) return fail("open_memstream failed");
    // sketch: tokenizer/tokenizer.h
    struct tok *t;
    char err[512];
    if (tok_load(&t, "models/tandem-tiny", err, sizeof err)) return -1; // tokenizer.json (+config)
    struct tok_ids ids = {0};
    if (tok_encode(t, text, strlen(text), TOK_ENCODE_ADD_SPECIAL, &ids, err, sizeof err)) return -1;
    char *s;
    size_t n;
    tok_decode(t, ids.ids, ids.n, 0, &s, &n, err, sizeof err); // s malloc'd
    struct tok_stream st;                                      // token by token:
    tok_stream_init(&st, t, 0);
    const char *piece;
    size_t k;
    for (size_t i = 0; i < ids.n; i++) {
        if (tok_stream_push(&st, ids.ids[i], &piece, &k, err, sizeof err)) break; // a bad id
        fwrite(piece, 1, k, out);
    }
    tok_stream_flush(&st, &piece, &k);
    fwrite(piece, 1, k, out);
    tok_stream_free(&st);
    tok_ids_free(&ids);
    free(s);
    tok_free(t);
    // end sketch
    fclose(out);
    size_t m = strlen(text);
    int rc = len != n || len < m || memcmp(buf + len - m, text, m)
                 ? fail("streamed %zu bytes \"%.*s\", decoded %zu", len, (int)len, buf, n)
                 : 0;
    free(buf);
    return rc;
}

static int ex_chat(void) {
    struct tok *tok;
    if (tok_load(&tok, TINY, err, sizeof err)) return fail("%s", err);
    // sketch: tokenizer/chat.h
    struct chat c;
    if (chat_init(&c, tok, err, sizeof err)) return -1; // picks the format from the vocab
    struct chat_msg m[] = {{.role = CHAT_ROLE_SYSTEM, .content = "Be brief."},
                           {.role = CHAT_ROLE_USER, .content = "Hi"}};
    struct tok_ids ids = {0};
    chat_encode(&c, m, 2, 1, &ids, err, sizeof err); // 1: open the assistant's turn
    // end sketch
    size_t len = 0;
    char *text = chat_render(&c, m, 2, 1, &len, err, sizeof err);
    int rc = ids.n < 3 || !text || !strstr(text, "Be brief.") || !strstr(text, "Hi")
                 ? fail("%zu ids, rendered \"%s\"", ids.n, text ? text : "(null)")
                 : 0;
    free(text);
    tok_ids_free(&ids);
    tok_free(tok);
    return rc;
}

static int ex_serve_config(void) {
    // sketch: serve/config.h
    struct srv_config c;
    char err[4096];
    if (srv_config_load(&c, "etc/tandem.ini", err, sizeof err) || // defaults, then the file
        srv_config_env(&c, NULL, err, sizeof err) ||              // TANDEM_SECTION_KEY
        srv_config_set(&c, "server.port=9000", "--set", err, sizeof err) ||
        srv_config_check(&c, err, sizeof err)) { // cross-key rules, once more
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    // end sketch
    if (c.port != 9000) return fail("server.port %d after --set server.port=9000", c.port);
    return 0;
}

static int ex_metrics(void) {
    struct td_engine_params p = td_engine_defaults();
    p.model_dir = YARN, p.backend = "cpu", p.max_seqs = 1, p.max_ctx = 64;
    p.max_cache_bytes = (size_t)1 << 28;
    struct td_engine *e;
    if (td_engine_init(&e, &p, err, sizeof err)) return fail("%s", err);
    char *buf = NULL;
    size_t buf_len = 0;
    FILE *out = open_memstream(&buf, &buf_len);
    // sketch: serve/metrics.h
    struct met_info mi = {.model = "tiny", .drafter = "mtp", .k = 3, .slots_total = 16};
    struct srv_metrics *m = met_new(&mi);    // NULL: out of memory
    met_received(m);                         // HTTP thread: a request parsed
    met_step(m, MET_STEP_DECODE, 0.004, 12); // engine thread: one step
    met_engine(m, td_engine_stats(e));       // engine thread: cumulative counters
    char *text;
    size_t len;
    if (met_render(m, &text, &len) == 0) {
        fwrite(text, 1, len, out);
        free(text);
    }
    // end sketch
    fclose(out);
    int rc = !buf || !strstr(buf, "\ntandem_requests_received_total 1\n") ||
                     met_value(m, "tandem_slots_total", NULL) != 16
                 ? fail("the rendering lacks a received request or 16 slots")
                 : 0;
    // sketch: serve/metrics.h
    met_free(m);
    // end sketch
    free(buf);
    td_engine_free(e);
    return rc;
}

/* compiled only: srv_run serves until SIGTERM or SIGINT */
static int ex_server(void) {
    // sketch: serve/server.h
    struct srv_config c;
    srv_config_defaults(&c);  // then srv_config_load / _env / _set (serve/config.h)
    return srv_run(&c, NULL); // blocks until SIGTERM/SIGINT; the exit code
    // end sketch
}

static int ex_text(void) {
    const char *text = "the end. Over and out";
    size_t n = strlen(text), from = 0;
    char *const stops[] = {"Over", "out."};
    int n_stops = 2;
    // sketch: serve/text.h
    size_t at;
    int s = stop_find(text, n, from, stops, n_stops, &at); // first match starting >= from
    size_t safe = stop_holdback(text, n, stops, n_stops);  // bytes sendable now
    // end sketch
    if (s != 0 || at != 9) return fail("stop %d at %zu, want 0 at 9", s, at);
    if (safe != n - 3) return fail("%zu bytes sendable, want %zu (\"out\" held)", safe, n - 3);
    return 0;
}

static int ex_fileio_tiny(void) {
    return ex_fileio(TINY);
}

/* ---- the check of the text ---- */

static const struct example {
    const char *header;
    int (*run)(void); /* NULL: compiled only */
    int (*compiled)(void);
} examples[] = {
    {"model/config.h", ex_config, NULL},
    {"model/fileio.h", ex_fileio_tiny, NULL},
    {"model/safetensors.h", ex_safetensors, NULL},
    {"model/model.h", ex_model, NULL},
    {"model/backend.h", ex_backend, NULL},
    {"model/forward.h", ex_forward, NULL},
    {"model/comm.h", ex_comm, NULL},
    {"model/split.h", ex_split, NULL},
    {"metadata/plan.h", ex_plan, NULL},
    {"engine/engine.h", ex_engine, NULL},
    {"engine/policy.h", ex_policy, NULL},
    {"draft/drafter.h", ex_drafter, NULL},
    {"draft/dspark.h", ex_dspark, NULL},
    {"draft/mtp.h", ex_mtp, NULL},
    {"tokenizer/tokenizer.h", ex_tokenizer, NULL},
    {"tokenizer/chat.h", ex_chat, NULL},
    {"serve/config.h", ex_serve_config, NULL},
    {"serve/metrics.h", ex_metrics, NULL},
    {"serve/server.h", NULL, ex_server},
    {"serve/text.h", ex_text, NULL},
};
#define N_EXAMPLES (int)(sizeof examples / sizeof *examples)

static char *slurp(const char *path) {
    char e[256];
    return td_file_read(path, 0, NULL, e, sizeof e);
}

/* s[0..n) appended to the malloc'd string *o of length *len */
static void put(char **o, size_t *len, const char *s, size_t n) {
    *o = realloc(*o, *len + n + 1);
    memcpy(*o + *len, s, n);
    *len += n;
    (*o)[*len] = 0;
}

/* the header's sketch: the first run of lines " *   ..." (three spaces or more after the star)
 * in its opening comment, without the " *"; NULL when it has none */
static char *header_sketch(const char *h) {
    const char *end = strstr(h, "*/");
    if (strncmp(h, "/*", 2) || !end) return NULL;
    char *o = NULL;
    size_t len = 0;
    for (const char *line = h; line < end;) {
        const char *nl = memchr(line, '\n', (size_t)(end - line));
        if (!nl) nl = end;
        if (nl - line >= 5 && !strncmp(line, " *   ", 5)) {
            put(&o, &len, line + 2, (size_t)(nl - line - 2));
            put(&o, &len, "\n", 1);
        } else if (o) {
            break;
        }
        line = nl + 1;
    }
    return o;
}

/* the pieces of this file between "// sketch: <header>" and "// end sketch", in order */
static char *test_sketch(const char *src, const char *header) {
    char open[128];
    snprintf(open, sizeof open, "// sketch: %s", header);
    char *o = NULL;
    size_t len = 0;
    int in = 0;
    for (const char *line = src; *line;) {
        const char *nl = strchr(line, '\n');
        if (!nl) nl = line + strlen(line);
        const char *a = line, *b = nl;
        while (a < b && isspace((unsigned char)*a))
            a++;
        while (b > a && isspace((unsigned char)b[-1]))
            b--;
        size_t n = (size_t)(b - a);
        if (!in && n == strlen(open) && !strncmp(a, open, n)) {
            in = 1;
        } else if (in && n == strlen("// end sketch") && !strncmp(a, "// end sketch", n)) {
            in = 0;
        } else if (in) {
            put(&o, &len, line, (size_t)(nl - line));
            put(&o, &len, "\n", 1);
        }
        line = *nl ? nl + 1 : nl;
    }
    return o;
}

static int ident(char c) {
    return isalnum((unsigned char)c) || c == '_';
}

/* s token for token: whitespace dropped, except one space between two identifier characters */
static char *tokens_of(const char *s) {
    char *o = malloc(strlen(s) + 1), *w = o;
    int space = 0;
    for (; *s; s++) {
        if (isspace((unsigned char)*s)) {
            space = 1;
            continue;
        }
        if (space && w > o && ident(w[-1]) && ident(*s)) *w++ = ' ';
        space = 0;
        *w++ = *s;
    }
    *w = 0;
    return o;
}

/* "" when the test's pieces equal the header's sketch, else why not (into why[cap]) */
static void compare(const char *src, const char *header, char *why, size_t cap) {
    why[0] = 0;
    char *h = slurp(header), *hs = h ? header_sketch(h) : NULL, *ts = test_sketch(src, header);
    if (!h) {
        snprintf(why, cap, "cannot read %s (run from the repo root)", header);
    } else if (!hs) {
        snprintf(why, cap, "%s's opening comment has no sketch", header);
    } else if (!ts) {
        snprintf(why, cap, "no \"// sketch: %s\" piece in %s", header, __FILE__);
    } else {
        char *a = tokens_of(hs), *b = tokens_of(ts);
        size_t i = 0;
        while (a[i] && a[i] == b[i])
            i++;
        if (a[i] || b[i]) {
            size_t from = i > 30 ? i - 30 : 0;
            snprintf(why, cap,
                     "the sketches part at token character %zu: header \"%.60s\", test \"%.60s\"",
                     i, a + from, b + from);
        }
        free(a), free(b);
    }
    free(h), free(hs), free(ts);
}

/* every header with a sketch (an indented run holding a ';') is in the table */
static void every_sketch_is_here(void) {
    static const char *dirs[] = {"model",  "engine",    "draft", "metadata",
                                 "verify", "tokenizer", "serve"};
    char why[512] = "";
    int seen = 0;
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs && !why[0]; i++) {
        DIR *d = opendir(dirs[i]);
        if (!d) {
            snprintf(why, sizeof why, "cannot open %s/ (run from the repo root)", dirs[i]);
            break;
        }
        for (struct dirent *de; (de = readdir(d)) && !why[0];) {
            size_t n = strlen(de->d_name);
            if (n < 3 || strcmp(de->d_name + n - 2, ".h")) continue;
            char path[300];
            snprintf(path, sizeof path, "%s/%s", dirs[i], de->d_name);
            char *h = slurp(path), *hs = h ? header_sketch(h) : NULL;
            if (hs && strchr(hs, ';')) {
                int listed = 0;
                for (int k = 0; k < N_EXAMPLES; k++)
                    listed |= !strcmp(examples[k].header, path);
                if (!listed)
                    snprintf(why, sizeof why, "%s has a sketch this test does not hold", path);
                seen++;
            }
            free(h), free(hs);
        }
        closedir(d);
    }
    if (!why[0] && seen != N_EXAMPLES)
        snprintf(why, sizeof why, "%d headers have sketches, the table lists %d", seen, N_EXAMPLES);
    report("examples/every_sketch_is_here", why[0] ? why : NULL);
}

int main(void) {
    char *src = slurp(__FILE__), why[512];
    if (!src) {
        printf("FAIL examples: cannot read %s (run from the repo root)\n", __FILE__);
        return 1;
    }
    if (td_config_load(&tc, TINY "/config.json", err, sizeof err)) {
        printf("FAIL examples: %s\n", err);
        return 1;
    }
    for (int i = 0; i < N_EXAMPLES; i++) {
        const struct example *x = &examples[i];
        char name[96];
        compare(src, x->header, why, sizeof why);
        snprintf(name, sizeof name, "examples/%s/text%s", x->header,
                 x->run ? "" : " (compiled, not run)");
        report(name, why[0] ? why : NULL);
        if (!x->run) continue;
        err[0] = 0, ex_why[0] = 0;
        int rc = x->run();
        snprintf(name, sizeof name, "examples/%s/runs", x->header);
        if (rc && !ex_why[0])
            snprintf(ex_why, sizeof ex_why, "the sketch returned %d (err: \"%.400s\")", rc, err);
        report(name, rc ? ex_why : NULL);
    }
    every_sketch_is_here();
    free(src);
    return check_failures ? 1 : 0;
}
