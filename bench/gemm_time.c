/* gemm_time.c: the skinny GEMM (decode and verify rows) per call on the GPU, warm: a CUDA graph
 * of 200 calls (20 for the largest) replayed 5 times (graph_time.h).
 *
 *   make bench-bins && build/bench/gemm_time
 *
 * Shapes: tandem-tiny's (in x out: 256 x 128 q_a, 128 x 512 q_b, 256 x 64 kv, 256 x 8192 head)
 * and the Flash slice's (4096 x 1024 q_a, 1024 x 32768 q_b, 4096 x 129280 head), bf16 weights,
 * at 1, 2, 4, 6 and 8 rows. */
#include "bench/graph_time.h"

struct gemm {
    const struct td_backend *b;
    float *y, *x;
    void *w;
    int n, in, out;
};

static void gemm_call(void *ctx) {
    struct gemm *q = ctx;
    q->b->ops.matmul(q->y, q->x, q->w, TD_DTYPE_BF16, q->n, q->in, q->out, NULL, TD_DTYPE_F32);
}

int main(void) {
    const struct td_backend *b = bench_cuda("gemm_time");
    if (!b) return 77;
    static const int shapes[][2] = {{256, 128},   {128, 512},    {256, 64},    {256, 8192},
                                    {4096, 1024}, {1024, 32768}, {4096, 129280}};
    static const int rows[] = {1, 2, 4, 6, 8};
    for (int s = 0; s < 7; s++) {
        int in = shapes[s][0], out = shapes[s][1], calls = out > 20000 ? 20 : 200;
        struct gemm q = {b, b->alloc((size_t)8 * out * 4), b->alloc((size_t)8 * in * 4),
                         b->alloc((size_t)in * out * 2), 0, in, out};
        if (!q.y || !q.x || !q.w) return 1;
        b->ops.fill_uniform(q.w, TD_DTYPE_BF16, (int64_t)in * out, 1, -0.05f, 0.05f);
        b->ops.fill_uniform(q.x, TD_DTYPE_F32, (int64_t)8 * in, 2, -1.0f, 1.0f);
        printf("%5d x %6d:", in, out);
        for (int r = 0; r < 5; r++) {
            q.n = rows[r];
            double us = graph_us(b, gemm_call, &q, calls, 5);
            if (us < 0) return 1;
            printf("  n %d %7.2f us", q.n, us);
        }
        printf("  (%.1f MB of weights)\n", (double)in * out * 2 / 1e6);
        b->release(q.w);
        b->release(q.x);
        b->release(q.y);
    }
    return 0;
}
