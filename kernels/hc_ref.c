/* hc_ref.c: mHC reference (pre with Sinkhorn, post, head). */
#include "hc.h"

#include "elementwise.h"
#include "err.h"
#include "rmsnorm.h"

#include <math.h>
#include <stdlib.h>

static float sigmoidf_(float z) {
    return 1.0f / (1.0f + expf(-z));
}

/* divide each of the nc lines of the nc x nc matrix m by its sum + eps: line a's elements are
 * m[a * line + b * step], b = 0 .. nc-1 (rows: line nc, step 1; columns: line 1, step nc),
 * summed in order */
static void sinkhorn_normalise(float *m, int nc, int line, int step, float eps) {
    for (int a = 0; a < nc; a++) {
        float sum = 0.0f, *l = m + (size_t)a * line;
        for (int b = 0; b < nc; b++)
            sum += l[(size_t)b * step];
        for (int b = 0; b < nc; b++)
            l[(size_t)b * step] /= sum + eps;
    }
}

/* mix[m] = fn[m, :] . (x / rms(x)) over the flattened nc * d streams of one token */
static void hc_mix(float *mix, const float *x, const void *fn, enum td_dtype fn_dtype, int m,
                   int width, float rms_eps) {
    double ss = 0.0;
    for (int i = 0; i < width; i++)
        ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / width + (double)rms_eps));
    for (int o = 0; o < m; o++) {
        double acc = 0.0;
        for (int i = 0; i < width; i++)
            acc += (double)(x[i] * r) * td_load_f32(fn, fn_dtype, (int64_t)o * width + i);
        mix[o] = (float)acc;
    }
}

void hc_pre_ref(float *collapsed, float *post, float *comb, const float *x,
                const struct hc_weights *w, int n, int nc, int d, int sinkhorn_iters, float hc_eps,
                float rms_eps, const void *norm, enum td_dtype norm_dtype) {
    int m = (2 + nc) * nc, width = nc * d;
    float *mix = td_xmalloc((size_t)m * sizeof(float));
    float s_pre = td_load_f32(w->scale, w->scale_dtype, 0);
    float s_post = td_load_f32(w->scale, w->scale_dtype, 1);
    float s_comb = td_load_f32(w->scale, w->scale_dtype, 2);
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * width;
        float *pt = post + (size_t)t * nc, *ct = comb + (size_t)t * nc * nc;
        hc_mix(mix, xt, w->fn, w->fn_dtype, m, width, rms_eps);
        float pre[16];
        for (int i = 0; i < nc; i++) {
            pre[i] = sigmoidf_(mix[i] * s_pre + td_load_f32(w->base, w->base_dtype, i)) + hc_eps;
            pt[i] = 2.0f *
                    sigmoidf_(mix[nc + i] * s_post + td_load_f32(w->base, w->base_dtype, nc + i));
        }
        // comb: row softmax + eps, then column normalise, then (iters - 1) x (row, column)
        for (int i = 0; i < nc; i++) {
            float *row = ct + i * nc, mx = -INFINITY;
            for (int j = 0; j < nc; j++) {
                row[j] = mix[2 * nc + i * nc + j] * s_comb +
                         td_load_f32(w->base, w->base_dtype, 2 * nc + i * nc + j);
                if (row[j] > mx) mx = row[j];
            }
            float sum = 0.0f;
            for (int j = 0; j < nc; j++)
                sum += (row[j] = expf(row[j] - mx));
            for (int j = 0; j < nc; j++)
                row[j] = row[j] / sum + hc_eps;
        }
        for (int it = 0; it < sinkhorn_iters; it++) {
            if (it > 0) sinkhorn_normalise(ct, nc, nc, 1, hc_eps); // rows
            sinkhorn_normalise(ct, nc, 1, nc, hc_eps);             // columns
        }
        float *yt = collapsed + (size_t)t * d;
        for (int c = 0; c < d; c++) {
            float acc = 0.0f;
            for (int i = 0; i < nc; i++)
                acc += pre[i] * xt[(size_t)i * d + c];
            yt[c] = acc;
        }
    }
    free(mix);
    if (norm) rmsnorm_ref(collapsed, collapsed, norm, norm_dtype, n, d, rms_eps);
}

void hc_post_ref(float *x, const float *a, const float *post, const float *comb, int n, int nc,
                 int d, float *mean, int mean_stride) {
    float *old = td_xmalloc((size_t)nc * d * sizeof(float));
    for (int t = 0; t < n; t++) {
        float *xt = x + (size_t)t * nc * d;
        const float *at = a + (size_t)t * d, *pt = post + (size_t)t * nc;
        const float *ct = comb + (size_t)t * nc * nc;
        for (int k = 0; k < nc * d; k++)
            old[k] = xt[k];
        for (int j = 0; j < nc; j++) {
            for (int c = 0; c < d; c++) {
                float acc = 0.0f;
                for (int i = 0; i < nc; i++)
                    acc += ct[i * nc + j] * old[(size_t)i * d + c];
                xt[(size_t)j * d + c] = pt[j] * at[c] + acc;
            }
        }
    }
    free(old);
    if (mean) mean_streams_ref(mean, x, n, nc, d, mean_stride);
}

void hc_head_ref(float *y, const float *x, const void *fn, enum td_dtype fn_dtype, const void *base,
                 enum td_dtype base_dtype, const void *scale, enum td_dtype scale_dtype, int n,
                 int nc, int d, float hc_eps, float rms_eps) {
    float mix[16], s = td_load_f32(scale, scale_dtype, 0);
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * nc * d;
        hc_mix(mix, xt, fn, fn_dtype, nc, nc * d, rms_eps);
        float pre[16];
        for (int i = 0; i < nc; i++)
            pre[i] = sigmoidf_(mix[i] * s + td_load_f32(base, base_dtype, i)) + hc_eps;
        for (int c = 0; c < d; c++) {
            float acc = 0.0f;
            for (int i = 0; i < nc; i++)
                acc += pre[i] * xt[(size_t)i * d + c];
            y[(size_t)t * d + c] = acc;
        }
    }
}
