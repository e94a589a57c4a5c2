/* model.h: a DeepSeek-V4 checkpoint: config + weight views into the mapped safetensors.
 *
 *   struct td_model m;
 *   char err[512];
 *   if (td_model_load(&m, "tests/fixtures/a_tiny_yarn", err, sizeof err)) { puts(err); return -1; }
 *   int64_t q_lora = m.layers[3].wq_a.shape[0];   // [q_lora_rank, dim], in the mapped file
 *   td_model_free(&m);
 *
 * Both weight layouts go through one mapping table (model.c): the HF transformers layout
 * (model.layers.N.self_attn.q_a_proj.weight, fused mlp.experts.gate_up_proj) and the upstream
 * DeepSeek layout (layers.N.attn.wq_a.weight, per-expert ffn.experts.E.w1/w2/w3). Every tensor
 * the config implies must be present with the right shape and a float (or, for tid2eid, int)
 * dtype; every stored tensor must be used, except mtp.* which stays available to the drafters
 * (td_model_load_mtp / _dspark bind it from the target's mapping, and refuse what they do not
 * use). Failures name the tensor with expected and actual shape/dtype.
 */
#ifndef TD_MODEL_H
#define TD_MODEL_H

#include "config.h"
#include "safetensors.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

struct td_hc_w {
    struct td_tensor fn;    /* [(2 + nc) * nc, nc * dim], head: [nc, nc * dim] */
    struct td_tensor base;  /* [(2 + nc) * nc], head: [nc] */
    struct td_tensor scale; /* [3], head: [1] */
};

struct td_compressor_w {
    struct td_tensor wkv;   /* [c * d, dim], c = 2 (CSA overlap: Ca | Cb) or 1 (HCA) */
    struct td_tensor wgate; /* [c * d, dim] */
    struct td_tensor ape;   /* [rate, c * d] position bias */
    struct td_tensor norm;  /* [d] */
};

struct td_layer {
    struct td_hc_w hc_attn, hc_ffn;
    struct td_tensor attn_norm, ffn_norm; /* [dim] */
    struct td_tensor wq_a;                /* [q_lora_rank, dim] */
    struct td_tensor q_norm;              /* [q_lora_rank] */
    struct td_tensor wq_b;                /* [n_heads * head_dim, q_lora_rank] */
    struct td_tensor wkv;                 /* [head_dim, dim] */
    struct td_tensor kv_norm;             /* [head_dim] */
    struct td_tensor wo_a;                /* [o_groups * o_lora_rank, n_heads*head_dim/g] */
    struct td_tensor wo_b;                /* [dim, o_groups * o_lora_rank] */
    struct td_tensor sinks;               /* [n_heads] F32, aligned: the loaders copy sinks
                                             stored otherwise (the CPU attention reads fp32) */
    struct td_compressor_w comp;          /* CSA and HCA layers, d = head_dim */
    struct td_compressor_w icomp;         /* CSA layers: indexer keys, d = index_head_dim */
    struct td_tensor idx_wq_b;            /* CSA: [index_n_heads * index_head_dim, q_lora] */
    struct td_tensor idx_weights;         /* CSA: [index_n_heads, dim] */
    struct td_tensor gate;                /* [n_experts, dim] */
    struct td_tensor gate_bias;           /* moe layers: [n_experts] */
    struct td_tensor tid2eid;             /* hash layers: [vocab, n_experts_tok] int */
    struct td_tensor *w1, *w3, *w2;       /* [n_experts] views: [inter, dim] x2, [dim, inter] */
    const void *const *ex_w1;             /* [n_experts + 1] w1 data pointers, where the */
    const void *const *ex_w3;             /*   weights live (host, or device for a */
    const void *const *ex_w2;             /*   model uploaded to a device backend) */
    enum td_dtype ex_dtype;               /* one dtype for all routed experts */
    int ex_shared; /* ex_w* hold the shared expert too, at index n_experts (same dtype, no
                      biases): it runs in the routed experts' kernels as one more pick */
    struct td_tensor sh_w1, sh_w3, sh_w2; /* shared expert */
    struct td_tensor sh_b1, sh_b3, sh_b2; /* shared expert biases (mlp_bias), else absent */
};

/* a DSpark drafter's own tensors beside its stages (td_model_load_dspark) */
struct td_dspark_w {
    struct td_tensor main_proj;  /* [dim, n_capture * dim] fuses the captured target rows */
    struct td_tensor main_norm;  /* [dim] */
    struct td_tensor markov_w1;  /* [vocab, rank] e(x): the Markov embedding */
    struct td_tensor markov_w2;  /* [vocab, rank] bias = W2 e(x_prev) */
    struct td_tensor confidence; /* [1, dim + rank] c = sigmoid(w . [y ; e]) (host only) */
};

/* A generated tensor of a dummy model (td_model_load_dummy): the view has dtype NONE and data
 * pointing at one of these; its values are made where the model is placed (td_model_upload),
 * with the backend's fill_uniform, so a large model never passes through host memory. */
struct td_dummy {
    uint64_t seed;
    float lo, hi;
    enum td_dtype quant; /* Q8 / Q4: a released-precision matrix (fill.h fill_quant), else NONE */
    uint8_t qscale;      /* its scale byte */
};

struct td_split;

struct td_model {
    struct td_config cfg;
    struct st_set st;
    struct td_tensor embed; /* [vocab, dim] */
    struct td_tensor head;  /* [vocab, dim] (= embed when tied) */
    struct td_tensor norm;  /* [dim] */
    struct td_hc_w hc_head;
    struct td_layer *layers;               /* [n_layers] */
    struct td_tensor mtp_enorm, mtp_hnorm; /* MTP layer only (td_model_load_mtp): [dim] */
    struct td_tensor mtp_eproj, mtp_hproj; /* [dim, dim] */
    struct td_dspark_w dspark;             /* DSpark only (td_model_load_dspark) */
    struct td_tensor *expert_views;        /* owned storage behind the w1/w3/w2 pointers */
    const void **expert_ptrs;              /* owned storage behind ex_w1/ex_w3/ex_w2 (host model) */
    const struct td_backend *backend; /* a device mirror's backend (td_model_upload), else NULL */
    void **dev_bufs;                  /* a device mirror's allocations */
    int n_dev_bufs;
    size_t placed_bytes; /* their bytes (what the placed weights take) */
    uint64_t dummy_seed; /* td_model_load_dummy's seed; 0: stored weights */
    int quantized;       /* FP8 / FP4 weights as loaded (views with .scale): the model runs only
                            from a placed copy (td_model_upload decodes or packs them) */
    void **owned;        /* a dummy model's host allocations (generators, tid2eid) */
    int n_owned;
    const struct td_split *split; /* this rank's experts of a model split over ranks (split.h),
                                     not owned; NULL: one rank runs every one */
};

/* Load DIR/config.json and DIR's safetensors. 0 on success; -1 with a message (nothing held). */
int td_model_load(struct td_model *m, const char *dir, char *err, size_t errlen);

/* A model with DIR/config.json's shapes and generated weights (seed != 0; benchmarks): every
 * tensor the config asks for, in the upstream layout's place, with values from fill.h: norms 1,
 * vectors (biases, sinks, HC bases) 0, matrices uniform with std 1/sqrt(fan-in), hash-routing
 * tables giving each token k distinct experts. Nothing is read but config.json; the values are
 * made by td_model_upload on the backend it places the model on (the CPU too), so a dummy model
 * always runs from its placed copy. 0, or -1 with a message. */
int td_model_load_dummy(struct td_model *m, const char *dir, uint64_t seed, char *err,
                        size_t errlen);

void td_model_free(struct td_model *m);

struct td_backend;

/* The MTP layer stored as mtp.0.* (upstream names) in target's files, as a one-layer model:
 * the decoder block (its attention kind from compress_ratios' tail; score-routed MoE), its own
 * hc_head and norm, and enorm/hnorm/e_proj/h_proj, each float or quantized as the target's
 * may be (FP8 with its 128x128 scale, FP4 routed experts with theirs: decoded to fp32). embed
 * and head are left empty: they are the target's (the caller points them at the target's, on
 * whatever backend it runs). Views into target's mapping, so target must outlive it. Every
 * mtp.0.* tensor must be bound (and no mtp.<s>.* past num_nextn_predict_layers be stored).
 * 0, or -1 with a message naming the tensor missing, mis-shaped (expected and stored dtype and
 * shape) or unexpected; a DSpark head under mtp.* is refused as such. */
int td_model_load_mtp(const struct td_model *target, struct td_model *mtp, char *err,
                      size_t errlen);

/* A DSpark drafter stored as mtp.{0..S-1}.* (drafters.md 2.4), as an S-layer model over
 * target's config: every stage a V4 block with sliding-window attention and a score-routed MoE;
 * hc_head and norm are the last stage's; main_proj/main_norm (stage 0's), the Markov head and
 * the confidence head (the last stage's) in m->dspark. Tensors float or quantized as the
 * target's may be (decoded to fp32). embed and head are left empty (the target's).
 *   dir: a folder of its own (models/<m>/dspark/), every tensor there bound; or NULL: the
 *        target's own files, where a release carries its head (V4-Flash-0731, -DSpark: stages
 *        beside the target; views into target's mapping, so target must outlive it), every
 *        mtp.* tensor there bound, and compress_ratios' entries past the target's layers, when
 *        given, sliding (0).
 *   n_stages: S, or 0 for the stages the files hold (the mtp.<s> prefixes, which must run
 *        0 .. S-1; the releases' configs do not say); given, it must be what they hold.
 * 0, or -1 with a message naming the tensor missing, mis-shaped (expected and stored dtype
 * and shape) or unexpected. */
int td_model_load_dspark(const struct td_model *target, const char *dir, int n_stages,
                         int n_capture, int rank, struct td_model *m, char *err, size_t errlen);

/* The drafter a checkpoint carries in its own files: DSpark when its config.json has the
 * dspark_* keys or it stores mtp.0.main_proj.weight (V4-Flash-0731, -DSpark), else MTP when it
 * stores mtp.0.e_proj.weight and num_nextn_predict_layers >= 1 (V4-Flash, -Pro), else none (a
 * dummy model stores nothing). */
enum td_own_drafter { TD_OWN_NONE = 0, TD_OWN_MTP, TD_OWN_DSPARK };
enum td_own_drafter td_model_own_drafter(const struct td_model *m);

/* A copy of `host` placed on backend b. On a device: matrices that go through GEMMs (and the
 * embedding) as BF16, FP8 / FP4 weights packed as Q8 / Q4 (kernels/quant.h), every other float
 * tensor as F32, tid2eid as I32; views in `dev` point into device memory. On the CPU only what
 * cannot run as loaded is made: FP8 / FP4 weights decoded exactly to F32, a dummy model's
 * tensors; the rest stay views into host's files (host must outlive dev). 0, or -1 with a
 * message (nothing held). Free with td_model_free. */
int td_model_upload(const struct td_model *host, const struct td_backend *b, struct td_model *dev,
                    char *err, size_t errlen);

/* td_model_upload of a rank's part of a model split over ranks (split.h): the routed experts
 * own marks ([n_layers][own_stride], 1: the layer's expert e is this rank's) and every other
 * weight; another rank's experts are not placed (their views' data NULL), so a rank's device
 * holds the replicated weights and its part of the experts, and the fail-closed sizing counts
 * only those. own NULL: the whole model. */
int td_model_upload_part(const struct td_model *host, const struct td_backend *b,
                         const unsigned char *own, int own_stride, struct td_model *dev, char *err,
                         size_t errlen);

/* A drafter's model (td_model_load_mtp/_dspark) ready to run on b: *run = its device mirror in
 * dev when b is a device, else host itself; either way with the embedding and head of the
 * target as it runs on b (target_run). When target_run is a split model's rank (its split
 * set), the drafter's experts are split over the same ranks (split.h td_split_serve into sp),
 * only this rank's are placed, and *run is view: the placed model with sp (free sp with
 * td_split_free; it is zeroed otherwise). 0, or -1 with a message. */
struct td_split;
int td_model_place_drafter(struct td_model *host, struct td_model *dev, struct td_split *sp,
                           struct td_model *view, const struct td_model *target_run,
                           const struct td_backend *b, const struct td_model **run, char *err,
                           size_t errlen);

/* whether m must be placed (td_model_upload) before it runs on b: a device, a dummy model, or
 * FP8 / FP4 weights */
int td_model_needs_placing(const struct td_model *m, const struct td_backend *b);

/* A stored tensor by its name in the file (e.g. "mtp.0.e_proj.weight"); NULL when absent. */
const struct td_tensor *td_model_tensor(const struct td_model *m, const char *name);

#ifdef __cplusplus
}
#endif
#endif
