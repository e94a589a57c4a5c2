/* main.c: the tandem command line: one command a call, dispatched by name.
 *
 *   tandem generate [--model DIR] ("TEXT" | --prompt-ids "1 2 3" | --prompt-ids-file F) [options]
 *   tandem chat [--model DIR] [--system TEXT] [options]
 *   tandem bench [--model DIR] --prompts FILE.jsonl [options]
 *   tandem serve [-c FILE] [--set SECTION.KEY=VALUE]... [options]
 *   tandem logits --model DIR --ids FILE --out OUT.npy [--chunks 37,1,1,64,...]
 *   tandem tokenize --model DIR (--text T | --file F) [--no-special]
 *   tandem detokenize --model DIR --ids "1 2 3" [--skip-special]
 *
 * logits and serve are here; generate and chat are in cli_generate.c, bench in cli_bench.c,
 * tokenize and detokenize in cli_tokenize.c, what they share in cli.c (app/cli.h). tandem --help
 * and tandem <command> --help list the options.
 *
 * Build: make. Every subcommand validates its arguments first and exits non-zero with a
 * one-line message on bad input.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "app/cli.h"
#include "app/npy.h"
#include "engine/engine.h"
#include "kernels/err.h"
#include "metadata/plan.h"
#include "model/backend.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/state.h"
#include "serve/config.h"
#include "serve/server.h"

/* the integer at *p of a comma-separated list, *p moved past it and its comma: 0, or -1 when
 * *p does not start with one that ends at a comma or the end */
static int csv_int(const char **p, long *v) {
    char *end;
    errno = 0;
    *v = strtol(*p, &end, 10);
    if (end == *p || errno || (*end && *end != ',')) return -1;
    *p = *end ? end + 1 : end;
    return 0;
}

/* "37,1,1,64" -> sizes; each > 0, sum == n_ids */
static int parse_chunks(const char *s, int n_ids, int **out, int *n_out, char *err, size_t errlen) {
    int *c = td_xmalloc((strlen(s) / 2 + 2) * sizeof *c), n = 0;
    long sum = 0, v;
    const char *p = s;
    while (*p) {
        if (csv_int(&p, &v) || v <= 0 || v > INT32_MAX) {
            free(c);
            return td_errf(err, errlen,
                           "--chunks '%s': sizes must be positive integers separated by commas", s);
        }
        c[n++] = (int)v;
        sum += v;
        if (p[-1] == ',' && !*p) {
            free(c);
            return td_errf(err, errlen, "--chunks '%s': trailing comma", s);
        }
    }
    if (n == 0 || sum != n_ids) {
        free(c);
        return td_errf(err, errlen, "--chunks '%s' sums to %ld, but the ids file holds %d ids", s,
                       sum, n_ids);
    }
    *out = c;
    *n_out = n;
    return 0;
}

/* "3,4,5": ascending layer indices in [0, n_layers) */
static int parse_layers(const char *s, int n_layers, int *out, int *n_out, char *err,
                        size_t errlen) {
    int n = 0;
    long v;
    const char *p = s;
    while (*p) {
        if (csv_int(&p, &v) || v < 0 || v >= n_layers || (n && v <= out[n - 1]) ||
            n == TD_MAX_LAYERS)
            return td_errf(
                err, errlen,
                "--capture '%s': expected ascending layer indices in [0, %d), separated by "
                "commas",
                s, n_layers);
        out[n++] = (int)v;
    }
    if (!n) return td_errf(err, errlen, "--capture '%s': no layer given", s);
    *n_out = n;
    return 0;
}

static int cmd_logits(int argc, char **argv) {
    const char *model_dir = NULL, *ids_path = NULL, *out_path = NULL, *chunks_arg = NULL;
    const char *backend = "cpu", *capture_arg = NULL, *capture_out = NULL;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            cli_usage(stdout);
            return 0;
        }
        const char **dst = !strcmp(a, "--model")         ? &model_dir
                           : !strcmp(a, "--ids")         ? &ids_path
                           : !strcmp(a, "--out")         ? &out_path
                           : !strcmp(a, "--chunks")      ? &chunks_arg
                           : !strcmp(a, "--backend")     ? &backend
                           : !strcmp(a, "--capture")     ? &capture_arg
                           : !strcmp(a, "--capture-out") ? &capture_out
                                                         : NULL;
        if (!dst) return die("logits: unknown option '%s' (see tandem logits --help)", a);
        if (i + 1 >= argc) return die("logits: %s needs a value", a);
        *dst = argv[++i];
    }
    if (!model_dir) return die("logits: --model DIR is required");
    if (!ids_path) return die("logits: --ids FILE is required");
    if (!out_path) return die("logits: --out OUT.npy is required");
    if (!capture_arg != !capture_out) return die("logits: --capture and --capture-out go together");

    char err[1024];
    int32_t *ids = NULL;
    int n_ids = 0, *chunks = NULL, n_chunks = 0, rc = 1;
    struct td_model m, dev = {0};
    struct td_state st = {0};
    const struct td_backend *b = td_backend_get(backend, err, sizeof err);
    if (!b) return die("%s", err);
    float *logits = NULL, *cap = NULL, *cap_dev = NULL;
    int cap_layers[TD_MAX_LAYERS], n_cap = 0;
    if (cli_read_ids(ids_path, &ids, &n_ids, err, sizeof err)) return die("%s", err);
    if (chunks_arg && parse_chunks(chunks_arg, n_ids, &chunks, &n_chunks, err, sizeof err)) {
        free(ids);
        return die("%s", err);
    }
    if (!chunks) {
        chunks = td_xmalloc(sizeof *chunks);
        chunks[0] = n_ids;
        n_chunks = 1;
    }
    if (td_model_load(&m, model_dir, err, sizeof err)) {
        free(ids);
        free(chunks);
        return die("%s", err);
    }
    for (int i = 0; i < n_ids; i++)
        if (ids[i] >= m.cfg.vocab) {
            snprintf(err, sizeof err, "%s: token id %d (item %d) is outside [0, %d)", ids_path,
                     ids[i], i + 1, m.cfg.vocab);
            goto done;
        }
    if (capture_arg &&
        parse_layers(capture_arg, m.cfg.n_layers, cap_layers, &n_cap, err, sizeof err))
        goto done;
    int max_chunk = 16;
    for (int i = 0; i < n_chunks; i++)
        max_chunk = chunks[i] > max_chunk ? chunks[i] : max_chunk;
    const struct td_model *run = &m;
    if (td_model_needs_placing(&m, b)) {
        if (td_model_upload(&m, b, &dev, err, sizeof err)) goto done;
        run = &dev;
    }
    if (td_state_init(&st, &m.cfg, 1, n_ids, max_chunk, (size_t)8 << 30, b, err, sizeof err))
        goto done;
    logits = malloc((size_t)n_ids * m.cfg.vocab * sizeof(float));
    if (!logits) {
        snprintf(err, sizeof err, "out of memory for %d x %d logits", n_ids, m.cfg.vocab);
        goto done;
    }
    size_t cap_row = (size_t)n_cap * m.cfg.dim;
    if (n_cap && (!(cap = malloc((size_t)n_ids * cap_row * sizeof(float))) ||
                  !(cap_dev = b->alloc((size_t)max_chunk * cap_row * sizeof(float))))) {
        snprintf(err, sizeof err, "out of memory for %d x %zu captured values", n_ids, cap_row);
        goto done;
    }
    int slot = td_state_seq_alloc(&st), pos = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < n_chunks; i++) {
        struct td_plan_seq q = {
            .slot = slot, .len_before = pos, .n_new = chunks[i], .ids = ids + pos};
        struct td_forward_io io = {
            .capture = cap_dev, .capture_layers = cap_layers, .n_capture = n_cap};
        if (td_forward_seqs_io(run, &st, &q, 1, n_cap ? &io : NULL,
                               logits + (size_t)pos * m.cfg.vocab, err, sizeof err))
            goto done;
        if (n_cap)
            b->to_host(cap + (size_t)pos * cap_row, cap_dev,
                       (size_t)chunks[i] * cap_row * sizeof(float));
        pos += chunks[i];
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (npy_write_f32(out_path, logits, n_ids, m.cfg.vocab, err, sizeof err)) goto done;
    if (n_cap && npy_write_f32(capture_out, cap, n_ids, (int)cap_row, err, sizeof err)) goto done;
    double s = (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
    fprintf(stderr, "tandem: %d positions in %d call(s), %.3f s (%.1f tokens/s), wrote %s\n", n_ids,
            n_chunks, s, n_ids / s, out_path);
    rc = 0;
done:
    if (rc) fprintf(stderr, "tandem: %s\n", err);
    free(logits);
    free(cap);
    if (cap_dev) b->release(cap_dev);
    free(ids);
    free(chunks);
    td_state_free(&st);
    if (dev.backend) td_model_free(&dev);
    td_model_free(&m);
    return rc;
}

// ---------------------------------------------------------------------------------------------
// serve: the OpenAI-compatible HTTP server (serve/server.h), configured by an INI file

static void serve_usage(FILE *fp) {
    fprintf(fp,
            "usage: tandem serve [-c FILE] [--set SECTION.KEY=VALUE]... [options]\n"
            "  -c, --config FILE      INI configuration (etc/tandem.ini shows every key)\n"
            "  --set SEC.KEY=VALUE    override one key (repeatable; beats TANDEM_SEC_KEY in the\n"
            "                         environment, which beats the file)\n"
            "  --print-config         print the effective configuration and exit\n"
            "  --help-config          every key with its type, range and default\n"
            "  generate's options that make sense for a server map to keys and count as --set:\n"
            "  --model/-m DIR, --host H, --port N, --backend B, --draft D, --draft-tokens K,\n"
            "  --dspark-dir DIR, --dspark-threshold C, --max-batch-tokens N, --prefill-chunk N,\n"
            "  --max-ctx N, --max-seqs N, --temperature T, --top-k K, --top-p P, --max-tokens N,\n"
            "  --api-key-file F, --deterministic, --no-graphs, --dummy-weights, --ignore-eos\n"
            "With no file it serves models/tandem-tiny on 127.0.0.1:8080.\n");
}

static int cmd_serve(int argc, char **argv) {
    struct srv_config c;
    srv_config_defaults(&c);
    const char *file = NULL;
    int print = 0;
    char err[8192];
    // the file first (wherever -c stands), then the environment, then the command line in order
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            serve_usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--help-config")) {
            srv_config_help(stdout);
            return 0;
        }
        if ((!strcmp(argv[i], "-c") || !strcmp(argv[i], "--config")) && i + 1 < argc)
            file = argv[++i];
    }
    if (file && srv_config_load(&c, file, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    if (srv_config_env(&c, NULL, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL, *key, *asg;
        char buf[SRV_STR + 128];
        if (!strcmp(a, "-c") || !strcmp(a, "--config")) {
            if (!v) return die("serve: %s needs a file", a);
            i++;
            continue;
        }
        if (!strcmp(a, "--print-config")) {
            print = 1;
            continue;
        }
        if ((asg = srv_config_flag_bool(a))) {
            if (srv_config_set(&c, asg, a, err, sizeof err)) return die("%s", err);
            continue;
        }
        if (!strcmp(a, "--set")) {
            if (!v) return die("serve: --set needs SECTION.KEY=VALUE");
            if (srv_config_set(&c, v, "--set", err, sizeof err)) return die("%s", err);
            i++;
            continue;
        }
        if (!(key = srv_config_flag_key(a)))
            return die("serve: unknown option '%s' (see tandem serve --help)", a);
        if (!v) return die("serve: %s needs a value", a);
        snprintf(buf, sizeof buf, "%s=%s", key, v);
        if (srv_config_set(&c, buf, a, err, sizeof err)) return die("%s", err);
        i++;
    }
    if (srv_config_check(&c, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    if (!c.path[0]) {
        const char *d = cli_default_model(cli_argv0);
        if (!d) return die("serve: no model: set model.path (models/tandem-tiny was not found)");
        snprintf(c.path, sizeof c.path, "%s", d);
    }
    // the drafter options as generate checks them (auto stays auto: the engine picks when it loads)
    struct td_engine_params ep = td_engine_defaults();
    ep.model_dir = c.path;
    ep.backend = c.backend;
    ep.draft = c.method;
    ep.dspark_dir = c.dspark_dir[0] ? c.dspark_dir : NULL;
    ep.dspark_threshold = (float)c.confidence_min;
    ep.draft_policy = c.policy == SRV_POLICY_FIXED ? TD_POLICY_FIXED : TD_POLICY_ADAPTIVE;
    ep.max_batch_tokens = c.max_batch_tokens;
    if (cli_draft_finish("serve", &ep, c.k)) return 2;
    c.k = ep.max_draft;
    c.max_batch_tokens = ep.max_batch_tokens;
    if (print) {
        char *ini = srv_config_ini(&c);
        fputs(ini ? ini : "", stdout);
        free(ini);
        return 0;
    }
    struct cli_ranks rk; // model.ranks: the model split over processes, this one serving
    int follower;
    if (cli_ranks_start(&rk, "serve", c.ranks, c.gpus, c.backend, &follower, err, sizeof err))
        return die("%s", err);
    if (follower) { // the server's engine, following (its params as the server makes them)
        struct td_engine_params fp = srv_engine_params(&c, c.path, c.method);
        cli_ranks_params(&rk, &fp);
        return cli_ranks_follow(&fp);
    }
    int rc = srv_run(&c, rk.comm);
    if (cli_ranks_finish(&rk) && !rc) rc = 1;
    return rc;
}

int main(int argc, char **argv) {
    cli_argv0 = argv[0];
    cli_argc = argc, cli_argv = argv;
    if (argc < 2) {
        cli_usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        cli_usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "logits")) return cmd_logits(argc - 2, argv + 2);
    if (!strcmp(argv[1], "generate")) return cmd_generate(argc - 2, argv + 2);
    if (!strcmp(argv[1], "chat")) return cmd_chat(argc - 2, argv + 2);
    if (!strcmp(argv[1], "bench")) return cmd_bench(argc - 2, argv + 2);
    if (!strcmp(argv[1], "serve")) return cmd_serve(argc - 2, argv + 2);
    if (!strcmp(argv[1], "tokenize")) return cmd_tokenize(argc - 2, argv + 2);
    if (!strcmp(argv[1], "detokenize")) return cmd_detokenize(argc - 2, argv + 2);
    fprintf(stderr, "tandem: unknown command '%s' (see tandem --help)\n", argv[1]);
    return 2;
}
