/* plan_time.c: the host's per-step plan work (meta_plan_build, meta_plan_validate) and the bytes a
 * device copy receives (meta_plan_spans), at V4-Flash's plan dimensions (window 128, top-512,
 * CSA 4 / HCA 128), for a few step shapes and row budgets:
 *
 *   make bench-bins && build/bench/plan_time
 *
 * Each line: the row budget (max_tok), sequences x rows each, then microseconds a call (the
 * mean of repeated calls on one plan) and the span in KB. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "metadata/plan.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static size_t span_bytes(const struct td_plan *p) {
    size_t off[2], bytes[2], n = 0;
    for (int i = 0, k = meta_plan_spans(p, off, bytes); i < k; i++)
        n += bytes[i];
    return n;
}

int main(void) {
    // {max_tok, sequences, rows each}: decode at 64 under the default budget and a long-prompt
    // one, a DSpark verify step of 64 sequences (6 rows), a 4096-row prefill chunk
    static const int shapes[][3] = {
        {256, 64, 1}, {4096, 64, 1}, {4096, 1, 1}, {384, 64, 6}, {4096, 1, 4096}};
    static int32_t tables[64 * 256]; // slot s's history blocks s * 256 .. (a state's fixed)
    for (int i = 0; i < 64 * 256; i++)
        tables[i] = i;
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        int max_tok = shapes[i][0], n = shapes[i][1], rows = shapes[i][2];
        struct td_plan_dims d = {.max_tok = max_tok,
                                 .max_seq = 64,
                                 .max_ctx = 65536,
                                 .window = 128,
                                 .topk = 512,
                                 .rate_csa = 4,
                                 .rate_hca = 128,
                                 .swa_ring = 136,
                                 .ring_csa = 8,
                                 .ring_hca = 256,
                                 .block = 0,
                                 .hist_block = 256,
                                 .max_blocks = 256,
                                 .n_blocks = 64 * 256,
                                 .slots = 64,
                                 .tables = tables};
        struct td_plan p;
        char err[256];
        if (meta_plan_init(&p, &d, err, sizeof err)) {
            fprintf(stderr, "plan_time: %s\n", err);
            return 1;
        }
        int32_t *ids = calloc((size_t)n * rows, sizeof(int32_t));
        struct td_plan_seq q[64];
        for (int s = 0; s < n; s++)
            q[s] = (struct td_plan_seq){
                .slot = s, .len_before = 300 + s, .n_new = rows, .ids = ids + (size_t)s * rows};
        int calls = rows > 1000 ? 50 : 2000;
        double t0 = now();
        for (int c = 0; c < calls; c++)
            if (meta_plan_build(&p, q, n, err, sizeof err)) {
                fprintf(stderr, "plan_time: %s\n", err);
                return 1;
            }
        double t1 = now();
        for (int c = 0; c < calls; c++)
            if (meta_plan_validate(&p, err, sizeof err)) {
                fprintf(stderr, "plan_time: %s\n", err);
                return 1;
            }
        double t2 = now();
        printf(
            "budget %5d rows, %2d x %4d rows: build %8.1f us, validate %7.1f us, span %6.1f KB\n",
            max_tok, n, rows, 1e6 * (t1 - t0) / calls, 1e6 * (t2 - t1) / calls,
            span_bytes(&p) / 1024.0);
        free(ids);
        meta_plan_free(&p);
    }
    return 0;
}
