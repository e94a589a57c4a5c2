/* policy.c: the adaptive draft policy (policy.h) */
#include "engine/policy.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct policy_cand {
    float v; /* the chance its drafts up to this one are all accepted */
    int s, j;
};

/* a measuring knob: the environment's number at least lo, else dflt */
static double knob(const char *name, double dflt, double lo) {
    const char *s = getenv(name);
    return s && atof(s) >= lo ? atof(s) : dflt;
}

void policy_init(struct td_policy *p) {
    memset(p, 0, sizeof *p);
    p->memory = knob("TD_POLICY_MEMORY", POLICY_MEMORY, 1.0);
    p->floor = knob("TD_POLICY_FLOOR", 0.0, 0.0);
    p->switch_w = knob("TD_POLICY_SWITCH_W", POLICY_SWITCH_W, -INFINITY);
    if (!(p->switch_w > 0)) p->switch_w = 0;
    p->plain = knob("TD_POLICY_PLAIN", 0.0, 0.0) > 0;
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

void policy_observe_drafter(struct td_policy *p, long rows, double seconds) {
    if (rows <= 0) {
        double a = p->n_phase < 16 ? 1.0 / (double)(p->n_phase + 1) : 1.0 / 16.0;
        p->n_phase++;
        p->draft_phase += (seconds - p->draft_phase) * a;
        return;
    }
    double extra = seconds - p->draft_phase;
    p->catch_s += extra > 0 ? extra : 0;
    p->catch_rows += rows, p->n_catch++;
}

double policy_catch_row(const struct td_policy *p) {
    return p->catch_rows ? p->catch_s / (double)p->catch_rows : 0;
}

void policy_decided(struct td_policy *p, int drafting) {
    if (drafting) {
        p->stretch++;
    } else if (p->stretch) {
        p->stretches++, p->stretch_steps += p->stretch;
        p->stretch = 0;
    }
}

/* the mean drafting stretch seen end (steps; 0: none yet) */
static double mean_stretch(const struct td_policy *p) {
    return p->stretches ? (double)p->stretch_steps / (double)p->stretches : 0.0;
}

/* how much the acceptance estimates rest on: position 1's aged proposals against a weight of
 * switch_w of them (0: taken as full) */
static double evidence(const struct td_policy *p) {
    return p->switch_w > 0 ? p->prop[0] / (p->prop[0] + p->switch_w) : 1.0;
}

double policy_switch_cost(const struct td_policy *p, long rows) {
    if (p->cost || rows <= 0) return 0;
    // (estimates with little behind them do not promise a long stretch; at least one step)
    double h = mean_stretch(p) * evidence(p);
    return policy_catch_row(p) * (double)rows / (h > 1.0 ? h : 1.0);
}

/* a plain step of bucket b: measured; else between the nearest measured buckets below and above
 * it, linear in rows (a step's time grows with its rows from a fixed part); else the nearest
 * one's, below first (optimistic); 0: none measured */
static double plain_bucket(const struct td_policy *p, int b) {
    const double *t = p->t[0];
    if (t[b] > 0) return t[b];
    int lo = b - 1, hi = b + 1;
    while (lo >= 0 && !(t[lo] > 0))
        lo--;
    while (hi < POLICY_BUCKETS && !(t[hi] > 0))
        hi++;
    if (lo >= 0 && hi < POLICY_BUCKETS)
        return t[lo] + (t[hi] - t[lo]) * (double)((1L << b) - (1L << lo)) /
                           (double)((1L << hi) - (1L << lo));
    return lo >= 0 ? t[lo] : hi < POLICY_BUCKETS ? t[hi] : 0;
}

/* The modelled cost of a step of bucket b (policy_cost without the test seam). A drafting
 * bucket never measured costs a plain step of its rows (plain_bucket) plus the drafter's part,
 * a drafting step's time beyond a plain one's in the nearest bucket where both are measured
 * (below first); with no such bucket, the plain step's alone (optimistic: the step is tried,
 * then known). Before, such a bucket took the nearest measured drafting bucket's time: after a
 * prompt phase had measured only 256-row drafting steps (1350 us), a batch-16 round of 96 rows
 * was priced at them, not at its 969 us. With no plain step measured, the nearest drafting
 * bucket's, below first. */
static double bucket_cost(const struct td_policy *p, int drafting, int b) {
    if (!drafting) return plain_bucket(p, b);
    const double *t = p->t[1], *t0 = p->t[0];
    if (t[b] > 0) return t[b];
    double plain = plain_bucket(p, b);
    if (plain > 0) {
        for (int d = 1; d < POLICY_BUCKETS; d++)
            for (int c = b - d; c <= b + d; c += 2 * d)
                if (c >= 0 && c < POLICY_BUCKETS && t[c] > 0 && t0[c] > 0)
                    return plain + (t[c] > t0[c] ? t[c] - t0[c] : 0);
        return plain;
    }
    for (int c = b - 1; c >= 0; c--)
        if (t[c] > 0) return t[c];
    for (int c = b + 1; c < POLICY_BUCKETS; c++)
        if (t[c] > 0) return t[c];
    return 0;
}

double policy_cost(const struct td_policy *p, int drafting, int rows) {
    if (p->cost) return p->cost(p->cost_ctx, drafting, rows);
    return bucket_cost(p, drafting, policy_bucket(rows));
}

/* the candidates' order: likelier first, then the earlier sequence, then its earlier draft */
static int before(const struct policy_cand *x, const struct policy_cand *y) {
    if (x->v != y->v) return x->v > y->v;
    if (x->s != y->s) return x->s < y->s;
    return x->j < y->j;
}

/* a binary heap of each sequence's next candidate, h[0] the first in that order */
static void heap_down(struct policy_cand *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, top = i;
        if (l < n && before(&h[l], &h[top])) top = l;
        if (r < n && before(&h[r], &h[top])) top = r;
        if (top == i) return;
        struct policy_cand t = h[i];
        h[i] = h[top], h[top] = t;
        i = top;
    }
}

/* a draft's chance as the policy takes it: at most the one before it in its sequence (prev; 1
 * for the first), at least 0, NaN-safe */
static float chance(float x, float prev) {
    if (!(x < prev)) x = prev;
    return x < 0 ? 0 : x;
}

/* the first candidate of the heap h[0 .. *nh), replaced there by its sequence's next draft */
static struct policy_cand pop(struct policy_cand *h, int *nh, const int *kmax, const float *m,
                              int stride) {
    struct policy_cand c = h[0];
    if (c.j + 1 < kmax[c.s]) {
        float x = chance(m[(size_t)c.s * stride + c.j + 1], c.v);
        h[0] = (struct policy_cand){.v = x, .s = c.s, .j = c.j + 1};
    } else {
        h[0] = h[--*nh];
    }
    heap_down(h, *nh, 0);
    return c;
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

/* a drafting step of bucket b, looked up once a call (cb[b] < 0: not yet) */
static double draft_bucket(const struct td_policy *p, int b, double *cb) {
    return cb[b] < 0 ? (cb[b] = bucket_cost(p, 1, b)) : cb[b];
}

/* a drafting step of rows rows: policy_cost, by draft_bucket */
static double draft_cost(const struct td_policy *p, int rows, double *cb) {
    return p->cost ? p->cost(p->cost_ctx, 1, rows) : draft_bucket(p, policy_bucket(rows), cb);
}

/* an upper bound of best_drafts' rate: every draft's chance at the cheapest drafting step of
 * any of its row counts (0: a cost not measured) */
static double rate_bound(const struct td_policy *p, int n, const int *kmax, const float *m,
                         int stride, const struct policy_step *st, int top, double *cb) {
    double e = n, tmin = -1;
    for (int s = 0; s < n; s++) {
        float v = 1.0f;
        for (int j = 0; j < kmax[s]; j++)
            e += v = chance(m[(size_t)s * stride + j], v);
    }
    // the rows grow with r (a draft takes at most the one prompt row it pushes), so the buckets
    // from r = 0 to top are every bucket they cover; the test seam is asked at every row count
    int b0 = policy_bucket(step_rows(st, n, 0, NULL)),
        b1 = policy_bucket(step_rows(st, n, top, NULL));
    for (int r = 0; p->cost && r <= top; r++) {
        double t = draft_cost(p, step_rows(st, n, r, NULL), cb);
        if (t <= 0) return 0;
        if (tmin < 0 || t < tmin) tmin = t;
    }
    for (int b = b0; !p->cost && b <= b1; b++) {
        double t = draft_bucket(p, b, cb);
        if (t <= 0) return 0;
        if (tmin < 0 || t < tmin) tmin = t;
    }
    return e / (tmin + st->extra);
}

/* the best allocation at the drafting step's costs: its drafts in all (the first ones of
 * p->cand, in order), its value in *val. Each sequence's chances are non-increasing, so the
 * drafts in order are a merge of the sequences' prefixes (a heap of their next drafts: the
 * decode step's policy ran a qsort of every draft on offer, about 6 us at batch 32 with 5 each,
 * every step, on the host's critical path). The value of r drafts, committed tokens e over
 * seconds t: rho == 0, the step's rate e / t; rho > 0, the surplus e - rho t over a rate rho
 * (a step beside prompt rows, policy_decide). Nothing measured: every draft, *val 0.
 * below: a rate the caller needs beaten (0: none; rho == 0 only); when no allocation can,
 * nothing is allocated and *val is the bound (the plain steps' decision, every step) */
static int best_drafts(struct td_policy *p, int n, const int *kmax, const float *m, int stride,
                       const struct policy_step *st, double rho, double below, double *val) {
    int total = 0;
    for (int s = 0; s < n; s++)
        total += kmax[s] > 0 ? kmax[s] : 0;
    *val = 0;
    if (total + n > p->cap) {
        struct policy_cand *c = realloc(p->cand, (size_t)(total + n) * sizeof *c);
        if (!c) return -1;
        p->cand = c, p->cap = total + n;
    }
    int top = total < st->max_drafts ? total : st->max_drafts;
    if (top < 0) top = 0;
    double cb[POLICY_BUCKETS]; // the drafting steps' costs by bucket, as looked up
    for (int b = 0; b < POLICY_BUCKETS; b++)
        cb[b] = -1;
    if (below > 0 && rho == 0) {
        double bound = rate_bound(p, n, kmax, m, stride, st, top, cb);
        if (bound > 0 && bound <= below) {
            *val = bound;
            return 0;
        }
    }
    // the heap after the order's slots (cand[0 .. r) the drafts taken, in order)
    struct policy_cand *h = p->cand + total;
    int nh = 0;
    for (int s = 0; s < n; s++)
        if (kmax[s] > 0)
            h[nh++] =
                (struct policy_cand){.v = chance(m[(size_t)s * stride], 1.0f), .s = s, .j = 0};
    for (int i = nh / 2 - 1; i >= 0; i--)
        heap_down(h, nh, i);
    // a prompt row pushed to a later step costs what a row of the plain step costs
    int pushed, rows0 = step_rows(st, n, 0, NULL);
    double t0 = policy_cost(p, 0, rows0), per_row = t0 > 0 ? t0 / rows0 : 0;
    // the value at r = 0 .. top drafts: the r most likely
    double e = n, best = -INFINITY;
    int best_r = top;
    for (int r = 0; r <= top; r++) {
        if (r) e += (p->cand[r - 1] = pop(h, &nh, kmax, m, stride)).v;
        double t = draft_cost(p, step_rows(st, n, r, &pushed), cb);
        if (t <= 0) { // nothing measured: every draft
            for (int q = r; q < top; q++)
                p->cand[q] = pop(h, &nh, kmax, m, stride);
            *val = 0;
            return top;
        }
        t += pushed * per_row + st->extra;
        double v = rho > 0 ? e - rho * t : e / t;
        if (v > best) best = v, best_r = r;
    }
    *val = best;
    return best_r;
}

/* The drafts of a step beside prompt rows: r drafts maximising e - rho t, rho the best rate of
 * these sequences' decode step alone (no prompt rows; drafting or plain). In such a step a plain
 * step's rate n / T(rows) counts the prompt rows' time and not their progress, so drafts whose own
 * rate (their tokens over the time they add) was far below decoding's looked worth it: at batch 32
 * (HumanEval, H100) the prompt phase verified 60-100 drafts a step with 10-30% accepted, each
 * such step 300-400 us longer. Against rho, a draft is verified where its tokens come at least
 * as fast as decoding gives them. Without prompt rows (or with rho not measured) the step's own
 * rate e / t decides (rho == 0). Returns what best_drafts does, and in *surplus the rate rho
 * when the value is a surplus (0 when it is a rate). */
static int policy_decide(struct td_policy *p, int n, const int *kmax, const float *m, int stride,
                         const struct policy_step *st, double below, double *val, double *surplus) {
    double rho = 0;
    *surplus = 0;
    if (st->prompt > 0) {
        struct policy_step alone = POLICY_STEP(st->fixed);
        alone.max_drafts = st->max_drafts;
        int r = best_drafts(p, n, kmax, m, stride, &alone, 0, 0, &rho);
        if (r < 0) return -1;
        // (or a plain step's, when decoding alone is better without the drafter)
        double plain = policy_cost(p, 0, step_rows(&alone, n, 0, NULL));
        if (rho > 0 && plain > 0 && n / plain > rho) rho = n / plain;
        if (rho > 0) {
            *surplus = rho;
            return best_drafts(p, n, kmax, m, stride, st, rho, 0, val);
        }
    }
    return best_drafts(p, n, kmax, m, stride, st, 0, below, val);
}

int policy_choose(struct td_policy *p, int n, const int *kmax, const float *m, int stride,
                  const struct policy_step *st, int *d) {
    int total = 0;
    for (int s = 0; s < n; s++)
        d[s] = 0, total += kmax[s] > 0 ? kmax[s] : 0;
    if (!total) return 0;
    double val, surplus;
    int r = policy_decide(p, n, kmax, m, stride, st, 0, &val, &surplus);
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
    if (!total || p->plain) return 0;
    int rows0 = step_rows(st, n, 0, NULL);
    double off = policy_cost(p, 0, rows0), on = policy_cost(p, 1, rows0);
    if (on <= 0) return 1;                                        // drafting never measured: try it
    if (off <= 0) return 0;                                       // nor a plain step: try that
    if (!p->cost && p->t[0][policy_bucket(rows0)] == 0) return 0; // its bucket
    double val, rho;
    int r = policy_decide(p, n, kmax, m, stride, st, n / off, &val, &rho);
    if (r < 0) return 1;
    // whether the drafting step beats the plain one: beside prompt rows by its surplus over
    // rho (the drafter's cost in it), alone by its rate
    return rho > 0 ? val > n - rho * off : val > n / off;
}

void policy_observe_round(struct td_policy *p, int verified, int accepted) {
    for (int j = 0; j < verified && j < POLICY_MAX_K; j++)
        p->prop[j] += 1.0, p->acc[j] += j < accepted;
}

void policy_age(struct td_policy *p) {
    const double keep = 1.0 - 1.0 / p->memory;
    for (int j = 0; j < POLICY_MAX_K; j++) {
        double k = keep; // (never below the floor: a count above it ages down to it)
        if (p->prop[j] * keep < p->floor) k = p->prop[j] > p->floor ? p->floor / p->prop[j] : 1.0;
        p->acc[j] *= k, p->prop[j] *= k;
    }
}

void policy_estimates(const long *acc_r, const long *prop_r, const double *acc, const double *prop,
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
    fprintf(f,
            "policy: catch-up %.3f us a row (%ld rows in %ld phases; a drafting phase %.1f us), "
            "drafting stretches %.1f steps (%ld)\n",
            1e6 * policy_catch_row(p), p->catch_rows, p->n_catch, 1e6 * p->draft_phase,
            mean_stretch(p), p->stretches);
    // what the aged counts hold at the end (their memory and floor beside them)
    fprintf(f, "policy: acceptance counts (memory %.0f steps, floor %.0f):", p->memory, p->floor);
    for (int j = 0; j < POLICY_MAX_K && p->prop[j] > 0; j++)
        fprintf(f, " %d: %.1f of %.1f", j + 1, p->acc[j], p->prop[j]);
    fprintf(f, "\n");
}
