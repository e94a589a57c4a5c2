/* attention_ref.c: full-softmax reference of sparse MQA with sinks (fp32, double sums). */
#include "attention.h"

#include <math.h>
#include <stdlib.h>

void attention_sink_ref(float *out, const float *q, const float *const *keys, int n_keys,
                        const float *sinks, int n_heads, int d, float scale) {
    float *s = malloc(((size_t)n_keys + 1) * sizeof(float));
    for (int h = 0; h < n_heads; h++) {
        const float *qh = q + (size_t)h * d;
        float *oh = out + (size_t)h * d;
        float mx = sinks[h];
        for (int j = 0; j < n_keys; j++) {
            double dot = 0.0;
            for (int c = 0; c < d; c++) dot += (double)qh[c] * keys[j][c];
            s[j] = (float)dot * scale;
            if (s[j] > mx) mx = s[j];
        }
        double den = exp((double)sinks[h] - mx);
        for (int j = 0; j < n_keys; j++) den += exp((double)s[j] - mx);
        for (int c = 0; c < d; c++) oh[c] = 0.0f;
        for (int j = 0; j < n_keys; j++) {
            float p = (float)(exp((double)s[j] - mx) / den);
            for (int c = 0; c < d; c++) oh[c] += p * keys[j][c];
        }
    }
    free(s);
}
