/* state.c: pool sizing and allocation for the position-indexed caches. */
#include "state.h"

#include "backend.h"
#include "kernels/err.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the keys a row sees at most: a window past the context is the whole context (no row is at
 * max_ctx or beyond), so rings and plans are sized by the smaller */
static int window_of(const struct td_config *c, int max_ctx) {
    return c->sliding_window < max_ctx ? c->sliding_window : max_ctx;
}

long long td_state_swa_ring(const struct td_config *cfg, int max_ctx, int max_chunk) {
    return (long long)window_of(cfg, max_ctx) + max_chunk;
}

/* one layer's pool shape for one sequence, in 64 bits: ring rows, row width, entries */
struct shape {
    long long ring, width, n_entries;
};

static struct shape layer_shape(const struct td_config *c, int i, int max_ctx, int max_chunk) {
    struct shape s = {.ring = 0, .width = 0, .n_entries = 0};
    int rate = td_layer_rate(c, i), csa = c->attn[i] == TD_ATTN_CSA;
    if (!rate) return s;
    s.ring = (csa ? 2 : 1) * (long long)rate + max_chunk;
    s.width = (csa ? 2 : 1) * (long long)c->head_dim;
    s.n_entries = max_ctx / rate;
    return s;
}

/* a * b + c, saturating at SIZE_MAX (a size that large is refused, never wrapped) */
static size_t mad_sat(size_t a, size_t b, size_t c) {
    if (b && a > (SIZE_MAX - c) / b) return SIZE_MAX;
    return a * b + c;
}

/* a main key's record (window keys and compressed entries: the RoPE dims kept in bf16 by
 * fp8) and an indexer key's (every dim in e4m3 by fp8) */
static struct kv_fmt main_fmt(const struct td_config *c, int kv) {
    return kv_fmt_of(kv, c->head_dim, c->rope_dim);
}

static struct kv_fmt index_fmt(const struct td_config *c, int kv) {
    return kv_fmt_of(kv, c->index_head_dim, 0);
}

int td_history_block(const struct td_config *c) {
    long long B = 0;
    for (int i = 0; i < c->n_layers; i++) {
        long long rate = td_layer_rate(c, i), x = B ? B : TD_HISTORY_BLOCK, y = rate;
        if (!rate) continue;
        while (y) { // B = lcm(B, rate)
            long long t = x % y;
            x = y, y = t;
        }
        B = (B ? B : TD_HISTORY_BLOCK) / x * rate;
        if (B > INT_MAX / 2) return INT_MAX / 2; // refused by td_state_init_pool's checks
    }
    return (int)B;
}

static int blocks_of(int max_ctx, int B) {
    return B ? (int)(((long long)max_ctx + B - 1) / B) : 0;
}

/* the pool that gives every slot its own max_blocks (INT_MAX past the int range: refused) */
static int fixed_pool(const struct td_config *c, int max_seqs, int max_ctx) {
    long long n =
        (long long)(max_seqs > 0 ? max_seqs : 0) * blocks_of(max_ctx, td_history_block(c));
    return n > INT_MAX ? INT_MAX : (int)n;
}

/* a sequence slot's rings (the window keys and the compressor rows) */
static size_t ring_bytes(const struct td_config *c, int max_ctx, int max_chunk) {
    size_t n = 0, F = sizeof(float);
    for (int i = 0; i < c->n_layers; i++) {
        struct shape ls = layer_shape(c, i, max_ctx, max_chunk);
        n = mad_sat(2 * (size_t)ls.ring, (size_t)ls.width * F, n);
        if (c->attn[i] == TD_ATTN_CSA)
            n = mad_sat(4 * (size_t)ls.ring, (size_t)c->index_head_dim * F, n);
    }
    return n;
}

static size_t per_seq_bytes(const struct td_config *c, int max_ctx, int max_chunk, int kv) {
    size_t swa = (size_t)window_of(c, max_ctx) + (size_t)max_chunk;
    size_t n = mad_sat(swa * (size_t)c->n_layers, (size_t)main_fmt(c, kv).rec, 0);
    size_t r = ring_bytes(c, max_ctx, max_chunk);
    return n > SIZE_MAX - r ? SIZE_MAX : n + r;
}

size_t td_state_block_bytes(const struct td_config *c, int kv) {
    size_t n = 0, km = (size_t)main_fmt(c, kv).rec, ki = (size_t)index_fmt(c, kv).rec;
    int B = td_history_block(c);
    for (int i = 0; i < c->n_layers; i++) {
        int rate = td_layer_rate(c, i);
        if (!rate) continue;
        n = mad_sat((size_t)(B / rate), km, n);
        if (c->attn[i] == TD_ATTN_CSA) n = mad_sat((size_t)(B / rate), ki, n);
    }
    return n;
}

size_t td_state_bytes_pool(const struct td_config *cfg, int max_seqs, int max_ctx, int max_chunk,
                           int kv_dtype, int n_blocks) {
    size_t S = (size_t)(max_seqs > 0 ? max_seqs : 0);
    if (n_blocks < 0) n_blocks = fixed_pool(cfg, max_seqs, max_ctx);
    size_t n = mad_sat(per_seq_bytes(cfg, max_ctx, max_chunk, kv_dtype), S, 0);
    return mad_sat((size_t)n_blocks, td_state_block_bytes(cfg, kv_dtype), n);
}

size_t td_state_bytes_kv(const struct td_config *cfg, int max_seqs, int max_ctx, int max_chunk,
                         int kv_dtype) {
    return td_state_bytes_pool(cfg, max_seqs, max_ctx, max_chunk, kv_dtype, -1);
}

size_t td_state_bytes(const struct td_config *cfg, int max_seqs, int max_ctx, int max_chunk) {
    return td_state_bytes_kv(cfg, max_seqs, max_ctx, max_chunk, TD_KV_F32);
}

double td_state_token_bytes(const struct td_config *c, int kv) {
    double n = 0.0;
    for (int i = 0; i < c->n_layers; i++) {
        int rate = td_layer_rate(c, i);
        if (!rate) continue;
        n += (double)main_fmt(c, kv).rec / rate;
        if (c->attn[i] == TD_ATTN_CSA) n += (double)index_fmt(c, kv).rec / rate;
    }
    return n;
}

static const char *const kv_names[] = {"fp32", "bf16", "fp8"};

const char *td_kv_dtype_name(int kv) {
    return kv >= 0 && kv < 3 ? kv_names[kv] : "?";
}

int td_kv_dtype_parse(const char *s) {
    for (int i = 0; s && i < 3; i++)
        if (!strcmp(s, kv_names[i])) return i;
    return -1;
}

static void *pool(const struct td_backend *b, size_t n, size_t each, int *oom) {
    if (!n || *oom) return NULL;
    void *p = b->alloc(n * each);
    if (!p) *oom = 1;
    return p;
}

int td_state_init(struct td_state *s, const struct td_config *cfg, int max_seqs, int max_ctx,
                  int max_chunk, size_t max_bytes, const struct td_backend *b, char *err,
                  size_t errlen) {
    return td_state_init_kv(s, cfg, max_seqs, max_ctx, max_chunk, max_bytes, b, TD_KV_F32, err,
                            errlen);
}

int td_state_init_kv(struct td_state *s, const struct td_config *cfg, int max_seqs, int max_ctx,
                     int max_chunk, size_t max_bytes, const struct td_backend *b, int kv_dtype,
                     char *err, size_t errlen) {
    return td_state_init_pool(s, cfg, max_seqs, max_ctx, max_chunk, -1, max_bytes, b, kv_dtype, err,
                              errlen);
}

int td_state_init_pool(struct td_state *s, const struct td_config *cfg, int max_seqs, int max_ctx,
                       int max_chunk, int n_blocks, size_t max_bytes, const struct td_backend *b,
                       int kv_dtype, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    if (kv_dtype < TD_KV_F32 || kv_dtype > TD_KV_FP8)
        return td_errf(err, errlen, "state: key-cache precision %d is none of fp32, bf16, fp8",
                       kv_dtype);
    if (!b) b = td_backend_cpu();
    if (max_seqs < 1 || max_ctx < 1 || max_chunk < 1)
        return td_errf(err, errlen, "state: max_seqs %d, max_ctx %d, max_chunk %d must all be >= 1",
                       max_seqs, max_ctx, max_chunk);
    // ring rows are int positions: max_chunk past the window (or the compressor's span) fits
    long long swa_ring = td_state_swa_ring(cfg, max_ctx, max_chunk);
    for (int i = 0; i < cfg->n_layers; i++) {
        struct shape ls = layer_shape(cfg, i, max_ctx, max_chunk);
        if (swa_ring > INT_MAX || ls.ring > INT_MAX || ls.width > INT_MAX)
            return td_errf(
                err, errlen,
                "state: layer %d's rings (%lld and %lld rows of %lld floats) exceed the int "
                "range; lower max_ctx (%d) or max_chunk (%d)",
                i, swa_ring, ls.ring, ls.width, max_ctx, max_chunk);
    }
    int B = td_history_block(cfg), NB = blocks_of(max_ctx, B), fixed = n_blocks < 0;
    if (fixed) n_blocks = fixed_pool(cfg, max_seqs, max_ctx);
    if (B > INT_MAX / 4 || n_blocks == INT_MAX)
        return td_errf(err, errlen,
                       "state: a history pool of %d slots x %d blocks of %d tokens passes the int "
                       "range of block ids; lower max_seqs or max_ctx",
                       max_seqs, NB, B);
    if (B && n_blocks < NB)
        return td_errf(err, errlen,
                       "state: a history pool of %d blocks of %d tokens; one sequence of max_ctx "
                       "%d needs %d",
                       n_blocks, B, max_ctx, NB);
    if (!B) n_blocks = 0;
    size_t bytes = td_state_bytes_pool(cfg, max_seqs, max_ctx, max_chunk, kv_dtype, n_blocks);
    if (bytes > max_bytes)
        return td_errf(err, errlen,
                       "state: %s caches for %d sequences x %d tokens (%d history blocks of %d "
                       "tokens) need %zu MiB, over the %zu MiB allowed (lower max_seqs or max_ctx, "
                       "take a smaller --kv-dtype, or raise the memory limit)",
                       td_kv_dtype_name(kv_dtype), max_seqs, max_ctx, n_blocks, B, bytes >> 20,
                       max_bytes >> 20);
    s->cfg = cfg;
    s->backend = b;
    s->max_seqs = max_seqs;
    s->max_ctx = max_ctx;
    s->max_chunk = max_chunk;
    s->window = window_of(cfg, max_ctx);
    s->swa_ring = (int)swa_ring;
    s->bytes = bytes;
    s->kv_dtype = kv_dtype;
    s->kfmt = main_fmt(cfg, kv_dtype);
    s->ifmt = index_fmt(cfg, kv_dtype);
    s->hist_block = B;
    s->max_blocks = NB;
    s->n_blocks = n_blocks;
    s->fixed_tables = fixed;
    int oom = 0;
    s->len = calloc((size_t)max_seqs, sizeof *s->len);
    s->hi = calloc((size_t)max_seqs, sizeof *s->hi);
    s->in_use = calloc((size_t)max_seqs, 1);
    s->layers = calloc((size_t)cfg->n_layers, sizeof *s->layers);
    if (!s->len || !s->hi || !s->in_use || !s->layers) oom = 1;
    if (!oom && NB && !(s->table = malloc((size_t)max_seqs * NB * sizeof *s->table))) oom = 1;
    for (size_t k = 0; !oom && k < (size_t)max_seqs * NB; k++) // fixed: slot i's own blocks
        s->table[k] = fixed ? (int32_t)k : -1;
    for (int i = 0; !oom && i < cfg->n_layers; i++) {
        struct td_layer_state *ls = &s->layers[i];
        struct shape sh = layer_shape(cfg, i, max_ctx, max_chunk); // checked above
        ls->ring = (int)sh.ring;
        ls->width = (int)sh.width;
        ls->n_entries = (int)sh.n_entries;
        int rate = td_layer_rate(cfg, i);
        ls->per = rate ? B / rate : 0;
        size_t S = (size_t)max_seqs, F = sizeof(float), km = (size_t)s->kfmt.rec;
        size_t E = (size_t)n_blocks * ls->per; // the pool's entries of this layer
        ls->swa = pool(b, S * s->swa_ring, km, &oom);
        ls->raw_kv = pool(b, S * ls->ring * ls->width, F, &oom);
        ls->raw_gate = pool(b, S * ls->ring * ls->width, F, &oom);
        ls->entries = pool(b, E, km, &oom);
        if (cfg->attn[i] == TD_ATTN_CSA) {
            ls->iraw_kv = pool(b, S * ls->ring * 2 * cfg->index_head_dim, F, &oom);
            ls->iraw_gate = pool(b, S * ls->ring * 2 * cfg->index_head_dim, F, &oom);
            ls->ientries = pool(b, E, (size_t)s->ifmt.rec, &oom);
        }
    }
    if (oom) {
        td_state_free(s);
        return td_errf(err, errlen, "state: out of memory allocating %zu MiB of caches",
                       bytes >> 20);
    }
    return 0;
}

void td_state_free(struct td_state *s) {
    if (s->ws_free) s->ws_free(s);
    if (s->layers && s->cfg) {
        for (int i = 0; i < s->cfg->n_layers; i++) {
            struct td_layer_state *ls = &s->layers[i];
            void *bufs[] = {ls->swa,     ls->raw_kv,    ls->raw_gate, ls->entries,
                            ls->iraw_kv, ls->iraw_gate, ls->ientries};
            for (int k = 0; k < 7; k++)
                if (bufs[k]) s->backend->release(bufs[k]);
        }
    }
    free(s->layers);
    free(s->table);
    free(s->len);
    free(s->hi);
    free(s->in_use);
    memset(s, 0, sizeof *s);
}

int td_state_seq_alloc(struct td_state *s) {
    for (int i = 0; i < s->max_seqs; i++)
        if (!s->in_use[i]) {
            s->in_use[i] = 1;
            s->len[i] = s->hi[i] = 0;
            return i;
        }
    return -1;
}

int td_state_seq_take(struct td_state *s, int slot) {
    if (slot < 0 || slot >= s->max_seqs) return -1;
    s->in_use[slot] = 1;
    s->len[slot] = s->hi[slot] = 0;
    return 0;
}

void td_state_seq_release(struct td_state *s, int slot) {
    if (slot < 0 || slot >= s->max_seqs) return;
    s->in_use[slot] = 0;
    for (int b = 0; !s->fixed_tables && b < s->max_blocks; b++) // the caller's blocks go back
        s->table[(size_t)slot * s->max_blocks + b] = -1;
}

int32_t *td_state_table(struct td_state *s, int slot) {
    return s->table && slot >= 0 && slot < s->max_seqs ? s->table + (size_t)slot * s->max_blocks
                                                       : NULL;
}

int td_state_rollback(struct td_state *s, int slot, int new_len, char *err, size_t errlen) {
    if (slot < 0 || slot >= s->max_seqs || !s->in_use[slot])
        return td_errf(err, errlen, "rollback: slot %d is not a live sequence", slot);
    if (new_len < 0 || new_len > s->len[slot])
        return td_errf(err, errlen, "rollback: length %d outside [0, %d]", new_len, s->len[slot]);
    if (s->hi[slot] - new_len > s->max_chunk)
        return td_errf(
            err, errlen,
            "rollback: to %d is %d tokens behind the last written position %d; the caches "
            "keep max_chunk = %d",
            new_len, s->hi[slot] - new_len, s->hi[slot], s->max_chunk);
    s->len[slot] = new_len;
    return 0;
}

int td_state_advance(struct td_state *s, int slot, int new_len, char *err, size_t errlen) {
    if (slot < 0 || slot >= s->max_seqs || !s->in_use[slot])
        return td_errf(err, errlen, "advance: slot %d is not a live sequence", slot);
    if (new_len < s->len[slot] || new_len > s->max_ctx)
        return td_errf(err, errlen, "advance: length %d outside [%d, %d]", new_len, s->len[slot],
                       s->max_ctx);
    for (int i = 0; i < s->cfg->n_layers; i++)
        if (s->cfg->attn[i] != TD_ATTN_SLIDING)
            return td_errf(err, errlen,
                           "advance: layer %d keeps compressed entries of every position", i);
    s->len[slot] = new_len;
    if (s->hi[slot] < new_len) s->hi[slot] = new_len; // (a position written is still written)
    return 0;
}

/* A row selects among at most ceil(max_ctx / rate) compressed entries; a larger index_topk
 * picks every one of them, as this does, so the plan's top-k rows are no wider (an index_topk
 * of 10^7 had the plan reserve rows x 10^7 ids: 20 GB for 320 rows) */
static int plan_topk(const struct td_config *c, int max_ctx) {
    long long reach = max_ctx; // no CSA layer: the region is unused; keep it within the context
    for (int i = 0; i < c->n_layers; i++)
        if (c->attn[i] == TD_ATTN_CSA) reach = ((long long)max_ctx + c->rate_csa - 1) / c->rate_csa;
    return c->index_topk < reach ? c->index_topk : (int)reach;
}

struct td_plan_dims td_state_plan_dims(const struct td_state *s, int max_tok, int max_seq) {
    const struct td_config *c = s->cfg;
    struct td_plan_dims d;
    memset(&d, 0, sizeof d);
    d.max_tok = max_tok;
    d.max_seq = max_seq;
    d.max_ctx = s->max_ctx;
    d.window = s->window;
    d.topk = plan_topk(c, s->max_ctx);
    d.swa_ring = s->swa_ring;
    d.block = s->max_block;
    d.hist_block = s->hist_block;
    d.max_blocks = s->max_blocks;
    d.n_blocks = s->hist_block ? s->n_blocks : 0;
    d.slots = s->hist_block ? s->max_seqs : 0;
    d.tables = s->hist_block ? s->table : NULL;
    for (int i = 0; i < c->n_layers; i++) {
        if (c->attn[i] == TD_ATTN_CSA) d.rate_csa = c->rate_csa, d.ring_csa = s->layers[i].ring;
        if (c->attn[i] == TD_ATTN_HCA) d.rate_hca = c->rate_hca, d.ring_hca = s->layers[i].ring;
    }
    return d;
}

/* The pieces a snapshot holds, in order: a slot's rings (window) or history block id's entries;
 * f(ctx, address in the pools, offset in the snapshot, bytes) for each (NULL: none). Returns
 * the snapshot's bytes. */
typedef void (*piece_fn)(void *ctx, char *at, size_t off, size_t bytes);

static size_t pieces(const struct td_state *s, int slot, int window, int id, piece_fn f,
                     void *ctx) {
    const struct td_config *c = s->cfg;
    size_t off = 0, km = (size_t)s->kfmt.rec, ki = (size_t)s->ifmt.rec, F = sizeof(float);
    size_t sl = (size_t)(slot < 0 ? 0 : slot), bl = (size_t)(id < 0 ? 0 : id);
#define PIECE(base, first, bytes)                                                                  \
    do {                                                                                           \
        if (f) f(ctx, (char *)(base) + (first), off, (bytes));                                     \
        off += (bytes);                                                                            \
    } while (0)
    for (int i = 0; i < c->n_layers; i++) {
        const struct td_layer_state *ls = &s->layers[i];
        int rate = td_layer_rate(c, i), csa = c->attn[i] == TD_ATTN_CSA;
        size_t ring = (size_t)ls->ring, iw = 2 * (size_t)c->index_head_dim, per = (size_t)ls->per;
        if (window) {
            PIECE(ls->swa, sl * s->swa_ring * km, (size_t)s->swa_ring * km);
            if (!rate) continue;
            PIECE(ls->raw_kv, sl * ring * ls->width * F, ring * ls->width * F);
            PIECE(ls->raw_gate, sl * ring * ls->width * F, ring * ls->width * F);
            if (csa) {
                PIECE(ls->iraw_kv, sl * ring * iw * F, ring * iw * F);
                PIECE(ls->iraw_gate, sl * ring * iw * F, ring * iw * F);
            }
        } else if (rate) {
            PIECE(ls->entries, bl * per * km, per * km);
            if (csa) PIECE(ls->ientries, bl * per * ki, per * ki);
        }
    }
#undef PIECE
    return off;
}

struct piece_copy {
    const struct td_backend *b;
    char *snap;
    int load; /* 1: snapshot -> pools; 0: pools -> snapshot; 2: pools -> host */
};

static void copy_piece(void *ctx, char *at, size_t off, size_t bytes) {
    struct piece_copy *pc = ctx;
    if (pc->load == 1)
        pc->b->ops.copy(at, pc->snap + off, bytes);
    else if (pc->load == 2)
        pc->b->to_host(pc->snap + off, at, bytes);
    else
        pc->b->ops.copy(pc->snap + off, at, bytes);
}

static int live_slot(const struct td_state *s, int slot, const char *what, char *err,
                     size_t errlen) {
    if (slot < 0 || slot >= s->max_seqs || !s->in_use[slot])
        return td_errf(err, errlen, "%s: slot %d is not a live sequence", what, slot);
    return 0;
}

size_t td_state_window_bytes(const struct td_state *s) {
    return pieces(s, -1, 1, -1, NULL, NULL);
}

int td_state_window_save(const struct td_state *s, int slot, void *dst, char *err, size_t errlen) {
    if (live_slot(s, slot, "window save", err, errlen)) return -1;
    struct piece_copy pc = {s->backend, dst, 0};
    pieces(s, slot, 1, -1, copy_piece, &pc);
    return 0;
}

int td_state_window_load(struct td_state *s, int slot, const void *src, int len, char *err,
                         size_t errlen) {
    if (live_slot(s, slot, "window load", err, errlen)) return -1;
    if (s->len[slot] || len < 0 || len > s->max_ctx)
        return td_errf(err, errlen, "window load: slot %d has length %d, the window %d (max %d)",
                       slot, s->len[slot], len, s->max_ctx);
    struct piece_copy pc = {s->backend, (char *)src, 1};
    pieces(s, slot, 1, -1, copy_piece, &pc);
    s->len[slot] = s->hi[slot] = len;
    return 0;
}

int td_state_block_read(const struct td_state *s, int id, void *dst, char *err, size_t errlen) {
    if (id < 0 || id >= s->n_blocks)
        return td_errf(err, errlen, "block read: block %d outside the pool of %d", id, s->n_blocks);
    struct piece_copy pc = {s->backend, dst, 2};
    pieces(s, -1, 0, id, copy_piece, &pc);
    return 0;
}

struct block_move {
    const struct td_backend *b;
    long long delta; /* dst - src, in blocks */
};

/* a block's piece is its layer's array at block id, per entries of the piece's bytes each */
static void move_piece(void *ctx, char *at, size_t off, size_t bytes) {
    struct block_move *m = ctx;
    (void)off;
    m->b->ops.copy(at + m->delta * (long long)bytes, at, bytes);
}

int td_state_block_copy(const struct td_state *s, int dst, int src, char *err, size_t errlen) {
    if (dst < 0 || dst >= s->n_blocks || src < 0 || src >= s->n_blocks || dst == src)
        return td_errf(err, errlen, "block copy: blocks %d <- %d in a pool of %d", dst, src,
                       s->n_blocks);
    struct block_move m = {s->backend, (long long)dst - src};
    pieces(s, -1, 0, src, move_piece, &m);
    return 0;
}
