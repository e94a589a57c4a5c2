/* config.c: config.json -> struct td_config, following transformers 5.17 DeepseekV4Config.
 *
 * HF keys (layer_types, mlp_layer_types, compress_rates, rope_parameters) and the legacy keys
 * of released checkpoints (compress_ratios, compress_rate_csa/hca, num_hash_layers,
 * qk_rope_head_dim, rope_scaling) are folded into one struct the way __post_init__ does it;
 * ../shared/design/dsv4.md §1 has the rules. JSON null counts as absent for optional keys.
 * Every failure is one line naming the key.
 */
#include "config.h"
#include "kernels/err.h"
#include "fileio.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <errno.h>
#include <float.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

const char *td_attn_kind_name(enum td_attn_kind k) {
    switch (k) {
    case TD_ATTN_SLIDING: return "sliding";
    case TD_ATTN_CSA: return "csa";
    case TD_ATTN_HCA: return "hca";
    default: return "?";
    }
}

// ----------------------------------------------------------------------------
// typed getters: `what` names the key in messages; ctx (may be NULL) prefixes key as "ctx.key"

static const char *type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "a list";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a float";
    case JSON_TRUE:
    case JSON_FALSE: return "a bool";
    default: return "null";
    }
}

static const char *label(char *buf, size_t n, const char *ctx, const char *key) {
    if (!ctx) return key;
    snprintf(buf, n, "%s.%s", ctx, key);
    return buf;
}

/* the value of key, or NULL when absent or null */
static json_t *get(const json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_null(v) ? NULL : v;
}

/* Every integer key is read here: a JSON integer in [lo, hi], compared as the 64-bit value
 * jansson holds before it is narrowed, so nothing out of range is ever converted. */
static int to_int(const json_t *v, const char *what, int lo, int hi, int *out, char *err,
                  size_t errlen) {
    if (!json_is_integer(v))
        return td_errf(err, errlen, "key \"%s\" must be an integer, got %s", what, type_name(v));
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return td_errf(err, errlen, "key \"%s\" = %lld is out of range [%d, %d]", what,
                       (long long)x, lo, hi);
    *out = (int)x;
    return 0;
}

static int to_num(const json_t *v, const char *what, double *out, char *err, size_t errlen) {
    if (!json_is_number(v))
        return td_errf(err, errlen, "key \"%s\" must be a number, got %s", what, type_name(v));
    *out = json_number_value(v);
    return 0;
}

/* required integer key (or its alias), in [lo, hi] */
static int req_int(const json_t *o, const char *key, const char *alias, int lo, int hi, int *out,
                   char *err, size_t errlen) {
    json_t *v = json_object_get(o, key);
    if (!v && alias && (v = json_object_get(o, alias))) key = alias;
    if (!v && alias)
        return td_errf(err, errlen, "missing required key \"%s\" (or \"%s\")", key, alias);
    if (!v) return td_errf(err, errlen, "missing required key \"%s\"", key);
    return to_int(v, key, lo, hi, out, err, errlen);
}

/* optional integer key in [lo, hi], def when absent or null */
static int opt_int(const json_t *o, const char *ctx, const char *key, int def, int lo, int hi,
                   int *out, char *err, size_t errlen) {
    char buf[128];
    json_t *v = get(o, key);
    *out = def;
    return v ? to_int(v, label(buf, sizeof buf, ctx, key), lo, hi, out, err, errlen) : 0;
}

static int opt_num(const json_t *o, const char *ctx, const char *key, double def, double *out,
                   char *err, size_t errlen) {
    char buf[128];
    json_t *v = get(o, key);
    *out = def;
    return v ? to_num(v, label(buf, sizeof buf, ctx, key), out, err, errlen) : 0;
}

static int opt_float(const json_t *o, const char *key, double def, float *out, char *err,
                     size_t errlen) {
    double d;
    if (opt_num(o, NULL, key, def, &d, err, errlen)) return -1;
    if (!(fabs(d) <= FLT_MAX)) // a double past float's range has no float value
        return td_errf(err, errlen, "key \"%s\" = %g is out of a float's range", key, d);
    *out = (float)d;
    return 0;
}

/* bools also accept 0/1 integers */
static int opt_bool(const json_t *o, const char *ctx, const char *key, int def, int *out, char *err,
                    size_t errlen) {
    char buf[128];
    json_t *v = get(o, key);
    *out = def;
    if (!v) return 0;
    if (json_is_boolean(v)) {
        *out = json_is_true(v);
        return 0;
    }
    if (json_is_integer(v) && (json_integer_value(v) == 0 || json_integer_value(v) == 1)) {
        *out = (int)json_integer_value(v);
        return 0;
    }
    return td_errf(err, errlen, "key \"%s\" must be a bool, got %s",
                   label(buf, sizeof buf, ctx, key), type_name(v));
}

static int opt_str(const json_t *o, const char *key, const char *def, const char **out, char *err,
                   size_t errlen) {
    json_t *v = get(o, key);
    *out = def;
    if (!v) return 0;
    if (!json_is_string(v))
        return td_errf(err, errlen, "key \"%s\" must be a string, got %s", key, type_name(v));
    *out = json_string_value(v);
    return 0;
}

// ----------------------------------------------------------------------------
// rope

static void rope_default(struct td_rope_cfg *r, double theta) {
    memset(r, 0, sizeof *r);
    r->theta = theta;
    r->factor = 1.0;
    r->beta_fast = 32.0;
    r->beta_slow = 1.0;
    r->attention_factor = 1.0;
    r->truncate = 1;
}

/* YaRN's default cos/sin multiplier (HF get_mscale) */
static double yarn_mscale(double scale, double mscale) {
    return scale <= 1.0 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

/* Reads one rope dict d (named ctx in messages) into r, which holds the defaults.
 * nested: the dict came from a {"main", "compress"} pair and is taken as-is (its rope_theta
 * wins, attention_factor is not defaulted to 1). Flat dicts only feed the compress rope. */
static int parse_rope(const json_t *d, const char *ctx, int nested, double max_pos,
                      struct td_rope_cfg *r, char *err, size_t errlen) {
    const char *type = "default";
    json_t *t = get(d, "rope_type");
    if (!t) t = get(d, "type");
    if (t && !json_is_string(t))
        return td_errf(err, errlen, "key \"%s.rope_type\" must be a string, got %s", ctx,
                       type_name(t));
    if (t) type = json_string_value(t);
    if (nested && opt_num(d, ctx, "rope_theta", r->theta, &r->theta, err, errlen)) return -1;

    if (strcmp(type, "default") == 0) return 0;
    if (strcmp(type, "yarn") != 0)
        return td_errf(err, errlen, "unsupported rope type \"%s\" in \"%s\" (want default or yarn)",
                       type, ctx);
    r->yarn = 1;

    json_t *om = get(d, "original_max_position_embeddings");
    if (!om)
        return td_errf(err, errlen, "yarn rope \"%s\" needs original_max_position_embeddings", ctx);
    char buf[128];
    if (to_num(om, label(buf, sizeof buf, ctx, "original_max_position_embeddings"),
               &r->orig_max_pos, err, errlen))
        return -1;
    if (!(r->orig_max_pos > 0))
        return td_errf(err, errlen, "key \"%s.original_max_position_embeddings\" must be positive",
                       ctx);
    if (opt_num(d, ctx, "factor", max_pos / r->orig_max_pos, &r->factor, err, errlen) ||
        opt_num(d, ctx, "beta_fast", 32.0, &r->beta_fast, err, errlen) ||
        opt_num(d, ctx, "beta_slow", 1.0, &r->beta_slow, err, errlen) ||
        opt_bool(d, ctx, "truncate", 1, &r->truncate, err, errlen))
        return -1;
    if (!(r->factor > 0)) return td_errf(err, errlen, "key \"%s.factor\" must be positive", ctx);

    /* HF injects attention_factor 1.0 only into flat dicts; nested ones get YaRN's default */
    double mscale = 0, mscale_all = 0, def = 1.0;
    if (nested) {
        if (opt_num(d, ctx, "mscale", 0, &mscale, err, errlen) ||
            opt_num(d, ctx, "mscale_all_dim", 0, &mscale_all, err, errlen))
            return -1;
        if (mscale != 0 && mscale_all != 0)
            def = yarn_mscale(r->factor, mscale) / yarn_mscale(r->factor, mscale_all);
        else
            def = yarn_mscale(r->factor, 1.0);
    }
    return opt_num(d, ctx, "attention_factor", def, &r->attention_factor, err, errlen);
}

static int parse_ropes(struct td_config *c, const json_t *o, double rope_theta,
                       double compress_theta, char *err, size_t errlen) {
    rope_default(&c->rope_main, rope_theta);
    rope_default(&c->rope_compress, compress_theta);

    const char *key = "rope_parameters";
    json_t *rp = get(o, key);
    if (!rp) {
        key = "rope_scaling";
        rp = get(o, key);
    }
    if (!rp) return 0;
    if (!json_is_object(rp))
        return td_errf(err, errlen, "key \"%s\" must be an object, got %s", key, type_name(rp));

    double max_pos = (double)c->max_position_embeddings;
    json_t *jmain = json_object_get(rp, "main"), *jcomp = json_object_get(rp, "compress");
    if (!json_is_object(jmain) && !json_is_object(jcomp))
        return parse_rope(rp, key, 0, max_pos, &c->rope_compress, err, errlen);
    if (!json_is_object(jmain) || !json_is_object(jcomp))
        return td_errf(err, errlen, "key \"%s\" must have both \"main\" and \"compress\" objects",
                       key);
    char ctx_main[64], ctx_comp[64];
    snprintf(ctx_main, sizeof ctx_main, "%s.main", key);
    snprintf(ctx_comp, sizeof ctx_comp, "%s.compress", key);
    if (parse_rope(jmain, ctx_main, 1, max_pos, &c->rope_main, err, errlen) ||
        parse_rope(jcomp, ctx_comp, 1, max_pos, &c->rope_compress, err, errlen))
        return -1;
    return 0;
}

// ----------------------------------------------------------------------------
// per-layer kinds

static const char *const attn_type_names[] = {
    [TD_ATTN_SLIDING] = "sliding_attention",
    [TD_ATTN_CSA] = "compressed_sparse_attention",
    [TD_ATTN_HCA] = "heavily_compressed_attention",
};

/* legacy compress_ratios entry i (0 sliding, else the CSA or HCA rate) */
static int ratio_kind(const json_t *v, int i, int rate_csa, int rate_hca, enum td_attn_kind *out,
                      char *err, size_t errlen) {
    if (!json_is_integer(v))
        return td_errf(err, errlen, "compress_ratios[%d] must be an integer, got %s", i,
                       type_name(v));
    json_int_t x = json_integer_value(v);
    if (x == 0)
        *out = TD_ATTN_SLIDING;
    else if (x == rate_csa)
        *out = TD_ATTN_CSA;
    else if (x == rate_hca)
        *out = TD_ATTN_HCA;
    else if (x == 4)
        *out = TD_ATTN_CSA;
    else if (x == 128)
        *out = TD_ATTN_HCA;
    else
        return td_errf(err, errlen,
                       "compress_ratios[%d] = %lld is not 0 (sliding), %d (CSA) or %d (HCA)", i,
                       (long long)x, rate_csa, rate_hca);
    return 0;
}

static int parse_attn(struct td_config *c, const json_t *o, char *err, size_t errlen) {
    int n = c->n_layers;
    json_t *lt = get(o, "layer_types"), *cr = get(o, "compress_ratios");

    for (int i = 0; i < 4; i++)
        c->mtp_attn[i] = TD_ATTN_SLIDING;
    if (lt) {
        if (!json_is_array(lt))
            return td_errf(err, errlen, "key \"layer_types\" must be a list, got %s",
                           type_name(lt));
        if (json_array_size(lt) < (size_t)n)
            return td_errf(err, errlen, "layer_types has %zu entries, num_hidden_layers is %d",
                           json_array_size(lt), n);
        for (int i = 0; i < n; i++) {
            const char *s = json_string_value(json_array_get(lt, (size_t)i));
            int k = 0;
            while (k < 3 && !(s && strcmp(s, attn_type_names[k]) == 0))
                k++;
            if (k == 3)
                return td_errf(err, errlen,
                               "layer_types[%d] is \"%s\", want sliding_attention, "
                               "compressed_sparse_attention or heavily_compressed_attention",
                               i, s ? s : "(not a string)");
            c->attn[i] = (enum td_attn_kind)k;
        }
    } else if (cr) {
        /* entries past num_hidden_layers describe the MTP layers */
        if (!json_is_array(cr))
            return td_errf(err, errlen, "key \"compress_ratios\" must be a list, got %s",
                           type_name(cr));
        size_t len = json_array_size(cr);
        if (len < (size_t)n)
            return td_errf(err, errlen, "compress_ratios has %zu entries, num_hidden_layers is %d",
                           len, n);
        for (int i = 0; i < n + 4 && (size_t)i < len; i++) {
            enum td_attn_kind k = TD_ATTN_SLIDING;
            if (ratio_kind(json_array_get(cr, (size_t)i), i, c->rate_csa, c->rate_hca, &k, err,
                           errlen))
                return -1;
            if (i < n)
                c->attn[i] = k;
            else
                c->mtp_attn[i - n] = k;
        }
    } else {
        for (int i = 0; i < n; i++)
            c->attn[i] = (i < 2 || (i - 2) % 2 == 0) ? TD_ATTN_HCA : TD_ATTN_CSA;
    }
    return 0;
}

static int parse_mlp(struct td_config *c, const json_t *o, char *err, size_t errlen) {
    int n = c->n_layers;
    json_t *mt = get(o, "mlp_layer_types");
    if (mt) {
        if (!json_is_array(mt))
            return td_errf(err, errlen, "key \"mlp_layer_types\" must be a list, got %s",
                           type_name(mt));
        if (json_array_size(mt) < (size_t)n)
            return td_errf(err, errlen, "mlp_layer_types has %zu entries, num_hidden_layers is %d",
                           json_array_size(mt), n);
        for (int i = 0; i < n; i++) {
            const char *s = json_string_value(json_array_get(mt, (size_t)i));
            if (s && strcmp(s, "hash_moe") == 0)
                c->mlp[i] = TD_MLP_HASH;
            else if (s && strcmp(s, "moe") == 0)
                c->mlp[i] = TD_MLP_MOE;
            else
                return td_errf(err, errlen, "mlp_layer_types[%d] is \"%s\", want hash_moe or moe",
                               i, s ? s : "(not a string)");
        }
        return 0;
    }
    int n_hash;
    if (opt_int(o, NULL, "num_hash_layers", 3, 0, INT_MAX, &n_hash, err, errlen)) return -1;
    for (int i = 0; i < n; i++)
        c->mlp[i] = i < n_hash ? TD_MLP_HASH : TD_MLP_MOE;
    return 0;
}

/* widths (hidden_size, head_dim, the low ranks, moe_intermediate_size, index_head_dim) up to this
 */
#define TD_MAX_WIDTH 65536

/* compress rates up to this (the release uses 4 and 128; a CSA ring holds 2 x rate rows, and
 * rates feed products of int sizes) */
#define TD_MAX_RATE 65536

/* compress_rates dict (replaces {4, 128} when given; 0 marks a missing key), then the legacy
 * compress_rate_csa / compress_rate_hca overrides */
static int parse_rates(struct td_config *c, const json_t *o, char *err, size_t errlen) {
    c->rate_csa = 4;
    c->rate_hca = 128;
    json_t *cr = get(o, "compress_rates");
    if (cr) {
        if (!json_is_object(cr))
            return td_errf(err, errlen, "key \"compress_rates\" must be an object, got %s",
                           type_name(cr));
        if (opt_int(cr, "compress_rates", "compressed_sparse_attention", 0, 0, TD_MAX_RATE,
                    &c->rate_csa, err, errlen) ||
            opt_int(cr, "compress_rates", "heavily_compressed_attention", 0, 0, TD_MAX_RATE,
                    &c->rate_hca, err, errlen))
            return -1;
    }
    if (opt_int(o, NULL, "compress_rate_csa", c->rate_csa, 0, TD_MAX_RATE, &c->rate_csa, err,
                errlen) ||
        opt_int(o, NULL, "compress_rate_hca", c->rate_hca, 0, TD_MAX_RATE, &c->rate_hca, err,
                errlen))
        return -1;
    return 0;
}

/* after the layer kinds are known: every rate a layer uses must be given and positive */
static int check_rates(const struct td_config *c, char *err, size_t errlen) {
    for (int i = 0; i < c->n_layers; i++) {
        if (c->attn[i] == TD_ATTN_CSA && c->rate_csa < 1)
            return td_errf(err, errlen,
                           "layer %d is CSA but compress_rates[\"compressed_sparse_attention\"] is "
                           "missing or not positive (%d)",
                           i, c->rate_csa);
        if (c->attn[i] == TD_ATTN_HCA && c->rate_hca < 1)
            return td_errf(
                err, errlen,
                "layer %d is HCA but compress_rates[\"heavily_compressed_attention\"] is "
                "missing or not positive (%d)",
                i, c->rate_hca);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// whole config

static int parse_tokens(struct td_config *c, const json_t *o, char *err, size_t errlen) {
    json_t *bos = get(o, "bos_token_id"), *eos = get(o, "eos_token_id");
    c->bos_id = -1;
    if (bos && to_int(bos, "bos_token_id", INT_MIN, INT_MAX, &c->bos_id, err, errlen)) return -1;

    c->n_eos = 0;
    if (!eos) return 0;
    if (json_is_integer(eos)) {
        c->n_eos = 1;
        return to_int(eos, "eos_token_id", INT_MIN, INT_MAX, &c->eos_ids[0], err, errlen);
    }
    if (!json_is_array(eos))
        return td_errf(err, errlen,
                       "key \"eos_token_id\" must be an integer, a list or null, got %s",
                       type_name(eos));
    if (json_array_size(eos) > TD_MAX_EOS)
        return td_errf(err, errlen, "eos_token_id has %zu ids (max %d)", json_array_size(eos),
                       TD_MAX_EOS);
    for (size_t i = 0; i < json_array_size(eos); i++) {
        char what[48];
        snprintf(what, sizeof what, "eos_token_id[%zu]", i);
        if (to_int(json_array_get(eos, i), what, INT_MIN, INT_MAX, &c->eos_ids[i], err, errlen))
            return -1;
        c->n_eos++;
    }
    return 0;
}

/* what one key's range cannot say (each key's own range is checked where it is read) */
static int check_sizes(const struct td_config *c, char *err, size_t errlen) {
    if (((long long)c->n_heads * c->head_dim) % c->o_groups != 0 || c->n_heads % c->o_groups != 0)
        return td_errf(err, errlen,
                       "o_groups %d must divide num_attention_heads %d (and heads x head_dim)",
                       c->o_groups, c->n_heads);
    if (c->index_topk > c->max_position_embeddings) // the plan's dims clamp it further
        return td_errf(err, errlen,
                       "index_topk %d exceeds max_position_embeddings %ld: a row selects among "
                       "fewer entries than that",
                       c->index_topk, c->max_position_embeddings);
    if (c->n_experts_tok > c->n_experts)
        return td_errf(err, errlen, "num_experts_per_tok %d exceeds n_routed_experts %d",
                       c->n_experts_tok, c->n_experts);
    return 0;
}

/* max_position_embeddings: a positive int (contexts are int positions); an integral float is
 * taken too, as before. Compared as a double before the cast, which is undefined past INT_MAX */
static int parse_max_pos(struct td_config *c, const json_t *o, char *err, size_t errlen) {
    json_t *v = get(o, "max_position_embeddings");
    int n = 1048576;
    if (v && json_is_real(v)) {
        double x = json_real_value(v);
        if (!(x >= 1 && x <= INT_MAX) || x != floor(x))
            return td_errf(err, errlen,
                           "key \"max_position_embeddings\" = %g is not an integer in [1, %d]", x,
                           INT_MAX);
        n = (int)x;
    } else if (v && to_int(v, "max_position_embeddings", 1, INT_MAX, &n, err, errlen)) {
        return -1;
    }
    c->max_position_embeddings = n;
    return 0;
}

/* rope_dim = int(head_dim * partial_rotary_factor), legacy qk_rope_head_dim, or head_dim / 8 */
static int parse_rope_dim(struct td_config *c, const json_t *o, char *err, size_t errlen) {
    json_t *prf = get(o, "partial_rotary_factor"), *qk = get(o, "qk_rope_head_dim");
    const char *src = prf ? "partial_rotary_factor" : qk ? "qk_rope_head_dim" : "the default";
    if (prf) {
        double f = 0;
        if (to_num(prf, "partial_rotary_factor", &f, err, errlen)) return -1;
        double d = c->head_dim * f;
        if (!(d > -1.0 && d < (double)INT_MAX))
            return td_errf(err, errlen, "partial_rotary_factor %g is out of range", f);
        c->rope_dim = (int)d;
    } else if (qk) {
        if (to_int(qk, "qk_rope_head_dim", INT_MIN, INT_MAX, &c->rope_dim, err, errlen)) return -1;
    } else {
        c->rope_dim = (int)(c->head_dim * (64.0 / 512.0));
    }
    if (c->rope_dim < 0 || c->rope_dim % 2 != 0 || c->rope_dim > c->head_dim ||
        c->rope_dim > c->index_head_dim)
        return td_errf(err, errlen,
                       "rope dims %d (from %s) must be even, >= 0 and <= head_dim %d and "
                       "index_head_dim %d",
                       c->rope_dim, src, c->head_dim, c->index_head_dim);
    return 0;
}

/* quantization_config and expert_dtype as DeepSeek releases them; any other scheme is refused
 * with what it says, rather than loaded as something else */
static int parse_quant(struct td_config *c, const json_t *o, char *err, size_t errlen) {
    json_t *q = get(o, "quantization_config");
    const char *experts;
    if (opt_str(o, "expert_dtype", NULL, &experts, err, errlen)) return -1;
    if (experts && strcmp(experts, "fp4") && strcmp(experts, "fp8") && strcmp(experts, "bf16"))
        return td_errf(err, errlen, "expert_dtype \"%s\" is not supported (want fp4, fp8 or bf16)",
                       experts);
    if (!q) return 0;
    if (!json_is_object(q))
        return td_errf(err, errlen, "quantization_config must be an object, got %s", type_name(q));
    const char *method, *fmt, *scale_fmt;
    if (opt_str(q, "quant_method", "fp8", &method, err, errlen) ||
        opt_str(q, "fmt", "e4m3", &fmt, err, errlen) ||
        opt_str(q, "scale_fmt", "ue8m0", &scale_fmt, err, errlen))
        return -1;
    if (strcmp(method, "fp8") || strcmp(fmt, "e4m3") || strcmp(scale_fmt, "ue8m0"))
        return td_errf(err, errlen,
                       "quantization_config: quant_method \"%s\", fmt \"%s\", scale_fmt \"%s\" "
                       "is not supported (the released format is fp8, e4m3, ue8m0)",
                       method, fmt, scale_fmt);
    json_t *bs = json_object_get(q, "weight_block_size");
    if (bs && (!json_is_array(bs) || json_array_size(bs) != 2 ||
               json_integer_value(json_array_get(bs, 0)) != 128 ||
               json_integer_value(json_array_get(bs, 1)) != 128)) {
        char *s = json_dumps(bs, JSON_COMPACT | JSON_ENCODE_ANY);
        int rc = td_errf(err, errlen,
                         "quantization_config: weight_block_size %s is not supported (the released "
                         "format is [128, 128])",
                         s ? s : "?");
        free(s);
        return rc;
    }
    c->quant_fp8 = 1;
    c->expert_fp4 = !experts || !strcmp(experts, "fp4");
    c->expert_fp8 = experts && !strcmp(experts, "fp8");
    return 0;
}

// ----------------------------------------------------------------------------
// a DSpark head's keys (drafters.md 2.1)

static const char *const dspark_keys[] = {"dspark_block_size", "dspark_noise_token_id",
                                          "dspark_markov_rank", "dspark_target_layer_ids"};

/* o's dspark_* keys, for a target of n_layers layers and vocab tokens: none of the four (d
 * cleared; refused when need), or all four in range, and dspark_num_stages when given */
static int parse_dspark(struct td_dspark_cfg *d, const json_t *o, int n_layers, int vocab, int need,
                        char *err, size_t errlen) {
    memset(d, 0, sizeof *d);
    const char *have = NULL, *lack = NULL;
    for (size_t i = 0; i < sizeof dspark_keys / sizeof *dspark_keys; i++) {
        if (get(o, dspark_keys[i]))
            have = have ? have : dspark_keys[i];
        else
            lack = lack ? lack : dspark_keys[i];
    }
    if (!have && !need) {
        if (get(o, "dspark_num_stages"))
            return td_errf(err, errlen,
                           "key \"dspark_num_stages\" without a DSpark head's keys "
                           "(dspark_block_size, dspark_noise_token_id, dspark_markov_rank, "
                           "dspark_target_layer_ids)");
        return 0;
    }
    if (lack)
        return td_errf(err, errlen,
                       "missing key \"%s\"%s%s%s: a DSpark head's dspark_block_size, "
                       "dspark_noise_token_id, dspark_markov_rank and dspark_target_layer_ids "
                       "come together",
                       lack, have ? " beside \"" : "", have ? have : "", have ? "\"" : "");
    if (to_int(get(o, "dspark_block_size"), "dspark_block_size", 1, TD_DSPARK_MAX_BLOCK, &d->block,
               err, errlen) ||
        to_int(get(o, "dspark_noise_token_id"), "dspark_noise_token_id", 0, vocab - 1, &d->noise,
               err, errlen) ||
        to_int(get(o, "dspark_markov_rank"), "dspark_markov_rank", 1, TD_DSPARK_MAX_RANK, &d->rank,
               err, errlen) ||
        opt_int(o, NULL, "dspark_num_stages", 0, 1, TD_DSPARK_MAX_STAGES, &d->n_stages, err,
                errlen))
        return -1;
    json_t *ids = get(o, "dspark_target_layer_ids");
    if (!json_is_array(ids))
        return td_errf(err, errlen, "key \"dspark_target_layer_ids\" must be a list, got %s",
                       type_name(ids));
    size_t n = json_array_size(ids);
    if (n < 1 || n > TD_DSPARK_MAX_CAPTURE)
        return td_errf(err, errlen,
                       "key \"dspark_target_layer_ids\" lists %zu layers, want 1 to %d", n,
                       TD_DSPARK_MAX_CAPTURE);
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(ids, i);
        if (!json_is_integer(v))
            return td_errf(err, errlen,
                           "key \"dspark_target_layer_ids[%zu]\" must be an integer, got %s", i,
                           type_name(v));
        json_int_t x = json_integer_value(v);
        if (x < 0 || x >= n_layers)
            return td_errf(err, errlen,
                           "key \"dspark_target_layer_ids[%zu]\" = %lld is not a layer of the "
                           "target ([0, %d))",
                           i, (long long)x, n_layers);
        if (i && x <= d->capture[i - 1])
            return td_errf(err, errlen,
                           "key \"dspark_target_layer_ids\" must ascend: [%zu] = %lld after %d", i,
                           (long long)x, d->capture[i - 1]);
        d->capture[i] = (int)x;
    }
    d->n_capture = (int)n;
    d->present = 1;
    return 0;
}

int td_config_dspark_load(struct td_dspark_cfg *d, const char *path, const struct td_config *target,
                          char *err, size_t errlen) {
    memset(d, 0, sizeof *d);
    json_t *root = td_json_load(path, 0, err, errlen); // its messages name the path
    if (!root) return -1;
    char msg[512] = "";
    int rc = json_is_object(root)
                 ? parse_dspark(d, root, target->n_layers, target->vocab, 1, msg, sizeof msg)
                 : td_errf(msg, sizeof msg, "not a JSON object");
    json_t *w = rc ? NULL : get(root, "sliding_window");
    if (w && !(json_is_integer(w) && json_integer_value(w) == target->sliding_window)) {
        char *s = json_dumps(w, JSON_COMPACT | JSON_ENCODE_ANY);
        rc = td_errf(msg, sizeof msg,
                     "key \"sliding_window\" = %s is not the target's %d (the stages' rings are "
                     "the target's window)",
                     s ? s : "?", target->sliding_window);
        free(s);
    }
    json_decref(root);
    if (rc) {
        memset(d, 0, sizeof *d);
        return td_errf(err, errlen, "%s: %s", path, msg);
    }
    return 0;
}

static int parse(struct td_config *c, const json_t *o, char *err, size_t errlen) {
    if (!json_is_object(o)) return td_errf(err, errlen, "config is not a JSON object");

    const char *model_type, *score;
    if (opt_str(o, "model_type", "deepseek_v4", &model_type, err, errlen)) return -1;
    if (strcmp(model_type, "deepseek_v4") != 0)
        return td_errf(err, errlen, "model_type is \"%s\", want \"deepseek_v4\"", model_type);

    // M: counts a size_t holds; W: widths, whose products with a step's rows and with each
    // other are int sizes downstream (the release's widest is 7168)
    const int M = INT_MAX, W = TD_MAX_WIDTH;
    if (req_int(o, "vocab_size", NULL, 1, M, &c->vocab, err, errlen) ||
        req_int(o, "hidden_size", NULL, 1, W, &c->dim, err, errlen) ||
        req_int(o, "num_hidden_layers", NULL, 1, TD_MAX_LAYERS, &c->n_layers, err, errlen) ||
        req_int(o, "num_attention_heads", NULL, 1, M, &c->n_heads, err, errlen) ||
        req_int(o, "head_dim", NULL, 1, W, &c->head_dim, err, errlen) ||
        req_int(o, "q_lora_rank", NULL, 1, W, &c->q_lora_rank, err, errlen) ||
        req_int(o, "o_groups", NULL, 1, M, &c->o_groups, err, errlen) ||
        req_int(o, "o_lora_rank", NULL, 1, W, &c->o_lora_rank, err, errlen) ||
        req_int(o, "n_routed_experts", "num_local_experts", 1, M, &c->n_experts, err, errlen) ||
        req_int(o, "num_experts_per_tok", NULL, 1, M, &c->n_experts_tok, err, errlen) ||
        req_int(o, "moe_intermediate_size", "intermediate_size", 1, W, &c->moe_inter, err,
                errlen) ||
        req_int(o, "index_n_heads", NULL, 1, M, &c->index_n_heads, err, errlen) ||
        req_int(o, "index_head_dim", NULL, 1, W, &c->index_head_dim, err, errlen) ||
        req_int(o, "index_topk", NULL, 1, M, &c->index_topk, err, errlen) ||
        req_int(o, "sliding_window", NULL, 2, M, &c->sliding_window, err, errlen))
        return -1;

    double rope_theta, compress_theta;
    if (opt_str(o, "scoring_func", "sqrtsoftplus", &score, err, errlen) ||
        opt_float(o, "routed_scaling_factor", 1.5, &c->routed_scaling, err, errlen) ||
        opt_float(o, "swiglu_limit", 10.0, &c->swiglu_limit, err, errlen) ||
        opt_bool(o, NULL, "mlp_bias", 0, &c->mlp_bias, err, errlen) ||
        opt_int(o, NULL, "hc_mult", 4, 1, TD_MAX_HC, &c->hc_mult, err, errlen) ||
        opt_int(o, NULL, "hc_sinkhorn_iters", 20, 0, TD_MAX_SINKHORN_ITERS, &c->hc_sinkhorn_iters,
                err, errlen) ||
        opt_float(o, "hc_eps", 1e-6, &c->hc_eps, err, errlen) ||
        opt_float(o, "rms_norm_eps", 1e-6, &c->rms_eps, err, errlen) ||
        opt_bool(o, NULL, "tie_word_embeddings", 0, &c->tie_word_embeddings, err, errlen) ||
        parse_max_pos(c, o, err, errlen) ||
        opt_int(o, NULL, "num_nextn_predict_layers", 1, 0, 4, &c->n_mtp_layers, err, errlen) ||
        opt_num(o, NULL, "rope_theta", 10000.0, &rope_theta, err, errlen) ||
        opt_num(o, NULL, "compress_rope_theta", 160000.0, &compress_theta, err, errlen))
        return -1;

    if (strcmp(score, "sqrtsoftplus") == 0)
        c->score_fn = TD_SCORE_SQRTSOFTPLUS;
    else if (strcmp(score, "sigmoid") == 0)
        c->score_fn = TD_SCORE_SIGMOID;
    else if (strcmp(score, "softmax") == 0)
        c->score_fn = TD_SCORE_SOFTMAX;
    else
        return td_errf(
            err, errlen,
            "scoring_func \"%s\" is not supported (want sqrtsoftplus, sigmoid or softmax)", score);

    if (check_sizes(c, err, errlen) || parse_tokens(c, o, err, errlen) ||
        parse_rates(c, o, err, errlen) || parse_attn(c, o, err, errlen) ||
        check_rates(c, err, errlen) || parse_mlp(c, o, err, errlen) ||
        parse_rope_dim(c, o, err, errlen) ||
        parse_ropes(c, o, rope_theta, compress_theta, err, errlen) ||
        parse_quant(c, o, err, errlen) ||
        parse_dspark(&c->dspark, o, c->n_layers, c->vocab, 0, err, errlen))
        return -1;
    return 0;
}

int td_config_parse(struct td_config *cfg, const char *json, char *err, size_t errlen) {
    memset(cfg, 0, sizeof *cfg);
    json_error_t jerr;
    json_t *root = json_loads(json, 0, &jerr);
    if (!root)
        return td_errf(err, errlen, "malformed config JSON: %s (line %d, column %d)", jerr.text,
                       jerr.line, jerr.column);
    int rc = parse(cfg, root, err, errlen);
    json_decref(root);
    if (rc) memset(cfg, 0, sizeof *cfg);
    return rc;
}

int td_config_load(struct td_config *cfg, const char *path, char *err, size_t errlen) {
    memset(cfg, 0, sizeof *cfg);
    json_t *root = td_json_load(path, 0, err, errlen); // its messages name the path
    if (!root) return -1;
    char msg[512] = "";
    int rc = parse(cfg, root, msg, sizeof msg);
    json_decref(root);
    if (rc) {
        memset(cfg, 0, sizeof *cfg);
        return td_errf(err, errlen, "%s: %s", path, msg);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// generation_config.json

/* its EOS ids: a value beside an int's range is refused, never cut (2^32 + 290 is not 290) */
static int generation_eos(const json_t *root, int vocab, int *ids, int *n, int cap, char *err,
                          size_t errlen) {
    if (!json_is_object(root)) return td_errf(err, errlen, "not a JSON object");
    json_t *v = get(root, "eos_token_id");
    if (v && !json_is_integer(v) && !json_is_array(v))
        return td_errf(err, errlen,
                       "key \"eos_token_id\" must be an integer, a list or null, got %s",
                       type_name(v));
    size_t k = !v ? 0 : json_is_array(v) ? json_array_size(v) : 1;
    for (size_t i = 0; i < k; i++) {
        json_t *x = json_is_array(v) ? json_array_get(v, i) : v;
        char what[48] = "eos_token_id";
        if (json_is_array(v)) snprintf(what, sizeof what, "eos_token_id[%zu]", i);
        if (!json_is_integer(x))
            return td_errf(err, errlen, "key \"%s\" must be an integer, got %s", what,
                           type_name(x));
        json_int_t id = json_integer_value(x);
        if (id < 0 || id >= vocab)
            return td_errf(err, errlen,
                           "key \"%s\" = %lld is not a token id (the vocabulary is [0, %d))", what,
                           (long long)id, vocab);
        int dup = 0;
        for (int j = 0; j < *n; j++)
            dup |= ids[j] == id;
        if (dup) continue;
        if (*n == cap)
            return td_errf(err, errlen, "eos_token_id: more EOS ids than the %d kept", cap);
        ids[(*n)++] = (int)id;
    }
    return 0;
}

int td_config_generation_eos(const char *path, int vocab, int *ids, int *n, int cap, char *err,
                             size_t errlen) {
    struct stat st;
    if (stat(path, &st) != 0 && errno == ENOENT) return 0; // no file: nothing to add
    json_t *root = td_json_load(path, 0, err, errlen);
    if (!root) return -1;
    char msg[256] = "";
    int rc = generation_eos(root, vocab, ids, n, cap, msg, sizeof msg);
    json_decref(root);
    return rc ? td_errf(err, errlen, "%s: %s", path, msg) : 0;
}
