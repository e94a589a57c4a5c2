/* kv_ref.c: a cached row's record, and a step's rows into a cache (kv.h). */
#include "kv.h"

#include <string.h>

void kv_put_ref(void *row, float *x, struct kv_fmt f) {
    unsigned char *p = row;
    if (f.dtype == TD_KV_F32) {
        memcpy(row, x, (size_t)f.d * sizeof(float));
        return;
    }
    int n8 = f.dtype == TD_KV_FP8 ? f.n8 : 0;
    uint16_t *tail = (uint16_t *)(f.dtype == TD_KV_FP8 ? p + f.tail_at : p);
    for (int c0 = 0; c0 < n8; c0 += KV_FP8_BLOCK) {
        int c1 = c0 + KV_FP8_BLOCK < n8 ? c0 + KV_FP8_BLOCK : n8;
        float amax = 0.0f;
        for (int c = c0; c < c1; c++)
            amax = fabsf(x[c]) > amax ? fabsf(x[c]) : amax;
        uint8_t sb = kv_fp8_scale_of(amax);
        float s = kv_fp8_scale_val(sb);
        p[n8 + c0 / KV_FP8_BLOCK] = sb;
        for (int c = c0; c < c1; c++) {
            p[c] = kv_e4m3_of(x[c] / s);
            x[c] = kv_e4m3_val(p[c]) * s;
        }
    }
    for (int c = n8; c < f.d; c++) {
        tail[c - n8] = kv_bf16_of(x[c]);
        x[c] = kv_bf16_val(tail[c - n8]);
    }
}

void kv_store_ref(const struct kv_store_args *a) {
    const struct rows_view *r = &a->rows;
    unsigned char scratch[8192], *sink = scratch; // a row nobody stores: rounded all the same
    for (int t = 0; t < r->n_tok; t++) {
        float *x = a->x + (size_t)t * a->fmt.d;
        int live = a->at && r->row_seq[t] >= 0 && a->at[t] >= 0;
        unsigned char *dst =
            live ? (unsigned char *)a->cache + kv_store_row(a, t, r->row_seq[t]) * a->fmt.rec
                 : sink;
        kv_put_ref(dst, x, a->fmt);
        if (a->step) memcpy((unsigned char *)a->step + (size_t)t * a->fmt.rec, dst, a->fmt.rec);
    }
}
