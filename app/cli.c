/* cli.c: what the subcommands share (cli.h): tandem's usage, token-id lists, number options,
 * the default model, and the engine, request and drafter options of generate, chat, bench and
 * serve. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "app/cli.h"
#include "model/comm.h"
#include "draft/drafter.h"
#include "engine/engine.h"
#include "kernels/err.h"
#include "model/fileio.h"

const char *cli_draft_usage_names(void) {
    static char names[128];
    draft_names_join(names, sizeof names, " | ", " | ");
    return names;
}

void cli_usage(FILE *fp) {
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
        "tandem generate [--model DIR] (\"TEXT\" | --prompt-file F | --prompt-ids \"1 2 3\" |\n"
        "                --prompt-ids-file F) [options]\n"
        "  --model DIR            default: models/tandem-tiny (here, or beside the binary)\n"
        "  TEXT, --prompt TEXT    a text prompt, encoded with DIR/tokenizer.json; the output is\n"
        "                         text (streamed for one completion) unless --print-ids\n"
        "  --prompt-file F        the text prompt read from file F (- : standard input)\n"
        "  --max-tokens N         tokens to generate per completion (default 64, >= 1)\n"
        "  --temperature T        0 = greedy (default 0), else sampled; >= 0\n"
        "  --top-k K              keep the K most likely tokens (default 0 = off)\n"
        "  --top-p P              nucleus mass in (0, 1] (default 1 = off)\n"
        "  --seed S               seed of completion 0; completion i uses S + i (default 0)\n"
        "  --n N                  independent completions decoded together (default "
        "1)\n"
        "  --ranks N              split the model's experts over N processes of this host\n"
        "                         (N divides the routed experts; the CPU backend): the same\n"
        "                         tokens, each rank holding a part of every MoE layer\n"
        "  --gpus N               the same split over N GPUs of this host, one process each,\n"
        "                         their experts summed by NCCL (the cuda backend)\n" CLI_DRAFT_USAGE
        "  --synthetic-acceptance P1,P2,...  LOSSY, for measurements: draft j is accepted with\n"
        "                         probability Pj whatever the target says (the output is not\n"
        "                         the model's; every stats line says so)\n"
        "  --print-ids            one line of generated ids per completion, nothing else\n"
        "  --stats                tokens/s, steps, mean accepted length, per-position\n"
        "                         acceptance and time per step (target, verify, drafter)\n"
        "                         to stderr\n"
        "  --ignore-eos           do not stop at EOS tokens\n"
        "  --max-batch-tokens N   rows per forward step (default: 256, or with MTP or DSpark\n"
        "                         a full round of every sequence, --n x (1 + drafts), if more)\n"
        "  --prefill-chunk N      prompt rows a step takes at most (default 0: no cap)\n"
        "  --prefix-blocks N      prefix cache of up to N blocks of 256 tokens (prompts' and\n"
        "                         replies', and what a finished request committed past its\n"
        "                         last full block; default 0: off): a prompt that begins with\n"
        "                         cached blocks prefills only the rest (with mtp or dspark at\n"
        "                         least their window of 128 tokens)\n"
        "  --history-blocks N     the compressed history's pool: N blocks of 256 tokens (default\n"
        "                         0: --n x max-ctx / 256); a request waits for the blocks its\n"
        "                         prompt and --max-tokens reach\n"
        "  --max-ctx N            tokens per sequence (default 4096, capped by the model)\n"
        "  --kv-dtype T           key caches in fp32 (default) | bf16 | fp8 (e4m3, per-64 scales)\n"
        "  --backend B            auto | cpu | cuda | cuda:N (GPU N; default auto: cuda, GPU\n"
        "                         0, when a GPU is usable)\n"
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
        cli_draft_usage_names());
}

/* more token ids than any context holds: a list this long is a mistake, refused as it is read */
#define MAX_IDS (1 << 24)

int cli_scan_ids(FILE *fp, const char *what, int32_t **out, int *n_out, char *err, size_t errlen) {
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

int cli_read_ids(const char *path, int32_t **out, int *n_out, char *err, size_t errlen) {
    FILE *fp = fopen(path, "r");
    if (!fp) return td_errf(err, errlen, "cannot open ids file %s: %s", path, strerror(errno));
    int rc = cli_scan_ids(fp, path, out, n_out, err, errlen);
    fclose(fp);
    return rc;
}

#define READ_MAX (256 << 20) /* bytes of text a file gives (tokenizing them: about 10 s) */

char *cli_read_text(const char *path, size_t *n, char *err, size_t errlen) {
    FILE *fp = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!fp) {
        td_errf(err, errlen, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    // a pipe or FIFO is fine (process substitution), endless input is not: /dev/zero is refused
    // at READ_MAX instead of reading until memory runs out
    size_t cap = 1 << 16, len = 0, k;
    char *buf = malloc(cap);
    while (buf && (k = fread(buf + len, 1, cap - 1 - len, fp)) > 0) { // (room for the 0)
        len += k;
        if (len >= READ_MAX) {
            free(buf);
            if (fp != stdin) fclose(fp);
            td_errf(err, errlen, "%s: more than %d MiB of text", path, READ_MAX >> 20);
            return NULL;
        }
        if (len == cap - 1) {
            char *p = realloc(buf, cap *= 2);
            if (!p) free(buf);
            buf = p;
        }
    }
    int bad_read = ferror(fp);
    if (fp != stdin) fclose(fp);
    if (!buf || bad_read) {
        free(buf);
        td_errf(err, errlen, "cannot read %s", path);
        return NULL;
    }
    buf[len] = 0;
    *n = len;
    return buf;
}

int cli_parse_int(const char *flag, const char *v, long lo, long hi, long *out) {
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

int cli_parse_float(const char *flag, const char *v, double lo, double hi, double *out) {
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

const char *cli_default_model(const char *argv0) {
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

const char *cli_argv0 = "tandem";
int cli_argc;
char **cli_argv;

#define CLI_MAX_RANKS 64

/* fd with its close-on-exec flag cleared (a follower's end of its socket survives the exec) */
static int fcntl_keep(int fd) {
    int fl = fcntl(fd, F_GETFD);
    if (fl >= 0) fcntl(fd, F_SETFD, fl & ~FD_CLOEXEC);
    return fd;
}

/* --ranks and --gpus as given (0: absent) against each other, the build, the host and backend */
static int ranks_options(const char *cmd, long ranks, long gpus, const char *backend, char *err,
                         size_t errlen) {
    if (ranks > 1 && gpus)
        return td_errf(err, errlen,
                       "%s: --ranks %ld and --gpus %ld: one of them (--gpus splits over GPUs, "
                       "--ranks over CPU processes)",
                       cmd, ranks, gpus);
#ifndef TD_HAVE_CUDA
    if (gpus)
        return td_errf(err, errlen, "%s: --gpus %ld: this build has no CUDA (nvcc was not found)",
                       cmd, gpus);
#endif
    if (gpus && !td_comm_nccl_version())
        return td_errf(err, errlen,
                       "%s: --gpus %ld: this build has no NCCL (make found no nccl.h: pip's "
                       "nvidia-nccl-cu13, or make NCCL_HOME=DIR)",
                       cmd, gpus);
    int have = gpus ? td_engine_gpus() : 0;
    if (gpus > have)
        return td_errf(err, errlen, "%s: --gpus %ld: this host shows %d GPU%s", cmd, gpus, have,
                       have == 1 ? "" : "s");
    if (gpus && backend && strcmp(backend, "cuda") && strcmp(backend, "auto"))
        return td_errf(err, errlen,
                       "%s: --gpus %ld runs rank r on GPU r (the cuda backend), not --backend %s",
                       cmd, gpus, backend);
    return 0;
}

int cli_ranks_start(struct cli_ranks *rk, const char *cmd, long ranks, long gpus,
                    const char *backend, int *follower, char *err, size_t errlen) {
    long n = gpus ? gpus : ranks;
    memset(rk, 0, sizeof *rk);
    *follower = 0;
    static struct td_comm comm;
    const char *eg = getenv("TANDEM_GPUS");
    rk->gpus = eg ? atoi(eg) != 0 : gpus;
    const char *er = getenv("TANDEM_RANK"), *ew = getenv("TANDEM_WORLD"),
               *ef = getenv("TANDEM_COMM_FD");
    if (er) { // a follower: its leader's socket
        int r = atoi(er), w = ew ? atoi(ew) : 0, fd = ef ? atoi(ef) : -1;
        if (r < 1 || w < 2 || r >= w || fd < 0)
            return td_errf(err, errlen,
                           "ranks: TANDEM_RANK %s of TANDEM_WORLD %s with TANDEM_COMM_FD %s: a "
                           "follower is started by its leader (--ranks N)",
                           er, ew ? ew : "(unset)", ef ? ef : "(unset)");
        prctl(PR_SET_PDEATHSIG, SIGTERM); // (and its socket closes when the leader ends)
        // a terminal's Ctrl-C reaches the whole process group: the leader decides (a server
        // drains its requests, which still need this rank), and its end ends this one
        signal(SIGINT, SIG_IGN);
        if (td_comm_sockets(&comm, r, w, &fd, 0.0, err, errlen)) return -1;
        rk->comm = &comm, rk->active = 1, rk->world = w;
        snprintf(rk->backend, sizeof rk->backend, "cuda:%d", r);
        *follower = 1;
        return 0;
    }
    if (ranks_options(cmd, ranks, gpus, backend, err, errlen)) return -1;
    snprintf(rk->backend, sizeof rk->backend, "cuda:0");
    if (n <= 1 && gpus) { // one rank, the split path over NCCL on GPU 0
        td_comm_self(&comm);
        rk->comm = &comm, rk->world = 1;
        return 0;
    }
    if (n <= 1) return 0;
    if (n > CLI_MAX_RANKS)
        return td_errf(err, errlen, "ranks: %ld ranks, at most %d", n, CLI_MAX_RANKS);
    int fds[CLI_MAX_RANKS];
    for (int q = 1; q < n; q++) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv))
            return td_errf(err, errlen, "ranks: socketpair: %s", strerror(errno));
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0) return td_errf(err, errlen, "ranks: fork: %s", strerror(errno));
        if (!pid) { // the follower: this command line again, its end of the socket kept open
            int fd = fcntl_keep(sv[1]);
            char rank[16], world[24], fdv[16];
            snprintf(rank, sizeof rank, "%d", q), snprintf(world, sizeof world, "%ld", n);
            snprintf(fdv, sizeof fdv, "%d", fd);
            setenv("TANDEM_RANK", rank, 1), setenv("TANDEM_WORLD", world, 1);
            setenv("TANDEM_COMM_FD", fdv, 1);
            if (gpus) setenv("TANDEM_GPUS", "1", 1);
            execv("/proc/self/exe", cli_argv);
            fprintf(stderr, "tandem: ranks: exec: %s\n", strerror(errno));
            _exit(127);
        }
        close(sv[1]);
        fds[q] = sv[0];
        rk->pid[q] = (int)pid;
    }
    if (td_comm_sockets(&comm, 0, (int)n, fds, 0.0, err, errlen)) return -1;
    rk->comm = &comm, rk->active = 1, rk->world = (int)n;
    return 0;
}

void cli_ranks_params(const struct cli_ranks *rk, struct td_engine_params *ep) {
    ep->comm = rk->comm;
    if (!rk->gpus) return;
    ep->backend = rk->backend;
    ep->nccl = 1;
}

int cli_ranks_finish(struct cli_ranks *rk) {
    if (!rk->active) return 0;
    int rc = 0;
    td_comm_sockets_free(rk->comm); // (a follower still following reads the end of its socket)
    for (int q = 1; q < rk->world && rk->pid[q]; q++) {
        int st = 0;
        while (waitpid(rk->pid[q], &st, 0) < 0 && errno == EINTR) {
        }
        if (!WIFEXITED(st) || WEXITSTATUS(st)) {
            if (WIFSIGNALED(st))
                fprintf(stderr, "tandem: rank %d ended by signal %d\n", q, WTERMSIG(st));
            else
                fprintf(stderr, "tandem: rank %d exited with %d\n", q, WEXITSTATUS(st));
            rc = 1;
        }
    }
    rk->active = 0;
    return rc;
}

int cli_ranks_follow(struct td_engine_params *ep) {
    char err[1024];
    struct td_engine *e;
    if (td_engine_init(&e, ep, err, sizeof err)) {
        fprintf(stderr, "tandem: rank %d: %s\n", ep->comm->rank, err);
        return 1;
    }
    const char *dies = getenv("TD_TEST_RANK_DIES"); // test seam: this rank ends after start-up
    if (dies && atoi(dies) == ep->comm->rank) _exit(3);
    int rc = td_engine_follow(e, err, sizeof err);
    if (rc) fprintf(stderr, "tandem: rank %d: %s\n", ep->comm->rank, err);
    td_engine_free(e);
    return rc ? 1 : 0;
}

int cli_value_option(const char *cmd, const char *a, const char *v, struct td_engine_params *ep,
                     long *draft_tokens, struct cli_req_opts *ro) {
    if (!v) {
        die("%s: %s needs a value (see tandem %s --help)", cmd, a, cmd);
        return -1;
    }
    int rc = cli_engine_option(a, v, ep, draft_tokens);
    if (!rc && ro) rc = cli_request_option(a, v, ro);
    return rc;
}

int cli_engine_option(const char *a, const char *v, struct td_engine_params *ep,
                      long *draft_tokens) {
    struct {
        const char *flag, **dst;
    } str[] = {{.flag = "--model", .dst = &ep->model_dir},
               {.flag = "--backend", .dst = &ep->backend},
               {.flag = "--draft", .dst = &ep->draft},
               {.flag = "--dspark-dir", .dst = &ep->dspark_dir}};
    for (size_t k = 0; k < sizeof str / sizeof *str; k++)
        if (!strcmp(a, str[k].flag)) return *str[k].dst = v, 1;
    if (!strcmp(a, "--draft-tokens"))
        return cli_parse_int(a, v, 1, TD_MAX_DRAFT, draft_tokens) ? -1 : 1;
    if (!strcmp(a, "--draft-policy")) {
        if (!strcmp(v, "adaptive") || !strcmp(v, "fixed"))
            return ep->draft_policy = strcmp(v, "fixed") ? TD_POLICY_ADAPTIVE : TD_POLICY_FIXED, 1;
        fprintf(stderr, "tandem: --draft-policy '%s': expected adaptive or fixed\n", v);
        return -1;
    }
    if (!strcmp(a, "--synthetic-acceptance")) { // p1,p2,...: one rate a draft position
        const char *q = v;
        ep->n_synthetic = 0;
        while (*q) {
            char *end;
            double x = strtod(q, &end);
            if (end == q || !(x >= 0 && x <= 1) || (*end && *end != ',') ||
                ep->n_synthetic == TD_MAX_DRAFT) {
                fprintf(stderr,
                        "tandem: --synthetic-acceptance '%s': expected up to %d rates in [0, 1], "
                        "comma-separated (draft positions 1, 2, ...)\n",
                        v, TD_MAX_DRAFT);
                return -1;
            }
            ep->synthetic_accept[ep->n_synthetic++] = (float)x;
            q = *end ? end + 1 : end;
        }
        if (!ep->n_synthetic) {
            fprintf(stderr, "tandem: --synthetic-acceptance needs at least one rate\n");
            return -1;
        }
        return 1;
    }
    if (!strcmp(a, "--dspark-threshold")) {
        double t;
        if (cli_parse_float(a, v, 0, 0.999999, &t)) return -1;
        ep->dspark_threshold = (float)t;
        return 1;
    }
    long lv;
    if (!strcmp(a, "--max-batch-tokens")) {
        if (cli_parse_int(a, v, 1, 1 << 20, &lv)) return -1;
        ep->max_batch_tokens = (int)lv;
        return 1;
    }
    if (!strcmp(a, "--prefill-chunk")) {
        if (cli_parse_int(a, v, 0, 1 << 20, &lv)) return -1;
        ep->prefill_chunk = (int)lv;
        return 1;
    }
    if (!strcmp(a, "--prefix-blocks")) {
        if (cli_parse_int(a, v, 0, 1 << 24, &lv)) return -1;
        ep->prefix_blocks = (int)lv;
        return 1;
    }
    if (!strcmp(a, "--history-blocks")) {
        if (cli_parse_int(a, v, 0, 1 << 24, &lv)) return -1;
        ep->history_blocks = (int)lv;
        return 1;
    }
    if (!strcmp(a, "--max-ctx")) {
        if (cli_parse_int(a, v, 2, 1 << 24, &lv)) return -1;
        ep->max_ctx = (int)lv;
        return 1;
    }
    if (!strcmp(a, "--kv-dtype")) {
        if ((ep->kv_dtype = td_engine_kv_dtype_parse(v)) < 0) {
            fprintf(stderr, "tandem: --kv-dtype '%s': expected fp32, bf16 or fp8\n", v ? v : "");
            return -1;
        }
        return 1;
    }
    return 0;
}

int cli_request_option(const char *a, const char *v, struct cli_req_opts *r) {
    int rc;
    if (!strcmp(a, "--max-tokens"))
        rc = cli_parse_int(a, v, 1, 1 << 24, &r->max_tokens);
    else if (!strcmp(a, "--temperature"))
        rc = cli_parse_float(a, v, 0, 1e6, &r->temperature);
    else if (!strcmp(a, "--seed"))
        rc = cli_parse_int(a, v, 0, LONG_MAX, &r->seed);
    else if (!strcmp(a, "--top-k"))
        rc = cli_parse_int(a, v, 0, INT32_MAX, &r->top_k);
    else if (!strcmp(a, "--top-p"))
        rc = cli_parse_float(a, v, 1e-9, 1, &r->top_p);
    else
        return 0;
    return rc ? -1 : 1;
}

int cli_engine_flag(const char *a, struct td_engine_params *ep) {
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

int cli_draft_options_ok(const char *cmd, const char *name, const struct td_engine_params *ep,
                         long draft_tokens) {
    const struct draft_info *di = draft_lookup(name, NULL, 0);
    if (!di) {
        char names[128];
        draft_names_join(names, sizeof names, ", ", " or ");
        fprintf(stderr, "tandem: %s: --draft '%s': expected %s\n", cmd, name, names);
        return 2;
    }
    if (ep->n_synthetic && strcmp(cmd, "generate") && strcmp(cmd, "bench")) {
        fprintf(stderr,
                "tandem: %s: --synthetic-acceptance is for generate and bench (it is "
                "lossy: the output is not the model's)\n",
                cmd);
        return 2;
    }
    if (di->kind == DRAFT_KIND_AUTO) return 0;
    if (di->kind == DRAFT_KIND_NONE && (draft_tokens > 0 || ep->n_synthetic)) {
        fprintf(stderr, "tandem: %s: %s needs a drafter (--draft ...)\n", cmd,
                draft_tokens > 0 ? "--draft-tokens" : "--synthetic-acceptance");
        return 2;
    }
    if (di->kind != DRAFT_KIND_DSPARK && (ep->dspark_threshold > 0.0f || ep->dspark_dir)) {
        fprintf(stderr, "tandem: %s: --dspark-threshold and --dspark-dir need --draft dspark\n",
                cmd);
        return 2;
    }
    return 0;
}

int cli_draft_finish(const char *cmd, struct td_engine_params *ep, long draft_tokens) {
    if (cli_draft_options_ok(cmd, ep->draft, ep, draft_tokens)) return 2;
    const struct draft_info *di = draft_lookup(ep->draft, NULL, 0);
    ep->max_draft = di->kind == DRAFT_KIND_NONE ? 0
                    : draft_tokens > 0          ? (int)draft_tokens
                                                : di->default_tokens;
    if (ep->max_batch_tokens && ep->max_batch_tokens < 1 + ep->max_draft)
        ep->max_batch_tokens = 1 + ep->max_draft;
    return 0;
}

void cli_print_policy(FILE *fp, const char *prefix, const struct td_engine_params *ep,
                      const struct td_engine_stats *s) {
    fprintf(fp,
            "%s: draft policy %s; drafts verified a step (offered), by decoding sequences:", prefix,
            ep->draft_policy == TD_POLICY_FIXED ? "fixed" : "adaptive");
    for (int b = 0; b < TD_BATCH_BUCKETS; b++)
        if (s->batch_steps[b])
            fprintf(fp, " %s%d: %.2f (%.2f)", b ? "<=" : "", 1 << b,
                    (double)s->batch_drafts[b] / s->batch_steps[b],
                    (double)s->batch_wanted[b] / s->batch_steps[b]);
    fprintf(fp, "\n");
}

void cli_print_synthetic(FILE *fp, const char *cmd, const struct td_engine_params *ep) {
    if (!ep->n_synthetic) return;
    fprintf(fp, "tandem: %s: --synthetic-acceptance", cmd);
    for (int j = 0; j < ep->n_synthetic; j++)
        fprintf(fp, "%c%g", j ? ',' : ' ', ep->synthetic_accept[j]);
    fprintf(fp, ": drafts are accepted at these rates whatever the target says; the output is "
                "LOSSY, not the model's\n");
}
