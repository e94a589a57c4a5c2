/* main.c: the tandem command line.
 *
 *   tandem logits --model DIR --ids FILE --out OUT.npy [--chunks 37,1,1,64,...]
 *
 * Build: make. Every subcommand validates its arguments first and exits non-zero with a
 * one-line message on bad input.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/forward.h"
#include "engine/model.h"
#include "engine/npy.h"
#include "engine/state.h"
#include "metadata/plan.h"

static void usage(FILE *fp) {
    fprintf(fp,
            "usage: tandem <command> [options]\n"
            "\n"
            "commands:\n"
            "  logits   run the reference forward and write every position's logits\n"
            "\n"
            "tandem logits --model DIR --ids FILE --out OUT.npy [--chunks N,N,...]\n"
            "  --model DIR     model directory: config.json + model.safetensors (or shards with\n"
            "                  model.safetensors.index.json), HF or upstream DeepSeek layout\n"
            "  --ids FILE      whitespace-separated token ids, each in [0, vocab_size)\n"
            "  --out OUT.npy   float32 little-endian C-order array [n_ids, vocab_size]\n"
            "  --chunks LIST   feed the ids as successive forward calls of these sizes\n"
            "                  (positive, summing to n_ids; default: one call)\n");
}

static int die(const char *fmt, const char *a) {
    fprintf(stderr, "tandem: ");
    fprintf(stderr, fmt, a);
    fprintf(stderr, "\n");
    return 2;
}

/* whitespace-separated non-negative integers; -1 with message on anything else */
static int read_ids(const char *path, int32_t **out, int *n_out, char *err, size_t errlen) {
    FILE *fp = fopen(path, "r");
    if (!fp) {
        snprintf(err, errlen, "cannot open ids file %s: %s", path, strerror(errno));
        return -1;
    }
    int cap = 1024, n = 0;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    char tok[64];
    int rc = 0;
    while (fscanf(fp, "%63s", tok) == 1) {
        char *end;
        errno = 0;
        long v = strtol(tok, &end, 10);
        if (*end || errno || v < 0 || v > INT32_MAX) {
            snprintf(err, errlen, "%s: '%s' (item %d) is not a token id", path, tok, n + 1);
            rc = -1;
            break;
        }
        if (n == cap) ids = realloc(ids, (size_t)(cap *= 2) * sizeof *ids);
        ids[n++] = (int32_t)v;
    }
    fclose(fp);
    if (!rc && n == 0) {
        snprintf(err, errlen, "%s holds no token ids", path);
        rc = -1;
    }
    if (rc) {
        free(ids);
        return -1;
    }
    *out = ids;
    *n_out = n;
    return 0;
}

/* "37,1,1,64" -> sizes; each > 0, sum == n_ids */
static int parse_chunks(const char *s, int n_ids, int **out, int *n_out, char *err,
                        size_t errlen) {
    int *c = malloc((strlen(s) / 2 + 2) * sizeof *c), n = 0;
    long sum = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v <= 0 || v > INT32_MAX || (*end && *end != ',')) {
            snprintf(err, errlen, "--chunks '%s': sizes must be positive integers separated by "
                                  "commas", s);
            free(c);
            return -1;
        }
        c[n++] = (int)v;
        sum += v;
        p = *end ? end + 1 : end;
        if (*end == ',' && !*p) {
            snprintf(err, errlen, "--chunks '%s': trailing comma", s);
            free(c);
            return -1;
        }
    }
    if (n == 0 || sum != n_ids) {
        snprintf(err, errlen, "--chunks '%s' sums to %ld, but the ids file holds %d ids", s, sum,
                 n_ids);
        free(c);
        return -1;
    }
    *out = c;
    *n_out = n;
    return 0;
}

static int cmd_logits(int argc, char **argv) {
    const char *model_dir = NULL, *ids_path = NULL, *out_path = NULL, *chunks_arg = NULL;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        const char **dst = !strcmp(a, "--model")    ? &model_dir
                           : !strcmp(a, "--ids")    ? &ids_path
                           : !strcmp(a, "--out")    ? &out_path
                           : !strcmp(a, "--chunks") ? &chunks_arg
                                                    : NULL;
        if (!dst) return die("logits: unknown option '%s' (see tandem logits --help)", a);
        if (i + 1 >= argc) return die("logits: %s needs a value", a);
        *dst = argv[++i];
    }
    if (!model_dir) return die("logits: --model DIR is required%s", "");
    if (!ids_path) return die("logits: --ids FILE is required%s", "");
    if (!out_path) return die("logits: --out OUT.npy is required%s", "");

    char err[1024];
    int32_t *ids = NULL;
    int n_ids = 0, *chunks = NULL, n_chunks = 0, rc = 1;
    struct td_model m;
    struct td_state st = {0};
    float *logits = NULL;
    if (read_ids(ids_path, &ids, &n_ids, err, sizeof err)) return die("%s", err);
    if (chunks_arg && parse_chunks(chunks_arg, n_ids, &chunks, &n_chunks, err, sizeof err)) {
        free(ids);
        return die("%s", err);
    }
    if (!chunks) {
        chunks = malloc(sizeof *chunks);
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
    int max_chunk = 16;
    for (int i = 0; i < n_chunks; i++) max_chunk = chunks[i] > max_chunk ? chunks[i] : max_chunk;
    if (td_state_init(&st, &m.cfg, 1, n_ids, max_chunk, (size_t)8 << 30, err, sizeof err))
        goto done;
    logits = malloc((size_t)n_ids * m.cfg.vocab * sizeof(float));
    if (!logits) {
        snprintf(err, sizeof err, "out of memory for %d x %d logits", n_ids, m.cfg.vocab);
        goto done;
    }
    int slot = td_state_seq_alloc(&st), pos = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < n_chunks; i++) {
        struct td_plan_seq q = {slot, pos, chunks[i], ids + pos};
        if (td_forward_seqs(&m, &st, &q, 1, logits + (size_t)pos * m.cfg.vocab, NULL, err,
                            sizeof err))
            goto done;
        pos += chunks[i];
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (npy_write_f32(out_path, logits, n_ids, m.cfg.vocab, err, sizeof err)) goto done;
    double s = (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
    fprintf(stderr, "tandem: %d positions in %d call(s), %.3f s (%.1f tokens/s), wrote %s\n",
            n_ids, n_chunks, s, n_ids / s, out_path);
    rc = 0;
done:
    if (rc) fprintf(stderr, "tandem: %s\n", err);
    free(logits);
    free(ids);
    free(chunks);
    td_state_free(&st);
    td_model_free(&m);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "logits")) return cmd_logits(argc - 2, argv + 2);
    fprintf(stderr, "tandem: unknown command '%s' (see tandem --help)\n", argv[1]);
    return 2;
}
