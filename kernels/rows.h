/* rows.h: the per-row step metadata the plan-driven kernels read, as raw pointers (host
 * memory for the CPU references, device memory for the CUDA kernels). The engine fills it from
 * metadata/plan.h's td_plan; kernels never see the plan type itself. Row-major, token-major:
 * n_tok rows this step, rows of sequence s are [qo_indptr[s], qo_indptr[s + 1]).
 */
#ifndef TD_KERNELS_ROWS_H
#define TD_KERNELS_ROWS_H

#include <stdint.h>

/* a function both the CPU references and the CUDA kernels call */
#ifdef __CUDACC__
#define TD_HD __host__ __device__
#else
#define TD_HD
#endif

#ifdef __cplusplus
extern "C" {
#endif

struct rows_view {
    int n_tok;
    const int32_t *input_ids;  /* [n_tok] */
    const int32_t *logit_rows; /* [max_tok] rows whose logits the step returns, then -1 */
    const int32_t *positions;  /* [n_tok] */
    const int32_t *row_seq;    /* [n_tok] */
    const int32_t *qo_indptr;  /* [n_seq + 1] */
    const int32_t *slot;       /* [n_seq] state slot */
    const int32_t *len_before; /* [n_seq] committed length before the step */
    const int32_t *swa_indptr; /* [n_tok + 1] */
    const int32_t *swa_pos;    /* [swa_indptr[n_tok]] key positions */
    const int32_t *swa_write;  /* [n_tok] sliding-window ring row or -1 */
    const int32_t *vis;        /* [n_tok] visible compressed entries (this layer's rate) */
    const int32_t *emit;       /* [n_tok] entry the row completes (this layer's rate) or -1 */
    const int32_t *write;      /* [n_tok] compressor ring row (this layer's rate) or -1 */
    int32_t *topk;             /* [n_tok, topk_stride] indexer picks, ascending, -1 padded */
    int topk_stride;
    const int32_t *blocks; /* [n_seq, blocks_stride] each sequence's history blocks (its block
                              table: block b holds positions [b * B, (b + 1) * B)), -1 past its
                              context; NULL for models without compressed layers */
    int blocks_stride;
};

/* Where the row of position q lives, for a sequence whose committed length is len, whose
 * step rows start at row0 of the step's buffers and whose state slot is slot: a position the
 * step brings (q >= len) is the step's row row0 + q - len; a committed one is row
 * slot * ring_rows + q % ring_rows of the sequence's ring (the cache is stored by position,
 * so rejecting drafts is only moving len back). The one rule every reader of a window or a
 * compressor ring follows, on the host and the device alike; *in_ring says which buffer. */
TD_HD static inline long long rows_where(int q, int len, int row0, int slot, int ring_rows,
                                         int *in_ring) {
    *in_ring = q < len;
    return q >= len ? (long long)row0 + (q - len) : (long long)slot * ring_rows + q % ring_rows;
}

/* the same as a pointer to the row's first element, rows of `width` elements */
TD_HD static inline const float *rows_key_row(const float *step_rows, const float *ring, int q,
                                              int len, int row0, int slot, int ring_rows,
                                              int width) {
    int in_ring;
    long long row = rows_where(q, len, row0, slot, ring_rows, &in_ring);
    return (in_ring ? ring : step_rows) + row * width;
}

/* Where compressed entry w of the step's sequence s lives in a paged history pool whose blocks
 * hold `per` entries each (B / rate: 64 of a CSA layer's and 2 of an HCA layer's at B = 256):
 * entry w % per of block blocks[s][w / per], as a row of the pool ([n_blocks * per] rows). The
 * one rule every reader and writer of compressed entries and indexer keys follows. */
TD_HD static inline long long rows_entry(const struct rows_view *r, int s, int w, int per) {
    return (long long)r->blocks[(long long)s * r->blocks_stride + w / per] * per + w % per;
}

#ifdef __cplusplus
}
#endif
#endif
