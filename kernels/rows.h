/* rows.h: the per-row step metadata the plan-driven kernels read, as raw pointers (host
 * memory for the CPU references, device memory for the CUDA kernels). The engine fills it from
 * metadata/plan.h's td_plan; kernels never see the plan type itself. Row-major, token-major:
 * n_tok rows this step, rows of sequence s are [qo_indptr[s], qo_indptr[s + 1]).
 */
#ifndef TD_KERNELS_ROWS_H
#define TD_KERNELS_ROWS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct rows_view {
    int n_tok;
    const int32_t *input_ids;  /* [n_tok] */
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
};

#ifdef __cplusplus
}
#endif
#endif
