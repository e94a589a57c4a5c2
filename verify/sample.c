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
    probs_cut_ref(p, vocab, s->top_k, s->top_p);
    return 0;
}

int td_sample(const float *p, int vocab, double u) {
    return cdf_draw_ref(p, vocab, u);
}
