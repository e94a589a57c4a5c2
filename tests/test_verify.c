/* test_verify.c: lossless acceptance (verify/accept.c) and the sampling distribution.
 *
 *   make build/tests/test_verify && build/tests/test_verify
 *
 * The statistical cases draw 10^5 chains on a 6-token vocabulary and compare the emitted
 * tokens' histogram with the target distribution by chi-square (Wilson-Hilferty z < 4.5, a
 * false alarm about once in 300,000 runs); the same test with a deliberately biased acceptance
 * rule must fail it (z > 10), which shows the test has power. Randomness is counter-based, so
 * every run is the same run.
 */
#include <stdint.h>

#include "check.h"
#include "kernels/greedy.h"
#include "verify/accept.h"
#include "verify/sample.h"

#define V      6
#define TRIALS 100000

static double chi2_z(const long *obs, const double *expect_p, int cells, long n) {
    double chi = 0;
    int df = -1;
    for (int i = 0; i < cells; i++) {
        if (expect_p[i] <= 0) {
            if (obs[i]) return 1e9; // mass where the target has none
            continue;
        }
        double e = expect_p[i] * n, d = obs[i] - e;
        chi += d * d / e;
        df++;
    }
    double k = df, h = 2.0 / (9.0 * k);
    return (pow(chi / k, 1.0 / 3.0) - (1.0 - h)) / sqrt(h);
}

static void normalise(double *p, int n) {
    double s = 0;
    for (int i = 0; i < n; i++)
        s += p[i];
    for (int i = 0; i < n; i++)
        p[i] /= s;
}

/* logits whose softmax is p */
static void to_logits(float *lg, const double *p) {
    for (int i = 0; i < V; i++)
        lg[i] = p[i] > 0 ? (float)log(p[i]) : -1e30f;
}

/* Markov target P[a][b] and draft Q[a][b]; chain of L drafts from anchor 0.
 * kind: 0 random q, 1 greedy (one-hot argmax of Q), 2 chained Markov q (sampled from Q[prev]).
 * Returns the z of the joint histogram of the first two emitted tokens against P. */
static double run_chain(int kind, int L, double bias, long *n_accepted) {
    static double P[V][V], Q[V][V];
    uint64_t st = 12345;
    for (int a = 0; a < V; a++) {
        for (int b = 0; b < V; b++) {
            P[a][b] = 0.05 + td_rand_uniform(st, (uint64_t)(a * V + b), 7);
            Q[a][b] = 0.05 + td_rand_uniform(st, (uint64_t)(a * V + b), 8);
        }
        P[a][(a + 1) % V] += 1.0; // peaked rows, so acceptance is neither ~0 nor ~1
        Q[a][(a + 1) % V] += 0.7;
        normalise(P[a], V);
        normalise(Q[a], V);
    }
    long hist[V * V] = {0};
    *n_accepted = 0;
    float logits[(8 + 1) * V], qrow[8][V], p[V], r[V];
    const float *qp[8];
    int32_t drafts[8];
    struct td_sampling s = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
    for (long t = 0; t < TRIALS; t++) {
        s.seed = (uint64_t)t;
        int prev = 0;
        for (int j = 0; j < L; j++) {
            double u = td_rand_uniform(s.seed, (uint64_t)j, 99);
            int x;
            if (kind == 1) {
                x = 0;
                for (int b = 1; b < V; b++)
                    x = Q[prev][b] > Q[prev][x] ? b : x;
                qp[j] = NULL;
            } else {
                const double *src = Q[kind == 2 ? prev : 0];
                double c = 0;
                x = V - 1;
                for (int b = 0; b < V; b++) {
                    c += src[b];
                    if (u < c) {
                        x = b;
                        break;
                    }
                }
                for (int b = 0; b < V; b++)
                    qrow[j][b] = (float)src[b];
                qp[j] = qrow[j];
            }
            drafts[j] = x;
            prev = x;
        }
        // target rows follow the chain the drafts build: row j is conditioned on draft j-1
        prev = 0;
        for (int j = 0; j <= L; j++) {
            to_logits(logits + j * V, P[prev]);
            if (j < L) prev = drafts[j];
        }
        struct verify_result vr;
        verify_chain(&vr, logits, V, drafts, kind == 1 ? NULL : qp, L, &s, 100, p, r, bias);
        *n_accepted += vr.n_accepted;
        int out[9], n = 0;
        for (int j = 0; j < vr.n_accepted; j++)
            out[n++] = drafts[j];
        out[n++] = vr.token;
        if (n < 2) { // one token this round: the next comes from a fresh target row
            float lg[V];
            to_logits(lg, P[out[0]]);
            td_probs(p, lg, V, &s);
            out[n++] = td_sample(p, V, td_rand_uniform(s.seed, 102, TD_RAND_SAMPLE));
        }
        hist[out[0] * V + out[1]]++;
    }
    double expect[V * V];
    for (int a = 0; a < V; a++)
        for (int b = 0; b < V; b++)
            expect[a * V + b] = P[0][a] * P[a][b];
    return chi2_z(hist, expect, V * V, TRIALS);
}

static void test_distribution(void) {
    const char *names[3] = {"random_q", "greedy_q", "markov_q"};
    for (int kind = 0; kind < 3; kind++) {
        char name[64], extra[96];
        long acc;
        case_begin();
        double z = run_chain(kind, 3, 1.0, &acc);
        CHECK(z < 4.5, "chi-square z = %.2f (accepted %.3f per chain)", z, (double)acc / TRIALS);
        snprintf(extra, sizeof extra, "(z = %.2f, %.3f drafts accepted per chain of 3)", z,
                 (double)acc / TRIALS);
        snprintf(name, sizeof name, "chi_square/%s", names[kind]);
        case_end(name, extra);
    }
    case_begin();
    long acc;
    double z = run_chain(2, 3, 1.3, &acc);
    CHECK(z > 10, "a biased acceptance rule passed (z = %.2f): the test has no power", z);
    char extra[64];
    snprintf(extra, sizeof extra, "(biased rule z = %.1f)", z);
    case_end("chi_square_detects_bias", extra);
}

static void test_one_hot(void) {
    case_begin();
    float logits[5 * V], p[V], r[V];
    int32_t want[5] = {2, 4, 1, 1, 5}, drafts[4];
    for (int j = 0; j < 5; j++)
        for (int v = 0; v < V; v++)
            logits[j * V + v] = v == want[j] ? 0.0f : -1e30f;
    for (int trial = 0; trial < 200; trial++) {
        struct td_sampling s = {.temperature = 0.7f + trial % 3,
                                .top_k = trial % 4,
                                .top_p = trial % 2 ? 0.9f : 1.0f,
                                .seed = (uint64_t)trial};
        for (int j = 0; j < 4; j++)
            drafts[j] = trial % 5 == 0 ? want[j] : (int32_t)(td_rand_uniform(trial, j, 9) * V);
        float q[4][V];
        const float *qp[4];
        for (int j = 0; j < 4; j++) {
            for (int v = 0; v < V; v++)
                q[j][v] = 1.0f / V;
            qp[j] = q[j];
        }
        struct verify_result vr;
        verify_chain(&vr, logits, V, drafts, qp, 4, &s, 10, p, r, 1.0);
        for (int j = 0; j < vr.n_accepted; j++)
            CHECK(drafts[j] == want[j], "trial %d: accepted draft %d = %d, target %d", trial, j,
                  drafts[j], want[j]);
        CHECK(vr.token == want[vr.n_accepted], "trial %d: token %d after %d accepted, target %d",
              trial, vr.token, vr.n_accepted, want[vr.n_accepted]);
        if (trial % 5 == 0)
            CHECK(vr.n_accepted == 4, "trial %d: the right chain was rejected", trial);
    }
    case_end("one_hot_target_exact", "");
}

static void test_greedy_prefix(void) {
    case_begin();
    float logits[8 * V], p[V], r[V];
    struct td_sampling s = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 3};
    for (int trial = 0; trial < 500; trial++) {
        for (int k = 0; k < 8 * V; k++)
            logits[k] = (float)td_rand_uniform(trial, k, 4);
        int32_t drafts[7];
        for (int j = 0; j < 7; j++)
            drafts[j] = trial % 3 ? td_argmax(logits + j * V, V)
                                  : (int32_t)(td_rand_uniform(trial, j, 5) * V);
        struct verify_result vr;
        verify_chain(&vr, logits, V, drafts, NULL, 7, &s, 0, p, r, 1.0);
        int a = 0;
        while (a < 7 && drafts[a] == td_argmax(logits + a * V, V))
            a++;
        CHECK(vr.n_accepted == a && vr.token == td_argmax(logits + a * V, V),
              "trial %d: accepted %d (expected %d), token %d", trial, vr.n_accepted, a, vr.token);
    }
    case_end("greedy_accepts_argmax_prefix", "");
}

static void test_nan(void) {
    float logits[4 * V], p[V], r[V], q[3][V];
    const float *qp[3] = {q[0], q[1], q[2]};
    int32_t drafts[3] = {1, 2, 3};
    struct td_sampling s = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = 1};
    case_begin();
    for (int k = 0; k < 4 * V; k++)
        logits[k] = k % V == (k / V + 1) ? 5.0f : 0.0f;
    for (int j = 0; j < 3; j++)
        for (int v = 0; v < V; v++)
            q[j][v] = v == drafts[j] ? 1.0f : 0.0f;
    logits[2 * V + 3] = NAN; // row 2 judges draft 3 and predicts position 10 + 3
    struct verify_result vr;
    for (int t = 0; t < 50; t++) {
        s.seed = (uint64_t)t;
        verify_chain(&vr, logits, V, drafts, qp, 3, &s, 10, p, r, 1.0);
        if (vr.n_accepted == 2 || vr.status) {
            CHECK(vr.status == VERIFY_NAN_TARGET && vr.nan_position == 13 && vr.token == -1,
                  "NaN row: status %d position %ld token %d", vr.status, vr.nan_position, vr.token);
        }
    }
    s.temperature = 0.0f;
    verify_chain(&vr, logits, V, drafts, NULL, 3, &s, 10, p, r, 1.0);
    CHECK(vr.status == VERIFY_NAN_TARGET && vr.token == -1, "greedy NaN row not reported");
    case_end("nan_target_row_fails_no_token", "");

    case_begin();
    logits[2 * V + 3] = 0.0f;
    q[1][4] = INFINITY; // draft 2's distribution is broken: it and draft 3 are dropped
    s.temperature = 1.0f;
    for (int t = 0; t < 50; t++) {
        s.seed = (uint64_t)t;
        verify_chain(&vr, logits, V, drafts, qp, 3, &s, 10, p, r, 1.0);
        CHECK(vr.status == VERIFY_OK && vr.n_drafts_used == 1 && vr.n_accepted <= 1 &&
                  vr.token >= 0 && vr.token < V,
              "non-finite q: used %d accepted %d token %d", vr.n_drafts_used, vr.n_accepted,
              vr.token);
    }
    case_end("nan_draft_row_rejected", "");
}

static void test_probs(void) {
    case_begin();
    float lg[V] = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f, 0.5f}, p[V];
    struct td_sampling g = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
    td_probs(p, lg, V, &g);
    CHECK(p[1] == 1.0f && p[3] == 0.0f, "greedy tie must pick the lowest id");
    struct td_sampling k2 = {.temperature = 1.0f, .top_k = 2, .top_p = 1.0f, .seed = 0};
    td_probs(p, lg, V, &k2);
    CHECK(p[0] == 0 && p[2] == 0 && fabsf(p[1] - 0.5f) < 1e-6f && fabsf(p[3] - 0.5f) < 1e-6f,
          "top-k 2: %g %g %g %g", p[0], p[1], p[2], p[3]);
    struct td_sampling tp = {.temperature = 1.0f, .top_k = 0, .top_p = 0.5f, .seed = 0};
    td_probs(p, lg, V, &tp);
    int nz = 0;
    for (int i = 0; i < V; i++)
        nz += p[i] > 0;
    CHECK(nz == 2 && p[1] > 0 && p[3] > 0, "top-p 0.5 kept %d tokens", nz);
    float bad[V] = {0, 1, NAN, 0, 0, 0};
    CHECK(td_probs(p, bad, V, &k2) == -1, "a NaN row was accepted");
    case_end("probs_temperature_topk_topp", "");
}

/* verify_chain at T = 0 takes a one-pass path (td_argmax_finite); it must give what the general
 * rule gives with a one-hot target (finite rows, p one-hot at td_argmax's first maximum, accept
 * when p[x] = 1, the residual's draw for a correction, the bonus drawn from p), and the one-pass
 * argmax must equal td_argmax on every row: 20000 random chains over vocabularies of 1 to 40,
 * logits from a few values (ties, -0 and +0), drafts often the argmax, a NaN or an infinity now and
 * then */
static void general_rule(struct verify_result *res, const float *lg, int nv, const int32_t *d,
                         int nl, const struct td_sampling *s, long pos0, float *p, float *r) {
    res->n_drafts_used = nl, res->status = VERIFY_OK, res->token = -1, res->nan_position = -1;
    int a = 0;
    for (;; a++) {
        long pos = pos0 + a + 1;
        const float *row = lg + (size_t)a * nv; // td_probs at T = 0, spelled out: finite, then
        int finite = 1;                         // one-hot at the first maximum (td_argmax)
        for (int i = 0; i < nv; i++)
            finite &= isfinite(row[i]) != 0;
        if (!finite) {
            res->status = VERIFY_NAN_TARGET, res->nan_position = pos;
            break;
        }
        for (int i = 0; i < nv; i++)
            p[i] = i == td_argmax(row, nv) ? 1.0f : 0.0f;
        if (a == nl) {
            res->token = td_sample(p, nv, td_rand_uniform(s->seed, pos, TD_RAND_SAMPLE));
            break;
        }
        if (p[d[a]] == 1.0f) continue;
        double mass = 0.0;
        for (int i = 0; i < nv; i++)
            mass += r[i] = p[i] > (i == d[a] ? 1.0f : 0.0f) ? p[i] - (i == d[a]) : 0.0f;
        for (int i = 0; i < nv && mass > 1e-8; i++)
            r[i] = (float)(r[i] / mass);
        res->token =
            td_sample(mass > 1e-8 ? r : p, nv, td_rand_uniform(s->seed, pos, TD_RAND_SAMPLE));
        break;
    }
    res->n_accepted = a;
}

static void test_greedy_fast_path(void) {
    case_begin();
    static const float vals[] = {-1.5f, 0.0f, -0.0f, 2.0f, 2.0f, 7.25f, -3.0f, 0.5f};
    float lg[6 * 40], p[40], r[40];
    int32_t d[5];
    uint64_t st = 12345;
    int differ = 0, nans = 0, accepted = 0;
    for (int it = 0; it < 20000; it++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        int nv = 1 + (int)((st >> 33) % 40), nl = (int)((st >> 20) % 6);
        for (int i = 0; i < (nl + 1) * nv; i++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            lg[i] = vals[(st >> 40) % 8];
            if ((st >> 24) % 997 == 0) lg[i] = (st >> 50) & 1 ? NAN : INFINITY;
        }
        for (int j = 0; j < nl; j++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            d[j] = (st >> 40) % 3 ? td_argmax(lg + (size_t)j * nv, nv) : (int)((st >> 20) % nv);
        }
        struct td_sampling s = {
            .temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = (uint64_t)it};
        struct verify_result a, b;
        for (int j = 0; j <= nl; j++) { // the one-pass argmax itself against td_argmax
            const float *row = lg + (size_t)j * nv;
            int finite = 1;
            for (int i = 0; i < nv; i++)
                finite &= isfinite(row[i]) != 0;
            differ += td_argmax_finite(row, nv) != (finite ? td_argmax(row, nv) : -1);
        }
        verify_chain(&a, lg, nv, d, NULL, nl, &s, 50, p, r, 1.0);
        general_rule(&b, lg, nv, d, nl, &s, 50, p, r);
        differ += a.status != b.status || a.n_accepted != b.n_accepted || a.token != b.token ||
                  a.nan_position != b.nan_position || a.n_drafts_used != b.n_drafts_used;
        // and from the rows' argmaxes alone (a greedy step whose logits stayed on the device)
        int32_t ids[6];
        argmax_rows_ref(ids, lg, nl + 1, nv);
        verify_greedy(&b, ids, nv, d, nl, 50);
        differ += a.status != b.status || a.n_accepted != b.n_accepted || a.token != b.token ||
                  a.nan_position != b.nan_position || a.n_drafts_used != b.n_drafts_used;
        nans += a.status == VERIFY_NAN_TARGET;
        accepted += a.n_accepted;
    }
    CHECK(!differ, "%d chains or argmax rows differ from the general rule", differ);
    CHECK(nans > 50 && accepted > 5000, "the cases did not reach NaN rows (%d) or acceptance (%d)",
          nans, accepted);
    char extra[80];
    snprintf(extra, sizeof extra, "(%d NaN or infinite targets, %d drafts accepted)", nans,
             accepted);
    case_end("greedy_fast_path_and_argmax_ids_equal_general_rule", extra);
}

/* a sampled row drawn where the logits are (sample_rows_ref, as the engine asks the backend for
 * a request with no drafts), with or without top-k and top-p, is the token the host's rule
 * draws: verify_chain with no drafts, the uniform of the position the row predicts; the same
 * for a row that is not finite (-1, and NaN_TARGET there) and a greedy one */
static void test_sample_rows_equal_host_rule(void) {
    case_begin();
    enum { NV = 300 };
    float lg[NV], p[NV], r[NV];
    uint64_t st = 777;
    int differ = 0, nans = 0, tokens[NV] = {0}, distinct = 0;
    for (int it = 0; it < 5000; it++) {
        for (int i = 0; i < NV; i++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            lg[i] = (float)((st >> 40) % 2000) / 200.0f - 5.0f;
            if ((st >> 24) % 49999 == 0) lg[i] = NAN;
        }
        float temps[3] = {0.0f, 0.7f, 1.8f}, top_ps[4] = {1.0f, 0.5f, 0.9f, 1.0f};
        int top_ks[5] = {0, 0, 1, 20, NV};
        struct td_sampling s = {.temperature = temps[it % 3],
                                .top_k = top_ks[it % 5],
                                .top_p = top_ps[it % 4],
                                .seed = (uint64_t)it * 31};
        long pos0 = it % 97;
        struct verify_result a, b;
        verify_chain(&a, lg, NV, NULL, NULL, 0, &s, pos0, p, r, 1.0);
        struct sample_row sr = {.temperature = s.temperature,
                                .top_k = s.top_k,
                                .top_p = s.top_p,
                                .u = td_rand_uniform(s.seed, (uint64_t)(pos0 + 1), TD_RAND_SAMPLE)};
        int32_t id;
        sample_rows_ref(&id, lg, 1, NV, &sr, 1);
        verify_greedy(&b, &id, NV, NULL, 0, pos0);
        differ += a.status != b.status || a.token != b.token || a.nan_position != b.nan_position;
        nans += a.status == VERIFY_NAN_TARGET;
        if (a.token >= 0 && !tokens[a.token]++) distinct++;
    }
    CHECK(!differ, "%d rows draw differently from the host's rule", differ);
    CHECK(nans > 10 && distinct > 50, "the cases reached %d NaN rows and %d tokens", nans,
          distinct);
    char extra[80];
    snprintf(extra, sizeof extra, "(%d NaN rows, %d distinct tokens)", nans, distinct);
    case_end("sample_rows_equal_host_rule", extra);
}

/* td_probs' top-k and top-p rank only as far as they need (a quickselect, then sorts of the
 * ranks a prefix reaches): the same p, bit for bit, as ranking the whole row (a qsort by
 * probability, ties to the lower id; the row's mass in id order without top-k, the k
 * candidates' in rank order with it), over 4000 rows: widths 1 to 3000, logits from a few
 * values (ties) or spread, every top-k and top-p from none to all, NaN rows refused alike */
struct ranked_t {
    float p;
    int id;
};
static int rank_cmp(const void *a, const void *b) {
    const struct ranked_t *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->id - y->id;
}
static int probs_sorted(float *p, const float *lg, int nv, const struct td_sampling *s) {
    if (softmax_t_ref(p, lg, nv, s->temperature)) return -1;
    int k = s->top_k > 0 && s->top_k < nv ? s->top_k : nv, use_p = s->top_p > 0 && s->top_p < 1;
    if (k == nv && !use_p) return 0;
    struct ranked_t *r = malloc((size_t)nv * sizeof *r);
    for (int i = 0; i < nv; i++)
        r[i] = (struct ranked_t){.p = p[i], .id = i};
    qsort(r, (size_t)nv, sizeof *r, rank_cmp);
    double mass = 0.0, kept = 0.0;
    if (k < nv)
        for (int j = 0; j < k; j++)
            mass += r[j].p;
    else
        for (int i = 0; i < nv; i++)
            mass += p[i];
    int n = 0;
    for (; n < k; n++) {
        kept += r[n].p;
        if (use_p && kept >= s->top_p * mass) {
            n++;
            break;
        }
    }
    for (int i = 0; i < nv; i++)
        p[i] = 0.0f;
    for (int j = 0; j < n; j++)
        p[r[j].id] = (float)(r[j].p / kept);
    free(r);
    return 0;
}

static void test_probs_ranked_as_far_as_needed(void) {
    case_begin();
    enum { VMAX = 3000 };
    static float lg[VMAX], a[VMAX], b[VMAX];
    static const float vals[] = {-2.0f, 0.0f, 0.5f, 1.0f, 1.0f, 3.0f};
    uint64_t st = 4242;
    int differ = 0, refused = 0, cut = 0;
    for (int it = 0; it < 4000; it++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        int nv = 1 + (int)((st >> 33) % VMAX), ties = (st >> 20) % 2;
        for (int i = 0; i < nv; i++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            lg[i] = ties ? vals[(st >> 40) % 6] : (float)((st >> 40) % 100000) / 8000.0f;
            if ((st >> 24) % 200000 == 0) lg[i] = NAN;
        }
        int ks[6] = {0, 1, 5, nv / 3, nv, nv + 5};
        float ps[4] = {1.0f, 0.3f, 0.9f, 0.999f}, ts[3] = {0.5f, 1.0f, 2.0f};
        struct td_sampling s = {.temperature = ts[it % 3],
                                .top_k = ks[(st >> 8) % 6],
                                .top_p = ps[(st >> 12) % 4],
                                .seed = 0};
        int ra = td_probs(a, lg, nv, &s), rb = probs_sorted(b, lg, nv, &s);
        refused += ra < 0;
        differ += ra != rb || (!ra && memcmp(a, b, (size_t)nv * sizeof *a));
        int nz = 0;
        for (int i = 0; !ra && i < nv; i++)
            nz += a[i] > 0.0f;
        cut += !ra && nz < nv;
    }
    CHECK(!differ, "%d rows differ from ranking the whole row", differ);
    CHECK(cut > 1000 && refused > 0, "the cases cut %d rows and refused %d", cut, refused);
    char extra[80];
    snprintf(extra, sizeof extra, "(%d rows cut, %d refused)", cut, refused);
    case_end("probs_ranked_as_far_as_needed", extra);
}

int main(void) {
    test_probs();
    test_probs_ranked_as_far_as_needed();
    test_sample_rows_equal_host_rule();
    test_one_hot();
    test_greedy_prefix();
    test_nan();
    test_distribution();
    test_greedy_fast_path();
    return check_failures ? 1 : 0;
}
