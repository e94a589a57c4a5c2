/* indexer_ref.c: Lightning Indexer scores (fp32 products, double head sum) and top-k. */
#include "indexer.h"

#include <stdlib.h>

void indexer_score_ref(float *score, const float *q, const float *weight, const float *keys,
                       int n_keys, int n_heads, int d, float scale) {
    for (int w = 0; w < n_keys; w++) {
        const float *k = keys + (size_t)w * d;
        double s = 0.0;
        for (int h = 0; h < n_heads; h++) {
            const float *qh = q + (size_t)h * d;
            double dot = 0.0;
            for (int c = 0; c < d; c++) dot += (double)qh[c] * k[c];
            float r = dot > 0 ? (float)dot : 0.0f;
            s += (double)(r * scale) * weight[h];
        }
        score[w] = (float)s;
    }
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

int topk_select_ref(int *idx, const float *score, int n_keys, int topk) {
    int k = n_keys < topk ? n_keys : topk;
    // selection by repeated max: strictly greater wins, so equal scores keep the lower index
    char *taken = calloc((size_t)n_keys + 1, 1);
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int w = 0; w < n_keys; w++)
            if (!taken[w] && (best < 0 || score[w] > score[best])) best = w;
        taken[best] = 1;
        idx[j] = best;
    }
    free(taken);
    qsort(idx, (size_t)k, sizeof(int), cmp_int);
    for (int j = k; j < topk; j++) idx[j] = -1;
    return k;
}
