/* cli_bench.c: `tandem bench`, batch throughput over a prompt set (see cli.h; tandem bench
 * --help lists the options).
 *
 *   tandem bench --prompts prompts.jsonl --n-prompts 64 --batch 16 --draft dspark [--csv]
 *
 * Every prompt is submitted at once (each generates exactly --max-tokens tokens), the engine
 * steps until idle, and one report (or CSV line) gives tokens/s, requests/s, time to the first
 * and the last token (p50, p90) and the drafter's acceptance.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "app/cli.h"
#include "engine/engine.h"
#include "kernels/err.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

// ---------------------------------------------------------------------------------------------
// bench: batch throughput over a prompt set

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int cmd_bench(int argc, char **argv) {
    struct td_engine_params ep = td_engine_defaults();
    const char *prompts_path = NULL;
    struct cli_req_opts ro = {128, 0, 0.0, 0, 1.0};
    long n_prompts = 64, batch = 16, draft_tokens = -1;
    int raw = 0, csv = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf(
                "usage: tandem bench [--model DIR] --prompts FILE.jsonl [options]\n"
                "  --prompts FILE       JSON lines with \"turns\": [text, ...] (the first turn is\n"
                "                       the prompt) or \"text\": text\n"
                "  --n-prompts N        prompts to run (default 64; fewer if the file has fewer)\n"
                "  --max-tokens N       tokens per request (default 128)\n"
                "  --batch B            requests decoding at once (default 16)\n"
                "  drafter options (default --draft none):\n" CLI_DRAFT_USAGE
                "  --synthetic-acceptance P1,P2,...  LOSSY: draft j is accepted with\n"
                "                       probability Pj whatever the target says (speculation's\n"
                "                       cost on shapes no drafter is trained for; every line\n"
                "                       says so)\n"
                "  --temperature T      default 0 (greedy);  --top-k K;  --top-p P\n"
                "  --seed S             request i uses S + i\n"
                "  --raw                prompts as plain text (default: the chat format)\n"
                "  --backend B          auto | cpu | cuda;  --deterministic;  --no-graphs\n"
                "  --max-batch-tokens N rows per step (default 256);  --max-ctx N\n"
                "  --dummy-weights      generated weights of DIR/config.json's shapes\n"
                "  --csv                one CSV header line and one result line\n"
                "Every request generates exactly --max-tokens tokens (EOS does not stop it).\n"
                "Prints tokens/s, requests/s, time to first token and to the last (median, p90),\n"
                "the mean accepted length and acceptance by draft position.\n",
                cli_draft_usage_names());
            return 0;
        }
        if (!strcmp(a, "--raw")) {
            raw = 1;
            continue;
        }
        if (!strcmp(a, "--csv")) {
            csv = 1;
            continue;
        }
        if (cli_engine_flag(a, &ep)) continue;
        int rc = cli_value_option("bench", a, v, &ep, &draft_tokens, &ro);
        if (rc < 0) return 2;
        i++;
        if (rc) continue;
        if (!strcmp(a, "--prompts"))
            prompts_path = v;
        else if (!strcmp(a, "--n-prompts"))
            rc = cli_parse_int(a, v, 1, 1 << 20, &n_prompts);
        else if (!strcmp(a, "--batch"))
            rc = cli_parse_int(a, v, 1, 4096, &batch);
        else
            return die("bench: unknown option '%s' (see tandem bench --help)", a);
        if (rc) return 2;
    }
    if (!prompts_path) return die("bench: --prompts FILE.jsonl is required");
    if (!ep.model_dir && !(ep.model_dir = cli_default_model(cli_argv0)))
        return die("bench: no model: give --model DIR (models/tandem-tiny was not found)");
    if (cli_draft_finish("bench", &ep, draft_tokens)) return 2;
    ep.max_seqs = (int)batch;

    char err[1024];
    struct tok *tk;
    struct chat ch;
    if (tok_load(&tk, ep.model_dir, err, sizeof err)) return die("%s", err);
    if (!raw && chat_init(&ch, tk, err, sizeof err)) {
        tok_free(tk);
        return die("%s", err);
    }
    FILE *fp = fopen(prompts_path, "r");
    if (!fp) {
        tok_free(tk);
        return die("bench: cannot open %s", prompts_path);
    }
    struct tok_ids *ids = td_xcalloc((size_t)n_prompts, sizeof *ids);
    int np = 0, lineno = 0;
    char *line = NULL;
    size_t cap = 0;
    while (np < n_prompts && getline(&line, &cap, fp) > 0) {
        lineno++;
        json_error_t je;
        json_t *doc = json_loads(line, 0, &je);
        json_t *turns = doc ? json_object_get(doc, "turns") : NULL;
        const char *text = json_is_array(turns) ? json_string_value(json_array_get(turns, 0))
                           : doc                ? json_string_value(json_object_get(doc, "text"))
                                                : NULL;
        int rc = -1;
        if (!text) {
            snprintf(err, sizeof err, "%s:%d: not a JSON object with \"turns\" or \"text\"",
                     prompts_path, lineno);
        } else if (raw) {
            rc = tok_encode(tk, text, strlen(text), TOK_ENCODE_ADD_SPECIAL, &ids[np], err,
                            sizeof err);
        } else {
            struct chat_msg msg = {.role = CHAT_ROLE_USER, .content = text};
            rc = chat_encode(&ch, &msg, 1, 1, &ids[np], err, sizeof err);
        }
        json_decref(doc);
        if (rc) {
            fclose(fp);
            free(line);
            for (int i = 0; i <= np; i++)
                tok_ids_free(&ids[i]);
            free(ids);
            tok_free(tk);
            return die("%s", err);
        }
        np++;
    }
    free(line);
    fclose(fp);
    if (!np) {
        free(ids);
        tok_free(tk);
        return die("bench: %s holds no prompts", prompts_path);
    }
    struct td_engine *e;
    int *rid = NULL, rc = td_engine_init(&e, &ep, err, sizeof err) ? die("%s", err) : 0;
    double *ttft = NULL, *done_t = NULL;
    if (!rc) rc = cli_draft_options_ok("bench", td_engine_draft(e), &ep, draft_tokens); // auto's
    if (!rc) cli_print_synthetic(stderr, "bench", &ep);
    if (rc) goto out;
    rid = td_xmalloc((size_t)np * sizeof *rid);
    ttft = td_xmalloc((size_t)np * sizeof *ttft);
    done_t = td_xmalloc((size_t)np * sizeof *done_t);
    long prompt_tokens = 0;
    double t0 = now_s();
    for (int i = 0; i < np; i++) {
        struct td_request_params rp = {.prompt = ids[i].ids,
                                       .n_prompt = (int)ids[i].n,
                                       .max_tokens = (int)ro.max_tokens,
                                       .sampling = {.temperature = (float)ro.temperature,
                                                    .top_k = (int)ro.top_k,
                                                    .top_p = (float)ro.top_p,
                                                    .seed = (uint64_t)(ro.seed + i)},
                                       .ignore_eos = 1};
        prompt_tokens += (long)ids[i].n;
        ttft[i] = done_t[i] = -1;
        if ((rid[i] = td_engine_submit(e, &rp, err, sizeof err)) < 0) {
            rc = die("%s", err);
            goto out;
        }
    }
    int live;
    do {
        live = td_engine_step(e, err, sizeof err);
        double t = now_s() - t0;
        for (int i = 0; i < np; i++) {
            int nt;
            enum td_req_status st;
            td_engine_output(e, rid[i], NULL, &nt, &st, NULL, NULL);
            if (nt > 0 && ttft[i] < 0) ttft[i] = t;
            if ((st == TD_REQ_FINISHED || st == TD_REQ_FAILED) && done_t[i] < 0) done_t[i] = t;
        }
    } while (live > 0);
    if (live < 0) {
        rc = die("%s", err);
        goto out;
    }
    double wall = now_s() - t0;
    const struct td_engine_stats *s = td_engine_stats(e);
    qsort(ttft, (size_t)np, sizeof *ttft, cmp_double);
    qsort(done_t, (size_t)np, sizeof *done_t, cmp_double);
    double mal = s->rounds ? (double)(s->accepted + s->rounds) / s->rounds : 1.0;
    if (csv) {
        printf(
            "model,backend,draft,k,prompts,batch,prompt_tokens,output_tokens,seconds,tokens_per_s,"
            "requests_per_s,ttft_p50,ttft_p90,latency_p50,latency_p90,mean_accepted_length,"
            "draft_policy,synthetic_acceptance\n");
        char syn[16 * TD_MAX_DRAFT + 16] = "none";
        for (int j = 0, o = 0; j < ep.n_synthetic; j++)
            o += snprintf(syn + o, sizeof syn - (size_t)o, "%s%g%s", j ? ";" : "",
                          ep.synthetic_accept[j], j == ep.n_synthetic - 1 ? " (lossy)" : "");
        printf("%s,%s,%s,%d,%d,%ld,%ld,%ld,%.3f,%.1f,%.3f,%.4f,%.4f,%.4f,%.4f,%.3f,%s,%s\n",
               ep.model_dir, td_engine_backend(e), td_engine_draft(e), td_engine_draft_tokens(e),
               np, batch, prompt_tokens, s->tokens_out, wall, s->tokens_out / wall, np / wall,
               ttft[np / 2], ttft[np * 9 / 10], done_t[np / 2], done_t[np * 9 / 10], mal,
               ep.draft_policy == TD_POLICY_FIXED ? "fixed" : "adaptive", syn);
    } else {
        const char *tag = ep.n_synthetic ? "bench [synthetic acceptance, lossy]" : "bench";
        printf("%s: %s on %s, draft %s k=%d, %d prompts (%ld tokens), batch %ld\n", tag,
               ep.model_dir, td_engine_backend(e), td_engine_draft(e), td_engine_draft_tokens(e),
               np, prompt_tokens, batch);
        printf("%s: %ld output tokens in %.3f s = %.1f tokens/s, %.2f requests/s, %ld steps\n", tag,
               s->tokens_out, wall, s->tokens_out / wall, np / wall, s->steps);
        printf("%s: time to first token p50 %.3f s p90 %.3f s; to the last p50 %.3f s p90 %.3f s\n",
               tag, ttft[np / 2], ttft[np * 9 / 10], done_t[np / 2], done_t[np * 9 / 10]);
        if (s->rounds && td_engine_draft_tokens(e)) {
            printf("%s: mean accepted length %.3f, acceptance by draft position:", tag, mal);
            for (int j = 0; j < TD_MAX_DRAFT && s->proposed_at[j]; j++)
                printf(" %d:%.3f", j + 1, (double)s->accepted_at[j] / s->proposed_at[j]);
            printf("\n");
            cli_print_policy(stdout, tag, &ep, s);
        }
    }
out:
    free(rid);
    free(ttft);
    free(done_t);
    for (int i = 0; i < np; i++)
        tok_ids_free(&ids[i]);
    free(ids);
    td_engine_free(e);
    tok_free(tk);
    return rc;
}
