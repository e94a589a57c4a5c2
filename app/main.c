/* main.c: the tandem command line.
 *
 *   tandem logits --model DIR --ids FILE --out OUT.npy [--chunks 37,1,1,64,...]
 *
 * Build: make. Every subcommand validates its arguments first and exits non-zero with a
 * one-line message on bad input.
 */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "draft/drafter.h"
#include "engine/engine.h"
#include "kernels/err.h"
#include "model/backend.h"
#include "app/cli.h"
#include "model/fileio.h"
#include "model/forward.h"
#include "model/model.h"
#include "app/npy.h"
#include "model/state.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/chat.h"
#include "metadata/plan.h"
#include "serve/config.h"
#include "serve/server.h"

/* the drafter options' help; its %s is draft_usage_names() */
#define DRAFT_USAGE                                                                                \
    "  --draft NAME           %s (auto: dspark when\n"                                             \
    "                         the model ships DIR/dspark/ and the backend is the GPU, else\n"      \
    "                         none; mtp reads the checkpoint's mtp.0.* layer)\n"                   \
    "  --draft-tokens K       draft tokens per round, 1..16 (default 3; dspark: its block\n"       \
    "                         size, and at most that)\n"                                           \
    "  --dspark-dir DIR       the DSpark drafter (default: the model's dspark/)\n"                 \
    "  --dspark-threshold C   verify only the drafts before the first slot whose confidence is\n"  \
    "                         below C, in [0, 1) (default 0: all; lossless either way)\n"

/* the drafter names as DRAFT_USAGE lists them: "auto | none | ngram | ..." (draft/drafter.c) */
static const char *draft_usage_names(void) {
    static char names[128];
    draft_names_join(names, sizeof names, " | ", " | ");
    return names;
}

static void usage(FILE *fp) {
    fprintf(
        fp,
        "usage: tandem <command> [options]\n"
        "\n"
        "commands:\n"
        "  generate   generate tokens from a prompt, with or without speculation\n"
        "  chat       an interactive session in the model's chat format\n"
        "  bench      batch throughput over a prompt set (tandem bench --help)\n"
        "  serve      an OpenAI-compatible HTTP server (tandem serve --help)\n"
        "  logits     run the reference forward and write every position's logits\n"
        "  tokenize   text -> token ids (tandem tokenize --help)\n"
        "  detokenize token ids -> text (tandem detokenize --help)\n"
        "\n"
        "tandem generate [--model DIR] (\"TEXT\" | --prompt-ids \"1 2 3\" | --prompt-ids-file F)\n"
        "                [options]\n"
        "  --model DIR            default: models/tandem-tiny (here, or beside the binary)\n"
        "  TEXT                   a text prompt, encoded with DIR/tokenizer.json; the output is\n"
        "                         text (streamed for one completion) unless --print-ids\n"
        "  --max-tokens N         tokens to generate per completion (default 64, >= 1)\n"
        "  --temperature T        0 = greedy (default 0), else sampled; >= 0\n"
        "  --top-k K              keep the K most likely tokens (default 0 = off)\n"
        "  --top-p P              nucleus mass in (0, 1] (default 1 = off)\n"
        "  --seed S               seed of completion 0; completion i uses S + i (default 0)\n"
        "  --n N                  independent completions decoded together (default "
        "1)\n" DRAFT_USAGE
        "  --print-ids            one line of generated ids per completion, nothing else\n"
        "  --stats                tokens/s, steps, mean accepted length, per-position\n"
        "                         acceptance and time per step (target, verify, drafter)\n"
        "                         to stderr\n"
        "  --ignore-eos           do not stop at EOS tokens\n"
        "  --max-batch-tokens N   rows per forward step (default 256)\n"
        "  --max-ctx N            tokens per sequence (default 4096, capped by the model)\n"
        "  --backend B            auto | cpu | cuda (default auto: cuda when a GPU is usable)\n"
        "  --deterministic        batch-invariant kernels (GPU; the CPU always is)\n"
        "  --no-graphs            run every GPU step eagerly (no CUDA graph replay)\n"
        "  --dummy-weights        generated weights of DIR/config.json's shapes, made on the\n"
        "                         backend (benchmarks; no safetensors are read)\n"
        "\n"
        "tandem logits --model DIR --ids FILE --out OUT.npy [--chunks N,N,...] [--backend B]\n"
        "              [--capture L,L,... --capture-out CAP.npy]\n"
        "  --model DIR     model directory: config.json + model.safetensors (or shards with\n"
        "                  model.safetensors.index.json), HF or upstream DeepSeek layout\n"
        "  --ids FILE      whitespace-separated token ids, each in [0, vocab_size)\n"
        "  --out OUT.npy   float32 little-endian C-order array [n_ids, vocab_size]\n"
        "  --chunks LIST   feed the ids as successive forward calls of these sizes\n"
        "                  (positive, summing to n_ids; default: one call)\n"
        "  --backend B     cpu (default: the fp32 reference), cuda or auto\n"
        "  --capture LIST  target layers (ascending, 0-based) whose mean HC stream is written,\n"
        "                  per position, to --capture-out as float32 [n_ids, layers * hidden]\n"
        "                  (the context a DSpark drafter reads)\n",
        draft_usage_names());
}

static int die(const char *fmt, const char *a) {
    fprintf(stderr, "tandem: ");
    fprintf(stderr, fmt, a);
    fprintf(stderr, "\n");
    return 2;
}

/* more token ids than any context holds: a list this long is a mistake, refused as it is read */
#define MAX_IDS (1 << 24)

/* whitespace-separated non-negative integers from fp, named `what` in messages; -1 with message
 * on anything else */
static int scan_ids(FILE *fp, const char *what, int32_t **out, int *n_out, char *err,
                    size_t errlen) {
    size_t cap = 1024, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    char tok[64];
    int rc = 0;
    if (!ids) return td_errf(err, errlen, "out of memory reading %s", what);
    while (fscanf(fp, "%63s", tok) == 1) {
        char *end;
        errno = 0;
        long v = strtol(tok, &end, 10);
        if (*end || errno || v < 0 || v > INT32_MAX) {
            rc = td_errf(err, errlen, "%s: '%s' (item %zu) is not a token id", what, tok, n + 1);
            break;
        }
        if (n == MAX_IDS) {
            rc = td_errf(err, errlen, "%s holds more than %d token ids", what, MAX_IDS);
            break;
        }
        if (n == cap) {
            int32_t *p = realloc(ids, (cap *= 2) * sizeof *ids);
            if (!p) {
                rc = td_errf(err, errlen, "out of memory reading %s after %zu ids", what, n);
                break;
            }
            ids = p;
        }
        ids[n++] = (int32_t)v;
    }
    if (!rc && n == 0) rc = td_errf(err, errlen, "%s holds no token ids", what);
    if (rc) {
        free(ids);
        return -1;
    }
    *out = ids;
    *n_out = (int)n;
    return 0;
}

static int read_ids(const char *path, int32_t **out, int *n_out, char *err, size_t errlen) {
    FILE *fp = fopen(path, "r");
    if (!fp) return td_errf(err, errlen, "cannot open ids file %s: %s", path, strerror(errno));
    int rc = scan_ids(fp, path, out, n_out, err, errlen);
    fclose(fp);
    return rc;
}

/* "37,1,1,64" -> sizes; each > 0, sum == n_ids */
static int parse_chunks(const char *s, int n_ids, int **out, int *n_out, char *err, size_t errlen) {
    int *c = td_xmalloc((strlen(s) / 2 + 2) * sizeof *c), n = 0;
    long sum = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v <= 0 || v > INT32_MAX || (*end && *end != ',')) {
            free(c);
            return td_errf(err, errlen,
                           "--chunks '%s': sizes must be positive integers separated by commas", s);
        }
        c[n++] = (int)v;
        sum += v;
        p = *end ? end + 1 : end;
        if (*end == ',' && !*p) {
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
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v >= n_layers || (n && v <= out[n - 1]) ||
            (*end && *end != ',') || n == TD_MAX_LAYERS)
            return td_errf(
                err, errlen,
                "--capture '%s': expected ascending layer indices in [0, %d), separated by "
                "commas",
                s, n_layers);
        out[n++] = (int)v;
        p = *end ? end + 1 : end;
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
            usage(stdout);
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
    if (!model_dir) return die("logits: --model DIR is required%s", "");
    if (!ids_path) return die("logits: --ids FILE is required%s", "");
    if (!out_path) return die("logits: --out OUT.npy is required%s", "");
    if (!capture_arg != !capture_out)
        return die("logits: --capture and --capture-out go together%s", "");

    char err[1024];
    int32_t *ids = NULL;
    int n_ids = 0, *chunks = NULL, n_chunks = 0, rc = 1;
    struct td_model m, dev = {0};
    struct td_state st = {0};
    const struct td_backend *b = td_backend_get(backend, err, sizeof err);
    if (!b) return die("%s", err);
    float *logits = NULL, *cap = NULL, *cap_dev = NULL;
    int cap_layers[TD_MAX_LAYERS], n_cap = 0;
    if (read_ids(ids_path, &ids, &n_ids, err, sizeof err)) return die("%s", err);
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
    if (b->on_device) {
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
        struct td_plan_seq q = {slot, pos, chunks[i], ids + pos, 0, 0};
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
// generate

static int parse_int(const char *flag, const char *v, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!*v || *end || errno || x < lo || x > hi) {
        fprintf(stderr, "tandem: %s '%s': expected an integer in [%ld, %ld]\n", flag, v, lo, hi);
        return -1;
    }
    *out = x;
    return 0;
}

static int parse_float(const char *flag, const char *v, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (!*v || *end || errno || !(x >= lo && x <= hi)) {
        fprintf(stderr, "tandem: %s '%s': expected a number in [%g, %g]\n", flag, v, lo, hi);
        return -1;
    }
    *out = x;
    return 0;
}

/* "1 2 3" -> ids (whitespace separated) */
static int parse_ids_text(const char *text, int32_t **out, int *n_out) {
    char err[256];
    FILE *fp = fmemopen((void *)text, strlen(text), "r");
    int rc = fp ? scan_ids(fp, "--prompt-ids", out, n_out, err, sizeof err) : -1;
    if (fp) fclose(fp);
    if (rc) fprintf(stderr, "tandem: %s\n", fp ? err : "--prompt-ids: out of memory");
    return rc;
}

/* the default model: models/tandem-tiny under the working directory, else beside the binary */
static const char *default_model(const char *argv0) {
    static char path[TD_PATH_MAX];
    if (!access("models/tandem-tiny/config.json", R_OK)) return "models/tandem-tiny";
    const char *slash = strrchr(argv0, '/');
    char bin[TD_PATH_MAX], cfg[TD_PATH_MAX], e[256];
    if (!slash || (size_t)(slash - argv0) >= sizeof bin) return NULL; // a cut path: none
    memcpy(bin, argv0, (size_t)(slash - argv0));
    bin[slash - argv0] = 0;
    if (td_path_join(path, sizeof path, bin, "../models/tandem-tiny", e, sizeof e) ||
        td_path_join(cfg, sizeof cfg, path, "config.json", e, sizeof e))
        return NULL;
    return access(cfg, R_OK) ? NULL : path;
}

static const char *argv0_g = "tandem";

/* stream request id's new tokens as text */
static void stream_text(struct td_engine *e, int id, struct tok_stream *ts, int *shown) {
    const int32_t *toks;
    int nt;
    td_engine_output(e, id, &toks, &nt, NULL, NULL, NULL);
    for (; *shown < nt; (*shown)++) {
        const char *txt;
        size_t len;
        char err[256];
        if (tok_stream_push(ts, toks[*shown], &txt, &len, err, sizeof err) == 0 && len)
            fwrite(txt, 1, len, stdout);
    }
    fflush(stdout);
}

/* the rest of request id's text, then a newline; ends the stream */
static void stream_finish(struct td_engine *e, int id, struct tok_stream *ts, int *shown) {
    stream_text(e, id, ts, shown);
    const char *txt;
    size_t len;
    tok_stream_flush(ts, &txt, &len);
    if (len) fwrite(txt, 1, len, stdout);
    printf("\n");
    tok_stream_free(ts);
}

// ---------------------------------------------------------------------------------------------
// drafter options, shared by generate, chat and bench

/* the options generate, chat and bench share (--model, --backend, the drafter's): 1: (a, v) was
 * one and is taken; 0: not one; -1: a bad value (message printed) */
static int engine_option(const char *a, const char *v, struct td_engine_params *ep,
                         long *draft_tokens) {
    if (!strcmp(a, "--model")) {
        ep->model_dir = v;
        return 1;
    }
    if (!strcmp(a, "--backend")) {
        ep->backend = v;
        return 1;
    }
    if (!strcmp(a, "--draft")) {
        ep->draft = v;
        return 1;
    }
    if (!strcmp(a, "--dspark-dir")) {
        ep->dspark_dir = v;
        return 1;
    }
    if (!strcmp(a, "--draft-tokens"))
        return parse_int(a, v, 1, TD_MAX_DRAFT, draft_tokens) ? -1 : 1;
    if (!strcmp(a, "--dspark-threshold")) {
        double t;
        if (parse_float(a, v, 0, 0.999999, &t)) return -1;
        ep->dspark_threshold = (float)t;
        return 1;
    }
    long lv;
    if (!strcmp(a, "--max-batch-tokens")) {
        if (parse_int(a, v, 1, 1 << 20, &lv)) return -1;
        ep->max_batch_tokens = (int)lv;
        return 1;
    }
    if (!strcmp(a, "--max-ctx")) {
        if (parse_int(a, v, 2, 1 << 24, &lv)) return -1;
        ep->max_ctx = (int)lv;
        return 1;
    }
    return 0;
}

/* the request options generate, chat and bench share: 1 when a was one (its value parsed into
 * r), -1 after printing a bad value's error, 0 when a is another option */
struct req_opts {
    long max_tokens, seed;
    double temperature;
    long top_k;
    double top_p;
};

static int request_option(const char *a, const char *v, struct req_opts *r) {
    int rc;
    if (!strcmp(a, "--max-tokens"))
        rc = parse_int(a, v, 1, 1 << 24, &r->max_tokens);
    else if (!strcmp(a, "--temperature"))
        rc = parse_float(a, v, 0, 1e6, &r->temperature);
    else if (!strcmp(a, "--seed"))
        rc = parse_int(a, v, 0, LONG_MAX, &r->seed);
    else if (!strcmp(a, "--top-k"))
        rc = parse_int(a, v, 0, INT32_MAX, &r->top_k);
    else if (!strcmp(a, "--top-p"))
        rc = parse_float(a, v, 1e-9, 1, &r->top_p);
    else
        return 0;
    return rc ? -1 : 1;
}

/* the value-less engine flags generate and bench share: 1 when a was one */
static int engine_flag(const char *a, struct td_engine_params *ep) {
    if (!strcmp(a, "--deterministic"))
        ep->deterministic = 1;
    else if (!strcmp(a, "--no-graphs"))
        ep->no_graphs = 1;
    else if (!strcmp(a, "--dummy-weights"))
        ep->dummy_weights = 1;
    else
        return 0;
    return 1;
}

/* the drafter options against drafter `name`: 0, or 2 after printing why not. Before the engine
 * exists name is --draft as given, and for auto the checks that need its pick wait; after, it is
 * the drafter the engine runs (td_engine_draft), auto's pick included */
static int draft_options_ok(const char *cmd, const char *name, const struct td_engine_params *ep,
                            long draft_tokens) {
    const struct draft_info *di = draft_lookup(name, NULL, 0);
    if (!di) {
        char names[128];
        draft_names_join(names, sizeof names, ", ", " or ");
        fprintf(stderr, "tandem: %s: --draft '%s': expected %s\n", cmd, name, names);
        return 2;
    }
    if (di->kind == DRAFT_KIND_AUTO) return 0;
    if (di->kind == DRAFT_KIND_NONE && draft_tokens > 0) {
        fprintf(stderr, "tandem: %s: --draft-tokens needs a drafter (--draft ...)\n", cmd);
        return 2;
    }
    if (di->kind != DRAFT_KIND_DSPARK && (ep->dspark_threshold > 0.0f || ep->dspark_dir)) {
        fprintf(stderr, "tandem: %s: --dspark-threshold and --dspark-dir need --draft dspark\n",
                cmd);
        return 2;
    }
    return 0;
}

/* check the drafter options and set max_draft (auto goes to the engine as it is: the engine
 * picks, and the caller checks the options again against its pick); 0, or 2 after an error */
static int draft_finish(const char *cmd, struct td_engine_params *ep, long draft_tokens) {
    if (draft_options_ok(cmd, ep->draft, ep, draft_tokens)) return 2;
    const struct draft_info *di = draft_lookup(ep->draft, NULL, 0);
    ep->max_draft = di->kind == DRAFT_KIND_NONE ? 0
                    : draft_tokens > 0          ? (int)draft_tokens
                                                : di->default_tokens;
    if (ep->max_batch_tokens < 1 + ep->max_draft) ep->max_batch_tokens = 1 + ep->max_draft;
    return 0;
}

/* -1 while a completion has no token yet; then the tokens out so far, with the time in *at */
static long all_started(struct td_engine *e, const int *ids, long n, struct timespec *at) {
    long out = 0;
    for (long i = 0; i < n; i++) {
        int nt;
        enum td_req_status st;
        td_engine_output(e, ids[i], NULL, &nt, &st, NULL, NULL);
        if (nt < 1 && st != TD_REQ_FINISHED && st != TD_REQ_FAILED) return -1;
        out += nt;
    }
    clock_gettime(CLOCK_MONOTONIC, at);
    return out;
}

static int cmd_generate(int argc, char **argv) {
    struct td_engine_params ep = td_engine_defaults();
    ep.draft = "auto";
    const char *prompt_text = NULL, *prompt_file = NULL, *text = NULL;
    struct req_opts ro = {64, 0, 0.0, 0, 1.0};
    long n = 1, draft_tokens = -1;
    int print_ids = 0, stats = 0, ignore_eos = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--print-ids")) {
            print_ids = 1;
            continue;
        }
        if (!strcmp(a, "--stats")) {
            stats = 1;
            continue;
        }
        if (!strcmp(a, "--ignore-eos")) {
            ignore_eos = 1;
            continue;
        }
        if (engine_flag(a, &ep)) continue;
        if (a[0] != '-' || !a[1]) { // the text prompt
            if (text) return die("generate: more than one text prompt ('%s')", a);
            text = a;
            continue;
        }
        if (!v) return die("generate: %s needs a value (see tandem generate --help)", a);
        i++;
        int rc = engine_option(a, v, &ep, &draft_tokens);
        if (!rc) rc = request_option(a, v, &ro);
        if (rc) {
            if (rc < 0) return 2;
            continue;
        }
        if (!strcmp(a, "--prompt-ids"))
            prompt_text = v;
        else if (!strcmp(a, "--prompt-ids-file"))
            prompt_file = v;
        else if (!strcmp(a, "--n"))
            rc = parse_int(a, v, 1, 4096, &n);
        else
            return die("generate: unknown option '%s' (see tandem generate --help)", a);
        if (rc) return 2;
    }
    if (!ep.model_dir && !(ep.model_dir = default_model(argv0_g)))
        return die("generate: no model: give --model DIR (models/tandem-tiny was not found)%s", "");
    if ((text != NULL) + (prompt_text != NULL) + (prompt_file != NULL) != 1)
        return die("generate: give exactly one of a text prompt, --prompt-ids and "
                   "--prompt-ids-file%s",
                   "");
    if (draft_finish("generate", &ep, draft_tokens)) return 2;
    ep.max_seqs = (int)(n < 256 ? n : 256);

    char err[1024];
    int32_t *prompt = NULL;
    int n_prompt = 0;
    struct tok *tk = NULL;
    // text in (and out, unless --print-ids) needs the model's tokenizer
    if ((text || !print_ids) && tok_load(&tk, ep.model_dir, err, sizeof err) != 0) {
        if (text) return die("%s", err);
        tk = NULL; // ids in, ids out
    }
    if (text) {
        struct tok_ids ti = {0};
        if (tok_encode(tk, text, strlen(text), TOK_ENCODE_ADD_SPECIAL, &ti, err, sizeof err)) {
            tok_free(tk);
            return die("%s", err);
        }
        prompt = ti.ids;
        n_prompt = (int)ti.n;
    } else if (prompt_file) {
        if (read_ids(prompt_file, &prompt, &n_prompt, err, sizeof err)) {
            tok_free(tk);
            return die("%s", err);
        }
    } else if (parse_ids_text(prompt_text, &prompt, &n_prompt)) {
        tok_free(tk);
        return 2;
    }
    struct td_engine *e;
    int bad = td_engine_init(&e, &ep, err, sizeof err) ? die("%s", err) : 0;
    if (!bad) bad = draft_options_ok("generate", td_engine_draft(e), &ep, draft_tokens); // auto's
    if (bad) {
        td_engine_free(e);
        free(prompt);
        tok_free(tk);
        return bad;
    }
    int *ids = td_xmalloc((size_t)n * sizeof *ids), rc = 0;
    int stream = tk && !print_ids && n == 1, shown = 0;
    struct tok_stream ts;
    if (stream) tok_stream_init(&ts, tk, 0);
    for (long i = 0; i < n; i++) {
        struct td_request_params rp = {.prompt = prompt,
                                       .n_prompt = n_prompt,
                                       .max_tokens = (int)ro.max_tokens,
                                       .sampling = {(float)ro.temperature, (int)ro.top_k,
                                                    (float)ro.top_p, (uint64_t)(ro.seed + i)},
                                       .ignore_eos = ignore_eos};
        if ((ids[i] = td_engine_submit(e, &rp, err, sizeof err)) < 0) {
            rc = die("%s", err);
            goto done;
        }
    }
    struct timespec t0, t1, tf = {0, 0};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int live;
    long first_out = -1; // tokens out when every completion had its first (the prefills' end)
    while ((live = td_engine_step(e, err, sizeof err)) > 0) {
        if (stream) stream_text(e, ids[0], &ts, &shown);
        if (first_out < 0) first_out = all_started(e, ids, n, &tf);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (stream) stream_finish(e, ids[0], &ts, &shown);
    if (live < 0) {
        rc = die("%s", err);
        goto done;
    }
    for (long i = 0; i < n; i++) {
        const int32_t *toks;
        int nt;
        enum td_req_status st;
        const char *msg;
        td_engine_output(e, ids[i], &toks, &nt, &st, NULL, &msg);
        if (tk && !print_ids && !stream) { // text, one completion after another
            char *out = NULL;
            size_t len = 0;
            if (!tok_decode(tk, toks, (size_t)nt, 0, &out, &len, err, sizeof err))
                printf("%s%.*s\n", i ? "\n" : "", (int)len, out);
            free(out);
        } else if (!stream) {
            for (int j = 0; j < nt; j++)
                printf(j ? " %d" : "%d", toks[j]);
            printf("\n");
        }
        if (st == TD_REQ_FAILED) {
            fprintf(stderr, "tandem: completion %ld failed: %s\n", i, msg);
            rc = 1;
        }
    }
    if (stats) {
        const struct td_engine_stats *s = td_engine_stats(e);
        fprintf(stderr, "stats: backend %s, draft %s (up to %d tokens a round)\n",
                td_engine_backend(e), td_engine_draft(e), td_engine_draft_tokens(e));
        double sec = (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
        fprintf(stderr, "stats: %ld tokens in %.3f s = %.1f tokens/s, %ld steps, %ld rows fed\n",
                s->tokens_out, sec, s->tokens_out / (sec > 0 ? sec : 1e-9), s->steps, s->rows);
        // decode alone: the tokens after every completion's first, over the time after it
        double dsec = (t1.tv_sec - tf.tv_sec) + 1e-9 * (t1.tv_nsec - tf.tv_nsec);
        if (first_out >= 0 && s->tokens_out > first_out && dsec > 0)
            fprintf(stderr,
                    "stats: decode %ld tokens in %.4f s = %.1f tokens/s (after the first token of "
                    "every completion, %.3f s in)\n",
                    s->tokens_out - first_out, dsec, (s->tokens_out - first_out) / dsec,
                    sec - dsec);
        if (s->rounds && td_engine_draft_tokens(e)) { // (speculation's numbers, with a drafter)
            fprintf(stderr,
                    "stats: mean accepted length %.3f (tokens per round incl. bonus), "
                    "acceptance %.3f (%ld of %ld drafts)\n",
                    (double)(s->accepted + s->rounds) / s->rounds,
                    s->drafted ? (double)s->accepted / s->drafted : 0.0, s->accepted, s->drafted);
            fprintf(stderr, "stats: acceptance by draft position:");
            for (int j = 0; j < TD_MAX_DRAFT && s->proposed_at[j]; j++)
                fprintf(stderr, " %d:%.3f", j + 1, (double)s->accepted_at[j] / s->proposed_at[j]);
            fprintf(stderr, "\nstats: conditional acceptance (drafts before all accepted):");
            for (int j = 0; j < TD_MAX_DRAFT && s->reached_at[j]; j++)
                fprintf(stderr, " %d:%.3f", j + 1, (double)s->accepted_at[j] / s->reached_at[j]);
            fprintf(stderr, "\n");
        }
        if (s->steps)
            fprintf(stderr,
                    "stats: per step (host wall time; on a GPU the drafter's device work runs "
                    "before the next step and counts in target): target %.3f ms, verify %.3f "
                    "ms, drafter %.3f ms\n",
                    1e3 * s->t_target / s->steps, 1e3 * s->t_verify / s->steps,
                    1e3 * s->t_draft / s->steps);
        if (s->graphs)
            fprintf(stderr, "stats: %d step graphs captured in %.1f ms\n", s->graphs,
                    1e3 * s->t_capture);
        if (s->nan_rows) fprintf(stderr, "stats: %ld non-finite logits rows\n", s->nan_rows);
    }
done:
    free(ids);
    free(prompt);
    tok_free(tk);
    td_engine_free(e);
    return rc;
}

// ---------------------------------------------------------------------------------------------
// chat: an interactive session in the model's chat format

static int cmd_chat(int argc, char **argv) {
    struct td_engine_params ep = td_engine_defaults();
    ep.draft = "auto";
    const char *system = NULL;
    struct req_opts ro = {256, 0, 0.0, 0, 1.0};
    long draft_tokens = -1;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: tandem chat [--model DIR] [--system TEXT] [--max-tokens N] "
                   "[--temperature T] [--seed S] [--backend B] [drafter options]\n" DRAFT_USAGE
                   "Type a message and Enter; an empty line or end of input ends the session.\n",
                   draft_usage_names());
            return 0;
        }
        if (!v) return die("chat: %s needs a value (see tandem chat --help)", a);
        i++;
        int rc = engine_option(a, v, &ep, &draft_tokens);
        if (!rc) rc = request_option(a, v, &ro);
        if (rc) {
            if (rc < 0) return 2;
            continue;
        }
        if (!strcmp(a, "--system"))
            system = v;
        else
            return die("chat: unknown option '%s' (see tandem chat --help)", a);
    }
    if (!ep.model_dir && !(ep.model_dir = default_model(argv0_g)))
        return die("chat: no model: give --model DIR (models/tandem-tiny was not found)%s", "");
    if (draft_finish("chat", &ep, draft_tokens)) return 2;
    ep.max_seqs = 1;
    char err[1024];
    struct tok *tk;
    struct chat ch;
    struct td_engine *e;
    if (tok_load(&tk, ep.model_dir, err, sizeof err)) return die("%s", err);
    if (chat_init(&ch, tk, err, sizeof err) || td_engine_init(&e, &ep, err, sizeof err)) {
        tok_free(tk);
        return die("%s", err);
    }
    if (draft_options_ok("chat", td_engine_draft(e), &ep, draft_tokens)) { // auto's pick
        td_engine_free(e);
        tok_free(tk);
        return 2;
    }
    struct chat_msg *msgs = NULL;
    char **owned = NULL;
    int n_msgs = 0, rc = 0, turn = 0;
    char line[8192];
    int interactive = isatty(0);
    if (system) {
        msgs = realloc(msgs, sizeof *msgs * (n_msgs + 1));
        msgs[n_msgs++] = (struct chat_msg){CHAT_ROLE_SYSTEM, system};
    }
    for (;;) {
        if (interactive) {
            printf("> ");
            fflush(stdout);
        }
        if (!fgets(line, sizeof line, stdin)) break;
        line[strcspn(line, "\r\n")] = 0;
        if (!line[0]) break;
        owned = realloc(owned, sizeof *owned * (n_msgs + 2));
        msgs = realloc(msgs, sizeof *msgs * (n_msgs + 2));
        owned[n_msgs] = strdup(line);
        msgs[n_msgs] = (struct chat_msg){CHAT_ROLE_USER, owned[n_msgs]};
        n_msgs++;
        struct tok_ids ti = {0};
        if (chat_encode(&ch, msgs, (size_t)n_msgs, 1, &ti, err, sizeof err)) {
            fprintf(stderr, "tandem: %s\n", err);
            n_msgs--;
            free(owned[n_msgs]);
            continue;
        }
        struct td_request_params rp = {.prompt = ti.ids,
                                       .n_prompt = (int)ti.n,
                                       .max_tokens = (int)ro.max_tokens,
                                       .sampling = {(float)ro.temperature, (int)ro.top_k,
                                                    (float)ro.top_p, (uint64_t)(ro.seed + turn++)},
                                       .ignore_eos = 0};
        int id = td_engine_submit(e, &rp, err, sizeof err);
        tok_ids_free(&ti);
        if (id < 0) {
            fprintf(stderr, "tandem: %s\n", err);
            rc = 1;
            break;
        }
        struct tok_stream ts;
        tok_stream_init(&ts, tk, TOK_DECODE_SKIP_SPECIAL);
        int shown = 0, live;
        while ((live = td_engine_step(e, err, sizeof err)) > 0)
            stream_text(e, id, &ts, &shown);
        stream_finish(e, id, &ts, &shown);
        if (live < 0) {
            fprintf(stderr, "tandem: %s\n", err);
            rc = 1;
            break;
        }
        // the reply joins the conversation
        const int32_t *toks;
        int nt;
        td_engine_output(e, id, &toks, &nt, NULL, NULL, NULL);
        char *reply = NULL;
        size_t rl = 0;
        if (tok_decode(tk, toks, (size_t)nt, TOK_DECODE_SKIP_SPECIAL, &reply, &rl, err, sizeof err))
            reply = strdup("");
        owned[n_msgs] = reply;
        msgs[n_msgs] = (struct chat_msg){CHAT_ROLE_ASSISTANT, reply};
        n_msgs++;
    }
    for (int i = 0; i < n_msgs; i++)
        if (msgs[i].role != CHAT_ROLE_SYSTEM) free(owned[i]);
    free(owned);
    free(msgs);
    td_engine_free(e);
    tok_free(tk);
    return rc;
}

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

static int cmd_bench(int argc, char **argv) {
    struct td_engine_params ep = td_engine_defaults();
    const char *prompts_path = NULL;
    struct req_opts ro = {128, 0, 0.0, 0, 1.0};
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
                "  drafter options (default --draft none):\n" DRAFT_USAGE
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
                draft_usage_names());
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
        if (engine_flag(a, &ep)) continue;
        if (!v) return die("bench: %s needs a value (see tandem bench --help)", a);
        i++;
        int rc = engine_option(a, v, &ep, &draft_tokens);
        if (!rc) rc = request_option(a, v, &ro);
        if (rc) {
            if (rc < 0) return 2;
            continue;
        }
        if (!strcmp(a, "--prompts"))
            prompts_path = v;
        else if (!strcmp(a, "--n-prompts"))
            rc = parse_int(a, v, 1, 1 << 20, &n_prompts);
        else if (!strcmp(a, "--batch"))
            rc = parse_int(a, v, 1, 4096, &batch);
        else
            return die("bench: unknown option '%s' (see tandem bench --help)", a);
        if (rc) return 2;
    }
    if (!prompts_path) return die("bench: --prompts FILE.jsonl is required%s", "");
    if (!ep.model_dir && !(ep.model_dir = default_model(argv0_g)))
        return die("bench: no model: give --model DIR (models/tandem-tiny was not found)%s", "");
    if (draft_finish("bench", &ep, draft_tokens)) return 2;
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
            struct chat_msg msg = {CHAT_ROLE_USER, text};
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
    int bad = td_engine_init(&e, &ep, err, sizeof err) ? die("%s", err) : 0;
    if (!bad) bad = draft_options_ok("bench", td_engine_draft(e), &ep, draft_tokens); // auto's pick
    if (bad) {
        for (int i = 0; i < np; i++)
            tok_ids_free(&ids[i]);
        free(ids);
        tok_free(tk);
        td_engine_free(e);
        return bad;
    }
    int *rid = td_xmalloc((size_t)np * sizeof *rid), rc = 0;
    double *ttft = td_xmalloc((size_t)np * sizeof *ttft);
    double *done_t = td_xmalloc((size_t)np * sizeof *done_t);
    long prompt_tokens = 0;
    double t0 = now_s();
    for (int i = 0; i < np; i++) {
        struct td_request_params rp = {.prompt = ids[i].ids,
                                       .n_prompt = (int)ids[i].n,
                                       .max_tokens = (int)ro.max_tokens,
                                       .sampling = {(float)ro.temperature, (int)ro.top_k,
                                                    (float)ro.top_p, (uint64_t)(ro.seed + i)},
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
            "requests_per_s,ttft_p50,ttft_p90,latency_p50,latency_p90,mean_accepted_length\n");
        printf("%s,%s,%s,%d,%d,%ld,%ld,%ld,%.3f,%.1f,%.3f,%.4f,%.4f,%.4f,%.4f,%.3f\n", ep.model_dir,
               td_engine_backend(e), td_engine_draft(e), td_engine_draft_tokens(e), np, batch,
               prompt_tokens, s->tokens_out, wall, s->tokens_out / wall, np / wall, ttft[np / 2],
               ttft[np * 9 / 10], done_t[np / 2], done_t[np * 9 / 10], mal);
    } else {
        printf("bench: %s on %s, draft %s k=%d, %d prompts (%ld tokens), batch %ld\n", ep.model_dir,
               td_engine_backend(e), td_engine_draft(e), td_engine_draft_tokens(e), np,
               prompt_tokens, batch);
        printf("bench: %ld output tokens in %.3f s = %.1f tokens/s, %.2f requests/s, %ld steps\n",
               s->tokens_out, wall, s->tokens_out / wall, np / wall, s->steps);
        printf(
            "bench: time to first token p50 %.3f s p90 %.3f s; to the last p50 %.3f s p90 %.3f s\n",
            ttft[np / 2], ttft[np * 9 / 10], done_t[np / 2], done_t[np * 9 / 10]);
        if (s->rounds && td_engine_draft_tokens(e)) {
            printf("bench: mean accepted length %.3f, acceptance by draft position:", mal);
            for (int j = 0; j < TD_MAX_DRAFT && s->proposed_at[j]; j++)
                printf(" %d:%.3f", j + 1, (double)s->accepted_at[j] / s->proposed_at[j]);
            printf("\n");
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
            "  --dspark-dir DIR, --dspark-threshold C, --max-batch-tokens N, --max-ctx N,\n"
            "  --max-seqs N, --temperature T, --top-k K, --top-p P, --max-tokens N,\n"
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
            if (!v) return die("serve: --set needs SECTION.KEY=VALUE%s", "");
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
        const char *d = default_model(argv0_g);
        if (!d)
            return die("serve: no model: set model.path (models/tandem-tiny was not found)%s", "");
        snprintf(c.path, sizeof c.path, "%s", d);
    }
    // the drafter options as generate checks them (auto stays auto: the engine picks when it loads)
    struct td_engine_params ep = td_engine_defaults();
    ep.model_dir = c.path;
    ep.backend = c.backend;
    ep.draft = c.method;
    ep.dspark_dir = c.dspark_dir[0] ? c.dspark_dir : NULL;
    ep.dspark_threshold = (float)c.confidence_min;
    ep.max_batch_tokens = c.max_batch_tokens;
    if (draft_finish("serve", &ep, c.k)) return 2;
    c.k = ep.max_draft;
    c.max_batch_tokens = ep.max_batch_tokens;
    if (print) {
        char *ini = srv_config_ini(&c);
        fputs(ini ? ini : "", stdout);
        free(ini);
        return 0;
    }
    return srv_run(&c);
}

int main(int argc, char **argv) {
    argv0_g = argv[0];
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
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
