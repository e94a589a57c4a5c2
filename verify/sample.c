/* sample.c: temperature / top-k / top-p distributions and the counter-based generator. */
#include "sample.h"

#include <math.h>
#include <stdlib.h>

#include "kernels/greedy.h"

/* splitmix64 finaliser: a bijective mix, so distinct keys give independent-looking outputs */
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double td_rand_uniform(uint64_t seed, uint64_t position, uint32_t stream) {
    uint64_t h = mix64(seed + 0x9e3779b97f4a7c15ull);
    h = mix64(h ^ (position * 0xd1b54a32d192ed03ull));
    h = mix64(h ^ ((uint64_t)stream * 0x8cb92ba72f3d8dd7ull));
    return (double)(h >> 11) * 0x1p-53;
}

int td_argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Eight independent lanes (each the first maximum of its residue class), folded by
 * value, then the lower index: the first maximum overall, without one long chain of compares */
int td_argmax_finite(const float *x, int vocab) {
    enum { LANES = 8 };
    float bv[LANES];
    int bi[LANES], finite = 1, i = LANES;
    for (int l = 0; l < LANES; l++) { // lane l starts at x[l]; a lane past the row stays empty
        bv[l] = l < vocab ? x[l] : -INFINITY, bi[l] = l < vocab ? l : vocab;
        finite &= l >= vocab || isfinite(x[l]);
    }
    for (; i + LANES <= vocab; i += LANES)
        for (int l = 0; l < LANES; l++) {
            float v = x[i + l];
            finite &= isfinite(v) != 0;
            if (v > bv[l]) bv[l] = v, bi[l] = i + l;
        }
    for (int l = 0; i < vocab; i++, l++) {
        float v = x[i];
        finite &= isfinite(v) != 0;
        if (v > bv[l]) bv[l] = v, bi[l] = i;
    }
    int b = 0;
    for (int l = 1; l < LANES; l++)
        if (bi[l] < vocab && (bv[l] > bv[b] || (bv[l] == bv[b] && bi[l] < bi[b]))) b = l;
    return finite ? bi[b] : -1;
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

int td_probs(float *p, const float *logits, int vocab, const struct td_sampling *s) {
    if (s->temperature <= 0.0f) {
        int m = td_argmax_finite(logits, vocab);
        if (m < 0) return -1;
        for (int i = 0; i < vocab; i++)
            p[i] = 0.0f;
        p[m] = 1.0f;
        return 0;
    }
    if (softmax_t_ref(p, logits, vocab, s->temperature)) return -1;
    int k = s->top_k > 0 && s->top_k < vocab ? s->top_k : vocab;
    int use_p = s->top_p > 0.0f && s->top_p < 1.0f;
    if (k == vocab && !use_p) return 0;
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
            if (use_p && kept >= s->top_p * mass) {
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
    return 0;
}

int td_sample(const float *p, int vocab, double u) {
    return cdf_draw_ref(p, vocab, u);
}
