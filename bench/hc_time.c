/* hc_time.c: hc_pre and hc_head per call on the GPU, warm: a CUDA graph of 200 calls captured
 * through the backend and replayed 5 times, host clock around the replays.
 *
 *   make bench-bins && build/bench/hc_time
 *
 * Shapes: nc = 4 streams of d = 256 (tandem-tiny) and d = 4096 (the Flash slice), 1 and 6 or 8
 * tokens, fp32 fn, 0 and 20 Sinkhorn iterations (the difference is the Sinkhorn's cost). */
#include <stdio.h>
#include <time.h>

#include "engine/backend.h"
#include "kernels/hc.h"

#ifdef TD_HAVE_CUDA
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
#endif

int main(void) {
#ifndef TD_HAVE_CUDA
    printf("SKIP hc_time: this build has no CUDA\n");
    return 77;
#else
    char err[256];
    const struct td_backend *b = td_backend_get("cuda", err, sizeof err);
    if (!b) {
        printf("SKIP hc_time: %s\n", err);
        return 77;
    }
    static const int shapes[][2] = {{1, 256}, {6, 256}, {1, 4096}, {8, 4096}}; // tokens, d
    const int nc = 4, m = (2 + nc) * nc, calls = 200, reps = 5;
    hc_cuda_reserve(hc_mix_parts(8, nc, 4096));
    for (int s = 0; s < 4; s++) {
        int n = shapes[s][0], d = shapes[s][1];
        float *x = b->alloc((size_t)n * nc * d * 4), *fn = b->alloc((size_t)m * nc * d * 4);
        float *base = b->alloc((size_t)m * 4), *scale = b->alloc(12),
              *col = b->alloc((size_t)n * d * 4);
        float *post = b->alloc((size_t)n * nc * 4), *comb = b->alloc((size_t)n * nc * nc * 4);
        struct hc_weights w = {fn, base, scale, TD_DTYPE_F32, TD_DTYPE_F32, TD_DTYPE_F32};
        for (int v = 0; v < 3; v++) { // hc_pre 0 iterations, hc_pre 20, hc_head
            if (b->graph_begin()) return 1;
            for (int i = 0; i < calls; i++)
                if (v == 2)
                    hc_head_cuda(col, x, fn, TD_DTYPE_F32, base, TD_DTYPE_F32, scale, TD_DTYPE_F32,
                                 n, nc, d, 1e-6f, 1e-6f);
                else
                    hc_pre_cuda(col, post, comb, x, &w, n, nc, d, 20 * v, 1e-6f, 1e-6f);
            void *g = b->graph_end();
            if (!g) return 1;
            b->graph_launch(g); // warm
            if (b->finish(err, sizeof err)) return 1;
            double t0 = now();
            for (int r = 0; r < reps; r++)
                b->graph_launch(g);
            if (b->finish(err, sizeof err)) return 1;
            double us = (now() - t0) * 1e6 / (calls * reps);
            printf("%s n %d nc %d d %d%s: %.2f us per call\n", v == 2 ? "hc_head" : "hc_pre ", n,
                   nc, d,
                   v == 2 ? ""
                   : v    ? ", 20 iterations"
                          : ", 0 iterations",
                   us);
            b->graph_free(g);
        }
    }
    return 0;
#endif
}
