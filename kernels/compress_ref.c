/* compress_ref.c: softmax-gated pooling of a compressor window (fp32 softmax). */
#include "compress.h"

#include "rmsnorm.h"
#include "rope.h"

#include <math.h>
#include <string.h>

void compress_pool_ref(float *out, const float *const *kv, const float *const *gate, int n_slots,
                       int d) {
    for (int c = 0; c < d; c++) {
        float mx = -INFINITY;
        for (int s = 0; s < n_slots; s++)
            if (gate[s][c] > mx) mx = gate[s][c];
        double den = 0.0, num = 0.0;
        for (int s = 0; s < n_slots; s++)
            den += exp((double)gate[s][c] - mx);
        for (int s = 0; s < n_slots; s++) {
            float a = (float)(exp((double)gate[s][c] - mx) / den);
            num += (double)a * kv[s][c];
        }
        out[c] = (float)num;
    }
}

void compress_emit_ref(const struct compress_args *a) {
    const struct rows_view *r = &a->rows;
    const float *kv_rows[1024], *gate_rows[1024];
    float cs[256], sn[256];
    for (int t = 0; t < r->n_tok; t++) {
        int w = r->emit[t];
        if (w < 0) continue;
        int sq = r->row_seq[t], slot = r->slot[sq], len = r->len_before[sq];
        int row0 = r->qo_indptr[sq], n_slots = 0;
        // CSA: first the previous window's Ca half (absent for w = 0), then the own Cb half
        for (int half = a->overlap ? 0 : 1; half < 2; half++) {
            int first = (w - (half == 0)) * a->rate, off = (a->overlap && half) ? a->d : 0;
            if (first < 0) continue;
            for (int s = 0; s < a->rate; s++) {
                int in_ring;
                size_t o =
                    (size_t)rows_where(first + s, len, row0, slot, a->ring, &in_ring) * a->width +
                    off;
                kv_rows[n_slots] = (in_ring ? a->ring_kv : a->raw) + o;
                gate_rows[n_slots++] = (in_ring ? a->ring_gate : a->gate) + o;
            }
        }
        float *e =
            a->entries + (a->by_row ? (long long)t : rows_entry(&a->rows, sq, w, a->per)) * a->d;
        compress_pool_ref(e, kv_rows, gate_rows, n_slots, a->d);
        rmsnorm_ref(e, e, a->norm, a->norm_dtype, 1, a->d, a->eps);
        rope_cos_sin_ref(cs, sn, a->inv_freq, a->rot_dim / 2, (long)w * a->rate, a->attn_factor);
        rope_apply_ref(e, 1, a->d, a->d, a->rot_dim, cs, sn, 0);
    }
}

void add_pos_bias_ref(float *x, const void *bias, enum td_dtype bias_dtype,
                      const int32_t *positions, int rate, int n, int width) {
    for (int t = 0; t < n; t++) {
        int s = positions[t] % rate;
        for (int j = 0; j < width; j++)
            x[(size_t)t * width + j] += td_load_f32(bias, bias_dtype, (int64_t)s * width + j);
    }
}

void ring_store_ref(float *ring, const float *rows, const int32_t *write, const struct rows_view *r,
                    int ring_rows, int width) {
    for (int t = 0; t < r->n_tok; t++) {
        if (write[t] < 0) continue;
        int slot = r->slot[r->row_seq[t]];
        float *dst = ring + ((size_t)slot * ring_rows + write[t]) * width;
        for (int j = 0; j < width; j++)
            dst[j] = rows[(size_t)t * width + j];
    }
}

void ring_load_ref(float *rows, const float *ring, const struct rows_view *r, int ring_rows,
                   int width) {
    for (int t = 0; t < r->n_tok; t++) {
        float *dst = rows + (size_t)t * width;
        if (r->row_seq[t] < 0) {
            memset(dst, 0, (size_t)width * sizeof(float));
            continue;
        }
        int slot = r->slot[r->row_seq[t]];
        memcpy(dst, ring + ((size_t)slot * ring_rows + r->positions[t] % ring_rows) * width,
               (size_t)width * sizeof(float));
    }
}

void ring_store_parts_ref(const struct ring_parts *p, const int32_t *write,
                          const struct rows_view *r, int ring_rows) {
    for (int i = 0; i < p->m; i++)
        ring_store_ref(p->ring[i], p->rows[i], write, r, ring_rows, p->width[i]);
}
