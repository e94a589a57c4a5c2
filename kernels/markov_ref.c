/* markov_ref.c: DSpark's greedy Markov chain on the host (see markov.h), slot by slot. The sums
 * are those of matmul_ref (td_dot), so the drafts equal the per-slot host loop's. */
#include "markov.h"

#include "dot.h"
#include "err.h"

#include <math.h>
#include <stdlib.h>

static void slot(const struct markov_args *a, int j) {
    float *e = td_xmalloc((size_t)a->r * sizeof(float)),
          *w = td_xmalloc((size_t)a->r * sizeof(float));
    for (int i = 0; i < a->n; i++) {
        if (a->n_drafts[i] != j || a->row_seq[i * a->g] < 0) continue;
        int row = i * a->g + j;
        int32_t prev = j ? a->tok[row - 1] : a->ids[i * a->g];
        td_load_row_f32(e, a->w1, a->w1_dtype, (int64_t)prev * a->r, a->r);
        const float *y = a->y + (size_t)row * a->D;
        double dot = 0.0;
        for (int t = 0; t < a->D; t++)
            dot += (double)a->conf_w[t] * y[t];
        for (int t = 0; t < a->r; t++)
            dot += (double)a->conf_w[a->D + t] * e[t];
        float conf = (float)(1.0 / (1.0 + exp(-dot)));
        a->conf[row] = conf;
        if (a->threshold > 0.0f && conf < a->threshold) continue;
        const float *u = a->U + (size_t)row * a->V;
        int best = 0, finite = 1;
        float bz = -INFINITY;
        for (int v = 0; v < a->V; v++) {
            td_load_row_f32(w, a->w2, a->w2_dtype, (int64_t)v * a->r, a->r);
            float zv = u[v] + (float)td_dot(e, w, a->r);
            finite &= isfinite(zv) != 0;
            if (zv > bz || v == 0) bz = zv, best = v;
        }
        if (!finite) continue;
        a->tok[row] = best;
        a->n_drafts[i] = j + 1;
    }
    free(e);
    free(w);
}

void markov_greedy_ref(const struct markov_args *a) {
    for (int i = 0; i < a->n; i++)
        a->n_drafts[i] = 0;
    for (int j = 0; j < a->g; j++)
        slot(a, j);
}
