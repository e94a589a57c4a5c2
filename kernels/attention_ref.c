/* attention_ref.c: full-softmax reference of sparse MQA with sinks (fp32, double sums). */
#include "attention.h"
#include "rope.h"
#include "err.h"

#include <math.h>
#include <stdlib.h>

void attention_sink_ref(float *out, const float *q, const float *const *keys, int n_keys,
                        const float *sinks, int n_heads, int d, float scale) {
    float *s = td_xmalloc(((size_t)n_keys + 1) * sizeof(float));
    for (int h = 0; h < n_heads; h++) {
        const float *qh = q + (size_t)h * d;
        float *oh = out + (size_t)h * d;
        float mx = sinks[h];
        for (int j = 0; j < n_keys; j++) {
            double dot = 0.0;
            for (int c = 0; c < d; c++)
                dot += (double)qh[c] * keys[j][c];
            s[j] = (float)dot * scale;
            if (s[j] > mx) mx = s[j];
        }
        double den = exp((double)sinks[h] - mx);
        for (int j = 0; j < n_keys; j++)
            den += exp((double)s[j] - mx);
        for (int c = 0; c < d; c++)
            oh[c] = 0.0f;
        for (int j = 0; j < n_keys; j++) {
            float p = (float)(exp((double)s[j] - mx) / den);
            for (int c = 0; c < d; c++)
                oh[c] += p * keys[j][c];
        }
    }
    free(s);
}

void attention_rows_ref(const struct attn_args *a) {
    const struct rows_view *r = &a->rows;
    int max_keys = 0;
    for (int t = 0; t < r->n_tok; t++) {
        int n = r->swa_indptr[t + 1] - r->swa_indptr[t] + (a->entries ? r->vis[t] : 0);
        if (n > max_keys) max_keys = n;
    }
    const float **keys = td_xmalloc(((size_t)max_keys + 1) * sizeof *keys);
    for (int t = 0; t < r->n_tok; t++) {
        if (r->row_seq[t] < 0) continue; // a pad row: inert
        int sq = r->row_seq[t], slot = r->slot[sq], len = r->len_before[sq];
        int row0 = r->qo_indptr[sq], nk = 0;
        for (int k = r->swa_indptr[t]; k < r->swa_indptr[t + 1]; k++) {
            int q = r->swa_pos[k];
            keys[nk++] = rows_key_row(a->kv, a->swa_ring, q, len, row0, slot, a->swa_rows, a->d);
        }
        if (a->entries) {
            const float *ent = a->entries + (size_t)slot * a->n_entries * a->d;
            if (a->use_topk) {
                const int32_t *pk = r->topk + (size_t)t * r->topk_stride;
                for (int j = 0; j < r->topk_stride && pk[j] >= 0; j++)
                    keys[nk++] = ent + (size_t)pk[j] * a->d;
            } else {
                for (int w = 0; w < r->vis[t]; w++)
                    keys[nk++] = ent + (size_t)w * a->d;
            }
        }
        attention_sink_ref(a->out + (size_t)t * a->n_heads * a->d,
                           a->q + (size_t)t * a->n_heads * a->d, keys, nk, a->sinks, a->n_heads,
                           a->d, a->scale);
        if (a->inv_freq)
            rope_rows_ref(a->out + (size_t)t * a->n_heads * a->d, 1, a->n_heads, a->d, a->rot_dim,
                          r->positions + t, a->inv_freq, a->attn_factor, 1);
    }
    free(keys);
}
