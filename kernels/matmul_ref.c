/* matmul_ref.c: plain-C reference GEMM over stored weights (fp32 math, double sums: dot.h). */
#include "matmul.h"

#include "dot.h"
#include "err.h"

#include <stdlib.h>

void matmul_ref(float *y, const float *x, const void *w, enum td_dtype w_dtype, int n, int in,
                int out, const void *bias, enum td_dtype bias_dtype) {
    float *row = td_xmalloc((size_t)in * sizeof(float));
    for (int o = 0; o < out; o++) {
        // convert one weight row once, then use it for every token
        td_load_row_f32(row, w, w_dtype, (int64_t)o * in, in);
        double b = bias ? td_load_f32(bias, bias_dtype, o) : 0.0;
        for (int t = 0; t < n; t++) {
            y[(size_t)t * out + o] = (float)(td_dot(x + (size_t)t * in, row, in) + b);
        }
    }
    free(row);
}

void matmul_grouped_ref(float *y, const float *x, const void *w, enum td_dtype w_dtype, int n,
                        int groups, int in, int out) {
    float *row = td_xmalloc((size_t)in * sizeof(float));
    for (int j = 0; j < groups; j++)
        for (int o = 0; o < out; o++) {
            td_load_row_f32(row, w, w_dtype, ((int64_t)j * out + o) * in, in);
            for (int t = 0; t < n; t++) {
                const float *xt = x + (size_t)t * groups * in + (size_t)j * in;
                y[(size_t)t * groups * out + (size_t)j * out + o] = (float)td_dot(xt, row, in);
            }
        }
    free(row);
}

void matmul_set_ref(const float *x, int n, int in, int m, const struct matmul_out *o) {
    for (int i = 0; i < m; i++) {
        matmul_ref(o[i].y, x, o[i].w, o[i].dtype, n, in, o[i].out, o[i].bias, o[i].bias_dtype);
        for (int t = 0; o[i].pos_bias && t < n; t++) {
            int64_t r = (int64_t)(o[i].positions[t] % o[i].rate) * o[i].out;
            for (int j = 0; j < o[i].out; j++)
                o[i].y[(size_t)t * o[i].out + j] +=
                    td_load_f32(o[i].pos_bias, o[i].pos_bias_dtype, r + j);
        }
    }
}
