/* indexer_ref.c: Lightning Indexer scores (fp32 products, double head sum) and top-k. */
#include "indexer.h"

#include "err.h"

#include <stdlib.h>

void indexer_score_ref(float *score, const float *q, const float *weight, const float *keys,
                       int n_keys, int n_heads, int d, float scale) {
    for (int w = 0; w < n_keys; w++) {
        const float *k = keys + (size_t)w * d;
        double s = 0.0;
        for (int h = 0; h < n_heads; h++) {
            const float *qh = q + (size_t)h * d;
            double dot = 0.0;
            for (int c = 0; c < d; c++)
                dot += (double)qh[c] * k[c];
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
    char *taken = td_xcalloc((size_t)n_keys + 1, 1);
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int w = 0; w < n_keys; w++)
            if (!taken[w] && (best < 0 || score[w] > score[best])) best = w;
        taken[best] = 1;
        idx[j] = best;
    }
    free(taken);
    qsort(idx, (size_t)k, sizeof(int), cmp_int);
    for (int j = k; j < topk; j++)
        idx[j] = -1;
    return k;
}

void indexer_topk_ref(const struct indexer_args *a) {
    const struct rows_view *r = &a->rows;
    float *score = td_xmalloc(((size_t)a->n_entries + 1) * sizeof(float));
    struct kv_fmt f = kv_fmt_or_f32(a->fmt, a->d);
    float *keys = td_xmalloc(((size_t)a->n_entries + 1) * a->d * sizeof *keys);
    int *picks = td_xmalloc(((size_t)a->topk + 1) * sizeof(int));
    for (int t = 0; t < r->n_tok; t++) {
        if (r->row_seq[t] < 0) { // a pad row picks nothing
            for (int j = 0; j < a->topk; j++)
                r->topk[(size_t)t * r->topk_stride + j] = -1;
            continue;
        }
        int sq = r->row_seq[t], n_vis = r->vis[t];
        for (int w = 0; w < n_vis; w++) { // the cached keys' values, gathered from their blocks
            const unsigned char *rec =
                (const unsigned char *)a->keys + rows_entry(r, sq, w, a->per) * f.rec;
            for (int c = 0; c < a->d; c++)
                keys[(size_t)w * a->d + c] = kv_get(rec, f, c);
        }
        indexer_score_ref(score, a->q + (size_t)t * a->n_heads * a->d,
                          a->w + (size_t)t * a->n_heads, keys, n_vis, a->n_heads, a->d, a->scale);
        topk_select_ref(picks, score, n_vis, a->topk);
        for (int j = 0; j < a->topk; j++)
            r->topk[(size_t)t * r->topk_stride + j] = picks[j];
    }
    free(keys);
    free(score);
    free(picks);
}
