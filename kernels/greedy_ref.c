/* greedy_ref.c: the tokens of greedy.h on the host: the argmax of td_argmax (first maximum)
 * after td_probs' finiteness check, and the sampled rows' softmax and inverse CDF (which
 * td_probs and td_sample are made of). */
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

void sample_rows_ref(int32_t *ids, const float *x, int n, int V, const struct sample_row *s) {
    float *p = NULL;
    for (int i = 0; i < n; i++) {
        const float *r = x + (size_t)i * V;
        if (!(s[i].temperature > 0.0f)) {
            ids[i] = row_argmax(r, V);
            continue;
        }
        if (!p) p = td_xmalloc((size_t)V * sizeof *p);
        ids[i] = softmax_t_ref(p, r, V, s[i].temperature) ? -1 : cdf_draw_ref(p, V, s[i].u);
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
