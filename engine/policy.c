/* policy.c: the adaptive draft policy (policy.h) */
#include "engine/policy.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct policy_cand {
    float v; /* the chance its drafts up to this one are all accepted */
    int s, j;
};

void policy_init(struct td_policy *p) {
    memset(p, 0, sizeof *p);
}

void policy_free(struct td_policy *p) {
    free(p->cand);
    p->cand = NULL, p->cap = 0;
}

int policy_bucket(int rows) {
    int b = 0;
    while (b < POLICY_BUCKETS - 1 && (1 << b) < rows)
        b++;
    return b;
}

void policy_observe(struct td_policy *p, int drafting, int rows, double seconds) {
    int b = policy_bucket(rows), m = drafting ? 1 : 0;
    if (p->n[m][b]++ == 0) return; // the warm-up (a graph captured, caches cold)
    // the mean of the first 16 measured, then a moving average over about 16
    double a = p->n[m][b] - 1 < 16 ? 1.0 / (double)(p->n[m][b] - 1) : 1.0 / 16.0;
    p->t[m][b] += (seconds - p->t[m][b]) * a;
}

double policy_cost(const struct td_policy *p, int drafting, int rows) {
    if (p->cost) return p->cost(p->cost_ctx, drafting, rows);
    const double *t = p->t[drafting ? 1 : 0];
    int b = policy_bucket(rows);
    for (int c = b; c >= 0; c--) // the next smaller measured bucket's (optimistic)
        if (t[c] > 0) return t[c];
    for (int c = b + 1; c < POLICY_BUCKETS; c++)
        if (t[c] > 0) return t[c];
    return 0;
}

static int by_value(const void *a, const void *b) {
    const struct policy_cand *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    if (x->s != y->s) return x->s < y->s ? -1 : 1;
    return x->j < y->j ? -1 : x->j > y->j;
}

/* the step's rows with r drafts beside st (policy_step), and (pushed non-NULL) the prompt
 * rows they push out */
static int step_rows(const struct policy_step *st, int n, int r, int *pushed) {
    int in0 = st->prompt < st->room ? st->prompt : st->room;
    int in = st->prompt < st->room - r ? st->prompt : st->room - r;
    if (in < 0) in = 0;
    if (pushed) *pushed = in0 - in;
    return n + st->fixed + r + in;
}

/* the best allocation at the drafting step's costs: its drafts in all (the first ones of
 * p->cand, sorted), its rate in *rate (0 when nothing is measured: every draft) */
static int best_drafts(struct td_policy *p, int n, const int *kmax, const float *m, int stride,
                       const struct policy_step *st, double *rate) {
    int total = 0;
    for (int s = 0; s < n; s++)
        total += kmax[s] > 0 ? kmax[s] : 0;
    *rate = 0;
    if (total > p->cap) {
        struct policy_cand *c = realloc(p->cand, (size_t)total * sizeof *c);
        if (!c) return -1;
        p->cand = c, p->cap = total;
    }
    int k = 0;
    for (int s = 0; s < n; s++) {
        float v = 1.0f;
        for (int j = 0; j < kmax[s]; j++) {
            float x = m[(size_t)s * stride + j];
            if (!(x < v)) x = v; // non-increasing (and NaN-safe)
            if (x < 0) x = 0;
            v = x;
            p->cand[k++] = (struct policy_cand){.v = v, .s = s, .j = j};
        }
    }
    qsort(p->cand, (size_t)k, sizeof *p->cand, by_value);
    int top = total < st->max_drafts ? total : st->max_drafts;
    if (top < 0) top = 0;
    // a prompt row pushed to a later step costs what a row of the plain step costs
    int pushed, rows0 = step_rows(st, n, 0, NULL);
    double t0 = policy_cost(p, 0, rows0), per_row = t0 > 0 ? t0 / rows0 : 0;
    // committed tokens per second at r = 0 .. top drafts: the r most likely
    double e = n, best = -1;
    int best_r = top;
    for (int r = 0; r <= top; r++) {
        if (r) e += p->cand[r - 1].v;
        int rows = step_rows(st, n, r, &pushed);
        double t = policy_cost(p, 1, rows);
        if (t <= 0) return top; // nothing measured: every draft
        t += pushed * per_row;
        if (e / t > best) best = e / t, best_r = r;
    }
    *rate = best;
    return best_r;
}

int policy_choose(struct td_policy *p, int n, const int *kmax, const float *m, int stride,
                  const struct policy_step *st, int *d) {
    int total = 0;
    for (int s = 0; s < n; s++)
        d[s] = 0, total += kmax[s] > 0 ? kmax[s] : 0;
    if (!total) return 0;
    // a step verifying no draft never measured (while others are): one is tried, so that its
    // cost is known before drafts are chosen against it
    int rows0 = step_rows(st, n, 0, NULL);
    if (!p->cost && policy_cost(p, 1, rows0) > 0 && p->t[1][policy_bucket(rows0)] == 0) return 0;
    double rate;
    int r = best_drafts(p, n, kmax, m, stride, st, &rate);
    if (r < 0) { // no scratch: every draft, as the fixed policy verifies them
        for (int s = 0; s < n; s++)
            d[s] = kmax[s] > 0 ? kmax[s] : 0;
        return total;
    }
    for (int i = 0; i < r; i++)
        d[p->cand[i].s]++;
    return r;
}

int policy_drafting(struct td_policy *p, int n, const int *kmax, const float *m, int stride,
                    const struct policy_step *st) {
    int total = 0;
    for (int s = 0; s < n; s++)
        total += kmax[s] > 0 ? kmax[s] : 0;
    if (!total) return 0;
    int rows0 = step_rows(st, n, 0, NULL);
    double off = policy_cost(p, 0, rows0), on = policy_cost(p, 1, rows0);
    if (on <= 0) return 1;                                        // drafting never measured: try it
    if (off <= 0) return 0;                                       // nor a plain step: try that
    if (!p->cost && p->t[0][policy_bucket(rows0)] == 0) return 0; // its bucket
    double rate;
    if (best_drafts(p, n, kmax, m, stride, st, &rate) < 0) return 1;
    return rate > n / off;
}

void policy_estimates(const long *acc_r, const long *prop_r, const long *acc, const long *prop,
                      long rounds, int k, float *m) {
    const double w = 8.0, beta = 0.25;
    double explore = log(2.0 + (double)(rounds > 0 ? rounds : 0));
    for (int j = 0; j < k; j++) {
        double all = (acc[j] + 1.0) / (prop[j] + 1.0) + beta * sqrt(explore / (prop[j] + 1.0));
        if (all > 1.0) all = 1.0;
        m[j] = (float)((acc_r[j] + w * all) / (prop_r[j] + w));
    }
}

void policy_trace(const struct td_policy *p, FILE *f) {
    fprintf(f, "policy: rows <=  plain us (steps)  drafting us (steps)\n");
    for (int b = 0; b < POLICY_BUCKETS; b++)
        if (p->n[0][b] || p->n[1][b])
            fprintf(f, "policy: %7d  %8.1f (%ld)  %8.1f (%ld)\n", 1 << b, 1e6 * p->t[0][b],
                    p->n[0][b], 1e6 * p->t[1][b], p->n[1][b]);
}
