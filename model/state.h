/* state.h: every sequence's position-indexed caches, in pools sized once at start-up.
 *
 * Per sequence slot and layer (dsv4.md section 4.6, architecture.md section 3):
 *   sliding-window keys   ring of W + max_chunk rows,               slot p mod ring
 *   compressor raw rows   ring of 2m + max_chunk (CSA) / M + max_chunk (HCA) rows of kv and
 *                         position-biased gate, slot p mod ring (CSA: main and indexer)
 *   compressed entries    append-only by entry w, capacity max_ctx / rate (CSA: + indexer keys)
 * A sequence's truth is its committed length; rollback is td_state_rollback (a length change).
 */
#ifndef TD_STATE_H
#define TD_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "metadata/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

struct td_layer_state {
    int ring;         /* compressor raw ring rows (0 for sliding layers) */
    int width;        /* raw row width: 2 * head_dim (CSA), head_dim (HCA) */
    int n_entries;    /* entry capacity: max_ctx / rate */
    float *swa;       /* [max_seqs, swa_ring, head_dim] */
    float *raw_kv;    /* [max_seqs, ring, width] */
    float *raw_gate;  /* [max_seqs, ring, width] gate + position bias */
    float *entries;   /* [max_seqs, n_entries, head_dim] */
    float *iraw_kv;   /* CSA: [max_seqs, ring, 2 * index_head_dim] */
    float *iraw_gate; /* CSA: [max_seqs, ring, 2 * index_head_dim] */
    float *ientries;  /* CSA: [max_seqs, n_entries, index_head_dim] indexer keys */
};

struct td_backend;
struct td_fwd_ws;

struct td_state {
    const struct td_config *cfg;
    const struct td_backend *backend; /* where the pools live */
    int max_seqs, max_ctx, max_chunk;
    int window;                    /* keys a row sees at most: min(sliding_window, max_ctx) */
    int swa_ring;                  /* window + max_chunk */
    int max_block;                 /* rows of a non-causal block a plan may hold (a DSpark
                                      drafter's; set after init, <= max_chunk), 0: none */
    int32_t *len;                  /* [max_seqs] committed length */
    int32_t *hi;                   /* [max_seqs] highest position ever written + 1 */
    uint8_t *in_use;               /* [max_seqs] */
    struct td_layer_state *layers; /* [n_layers] */
    size_t bytes;                  /* total pool bytes */
    int use_graphs;                /* replay captured step graphs where the backend has them */
    struct td_fwd_ws *ws;          /* the forward's step buffers (forward.c), made on first use */
    int n_captured;                /* step graphs captured so far, and the seconds it took */
    double t_capture;
    void (*ws_free)(struct td_state *s);
};

/* Bytes td_state_init would allocate for this shape. */
size_t td_state_bytes(const struct td_config *cfg, int max_seqs, int max_ctx, int max_chunk);

/* Allocate every pool up front on backend b (NULL: the CPU). A sliding window past max_ctx is
 * sized as max_ctx (the same keys). Refuses (returns -1, message with the numbers) when the
 * pools exceed max_bytes, a ring's rows would pass INT_MAX, or max_chunk < 1; nothing is held
 * then. */
int td_state_init(struct td_state *s, const struct td_config *cfg, int max_seqs, int max_ctx,
                  int max_chunk, size_t max_bytes, const struct td_backend *b, char *err,
                  size_t errlen);

void td_state_free(struct td_state *s);

/* A free slot with length 0, or -1 when every slot is taken. */
int td_state_seq_alloc(struct td_state *s);

void td_state_seq_release(struct td_state *s, int slot);

/* Plan dims matching this state's rings and context, for batches of up to max_tok rows from
 * max_seq sequences. The forward refuses a plan laid out for anything else. */
struct td_plan_dims td_state_plan_dims(const struct td_state *s, int max_tok, int max_seq);

/* Move the committed length back to new_len. Allowed while no position at or beyond new_len
 * has overwritten a row new_len still needs: hi - new_len <= max_chunk. -1 with a message. */
int td_state_rollback(struct td_state *s, int slot, int new_len, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
