/* attention.h: shared-KV multi-query attention with per-head sinks (DeepSeek-V4).
 *
 * For one query token with H heads: keys are n_keys rows of d floats (K = V); for head h
 *   s_j = q_h . k_j * scale,   p_j = exp(s_j - M) / (sum_j exp(s_j - M) + exp(sink_h - M)),
 *   out_h = sum_j p_j k_j,     M = max(max_j s_j, sink_h).
 * The sink is a raw logit with no value. n_keys may be 0 (out = 0). */
#ifndef TD_KERNELS_ATTENTION_H
#define TD_KERNELS_ATTENTION_H

#include <stddef.h>

#include "rows.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out[n_heads, d], q[n_heads, d]; keys[j] -> d floats; sinks[n_heads] fp32. */
void attention_sink_ref(float *out, const float *q, const float *const *keys, int n_keys,
                        const float *sinks, int n_heads, int d, float scale);

/* The one sparse-attention entry point: every row's key set comes from the step metadata. */
struct attn_args {
    struct rows_view rows; /* swa_indptr/swa_pos, vis, topk, row_seq, slot, len_before */
    float *out;            /* [n_tok, n_heads, d] */
    const float *q;        /* [n_tok, n_heads, d] */
    const float *kv;       /* [n_tok, d] this step's keys (= values) */
    const float *swa_ring; /* [max_seqs, swa_rows, d] older window keys */
    int swa_rows;
    const float *entries; /* [max_seqs, n_entries, d] compressed entries, NULL: none */
    int n_entries;
    int use_topk;       /* 1: entries rows.topk picks (CSA); 0: all w < vis (HCA) */
    const float *sinks; /* [n_heads] */
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

/* The CUDA kernel splits each row's keys into this many contiguous slices, one block of a
 * cluster each, for models of few heads (tandem-tiny's 8: a batch-1 step would fill 8 blocks)
 * and rows of up to max_keys >= 128 keys. It follows the configuration, never the batch.
 * (With the Flash slice's 64 heads a split of 4 left batch 1 unchanged and cost batch 8 7%.) */
static inline int attention_splits(int n_heads, int max_keys) {
    return n_heads <= 16 && max_keys >= 128 ? 4 : 1;
}

/* The CUDA kernel's threads a block: a warp per group of keys, 16 of them for the Flash
 * slice's head_dim 512 (a 128-thread block that walked the 512 columns in four passes of
 * dependent key loads took 49 us per layer at batch 1, 24 with 512). It follows d alone, and
 * so does the order in which the block joins its warps' parts. A lane holds d / 32 columns,
 * at most ATTENTION_MAX_D / 32. */
#define ATTENTION_MAX_D 512
static inline int attention_threads(int d) {
    return d > 256 ? 512 : d > 128 ? 256 : 128;
}

/* Shared memory of the CUDA kernel's block for rows of up to max_keys keys of d floats: its
 * slice's key addresses, its warps' output parts, maxima and sums, its own part, max and sum. */
static inline size_t attention_smem(int d, int max_keys, int n_heads) {
    int s = attention_splits(n_heads, max_keys), slice = (max_keys + s - 1) / s;
    int nw = attention_threads(d) / 32;
    return (size_t)slice * sizeof(float *) +
           ((size_t)(nw + 1) * d + 2 + 2 * (size_t)nw) * sizeof(float);
}

/* CUDA launchers (kernels/<op>.cu): the same contract on device pointers, queued on the
 * backend's stream. Defined only in builds with nvcc. */
void attention_rows_cuda(const struct attn_args *a);

#ifdef __cplusplus
}
#endif
#endif
