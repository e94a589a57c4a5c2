/* greedy_ref.c: one slot of a greedy draft chain on the host (see greedy.h); the argmax of
 * td_argmax (first maximum) after td_probs' finiteness check. */
#include "greedy.h"

#include <math.h>
#include <stddef.h>

void greedy_slot_ref(int32_t *tok, int32_t *n_drafts, int32_t *next, const float *x, int n, int V,
                     int g, int j) {
    for (int i = 0; i < n; i++) {
        const float *r = x + (size_t)i * V;
        int best = 0, finite = 1;
        for (int v = 0; v < V; v++) {
            if (!isfinite(r[v])) finite = 0;
            if (r[v] > r[best]) best = v;
        }
        next[i] = finite ? best : 0;
        if (finite && n_drafts[i] == j) {
            tok[(size_t)i * g + j] = best;
            n_drafts[i] = j + 1;
        }
    }
}
