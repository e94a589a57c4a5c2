/* greedy_ref.c: the argmaxes of greedy.h on the host: the argmax of td_argmax (first maximum)
 * after td_probs' finiteness check. */
#include "greedy.h"

#include <math.h>
#include <stddef.h>

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
