/* forward.c: the DeepSeek-V4 layer loop over a step plan, calling the kernels' references.
 *
 * Follows ../shared/design/dsv4.md section 3 op by op. Activations are token-major [n_tok, ...].
 * Keys and compressor rows of the rows being fed are read from this call's activations; older
 * positions come from the sequence's rings, which are written only after the layer's attention
 * (so a chunk of any length is fine, and rolled-back rows are never read).
 */
#include "forward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/compress.h"
#include "kernels/hc.h"
#include "kernels/indexer.h"
#include "kernels/matmul.h"
#include "kernels/moe.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"

#define W(t) (t).data, (t).dtype

// ---------------------------------------------------------------------------------------------
// scratch for one call

struct fwd {
    const struct td_model *m;
    const struct td_config *c;
    struct td_state *st;
    const struct td_plan *p;
    int n;                          /* rows */
    float *X;                       /* [n, nc, dim] residual streams */
    float *x, *xn, *a;              /* [n, dim] */
    float *post, *comb;             /* [n, nc], [n, nc, nc] */
    float *qr;                      /* [n, q_lora_rank] */
    float *q, *o;                   /* [n, n_heads * head_dim] */
    float *kv;                      /* [n, head_dim] */
    float *og, *gin, *gout;         /* [n, g * ro], [n, H * hd / g], [n, ro] */
    float *raw, *gate;              /* [n, 2 * head_dim] compressor rows */
    float *iraw, *igate;            /* [n, 2 * index_head_dim] */
    float *qi, *wi;                 /* [n, IH * ihd], [n, IH] */
    float *score;                   /* [max entries] */
    int *picks;                     /* [index_topk] */
    const float **keys;             /* [sliding_window + max entries] */
    float *cos_main, *sin_main;     /* [n, rope_dim / 2] */
    float *cos_comp, *sin_comp;     /* [n, rope_dim / 2] */
    float *entry;                   /* [head_dim] */
    int32_t *topk_trace;
};

static const float *ring_row(const float *base, int slot, int ring, int width, int pos) {
    return base + ((size_t)slot * ring + (size_t)(pos % ring)) * width;
}

static struct rope_params rope_of(const struct td_rope_cfg *r, int rot_dim) {
    struct rope_params p = {r->theta, rot_dim, r->yarn, r->factor, r->orig_max_pos,
                            r->beta_fast, r->beta_slow, r->truncate, (float)r->attention_factor};
    return p;
}

/* cos/sin tables per row for the main and compress ropes */
static void build_rope_tables(struct fwd *f) {
    const struct td_config *c = f->c;
    int half = c->rope_dim / 2;
    float inv_main[256], inv_comp[256];
    struct rope_params pm = rope_of(&c->rope_main, c->rope_dim);
    struct rope_params pc = rope_of(&c->rope_compress, c->rope_dim);
    rope_inv_freq_ref(inv_main, &pm);
    rope_inv_freq_ref(inv_comp, &pc);
    for (int t = 0; t < f->n; t++) {
        long pos = f->p->positions[t];
        rope_cos_sin_ref(f->cos_main + (size_t)t * half, f->sin_main + (size_t)t * half, inv_main,
                         half, pos, pm.attention_factor);
        rope_cos_sin_ref(f->cos_comp + (size_t)t * half, f->sin_comp + (size_t)t * half, inv_comp,
                         half, pos, pc.attention_factor);
    }
}

/* rotate one vector (n_vec consecutive heads of width d) with the tables of row t */
static void rope_row(struct fwd *f, float *x, int n_vec, int d, int t, int compress, int inverse) {
    int half = f->c->rope_dim / 2;
    const float *cs = (compress ? f->cos_comp : f->cos_main) + (size_t)t * half;
    const float *sn = (compress ? f->sin_comp : f->sin_main) + (size_t)t * half;
    rope_apply_ref(x, n_vec, d, d, f->c->rope_dim, cs, sn, inverse);
}

// ---------------------------------------------------------------------------------------------
// compressor: emit the entries whose window closes in this call

struct comp_io {
    const struct td_compressor_w *w;
    int rate, overlap, d;           /* overlap: CSA (Ca of window w-1 + Cb of window w) */
    const int32_t *emit, *write;    /* the plan's emit_* and write_* rows for this rate */
    float *raw, *gate;              /* [n, (1 + overlap) * d] this call's rows */
    float *ring_kv, *ring_gate;     /* the layer's rings */
    int ring;
    float *entries;                 /* [max_seqs, n_entries, d] */
    int n_entries;
};

static void compressor_run(struct fwd *f, const struct comp_io *io, const float *xn) {
    const struct td_config *c = f->c;
    int width = (1 + io->overlap) * io->d, n = f->n;
    matmul_ref(io->raw, xn, W(io->w->wkv), n, c->dim, width, NULL, 0);
    matmul_ref(io->gate, xn, W(io->w->wgate), n, c->dim, width, NULL, 0);
    for (int t = 0; t < n; t++) {
        int s = f->p->positions[t] % io->rate;
        float *g = io->gate + (size_t)t * width;
        for (int j = 0; j < width; j++) g[j] += td_tensor_getf(&io->w->ape, (int64_t)s * width + j);
    }
    const float *kv_rows[512], *gate_rows[512];
    for (int t = 0; t < n; t++) {
        int w = io->emit[t];
        if (w < 0) continue;
        int sq = f->p->row_seq[t], slot = f->p->slot[sq], len = f->p->len_before[sq];
        int row0 = f->p->qo_indptr[sq], n_slots = 0;
        // slots: CSA first the previous window's Ca half (none for w = 0), then own Cb half
        for (int half = io->overlap ? 0 : 1; half < 2; half++) {
            int first = (w - (half == 0)) * io->rate, off = (io->overlap && half) ? io->d : 0;
            if (first < 0) continue;
            for (int s = 0; s < io->rate; s++) {
                int q = first + s;
                const float *kr, *gr;
                if (q >= len) {
                    kr = io->raw + (size_t)(row0 + q - len) * width;
                    gr = io->gate + (size_t)(row0 + q - len) * width;
                } else {
                    kr = ring_row(io->ring_kv, slot, io->ring, width, q);
                    gr = ring_row(io->ring_gate, slot, io->ring, width, q);
                }
                kv_rows[n_slots] = kr + off;
                gate_rows[n_slots++] = gr + off;
            }
        }
        float *e = io->entries + ((size_t)slot * io->n_entries + w) * io->d;
        compress_pool_ref(e, kv_rows, gate_rows, n_slots, io->d);
        rmsnorm_ref(e, e, W(io->w->norm), 1, io->d, c->rms_eps);
        // the entry sits at its window's first position, on the compress rope
        struct rope_params pc = rope_of(&c->rope_compress, c->rope_dim);
        float inv[256], cs[256], sn[256];
        rope_inv_freq_ref(inv, &pc);
        rope_cos_sin_ref(cs, sn, inv, c->rope_dim / 2, (long)w * io->rate, pc.attention_factor);
        rope_apply_ref(e, 1, io->d, io->d, c->rope_dim, cs, sn, 0);
    }
}

/* keep this call's raw rows in the ring (only the last `ring` positions of a long chunk) */
static void compressor_store(struct fwd *f, const struct comp_io *io) {
    int width = (1 + io->overlap) * io->d;
    for (int t = 0; t < f->n; t++) {
        int r = io->write[t], slot = f->p->slot[f->p->row_seq[t]];
        if (r < 0) continue;
        memcpy(io->ring_kv + ((size_t)slot * io->ring + r) * width, io->raw + (size_t)t * width,
               (size_t)width * sizeof(float));
        memcpy(io->ring_gate + ((size_t)slot * io->ring + r) * width,
               io->gate + (size_t)t * width, (size_t)width * sizeof(float));
    }
}

// ---------------------------------------------------------------------------------------------
// attention block

static void attention_block(struct fwd *f, int li) {
    const struct td_config *c = f->c;
    const struct td_layer *l = &f->m->layers[li];
    struct td_layer_state *ls = &f->st->layers[li];
    int n = f->n, D = c->dim, H = c->n_heads, hd = c->head_dim, rq = c->q_lora_rank;
    int kind = c->attn[li], comp = kind != TD_ATTN_SLIDING;
    float *xn = f->xn;

    // q path: low-rank q, per-head unweighted norm, rope on the trailing dims
    matmul_ref(f->qr, xn, W(l->wq_a), n, D, rq, NULL, 0);
    rmsnorm_ref(f->qr, f->qr, W(l->q_norm), n, rq, c->rms_eps);
    matmul_ref(f->q, f->qr, W(l->wq_b), n, rq, H * hd, NULL, 0);
    rmsnorm_ref(f->q, f->q, NULL, 0, n * H, hd, c->rms_eps);
    // shared K = V vector
    matmul_ref(f->kv, xn, W(l->wkv), n, D, hd, NULL, 0);
    rmsnorm_ref(f->kv, f->kv, W(l->kv_norm), n, hd, c->rms_eps);
    for (int t = 0; t < n; t++) {
        rope_row(f, f->q + (size_t)t * H * hd, H, hd, t, comp, 0);
        rope_row(f, f->kv + (size_t)t * hd, 1, hd, t, comp, 0);
    }

    struct comp_io main_io = {0}, idx_io = {0};
    if (comp) {
        int csa = kind == TD_ATTN_CSA;
        main_io = (struct comp_io){&l->comp, csa ? c->rate_csa : c->rate_hca, csa, hd,
                                   csa ? f->p->emit_csa : f->p->emit_hca,
                                   csa ? f->p->write_csa : f->p->write_hca, f->raw, f->gate,
                                   ls->raw_kv, ls->raw_gate, ls->ring, ls->entries,
                                   ls->n_entries};
        compressor_run(f, &main_io, xn);
    }
    int IH = c->index_n_heads, ihd = c->index_head_dim;
    if (kind == TD_ATTN_CSA) {
        idx_io = (struct comp_io){&l->icomp, c->rate_csa, 1, ihd, f->p->emit_csa,
                                  f->p->write_csa, f->iraw, f->igate, ls->iraw_kv,
                                  ls->iraw_gate, ls->ring, ls->ientries, ls->n_entries};
        compressor_run(f, &idx_io, xn);
        matmul_ref(f->qi, f->qr, W(l->idx_wq_b), n, rq, IH * ihd, NULL, 0);
        matmul_ref(f->wi, xn, W(l->idx_weights), n, D, IH, NULL, 0);
        float wscale = 1.0f / sqrtf((float)IH);
        for (int t = 0; t < n; t++) {
            rope_row(f, f->qi + (size_t)t * IH * ihd, IH, ihd, t, 1, 0);
            for (int h = 0; h < IH; h++) f->wi[(size_t)t * IH + h] *= wscale;
        }
    }

    float sinks[1024];
    for (int h = 0; h < H; h++) sinks[h] = td_tensor_getf(&l->sinks, h);
    float scale = 1.0f / sqrtf((float)hd);
    for (int t = 0; t < n; t++) {
        int sq = f->p->row_seq[t], slot = f->p->slot[sq], len = f->p->len_before[sq];
        int row0 = f->p->qo_indptr[sq], nk = 0;
        // sliding window keys: this call's rows from the activations, older ones from the ring
        for (int k = f->p->swa_indptr[t]; k < f->p->swa_indptr[t + 1]; k++) {
            int q = f->p->swa_pos[k];
            f->keys[nk++] = q >= len ? f->kv + (size_t)(row0 + q - len) * hd
                                     : ring_row(ls->swa, slot, f->st->swa_ring, hd, q);
        }
        if (comp) {
            int n_vis = kind == TD_ATTN_CSA ? f->p->vis_csa[t] : f->p->vis_hca[t];
            const float *ent = ls->entries + (size_t)slot * ls->n_entries * hd;
            if (kind == TD_ATTN_HCA) {
                for (int w = 0; w < n_vis; w++) f->keys[nk++] = ent + (size_t)w * hd;
            } else {
                const float *ik = ls->ientries + (size_t)slot * ls->n_entries * ihd;
                indexer_score_ref(f->score, f->qi + (size_t)t * IH * ihd, f->wi + (size_t)t * IH,
                                  ik, n_vis, IH, ihd, 1.0f / sqrtf((float)ihd));
                int32_t *picks = f->p->topk + (size_t)t * f->p->dims.topk;
                int k = topk_select_ref(f->picks, f->score, n_vis, c->index_topk);
                for (int j = 0; j < c->index_topk; j++) picks[j] = f->picks[j];
                for (int j = 0; j < k; j++) f->keys[nk++] = ent + (size_t)picks[j] * hd;
                if (f->topk_trace)
                    memcpy(f->topk_trace + ((size_t)li * n + t) * c->index_topk, picks,
                           (size_t)c->index_topk * sizeof(int32_t));
            }
        }
        float *ot = f->o + (size_t)t * H * hd;
        attention_sink_ref(ot, f->q + (size_t)t * H * hd, f->keys, nk, sinks, H, hd, scale);
        // V carried rope at the key position: undo it at the query position
        rope_row(f, ot, H, hd, t, comp, 1);
    }

    // grouped output projection: group j (heads [j H/g, (j+1) H/g)) -> ro values, then wo_b
    int g = c->o_groups, ro = c->o_lora_rank, gin = H * hd / g;
    size_t esz = td_dtype_size(l->wo_a.dtype);
    for (int j = 0; j < g; j++) {
        for (int t = 0; t < n; t++)
            memcpy(f->gin + (size_t)t * gin, f->o + (size_t)t * H * hd + (size_t)j * gin,
                   (size_t)gin * sizeof(float));
        const void *wj = (const char *)l->wo_a.data + (size_t)j * ro * gin * esz;
        matmul_ref(f->gout, f->gin, wj, l->wo_a.dtype, n, gin, ro, NULL, 0);
        for (int t = 0; t < n; t++)
            memcpy(f->og + (size_t)t * g * ro + (size_t)j * ro, f->gout + (size_t)t * ro,
                   (size_t)ro * sizeof(float));
    }
    matmul_ref(f->a, f->og, W(l->wo_b), n, g * ro, D, NULL, 0);

    // the rings learn this call's rows only now, after every read of older positions
    for (int t = 0; t < n; t++) {
        int r = f->p->swa_write[t], slot = f->p->slot[f->p->row_seq[t]];
        if (r >= 0)
            memcpy(ls->swa + ((size_t)slot * f->st->swa_ring + r) * hd, f->kv + (size_t)t * hd,
                   (size_t)hd * sizeof(float));
    }
    if (comp) compressor_store(f, &main_io);
    if (kind == TD_ATTN_CSA) compressor_store(f, &idx_io);
}

// ---------------------------------------------------------------------------------------------
// MoE block

static void moe_block(struct fwd *f, int li) {
    const struct td_config *c = f->c;
    const struct td_layer *l = &f->m->layers[li];
    int n = f->n, D = c->dim, E = c->n_experts, k = c->n_experts_tok, I = c->moe_inter;
    float *logits = malloc((size_t)n * E * sizeof(float));
    int *picks = malloc((size_t)n * k * sizeof(int));
    float *wts = malloc((size_t)n * k * sizeof(float));
    int *rows = malloc((size_t)n * k * sizeof(int));
    float *xe = malloc((size_t)n * k * D * sizeof(float));
    float *ye = malloc((size_t)n * k * D * sizeof(float));
    int64_t hash_row[64];

    matmul_ref(logits, f->xn, W(l->gate), n, D, E, NULL, 0);
    for (int t = 0; t < n; t++) {
        int hash = c->mlp[li] == TD_MLP_HASH;
        if (hash)
            for (int j = 0; j < k; j++)
                hash_row[j] = td_tensor_geti(&l->tid2eid, (int64_t)f->p->input_ids[t] * k + j);
        moe_route_ref(picks + (size_t)t * k, wts + (size_t)t * k, logits + (size_t)t * E,
                      (enum moe_score)c->score_fn, hash ? NULL : l->gate_bias.data,
                      l->gate_bias.dtype, hash ? hash_row : NULL, k, E, c->routed_scaling);
    }
    // routed experts in ascending expert order: each row accumulates its experts in that order
    memset(f->a, 0, (size_t)n * D * sizeof(float));
    for (int e = 0; e < E; e++) {
        int m = 0;
        for (int t = 0; t < n; t++)
            for (int j = 0; j < k; j++)
                if (picks[t * k + j] == e) {
                    rows[m] = t * k + j;
                    memcpy(xe + (size_t)m * D, f->xn + (size_t)t * D, (size_t)D * sizeof(float));
                    m++;
                }
        if (!m) continue;
        struct swiglu_weights sw = {l->w1[e].data, l->w3[e].data, l->w2[e].data, NULL, NULL, NULL,
                                    l->w1[e].dtype, l->w3[e].dtype, l->w2[e].dtype, 0, 0, 0};
        swiglu_ref(ye, xe, &sw, m, D, I, c->swiglu_limit);
        for (int r = 0; r < m; r++) {
            int t = rows[r] / k;
            float w = wts[rows[r]];
            for (int d = 0; d < D; d++) f->a[(size_t)t * D + d] += ye[(size_t)r * D + d] * w;
        }
    }
    struct swiglu_weights sh = {l->sh_w1.data, l->sh_w3.data,
                                l->sh_w2.data, l->sh_b1.data, l->sh_b3.data, l->sh_b2.data,
                                l->sh_w1.dtype, l->sh_w3.dtype, l->sh_w2.dtype, l->sh_b1.dtype,
                                l->sh_b3.dtype, l->sh_b2.dtype};
    swiglu_ref(ye, f->xn, &sh, n, D, I, c->swiglu_limit);
    for (size_t i = 0; i < (size_t)n * D; i++) f->a[i] += ye[i];
    free(logits);
    free(picks);
    free(wts);
    free(rows);
    free(xe);
    free(ye);
}

// ---------------------------------------------------------------------------------------------

static int check_plan(const struct td_model *m, const struct td_state *st,
                      const struct td_plan *p, char *err, size_t errlen) {
#ifndef NDEBUG
    if (meta_plan_validate(p, err, errlen)) return -1; // every step, in debug builds and tests
#endif
    struct td_plan_dims want = td_state_plan_dims(st, p->dims.max_tok, p->dims.max_seq);
    if (memcmp(&want, &p->dims, sizeof want)) {
        snprintf(err, errlen, "forward: the plan was laid out for other state dimensions");
        return -1;
    }
    for (int s = 0; s < p->n_seq; s++) {
        int slot = p->slot[s], rows = p->qo_indptr[s + 1] - p->qo_indptr[s];
        if (slot < 0 || slot >= st->max_seqs || !st->in_use[slot]) {
            snprintf(err, errlen, "forward: sequence %d names slot %d, not a live sequence", s,
                     slot);
            return -1;
        }
        if (p->len_before[s] != st->len[slot]) {
            snprintf(err, errlen, "forward: sequence %d says length %d, its state has %d", s,
                     p->len_before[s], st->len[slot]);
            return -1;
        }
        if ((long)p->len_before[s] + rows > st->max_ctx) {
            snprintf(err, errlen, "forward: sequence %d would reach %ld tokens, max context %d", s,
                     (long)p->len_before[s] + rows, st->max_ctx);
            return -1;
        }
    }
    for (int t = 0; t < p->n_tok; t++)
        if (p->input_ids[t] < 0 || p->input_ids[t] >= m->cfg.vocab) {
            snprintf(err, errlen, "forward: token id %d at row %d is outside [0, %d)",
                     p->input_ids[t], t, m->cfg.vocab);
            return -1;
        }
    return 0;
}

int td_forward(const struct td_model *m, struct td_state *st, const struct td_plan *p,
               float *logits, int32_t *topk_trace, char *err, size_t errlen) {
    if (check_plan(m, st, p, err, errlen)) return -1;
    const struct td_config *c = &m->cfg;
    int n = p->n_tok, D = c->dim, nc = c->hc_mult, H = c->n_heads, hd = c->head_dim;
    int half = c->rope_dim / 2, max_ent = st->max_ctx / (c->rate_csa < 1 ? 1 : c->rate_csa);
    if (c->rate_hca > 0 && st->max_ctx / c->rate_hca > max_ent) max_ent = st->max_ctx / c->rate_hca;
    int wmax = 2 * (hd > c->index_head_dim ? hd : c->index_head_dim);
    struct fwd f = {.m = m, .c = c, .st = st, .p = p, .n = n, .topk_trace = topk_trace};
    size_t N = (size_t)n;
    f.X = malloc(N * nc * D * sizeof(float));
    f.x = malloc(N * D * sizeof(float));
    f.xn = malloc(N * D * sizeof(float));
    f.a = malloc(N * D * sizeof(float));
    f.post = malloc(N * nc * sizeof(float));
    f.comb = malloc(N * nc * nc * sizeof(float));
    f.qr = malloc(N * c->q_lora_rank * sizeof(float));
    f.q = malloc(N * H * hd * sizeof(float));
    f.o = malloc(N * H * hd * sizeof(float));
    f.kv = malloc(N * hd * sizeof(float));
    f.og = malloc(N * c->o_groups * c->o_lora_rank * sizeof(float));
    f.gin = malloc(N * H * hd / c->o_groups * sizeof(float));
    f.gout = malloc(N * c->o_lora_rank * sizeof(float));
    f.raw = malloc(N * wmax * sizeof(float));
    f.gate = malloc(N * wmax * sizeof(float));
    f.iraw = malloc(N * wmax * sizeof(float));
    f.igate = malloc(N * wmax * sizeof(float));
    f.qi = malloc(N * c->index_n_heads * c->index_head_dim * sizeof(float));
    f.wi = malloc(N * c->index_n_heads * sizeof(float));
    f.score = malloc(((size_t)max_ent + 1) * sizeof(float));
    f.picks = malloc(((size_t)c->index_topk + 1) * sizeof(int));
    f.keys = malloc(((size_t)c->sliding_window + max_ent + 1) * sizeof(*f.keys));
    f.cos_main = malloc(N * half * sizeof(float));
    f.sin_main = malloc(N * half * sizeof(float));
    f.cos_comp = malloc(N * half * sizeof(float));
    f.sin_comp = malloc(N * half * sizeof(float));

    build_rope_tables(&f);
    // embedding, copied into nc identical streams
    for (int t = 0; t < n; t++)
        for (int i = 0; i < nc; i++)
            td_load_row_f32(f.X + ((size_t)t * nc + i) * D, W(m->embed),
                            (int64_t)p->input_ids[t] * D, D);
    for (int li = 0; li < c->n_layers; li++) {
        const struct td_layer *l = &m->layers[li];
        struct hc_weights ha = {l->hc_attn.fn.data, l->hc_attn.base.data, l->hc_attn.scale.data,
                                l->hc_attn.fn.dtype, l->hc_attn.base.dtype,
                                l->hc_attn.scale.dtype};
        struct hc_weights hf = {l->hc_ffn.fn.data, l->hc_ffn.base.data, l->hc_ffn.scale.data,
                                l->hc_ffn.fn.dtype, l->hc_ffn.base.dtype, l->hc_ffn.scale.dtype};
        hc_pre_ref(f.x, f.post, f.comb, f.X, &ha, n, nc, D, c->hc_sinkhorn_iters, c->hc_eps,
                   c->rms_eps);
        rmsnorm_ref(f.xn, f.x, W(l->attn_norm), n, D, c->rms_eps);
        attention_block(&f, li);
        hc_post_ref(f.X, f.a, f.post, f.comb, n, nc, D);
        hc_pre_ref(f.x, f.post, f.comb, f.X, &hf, n, nc, D, c->hc_sinkhorn_iters, c->hc_eps,
                   c->rms_eps);
        rmsnorm_ref(f.xn, f.x, W(l->ffn_norm), n, D, c->rms_eps);
        moe_block(&f, li);
        hc_post_ref(f.X, f.a, f.post, f.comb, n, nc, D);
    }
    hc_head_ref(f.x, f.X, W(m->hc_head.fn), W(m->hc_head.base), W(m->hc_head.scale), n, nc, D,
                c->hc_eps, c->rms_eps);
    rmsnorm_ref(f.xn, f.x, W(m->norm), n, D, c->rms_eps);
    matmul_ref(logits, f.xn, W(m->head), n, D, c->vocab, NULL, 0);

    for (int s = 0; s < p->n_seq; s++) {
        int slot = p->slot[s];
        st->len[slot] = p->len_before[s] + p->qo_indptr[s + 1] - p->qo_indptr[s];
        if (st->len[slot] > st->hi[slot]) st->hi[slot] = st->len[slot];
    }
    void *bufs[] = {f.X, f.x, f.xn, f.a, f.post, f.comb, f.qr, f.q, f.o, f.kv, f.og, f.gin,
                    f.gout, f.raw, f.gate, f.iraw, f.igate, f.qi, f.wi, f.score, f.picks,
                    (void *)f.keys, f.cos_main, f.sin_main, f.cos_comp, f.sin_comp};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
    return 0;
}

int td_forward_seqs(const struct td_model *m, struct td_state *st, const struct td_plan_seq *seqs,
                    int n_seq, float *logits, int32_t *topk_trace, char *err, size_t errlen) {
    int n_tok = 0;
    for (int s = 0; s < n_seq; s++) n_tok += seqs[s].n_new > 0 ? seqs[s].n_new : 0;
    struct td_plan_dims d = td_state_plan_dims(st, meta_bucket(n_tok, 1 << 30),
                                               meta_bucket(n_seq, 1 << 30));
    struct td_plan p;
    if (meta_plan_init(&p, &d, err, errlen)) return -1;
    int rc = meta_plan_build(&p, seqs, n_seq, err, errlen);
    if (!rc) rc = td_forward(m, st, &p, logits, topk_trace, err, errlen);
    meta_plan_free(&p);
    return rc;
}
