/* rmsnorm_ref.c: RMSNorm with an fp32 result of a double statistic. */
#include "rmsnorm.h"

#include <math.h>

void rmsnorm_ref(float *y, const float *x, const void *w, enum td_dtype w_dtype, int n, int d,
                 float eps) {
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * d;
        float *yt = y + (size_t)t * d;
        double ss = 0.0;
        for (int i = 0; i < d; i++)
            ss += (double)xt[i] * xt[i];
        float r = (float)(1.0 / sqrt(ss / d + (double)eps));
        for (int i = 0; i < d; i++) {
            float v = xt[i] * r;
            yt[i] = w ? v * td_load_f32(w, w_dtype, i) : v;
        }
    }
}
