/* fuzz_engine.c: libFuzzer target for config.json through the whole engine, `make fuzz`. The
 * input is written as config.json into a temporary model directory; an engine of dummy weights
 * (td_engine_params.dummy_weights) on the CPU backend is made from it, with a small context and
 * two sequence slots, and a 3-token prompt decodes a few tokens, without a drafter, with ngram
 * or with random drafts (picked by the input's length). Configs whose weights would be
 * over PARAM_BUDGET are skipped after parsing: a real model's shapes do not fit a fuzzing run,
 * and the cache pools are capped by max_cache_bytes. Seeds: tests/fuzz/fuzz_engine/; JSON-aware
 * mutations: fuzz_json.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/config.h"
#include "engine/engine.h"
#include "fuzz_json.h"

#define PARAM_BUDGET 1.5e6 /* a_tiny_yarn's 1.0 M: about 30 ms a run without sanitizers */

/* the weights' element count, roughly; in double, as the fuzzer's shapes overflow any int */
static double params(const struct td_config *c) {
    double d = c->dim, hd = c->head_dim, h = c->n_heads, q = c->q_lora_rank, hc = c->hc_mult;
    double attn = d * q + q * h * hd + d * hd + c->o_lora_rank * (h * hd + c->o_groups * d) +
                  4 * d * hd; // q, kv, grouped output, compressor
    double index =
        q * c->index_n_heads * c->index_head_dim + d * c->index_n_heads + 4 * d * c->index_head_dim;
    double ffn = (c->n_experts + 1.0) * 3 * d * c->moe_inter + d * c->n_experts +
                 (double)c->vocab * c->n_experts_tok;
    double hcw = 2 * hc * d * (2 * hc + hc * hc);
    return 2.0 * c->vocab * d + (c->n_layers + c->n_mtp_layers + 1.0) * (attn + index + ffn + hcw);
}

static char dir[64], path[96]; /* the model directory, made once per process */

static void remove_dir(void) {
    unlink(path);
    rmdir(dir);
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t n) {
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/td_fuzz_engine_XXXXXX");
        if (!mkdtemp(dir)) abort();
        snprintf(path, sizeof path, "%s/config.json", dir);
        atexit(remove_dir);
    }
    char *s = malloc(n + 1), err[512];
    if (!s) return 0;
    memcpy(s, data, n);
    s[n] = 0;
    struct td_config c;
    int skip = td_config_parse(&c, s, err, sizeof err) || params(&c) > PARAM_BUDGET;
    free(s);
    if (skip) return 0;
    FILE *fp = fopen(path, "wb");
    if (!fp) return 0;
    fwrite(data, 1, n, fp);
    fclose(fp);

    static const char *drafts[] = {"none", "ngram", "random"}; // (MTP needs stored weights)
    struct td_engine_params ep = td_engine_defaults();
    ep.model_dir = dir;
    ep.backend = "cpu";
    ep.dummy_weights = 1;
    ep.max_seqs = 2;
    ep.max_ctx = 32;
    ep.max_batch_tokens = 16;
    ep.draft = drafts[n % 3];
    ep.max_draft = n % 3 ? 2 : 0;
    ep.no_graphs = 1;
    ep.max_cache_bytes = (size_t)64 << 20;
    struct td_engine *e;
    if (td_engine_init(&e, &ep, err, sizeof err)) return 0;
    int v = td_engine_vocab(e);
    int32_t prompt[3] = {1 % v, 2 % v, 3 % v};
    struct td_request_params rp = {
        .prompt = prompt,
        .n_prompt = 3,
        .max_tokens = 3,
        .sampling = {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 42},
        .ignore_eos = 1};
    if (td_engine_submit(e, &rp, err, sizeof err) >= 0)
        for (int step = 0; step < 8 && td_engine_step(e, err, sizeof err) > 0; step++)
            ;
    td_engine_free(e);
    return 0;
}
