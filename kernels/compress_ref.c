/* compress_ref.c: softmax-gated pooling of a compressor window (fp32 softmax). */
#include "compress.h"

#include <math.h>

void compress_pool_ref(float *out, const float *const *kv, const float *const *gate, int n_slots,
                       int d) {
    for (int c = 0; c < d; c++) {
        float mx = -INFINITY;
        for (int s = 0; s < n_slots; s++)
            if (gate[s][c] > mx) mx = gate[s][c];
        double den = 0.0, num = 0.0;
        for (int s = 0; s < n_slots; s++) den += exp((double)gate[s][c] - mx);
        for (int s = 0; s < n_slots; s++) {
            float a = (float)(exp((double)gate[s][c] - mx) / den);
            num += (double)a * kv[s][c];
        }
        out[c] = (float)num;
    }
}
