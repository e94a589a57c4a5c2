/* attention.h: shared-KV multi-query attention with per-head sinks (DeepSeek-V4).
 *
 * For one query token with H heads: keys are n_keys rows of d floats (K = V); for head h
 *   s_j = q_h . k_j * scale,   p_j = exp(s_j - M) / (sum_j exp(s_j - M) + exp(sink_h - M)),
 *   out_h = sum_j p_j k_j,     M = max(max_j s_j, sink_h).
 * The sink is a raw logit with no value. n_keys may be 0 (out = 0). */
#ifndef TD_KERNELS_ATTENTION_H
#define TD_KERNELS_ATTENTION_H

#include <stddef.h>

#include "kv.h"
#include "rows.h"
#include "reserve.h"

#ifdef __cplusplus
extern "C" {
#endif

/* At start-up, outside any capture: sizes the CUDA kernels' scratch for the largest step and
 * refuses (-1 + message with the numbers) what they cannot take. Accepts: head_dim at most 512 (a
 * lane holds head_dim / 32 columns); the block's shared memory for max_keys key addresses, at most
 * what the GPU gives a block. */
int attention_cuda_reserve(const struct td_reserve *r, char *err, size_t errlen);

/* out[n_heads, d], q[n_heads, d]; keys[j] -> d floats; sinks[n_heads] fp32. */
void attention_sink_ref(float *out, const float *q, const float *const *keys, int n_keys,
                        const float *sinks, int n_heads, int d, float scale);

/* The one sparse-attention entry point: every row's key set comes from the step metadata. */
struct attn_args {
    struct rows_view rows; /* swa_indptr/swa_pos, vis, topk, row_seq, slot, len_before */
    float *out;            /* [n_tok, n_heads, d] */
    const float *q;        /* [n_tok, n_heads, d] */
    const void *kv;        /* [n_tok] this step's keys (= values), fmt records (kv_store's
                              step copy; an fp32 cache's: the fp32 rows) */
    const void *swa_ring;  /* [max_seqs, swa_rows] older window keys, fmt records */
    int swa_rows;
    int swa_keys;        /* window keys a row has at most (the plan's window + block): with
                            the entries, what the CUDA kernel splits a row's keys by, so a
                            row's sums follow the model, never the ring's slack */
    const void *entries; /* [n_blocks * per] compressed entries (fmt), paged: entry w of row t's
                            sequence s is row rows_entry(&rows, s, w, per); NULL: none */
    int n_entries;       /* entries a sequence reaches at most */
    int per;             /* entries a history block holds */
    struct kv_fmt fmt;   /* the cached keys' precision (kv.h); fmt.d == d */
    int use_topk;        /* 1: entries rows.topk picks (CSA); 0: all w < vis (HCA) */
    const float *sinks;  /* [n_heads] */
    int n_heads, d;
    float scale;
    /* V carried rope at its key position: when inv_freq is not NULL, each output row's trailing
     * rot_dim dims are rotated back at the query's position (rope_rows_ref, inverse) */
    const float *inv_freq;
    int rot_dim;
    float attn_factor;
};

/* Keys of row t: window positions swa_pos[swa_indptr[t] .. swa_indptr[t + 1]) (this step's rows
 * from kv, older ones from the ring), then the compressed entries. */
void attention_rows_ref(const struct attn_args *a);

/* CUDA launchers (kernels/<op>.cu): the same contract on device pointers, queued on the
 * backend's stream. Defined only in builds with nvcc. */
void attention_rows_cuda(const struct attn_args *a);
/* steps of many rows (prefill) take a tensor-core kernel (bf16 operands, fp32 sums) for heads of
 * 512 columns: mode 0 from AM_ROWS rows (the default), 1 at every step, 2 never (tests, A/B);
 * batch-invariant mode (set_deterministic) never */
void attention_cuda_set_wide(int mode);
/* 1: the tensor-core kernel copies each chunk's key records ahead by cp.async (the same bits);
 * 0 (the default until run on a GPU): it loads them as it reaches them; -1: as TD_ATT_STAGE says
 * (read at the next wide step; unset: 0). */
void attention_cuda_set_stage(int on);
/* 1: the tensor-core kernel resolves the row's key records 256 at a time, a batch ahead (the
 * same bits); 0 (the default until run on a GPU): a chunk's 32 by one warp before its keys are
 * read; -1: as TD_ATT_RING says (read at the next wide step; unset: 0). */
void attention_cuda_set_ring(int on);
/* 1: the tensor-core steps on Hopper's wgmma (attention_wg_kernel: chunks of 64 keys, two
 * warpgroups); 0 (the default until run on a GPU): mma.sync; -1: as TD_ATT_WGMMA says */
void attention_cuda_set_wg(int on);
/* tests: V's descriptor byte offsets in the other order (1), to name the order wgmma reads */
void attention_cuda_set_wg_v_swap(int on);
void attention_cuda_set_deterministic(int on);

#ifdef __cplusplus
}
#endif
#endif
