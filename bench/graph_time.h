/* graph_time.h: the warm per-call time of queued GPU ops, for the bench/ *_time programs: the
 * calls captured into one CUDA graph through the backend, replayed once to warm and then reps
 * times under the host clock (the time a call takes inside a step's graph, launch gap
 * included). */
#ifndef TD_BENCH_GRAPH_TIME_H
#define TD_BENCH_GRAPH_TIME_H

#include <stdio.h>
#include <time.h>

#include "model/backend.h"

/* the CUDA backend, or NULL after the SKIP line (the program then exits 77) */
static inline const struct td_backend *bench_cuda(const char *prog) {
    char err[256];
    const struct td_backend *b = td_backend_get("cuda", err, sizeof err);
    if (!b) printf("SKIP %s: %s\n", prog, err);
    return b;
}

/* microseconds per call of `calls` calls of body(ctx), or -1 when the graph or a replay fails */
static inline double graph_us(const struct td_backend *b, void (*body)(void *ctx), void *ctx, int calls,
                       int reps) {
    char err[256];
    body(ctx); // once eagerly: what a first call sets up happens outside the capture
    if (b->finish(err, sizeof err) || b->graph_begin()) return -1.0;
    for (int i = 0; i < calls; i++)
        body(ctx);
    void *g = b->graph_end();
    if (!g) return -1.0;
    b->graph_launch(g); // warm
    if (b->finish(err, sizeof err)) return -1.0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int k = 0; k < reps; k++)
        b->graph_launch(g);
    int bad = b->finish(err, sizeof err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    b->graph_free(g);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    return bad ? -1.0 : s * 1e6 / ((double)calls * reps);
}

#endif
