/* mtp.c: the V4 MTP drafter over the engine's forward (see mtp.h). */
#include "mtp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/err.h"
#include "model/backend.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/split.h"
#include "model/state.h"
#include "metadata/plan.h"

#define W(t) (t).data, (t).dtype

struct draft_mtp {
    const struct td_backend *b;
    struct td_model host;       /* mtp.0.* views (host) */
    struct td_model dev;        /* its device mirror, when b is a device */
    struct td_split sp;         /* a split target's: its experts here (split.h td_split_serve) */
    struct td_model view;       /* then the placed model with sp */
    const struct td_model *run; /* the one the forward reads */
    struct td_state st;
    struct td_plan plan;
    int max_rows, max_k, vocab, nc, dim;
    float *hidden;            /* [max_seqs, ring, nc, dim] the target's streams by position
                                 (its window ring's rows: td_forward_io.hidden_by_position) */
    int ring;                 /* the target's window ring rows (td_state.swa_ring) */
    int window;               /* the positions the MTP layer's attention reaches back */
    float *h_in, *h_out;      /* [max_rows, nc, dim] */
    int32_t *src, *src_dev;   /* [max_rows] rows to gather (gather_streams), host and backend */
    float *logits;            /* [max_rows, vocab] host */
    float *p;                 /* [vocab] host scratch */
    int32_t *ids;             /* [max_rows] host */
    struct td_plan_seq *seqs; /* [max_seqs] */
    int *live, *keep;         /* [max_seqs] */
    int *ord;                 /* [max_seqs] the catch-up plan's sequence order */
    int *from;                /* [max_seqs] where each one's forward rows start */
    int all_logits;           /* catch-up returns every row's logits (tests) */
    int max_seqs;
    /* deferred greedy rounds: chain = n_drafts [max_seqs] | tok [max_seqs * max_k] | next
     * [max_seqs] in backend memory, chain_host its mirror */
    int32_t *chain, *chain_host;
    int defer, pending, n_round;
};

/* MTP's passes, each with its own graphs: a round's first pass (its input from the target's
 * streams, by position), a chain step's (from the last pass's, in h_in), a catch-up's (keys
 * only, from the target's streams) */
enum mtp_pass { MTP_FIRST, MTP_CHAIN, MTP_KEYS };

/* a pass's buffers: one description for the graphs made at start-up and every call, which
 * must match */
static struct td_forward_io pass_io(const struct draft_mtp *d, enum mtp_pass pass) {
    if (pass == MTP_CHAIN) return (struct td_forward_io){.x_in = d->h_in, .hidden_out = d->h_out};
    struct td_forward_io io = {.x_ring = d->hidden, .x_ring_rows = d->ring};
    if (pass == MTP_KEYS)
        io.keys_only = TD_KEYS_STREAMS;
    else
        io.hidden_out = d->h_out;
    return io;
}

int draft_mtp_init(struct draft_mtp **out, const struct td_model *target_host,
                   const struct td_model *target_run, const struct td_backend *b, int max_seqs,
                   int max_ctx, int max_rows, int max_k, int stream_ring, int use_graphs,
                   size_t max_bytes, enum td_kv_dtype kv, char *err, size_t errlen) {
    *out = NULL;
    struct draft_mtp *d = calloc(1, sizeof *d);
    if (!d) return td_errf(err, errlen, "mtp: out of memory");
    d->b = b;
    if (td_model_load_mtp(target_host, &d->host, err, errlen)) {
        free(d);
        return -1;
    }
    if (td_model_place_drafter(&d->host, &d->dev, &d->sp, &d->view, target_run, b, &d->run, err,
                               errlen))
        goto fail;
    const struct td_config *c = &d->host.cfg;
    d->max_rows = max_rows;
    d->max_k = max_k;
    d->max_seqs = max_seqs;
    d->vocab = c->vocab;
    d->nc = c->hc_mult;
    d->dim = c->dim;
    int chunk = max_k > 16 ? max_k : 16; // the chain's rows are what gets rolled back
    if (td_state_init_kv(&d->st, c, max_seqs, max_ctx, chunk, max_bytes, b, kv, err, errlen))
        goto fail;
    d->st.use_graphs = use_graphs;
    d->st.graph_rows = max_rows; // every catch-up and chain step replays a graph (dspark.c)
    struct td_plan_dims pd = td_state_plan_dims(&d->st, max_rows, max_seqs);
    if (meta_plan_init(&d->plan, &pd, err, errlen)) goto fail;
    size_t R = (size_t)max_rows, S = R * d->nc * d->dim * sizeof(float);
    // A sequence that drafts nothing is not caught up: its MTP rows fall behind, and when it
    // drafts again only the rows the layer's window reaches from its last row are made, from
    // the target's streams kept by position (the last swa_ring of every sequence). A row's key
    // is a function of its stream and the token after it alone, and the MTP layer attends
    // within its window only (no compressed entries), so this is bit for bit a catch-up of
    // every row at every step (test_mtp lazy_catchup_same_bits).
    d->ring = stream_ring;
    d->window = c->sliding_window < max_ctx ? c->sliding_window : max_ctx;
    if (d->window > stream_ring) { // (its loader refuses any but a sliding-window layer)
        td_errf(err, errlen,
                "mtp: the layer's window of %d positions is longer than the target's ring of %d "
                "(the streams kept by position)",
                d->window, stream_ring);
        goto fail;
    }
    size_t ring_bytes = (size_t)max_seqs * stream_ring * d->nc * d->dim * sizeof(float);
    if (!(d->hidden = b->alloc(ring_bytes))) {
        td_errf(err, errlen,
                "mtp: out of memory for the target's streams by position (%d slots x %d rows x "
                "%d x %d floats, %.1f MiB)",
                max_seqs, stream_ring, d->nc, d->dim, (double)ring_bytes / (1 << 20));
        goto fail;
    }
    d->h_in = b->alloc(S);
    d->h_out = b->alloc(S);
    d->src_dev = b->alloc(R * sizeof(int32_t));
    d->src = malloc(R * sizeof(int32_t));
    d->logits = malloc(R * d->vocab * sizeof(float));
    d->p = malloc((size_t)d->vocab * sizeof(float));
    d->ids = malloc(R * sizeof(int32_t));
    d->seqs = calloc((size_t)max_seqs, sizeof *d->seqs);
    d->live = malloc((size_t)max_seqs * sizeof(int));
    d->keep = malloc((size_t)max_seqs * sizeof(int));
    d->ord = malloc((size_t)max_seqs * sizeof(int));
    d->from = malloc((size_t)max_seqs * sizeof(int));
    size_t chain_words = (size_t)max_seqs * (2 + (max_k > 0 ? max_k : 1));
    d->chain = b->alloc(chain_words * sizeof(int32_t));
    d->chain_host = b->alloc_host(chain_words * sizeof(int32_t)); // queued copies land here
    if (!d->chain || !d->chain_host) {
        td_errf(err, errlen, "mtp: out of memory for the chain's buffers");
        goto fail;
    }
    if (!d->hidden || !d->h_in || !d->h_out || !d->src_dev || !d->src || !d->logits || !d->p ||
        !d->ids || !d->seqs || !d->live || !d->keep || !d->ord || !d->from) {
        td_errf(err, errlen, "mtp: out of memory for %d-row buffers", max_rows);
        goto fail;
    }
    for (int pass = MTP_FIRST; pass <= MTP_KEYS; pass++) {
        struct td_forward_io io = pass_io(d, (enum mtp_pass)pass);
        if (td_forward_prepare(d->run, &d->st, &pd, &io, 1, max_rows, err, errlen)) goto fail;
    }
    *out = d;
    return 0;
fail:
    draft_mtp_free(d);
    return -1;
}

int draft_mtp_serve(struct td_serve **out, const struct td_model *target_host,
                    const struct td_model *target_run, const struct td_backend *b, int max_rows,
                    char *err, size_t errlen) {
    struct td_model host;
    if (td_model_load_mtp(target_host, &host, err, errlen)) return -1;
    return td_serve_init(out, &host, target_run, b, max_rows, err, errlen);
}

void draft_mtp_free(struct draft_mtp *d) {
    if (!d) return;
    const struct td_backend *b = d->b;
    void *bufs[] = {d->hidden, d->h_in, d->h_out, d->src_dev, d->chain};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i]) b->release(bufs[i]);
    if (d->chain_host) b->release_host(d->chain_host);
    free(d->logits);
    free(d->p);
    free(d->ids);
    free(d->src);
    free(d->seqs);
    free(d->live);
    free(d->keep);
    free(d->ord);
    free(d->from);
    meta_plan_free(&d->plan);
    td_state_free(&d->st);
    td_split_free(&d->sp);
    if (d->dev.backend) td_model_free(&d->dev);
    td_model_free(&d->host);
    free(d);
}

const struct td_state *draft_mtp_state(const struct draft_mtp *d) {
    return &d->st;
}

float *draft_mtp_hidden(struct draft_mtp *d) {
    return d->hidden;
}

const float *draft_mtp_logits(const struct draft_mtp *d) {
    return d->logits;
}

/* rows 0 .. n - 1 of to = rows d->src[0 .. n - 1] of from (streams of nc x dim floats), in one
 * gather (the embed op over an fp32 table, exact); to must not overlap from. A copy a row took
 * a launch a sequence: at batch 64 the catch-up of a step in which MTP drafts nothing spent
 * about 300 us of device time around a 670 us target step (TD_TIMELINE, tandem-tiny). */
static void gather_streams(struct draft_mtp *d, float *to, const float *from, int n) {
    if (!n) return;
    d->b->to_device(d->src_dev, d->src, (size_t)n * sizeof(int32_t));
    d->b->ops.embed(to, d->src_dev, from, TD_DTYPE_F32, n, 1, d->nc * d->dim);
}

void draft_mtp_set_all_logits(struct draft_mtp *d, int on) {
    d->all_logits = on;
}

/* The MTP block over the plan already built in d->plan, as pass MTP_FIRST or MTP_CHAIN (the
 * forward makes its input with the plan's ids, in its graph). ids_dev: the plan's n ids in
 * backend memory instead (patched into its device copy). logits NULL: they stay in the
 * backend (td_forward_logits) */
static int mtp_forward(struct draft_mtp *d, int n, enum mtp_pass pass, const int32_t *ids_dev,
                       float *logits, char *err, size_t errlen) {
    struct td_id_patch patch = {.row = 0, .n = n, .src = ids_dev};
    struct td_forward_io io = pass_io(d, pass);
    if (patch.src) io.id_patches = &patch, io.n_id_patches = 1;
    return td_forward_ex(d->run, &d->st, &d->plan, &io, logits, NULL, err, errlen);
}

void draft_mtp_defer(struct draft_mtp *d, int on) {
    d->defer = on;
}

/* A greedy round in which the n drafting sequences seqs[d->ord[0 .. n - 1]], the first n of
 * the catch-up plan, draft k steps (the largest of their k; each keeps its own), on the backend
 * (kernels/greedy.h): each slot is drafted from logits that stay there, and each later step embeds
 * the ids the last one left. Row i of every step is sequence d->ord[i]; its drafts go to tok[i *
 * max_k ..]. Nothing waits (draft_mtp_collect). */
static int device_chain(struct draft_mtp *d, struct td_draft_seq *seqs, int n_seq, int k, char *err,
                        size_t errlen) {
    const struct td_backend *b = d->b;
    size_t S = (size_t)d->max_seqs, K = (size_t)d->max_k;
    size_t row_floats = (size_t)d->nc * d->dim, row_bytes = row_floats * sizeof(float);
    int32_t *nd = d->chain, *tok = nd + S, *next = tok + S * K;
    memset(d->chain_host, 0, (size_t)n_seq * sizeof(int32_t));
    b->to_device(nd, d->chain_host, (size_t)n_seq * sizeof(int32_t));
    // slot 0 from the catch-up's logits (one row per sequence: its last), the streams of each
    // sequence's last row for the next step
    b->ops.greedy_slot(tok, nd, next, td_forward_logits(&d->st), n_seq, d->vocab, (int)K, 0);
    for (int i = 0, r = 0; i < n_seq; r += d->seqs[i].n_new, i++) // (the catch-up plan's)
        d->src[i] = r + d->seqs[i].n_new - 1;
    gather_streams(d, d->h_in, d->h_out, n_seq);
    for (int j = 1; j < k; j++) {
        for (int i = 0; i < n_seq; i++) {
            const struct td_draft_seq *q = &seqs[d->ord[i]];
            d->ids[i] = 0; // a placeholder: the plan's device copy takes next[i]
            d->seqs[i] = (struct td_plan_seq){.slot = q->slot,
                                              .len_before = q->pos0 + q->n + j - 1,
                                              .n_new = 1,
                                              .ids = d->ids + i};
        }
        if (meta_plan_build(&d->plan, d->seqs, n_seq, err, errlen) ||
            mtp_forward(d, n_seq, MTP_CHAIN, next, NULL, err, errlen))
            return -1;
        b->ops.greedy_slot(tok, nd, next, td_forward_logits(&d->st), n_seq, d->vocab, (int)K, j);
        b->ops.copy(d->h_in, d->h_out, (size_t)n_seq * row_bytes);
    }
    for (int i = 0; i < n_seq; i++) { // each its own k (the chain ran to the largest)
        seqs[d->ord[i]].dev_drafts = tok + (size_t)i * K;
        seqs[d->ord[i]].n_drafts = seqs[d->ord[i]].k;
    }
    d->n_round = n_seq;
    // the drafts come to the host behind the chain, so that collecting them after the verify
    // step (which waits for its own queued results, behind these) waits for nothing more
    b->to_host_queued(d->chain_host, d->chain, (S + S * K) * sizeof(int32_t)); // n_drafts | tok
    d->pending = 1;
    return 0;
}

int draft_mtp_collect(struct draft_mtp *d, struct td_draft_seq *seqs, char *err, size_t errlen) {
    if (!d->pending) return 0;
    d->pending = 0;
    size_t S = (size_t)d->max_seqs, K = (size_t)d->max_k;
    if (d->b->wait_queued(err, errlen)) return -1; // the queued copy has landed
    for (int i = 0; i < d->n_round; i++) {         // row i: sequence ord[i] (device_chain)
        struct td_draft_seq *q = &seqs[d->ord[i]];
        q->n_drafts = d->chain_host[i] < q->k ? d->chain_host[i] : q->k;
        memcpy(q->drafts, d->chain_host + S + (size_t)i * K, (size_t)q->n_drafts * sizeof(int32_t));
    }
    return 0;
}

/* draft one token from logits row lg; its distribution into q; -1 when the row is not finite */
static int draw(struct draft_mtp *d, const float *lg, const struct td_sampling *s, long pos,
                float *q) {
    if (td_probs(q, lg, d->vocab, s)) return -1;
    return td_sample(q, d->vocab, td_rand_uniform(s->seed, (uint64_t)pos, TD_RAND_DRAFT));
}

/* The rows of sequences ord[0 .. n) before the ones this call's forward makes (from ..
 * this step's pos0): those a sequence skipped while it drafted nothing, from as far back as the
 * layer's window reaches from the step's last row (the length jumps over the rest, which no
 * later row reads: td_state_advance), keys only, in calls of up to max_rows rows (their
 * streams read by position in the pass's graph). from[i]:
 * where sequence i's forward rows start (its pos0, or later when the step holds more rows than
 * the window: its earlier rows' keys are never read, their streams may be gone from the ring).
 * With every row's logits asked for (tests), nothing is skipped. */
static int catch_up_missed(struct draft_mtp *d, struct td_draft_seq *seqs, const int *ord, int n,
                           int *from, char *err, size_t errlen) {
    for (int i = 0; i < n; i++) {
        const struct td_draft_seq *q = &seqs[ord[i]];
        int len = d->st.len[q->slot], f = q->pos0 + q->n - d->window;
        if (!q->toks) return td_errf(err, errlen, "mtp: slot %d's call brings no tokens", q->slot);
        if (len > q->pos0)
            return td_errf(err, errlen, "mtp: slot %d holds %d rows, the target committed %d",
                           q->slot, len, q->pos0);
        if (d->all_logits || f < len) f = len;
        if (f > len && td_state_advance(&d->st, q->slot, f, err, errlen)) return -1;
        from[i] = f > q->pos0 ? f : q->pos0;
        seqs[ord[i]].caught = q->pos0 > d->st.len[q->slot] ? q->pos0 - d->st.len[q->slot] : 0;
    }
    struct td_forward_io keys = pass_io(d, MTP_KEYS);
    for (;;) {
        int rows = 0, m = 0;
        for (int i = 0; i < n && rows < d->max_rows; i++) {
            const struct td_draft_seq *q = &seqs[ord[i]];
            int len = d->st.len[q->slot], take = q->pos0 - len;
            if (take > d->max_rows - rows) take = d->max_rows - rows;
            if (take <= 0) continue;
            memcpy(d->ids + rows, q->toks + len + 1, (size_t)take * sizeof(int32_t));
            d->seqs[m++] = (struct td_plan_seq){.slot = q->slot,
                                                .len_before = len,
                                                .n_new = take,
                                                .ids = d->ids + rows,
                                                .skip_logits = take};
            rows += take;
        }
        if (!m) return 0;
        if (meta_plan_build(&d->plan, d->seqs, m, err, errlen) ||
            td_forward_store_kv(d->run, &d->st, &d->plan, &keys, err, errlen))
            return -1;
    }
}

int draft_mtp_run(struct draft_mtp *d, struct td_draft_seq *seqs, int n_seq, char *err,
                  size_t errlen) {
    const struct td_backend *b = d->b;
    size_t row_bytes = (size_t)d->nc * d->dim * sizeof(float);
    int rows = 0;
    if (d->pending)
        return td_errf(err, errlen, "mtp: a round before the last round's drafts were collected");
    for (int s = 0; s < n_seq; s++) {
        seqs[s].n_drafts = seqs[s].caught = 0;
        seqs[s].dev_drafts = NULL;
        if (seqs[s].pos0 == 0) { // a new sequence in this slot, caught up or not
            d->st.in_use[seqs[s].slot] = 1;
            d->st.len[seqs[s].slot] = d->st.hi[seqs[s].slot] = 0;
        }
    }
    // a deferred round: the backend's own chain, when every drafting sequence is greedy. It
    // runs to the largest k and each sequence keeps its own k's drafts (a greedy chain's first
    // drafts are those of a shorter chain). Its plan holds the drafting sequences alone, so
    // that their catch-up logits and every later step's rows are rows 0 .. n_draft - 1. (It
    // took the same k of all: under the adaptive policy, whose k differ, rounds went to the
    // host's chain, a wait for each draft.)
    int k = 0, n_draft = 0, *ord = d->ord, dev = d->defer && !d->all_logits;
    for (int s = 0; s < n_seq; s++) {
        if (seqs[s].k < 1) continue;
        dev = dev && seqs[s].sampling->temperature <= 0.0f;
        if (seqs[s].k > k) k = seqs[s].k;
        ord[n_draft++] = s;
    }
    dev = dev && n_draft;
    // the sequences this call catches up, ord[0 .. n_in): those that draft (the drafting ones
    // first in a deferred round, else in order); every one when a test asks for all logits
    int n_in = dev ? n_draft : 0, *from = d->from;
    for (int s = 0; s < n_seq && !dev; s++) // (a deferred round never has all_logits)
        if (d->all_logits || seqs[s].k >= 1) ord[n_in++] = s;
    if (!n_in) return 0; // nothing drafts: nothing is made (the sequences fall behind)
    if (catch_up_missed(d, seqs, ord, n_in, from, err, errlen)) return -1;
    // this step's rows (those the window reaches), in one call: only each sequence's last row's
    // logits draft; all rows' when a test asks for them
    for (int i = 0; i < n_in; i++) {
        struct td_draft_seq *q = &seqs[ord[i]];
        int p0 = from[i], n = q->pos0 + q->n - p0;
        memcpy(d->ids + rows, q->toks + p0 + 1, (size_t)n * sizeof(int32_t)); // (its next)
        d->seqs[i] = (struct td_plan_seq){.slot = q->slot,
                                          .len_before = p0,
                                          .n_new = n,
                                          .ids = d->ids + rows,
                                          .skip_logits = d->all_logits ? 0 : n - 1};
        rows += n;
    }
    if (b->mark) b->mark("draft");
    if (meta_plan_build(&d->plan, d->seqs, n_in, err, errlen) ||
        mtp_forward(d, rows, MTP_FIRST, NULL, dev ? NULL : d->logits, err, errlen) ||
        (dev && device_chain(d, seqs, n_draft, k, err, errlen)))
        return -1;
    if (dev) goto rollback;
    // the chain: draft 1 from each sequence's last row, then one recycled row per step
    int *live = d->live, n_live = 0, kmax = 0;
    for (int i = 0, r = 0; i < n_in; r += d->seqs[i].n_new, i++) {
        int s = ord[i], n = d->seqs[i].n_new; // (the plan's sequence i, its rows)
        struct td_draft_seq *q = &seqs[s];
        if (q->k < 1) continue;
        long pos = q->pos0 + q->n + 1;            // the position of the token row pos0+n-1 predicts
        int last = d->all_logits ? r + n - 1 : i; // the row in the step's logits
        int t = draw(d, d->logits + (size_t)last * d->vocab, q->sampling, pos, q->q);
        if (t < 0) continue;
        q->drafts[0] = t;
        q->n_drafts = 1;
        // this sequence's streams for the next step: its last row's output
        d->src[n_live] = r + n - 1;
        live[n_live++] = s;
        if (q->k > kmax) kmax = q->k;
    }
    gather_streams(d, d->h_in, d->h_out, n_live);
    for (int j = 1; j < kmax; j++) {
        int n = 0, *keep = d->keep;
        for (int i = 0; i < n_live; i++) {
            struct td_draft_seq *q = &seqs[live[i]];
            if (q->k <= j || q->n_drafts < j) continue;
            if (n != i) // compact the recycled streams to rows 0..n
                b->ops.copy(d->h_in + (size_t)n * d->nc * d->dim,
                            d->h_in + (size_t)i * d->nc * d->dim, row_bytes);
            d->ids[n] = q->drafts[j - 1];
            int pos = q->pos0 + q->n + j - 1;
            d->seqs[n] = (struct td_plan_seq){
                .slot = q->slot, .len_before = pos, .n_new = 1, .ids = d->ids + n};
            keep[n++] = live[i];
        }
        if (!n) break;
        if (meta_plan_build(&d->plan, d->seqs, n, err, errlen) ||
            mtp_forward(d, n, MTP_CHAIN, NULL, d->logits, err, errlen))
            return -1;
        n_live = 0;
        for (int i = 0; i < n; i++) {
            struct td_draft_seq *q = &seqs[keep[i]];
            long pos = q->pos0 + q->n + j + 1;
            int t = draw(d, d->logits + (size_t)i * d->vocab, q->sampling, pos,
                         q->q + (size_t)j * d->vocab);
            if (t < 0) continue;
            q->drafts[j] = t;
            q->n_drafts = j + 1;
            b->ops.copy(d->h_in + (size_t)n_live * d->nc * d->dim,
                        d->h_out + (size_t)i * d->nc * d->dim, row_bytes);
            live[n_live++] = keep[i];
        }
    }
rollback: // the chain rows were speculative: the MTP's committed length is the target's
    if (b->mark) b->mark("drafted");
    for (int i = 0; i < n_in; i++) {
        const struct td_draft_seq *q = &seqs[ord[i]];
        int keep_len = q->pos0 + q->n;
        if (d->st.len[q->slot] != keep_len &&
            td_state_rollback(&d->st, q->slot, keep_len, err, errlen))
            return -1;
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------
// the engine's table

static void mtp_target_io(void *impl, struct td_forward_io *io) {
    io->hidden_out = draft_mtp_hidden(impl);
    io->hidden_by_position = 1;
}
static int mtp_run(void *impl, struct td_draft_seq *seqs, int n, char *err, size_t errlen) {
    return draft_mtp_run(impl, seqs, n, err, errlen);
}
static int mtp_collect(void *impl, struct td_draft_seq *seqs, char *err, size_t errlen) {
    return draft_mtp_collect(impl, seqs, err, errlen);
}
static const struct td_state *mtp_state(const void *impl) {
    return draft_mtp_state(impl);
}
static void mtp_free(void *impl) {
    draft_mtp_free(impl);
}

static void mtp_begin(void *impl, int slot, int len) {
    struct draft_mtp *d = impl;
    d->st.in_use[slot] = 1;
    d->st.len[slot] = d->st.hi[slot] = len;
}

static const struct td_model *mtp_loaded(const void *impl) {
    return &((const struct draft_mtp *)impl)->host;
}

static size_t mtp_weight_bytes(const void *impl) {
    const struct draft_mtp *d = impl;
    return d->dev.backend ? d->dev.placed_bytes : 0;
}

struct td_model_drafter draft_mtp_model(struct draft_mtp *d) {
    return (struct td_model_drafter){.impl = d,
                                     .target_io = mtp_target_io,
                                     .insert_step = NULL,
                                     .run = mtp_run,
                                     .collect = mtp_collect,
                                     .begin = mtp_begin,
                                     .state = mtp_state,
                                     .weight_bytes = mtp_weight_bytes,
                                     .model = mtp_loaded,
                                     .free = mtp_free};
}
