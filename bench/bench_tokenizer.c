/* bench_tokenizer.c: encode speed of the tokenizer on one core, in MB/s of input text.
 *
 *   make build/libtandem.a && cc -O2 -I. -o build/bench_tokenizer bench/bench_tokenizer.c \
 *       build/libtandem.a -ljansson -lpcre2-8 -lutf8proc -lm
 *   build/bench_tokenizer MODEL_DIR TEXT_FILE [REPEAT]
 *
 * Reads TEXT_FILE (repeated REPEAT times in memory, default 1), encodes it in chunks of about
 * 64 KiB cut at line ends (as a server or the corpus tooling would feed it), with a fresh
 * tokenizer so the word cache starts cold, and prints bytes, tokens, seconds and MB/s
 * (1 MB = 1e6 bytes). It then decodes the ids and checks the round trip.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenizer/tokenizer.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bench_tokenizer MODEL_DIR TEXT_FILE [REPEAT]\n");
        return 2;
    }
    int repeat = argc > 3 ? atoi(argv[3]) : 1;
    char err[512];
    struct tok *t;
    if (tok_load(&t, argv[1], err, sizeof err)) {
        fprintf(stderr, "bench_tokenizer: %s\n", err);
        return 1;
    }
    FILE *fp = fopen(argv[2], "rb");
    if (!fp) {
        fprintf(stderr, "bench_tokenizer: cannot open %s\n", argv[2]);
        return 1;
    }
    fseek(fp, 0, SEEK_END);
    long one = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    size_t n = (size_t)one * (size_t)(repeat > 0 ? repeat : 1);
    char *text = malloc(n + 1);
    if (!text || fread(text, 1, (size_t)one, fp) != (size_t)one) {
        fprintf(stderr, "bench_tokenizer: cannot read %s\n", argv[2]);
        return 1;
    }
    fclose(fp);
    for (size_t k = (size_t)one; k < n; k += (size_t)one)
        memcpy(text + k, text, (size_t)one);

    struct tok_ids ids = {0};
    double t0 = now();
    for (size_t at = 0; at < n;) {
        size_t end = at + 65536 < n ? at + 65536 : n;
        while (end < n && text[end - 1] != '\n')
            end++;
        if (tok_encode(t, text + at, end - at, 0, &ids, err, sizeof err)) {
            fprintf(stderr, "bench_tokenizer: %s\n", err);
            return 1;
        }
        at = end;
    }
    double s = now() - t0;
    char *back;
    size_t bn;
    if (tok_decode(t, ids.ids, ids.n, 0, &back, &bn, err, sizeof err)) {
        fprintf(stderr, "bench_tokenizer: %s\n", err);
        return 1;
    }
    int same = bn == n && !memcmp(back, text, n);
    printf("%zu bytes, %zu tokens, %.3f s, %.1f MB/s encode, round trip %s\n", n, ids.n, s,
           n / s / 1e6, same ? "exact" : "DIFFERS");
    free(back);
    free(text);
    tok_ids_free(&ids);
    tok_free(t);
    return same ? 0 : 1;
}
