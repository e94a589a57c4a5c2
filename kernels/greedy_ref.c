/* greedy_ref.c: the tokens of greedy.h on the host: the argmax of td_argmax (first maximum)
 * after td_probs' finiteness check, and the sampled rows' softmax, top-k / top-p cut and
 * inverse CDF (which td_probs and td_sample are made of). */
#include "greedy.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>

#include "err.h"

// the first maximum of a row, or -1 when an entry is not finite
static int row_argmax(const float *r, int V) {
    int best = 0, finite = 1;
    for (int v = 0; v < V; v++) {
        if (!isfinite(r[v])) finite = 0;
        if (r[v] > r[best]) best = v;
    }
    return finite ? best : -1;
}

void argmax_rows_ref(int32_t *ids, const float *x, int n, int V) {
    for (int i = 0; i < n; i++)
        ids[i] = row_argmax(x + (size_t)i * V, V);
}

int softmax_t_ref(float *p, const float *x, int V, float temperature) {
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) {
        if (!isfinite(x[i])) return -1;
        mx = x[i] > mx ? x[i] : mx;
    }
    double sum = 0.0;
    for (int i = 0; i < V; i++)
        sum += p[i] = expf((x[i] - mx) / temperature);
    for (int i = 0; i < V; i++)
        p[i] = (float)(p[i] / sum);
    return 0;
}

int cdf_draw_ref(const float *p, int V, double u) {
    double c = 0.0;
    int last = 0;
    for (int i = 0; i < V; i++) {
        if (p[i] <= 0.0f) continue;
        c += p[i];
        last = i;
        if (u < c) return i;
    }
    return last;
}

/* a token and its probability, sorted by probability, ties to the lower id (no shared state,
 * so concurrent callers are safe) */
struct ranked {
    float p;
    int id;
};

static int by_prob_desc(const void *a, const void *b) {
    const struct ranked *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->id - y->id;
}

static int ranks_before(struct ranked a, struct ranked b) {
    return a.p > b.p || (a.p == b.p && a.id < b.id);
}

/* r[lo .. n) rearranged so that its m most likely (by_prob_desc's order, a total one) are
 * r[lo .. lo + m), in no order: a quickselect (median-of-three pivots, the same moves for the
 * same row), in O(n) steps expected; a range that splits badly too often is sorted instead */
static void select_top(struct ranked *r, int lo, int n, int m) {
    int hi = n, want = lo + m, budget = 64;
    while (hi - lo > 16 && want > lo && want < hi) {
        if (!budget--) break;
        int mid = lo + (hi - lo) / 2;
        struct ranked x = r[lo], y = r[mid], z = r[hi - 1], piv;
        if (ranks_before(x, y))
            piv = ranks_before(y, z) ? y : ranks_before(x, z) ? z : x;
        else
            piv = ranks_before(x, z) ? x : ranks_before(y, z) ? z : y;
        int i = lo, j = hi - 1; // Hoare: r[lo .. i) rank before piv or equal, r(j .. hi) after
        while (i <= j) {
            while (ranks_before(r[i], piv))
                i++;
            while (ranks_before(piv, r[j]))
                j--;
            if (i <= j) {
                struct ranked t = r[i];
                r[i++] = r[j], r[j--] = t;
            }
        }
        if (want <= j + 1)
            hi = j + 1;
        else if (want >= i)
            lo = i;
        else
            return; // r[j + 1 .. i) is piv itself: the cut falls there
    }
    if (want > lo && want < hi) qsort(r + lo, (size_t)(hi - lo), sizeof *r, by_prob_desc);
}

void probs_cut_ref(float *p, int vocab, int top_k, float top_p) {
    int k = top_k > 0 && top_k < vocab ? top_k : vocab;
    int use_p = top_p > 0.0f && top_p < 1.0f;
    if (k == vocab && !use_p) return;
    // the candidates: the k most likely, sorted (their mass summed in that order); with no
    // top-k, every token, whose mass is the row's sum in id order, and whose ranks are found
    // only as far as the top-p prefix needs them (a first 256, then four times as many
    // more at a time): sorting 129280 entries took 35-42 ms a row, the whole of a step
    struct ranked *r = malloc((size_t)vocab * sizeof *r);
    for (int i = 0; i < vocab; i++)
        r[i] = (struct ranked){.p = p[i], .id = i};
    double mass = 0.0;
    int sorted = 0; // r[0 .. sorted) hold the candidates' first ranks, in order
    if (k < vocab) {
        select_top(r, 0, vocab, k);
        qsort(r, (size_t)k, sizeof *r, by_prob_desc);
        sorted = k;
        for (int j = 0; j < k; j++)
            mass += r[j].p;
    } else {
        for (int i = 0; i < vocab; i++)
            mass += p[i];
    }
    // the shortest prefix of the candidates whose mass reaches top_p of theirs (all k without)
    double kept = 0.0;
    int n = 0, done = 0, grow = 256;
    while (!done && n < k) {
        if (n == sorted) { // rank the next ones
            int m = k - sorted < grow ? k - sorted : grow;
            select_top(r, sorted, k, m);
            qsort(r + sorted, (size_t)m, sizeof *r, by_prob_desc);
            sorted += m, grow *= 4;
        }
        for (; n < sorted; n++) {
            kept += r[n].p;
            if (use_p && kept >= top_p * mass) {
                n++, done = 1;
                break;
            }
        }
    }
    for (int i = 0; i < vocab; i++)
        p[i] = 0.0f;
    for (int j = 0; j < n; j++)
        p[r[j].id] = (float)(r[j].p / kept);
    free(r);
}

void sample_rows_ref(int32_t *ids, const float *x, int n, int V, const struct sample_row *s,
                     int cuts) {
    (void)cuts;
    float *p = NULL;
    for (int i = 0; i < n; i++) {
        const float *r = x + (size_t)i * V;
        if (!(s[i].temperature > 0.0f)) {
            ids[i] = row_argmax(r, V);
            continue;
        }
        if (!p) p = td_xmalloc((size_t)V * sizeof *p);
        if (softmax_t_ref(p, r, V, s[i].temperature)) {
            ids[i] = -1;
            continue;
        }
        probs_cut_ref(p, V, s[i].top_k, s[i].top_p);
        ids[i] = cdf_draw_ref(p, V, s[i].u);
    }
    free(p);
}

void greedy_slot_ref(int32_t *tok, int32_t *n_drafts, int32_t *next, const float *x, int n, int V,
                     int g, int j) {
    for (int i = 0; i < n; i++) {
        int best = row_argmax(x + (size_t)i * V, V), finite = best >= 0;
        next[i] = finite ? best : 0;
        if (finite && n_drafts[i] == j) {
            tok[(size_t)i * g + j] = best;
            n_drafts[i] = j + 1;
        }
    }
}
