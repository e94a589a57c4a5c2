/* policy.c: the adaptive draft policy (policy.h) */
#include "engine/policy.h"

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

/* the best allocation at the drafting step's costs: its drafts in all (the first ones of
 * p->cand, sorted), its rate in *rate (0 when nothing is measured: every draft) */
static int best_drafts(struct td_policy *p, int n, const int *kmax, const float *m, int stride,
                       int other_rows, double *rate) {
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
    // committed tokens per second at n + r rows, r = 0 .. total: the r most likely drafts
    double e = n, best = -1;
    int best_r = total;
    for (int r = 0; r <= total; r++) {
        if (r) e += p->cand[r - 1].v;
        double t = policy_cost(p, 1, other_rows + n + r);
        if (t <= 0) return total; // nothing measured: every draft
        if (e / t > best) best = e / t, best_r = r;
    }
    *rate = best;
    return best_r;
}

int policy_choose(struct td_policy *p, int n, const int *kmax, const float *m, int stride,
                  int other_rows, int *d) {
    int total = 0;
    for (int s = 0; s < n; s++)
        d[s] = 0, total += kmax[s] > 0 ? kmax[s] : 0;
    if (!total) return 0;
    // a step verifying no draft never measured (while others are): one is tried, so that its
    // cost is known before drafts are chosen against it
    if (!p->cost && policy_cost(p, 1, other_rows + n) > 0 &&
        p->t[1][policy_bucket(other_rows + n)] == 0)
        return 0;
    double rate;
    int r = best_drafts(p, n, kmax, m, stride, other_rows, &rate);
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
                    int other_rows) {
    int total = 0;
    for (int s = 0; s < n; s++)
        total += kmax[s] > 0 ? kmax[s] : 0;
    if (!total) return 0;
    double off = policy_cost(p, 0, other_rows + n), on = policy_cost(p, 1, other_rows + n);
    if (on <= 0) return 1;  // drafting never measured: try it
    if (off <= 0) return 0; // nor a plain step: try that
    if (!p->cost && p->t[0][policy_bucket(other_rows + n)] == 0) return 0; // its bucket
    double rate;
    if (best_drafts(p, n, kmax, m, stride, other_rows, &rate) < 0) return 1;
    return rate > n / off;
}
