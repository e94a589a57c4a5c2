/* forward.c: the DeepSeek-V4 layer loop over a step plan, written once against the backend's
 * op table (model/backend.h): the CPU backend runs kernels/<op>_ref.c, the CUDA backend the
 * kernels/<op>.cu launchers, over the same arguments.
 *
 * Follows ../shared/design/dsv4.md section 3 op by op. Activations are token-major [n_tok, ...]
 * in the backend's memory. Keys and compressor rows of this step's rows are read from this
 * step's activations; older positions come from the sequence's rings, which are written only
 * after the layer's attention (so a chunk of any length is fine, and rolled-back rows are never
 * read).
 */
#include "forward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "model/backend.h"
#include "model/split.h"
#include "kernels/err.h"
#include "kernels/rope.h"

#define W(t) (t).data, (t).dtype

/* the model's split when it runs split: over several ranks, or over a device communicator
 * (which one rank runs too: --gpus 1) */
static const struct td_split *split_of(const struct td_model *m) {
    const struct td_split *sp = m->split;
    return sp && (sp->comm->world > 1 || sp->data) ? sp : NULL;
}

// ---------------------------------------------------------------------------------------------
// one call's buffers, all in backend memory

struct fwd {
    const struct td_backend *b;
    const struct td_ops *op;
    const struct td_model *m;
    const struct td_config *c;
    struct td_state *st;
    const struct td_plan *p;
    struct rows_view rows;      /* the plan's arrays, in backend memory */
    int n;                      /* rows */
    float *X;                   /* [n, nc, dim] residual streams */
    float *x, *xn, *a, *a2;     /* [n, dim] */
    float *post, *comb;         /* [n, nc], [n, nc, nc] */
    float *qr;                  /* [n, q_lora_rank] */
    float *q, *o;               /* [n, n_heads * head_dim] */
    float *kv;                  /* [n, head_dim] */
    float *ent;                 /* [n, max(head_dim, ihd)] entries on their way to a typed cache */
    void *kvrec;                /* [n] this step's keys as typed records (the attention's) */
    float *og;                  /* [n, o_groups * o_lora_rank] */
    float *raw, *gate;          /* [n, 2 * head_dim] compressor rows */
    float *iraw, *igate;        /* [n, 2 * index_head_dim] */
    float *qi, *wi;             /* [n, IH * ihd], [n, IH] */
    float *g, *u;               /* [n, moe_inter] shared expert */
    float *router;              /* [n, n_experts] */
    int32_t *picks;             /* [n, experts per token] */
    float *weights;             /* [n, experts per token] */
    float *slots;               /* [n, experts per token, dim] a split model's expert outputs */
    float *slots_host;          /* the same on the host: a device backend's all-reduce goes
                                   through it (a split model's ranks join by host sockets) */
    float *logits;              /* [n, vocab] */
    float *inv_main, *inv_comp; /* [rope_dim / 2] */
    void *plan_dev;    /* the plan's copy in backend memory: every step's on a device backend; on
                          the CPU a step's whose draft ids come from backend memory (id patches) */
    void *plan_base;   /* the plan buffer this step's kernels read: plan_dev, or the plan itself */
    const float *x_in; /* [n, nc, dim] input streams instead of the embedding, or NULL */
    int head_all_rows; /* 1: a graph's head, on head_rows rows; 0: on the compacted logit rows */
    int head_rows;     /* a graph's: n, or the logit rows gathered (td_state.logit_rows) */
    float *capture;    /* [n, n_capture, dim] stream means, or NULL */
    float *capture_ring; /* [slots, swa_ring, n_capture, dim] capture by position, or NULL */
    const float *x_ring; /* [slots, x_ring_rows, width] a keys pass's rows by position, or NULL */
    int x_ring_rows;
    float *xc; /* [n, main_proj's input or hc_mult * dim] rows loaded from x_ring (DSpark's
                  captured rows, MTP's streams), MTP's normed streams */
    const int *capture_layers; /* [n_capture] */
    int n_capture;
    float *hidden_out;      /* [n, nc, dim] final streams out, or NULL */
    int hidden_by_position; /* hidden_out by slot and window ring row (td_forward_io) */
    float *hc_out;          /* [n, dim] hc_head's rows out, or NULL (then in x) */
    enum td_keys keys_only; /* the pass stores keys (td_forward_store_kv), nothing else */
    const struct td_forward_tail *tail; /* queued after the head, or NULL */
};

static struct rope_params rope_of(const struct td_rope_cfg *r, int rot_dim) {
    struct rope_params p = {.theta = r->theta,
                            .rot_dim = rot_dim,
                            .yarn = r->yarn,
                            .factor = r->factor,
                            .orig_max_pos = r->orig_max_pos,
                            .beta_fast = r->beta_fast,
                            .beta_slow = r->beta_slow,
                            .truncate = r->truncate,
                            .attention_factor = (float)r->attention_factor};
    return p;
}

// ---------------------------------------------------------------------------------------------
// attention block

/* the entries the step completes, from the compressor's rows and gates (raw, gate: two
 * outputs of the layer's set of xn projections in attention_block, the gates with their
 * position bias added there) */
/* a step's rows x into a key cache of format fmt at rows at[t] (NULL: rounded to its precision
 * only); an fp32 cache's stores are made by the ops that make the rows */
static void kv_store(struct fwd *f, void *cache, struct kv_fmt fmt, int cache_rows, int per,
                     float *x, const int32_t *at, void *step) {
    struct kv_store_args a = {.cache = cache,
                              .fmt = fmt,
                              .cache_rows = cache_rows,
                              .per = per,
                              .x = x,
                              .at = at,
                              .step = step,
                              .rows = f->rows};
    f->op->kv_store(&a);
}

static void compressor(struct fwd *f, const struct td_compressor_w *w, int kind, int d, float *raw,
                       float *gate, float *ring_kv, float *ring_gate, void *entries,
                       struct kv_fmt fmt, const struct td_layer_state *ls) {
    const struct td_config *c = f->c;
    int csa = kind == TD_ATTN_CSA, rate = csa ? c->rate_csa : c->rate_hca;
    int width = (1 + csa) * d, typed = fmt.dtype != TD_KV_F32;
    struct compress_args io = {.rows = f->rows,
                               .raw = raw,
                               .gate = gate,
                               .ring_kv = ring_kv,
                               .ring_gate = ring_gate,
                               .ring = ls->ring,
                               .width = width,
                               .d = d,
                               .rate = rate,
                               .overlap = csa,
                               .entries = typed ? f->ent : entries,
                               .per = ls->per,
                               .by_row = typed,
                               .norm = w->norm.data,
                               .norm_dtype = w->norm.dtype,
                               .eps = c->rms_eps,
                               .inv_freq = f->inv_comp,
                               .rot_dim = c->rope_dim,
                               .attn_factor = (float)c->rope_compress.attention_factor};
    f->op->compress_emit(&io);
    if (typed) kv_store(f, entries, fmt, 0, ls->per, f->ent, f->rows.emit, NULL);
}

/* f->kv (wkv x, made by the caller) = rope(kv_norm(f->kv)) at the rows' positions: the layer's
 * shared K = V rows, and, when ring is not NULL, their store in that sliding-window ring (rows
 * with swa_write >= 0): a part of a norm_rope call */
static struct norm_rope_args keys_norm_rope(struct fwd *f, const struct td_layer *l, float *ring,
                                            const float *inv, float af) {
    const struct td_config *c = f->c;
    return (struct norm_rope_args){.x = f->kv,
                                   .n = f->n,
                                   .n_vec = 1,
                                   .d = c->head_dim,
                                   .w = l->kv_norm.data,
                                   .w_dtype = l->kv_norm.dtype,
                                   .eps = c->rms_eps,
                                   .rot_dim = c->rope_dim,
                                   .positions = f->rows.positions,
                                   .inv_freq = inv,
                                   .attn_factor = af,
                                   .ring = ring,
                                   .write = f->rows.swa_write,
                                   .rows = f->rows,
                                   .ring_rows = f->st->swa_ring};
}

/* an output of a set of GEMMs over one x (matmul_set): y = x . w^T */
static struct matmul_out set_out(float *y, const struct td_tensor *w, int out) {
    return (struct matmul_out){.y = y, .w = w->data, .dtype = w->dtype, .out = out};
}

/* the same with the compressor's position bias (row positions[t] % rate of ape) */
static struct matmul_out pos_biased(struct matmul_out o, const struct td_tensor *ape,
                                    const struct rows_view *rows, int rate) {
    o.pos_bias = ape->data, o.pos_bias_dtype = ape->dtype;
    o.positions = rows->positions, o.rate = rate;
    return o;
}

static void attention_block(struct fwd *f, int li) {
    const struct td_config *c = f->c;
    const struct td_layer *l = &f->m->layers[li];
    struct td_layer_state *ls = &f->st->layers[li];
    const struct td_ops *op = f->op;
    int n = f->n, D = c->dim, H = c->n_heads, hd = c->head_dim, rq = c->q_lora_rank;
    int kind = c->attn[li], comp = kind != TD_ATTN_SLIDING, csa = kind == TD_ATTN_CSA;
    const float *inv = comp ? f->inv_comp : f->inv_main;
    float af = (float)(comp ? c->rope_compress : c->rope_main).attention_factor;
    const struct td_plan *p = f->p;

    // this layer's rate decides which visible / emit / ring-write rows apply
    struct rows_view rows = meta_plan_rows(p, f->plan_base, csa ? META_RATE_CSA : META_RATE_HCA);
    rows.n_tok = f->n;
    f->rows = rows;

    // every projection of the normed input is one set (one launch for a skinny step): q's low
    // rank, the shared K = V row, the compressors' rows and gates (with their position bias),
    // the indexer's head weights
    int IH = c->index_n_heads, ihd = c->index_head_dim, cw = (1 + csa) * hd, iw = (1 + csa) * ihd;
    int rate = csa ? c->rate_csa : c->rate_hca;
    struct matmul_out xo[MATMUL_SET_MAX], qo[2];
    int m = 0;
    xo[m++] = set_out(f->qr, &l->wq_a, rq);
    xo[m++] = set_out(f->kv, &l->wkv, hd);
    if (comp) {
        xo[m++] = set_out(f->raw, &l->comp.wkv, cw);
        xo[m++] = pos_biased(set_out(f->gate, &l->comp.wgate, cw), &l->comp.ape, &rows, rate);
    }
    if (csa) {
        xo[m++] = set_out(f->iraw, &l->icomp.wkv, iw);
        xo[m++] = pos_biased(set_out(f->igate, &l->icomp.wgate, iw), &l->icomp.ape, &rows, rate);
        xo[m++] = set_out(f->wi, &l->idx_weights, IH);
    }
    op->matmul_set(f->xn, n, D, m, xo);
    // q path: low-rank q, per-head unweighted norm, rope on the trailing dims; the indexer's
    // queries read the same normed low rank (a second set)
    op->rmsnorm(f->qr, f->qr, W(l->q_norm), n, rq, c->rms_eps);
    qo[0] = set_out(f->q, &l->wq_b, H * hd);
    qo[1] = set_out(f->qi, &l->idx_wq_b, IH * ihd);
    op->matmul_set(f->qr, n, rq, 1 + csa, qo);
    // the queries' per-head norm and rope, and the shared K = V vector's, in one call. K = V
    // goes into the ring at once when the step has at most swa_ring - window rows
    // (every decode, verify and graph step): then a row of this step lands on a position older
    // than any query of the step can see. A longer chunk would overwrite window keys its own
    // first rows still read, so it stores after the attention.
    int early = n <= f->st->swa_ring - f->st->window, typed = f->st->kv_dtype != TD_KV_F32;
    struct norm_rope_args nr[2] = {{.x = f->q,
                                    .n = n,
                                    .n_vec = H,
                                    .d = hd,
                                    .w = NULL,
                                    .w_dtype = TD_DTYPE_F32,
                                    .eps = c->rms_eps,
                                    .rot_dim = c->rope_dim,
                                    .positions = rows.positions,
                                    .inv_freq = inv,
                                    .attn_factor = af,
                                    .ring = NULL,
                                    .write = NULL,
                                    .rows = rows,
                                    .ring_rows = 0},
                                   keys_norm_rope(f, l, early && !typed ? ls->swa : NULL, inv, af)};
    op->norm_rope(nr, 2);
    // a typed cache: the keys rounded to its precision (the attention reads this step's keys
    // from f->kv, so they are the cache's values too), and stored now when early
    if (typed)
        kv_store(f, ls->swa, f->st->kfmt, f->st->swa_ring, 0, f->kv, early ? rows.swa_write : NULL,
                 f->kvrec);

    if (comp)
        compressor(f, &l->comp, kind, hd, f->raw, f->gate, ls->raw_kv, ls->raw_gate, ls->entries,
                   f->st->kfmt, ls);
    if (csa) {
        compressor(f, &l->icomp, kind, ihd, f->iraw, f->igate, ls->iraw_kv, ls->iraw_gate,
                   ls->ientries, f->st->ifmt, ls);
        op->rope_rows(f->qi, n, IH, ihd, c->rope_dim, rows.positions, f->inv_comp,
                      (float)c->rope_compress.attention_factor, 0);
        op->scale(f->wi, 1.0f / sqrtf((float)IH), (size_t)n * IH);
        struct indexer_args ia = {.rows = rows,
                                  .q = f->qi,
                                  .w = f->wi,
                                  .keys = ls->ientries,
                                  .fmt = f->st->ifmt,
                                  .n_entries = ls->n_entries,
                                  .per = ls->per,
                                  .n_heads = IH,
                                  .d = ihd,
                                  .topk = p->dims.topk,
                                  .scale = 1.0f / sqrtf((float)ihd)};
        op->indexer_topk(&ia);
    }

    struct attn_args aa = {.rows = rows,
                           .out = f->o,
                           .q = f->q,
                           .kv = typed ? f->kvrec : (const void *)f->kv,
                           .swa_ring = ls->swa,
                           .swa_rows = f->st->swa_ring,
                           .swa_keys = f->p->dims.window + f->p->dims.block,
                           .entries = comp ? ls->entries : NULL,
                           .n_entries = ls->n_entries,
                           .per = ls->per,
                           .fmt = f->st->kfmt,
                           .use_topk = csa,
                           .sinks = l->sinks.data,
                           .n_heads = H,
                           .d = hd,
                           .scale = 1.0f / sqrtf((float)hd),
                           .inv_freq = inv,
                           .rot_dim = c->rope_dim,
                           .attn_factor = af};
    op->attention_rows(&aa); // (which rotates V's rope back at the query position)

    // grouped output projection, then wo_b
    int g = c->o_groups, ro = c->o_lora_rank;
    op->matmul_grouped(f->og, f->o, W(l->wo_a), n, g, H * hd / g, ro);
    op->matmul(f->a, f->og, W(l->wo_b), n, g * ro, D, NULL, 0);

    // the rings learn this step's rows only now, after every read of older positions
    if (!early && typed) // (rounding rounded values again leaves them as they are)
        kv_store(f, ls->swa, f->st->kfmt, f->st->swa_ring, 0, f->kv, rows.swa_write, NULL);
    if (!early && !typed) {
        struct ring_parts sw = {.m = 1, .ring = {ls->swa}, .rows = {f->kv}, .width = {hd}};
        op->ring_store(&sw, rows.swa_write, &rows, f->st->swa_ring);
    }
    if (comp) { // the compressors' rows and gates (and the indexer's): one store
        struct ring_parts cp = {.m = 2,
                                .ring = {ls->raw_kv, ls->raw_gate},
                                .rows = {f->raw, f->gate},
                                .width = {cw, cw}};
        if (csa) {
            cp.ring[2] = ls->iraw_kv, cp.ring[3] = ls->iraw_gate;
            cp.rows[2] = f->iraw, cp.rows[3] = f->igate;
            cp.width[2] = cp.width[3] = iw;
            cp.m = 4;
        }
        op->ring_store(&cp, rows.write, &rows, ls->ring);
    }
}

// ---------------------------------------------------------------------------------------------
// MoE block

/* the split's collective over buf (backend b's memory): sum (f32 elements) or, 0, rank 0's bytes
 * to every rank. On the devices in b's queue (a graph keeps it), or through host (bytes of the
 * host's memory) when a device's ranks sum through the host (the step runs eagerly: graphs_on),
 * or on buf itself on the CPU. A failure fails the world, which the call's end reports. */
static void split_collective(const struct td_backend *b, const struct td_split *sp, void *host,
                             int sum, void *buf, size_t bytes) {
    struct td_comm *c = sp->data ? sp->data : sp->comm;
    void *at = !sp->data && b->on_device ? host : buf;
    if (at != buf) {
        char e2[8];
        b->to_host(at, buf, bytes);
        b->finish(e2, sizeof e2);
    }
    if (sum)
        c->ops->all_reduce_sum_f32(c, at, bytes / sizeof(float));
    else
        c->ops->broadcast(c, at, bytes, 0);
    if (at != buf) b->to_device(buf, at, bytes);
}

/* whether layer l's shared expert runs as one more pick in a step of n rows (moe_fold_shared) */
static int shared_as_pick(const struct td_backend *b, const struct td_layer *l, int n, int k) {
    return l->ex_shared && (!b->moe_fold_shared || b->moe_fold_shared(n * (k + 1)));
}

/* this rank's experts of layer li (of a model with config c) over n rows x and their picks (the
 * shared expert one more where sh), into slots, summed over the split's ranks: every rank's part
 * of a split MoE layer, the leader's and a server's */
static void own_experts_summed(const struct td_backend *b, const struct td_split *sp, void *host,
                               const struct td_config *c, const struct td_layer *l, int li, int n,
                               int sh, const float *x, const int32_t *picks, float *slots) {
    int k = c->n_experts_tok + sh;
    struct expert_set ex = {.w1 = l->ex_w1,
                            .w3 = l->ex_w3,
                            .w2 = l->ex_w2,
                            .dtype = l->ex_dtype,
                            .own = sp->own_run + (size_t)li * sp->per_layer};
    b->ops.moe_experts_slots(slots, x, picks, &ex, n, c->dim, c->moe_inter, k, c->n_experts + sh,
                             c->swiglu_limit);
    split_collective(b, sp, host, 1, slots, (size_t)n * k * c->dim * sizeof(float));
}

static void moe_block(struct fwd *f, int li) {
    const struct td_config *c = f->c;
    const struct td_layer *l = &f->m->layers[li];
    const struct td_ops *op = f->op;
    int n = f->n, D = c->dim, E = c->n_experts, k = c->n_experts_tok, I = c->moe_inter;
    int hash = c->mlp[li] == TD_MLP_HASH;
    int sh = shared_as_pick(f->b, l, n, k);
    op->matmul(f->router, f->xn, W(l->gate), n, D, E, NULL, 0);
    op->moe_route_rows(f->picks, f->weights, f->router, f->rows.input_ids,
                       (enum moe_score)c->score_fn, hash ? NULL : l->gate_bias.data,
                       l->gate_bias.dtype, hash ? l->tid2eid.data : NULL, l->tid2eid.dtype, n, k, E,
                       c->routed_scaling, sh);
    struct expert_set ex = {.w1 = l->ex_w1, .w3 = l->ex_w3, .w2 = l->ex_w2, .dtype = l->ex_dtype};
    const struct td_split *sp = split_of(f->m);
    if (sp) { // this rank's experts into their slots, summed over ranks
        // (a failed world fails every later op at once; the call's end reports it)
        if (sp->serves) { // the rows and picks to the ranks that serve the experts (td_serve)
            size_t xb = (size_t)n * D * sizeof(float), pb = (size_t)n * (k + sh) * sizeof(int32_t);
            op->copy(f->slots, f->xn, xb); // (the slots' room: the experts write there after)
            op->copy((char *)f->slots + xb, f->picks, pb);
            split_collective(f->b, sp, f->slots_host, 0, f->slots, xb + pb);
        }
        own_experts_summed(f->b, sp, f->slots_host, c, l, li, n, sh, f->xn, f->picks, f->slots);
        op->moe_combine_slots(f->a, f->slots, f->picks, f->weights, n, D, k + sh);
    } else {
        op->moe_experts(f->a, f->xn, f->picks, f->weights, &ex, n, D, I, k + sh, E + sh,
                        c->swiglu_limit);
    }
    // the shared expert ran there as one more pick of weight 1, added last (expert E), as the
    // add below would add it; it has its own GEMMs with biases, another dtype, or in steps the
    // backend runs faster so (moe_fold_shared: a tandem-tiny verify step of 16 sequences took
    // the routed experts' fp32 tiles for it, and DSpark at batch 16 went from 1.16x to 0.99x)
    if (sh) return;
    // the shared expert: down(silu(clamp(gate x)) * clamp(up x)), same clamps
    op->matmul(f->g, f->xn, W(l->sh_w1), n, D, I, l->sh_b1.data, l->sh_b1.dtype);
    op->matmul(f->u, f->xn, W(l->sh_w3), n, D, I, l->sh_b3.data, l->sh_b3.dtype);
    op->swiglu_act(f->g, f->u, (size_t)n * I, c->swiglu_limit);
    op->matmul(f->a2, f->g, W(l->sh_w2), n, I, D, l->sh_b2.data, l->sh_b2.dtype);
    op->add(f->a, f->a2, (size_t)n * D);
}

// ---------------------------------------------------------------------------------------------

static int check_plan(const struct td_model *m, const struct td_state *st, const struct td_plan *p,
                      char *err, size_t errlen) {
    // every step, in every build (5 us a tandem-tiny batch-64 step, 226 us a 4096-row prefill
    // chunk on a 2-core EPYC)
    if (meta_plan_validate(p, err, errlen)) return -1;
    struct td_plan_dims want = td_state_plan_dims(st, p->dims.max_tok, p->dims.max_seq);
    if (!meta_plan_dims_equal(&want, &p->dims))
        return td_errf(err, errlen, "forward: the plan was laid out for other state dimensions");
    for (int s = 0; s < p->n_seq; s++) {
        int slot = p->slot[s], rows = p->qo_indptr[s + 1] - p->qo_indptr[s];
        if (slot < 0 || slot >= st->max_seqs || !st->in_use[slot])
            return td_errf(err, errlen, "forward: sequence %d names slot %d, not a live sequence",
                           s, slot);
        if (p->len_before[s] != st->len[slot])
            return td_errf(err, errlen, "forward: sequence %d says length %d, its state has %d", s,
                           p->len_before[s], st->len[slot]);
        if ((long)p->len_before[s] + rows > st->max_ctx)
            return td_errf(err, errlen,
                           "forward: sequence %d would reach %ld tokens, max context %d", s,
                           (long)p->len_before[s] + rows, st->max_ctx);
    }
    for (int t = 0; t < p->n_tok; t++)
        if (p->input_ids[t] < 0 || p->input_ids[t] >= m->cfg.vocab)
            return td_errf(err, errlen, "forward: token id %d at row %d is outside [0, %d)",
                           p->input_ids[t], t, m->cfg.vocab);
    return 0;
}

// ---------------------------------------------------------------------------------------------
// step buffers: made once per plan layout, so every step (and every captured graph) reads and
// writes the same addresses

#define MAX_GRAPHS 64 /* (MTP: three passes a bucket) */

/* what a captured graph is for: its row bucket, its pass and the io buffers it was captured
 * with (zero-filled, compared whole) */
struct graph_key {
    int n_pad, head_rows, keys_only, hidden_by_position, x_ring_rows;
    const void *x_in, *hidden_out, *hc_out, *capture, *capture_ring, *x_ring, *tail;
};

struct td_fwd_ws {
    struct td_plan_dims dims;
    const struct td_backend *b;
    void **bufs;
    int n_bufs;
    struct fwd f; /* buffer pointers; per-step fields are set by td_forward */
    struct {
        struct graph_key key;
        void *exec; /* NULL: capture failed, run eagerly */
    } graphs[MAX_GRAPHS];
    int n_graphs;
};

static void ws_free(struct td_state *st) {
    struct td_fwd_ws *ws = st->ws;
    if (!ws) return;
    for (int i = 0; i < ws->n_graphs; i++)
        if (ws->graphs[i].exec) ws->b->graph_free(ws->graphs[i].exec);
    for (int i = 0; i < ws->n_bufs; i++)
        ws->b->release(ws->bufs[i]);
    if (ws->f.slots_host) ws->b->release_host(ws->f.slots_host);
    free(ws->bufs);
    free(ws);
    st->ws = NULL;
}

/* elements of the largest packed Q8 / Q4 matrix among t[0 .. n), 0 for none */
static long long quant_max(const struct td_tensor *const *t, int n) {
    long long most = 0;
    for (int j = 0; j < n; j++)
        if ((t[j]->dtype == TD_DTYPE_Q8 || t[j]->dtype == TD_DTYPE_Q4) &&
            td_tensor_numel(t[j]) > most)
            most = td_tensor_numel(t[j]);
    return most;
}

static int ws_make(struct td_state *st, const struct td_model *m, const struct td_plan_dims *d,
                   char *err, size_t errlen) {
    const struct td_config *c = &m->cfg;
    if (st->ws && meta_plan_dims_equal(&st->ws->dims, d)) return 0;
    ws_free(st);
    const struct td_backend *b = st->backend;
    struct td_fwd_ws *ws = calloc(1, sizeof *ws);
    if (!ws) goto oom;
    st->ws = ws;
    st->ws_free = ws_free;
    ws->dims = *d;
    ws->b = b;
    struct fwd *f = &ws->f;
    int D = c->dim, nc = c->hc_mult, H = c->n_heads, hd = c->head_dim, half = c->rope_dim / 2;
    int wmax = 2 * (hd > c->index_head_dim ? hd : c->index_head_dim);
    size_t N = (size_t)d->max_tok, F = sizeof(float);
    struct {
        void **dst;
        size_t bytes;
    } want[] = {
        {.dst = (void **)&f->X, .bytes = N * nc * D * F},
        {.dst = (void **)&f->x, .bytes = N * D * F},
        {.dst = (void **)&f->xn, .bytes = N * D * F},
        {.dst = (void **)&f->a, .bytes = N * D * F},
        {.dst = (void **)&f->a2, .bytes = N * D * F},
        {.dst = (void **)&f->post, .bytes = N * nc * F},
        {.dst = (void **)&f->comb, .bytes = N * nc * nc * F},
        {.dst = (void **)&f->qr, .bytes = N * c->q_lora_rank * F},
        {.dst = (void **)&f->q, .bytes = N * H * hd * F},
        {.dst = (void **)&f->o, .bytes = N * H * hd * F},
        {.dst = (void **)&f->kv, .bytes = N * hd * F},
        {.dst = (void **)&f->ent, .bytes = N * (wmax / 2) * F},
        {.dst = (void **)&f->kvrec, .bytes = N * hd * F}, // (a record is at most fp32's bytes)
        {.dst = (void **)&f->og, .bytes = N * c->o_groups * c->o_lora_rank * F},
        {.dst = (void **)&f->raw, .bytes = N * wmax * F},
        {.dst = (void **)&f->gate, .bytes = N * wmax * F},
        {.dst = (void **)&f->iraw, .bytes = N * wmax * F},
        {.dst = (void **)&f->igate, .bytes = N * wmax * F},
        {.dst = (void **)&f->qi, .bytes = N * c->index_n_heads * c->index_head_dim * F},
        {.dst = (void **)&f->wi, .bytes = N * c->index_n_heads * F},
        {.dst = (void **)&f->g, .bytes = N * c->moe_inter * F},
        {.dst = (void **)&f->u, .bytes = N * c->moe_inter * F},
        {.dst = (void **)&f->router, .bytes = N * c->n_experts * F},
        {.dst = (void **)&f->picks,
         .bytes = N * (c->n_experts_tok + 1) * sizeof(int32_t)}, // + the shared
        {.dst = (void **)&f->weights, .bytes = N * (c->n_experts_tok + 1) * F},
        {.dst = (void **)&f->slots, // (a float when the model is not split)
         .bytes = m->split ? N * (c->n_experts_tok + 1) * D * F : F},
        {.dst = (void **)&f->logits, .bytes = N * c->vocab * F},
        {.dst = (void **)&f->inv_main, .bytes = (size_t)(half + 1) * F},
        {.dst = (void **)&f->inv_comp, .bytes = (size_t)(half + 1) * F},
        {.dst = (void **)&f->plan_dev, .bytes = meta_plan_bytes(d)},
        {.dst = (void **)&f->xc,
         .bytes = N * F *
                  (m->dspark.main_proj.data ? (size_t)m->dspark.main_proj.shape[1]
                   : m->mtp_hproj.data      ? (size_t)nc * D
                                            : 1)},
    };
    int n = (int)(sizeof want / sizeof *want);
    if (!(ws->bufs = calloc((size_t)n, sizeof *ws->bufs))) goto oom;
    for (int i = 0; i < n; i++) {
        if (!(*want[i].dst = b->alloc(want[i].bytes))) goto oom;
        ws->bufs[ws->n_bufs++] = *want[i].dst;
    }
    if (m->split && !m->split->data && b->on_device &&
        !(f->slots_host = b->alloc_host(N * (c->n_experts_tok + 1) * D * F)))
        goto oom;
    float inv[256];
    struct rope_params pm = rope_of(&c->rope_main, c->rope_dim);
    struct rope_params pc = rope_of(&c->rope_compress, c->rope_dim);
    rope_inv_freq_ref(inv, &pm);
    b->to_device(f->inv_main, inv, (size_t)half * F);
    rope_inv_freq_ref(inv, &pc);
    b->to_device(f->inv_comp, inv, (size_t)half * F);
    if (b->reserve) {
        size_t in_max = (size_t)D;
        // (and the drafters' input projections: MTP's hproj reads a step row's hc_mult
        // streams as hc_mult rows of D, so x holds N * hc_mult * D inputs: a catch-up of a new
        // width grew the bf16 copy of x inside a graph's capture)
        size_t ins[6] = {(size_t)c->q_lora_rank,
                         (size_t)H * hd,
                         (size_t)c->o_groups * c->o_lora_rank,
                         (size_t)c->moe_inter,
                         (size_t)(m->dspark.main_proj.data ? m->dspark.main_proj.shape[1] : 0),
                         (size_t)(m->mtp_hproj.data ? nc * D : 0)};
        for (int i = 0; i < 6; i++)
            in_max = ins[i] > in_max ? ins[i] : in_max;
        int ent = 0;
        for (int i = 0; i < c->n_layers; i++)
            if (st->layers[i].n_entries > ent) ent = st->layers[i].n_entries;
        int csa_slots = c->rate_csa ? 2 * c->rate_csa : 0; // CSA windows overlap
        // the largest Q8 / Q4 matrix a wide step decodes (matmul)
        const struct td_tensor *mt[] = {&m->mtp_eproj, &m->mtp_hproj, &m->dspark.main_proj};
        long long qw = quant_max(mt, 3);
        for (int i = 0; i < c->n_layers; i++) {
            const struct td_layer *l = &m->layers[i];
            const struct td_tensor *ts[] = {&l->wq_a,     &l->wq_b,  &l->wkv,   &l->wo_a, &l->wo_b,
                                            &l->idx_wq_b, &l->sh_w1, &l->sh_w3, &l->sh_w2};
            long long q = quant_max(ts, 9);
            qw = q > qw ? q : qw;
        }
        struct td_reserve rs = {
            .rows = (int)N,
            .gemm_in = (int)in_max,
            .dim = D,
            .hc_mult = c->hc_mult,
            .n_heads = c->n_heads,
            .head_dim = hd,
            .index_head_dim = c->rate_csa ? c->index_head_dim : 0,
            .index_n_heads = c->rate_csa ? c->index_n_heads : 0,
            .rot_dim = c->rope_dim,
            .max_keys = d->window + d->block + (ent > d->topk ? ent : d->topk),
            .entries = ent,
            .comp_slots = csa_slots > c->rate_hca ? csa_slots : c->rate_hca,
            .moe_k = c->n_experts_tok + 1, // + the shared expert, when folded in
            .moe_experts = c->n_experts + 1,
            .moe_inter = c->moe_inter,
            .markov_rank = m->dspark.markov_w1.data ? (int)m->dspark.markov_w1.shape[1] : 0,
            .markov_slots = m->dspark.markov_w1.data ? d->block : 0,
            .vocab = c->vocab,
            .quant_weight = qw,
        };
        if (b->reserve(&rs, err, errlen)) {
            ws_free(st);
            return -1;
        }
    }
    return 0;
oom:
    ws_free(st);
    return td_errf(err, errlen, "forward: out of %s memory for step buffers of %d rows", b->name,
                   d->max_tok);
}

/* rows logit_rows[i] -> i of x [rows, width], in place: ascending, and logit_rows[i] >= i, so a
 * copy never overwrites a row a later copy reads (queued copies run in order) */
static void compact_rows(struct fwd *f, float *x, int width) {
    const struct td_plan *p = f->p;
    for (int i = 0; i < p->n_logit; i++)
        if (p->logit_rows[i] != i)
            f->op->copy(x + (size_t)i * width, x + (size_t)p->logit_rows[i] * width,
                        (size_t)width * sizeof(float));
}

/* layer li's indexer picks into the trace [n_layers, n, index_topk]: the plan's rows are
 * dims.topk wide (index_topk, or fewer when no row can see that many entries: then the rest
 * of each trace row is -1, the padding a wider selection would have had) */
static void trace_picks(struct fwd *f, int32_t *trace, int li) {
    int n = f->n, k = f->c->index_topk, w = f->p->dims.topk;
    int32_t *dst = trace + (size_t)li * n * k;
    if (w == k) {
        f->b->to_host(dst, f->rows.topk, (size_t)n * k * sizeof(int32_t));
        return;
    }
    for (int t = 0; t < n; t++) {
        f->b->to_host(dst + (size_t)t * k, f->rows.topk + (size_t)t * w,
                      (size_t)w * sizeof(int32_t));
        for (int j = w; j < k; j++)
            dst[(size_t)t * k + j] = -1;
    }
}

/* the whole forward for n rows, queued on the backend (capturable: no allocation, no copy) */
/* a hyper-connection's weights as hc_pre reads them */
static struct hc_weights hc_of(const struct td_hc_w *h) {
    return (struct hc_weights){.fn = h->fn.data,
                               .base = h->base.data,
                               .scale = h->scale.data,
                               .fn_dtype = h->fn.dtype,
                               .base_dtype = h->base.dtype,
                               .scale_dtype = h->scale.dtype};
}

/* MTP's input streams into X: hproj(hnorm(h)) + eproj(enorm(embed(id))) for each row (its
 * plan id), the token term zero at position 0, h the streams before: x_in's rows, or by
 * position from x_ring (the target's, kept by position). In the step's graph: made on the
 * host's side they were eight launches and two uploads a pass, and a catch-up of 32 sequences
 * x 128 rows took 2.7-3.5 ms (H100, batch 32) */
static void mtp_input(struct fwd *f) {
    const struct td_model *m = f->m;
    const struct td_config *c = f->c;
    int n = f->n, D = c->dim, nc = c->hc_mult;
    float eps = c->rms_eps;
    const float *h = f->x_in;
    if (f->x_ring) {
        f->op->ring_load(f->xc, f->x_ring, &f->rows, f->x_ring_rows, nc * D);
        h = f->xc;
    }
    f->op->embed(f->x, f->rows.input_ids, W(m->embed), n, 1, D);
    f->op->rmsnorm(f->x, f->x, W(m->mtp_enorm), n, D, eps);
    f->op->matmul(f->a, f->x, W(m->mtp_eproj), n, D, D, NULL, 0);
    f->op->rmsnorm(f->xc, h, W(m->mtp_hnorm), n * nc, D, eps);
    f->op->matmul(f->X, f->xc, W(m->mtp_hproj), n * nc, D, D, NULL, 0);
    f->op->add_bcast(f->X, f->a, n, nc, D, f->rows.positions);
}

static void run_layers(struct fwd *f, int32_t *topk_trace) {
    const struct td_model *m = f->m;
    const struct td_config *c = f->c;
    int n = f->n, D = c->dim, nc = c->hc_mult;
    if (m->mtp_hproj.data) // MTP: its input from the streams before and the tokens
        mtp_input(f);
    else if (f->x_in) // a drafter's own input streams
        f->op->copy(f->X, f->x_in, (size_t)n * nc * D * sizeof(float));
    else
        f->op->embed(f->X, f->rows.input_ids, W(m->embed), n, nc, D);
    for (int li = 0; li < c->n_layers; li++) {
        const struct td_layer *l = &m->layers[li];
        struct hc_weights ha = hc_of(&l->hc_attn), hf = hc_of(&l->hc_ffn);
        f->op->hc_pre(f->xn, f->post, f->comb, f->X, &ha, n, nc, D, c->hc_sinkhorn_iters, c->hc_eps,
                      c->rms_eps, W(l->attn_norm));
        attention_block(f, li);
        f->op->hc_post(f->X, f->a, f->post, f->comb, n, nc, D, NULL, 0);
        f->op->hc_pre(f->xn, f->post, f->comb, f->X, &hf, n, nc, D, c->hc_sinkhorn_iters, c->hc_eps,
                      c->rms_eps, W(l->ffn_norm));
        moe_block(f, li);
        float *mean = NULL; // DSpark's context: this layer's mean stream, made by hc_post
        for (int k = 0; k < f->n_capture && !mean; k++)
            if (f->capture_layers[k] == li) mean = f->capture + (size_t)k * D;
        f->op->hc_post(f->X, f->a, f->post, f->comb, n, nc, D, mean, f->n_capture * D);
        if (topk_trace && c->attn[li] == TD_ATTN_CSA) trace_picks(f, topk_trace, li);
    }
    // by position, as the window's keys are: the final streams (MTP), the captured rows
    // (DSpark), in one launch
    struct ring_parts by_pos = {.m = 0};
    if (f->hidden_out && f->hidden_by_position)
        by_pos.ring[by_pos.m] = f->hidden_out, by_pos.rows[by_pos.m] = f->X,
        by_pos.width[by_pos.m++] = nc * D;
    if (f->capture_ring)
        by_pos.ring[by_pos.m] = f->capture_ring, by_pos.rows[by_pos.m] = f->capture,
        by_pos.width[by_pos.m++] = f->n_capture * D;
    if (by_pos.m) f->op->ring_store(&by_pos, f->rows.swa_write, &f->rows, f->st->swa_ring);
    if (f->hidden_out && !f->hidden_by_position) // the final streams, before hc_head (MTP)
        f->op->copy(f->hidden_out, f->X, (size_t)n * nc * D * sizeof(float));
    float *hx = f->hc_out ? f->hc_out : f->x;
    f->op->hc_head(hx, f->X, W(m->hc_head.fn), W(m->hc_head.base), W(m->hc_head.scale), n, nc, D,
                   c->hc_eps, c->rms_eps);
    f->op->rmsnorm(f->xn, hx, W(m->norm), n, D, c->rms_eps);
    int n_head = n;
    const float *xh = f->xn;
    if (!f->head_all_rows) { // only the rows whose logits the step returns meet the head
        compact_rows(f, f->xn, D);
        n_head = f->p->n_logit;
    } else if (f->head_rows < n) { // a graph's: those rows gathered (-1s: zero rows), in order
        f->op->embed(f->a, f->rows.logit_rows, f->xn, TD_DTYPE_F32, f->head_rows, 1, D);
        xh = f->a, n_head = f->head_rows;
    }
    f->op->matmul(f->logits, xh, W(m->head), n_head, D, c->vocab, NULL, 0);
}

/* the rows' keys into every layer's ring (td_forward_store_kv), capturable */
static void run_store(struct fwd *f) {
    const struct td_model *m = f->m;
    const struct td_config *c = f->c;
    const float *x = f->x_in;
    if (f->keys_only == TD_KEYS_STREAMS) { // the one layer's normed input, as run_layers makes it
        const struct td_layer *l = &m->layers[0];
        if (m->mtp_hproj.data) {
            mtp_input(f);
            x = f->X;
        }
        struct hc_weights ha = hc_of(&l->hc_attn);
        f->op->hc_pre(f->xn, f->post, f->comb, x, &ha, f->n, c->hc_mult, c->dim,
                      c->hc_sinkhorn_iters, c->hc_eps, c->rms_eps, W(l->attn_norm));
        x = f->xn;
    } else if (m->dspark.main_proj.data) { // DSpark: the captured target rows, fused and normalised
        int in = (int)m->dspark.main_proj.shape[1];
        if (f->x_ring) { // read by position from the target's ring
            f->op->ring_load(f->xc, f->x_ring, &f->rows, f->x_ring_rows, in);
            x = f->xc;
        }
        f->op->matmul(f->x, x, W(m->dspark.main_proj), f->n, in, c->dim, NULL, 0);
        f->op->rmsnorm(f->x, f->x, W(m->dspark.main_norm), f->n, c->dim, c->rms_eps);
        x = f->x;
    }
    for (int li = 0; li < c->n_layers; li++) {
        const struct td_layer *l = &m->layers[li];
        f->op->matmul(f->kv, x, W(l->wkv), f->n, c->dim, c->head_dim, NULL, 0);
        struct td_layer_state *ls = &f->st->layers[li];
        int typed = f->st->kv_dtype != TD_KV_F32;
        struct norm_rope_args a = keys_norm_rope(f, l, typed ? NULL : ls->swa, f->inv_main,
                                                 (float)c->rope_main.attention_factor);
        f->op->norm_rope(&a, 1);
        if (typed)
            kv_store(f, ls->swa, f->st->kfmt, f->st->swa_ring, 0, f->kv, f->rows.swa_write, NULL);
    }
}

static void run_pass(struct fwd *f, int32_t *topk_trace) {
    if (f->keys_only)
        run_store(f);
    else
        run_layers(f, topk_trace);
    if (f->tail) f->tail->run(f->tail->ctx, &f->rows);
}

/* steps of more rows than this (long prefill chunks) run eagerly: td_state.graph_rows, 0 = 128 */
static int graph_max_rows(const struct td_state *st) {
    return st->graph_rows > 0 ? st->graph_rows : 128;
}

/* the rows a graph of n_pad rows runs the head on: every one, or at most the state's logit rows
 * (a 512-row prompt chunk returns one row's logits, or none; the head over all of them took
 * 0.8 of the 28.8 ms of such a step of the released slice, H100) */
static int head_rows(const struct td_state *st, int n_pad) {
    return st->logit_rows > 0 && st->logit_rows < n_pad ? st->logit_rows : n_pad;
}

/* the graph of bucket n_pad for f's io buffers, captured now if it is new: its index, or -1
 * (none: the table is full or capture failed; the step runs eagerly). f is set up for n_pad
 * rows: pad rows are valid rows, the kernels leave them inert, and the head runs on all. */
static int graph_for(struct fwd *f, struct td_fwd_ws *ws, int n_pad) {
    const struct td_backend *b = f->b;
    struct graph_key key;
    memset(&key, 0, sizeof key);
    key.n_pad = n_pad;
    key.head_rows = head_rows(f->st, n_pad);
    key.keys_only = f->keys_only;
    key.x_in = f->x_in;
    key.hidden_out = f->hidden_out;
    key.hidden_by_position = f->hidden_by_position;
    key.hc_out = f->hc_out;
    key.capture = f->capture;
    key.capture_ring = f->capture_ring;
    key.x_ring = f->x_ring;
    key.x_ring_rows = f->x_ring_rows;
    key.tail = f->tail;
    int g = 0;
    while (g < ws->n_graphs && memcmp(&ws->graphs[g].key, &key, sizeof key))
        g++;
    f->n = n_pad;
    f->rows.n_tok = n_pad;
    f->head_all_rows = 1; // a graph serves every step of its bucket, whatever rows they keep
    f->head_rows = head_rows(f->st, n_pad);
    if (g == ws->n_graphs) {
        if (g == MAX_GRAPHS) return -1;
        void *exec = NULL;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        if (!b->graph_begin()) {
            run_pass(f, NULL);
            exec = b->graph_end();
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        f->st->n_captured++;
        f->st->t_capture +=
            (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        ws->graphs[g].key = key;
        ws->graphs[g].exec = exec;
        ws->n_graphs++;
    }
    return ws->graphs[g].exec ? g : -1;
}

static int graphs_on(const struct fwd *f) {
    const struct td_split *sp = split_of(f->m); // (a host all-reduce waits: no graph)
    return f->st->use_graphs && f->b->graph_begin && !(sp && !sp->data);
}

/* A step as rank 0 sends it to the followers: then the parts of the plan's buffer it reads */
struct step_msg {
    int32_t kind; /* 1: a step follows, 2: a state op (op), 3: a served model's step of n_tok
                    rows (td_serve_step), 0: stop */
    int32_t max_tok, max_seq, n_tok, n_seq, n_tok_pad, n_seq_pad, n_logit, n_spans;
    uint64_t off[2], bytes[2];
    struct td_state_op op;
};

static struct td_comm *leader_comm(const struct td_model *m) {
    const struct td_split *sp = m->split;
    return sp && sp->leads && sp->comm->world > 1 && sp->comm->rank == 0 ? sp->comm : NULL;
}

/* rank 0 of a split whose other ranks serve its experts (split.h serves): the rows this step's
 * MoE layers run, to them, before the step's collectives (td_serve_step) */
static void serve_rows(const struct fwd *f) {
    struct td_comm *c = leader_comm(f->m);
    if (!c || !f->m->split->serves || f->keys_only) return; // (keys only: no MoE layer)
    struct step_msg h = {.kind = 3, .n_tok = f->n};
    c->ops->broadcast(c, &h, sizeof h, 0); // (a failure fails the world: the call's end says)
}

/* decode and verify steps and context stores (up to 128 rows) replay a graph captured once per
 * row bucket */
static void run_step(struct fwd *f, struct td_fwd_ws *ws, int32_t *topk_trace) {
    int n_pad = f->p->n_tok_pad, g = -1;
    if (graphs_on(f) && !topk_trace && n_pad <= graph_max_rows(f->st) &&
        f->p->n_logit <= head_rows(f->st, n_pad) && // (more logits: eagerly)
        (g = graph_for(f, ws, n_pad)) < 0) {        // none for the bucket: eagerly, on its own rows
        f->n = f->p->n_tok;
        f->rows.n_tok = f->p->n_tok;
        f->head_all_rows = 0;
    }
    serve_rows(f);
    if (g < 0) {
        run_pass(f, topk_trace);
        return;
    }
    f->b->graph_launch(ws->graphs[g].exec);
    if (!f->keys_only && f->head_rows == n_pad) // the head ran on every row
        compact_rows(f, f->logits, f->c->vocab);
}

int td_forward(const struct td_model *m, struct td_state *st, const struct td_plan *p,
               float *logits, int32_t *topk_trace, char *err, size_t errlen) {
    return td_forward_ex(m, st, p, NULL, logits, topk_trace, err, errlen);
}

/* step buffers and the fields every forward call sets (p: the step's plan, or a plan whose
 * layout alone is read) */
static struct fwd *setup(const struct td_model *m, struct td_state *st, const struct td_plan *p,
                         const struct td_forward_io *io, char *err, size_t errlen) {
    static const struct td_forward_io none;
    if (!io) io = &none;
    const struct td_backend *b = st->backend;
    if (m->quantized) { // its FP8 / FP4 views are for td_model_upload to decode or pack
        td_errf(err, errlen,
                "forward: the model has %d FP8/FP4 weights as loaded: run its placed "
                "copy (td_model_upload)",
                m->quantized);
        return NULL;
    }
    if (split_of(m) && (!b->ops.moe_experts_slots || !b->ops.moe_combine_slots)) {
        td_errf(err, errlen,
                "forward: the %s backend cannot run a model split over %d ranks yet (it has no "
                "expert slots)",
                b->name, m->split->comm->world);
        return NULL;
    }
    if (split_of(m) && m->split->data && !b->queue) {
        td_errf(err, errlen, "forward: a device communicator needs a device backend, not %s",
                b->name);
        return NULL;
    }
    if (ws_make(st, m, &p->dims, err, errlen)) return NULL;
    struct fwd *f = &st->ws->f;
    f->b = b;
    f->op = &b->ops;
    f->m = m;
    f->c = &m->cfg;
    f->st = st;
    f->p = p;
    f->n = p->n_tok;
    f->x_in = io->x_in;
    f->hidden_out = io->hidden_out;
    f->hidden_by_position = io->hidden_by_position;
    f->hc_out = io->hc_out;
    f->capture = io->capture;
    f->capture_layers = io->capture_layers;
    f->n_capture = io->capture ? io->n_capture : 0;
    f->capture_ring = io->capture ? io->capture_ring : NULL;
    f->x_ring = io->x_ring;
    f->x_ring_rows = io->x_ring_rows;
    f->keys_only = io->keys_only;
    f->tail = io->tail;
    f->head_all_rows = 0;
    f->plan_base = b->on_device ? f->plan_dev : p->mem; // the CPU reads the plan itself
    f->rows = meta_plan_rows(p, f->plan_base, META_RATE_NONE);
    return f;
}

/* checks, step buffers and the plan's copy in backend memory when the step reads one (a
 * device's every step; on the CPU a step with id patches, which are written to the copy, never
 * to the plan): the start of every forward call */
static struct fwd *begin(const struct td_model *m, struct td_state *st, const struct td_plan *p,
                         const struct td_forward_io *io, char *err, size_t errlen) {
    if (check_plan(m, st, p, err, errlen)) return NULL;
    if (m->mtp_hproj.data && !(io && (io->x_in || io->x_ring))) {
        td_errf(err, errlen, "forward: an MTP layer's input needs the streams before its rows");
        return NULL;
    }
    struct fwd *f = setup(m, st, p, io, err, errlen);
    if (!f) return NULL;
    if (io && io->n_id_patches && f->plan_base == p->mem) {
        f->plan_base = f->plan_dev;
        f->rows = meta_plan_rows(p, f->plan_base, META_RATE_NONE);
    }
    if (f->plan_base == f->plan_dev) { // the step's rows and tables only (meta_plan_spans)
        size_t off[2], bytes[2];
        for (int i = 0, n = meta_plan_spans(p, off, bytes); i < n; i++)
            f->b->to_device((char *)f->plan_dev + off[i], (const char *)p->mem + off[i], bytes[i]);
        if (f->b->mark) f->b->mark("upload");
    }
    return f;
}

int td_forward_prepare(const struct td_model *m, struct td_state *st, const struct td_plan_dims *d,
                       const struct td_forward_io *io, int min_rows, int max_rows, char *err,
                       size_t errlen) {
    if (!st->use_graphs || !st->backend->graph_begin) return 0;
    const struct td_split *sp = split_of(m);
    if (sp && !sp->data) return 0; // (its steps run eagerly: graphs_on)
    struct td_plan_dims want = td_state_plan_dims(st, d->max_tok, d->max_seq);
    if (!meta_plan_dims_equal(&want, d))
        return td_errf(err, errlen, "forward: prepare was given other state dimensions");
    struct td_plan p; // its layout only: capture records the kernels, it runs none of them
    if (meta_plan_init(&p, d, err, errlen)) return -1;
    struct fwd *f = setup(m, st, &p, io, err, errlen);
    int cap = graph_max_rows(st);
    int top = meta_bucket(max_rows < cap ? max_rows : cap, d->max_tok);
    for (int n_pad = meta_bucket(min_rows, d->max_tok); f && n_pad <= top; n_pad *= 2)
        graph_for(f, st->ws, n_pad);
    meta_plan_free(&p);
    return f && !st->backend->finish(err, errlen) ? 0 : -1;
}

/* rank 0: the step's plan to the followers, from the buffer the kernels read (base) */
static int send_step(struct td_comm *c, const struct td_plan *p, const struct fwd *f, char *err,
                     size_t errlen) {
    const char *base = (const char *)f->plan_base;
    struct step_msg h = {.kind = 1,
                         .max_tok = p->dims.max_tok,
                         .max_seq = p->dims.max_seq,
                         .n_tok = p->n_tok,
                         .n_seq = p->n_seq,
                         .n_tok_pad = p->n_tok_pad,
                         .n_seq_pad = p->n_seq_pad,
                         .n_logit = p->n_logit};
    size_t off[2], bytes[2];
    h.n_spans = meta_plan_spans(p, off, bytes);
    for (int i = 0; i < h.n_spans; i++)
        h.off[i] = off[i], h.bytes[i] = bytes[i];
    int rc = c->ops->broadcast(c, &h, sizeof h, 0);
    for (int i = 0; !rc && i < h.n_spans; i++) {
        if (!f->b->on_device) {
            rc = c->ops->broadcast(c, (char *)base + off[i], bytes[i], 0);
            continue;
        }
        // a device's copy, its draft ids patched in there: back to the host first
        char *host = malloc(bytes[i] ? bytes[i] : 1);
        if (!host) {
            c->ops->abort(c, "rank 0: out of memory for a step's plan");
            free(host);
            return td_errf(err, errlen, "forward: out of memory for a step's plan");
        }
        f->b->to_host(host, base + off[i], bytes[i]);
        rc = f->b->finish(err, errlen);
        if (rc) c->ops->abort(c, err);
        if (!rc) rc = c->ops->broadcast(c, host, bytes[i], 0);
        free(host);
    }
    if (rc) c->ops->poll_error(c, err, errlen);
    return rc ? -1 : 0;
}

int td_forward_send_op(const struct td_model *m, const struct td_state_op *op, char *err,
                       size_t errlen) {
    struct td_comm *c = leader_comm(m);
    struct step_msg h = {.kind = 2, .op = *op};
    if (c && c->ops->broadcast(c, &h, sizeof h, 0)) return c->ops->poll_error(c, err, errlen);
    return 0;
}

void td_forward_stop(const struct td_model *m) {
    struct td_comm *c = leader_comm(m);
    struct step_msg h = {.kind = 0};
    if (c) c->ops->broadcast(c, &h, sizeof h, 0);
}

/* a follower's failure ends the world, with its reason */
static int follower_fails(struct td_comm *c, char *err) {
    char why[600];
    snprintf(why, sizeof why, "rank %d: %s", c->rank, err);
    c->ops->abort(c, why);
    return -1;
}

int td_forward_follow(const struct td_model *m, struct td_state *st,
                      const struct td_follow_ops *ops, char *err, size_t errlen) {
    struct td_comm *c = m->split ? m->split->comm : NULL;
    if (!c || c->world < 2 || c->rank == 0 || !m->split->leads)
        return td_errf(err, errlen,
                       "forward: a follower is a rank past 0 of a split model whose rank 0 leads");
    struct td_plan p;
    int have = 0, rc = 0;
    for (;;) {
        struct step_msg h;
        if (c->ops->broadcast(c, &h, sizeof h, 0)) {
            c->ops->poll_error(c, err, errlen);
            rc = -1;
            break;
        }
        if (h.kind == 0) break;
        if (h.kind == 3) {
            if (!ops || !ops->serve)
                td_errf(err, errlen,
                        "forward: rank 0 runs a drafter whose experts this rank does not serve");
            if (!ops || !ops->serve || td_serve_step(ops->serve, h.n_tok, err, errlen)) {
                rc = follower_fails(c, err);
                break;
            }
            continue;
        }
        if (h.kind == 2) {
            if (!ops || !ops->apply)
                td_errf(err, errlen, "forward: rank 0 sent a state op (%d) this rank cannot make",
                        h.op.kind);
            if (!ops || !ops->apply || ops->apply(ops->ctx, &h.op, err, errlen)) {
                rc = follower_fails(c, err);
                break;
            }
            continue;
        }
        if (!have || p.dims.max_tok != h.max_tok || p.dims.max_seq != h.max_seq) {
            if (have) meta_plan_free(&p);
            struct td_plan_dims d = td_state_plan_dims(st, h.max_tok, h.max_seq);
            have = !meta_plan_init(&p, &d, err, errlen);
            if (!have) {
                rc = follower_fails(c, err);
                break;
            }
        }
        int bad = h.n_spans < 0 || h.n_spans > 2;
        for (int i = 0; !bad && i < h.n_spans; i++)
            bad = h.off[i] > p.bytes || h.bytes[i] > p.bytes - h.off[i];
        if (bad) {
            td_errf(err, errlen, "forward: a step of %d parts outside the plan's %zu bytes",
                    h.n_spans, p.bytes);
            rc = follower_fails(c, err);
            break;
        }
        for (int i = 0; !rc && i < h.n_spans; i++)
            if (c->ops->broadcast(c, (char *)p.mem + h.off[i], h.bytes[i], 0)) {
                c->ops->poll_error(c, err, errlen);
                rc = -1;
            }
        if (rc) break;
        p.n_tok = h.n_tok, p.n_seq = h.n_seq, p.n_tok_pad = h.n_tok_pad;
        p.n_seq_pad = h.n_seq_pad, p.n_logit = h.n_logit;
        for (int s = 0; s < p.n_seq && !rc; s++) { // the state by position: only the lengths
            int slot = p.slot[s], len = p.len_before[s];
            if (slot < 0 || slot >= st->max_seqs || len < 0 || len > st->max_ctx) {
                td_errf(err, errlen, "forward: a step names slot %d at length %d", slot, len);
                rc = follower_fails(c, err);
                break;
            }
            if (!st->in_use[slot] || !len) st->in_use[slot] = 1, st->hi[slot] = 0;
            st->len[slot] = len;
        }
        if (!rc && td_forward_ex(m, st, &p, NULL, NULL, NULL, err, errlen))
            rc = follower_fails(c, err);
        if (rc) break;
    }
    if (have) meta_plan_free(&p);
    return rc;
}

/* The ranks' last residual streams of the step (every row, every stream) compared by hash:
 * they run the same rows on the same weights, so a rank that differs has diverged (another
 * weight, a state that moved apart, a kernel that is not the same function): the world fails,
 * naming it and the step. */
static int check_ranks(struct fwd *f, char *err, size_t errlen) {
    const struct td_split *sp = f->m->split;
    struct td_comm *c = sp->comm;
    size_t bytes = (size_t)f->n * f->c->hc_mult * f->c->dim * sizeof(float);
    void *host = malloc(bytes ? bytes : 1);
    uint64_t h[2] = {0, 0}, *all = calloc((size_t)c->world, sizeof h);
    if (!host || !all) {
        free(host), free(all);
        return td_errf(err, errlen, "forward: out of memory for the ranks' check");
    }
    f->b->to_host(host, f->X, bytes);
    int rc = f->b->finish(err, errlen);
    h[0] = XXH3_64bits(host, bytes), h[1] = (uint64_t)f->st->n_steps;
    if (!rc && c->ops->all_gather(c, h, all, sizeof h)) rc = c->ops->poll_error(c, err, errlen);
    for (int r = 1; !rc && r < c->world; r++)
        if (all[2 * r] != all[0]) {
            rc = td_errf(err, errlen,
                         "forward: rank %d's residual streams differ from rank 0's at its step "
                         "%llu (hash %016llx against %016llx): the ranks have diverged",
                         r, (unsigned long long)all[2 * r + 1], (unsigned long long)all[2 * r],
                         (unsigned long long)all[0]);
            c->ops->abort(c, err);
        }
    free(host), free(all);
    return rc ? -1 : 0;
}

/* a split model's ranks: has their world failed (a rank aborted, disagreed or timed out, or
 * the device communicator failed)? */
static int world_failed(const struct td_model *m, char *err, size_t errlen) {
    struct td_comm *c = m->split ? m->split->comm : NULL, *d = m->split ? m->split->data : NULL;
    return (c && c->ops->poll_error(c, err, errlen)) || (d && d->ops->poll_error(d, err, errlen));
}

static void commit(struct td_state *st, const struct td_plan *p) {
    for (int s = 0; s < p->n_seq; s++) {
        int slot = p->slot[s];
        if (p->block[s]) continue; // a non-causal block stores nothing: its length stays
        st->len[slot] = p->len_before[s] + p->qo_indptr[s + 1] - p->qo_indptr[s];
        if (st->len[slot] > st->hi[slot]) st->hi[slot] = st->len[slot];
    }
}

int td_forward_ex(const struct td_model *m, struct td_state *st, const struct td_plan *p,
                  const struct td_forward_io *io, float *logits, int32_t *topk_trace, char *err,
                  size_t errlen) {
    struct fwd *f = begin(m, st, p, io, err, errlen);
    if (!f) return -1;
    struct id_patches batch; // (a launch for up to ID_PATCH_MAX)
    batch.n = 0;
    for (int i = 0; io && i < io->n_id_patches; i++) {
        const struct td_id_patch *q = &io->id_patches[i];
        if (q->row < 0 || q->n < 0 || q->row + q->n > p->n_tok)
            return td_errf(err, errlen, "forward: id patch of rows %d + %d, the plan has %d",
                           q->row, q->n, p->n_tok);
        batch.row[batch.n] = q->row, batch.len[batch.n] = q->n, batch.src[batch.n++] = q->src;
        if (batch.n == ID_PATCH_MAX || i + 1 == io->n_id_patches) {
            f->b->ops.patch_ids((int32_t *)f->rows.input_ids, &batch);
            batch.n = 0;
        }
    }
    struct td_comm *lead = leader_comm(m);
    if (lead && !m->split->serves && send_step(lead, p, f, err, errlen)) return -1;
    run_step(f, st->ws, topk_trace);
    if (world_failed(m, err, errlen)) return -1;
    if (m->split && m->split->check && !m->split->serves && m->split->comm->world > 1 &&
        check_ranks(f, err, errlen))
        return -1;
    st->n_steps++;
    if (logits) { // else they stay in the backend (td_forward_logits) and nothing waits here
        f->b->to_host(logits, f->logits, (size_t)p->n_logit * f->c->vocab * sizeof(float));
        if (f->b->finish(err, errlen) || world_failed(m, err, errlen)) return -1;
    }
    commit(st, p);
    return 0;
}

const float *td_forward_logits(const struct td_state *st) {
    return st->ws ? st->ws->f.logits : NULL;
}

int td_forward_store_kv(const struct td_model *m, struct td_state *st, const struct td_plan *p,
                        const struct td_forward_io *io, char *err, size_t errlen) {
    const struct td_config *c = &m->cfg;
    enum td_keys from = io->keys_only;
    if (from != TD_KEYS_CONTEXT && from != TD_KEYS_STREAMS)
        return td_errf(err, errlen, "store_kv: keys from %d, neither context nor streams",
                       (int)from);
    if (from == TD_KEYS_STREAMS && c->n_layers != 1)
        return td_errf(err, errlen,
                       "store_kv: keys from the input streams need a one-layer model, this one "
                       "has %d layers",
                       c->n_layers);
    for (int li = 0; li < c->n_layers; li++)
        if (c->attn[li] != TD_ATTN_SLIDING)
            return td_errf(
                err, errlen,
                "store_kv: layer %d has %s attention; only sliding-window layers take keys "
                "from outside",
                li, td_attn_kind_name(c->attn[li]));
    for (int s = 0; s < p->n_seq; s++)
        if (p->block[s])
            return td_errf(err, errlen,
                           "store_kv: sequence %d is a block, and blocks store nothing", s);
    if (io->x_ring && (io->x_ring_rows < 1 ||
                       (from == TD_KEYS_CONTEXT ? !m->dspark.main_proj.data : !m->mtp_hproj.data)))
        return td_errf(err, errlen,
                       "store_kv: rows by position are a DSpark insertion's or MTP's (%d ring "
                       "rows)",
                       io->x_ring_rows);
    struct fwd *f = begin(m, st, p, io, err, errlen);
    if (!f) return -1;
    run_step(f, st->ws, NULL);
    if (world_failed(m, err, errlen)) return -1;
    commit(st, p); // queued: the next forward on this state runs after it
    return 0;
}

static int forward_seqs(const struct td_model *m, struct td_state *st,
                        const struct td_plan_seq *seqs, int n_seq, const struct td_forward_io *io,
                        float *logits, int32_t *topk_trace, char *err, size_t errlen) {
    int n_tok = 0;
    for (int s = 0; s < n_seq; s++)
        n_tok += seqs[s].n_new > 0 ? seqs[s].n_new : 0;
    struct td_plan_dims d =
        td_state_plan_dims(st, meta_bucket(n_tok, 1 << 30), meta_bucket(n_seq, 1 << 30));
    struct td_plan p;
    if (meta_plan_init(&p, &d, err, errlen)) return -1;
    int rc = meta_plan_build(&p, seqs, n_seq, err, errlen);
    if (!rc) rc = td_forward_ex(m, st, &p, io, logits, topk_trace, err, errlen);
    meta_plan_free(&p);
    return rc;
}

int td_forward_seqs(const struct td_model *m, struct td_state *st, const struct td_plan_seq *seqs,
                    int n_seq, float *logits, int32_t *topk_trace, char *err, size_t errlen) {
    return forward_seqs(m, st, seqs, n_seq, NULL, logits, topk_trace, err, errlen);
}

int td_forward_seqs_io(const struct td_model *m, struct td_state *st,
                       const struct td_plan_seq *seqs, int n_seq, const struct td_forward_io *io,
                       float *logits, char *err, size_t errlen) {
    return forward_seqs(m, st, seqs, n_seq, io, logits, NULL, err, errlen);
}

// ---------------------------------------------------------------------------------------------
// a drafter's experts on a rank past 0 (forward.h td_serve)

struct td_serve {
    struct td_model host, dev, view; /* the drafter: loaded, placed (dev.backend: a copy) */
    struct td_split sp;              /* its experts here (serves) */
    const struct td_model *run;      /* view: the placed model with sp */
    const struct td_backend *b;
    int max_rows;
    float *in;      /* [max_rows, dim] normed rows, then [max_rows, k + 1] picks (int32) */
    float *slots;   /* [max_rows, k + 1, dim] */
    void *host_buf; /* a device's sums through the host: the larger of in and slots */
};

void td_serve_free(struct td_serve *s) {
    if (!s) return;
    if (s->in) s->b->release(s->in);
    if (s->slots) s->b->release(s->slots);
    if (s->host_buf) s->b->release_host(s->host_buf);
    td_split_free(&s->sp);
    if (s->dev.backend) td_model_free(&s->dev);
    td_model_free(&s->host);
    free(s);
}

int td_serve_init(struct td_serve **out, struct td_model *host, const struct td_model *target_run,
                  const struct td_backend *b, int max_rows, char *err, size_t errlen) {
    *out = NULL;
    struct td_serve *s = calloc(1, sizeof *s);
    if (!s) {
        td_model_free(host);
        return td_errf(err, errlen, "serve: out of memory");
    }
    s->host = *host; // (taken)
    memset(host, 0, sizeof *host);
    s->b = b;
    s->max_rows = max_rows;
    if (!target_run->split || !target_run->split->comm || target_run->split->comm->rank == 0) {
        td_errf(err, errlen,
                "serve: a drafter's experts are served by a split model's rank past 0");
        goto fail;
    }
    if (td_model_place_drafter(&s->host, &s->dev, &s->sp, &s->view, target_run, b, &s->run, err,
                               errlen))
        goto fail;
    const struct td_config *c = &s->host.cfg;
    size_t N = (size_t)max_rows, K = (size_t)c->n_experts_tok + 1, D = (size_t)c->dim;
    size_t in_bytes = N * (D + K) * sizeof(float), slot_bytes = N * K * D * sizeof(float);
    s->in = b->alloc(in_bytes);
    s->slots = b->alloc(slot_bytes);
    if (!s->sp.data && b->on_device)
        s->host_buf = b->alloc_host(in_bytes > slot_bytes ? in_bytes : slot_bytes);
    if (!s->in || !s->slots || (!s->sp.data && b->on_device && !s->host_buf)) {
        td_errf(err, errlen, "serve: out of %s memory for a drafter's experts over %d rows",
                b->name, max_rows);
        goto fail;
    }
    if (b->reserve) { // the expert kernels' scratch for its widest step
        struct td_reserve rs = {.rows = max_rows,
                                .gemm_in = (int)D,
                                .dim = (int)D,
                                .hc_mult = 1,
                                .moe_k = (int)K,
                                .moe_experts = c->n_experts + 1,
                                .moe_inter = c->moe_inter};
        if (b->reserve(&rs, err, errlen)) goto fail;
    }
    *out = s;
    return 0;
fail:
    td_serve_free(s);
    return -1;
}

const struct td_model *td_serve_model(const struct td_serve *s) {
    return &s->host;
}

size_t td_serve_weight_bytes(const struct td_serve *s) {
    return s && s->dev.backend ? s->dev.placed_bytes : 0;
}

int td_serve_step(struct td_serve *s, int n, char *err, size_t errlen) {
    const struct td_model *m = s->run;
    const struct td_config *c = &m->cfg;
    const struct td_backend *b = s->b;
    if (n < 1 || n > s->max_rows)
        return td_errf(err, errlen, "serve: rank 0's drafter step of %d rows (this rank: 1 .. %d)",
                       n, s->max_rows);
    int D = c->dim, k = c->n_experts_tok;
    for (int li = 0; li < c->n_layers; li++) { // every layer's MoE, in the forward's order
        const struct td_layer *l = &m->layers[li];
        int sh = shared_as_pick(b, l, n, k);
        size_t xb = (size_t)n * D * sizeof(float), pb = (size_t)n * (k + sh) * sizeof(int32_t);
        split_collective(b, &s->sp, s->host_buf, 0, s->in, xb + pb); // rank 0's rows and picks
        own_experts_summed(b, &s->sp, s->host_buf, c, l, li, n, sh, s->in,
                           (const int32_t *)((char *)s->in + xb), s->slots);
    }
    return world_failed(m, err, errlen) ? -1 : 0;
}
