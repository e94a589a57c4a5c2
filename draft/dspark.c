/* dspark.c: the V4 DSpark drafter over the engine's forward (see dspark.h). */
#include "dspark.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/backend.h"
#include "kernels/err.h"
#include "model/fileio.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/split.h"
#include "model/state.h"
#include "metadata/plan.h"

#define W(t) (t).data, (t).dtype

struct draft_dspark {
    struct td_dspark_cfg cfg; /* n_stages: as the files hold */
    const struct td_backend *b;
    struct td_model host;       /* the stages and heads (its own mapped files, or views into
                                   the target's when the checkpoint carries them) */
    struct td_model dev;        /* its device mirror, when b is a device */
    struct td_split sp;         /* a split target's: its experts here (split.h td_split_serve) */
    struct td_model view;       /* then the placed model with sp */
    const struct td_model *run; /* the one the forward reads */
    struct td_state st;
    struct td_plan plan;
    int max_rows, max_seqs, vocab, dim;
    float threshold;
    /* [max(max_rows, max_tok), n_capture * dim]: the target step's captured rows, in the
     * step's row order (the target's scratch) */
    float *capture;
    /* [max_seqs, ring_rows, n_capture * dim]: the same rows by position, as the target keeps
     * its window's keys (td_forward_io.capture_ring); every insertion reads them there */
    float *ring;
    int ring_rows;    /* the target's window ring rows (td_state.swa_ring) */
    char *on;         /* [max_seqs] drafted in the last run: its next step's rows go in at once */
    float *y;         /* [max_tok, dim] hc_head of the stages' output streams */
    float *e, *bias;  /* [max_seqs, rank], [max_seqs, vocab] Markov step */
    int32_t *ids_dev; /* [max_seqs] */
    float *U;         /* host [max_seqs * block, vocab] base logits */
    float *y_host;    /* host [max_seqs * block, dim] */
    float *e_host, *bias_host; /* host [max_seqs, rank], [max_seqs, vocab] */
    float *z;                  /* host [vocab] */
    float *conf_w;             /* host [dim + rank] */
    float *conf_w_dev;         /* [dim + rank] in backend memory */
    /* greedy rounds draft on the backend (kernels/markov.h), the chain the block forward's
     * tail: mk = n_drafts [mk_seqs] | tok | conf [mk_seqs * block each], mk_seqs the blocks
     * of the widest bucket; mk_host its host mirror */
    struct td_forward_tail tail;
    int mk_seqs;
    int32_t *mk, *mk_host;
    int32_t *zeros;           /* [max_rows] token ids of insertion rows (never read) */
    int32_t *blk_ids;         /* [max_seqs * block] */
    int32_t *ids_host;        /* [max_seqs] */
    int *live, *act;          /* [max_seqs] */
    struct td_plan_seq *seqs; /* [max_seqs] */
    int *pre_end;             /* [max_seqs] per slot, the length draft_dspark_insert_step left
                                 (0: none since the last run, which may commit only those) */
    const int32_t *chain;     /* forced Markov chain (tests), or NULL */
    int n_round;              /* sequences in the last round's block forward */
    int defer;                /* greedy rounds leave their drafts in backend memory */
    int pending;              /* the last round's drafts are still only there */
};

static void markov_tail(void *ctx, const struct rows_view *rows);

/* the insertion's pass: keys from the target's captured rows, read by position (one
 * description for the graphs made at start-up and every call, which must match) */
static struct td_forward_io insert_io(const struct draft_dspark *d) {
    return (struct td_forward_io){
        .keys_only = TD_KEYS_CONTEXT, .x_ring = d->ring, .x_ring_rows = d->ring_rows};
}

// ---------------------------------------------------------------------------------------------
// config

int dspark_config_load(struct td_dspark_cfg *c, const char *dir, const struct td_model *target,
                       char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    if (!dir) { // the checkpoint's own head: its config.json's keys (td_config_load checked them)
        *c = target->cfg.dspark;
        if (!c->present)
            return td_errf(err, errlen,
                           "dspark: %s, but its config.json has no dspark_* keys "
                           "(dspark_block_size, dspark_noise_token_id, dspark_markov_rank, "
                           "dspark_target_layer_ids)",
                           st_set_find(&target->st, "mtp.0.main_proj.weight")
                               ? "the checkpoint stores a DSpark head (mtp.0.main_proj.weight)"
                               : "the checkpoint carries no DSpark head (and none was given "
                                 "in a folder of its own)");
        return 0;
    }
    char path[TD_PATH_MAX], msg[768];
    if (td_path_join(path, sizeof path, dir, "config.json", err, errlen)) return -1;
    if (td_config_dspark_load(c, path, &target->cfg, msg, sizeof msg))
        return td_errf(err, errlen, "dspark: the drafter's config: %s", msg);
    return 0;
}

// ---------------------------------------------------------------------------------------------
// life cycle

/* the drafter's config and stages (dir: its folder, or NULL: the target's own files) */
static int load(struct td_dspark_cfg *cfg, struct td_model *host, const char *dir,
                const struct td_model *target_host, char *err, size_t errlen) {
    return dspark_config_load(cfg, dir, target_host, err, errlen) ||
                   td_model_load_dspark(target_host, dir, cfg->n_stages, cfg->n_capture, cfg->rank,
                                        host, err, errlen)
               ? -1
               : 0;
}

int draft_dspark_serve(struct td_serve **out, const char *dir, const struct td_model *target_host,
                       const struct td_model *target_run, const struct td_backend *b, int max_rows,
                       char *err, size_t errlen) {
    struct td_dspark_cfg cfg;
    struct td_model host;
    if (load(&cfg, &host, dir, target_host, err, errlen)) return -1;
    return td_serve_init(out, &host, target_run, b, max_rows, err, errlen);
}

int draft_dspark_init(struct draft_dspark **out, const char *dir,
                      const struct td_model *target_host, const struct td_model *target_run,
                      const struct td_backend *b, int max_seqs, int max_ctx, int max_rows,
                      int stream_ring, float threshold, int use_graphs, size_t max_bytes,
                      enum td_kv_dtype kv, char *err, size_t errlen) {
    *out = NULL;
    struct draft_dspark *d = calloc(1, sizeof *d);
    if (!d) return td_errf(err, errlen, "dspark: out of memory");
    d->b = b;
    if (load(&d->cfg, &d->host, dir, target_host, err, errlen)) {
        free(d);
        return -1;
    }
    d->cfg.n_stages = d->host.cfg.n_layers;
    const struct td_dspark_cfg *dc = &d->cfg;
    if (td_model_place_drafter(&d->host, &d->dev, &d->sp, &d->view, target_run, b, &d->run, err,
                               errlen))
        goto fail;
    const struct td_config *c = &d->host.cfg;
    d->max_rows = max_rows;
    d->max_seqs = max_seqs;
    d->vocab = c->vocab;
    d->dim = c->dim;
    d->threshold = threshold;
    // rings of window + max(16, block) rows; the block's positions run past the committed
    // length, so the state allows max_ctx + block
    int chunk = dc->block > 16 ? dc->block : 16;
    if (max_ctx > INT_MAX - dc->block) {
        td_errf(err, errlen, "dspark: a context of %d tokens plus a block of %d passes %d", max_ctx,
                dc->block, INT_MAX);
        goto fail;
    }
    if (td_state_init_kv(&d->st, c, max_seqs, max_ctx + dc->block, chunk, max_bytes, b, kv, err,
                         errlen))
        goto fail;
    d->st.use_graphs = use_graphs;
    d->st.max_block = dc->block;
    // A sequence that drafts nothing is not inserted: it falls behind, and when it drafts again
    // only the rows its stages' window reaches from the committed end are inserted, from the
    // target's captured rows kept by position (its window ring's rows). A key is a function of
    // its row's captured streams and its position alone, and the stages attend within their
    // window only, so this is bit for bit an insertion of every row at every step.
    d->ring_rows = stream_ring;
    if (d->st.window > stream_ring) {
        td_errf(err, errlen,
                "dspark: the stages' window of %d positions is longer than the target's ring of "
                "%d (the captured rows kept by position)",
                d->st.window, stream_ring);
        goto fail;
    }
    int blk_rows = max_seqs * dc->block;
    int max_tok = max_rows > blk_rows ? max_rows : blk_rows;
    // every insertion and block forward replays a graph, however many sequences it holds: a
    // block of 22 or more sequences (past 128 rows) ran eagerly, and under the adaptive policy
    // at batch 64 (a few sequences drafting, a new row count each round, each one new cuBLASLt
    // plans) took 5.9 ms a round against 1.1 at every sequence (TD_TIMELINE, tandem-tiny)
    d->st.graph_rows = max_tok;
    struct td_plan_dims pd = td_state_plan_dims(&d->st, max_tok, max_seqs);
    if (meta_plan_init(&d->plan, &pd, err, errlen)) goto fail;
    size_t F = sizeof(float), R = (size_t)max_rows, CW = (size_t)dc->n_capture * d->dim;
    size_t BR = (size_t)blk_rows, S = (size_t)max_seqs, V = (size_t)d->vocab;
    // the target's graphs write every row of their bucket, so capture has the widest too
    d->capture = b->alloc((R > (size_t)pd.max_tok ? R : (size_t)pd.max_tok) * CW * F);
    size_t ring_bytes = S * (size_t)stream_ring * CW * F;
    if (!(d->ring = b->alloc(ring_bytes))) {
        td_errf(err, errlen,
                "dspark: out of memory for the target's captured rows by position (%d slots x %d "
                "rows x %zu floats, %.1f MiB)",
                max_seqs, stream_ring, CW, (double)ring_bytes / (1 << 20));
        goto fail;
    }
    // the block forward writes hc_head's rows for every row of its padded bucket (a graph of
    // n_tok_pad rows), so they are sized by the plan's widest bucket, not the live rows
    d->y = b->alloc((size_t)pd.max_tok * d->dim * F);
    d->e = b->alloc(S * dc->rank * F);
    d->bias = b->alloc(S * V * F);
    d->ids_dev = b->alloc(S * sizeof(int32_t));
    d->U = malloc(BR * V * F);
    d->y_host = malloc(BR * d->dim * F);
    d->e_host = malloc(S * dc->rank * F);
    d->bias_host = malloc(S * V * F);
    d->z = malloc(V * F);
    d->conf_w = malloc(((size_t)d->dim + dc->rank) * F);
    d->zeros = calloc(R, sizeof(int32_t));
    d->blk_ids = malloc(BR * sizeof(int32_t));
    d->ids_host = malloc(S * sizeof(int32_t));
    d->live = malloc(S * sizeof(int));
    d->act = malloc(S * sizeof(int));
    d->seqs = calloc(S, sizeof *d->seqs);
    d->pre_end = calloc(S, sizeof *d->pre_end);
    d->on = calloc(S, 1);
    if (!d->on || !d->capture || !d->y || !d->e || !d->bias || !d->ids_dev || !d->U || !d->y_host ||
        !d->e_host || !d->bias_host || !d->z || !d->conf_w || !d->zeros || !d->blk_ids ||
        !d->ids_host || !d->live || !d->act || !d->seqs || !d->pre_end) {
        td_errf(err, errlen, "dspark: out of memory for %d-row buffers", max_tok);
        goto fail;
    }
    for (int i = 0; i < d->dim + dc->rank; i++)
        d->conf_w[i] = td_tensor_getf(&d->host.dspark.confidence, i);
    d->mk_seqs = max_tok / dc->block + 1; // the blocks of the widest bucket, pads included
    size_t mk_words = (size_t)d->mk_seqs * (1 + 2 * (size_t)dc->block);
    d->conf_w_dev = b->alloc(((size_t)d->dim + dc->rank) * F);
    d->mk = b->alloc(mk_words * sizeof(int32_t));
    d->mk_host = b->alloc_host(mk_words * sizeof(int32_t)); // queued copies land here
    if (!d->conf_w_dev || !d->mk || !d->mk_host) {
        td_errf(err, errlen, "dspark: out of memory for the Markov chain's buffers");
        goto fail;
    }
    b->to_device(d->conf_w_dev, d->conf_w, ((size_t)d->dim + dc->rank) * F);
    memset(d->mk_host, 0, mk_words * sizeof(int32_t)); // every tok a valid id, drafted or not
    b->to_device(d->mk, d->mk_host, mk_words * sizeof(int32_t));
    // the graphs, made now: the insertion's of 1 to max_rows rows, the block forward's of a
    // block of g rows per drafting sequence
    d->tail = (struct td_forward_tail){.run = markov_tail, .ctx = d};
    struct markov_args setup = {.w1_dtype = d->run->dspark.markov_w1.dtype,
                                .w2_dtype = d->run->dspark.markov_w2.dtype,
                                .w2 = d->run->dspark.markov_w2.data,
                                .g = dc->block,
                                .V = d->vocab,
                                .r = dc->rank};
    b->ops.markov_greedy(&setup); // n = 0: the launch settings, before any capture
    struct td_forward_io ins = insert_io(d);
    struct td_forward_io io = {.hc_out = d->y}, io_greedy = {.hc_out = d->y, .tail = &d->tail};
    if (td_forward_prepare(d->run, &d->st, &pd, &ins, 1, max_rows, err, errlen) ||
        td_forward_prepare(d->run, &d->st, &pd, &io_greedy, dc->block, blk_rows, err, errlen) ||
        td_forward_prepare(d->run, &d->st, &pd, &io, dc->block, blk_rows, err, errlen))
        goto fail;
    *out = d;
    return 0;
fail:
    draft_dspark_free(d);
    return -1;
}

void draft_dspark_free(struct draft_dspark *d) {
    if (!d) return;
    void *bufs[] = {d->capture, d->ring, d->y, d->e, d->bias, d->ids_dev, d->conf_w_dev, d->mk};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i]) d->b->release(bufs[i]);
    free(d->U);
    free(d->y_host);
    free(d->e_host);
    free(d->bias_host);
    free(d->z);
    free(d->conf_w);
    if (d->mk_host) d->b->release_host(d->mk_host);
    free(d->zeros);
    free(d->blk_ids);
    free(d->ids_host);
    free(d->live);
    free(d->act);
    free(d->seqs);
    free(d->pre_end);
    free(d->on);
    meta_plan_free(&d->plan);
    td_state_free(&d->st);
    td_split_free(&d->sp);
    if (d->dev.backend) td_model_free(&d->dev);
    td_model_free(&d->host);
    free(d);
}

const struct td_dspark_cfg *draft_dspark_config(const struct draft_dspark *d) {
    return &d->cfg;
}

float *draft_dspark_capture(struct draft_dspark *d) {
    return d->capture;
}

float *draft_dspark_ring(struct draft_dspark *d, int *ring_rows) {
    *ring_rows = d->ring_rows;
    return d->ring;
}

const int *draft_dspark_capture_layers(const struct draft_dspark *d, int *n) {
    *n = d->cfg.n_capture;
    return d->cfg.capture;
}

const struct td_state *draft_dspark_state(const struct draft_dspark *d) {
    return &d->st;
}

const float *draft_dspark_base_logits(struct draft_dspark *d) {
    const float *u = td_forward_logits(&d->st); // the block forward's (an insertion makes none)
    if (u && d->n_round)
        d->b->to_host(d->U, u, (size_t)d->n_round * d->cfg.block * d->vocab * sizeof(float));
    return d->U;
}

void draft_dspark_force_chain(struct draft_dspark *d, const int32_t *chain) {
    d->chain = chain;
}

// ---------------------------------------------------------------------------------------------
// a call

/* the round's first row: the token after the last committed row */
static int32_t anchor_of(const struct td_draft_seq *q) {
    return q->next[q->n - 1];
}

/* a sequence at pos0: a new one (pos0 0) takes its slot; a drafter ahead of the target is
 * an engine error */
static int seq_at(struct draft_dspark *d, int slot, int pos0, char *err, size_t errlen) {
    if (pos0 == 0) {
        d->st.in_use[slot] = 1;
        d->st.len[slot] = d->st.hi[slot] = 0;
        d->on[slot] = 0;
    }
    if (d->st.len[slot] > pos0)
        return td_errf(err, errlen, "dspark: slot %d holds %d rows, the target committed %d", slot,
                       d->st.len[slot], pos0);
    return 0;
}

/* the rows d->seqs[0 .. m) into the stages' rings, from the target's captured rows by position */
static int insert_rows(struct draft_dspark *d, int m, char *err, size_t errlen) {
    struct td_forward_io io = insert_io(d);
    if (meta_plan_build(&d->plan, d->seqs, m, err, errlen) ||
        td_forward_store_kv(d->run, &d->st, &d->plan, &io, err, errlen))
        return -1;
    if (d->b->mark) d->b->mark("insert");
    return 0;
}

int draft_dspark_insert_step(struct draft_dspark *d, const struct td_plan *p, char *err,
                             size_t errlen) {
    memset(d->pre_end, 0, (size_t)d->max_seqs * sizeof *d->pre_end);
    int m = 0;
    for (int s = 0; s < p->n_seq; s++) {
        int slot = p->slot[s], pos0 = p->len_before[s], n = p->qo_indptr[s + 1] - p->qo_indptr[s];
        if (seq_at(d, slot, pos0, err, errlen)) return -1;
        if (!d->on[slot] || d->st.len[slot] != pos0) continue; // caught up when it drafts
        if (n > d->max_rows)
            return td_errf(err, errlen, "dspark: %d rows to insert, capacity %d", n, d->max_rows);
        d->seqs[m++] = (struct td_plan_seq){
            .slot = slot, .len_before = pos0, .n_new = n, .ids = d->zeros, .skip_logits = n};
        d->pre_end[slot] = pos0 + n;
    }
    return m ? insert_rows(d, m, err, errlen) : 0;
}

/* every sequence's committed rows: one its step inserted (draft_dspark_insert_step) with the
 * rows its verify then rejected moves its length back to the committed one; one it did not
 * insert stays behind (at most at its committed length) */
static int commit(struct draft_dspark *d, const struct td_draft_seq *seqs, int n_seq, char *err,
                  size_t errlen) {
    for (int s = 0; s < n_seq; s++) {
        const struct td_draft_seq *q = &seqs[s];
        int end = q->pos0 + q->n, pre = d->pre_end[q->slot];
        if (!pre && seq_at(d, q->slot, q->pos0, err, errlen)) return -1;
        if (pre && (pre < end || d->st.len[q->slot] != pre))
            return td_errf(err, errlen,
                           "dspark: slot %d holds %d rows, %d from its step's insertion; the round "
                           "commits %d",
                           q->slot, d->st.len[q->slot], pre, end);
        if (pre && td_state_rollback(&d->st, q->slot, end, err, errlen)) return -1;
        d->on[q->slot] = 0;
    }
    memset(d->pre_end, 0, (size_t)d->max_seqs * sizeof *d->pre_end);
    return 0;
}

/* the drafting sequences seqs[live[0 .. nb)] that fell behind, caught up: the rows their
 * stages' window reaches from the committed end (the length jumps over the rest, which no block
 * reads: td_state_advance), in calls of up to max_rows rows */
static int catch_up(struct draft_dspark *d, struct td_draft_seq *seqs, int nb, char *err,
                    size_t errlen) {
    for (int i = 0; i < nb; i++) {
        struct td_draft_seq *q = &seqs[d->live[i]];
        int end = q->pos0 + q->n, from = end - d->st.window;
        q->caught = draft_rows_behind(&d->st, q->slot, end);
        if (from > d->st.len[q->slot] && td_state_advance(&d->st, q->slot, from, err, errlen))
            return -1;
    }
    for (;;) {
        int rows = 0, m = 0;
        for (int i = 0; i < nb && rows < d->max_rows; i++) {
            const struct td_draft_seq *q = &seqs[d->live[i]];
            int len = d->st.len[q->slot], take = q->pos0 + q->n - len;
            if (take > d->max_rows - rows) take = d->max_rows - rows;
            if (take <= 0) continue;
            d->seqs[m++] = (struct td_plan_seq){.slot = q->slot,
                                                .len_before = len,
                                                .n_new = take,
                                                .ids = d->zeros,
                                                .skip_logits = take};
            rows += take;
        }
        if (!m) return 0;
        if (insert_rows(d, m, err, errlen)) return -1;
    }
}

static int chain_results(struct draft_dspark *d, struct td_draft_seq *seqs, int nb, char *err,
                         size_t errlen);

static float sigmoid(double z) {
    return (float)(1.0 / (1.0 + exp(-z)));
}

/* the Markov chain of a greedy round on the backend (kernels/markov.h), queued as the block
 * forward's tail (in its graph): over that pass's logits, hc_head rows and plan rows (the
 * anchors are the blocks' first ids), every sequence of the bucket, pad blocks drafting
 * nothing. q is one-hot at each draft and not written. */
static void markov_tail(void *ctx, const struct rows_view *rows) {
    struct draft_dspark *d = ctx;
    const struct td_model *m = d->run;
    size_t S = (size_t)d->mk_seqs;
    int g = d->cfg.block;
    int32_t *nd = d->mk, *tok = nd + S;
    struct markov_args a = {.U = td_forward_logits(&d->st),
                            .y = d->y,
                            .w1 = m->dspark.markov_w1.data,
                            .w2 = m->dspark.markov_w2.data,
                            .w1_dtype = m->dspark.markov_w1.dtype,
                            .w2_dtype = m->dspark.markov_w2.dtype,
                            .conf_w = d->conf_w_dev,
                            .threshold = d->threshold,
                            .n = rows->n_tok / g,
                            .g = g,
                            .V = d->vocab,
                            .D = d->dim,
                            .r = d->cfg.rank,
                            .ids = rows->input_ids,
                            .row_seq = rows->row_seq,
                            .tok = tok,
                            .conf = (float *)(tok + S * g),
                            .n_drafts = nd};
    d->b->ops.markov_greedy(&a);
}

/* after a greedy round's block forward (and chain): the results come to the host behind it.
 * Deferred, collecting them after the verify step waits for nothing more */
static int greedy_chain(struct draft_dspark *d, struct td_draft_seq *seqs, int nb, char *err,
                        size_t errlen) {
    const struct td_backend *b = d->b;
    size_t S = (size_t)d->mk_seqs;
    int g = d->cfg.block;
    int32_t *nd = d->mk, *tok = nd + S;
    b->to_host_queued(d->mk_host, nd, (S + 2 * S * g) * sizeof(int32_t)); // n_drafts|tok|conf
    if (!d->defer) return chain_results(d, seqs, nb, err, errlen);
    for (int i = 0; i < nb; i++) { // the drafts stay where the next verify step reads them
        struct td_draft_seq *q = &seqs[d->live[i]];
        q->dev_drafts = tok + (size_t)i * g;
        q->n_drafts = q->k;
    }
    d->pending = 1;
    return 0;
}

int draft_dspark_collect(struct draft_dspark *d, struct td_draft_seq *seqs, char *err,
                         size_t errlen) {
    if (!d->pending) return 0;
    d->pending = 0;
    return chain_results(d, seqs, d->n_round, err, errlen);
}

void draft_dspark_defer(struct draft_dspark *d, int on) {
    d->defer = on;
}

/* a greedy round's drafts, counts and confidences, once the queued copy has landed (waits for
 * the round; at once after a step) */
static int chain_results(struct draft_dspark *d, struct td_draft_seq *seqs, int nb, char *err,
                         size_t errlen) {
    size_t S = (size_t)d->mk_seqs;
    int g = d->cfg.block;
    int32_t *h = d->mk_host;
    if (d->b->wait_queued(err, errlen)) return -1;
    const int32_t *h_nd = h, *h_tok = h_nd + S;
    const float *h_conf = (const float *)(h_tok + S * g);
    for (int i = 0; i < nb; i++) { // the chain drafts all g slots: the sequence keeps its k
        struct td_draft_seq *q = &seqs[d->live[i]];
        q->n_drafts = h_nd[i] < q->k ? h_nd[i] : q->k;
        memcpy(q->drafts, h_tok + (size_t)i * g, (size_t)q->n_drafts * sizeof(int32_t));
        for (int j = 0; q->conf && j <= q->n_drafts && j < q->k; j++) // every slot scored
            q->conf[j] = h_conf[(size_t)i * g + j];
    }
    return 0;
}

int draft_dspark_run(struct draft_dspark *d, struct td_draft_seq *seqs, int n_seq, char *err,
                     size_t errlen) {
    const struct td_backend *b = d->b;
    const struct td_model *m = d->run;
    int g = d->cfg.block, r = d->cfg.rank, V = d->vocab, D = d->dim;
    if (!n_seq) return 0;
    if (d->pending)
        return td_errf(err, errlen,
                       "dspark: a round before the last round's drafts were collected");
    for (int s = 0; s < n_seq; s++)
        seqs[s].n_drafts = seqs[s].caught = 0, seqs[s].dev_drafts = NULL;
    // the sequences that draft, and whether the round is greedy (drafted on the backend;
    // sampled rounds draft on the host)
    int nb = 0;
    for (int s = 0; s < n_seq; s++)
        if (seqs[s].k >= 1) d->live[nb++] = s;
    d->n_round = nb;
    int greedy = nb && !d->chain;
    for (int i = 0; i < nb && greedy; i++)
        greedy = seqs[d->live[i]].sampling->temperature <= 0.0f;
    if (b->mark) b->mark("draft");
    if (commit(d, seqs, n_seq, err, errlen)) return -1;
    if (!nb) return 0; // nothing drafts: nothing is inserted (the sequences fall behind)
    if (catch_up(d, seqs, nb, err, errlen)) return -1;
    for (int i = 0; i < nb; i++) // their next step's rows go in as it is queued
        d->on[seqs[d->live[i]].slot] = 1;
    // the block forward of every sequence that drafts: [anchor, noise...] after its context
    for (int i = 0; i < nb; i++) {
        const struct td_draft_seq *q = &seqs[d->live[i]];
        int32_t *ids = d->blk_ids + (size_t)i * g;
        ids[0] = anchor_of(q);
        for (int j = 1; j < g; j++)
            ids[j] = d->cfg.noise;
        d->seqs[i] = (struct td_plan_seq){.slot = q->slot,
                                          .len_before = q->pos0 + q->n,
                                          .n_new = g,
                                          .ids = ids,
                                          .skip_logits = 0,
                                          .block = 1};
    }
    struct td_forward_io io = {.hc_out = d->y}; // the Markov and confidence heads' rows
    if (greedy) io.tail = &d->tail;
    if (meta_plan_build(&d->plan, d->seqs, nb, err, errlen) ||
        td_forward_ex(m, &d->st, &d->plan, &io, greedy ? NULL : d->U, NULL, err, errlen))
        return -1;
    if (b->mark) b->mark("block");
    if (greedy) return greedy_chain(d, seqs, nb, err, errlen);
    b->to_host(d->y_host, d->y, (size_t)nb * g * D * sizeof(float));
    // the Markov chain, slot by slot, over every sequence still drafting
    for (int j = 0; j < g; j++) {
        int na = 0;
        for (int i = 0; i < nb; i++) {
            struct td_draft_seq *q = &seqs[d->live[i]];
            if (j >= q->k || q->n_drafts != j) continue; // done, cut, or a non-finite row
            d->ids_host[na] = j ? q->drafts[j - 1] : anchor_of(q);
            d->act[na++] = i;
        }
        if (!na) break;
        b->to_device(d->ids_dev, d->ids_host, (size_t)na * sizeof(int32_t));
        b->ops.embed(d->e, d->ids_dev, W(m->dspark.markov_w1), na, 1, r);
        b->ops.matmul(d->bias, d->e, W(m->dspark.markov_w2), na, r, V, NULL, 0);
        b->to_host(d->bias_host, d->bias, (size_t)na * V * sizeof(float));
        b->to_host(d->e_host, d->e, (size_t)na * r * sizeof(float));
        if (b->finish(err, errlen)) return -1;
        for (int a = 0; a < na; a++) {
            int i = d->act[a], row = i * g + j;
            struct td_draft_seq *q = &seqs[d->live[i]];
            const float *y = d->y_host + (size_t)row * D, *e = d->e_host + (size_t)a * r;
            double dot = 0.0;
            for (int t = 0; t < D; t++)
                dot += (double)d->conf_w[t] * y[t];
            for (int t = 0; t < r; t++)
                dot += (double)d->conf_w[D + t] * e[t];
            float conf = sigmoid(dot);
            if (q->conf) q->conf[j] = conf;
            if (d->threshold > 0.0f && conf < d->threshold) continue; // the cut: before drawing
            const float *u = d->U + (size_t)row * V, *bias = d->bias_host + (size_t)a * V;
            int32_t t;
            for (int v = 0; v < V; v++)
                d->z[v] = u[v] + bias[v];
            float *qj = q->q + (size_t)j * V;
            if (td_probs(qj, d->z, V, q->sampling)) continue; // non-finite: no more drafts
            long pos = (long)q->pos0 + q->n + j + 1;          // the position of the token drafted
            t = d->chain
                    ? d->chain[row]
                    : td_sample(qj, V,
                                td_rand_uniform(q->sampling->seed, (uint64_t)pos, TD_RAND_DRAFT));
            q->drafts[j] = t;
            q->n_drafts = j + 1;
        }
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------
// the engine's table

static void dspark_target_io(void *impl, struct td_forward_io *io) {
    struct draft_dspark *d = impl;
    io->capture = d->capture;
    io->capture_ring = d->ring;
    io->capture_layers = draft_dspark_capture_layers(d, &io->n_capture);
}
static int dspark_insert_step(void *impl, const struct td_plan *p, char *err, size_t errlen) {
    return draft_dspark_insert_step(impl, p, err, errlen);
}
static int dspark_run(void *impl, struct td_draft_seq *seqs, int n, char *err, size_t errlen) {
    return draft_dspark_run(impl, seqs, n, err, errlen);
}
static int dspark_collect(void *impl, struct td_draft_seq *seqs, char *err, size_t errlen) {
    return draft_dspark_collect(impl, seqs, err, errlen);
}
static const struct td_state *dspark_state(const void *impl) {
    return draft_dspark_state(impl);
}
static void dspark_free(void *impl) {
    draft_dspark_free(impl);
}

static void dspark_begin(void *impl, int slot, int len) {
    struct draft_dspark *d = impl;
    d->st.in_use[slot] = 1;
    d->st.len[slot] = d->st.hi[slot] = len;
    d->on[slot] = 0;
}

static const struct td_model *dspark_loaded(const void *impl) {
    return &((const struct draft_dspark *)impl)->host;
}

static size_t dspark_weight_bytes(const void *impl) {
    const struct draft_dspark *d = impl;
    return d->dev.backend ? d->dev.placed_bytes : 0;
}

struct td_model_drafter draft_dspark_model(struct draft_dspark *d) {
    return (struct td_model_drafter){.impl = d,
                                     .target_io = dspark_target_io,
                                     .insert_step = dspark_insert_step,
                                     .run = dspark_run,
                                     .collect = dspark_collect,
                                     .begin = dspark_begin,
                                     .state = dspark_state,
                                     .weight_bytes = dspark_weight_bytes,
                                     .model = dspark_loaded,
                                     .free = dspark_free};
}
