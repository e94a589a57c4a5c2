/* backend.h: where the forward runs. One table of op entry points over raw buffers (kernels/
 * signatures), plus memory. The CPU backend calls kernels/<op>_ref.c; the CUDA backend launches
 * kernels/<op>.cu on one stream. The layer loop (forward.c) is written once against this table.
 *
 *   const struct td_backend *b = td_backend_get("cpu", err, sizeof err);   // or "cuda", "auto"
 *   if (!b) return -1;
 *   const struct td_model *run = &model;   // the CPU runs the loaded weights where they are
 *   if (b->on_device && td_model_upload(&model, b, &dev, err, sizeof err)) return -1;
 *   if (b->on_device) run = &dev;          // weights resident on b
 *   if (td_state_init(&st, &model.cfg, 4, 256, 16, (size_t)1 << 30, b, err, sizeof err))
 *       return -1;                         // pools live on b
 *   struct td_plan_seq seq = {.slot = td_state_seq_alloc(&st), .n_new = n, .ids = ids};
 *   if (td_forward_seqs(run, &st, &seq, 1, logits, NULL, err, sizeof err)) return -1;
 */
#ifndef TD_BACKEND_H
#define TD_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/attention.h"
#include "kernels/compress.h"
#include "kernels/dtype.h"
#include "kernels/elementwise.h"
#include "kernels/fill.h"
#include "kernels/greedy.h"
#include "kernels/hc.h"
#include "kernels/indexer.h"
#include "kernels/kv.h"
#include "kernels/markov.h"
#include "kernels/matmul.h"
#include "kernels/moe.h"
#include "kernels/norm_rope.h"
#include "kernels/reserve.h"

#ifdef __cplusplus
extern "C" {
#endif

struct td_ops {
    void (*embed)(float *X, const int32_t *ids, const void *emb, enum td_dtype t, int n, int nc,
                  int d);
    void (*matmul)(float *y, const float *x, const void *w, enum td_dtype t, int n, int in, int out,
                   const void *bias, enum td_dtype bias_t);
    void (*matmul_grouped)(float *y, const float *x, const void *w, enum td_dtype t, int n,
                           int groups, int in, int out);
    void (*rmsnorm)(float *y, const float *x, const void *w, enum td_dtype t, int n, int d,
                    float eps);
    void (*rope_rows)(float *x, int n, int n_vec, int d, int rot_dim, const int32_t *positions,
                      const float *inv_freq, float attention_factor, int inverse);
    void (*hc_pre)(float *collapsed, float *post, float *comb, const float *x,
                   const struct hc_weights *w, int n, int nc, int d, int iters, float hc_eps,
                   float rms_eps, const void *norm, enum td_dtype norm_dtype);
    void (*hc_post)(float *x, const float *a, const float *post, const float *comb, int n, int nc,
                    int d, float *mean, int mean_stride);
    void (*hc_head)(float *y, const float *x, const void *fn, enum td_dtype fn_t, const void *base,
                    enum td_dtype base_t, const void *scale, enum td_dtype scale_t, int n, int nc,
                    int d, float hc_eps, float rms_eps);
    void (*compress_emit)(const struct compress_args *a);
    void (*ring_store)(const struct ring_parts *p, const int32_t *write, const struct rows_view *r,
                       int ring_rows);
    void (*ring_load)(float *rows, const float *ring, const struct rows_view *r, int ring_rows,
                      int width);
    void (*kv_store)(const struct kv_store_args *a); /* a step's keys into a typed cache */
    void (*indexer_topk)(const struct indexer_args *a);
    void (*attention_rows)(const struct attn_args *a);
    void (*moe_route_rows)(int32_t *picks, float *weights, const float *logits, const int32_t *ids,
                           enum moe_score fn, const void *bias, enum td_dtype bias_t,
                           const void *tid2eid, enum td_dtype tid_t, int n, int k, int n_experts,
                           float scaling, int shared);
    void (*moe_experts)(float *out, const float *x, const int32_t *picks, const float *weights,
                        const struct expert_set *ex, int n, int d, int inter, int k, int n_experts,
                        float limit);
    /* a model split over ranks (split.h): the picks' unweighted outputs of this rank's experts
     * into their slots, zeros elsewhere; then, after the all-reduce, the slots' weighted sum in
     * ascending expert order (moe.h); NULL: the backend runs no split model yet */
    void (*moe_experts_slots)(float *slots, const float *x, const int32_t *picks,
                              const struct expert_set *ex, int n, int d, int inter, int k,
                              int n_experts, float limit);
    void (*moe_combine_slots)(float *out, const float *slots, const int32_t *picks,
                              const float *weights, int n, int d, int k);
    void (*add)(float *y, const float *x, size_t n);
    void (*scale)(float *x, float s, size_t n);
    void (*swiglu_act)(float *g, const float *u, size_t n, float limit);
    void (*add_bcast)(float *X, const float *e, int n, int nc, int d, const int32_t *positions);
    void (*copy)(void *dst, const void *src, size_t bytes);      /* within backend memory, queued */
    void (*patch_ids)(int32_t *ids, const struct id_patches *p); /* kernels/elementwise.h */
    void (*fill_uniform)(void *dst, enum td_dtype t, int64_t n, uint64_t seed, float lo, float hi);
    void (*fill_quant)(void *dst, enum td_dtype t, int64_t rows, int64_t in, uint64_t seed,
                       uint8_t scale);
    void (*markov_greedy)(const struct markov_args *a);
    void (*greedy_slot)(int32_t *tok, int32_t *n_drafts, int32_t *next, const float *x, int n,
                        int V, int g, int j);
    void (*sample_rows)(int32_t *ids, const float *x, int n, int V, const struct sample_row *s,
                        int cuts);
    void (*norm_rope)(const struct norm_rope_args *a, int m); /* m parts, one launch */
    void (*matmul_set)(const float *x, int n, int in, int m, const struct matmul_out *o);
};

struct td_backend {
    const char *name;
    int on_device;   /* buffers are not host-addressable */
    int sample_cuts; /* ops.sample_rows draws top-k / top-p rows (else they come to the host) */
    struct td_ops ops;
    void *(*alloc)(size_t bytes); /* zeroed, NULL on failure */
    void (*release)(void *p);
    void (*to_device)(void *dst, const void *src, size_t bytes);
    void (*to_host)(void *dst, const void *src, size_t bytes);
    int (*finish)(char *err, size_t errlen); /* drain queued work, report faults */
    size_t (*free_bytes)(void);              /* memory the backend can still take */
    /* batch-invariant mode: a row's results never depend on which rows share its step.
     * NULL when the backend always is (the CPU references are). */
    void (*set_deterministic)(int on);
    /* step graphs (NULL when the backend has none): capture what the ops queue next, end it into
     * an executable graph (NULL on failure), replay it, free it */
    int (*graph_begin)(void);
    void *(*graph_end)(void);
    void (*graph_launch)(void *g);
    void (*graph_free)(void *g);
    /* size the ops' internal scratch once for the largest step's shapes (kernels/reserve.h),
     * outside any capture; -1 + message when a shape is more than the backend's kernels take
     * (checked before any step runs). NULL: the backend takes any shape (the CPU's) */
    int (*reserve)(const struct td_reserve *r, char *err, size_t errlen);
    /* a named point in the queue (NULL when the backend has none). With TD_TIMELINE=1 set,
     * the device time between consecutive points is summed per (from, to) pair and printed at
     * exit: the spans of a step's phases and the idle gaps between them, which kernel
     * profilers do not show. A point inside a graph capture is ignored. */
    void (*mark)(const char *name);
    /* host buffers a queued copy may land in (pinned on a device), and that copy: it joins the
     * queue and returns at once; the bytes are there after the next finish or to_host. A
     * device's to_host waits for the queue to drain: a result the host wants only after a later
     * step (a deferred round's drafts) comes this way instead, without its own wait. */
    void *(*alloc_host)(size_t bytes); /* zeroed, NULL on failure */
    void (*release_host)(void *p);
    void (*to_host_queued)(void *dst, const void *src, size_t bytes);
    /* wait until every queued copy made so far has landed, and not for the work queued after
     * them (a step's results while the drafter's insertion still runs); reports faults */
    int (*wait_queued)(char *err, size_t errlen);
    /* whether a step of `entries` expert entries runs a layer's shared expert as one more pick
     * of the routed experts (model.h ex_shared) rather than as its own GEMMs; NULL: always */
    int (*moe_fold_shared)(int entries);
    /* the queue ops run on (a cudaStream_t), where a device communicator queues its collectives
     * (comm.h td_comm_nccl); NULL: the backend has none */
    void *(*queue)(void);
    /* the device's identity for a split model's manifests: its PCI bus id into id, and its
     * compute capability (major * 10 + minor) returned; NULL on a backend without one */
    int (*identify)(char *id, size_t idlen);
};

const struct td_backend *td_backend_cpu(void);

/* "cpu", "cuda", "cuda:N" (the process's GPU N; "cuda" is GPU 0), or "auto" (cuda when a
 * device is usable, else cpu). NULL + message when the named backend is unavailable (no GPU,
 * no GPU N, built without nvcc, or this process already runs on another GPU). */
const struct td_backend *td_backend_get(const char *name, char *err, size_t errlen);

/* the GPUs this process could run on (0: none, or a build without CUDA); uses none of them */
int td_backend_gpus(void);

#ifdef __cplusplus
}
#endif
#endif
