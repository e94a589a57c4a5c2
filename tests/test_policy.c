/* test_policy.c: the adaptive draft policy (engine/policy.h) chooses what its cost model says.
 *
 *   make build/tests/test_policy && build/tests/test_policy
 *
 * policy/flat_cost_verifies_all       a step costs the same at any rows: every draft is verified
 * policy/steep_cost_verifies_none     each row costs as much as a step: no draft pays
 * policy/bucket_cost_fills_bucket     a step of 2^b rows costs b + 1 units: the drafts fill the
 *                                     bucket whose rate is best, the likeliest first
 * policy/best_rate_brute_force        on random acceptance and random monotone costs, the choice
 *                                     reaches the best rate of every allocation of a small batch
 * policy/merge_matches_sort           batches of up to 40 sequences, tied chances: the choice is
 *                                     the sorted rule's, and drafting is chosen exactly when the
 *                                     best rate beats a plain step's
 * policy/measured_buckets             observe: warm-up dropped, mean; a plain bucket never
 *                                     measured lies between the measured ones around it (linear
 *                                     in rows); a drafting one is a plain step of its rows plus
 *                                     the drafter's part where both are measured; nothing
 *                                     measured: all drafts
 * policy/deterministic_ties           equal chances: the earlier sequence, each its prefix
 * policy/estimates_explore           a position's estimate: 1 before any trial; after a streak
 *                                     of rejections it climbs back with the rounds; once verified
 *                                     often it is its acceptance
 * policy/no_lock_in                   a simulated batch-1 run whose first 10 rounds reject every
 *                                     draft (true chances 0.8, then 0.6 given the first): the
 *                                     policy verifies drafts again and two a round at the end
 * policy/pushed_prompt_rows           a draft that takes a waiting prompt's row is charged that
 *                                     row: at flat step costs, unlikely drafts fill only the
 *                                     rows the prompts leave
 * policy/prompt_step_decode_rate      beside prompt rows, drafts are verified only where their
 *                                     tokens come as fast as the sequences' own decode steps
 *                                     give them (a plain step's rate there counts the prompts'
 *                                     time and not their progress)
 * policy/aged_counts                  a prompt phase's poor first rounds (0.2 a draft) make a
 *                                     batch of 16 decode plain; the counts age while it does, so
 *                                     it tries drafting again and, at 0.7 a draft, keeps on (also
 *                                     with a floor of 8 proposals)
 * policy/aged_counts_floor            a batch-64 tail behind a costly catch-up drafts again once
 *                                     its counts have aged away, not with a floor
 * policy/switch_cost                  drafting again after a plain stretch pays its catch-up:
 *                                     the rows' measured cost over the mean drafting stretch,
 *                                     shortened by the evidence the estimates rest on (the whole
 *                                     cost with none), which can turn a drafting step plain;
 *                                     none with the seam
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "engine/policy.h"

#define K 8

static const struct policy_step none = POLICY_STEP(0), three = POLICY_STEP(3);

static double flat(void *ctx, int drafting, int rows) {
    (void)ctx, (void)rows, (void)drafting;
    return 1.0;
}
static double steep(void *ctx, int drafting, int rows) {
    (void)ctx, (void)drafting;
    return (double)rows;
}
static double by_bucket(void *ctx, int drafting, int rows) {
    (void)ctx, (void)drafting;
    return 1.0 + policy_bucket(rows);
}

static void flat_all(void) {
    case_begin();
    struct td_policy p;
    policy_init(&p);
    p.cost = flat;
    float m[3 * K];
    int kmax[3] = {5, 0, 8}, d[3];
    for (int i = 0; i < 3 * K; i++)
        m[i] = 0.5f;
    int got = policy_choose(&p, 3, kmax, m, K, &none, d);
    CHECK(got == 13 && d[0] == 5 && d[1] == 0 && d[2] == 8, "chose %d: %d %d %d", got, d[0], d[1],
          d[2]);
    policy_free(&p);
    case_end("policy/flat_cost_verifies_all", "");
}

static void steep_none(void) {
    case_begin();
    struct td_policy p;
    policy_init(&p);
    p.cost = steep; // a draft row costs as much as a whole token is worth: it never pays
    float m[2 * K];
    int kmax[2] = {4, 4}, d[2];
    for (int i = 0; i < 2 * K; i++)
        m[i] = 0.9f;
    int got = policy_choose(&p, 2, kmax, m, K, &none, d);
    CHECK(got == 0 && d[0] == 0 && d[1] == 0, "chose %d: %d %d", got, d[0], d[1]);
    policy_free(&p);
    case_end("policy/steep_cost_verifies_none", "");
}

static void bucket_fill(void) {
    case_begin();
    struct td_policy p;
    policy_init(&p);
    p.cost = by_bucket;
    // 4 sequences, anchors 4 rows (bucket 4: cost 3). The likely drafts: sequence 0's two at
    // 0.9, 0.8 and sequence 2's at 0.85; the rest at 0.1. Up to 8 rows (cost 4): 4 drafts,
    // 4 + 0.9 + 0.85 + 0.8 + 0.1 = 6.65 -> 1.66 a unit against 4 / 3 = 1.33 with none; 16 rows
    // (cost 5) would need 12 drafts of 0.1: 4 + 2.55 + 0.9 = 7.45 -> 1.49. So 8 rows.
    float m[4 * K];
    for (int i = 0; i < 4 * K; i++)
        m[i] = 0.1f;
    m[0] = 0.9f, m[1] = 0.8f, m[2 * K] = 0.85f;
    int kmax[4] = {4, 4, 4, 4}, d[4];
    int got = policy_choose(&p, 4, kmax, m, K, &none, d);
    CHECK(got == 4, "chose %d drafts", got);
    CHECK(d[0] == 3 && d[1] == 0 && d[2] == 1 && d[3] == 0, "chose %d %d %d %d", d[0], d[1], d[2],
          d[3]);
    // beside 3 prefill rows the anchors start at 7 rows (cost 4): 8 rows give 4.9 / 4, 16 rows
    // (9 drafts: the three likely ones and six at 0.1, earlier sequences first) 7.15 / 5, all
    // 16 drafts at 23 rows 7.85 / 6
    got = policy_choose(&p, 4, kmax, m, K, &three, d);
    CHECK(got == 9 && d[0] == 4 && d[1] == 4 && d[2] == 1 && d[3] == 0,
          "beside a prefill chunk: %d drafts: %d %d %d %d", got, d[0], d[1], d[2], d[3]);
    policy_free(&p);
    case_end("policy/bucket_cost_fills_bucket", "");
}

static uint64_t rs = 0x2545f4914f6cdd1dull;
static double urand(void) {
    return (double)(xorshift64(&rs) >> 11) * 0x1p-53;
}

static double costs[64];
static double table(void *ctx, int drafting, int rows) {
    (void)ctx, (void)drafting;
    return costs[rows < 64 ? rows : 63];
}

static double plain_f = 1.0; /* a plain step's cost over a drafting one's of the same rows */
static double table2(void *ctx, int drafting, int rows) {
    return table(ctx, drafting, rows) * (drafting ? 1.0 : plain_f);
}

struct ref_cand {
    float v;
    int s, j;
};
static int ref_order(const void *a, const void *b) {
    const struct ref_cand *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    if (x->s != y->s) return x->s < y->s ? -1 : 1;
    return x->j < y->j ? -1 : x->j > y->j;
}

/* the policy's choice against the plain rule it implements: every draft on offer sorted
 * (likelier first, ties to the earlier sequence, then its earlier draft), the best rate over
 * the first r; batches of up to 40 sequences with up to 8 drafts each and tied chances (the
 * heap that merges the sequences' drafts must give the sort's order); and whether to draft at
 * all (policy_drafting: its bound must never turn down a rate that beats a plain step) */
static void merge_matches_sort(void) {
    case_begin();
    struct td_policy p;
    policy_init(&p);
    p.cost = table2;
    static struct ref_cand c[40 * K];
    int agree = 0, drafting = 0;
    for (int trial = 0; trial < 400 && !check_case_failed; trial++) {
        int n = 1 + (int)(urand() * 40), kmax[40], d[40], want[40] = {0}, total = 0;
        static float m[40 * K];
        for (int s = 0; s < n; s++) {
            kmax[s] = (int)(urand() * (K + 1));
            float v = 1.0f;
            for (int j = 0; j < K; j++) // eighths: ties between sequences
                m[s * K + j] = v = (float)((int)(v * urand() * 8.0 + 0.5) / 8.0);
            for (int j = 0; j < kmax[s]; j++)
                c[total++] = (struct ref_cand){.v = m[s * K + j], .s = s, .j = j};
        }
        costs[0] = 0.1;
        for (int r = 1; r < 64; r++)
            costs[r] = costs[r - 1] + (urand() < 0.3 ? urand() : 0.0);
        plain_f = 0.5 + urand();
        qsort(c, (size_t)total, sizeof *c, ref_order);
        double e = n, best = -1;
        int best_r = 0;
        for (int r = 0; r <= total; r++) {
            if (r) e += c[r - 1].v;
            double rate = e / table2(NULL, 1, n + r);
            if (rate > best) best = rate, best_r = r;
        }
        for (int r = 0; r < best_r; r++)
            want[c[r].s]++;
        int got = policy_choose(&p, n, kmax, m, K, &none, d);
        CHECK(got == best_r && !memcmp(d, want, (size_t)n * sizeof *d),
              "trial %d (%d sequences): %d drafts chosen, the sort's %d", trial, n, got, best_r);
        double off = n / table2(NULL, 0, n);
        if (fabs(best - off) > 1e-9 * off) {
            int dr = policy_drafting(&p, n, kmax, m, K, &none);
            CHECK(dr == (best > off), "trial %d: drafting %d, best rate %.6f, plain %.6f", trial,
                  dr, best, off);
            agree++, drafting += dr;
        }
    }
    CHECK(drafting > 20 && agree - drafting > 20, "%d decisions, %d to draft", agree, drafting);
    policy_free(&p);
    char extra[64];
    snprintf(extra, sizeof extra, "(%d decisions, %d to draft)", agree, drafting);
    case_end("policy/merge_matches_sort", extra);
}

static void brute(void) {
    case_begin();
    struct td_policy p;
    policy_init(&p);
    p.cost = table;
    for (int trial = 0; trial < 300; trial++) {
        int n = 1 + (int)(urand() * 3), kmax[3], d[3];
        float m[3 * K];
        for (int s = 0; s < n; s++) {
            kmax[s] = (int)(urand() * 5);
            float v = 1.0f;
            for (int j = 0; j < K; j++)
                m[s * K + j] = v *= (float)urand();
        }
        costs[0] = 0.1;
        for (int r = 1; r < 64; r++) // non-decreasing, with steps
            costs[r] = costs[r - 1] + (urand() < 0.3 ? urand() : 0.0);
        policy_choose(&p, n, kmax, m, K, &none, d);
        double e = n, best = 0;
        int rows = n;
        for (int s = 0; s < n; s++) {
            CHECK(d[s] >= 0 && d[s] <= kmax[s], "trial %d: d[%d] = %d of %d", trial, s, d[s],
                  kmax[s]);
            for (int j = 0; j < d[s]; j++)
                e += m[s * K + j];
            rows += d[s];
        }
        double rate = e / costs[rows];
        int a[3] = {0, 0, 0};
        for (;;) { // every allocation
            double ee = n;
            int rr = n;
            for (int s = 0; s < n; s++) {
                for (int j = 0; j < a[s]; j++)
                    ee += m[s * K + j];
                rr += a[s];
            }
            if (ee / costs[rr] > best) best = ee / costs[rr];
            int s = 0;
            while (s < n && ++a[s] > kmax[s])
                a[s++] = 0;
            if (s == n) break;
        }
        CHECK(rate >= best * (1 - 1e-5), "trial %d: rate %.6f, the best %.6f", trial, rate, best);
    }
    policy_free(&p);
    case_end("policy/best_rate_brute_force", "");
}

static void measured(void) {
    case_begin();
    struct td_policy p;
    policy_init(&p);
    CHECK(policy_cost(&p, 1, 8) == 0, "cost before any step");
    float m[2 * K];
    int kmax[2] = {3, 3}, d[2];
    for (int i = 0; i < 2 * K; i++)
        m[i] = 0.01f;
    CHECK(policy_choose(&p, 2, kmax, m, K, &none, d) == 6, "nothing measured: not every draft");
    policy_observe(&p, 1, 8, 100.0); // warm-up: dropped
    policy_observe(&p, 1, 7, 9.0);
    policy_observe(&p, 1, 8, 11.0);
    CHECK(fabs(policy_cost(&p, 1, 5) - 10.0) < 1e-12, "bucket 8: %g, not the mean 10",
          policy_cost(&p, 1, 5));
    // no step below 8 rows is measured: every row count costs bucket 8's, so all drafts
    CHECK(policy_choose(&p, 2, kmax, m, K, &none, d) == 6, "bucket 8's cost: not every draft");
    policy_observe(&p, 1, 2, 100.0);
    policy_observe(&p, 1, 2, 2.0);
    CHECK(fabs(policy_cost(&p, 1, 1) - 2.0) < 1e-12, "bucket 1 takes bucket 2's: %g",
          policy_cost(&p, 1, 1));
    // 2 rows cost 2, bucket 4 unmeasured (so 2, optimistically): it is tried
    CHECK(policy_choose(&p, 2, kmax, m, K, &none, d) == 2, "the unmeasured bucket 4 is not tried");
    CHECK(fabs(policy_cost(&p, 1, 3) - 2.0) < 1e-12, "bucket 4 unmeasured: %g",
          policy_cost(&p, 1, 3));
    policy_observe(&p, 1, 4, 3.0);
    policy_observe(&p, 1, 4, 3.0);
    // measured at 3: drafts at 0.01 do not pay; at 0.9 they do (2 + 6 * 0.9 at cost 10 > 1)
    CHECK(policy_choose(&p, 2, kmax, m, K, &none, d) == 0, "drafts chosen at 0.01 acceptance");
    for (int i = 0; i < 2 * K; i++)
        m[i] = 0.9f;
    CHECK(policy_choose(&p, 2, kmax, m, K, &none, d) == 2,
          "at 0.9: not the 4-row bucket (3.8 / 3)");
    policy_free(&p);
    // a drafting bucket never measured: a plain step of its rows plus the drafter's part where
    // both kinds are measured (the prompt phase measures 256 rows; decode steps draft at 64)
    policy_init(&p);
    policy_observe(&p, 1, 256, 1.0), policy_observe(&p, 1, 256, 20.0);
    policy_observe(&p, 0, 64, 1.0), policy_observe(&p, 0, 64, 5.0);
    // no bucket has both: the drafter's part is not known, a plain step's (optimistic)
    CHECK(fabs(policy_cost(&p, 1, 40) - 5.0) < 1e-12, "drafting at 40 rows: %g, not 5",
          policy_cost(&p, 1, 40));
    CHECK(fabs(policy_cost(&p, 1, 100) - 5.0) < 1e-12, "drafting at 100 rows: %g, not 5",
          policy_cost(&p, 1, 100));
    // plain steps of 256 rows cost 17: the drafter's part is 3; a plain step of 128 rows lies
    // between 64 and 256 (5 + 12 * 64 / 192 = 9), drafting at 100 rows 12; at 40, 5 + 3
    policy_observe(&p, 0, 256, 1.0), policy_observe(&p, 0, 256, 17.0);
    CHECK(fabs(policy_cost(&p, 0, 100) - 9.0) < 1e-12, "plain at 100 rows: %g, not 9",
          policy_cost(&p, 0, 100));
    CHECK(fabs(policy_cost(&p, 1, 100) - 12.0) < 1e-12, "drafting at 100 rows: %g, not 12",
          policy_cost(&p, 1, 100));
    CHECK(fabs(policy_cost(&p, 1, 40) - 8.0) < 1e-12, "drafting at 40 rows: %g, not 8",
          policy_cost(&p, 1, 40));
    // outside the measured plain buckets: the nearest's (16 rows: 64's; 1000 rows: 256's)
    CHECK(fabs(policy_cost(&p, 0, 16) - 5.0) < 1e-12 &&
              fabs(policy_cost(&p, 0, 1000) - 17.0) < 1e-12,
          "plain at 16 and 1000 rows: %g %g", policy_cost(&p, 0, 16), policy_cost(&p, 0, 1000));
    policy_free(&p);
    case_end("policy/measured_buckets", "");
}

static void ties(void) {
    case_begin();
    struct td_policy p;
    policy_init(&p);
    p.cost = by_bucket;
    float m[3 * K];
    for (int i = 0; i < 3 * K; i++)
        m[i] = 0.2f;
    m[1] = 0.5f; // not non-increasing as given: made so (0.2)
    int kmax[3] = {3, 3, 3}, d[3], d2[3];
    // 3 anchors (bucket 4, cost 3): one draft fills it, 3.2 / 3; 8 rows (cost 4): 4.0 / 4;
    // 12 rows (cost 5): 4.8 / 5. One draft, the first sequence's
    int got = policy_choose(&p, 3, kmax, m, K, &none, d);
    policy_choose(&p, 3, kmax, m, K, &none, d2);
    CHECK(!memcmp(d, d2, sizeof d), "two calls differ");
    CHECK(got == 1 && d[0] == 1 && d[1] == 0 && d[2] == 0, "chose %d: %d %d %d", got, d[0], d[1],
          d[2]);
    policy_free(&p);
    case_end("policy/deterministic_ties", "");
}

static void pushed(void) {
    case_begin();
    struct td_policy p;
    policy_init(&p);
    p.cost = flat; // every step costs 1 at any rows: a row of a 108-row step costs 1 / 108
    float m[8 * K];
    int kmax[8], d[8];
    for (int s = 0; s < 8; s++)
        kmax[s] = 2;
    for (int i = 0; i < 8 * K; i++)
        m[i] = 0.05f;
    // no prompts: drafts are free, all 16 are verified
    int got = policy_choose(&p, 8, kmax, m, K, &none, d);
    CHECK(got == 16, "no prompts: %d drafts", got);
    // prompts fill the step: a draft of 0.05 costs 1 / 108 of a step, and 8 tokens a step are
    // 0.074 a row, so none pays
    struct policy_step full = {.prompt = 200, .room = 100, .max_drafts = 50};
    got = policy_choose(&p, 8, kmax, m, K, &full, d);
    CHECK(got == 0, "prompts fill the step: %d drafts", got);
    // 90 prompt rows in a room of 100: the 10 rows they leave are free
    struct policy_step part = {.prompt = 90, .room = 100, .max_drafts = 50};
    got = policy_choose(&p, 8, kmax, m, K, &part, d);
    // (equal chances: the earlier sequences, each its prefix)
    CHECK(got == 10 && d[0] == 2 && d[4] == 2 && d[5] == 0 && d[7] == 0,
          "90 prompt rows: %d drafts (%d .. %d %d .. %d)", got, d[0], d[4], d[5], d[7]);
    // likely drafts (0.9) pay for the rows they take
    for (int i = 0; i < 8 * K; i++)
        m[i] = 0.9f;
    got = policy_choose(&p, 8, kmax, m, K, &full, d);
    CHECK(got == 16, "drafts of 0.9 in a full step: %d", got);
    // and never more than max_drafts
    full.max_drafts = 5;
    got = policy_choose(&p, 8, kmax, m, K, &full, d);
    CHECK(got == 5, "max_drafts 5: %d", got);
    CHECK(policy_drafting(&p, 8, kmax, m, K, &full), "drafts of 0.9 do not draft");
    for (int i = 0; i < 8 * K; i++)
        m[i] = 0.05f;
    full.max_drafts = 50;
    CHECK(!policy_drafting(&p, 8, kmax, m, K, &full), "drafts of 0.05 draft in a full step");
    policy_free(&p);
    case_end("policy/pushed_prompt_rows", "");
}

/* a step of rows rows: 0.5 + 0.005 rows, drafting 0.3 more (its drafter) */
static double linear(void *ctx, int drafting, int rows) {
    (void)ctx;
    return 0.5 + 0.005 * rows + (drafting ? 0.3 : 0.0);
}

static void prompt_step(void) {
    case_begin();
    struct td_policy p;
    policy_init(&p);
    p.cost = linear;
    float m[16 * K];
    int kmax[16], d[16];
    for (int s = 0; s < 16; s++) {
        kmax[s] = 5;
        for (int j = 0; j < K; j++)
            m[s * K + j] = j ? 0.0f : 0.3f; // a first draft of 0.3, nothing after it
    }
    // 16 sequences beside 240 prompt rows (a step of 256). Plain: 16 tokens in 1.78, 9.0 a
    // unit; the 16 first drafts: 20.8 in 1.78 + 0.3 + 16 pushed rows (0.11), 9.5 a unit, more
    // than the plain step's, but the sequences' decode step alone gives 16 in 0.58 (27.6 a
    // unit), and drafting adds 4.8 tokens for 0.41: it does not draft
    struct policy_step st = {.prompt = 240, .room = 240, .max_drafts = 80};
    CHECK(!policy_drafting(&p, 16, kmax, m, K, &st), "drafts of 0.3 beside prompts: drafting");
    // drafts made all the same (the drafter's 0.3 spent) add 4.8 for the pushed rows' 0.11
    int got = policy_choose(&p, 16, kmax, m, K, &st, d);
    CHECK(got == 16, "drafts of 0.3 made beside prompts: %d verified", got);
    // first drafts of 0.9: decoding alone is best with them (30.4 in 0.96), and beside the
    // prompts they add 14.4 tokens for 0.41, faster than that: all 16
    for (int s = 0; s < 16; s++)
        m[s * K] = 0.9f;
    got = policy_choose(&p, 16, kmax, m, K, &st, d);
    CHECK(got == 16 && d[0] == 1 && d[15] == 1, "drafts of 0.9 beside prompts: %d verified", got);
    CHECK(policy_drafting(&p, 16, kmax, m, K, &st), "drafts of 0.9 beside prompts: plain");
    // no prompts: the step's own rate, as before (0.3: 20.8 in 0.96 against 16 in 0.58: plain)
    for (int s = 0; s < 16; s++)
        m[s * K] = 0.3f;
    CHECK(!policy_drafting(&p, 16, kmax, m, K, &none), "drafts of 0.3 alone: drafting");
    policy_free(&p);
    case_end("policy/prompt_step_decode_rate", "");
}

static void switch_cost(void) {
    case_begin();
    struct td_policy p;
    policy_init(&p);
    // plain steps of 32 rows 1.0, drafting ones of 64 rows 1.2 and of 32 rows 0.9 (each
    // bucket's first a warm-up; the cheaper 32 keeps the rate's bound above a plain step's)
    for (int i = 0; i < 3; i++)
        policy_observe(&p, 0, 32, 1.0), policy_observe(&p, 1, 64, 1.2),
            policy_observe(&p, 1, 32, 0.9);
    float m[32 * K];
    int kmax[32];
    for (int s = 0; s < 32; s++) {
        kmax[s] = 1;
        m[s * K] = 0.5f;
    }
    // 32 sequences, a draft each of 0.5: 48 tokens in 1.2 (40 a unit) against 32 in 1.0
    struct policy_step st = POLICY_STEP(0);
    CHECK(policy_drafting(&p, 32, kmax, m, K, &st), "drafts of 0.5 at 1.2: plain");
    CHECK(policy_switch_cost(&p, 1000) == 0.0, "a catch-up priced before any was measured");
    // drafting phases of 0.5 ms; one that made up 1000 rows took 2.5 ms, one that made up 2
    // took 0.4: 2 ms for 1002 rows. Stretches of 3 and 1 drafting steps: a switch that makes
    // up 1000 rows costs each of the 2 steps it buys about 1 ms
    policy_observe_drafter(&p, 0, 0.0005), policy_observe_drafter(&p, 0, 0.0005);
    policy_observe_drafter(&p, 1000, 0.0025), policy_observe_drafter(&p, 2, 0.0004);
    CHECK(fabs(policy_catch_row(&p) - 0.002 / 1002) < 1e-15, "a row of catch-up %g",
          policy_catch_row(&p));
    int seq[] = {1, 1, 1, 0, 1, 0, 0};
    for (int i = 0; i < 7; i++)
        policy_decided(&p, seq[i]);
    // no round verified yet: estimates with nothing behind them promise no stretch, the whole
    // catch-up is charged
    double sw = policy_switch_cost(&p, 1002);
    CHECK(fabs(sw - 0.002) < 1e-12, "switch cost with no evidence %g, not 0.002", sw);
    // 1016 first drafts verified (against a weight of 8): the stretch is 2 * 1016 / 1024
    for (int i = 0; i < 1016; i++)
        policy_observe_round(&p, 1, 1);
    sw = policy_switch_cost(&p, 1002);
    CHECK(fabs(sw - 0.002 / (2.0 * 1016 / 1024)) < 1e-12, "switch cost %g, not %g", sw,
          0.002 / (2.0 * 1016 / 1024));
    // aged to 8 proposals: half of the stretch, one step
    p.acc[0] = p.prop[0] = 8.0;
    CHECK(fabs(policy_switch_cost(&p, 1002) - 0.002) < 1e-12, "aged: switch cost %g, not 0.002",
          policy_switch_cost(&p, 1002));
    p.acc[0] = p.prop[0] = 1016.0;
    // 48 in 1.2 + 0.5 (28.2 a unit): plain; the same drafts with nothing behind still draft
    st.extra = 0.5;
    CHECK(!policy_drafting(&p, 32, kmax, m, K, &st), "a switch of 0.5 drafts");
    st.extra = 0.0;
    CHECK(policy_drafting(&p, 32, kmax, m, K, &st), "nothing behind: plain");
    p.cost = flat; // the seam: no catch-up costs anything
    CHECK(policy_switch_cost(&p, 1000) == 0.0, "a catch-up priced with the seam");
    policy_free(&p);
    case_end("policy/switch_cost", "");
}

static void estimates(void) {
    case_begin();
    long zero[K] = {0};
    double acc[K] = {0}, prop[K] = {0};
    float m[K];
    policy_estimates(zero, zero, acc, prop, 0, 3, m);
    CHECK(m[0] == 1.0f && m[2] == 1.0f, "before any trial: %g %g", m[0], m[2]);
    prop[0] = prop[1] = 10; // ten rejections at positions 1 and 2
    policy_estimates(zero, zero, acc, prop, 20, 2, m);
    float early = m[1];
    CHECK(early > 1.0f / 11 && early < 0.4f, "after 10 rejections, 20 rounds: %g", early);
    policy_estimates(zero, zero, acc, prop, 100000, 2, m);
    CHECK(m[1] > early + 0.05f, "no climb with the rounds: %g after 20, %g after 100000", early,
          m[1]);
    prop[0] = 100000, acc[0] = 50000; // verified often: its rate
    policy_estimates(zero, zero, acc, prop, 100000, 1, m);
    CHECK(fabsf(m[0] - 0.5f) < 0.01f, "0.5 over 100000 trials estimated %g", m[0]);
    case_end("policy/estimates_explore", "");
}

static double batch1(void *ctx, int drafting, int rows) {
    (void)ctx, (void)drafting;
    return 1.0 + 0.1 * (rows - 1);
}

/* a round of a sequence whose drafts are each accepted with chance q given the ones before: d of
 * them verified, counted in p */
static void sim_round(struct td_policy *p, int d, double q, uint64_t *r) {
    int a = 0;
    while (a < d && (double)(xorshift64(r) >> 11) * 0x1p-53 < q)
        a++;
    policy_observe_round(p, d, a);
}

static void no_lock_in(void) {
    case_begin();
    struct td_policy p;
    policy_init(&p);
    p.cost = batch1; // one draft pays above 0.1, a second above about 0.17
    long zero[K] = {0};
    float m[K];
    int kmax[1] = {3}, d[1];
    uint64_t r = 0x9e3779b97f4a7c15ull;
    long last_two = 0, rounds = 3000;
    for (long t = 0; t < rounds; t++) {
        policy_estimates(zero, zero, p.acc, p.prop, t, 3, m);
        policy_choose(&p, 1, kmax, m, K, &none, d);
        // drafts 1 .. d verified, accepted up to the first rejection (0.8, then 0.6 given the
        // ones before); the first 10 rounds reject every draft
        int a = 0;
        for (int j = 0, ok = t >= 10; j < d[0]; j++) {
            double u = (double)(xorshift64(&r) >> 11) * 0x1p-53;
            ok = ok && u < (j ? 0.6 : 0.8);
            a += ok;
        }
        policy_observe_round(&p, d[0], a);
        policy_age(&p);
        if (t >= rounds - 1000 && d[0] >= 2) last_two++;
    }
    CHECK(last_two > 900,
          "the last 1000 rounds verified 2 drafts %ld times (position 1: %.1f of "
          "%.1f, 2: %.1f of %.1f)",
          last_two, p.acc[0], p.prop[0], p.acc[1], p.prop[1]);
    policy_free(&p);
    case_end("policy/no_lock_in", "");
}

/* a batch-16 step of rows rows (us): 430 + 2.5 a row, drafting 250 more (its drafter) */
static double batch16(void *ctx, int drafting, int rows) {
    (void)ctx;
    return 430.0 + 2.5 * rows + (drafting ? 250.0 : 0.0);
}

/* n sequences after a prompt phase of 40 rounds whose drafts were each accepted at q0, then
 * `steps` steps of sequences whose drafts are accepted at q (each given the ones before),
 * drafting again costing `extra` more (a catch-up), with counts that keep at least `floor`
 * proposals (and never drafting when plain, TD_POLICY_PLAIN's knob): the first step that
 * drafts (-1: none) and how many of the last 100 did */
static void sim_aged(int n, double q0, double q, double extra, double floor, int plain, long steps,
                     long *first, long *late) {
    struct td_policy p;
    policy_init(&p);
    p.cost = batch16, p.floor = floor, p.plain = plain;
    long zero[K] = {0};
    float m[64 * K];
    int kmax[64], d[64];
    for (int s = 0; s < n; s++)
        kmax[s] = 5;
    uint64_t r = 0x2545f4914f6cdd1dull;
    for (int i = 0; i < 40; i++)
        sim_round(&p, 5, q0, &r);
    long rounds = 40;
    *first = -1, *late = 0;
    struct policy_step st = POLICY_STEP(0);
    st.extra = extra;
    for (long t = 0; t < steps; t++) {
        for (int s = 0; s < n; s++)
            policy_estimates(zero, zero, p.acc, p.prop, rounds, 5, m + s * K);
        int on = policy_drafting(&p, n, kmax, m, K, &st);
        if (on) {
            policy_choose(&p, n, kmax, m, K, &st, d);
            for (int s = 0; s < n; s++)
                sim_round(&p, d[s], q, &r);
            if (*first < 0) *first = t;
        }
        rounds += n;
        policy_age(&p);
        if (t >= steps - 100) *late += on;
    }
    policy_free(&p);
}

static void aged_counts(void) {
    case_begin();
    long first, late;
    // 16 sequences after a prompt phase at 0.2 a draft, then 0.7 (all five drafts: 2.9 tokens a
    // sequence, 46 in 920 us against plain 16 in 470): plain first (what the counts say), then
    // the aged counts are tried again, and kept; the same with a floor of 8 proposals
    for (int f = 0; f < 2; f++) {
        sim_aged(16, 0.2, 0.7, 0.0, f ? 8.0 : 0.0, 0, 400, &first, &late);
        CHECK(first > 0 && first < 150 && late == 100,
              "floor %d: first drafting step %ld (-1: never), the last 100 drafted %ld times",
              f ? 8 : 0, first, late);
    }
    case_end("policy/aged_counts", "");
    // 47 sequences (a batch-64 run's tail) after a prompt phase that accepted nearly nothing,
    // drafting again behind a catch-up of 1.8 ms, drafts accepted at 0.5: only estimates of
    // about 1 make it look worth it (282 rows, 3.2 ms, against 86 tokens a ms plain). Without a
    // floor the counts age that far and it drafts; with one it stays plain
    case_begin();
    sim_aged(47, 0.05, 0.5, 1800.0, 0.0, 0, 400, &first, &late);
    long first0 = first;
    sim_aged(47, 0.05, 0.5, 1800.0, 8.0, 0, 400, &first, &late);
    CHECK(first0 >= 0 && first < 0, "drafting began at step %ld without a floor, %ld with one",
          first0, first);
    case_end("policy/aged_counts_floor", "");
    // the measuring knob that keeps a drafter's run plain: the batch-16 case that drafts from
    // its step 12 or so above never drafts
    case_begin();
    sim_aged(16, 0.2, 0.7, 0.0, 0.0, 1, 400, &first, &late);
    CHECK(first < 0 && late == 0, "plain: drafting began at step %ld", first);
    case_end("policy/plain_knob", "");
}

int main(void) {
    flat_all();
    steep_none();
    bucket_fill();
    brute();
    merge_matches_sort();
    measured();
    ties();
    pushed();
    prompt_step();
    switch_cost();
    estimates();
    no_lock_in();
    aged_counts();
    return check_failures ? 1 : 0;
}
