/* acceptance.c: a drafter's acceptance on tandem-tiny's held-out text, measured the way
 * tools/spec_loop.py measures the PyTorch reference, so the two can be compared.
 *
 *   make bench-bins && build/bench/acceptance [--draft mtp|dspark] [--prompts 8] [--new 128]
 *        [--k 3] [--threshold C] [--backend cpu|cuda] [--val F | --prompt-file F]
 *        [--model DIR] [--dspark-dir DIR]
 *
 * Prompts: the first documents of the validation split (--val, default .corpus/val.jsonl from
 * sh tools/corpus.sh), each encoded as BOS + ids, cut to the first 128 tokens (documents
 * shorter than that, or holding EOS inside, are skipped), as spec_loop.py does for MTP; or the
 * lines of --prompt-file (ids, one prompt per line, the first 128 used), as spec_loop.py takes
 * for DSpark from tools/dspark_data.py's held-out windows (bench/prompts/tiny_val.ids: the first
 * 128 ids of `tools/dspark_data.py --split val --windows 16 --seq 512 --seed 12`). Each prompt is
 * decoded alone at T = 0 and T = 1 with k drafts per round (DSpark: its block size unless --k),
 * stopping at EOS or 128 new tokens. Printed: per-position conditional acceptance P(draft j
 * accepted | drafts < j accepted) and the mean accepted length per round (bonus included).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "tokenizer/tokenizer.h"

int main(int argc, char **argv) {
    int n_prompts = 8, n_new = 128, k = 3, plen = 128;
    float threshold = 0.0f;
    const char *model = "models/tandem-tiny", *backend = "cpu", *val = ".corpus/val.jsonl";
    const char *draft = "mtp", *prompt_file = NULL, *dspark_dir = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--prompts"))
            n_prompts = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--new"))
            n_new = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--k"))
            k = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--backend"))
            backend = argv[i + 1];
        else if (!strcmp(argv[i], "--val"))
            val = argv[i + 1];
        else if (!strcmp(argv[i], "--draft"))
            draft = argv[i + 1];
        else if (!strcmp(argv[i], "--prompt-file"))
            prompt_file = argv[i + 1];
        else if (!strcmp(argv[i], "--model"))
            model = argv[i + 1];
        else if (!strcmp(argv[i], "--dspark-dir"))
            dspark_dir = argv[i + 1];
        else if (!strcmp(argv[i], "--threshold"))
            threshold = (float)atof(argv[i + 1]);
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    char err[512];
    struct tok *tk;
    if (tok_load(&tk, model, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    FILE *fp = fopen(prompt_file ? prompt_file : val, "r");
    if (!fp) {
        fprintf(stderr, "cannot open %s%s\n", prompt_file ? prompt_file : val,
                prompt_file ? "" : " (run sh tools/corpus.sh)");
        return 1;
    }
    int32_t bos = tok_bos(tk), eos = tok_eos(tk);
    int32_t prompts[64][128];
    int np = 0;
    char *line = NULL;
    size_t cap = 0;
    if (n_prompts > 64) n_prompts = 64;
    while (np < n_prompts && getline(&line, &cap, fp) > 0) {
        if (prompt_file) { // ids
            int n = 0, off = 0, used;
            while (n < plen && sscanf(line + off, "%d%n", &prompts[np][n], &used) == 1)
                n++, off += used;
            if (n == plen) np++;
            continue;
        }
        json_t *doc = json_loads(line, 0, NULL);
        const char *text = doc ? json_string_value(json_object_get(doc, "text")) : NULL;
        if (text) {
            struct tok_ids ti = {0};
            if (!tok_encode(tk, text, strlen(text), 0, &ti, err, sizeof err) &&
                ti.n + 1 > (size_t)plen) {
                prompts[np][0] = bos;
                memcpy(prompts[np] + 1, ti.ids, (size_t)(plen - 1) * sizeof(int32_t));
                int has_eos = 0;
                for (int i = 0; i < plen; i++)
                    has_eos |= prompts[np][i] == eos;
                if (!has_eos) np++;
            }
            tok_ids_free(&ti);
        }
        json_decref(doc);
    }
    free(line);
    fclose(fp);
    tok_free(tk);
    if (!strcmp(draft, "dspark") && k == 3) k = 0; // its block size
    int k_run = k;
    for (int ti = 0; ti < 2; ti++) {
        float T = ti ? 1.0f : 0.0f;
        long acc[16] = {0}, reached[16] = {0}, rounds = 0, accepted = 0;
        for (int p = 0; p < np; p++) {
            struct td_engine_params ep = td_engine_defaults();
            ep.model_dir = model;
            ep.backend = backend;
            ep.draft = draft;
            ep.max_draft = k_run;
            ep.dspark_threshold = threshold;
            ep.dspark_dir = dspark_dir;
            ep.max_seqs = 1;
            ep.max_ctx = 1024;
            struct td_engine *e;
            if (td_engine_init(&e, &ep, err, sizeof err)) {
                fprintf(stderr, "%s\n", err);
                return 1;
            }
            k = td_engine_draft_tokens(e);
            if (!p && !ti)
                printf("model %s, backend %s, %d prompts x %d tokens, %s k = %d\n", model, backend,
                       np, plen, draft, k);
            struct td_request_params rp = {
                .prompt = prompts[p],
                .n_prompt = plen,
                .max_tokens = n_new,
                .sampling = {.temperature = T, .top_k = 0, .top_p = 1.0f, .seed = (uint64_t)p},
                .ignore_eos = 0};
            td_engine_submit(e, &rp, err, sizeof err);
            while (td_engine_step(e, err, sizeof err) > 0) {
            }
            const struct td_engine_stats *s = td_engine_stats(e);
            for (int j = 0; j < k; j++)
                acc[j] += s->accepted_at[j], reached[j] += s->reached_at[j];
            rounds += s->rounds;
            accepted += s->accepted;
            td_engine_free(e);
        }
        printf("T = %.0f: conditional acceptance by position:", T);
        for (int j = 0; j < k; j++)
            printf(" %d: %.3f", j + 1, reached[j] ? (double)acc[j] / reached[j] : 0.0);
        printf("; mean accepted length %.3f (bonus included), %ld rounds\n",
               rounds ? (double)(accepted + rounds) / rounds : 0.0, rounds);
    }
    return 0;
}
