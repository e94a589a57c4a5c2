/* elementwise_ref.c: embedding gather and pointwise ops, plain C. */
#include "elementwise.h"

#include <math.h>
#include <string.h>

void embed_ref(float *X, const int32_t *ids, const void *emb, enum td_dtype emb_dtype, int n,
               int nc, int d) {
    for (int t = 0; t < n; t++)
        for (int i = 0; i < nc; i++) {
            float *x = X + ((size_t)t * nc + i) * d;
            if (ids[t] < 0)
                memset(x, 0, (size_t)d * sizeof *x);
            else
                td_load_row_f32(x, emb, emb_dtype, (int64_t)ids[t] * d, d);
        }
}

void add_ref(float *y, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        y[i] += x[i];
}

void scale_ref(float *x, float s, size_t n) {
    for (size_t i = 0; i < n; i++)
        x[i] *= s;
}

void swiglu_act_ref(float *g, const float *u, size_t n, float limit) {
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] > limit ? limit : g[i]; // gate: upper bound only
        float ui = u[i] > limit ? limit : (u[i] < -limit ? -limit : u[i]);
        g[i] = gi / (1.0f + expf(-gi)) * ui;
    }
}

void add_bcast_ref(float *X, const float *e, int n, int nc, int d, const int32_t *positions) {
    for (int t = 0; t < n; t++)
        for (int i = 0; i < nc && !(positions && positions[t] == 0); i++)
            for (int c = 0; c < d; c++)
                X[((size_t)t * nc + i) * d + c] += e[(size_t)t * d + c];
}

void mean_streams_ref(float *y, const float *X, int n, int nc, int d, int y_stride) {
    for (int t = 0; t < n; t++)
        for (int c = 0; c < d; c++) {
            float s = 0.0f;
            for (int i = 0; i < nc; i++)
                s += X[((size_t)t * nc + i) * d + c];
            y[(size_t)t * y_stride + c] = s / (float)nc;
        }
}

void patch_ids_ref(int32_t *ids, const struct id_patches *p) {
    for (int i = 0; i < p->n; i++)
        memcpy(ids + p->row[i], p->src[i], (size_t)p->len[i] * sizeof(int32_t));
}
