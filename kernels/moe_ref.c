/* moe_ref.c: router scores/selection and the clamped SwiGLU expert, plain C. */
#include "moe.h"
#include "elementwise.h"
#include "matmul.h"
#include "err.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float score_one(float z, enum moe_score fn) {
    if (fn == MOE_SCORE_SIGMOID) return 1.0f / (1.0f + expf(-z));
    // sqrt(softplus(z)), torch softplus: z itself above threshold 20
    float sp = z > 20.0f ? z : log1pf(expf(z));
    return sqrtf(sp);
}

void moe_route_ref(int *picks, float *weights, const float *logits, enum moe_score score_fn,
                   const void *bias, enum td_dtype bias_dtype, const int64_t *hash_row, int k,
                   int n_experts, float scaling) {
    float sc[1024];
    if (score_fn == MOE_SCORE_SOFTMAX) {
        float mx = -INFINITY;
        for (int e = 0; e < n_experts; e++)
            mx = logits[e] > mx ? logits[e] : mx;
        double den = 0.0;
        for (int e = 0; e < n_experts; e++)
            den += exp((double)logits[e] - mx);
        for (int e = 0; e < n_experts; e++)
            sc[e] = (float)(exp((double)logits[e] - mx) / den);
    } else {
        for (int e = 0; e < n_experts; e++)
            sc[e] = score_one(logits[e], score_fn);
    }
    if (hash_row) {
        for (int j = 0; j < k; j++)
            picks[j] = (int)hash_row[j];
    } else {
        char taken[1024] = {0};
        for (int j = 0; j < k; j++) {
            int best = -1;
            float bv = 0.0f;
            for (int e = 0; e < n_experts; e++) {
                if (taken[e]) continue;
                float v = sc[e] + (bias ? td_load_f32(bias, bias_dtype, e) : 0.0f);
                if (best < 0 || v > bv) best = e, bv = v;
            }
            taken[best] = 1;
            picks[j] = best;
        }
    }
    float sum = 0.0f;
    for (int j = 0; j < k; j++)
        sum += sc[picks[j]];
    for (int j = 0; j < k; j++)
        weights[j] = sc[picks[j]] / (sum + 1e-20f) * scaling;
}

void swiglu_ref(float *y, const float *x, const struct swiglu_weights *w, int n, int d, int inter,
                float limit) {
    float *g = td_xmalloc((size_t)n * inter * sizeof(float));
    float *u = td_xmalloc((size_t)n * inter * sizeof(float));
    matmul_ref(g, x, w->w1, w->w1_dtype, n, d, inter, w->b1, w->b1_dtype);
    matmul_ref(u, x, w->w3, w->w3_dtype, n, d, inter, w->b3, w->b3_dtype);
    swiglu_act_ref(g, u, (size_t)n * inter, limit);
    matmul_ref(y, g, w->w2, w->w2_dtype, n, inter, d, w->b2, w->b2_dtype);
    free(g);
    free(u);
}

void moe_route_rows_ref(int32_t *picks, float *weights, const float *logits, const int32_t *ids,
                        enum moe_score score_fn, const void *bias, enum td_dtype bias_dtype,
                        const void *tid2eid, enum td_dtype tid_dtype, int n, int k, int n_experts,
                        float scaling, int shared) {
    int kk = k + shared;
    int64_t row[64];
    int p[64];
    for (int t = 0; t < n; t++) {
        if (tid2eid)
            for (int j = 0; j < k; j++) {
                int64_t i = (int64_t)ids[t] * k + j;
                if (tid_dtype == TD_DTYPE_I64) {
                    memcpy(&row[j], (const char *)tid2eid + 8 * i, 8);
                } else {
                    int32_t v;
                    memcpy(&v, (const char *)tid2eid + 4 * i, 4);
                    row[j] = v;
                }
            }
        moe_route_ref(p, weights + (size_t)t * kk, logits + (size_t)t * n_experts, score_fn,
                      tid2eid ? NULL : bias, bias_dtype, tid2eid ? row : NULL, k, n_experts,
                      scaling);
        for (int j = 0; j < k; j++)
            picks[(size_t)t * kk + j] = p[j];
        if (shared) picks[(size_t)t * kk + k] = n_experts, weights[(size_t)t * kk + k] = 1.0f;
    }
}

void moe_experts_ref(float *out, const float *x, const int32_t *picks, const float *weights,
                     const struct expert_set *ex, int n, int d, int inter, int k, int n_experts,
                     float limit) {
    float *slots = td_xmalloc((size_t)n * k * d * sizeof(float));
    moe_experts_slots_ref(slots, x, picks, ex, n, d, inter, k, n_experts, limit);
    moe_combine_slots_ref(out, slots, picks, weights, n, d, k);
    free(slots);
}

void moe_experts_slots_ref(float *slots, const float *x, const int32_t *picks,
                           const struct expert_set *ex, int n, int d, int inter, int k,
                           int n_experts, float limit) {
    int *rows = td_xmalloc((size_t)n * k * sizeof(int));
    float *xe = td_xmalloc((size_t)n * k * d * sizeof(float));
    float *ye = td_xmalloc((size_t)n * k * d * sizeof(float));
    memset(slots, 0, (size_t)n * k * d * sizeof(float));
    // gather each expert's rows, run it once, place its outputs in their picks' slots
    for (int e = 0; e < n_experts; e++) {
        if (ex->own && !ex->own[e]) continue;
        int m = 0;
        for (int t = 0; t < n; t++)
            for (int j = 0; j < k; j++)
                if (picks[(size_t)t * k + j] == e) {
                    rows[m] = t * k + j;
                    memcpy(xe + (size_t)m * d, x + (size_t)t * d, (size_t)d * sizeof(float));
                    m++;
                }
        if (!m) continue;
        struct swiglu_weights sw = {.w1 = ex->w1[e],
                                    .w3 = ex->w3[e],
                                    .w2 = ex->w2[e],
                                    .b1 = NULL,
                                    .b3 = NULL,
                                    .b2 = NULL,
                                    .w1_dtype = ex->dtype,
                                    .w3_dtype = ex->dtype,
                                    .w2_dtype = ex->dtype,
                                    .b1_dtype = 0,
                                    .b3_dtype = 0,
                                    .b2_dtype = 0};
        swiglu_ref(ye, xe, &sw, m, d, inter, limit);
        for (int r = 0; r < m; r++)
            memcpy(slots + (size_t)rows[r] * d, ye + (size_t)r * d, (size_t)d * sizeof(float));
    }
    free(rows);
    free(xe);
    free(ye);
}

void moe_combine_slots_ref(float *out, const float *slots, const int32_t *picks,
                           const float *weights, int n, int d, int k) {
    for (int t = 0; t < n; t++) {
        const int32_t *p = picks + (size_t)t * k;
        float *o = out + (size_t)t * d;
        for (int c = 0; c < d; c++)
            o[c] = 0.0f;
        // the picks in ascending expert order, ties in pick order (an insertion sort of k)
        int ord[64];
        for (int j = 0; j < k; j++) {
            int i = j;
            while (i > 0 && p[ord[i - 1]] > p[j]) {
                ord[i] = ord[i - 1];
                i--;
            }
            ord[i] = j;
        }
        for (int i = 0; i < k; i++) {
            const float *y = slots + ((size_t)t * k + ord[i]) * d;
            float w = weights[(size_t)t * k + ord[i]];
            for (int c = 0; c < d; c++)
                o[c] += y[c] * w;
        }
    }
}
