/* model.c: the weight mapping table (HF and upstream DeepSeek layouts) and shape checks.
 *
 * One table, `layer_table`, lists every per-layer tensor once: its HF name, its upstream
 * name, where it lands in struct td_layer, when it exists, and its shape in symbolic dims.
 * The routed experts are the one place the layouts differ in structure (HF fuses them into
 * [E, 2I, D] / [E, D, I]; upstream stores ffn.experts.E.w1/w3/w2), handled in load_experts.
 */
#include "model.h"

#include "backend.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "kernels/err.h"
#include "kernels/quant.h"
#include "model/split.h"
#include "fileio.h"

// ---------------------------------------------------------------------------------------------
// symbolic dims

enum sym {
    S_END = 0,
    S_1,
    S_3,
    S_DIM,
    S_VOCAB,
    S_RQ,
    S_QOUT,
    S_HD,
    S_CHD,
    S_OA_OUT,
    S_OA_IN,
    S_E,
    S_K,
    S_I,
    S_H,
    S_NC,
    S_HCM,
    S_NCD,
    S_RATE,
    S_IHD,
    S_2IHD,
    S_IQOUT,
    S_IH,
    S_RATE_CSA,
};

enum when { W_ALL, W_COMP, W_CSA, W_MOE, W_HASH, W_BIAS };
enum kind { K_FLOAT, K_INT };

struct wdesc {
    const char *hf; /* after "model.layers.N." */
    const char *up; /* after "layers.N." */
    size_t off;     /* offsetof(struct td_layer, ...) */
    int when;
    int kind; /* K_FLOAT (0: the rows leave it out) or K_INT */
    int dims[3];
};

#define L(f) offsetof(struct td_layer, f)
static const struct wdesc layer_table[] = {
    {.hf = "attn_hc.fn",
     .up = "hc_attn_fn",
     .off = L(hc_attn.fn),
     .when = W_ALL,
     .dims = {S_HCM, S_NCD}},
    {.hf = "attn_hc.base",
     .up = "hc_attn_base",
     .off = L(hc_attn.base),
     .when = W_ALL,
     .dims = {S_HCM}},
    {.hf = "attn_hc.scale",
     .up = "hc_attn_scale",
     .off = L(hc_attn.scale),
     .when = W_ALL,
     .dims = {S_3}},
    {.hf = "ffn_hc.fn",
     .up = "hc_ffn_fn",
     .off = L(hc_ffn.fn),
     .when = W_ALL,
     .dims = {S_HCM, S_NCD}},
    {.hf = "ffn_hc.base",
     .up = "hc_ffn_base",
     .off = L(hc_ffn.base),
     .when = W_ALL,
     .dims = {S_HCM}},
    {.hf = "ffn_hc.scale",
     .up = "hc_ffn_scale",
     .off = L(hc_ffn.scale),
     .when = W_ALL,
     .dims = {S_3}},
    {.hf = "input_layernorm.weight",
     .up = "attn_norm.weight",
     .off = L(attn_norm),
     .when = W_ALL,
     .dims = {S_DIM}},
    {.hf = "post_attention_layernorm.weight",
     .up = "ffn_norm.weight",
     .off = L(ffn_norm),
     .when = W_ALL,
     .dims = {S_DIM}},
    {.hf = "self_attn.q_a_proj.weight",
     .up = "attn.wq_a.weight",
     .off = L(wq_a),
     .when = W_ALL,
     .dims = {S_RQ, S_DIM}},
    {.hf = "self_attn.q_a_norm.weight",
     .up = "attn.q_norm.weight",
     .off = L(q_norm),
     .when = W_ALL,
     .dims = {S_RQ}},
    {.hf = "self_attn.q_b_proj.weight",
     .up = "attn.wq_b.weight",
     .off = L(wq_b),
     .when = W_ALL,
     .dims = {S_QOUT, S_RQ}},
    {.hf = "self_attn.kv_proj.weight",
     .up = "attn.wkv.weight",
     .off = L(wkv),
     .when = W_ALL,
     .dims = {S_HD, S_DIM}},
    {.hf = "self_attn.kv_norm.weight",
     .up = "attn.kv_norm.weight",
     .off = L(kv_norm),
     .when = W_ALL,
     .dims = {S_HD}},
    {.hf = "self_attn.o_a_proj.weight",
     .up = "attn.wo_a.weight",
     .off = L(wo_a),
     .when = W_ALL,
     .dims = {S_OA_OUT, S_OA_IN}},
    {.hf = "self_attn.o_b_proj.weight",
     .up = "attn.wo_b.weight",
     .off = L(wo_b),
     .when = W_ALL,
     .dims = {S_DIM, S_OA_OUT}},
    {.hf = "self_attn.sinks",
     .up = "attn.attn_sink",
     .off = L(sinks),
     .when = W_ALL,
     .dims = {S_H}},
    {.hf = "self_attn.compressor.kv_proj.weight",
     .up = "attn.compressor.wkv.weight",
     .off = L(comp.wkv),
     .when = W_COMP,
     .dims = {S_CHD, S_DIM}},
    {.hf = "self_attn.compressor.gate_proj.weight",
     .up = "attn.compressor.wgate.weight",
     .off = L(comp.wgate),
     .when = W_COMP,
     .dims = {S_CHD, S_DIM}},
    {.hf = "self_attn.compressor.position_bias",
     .up = "attn.compressor.ape",
     .off = L(comp.ape),
     .when = W_COMP,
     .dims = {S_RATE, S_CHD}},
    {.hf = "self_attn.compressor.kv_norm.weight",
     .up = "attn.compressor.norm.weight",
     .off = L(comp.norm),
     .when = W_COMP,
     .dims = {S_HD}},
    {.hf = "self_attn.compressor.indexer.kv_proj.weight",
     .up = "attn.indexer.compressor.wkv.weight",
     .off = L(icomp.wkv),
     .when = W_CSA,
     .dims = {S_2IHD, S_DIM}},
    {.hf = "self_attn.compressor.indexer.gate_proj.weight",
     .up = "attn.indexer.compressor.wgate.weight",
     .off = L(icomp.wgate),
     .when = W_CSA,
     .dims = {S_2IHD, S_DIM}},
    {.hf = "self_attn.compressor.indexer.position_bias",
     .up = "attn.indexer.compressor.ape",
     .off = L(icomp.ape),
     .when = W_CSA,
     .dims = {S_RATE_CSA, S_2IHD}},
    {.hf = "self_attn.compressor.indexer.kv_norm.weight",
     .up = "attn.indexer.compressor.norm.weight",
     .off = L(icomp.norm),
     .when = W_CSA,
     .dims = {S_IHD}},
    {.hf = "self_attn.compressor.indexer.q_b_proj.weight",
     .up = "attn.indexer.wq_b.weight",
     .off = L(idx_wq_b),
     .when = W_CSA,
     .dims = {S_IQOUT, S_RQ}},
    {.hf = "self_attn.compressor.indexer.scorer.weights_proj.weight",
     .up = "attn.indexer.weights_proj.weight",
     .off = L(idx_weights),
     .when = W_CSA,
     .dims = {S_IH, S_DIM}},
    {.hf = "mlp.gate.weight",
     .up = "ffn.gate.weight",
     .off = L(gate),
     .when = W_ALL,
     .dims = {S_E, S_DIM}},
    {.hf = "mlp.gate.e_score_correction_bias",
     .up = "ffn.gate.bias",
     .off = L(gate_bias),
     .when = W_MOE,
     .dims = {S_E}},
    {.hf = "mlp.gate.tid2eid",
     .up = "ffn.gate.tid2eid",
     .off = L(tid2eid),
     .when = W_HASH,
     .kind = K_INT,
     .dims = {S_VOCAB, S_K}},
    {.hf = "mlp.shared_experts.gate_proj.weight",
     .up = "ffn.shared_experts.w1.weight",
     .off = L(sh_w1),
     .when = W_ALL,
     .dims = {S_I, S_DIM}},
    {.hf = "mlp.shared_experts.up_proj.weight",
     .up = "ffn.shared_experts.w3.weight",
     .off = L(sh_w3),
     .when = W_ALL,
     .dims = {S_I, S_DIM}},
    {.hf = "mlp.shared_experts.down_proj.weight",
     .up = "ffn.shared_experts.w2.weight",
     .off = L(sh_w2),
     .when = W_ALL,
     .dims = {S_DIM, S_I}},
    {.hf = "mlp.shared_experts.gate_proj.bias",
     .up = "ffn.shared_experts.w1.bias",
     .off = L(sh_b1),
     .when = W_BIAS,
     .dims = {S_I}},
    {.hf = "mlp.shared_experts.up_proj.bias",
     .up = "ffn.shared_experts.w3.bias",
     .off = L(sh_b3),
     .when = W_BIAS,
     .dims = {S_I}},
    {.hf = "mlp.shared_experts.down_proj.bias",
     .up = "ffn.shared_experts.w2.bias",
     .off = L(sh_b2),
     .when = W_BIAS,
     .dims = {S_DIM}},
};
#undef L

#define M(f) offsetof(struct td_model, f)
static const struct wdesc model_table[] = {
    {.hf = "model.embed_tokens.weight",
     .up = "embed.weight",
     .off = M(embed),
     .when = W_ALL,
     .dims = {S_VOCAB, S_DIM}},
    {.hf = "model.norm.weight",
     .up = "norm.weight",
     .off = M(norm),
     .when = W_ALL,
     .dims = {S_DIM}},
    {.hf = "model.hc_head.hc_fn",
     .up = "hc_head_fn",
     .off = M(hc_head.fn),
     .when = W_ALL,
     .dims = {S_NC, S_NCD}},
    {.hf = "model.hc_head.hc_base",
     .up = "hc_head_base",
     .off = M(hc_head.base),
     .when = W_ALL,
     .dims = {S_NC}},
    {.hf = "model.hc_head.hc_scale",
     .up = "hc_head_scale",
     .off = M(hc_head.scale),
     .when = W_ALL,
     .dims = {S_1}},
    {.hf = "lm_head.weight",
     .up = "head.weight",
     .off = M(head),
     .when = W_ALL,
     .dims = {S_VOCAB, S_DIM}},
};
#undef M

static int64_t dim_of(const struct td_config *c, int s, enum td_attn_kind kind) {
    switch (s) {
    case S_1: return 1;
    case S_3: return 3;
    case S_DIM: return c->dim;
    case S_VOCAB: return c->vocab;
    case S_RQ: return c->q_lora_rank;
    case S_QOUT: return (int64_t)c->n_heads * c->head_dim;
    case S_HD: return c->head_dim;
    case S_CHD: return (kind == TD_ATTN_CSA ? 2 : 1) * (int64_t)c->head_dim;
    case S_OA_OUT: return (int64_t)c->o_groups * c->o_lora_rank;
    case S_OA_IN: return (int64_t)c->n_heads * c->head_dim / c->o_groups;
    case S_E: return c->n_experts;
    case S_K: return c->n_experts_tok;
    case S_I: return c->moe_inter;
    case S_H: return c->n_heads;
    case S_NC: return c->hc_mult;
    case S_HCM: return (int64_t)(2 + c->hc_mult) * c->hc_mult;
    case S_NCD: return (int64_t)c->hc_mult * c->dim;
    case S_RATE: return kind == TD_ATTN_CSA ? c->rate_csa : c->rate_hca;
    case S_RATE_CSA: return c->rate_csa;
    case S_IHD: return c->index_head_dim;
    case S_2IHD: return 2 * (int64_t)c->index_head_dim;
    case S_IQOUT: return (int64_t)c->index_n_heads * c->index_head_dim;
    case S_IH: return c->index_n_heads;
    default: return -1;
    }
}

// ---------------------------------------------------------------------------------------------
// lookup with bookkeeping of which stored tensors were used

struct loader {
    struct td_model *m;
    const struct st_set *st; /* where tensors are looked up */
    char *used;              /* [st.n_entries], NULL: no bookkeeping */
    char *err;
    size_t errlen;
    uint64_t dummy; /* nonzero: make every tensor instead (td_model_load_dummy's seed) */
};

static int fail(struct loader *ld, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ld->err, ld->errlen, fmt, ap);
    va_end(ap);
    return -1;
}

static void shape_str(char *buf, size_t n, const int64_t *shape, int ndim) {
    size_t k = 0;
    k += snprintf(buf + k, n - k, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

static void *own(struct td_model *m, size_t bytes) {
    void **no = realloc(m->owned, (size_t)(m->n_owned + 1) * sizeof *no);
    if (!no) return NULL;
    m->owned = no;
    void *p = calloc(1, bytes ? bytes : 1);
    if (p) m->owned[m->n_owned++] = p;
    return p;
}

static uint64_t name_hash(const char *s) { // FNV-1a
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* The dtype a released checkpoint stores the matrix of upstream name `up` in (released_formats.md
 * 1.3, 1.8) under c's quantization keys: Q8 for the FP8 projections, Q4 (or Q8 / NONE, by
 * expert_dtype) for the routed experts, NONE for what stays BF16 / F32 (the embedding, the head,
 * norms, the router, the compressors and the indexer's other matrices). */
static enum td_dtype released_quant(const struct td_config *c, const char *up) {
    static const char *fp8[] = {".attn.wq_a.weight",
                                ".attn.wq_b.weight",
                                ".attn.wkv.weight",
                                ".attn.wo_a.weight",
                                ".attn.wo_b.weight",
                                ".indexer.wq_b.weight",
                                ".shared_experts.w1.weight",
                                ".shared_experts.w2.weight",
                                ".shared_experts.w3.weight",
                                ".e_proj.weight",
                                ".h_proj.weight",
                                ".main_proj.weight"};
    size_t n = strlen(up);
    if (strstr(up, ".ffn.experts."))
        return c->expert_fp4 ? TD_DTYPE_Q4 : c->expert_fp8 ? TD_DTYPE_Q8 : TD_DTYPE_NONE;
    for (size_t i = 0; c->quant_fp8 && i < sizeof fp8 / sizeof *fp8; i++) {
        size_t k = strlen(fp8[i]);
        if (n >= k && !strcmp(up + n - k, fp8[i])) return TD_DTYPE_Q8;
    }
    return TD_DTYPE_NONE;
}

/* a dummy model's tensor `name` of the given shape (see td_model_load_dummy for the values) */
static int make_dummy(struct loader *ld, struct td_tensor *dst, const char *name, int kind,
                      const int64_t *shape, int ndim) {
    struct td_tensor t = {.data = NULL, .dtype = TD_DTYPE_NONE, .ndim = ndim, .shape = {0}};
    memcpy(t.shape, shape, (size_t)ndim * sizeof *shape);
    int64_t n = td_tensor_numel(&t); // the shape is config.json's dims: it can pass 64 bits
    if (n > TD_MAX_NUMEL) {
        char s[96];
        shape_str(s, sizeof s, shape, ndim);
        return fail(ld, "dummy weights: tensor %s %s is too large (over 2^60 elements)", name, s);
    }
    if (kind == K_INT) { // tid2eid [vocab, k]: token v's j-th expert (v + j) mod E, all distinct
        int32_t *v = own(ld->m, (size_t)n * sizeof *v);
        if (!v) return fail(ld, "out of memory making %s", name);
        for (int64_t i = 0; i < n; i++)
            v[i] = (int32_t)((i / shape[1] + i % shape[1]) % ld->m->cfg.n_experts);
        t.data = v;
        t.dtype = TD_DTYPE_I32;
    } else {
        struct td_dummy *g = own(ld->m, sizeof *g);
        if (!g) return fail(ld, "out of memory making %s", name);
        const char *last = strrchr(name, '.');
        last = last ? last + 1 : name;
        g->seed = ld->dummy ^ name_hash(name);
        if (strstr(name, "norm") || !strcmp(last, "scale") || !strcmp(last, "hc_scale")) {
            g->lo = g->hi = 1.0f; // RMSNorm weights, HC scales
        } else if (ndim < 2) {
            g->lo = g->hi = 0.0f; // biases, sinks, HC bases
        } else {
            float a = sqrtf(3.0f / (float)shape[ndim - 1]); // std 1/sqrt(fan-in)
            g->lo = -a;
            g->hi = a;
            enum td_dtype q = ndim == 2 ? released_quant(&ld->m->cfg, name) : TD_DTYPE_NONE;
            if (q != TD_DTYPE_NONE && shape[1] % (q == TD_DTYPE_Q4 ? 32 : 1))
                return fail(ld,
                            "dummy weights: FP4 tensor %s needs an input width that is a "
                            "multiple of 32, the config gives %lld",
                            name, (long long)shape[1]);
            g->quant = q;
            if (q != TD_DTYPE_NONE) g->qscale = fill_quant_scale(q, 1.0f / sqrtf((float)shape[1]));
        }
        t.data = g;
    }
    *dst = t;
    return 0;
}

/* A released checkpoint's quantized weight (released_formats.md 1.5-1.7): FP8 (F8_E4M3 [out, in])
 * or FP4 (I8 [out, in / 2], two e2m1 codes a byte) with its F8_E8M0 scale in the sibling
 * `<module>.scale` (exactly that suffix: `hc_*_scale` are learned parameters). Both are checked
 * by name, dtype and shape, and a NaN scale byte is refused. The view stays in the mapped file
 * (F8_E4M3 or F4_E2M1 with .scale): placing the model decodes it exactly to fp32 for the CPU,
 * whose forward then runs unchanged, or packs it for a device's kernels (td_model_upload). */
static int bind_quantized(struct loader *ld, struct td_tensor *dst, const struct st_entry *e,
                          const int64_t *shape, int ndim, const char *want) {
    const struct td_tensor *t = &e->t;
    int fp4 = t->dtype == TD_DTYPE_I8;
    char got[96], sname[512];
    shape_str(got, sizeof got, t->shape, t->ndim);
    if (ndim != 2 || t->ndim != 2)
        return fail(ld, "tensor %s: a quantized %s %s where a float %s is expected", e->name,
                    td_dtype_name(t->dtype), got, want);
    int64_t out = shape[0], in = shape[1];
    if (fp4 && in % 32)
        return fail(ld,
                    "tensor %s: FP4 needs an input width that is a multiple of 32, the model "
                    "has %lld",
                    e->name, (long long)in);
    if (t->shape[0] != out || t->shape[1] != (fp4 ? in / 2 : in))
        return fail(ld, "tensor %s: expected %s [%lld, %lld] for a weight of %s, got %s", e->name,
                    td_dtype_name(t->dtype), (long long)out, (long long)(fp4 ? in / 2 : in), want,
                    got);
    size_t n = strlen(e->name);
    if (n < 7 || strcmp(e->name + n - 7, ".weight") || n >= sizeof sname)
        return fail(ld, "tensor %s: a quantized weight must be named <module>.weight", e->name);
    snprintf(sname, sizeof sname, "%.*s.scale", (int)(n - 7), e->name);
    const struct st_entry *se = st_set_find(ld->st, sname);
    if (!se)
        return fail(ld, "tensor %s is %s but its scale %s is missing", e->name,
                    td_dtype_name(t->dtype), sname);
    int64_t s0 = fp4 ? out : (out + 127) / 128, s1 = fp4 ? in / 32 : (in + 127) / 128;
    const struct td_tensor *st = &se->t;
    if (st->dtype != TD_DTYPE_F8_E8M0 || st->ndim != 2 || st->shape[0] != s0 ||
        st->shape[1] != s1) {
        shape_str(got, sizeof got, st->shape, st->ndim);
        return fail(ld, "tensor %s: expected F8_E8M0 [%lld, %lld] (the %s scale of %s), got %s %s",
                    sname, (long long)s0, (long long)s1, fp4 ? "per-32" : "128x128", e->name,
                    td_dtype_name(st->dtype), got);
    }
    long nan = td_e8m0_find_nan(st->data, (size_t)(s0 * s1));
    if (nan >= 0)
        return fail(ld, "tensor %s: scale byte %ld is 255 (NaN): the checkpoint is corrupt", sname,
                    nan);
    if (out > INT32_MAX || in > INT32_MAX)
        return fail(ld, "tensor %s: %lld x %lld is too large for the quantized kernels", e->name,
                    (long long)out, (long long)in);
    if (ld->used) ld->used[e - ld->st->entries] = ld->used[se - ld->st->entries] = 1;
    *dst = (struct td_tensor){.data = t->data,
                              .dtype = fp4 ? TD_DTYPE_F4_E2M1 : TD_DTYPE_F8_E4M3,
                              .scale = st->data,
                              .ndim = 2,
                              .shape = {out, in}};
    ld->m->quantized++;
    return 0;
}

/* find `name` (or `alt`), check kind and shape, store the view at dst; -1 with message */
static int bind(struct loader *ld, struct td_tensor *dst, const char *name, const char *alt,
                int kind, const int64_t *shape, int ndim) {
    if (ld->dummy) return make_dummy(ld, dst, alt ? alt : name, kind, shape, ndim);
    const struct st_set *st = ld->st;
    const struct st_entry *e = st_set_find(st, name);
    if (!e && alt) e = st_set_find(st, alt);
    char want[96], got[96];
    shape_str(want, sizeof want, shape, ndim);
    const char *want_dtype = kind == K_INT ? "I32/I64" : "F32/BF16/F16";
    if (!e)
        return fail(ld, "missing tensor %s (upstream name %s): expected %s %s", name,
                    alt ? alt : "-", want_dtype, want);
    const struct td_tensor *t = &e->t;
    if (kind == K_FLOAT && (t->dtype == TD_DTYPE_F8_E4M3 || t->dtype == TD_DTYPE_I8))
        return bind_quantized(ld, dst, e, shape, ndim, want);
    int dtype_ok = kind == K_INT ? (t->dtype == TD_DTYPE_I32 || t->dtype == TD_DTYPE_I64)
                                 : (t->dtype == TD_DTYPE_F32 || t->dtype == TD_DTYPE_BF16 ||
                                    t->dtype == TD_DTYPE_F16);
    int shape_ok = t->ndim == ndim;
    for (int i = 0; shape_ok && i < ndim; i++)
        shape_ok = t->shape[i] == shape[i];
    if (!dtype_ok || !shape_ok) {
        shape_str(got, sizeof got, t->shape, t->ndim);
        return fail(ld, "tensor %s: expected %s %s, got %s %s", e->name, want_dtype, want,
                    td_dtype_name(t->dtype), got);
    }
    if (ld->used) ld->used[e - st->entries] = 1;
    *dst = *t;
    return 0;
}

static int bind_desc(struct loader *ld, void *base, const struct wdesc *d, const char *hf_prefix,
                     const char *up_prefix, enum td_attn_kind kind) {
    char hf[256], up[256];
    int64_t shape[3];
    int ndim = 0;
    while (ndim < 3 && d->dims[ndim]) {
        shape[ndim] = dim_of(&ld->m->cfg, d->dims[ndim], kind);
        ndim++;
    }
    snprintf(hf, sizeof hf, "%s%s", hf_prefix, d->hf);
    snprintf(up, sizeof up, "%s%s", up_prefix, d->up);
    return bind(ld, (struct td_tensor *)((char *)base + d->off), hf, up, d->kind, shape, ndim);
}

static int layer_has(const struct td_config *c, int i, int when) {
    switch (when) {
    case W_COMP: return c->attn[i] != TD_ATTN_SLIDING;
    case W_CSA: return c->attn[i] == TD_ATTN_CSA;
    case W_MOE: return c->mlp[i] == TD_MLP_MOE;
    case W_HASH: return c->mlp[i] == TD_MLP_HASH;
    case W_BIAS: return c->mlp_bias;
    default: return 1;
    }
}

/* views of one expert matrix at row offset `row0` of a fused [E, rows, cols] tensor */
static struct td_tensor expert_view(const struct td_tensor *fused, int e, int64_t row0,
                                    int64_t rows, int64_t cols) {
    struct td_tensor v = *fused;
    size_t esz = td_dtype_size(fused->dtype);
    v.data = (const char *)fused->data + ((size_t)e * fused->shape[1] + row0) * cols * esz;
    v.ndim = 2;
    v.shape[0] = rows;
    v.shape[1] = cols;
    return v;
}

/* hf / up: the layer's name prefixes in the two layouts ("model.layers.3." / "layers.3.") */
static int load_experts(struct loader *ld, int i, const char *hf, const char *up) {
    const struct td_config *c = &ld->m->cfg;
    struct td_layer *l = &ld->m->layers[i];
    int E = c->n_experts;
    int64_t I = c->moe_inter, D = c->dim;
    char a[256], b[256];
    snprintf(a, sizeof a, "%smlp.experts.gate_up_proj", hf);
    snprintf(b, sizeof b, "%smlp.experts.down_proj", hf);
    if (st_set_find(ld->st, a) || st_set_find(ld->st, b)) { // HF fused layout
        struct td_tensor gu, dn;
        int64_t s_gu[3] = {E, 2 * I, D}, s_dn[3] = {E, D, I};
        if (bind(ld, &gu, a, NULL, K_FLOAT, s_gu, 3) || bind(ld, &dn, b, NULL, K_FLOAT, s_dn, 3))
            return -1;
        for (int e = 0; e < E; e++) {
            l->w1[e] = expert_view(&gu, e, 0, I, D);
            l->w3[e] = expert_view(&gu, e, I, I, D);
            l->w2[e] = expert_view(&dn, e, 0, D, I);
        }
        return 0;
    }
    for (int e = 0; e < E; e++) { // upstream per-expert layout
        int64_t s_in[2] = {I, D}, s_out[2] = {D, I};
        const char *w[3] = {"w1", "w3", "w2"};
        struct td_tensor *dst[3] = {&l->w1[e], &l->w3[e], &l->w2[e]};
        for (int j = 0; j < 3; j++) {
            char hfn[256];
            snprintf(a, sizeof a, "%sffn.experts.%d.%s.weight", up, e, w[j]);
            snprintf(hfn, sizeof hfn, "%smlp.experts.gate_up_proj", hf);
            if (bind(ld, dst[j], a, NULL, K_FLOAT, j == 2 ? s_out : s_in, 2)) {
                if (!st_set_find(ld->st, a))
                    fail(ld,
                         "missing tensor %s (HF layout: %s): expected F32/BF16/F16 [%lld, %lld]", a,
                         hfn, (long long)(j == 2 ? D : I), (long long)(j == 2 ? I : D));
                return -1;
            }
        }
    }
    return 0;
}

static int check_tid2eid(struct loader *ld, int i) {
    const struct td_tensor *t = &ld->m->layers[i].tid2eid;
    int64_t n = td_tensor_numel(t);
    for (int64_t j = 0; j < n; j++) {
        int64_t v = td_tensor_geti(t, j);
        if (v < 0 || v >= ld->m->cfg.n_experts)
            return fail(ld, "layer %d tid2eid[%lld][%lld] = %lld is not an expert id in [0, %d)", i,
                        (long long)(j / t->shape[1]), (long long)(j % t->shape[1]), (long long)v,
                        ld->m->cfg.n_experts);
    }
    return 0;
}

/* the layer's shared expert as routed expert E, the last entry of the expert pointer arrays
 * ptrs = w1 [E + 1] | w3 [E + 1] | w2 [E + 1], when it can run so (ex_shared): present, without
 * biases, in the routed experts' dtype (l->ex_dtype set) */
static void share_expert(struct td_layer *l, const void **ptrs, size_t E) {
    enum td_dtype t = l->ex_dtype;
    l->ex_shared = l->sh_w1.data && l->sh_w3.data && l->sh_w2.data && !l->sh_b1.data &&
                   !l->sh_b3.data && !l->sh_b2.data && l->sh_w1.dtype == t && l->sh_w3.dtype == t &&
                   l->sh_w2.dtype == t;
    if (!l->ex_shared) return;
    ptrs[E] = l->sh_w1.data;
    ptrs[2 * E + 1] = l->sh_w3.data;
    ptrs[3 * E + 2] = l->sh_w2.data;
}

/* A vector the CPU kernels read as raw fp32 (the attention's sinks, kernels/attention.h) as an
 * aligned fp32 copy the model owns when it is stored otherwise: BF16 or F16 (an HF export in
 * bf16 has BF16 sinks), or F32 at an address that is not 4-aligned (a header of odd length
 * leaves every tensor there). An aligned F32 view stays a view; a dummy's generator is made
 * as F32 where it is placed. */
static int own_f32(struct loader *ld, struct td_tensor *t, const char *what, int layer) {
    if (!t->data || t->dtype == TD_DTYPE_NONE) return 0;
    if (t->dtype == TD_DTYPE_F32 && (uintptr_t)t->data % _Alignof(float) == 0) return 0;
    int64_t n = td_tensor_numel(t);
    float *v = own(ld->m, (size_t)n * sizeof *v);
    if (!v) return fail(ld, "out of memory converting layer %d's %s to fp32", layer, what);
    td_tensor_read_f32(t, 0, n, v);
    t->data = v;
    t->dtype = TD_DTYPE_F32;
    return 0;
}

/* layer i's tensors (names after the prefixes hf / up) and its routed experts; m->layers,
 * m->expert_views and m->expert_ptrs hold room for it */
static int bind_layer(struct loader *ld, int i, const char *hf, const char *up) {
    struct td_model *m = ld->m;
    const struct td_config *c = &m->cfg;
    struct td_layer *l = &m->layers[i];
    for (size_t j = 0; j < sizeof layer_table / sizeof *layer_table; j++) {
        const struct wdesc *d = &layer_table[j];
        if (!layer_has(c, i, d->when)) continue;
        if (bind_desc(ld, l, d, hf, up, c->attn[i])) return -1;
    }
    if (own_f32(ld, &l->sinks, "sinks", i)) return -1;
    l->w1 = m->expert_views + (size_t)i * c->n_experts * 3;
    l->w3 = l->w1 + c->n_experts;
    l->w2 = l->w3 + c->n_experts;
    if (load_experts(ld, i, hf, up)) return -1;
    int E1 = c->n_experts + 1;
    const void **xp = m->expert_ptrs + (size_t)i * 3 * E1;
    for (int e = 0; e < c->n_experts; e++) {
        xp[e] = l->w1[e].data;
        xp[E1 + e] = l->w3[e].data;
        xp[2 * E1 + e] = l->w2[e].data;
        if (l->w1[e].dtype != l->w1[0].dtype || l->w3[e].dtype != l->w1[0].dtype ||
            l->w2[e].dtype != l->w1[0].dtype)
            return fail(ld, "layer %d: routed experts mix dtypes (expert %d)", i, e);
    }
    l->ex_w1 = xp;
    l->ex_w3 = xp + E1;
    l->ex_w2 = xp + 2 * E1;
    l->ex_dtype = l->w1[0].dtype;
    share_expert(l, xp, (size_t)c->n_experts);
    return 0;
}

static int alloc_layers(struct loader *ld) {
    struct td_model *m = ld->m;
    const struct td_config *c = &m->cfg;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    m->expert_views = calloc((size_t)c->n_layers * c->n_experts * 3, sizeof *m->expert_views);
    m->expert_ptrs = calloc((size_t)c->n_layers * (c->n_experts + 1) * 3, sizeof *m->expert_ptrs);
    return m->layers && m->expert_views && m->expert_ptrs ? 0 : fail(ld, "out of memory");
}

static int check_unused(struct loader *ld, const char *dir, const char *keep);

static int load_all(struct loader *ld, const char *dir) {
    struct td_model *m = ld->m;
    const struct td_config *c = &m->cfg;
    char path[TD_PATH_MAX];
    if (td_path_join(path, sizeof path, dir, "config.json", ld->err, ld->errlen) ||
        td_config_load(&m->cfg, path, ld->err, ld->errlen))
        return -1;
    // limits of the reference kernels' fixed-size scratch
    if (c->hc_mult > 16 || c->n_experts > 1024 || c->n_experts_tok > 64 || c->n_heads > 1024 ||
        c->rope_dim > 512 || c->rate_csa > 256 || c->rate_hca > 512)
        return fail(ld,
                    "%s: unsupported size (limits: hc_mult 16, n_routed_experts 1024, "
                    "num_experts_per_tok 64, heads 1024, rope dims 512, csa rate 256, hca "
                    "rate 512)",
                    path);
    if (!ld->dummy && st_set_open(&m->st, dir, ld->err, ld->errlen)) return -1;
    ld->used = calloc((size_t)m->st.n_entries + 1, 1);
    if (!ld->used || alloc_layers(ld)) return fail(ld, "out of memory loading %s", dir);

    for (size_t j = 0; j < sizeof model_table / sizeof *model_table; j++) {
        const struct wdesc *d = &model_table[j];
        if (d->off == offsetof(struct td_model, head) && c->tie_word_embeddings) continue;
        if (bind_desc(ld, m, d, "", "", TD_ATTN_SLIDING)) return -1;
    }
    if (c->tie_word_embeddings) m->head = m->embed;
    for (int i = 0; i < c->n_layers; i++) {
        char hf[64], up[64];
        snprintf(hf, sizeof hf, "model.layers.%d.", i);
        snprintf(up, sizeof up, "layers.%d.", i);
        if (bind_layer(ld, i, hf, up)) return -1;
        if (c->mlp[i] == TD_MLP_HASH && check_tid2eid(ld, i)) return -1;
    }
    return check_unused(ld, dir, "mtp.");
}

/* every stored tensor was bound, except those starting with `keep` (NULL: none) */
static int check_unused(struct loader *ld, const char *dir, const char *keep) {
    for (int j = 0; j < ld->m->st.n_entries; j++) {
        const char *name = ld->m->st.entries[j].name;
        if (!ld->used[j] && !(keep && !strncmp(name, keep, strlen(keep))))
            return fail(ld,
                        "unexpected tensor %s in %s (not part of a %d-layer model with this "
                        "config)",
                        name, dir, ld->m->cfg.n_layers);
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------
// drafters: the MTP layer and a DSpark head, in the target's files or (DSpark) a folder of their
// own

/* the stage of a drafter tensor's name: s for "mtp.<s>.", else -1 */
static int stage_of(const char *name) {
    if (strncmp(name, "mtp.", 4)) return -1;
    int s = 0, k = 0;
    for (const char *p = name + 4; *p >= '0' && *p <= '9'; p++, k++) {
        if (k == 6) return -1;
        s = s * 10 + (*p - '0');
    }
    return k && name[4 + k] == '.' ? s : -1;
}

/* every tensor of ld->st whose name starts with `only` was bound, except those of stages
 * 1 .. keep_hi - 1 (further MTP layers, which no drafter binds yet); where: the files, what:
 * the drafter, for the message */
static int check_drafter_unused(struct loader *ld, const char *only, const char *where, int keep_hi,
                                const char *what) {
    for (int j = 0; j < ld->st->n_entries; j++) {
        const struct st_entry *e = &ld->st->entries[j];
        int s = stage_of(e->name);
        if (ld->used[j] || strncmp(e->name, only, strlen(only)) || (s >= 1 && s < keep_hi))
            continue;
        char got[96];
        shape_str(got, sizeof got, e->t.shape, e->t.ndim);
        return fail(ld, "unexpected tensor %s (%s %s) in %s: not part of %s", e->name,
                    td_dtype_name(e->t.dtype), got, where, what);
    }
    return 0;
}

/* the DSpark stages ld->st holds: S when its mtp.<s>.* tensors are those of s = 0 .. S - 1, each
 * with some (0: none); -1 with a message when one is skipped or past the limit */
static int count_stages(struct loader *ld, const char *where) {
    char seen[TD_DSPARK_MAX_STAGES] = {0};
    int hi = -1;
    for (int j = 0; j < ld->st->n_entries; j++) {
        const char *name = ld->st->entries[j].name;
        int s = stage_of(name);
        if (s < 0) continue;
        if (s >= TD_DSPARK_MAX_STAGES)
            return fail(ld,
                        "tensor %s in %s: a DSpark head has at most %d stages (mtp.0 .. mtp.%d)",
                        name, where, TD_DSPARK_MAX_STAGES, TD_DSPARK_MAX_STAGES - 1);
        seen[s] = 1;
        hi = s > hi ? s : hi;
    }
    for (int s = 0; s < hi; s++)
        if (!seen[s])
            return fail(ld,
                        "no mtp.%d.* in %s, but mtp.%d.*: a DSpark head's stages are mtp.0 .. "
                        "mtp.%d",
                        s, where, hi, hi);
    return hi + 1;
}

enum td_own_drafter td_model_own_drafter(const struct td_model *m) {
    if (m->dummy_seed) // nothing stored: what its config.json names is made like the rest
        return m->cfg.dspark.present && m->cfg.dspark.n_stages      ? TD_OWN_DSPARK
               : m->cfg.n_mtp_layers >= 1 && !m->cfg.dspark.present ? TD_OWN_MTP
                                                                    : TD_OWN_NONE;
    if (m->cfg.dspark.present || st_set_find(&m->st, "mtp.0.main_proj.weight"))
        return TD_OWN_DSPARK;
    if (m->cfg.n_mtp_layers >= 1 && st_set_find(&m->st, "mtp.0.e_proj.weight")) return TD_OWN_MTP;
    return TD_OWN_NONE;
}

int td_model_load_mtp(const struct td_model *t, struct td_model *m, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    m->cfg = t->cfg;
    struct td_config *c = &m->cfg;
    c->n_layers = 1;
    c->attn[0] = t->cfg.mtp_attn[0];
    c->mlp[0] = TD_MLP_MOE;
    struct loader ld = {.m = m, .st = &t->st, .err = err, .errlen = errlen, .dummy = t->dummy_seed};
    m->dummy_seed = t->dummy_seed;
    if (td_model_own_drafter(t) == TD_OWN_DSPARK)
        return fail(&ld,
                    "this checkpoint's mtp.* tensors are a DSpark head (%s), not an MTP "
                    "layer: draft with dspark",
                    t->cfg.dspark.present ? "config.json has the dspark_* keys"
                                          : "mtp.0.main_proj.weight");
    if (t->cfg.n_mtp_layers < 1 || (!ld.dummy && !st_set_find(&t->st, "mtp.0.e_proj.weight")))
        return fail(&ld, "this checkpoint has no MTP layer (no mtp.0.* tensors)");
    if (c->attn[0] != TD_ATTN_SLIDING)
        return fail(&ld,
                    "MTP layer with %s attention: only sliding-window MTP layers are supported",
                    td_attn_kind_name(c->attn[0]));
    int rc = -1;
    if (!(ld.used = calloc((size_t)t->st.n_entries + 1, 1)) || alloc_layers(&ld) ||
        bind_layer(&ld, 0, "mtp.0.", "mtp.0."))
        goto out;
    int64_t vd[1] = {c->dim}, md[2] = {c->dim, c->dim},
            hcf[2] = {c->hc_mult, (int64_t)c->hc_mult * c->dim};
    int64_t hcb[1] = {c->hc_mult}, one[1] = {1};
    if (bind(&ld, &m->norm, "mtp.0.norm.weight", NULL, K_FLOAT, vd, 1) ||
        bind(&ld, &m->hc_head.fn, "mtp.0.hc_head_fn", NULL, K_FLOAT, hcf, 2) ||
        bind(&ld, &m->hc_head.base, "mtp.0.hc_head_base", NULL, K_FLOAT, hcb, 1) ||
        bind(&ld, &m->hc_head.scale, "mtp.0.hc_head_scale", NULL, K_FLOAT, one, 1) ||
        bind(&ld, &m->mtp_enorm, "mtp.0.enorm.weight", NULL, K_FLOAT, vd, 1) ||
        bind(&ld, &m->mtp_hnorm, "mtp.0.hnorm.weight", NULL, K_FLOAT, vd, 1) ||
        bind(&ld, &m->mtp_eproj, "mtp.0.e_proj.weight", NULL, K_FLOAT, md, 2) ||
        bind(&ld, &m->mtp_hproj, "mtp.0.h_proj.weight", NULL, K_FLOAT, md, 2))
        goto out;
    rc = ld.dummy ? 0
                  : check_drafter_unused(&ld, "mtp.", "the checkpoint's files", t->cfg.n_mtp_layers,
                                         "its MTP layer (mtp.0)");
out:
    free(ld.used);
    if (rc) td_model_free(m); // its st is empty: the views are into target's mapping
    return rc;
}

int td_model_load_dspark(const struct td_model *t, const char *dir, int n_stages, int n_capture,
                         int rank, struct td_model *m, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    m->cfg = t->cfg;
    struct td_config *c = &m->cfg;
    const char *where = dir ? dir : "the checkpoint's own files";
    // a dummy target's head (its own, or a folder's config.json alone): its stages made like
    // the rest, as many as dspark_num_stages says
    uint64_t dummy = t->dummy_seed;
    struct loader ld = {
        .m = m, .st = dir ? &m->st : &t->st, .err = err, .errlen = errlen, .dummy = dummy};
    m->dummy_seed = dummy;
    if (n_stages < 0 || n_stages > TD_DSPARK_MAX_STAGES || n_capture < 1 || rank < 1)
        return fail(&ld,
                    "%s: %d stages, %d captured layers, Markov rank %d: stages must be in [0, %d] "
                    "(0: as the files hold), the others >= 1",
                    where, n_stages, n_capture, rank, TD_DSPARK_MAX_STAGES);
    int rc = -1, held;
    if (dir && !dummy && st_set_open(&m->st, dir, err, errlen)) goto out;
    if (dummy && !n_stages) {
        fail(&ld,
             "dummy weights: %s: the dspark_* keys need dspark_num_stages (no files to count "
             "the stages in)",
             dir ? dir : "config.json");
        goto out;
    }
    if ((held = dummy ? n_stages : count_stages(&ld, where)) < 0) goto out;
    if (!held) {
        fail(&ld, "no DSpark stages (mtp.<s>.* tensors) in %s%s", where,
             dir ? "" : ", though config.json has the dspark_* keys");
        goto out;
    }
    if (n_stages && n_stages != held) {
        fail(&ld, "dspark_num_stages is %d, but there %s %d (mtp.0 .. mtp.%d) in %s", n_stages,
             held > 1 ? "are" : "is", held, held - 1, where);
        goto out;
    }
    n_stages = c->n_layers = held;
    for (int i = 0; i < n_stages; i++) { // sliding-window attention, score-routed MoE
        c->attn[i] = TD_ATTN_SLIDING;
        c->mlp[i] = TD_MLP_MOE;
        // a release's compress_ratios lists its stages after the target's layers
        if (!dir && i < 4 && t->cfg.mtp_attn[i] != TD_ATTN_SLIDING) {
            fail(&ld,
                 "DSpark stage mtp.%d: compress_ratios[%d] says %s attention; the stages are "
                 "sliding-window (0)",
                 i, t->cfg.n_layers + i, td_attn_kind_name(t->cfg.mtp_attn[i]));
            goto out;
        }
    }
    if (!(ld.used = calloc((size_t)ld.st->n_entries + 1, 1)) || alloc_layers(&ld)) goto out;
    for (int i = 0; i < n_stages; i++) {
        char pre[32];
        snprintf(pre, sizeof pre, "mtp.%d.", i);
        if (bind_layer(&ld, i, pre, pre)) goto out;
    }
    char last[32], name[96];
    snprintf(last, sizeof last, "mtp.%d.", n_stages - 1);
    int64_t D = c->dim, V = c->vocab, nc = c->hc_mult;
    struct {
        struct td_tensor *dst;
        const char *pre, *name;
        int64_t shape[2];
        int ndim;
    } want[] = {
        {.dst = &m->dspark.main_proj,
         .pre = "mtp.0.",
         .name = "main_proj.weight",
         .shape = {D, n_capture * D},
         .ndim = 2},
        {.dst = &m->dspark.main_norm,
         .pre = "mtp.0.",
         .name = "main_norm.weight",
         .shape = {D},
         .ndim = 1},
        {.dst = &m->hc_head.fn,
         .pre = last,
         .name = "hc_head_fn",
         .shape = {nc, nc * D},
         .ndim = 2},
        {.dst = &m->hc_head.base, .pre = last, .name = "hc_head_base", .shape = {nc}, .ndim = 1},
        {.dst = &m->hc_head.scale, .pre = last, .name = "hc_head_scale", .shape = {1}, .ndim = 1},
        {.dst = &m->norm, .pre = last, .name = "norm.weight", .shape = {D}, .ndim = 1},
        {.dst = &m->dspark.markov_w1,
         .pre = last,
         .name = "markov_head.markov_w1.weight",
         .shape = {V, rank},
         .ndim = 2},
        {.dst = &m->dspark.markov_w2,
         .pre = last,
         .name = "markov_head.markov_w2.weight",
         .shape = {V, rank},
         .ndim = 2},
        {.dst = &m->dspark.confidence,
         .pre = last,
         .name = "confidence_head.proj.weight",
         .shape = {1, D + rank},
         .ndim = 2},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        snprintf(name, sizeof name, "%s%s", want[i].pre, want[i].name);
        if (bind(&ld, want[i].dst, name, NULL, K_FLOAT, want[i].shape, want[i].ndim)) goto out;
    }
    char what[64];
    snprintf(what, sizeof what, "a %d-stage DSpark head", n_stages);
    rc = dummy ? 0 : check_drafter_unused(&ld, dir ? "" : "mtp.", where, 0, what); // a folder: all
out:
    free(ld.used);
    if (rc) td_model_free(m);
    return rc;
}

static int load(struct td_model *m, const char *dir, uint64_t dummy, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    struct loader ld = {.m = m, .st = &m->st, .err = err, .errlen = errlen, .dummy = dummy};
    m->dummy_seed = dummy;
    int rc = load_all(&ld, dir);
    free(ld.used);
    if (rc) td_model_free(m);
    return rc;
}

int td_model_load(struct td_model *m, const char *dir, char *err, size_t errlen) {
    return load(m, dir, 0, err, errlen);
}

int td_model_load_dummy(struct td_model *m, const char *dir, uint64_t seed, char *err,
                        size_t errlen) {
    if (!seed) return td_errf(err, errlen, "dummy weights: the seed must be nonzero");
    return load(m, dir, seed, err, errlen);
}

void td_model_free(struct td_model *m) {
    if (m->backend)
        for (int i = 0; i < m->n_dev_bufs; i++)
            m->backend->release(m->dev_bufs[i]);
    free(m->dev_bufs);
    st_set_close(&m->st);
    free(m->layers);
    free(m->expert_views);
    free(m->expert_ptrs);
    for (int i = 0; i < m->n_owned; i++)
        free(m->owned[i]);
    free(m->owned);
    memset(m, 0, sizeof *m);
}

// ---------------------------------------------------------------------------------------------
// device mirror

/* a placement's progress line on a terminal (stderr): bytes, rate, time left */
struct progress {
    int on;
    size_t total, done;
    double t0, last;
    const char *where;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void progress_add(struct progress *pg, size_t bytes) {
    if (!pg || !pg->on) return;
    pg->done += bytes;
    double t = now_s(), el = t - pg->t0;
    if (t - pg->last < 0.2 && pg->done < pg->total) return;
    pg->last = t;
    double rate = el > 0 ? pg->done / el : 0;
    fprintf(stderr, "\rplacing the weights on %s: %.1f / %.1f GB, %.1f GB/s, %.0f s left   ",
            pg->where, pg->done / 1e9, pg->total / 1e9, rate / 1e9,
            rate > 0 ? (pg->total - pg->done) / rate : 0.0);
    if (pg->done >= pg->total) fprintf(stderr, "\n");
}

struct uploader {
    struct td_model *dev;
    const struct td_backend *b;
    int cap;
    char *err;
    size_t errlen;
    struct progress *pg;
    char *arena;        /* a device placement's one buffer (NULL: a buffer a tensor) */
    size_t arena_bytes; /* its size: the dry run's count */
};

/* every placed tensor starts on this boundary, in an arena and in the dry run's count alike */
#define PLACE_ALIGN ((size_t)256)

/* the next tensor's bytes: from the arena (one allocation for the whole placement: a device
 * allocator's per-buffer rounding, 2 MiB pages on CUDA, made V4-Flash's 3 x 4.46 MB FP4 experts
 * take 40% more than they hold), else a buffer of its own */
static void *dev_alloc(struct uploader *u, size_t bytes) {
    size_t step = (bytes + PLACE_ALIGN - 1) / PLACE_ALIGN * PLACE_ALIGN;
    void *p = NULL;
    if (u->arena) {
        if (u->dev->placed_bytes + step <= u->arena_bytes) p = u->arena + u->dev->placed_bytes;
    } else {
        if (u->dev->n_dev_bufs == u->cap) {
            u->cap = u->cap ? 2 * u->cap : 256;
            void **nb = realloc(u->dev->dev_bufs, (size_t)u->cap * sizeof *nb);
            if (!nb) return NULL;
            u->dev->dev_bufs = nb;
        }
        if ((p = u->b->alloc(bytes))) u->dev->dev_bufs[u->dev->n_dev_bufs++] = p;
    }
    if (p) u->dev->placed_bytes += step;
    progress_add(u->pg, bytes); // (the previous buffer's bytes are there: copies are synchronous)
    return p;
}

static uint16_t f32_to_bf16(float f) { // round to nearest even
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static void *count_alloc(size_t bytes);

/* a dry run (placed_size): allocations are counted, and nothing is read, decoded or written */
static int dry_run(const struct uploader *u) {
    return u->b->alloc == count_alloc;
}

static int upload_oom(struct uploader *u, size_t bytes) {
    snprintf(u->err, u->errlen, "upload: out of %s memory for a %zu-byte tensor (%zu bytes free)",
             u->b->name, bytes, u->b->free_bytes ? u->b->free_bytes() : (size_t)0);
    return -1;
}

static int is_quantized(enum td_dtype t) {
    return t == TD_DTYPE_F8_E4M3 || t == TD_DTYPE_F4_E2M1;
}

/* a packed Q8 / Q4 matrix made on the host (a dummy's, for the CPU) decoded to F32 into t */
static int decode_packed(struct uploader *u, struct td_tensor *t, enum td_dtype q,
                         const void *packed) {
    int64_t rows = t->shape[0], in = t->shape[1];
    size_t bytes = (size_t)(rows * in) * sizeof(float);
    void *dst = dev_alloc(u, bytes);
    if (!dst) return upload_oom(u, bytes);
    if (!dry_run(u)) dequant_packed_ref(dst, packed, q, (int)rows, (int)in);
    t->data = dst;
    t->dtype = TD_DTYPE_F32;
    return 0;
}

/* a loaded FP8 / FP4 view (codes and .scale in the mapped file): on a device its codes, then its
 * scales, in one buffer (quant.h); on the CPU decoded exactly to F32 */
static int place_quantized(struct uploader *u, struct td_tensor *t) {
    enum td_dtype q = t->dtype == TD_DTYPE_F4_E2M1 ? TD_DTYPE_Q4 : TD_DTYPE_Q8;
    int64_t rows = t->shape[0], in = t->shape[1];
    size_t codes = td_quant_code_bytes(q, rows, in), all = td_quant_bytes(q, rows, in);
    if (u->b->on_device) { // straight from the mapping: no host copy
        uint8_t *dst = dev_alloc(u, all);
        if (!dst) return upload_oom(u, all);
        u->b->to_device(dst, t->data, codes);
        u->b->to_device(dst + codes, t->scale, all - codes);
        t->data = dst;
        t->dtype = q;
        t->scale = NULL;
        return 0;
    }
    float *dst = dev_alloc(u, (size_t)(rows * in) * sizeof *dst);
    if (!dst) return upload_oom(u, (size_t)(rows * in) * sizeof *dst);
    if (!dry_run(u) && q == TD_DTYPE_Q4)
        dequant_fp4_ref(dst, t->data, t->scale, (int)rows, (int)in);
    else if (!dry_run(u))
        dequant_fp8_ref(dst, t->data, t->scale, (int)rows, (int)in);
    t->data = dst;
    t->dtype = TD_DTYPE_F32;
    t->scale = NULL;
    return 0;
}

/* place t on the uploader's backend, converted to `to` (BF16, F32, or I32 for int tensors) on a
 * device; rewrites t's view (see td_model_upload) */
static int upload_tensor(struct uploader *u, struct td_tensor *t, enum td_dtype to) {
    if (!t->data) return 0;
    if (is_quantized(t->dtype)) return place_quantized(u, t);
    if (!u->b->on_device && t->dtype != TD_DTYPE_NONE) return 0; // the CPU runs it as loaded
    int64_t n = td_tensor_numel(t);
    size_t bytes = (size_t)n * td_dtype_size(to);
    if (t->dtype == TD_DTYPE_NONE) { // a dummy model's tensor: made here, on the backend
        const struct td_dummy *g = t->data;
        if (g->quant != TD_DTYPE_NONE) {
            if (u->b->on_device) {
                size_t qb = td_quant_bytes(g->quant, t->shape[0], t->shape[1]);
                void *dst = dev_alloc(u, qb);
                if (!dst) return upload_oom(u, qb);
                u->b->ops.fill_quant(dst, g->quant, t->shape[0], t->shape[1], g->seed, g->qscale);
                t->data = dst;
                t->dtype = g->quant;
                return 0;
            }
            if (dry_run(u)) return decode_packed(u, t, g->quant, NULL);
            size_t qb = td_quant_bytes(g->quant, t->shape[0], t->shape[1]);
            void *packed = malloc(qb);
            if (!packed) return upload_oom(u, qb);
            fill_quant_ref(packed, g->quant, t->shape[0], t->shape[1], g->seed, g->qscale);
            int rc = decode_packed(u, t, g->quant, packed);
            free(packed);
            return rc;
        }
        void *dst = dev_alloc(u, bytes);
        if (!dst) return upload_oom(u, bytes);
        u->b->ops.fill_uniform(dst, to, n, g->seed, g->lo, g->hi);
        t->data = dst;
        t->dtype = to;
        return 0;
    }
    void *dst = dev_alloc(u, bytes);
    if (!dst) return upload_oom(u, bytes);
    if (dry_run(u)) { // nothing to read
        t->data = dst;
        t->dtype = to;
        return 0;
    }
    // converted in pieces: host memory stays bounded whatever the tensor's size
    enum { PIECE = 1 << 22 };
    size_t esz = td_dtype_size(to);
    void *host = malloc((size_t)(n < PIECE ? n : PIECE) * esz + 1);
    if (!host) return upload_oom(u, bytes);
    for (int64_t i0 = 0; i0 < n; i0 += PIECE) {
        int64_t m = n - i0 < PIECE ? n - i0 : PIECE;
        for (int64_t i = 0; i < m; i++) {
            if (to == TD_DTYPE_BF16)
                ((uint16_t *)host)[i] = f32_to_bf16(td_tensor_getf(t, i0 + i));
            else if (to == TD_DTYPE_F32)
                ((float *)host)[i] = td_tensor_getf(t, i0 + i);
            else
                ((int32_t *)host)[i] = (int32_t)td_tensor_geti(t, i0 + i);
        }
        u->b->to_device((char *)dst + (size_t)i0 * esz, host, (size_t)m * esz);
    }
    free(host);
    t->data = dst;
    t->dtype = to;
    return 0;
}

static enum td_dtype upload_dtype(const struct td_tensor *t, const struct wdesc *d) {
    if (d->kind == K_INT) return TD_DTYPE_I32;
    // GEMM operands go bf16; HC mixing, position biases and vectors stay fp32 (dsv4.md 2.2)
    int keep32 = t->ndim < 2 || strstr(d->hf, "_hc.") || strstr(d->hf, "hc_head") ||
                 strstr(d->hf, "position_bias");
    return keep32 ? TD_DTYPE_F32 : TD_DTYPE_BF16;
}

static int place(const struct td_model *host, const struct td_backend *b, struct td_model *dev,
                 const unsigned char *own, int own_stride, struct progress *pg, void *arena,
                 size_t arena_bytes, char *err, size_t errlen) {
    const struct td_config *c = &host->cfg;
    memset(dev, 0, sizeof *dev);
    dev->cfg = *c;
    dev->backend = b;
    struct uploader u = {.dev = dev,
                         .b = b,
                         .cap = 0,
                         .err = err,
                         .errlen = errlen,
                         .pg = pg,
                         .arena = arena,
                         .arena_bytes = arena_bytes};
    if (arena) { // the model owns it: td_model_free releases it
        if (!(dev->dev_bufs = malloc(sizeof *dev->dev_bufs))) {
            b->release(arena);
            return td_errf(err, errlen, "upload: out of memory");
        }
        dev->dev_bufs[0] = arena, dev->n_dev_bufs = 1;
    }
    size_t E = (size_t)c->n_experts;
    dev->layers = malloc((size_t)c->n_layers * sizeof *dev->layers);
    dev->expert_views = calloc((size_t)c->n_layers * E * 3, sizeof *dev->expert_views);
    if (!dev->layers || !dev->expert_views) goto oom;
    for (size_t j = 0; j < sizeof model_table / sizeof *model_table; j++) {
        const struct wdesc *d = &model_table[j];
        struct td_tensor *t = (struct td_tensor *)((char *)dev + d->off);
        *t = *(const struct td_tensor *)((const char *)host + d->off);
        if (d->off == offsetof(struct td_model, head) && c->tie_word_embeddings) continue;
        if (upload_tensor(&u, t, upload_dtype(t, d))) goto fail;
    }
    if (c->tie_word_embeddings) dev->head = dev->embed;
    dev->mtp_enorm = host->mtp_enorm;
    dev->mtp_hnorm = host->mtp_hnorm;
    dev->mtp_eproj = host->mtp_eproj;
    dev->mtp_hproj = host->mtp_hproj;
    dev->dspark = host->dspark; // the confidence head stays on the host (its dot is there)
    if (upload_tensor(&u, &dev->dspark.main_proj, TD_DTYPE_BF16) ||
        upload_tensor(&u, &dev->dspark.main_norm, TD_DTYPE_F32) ||
        upload_tensor(&u, &dev->dspark.markov_w1, TD_DTYPE_BF16) ||
        upload_tensor(&u, &dev->dspark.markov_w2, TD_DTYPE_BF16))
        goto fail;
    if (upload_tensor(&u, &dev->mtp_enorm, TD_DTYPE_F32) ||
        upload_tensor(&u, &dev->mtp_hnorm, TD_DTYPE_F32) ||
        upload_tensor(&u, &dev->mtp_eproj, TD_DTYPE_BF16) ||
        upload_tensor(&u, &dev->mtp_hproj, TD_DTYPE_BF16))
        goto fail;
    for (int i = 0; i < c->n_layers; i++) {
        struct td_layer *l = &dev->layers[i];
        *l = host->layers[i];
        for (size_t j = 0; j < sizeof layer_table / sizeof *layer_table; j++) {
            const struct wdesc *d = &layer_table[j];
            struct td_tensor *t = (struct td_tensor *)((char *)l + d->off);
            if (upload_tensor(&u, t, upload_dtype(t, d))) goto fail;
        }
        // routed experts: bf16 (or Q8 / Q4) copies, and device arrays of their pointers
        l->w1 = dev->expert_views + (size_t)i * 3 * E;
        l->w3 = l->w1 + E;
        l->w2 = l->w3 + E;
        size_t E1 = E + 1;
        const void **ptrs = calloc(3 * E1, sizeof *ptrs);
        if (!ptrs) goto oom;
        int first = -1; // the first expert placed (its dtype is the set's)
        for (size_t e = 0; e < E; e++) {
            l->w1[e] = host->layers[i].w1[e];
            l->w3[e] = host->layers[i].w3[e];
            l->w2[e] = host->layers[i].w2[e];
            if (own && !own[(size_t)i * own_stride + e]) { // another rank's: not placed
                l->w1[e].data = l->w3[e].data = l->w2[e].data = NULL;
                continue;
            }
            if (first < 0) first = (int)e;
            if (upload_tensor(&u, &l->w1[e], TD_DTYPE_BF16) ||
                upload_tensor(&u, &l->w3[e], TD_DTYPE_BF16) ||
                upload_tensor(&u, &l->w2[e], TD_DTYPE_BF16)) {
                free(ptrs);
                goto fail;
            }
            ptrs[e] = l->w1[e].data;
            ptrs[E1 + e] = l->w3[e].data;
            ptrs[2 * E1 + e] = l->w2[e].data;
        }
        l->ex_dtype = first >= 0 ? l->w1[first].dtype : TD_DTYPE_BF16;
        share_expert(l, ptrs, E); // its uploaded copy
        const void **dp = dev_alloc(&u, 3 * E1 * sizeof *dp);
        if (!dp) {
            free(ptrs);
            goto oom;
        }
        b->to_device(dp, ptrs, 3 * E1 * sizeof *dp);
        free(ptrs);
        l->ex_w1 = dp;
        l->ex_w3 = dp + E1;
        l->ex_w2 = dp + 2 * E1;
    }
    return 0;
oom:
    td_errf(err, errlen, "upload: out of memory");
fail:
    td_model_free(dev);
    return -1;
}

/* A device placement made without memory: every allocation is counted and none is made, nothing
 * is copied or filled. It walks the placement itself, so the count is what place allocates. */
static void *count_alloc(size_t bytes) {
    (void)bytes;
    return (void *)(uintptr_t)256; // never dereferenced: every op that would write is a no-op
}
static void count_release(void *p) {
    (void)p;
}
static void count_copy(void *dst, const void *src, size_t bytes) {
    (void)dst, (void)src, (void)bytes;
}
static void count_fill(void *dst, enum td_dtype t, int64_t n, uint64_t seed, float lo, float hi) {
    (void)dst, (void)t, (void)n, (void)seed, (void)lo, (void)hi;
}
static void count_fill_quant(void *dst, enum td_dtype t, int64_t rows, int64_t in, uint64_t seed,
                             uint8_t scale) {
    (void)dst, (void)t, (void)rows, (void)in, (void)seed, (void)scale;
}

/* the bytes the weights take placed on device b (a dry run of place) */
static int placed_size(const struct td_model *host, const struct td_backend *b,
                       const unsigned char *own, int own_stride, size_t *bytes, char *err,
                       size_t errlen) {
    struct td_backend counter = *b;
    counter.alloc = count_alloc;
    counter.release = count_release;
    counter.to_device = count_copy;
    counter.ops.fill_uniform = count_fill;
    counter.ops.fill_quant = count_fill_quant;
    struct td_model dry;
    if (place(host, &counter, &dry, own, own_stride, NULL, NULL, 0, err, errlen)) return -1;
    *bytes = dry.placed_bytes;
    td_model_free(&dry);
    return 0;
}

/* what a device keeps free beside the weights: the engine's step buffers, activations and the
 * GEMM workspace (engine.c sizes the caches in what is left); the host, for the rest of the
 * process (its caches are sized against physical memory) */
#define PLACE_HEADROOM      ((size_t)2 << 30)
#define PLACE_HEADROOM_HOST ((size_t)512 << 20)

int td_model_upload(const struct td_model *host, const struct td_backend *b, struct td_model *dev,
                    char *err, size_t errlen) {
    return td_model_upload_part(host, b, NULL, 0, dev, err, errlen);
}

int td_model_upload_part(const struct td_model *host, const struct td_backend *b,
                         const unsigned char *own, int own_stride, struct td_model *dev, char *err,
                         size_t errlen) {
    // fail closed: the whole placement is sized first, and refused before anything is made (on
    // the host too: dummy weights and dequantized checkpoints are made there in fp32)
    size_t need, avail = b->free_bytes ? b->free_bytes() : SIZE_MAX;
    size_t keep = b->on_device ? PLACE_HEADROOM : PLACE_HEADROOM_HOST;
    memset(dev, 0, sizeof *dev);
    if (placed_size(host, b, own, own_stride, &need, err, errlen)) return -1;
    if (avail < keep || need > avail - keep) {
        double g = 1073741824.0, sn = need >= ((size_t)1 << 30) ? need / g : need / 1048576.0;
        return td_errf(err, errlen,
                       "the model's weights need %.2f %s on %s and %.2f GiB is %s: with %.2f "
                       "GiB kept for %s they do not fit (nothing was placed; %s)",
                       sn, need >= ((size_t)1 << 30) ? "GiB" : "MiB", b->name, avail / g,
                       b->on_device ? "free" : "available", keep / g,
                       b->on_device ? "step buffers and the caches" : "the rest of the process",
                       b->on_device ? "a smaller model, or a released checkpoint split over "
                                      "several GPUs, is needed"
                                    : "a smaller model, or a GPU, is needed");
    }
    if (!b->on_device) return place(host, b, dev, own, own_stride, NULL, NULL, 0, err, errlen);
    struct progress pg = {.on = isatty(STDERR_FILENO) && need >= ((size_t)1 << 30),
                          .total = need,
                          .t0 = now_s(),
                          .where = b->name};
    void *arena = b->alloc(need); // one buffer for all of it, as the dry run counted
    if (!arena)
        return td_errf(err, errlen,
                       "the model's weights need %.2f GiB on %s in one buffer, and %s could not "
                       "allocate it (%.2f GiB was free; nothing was placed)",
                       need / 1073741824.0, b->name, b->name, avail / 1073741824.0);
    return place(host, b, dev, own, own_stride, &pg, arena, need, err, errlen);
}

int td_model_needs_placing(const struct td_model *m, const struct td_backend *b) {
    return b->on_device || m->dummy_seed || m->quantized;
}

int td_model_place_drafter(struct td_model *host, struct td_model *dev, struct td_split *sp,
                           struct td_model *view, const struct td_model *target_run,
                           const struct td_backend *b, const struct td_model **run, char *err,
                           size_t errlen) {
    const struct td_split *ts = target_run->split;
    memset(sp, 0, sizeof *sp);
    if (ts && td_split_serve(sp, ts, host, err, errlen)) return -1;
    struct td_model *m = host;
    if (td_model_needs_placing(host, b)) {
        if (td_model_upload_part(host, b, sp->own, sp->per_layer, dev, err, errlen)) return -1;
        m = dev;
    }
    m->embed = target_run->embed; // shared with the target, on the same backend
    m->head = target_run->head;
    if (ts) { // this rank's view: the placed weights, its experts
        if (td_split_place(sp, b, err, errlen)) return -1;
        *view = *m;
        view->split = sp;
        m = view;
    }
    *run = m;
    return 0;
}

const struct td_tensor *td_model_tensor(const struct td_model *m, const char *name) {
    const struct st_entry *e = st_set_find(&m->st, name);
    return e ? &e->t : NULL;
}
