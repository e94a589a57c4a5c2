/* engine.c: scheduler, the speculative round, commit and rollback (architecture.md section 6).
 *
 *   for each step:
 *     admit queued requests to free slots
 *     pack decode groups [anchor, drafts...] then prefill chunks, within the row budget
 *     plan = build(those groups)          // fresh every step, from scheduler state only
 *     logits = forward(target, plan)
 *     per group: verify -> accepted prefix + correction/bonus; commit; roll the rest back
 */
#include "engine.h"

#include <limits.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "draft/drafter.h"
#include "engine/policy.h"
#include "engine/prefix.h"
#include "draft/dspark.h"
#include "draft/mtp.h"
#include "kernels/err.h"
#include "model/backend.h"
#include "model/fileio.h"
#include "model/split.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/state.h"
#include "metadata/plan.h"
#include "verify/accept.h"

struct request {
    int id;
    enum td_req_status status;
    enum td_finish finish;
    int32_t *toks; /* [cap] prompt then generated */
    uint8_t *src;  /* [cap] where each token came from (td_engine_output_sources) */
    int n_prompt, n_toks, cap;
    int max_tokens;
    struct td_sampling sampling;
    int ignore_eos;
    int no_draft;                      /* td_request_params.no_draft */
    int32_t stop_ids[TD_MAX_STOP_IDS]; /* tokens that end it beside EOS */
    int n_stop_ids;
    int released; /* td_engine_release was called while a drafter call still held it */
    int slot;     /* state slot while running, else -1 */
    int32_t drafts[TD_MAX_DRAFT]; /* MTP, DSpark: drafts made after the last step, for the next */
    int n_drafts;
    int pol_d; /* drafts the policy chose for it last step (the next round drafts one more) */
    const int32_t
        *drafts_dev; /* a deferred MTP or DSpark round: the drafts are there, in backend memory */
    char msg[256];
    struct td_request_stats st;
    int32_t *blocks; /* [max_blocks] the history blocks it holds from admission to its end, in
                        position order (its slot's table row): a hit's published ones, then its
                        own, as many as its positions can reach */
    int n_blocks;
    int n_pub; /* its leading blocks that are published (a hit's, then the ones it published) */
};

/* one sequence of the current step */
struct group {
    struct request *r;
    int prefill; /* 1: prompt chunk, 0: verify group */
    int want;    /* verify group: drafts it could take this step */
    int n_drafts;
    int q_onehot;
    int host; /* its logits rows come to the host (host_rows) */
    int32_t rows[TD_MAX_DRAFT + 1];
};

struct td_engine {
    struct td_engine_params p;
    const struct td_backend *b;
    struct td_model model;      /* on the host (mapped files) */
    struct td_model dev;        /* its mirror on a device backend */
    const struct td_model *run; /* the one the forward reads: model or dev (or ranked) */
    struct td_model ranked;     /* a split model's: run's weights, this rank's experts */
    struct td_split split;
    struct td_comm dcomm; /* the split's device communicator (params.nccl) */
    int follower; /* a split model's rank past 0: runs the leader's steps (td_engine_follow) */
    uint64_t *rank_bytes; /* a split model's [world][2]: each rank's placed weights and caches */
    struct td_state state;
    struct td_plan plan;
    struct td_drafter *drafter;
    struct td_model_drafter md;  /* MTP or DSpark (md.impl NULL: neither) */
    struct td_serve *serve;      /* a split model's follower: its part of the drafter's experts */
    struct td_draft_seq *dseqs;  /* [max_seqs] the sequences of its last call */
    int n_live;                  /* requests in the last drafter call (live, dseqs) */
    struct td_id_patch *patches; /* [max_seqs] */
    struct request **live;       /* [max_seqs] the requests of a drafter call */
    struct request **reqs;   /* [n_reqs] the requests not yet released, by id (ascending: ids are
                                given in submission order). Each is its own allocation: a
                                request's address (its drafts, sampling and message, which the
                                model drafter's deferred round and td_engine_output's callers
                                hold) never moves until it is released */
    int n_reqs, cap;         /* cap: the length of reqs and of active */
    int next_id;             /* the id the next submission gets */
    struct request **active; /* [n_active] requests not yet finished, oldest first */
    int n_active;
    struct request **doomed; /* [n_doomed] released while the last drafter call held them:
                                freed once the next step has collected that call */
    int n_doomed, cap_doomed;
    struct group *groups;     /* [max_seqs] */
    struct td_plan_seq *seqs; /* [max_seqs] */
    float *logits;            /* [max_batch_tokens, vocab] */
    int32_t *ids, *ids_dev;   /* [max_batch_tokens] the rows' tokens (sample_rows), host and
                                 backend (the logits stay in the backend unless a group
                                 needs its rows on the host) */
    struct sample_row *samp;  /* [max_batch_tokens] how each row draws its token */
    void *samp_dev;
    float *q;                     /* [max_seqs, max_draft, vocab] */
    float *p_scratch, *r_scratch; /* [vocab] */
    int eos[TD_MAX_EOS + 8];
    int n_eos;
    struct td_engine_stats stats;
    int mtp;                 /* the drafter is MTP (its round's cost grows with its drafts) */
    struct td_policy pol;    /* the adaptive draft policy's cost model */
    float *pol_m;            /* [max_seqs, TD_MAX_DRAFT] its acceptance estimates */
    int *pol_k, *pol_d;      /* [max_seqs] drafts offered, chosen */
    int draft_on;            /* the model drafter drafts for the next step (else only catches up) */
    int trace;               /* TD_POLICY_TRACE: 1 the cost tables at the end, 2 also every step */
    long step_offered;       /* drafts on offer this step */
    double t_policy;         /* the adaptive policy's decision in the last drafter phase */
    int decide_pending;      /* a plain stretch's decision, made once the next step is queued */
    struct request **pend_r; /* [max_seqs] decide_queued's requests */
    int *pend_k;             /* [max_seqs] drafts wanted of each (decide_drafting) */
    long caught;             /* rows the last drafter phase made up (its sequences had fallen
                                behind) */
    double t_drafted;        /* the model drafter's phase of the last step (it made this step's
                                drafts), counted in this step's cost */
    /* the host's side of the steps (TD_POLICY_TRACE, at exit), seconds: scheduling, the plan,
       the forward's launch (its checks, the plan's upload and the graph's launch), the work
       queued behind it (DSpark's insertion, a plain stretch's decision), the wait for its ids,
       the drafts' collection; h[HOST_PHASES] counts the steps */
#define HOST_PHASES 6
    double h[HOST_PHASES + 1];
    /* the history pool's allocator (engine/prefix.h; models with compressed layers), and the
       prefix cache (prefix_blocks > 0): every published block has a checkpoint of the slot's
       windows at its end, ckpt_of[block] of the n_ckpt in cpool (p_win bytes each) */
    struct td_prefix *pool;
    int caching;
    int *ckpt_of;   /* [state.n_blocks] a published block's checkpoint, else -1 */
    int *ckpt_free; /* [n_ckpt] a stack of the free ones */
    int *ckpt_pos;  /* [n_ckpt] the length its slot had when it was taken */
    int n_ckpt, n_ckpt_free;
    char *cpool;
    size_t p_win;
};

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

double td_engine_clock(void) {
    return now();
}

/* the automatic row budget: AUTO_ROWS, or a round of k drafts for every slot when that is more */
#define AUTO_ROWS 256
static void round_rows(struct td_engine *e, int k) {
    long rows = (long)e->p.max_seqs * (1 + k);
    if (rows > e->p.max_batch_tokens) e->p.max_batch_tokens = rows > 1 << 20 ? 1 << 20 : (int)rows;
}

/* The widest step that replays a graph: every step the budget allows, up to TD_GRAPH_ROWS (past
 * it a step's work dwarfs its launches), and always a full verify round of every slot (within
 * the budget). It was 128 rows without a drafter, so at batch 128 a decode step beside prompt
 * rows (up to the 256 of the budget) ran eagerly, and `none` there lost to drafters whose
 * acceptance was nil (GSM8K, mean accepted length 1.00: 1.44x and 1.62x). */
static int graph_rows(int budget, int max_seqs, int max_draft) {
    long verify = (long)max_seqs * (1 + max_draft),
         rows = budget < TD_GRAPH_ROWS ? budget : TD_GRAPH_ROWS;
    if (verify > budget) verify = budget;
    if (verify > rows) rows = verify;
    return rows > 128 ? (int)rows : 128;
}

int td_engine_graph_rows(const struct td_engine *e) {
    return e->state.graph_rows;
}

int td_engine_rows(const struct td_engine *e) {
    return e->p.max_batch_tokens;
}

struct td_engine_params td_engine_defaults(void) {
    struct td_engine_params p;
    memset(&p, 0, sizeof p);
    p.max_seqs = 16;
    p.max_ctx = 4096;
    p.max_batch_tokens = 0; // auto (init)
    p.draft = "none";
    p.backend = "auto";
    p.max_draft = 0;
    p.max_cache_bytes = 0; // auto: see cache_limit()
    return p;
}

/* EOS ids: config.json's, plus generation_config.json's when the model directory has one */
static int load_eos(struct td_engine *e, char *err, size_t errlen) {
    const struct td_config *c = &e->model.cfg;
    for (int i = 0; i < c->n_eos; i++)
        e->eos[e->n_eos++] = c->eos_ids[i];
    char path[TD_PATH_MAX];
    if (td_path_join(path, sizeof path, e->p.model_dir, "generation_config.json", err, errlen))
        return -1;
    return td_config_generation_eos(path, c->vocab, e->eos, &e->n_eos,
                                    (int)(sizeof e->eos / sizeof *e->eos), err, errlen);
}

static int is_eos(const struct td_engine *e, int32_t t) {
    for (int i = 0; i < e->n_eos; i++)
        if (e->eos[i] == t) return 1;
    return 0;
}

/* the cache-pool limit: as given; on a device, its free memory (after the weights) less 10% and
 * 2 GiB for step buffers, activations and the GEMM workspace; on the CPU 3/4 of physical memory
 * less 1 GiB for the weights' page cache, step buffers and the rest of the process */
static size_t cache_limit(size_t asked, const struct td_backend *b) {
    if (asked) return asked;
    if (b->on_device) {
        size_t fr = b->free_bytes(), keep = fr / 10 + ((size_t)2 << 30);
        return fr > keep ? fr - keep : 0;
    }
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    size_t phys = pages > 0 && page > 0 ? (size_t)pages * (size_t)page : (size_t)4 << 30;
    size_t lim = phys / 4 * 3;
    return lim > ((size_t)1 << 30) ? lim - ((size_t)1 << 30) : lim / 2;
}

/* what the target's forward hands a model drafter: MTP reads its final streams, DSpark the
 * mean streams of its capture layers */
static struct td_forward_io target_io(struct td_engine *e) {
    struct td_forward_io io = {0};
    if (e->md.impl) e->md.target_io(e->md.impl, &io);
    return io;
}

/* why model_dir/dspark/ was looked for (in_folder: the drafter came from there), after the
 * message in err: the checkpoint carries no head of its own */
static void why_dspark_dir(const struct td_engine *e, int in_folder, char *err, size_t errlen) {
    if (!in_folder || e->model.cfg.dspark.present || !errlen) return;
    char why[768];
    snprintf(why, sizeof why, "%s", err);
    td_errf(err, errlen,
            "%s (the checkpoint carries no DSpark head of its own: no dspark_* keys in its "
            "config.json)",
            why);
}

/* ---------------------------------------------------------------------------------------------
 * The history pool and the prefix cache (../shared/design/prefix_cache.md sections 3.2-3.11).
 * Compressed entries and indexer keys live in the state's pool of bundled blocks of B tokens
 * (model/state.h); engine/prefix.h allocates them. At admission a request is given every block
 * its positions can reach (its prompt, max_tokens and a round of drafts, within max_ctx), or
 * waits, in arrival order, until finished requests give enough back: no request that started
 * ever runs out. The prefix cache (prefix_blocks > 0) publishes a request's prompt blocks as its
 * chunks complete them (chunks end at block boundaries), each with a checkpoint of the slot's
 * windows at its end, and a request whose prompt begins with published blocks shares them (its
 * table names them: nothing is copied) and loads the last one's checkpoint into its rings, then
 * prefills the rest. A hit stops at least one token before the prompt's end (its last row makes
 * the first token's logits), and with a model drafter at least the drafter's window before it,
 * whose rows rebuild every ring the drafter reads (section 3.8, drafter-state replay). Every
 * kernel gives a row the same bits in any chunking (test_forward's chunked and snapshot cases),
 * so a warm request's output is the cold one's. Blocks that decode steps complete are published
 * too (a conversation's next turn begins with this one's prompt and reply). Published blocks are
 * frozen: every write lands at a position at or past its sequence's committed length, in a block of
 * its own (the plan's validator checks it every step). */
static int ckpt_take(struct td_engine *e, int tail) {
    if (!e->n_ckpt_free) { // the least recently used cached leaf gives its block and checkpoint
        // (a tail's only another tail: a tail never pushes a full block out, so a cache whose
        // checkpoints the full blocks fill keeps them as it would without tails)
        int id = td_prefix_evict(e->pool, tail);
        if (id < 0) return -1;
        e->ckpt_free[e->n_ckpt_free++] = e->ckpt_of[id], e->ckpt_of[id] = -1;
    }
    return e->ckpt_free[--e->n_ckpt_free];
}

/* a block the allocator handed out: if it was a cached one, evicted, its checkpoint is free */
static void ckpt_drop(struct td_engine *e, int id) {
    if (e->ckpt_of && e->ckpt_of[id] >= 0)
        e->ckpt_free[e->n_ckpt_free++] = e->ckpt_of[id], e->ckpt_of[id] = -1;
}

static char *ckpt_mem(const struct td_engine *e, int ck) {
    return e->cpool + (size_t)ck * e->p_win;
}

/* A change of the state outside a step (the prefix cache's), made here; on a split model's rank
 * 0 then sent to the followers, which make it in their td_engine_follow (state_apply). A
 * failure to send fails the world, which the next step reports. */
static int state_apply(void *ctx, const struct td_state_op *op, char *err, size_t errlen) {
    struct td_engine *e = ctx;
    int n_ck = e->cpool ? e->n_ckpt : 0;
    if ((op->kind == TD_OP_WINDOW_SAVE || op->kind == TD_OP_WINDOW_LOAD) &&
        (op->b < 0 || op->b >= n_ck))
        return td_errf(err, errlen, "engine: checkpoint %d outside the pool of %d", op->b, n_ck);
    switch (op->kind) {
    case TD_OP_BLOCK_COPY: return td_state_block_copy(&e->state, op->a, op->b, err, errlen);
    case TD_OP_WINDOW_SAVE:
        return td_state_window_save(&e->state, op->a, ckpt_mem(e, op->b), err, errlen);
    case TD_OP_WINDOW_LOAD:
        if (e->follower && td_state_seq_take(&e->state, op->a))
            return td_errf(err, errlen, "engine: a window load into slot %d", op->a);
        return td_state_window_load(&e->state, op->a, ckpt_mem(e, op->b), op->c, err, errlen);
    }
    return td_errf(err, errlen, "engine: state op %d", op->kind);
}

static int state_op(struct td_engine *e, int kind, int a, int b, int c, char *err, size_t errlen) {
    struct td_state_op op = {.kind = kind, .a = a, .b = b, .c = c};
    if (state_apply(e, &op, err, errlen)) return -1;
    char e2[8];
    if (e->split.comm && !e->follower) td_forward_send_op(e->run, &op, e2, sizeof e2);
    return 0;
}

/* A split model's ranks run the leader's plans on states of their own: every rank's must have
 * the leader's dims (collective: each gathers every rank's and refuses any that differs) */
static int same_state(struct td_engine *e, char *err, size_t errlen) {
    struct td_comm *c = e->split.comm;
    const struct td_state *st = &e->state;
    enum { N = 11 };
    const struct td_model *dm = e->md.impl && e->md.model ? e->md.model(e->md.impl)
                                : e->serve                ? td_serve_model(e->serve)
                                                          : NULL;
    uint64_t fp = dm ? td_split_fingerprint(dm) : 0; // the drafter's weights, as the target's
    int32_t me[N] = {st->max_seqs,
                     st->max_ctx,
                     st->max_chunk,
                     st->n_blocks,
                     (int32_t)st->kv_dtype,
                     st->hist_block,
                     e->p.max_batch_tokens,
                     e->cpool ? e->n_ckpt : 0,
                     e->md.impl || e->serve ? 1 + !e->mtp : 0,
                     (int32_t)(fp & 0xffffffffu),
                     (int32_t)(fp >> 32)};
    static const char *what[N] = {"sequences",
                                  "max_ctx",
                                  "max_chunk",
                                  "history blocks",
                                  "key-cache dtype",
                                  "history block tokens",
                                  "rows a step",
                                  "prefix-cache checkpoints",
                                  "model drafter (1 MTP, 2 DSpark)",
                                  "",
                                  ""}; // (the drafter's fingerprint: its own message)
    int32_t *all = calloc((size_t)c->world, sizeof me);
    if (!all) return td_errf(err, errlen, "engine: out of memory");
    int rc = c->ops->all_gather(c, me, all, sizeof me);
    if (rc) c->ops->poll_error(c, err, errlen);
    for (int r = 1; !rc && r < c->world; r++)
        for (int i = 0; !rc && i < N; i++) {
            const int32_t *a = all + N * r;
            if (i >= N - 2 && a[i] != all[i]) // the drafter's fingerprint
                rc = td_errf(err, errlen,
                             "engine: rank %d loaded another drafter than rank 0 (weights "
                             "%08x%08x against %08x%08x): every rank must load the same one",
                             r, (unsigned)a[N - 1], (unsigned)a[N - 2], (unsigned)all[N - 1],
                             (unsigned)all[N - 2]);
            else if (a[i] != all[i])
                rc = td_errf(err, errlen,
                             "engine: rank %d's state has %d %s where rank 0's has %d: every rank "
                             "must start with the same settings",
                             r, a[i], what[i], all[i]);
        }
    free(all);
    // and what each rank holds, for its leader to print (parallel.md 5.6)
    uint64_t mine[2] = {td_engine_weight_bytes(e), st->bytes};
    if (!rc && !(e->rank_bytes = calloc((size_t)c->world, sizeof mine)))
        rc = td_errf(err, errlen, "engine: out of memory");
    if (!rc && c->ops->all_gather(c, mine, e->rank_bytes, sizeof mine))
        rc = c->ops->poll_error(c, err, errlen);
    return rc ? -1 : 0;
}

static int pool_init(struct td_engine *e, const struct td_engine_params *p, char *err,
                     size_t errlen) {
    const struct td_config *c = &e->model.cfg;
    int B = e->state.hist_block;
    // the root: what makes a block's bytes (another model, cache format or numerics never hits)
    char fp[512];
    int n =
        snprintf(fp, sizeof fp, "tandem prefix v2|%s|%s|kv %s|det %d|block %d|layers %d|vocab %d",
                 p->model_dir ? p->model_dir : "", e->b->name, td_kv_dtype_name(p->kv_dtype),
                 p->deterministic, B, c->n_layers, c->vocab);
    if (!(e->pool = td_prefix_new(e->state.n_blocks, B, td_prefix_root(fp, (size_t)n))))
        return td_errf(err, errlen, "engine: out of memory for the history pool's index");
    if (p->prefix_blocks <= 0) return 0;
    e->p_win = td_state_window_bytes(&e->state);
    e->n_ckpt = p->prefix_blocks < e->state.n_blocks ? p->prefix_blocks : e->state.n_blocks;
    size_t bytes = (size_t)e->n_ckpt * e->p_win;
    size_t limit = cache_limit(p->max_cache_bytes, e->b); // the caches' headroom counts it too
    if (e->state.bytes + bytes > limit)
        return td_errf(err, errlen,
                       "engine: the prefix cache's %d window checkpoints need %zu MiB beside the "
                       "caches' %zu MiB, past their limit of %zu MiB (fewer prefix blocks, or "
                       "more cache memory)",
                       e->n_ckpt, bytes >> 20, e->state.bytes >> 20, limit >> 20);
    if (!(e->cpool = e->state.backend->alloc(bytes)))
        return td_errf(err, errlen,
                       "engine: no room for the prefix cache's %d window checkpoints of %zu KiB: "
                       "%zu MiB",
                       e->n_ckpt, e->p_win >> 10, bytes >> 20);
    e->ckpt_of = malloc((size_t)e->state.n_blocks * sizeof *e->ckpt_of);
    e->ckpt_free = malloc((size_t)e->n_ckpt * sizeof *e->ckpt_free);
    e->ckpt_pos = malloc((size_t)e->n_ckpt * sizeof *e->ckpt_pos);
    if (!e->ckpt_of || !e->ckpt_free || !e->ckpt_pos)
        return td_errf(err, errlen, "engine: out of memory for the prefix cache's index");
    for (int i = 0; i < e->state.n_blocks; i++)
        e->ckpt_of[i] = -1;
    for (int i = 0; i < e->n_ckpt; i++)
        e->ckpt_free[i] = e->n_ckpt - 1 - i;
    e->n_ckpt_free = e->n_ckpt;
    e->caching = 1;
    return 0;
}

/* the blocks r may reach: its prompt, the tokens it may make and a round of drafts past the
 * last, within the context */
static int blocks_needed(const struct td_engine *e, const struct request *r) {
    long room = (long)e->p.max_ctx + 1 - r->n_prompt;
    long reach = (long)r->n_prompt + (r->max_tokens < room ? r->max_tokens : room) + e->p.max_draft;
    if (reach > e->p.max_ctx) reach = e->p.max_ctx;
    return (int)((reach + e->state.hist_block - 1) / e->state.hist_block);
}

/* At admission into slot: the published blocks r's prompt begins with (prefix cache), then
 * blocks of its own for the rest it may reach; its slot's table names them all, and a hit's
 * last checkpoint becomes the slot's windows. After the full blocks the hit may end inside the
 * next published block, full or a tail (a finished request's last, part-filled block: a
 * conversation's next turn): its bytes are copied into r's own block there, which r goes on
 * writing, and its checkpoint serves the hit's end S when it was taken at most max_chunk
 * positions past S (prefix_publish's rule: the rows below S are in the rings, those past S are
 * rewritten before they are read, as after a rollback). A hit ends at least the drafter's
 * window D before the prompt's last token (drafter-state replay). -1 (nothing held) when the
 * pool cannot give the blocks now: r waits. */
static int pool_admit(struct td_engine *e, struct request *r, int slot) {
    char err[256];
    int B = e->state.hist_block, need = blocks_needed(e, r), n = 0, part = -1, n_part = 0;
    int D = e->md.impl ? e->md.state(e->md.impl)->window : 0, most = r->n_prompt - 1 - D;
    if (e->caching && most >= 1) {
        n = td_prefix_match(e->pool, r->toks, r->n_prompt, r->blocks, most / B);
        int ids[16], common[16], k = 0, lim = most - n * B;
        if (lim >= 1)
            k = td_prefix_within(e->pool, n ? r->blocks[n - 1] : -1, r->toks + (size_t)n * B, lim,
                                 ids, common, 16);
        for (int i = 0; i < k; i++) // the longest whose checkpoint serves its end
            if (common[i] > n_part &&
                e->ckpt_pos[e->ckpt_of[ids[i]]] - (n * B + common[i]) <= e->state.max_chunk)
                part = ids[i], n_part = common[i];
    }
    td_prefix_hold(e->pool, r->blocks, n);
    if (part >= 0) td_prefix_hold(e->pool, &part, 1); // (no allocation below may evict it)
    if (td_prefix_available(e->pool) < need - n) {
        td_prefix_release(e->pool, r->blocks, n);
        if (part >= 0) td_prefix_release(e->pool, &part, 1);
        return -1;
    }
    for (int i = n; i < need; i++) {
        int id = td_prefix_alloc(e->pool);
        TD_ASSERT(id >= 0); // available said so
        ckpt_drop(e, id);
        r->blocks[i] = id;
    }
    r->n_blocks = need;
    memcpy(td_state_table(&e->state, slot), r->blocks, (size_t)need * sizeof *r->blocks);
    int hit = n * B + n_part, last = part >= 0 ? part : n ? r->blocks[n - 1] : -1;
    if (e->caching) td_prefix_count(e->pool, n + (part >= 0), hit);
    r->n_pub = n;
    if (!hit) return 0;
    if (part >= 0 && state_op(e, TD_OP_BLOCK_COPY, r->blocks[n], part, 0, err, sizeof err))
        TD_ABORT("prefix hit: %s", err);
    if (state_op(e, TD_OP_WINDOW_LOAD, slot, e->ckpt_of[last], hit, err, sizeof err))
        TD_ABORT("prefix hit: %s", err);
    if (part >= 0) td_prefix_release(e->pool, &part, 1); // (its copy and checkpoint are queued)
    r->st.cached_tokens = hit;
    if (e->md.impl) e->md.begin(e->md.impl, slot, hit);
    return 0;
}

/* block b of r, holding n of its committed tokens (B, or fewer: a tail), published with a
 * checkpoint of the windows now; 0, or -1 when no checkpoint can be had (every checkpoint's
 * block is held: nothing published) */
static int publish_block(struct td_engine *e, struct request *r, int b, int n) {
    char err[256];
    int ck = ckpt_take(e, n < e->state.hist_block);
    if (ck < 0) return -1;
    if (state_op(e, TD_OP_WINDOW_SAVE, r->slot, ck, 0, err, sizeof err))
        TD_ABORT("prefix publish: %s", err);
    e->ckpt_pos[ck] = e->state.len[r->slot];
    int id = r->blocks[b], parent = b ? r->blocks[b - 1] : -1, B = e->state.hist_block;
    const int32_t *t = r->toks + (size_t)b * B;
    int q = n == B ? td_prefix_publish(e->pool, id, parent, t)
                   : td_prefix_publish_tail(e->pool, id, parent, t, n);
    if (q == id) {
        e->ckpt_of[id] = ck;
    } else { // the same block was published already: r holds that one now, and its own is free
        e->ckpt_free[e->n_ckpt_free++] = ck;
        r->blocks[b] = q;
        td_state_table(&e->state, r->slot)[b] = q;
    }
    return 0;
}

/* After a step (a prompt chunk or a decode step): when r's committed length has reached the end
 * of its next unpublished block, that block is published with a checkpoint of the windows now.
 * The rings keep the last W + max_chunk positions, stored by position, so a checkpoint taken at
 * L serves the block's end S as long as L - S <= max_chunk: the rows a hit at S reads (below S)
 * are there, and the ones past S are never read before the hit's own rows replace them
 * (rows.h's rule). Decode steps bring fewer rows than that, prompt chunks end at block ends.
 * (When no checkpoint can be had nothing more of r's is published.) */
static void prefix_publish(struct td_engine *e, struct request *r) {
    int B = e->state.hist_block, L = e->state.len[r->slot], b = r->n_pub;
    if (L < (b + 1) * B || L - (b + 1) * B > e->state.max_chunk) return;
    if (!publish_block(e, r, b, B)) r->n_pub++;
}

/* At a request's finish (not a failure): the blocks its committed tokens filled since the last
 * step (prefix_publish), then what it committed past its last full block, as a published tail
 * with a checkpoint of the windows at its end: the next turn of a conversation (the prompt, the
 * reply, more) then finds every committed token, not only the full blocks. Nothing when a stop
 * cut the output below the committed length (td_engine_stop_at), when an earlier block went
 * unpublished, or when no checkpoint can be had. */
static void prefix_publish_tail(struct td_engine *e, struct request *r) {
    int B = e->state.hist_block, L = e->state.len[r->slot];
    if (r->n_toks < L) return;
    prefix_publish(e, r);
    int b = r->n_pub, n = L - b * B;
    if (n >= 1 && n < B && b < r->n_blocks) publish_block(e, r, b, n);
}

/* What the plan's validator cannot see, before every step: each sequence reads blocks it holds,
 * and the blocks its rows write (those holding a position at or past its committed length) are
 * private: held by it alone, unpublished. A break is the engine's bug: it stops there. */
static void pool_check(const struct td_engine *e, int n) {
    int B = e->state.hist_block;
    for (int i = 0; i < n; i++) {
        const struct request *r = e->groups[i].r;
        int end = e->plan.kv_indptr[i + 1] - e->plan.kv_indptr[i], w0 = e->plan.len_before[i] / B;
        for (int b = 0; b < (end + B - 1) / B; b++) {
            int id = b < r->n_blocks ? r->blocks[b] : -1, h = td_prefix_holds(e->pool, id);
            if (id < 0 || h < 1 || (b >= w0 && (h != 1 || td_prefix_published(e->pool, id))))
                TD_ABORT("history pool: request %d's block %d (pool block %d, %d holds%s) is %s",
                         r->id, b, id, h, td_prefix_published(e->pool, id) ? ", published" : "",
                         b >= w0 ? "written but not its own" : "read but not held");
        }
    }
}

uint64_t td_engine_prefix_checksum(const struct td_engine *e) {
    if (!e->caching) return 0;
    char err[256];
    size_t hb = td_state_block_bytes(&e->model.cfg, e->state.kv_dtype);
    unsigned char *h = malloc(hb + e->p_win);
    TD_ASSERT(h);
    uint64_t sum = 0;
    for (int id = 0; id < e->state.n_blocks; id++)
        if (td_prefix_published(e->pool, id)) {
            if (td_state_block_read(&e->state, id, h, err, sizeof err))
                TD_ABORT("prefix checksum: %s", err);
            e->state.backend->to_host(h + hb, ckpt_mem(e, e->ckpt_of[id]), e->p_win);
            sum = XXH3_64bits_withSeed(h, hb + e->p_win, sum ^ (uint64_t)id);
        }
    free(h);
    return sum;
}

int td_engine_prefix_stats(const struct td_engine *e, struct td_prefix_stats *out) {
    if (!e->caching) return -1;
    td_prefix_stats(e->pool, out);
    return 0;
}

/* The history pool's blocks (model/state.h): history_blocks, else as many as every slot at
 * max_ctx takes and the prefix cache's blocks beside them, or as many as the cache memory holds
 * when that is less, as long as one sequence of max_ctx and a block for every other slot fit.
 * 0 for a model without compressed layers; -1 with a message when too few fit. */
static long long pool_blocks(const struct td_engine *e, const struct td_engine_params *p,
                             int max_chunk, char *err, size_t errlen) {
    const struct td_config *c = &e->model.cfg;
    int hb = td_history_block(c), NB = hb ? (e->p.max_ctx + hb - 1) / hb : 0;
    int ckpts = p->prefix_blocks > 0 ? p->prefix_blocks : 0, S = e->p.max_seqs;
    size_t limit = cache_limit(p->max_cache_bytes, e->b);
    long long nb = p->history_blocks > 0 ? p->history_blocks : hb ? (long long)S * NB + ckpts : 0;
    if (hb && p->history_blocks > 0 && p->history_blocks < NB)
        return td_errf(err, errlen,
                       "engine: a history pool of %d blocks holds %lld tokens; one sequence of "
                       "max_ctx %d needs %d blocks of %d (raise history_blocks or lower max_ctx)",
                       p->history_blocks, (long long)p->history_blocks * hb, e->p.max_ctx, NB, hb);
    if (!hb || p->history_blocks > 0) return nb;
    size_t rings = td_state_bytes_pool(c, S, e->p.max_ctx, max_chunk, p->kv_dtype, 0);
    size_t ck = (size_t)ckpts * td_state_bytes_pool(c, 1, e->p.max_ctx, max_chunk, p->kv_dtype,
                                                    0); // (a window each)
    size_t bb = td_state_block_bytes(c, p->kv_dtype);
    long long fit = limit > rings + ck ? (long long)((limit - rings - ck) / bb) : 0;
    if (fit < nb) nb = fit;
    if (nb < (long long)NB + S - 1)
        return td_errf(err, errlen,
                       "engine: the cache memory limit of %zu MiB holds %lld history blocks of %d "
                       "tokens (%.2f MiB each) beside %d sequences' windows (%zu MiB) and the "
                       "prefix cache's %d blocks' checkpoints (%zu MiB); one sequence of max_ctx "
                       "%d and a block for every other sequence need %d (fewer sequences or "
                       "prefix blocks, a shorter max_ctx, a smaller --kv-dtype, or more cache "
                       "memory)",
                       limit >> 20, nb, hb, bb / 1048576.0, S, rings >> 20, ckpts, ck >> 20,
                       e->p.max_ctx, NB + S - 1);
    return nb;
}

int td_engine_init(struct td_engine **out, const struct td_engine_params *p, char *err,
                   size_t errlen) {
    *out = NULL;
    struct td_engine *e = calloc(1, sizeof *e);
    if (!e) return td_errf(err, errlen, "out of memory");
    e->p = *p;
    if (!p->model_dir) {
        free(e);
        return td_errf(err, errlen, "engine: no model directory");
    }
    if (p->max_seqs < 1 || p->max_ctx < 2 || p->max_draft < 0 || p->max_draft > TD_MAX_DRAFT ||
        p->max_batch_tokens < 0 ||
        (p->max_batch_tokens && p->max_batch_tokens < 1 + p->max_draft)) {
        free(e);
        return td_errf(err, errlen,
                       "engine: need max_seqs >= 1, max_ctx >= 2, draft tokens in [0, %d] and a "
                       "batch of at least 1 + draft tokens rows (got %d, %d, %d, %d)",
                       TD_MAX_DRAFT, p->max_seqs, p->max_ctx, p->max_draft, p->max_batch_tokens);
    }
    if (p->prefill_chunk < 0) {
        free(e);
        return td_errf(err, errlen, "engine: prefill_chunk is %d, must be >= 0 (0: no cap)",
                       p->prefill_chunk);
    }
    const struct draft_info *di = draft_lookup(p->draft ? p->draft : "none", err, errlen);
    if (!di || !(e->b = td_backend_get(p->backend ? p->backend : "auto", err, errlen))) {
        free(e);
        return -1;
    }
    if (p->dummy_weights ? td_model_load_dummy(&e->model, p->model_dir, 1, err, errlen)
                         : td_model_load(&e->model, p->model_dir, err, errlen)) {
        free(e);
        return -1;
    }
    int auto_rows = !p->max_batch_tokens; // sized below, once the drafter's round is known
    if (auto_rows)
        e->p.max_batch_tokens = AUTO_ROWS > 1 + p->max_draft ? AUTO_ROWS : 1 + p->max_draft;
    // auto: its pick from the backend and what the model carries (its own files, dspark/)
    enum td_own_drafter own = td_model_own_drafter(&e->model);
    if (di->kind == DRAFT_KIND_AUTO) {
        di = draft_pick_auto(e->b->on_device, p->model_dir, p->dspark_dir, own);
        int room = e->p.max_batch_tokens - 1;               // rows beside each anchor
        if (di->kind == DRAFT_KIND_MTP && p->max_draft < 1) // none asked for: the pick's
            e->p.max_draft = di->default_tokens < room ? di->default_tokens : room;
        if (di->kind == DRAFT_KIND_MTP && e->p.max_draft < 1) di = draft_lookup("none", NULL, 0);
    }
    e->p.draft = di->name; // (td_engine_draft)
    if (e->b->set_deterministic) e->b->set_deterministic(p->deterministic);
    if (p->comm && (p->comm->world > 1 || p->nccl)) {  // a split model (collective)
        const char *try_gpu = getenv("TD_RANKS_CUDA"); // (host sums on a GPU: not yet run)
        if (e->b->on_device && !p->nccl && !(try_gpu && !strcmp(try_gpu, "1"))) {
            td_errf(err, errlen,
                    "engine: a model split over ranks on the %s backend sums its experts by NCCL, "
                    "one GPU a rank (--gpus N); --ranks N runs on the CPU backend",
                    e->b->name);
            goto fail;
        }
        if (p->nccl && !e->b->queue) {
            td_errf(err, errlen, "engine: NCCL (--gpus) needs the cuda backend, not %s",
                    e->b->name);
            goto fail;
        }
        if (p->nccl && td_comm_nccl(&e->dcomm, p->comm, e->b->queue(), 120.0, err, errlen))
            goto fail;
        if (td_split_init(&e->split, &e->model, p->comm, p->nccl ? &e->dcomm : NULL, e->b, err,
                          errlen))
            goto fail;
        e->split.leads = 1;
#ifdef TD_DEBUG
        e->split.check = 1; // (every step: a copy of the residual streams to the host)
#endif
        const char *rck = getenv("TD_RANK_CHECK");
        if (rck && *rck) e->split.check = atoi(rck) != 0;
        e->follower = p->comm->rank > 0;
    }
    e->run = &e->model;
    if (td_model_needs_placing(&e->model, e->b)) { // a device, a dummy's values, FP8 / FP4
        // (a split model's rank places its own experts only, and its kernels read no other)
        if (td_model_upload_part(&e->model, e->b, e->split.own, e->split.per_layer, &e->dev, err,
                                 errlen))
            goto fail;
        e->run = &e->dev;
    }
    if (e->split.comm && td_split_place(&e->split, e->b, err, errlen)) goto fail;
    if (e->split.comm) { // this rank's view: its placed weights, its experts
        e->ranked = *e->run;
        e->ranked.split = &e->split;
        e->run = &e->ranked;
    }
    const struct td_config *c = &e->model.cfg;
    if (p->max_ctx > c->max_position_embeddings) e->p.max_ctx = (int)c->max_position_embeddings;
    if (di->kind == DRAFT_KIND_NONE) e->p.max_draft = 0;
    int use_mtp = di->kind == DRAFT_KIND_MTP, use_dspark = di->kind == DRAFT_KIND_DSPARK;
    e->mtp = use_mtp;
    if (p->draft_policy != TD_POLICY_ADAPTIVE && p->draft_policy != TD_POLICY_FIXED) {
        td_errf(err, errlen, "engine: draft policy %d is neither adaptive nor fixed",
                p->draft_policy);
        goto fail;
    }
    if (p->n_synthetic < 0 || p->n_synthetic > TD_MAX_DRAFT) {
        td_errf(err, errlen, "engine: %d synthetic acceptance rates (0 .. %d)", p->n_synthetic,
                TD_MAX_DRAFT);
        goto fail;
    }
    for (int j = 0; j < p->n_synthetic; j++)
        if (!(p->synthetic_accept[j] >= 0.0f && p->synthetic_accept[j] <= 1.0f)) {
            td_errf(err, errlen,
                    "engine: synthetic acceptance %g at draft position %d is not in "
                    "[0, 1]",
                    p->synthetic_accept[j], j + 1);
            goto fail;
        }
    if (!(p->dspark_threshold >= 0.0f && p->dspark_threshold < 1.0f)) {
        td_errf(err, errlen, "engine: DSpark threshold %g must be in [0, 1)", p->dspark_threshold);
        goto fail;
    }
    // DSpark's config first: its block bounds a round's drafts, which size the row budget; the
    // drafter is made before the target's state (below). Its folder: the one named, else the
    // checkpoint's own stages (NULL), else model_dir/dspark/
    char dir[TD_PATH_MAX];
    const char *ddir = p->dspark_dir;
    int dspark_block = 0;
    if (use_dspark) {
        if (!ddir && own != TD_OWN_DSPARK) {
            if (td_path_join(dir, sizeof dir, p->model_dir, "dspark", err, errlen)) goto fail;
            ddir = dir;
        }
        struct td_dspark_cfg dc;
        if (dspark_config_load(&dc, ddir, &e->model, err, errlen)) {
            why_dspark_dir(e, ddir == dir, err, errlen);
            goto fail;
        }
        dspark_block = dc.block;
        if (e->p.max_draft < 1 || e->p.max_draft > dc.block) e->p.max_draft = dc.block;
        if (auto_rows) round_rows(e, e->p.max_draft);
        if (e->p.max_batch_tokens < 1 + e->p.max_draft) {
            td_errf(err, errlen, "engine: a batch of %d rows cannot hold a DSpark round of %d",
                    e->p.max_batch_tokens, 1 + e->p.max_draft);
            goto fail;
        }
    }
    if (di->kind == DRAFT_KIND_REQUEST &&
        !(e->drafter = draft_init(di->name, c->vocab, err, errlen)))
        goto fail;
    if (auto_rows && use_mtp) round_rows(e, e->p.max_draft);
    // rollback depth is at most max_draft rows; 16 leaves room for the verify pass of k <= 15.
    // With the prefix cache and a model drafter, the rings keep the drafter's window (the target's
    // sliding window) more: a hit ends that window before its prompt's end (drafter-state
    // replay), and a checkpoint taken at L serves a hit's end S when L - S <= max_chunk, so a
    // conversation's next turn, however short, can end its hit inside the last turn's tail
    int max_chunk = e->p.max_draft + 1 > 16 ? e->p.max_draft + 1 : 16;
    if (p->prefix_blocks > 0 && (use_mtp || use_dspark) && c->sliding_window + 1 > max_chunk)
        max_chunk = c->sliding_window + 1;
    // the drafter before the caches: its weights (and its part of a split drafter's experts)
    // are placed first, so the history pool is sized in the memory they leave, not they in the
    // headroom kept for step buffers. It keeps rows by the target's window ring's rows, a
    // function of the shape alone
    long long ring_rows = td_state_swa_ring(c, e->p.max_ctx, max_chunk);
    int ring = ring_rows > INT_MAX ? INT_MAX : (int)ring_rows; // (the state refuses it below)
    if (use_dspark && !e->follower) { // (the leader runs the drafters, whole)
        struct draft_dspark *ds;
        if (draft_dspark_init(&ds, ddir, &e->model, e->run, e->b, e->p.max_seqs, e->p.max_ctx,
                              e->p.max_batch_tokens, ring, p->dspark_threshold, !p->no_graphs,
                              cache_limit(p->max_cache_bytes, e->b), p->kv_dtype, err, errlen)) {
            why_dspark_dir(e, ddir == dir, err, errlen);
            goto fail;
        }
        e->md = draft_dspark_model(ds);
        draft_dspark_defer(ds, 1); // greedy drafts go from the drafter to the verify
    }
    if (use_mtp && !e->follower) {
        struct draft_mtp *mtp;
        if (draft_mtp_init(&mtp, &e->model, e->run, e->b, e->p.max_seqs, e->p.max_ctx,
                           e->p.max_batch_tokens, e->p.max_draft, ring, !p->no_graphs,
                           cache_limit(p->max_cache_bytes, e->b), p->kv_dtype, err, errlen))
            goto fail;
        e->md = draft_mtp_model(mtp);
        draft_mtp_defer(mtp, 1); // greedy drafts go from the drafter to the verify step
    }
    if (e->follower && (use_mtp || use_dspark)) { // its part of rank 0's drafter's experts
        int rows = e->p.max_batch_tokens, blocks = e->p.max_seqs * dspark_block;
        if (use_dspark && blocks > rows) rows = blocks; // (a block for every sequence)
        if (use_mtp
                ? draft_mtp_serve(&e->serve, &e->model, e->run, e->b, rows, err, errlen)
                : draft_dspark_serve(&e->serve, ddir, &e->model, e->run, e->b, rows, err, errlen)) {
            if (use_dspark) why_dspark_dir(e, ddir == dir, err, errlen);
            goto fail;
        }
    }
    long long nb = pool_blocks(e, p, max_chunk, err, errlen);
    if (nb < 0) goto fail;
    size_t limit = cache_limit(p->max_cache_bytes, e->b);
    if (td_state_init_pool(&e->state, c, e->p.max_seqs, e->p.max_ctx, max_chunk,
                           nb > INT_MAX ? INT_MAX : (int)nb, limit, e->b, p->kv_dtype, err, errlen))
        goto fail;
    e->state.use_graphs = !p->no_graphs;
    e->state.graph_rows = graph_rows(e->p.max_batch_tokens, e->p.max_seqs, e->p.max_draft);
    // a step's logits: a round of every sequence at most (a prompt chunk returns one row's), so
    // a graph's head runs on those rows, gathered, not on every row (TD_HEAD_GATHER=0: every
    // row, measuring only)
    if (!getenv("TD_HEAD_GATHER") || atoi(getenv("TD_HEAD_GATHER")))
        e->state.logit_rows = e->p.max_seqs * (1 + e->p.max_draft);
    if (e->md.impl && !(e->dseqs = calloc((size_t)e->p.max_seqs, sizeof *e->dseqs))) {
        td_errf(err, errlen, "engine: out of memory");
        goto fail;
    }
    if (p->prefix_blocks > 0 && !e->state.hist_block) {
        td_errf(err, errlen,
                "engine: the prefix cache keeps blocks of compressed history, and this model has "
                "no compressed layer (run it with prefix_blocks 0)");
        goto fail;
    }
    if (e->state.hist_block && pool_init(e, p, err, errlen)) goto fail;
    if (e->split.comm && same_state(e, err, errlen)) goto fail;
    struct td_plan_dims d = td_state_plan_dims(&e->state, e->p.max_batch_tokens, e->p.max_seqs);
    if (meta_plan_init(&e->plan, &d, err, errlen)) goto fail;
    struct td_forward_io io = target_io(e);
    if (td_forward_prepare(e->run, &e->state, &d, &io, 1, e->p.max_batch_tokens, err, errlen))
        goto fail;
    size_t V = (size_t)c->vocab;
    e->groups = calloc((size_t)e->p.max_seqs, sizeof *e->groups);
    e->live = calloc((size_t)e->p.max_seqs, sizeof *e->live);
    e->seqs = calloc((size_t)e->p.max_seqs, sizeof *e->seqs);
    e->patches = calloc((size_t)e->p.max_seqs, sizeof *e->patches);
    e->logits = malloc((size_t)e->p.max_batch_tokens * V * sizeof(float));
    e->ids = e->b->alloc_host((size_t)e->p.max_batch_tokens * sizeof(int32_t)); // queued copies
    e->ids_dev = e->state.backend->alloc((size_t)e->p.max_batch_tokens * sizeof(int32_t));
    e->samp = malloc((size_t)e->p.max_batch_tokens * sizeof *e->samp);
    e->samp_dev = e->state.backend->alloc((size_t)e->p.max_batch_tokens * sizeof *e->samp);
    e->q = malloc(((size_t)e->p.max_seqs * (e->p.max_draft + 1)) * V * sizeof(float));
    e->p_scratch = malloc(V * sizeof(float));
    e->r_scratch = malloc(V * sizeof(float));
    policy_init(&e->pol);
    e->pol.cost = p->step_cost, e->pol.cost_ctx = p->cost_ctx;
    e->draft_on = 1;
    e->trace = getenv("TD_POLICY_TRACE") ? atoi(getenv("TD_POLICY_TRACE")) : 0;
    e->pol_m = malloc((size_t)e->p.max_seqs * TD_MAX_DRAFT * sizeof(float));
    e->pol_k = malloc((size_t)e->p.max_seqs * sizeof(int));
    e->pol_d = malloc((size_t)e->p.max_seqs * sizeof(int));
    e->pend_r = malloc((size_t)e->p.max_seqs * sizeof *e->pend_r);
    e->pend_k = malloc((size_t)e->p.max_seqs * sizeof(int));
    if (!e->groups || !e->live || !e->seqs || !e->patches || !e->logits || !e->q || !e->p_scratch ||
        !e->r_scratch || !e->ids || !e->ids_dev || !e->samp || !e->samp_dev || !e->pol_m ||
        !e->pol_k || !e->pol_d || !e->pend_r || !e->pend_k) {
        td_errf(err, errlen, "engine: out of memory for step buffers (%zu MiB of logits)",
                ((size_t)e->p.max_batch_tokens * V * 4) >> 20);
        goto fail;
    }
    if (load_eos(e, err, errlen)) goto fail;
    *out = e;
    return 0;
fail:
    if (e->split.comm && e->follower) { // the leader's next step fails with the reason
        char why[600];
        snprintf(why, sizeof why, "rank %d's engine: %s", e->split.comm->rank, err);
        e->split.comm->ops->abort(e->split.comm, why);
    }
    td_engine_free(e);
    return -1;
}

static void request_free(struct request *r) {
    free(r->blocks);
    free(r->toks);
    free(r->src);
    free(r);
}

int td_engine_follow(struct td_engine *e, char *err, size_t errlen) {
    if (!e->follower)
        return td_errf(err, errlen, "engine: only a split model's rank past 0 follows");
    struct td_follow_ops ops = {.apply = state_apply, .ctx = e, .serve = e->serve};
    return td_forward_follow(e->run, &e->state, &ops, err, errlen);
}

void td_engine_free(struct td_engine *e) {
    if (!e) return;
    if (e->split.comm && !e->follower) td_forward_stop(e->run);
    for (int i = 0; i < e->n_reqs; i++)
        request_free(e->reqs[i]);
    for (int i = 0; i < e->n_doomed; i++)
        request_free(e->doomed[i]);
    free(e->reqs);
    free(e->doomed);
    free(e->active);
    free(e->groups);
    free(e->live);
    free(e->seqs);
    free(e->logits);
    if (e->ids) e->b->release_host(e->ids);
    if (e->ids_dev) e->state.backend->release(e->ids_dev);
    free(e->samp);
    if (e->samp_dev) e->state.backend->release(e->samp_dev);
    free(e->q);
    free(e->p_scratch);
    free(e->r_scratch);
    if (e->trace) {
        policy_trace(&e->pol, stderr);
        double k = e->h[HOST_PHASES] > 0 ? 1e6 / e->h[HOST_PHASES] : 0.0;
        fprintf(stderr,
                "policy: host a step (us): schedule %.1f, plan %.1f, launch %.1f, beside the "
                "device %.1f, wait %.1f, drafts collected %.1f, verify %.1f, drafter %.1f\n",
                k * e->h[0], k * e->h[1], k * e->h[2], k * e->h[3], k * e->h[4], k * e->h[5],
                k * e->stats.t_verify, k * e->stats.t_draft);
        const struct td_state *ds = e->md.impl ? e->md.state(e->md.impl) : NULL;
        fprintf(stderr, "policy: graphs: target %d (%.1f ms), drafter %d (%.1f ms)\n",
                e->state.n_captured, 1e3 * e->state.t_capture, ds ? ds->n_captured : 0,
                ds ? 1e3 * ds->t_capture : 0.0);
    }
    policy_free(&e->pol);
    free(e->pol_m);
    free(e->pol_k);
    free(e->pol_d);
    free(e->pend_r);
    free(e->pend_k);
    draft_free(e->drafter);
    if (e->md.impl) e->md.free(e->md.impl);
    td_serve_free(e->serve);
    free(e->dseqs);
    free(e->patches);
    meta_plan_free(&e->plan);
    td_prefix_free(e->pool);
    if (e->cpool) e->state.backend->release(e->cpool);
    free(e->ckpt_of);
    free(e->ckpt_free);
    free(e->ckpt_pos);
    td_state_free(&e->state);
    td_split_free(&e->split);
    td_comm_nccl_free(&e->dcomm);
    free(e->rank_bytes);
    if (e->dev.backend) td_model_free(&e->dev);
    td_model_free(&e->model);
    free(e);
}

const char *td_engine_kv_dtype(const struct td_engine *e) {
    return td_kv_dtype_name(e->state.kv_dtype);
}

int td_engine_gpus(void) {
    return td_backend_gpus();
}

int td_engine_kv_dtype_parse(const char *name) {
    return td_kv_dtype_parse(name);
}

size_t td_engine_cache_bytes(const struct td_engine *e) {
    return e->state.bytes;
}

double td_engine_token_bytes(const struct td_engine *e) {
    return td_state_token_bytes(&e->model.cfg, e->state.kv_dtype);
}

int td_engine_ranks(const struct td_engine *e, int r, size_t *weights, size_t *caches) {
    int W = e->split.comm ? e->split.comm->world : 1;
    if (r < 0 || r >= W) return W;
    *weights = W > 1 ? (size_t)e->rank_bytes[2 * r] : td_engine_weight_bytes(e);
    *caches = W > 1 ? (size_t)e->rank_bytes[2 * r + 1] : e->state.bytes;
    return W;
}

size_t td_engine_weight_bytes(const struct td_engine *e) {
    size_t t = e->dev.backend ? e->dev.placed_bytes : 0; // (placed: run is dev, or its rank's view)
    return t + (e->md.impl && e->md.weight_bytes ? e->md.weight_bytes(e->md.impl) : 0) +
           td_serve_weight_bytes(e->serve);
}

const char *td_engine_backend(const struct td_engine *e) {
    return e->b->name;
}

const char *td_engine_draft(const struct td_engine *e) {
    return e->p.draft;
}

int td_engine_draft_tokens(const struct td_engine *e) {
    return e->p.max_draft;
}

int td_engine_vocab(const struct td_engine *e) {
    return e->model.cfg.vocab;
}

const struct td_engine_stats *td_engine_stats(struct td_engine *e) {
    const struct td_state *ds = e->md.impl ? e->md.state(e->md.impl) : NULL;
    e->stats.graphs = e->state.n_captured + (ds ? ds->n_captured : 0);
    e->stats.t_capture = e->state.t_capture + (ds ? ds->t_capture : 0.0);
    struct td_prefix_stats ps;
    e->stats.hist_blocks = e->state.n_blocks, e->stats.hist_block = e->state.hist_block;
    e->stats.hist_held = 0;
    if (e->pool) {
        td_prefix_stats(e->pool, &ps);
        e->stats.hist_held = ps.in_use;
    }
    if (!td_engine_prefix_stats(e, &ps)) {
        e->stats.prefix_lookups = ps.lookups, e->stats.prefix_hits = ps.hits;
        e->stats.prefix_hit_tokens = ps.hit_tokens;
        e->stats.prefix_evictions = ps.evictions;
        e->stats.prefix_held = ps.in_use, e->stats.prefix_cached = ps.cached;
        e->stats.prefix_free = ps.free;
    }
    return &e->stats;
}

int td_engine_submit(struct td_engine *e, const struct td_request_params *rp, char *err,
                     size_t errlen) {
    const struct td_sampling *s = &rp->sampling;
    if (e->follower)
        return td_errf(err, errlen, "request: rank %d follows; requests go to rank 0",
                       e->split.comm->rank);
    if (rp->n_prompt < 1 || !rp->prompt) return td_errf(err, errlen, "request: empty prompt");
    if (rp->n_prompt > e->p.max_ctx) {
        long most = e->model.cfg.max_position_embeddings;
        if (most > e->p.max_ctx)
            return td_errf(err, errlen,
                           "request: prompt of %d tokens exceeds the context of %d (max_ctx; the "
                           "model takes up to %ld)",
                           rp->n_prompt, e->p.max_ctx, most);
        return td_errf(err, errlen,
                       "request: prompt of %d tokens exceeds the context of %d (the model's own "
                       "limit)",
                       rp->n_prompt, e->p.max_ctx);
    }
    if (rp->max_tokens < 1)
        return td_errf(err, errlen, "request: max_tokens %d, must be >= 1", rp->max_tokens);
    if (!(s->temperature >= 0.0f) || s->top_k < 0 || !(s->top_p > 0.0f && s->top_p <= 1.0f))
        return td_errf(err, errlen,
                       "request: temperature %g (>= 0), top_k %d (>= 0), top_p %g (in "
                       "(0, 1]) out of range",
                       s->temperature, s->top_k, s->top_p);
    for (int i = 0; i < rp->n_prompt; i++)
        if (rp->prompt[i] < 0 || rp->prompt[i] >= e->model.cfg.vocab)
            return td_errf(err, errlen, "request: prompt token %d (item %d) is outside [0, %d)",
                           rp->prompt[i], i + 1, e->model.cfg.vocab);
    if (rp->n_stop_ids < 0 || rp->n_stop_ids > TD_MAX_STOP_IDS || (rp->n_stop_ids && !rp->stop_ids))
        return td_errf(err, errlen, "request: %d stop token ids, at most %d", rp->n_stop_ids,
                       TD_MAX_STOP_IDS);
    for (int i = 0; i < rp->n_stop_ids; i++)
        if (rp->stop_ids[i] < 0 || rp->stop_ids[i] >= e->model.cfg.vocab)
            return td_errf(err, errlen, "request: stop token id %d is outside [0, %d)",
                           rp->stop_ids[i], e->model.cfg.vocab);
    if (e->next_id == INT_MAX)
        return td_errf(err, errlen, "request: %d requests submitted, no ids left", INT_MAX);
    if (e->n_reqs == e->cap) { // both arrays hold cap (active is never longer than reqs)
        int cap = e->cap > INT_MAX / 2 ? INT_MAX : e->cap ? 2 * e->cap : 16;
        struct request **nr = realloc(e->reqs, (size_t)cap * sizeof *nr);
        if (nr) e->reqs = nr; // a larger block, used once both have grown
        struct request **na = nr ? realloc(e->active, (size_t)cap * sizeof *na) : NULL;
        if (na) e->active = na;
        if (!nr || !na) return td_errf(err, errlen, "request: out of memory");
        e->cap = cap;
    }
    // tokens: the prompt, then at most what the context leaves (a sequence ends once max_ctx
    // tokens are fed, the last one sampled beside them), however large max_tokens is
    long room = (long)e->p.max_ctx + 1 - rp->n_prompt;
    long gen = rp->max_tokens < room ? rp->max_tokens : room;
    struct request *r = calloc(1, sizeof *r);
    if (r) r->cap = (int)(rp->n_prompt + gen + TD_MAX_DRAFT + 1);
    if (!r || !(r->toks = malloc((size_t)r->cap * sizeof(int32_t))) ||
        !(r->src = calloc((size_t)r->cap, 1))) {
        if (r) free(r->toks);
        free(r);
        return td_errf(err, errlen, "request: out of memory");
    }
    if (e->pool && !(r->blocks = malloc((size_t)e->state.max_blocks * sizeof(int32_t)))) {
        request_free(r);
        return td_errf(err, errlen, "request: out of memory");
    }
    e->reqs[e->n_reqs++] = r;
    memcpy(r->toks, rp->prompt, (size_t)rp->n_prompt * sizeof(int32_t));
    if (rp->n_stop_ids) memcpy(r->stop_ids, rp->stop_ids, (size_t)rp->n_stop_ids * sizeof(int32_t));
    r->n_stop_ids = rp->n_stop_ids;
    r->id = e->next_id++;
    r->st.t_submit = now();
    r->st.t_admit = r->st.t_first = r->st.t_end = -1.0;
    r->n_prompt = r->n_toks = rp->n_prompt;
    r->max_tokens = rp->max_tokens;
    r->sampling = *s;
    r->ignore_eos = rp->ignore_eos;
    r->no_draft = rp->no_draft;
    r->pol_d = TD_MAX_DRAFT;
    r->slot = -1;
    r->status = TD_REQ_QUEUED;
    e->active[e->n_active++] = r;
    return r->id;
}

/* the request with this id, or NULL (never submitted, or released) */
static struct request *find(const struct td_engine *e, int id) {
    int lo = 0, hi = e->n_reqs; // reqs ascend by id
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (e->reqs[mid]->id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < e->n_reqs && e->reqs[lo]->id == id ? e->reqs[lo] : NULL;
}

static void finish(struct td_engine *e, struct request *r, enum td_req_status st,
                   enum td_finish why) {
    r->status = st;
    r->finish = why;
    r->st.t_end = now();
    if (e->caching && st == TD_REQ_FINISHED && r->slot >= 0) prefix_publish_tail(e, r);
    if (r->slot >= 0) td_state_seq_release(&e->state, r->slot);
    r->slot = -1;
    if (r->n_blocks) td_prefix_release(e->pool, r->blocks, r->n_blocks);
    r->n_blocks = r->n_pub = 0;
}

static int is_done(const struct request *r) {
    return r->status == TD_REQ_FINISHED || r->status == TD_REQ_FAILED;
}

void td_engine_cancel(struct td_engine *e, int id) {
    struct request *r = find(e, id);
    if (!r || is_done(r)) return;
    snprintf(r->msg, sizeof r->msg, "cancelled");
    finish(e, r, TD_REQ_FINISHED, TD_FINISH_NONE);
}

int td_engine_stop_at(struct td_engine *e, int id, int n_keep) {
    struct request *r = find(e, id);
    if (!r || n_keep < 0 || n_keep > r->n_toks - r->n_prompt) return -1;
    // the committed length moves back to the cut (state by position: the rest is forgotten)
    // and the request ends there, stopped; what it emitted after the cut is dropped, and the
    // accepted drafts among it leave its count (which stays the drafts its output holds)
    for (int i = r->n_prompt + n_keep; i < r->n_toks; i++)
        if (r->src[i] != TD_SRC_TARGET) r->st.accepted--, r->st.accepted_at[r->src[i] - 1]--;
    r->n_toks = r->n_prompt + n_keep;
    r->msg[0] = 0;
    if (r->status == TD_REQ_FAILED) r->status = TD_REQ_FINISHED; // a failure after the stop
    if (is_done(r))
        r->finish = TD_FINISH_STOP;
    else
        finish(e, r, TD_REQ_FINISHED, TD_FINISH_STOP);
    return 0;
}

/* the requests released while the last model drafter call held them, freed (that call is
 * collected) */
static void free_doomed(struct td_engine *e) {
    for (int i = 0; i < e->n_doomed; i++)
        request_free(e->doomed[i]);
    e->n_doomed = 0;
}

/* the last model drafter call collected now (its queued results waited for) and the requests
 * released under it freed: when no request is left to step for, no step would collect it */
static void flush_drafter(struct td_engine *e) {
    char err[256];
    if (e->md.impl && e->n_live && e->md.collect(e->md.impl, e->dseqs, err, sizeof err))
        return; // (a device fault: the next step reports it; they stay held till then)
    for (int j = 0; j < e->n_live; j++)
        e->live[j]->drafts_dev = NULL;
    e->n_live = 0;
    free_doomed(e);
}

void td_engine_release(struct td_engine *e, int id) {
    struct request *r = find(e, id);
    if (!r) return;
    td_engine_cancel(e, id);
    int i = 0;
    while (e->reqs[i] != r)
        i++;
    memmove(e->reqs + i, e->reqs + i + 1, (size_t)(e->n_reqs - i - 1) * sizeof *e->reqs);
    e->n_reqs--;
    for (int a = 0; a < e->n_active; a++) // cancelled: gone from active at the step's end, or now
        if (e->active[a] == r) {
            memmove(e->active + a, e->active + a + 1,
                    (size_t)(e->n_active - a - 1) * sizeof *e->active);
            e->n_active--;
            break;
        }
    int held = 0; // the last model drafter call's sequences: collected by the next step
    for (int j = 0; j < e->n_live; j++)
        held |= e->live[j] == r;
    if (!held) {
        request_free(r);
        return;
    }
    if (e->n_doomed == e->cap_doomed) {
        int cap = e->cap_doomed ? 2 * e->cap_doomed : 16;
        struct request **nd = realloc(e->doomed, (size_t)cap * sizeof *nd);
        if (!nd) { // kept (a request's bytes) rather than freed under the drafter
            r->released = 1;
            return;
        }
        e->doomed = nd;
        e->cap_doomed = cap;
    }
    e->doomed[e->n_doomed++] = r;
    // the last one released: nothing will step, so nothing would collect the call and free it
    // (release_many/dspark ended with a request held)
    if (!e->n_reqs) flush_drafter(e);
}

int td_engine_request_stats(const struct td_engine *e, int id, struct td_request_stats *out) {
    const struct request *r = find(e, id);
    if (!r) return -1;
    *out = r->st;
    return 0;
}

void td_engine_load(const struct td_engine *e, struct td_engine_load *out) {
    memset(out, 0, sizeof *out);
    for (int a = 0; a < e->n_active; a++) {
        const struct request *r = e->active[a];
        if (r->status == TD_REQ_QUEUED) out->queued++;
        if (r->status == TD_REQ_PREFILL) out->prefill++;
        if (r->status == TD_REQ_DECODE) out->decode++;
    }
    out->slots_total = e->p.max_seqs;
    out->slots_busy = out->prefill + out->decode;
    out->requests_held = e->n_reqs + e->n_doomed;
}

int td_engine_output(const struct td_engine *e, int id, const int32_t **tokens, int *n_tokens,
                     enum td_req_status *status, enum td_finish *why, const char **msg) {
    const struct request *r = find(e, id);
    if (!r) return -1;
    if (tokens) *tokens = r->toks + r->n_prompt;
    if (n_tokens) *n_tokens = r->n_toks - r->n_prompt;
    if (status) *status = r->status;
    if (why) *why = r->finish;
    if (msg) *msg = r->msg;
    return 0;
}

int td_engine_output_sources(const struct td_engine *e, int id, const uint8_t **src) {
    const struct request *r = find(e, id);
    if (!r) return -1;
    *src = r->src + r->n_prompt;
    return 0;
}

/* append one generated token (src: TD_SRC_TARGET, or the draft position it was accepted at);
 * returns 1 when the request is done */
static int emit(struct td_engine *e, struct request *r, int32_t tok, int src) {
    if (r->n_toks == r->n_prompt) r->st.t_first = now();
    r->src[r->n_toks] = (uint8_t)src;
    r->toks[r->n_toks++] = tok;
    e->stats.tokens_out++;
    if (!r->ignore_eos && is_eos(e, tok)) {
        finish(e, r, TD_REQ_FINISHED, TD_FINISH_EOS);
        return 1;
    }
    for (int i = 0; i < r->n_stop_ids; i++)
        if (r->stop_ids[i] == tok) {
            finish(e, r, TD_REQ_FINISHED, TD_FINISH_STOP);
            return 1;
        }
    if (r->n_toks - r->n_prompt >= r->max_tokens) {
        finish(e, r, TD_REQ_FINISHED, TD_FINISH_LENGTH);
        return 1;
    }
    return 0;
}

static void fail_nan(struct td_engine *e, struct request *r, long pos) {
    e->stats.nan_rows++;
    snprintf(r->msg, sizeof r->msg, "non-finite logits for position %ld; no token emitted", pos);
    finish(e, r, TD_REQ_FAILED, TD_FINISH_ERROR);
}

/* drafts the next round of r may verify: a round emits up to k + 1 tokens and feeds k + 1 rows */
static int draft_budget(const struct td_engine *e, const struct request *r, int fed) {
    int k = r->no_draft ? 0 : e->p.max_draft;
    int left = r->max_tokens - (r->n_toks - r->n_prompt);
    if (k > left - 1) k = left - 1;
    if (k > e->p.max_ctx - fed - 1) k = e->p.max_ctx - fed - 1;
    return k < 0 ? 0 : k;
}

/* the chance that r's drafts 1 .. j + 1 are all accepted, m[j] for j < k (policy_estimates) */
static void accept_estimates(const struct td_engine *e, const struct request *r, int k, float *m) {
    policy_estimates(r->st.accepted_at, r->st.proposed_at, e->pol.acc, e->pol.prop, e->stats.rounds,
                     k, m);
}

/* the policy's entry i: request r's k drafts on offer and their chances */
static void offer(struct td_engine *e, int i, const struct request *r, int k) {
    e->pol_k[i] = k;
    accept_estimates(e, r, k, e->pol_m + (size_t)i * TD_MAX_DRAFT);
}

/* the adaptive policy: how many of the drafts on offer (groups[i].want) each of the n_dec
 * verify groups verifies, beside prompt_rows rows of prompts waiting; budget: the rows after
 * the anchors, draft_rows: those the drafts may take */
static void choose_drafts(struct td_engine *e, int n_dec, long prompt_rows, int budget,
                          int draft_rows) {
    // a sampled request's tokens depend on the drafts it verifies: it verifies all it is offered
    // (as the fixed policy does), so that they stay the same in any batch; the policy chooses
    // for the greedy ones (whose tokens never depend on them), beside the sampled rows
    int m = 0, fixed = 0;
    for (int i = 0; i < n_dec; i++) {
        struct group *g = &e->groups[i];
        if (g->r->sampling.temperature > 0.0f) {
            fixed += g->want;
            continue;
        }
        offer(e, m++, g->r, g->want);
    }
    if (!m) return;
    if (fixed > draft_rows) fixed = draft_rows;
    struct policy_step st = {.fixed = n_dec - m + fixed,
                             .prompt = prompt_rows < budget ? (int)prompt_rows : budget,
                             .room = budget - fixed,
                             .max_drafts = draft_rows - fixed};
    policy_choose(&e->pol, m, e->pol_k, e->pol_m, TD_MAX_DRAFT, &st, e->pol_d);
    for (int i = 0, j = 0; i < n_dec; i++)
        if (e->groups[i].r->sampling.temperature <= 0.0f)
            e->groups[i].want = e->groups[i].r->pol_d = e->pol_d[j++];
}

/* the prompt rows a step can take of rows waiting (prefill_chunk's cap) */
static long prompt_cap(const struct td_engine *e, long rows) {
    return e->p.prefill_chunk && rows > e->p.prefill_chunk ? e->p.prefill_chunk : rows;
}

/* the rows drafts may take from a step's budget (after the anchors) while prompts wait: the
 * prompts keep up to half of it */
static int draft_share(int budget, long prompt_rows) {
    int share = (budget + 1) / 2; // the prompts' half, rounded up: one row left goes to them
    return budget - (int)(prompt_rows < share ? prompt_rows : share);
}

static float *q_rows(const struct td_engine *e, int slot) {
    return e->q + (size_t)slot * e->p.max_draft * e->model.cfg.vocab;
}

/* A step that replays a graph runs its bucket's rows: the prompt rows of groups n_dec .. n - 1
 * that would take it just past a bucket wait for the next step instead (metadata/plan.h
 * meta_bucket_fit), from the last chunk back (a chunk cut short ends inside the prompt, so it
 * returns no logits). fixed: the decode and verify rows. The groups that remain. */
static int fit_bucket(struct td_engine *e, int n_dec, int n, int fixed) {
    static int off = -1; // TD_BUCKET_FIT=0: the chunks as they come (an A/B)
    if (off < 0) off = getenv("TD_BUCKET_FIT") && !atoi(getenv("TD_BUCKET_FIT"));
    if (off || !e->state.use_graphs || !e->b->graph_begin || n == n_dec) return n;
    int flex = 0;
    for (int i = n_dec; i < n; i++)
        flex += e->seqs[i].n_new;
    // (buckets of 512 rows and more, where a step's cost follows its rows: below, a step's
    // weights cost more than its padding, and a prompt's rows would wait for little)
    int keep = meta_bucket_fit(fixed, flex, e->p.max_batch_tokens, e->state.graph_rows, 256);
    for (int cut = flex - keep; cut > 0 && n > n_dec; n--) {
        struct td_plan_seq *q = &e->seqs[n - 1];
        if (q->n_new > cut) {
            q->n_new -= cut;
            q->skip_logits = q->n_new; // (it ends before its prompt's end now)
            break;
        }
        cut -= q->n_new; // the whole chunk waits
    }
    return n;
}

/* pack this step's groups; returns how many */
static int schedule(struct td_engine *e) {
    int budget = e->p.max_batch_tokens, n = 0;
    // admit in arrival order while slots are free (active is in arrival order)
    for (int a = 0; a < e->n_active; a++) {
        struct request *r = e->active[a];
        if (r->status != TD_REQ_QUEUED) continue;
        int slot = td_state_seq_alloc(&e->state);
        if (slot < 0) break;
        if (e->pool && pool_admit(e, r, slot)) { // its history blocks: it waits for them
            td_state_seq_release(&e->state, slot);
            break;
        }
        r->slot = slot;
        r->status = TD_REQ_PREFILL;
        r->st.t_admit = now();
    }
    // 1. every decoding request's anchor row, oldest first: a request that decodes advances
    //    every step, however many drafts the others would like
    for (int a = 0; a < e->n_active && n < e->p.max_seqs && budget > 0; a++) {
        struct request *r = e->active[a];
        if (r->status != TD_REQ_DECODE) continue;
        struct group *g = &e->groups[n];
        g->r = r;
        g->prefill = 0;
        g->rows[0] = r->toks[r->n_toks - 1]; // the anchor: sampled, not yet fed
        g->n_drafts = 0;
        g->q_onehot = 1;
        int k = e->drafter || e->md.impl ? draft_budget(e, r, e->state.len[r->slot]) : 0;
        if (e->md.impl && r->n_drafts < k) k = r->n_drafts; // drafted at the end of the last step
        g->want = k;
        n++;
        budget--;
    }
    int n_dec = n;
    // 2. drafts share the rows the anchors leave, one draft position at a time (every request's
    //    first draft before any request's second: earlier drafts are accepted more often);
    //    while prompts wait, they keep up to half of those rows
    long prompt_rows = 0;
    for (int a = 0; a < e->n_active; a++) {
        const struct request *r = e->active[a];
        if (r->status == TD_REQ_PREFILL) prompt_rows += r->n_prompt - e->state.len[r->slot];
    }
    prompt_rows = prompt_cap(e, prompt_rows);
    int draft_rows = draft_share(budget, prompt_rows);
    long offered = 0;
    for (int i = 0; i < n_dec; i++)
        offered += e->groups[i].want;
    if (e->p.draft_policy == TD_POLICY_ADAPTIVE && offered)
        choose_drafts(e, n_dec, prompt_rows, budget, draft_rows);
    for (int j = 1, more = 1; more && draft_rows > 0; j++) {
        more = 0;
        for (int i = 0; i < n_dec && draft_rows > 0; i++)
            if (e->groups[i].want >= j) e->groups[i].n_drafts++, draft_rows--, more = 1;
    }
    for (int i = 0; i < n_dec; i++) {
        struct group *g = &e->groups[i];
        struct request *r = g->r;
        int k = g->n_drafts;
        if (k > 0 && e->drafter) {
            struct td_draft_req dr = {
                .id = r->id, .tokens = r->toks, .n_tokens = r->n_toks, .sampling = &r->sampling};
            g->n_drafts = e->drafter->propose(e->drafter, &dr, k, g->rows + 1, q_rows(e, r->slot),
                                              &g->q_onehot);
        } else if (k > 0) {    // a model drafter's, made at the end of the last step
            if (r->drafts_dev) // still in backend memory: placeholders here (collect_drafts)
                memset(g->rows + 1, 0, (size_t)k * sizeof(int32_t));
            else
                memcpy(g->rows + 1, r->drafts, (size_t)k * sizeof(int32_t));
            g->q_onehot = r->sampling.temperature <= 0.0f; // greedy drafts: one-hot q
        }
        e->seqs[i] = (struct td_plan_seq){.slot = r->slot,
                                          .len_before = e->state.len[r->slot],
                                          .n_new = 1 + g->n_drafts,
                                          .ids = g->rows};
        budget -= g->n_drafts;
    }
    e->step_offered = offered;
    if (n_dec && !offered && e->md.impl && !e->draft_on) e->stats.plain_steps++;
    if (n_dec) {
        int b = policy_bucket(n_dec);
        if (b >= TD_BATCH_BUCKETS) b = TD_BATCH_BUCKETS - 1;
        e->stats.batch_steps[b]++;
        e->stats.batch_wanted[b] += offered;
        for (int i = 0; i < n_dec; i++)
            e->stats.batch_drafts[b] += e->groups[i].n_drafts;
    }
    // 3. prefill chunks in the rows left (prefill_chunk at most), oldest first
    int pf = (int)prompt_cap(e, budget);
    for (int a = 0; a < e->n_active && n < e->p.max_seqs && pf > 0; a++) {
        struct request *r = e->active[a];
        if (r->status != TD_REQ_PREFILL) continue;
        int fed = e->state.len[r->slot], chunk = r->n_prompt - fed;
        if (chunk > pf) chunk = pf;
        if (e->caching) { // chunks end at the prefix cache's block boundaries
            int B = e->state.hist_block, edge = (fed / B + 1) * B;
            if (fed + chunk > edge) chunk = edge - fed;
        }
        struct group *g = &e->groups[n];
        g->r = r;
        g->prefill = 1;
        g->n_drafts = 0;
        // a prompt chunk needs no logits, except the last row of the chunk that ends the prompt
        int skip = fed + chunk < r->n_prompt ? chunk : chunk - 1;
        e->seqs[n] = (struct td_plan_seq){.slot = r->slot,
                                          .len_before = fed,
                                          .n_new = chunk,
                                          .ids = r->toks + fed,
                                          .skip_logits = skip};
        pf -= chunk;
        n++;
    }
    return fit_bucket(e, n_dec, n, e->p.max_batch_tokens - budget);
}

static void hook_rows(struct td_engine *e, const struct request *r, float *rows, long pos0, int n) {
    if (!e->p.logits_hook) return;
    int V = e->model.cfg.vocab;
    for (int j = 0; j < n; j++)
        e->p.logits_hook(e->p.hook_ctx, r->id, pos0 + j, rows + (size_t)j * V, V);
}

/* the target's own token from row j of a group: ids[j] (sample_rows' token, drawn with r's
 * sampling at position pos) when its rows stayed on the backend, else a draw from rows[j];
 * -1 for a non-finite row */
static int32_t target_token(struct td_engine *e, const struct request *r, const float *rows,
                            const int32_t *ids, int j, long pos) {
    int V = e->model.cfg.vocab;
    if (!rows) return ids[j];
    if (td_probs(e->p_scratch, rows + (size_t)j * V, V, &r->sampling)) return -1;
    return td_sample(e->p_scratch, V,
                     td_rand_uniform(r->sampling.seed, (uint64_t)pos, TD_RAND_SAMPLE));
}

/* rows: the group's logits rows on the host, or NULL when they stayed in the backend and ids
 * holds their tokens (sample_rows) */
static void finish_prefill(struct td_engine *e, struct group *g, const float *rows,
                           const int32_t *ids, int n_rows) {
    struct request *r = g->r;
    int fed = e->state.len[r->slot];
    if (fed < r->n_prompt) return;                                // more chunks to come
    int32_t tok = target_token(e, r, rows, ids, n_rows - 1, fed); // the last row's
    if (tok < 0) {
        fail_nan(e, r, fed);
        return;
    }
    r->status = TD_REQ_DECODE;
    if (emit(e, r, tok, TD_SRC_TARGET)) return;
    if (fed >= e->p.max_ctx) finish(e, r, TD_REQ_FINISHED, TD_FINISH_CONTEXT);
}

/* --synthetic-acceptance (lossy): draft j is accepted with probability synthetic_accept[j - 1]
 * after drafts 1 .. j - 1, whatever the target said; the token after them is the target's own
 * at that row (its argmax, or a sample of its row) */
static void synthetic_verdict(struct td_engine *e, const struct request *r,
                              struct verify_result *vr, const float *rows, const int32_t *ids,
                              int L, long pos0) {
    int a = 0;
    while (a < L && a < e->p.n_synthetic &&
           td_rand_uniform(r->sampling.seed, (uint64_t)(pos0 + 1 + a), TD_RAND_ACCEPT) <
               e->p.synthetic_accept[a])
        a++;
    int32_t tok = target_token(e, r, rows, ids, a, pos0 + 1 + a);
    vr->n_accepted = a;
    vr->n_drafts_used = L;
    vr->token = tok;
    if (tok < 0) vr->status = VERIFY_NAN_TARGET, vr->nan_position = pos0 + a;
}

static void finish_round(struct td_engine *e, struct group *g, const float *rows,
                         const int32_t *ids, long pos0) {
    struct request *r = g->r;
    int V = e->model.cfg.vocab, L = g->n_drafts;
    const float *qrows[TD_MAX_DRAFT];
    for (int j = 0; j < L; j++)
        qrows[j] = g->q_onehot ? NULL : q_rows(e, r->slot) + (size_t)j * V;
    struct verify_result vr;
    if (!rows) // greedy, or a plain draw with no drafts: the rows' tokens from the backend
        verify_greedy(&vr, ids, V, g->rows + 1, L, pos0);
    else
        verify_chain(&vr, rows, V, g->rows + 1, g->q_onehot ? NULL : qrows, L, &r->sampling, pos0,
                     e->p_scratch, e->r_scratch, 1.0);
    if (e->p.n_synthetic && vr.status != VERIFY_NAN_TARGET)
        synthetic_verdict(e, r, &vr, rows, ids, L, pos0);
    e->stats.rounds++;
    e->stats.drafted += vr.n_drafts_used;
    for (int j = 0; j < vr.n_drafts_used; j++)
        e->stats.proposed_at[j]++;
    e->stats.accepted += vr.n_accepted;
    for (int j = 0; j < vr.n_accepted; j++)
        e->stats.accepted_at[j]++;
    policy_observe_round(&e->pol, vr.n_drafts_used, vr.n_accepted);
    struct td_request_stats *rs = &r->st; // (its accepted drafts: those emitted, below)
    rs->rounds++;
    rs->drafted += vr.n_drafts_used;
    if (vr.n_drafts_used) rs->spec_rounds++;
    for (int j = 0; j < vr.n_drafts_used; j++)
        rs->proposed_at[j]++;
    if (vr.n_drafts_used) e->stats.accepted_hist[vr.n_accepted]++;
    for (int j = 0; j <= vr.n_accepted && j < vr.n_drafts_used; j++)
        e->stats.reached_at[j]++;
    if (e->drafter && e->drafter->observe) {
        struct td_draft_req dr = {
            .id = r->id, .tokens = r->toks, .n_tokens = r->n_toks, .sampling = &r->sampling};
        e->drafter->observe(e->drafter, &dr, vr.n_accepted);
    }
    // commit: the anchor and the accepted drafts stay fed; the rejected rows are forgotten
    char err[200];
    int keep = (int)pos0 + 1 + vr.n_accepted;
    if (td_state_rollback(&e->state, r->slot, keep, err, sizeof err)) {
        snprintf(r->msg, sizeof r->msg, "%s", err);
        finish(e, r, TD_REQ_FAILED, TD_FINISH_ERROR);
        return;
    }
    // a request counts the accepted drafts its output holds (a round cut by EOS or its length
    // emits fewer than were accepted): the count of tokens td_engine_output_sources marks
    for (int j = 0; j < vr.n_accepted; j++) {
        rs->accepted++, rs->accepted_at[j]++;
        if (emit(e, r, g->rows[1 + j], 1 + j)) return; // EOS or length inside the prefix
    }
    // a non-finite row after the accepted drafts: they are kept, as plain decoding would have
    // emitted them before meeting that row, and the request fails there
    if (vr.status == VERIFY_NAN_TARGET) {
        fail_nan(e, r, vr.nan_position);
        return;
    }
    if (emit(e, r, vr.token, TD_SRC_TARGET)) return;
    if (keep >= e->p.max_ctx) finish(e, r, TD_REQ_FINISHED, TD_FINISH_CONTEXT);
}

/* the drafts a model drafter is asked for a decoding request r whose fed rows are fed */
static int drafts_wanted(const struct td_engine *e, const struct request *r, int fed) {
    int k = r->status == TD_REQ_DECODE ? draft_budget(e, r, fed) : 0;
    // MTP's chain costs a pass a draft: under the policy it drafts one more than it chose
    if (e->mtp && e->p.draft_policy == TD_POLICY_ADAPTIVE && k > r->pol_d + 1) k = r->pol_d + 1;
    return k;
}

/* the adaptive policy, for a model drafter about to run over the n requests reqs[j], k[j]
 * drafts wanted of each: whether the next step is better with its drafts (at its chosen
 * lengths) or plain (then the drafter only keeps up); unchanged when none is wanted */
static void decide_drafting(struct td_engine *e, int n, struct request *const *reqs, const int *k) {
    int m = 0, prompt_rows = 0;
    long behind = 0; // the rows drafting would make the drafter catch up first
    const struct td_state *ds = e->md.state(e->md.impl);
    for (int j = 0; j < n; j++) {
        const struct request *r = reqs[j];
        if (r->status == TD_REQ_PREFILL) prompt_rows += r->n_prompt - e->state.len[r->slot];
        if (!k[j]) continue;
        if (r->sampling.temperature > 0.0f) { // its tokens depend on its drafts: it drafts
            e->draft_on = 1;
            return;
        }
        offer(e, m++, r, k[j]);
        behind += draft_rows_behind(ds, r->slot, e->state.len[r->slot]);
    }
    if (!m) return;
    prompt_rows = (int)prompt_cap(e, prompt_rows);
    int room = e->p.max_batch_tokens - m;
    struct policy_step st = {.prompt = prompt_rows < room ? prompt_rows : room,
                             .room = room,
                             .max_drafts = draft_share(room, prompt_rows),
                             .extra = policy_switch_cost(&e->pol, behind)};
    e->draft_on = policy_drafting(&e->pol, m, e->pol_k, e->pol_m, TD_MAX_DRAFT, &st);
    policy_decided(&e->pol, e->draft_on);
}

/* A plain stretch's decision, made while the step just queued runs (the host's time between
 * steps is the device's idle time): over that step's requests, each decoding one as it will
 * stand after it (one more row), so that the step after it drafts if drafting pays. It sat in
 * the drafter phase, on the critical path: 13-22 us of a 540 us batch-32 step (H100, HumanEval,
 * TD_POLICY_TRACE). */
static void decide_queued(struct td_engine *e, int n_groups) {
    int n = 0;
    for (int i = 0; i < n_groups; i++) {
        struct request *r = e->groups[i].r;
        if (r->status != TD_REQ_PREFILL && r->status != TD_REQ_DECODE) continue;
        e->pend_r[n] = r;
        e->pend_k[n++] = drafts_wanted(e, r, e->state.len[r->slot]);
    }
    decide_drafting(e, n, e->pend_r, e->pend_k);
    e->stats.decisions_queued++;
}

/* MTP or DSpark, after the target step: every live sequence's rows this step committed (never a
 * rejected draft's) reach the drafter (MTP catches them up, DSpark inserts them as context),
 * then each decoding sequence gets its next round's drafts in r->drafts and their q */
static int model_drafter_step(struct td_engine *e, int n_groups, char *err, size_t errlen) {
    int n = 0;
    for (int i = 0; i < n_groups; i++) {
        struct request *r = e->groups[i].r;
        r->n_drafts = 0;
        if (r->status != TD_REQ_PREFILL && r->status != TD_REQ_DECODE) continue; // finished
        int pos0 = e->plan.len_before[i], fed = e->state.len[r->slot];
        int k = drafts_wanted(e, r, fed);
        // row q's next token is r->toks[q + 1] (the token at position q + 1); the last row's
        // is the anchor, the token just sampled (position fed)
        e->dseqs[n] = (struct td_draft_seq){.slot = r->slot,
                                            .pos0 = pos0,
                                            .n = fed - pos0,
                                            .next = r->toks + pos0 + 1,
                                            .toks = r->toks,
                                            .k = k,
                                            .sampling = &r->sampling,
                                            .drafts = r->drafts,
                                            .q = q_rows(e, r->slot),
                                            .conf = NULL};
        e->live[n++] = r;
    }
    e->n_live = n;
    double t0 = now();
    if (e->p.draft_policy == TD_POLICY_ADAPTIVE) {
        // in a plain stretch (the last decision plain, no sampled request drafting, whose
        // tokens depend on its drafts) the next decision is made once the next step is queued
        int quiet = !e->draft_on;
        for (int j = 0; j < n; j++) {
            e->pend_k[j] = e->dseqs[j].k;
            quiet = quiet && !(e->dseqs[j].k && e->live[j]->sampling.temperature > 0.0f);
        }
        if (quiet)
            e->decide_pending = 1;
        else
            decide_drafting(e, n, e->live, e->pend_k);
        for (int j = 0; !e->draft_on && j < n; j++)
            e->dseqs[j].k = 0;
    }
    e->t_policy = now() - t0;
    if (e->md.run(e->md.impl, e->dseqs, n, err, errlen)) return -1;
    for (int j = 0; j < n; j++) {
        e->live[j]->n_drafts = e->dseqs[j].n_drafts;
        e->live[j]->drafts_dev = e->dseqs[j].dev_drafts;
        e->caught += e->dseqs[j].caught;
    }
    e->stats.caught_rows += e->caught;
    return 0;
}

/* A deferred MTP or DSpark round's drafts (dev_drafts) went into this step's plan on the
 * device; now that the step has run, they come to the host, and each verify group keeps the
 * ones that were made (a round may stop short of its k: the rows past it are verified and
 * dropped). */
static int collect_drafts(struct td_engine *e, int n_groups, char *err, size_t errlen) {
    if (!e->md.impl) return 0;
    if (e->md.collect(e->md.impl, e->dseqs, err, errlen)) return -1;
    for (int j = 0; j < e->n_live; j++)
        e->live[j]->n_drafts = e->dseqs[j].n_drafts;
    for (int i = 0; i < n_groups; i++) {
        struct group *g = &e->groups[i];
        struct request *r = g->r;
        if (g->prefill || !r->drafts_dev) continue;
        if (g->n_drafts > r->n_drafts) g->n_drafts = r->n_drafts;
        memcpy(g->rows + 1, r->drafts, (size_t)g->n_drafts * sizeof(int32_t));
    }
    for (int j = 0; j < e->n_live; j++) // on the host now, also for those this step left out
        e->live[j]->drafts_dev = NULL;
    return 0;
}

_Static_assert(POLICY_MAX_K == TD_MAX_DRAFT, "the policy's counts hold every draft position");

/* whether a sampling cuts the distribution (top-k or top-p) */
static int cuts(const struct td_sampling *s, int V) {
    return sample_row_cut(s->temperature, s->top_k, s->top_p, V);
}

/* whether a group's logits rows must come to the host: a sampled request's verify group with
 * drafts (acceptance reads p and q), or one with top-k or top-p where the backend's sample_rows
 * does not draw those (sample_cuts) */
static int host_rows(const struct td_engine *e, const struct group *g, int V) {
    const struct td_sampling *s = &g->r->sampling;
    if (s->temperature <= 0.0f) return 0;
    if (cuts(s, V) && !e->state.backend->sample_cuts) return 1;
    return !g->prefill && g->n_drafts > 0;
}

/* each logits row's draw for sample_rows: a greedy row's argmax, or a draw with its request's
 * temperature and the uniform of the position it predicts (td_rand_uniform, as td_probs and
 * td_sample on the host would draw it: the same token); a row that comes to the host takes the
 * argmax (unused). Every row comes when a logits hook (a test seam that may alter them) is
 * set. Returns whether any rows come to the host; *cut: whether a row the backend draws has a
 * top-k or top-p. */
static int sample_plan(struct td_engine *e, int n, int *cut) {
    int host = 0, V = e->model.cfg.vocab;
    *cut = 0;
    for (int i = 0; i < n; i++) {
        struct group *g = &e->groups[i];
        const struct td_sampling *s = &g->r->sampling;
        g->host = e->p.logits_hook || host_rows(e, g, V); // (a hook may alter the rows)
        host |= g->host;
        int sampled = s->temperature > 0.0f && !g->host;
        *cut |= sampled && cuts(s, V);
        int l0 = e->plan.logit_indptr[i], n_rows = e->plan.logit_indptr[i + 1] - l0;
        // row j holds the token at position p0 + j and draws the one at p0 + j + 1
        long p0 =
            e->plan.len_before[i] + (e->plan.qo_indptr[i + 1] - e->plan.qo_indptr[i]) - n_rows;
        for (int j = 0; j < n_rows; j++) {
            e->samp[l0 + j] = (struct sample_row){
                .temperature = sampled ? s->temperature : 0.0f,
                .top_k = s->top_k,
                .top_p = s->top_p,
                .u = sampled ? td_rand_uniform(s->seed, (uint64_t)(p0 + j + 1), TD_RAND_SAMPLE)
                             : 0.0};
        }
    }
    return host;
}

int td_engine_step(struct td_engine *e, char *err, size_t errlen) {
    if (e->follower)
        return td_errf(err, errlen, "engine: rank %d follows (td_engine_follow), it takes no steps",
                       e->split.comm->rank);
    double ts = now();
    int n = schedule(e), V = e->model.cfg.vocab;
    if (n > 0) {
        policy_age(&e->pol);
        // the phases' wall times (each ends with its results on the host, so they add up)
        double t0 = now();
        e->h[0] += t0 - ts, e->h[HOST_PHASES]++;
        if (meta_plan_build(&e->plan, e->seqs, n, err, errlen)) return -1;
        if (e->pool) pool_check(e, n);
        struct td_forward_io io = target_io(e);
        io.id_patches = e->patches;
        for (int i = 0; i < n; i++) { // drafts the last MTP or DSpark round left on the device
            struct group *g = &e->groups[i];
            if (!g->prefill && g->r->drafts_dev && g->n_drafts)
                e->patches[io.n_id_patches++] = (struct td_id_patch){
                    .row = e->plan.qo_indptr[i] + 1, .n = g->n_drafts, .src = g->r->drafts_dev};
        }
        const struct td_backend *b = e->state.backend;
        // every row's token is drawn where the logits are (sample_rows) and only those ids come
        // to the host; the rows themselves only when a group needs them (host_rows) or a hook
        // reads them
        int cut, host = sample_plan(e, n, &cut);
        double tp = now();
        e->h[1] += tp - t0;
        if (b->mark) b->mark("step");
        if (td_forward_ex(e->run, &e->state, &e->plan, &io, NULL, NULL, err, errlen)) return -1;
        const float *lg = td_forward_logits(&e->state);
        b->to_device(e->samp_dev, e->samp, (size_t)e->plan.n_logit * sizeof *e->samp);
        b->ops.sample_rows(e->ids_dev, lg, e->plan.n_logit, V, e->samp_dev, cut);
        b->to_host_queued(e->ids, e->ids_dev, (size_t)e->plan.n_logit * sizeof(int32_t));
        for (int i = 0; i < n && host; i++) { // the rows of each group that needs them
            size_t l0 = (size_t)e->plan.logit_indptr[i] * V;
            size_t rows = (size_t)(e->plan.logit_indptr[i + 1] - e->plan.logit_indptr[i]) * V;
            if (e->groups[i].host) b->to_host(e->logits + l0, lg + l0, rows * sizeof(float));
        }
        if (b->mark) b->mark("target");
        double tl = now();
        e->h[2] += tl - tp;
        // what the drafter does before the verdict (DSpark's insertion) is queued behind the
        // step and runs on the device while the host verifies; the host waits for the ids only
        if (e->md.impl && e->md.insert_step && e->md.insert_step(e->md.impl, &e->plan, err, errlen))
            return -1;
        if (e->decide_pending) { // (a plain stretch's: behind the queued step)
            e->decide_pending = 0;
            decide_queued(e, n);
        }
        double tq = now();
        if (b->wait_queued(err, errlen)) return -1;
        // (a device communicator's failure: the ids came from a step it did not finish)
        if (e->split.data && e->split.data->ops->poll_error(e->split.data, err, errlen)) return -1;
        double tw = now();
        if (collect_drafts(e, n, err, errlen)) return -1;
        double t1 = now();
        e->h[3] += tq - tl, e->h[4] += tw - tq, e->h[5] += t1 - tw;
        long accepted0 = e->stats.accepted, out0 = e->stats.tokens_out;
        e->stats.t_target += t1 - t0;
        e->stats.steps++;
        e->stats.rows += e->plan.n_tok;
        for (int i = 0; i < n; i++) {
            struct group *g = &e->groups[i];
            // this sequence's logits rows: the last n_rows of its rows
            int l0 = e->plan.logit_indptr[i], n_rows = e->plan.logit_indptr[i + 1] - l0;
            float *rows = g->host ? e->logits + (size_t)l0 * V : NULL;
            const int32_t *ids = e->ids + l0;
            int fed_rows = e->plan.qo_indptr[i + 1] - e->plan.qo_indptr[i];
            if (rows) hook_rows(e, g->r, rows, e->plan.len_before[i] + fed_rows - n_rows, n_rows);
            // the block this step completed, if any (prefix_publish): a prompt chunk's rows are
            // all committed; a round's once verified (a request that ended in it publishes none)
            if (g->prefill) {
                if (e->caching) prefix_publish(e, g->r);
                finish_prefill(e, g, rows, ids, n_rows);
            } else {
                finish_round(e, g, rows, ids, e->plan.len_before[i]); // anchor position
                if (e->caching && g->r->slot >= 0) prefix_publish(e, g->r);
            }
        }
        double t2 = now();
        e->stats.t_verify += t2 - t1;
        e->caught = 0;
        if (e->md.impl && model_drafter_step(e, n, err, errlen)) return -1;
        double t3 = now();
        e->stats.t_draft += t3 - t2;
        if (e->md.impl && e->draft_on) policy_observe_drafter(&e->pol, e->caught, t3 - t2);
        // the whole step, by its rows, with drafts on offer or not: the drafter's phase counts
        // in the step that verifies what it made, as its queued work does (the next forward
        // waits for it). Counted in the step that ran it, a plain step followed by drafting
        // carried the drafter's catch-up, and at batch 32 plain steps of 256 rows cost more
        // than drafting ones (2914 against 2669 us, MTP, HumanEval, TD_POLICY_TRACE).
        // A catch-up after a plain stretch counts in the drafting step after it: leaving such
        // steps out of the tables (an A/B switch, session 25) gained nothing (GSM8K batch 1,
        // MTP: 3527.9 against 3587.8 tok/s, H100)
        policy_observe(&e->pol, e->step_offered > 0, e->plan.n_tok, t2 - t0 + e->t_drafted);
        e->t_drafted = t3 - t2;
        if (e->trace > 1) {
            long verified = 0;
            int decoding = 0;
            for (int i = 0; i < n; i++)
                if (!e->groups[i].prefill) verified += e->groups[i].n_drafts, decoding++;
            fprintf(stderr,
                    "policy: step %ld, %d rows, %ld offered, %ld verified, %ld accepted, %.1f us "
                    "(target %.1f, verify %.1f, drafter %.1f, policy %.1f, caught up %ld), %d "
                    "decoding, %ld out; next %s; host launch %.1f us, wait %.1f us\n",
                    e->stats.steps, e->plan.n_tok, e->step_offered, verified,
                    e->stats.accepted - accepted0, 1e6 * (t3 - t0), 1e6 * (t1 - t0),
                    1e6 * (t2 - t1), 1e6 * (t3 - t2), e->md.impl ? 1e6 * e->t_policy : 0.0,
                    e->caught, decoding, e->stats.tokens_out - out0,
                    !e->md.impl   ? "-"
                    : e->draft_on ? "drafts"
                                  : "plain",
                    1e6 * (tl - tp), 1e6 * (tw - tq));
        }
    }
    // forget finished requests: each step scans only the live ones
    int live = 0;
    for (int a = 0; a < e->n_active; a++)
        if (!is_done(e->active[a])) e->active[live++] = e->active[a];
    e->n_active = live;
    // released requests the last model drafter call held, once that call was collected (a
    // step with no groups collects nothing: its live list still names them)
    if (n > 0 || !e->n_live) free_doomed(e);
    return live;
}
