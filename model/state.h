/* state.h: every sequence's position-indexed caches, in pools sized once at start-up.
 *
 * Per sequence slot and layer (dsv4.md section 4.6, architecture.md section 3):
 *   sliding-window keys   ring of W + max_chunk rows,               slot p mod ring
 *   compressor raw rows   ring of 2m + max_chunk (CSA) / M + max_chunk (HCA) rows of kv and
 *                         position-biased gate, slot p mod ring (CSA: main and indexer)
 * and the history, paged (../shared/design/prefix_cache.md sections 3.2-3.4):
 *   compressed entries    entry w by position, in blocks of B tokens: B / rate entries a layer
 *   (CSA: + indexer keys) (64 CSA entries and keys, 2 HCA entries at B = 256); one block id
 *                         holds every layer's entries of its B positions (a bundled block), and
 *                         each slot's table names the blocks of its positions [b B, (b + 1) B)
 * Blocks come from one pool of n_blocks. The table is scheduler state: each step's plan copies
 * its sequences' rows (plan.h, blocks), so several slots may read one block (a shared prefix)
 * and a block outlives the slot that wrote it. A sequence's truth is its committed length;
 * rollback is td_state_rollback (a length change).
 */
#ifndef TD_STATE_H
#define TD_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "kernels/kv.h"
#include "metadata/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* tokens a history block holds at least; a model's block (td_history_block) is the least
 * multiple of it that every compressed layer's rate divides: 256 for V4 (rates 4 and 128) */
#define TD_HISTORY_BLOCK 256

struct td_layer_state {
    int ring;         /* compressor raw ring rows (0 for sliding layers) */
    int width;        /* raw row width: 2 * head_dim (CSA), head_dim (HCA) */
    int n_entries;    /* entries a sequence reaches at most: max_ctx / rate */
    int per;          /* entries a history block holds: hist_block / rate (0: sliding) */
    void *swa;        /* [max_seqs, swa_ring] keys, td_state.kfmt records */
    float *raw_kv;    /* [max_seqs, ring, width] */
    float *raw_gate;  /* [max_seqs, ring, width] gate + position bias */
    void *entries;    /* [n_blocks, per] compressed entries, kfmt records */
    float *iraw_kv;   /* CSA: [max_seqs, ring, 2 * index_head_dim] */
    float *iraw_gate; /* CSA: [max_seqs, ring, 2 * index_head_dim] */
    void *ientries;   /* CSA: [n_blocks, per] indexer keys, ifmt records */
};

struct td_backend;
struct td_fwd_ws;

struct td_state {
    const struct td_config *cfg;
    const struct td_backend *backend; /* where the pools live */
    long n_steps; /* forwards run on this state (a split model's ranks' check names it) */
    int max_seqs, max_ctx, max_chunk;
    int window;                    /* keys a row sees at most: min(sliding_window, max_ctx) */
    int swa_ring;                  /* window + max_chunk */
    int max_block;                 /* rows of a non-causal block a plan may hold (a DSpark
                                      drafter's; set after init, <= max_chunk), 0: none */
    int kv_dtype;                  /* enum td_kv_dtype of the key caches (kernels/kv.h) */
    struct kv_fmt kfmt;            /* a window key's and a compressed entry's record */
    struct kv_fmt ifmt;            /* an indexer key's record */
    int32_t *len;                  /* [max_seqs] committed length */
    int32_t *hi;                   /* [max_seqs] highest position ever written + 1 */
    uint8_t *in_use;               /* [max_seqs] */
    struct td_layer_state *layers; /* [n_layers] */
    int hist_block;                /* tokens a history block holds (0: no compressed layer) */
    int max_blocks;                /* a table's width: ceil(max_ctx / hist_block) */
    int n_blocks;                  /* blocks in the history pool */
    int32_t *table;                /* [max_seqs, max_blocks] each slot's blocks (host), -1: none */
    int fixed_tables;              /* 1: slot i's table is blocks i * max_blocks .. for good (a
                                      pool of max_seqs x max_blocks); 0: the caller fills them */
    size_t bytes;                  /* total pool bytes */
    int use_graphs;                /* replay captured step graphs where the backend has them */
    int graph_rows;                /* steps of up to this many rows replay graphs (0: 128); more
                                      run eagerly (long prefill chunks) */
    int logit_rows;                /* the most rows a step returns logits for, which a graph's
                                      head runs on, gathered (0: a graph's head runs on every
                                      row, then they are compacted) */
    struct td_fwd_ws *ws;          /* the forward's step buffers (forward.c), made on first use */
    int n_captured;                /* step graphs captured so far, and the seconds it took */
    double t_capture;
    void (*ws_free)(struct td_state *s);
};

/* The rows of a state's window ring (td_state.swa_ring: the window, at most max_ctx, and
 * max_chunk past it), known before the state is made (a drafter made first keeps rows by it);
 * past INT_MAX, td_state_init* refuse the shape. */
long long td_state_swa_ring(const struct td_config *cfg, int max_ctx, int max_chunk);

/* The tokens a history block of this model holds (TD_HISTORY_BLOCK, or the least multiple of it
 * every compressed layer's rate divides); 0 for a model without compressed layers. */
int td_history_block(const struct td_config *cfg);

/* Bytes td_state_init (fp32 keys) / td_state_init_kv / td_state_init_pool would allocate for
 * this shape (n_blocks -1: max_seqs x ceil(max_ctx / B)); the bytes of one bundled block. */
size_t td_state_bytes(const struct td_config *cfg, int max_seqs, int max_ctx, int max_chunk);
size_t td_state_bytes_kv(const struct td_config *cfg, int max_seqs, int max_ctx, int max_chunk,
                         int kv_dtype);
size_t td_state_bytes_pool(const struct td_config *cfg, int max_seqs, int max_ctx, int max_chunk,
                           int kv_dtype, int n_blocks);
size_t td_state_block_bytes(const struct td_config *cfg, int kv_dtype);

/* Bytes one more token of context costs a sequence: its share of the compressed entries and
 * indexer keys (the windows and compressor rings are fixed per slot). */
double td_state_token_bytes(const struct td_config *cfg, int kv_dtype);

/* The name of a key-cache precision ("fp32", "bf16", "fp8"), and back (-1: none of them). */
const char *td_kv_dtype_name(int kv_dtype);
int td_kv_dtype_parse(const char *s);

/* Allocate every pool up front on backend b (NULL: the CPU). A sliding window past max_ctx is
 * sized as max_ctx (the same keys). Refuses (returns -1, message with the numbers) when the
 * pools exceed max_bytes, a ring's rows would pass INT_MAX, or max_chunk < 1; nothing is held
 * then. */
int td_state_init(struct td_state *s, const struct td_config *cfg, int max_seqs, int max_ctx,
                  int max_chunk, size_t max_bytes, const struct td_backend *b, char *err,
                  size_t errlen);

/* The same with the key caches (window keys, compressed entries, indexer keys) in precision
 * kv_dtype (kernels/kv.h: fp32, bf16, or fp8 as the released model quantizes them: main keys
 * with their RoPE dims in bf16, indexer keys all e4m3). The compressor rings stay fp32. */
int td_state_init_kv(struct td_state *s, const struct td_config *cfg, int max_seqs, int max_ctx,
                     int max_chunk, size_t max_bytes, const struct td_backend *b, int kv_dtype,
                     char *err, size_t errlen);

/* td_state_init_kv with a history pool of n_blocks blocks whose tables start empty (-1): the
 * caller gives each slot the blocks its positions reach (td_state_table) before a step writes
 * them, and takes them back (the engine's allocator, engine/prefix.h). n_blocks -1: a pool of
 * max_seqs x max_blocks where slot i's table is blocks i * max_blocks .. (i + 1) * max_blocks - 1
 * for good (fixed_tables: every slot can reach max_ctx, the layout before paging;
 * td_state_init_kv). Refuses fewer blocks than one sequence of max_ctx needs. */
int td_state_init_pool(struct td_state *s, const struct td_config *cfg, int max_seqs, int max_ctx,
                       int max_chunk, int n_blocks, size_t max_bytes, const struct td_backend *b,
                       int kv_dtype, char *err, size_t errlen);

/* slot's block table row: max_blocks ids (-1: none), the caller's to fill unless fixed_tables */
int32_t *td_state_table(struct td_state *s, int slot);

void td_state_free(struct td_state *s);

/* A free slot with length 0, or -1 when every slot is taken. */
int td_state_seq_alloc(struct td_state *s);

void td_state_seq_release(struct td_state *s, int slot);
/* slot, live and empty whatever it held (a split model's follower takes the slot its leader
 * chose): -1 when slot is not one of the state's */
int td_state_seq_take(struct td_state *s, int slot);

/* Plan dims matching this state's rings and context, for batches of up to max_tok rows from
 * max_seq sequences. The forward refuses a plan laid out for anything else. */
struct td_plan_dims td_state_plan_dims(const struct td_state *s, int max_tok, int max_seq);

/* Move the committed length back to new_len. Allowed while no position at or beyond new_len
 * has overwritten a row new_len still needs: hi - new_len <= max_chunk. -1 with a message. */
int td_state_rollback(struct td_state *s, int slot, int new_len, char *err, size_t errlen);

/* Move the committed length forward to new_len without writing the positions in between: for
 * a model whose every layer attends within its window only, whose next rows write the window
 * before anything reads it (a lagging MTP layer, draft/mtp.c). -1 with a message (a layer with
 * compressed entries, or new_len outside [len, max_ctx]). */
int td_state_advance(struct td_state *s, int slot, int new_len, char *err, size_t errlen);

/* The prefix cache's copies of a slot's state (issue 27; ../shared/design/prefix_cache.md
 * sections 3.6-3.7), in backend memory and queued on its stream like every copy there.
 * The window: every layer's sliding-window ring and compressor rings (main and indexer) as they
 * stand, whole; their rows sit at position mod ring in every slot, so a copy saved from one slot
 * at length L loads into another as that slot's state at L (the rows below L - window are never
 * read again). Saved right after the step that made the length L. */
size_t td_state_window_bytes(const struct td_state *s);
int td_state_window_save(const struct td_state *s, int slot, void *dst, char *err, size_t errlen);
/* into a live slot of length 0, whose length becomes len (the length it was saved at) */
int td_state_window_load(struct td_state *s, int slot, const void *src, int len, char *err,
                         size_t errlen);

/* Block id's bytes (td_state_block_bytes: every compressed layer's entries and indexer keys of
 * its positions, layer by layer) into host memory dst, after the stream's work: what the prefix
 * cache's checks read. 0, or -1 with a message (id outside the pool). */
int td_state_block_read(const struct td_state *s, int id, void *dst, char *err, size_t errlen);

/* Block src's bytes into block dst, queued on the backend (a hit on a published tail: the
 * sequence writes on in a copy of it). 0, or -1 with a message (an id outside the pool, or the
 * same block). */
int td_state_block_copy(const struct td_state *s, int dst, int src, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
