/* moe.h: DeepSeek-V4 MoE pieces: router (learned top-k or hash) and a clamped SwiGLU expert. */
#ifndef TD_KERNELS_MOE_H
#define TD_KERNELS_MOE_H

#include <stddef.h>
#include "dtype.h"
#include "reserve.h"

#ifdef __cplusplus
extern "C" {
#endif

/* At start-up, outside any capture: sizes the CUDA kernels' scratch for the largest step and
 * refuses (-1 + message with the numbers) what they cannot take. Accepts: at most 31 expert picks a
 * row (moe_k); sizes the grouped scratch for rows x moe_k entries over moe_experts experts. */
int moe_cuda_reserve(const struct td_reserve *r, char *err, size_t errlen);

enum moe_score { MOE_SCORE_SQRTSOFTPLUS = 0, MOE_SCORE_SIGMOID, MOE_SCORE_SOFTMAX };

/* One token. scores = score_fn(logits[n_experts]).
 * Learned (hash_row == NULL): picks = top-k of scores + bias (bias may be NULL), ties to the
 * lower expert id. Hash: picks = hash_row[0..k). weight_j = scores[pick_j] /
 * (sum + 1e-20) * scaling. Picks are written in selection order. */
void moe_route_ref(int *picks, float *weights, const float *logits, enum moe_score score_fn,
                   const void *bias, enum td_dtype bias_dtype, const int64_t *hash_row, int k,
                   int n_experts, float scaling);

/* y[n, d] = w2 . (silu(min(x.w1, limit)) * clamp(x.w3, -limit, limit)); w1, w3 [inter, d],
 * w2 [d, inter]; optional biases (NULL) b1, b3 [inter], b2 [d]. */
struct swiglu_weights {
    const void *w1, *w3, *w2, *b1, *b3, *b2;
    enum td_dtype w1_dtype, w3_dtype, w2_dtype, b1_dtype, b3_dtype, b2_dtype;
};
void swiglu_ref(float *y, const float *x, const struct swiglu_weights *w, int n, int d, int inter,
                float limit);

/* Route n rows: hash rows (tid2eid != NULL) take tid2eid[ids[t]] ([vocab, k], I32 or I64);
 * learned rows take the top-k of scores + bias. picks/weights [n, k + shared]: with shared = 1
 * each row's k picks are followed by expert n_experts (the shared expert) with weight 1. */
void moe_route_rows_ref(int32_t *picks, float *weights, const float *logits, const int32_t *ids,
                        enum moe_score score_fn, const void *bias, enum td_dtype bias_dtype,
                        const void *tid2eid, enum td_dtype tid_dtype, int n, int k, int n_experts,
                        float scaling, int shared);

/* the routed experts: arrays of n_experts weight pointers, one dtype for all (the shared
 * expert may be one more, picked by moe_route_rows' shared) */
struct expert_set {
    const void *const *w1;    /* [n_experts] -> [inter, d] gate */
    const void *const *w3;    /* [n_experts] -> [inter, d] up */
    const void *const *w2;    /* [n_experts] -> [d, inter] down */
    const unsigned char *own; /* [n_experts] the experts this rank runs (1), of a model split
                                 over ranks (parallel.md 5.2), in the backend's memory like the
                                 weights; NULL: every one. Another rank's experts are never
                                 read: their pointers may be NULL (not placed) */
    enum td_dtype dtype;
};

/* out[n, d] = sum over row t's picks, in ascending expert order (then pick order), of
 * weights[t, j] * expert(x[t]). Batch-invariant: a row's sum never depends on other rows.
 * It is moe_experts_slots_ref, then moe_combine_slots_ref: the one order a split model's
 * ranks sum in too. */
void moe_experts_ref(float *out, const float *x, const int32_t *picks, const float *weights,
                     const struct expert_set *ex, int n, int d, int inter, int k, int n_experts,
                     float limit);

/* slots[t * k + j, :] ([n * k, d]) = expert picks[t, j] of x[t], unweighted, for every pick whose
 * expert this rank runs (ex->own), zeros for the others: the ranks' slots are disjoint, so one
 * all-reduce sum of them is exact in any order. Each expert runs once over its rows. */
void moe_experts_slots_ref(float *slots, const float *x, const int32_t *picks,
                           const struct expert_set *ex, int n, int d, int inter, int k,
                           int n_experts, float limit);

/* out[t, :] = 0 + the sum over row t's picks, in ascending expert order (then pick order), of
 * slots[t * k + j, :] * weights[t, j] */
void moe_combine_slots_ref(float *out, const float *slots, const int32_t *picks,
                           const float *weights, int n, int d, int k);

/* CUDA launchers (kernels/<op>.cu): the same contract on device pointers, queued on the
 * backend's stream. Defined only in builds with nvcc. */
void moe_route_rows_cuda(int32_t *picks, float *weights, const float *logits, const int32_t *ids,
                         enum moe_score score_fn, const void *bias, enum td_dtype bias_dtype,
                         const void *tid2eid, enum td_dtype tid_dtype, int n, int k, int n_experts,
                         float scaling, int shared);
void moe_experts_cuda(float *out, const float *x, const int32_t *picks, const float *weights,
                      const struct expert_set *ex, int n, int d, int inter, int k, int n_experts,
                      float limit);
/* a split model's slots and their combine (moe_experts_slots_ref, moe_combine_slots_ref): the
 * own experts' entries as moe_experts_cuda makes them (the same tiles: only the others' are
 * left out), then the weighted sum in its order */
void moe_experts_slots_cuda(float *slots, const float *x, const int32_t *picks,
                            const struct expert_set *ex, int n, int d, int inter, int k,
                            int n_experts, float limit);
void moe_combine_slots_cuda(float *out, const float *slots, const int32_t *picks,
                            const float *weights, int n, int d, int k);
/* batch-invariant mode: every step's experts take the one fp32 tile form (a row's result
 * never depends on the step's size); otherwise small steps run on tensor cores */
void moe_cuda_set_deterministic(int on);
/* the block tiles' height of wide steps: 32, 64 or 128 entries, or 0 (the default) by the
 * step's entries an expert (tests: a row's bits do not depend on it) */
void moe_cuda_set_wide_height(int bm);
/* FP4 block tiles stream their codes and scales by cp.async, stages ahead (1, the default), or
 * load them into registers a stage ahead (0; TD_Q4_ASYNC=0 at start-up): the same bits */
void moe_cuda_set_q4_async(int on);
/* bf16 and FP4 experts' block tiles on wgmma (1) or mma.sync (0), or FP4 projections whose
 * input is a multiple of 128 with the weights decoded into wgmma's register operand (2; the rest
 * as 1), or as at start-up (-1: the default, or TD_MOE_WGMMA=0|1|2): each form's bits the same at
 * every tile height, the forms' not necessarily the same */
void moe_cuda_set_wgmma(int on);
/* whether a step of `entries` (row, pick) entries, the shared expert's included, had better
 * run the shared expert among the routed ones: when they take the tensor-core tiles (a larger
 * step's shared expert is a dense GEMM), and always in batch-invariant mode (one form for every
 * step size) */
int moe_cuda_fold_shared(int entries);

#ifdef __cplusplus
}
#endif
#endif
