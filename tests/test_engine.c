/* test_engine.c: the engine end to end on the oracle fixtures: speculation is lossless.
 *
 *   make build/tests/test_engine && build/tests/test_engine
 *
 * greedy_spec_equals_plain/<fixture>/<drafter>/k<k>/b<batch>: with greedy decoding, ngram,
 *     random (and, on b_plain_hc2, a random DSpark drafter) speculation with k in {1, 3, 7}
 *     give token-for-token the output of plain decoding, for batches of 1 and 13 requests (13
 *     with a small row budget, so prefill chunks, decode rows and verify rows share steps).
 * {mtp,dspark}_greedy_equals_plain/tandem-tiny: the trained drafters, lossless and accepted.
 * {mtp,dspark}_sampled_keeps_target_distribution: a chi-square of sampled tokens vs no drafter.
 * sampled_batch_invariant: on tandem-tiny a sampled request gives the same tokens alone and inside
 *     a batch; its tokens vary and differ without the drafter (the check could fail).
 * admission_waits: more requests than sequence slots all finish, with the same tokens.
 * eos_and_length_stops, context_stop, nan_target_fails_request, bad_requests_refused.
 * engine/prefill_chunk_caps_prompt_rows: a 300-token prompt arriving beside a decoding request
 *     takes at most prefill_chunk rows a step, the decode advances every step, and the tokens
 *     are those of an uncapped run.
 * engine/prefix_warm_equals_cold: the prefix cache (tandem-tiny, prompts of 520 and 512 tokens,
 *     blocks of 256, one slot, another prompt run between any two): a repeated prompt takes 519
 *     tokens from the cache (its last is fed; inside the first run's tail), a prompt sharing
 *     300 tokens 256, a prompt of exactly 512 511 (inside the second block), and each gives the
 *     logits rows (their bytes) and the tokens (greedy and sampled) of an engine without the
 *     cache.
 * engine/prefix_eviction: a pool of 2 blocks: another prompt evicts the first's blocks, which
 *     then misses, with the same tokens.
 * engine/prefix_concurrent_dedup: the same prompt twice at once: both prefill, the second's
 *     blocks and tail are the first's (published twice), the same tokens.
 * engine/prefix_shared_by_many: six requests at once share a prompt's two published blocks,
 *     each with the tokens of an engine without the cache.
 * engine/prefix_with_{mtp,dspark}: with a model drafter a hit leaves the drafter's window of the
 *     prompt to prefill (391 of 520 tokens cached, inside the second block, not 519), which
 *     rebuilds its rings: the same logits rows and tokens, greedy and sampled, as without the
 *     cache (fixed draft policy).
 * engine/prefix_blocks_frozen: a hit that decodes past a block boundary with the random drafter
 *     (rejections around it) leaves the published blocks' bytes unchanged
 * (td_engine_prefix_checksum). engine/prefix_decode_blocks: a block its decode steps complete is
 * published, and at the finish the committed tokens past the last full block as a tail: a
 * conversation's next turn (prompt, reply, more) takes every committed token from the cache
 * (299, not the 256 of the full block) with the logits and tokens of an engine without it;
 * engine/prefix_tail_with_{mtp,dspark}: the same with a model drafter (the hit ends 128 tokens
 * or more before the prompt's end); a short next turn (20 ids after the reply) takes 299
 * without a drafter and 191 with one, inside the first block. engine/prefix_pool_refused: a pool
 * past the cache memory limit is refused with the numbers. engine/history_pool_waits: a history
 * pool of one max_ctx sequence makes a second long prompt wait for the first's blocks (the tokens
 * of a pool that holds both), lets two short ones run at once, and is refused under one sequence's
 * blocks. engine/prefix_boundaries/<fixture>: on every fixture, prompts that begin with a cached
 * one's first block, of 257, 300, 383, 384 and 385 tokens (past the block, around the window after
 * it), take the block and then the part of the tail before them that they share (256, 257,
 * 300, 383, 384 tokens) with the logits rows and tokens of an engine without the cache.
 * engine/history_pool_fits_memory: the default pool takes what the cache memory limit holds when
 * every slot at max_ctx does not fit, and is refused with the numbers under one max_ctx sequence
 * and a block for every other slot.
 * TD_TEST_QUICK=1 (sanitizer run) checks one fixture.
 */
#include <stdint.h>
#include <unistd.h>

#include "check.h"
#include "engine/engine.h"
#include "model/config.h"
#include "model/state.h"
#include "kernels/err.h"
#include "tokenizer/tokenizer.h"

#define MAX_REQ 16
/* tandem-tiny's DSpark drafter is accepted at least this often at T = 0 (measured: see
 * models/tandem-tiny/README.md) */
#define DSPARK_MIN_ACCEPT 0.2

struct run {
    int n;
    int32_t out[MAX_REQ][128];
    int n_out[MAX_REQ];
    enum td_req_status st[MAX_REQ];
    enum td_finish why[MAX_REQ];
    char msg[MAX_REQ][256];
    struct td_engine_stats stats;
};

struct hook {
    int request; /* -1: none */
    long position;
    int mode; /* 0: NaN row, 1: force token `token` */
    int token;
};

static void hook_fn(void *ctx, int request, long position, float *row, int vocab) {
    struct hook *h = ctx;
    if (h->request != request && h->request != -2) return;
    if (position != h->position) return;
    for (int v = 0; v < vocab; v++)
        row[v] = h->mode == 0 ? (v == 3 ? NAN : row[v]) : (v == h->token ? 100.0f : -100.0f);
}

static int32_t prompts[MAX_REQ][64];
static const char *dspark_dir_g; /* the DSpark drafter run() uses (NULL: the model's dspark/) */
static float dspark_threshold_g; /* and its --dspark-threshold */
static int prompt_len[MAX_REQ];

static void make_prompts(int vocab) {
    for (int r = 0; r < MAX_REQ; r++) {
        prompt_len[r] = 5 + (r * 7) % 40;
        for (int i = 0; i < prompt_len[r]; i++)
            // repeating spans so the lookup drafter finds matches, varied per request
            prompts[r][i] = (int32_t)(((i % (3 + r % 4)) * 31 + r * 17 + (i > 20 ? i : 0)) % vocab);
    }
}

/* run's draft policy (the tests of speculation's mechanics verify every draft: fixed) and,
 * for the adaptive one, its cost seam and synthetic acceptance */
static int policy_g = TD_POLICY_FIXED;
static double (*cost_g)(void *, int, int);
static float synth_g[TD_MAX_DRAFT];
static int n_synth_g;

static int run(const char *model, const char *draft, int k, int n_req, int budget, int max_seqs,
               const struct td_sampling *s, int first_req, struct hook *h, int max_tokens,
               int max_ctx, struct run *out) {
    char err[512];
    struct td_engine_params ep = td_engine_defaults();
    ep.model_dir = model;
    ep.draft = draft;
    ep.max_draft = k;
    if (!strcmp(draft, "dspark")) ep.dspark_dir = dspark_dir_g;
    ep.dspark_threshold = dspark_threshold_g;
    ep.draft_policy = policy_g;
    ep.step_cost = cost_g;
    ep.n_synthetic = n_synth_g;
    memcpy(ep.synthetic_accept, synth_g, sizeof synth_g);
    ep.max_batch_tokens = budget;
    ep.max_seqs = max_seqs;
    ep.max_ctx = max_ctx;
    ep.max_cache_bytes = (size_t)1 << 30;
    ep.backend = "cpu";
    if (h) {
        ep.logits_hook = hook_fn;
        ep.hook_ctx = h;
    }
    struct td_engine *e;
    if (td_engine_init(&e, &ep, err, sizeof err)) {
        case_fail("engine init: %s", err);
        return -1;
    }
    int ids[MAX_REQ];
    for (int i = 0; i < n_req; i++) {
        int r = first_req + i;
        struct td_sampling si = *s;
        si.seed = s->seed + (uint64_t)r;
        struct td_request_params rp = {.prompt = prompts[r],
                                       .n_prompt = prompt_len[r],
                                       .max_tokens = max_tokens,
                                       .sampling = si,
                                       .ignore_eos = h ? 0 : 1};
        ids[i] = td_engine_submit(e, &rp, err, sizeof err);
        if (ids[i] < 0) {
            case_fail("submit: %s", err);
            td_engine_free(e);
            return -1;
        }
    }
    int live, steps = 0;
    while ((live = td_engine_step(e, err, sizeof err)) > 0 && steps++ < 100000) {
    }
    if (live != 0) case_fail("engine step: %s", live < 0 ? err : "did not finish");
    out->n = n_req;
    for (int i = 0; i < n_req; i++) {
        const int32_t *t;
        const char *msg;
        td_engine_output(e, ids[i], &t, &out->n_out[i], &out->st[i], &out->why[i], &msg);
        memcpy(out->out[i], t, (size_t)out->n_out[i] * sizeof(int32_t));
        snprintf(out->msg[i], sizeof out->msg[i], "%s", msg);
    }
    out->stats = *td_engine_stats(e);
    td_engine_free(e);
    return 0;
}

static int same_tokens(const struct run *a, const struct run *b, int *which) {
    for (int i = 0; i < a->n; i++)
        if (a->n_out[i] != b->n_out[i] ||
            memcmp(a->out[i], b->out[i], (size_t)a->n_out[i] * sizeof(int32_t))) {
            *which = i;
            return 0;
        }
    return 1;
}

static void greedy_lossless(const char *fx) {
    char model[128], name[160], extra[128];
    snprintf(model, sizeof model, "tests/fixtures/%s", fx);
    struct td_sampling greedy = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
    static struct run base1, base13, spec;
    case_begin();
    run(model, "none", 0, 1, 256, 1, &greedy, 3, NULL, 24, 512, &base1);
    run(model, "none", 0, 13, 64, 13, &greedy, 0, NULL, 24, 512, &base13);
    snprintf(name, sizeof name, "plain_greedy/%s", fx);
    case_end(name, "");
    // DSpark where the fixture has a drafter (a random one: it tests losslessness, not skill)
    const char *drafters[3] = {"ngram", "random", "dspark"};
    char ddir[160];
    snprintf(ddir, sizeof ddir, "tests/fixtures/dspark_%c/dspark", fx[0]);
    dspark_dir_g = ddir;
    int n_drafters = access(ddir, R_OK) ? 2 : 3;
    int ks[3] = {1, 3, 7};
    for (int d = 0; d < n_drafters; d++)
        for (int ki = 0; ki < 3; ki++)
            for (int b = 0; b < 2; b++) {
                case_begin();
                struct run *base = b ? &base13 : &base1;
                if (b)
                    run(model, drafters[d], ks[ki], 13, 64, 13, &greedy, 0, NULL, 24, 512, &spec);
                else
                    run(model, drafters[d], ks[ki], 1, 256, 1, &greedy, 3, NULL, 24, 512, &spec);
                int which = -1;
                CHECK(same_tokens(&spec, base, &which), "request %d differs from plain decoding",
                      which);
                const struct td_engine_stats *s = &spec.stats;
                snprintf(extra, sizeof extra, "(%ld steps vs %ld plain, accepted %ld of %ld)",
                         s->steps, base->stats.steps, s->accepted, s->drafted);
                snprintf(name, sizeof name, "greedy_spec_equals_plain/%s/%s/k%d/b%d", fx,
                         drafters[d], ks[ki], b ? 13 : 1);
                case_end(name, extra);
            }
}

/* a drafter trained for the default model (mtp, dspark): lossless, and it predicts: its
 * acceptance is far above chance (~1/8192), at least min_accept */
static void model_drafter_tests(const char *draft, double min_accept) {
    const char *model = "models/tandem-tiny";
    const char *texts[4] = {
        "In the beginning God created the heaven and the earth.",
        "It is a truth universally acknowledged, that",
        "dog, domestic dog, Canis familiaris:", "And it came to pass, when the king heard"};
    char err[512];
    struct tok *tk;
    if (tok_load(&tk, model, err, sizeof err)) {
        printf("FAIL %s: %s\n", draft, err);
        check_failures++;
        return;
    }
    int n_req = quick_mode() ? 2 : 4, max_tokens = quick_mode() ? 12 : 24;
    for (int r = 0; r < n_req; r++) {
        struct tok_ids ti = {0};
        tok_encode(tk, texts[r], strlen(texts[r]), TOK_ENCODE_ADD_SPECIAL, &ti, err, sizeof err);
        prompt_len[r] = (int)ti.n;
        memcpy(prompts[r], ti.ids, ti.n * sizeof(int32_t));
        tok_ids_free(&ti);
    }
    tok_free(tk);
    struct td_sampling greedy = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
    static struct run base, spec;
    int ks[2] = {1, 3}, dspark = !strcmp(draft, "dspark");
    dspark_dir_g = NULL;
    if (dspark) ks[1] = 0; // 0: the drafter's block size
    for (int b = 0; b < 2; b++) {
        int n = b ? n_req : 1;
        run(model, "none", 0, n, 64, n, &greedy, 0, NULL, max_tokens, 512, &base);
        for (int ki = 0; ki < 2; ki++) {
            char name[96], extra[128];
            case_begin();
            run(model, draft, ks[ki], n, 64, n, &greedy, 0, NULL, max_tokens, 512, &spec);
            int which = -1;
            CHECK(same_tokens(&spec, &base, &which), "request %d differs from plain decoding",
                  which);
            const struct td_engine_stats *s = &spec.stats;
            double mean = s->rounds ? (double)(s->accepted + s->rounds) / s->rounds : 0;
            CHECK(s->drafted > 0 && (double)s->accepted / s->drafted > min_accept,
                  "acceptance %ld of %ld drafts", s->accepted, s->drafted);
            // position counts: draft j is reached only when every draft before it was accepted
            long sum_acc = 0;
            for (int j = 0; j < TD_MAX_DRAFT; j++) {
                sum_acc += s->accepted_at[j];
                CHECK(s->accepted_at[j] <= s->reached_at[j] &&
                          s->reached_at[j] <= s->proposed_at[j] &&
                          (j == 0 || s->reached_at[j] <= s->accepted_at[j - 1]),
                      "position %d: accepted %ld, reached %ld, proposed %ld", j + 1,
                      s->accepted_at[j], s->reached_at[j], s->proposed_at[j]);
            }
            CHECK(sum_acc == s->accepted && s->reached_at[0] == s->proposed_at[0],
                  "position counts do not add up");
            snprintf(extra, sizeof extra,
                     "(accepted %ld of %ld, mean accepted length %.2f, %ld "
                     "steps vs %ld plain)",
                     s->accepted, s->drafted, mean, s->steps, base.stats.steps);
            snprintf(name, sizeof name, "%s_greedy_equals_plain/tandem-tiny/k%d/b%d", draft, ks[ki],
                     n);
            case_end(name, extra);
        }
        if (!dspark) continue;
        // a confidence cut: rounds stop short of the block, and the verify step (built while
        // the drafts were still in backend memory) verifies the block's rows and keeps the
        // drafts made
        case_begin();
        dspark_threshold_g = 0.5f;
        run(model, draft, 0, n, 64, n, &greedy, 0, NULL, max_tokens, 512, &spec);
        dspark_threshold_g = 0.0f;
        int which = -1;
        CHECK(same_tokens(&spec, &base, &which), "request %d differs from plain decoding", which);
        const struct td_engine_stats *s = &spec.stats;
        CHECK(s->drafted < 5 * s->rounds, "no round was cut (%ld drafts in %ld rounds)", s->drafted,
              s->rounds);
        char name[96], extra[96];
        snprintf(extra, sizeof extra, "(%ld drafts in %ld rounds of up to 5)", s->drafted,
                 s->rounds);
        snprintf(name, sizeof name, "dspark_threshold_greedy_equals_plain/tandem-tiny/b%d", n);
        case_end(name, extra);
    }
    // sampled: the same seed gives the same tokens alone and in a batch (draws are keyed by
    // request seed and position too)
    case_begin();
    struct td_sampling samp = {.temperature = 0.9f, .top_k = 40, .top_p = 0.95f, .seed = 77};
    static struct run a, bb;
    run(model, draft, 3, 1, 64, 1, &samp, 1, NULL, max_tokens, 512, &a);
    run(model, draft, 3, n_req, 64, n_req, &samp, 0, NULL, max_tokens, 512, &bb);
    CHECK(a.n_out[0] == bb.n_out[1] && !memcmp(a.out[0], bb.out[1], (size_t)a.n_out[0] * 4),
          "a sampled request differs alone and in a batch");
    char name[96];
    snprintf(name, sizeof name, "%s_sampled_batch_invariant", draft);
    case_end(name, "");
}

/* sampled speculation keeps the target's distribution: the third token of 512 sampled
 * completions (drafted by MTP or DSpark and verified with the q it was drawn from) has the same
 * histogram as without a drafter: a two-sample chi-square over the tokens seen >= 10 times, the
 * rest pooled (Wilson-Hilferty z < 4.5). Power is modest at this size (a q taken at T = 0.3 instead
 * of the drafting T = 1 moved z from -1.5 to 2.1): it catches gross wiring errors end to end;
 * the sampler's exactness and the power of the test itself are shown in test_verify.c. */
static void drafter_distribution(const char *draft) {
    const char *model = "models/tandem-tiny";
    char err[512];
    int N = 512;
    static int counts[2][8192];
    memset(counts, 0, sizeof counts);
    case_begin();
    for (int pass = 0; pass < 2; pass++) {
        struct td_engine_params ep = td_engine_defaults();
        ep.model_dir = model;
        ep.backend = "cpu";
        ep.draft = pass ? draft : "none";
        ep.max_draft = pass ? 2 : 0;
        ep.max_seqs = 64;
        ep.max_ctx = 64;
        struct td_engine *e;
        if (td_engine_init(&e, &ep, err, sizeof err)) {
            case_fail("%s", err);
            break;
        }
        int32_t prompt[3] = {0, 269, 1071};
        int *ids = malloc((size_t)N * sizeof *ids);
        for (int i = 0; i < N; i++) {
            // seeds differ between the passes: two independent samples of one distribution
            struct td_request_params rp = {.prompt = prompt,
                                           .n_prompt = 3,
                                           .max_tokens = 3,
                                           .sampling = {.temperature = 1.0f,
                                                        .top_k = 0,
                                                        .top_p = 1.0f,
                                                        .seed = (uint64_t)(pass * 100000 + i)},
                                           .ignore_eos = 1};
            ids[i] = td_engine_submit(e, &rp, err, sizeof err);
        }
        while (td_engine_step(e, err, sizeof err) > 0) {
        }
        for (int i = 0; i < N; i++) {
            const int32_t *t;
            int nt;
            td_engine_output(e, ids[i], &t, &nt, NULL, NULL, NULL);
            if (nt == 3) counts[pass][t[2]]++;
        }
        if (pass) CHECK(td_engine_stats(e)->accepted > 0, "no %s draft was accepted", draft);
        free(ids);
        td_engine_free(e);
    }
    double chi = 0;
    int df = -1;
    long pool[2] = {0, 0};
    for (int v = 0; v < 8192; v++) {
        int a = counts[0][v], b = counts[1][v];
        if (a + b < 10) {
            pool[0] += a, pool[1] += b;
            continue;
        }
        double ea = (a + b) / 2.0;
        chi += (a - ea) * (a - ea) / ea + (b - ea) * (b - ea) / ea;
        df++;
    }
    if (pool[0] + pool[1] > 0) {
        double ea = (pool[0] + pool[1]) / 2.0;
        chi += (pool[0] - ea) * (pool[0] - ea) / ea + (pool[1] - ea) * (pool[1] - ea) / ea;
        df++;
    }
    double z = 0;
    if (df > 0) {
        double h = 2.0 / (9.0 * df);
        z = (pow(chi / df, 1.0 / 3.0) - (1.0 - h)) / sqrt(h);
    }
    CHECK(df >= 3 && z < 4.5, "chi-square %.1f on %d df (z = %.2f)", chi, df, z);
    char extra[96];
    snprintf(extra, sizeof extra, "(chi-square %.1f on %d df, z = %.2f)", chi, df, z);
    char name[96];
    snprintf(name, sizeof name, "%s_sampled_keeps_target_distribution", draft);
    case_end(name, extra);
}

/* td_engine_output_sources: greedy DSpark on tandem-tiny, three requests, the middle one with
 * no_draft. Each request's marked tokens (an accepted draft at position j follows one at j - 1,
 * a target token opens every round) number its accepted drafts; the no_draft request verifies
 * none and marks none, and its tokens are the drafted requests' (speculation is lossless). */
static void token_sources(void) {
    case_begin();
    char err[512];
    struct td_engine_params ep = td_engine_defaults();
    ep.model_dir = "models/tandem-tiny";
    ep.draft = "dspark";
    ep.draft_policy = TD_POLICY_FIXED; // every draft verified: the marks have power
    ep.backend = "cpu";
    ep.max_seqs = 3;
    ep.max_ctx = 512;
    ep.max_cache_bytes = (size_t)1 << 30;
    struct td_engine *e;
    if (td_engine_init(&e, &ep, err, sizeof err)) {
        case_fail("engine init: %s", err);
        case_end("engine/token_sources", "");
        return;
    }
    int ids[3];
    for (int i = 0; i < 3; i++) {
        struct td_request_params rp = {.prompt = prompts[7],
                                       .n_prompt = prompt_len[7],
                                       .max_tokens = 40,
                                       .sampling = {.temperature = 0.0f, .top_p = 1.0f},
                                       .ignore_eos = 1,
                                       .no_draft = i == 1};
        ids[i] = td_engine_submit(e, &rp, err, sizeof err);
        CHECK(ids[i] >= 0, "submit: %s", err);
    }
    int live, steps = 0;
    while ((live = td_engine_step(e, err, sizeof err)) > 0 && steps++ < 10000) {
    }
    CHECK(live == 0, "engine step: %s", err);
    const int32_t *t[3];
    int n[3];
    long marked_all = 0;
    for (int i = 0; i < 3; i++) {
        const uint8_t *src;
        struct td_request_stats st;
        td_engine_output(e, ids[i], &t[i], &n[i], NULL, NULL, NULL);
        CHECK(!td_engine_output_sources(e, ids[i], &src), "no sources for request %d", i);
        td_engine_request_stats(e, ids[i], &st);
        long marked = 0;
        for (int k = 0; k < n[i]; k++) {
            marked += src[k] != TD_SRC_TARGET;
            CHECK(src[k] == TD_SRC_TARGET || (k > 0 && src[k] == (k ? src[k - 1] : 0) + 1),
                  "request %d token %d: source %d after %d", i, k, src[k], k ? src[k - 1] : -1);
        }
        CHECK(src[0] == TD_SRC_TARGET, "request %d opens with a draft", i);
        CHECK(marked == st.accepted, "request %d: %ld tokens marked as drafts, %ld accepted", i,
              marked, st.accepted);
        if (i == 1) CHECK(st.drafted == 0, "the no_draft request verified %ld drafts", st.drafted);
        marked_all += marked;
    }
    CHECK(marked_all > 0, "no accepted drafts at all: the check has no power");
    for (int i = 1; i < 3; i++)
        CHECK(n[i] == n[0] && !memcmp(t[i], t[0], (size_t)n[0] * sizeof(int32_t)),
              "request %d's tokens differ from request 0's", i);
    // a stop string cut at half the output: the drafts after the cut leave the count
    const uint8_t *src;
    td_engine_output_sources(e, ids[2], &src);
    int keep = n[2] / 2;
    long kept = 0, kept_at[TD_MAX_DRAFT] = {0}, cut = 0;
    for (int k = 0; k < n[2]; k++) {
        if (k < keep && src[k] != TD_SRC_TARGET) kept++, kept_at[src[k] - 1]++;
        cut += k >= keep && src[k] != TD_SRC_TARGET;
    }
    CHECK(!td_engine_stop_at(e, ids[2], keep), "stop_at %d refused", keep);
    struct td_request_stats st;
    td_engine_request_stats(e, ids[2], &st);
    CHECK(cut > 0, "no accepted draft after the cut: the check has no power");
    CHECK(st.accepted == kept, "after the cut: %ld accepted, the output holds %ld", st.accepted,
          kept);
    for (int j = 0; j < TD_MAX_DRAFT; j++)
        CHECK(st.accepted_at[j] == kept_at[j], "after the cut, position %d: %ld accepted, %ld kept",
              j + 1, st.accepted_at[j], kept_at[j]);
    td_engine_free(e);
    case_end("engine/token_sources", "");
}

/* the adaptive policy on tandem-tiny with DSpark, greedy, 4 requests, fed costs by the test seam:
 * whatever it chooses the tokens are plain decoding's; with flat costs it verifies every draft
 * offered, with a drafting step costing 100 plain ones none (every step plain: the drafter off),
 * and with a drafting step costing 1.5 plain ones (whatever its rows) it drafts and verifies every
 * draft. Synthetic acceptance (1, 1, 0): every round that offers 3 drafts accepts exactly 2. */
static double cost_flat(void *ctx, int drafting, int rows) {
    (void)ctx, (void)drafting, (void)rows;
    return 1.0;
}
static double cost_draft100(void *ctx, int drafting, int rows) {
    (void)ctx, (void)rows;
    return drafting ? 100.0 : 1.0;
}
static double cost_draft15(void *ctx, int drafting, int rows) {
    (void)ctx, (void)rows;
    return drafting ? 1.5 : 1.0;
}

static long switch_calls;
static double cost_switch(void *ctx, int drafting, int rows) {
    (void)ctx, (void)rows;
    return drafting && switch_calls++ < 100 ? 100.0 : 1.0;
}

static long alt_calls;
static double cost_alternate(void *ctx, int drafting, int rows) {
    (void)ctx, (void)rows;
    return drafting && (alt_calls++ / 40) % 4 ? 100.0 : 1.0;
}

/* the stats' sum over the batch buckets of one of their per-bucket counts */
static long bucket_sum(const long *v) {
    long t = 0;
    for (int b = 0; b < TD_BATCH_BUCKETS; b++)
        t += v[b];
    return t;
}

/* adaptive_policy's runs: 4 greedy requests on tandem-tiny (policy_run: with draft at the seam
 * cost_g, checked token for token against plain decoding's, policy_base; its stats) */
static struct run policy_base, policy_spec;
static void policy_runs(const char *draft, int k, struct run *out) {
    struct td_sampling greedy = {.temperature = 0.0f, .top_p = 1.0f};
    run("models/tandem-tiny", draft, k, 4, 64, 4, &greedy, 0, NULL, quick_mode() ? 16 : 32, 512,
        out);
}
static const struct td_engine_stats *policy_run(const char *draft, int k) {
    policy_runs(draft, k, &policy_spec);
    int which = -1;
    CHECK(same_tokens(&policy_spec, &policy_base, &which), "request %d differs from plain decoding",
          which);
    return &policy_spec.stats;
}

static void adaptive_policy(void) {
    policy_runs("none", 0, &policy_base);
    struct {
        const char *name;
        double (*cost)(void *, int, int);
    } regimes[3] = {{.name = "flat", .cost = cost_flat},
                    {.name = "drafting_100x", .cost = cost_draft100},
                    {.name = "drafting_1.5x", .cost = cost_draft15}};
    policy_g = TD_POLICY_ADAPTIVE;
    for (int i = 0; i < 3; i++) {
        case_begin();
        cost_g = regimes[i].cost;
        const struct td_engine_stats *s = policy_run("dspark", 0);
        long steps = bucket_sum(s->batch_steps), wanted = bucket_sum(s->batch_wanted),
             drafts = bucket_sum(s->batch_drafts);
        if (i == 0)
            CHECK(drafts == wanted && drafts > 0, "flat: %ld of %ld drafts", drafts, wanted);
        if (i == 1) // no drafting step pays: every decoding step is plain, and each decision
            // after the first is made behind the step queued next (off the critical path)
            CHECK(wanted == 0 && s->plain_steps == steps && s->decisions_queued >= steps - 3,
                  "drafting 100x: %ld drafts offered, %ld plain steps of %ld, %ld decisions "
                  "queued",
                  wanted, s->plain_steps, steps, s->decisions_queued);
        if (i != 1)
            CHECK(s->decisions_queued == 0, "%ld decisions queued while drafting",
                  s->decisions_queued);
        if (i == 2) // 4 sequences commit well over 1.5 x 4 tokens a drafting step: it drafts
            CHECK(drafts == wanted && drafts > 0 && s->plain_steps == 0,
                  "drafting 1.5x: %ld of %ld drafts, %ld plain steps", drafts, wanted,
                  s->plain_steps);
        char name[96], extra[128];
        snprintf(extra, sizeof extra, "(%ld of %ld drafts verified, %ld plain steps of %ld)",
                 drafts, wanted, s->plain_steps, steps);
        snprintf(name, sizeof name, "engine/adaptive_policy_%s", regimes[i].name);
        case_end(name, extra);
    }
    // plain, then drafting pays from the seam's 100th call on: the queued decision sees it
    // and the steps after it draft; the tokens are plain decoding's
    case_begin();
    cost_g = cost_switch;
    switch_calls = 0;
    {
        const struct td_engine_stats *s = policy_run("dspark", 0);
        long drafts = bucket_sum(s->batch_drafts);
        CHECK(s->plain_steps > 0 && s->decisions_queued > 0 && drafts > 0,
              "%ld plain steps, %ld decisions queued, then %ld drafts verified", s->plain_steps,
              s->decisions_queued, drafts);
        char extra[128];
        snprintf(extra, sizeof extra, "(%ld plain steps, %ld decisions queued, %ld drafts)",
                 s->plain_steps, s->decisions_queued, drafts);
        case_end("engine/adaptive_policy_plain_then_drafting", extra);
    }
    // drafting that pays now and then (the seam's calls 0-39, 160-199, ...): the drafter falls
    // behind between and catches up; the tokens are plain decoding's
    {
        case_begin();
        cost_g = cost_alternate;
        alt_calls = 0;
        const struct td_engine_stats *s = policy_run("mtp", 3);
        CHECK(s->caught_rows > 0, "no catch-up (%ld plain steps)", s->plain_steps);
        char extra[128];
        snprintf(extra, sizeof extra, "(%ld rows caught up, %ld steps)", s->caught_rows, s->steps);
        case_end("engine/adaptive_policy_catch_ups", extra);
    }
    // synthetic acceptance: drafts 1 and 2 always, 3 never
    case_begin();
    cost_g = cost_flat;
    synth_g[0] = synth_g[1] = 1.0f, synth_g[2] = 0.0f, n_synth_g = 3;
    policy_runs("dspark", 3, &policy_spec);
    const struct td_engine_stats *s = &policy_spec.stats;
    CHECK(s->proposed_at[2] > 0 && s->accepted_at[0] == s->proposed_at[0] &&
              s->accepted_at[1] == s->proposed_at[1] && s->accepted_at[2] == 0,
          "position 1: %ld of %ld, 2: %ld of %ld, 3: %ld of %ld", s->accepted_at[0],
          s->proposed_at[0], s->accepted_at[1], s->proposed_at[1], s->accepted_at[2],
          s->proposed_at[2]);
    n_synth_g = 0;
    case_end("engine/synthetic_acceptance", "");
    policy_g = TD_POLICY_FIXED, cost_g = NULL;
}

/* the automatic row budget (max_batch_tokens 0): 256 rows without a model drafter, and with
 * MTP or DSpark a full round of every slot when that is more; a budget given is kept. Graphs
 * serve every step of the budget up to TD_GRAPH_ROWS, and a full verify round past that */
static void auto_rows(void) {
    struct {
        const char *draft;
        int k, seqs, given, want, graph;
    } t[] = {
        {"none", 0, 64, 0, 256, 256},     {"mtp", 3, 16, 0, 256, 256},
        {"mtp", 3, 100, 0, 400, 400},     {"dspark", 0, 64, 0, 384, 384},
        {"dspark", 2, 64, 0, 256, 256},   {"dspark", 0, 64, 128, 128, 128},
        {"ngram", 3, 100, 0, 256, 256},   {"none", 0, 8, 64, 64, 128},
        {"none", 0, 8, 2048, 2048, 1024}, {"mtp", 3, 400, 2048, 2048, 1600},
    };
    case_begin();
    char err[512], extra[200] = "";
    int o = 0;
    for (size_t i = 0; i < sizeof t / sizeof *t && !check_case_failed; i++) {
        struct td_engine_params ep = td_engine_defaults();
        ep.model_dir = "models/tandem-tiny";
        ep.backend = "cpu";
        ep.draft = t[i].draft;
        ep.max_draft = t[i].k;
        ep.max_seqs = t[i].seqs;
        ep.max_ctx = 64;
        ep.max_batch_tokens = t[i].given;
        struct td_engine *e;
        CHECK(!td_engine_init(&e, &ep, err, sizeof err), "%s: %s", t[i].draft, err);
        if (check_case_failed) break;
        CHECK(td_engine_rows(e) == t[i].want, "%s k %d, %d slots, given %d: %d rows, want %d",
              t[i].draft, t[i].k, t[i].seqs, t[i].given, td_engine_rows(e), t[i].want);
        CHECK(td_engine_graph_rows(e) == t[i].graph,
              "%s k %d, %d slots, given %d: graphs up to %d rows, want %d", t[i].draft, t[i].k,
              t[i].seqs, t[i].given, td_engine_graph_rows(e), t[i].graph);
        o += snprintf(extra + o, sizeof extra - (size_t)o, "%s%s/%d:%d", i ? " " : "(", t[i].draft,
                      t[i].seqs, td_engine_rows(e));
        td_engine_free(e);
    }
    if (o) snprintf(extra + o, sizeof extra - (size_t)o, ")");
    case_end("engine/auto_rows", extra);
}

/* a 300-token prompt (ids by a fixed rule) arriving while a short one decodes, prefill_chunk
 * 0 (the row budget's 256) or 16: the most rows a step took after it arrived, the steps that
 * held prompt rows beside the two requests' anchors, and both requests' tokens */
static int prefill_run(int chunk, int32_t (*out)[64], int *n_out, int *most_rows, int *steps) {
    char err[512];
    static int32_t longp[300];
    for (int i = 0; i < 300; i++)
        longp[i] = (int32_t)((i * 37 + (i % 11) * 5) % 8000 + 2);
    struct td_engine_params ep = td_engine_defaults();
    ep.model_dir = "models/tandem-tiny";
    ep.backend = "cpu";
    ep.max_seqs = 2;
    ep.max_ctx = 512;
    ep.max_cache_bytes = (size_t)1 << 30;
    ep.prefill_chunk = chunk;
    struct td_engine *e;
    if (td_engine_init(&e, &ep, err, sizeof err)) {
        case_fail("engine init: %s", err);
        return -1;
    }
    struct td_request_params rp = {.prompt = longp,
                                   .n_prompt = 6,
                                   .max_tokens = 40,
                                   .sampling = {.temperature = 0.0f, .top_p = 1.0f},
                                   .ignore_eos = 1};
    int ids[2];
    ids[0] = td_engine_submit(e, &rp, err, sizeof err);
    *most_rows = 0, *steps = 0;
    long rows0 = 0;
    for (int s = 0; s < 1000; s++) {
        if (s == 3) { // the short one decodes: the long one arrives
            rp.n_prompt = 300, rp.max_tokens = 8;
            ids[1] = td_engine_submit(e, &rp, err, sizeof err);
        }
        int live = td_engine_step(e, err, sizeof err);
        const struct td_engine_stats *st = td_engine_stats(e);
        int rows = (int)(st->rows - rows0);
        rows0 = st->rows;
        if (s >= 3 && rows > *most_rows) *most_rows = rows;
        if (s >= 3 && rows > 2) ++*steps;
        if (live <= 0 && s >= 3) break;
    }
    for (int i = 0; i < 2; i++) {
        const int32_t *tk;
        td_engine_output(e, ids[i], &tk, &n_out[i], NULL, NULL, NULL);
        memcpy(out[i], tk, (size_t)n_out[i] * sizeof(int32_t));
    }
    td_engine_free(e);
    return 0;
}

static void prefill_chunk(void) {
    case_begin();
    static int32_t a[2][64], b[2][64];
    int na[2], nb[2], most_a, most_b, steps_a, steps_b;
    prefill_run(0, a, na, &most_a, &steps_a);
    prefill_run(16, b, nb, &most_b, &steps_b);
    // uncapped the prompt fills the budget's 256 rows beside the decoding anchor (255 + 45);
    // capped, a step holds the anchors and 16 prompt rows (18 x 16 + 12)
    CHECK(most_a > 17 && most_b == 17, "most rows a step: %d uncapped, %d with 16", most_a, most_b);
    CHECK(steps_a == 2 && steps_b == 19, "steps with prompt rows: %d uncapped, %d capped", steps_a,
          steps_b);
    for (int i = 0; i < 2; i++)
        CHECK(na[i] == nb[i] && !memcmp(a[i], b[i], (size_t)na[i] * sizeof(int32_t)),
              "request %d's tokens differ with the cap", i);
    CHECK(na[0] == 40 && na[1] == 8, "%d and %d tokens", na[0], na[1]);
    char extra[96];
    snprintf(extra, sizeof extra, "(most rows a step %d -> %d, prompt steps %d -> %d)", most_a,
             most_b, steps_a, steps_b);
    case_end("engine/prefill_chunk_caps_prompt_rows", extra);
    struct td_engine_params ep = td_engine_defaults();
    ep.model_dir = "models/tandem-tiny";
    ep.backend = "cpu";
    ep.prefill_chunk = -1;
    struct td_engine *e;
    char err[256] = "";
    case_begin();
    CHECK(td_engine_init(&e, &ep, err, sizeof err) && strstr(err, "prefill_chunk"),
          "prefill_chunk -1 taken or refused without naming it: %s", err);
    case_end("engine/prefill_chunk_negative_refused", "");
}

/* the bytes of every logits row an engine verified (its logits hook), FNV-1a */
static uint64_t rows_hash;
static void hash_rows(void *ctx, int request, long position, float *row, int vocab) {
    (void)ctx, (void)request, (void)position;
    rows_hash = fnv1a(rows_hash, row, (size_t)vocab * sizeof *row);
}

/* the prefix cache's engine on tandem-tiny (prefix_blocks 0: off) */
static struct td_engine *prefix_engine(int blocks, int max_seqs, const char *draft) {
    char err[512];
    struct td_engine_params ep = td_engine_defaults();
    ep.model_dir = "models/tandem-tiny";
    ep.backend = "cpu";
    ep.max_seqs = max_seqs;
    ep.max_ctx = 640;
    ep.max_cache_bytes = (size_t)1 << 30;
    ep.prefix_blocks = blocks;
    ep.logits_hook = hash_rows;
    if (draft) ep.draft = draft, ep.max_draft = 3, ep.draft_policy = TD_POLICY_FIXED; // (no clock)
    struct td_engine *e;
    if (td_engine_init(&e, &ep, err, sizeof err)) {
        case_fail("engine init: %s", err);
        return NULL;
    }
    return e;
}

/* n requests of the prompts p[i] (len[i] ids) submitted together, run to the end: their tokens
 * (up to 12) and the prompt tokens each took from the cache; returns the hash of every logits
 * row verified */
static uint64_t prefix_run(struct td_engine *e, int n, const int32_t *const *p, const int *len,
                           const struct td_sampling *samp, int32_t (*out)[12], int *n_out,
                           int *cached) {
    char err[512];
    TD_ASSERT(n <= 8);
    rows_hash = 0xcbf29ce484222325ull;
    int ids[8];
    for (int i = 0; i < n; i++) {
        struct td_request_params rp = {.prompt = p[i],
                                       .n_prompt = len[i],
                                       .max_tokens = 12,
                                       .sampling = *samp,
                                       .ignore_eos = 1};
        ids[i] = td_engine_submit(e, &rp, err, sizeof err);
        CHECK(ids[i] >= 0, "submit: %s", err);
    }
    for (int s = 0; s < 200 && td_engine_step(e, err, sizeof err) > 0; s++) {
    }
    for (int i = 0; i < n; i++) {
        const int32_t *t;
        struct td_request_stats rs;
        td_engine_output(e, ids[i], &t, &n_out[i], NULL, NULL, NULL);
        memcpy(out[i], t, (size_t)n_out[i] * sizeof(int32_t));
        CHECK(!td_engine_request_stats(e, ids[i], &rs), "request stats");
        cached[i] = rs.cached_tokens;
        td_engine_release(e, ids[i]);
    }
    return rows_hash;
}

static int same12(const int32_t *a, int na, const int32_t *b, int nb) {
    return na == nb && !memcmp(a, b, (size_t)na * sizeof(int32_t));
}

static void prefix_cache(void) {
    static int32_t P[520], Q[520], R[520], E[512];
    for (int i = 0; i < 520; i++) {
        P[i] = (int32_t)((i * 7919 + 13) % 8000 + 2);
        Q[i] = i < 300 ? P[i] : (int32_t)((i * 104729 + 5) % 8000 + 2);
        R[i] = (int32_t)((i * 31 + 17) % 7000 + 100);
        if (i < 512) E[i] = P[i];
    }
    struct td_sampling greedy = {.temperature = 0.0f, .top_p = 1.0f},
                       sampled = {.temperature = 1.0f, .top_p = 1.0f, .seed = 7};
    const int32_t *ps[5] = {P, P, Q, E, P};
    int lens[5] = {520, 520, 520, 512, 520};
    const struct td_sampling *smp[5] = {&greedy, &greedy, &greedy, &greedy, &sampled};
    // what each takes: P again all but its last token (inside the first P's tail, whose
    // checkpoint at 531 serves 519); Q, sharing 300 with P, the first block (P's second block
    // shares 44 more, but its checkpoint at 512 is more than the chunk past 300); E (P's first
    // 512) 511, inside P's second block; P sampled its two blocks (P's tail gone for E's)
    int want[5] = {0, 519, 256, 511, 512};
    static int32_t cold[5][12], warm[5][12];
    int nc[5], nw[5], cc[5], cw[5];

    case_begin();
    struct td_engine *off = prefix_engine(0, 1, NULL), *on = prefix_engine(8, 1, NULL);
    // one request at a time in the one slot, another prompt between them (its rings hold that
    // prompt's rows, not the next one's: what a hit uses is what it loaded)
    const int32_t *rp1 = R;
    int lr = 520, nr, cr;
    static int32_t orr[1][12];
    for (int i = 0; off && on && i < 5; i++) {
        uint64_t hc = prefix_run(off, 1, &ps[i], &lens[i], smp[i], &cold[i], &nc[i], &cc[i]);
        prefix_run(on, 1, &rp1, &lr, &greedy, orr, &nr, &cr);
        uint64_t hw = prefix_run(on, 1, &ps[i], &lens[i], smp[i], &warm[i], &nw[i], &cw[i]);
        CHECK(hc == hw, "request %d (%d cached): other logits than without the cache", i, cw[i]);
        CHECK(cw[i] == want[i], "request %d took %d tokens from the cache, not %d", i, cw[i],
              want[i]);
        CHECK(same12(cold[i], nc[i], warm[i], nw[i]) && nc[i] == 12,
              "request %d (%d cached): other tokens than without the cache", i, cw[i]);
    }
    CHECK(!same12(cold[4], nc[4], cold[0], nc[0]), "the sampled run drew the greedy tokens");
    struct td_prefix_stats st;
    // cached: every one of the 8 checkpoints' blocks (R's, P's and Q's full blocks and the
    // requests' tails, 10 in all, the least recently used leaves evicted)
    CHECK(on && !td_engine_prefix_stats(on, &st) && st.lookups == 10 && st.hits == 8 &&
              st.cached == 8,
          "lookups %ld, hits %ld, cached %d", st.lookups, st.hits, st.cached);
    CHECK(off && td_engine_prefix_stats(off, &st) == -1, "stats of an engine without the cache");
    td_engine_free(off), td_engine_free(on);
    case_end("engine/prefix_warm_equals_cold", "");

    case_begin();
    struct td_engine *small = prefix_engine(2, 2, NULL);
    const int32_t *pr[3] = {P, R, P};
    int l3[3] = {520, 520, 520}, n3[3], c3[3];
    static int32_t o3[3][12];
    for (int i = 0; small && i < 3; i++)
        prefix_run(small, 1, &pr[i], &l3[i], &greedy, &o3[i], &n3[i], &c3[i]);
    CHECK(c3[0] == 0 && c3[1] == 0 && c3[2] == 0, "cached %d %d %d: P's blocks were evicted by R's",
          c3[0], c3[1], c3[2]);
    CHECK(same12(o3[0], n3[0], cold[0], nc[0]) && same12(o3[2], n3[2], cold[0], nc[0]),
          "P's tokens changed");
    CHECK(small && !td_engine_prefix_stats(small, &st) && st.evictions == 4 && st.cached == 2,
          "evictions %ld, cached %d", st.evictions, st.cached);
    td_engine_free(small);
    case_end("engine/prefix_eviction", "");

    case_begin();
    struct td_engine *two = prefix_engine(8, 2, NULL);
    const int32_t *pp[2] = {P, P};
    int l2[2] = {520, 520}, n2[2], c2[2];
    static int32_t o2[2][12];
    if (two) prefix_run(two, 2, pp, l2, &greedy, o2, n2, c2);
    CHECK(c2[0] == 0 && c2[1] == 0, "cached %d and %d at once", c2[0], c2[1]);
    CHECK(same12(o2[0], n2[0], cold[0], nc[0]) && same12(o2[1], n2[1], cold[0], nc[0]),
          "other tokens");
    // the two blocks and the tail, each published twice
    CHECK(two && !td_engine_prefix_stats(two, &st) && st.dedups == 3 && st.cached == 3,
          "published twice %ld, cached %d", st.dedups, st.cached);
    td_engine_free(two);
    case_end("engine/prefix_concurrent_dedup", "");

    // six requests sharing P's first 512 tokens, each its own last 8, at once after P ran
    // alone: each takes 512 tokens from the cache (the same two blocks, held six times over),
    // with the tokens of an engine without it (the logits hash is of rows in step order, which
    // differs with the steps' rows)
    case_begin();
    {
        struct td_engine *c0 = prefix_engine(0, 6, NULL), *c1 = prefix_engine(8, 6, NULL);
        static int32_t six[6][520];
        const int32_t *p6[6];
        int l6[6], n0[6], n1[6], k0[6], k1[6];
        static int32_t o0[6][12], o1[6][12];
        for (int j = 0; j < 6; j++) {
            memcpy(six[j], P, sizeof six[j]);
            for (int i = 512; i < 520; i++)
                six[j][i] = (int32_t)(100 + 37 * j + i);
            p6[j] = six[j], l6[j] = 520;
        }
        if (c0 && c1) {
            int one = 520, kk, nn;
            int32_t oo[1][12];
            const int32_t *pp0 = P;
            prefix_run(c1, 1, &pp0, &one, &greedy, oo, &nn, &kk);
            prefix_run(c0, 6, p6, l6, &greedy, o0, n0, k0);
            prefix_run(c1, 6, p6, l6, &greedy, o1, n1, k1);
            int all = 1;
            for (int j = 0; j < 6; j++)
                all &= k1[j] == 512 && same12(o0[j], n0[j], o1[j], n1[j]) && n0[j] == 12;
            CHECK(all, "a request took %d %d %d %d %d %d tokens from the cache, or other tokens",
                  k1[0], k1[1], k1[2], k1[3], k1[4], k1[5]);
            struct td_prefix_stats st;
            CHECK(!td_engine_prefix_stats(c1, &st) && st.in_use == 0 && st.dedups == 0,
                  "held %d, published twice %ld", st.in_use, st.dedups);
        }
        td_engine_free(c0), td_engine_free(c1);
    }
    case_end("engine/prefix_shared_by_many", "");

    // the model drafters: a hit leaves their window (128) of the prompt to prefill, which
    // rebuilds their rings (one block of the 520 tokens, not two); the same logits and tokens
    const char *dr[2] = {"mtp", "dspark"};
    for (int d = 0; d < 2; d++) {
        case_begin();
        struct td_engine *dc = prefix_engine(0, 1, dr[d]), *dw = prefix_engine(8, 1, dr[d]);
        const int32_t *pp1 = P;
        int l1 = 520, n1a, n1b, c1a, c1b;
        static int32_t oa[1][12], ob[1][12];
        for (int k = 0; dc && dw && k < 2; k++) {
            const struct td_sampling *sm = k ? &sampled : &greedy;
            uint64_t hc = prefix_run(dc, 1, &pp1, &l1, sm, oa, &n1a, &c1a);
            prefix_run(dw, 1, &pp1, &l1, sm, ob, &n1b, &c1b); // cold (k 0) or warm
            prefix_run(dw, 1, &rp1, &lr, &greedy, orr, &nr, &cr);
            uint64_t hw = prefix_run(dw, 1, &pp1, &l1, sm, ob, &n1b, &c1b);
            CHECK(c1b == 391, "%s: %d tokens from the cache, not 391 (its window prefilled)", dr[d],
                  c1b);
            CHECK(hc == hw, "%s, %s: other logits than without the cache", dr[d],
                  k ? "sampled" : "greedy");
            CHECK(same12(oa[0], n1a, ob[0], n1b), "%s, %s: other tokens", dr[d],
                  k ? "sampled" : "greedy");
        }
        const struct td_engine_stats *es = dw ? td_engine_stats(dw) : NULL;
        CHECK(es && es->drafted > 0, "%s drafted nothing", dr[d]);
        td_engine_free(dc), td_engine_free(dw);
        char name[64];
        snprintf(name, sizeof name, "engine/prefix_with_%s", dr[d]);
        case_end(name, "");
    }

    // published blocks are frozen: a request on them that decodes past a block boundary with
    // the random drafter (rejections on both sides of it) leaves their bytes as they were
    case_begin();
    char err[512] = "";
    struct td_engine_params ep = td_engine_defaults();
    ep.model_dir = "models/tandem-tiny";
    ep.backend = "cpu";
    ep.max_seqs = 1, ep.max_ctx = 1024, ep.max_cache_bytes = (size_t)1 << 30;
    // 2 checkpoints: the hit's blocks hold both, so the blocks the decode completes are not
    // published and the checksum covers the hit's alone
    ep.prefix_blocks = 2, ep.draft = "random", ep.max_draft = 3;
    ep.draft_policy = TD_POLICY_FIXED;
    struct td_engine *e;
    CHECK(!td_engine_init(&e, &ep, err, sizeof err), "engine init: %s", err);
    if (!check_case_failed) {
        struct td_request_params rp = {
            .prompt = P, .n_prompt = 520, .max_tokens = 1, .sampling = greedy, .ignore_eos = 1};
        int id = td_engine_submit(e, &rp, err, sizeof err);
        while (td_engine_step(e, err, sizeof err) > 0) {
        }
        td_engine_release(e, id);
        uint64_t before = td_engine_prefix_checksum(e);
        rp.max_tokens = 300; // positions 520 .. 820: past the boundary at 768
        id = td_engine_submit(e, &rp, err, sizeof err);
        while (td_engine_step(e, err, sizeof err) > 0) {
        }
        struct td_request_stats rs;
        const struct td_engine_stats *es = td_engine_stats(e);
        CHECK(!td_engine_request_stats(e, id, &rs) && rs.cached_tokens == 512,
              "the second request took %d tokens from the cache", rs.cached_tokens);
        CHECK(es->drafted > es->accepted && es->accepted >= 0 && es->drafted > 100,
              "random drafts verified %ld, accepted %ld", es->drafted, es->accepted);
        CHECK(before != 0 && td_engine_prefix_checksum(e) == before,
              "the published blocks' bytes changed");
        td_engine_release(e, id);
        td_engine_free(e);
    }
    case_end("engine/prefix_blocks_frozen", "");

    // a block its decode steps complete is published too, and at its finish what it committed
    // past its last full block (a tail): a 200-token prompt decoding 100 tokens crosses 256 and
    // commits 299; the next turn (that prompt, the reply, 150 more ids) takes all 299 tokens
    // from the cache (the full block and a copy of the tail) with the logits and tokens of an
    // engine without it; with a model drafter too, whose window (128) before the prompt's end
    // the hit leaves to prefill
    const char *tdr[3] = {NULL, "mtp", "dspark"};
    for (int d = 0; d < 3; d++) {
        case_begin();
        struct td_engine *c0 = prefix_engine(0, 1, tdr[d]), *c1 = prefix_engine(8, 1, tdr[d]);
        static int32_t turn2[450];
        int n2 = 0;
        for (int k = 0; c0 && c1 && k < 2; k++) {
            struct td_engine *e = k ? c1 : c0;
            struct td_request_params rp = {.prompt = P,
                                           .n_prompt = 200,
                                           .max_tokens = 100,
                                           .sampling = greedy,
                                           .ignore_eos = 1};
            int id = td_engine_submit(e, &rp, err, sizeof err);
            while (td_engine_step(e, err, sizeof err) > 0) {
            }
            const int32_t *t;
            int nt;
            td_engine_output(e, id, &t, &nt, NULL, NULL, NULL);
            CHECK(nt == 100, "the first turn made %d tokens", nt);
            if (!k) { // the next turn's prompt: the first's, its reply, then 150 more ids
                memcpy(turn2, P, 200 * sizeof(int32_t));
                memcpy(turn2 + 200, t, (size_t)nt * sizeof(int32_t));
                for (n2 = 200 + nt; n2 < 450; n2++)
                    turn2[n2] = R[n2];
            }
            td_engine_release(e, id);
        }
        const int32_t *p2 = turn2;
        int32_t o0[1][12], o1[1][12];
        int m0 = 0, m1 = 0, k0 = 0, k1 = 0;
        uint64_t h0 = c0 ? prefix_run(c0, 1, &p2, &n2, &greedy, o0, &m0, &k0) : 0;
        uint64_t h1 = c1 ? prefix_run(c1, 1, &p2, &n2, &greedy, o1, &m1, &k1) : 1;
        CHECK(c1 && k1 == 299, "the next turn took %d tokens from the cache, not 299", k1);
        CHECK(h0 == h1 && same12(o0[0], m0, o1[0], m1) && m0 == 12,
              "the next turn's logits or tokens differ from an engine without the cache");
        // a short next turn (20 ids after the reply): with a drafter the hit ends 128 before
        // its end, at 191, inside the first block, whose checkpoint (taken as the decode crossed
        // 256) serves it: the rings keep the drafter's window more than a verify step's rows
        int ns = 320, want = d ? 191 : 299;
        h0 = c0 ? prefix_run(c0, 1, &p2, &ns, &greedy, o0, &m0, &k0) : 0;
        h1 = c1 ? prefix_run(c1, 1, &p2, &ns, &greedy, o1, &m1, &k1) : 1;
        CHECK(c1 && k1 == want, "a short next turn took %d tokens from the cache, not %d", k1,
              want);
        CHECK(h0 == h1 && same12(o0[0], m0, o1[0], m1) && m0 == 12,
              "a short next turn's logits or tokens differ from an engine without the cache");
        td_engine_free(c0), td_engine_free(c1);
        char name[64];
        snprintf(name, sizeof name, "engine/prefix_%s%s", d ? "tail_with_" : "decode_blocks",
                 d ? tdr[d] : "");
        case_end(name, "");
    }

    case_begin();
    ep = td_engine_defaults();
    ep.model_dir = "models/tandem-tiny";
    ep.backend = "cpu";
    ep.prefix_blocks = 1 << 20, ep.max_cache_bytes = (size_t)64 << 20;
    CHECK(td_engine_init(&e, &ep, err, sizeof err) &&
              strstr(err, "prefix cache's 1048576 blocks") && strstr(err, "limit of 64 MiB"),
          "a pool past the cache limit: %s", err);
    case_end("engine/prefix_pool_refused", "");
}

/* The prefix cache on a fixture: after a 400-token prompt, prompts that begin with it, of 257
 * tokens (just past its first block of 256), 300, and 383, 384 and 385 (around the end of the
 * window of 128 after the block), each take from the cache what the run before it committed
 * in common with it (the first block, then inside the tail each run publishes) and give the
 * logits rows and tokens of an engine without it */
static void prefix_fixture(const char *fx) {
    char model[128], name[160], err[512];
    snprintf(model, sizeof model, "tests/fixtures/%s", fx);
    snprintf(name, sizeof name, "engine/prefix_boundaries/%s", fx);
    case_begin();
    struct td_engine *e[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        struct td_engine_params ep = td_engine_defaults();
        ep.model_dir = model;
        ep.backend = "cpu";
        ep.max_seqs = 1, ep.max_ctx = 512, ep.prefix_blocks = k ? 4 : 0;
        ep.logits_hook = hash_rows;
        CHECK(!td_engine_init(&e[k], &ep, err, sizeof err), "engine init: %s", err);
    }
    if (!check_case_failed) {
        static int32_t base[400];
        int V = td_engine_vocab(e[1]);
        for (int i = 0; i < 400; i++)
            base[i] = (int32_t)((i * 7919 + 13) % (V - 2) + 2);
        struct td_sampling greedy = {.temperature = 0.0f, .top_p = 1.0f};
        const int32_t *pb = base;
        // each takes what the run before it committed in common with it: the 400-token run's
        // first block, then each shorter run's tail (whose checkpoint at its end serves it)
        int n400 = 400, lens[5] = {257, 300, 383, 384, 385}, want[5] = {256, 257, 300, 383, 384};
        int nw = 0, nc = 0, kw = 0, kc = 0;
        int32_t ow[1][12], oc[1][12];
        prefix_run(e[1], 1, &pb, &n400, &greedy, ow, &nw, &kw);
        for (int j = 0; j < 5; j++) {
            uint64_t hc = prefix_run(e[0], 1, &pb, &lens[j], &greedy, oc, &nc, &kc);
            uint64_t hw = prefix_run(e[1], 1, &pb, &lens[j], &greedy, ow, &nw, &kw);
            CHECK(kw == want[j] && hc == hw && same12(oc[0], nc, ow[0], nw) && nc == 12,
                  "a %d-token prompt: %d tokens from the cache, %s logits, %s tokens", lens[j], kw,
                  hc == hw ? "the same" : "other",
                  same12(oc[0], nc, ow[0], nw) ? "the same" : "other");
        }
    }
    td_engine_free(e[0]), td_engine_free(e[1]);
    case_end(name, "");
}

/* an engine on tandem-tiny with two slots of 640 tokens and a history pool of `blocks` (0: the
 * default) */
static struct td_engine *pool_engine(int blocks, char *err, size_t errlen) {
    struct td_engine_params ep = td_engine_defaults();
    ep.model_dir = "models/tandem-tiny";
    ep.backend = "cpu";
    ep.max_seqs = 2;
    ep.max_ctx = 640;
    ep.history_blocks = blocks;
    struct td_engine *e;
    return td_engine_init(&e, &ep, err, errlen) ? NULL : e;
}

/* two requests of prompts p[0], p[1] (n ids each, 12 tokens out, greedy) submitted together and
 * run to the end: their tokens, and whether the second was still queued after the first step */
static int pool_pair(struct td_engine *e, const int32_t *const *p, int n, int32_t (*out)[12],
                     int *n_out) {
    char err[512];
    int ids[2], waited = 0;
    for (int i = 0; i < 2; i++) {
        struct td_request_params rp = {.prompt = p[i],
                                       .n_prompt = n,
                                       .max_tokens = 12,
                                       .sampling = {.temperature = 0.0f, .top_p = 1.0f},
                                       .ignore_eos = 1};
        ids[i] = td_engine_submit(e, &rp, err, sizeof err);
        CHECK(ids[i] >= 0, "submit: %s", err);
    }
    for (int s = 0; s < 400 && td_engine_step(e, err, sizeof err) > 0; s++)
        if (!s) {
            enum td_req_status st;
            td_engine_output(e, ids[1], NULL, NULL, &st, NULL, NULL);
            waited = st == TD_REQ_QUEUED;
        }
    for (int i = 0; i < 2; i++) {
        const int32_t *t;
        td_engine_output(e, ids[i], &t, &n_out[i], NULL, NULL, NULL);
        memcpy(out[i], t, (size_t)n_out[i] * sizeof(int32_t));
        td_engine_release(e, ids[i]);
    }
    return waited;
}

/* The history pool: with room for one sequence of max_ctx (3 blocks of 256 at 640 tokens), two
 * 520-token prompts do not run at once: the second waits for the first's blocks, and both give
 * the tokens of an engine whose pool holds both; two 100-token prompts (a block each) run at
 * once. A pool smaller than one max_ctx sequence is refused with the numbers. */
static void history_pool(void) {
    char err[512];
    static int32_t A[520], B[520];
    for (int i = 0; i < 520; i++)
        A[i] = (int32_t)((i * 7919 + 13) % 8000 + 2), B[i] = (int32_t)((i * 31 + 17) % 7000 + 100);
    const int32_t *pp[2] = {A, B};
    int32_t big[2][12], small[2][12], ref[2][12], rs[2][12];
    int nb[2], ns[2], nr[2], nrs[2];
    case_begin();
    struct td_engine *one = pool_engine(3, err, sizeof err), *all = pool_engine(0, err, sizeof err);
    CHECK(one && all, "engine init: %s", err);
    if (one && all) {
        const struct td_engine_stats *st = td_engine_stats(one);
        CHECK(st->hist_blocks == 3 && st->hist_block == 256, "a pool of %d blocks of %d",
              st->hist_blocks, st->hist_block);
        CHECK(td_engine_stats(all)->hist_blocks == 6, "the default pool: %d blocks, not 2 x 3",
              td_engine_stats(all)->hist_blocks);
        CHECK(pool_pair(one, pp, 520, big, nb), "the second 520-token prompt did not wait");
        CHECK(!pool_pair(all, pp, 520, ref, nr), "with room for both, the second waited");
        CHECK(nb[0] == 12 && nb[1] == 12 && !memcmp(big, ref, sizeof big),
              "the tokens differ from a pool that holds both");
        CHECK(!pool_pair(one, pp, 100, small, ns), "two 100-token prompts did not run at once");
        pool_pair(all, pp, 100, rs, nrs);
        CHECK(ns[0] == 12 && !memcmp(small, rs, sizeof small), "short prompts: other tokens");
        CHECK(td_engine_stats(one)->hist_held == 0, "%d blocks still held at the end",
              td_engine_stats(one)->hist_held);
    }
    td_engine_free(one), td_engine_free(all);
    CHECK(!pool_engine(2, err, sizeof err) && strstr(err, "2 blocks holds 512 tokens") &&
              strstr(err, "needs 3 blocks of 256"),
          "a pool under one max_ctx sequence: %s", err);
    case_end("engine/history_pool_waits", "");

    // the default pool under a cache memory limit: every slot at max_ctx (8 x 4 blocks at
    // 1024 tokens) does not fit, 12 blocks do and are taken; 10 are fewer than one max_ctx
    // sequence and a block for every other slot (4 + 7), refused with the numbers
    case_begin();
    struct td_config c;
    CHECK(!td_config_load(&c, "models/tandem-tiny/config.json", err, sizeof err), "%s", err);
    if (!check_case_failed) {
        size_t rings = td_state_bytes_pool(&c, 8, 1024, 16, TD_KV_F32, 0);
        size_t bb = td_state_block_bytes(&c, TD_KV_F32);
        struct td_engine_params ep = td_engine_defaults();
        ep.model_dir = "models/tandem-tiny";
        ep.backend = "cpu";
        ep.max_seqs = 8, ep.max_ctx = 1024;
        ep.max_cache_bytes = rings + 12 * bb + bb / 2;
        struct td_engine *e = NULL;
        CHECK(!td_engine_init(&e, &ep, err, sizeof err), "12 blocks' memory: %s", err);
        CHECK(e && td_engine_stats(e)->hist_blocks == 12, "a pool of %d blocks, not 12",
              e ? td_engine_stats(e)->hist_blocks : -1);
        td_engine_free(e);
        ep.max_cache_bytes = rings + 10 * bb + bb / 2;
        CHECK(td_engine_init(&e, &ep, err, sizeof err) && strstr(err, "holds 10 history blocks") &&
                  strstr(err, "need 11"),
              "10 blocks' memory: %s", err);
    }
    case_end("engine/history_pool_fits_memory", "");
}

int main(void) {
    const char *fxs[3] = {"b_plain_hc2", "a_tiny_yarn", "c_upstream_sharded"};
    make_prompts(300);
    for (int i = 0; i < (quick_mode() ? 1 : 3); i++)
        greedy_lossless(fxs[i]);
    model_drafter_tests("mtp", 0.3);
    model_drafter_tests("dspark", DSPARK_MIN_ACCEPT);
    token_sources();
    adaptive_policy();
    auto_rows();
    prefill_chunk();
    prefix_cache();
    for (int i = 0; i < (quick_mode() ? 1 : 3); i++)
        prefix_fixture(fxs[i]);
    history_pool();
    if (!quick_mode()) {
        drafter_distribution("mtp");
        drafter_distribution("dspark");
    }
    make_prompts(300);

    const char *model = "tests/fixtures/b_plain_hc2";
    static struct run a, b, c;
    struct td_sampling samp = {.temperature = 0.8f, .top_k = 50, .top_p = 0.9f, .seed = 1000};

    // on tandem-tiny, whose sampled tokens depend on their context (b_plain_hc2 samples its
    // prompt's last token again and again, which no batch could change)
    case_begin();
    {
        const char *tiny = "models/tandem-tiny";
        run(tiny, "ngram", 3, 1, 256, 1, &samp, 5, NULL, 20, 512, &a);
        run(tiny, "ngram", 3, 13, 48, 13, &samp, 0, NULL, 20, 512, &b);
        CHECK(a.n_out[0] == b.n_out[5] && !memcmp(a.out[0], b.out[5], (size_t)a.n_out[0] * 4),
              "request 5 differs alone and in a batch");
        // the check has power: the tokens vary, and another way of drawing them (no drafter:
        // no acceptance draws) gives other tokens
        int distinct = 0;
        for (int i = 0; i < a.n_out[0]; i++) {
            int seen = 0;
            for (int j = 0; j < i; j++)
                seen |= a.out[0][j] == a.out[0][i];
            distinct += !seen;
        }
        CHECK(distinct >= 5, "request 5 drew only %d distinct tokens in %d", distinct, a.n_out[0]);
        run(tiny, "none", 0, 13, 48, 13, &samp, 0, NULL, 20, 512, &c);
        int diff = 0;
        for (int i = 0; i < 13; i++)
            diff += c.n_out[i] != b.n_out[i] || memcmp(c.out[i], b.out[i], (size_t)c.n_out[i] * 4);
        CHECK(diff >= 3, "only %d of 13 requests differ with and without a drafter", diff);
    }
    case_end("sampled_batch_invariant", "");

    case_begin();
    struct td_sampling greedy = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
    run(model, "ngram", 3, 13, 64, 13, &greedy, 0, NULL, 20, 512, &a);
    run(model, "ngram", 3, 13, 64, 3, &greedy, 0, NULL, 20, 512, &b);
    int which = -1;
    CHECK(same_tokens(&a, &b, &which), "request %d differs with 3 slots", which);
    for (int i = 0; i < 13; i++)
        CHECK(b.st[i] == TD_REQ_FINISHED, "request %d not finished", i);
    case_end("admission_waits", "");

    // EOS (id 1 in the fixture config) forced at a position: the request ends right there
    case_begin();
    for (int dr = 0; dr < 2; dr++) {
        struct hook h = {.request = 2, .position = prompt_len[2] + 5, .mode = 1, .token = 1};
        run(model, dr ? "ngram" : "none", 3, 4, 256, 4, &greedy, 0, &h, 30, 512, &a);
        CHECK(a.why[2] == TD_FINISH_EOS && a.n_out[2] == 7 && a.out[2][6] == 1,
              "EOS at position %ld: finish %d after %d tokens", h.position, a.why[2], a.n_out[2]);
        CHECK(a.why[1] == TD_FINISH_LENGTH && a.n_out[1] == 30, "request 1 stopped at %d",
              a.n_out[1]);
    }
    case_end("eos_and_length_stops", "");

    case_begin();
    run(model, "ngram", 3, 1, 256, 1, &greedy, 0, NULL, 100, 20, &a);
    CHECK(a.why[0] == TD_FINISH_CONTEXT && prompt_len[0] + a.n_out[0] == 21,
          "context 20: finish %d with %d prompt + %d generated", a.why[0], prompt_len[0],
          a.n_out[0]);
    case_end("context_stop", "");

    // a NaN target row fails only its request, names the position, emits no token for it
    case_begin();
    for (int dr = 0; dr < 2; dr++) {
        struct hook h = {.request = 1, .position = prompt_len[1] + 4, .mode = 0, .token = 0};
        run(model, "none", 0, 3, 256, 3, &greedy, 0, NULL, 12, 512, &b);
        run(model, dr ? "random" : "none", 3, 3, 256, 3, &greedy, 0, &h, 12, 512, &a);
        char want[64];
        snprintf(want, sizeof want, "position %ld", h.position + 1);
        CHECK(a.st[1] == TD_REQ_FAILED && strstr(a.msg[1], want), "status %d msg '%s'", a.st[1],
              a.msg[1]);
        CHECK(a.n_out[1] <= 5 && !memcmp(a.out[1], b.out[1], (size_t)a.n_out[1] * 4),
              "failed request emitted %d tokens", a.n_out[1]);
        for (int j = 0; j < a.n_out[1]; j++)
            CHECK(a.out[1][j] != 0 || b.out[1][j] == 0, "token 0");
        CHECK(a.stats.nan_rows == 1, "nan counter %ld", a.stats.nan_rows);
        CHECK(a.n_out[0] == b.n_out[0] && !memcmp(a.out[0], b.out[0], (size_t)a.n_out[0] * 4) &&
                  !memcmp(a.out[2], b.out[2], (size_t)a.n_out[2] * 4),
              "other requests changed");
    }
    case_end("nan_target_fails_request", "");

    // cancel, max_tokens = 1, a prompt that fills the context
    case_begin();
    {
        char e2[256];
        struct td_engine_params ep2 = td_engine_defaults();
        ep2.model_dir = model;
        ep2.backend = "cpu";
        ep2.max_ctx = 40;
        struct td_engine *en;
        CHECK(!td_engine_init(&en, &ep2, e2, sizeof e2), "%s", e2);
        int32_t full[40];
        for (int i = 0; i < 40; i++)
            full[i] = (i * 7) % 300;
        struct td_request_params a1 = {.prompt = prompts[0],
                                       .n_prompt = prompt_len[0],
                                       .max_tokens = 20,
                                       .sampling = greedy,
                                       .ignore_eos = 1};
        struct td_request_params a2 = {.prompt = prompts[1],
                                       .n_prompt = prompt_len[1],
                                       .max_tokens = 1,
                                       .sampling = greedy,
                                       .ignore_eos = 1};
        struct td_request_params a3 = {
            .prompt = full, .n_prompt = 40, .max_tokens = 10, .sampling = greedy, .ignore_eos = 1};
        int i1 = td_engine_submit(en, &a1, e2, sizeof e2),
            i2 = td_engine_submit(en, &a2, e2, sizeof e2);
        int i3 = td_engine_submit(en, &a3, e2, sizeof e2);
        for (int k = 0; k < 3; k++)
            td_engine_step(en, e2, sizeof e2);
        td_engine_cancel(en, i1);
        while (td_engine_step(en, e2, sizeof e2) > 0) {
        }
        int n1, n2, n3;
        enum td_req_status s1, s2, s3;
        enum td_finish f2, f3;
        const char *m1;
        td_engine_output(en, i1, NULL, &n1, &s1, NULL, &m1);
        td_engine_output(en, i2, NULL, &n2, &s2, &f2, NULL);
        td_engine_output(en, i3, NULL, &n3, &s3, &f3, NULL);
        CHECK(s1 == TD_REQ_FINISHED && !strcmp(m1, "cancelled") && n1 < 20,
              "cancel: %d tokens '%s'", n1, m1);
        CHECK(s2 == TD_REQ_FINISHED && f2 == TD_FINISH_LENGTH && n2 == 1, "max_tokens 1: %d", n2);
        CHECK(s3 == TD_REQ_FINISHED && f3 == TD_FINISH_CONTEXT && n3 == 1,
              "a full-context prompt: %d tokens, finish %d", n3, f3);
        td_engine_free(en);
    }
    case_end("cancel_one_token_full_context", "");

    case_begin();
    char err[256];
    struct td_engine_params ep = td_engine_defaults();
    ep.model_dir = model;
    ep.max_ctx = 32;
    struct td_engine *e;
    CHECK(!td_engine_init(&e, &ep, err, sizeof err), "%s", err);
    int32_t long_prompt[40] = {0}, bad_tok[2] = {1, 300};
    struct td_request_params rp = {.prompt = long_prompt,
                                   .n_prompt = 40,
                                   .max_tokens = 5,
                                   .sampling = greedy,
                                   .ignore_eos = 0};
    CHECK(td_engine_submit(e, &rp, err, sizeof err) == -1 && strstr(err, "context"), "long prompt");
    rp = (struct td_request_params){
        .prompt = bad_tok, .n_prompt = 2, .max_tokens = 5, .sampling = greedy, .ignore_eos = 0};
    CHECK(td_engine_submit(e, &rp, err, sizeof err) == -1 && strstr(err, "outside"), "bad id");
    rp = (struct td_request_params){
        .prompt = bad_tok, .n_prompt = 0, .max_tokens = 5, .sampling = greedy, .ignore_eos = 0};
    CHECK(td_engine_submit(e, &rp, err, sizeof err) == -1, "empty prompt accepted");
    rp = (struct td_request_params){
        .prompt = bad_tok,
        .n_prompt = 1,
        .max_tokens = 5,
        .sampling = {.temperature = -1.0f, .top_k = 0, .top_p = 1.0f, .seed = 0},
        .ignore_eos = 0};
    CHECK(td_engine_submit(e, &rp, err, sizeof err) == -1, "negative temperature accepted");
    td_engine_free(e);
    ep.max_cache_bytes = 1000;
    CHECK(td_engine_init(&e, &ep, err, sizeof err) == -1 && strstr(err, "MiB"),
          "pools over the limit were not refused");
    case_end("bad_requests_refused", "");
    return check_failures ? 1 : 0;
}
