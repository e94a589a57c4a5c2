/* rope_ref.c: RoPE tables (default and YaRN, as transformers 5.17 builds them) and rotation. */
#include "rope.h"

#include <math.h>
#include <stddef.h>

void rope_inv_freq_ref(float *inv_freq, const struct rope_params *p) {
    int dim = p->rot_dim, half = dim / 2;
    float base = (float)p->theta;
    // yarn correction range: dims whose wavelength rotates beta times over the original context
    double low = 0, high = 0;
    if (p->yarn) {
        double lb = log(p->theta);
        low = dim * log(p->orig_max_pos / (p->beta_fast * 2 * M_PI)) / (2 * lb);
        high = dim * log(p->orig_max_pos / (p->beta_slow * 2 * M_PI)) / (2 * lb);
        if (p->truncate) {
            low = floor(low);
            high = ceil(high);
        }
        if (low < 0) low = 0;
        if (high > dim - 1) high = dim - 1;
        if (low == high) high += 0.001;
    }
    for (int i = 0; i < half; i++) {
        // torch: base ** (arange(0, dim, 2).float() / dim), all in fp32
        float expo = (float)(2 * i) / (float)dim;
        float pos_freq = powf(base, expo);
        float extrap = 1.0f / pos_freq;
        if (!p->yarn) {
            inv_freq[i] = extrap;
            continue;
        }
        float interp = 1.0f / ((float)p->factor * pos_freq);
        float ramp = (float)(((float)i - (float)low) / (float)(high - low));
        if (ramp < 0) ramp = 0;
        if (ramp > 1) ramp = 1;
        float ef = 1.0f - ramp; // extrapolation factor
        inv_freq[i] = interp * (1.0f - ef) + extrap * ef;
    }
}

void rope_cos_sin_ref(float *cos_out, float *sin_out, const float *inv_freq, int half, long pos,
                      float attention_factor) {
    for (int i = 0; i < half; i++) {
        float ang = (float)pos * inv_freq[i];
        cos_out[i] = (float)cos((double)ang) * attention_factor;
        sin_out[i] = (float)sin((double)ang) * attention_factor;
    }
}

void rope_apply_ref(float *x, int n, int stride, int d, int rot_dim, const float *cos_t,
                    const float *sin_t, int inverse) {
    for (int v = 0; v < n; v++) {
        float *r = x + (size_t)v * stride + (d - rot_dim);
        for (int i = 0; i < rot_dim / 2; i++) {
            float c = cos_t[i], s = inverse ? -sin_t[i] : sin_t[i];
            float a = r[2 * i], b = r[2 * i + 1];
            r[2 * i] = a * c - b * s;
            r[2 * i + 1] = b * c + a * s;
        }
    }
}

void rope_rows_ref(float *x, int n, int n_vec, int d, int rot_dim, const int32_t *positions,
                   const float *inv_freq, float attention_factor, int inverse) {
    float cs[256], sn[256];
    for (int t = 0; t < n; t++) {
        rope_cos_sin_ref(cs, sn, inv_freq, rot_dim / 2, positions[t], attention_factor);
        rope_apply_ref(x + (size_t)t * n_vec * d, n_vec, d, d, rot_dim, cs, sn, inverse);
    }
}
