/* gemm_time.c: the skinny GEMM (decode and verify rows) per call on the GPU, warm: a CUDA graph
 * of 200 calls captured through the backend and replayed 5 times, host clock around the
 * replays (the time a call takes inside a step's graph, launch gap included).
 *
 *   make bench-bins && build/bench/gemm_time
 *
 * Shapes: tandem-tiny's (in x out: 256 x 128 q_a, 128 x 512 q_b, 256 x 64 kv, 256 x 8192 head)
 * and the Flash slice's (4096 x 1024 q_a, 1024 x 32768 q_b, 4096 x 129280 head), bf16 weights,
 * at 1, 2, 4, 6 and 8 rows. */
#include <stdio.h>
#include <time.h>

#include "engine/backend.h"

#ifdef TD_HAVE_CUDA
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
#endif

int main(void) {
#ifndef TD_HAVE_CUDA
    printf("SKIP gemm_time: this build has no CUDA\n");
    return 77;
#else
    char err[256];
    const struct td_backend *b = td_backend_get("cuda", err, sizeof err);
    if (!b) {
        printf("SKIP gemm_time: %s\n", err);
        return 77;
    }
    static const int shapes[][2] = {{256, 128},   {128, 512},    {256, 64},    {256, 8192},
                                    {4096, 1024}, {1024, 32768}, {4096, 129280}};
    static const int rows[] = {1, 2, 4, 6, 8};
    const int reps = 5;
    for (int s = 0; s < 7; s++) {
        int in = shapes[s][0], out = shapes[s][1], calls = out > 20000 ? 20 : 200;
        void *w = b->alloc((size_t)in * out * 2);
        float *x = b->alloc((size_t)8 * in * 4), *y = b->alloc((size_t)8 * out * 4);
        b->ops.fill_uniform(w, TD_DTYPE_BF16, (int64_t)in * out, 1, -0.05f, 0.05f);
        b->ops.fill_uniform(x, TD_DTYPE_F32, (int64_t)8 * in, 2, -1.0f, 1.0f);
        printf("%5d x %6d:", in, out);
        for (int r = 0; r < 5; r++) {
            int n = rows[r];
            if (b->graph_begin()) return 1;
            for (int i = 0; i < calls; i++)
                b->ops.matmul(y, x, w, TD_DTYPE_BF16, n, in, out, NULL, TD_DTYPE_F32);
            void *g = b->graph_end();
            if (!g) return 1;
            b->graph_launch(g); // warm
            if (b->finish(err, sizeof err)) return 1;
            double t0 = now();
            for (int k = 0; k < reps; k++)
                b->graph_launch(g);
            if (b->finish(err, sizeof err)) return 1;
            printf("  n %d %7.2f us", n, (now() - t0) * 1e6 / (calls * reps));
            b->graph_free(g);
        }
        double gb = (double)in * out * 2 / 1e9;
        printf("  (%.1f MB of weights)\n", gb * 1e3);
        b->release(w);
        b->release(x);
        b->release(y);
    }
    return 0;
#endif
}
