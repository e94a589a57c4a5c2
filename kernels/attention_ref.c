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

/* key j of a row read from a cache record: where it is (fp32) or its values decoded into dec */
static const float *cached_key(const unsigned char *rec, const struct kv_fmt *f, float *dec) {
    if (f->dtype == TD_KV_F32) return (const float *)rec;
    for (int c = 0; c < f->d; c++)
        dec[c] = kv_get(rec, *f, c);
    return dec;
}

void attention_rows_ref(const struct attn_args *a) {
    const struct rows_view *r = &a->rows;
    int max_keys = 0;
    for (int t = 0; t < r->n_tok; t++) {
        int n = r->swa_indptr[t + 1] - r->swa_indptr[t] + (a->entries ? r->vis[t] : 0);
        if (n > max_keys) max_keys = n;
    }
    const float **keys = td_xmalloc(((size_t)max_keys + 1) * sizeof *keys);
    struct kv_fmt fmt = kv_fmt_or_f32(a->fmt, a->d);
    float *dec =
        fmt.dtype == TD_KV_F32 ? NULL : td_xmalloc(((size_t)max_keys + 1) * a->d * sizeof *dec);
    size_t rec = (size_t)fmt.rec;
    for (int t = 0; t < r->n_tok; t++) {
        if (r->row_seq[t] < 0) continue; // a pad row: inert
        int sq = r->row_seq[t], slot = r->slot[sq], len = r->len_before[sq];
        int row0 = r->qo_indptr[sq], nk = 0, in_ring;
        for (int k = r->swa_indptr[t]; k < r->swa_indptr[t + 1]; k++, nk++) {
            long long row = rows_where(r->swa_pos[k], len, row0, slot, a->swa_rows, &in_ring);
            const void *rows = in_ring ? a->swa_ring : a->kv;
            keys[nk] = cached_key((const unsigned char *)rows + row * rec, &fmt,
                                  dec ? dec + (size_t)nk * a->d : NULL);
        }
        if (a->entries) {
            const unsigned char *ent = (const unsigned char *)a->entries;
            const int32_t *pk = r->topk + (size_t)t * r->topk_stride;
            int n_ent = 0;
            if (a->use_topk)
                while (n_ent < r->topk_stride && pk[n_ent] >= 0)
                    n_ent++;
            else
                n_ent = r->vis[t];
            for (int j = 0; j < n_ent; j++, nk++)
                keys[nk] =
                    cached_key(ent + rows_entry(r, sq, a->use_topk ? pk[j] : j, a->per) * rec, &fmt,
                               dec ? dec + (size_t)nk * a->d : NULL);
        }
        attention_sink_ref(a->out + (size_t)t * a->n_heads * a->d,
                           a->q + (size_t)t * a->n_heads * a->d, keys, nk, a->sinks, a->n_heads,
                           a->d, a->scale);
        if (a->inv_freq)
            rope_rows_ref(a->out + (size_t)t * a->n_heads * a->d, 1, a->n_heads, a->d, a->rot_dim,
                          r->positions + t, a->inv_freq, a->attn_factor, 1);
    }
    free(dec);
    free(keys);
}
