/* config.h: everything config.json says that changes the DeepSeek-V4 forward.
 *
 *   struct td_config cfg;
 *   char err[512];
 *   if (td_config_load(&cfg, "models/tandem-tiny/config.json", err, sizeof err)) return -1;
 *
 * Both the HF transformers layout (layer_types, mlp_layer_types, compress_rates,
 * rope_parameters nested {main, compress} or flat) and the legacy keys released
 * checkpoints carry (compress_ratios, compress_rate_csa/hca, num_hash_layers,
 * qk_rope_head_dim, rope_scaling) are folded into one struct, following
 * transformers 5.17 DeepseekV4Config.__post_init__ (see ../shared/design/dsv4.md §1).
 */
#ifndef TD_CONFIG_H
#define TD_CONFIG_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TD_MAX_LAYERS 256
#define TD_MAX_EOS    8
#define TD_MAX_HC     16 /* hc_mult: the HC kernels hold nc x nc in fixed arrays */
/* hc_sinkhorn_iters: the release uses 20; each is a pass over nc x nc per row, twice a layer,
 * and 2^31 of them ran for hours with no word, so a bound far past any use */
#define TD_MAX_SINKHORN_ITERS 1000

/* a DSpark head's limits: captured target layers, drafts a round (gamma), Markov rank (the
 * Markov kernels hold one embedding in shared memory), stages */
#define TD_DSPARK_MAX_CAPTURE 8
#define TD_DSPARK_MAX_BLOCK   16
#define TD_DSPARK_MAX_RANK    256
#define TD_DSPARK_MAX_STAGES  64

enum td_attn_kind { TD_ATTN_SLIDING = 0, TD_ATTN_CSA, TD_ATTN_HCA };
enum td_mlp_kind { TD_MLP_HASH = 0, TD_MLP_MOE };
enum td_score_fn { TD_SCORE_SQRTSOFTPLUS = 0, TD_SCORE_SIGMOID, TD_SCORE_SOFTMAX };

struct td_rope_cfg {
    int yarn;                /* 0: default rope, 1: yarn */
    double theta;            /* base */
    double factor;           /* yarn: scaling factor */
    double orig_max_pos;     /* yarn: original_max_position_embeddings */
    double beta_fast;        /* yarn, default 32 */
    double beta_slow;        /* yarn, default 1 */
    double attention_factor; /* cos/sin multiplier (1.0 unless a nested dict says otherwise) */
    int truncate;            /* yarn: floor/ceil the correction range (default 1) */
};

/* A DSpark head's keys (drafters.md 2.1): in the target's own config.json when the checkpoint
 * carries the head in its files (V4-Flash-0731, the -DSpark releases: stages mtp.0.. beside
 * the target), or in a drafter folder's (models/<m>/dspark/config.json). The four keys come
 * together; dspark_num_stages is optional (the releases leave it out: the mtp.<s> prefixes of
 * the weights say). */
struct td_dspark_cfg {
    int present;                        /* the keys are there */
    int block;                          /* dspark_block_size: gamma, drafts a round */
    int noise;                          /* dspark_noise_token_id: the block's filler token */
    int rank;                           /* dspark_markov_rank */
    int n_stages;                       /* dspark_num_stages; 0: not given */
    int n_capture;                      /* len(dspark_target_layer_ids) */
    int capture[TD_DSPARK_MAX_CAPTURE]; /* dspark_target_layer_ids: target layers, ascending */
};

struct td_config {
    int vocab;    /* vocab_size */
    int dim;      /* hidden_size */
    int n_layers; /* num_hidden_layers */
    int n_heads;  /* num_attention_heads (one shared K=V head) */
    int head_dim; /* head_dim */
    int rope_dim; /* int(head_dim * partial_rotary_factor), trailing dims */
    int q_lora_rank;
    int o_groups, o_lora_rank;
    int n_experts;     /* n_routed_experts */
    int n_experts_tok; /* num_experts_per_tok, also tid2eid columns */
    int moe_inter;     /* moe_intermediate_size: routed and shared expert width */
    enum td_score_fn score_fn;
    float routed_scaling;
    float swiglu_limit;
    int mlp_bias; /* shared expert Linears have biases */
    int hc_mult, hc_sinkhorn_iters;
    float hc_eps, rms_eps;
    int sliding_window;
    int rate_csa, rate_hca; /* compress_rates */
    int index_n_heads, index_head_dim, index_topk;
    int tie_word_embeddings;
    /* released precision (released_formats.md 1.9): quantization_config says FP8 weights in
     * 128x128 blocks with ue8m0 scales; expert_dtype "fp4" (vLLM's default when a quantized
     * config leaves it out) says the routed experts are FP4. The loader goes by each tensor's
     * dtype; these say what the config announced (and what a dummy model is made in). */
    int quant_fp8, expert_fp4, expert_fp8;
    long max_position_embeddings; /* in [1, INT_MAX]: positions are int */
    int n_mtp_layers;             /* num_nextn_predict_layers */
    enum td_attn_kind
        mtp_attn[4]; /* attention kind of each MTP layer (from compress_ratios tail) */
    struct td_rope_cfg rope_main, rope_compress;
    enum td_attn_kind attn[TD_MAX_LAYERS];
    enum td_mlp_kind mlp[TD_MAX_LAYERS];
    struct td_dspark_cfg dspark; /* the dspark_* keys, when the checkpoint carries the head */
    int bos_id;                  /* -1 when absent */
    int eos_ids[TD_MAX_EOS];
    int n_eos;
};

/* Parse config.json. Returns 0, or -1 with a message naming the key. */
int td_config_load(struct td_config *cfg, const char *path, char *err, size_t errlen);

/* Same from a JSON string (tests). */
int td_config_parse(struct td_config *cfg, const char *json, char *err, size_t errlen);

/* generation_config.json's eos_token_id (an id, a list of ids, or null) appended to ids[*n]
 * (room for cap; an id already there is skipped). Each must be a token id, in [0, vocab). A
 * missing file adds nothing and is no error; a malformed one is. 0, or -1 with one line
 * naming the file and the bad value. */
int td_config_generation_eos(const char *path, int vocab, int *ids, int *n, int cap, char *err,
                             size_t errlen);

/* A DSpark drafter folder's config.json (path) for target: the four dspark_* keys required, as
 * td_config_load checks them in a target's own config, and its sliding_window, when given, the
 * target's (the stages' rings are the target's window). 0, or -1 with a message naming the
 * file and the key. */
int td_config_dspark_load(struct td_dspark_cfg *d, const char *path, const struct td_config *target,
                          char *err, size_t errlen);

const char *td_attn_kind_name(enum td_attn_kind k);

/* the tokens a compressed entry of layer i holds (its compress rate), 0 for a sliding layer */
static inline int td_layer_rate(const struct td_config *c, int i) {
    return c->attn[i] == TD_ATTN_CSA ? c->rate_csa : c->attn[i] == TD_ATTN_HCA ? c->rate_hca : 0;
}

#ifdef __cplusplus
}
#endif
#endif
