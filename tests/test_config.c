/* test_config.c: config.json parsing (HF layout, legacy keys, defaults, errors).
 *
 *   make build/tests/test_config && build/tests/test_config
 *
 * Configs are written with ' for " and varied through jansson: variant(base, patch, del) merges
 * the JSON object patch into base and deletes the space-separated keys del. Prints
 * "OK <case>" or "FAIL <case>: <why>" per case; exits 0 iff all pass. TD_TEST_VERBOSE=1 also
 * prints each expected error message.
 */
#include "model/config.h"
#include "check.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int near(double a, double b) {
    return fabs(a - b) <= 1e-6 * fmax(1.0, fabs(b));
}

/* ' -> ", parsed; NULL on bad test JSON */
static json_t *js(const char *s) {
    char *q = strdup(s);
    for (char *p = q; *p; p++)
        if (*p == '\'') *p = '"';
    json_error_t e;
    json_t *v = json_loads(q, 0, &e);
    if (!v) printf("  bad test JSON: %s: %s\n", e.text, q);
    free(q);
    return v;
}

/* base with patch merged in and the keys in del removed, as a malloc'd JSON string */
static char *variant(const char *base, const char *patch, const char *del) {
    json_t *o = js(base);
    if (!o) return NULL;
    if (patch) {
        json_t *p = js(patch);
        if (!p) {
            json_decref(o);
            return NULL;
        }
        json_object_update(o, p);
        json_decref(p);
    }
    if (del) {
        char *keys = strdup(del), *save = NULL;
        for (char *k = strtok_r(keys, " ", &save); k; k = strtok_r(NULL, " ", &save))
            json_object_del(o, k);
        free(keys);
    }
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

/* parse a variant; on failure the message lands in err */
static int parse_variant(struct td_config *c, const char *base, const char *patch, const char *del,
                         char *err, size_t errlen) {
    char *s = variant(base, patch, del);
    if (!s) {
        snprintf(err, errlen, "bad test JSON");
        return -2;
    }
    int rc = td_config_parse(c, s, err, errlen);
    free(s);
    return rc;
}

/* the variant must fail with `want` in a non-empty one-line message */
static void expect_fail(const char *name, const char *base, const char *patch, const char *del,
                        const char *want) {
    struct td_config c;
    char err[512] = "", why[700];
    int rc = parse_variant(&c, base, patch, del, err, sizeof err);
    if (getenv("TD_TEST_VERBOSE")) printf("  %s: %s\n", name, err);
    if (rc != -1)
        snprintf(why, sizeof why, "parse returned %d (err \"%s\")", rc, err);
    else if (err[0] == '\0' || strchr(err, '\n') || !strstr(err, want))
        snprintf(why, sizeof why, "want \"%s\" in message, got \"%s\"", want, err);
    else
        why[0] = '\0';
    report(name, why[0] ? why : NULL);
}

/* expect success; on failure report and return -1 */
static int expect_ok(const char *name, struct td_config *c, const char *base, const char *patch,
                     const char *del) {
    char err[512] = "", why[600];
    if (parse_variant(c, base, patch, del, err, sizeof err) == 0) return 0;
    snprintf(why, sizeof why, "parse failed: %s", err);
    report(name, why);
    return -1;
}

// ----------------------------------------------------------------------------
// configs

/* the TINY config of dsv4.md §1.4, as save_pretrained writes it (nested rope dict) */
static const char *tiny =
    "{'model_type': 'deepseek_v4', 'vocab_size': 512, 'hidden_size': 128,"
    " 'moe_intermediate_size': 64, 'num_hidden_layers': 4, 'num_attention_heads': 4,"
    " 'num_key_value_heads': 1, 'head_dim': 64, 'q_lora_rank': 64, 'partial_rotary_factor': 0.25,"
    " 'layer_types': ['sliding_attention', 'compressed_sparse_attention',"
    "                 'heavily_compressed_attention', 'compressed_sparse_attention'],"
    " 'mlp_layer_types': ['hash_moe', 'hash_moe', 'moe', 'moe'],"
    " 'compress_rates': {'compressed_sparse_attention': 4, 'heavily_compressed_attention': 8},"
    " 'sliding_window': 8, 'o_groups': 2, 'o_lora_rank': 32,"
    " 'index_n_heads': 8, 'index_head_dim': 32, 'index_topk': 3,"
    " 'n_routed_experts': 8, 'num_experts_per_tok': 2, 'n_shared_experts': 1,"
    " 'scoring_func': 'sqrtsoftplus', 'routed_scaling_factor': 1.5, 'swiglu_limit': 10.0,"
    " 'hc_mult': 4, 'hc_sinkhorn_iters': 20, 'hc_eps': 1e-06, 'rms_norm_eps': 1e-06,"
    " 'rope_theta': 10000.0, 'compress_rope_theta': 160000.0,"
    " 'rope_parameters': {"
    "   'main': {'rope_type': 'default', 'rope_theta': 10000.0, 'partial_rotary_factor': 0.25},"
    "   'compress': {'rope_type': 'yarn', 'rope_theta': 160000.0, 'factor': 16.0,"
    "                'original_max_position_embeddings': 32, 'beta_fast': 32.0,"
    "                'beta_slow': 1.0, 'attention_factor': 1.0, 'partial_rotary_factor': 0.25}},"
    " 'max_position_embeddings': 512, 'tie_word_embeddings': false,"
    " 'bos_token_id': 0, 'eos_token_id': 1, 'num_nextn_predict_layers': 1}";

/* only the required keys */
static const char *minimal =
    "{'vocab_size': 1000, 'hidden_size': 256, 'num_hidden_layers': 6,"
    " 'num_attention_heads': 8, 'head_dim': 64, 'q_lora_rank': 128, 'o_groups': 4,"
    " 'o_lora_rank': 64, 'n_routed_experts': 16, 'num_experts_per_tok': 4,"
    " 'moe_intermediate_size': 128, 'index_n_heads': 4, 'index_head_dim': 32,"
    " 'index_topk': 16, 'sliding_window': 16}";

static const char *required_keys[] = {
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "head_dim",
    "q_lora_rank",
    "o_groups",
    "o_lora_rank",
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "index_n_heads",
    "index_head_dim",
    "index_topk",
    "sliding_window",
};

/* the released V4-Flash config.json shape: legacy keys only */
static char *flash_config(void) {
    json_t *o = js("{'architectures': ['DeepseekV4ForCausalLM'], 'model_type': 'deepseek_v4',"
                   " 'vocab_size': 129280, 'hidden_size': 4096, 'num_hidden_layers': 43,"
                   " 'num_attention_heads': 64, 'head_dim': 512, 'qk_rope_head_dim': 64,"
                   " 'q_lora_rank': 1024, 'o_groups': 8, 'o_lora_rank': 1024,"
                   " 'n_routed_experts': 256, 'n_shared_experts': 1, 'num_experts_per_tok': 6,"
                   " 'moe_intermediate_size': 2048, 'num_hash_layers': 3,"
                   " 'routed_scaling_factor': 1.5, 'swiglu_limit': 10.0, 'scoring_func':"
                   " 'sqrtsoftplus', 'topk_method': 'noaux_tc', 'first_k_dense_replace': 0,"
                   " 'index_n_heads': 64, 'index_head_dim': 128, 'index_topk': 512,"
                   " 'sliding_window': 128, 'hc_mult': 4, 'hc_sinkhorn_iters': 20,"
                   " 'hc_eps': 1e-06, 'rms_norm_eps': 1e-06, 'rope_theta': 10000,"
                   " 'compress_rope_theta': 160000, 'max_position_embeddings': 1048576,"
                   " 'rope_scaling': {'type': 'yarn', 'factor': 16,"
                   "                  'original_max_position_embeddings': 65536},"
                   " 'num_nextn_predict_layers': 1, 'bos_token_id': 0, 'eos_token_id': 1,"
                   " 'tie_word_embeddings': false, 'torch_dtype': 'bfloat16'}");
    /* [0, 0, (4, 128) x 20, 4, 0]: 43 main layers + 1 MTP layer */
    json_t *r = json_array();
    json_array_append_new(r, json_integer(0));
    json_array_append_new(r, json_integer(0));
    for (int i = 0; i < 20; i++) {
        json_array_append_new(r, json_integer(4));
        json_array_append_new(r, json_integer(128));
    }
    json_array_append_new(r, json_integer(4));
    json_array_append_new(r, json_integer(0));
    json_object_set_new(o, "compress_ratios", r);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

// ----------------------------------------------------------------------------
// cases

static void test_hf_tiny(void) {
    char why[600] = "";
    struct td_config c;
    if (expect_ok("hf_tiny", &c, tiny, NULL, NULL)) return;
    REQUIRE(c.vocab == 512 && c.dim == 128 && c.n_layers == 4 && c.n_heads == 4);
    REQUIRE(c.head_dim == 64 && c.rope_dim == 16 && c.q_lora_rank == 64);
    REQUIRE(c.o_groups == 2 && c.o_lora_rank == 32);
    REQUIRE(c.n_experts == 8 && c.n_experts_tok == 2 && c.moe_inter == 64);
    REQUIRE(c.score_fn == TD_SCORE_SQRTSOFTPLUS && c.routed_scaling == 1.5f);
    REQUIRE(c.swiglu_limit == 10.0f && c.mlp_bias == 0);
    REQUIRE(c.hc_mult == 4 && c.hc_sinkhorn_iters == 20 && c.hc_eps == 1e-6f && c.rms_eps == 1e-6f);
    REQUIRE(c.sliding_window == 8 && c.rate_csa == 4 && c.rate_hca == 8);
    REQUIRE(c.index_n_heads == 8 && c.index_head_dim == 32 && c.index_topk == 3);
    REQUIRE(c.tie_word_embeddings == 0 && c.max_position_embeddings == 512);
    REQUIRE(c.n_mtp_layers == 1 && c.mtp_attn[0] == TD_ATTN_SLIDING);
    REQUIRE(c.attn[0] == TD_ATTN_SLIDING && c.attn[1] == TD_ATTN_CSA);
    REQUIRE(c.attn[2] == TD_ATTN_HCA && c.attn[3] == TD_ATTN_CSA);
    REQUIRE(c.mlp[0] == TD_MLP_HASH && c.mlp[1] == TD_MLP_HASH);
    REQUIRE(c.mlp[2] == TD_MLP_MOE && c.mlp[3] == TD_MLP_MOE);
    REQUIRE(!c.rope_main.yarn && c.rope_main.theta == 10000.0);
    REQUIRE(c.rope_main.attention_factor == 1.0);
    REQUIRE(c.rope_compress.yarn && c.rope_compress.theta == 160000.0);
    REQUIRE(c.rope_compress.factor == 16.0 && c.rope_compress.orig_max_pos == 32.0);
    REQUIRE(c.rope_compress.beta_fast == 32.0 && c.rope_compress.beta_slow == 1.0);
    REQUIRE(c.rope_compress.attention_factor == 1.0 && c.rope_compress.truncate == 1);
    REQUIRE(c.bos_id == 0 && c.n_eos == 1 && c.eos_ids[0] == 1);
done:
    report("hf_tiny", why[0] ? why : NULL);
}

/* nested dicts are taken as-is: no attention_factor means YaRN's 0.1 ln(factor) + 1 */
static void test_nested_rope(void) {
    char why[600] = "";
    struct td_config c;
    const char *no_af =
        "{'rope_parameters': {'main': {'rope_type': 'default', 'rope_theta': 5000.0},"
        " 'compress': {'rope_type': 'yarn', 'rope_theta': 320000.0, 'factor': 16.0,"
        "              'original_max_position_embeddings': 32, 'truncate': false}}}";
    if (expect_ok("nested_rope_no_attention_factor", &c, tiny, no_af, NULL)) return;
    REQUIRE(!c.rope_main.yarn && c.rope_main.theta == 5000.0);
    REQUIRE(c.rope_compress.yarn && c.rope_compress.theta == 320000.0);
    REQUIRE(near(c.rope_compress.attention_factor, 0.1 * log(16.0) + 1.0));
    REQUIRE(c.rope_compress.truncate == 0);
done:
    report("nested_rope_no_attention_factor", why[0] ? why : NULL);
}

static void test_nested_rope_main_yarn(void) {
    char why[600] = "";
    struct td_config c;
    const char *both_yarn =
        "{'rope_parameters': {'main': {'rope_type': 'yarn', 'factor': 4.0,"
        "                              'original_max_position_embeddings': 128},"
        " 'compress': {'type': 'default'}}}";
    if (expect_ok("nested_rope_main_yarn", &c, tiny, both_yarn, NULL)) return;
    REQUIRE(c.rope_main.yarn && c.rope_main.theta == 10000.0 && c.rope_main.factor == 4.0);
    REQUIRE(near(c.rope_main.attention_factor, 0.1 * log(4.0) + 1.0));
    REQUIRE(!c.rope_compress.yarn && c.rope_compress.theta == 160000.0);
    REQUIRE(c.rope_compress.attention_factor == 1.0);
done:
    report("nested_rope_main_yarn", why[0] ? why : NULL);
}

/* flat dicts feed the compress rope only; rope_theta inside is ignored, attention_factor 1 */
static void test_flat_rope(void) {
    char why[600] = "";
    struct td_config c;
    const char *flat = "{'rope_parameters': {'rope_type': 'yarn', 'factor': 16.0,"
                       " 'original_max_position_embeddings': 32, 'beta_fast': 16,"
                       " 'rope_theta': 1234.0}}";
    if (expect_ok("flat_yarn_rope", &c, tiny, flat, NULL)) return;
    REQUIRE(!c.rope_main.yarn && c.rope_main.theta == 10000.0);
    REQUIRE(c.rope_compress.yarn && c.rope_compress.theta == 160000.0);
    REQUIRE(c.rope_compress.factor == 16.0 && c.rope_compress.orig_max_pos == 32.0);
    REQUIRE(c.rope_compress.beta_fast == 16.0 && c.rope_compress.beta_slow == 1.0);
    REQUIRE(c.rope_compress.attention_factor == 1.0 && c.rope_compress.truncate == 1);
done:
    report("flat_yarn_rope", why[0] ? why : NULL);
}

static void test_flat_rope_no_factor(void) {
    char why[600] = "";
    struct td_config c;
    const char *flat =
        "{'rope_parameters': {'type': 'yarn', 'original_max_position_embeddings': 32}}";
    if (expect_ok("flat_yarn_factor_from_max_pos", &c, tiny, flat, NULL)) return;
    REQUIRE(c.rope_compress.yarn && c.rope_compress.factor == 512.0 / 32.0);
done:
    report("flat_yarn_factor_from_max_pos", why[0] ? why : NULL);
}

static void test_no_rope_dict(void) {
    char why[600] = "";
    struct td_config c;
    if (expect_ok("no_rope_dict", &c, tiny, "{'rope_parameters': null}", NULL)) return;
    REQUIRE(!c.rope_main.yarn && !c.rope_compress.yarn);
    REQUIRE(c.rope_main.theta == 10000.0 && c.rope_compress.theta == 160000.0);
    REQUIRE(c.rope_compress.attention_factor == 1.0);
done:
    report("no_rope_dict", why[0] ? why : NULL);
}

static void test_legacy_flash(void) {
    char why[600] = "", err[512] = "";
    struct td_config c;
    char *s = flash_config();
    if (td_config_parse(&c, s, err, sizeof err) != 0) {
        snprintf(why, sizeof why, "parse failed: %s", err);
        goto done;
    }
    int n_kind[3] = {0};
    for (int i = 0; i < c.n_layers; i++)
        n_kind[c.attn[i]]++;
    REQUIRE(c.n_layers == 43 && c.head_dim == 512 && c.rope_dim == 64);
    REQUIRE(n_kind[TD_ATTN_SLIDING] == 2 && n_kind[TD_ATTN_CSA] == 21 && n_kind[TD_ATTN_HCA] == 20);
    REQUIRE(c.attn[0] == TD_ATTN_SLIDING && c.attn[1] == TD_ATTN_SLIDING);
    REQUIRE(c.attn[2] == TD_ATTN_CSA && c.attn[3] == TD_ATTN_HCA && c.attn[42] == TD_ATTN_CSA);
    REQUIRE(c.n_mtp_layers == 1 && c.mtp_attn[0] == TD_ATTN_SLIDING);
    REQUIRE(c.rate_csa == 4 && c.rate_hca == 128);
    REQUIRE(c.mlp[0] == TD_MLP_HASH && c.mlp[2] == TD_MLP_HASH && c.mlp[3] == TD_MLP_MOE);
    REQUIRE(c.mlp[42] == TD_MLP_MOE);
    REQUIRE(!c.rope_main.yarn && c.rope_main.theta == 10000.0);
    REQUIRE(c.rope_compress.yarn && c.rope_compress.theta == 160000.0);
    REQUIRE(c.rope_compress.factor == 16.0 && c.rope_compress.orig_max_pos == 65536.0);
    REQUIRE(c.rope_compress.beta_fast == 32.0 && c.rope_compress.beta_slow == 1.0);
    REQUIRE(c.rope_compress.attention_factor == 1.0);
    REQUIRE(c.n_experts == 256 && c.n_experts_tok == 6 && c.moe_inter == 2048);
    REQUIRE(c.index_n_heads == 64 && c.index_head_dim == 128 && c.index_topk == 512);
    REQUIRE(c.max_position_embeddings == 1048576 && c.bos_id == 0);
    REQUIRE(c.n_eos == 1 && c.eos_ids[0] == 1);
done:
    free(s);
    report("legacy_v4_flash", why[0] ? why : NULL);
}

static void test_legacy_small(void) {
    char why[600] = "";
    struct td_config c;
    const char *del = "layer_types mlp_layer_types compress_rates partial_rotary_factor";
    /* MTP tail of compress_ratios, custom CSA rate via compress_rate_csa */
    if (expect_ok("legacy_ratios_mtp_tail", &c, tiny,
                  "{'compress_ratios': [0, 8, 128, 8, 128, 0, 4], 'compress_rate_csa': 8,"
                  " 'num_hash_layers': 1, 'qk_rope_head_dim': 8}",
                  del))
        return;
    REQUIRE(c.rate_csa == 8 && c.rate_hca == 128 && c.rope_dim == 8);
    REQUIRE(c.attn[0] == TD_ATTN_SLIDING && c.attn[1] == TD_ATTN_CSA);
    REQUIRE(c.attn[2] == TD_ATTN_HCA && c.attn[3] == TD_ATTN_CSA);
    REQUIRE(c.mtp_attn[0] == TD_ATTN_HCA && c.mtp_attn[1] == TD_ATTN_SLIDING);
    REQUIRE(c.mtp_attn[2] == TD_ATTN_CSA && c.mtp_attn[3] == TD_ATTN_SLIDING);
    REQUIRE(c.mlp[0] == TD_MLP_HASH && c.mlp[1] == TD_MLP_MOE);
done:
    report("legacy_ratios_mtp_tail", why[0] ? why : NULL);
}

static void test_defaults(void) {
    char why[600] = "";
    struct td_config c;
    if (expect_ok("defaults", &c, minimal, NULL, NULL)) return;
    REQUIRE(c.attn[0] == TD_ATTN_HCA && c.attn[1] == TD_ATTN_HCA && c.attn[2] == TD_ATTN_HCA);
    REQUIRE(c.attn[3] == TD_ATTN_CSA && c.attn[4] == TD_ATTN_HCA && c.attn[5] == TD_ATTN_CSA);
    REQUIRE(c.mlp[0] == TD_MLP_HASH && c.mlp[2] == TD_MLP_HASH && c.mlp[3] == TD_MLP_MOE);
    REQUIRE(c.mlp[5] == TD_MLP_MOE && c.rope_dim == 8 && c.rate_csa == 4 && c.rate_hca == 128);
    REQUIRE(c.score_fn == TD_SCORE_SQRTSOFTPLUS && c.routed_scaling == 1.5f);
    REQUIRE(c.swiglu_limit == 10.0f && c.mlp_bias == 0 && c.hc_mult == 4);
    REQUIRE(c.hc_sinkhorn_iters == 20 && c.hc_eps == 1e-6f && c.rms_eps == 1e-6f);
    REQUIRE(c.tie_word_embeddings == 0 && c.max_position_embeddings == 1048576);
    REQUIRE(c.n_mtp_layers == 1 && c.mtp_attn[0] == TD_ATTN_SLIDING);
    REQUIRE(!c.rope_main.yarn && !c.rope_compress.yarn && c.rope_main.theta == 10000.0);
    REQUIRE(c.rope_compress.theta == 160000.0 && c.rope_compress.attention_factor == 1.0);
    REQUIRE(c.bos_id == -1 && c.n_eos == 0);
done:
    report("defaults_and_default_layer_types", why[0] ? why : NULL);
}

static void test_default_mlp_two_layers(void) {
    char why[600] = "";
    struct td_config c;
    if (expect_ok("default_mlp_two_layers", &c, minimal, "{'num_hidden_layers': 2}", NULL)) return;
    REQUIRE(c.mlp[0] == TD_MLP_HASH && c.mlp[1] == TD_MLP_HASH);
    REQUIRE(c.attn[0] == TD_ATTN_HCA && c.attn[1] == TD_ATTN_HCA);
done:
    report("default_mlp_two_layers", why[0] ? why : NULL);
}

static void test_aliases_and_options(void) {
    char why[600] = "";
    struct td_config c;
    if (expect_ok("aliases", &c, minimal,
                  "{'num_local_experts': 32, 'intermediate_size': 96, 'scoring_func': 'sigmoid',"
                  " 'mlp_bias': true, 'tie_word_embeddings': true, 'hc_mult': 2,"
                  " 'rope_theta': 50000, 'num_nextn_predict_layers': 0}",
                  "n_routed_experts moe_intermediate_size"))
        return;
    REQUIRE(c.n_experts == 32 && c.moe_inter == 96 && c.score_fn == TD_SCORE_SIGMOID);
    REQUIRE(c.mlp_bias == 1 && c.tie_word_embeddings == 1 && c.hc_mult == 2);
    REQUIRE(c.rope_main.theta == 50000.0 && c.n_mtp_layers == 0);
done:
    report("aliases_and_options", why[0] ? why : NULL);
}

static void test_scoring_softmax(void) {
    char why[600] = "";
    struct td_config c;
    if (expect_ok("scoring_softmax", &c, minimal, "{'scoring_func': 'softmax'}", NULL)) return;
    REQUIRE(c.score_fn == TD_SCORE_SOFTMAX);
done:
    report("scoring_softmax", why[0] ? why : NULL);
}

/* the release's quantization keys, verbatim (released_formats.md 1.9) */
static void test_released_quant(void) {
    char why[600] = "";
    struct td_config c;
    const char *rel = "{'quantization_config': {'activation_scheme': 'dynamic', 'fmt': 'e4m3',"
                      " 'quant_method': 'fp8', 'scale_fmt': 'ue8m0', 'weight_block_size': [128,"
                      " 128]}, 'expert_dtype': 'fp4'}";
    if (expect_ok("released_quant_keys", &c, minimal, rel, NULL)) return;
    REQUIRE(c.quant_fp8 == 1 && c.expert_fp4 == 1);
    if (expect_ok("released_quant_keys", &c, minimal, "{'quantization_config': {}}", NULL)) return;
    REQUIRE(c.quant_fp8 == 1 && c.expert_fp4 == 1); // vLLM's default: fp4 experts
    if (expect_ok("released_quant_keys", &c, minimal,
                  "{'quantization_config': {}, 'expert_dtype': 'bf16'}", NULL))
        return;
    REQUIRE(c.quant_fp8 == 1 && c.expert_fp4 == 0);
    if (expect_ok("released_quant_keys", &c, minimal, NULL, NULL)) return;
    REQUIRE(c.quant_fp8 == 0 && c.expert_fp4 == 0);
done:
    report("released_quant_keys", why[0] ? why : NULL);
}

static void test_tokens(void) {
    char why[600] = "";
    struct td_config c;
    if (expect_ok("eos_list", &c, tiny, "{'eos_token_id': [1, 2, 3], 'bos_token_id': 7}", NULL))
        return;
    REQUIRE(c.n_eos == 3 && c.eos_ids[0] == 1 && c.eos_ids[1] == 2 && c.eos_ids[2] == 3);
    REQUIRE(c.bos_id == 7);
done:
    report("eos_list", why[0] ? why : NULL);
}

static void test_tokens_null(void) {
    char why[600] = "";
    struct td_config c;
    if (expect_ok("eos_bos_null", &c, tiny, "{'eos_token_id': null, 'bos_token_id': null}", NULL))
        return;
    REQUIRE(c.n_eos == 0 && c.bos_id == -1);
done:
    report("eos_bos_null", why[0] ? why : NULL);
    expect_fail("eos_too_many", tiny, "{'eos_token_id': [1, 2, 3, 4, 5, 6, 7, 8, 9]}", NULL,
                "eos_token_id");
    expect_fail("eos_bad_type", tiny, "{'eos_token_id': '1'}", NULL, "eos_token_id");
    expect_fail("eos_bad_element", tiny, "{'eos_token_id': [1, 'x']}", NULL, "eos_token_id[1]");
    expect_fail("bos_bad_type", tiny, "{'bos_token_id': [0]}", NULL, "bos_token_id");
}

static void test_rates(void) {
    char why[600] = "";
    struct td_config c;
    /* a dict replaces the default: a missing key only matters when that kind exists */
    if (expect_ok("rates_partial_dict_unused", &c, tiny,
                  "{'compress_rates': {'compressed_sparse_attention': 4},"
                  " 'layer_types': ['sliding_attention', 'compressed_sparse_attention',"
                  "                 'sliding_attention', 'compressed_sparse_attention']}",
                  NULL))
        return;
    REQUIRE(c.rate_csa == 4 && c.attn[2] == TD_ATTN_SLIDING);
done:
    report("rates_partial_dict_unused", why[0] ? why : NULL);

    expect_fail("rates_partial_dict_used", tiny,
                "{'compress_rates': {'compressed_sparse_attention': 4}}", NULL,
                "heavily_compressed_attention");
    expect_fail("rates_not_object", tiny, "{'compress_rates': [4, 128]}", NULL, "compress_rates");
    expect_fail("rates_not_positive", tiny, "{'compress_rate_hca': 0}", NULL,
                "heavily_compressed_attention");
}

static void test_errors(void) {
    for (size_t i = 0; i < sizeof required_keys / sizeof required_keys[0]; i++) {
        char name[96];
        snprintf(name, sizeof name, "missing_%s", required_keys[i]);
        expect_fail(name, minimal, NULL, required_keys[i], required_keys[i]);
    }
    expect_fail("wrong_type_hidden_size", tiny, "{'hidden_size': '128'}", NULL, "hidden_size");
    expect_fail("wrong_type_null_required", tiny, "{'head_dim': null}", NULL, "head_dim");
    expect_fail("wrong_model_type", tiny, "{'model_type': 'deepseek_v3'}", NULL, "model_type");
    expect_fail("bad_layer_type", tiny,
                "{'layer_types': ['sliding_attention', 'full_attention',"
                " 'sliding_attention', 'sliding_attention']}",
                NULL, "layer_types[1] is \"full_attention\"");
    expect_fail("layer_types_too_short", tiny, "{'layer_types': ['sliding_attention']}", NULL,
                "layer_types has 1 entries");
    expect_fail("bad_mlp_type", tiny, "{'mlp_layer_types': ['moe', 'moe', 'dense', 'moe']}", NULL,
                "mlp_layer_types[2]");
    expect_fail("bad_compress_ratio", tiny, "{'compress_ratios': [0, 4, 7, 128]}", "layer_types",
                "compress_ratios[2]");
    expect_fail("compress_ratios_too_short", tiny, "{'compress_ratios': [0, 4]}", "layer_types",
                "compress_ratios");
    expect_fail("hc_mult_too_many", tiny, "{'hc_mult': 17}", NULL, "hc_mult");
    expect_fail("quant_block_64", tiny,
                "{'quantization_config': {'quant_method': 'fp8', 'fmt': 'e4m3', 'scale_fmt': "
                "'ue8m0', 'weight_block_size': [64, 64]}}",
                NULL, "weight_block_size [64,64] is not supported");
    expect_fail("quant_fmt_e5m2", tiny, "{'quantization_config': {'fmt': 'e5m2'}}", NULL,
                "fmt \"e5m2\"");
    expect_fail("quant_method_awq", tiny, "{'quantization_config': {'quant_method': 'awq'}}", NULL,
                "quant_method \"awq\"");
    expect_fail("quant_not_object", tiny, "{'quantization_config': 'fp8'}", NULL,
                "quantization_config must be an object");
    expect_fail("expert_dtype_int4", tiny, "{'expert_dtype': 'int4'}", NULL,
                "expert_dtype \"int4\"");
    expect_fail("bad_scoring_func", tiny, "{'scoring_func': 'relu'}", NULL,
                "scoring_func \"relu\"");
    expect_fail("rope_dim_odd", tiny, "{'qk_rope_head_dim': 15}", "partial_rotary_factor",
                "rope dims 15");
    expect_fail("rope_dim_past_index_head_dim", tiny, "{'partial_rotary_factor': 0.75}", NULL,
                "rope dims 48");
    expect_fail("o_groups_not_dividing", tiny, "{'o_groups': 3}", NULL, "o_groups");
    expect_fail("topk_over_experts", tiny, "{'num_experts_per_tok': 9}", NULL,
                "num_experts_per_tok");
    expect_fail("sliding_window_1", tiny, "{'sliding_window': 1}", NULL, "sliding_window");
    expect_fail("hc_mult_0", tiny, "{'hc_mult': 0}", NULL, "hc_mult");
    expect_fail("too_many_layers", minimal, "{'num_hidden_layers': 300}", NULL,
                "num_hidden_layers");
    expect_fail("negative_size", minimal, "{'hidden_size': -4}", NULL, "hidden_size");
    expect_fail("flat_yarn_no_original", tiny,
                "{'rope_parameters': {'rope_type': 'yarn',"
                " 'factor': 4.0}}",
                NULL, "original_max_position_embeddings");
    expect_fail("flat_rope_unknown_type", tiny,
                "{'rope_scaling': {'type': 'linear', 'factor': 2.0}}", "rope_parameters",
                "\"linear\"");
    expect_fail("nested_rope_unknown_type", tiny,
                "{'rope_parameters': {'main': {'rope_type': 'default'},"
                " 'compress': {'rope_type': 'llama3'}}}",
                NULL, "\"llama3\"");
    expect_fail("nested_rope_half", tiny, "{'rope_parameters': {'main': {}}}", NULL, "compress");
    expect_fail("rope_not_object", tiny, "{'rope_parameters': 'yarn'}", NULL, "rope_parameters");
    expect_fail("bool_wrong_type", tiny, "{'mlp_bias': 'yes'}", NULL, "mlp_bias");
    expect_fail("not_an_object", "[1, 2]", NULL, NULL, "not a JSON object");
}

/* JSON numbers are checked against each key's range before they are converted, and the
 * message names the key, the value and the range */
static void test_ranges(void) {
    expect_fail("max_pos_2_63_minus_1", tiny, "{'max_position_embeddings': 9223372036854775807}",
                NULL,
                "\"max_position_embeddings\" = 9223372036854775807 is out of range [1, "
                "2147483647]");
    expect_fail("max_pos_2_32", tiny, "{'max_position_embeddings': 4294967296}", NULL,
                "max_position_embeddings");
    expect_fail("max_pos_float_2_63", tiny, "{'max_position_embeddings': 9.3e18}", NULL,
                "max_position_embeddings");
    expect_fail("max_pos_zero", tiny, "{'max_position_embeddings': 0}", NULL,
                "is out of range [1, 2147483647]");
    expect_fail("hidden_size_2_32", tiny, "{'hidden_size': 4294967296}", NULL,
                "\"hidden_size\" = 4294967296 is out of range [1, 65536]");
    expect_fail("head_dim_past_width", tiny, "{'head_dim': 65537}", NULL,
                "\"head_dim\" = 65537 is out of range [1, 65536]");
    expect_fail("vocab_size_zero", tiny, "{'vocab_size': 0}", NULL,
                "\"vocab_size\" = 0 is out of range [1, 2147483647]");
    expect_fail("num_nextn_negative", tiny, "{'num_nextn_predict_layers': -1}", NULL,
                "\"num_nextn_predict_layers\" = -1 is out of range [0, 4]");
    expect_fail("rate_in_dict_2_32", tiny,
                "{'compress_rates': {'compressed_sparse_attention': 4294967300,"
                " 'heavily_compressed_attention': 8}}",
                NULL, "compress_rates.compressed_sparse_attention");
    // fuzz_engine: 2 * 2147483647 overflowed in the model's size check
    expect_fail("rate_csa_int_max", tiny, "{'compress_rate_csa': 2147483647}", NULL,
                "\"compress_rate_csa\" = 2147483647 is out of range [0, 65536]");
    expect_fail("float_key_past_float", tiny, "{'routed_scaling_factor': 1e300}", NULL,
                "routed_scaling_factor");
    // a row can select no more entries than the context has positions (tiny: 512)
    expect_fail("index_topk_past_max_pos", tiny, "{'index_topk': 10000000}", NULL,
                "index_topk 10000000 exceeds max_position_embeddings 512");
    expect_fail("index_topk_int_max", tiny, "{'index_topk': 2147483647}", NULL, "index_topk");
    // 2^31 Sinkhorn iterations ran the forward for hours without a word
    expect_fail("sinkhorn_iters_int_max", tiny, "{'hc_sinkhorn_iters': 2147483647}", NULL,
                "\"hc_sinkhorn_iters\" = 2147483647 is out of range [0, 1000]");
    expect_fail("sinkhorn_iters_1001", tiny, "{'hc_sinkhorn_iters': 1001}", NULL,
                "hc_sinkhorn_iters");
    char why[600] = "";
    struct td_config c;
    if (expect_ok("sinkhorn_iters_1000", &c, tiny, "{'hc_sinkhorn_iters': 1000}", NULL)) return;
    REQUIRE(c.hc_sinkhorn_iters == 1000);
    if (expect_ok("index_topk_max_pos", &c, tiny, "{'index_topk': 512}", NULL)) return;
    REQUIRE(c.index_topk == 512);
    if (expect_ok("max_pos_integral_float", &c, tiny, "{'max_position_embeddings': 2048.0}", NULL))
        return;
    REQUIRE(c.max_position_embeddings == 2048);
    if (expect_ok("max_pos_int_max", &c, tiny, "{'max_position_embeddings': 2147483647}", NULL))
        return;
    REQUIRE(c.max_position_embeddings == 2147483647);
done:
    report("max_pos_in_range", why[0] ? why : NULL);
}

static void test_load_file(void) {
    char why[600] = "", err[512] = "", path[64] = "/tmp/td_test_cfg_XXXXXX";
    struct td_config c;
    int fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    char *s = variant(tiny, NULL, NULL);
    REQUIRE(f && s);
    fputs(s, f);
    fclose(f);
    f = NULL;
    if (td_config_load(&c, path, err, sizeof err) != 0) {
        snprintf(why, sizeof why, "load failed: %s", err);
        goto done;
    }
    REQUIRE(c.n_layers == 4 && c.attn[2] == TD_ATTN_HCA && c.rope_compress.yarn);

    /* errors from a file name the file and the key */
    f = fopen(path, "w");
    REQUIRE(f);
    fputs("{\"vocab_size\": 10}", f);
    fclose(f);
    f = NULL;
    REQUIRE(td_config_load(&c, path, err, sizeof err) == -1);
    REQUIRE(strstr(err, path) && strstr(err, "hidden_size"));

    f = fopen(path, "w");
    REQUIRE(f);
    fputs("{\"vocab_size\": ", f);
    fclose(f);
    f = NULL;
    REQUIRE(td_config_load(&c, path, err, sizeof err) == -1 && strstr(err, path));

    REQUIRE(td_config_load(&c, "/nonexistent/config.json", err, sizeof err) == -1);
    REQUIRE(strstr(err, "/nonexistent/config.json") != NULL);
    REQUIRE(td_config_parse(&c, "{", err, sizeof err) == -1 && strstr(err, "malformed"));
done:
    if (f) fclose(f);
    free(s);
    if (fd >= 0) unlink(path);
    report("load_file", why[0] ? why : NULL);
}

/* config.json that is a FIFO (an open for reading would wait for a writer forever) or a
 * directory, or larger than any config: refused at once, naming the file */
static void test_special_files(void) {
    char why[600] = "", err[512] = "", dir[64] = "/tmp/td_test_cfg_XXXXXX", path[128];
    struct td_config c;
    REQUIRE(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/config.json", dir);
    REQUIRE(mkfifo(path, 0600) == 0);
    case_deadline("config_special_files", 10);
    REQUIRE(td_config_load(&c, path, err, sizeof err) == -1);
    REQUIRE(strstr(err, path) && strstr(err, "not a regular file") && !strchr(err, '\n'));
    unlink(path);
    REQUIRE(mkdir(path, 0700) == 0);
    REQUIRE(td_config_load(&c, path, err, sizeof err) == -1 && strstr(err, "not a regular file"));
    rmdir(path);
    // 65 MiB (sparse): past the 64 MiB any JSON file may have, refused before it is read
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    int ok = ftruncate(fileno(f), (off_t)65 << 20) == 0;
    fclose(f);
    REQUIRE(ok);
    REQUIRE(td_config_load(&c, path, err, sizeof err) == -1);
    REQUIRE(strstr(err, path) && strstr(err, "64 MiB"));
done:
    case_deadline(NULL, 0);
    if (getenv("TD_TEST_VERBOSE")) printf("  %s\n", err);
    unlink(path);
    rmdir(path);
    rmdir(dir);
    report("config_special_files", why[0] ? why : NULL);
}

/* a DSpark head's keys in the target's own config.json (V4-Flash-0731, the -DSpark releases):
 * read with the stage count left to the weights, or given; absent, nothing; incomplete or out of
 * range (against the target's layers and vocabulary), refused naming the key. The same keys in
 * a drafter folder's config.json (td_config_dspark_load) are required, and its window must be
 * the target's. */
static void test_dspark_keys(void) {
    char why[600] = "", err[512] = "", path[64] = "/tmp/td_test_cfg_XXXXXX";
    struct td_config c, t;
    const char *keys = "{'dspark_block_size': 5, 'dspark_noise_token_id': 511,"
                       " 'dspark_markov_rank': 64, 'dspark_target_layer_ids': [1, 2, 3]}";
    int fd = -1;
    if (expect_ok("dspark_keys", &c, tiny, keys, NULL)) return;
    REQUIRE(c.dspark.present && c.dspark.block == 5 && c.dspark.noise == 511);
    REQUIRE(c.dspark.rank == 64 && c.dspark.n_stages == 0 && c.dspark.n_capture == 3);
    REQUIRE(c.dspark.capture[0] == 1 && c.dspark.capture[1] == 2 && c.dspark.capture[2] == 3);
    if (expect_ok("dspark_keys", &c, tiny,
                  "{'dspark_block_size': 16, 'dspark_noise_token_id': 0,"
                  " 'dspark_markov_rank': 256, 'dspark_target_layer_ids': [0],"
                  " 'dspark_num_stages': 3}",
                  NULL))
        return;
    REQUIRE(c.dspark.present && c.dspark.block == 16 && c.dspark.n_stages == 3);
    REQUIRE(c.dspark.n_capture == 1 && c.dspark.capture[0] == 0);
    if (expect_ok("dspark_keys", &c, tiny, NULL, NULL)) return;
    REQUIRE(!c.dspark.present && c.dspark.n_capture == 0);
    // a folder's config: the keys required, its window the target's
    char *ts = variant(tiny, NULL, NULL);
    REQUIRE(ts && !td_config_parse(&t, ts, err, sizeof err));
    free(ts);
    const struct {
        const char *patch, *want; /* want NULL: loads */
    } folder[] = {
        {"{'model_type': 'deepseek_v4_dspark', 'sliding_window': 8, 'dspark_num_stages': 2}", NULL},
        {"{'sliding_window': 16}", "\"sliding_window\" = 16 is not the target's 8"},
        {"{'dspark_target_layer_ids': [4]}", "\"dspark_target_layer_ids[0]\" = 4 is not a layer"},
    };
    for (size_t i = 0; i < sizeof folder / sizeof *folder; i++) {
        char *fs = variant(keys, folder[i].patch, NULL);
        fd = mkstemp(path);
        FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
        REQUIRE(f && fs);
        fputs(fs, f);
        fclose(f);
        free(fs);
        struct td_dspark_cfg d;
        int rc = td_config_dspark_load(&d, path, &t, err, sizeof err);
        if (!folder[i].want)
            REQUIRE(!rc && d.present && d.n_stages == 2 && d.rank == 64);
        else
            REQUIRE(rc && strstr(err, path) && strstr(err, folder[i].want));
        unlink(path);
        snprintf(path, sizeof path, "/tmp/td_test_cfg_XXXXXX");
    }
    fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    REQUIRE(f);
    fputs("{\"dspark_block_size\": 5}", f);
    fclose(f);
    struct td_dspark_cfg d;
    REQUIRE(td_config_dspark_load(&d, path, &t, err, sizeof err) &&
            strstr(err, "missing key \"dspark_noise_token_id\""));
    unlink(path);
done:
    report("dspark_keys", why[0] ? why : NULL);

    const char *miss[] = {"dspark_block_size", "dspark_noise_token_id", "dspark_markov_rank",
                          "dspark_target_layer_ids"};
    for (size_t i = 0; i < sizeof miss / sizeof *miss; i++) {
        char name[96], want[96];
        snprintf(name, sizeof name, "dspark_incomplete_%s", miss[i] + strlen("dspark_"));
        snprintf(want, sizeof want, "missing key \"%s\" beside", miss[i]);
        char *base = variant(tiny, keys, NULL);
        expect_fail(name, base, NULL, miss[i], want);
        free(base);
    }
    const struct {
        const char *name, *patch, *want;
    } bad[] = {
        {"dspark_block_zero", "{'dspark_block_size': 0}",
         "\"dspark_block_size\" = 0 is out of range [1, 16]"},
        {"dspark_block_past_16", "{'dspark_block_size': 17}", "\"dspark_block_size\" = 17"},
        {"dspark_noise_past_vocab", "{'dspark_noise_token_id': 512}",
         "\"dspark_noise_token_id\" = 512 is out of range [0, 511]"},
        {"dspark_rank_past_256", "{'dspark_markov_rank': 257}", "\"dspark_markov_rank\" = 257"},
        {"dspark_rank_string", "{'dspark_markov_rank': '64'}",
         "\"dspark_markov_rank\" must be an integer, got a string"},
        {"dspark_ids_not_list", "{'dspark_target_layer_ids': 3}",
         "\"dspark_target_layer_ids\" must be a list, got an integer"},
        {"dspark_ids_empty", "{'dspark_target_layer_ids': []}", "lists 0 layers, want 1 to 8"},
        {"dspark_ids_nine", "{'dspark_target_layer_ids': [0, 1, 2, 3, 4, 5, 6, 7, 8]}",
         "lists 9 layers"},
        {"dspark_ids_descend", "{'dspark_target_layer_ids': [2, 1]}",
         "\"dspark_target_layer_ids\" must ascend: [1] = 1 after 2"},
        {"dspark_ids_repeat", "{'dspark_target_layer_ids': [2, 2]}", "must ascend"},
        {"dspark_ids_past_layers", "{'dspark_target_layer_ids': [1, 4]}",
         "\"dspark_target_layer_ids[1]\" = 4 is not a layer of the target ([0, 4))"},
        {"dspark_ids_negative", "{'dspark_target_layer_ids': [-1]}", "[0]\" = -1 is not a layer"},
        {"dspark_ids_element_string", "{'dspark_target_layer_ids': [1, 'x']}",
         "\"dspark_target_layer_ids[1]\" must be an integer, got a string"},
        {"dspark_stages_zero", "{'dspark_num_stages': 0}",
         "\"dspark_num_stages\" = 0 is out of range"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char *base = variant(tiny, keys, NULL);
        expect_fail(bad[i].name, base, bad[i].patch, NULL, bad[i].want);
        free(base);
    }
    expect_fail("dspark_stages_alone", tiny, "{'dspark_num_stages': 3}", NULL,
                "\"dspark_num_stages\" without a DSpark head's keys");
}

static void test_kind_names(void) {
    char why[600] = "";
    REQUIRE(strcmp(td_attn_kind_name(TD_ATTN_SLIDING), "sliding") == 0);
    REQUIRE(strcmp(td_attn_kind_name(TD_ATTN_CSA), "csa") == 0);
    REQUIRE(strcmp(td_attn_kind_name(TD_ATTN_HCA), "hca") == 0);
done:
    report("attn_kind_names", why[0] ? why : NULL);
}

int main(void) {
    test_hf_tiny();
    test_nested_rope();
    test_nested_rope_main_yarn();
    test_flat_rope();
    test_flat_rope_no_factor();
    test_no_rope_dict();
    test_legacy_flash();
    test_legacy_small();
    test_defaults();
    test_default_mlp_two_layers();
    test_aliases_and_options();
    test_scoring_softmax();
    test_released_quant();
    test_tokens();
    test_tokens_null();
    test_rates();
    test_errors();
    test_ranges();
    test_load_file();
    test_special_files();
    test_dspark_keys();
    test_kind_names();
    return check_failures ? 1 : 0;
}
