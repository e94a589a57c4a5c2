/* moe_ref.c: router scores/selection and the clamped SwiGLU expert, plain C. */
#include "moe.h"
#include "matmul.h"

#include <math.h>
#include <stdlib.h>

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
        for (int e = 0; e < n_experts; e++) mx = logits[e] > mx ? logits[e] : mx;
        double den = 0.0;
        for (int e = 0; e < n_experts; e++) den += exp((double)logits[e] - mx);
        for (int e = 0; e < n_experts; e++) sc[e] = (float)(exp((double)logits[e] - mx) / den);
    } else {
        for (int e = 0; e < n_experts; e++) sc[e] = score_one(logits[e], score_fn);
    }
    if (hash_row) {
        for (int j = 0; j < k; j++) picks[j] = (int)hash_row[j];
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
    for (int j = 0; j < k; j++) sum += sc[picks[j]];
    for (int j = 0; j < k; j++) weights[j] = sc[picks[j]] / (sum + 1e-20f) * scaling;
}

void swiglu_ref(float *y, const float *x, const struct swiglu_weights *w, int n, int d, int inter,
                float limit) {
    float *g = malloc((size_t)n * inter * sizeof(float));
    float *u = malloc((size_t)n * inter * sizeof(float));
    matmul_ref(g, x, w->w1, w->w1_dtype, n, d, inter, w->b1, w->b1_dtype);
    matmul_ref(u, x, w->w3, w->w3_dtype, n, d, inter, w->b3, w->b3_dtype);
    for (size_t i = 0; i < (size_t)n * inter; i++) {
        float gi = g[i] > limit ? limit : g[i]; // gate: upper bound only
        float ui = u[i] > limit ? limit : (u[i] < -limit ? -limit : u[i]);
        g[i] = gi / (1.0f + expf(-gi)) * ui;
    }
    matmul_ref(y, g, w->w2, w->w2_dtype, n, inter, d, w->b2, w->b2_dtype);
    free(g);
    free(u);
}
