/* compress.h: one compressed KV entry from its window of raw rows (HCA and CSA, main and
 * indexer compressors). Per channel c: alpha = softmax over slots of gate[s][c] (biased by
 * position_bias already), entry[c] = sum_s alpha_s kv[s][c]. The caller applies the norm and
 * RoPE at the window's first position. */
#ifndef TD_KERNELS_COMPRESS_H
#define TD_KERNELS_COMPRESS_H

#include <stddef.h>
#include "dtype.h"
#include "rows.h"
#include "reserve.h"

#ifdef __cplusplus
extern "C" {
#endif

/* At start-up, outside any capture: sizes the CUDA kernels' scratch for the largest step and
 * refuses (-1 + message with the numbers) what they cannot take. Accepts: at most 512 slots a
 * window (comp_slots); even widths (head_dim, index_head_dim) of at most 1024 with an even rot_dim
 * of at most 512 and at most the width. */
int compress_cuda_reserve(const struct td_reserve *r, char *err, size_t errlen);

/* out[d]; kv[s] and gate[s] point at d contiguous floats for each of the n_slots slots.
 * Slots that do not exist (CSA window 0's previous-window half) are simply not passed. */
void compress_pool_ref(float *out, const float *const *kv, const float *const *gate, int n_slots,
                       int d);

/* Everything one compressor (main or indexer, CSA or HCA) does for the rows of a step. */
struct compress_args {
    struct rows_view rows;  /* uses positions, row_seq, qo_indptr, slot, len_before, emit */
    const float *raw;       /* [n_tok, width] this step's kv rows */
    const float *gate;      /* [n_tok, width] this step's gate rows, position bias added */
    const float *ring_kv;   /* [max_seqs, ring, width] older rows */
    const float *ring_gate; /* [max_seqs, ring, width] */
    int ring, width;        /* width = (1 + overlap) * d */
    int d, rate, overlap;   /* overlap: CSA (previous window's Ca half + own Cb half) */
    float *entries;         /* [n_blocks * per, d] entry w of row t's sequence s at row
                               rows_entry(&rows, s, w, per) (paged) */
    int per;                /* entries a history block holds */
    int by_row;       /* 1: row t's entry at entries + t * d instead ([n_tok, d] step rows, which
                         kv_store encodes into a cache of another precision) */
    const void *norm; /* [d] kv_norm weight */
    enum td_dtype norm_dtype;
    float eps;
    const float *inv_freq; /* [rot_dim / 2] compress rope */
    int rot_dim;
    float attn_factor;
};

/* For every row with emit >= 0: pool the entry's window (rows of this step from raw/gate,
 * older ones from the ring), RMS-normalise, rope at w * rate, store at entries[slot][w]. */
void compress_emit_ref(const struct compress_args *a);

/* x[t, :] += bias[positions[t] mod rate, :] for t < n (the compressor's position bias). */
void add_pos_bias_ref(float *x, const void *bias, enum td_dtype bias_dtype,
                      const int32_t *positions, int rate, int n, int width);

/* ring[slot(t)][write[t]] = rows[t] for every row with write[t] >= 0. */
void ring_store_ref(float *ring, const float *rows, const int32_t *write, const struct rows_view *r,
                    int ring_rows, int width);

/* The inverse by position: rows[t] = ring[slot(t)][positions[t] % ring_rows] ([slots, ring_rows,
 * width]) for every row of a sequence; pad rows (row_seq -1) get zeros. A drafter's rows read
 * back from a ring another pass wrote by position (DSpark's insertion of the target's captured
 * rows). */
void ring_load_ref(float *rows, const float *ring, const struct rows_view *r, int ring_rows,
                   int width);

/* Several rings written at the same rows of a step (a layer's compressor rows and gates): part
 * i stores rows[i] ([n_tok, width[i]]) into ring[i] ([slots, ring_rows, width[i]]), as
 * ring_store_ref does for each; one launch on the GPU. */
#define RING_PARTS_MAX 4
struct ring_parts {
    int m;
    float *ring[RING_PARTS_MAX];
    const float *rows[RING_PARTS_MAX];
    int width[RING_PARTS_MAX];
};
void ring_store_parts_ref(const struct ring_parts *p, const int32_t *write,
                          const struct rows_view *r, int ring_rows);

/* CUDA launchers (kernels/<op>.cu): the same contract on device pointers, queued on the
 * backend's stream. Defined only in builds with nvcc. */
void compress_emit_cuda(const struct compress_args *a);
void add_pos_bias_cuda(float *x, const void *bias, enum td_dtype bias_dtype,
                       const int32_t *positions, int rate, int n, int width);
void ring_store_parts_cuda(const struct ring_parts *p, const int32_t *write,
                           const struct rows_view *r, int ring_rows);
void ring_load_cuda(float *rows, const float *ring, const struct rows_view *r, int ring_rows,
                    int width);

#ifdef __cplusplus
}
#endif
#endif
