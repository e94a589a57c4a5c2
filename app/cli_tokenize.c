/* cli_tokenize.c: `tandem tokenize` and `tandem detokenize` (see cli.h).
 *
 *   tandem tokenize --model DIR --text "Hello world"      -> 15496 995
 *   tandem tokenize --model DIR --file notes.txt          (--file - reads stdin)
 *   tandem detokenize --model DIR --ids "15496 995"       -> Hello world
 *
 * tokenize prints exactly HF's Tokenizer.encode(text).ids (post-processor included; --no-special
 * leaves it out). Input that is not UTF-8 is refused with the offset of the first bad byte, as
 * HF's Python API cannot take it either. detokenize prints special tokens as their text unless
 * --skip-special, and refuses ids that name no token.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/cli.h"
#include "kernels/err.h"
#include "tokenizer/tokenizer.h"

static int usage_tokenize(FILE *fp) {
    fprintf(fp, "usage: tandem tokenize --model DIR (--text T | --file F) [--no-special]\n"
                "  --model DIR     directory with tokenizer.json (and tokenizer_config.json)\n"
                "  --text T        the text to encode\n"
                "  --file F        encode the bytes of file F (- for stdin); UTF-8 only\n"
                "  --no-special    leave out the post-processor's tokens (e.g. BOS)\n"
                "prints the ids, space-separated, on one line\n");
    return fp == stdout ? 0 : 2;
}

static int usage_detokenize(FILE *fp) {
    fprintf(fp, "usage: tandem detokenize --model DIR --ids \"1 2 3\" [--skip-special]\n"
                "  --model DIR     directory with tokenizer.json\n"
                "  --ids LIST      token ids separated by spaces or commas\n"
                "  --skip-special  drop special tokens instead of printing their text\n"
                "writes the decoded text to stdout, nothing added\n");
    return fp == stdout ? 0 : 2;
}

static int bad(const char *cmd, const char *fmt, const char *a) {
    fprintf(stderr, "tandem: %s: ", cmd);
    fprintf(stderr, fmt, a);
    fputc('\n', stderr);
    return 2;
}

/* options: --model V, --text V, --file V, --ids V and the given flag; 0 or an exit status */
struct opts {
    const char *model, *text, *file, *ids;
    int flag;
};

static int parse(const char *cmd, int argc, char **argv, const char *flag, const char *valued,
                 struct opts *o, int (*usage)(FILE *)) {
    memset(o, 0, sizeof *o);
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage(stdout) + 256;
        if (!strcmp(a, flag)) {
            o->flag = 1;
            continue;
        }
        const char **dst = !strcmp(a, "--model")                         ? &o->model
                           : !strcmp(a, "--text") && strstr(valued, "t") ? &o->text
                           : !strcmp(a, "--file") && strstr(valued, "f") ? &o->file
                           : !strcmp(a, "--ids") && strstr(valued, "i")  ? &o->ids
                                                                         : NULL;
        if (!dst) {
            fprintf(stderr, "tandem: %s: unknown option '%s' (see tandem %s --help)\n", cmd, a,
                    cmd);
            return 2;
        }
        if (i + 1 >= argc) return bad(cmd, "%s needs a value", a);
        *dst = argv[++i];
    }
    if (!o->model) return bad(cmd, "--model DIR is required%s", "");
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    struct opts o;
    int rc = parse("tokenize", argc, argv, "--no-special", "tf", &o, usage_tokenize);
    if (rc) return rc > 255 ? rc - 256 : rc;
    if (!o.text == !o.file)
        return bad("tokenize", "give exactly one of --text T and --file F%s", "");
    char err[1024];
    struct tok *t;
    if (tok_load(&t, o.model, err, sizeof err)) {
        fprintf(stderr, "tandem: tokenize: %s\n", err);
        return 1;
    }
    size_t n = 0;
    char *owned = NULL;
    const char *text = o.text;
    if (o.file) {
        if (!(owned = cli_read_text(o.file, &n, err, sizeof err))) {
            fprintf(stderr, "tandem: tokenize: %s\n", err);
            tok_free(t);
            return 1;
        }
        text = owned;
    } else {
        n = strlen(text);
    }
    struct tok_ids ids = {0};
    rc = 0;
    if (tok_encode(t, text, n, o.flag ? 0 : TOK_ENCODE_ADD_SPECIAL, &ids, err, sizeof err)) {
        fprintf(stderr, "tandem: tokenize: %s: %s\n", o.file ? o.file : "--text", err);
        rc = 1;
    } else {
        for (size_t i = 0; i < ids.n; i++)
            printf(i ? " %d" : "%d", ids.ids[i]);
        putchar('\n');
        if (fflush(stdout)) rc = 1;
    }
    tok_ids_free(&ids);
    free(owned);
    tok_free(t);
    return rc;
}

int cmd_detokenize(int argc, char **argv) {
    struct opts o;
    int rc = parse("detokenize", argc, argv, "--skip-special", "i", &o, usage_detokenize);
    if (rc) return rc > 255 ? rc - 256 : rc;
    if (!o.ids) return bad("detokenize", "--ids LIST is required%s", "");
    // parse first, so that a typo is reported before the model is loaded
    struct tok_ids ids = {0};
    for (const char *p = o.ids; *p;) {
        if (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n') {
            p++;
            continue;
        }
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT_MAX ||
            (*end && *end != ' ' && *end != ',' && *end != '\t' && *end != '\n')) {
            tok_ids_free(&ids);
            return bad("detokenize", "--ids: '%s' is not a list of token ids", o.ids);
        }
        if (tok_ids_push(&ids, (int32_t)v)) {
            tok_ids_free(&ids);
            return bad("detokenize", "out of memory%s", "");
        }
        p = end;
    }
    char err[1024];
    struct tok *t;
    if (tok_load(&t, o.model, err, sizeof err)) {
        fprintf(stderr, "tandem: detokenize: %s\n", err);
        tok_ids_free(&ids);
        return 1;
    }
    char *text;
    size_t n;
    rc = 0;
    if (tok_decode(t, ids.ids, ids.n, o.flag ? TOK_DECODE_SKIP_SPECIAL : 0, &text, &n, err,
                   sizeof err)) {
        fprintf(stderr, "tandem: detokenize: %s\n", err);
        rc = 1;
    } else {
        if (fwrite(text, 1, n, stdout) != n || fflush(stdout)) rc = 1;
        free(text);
    }
    tok_ids_free(&ids);
    tok_free(t);
    return rc;
}
