/* gemm_time.c: the skinny GEMM (decode and verify rows) per call on the GPU, inside a CUDA graph
 * of back-to-back calls replayed 5 times (graph_time.h). The calls cycle through copies of the
 * weights, at least 256 MB of them, so that each call reads its weights from HBM as a step does
 * (a step reads gigabytes; the 50 MB L2 keeps none of them), not from a warm L2.
 *
 *   make bench-bins && build/bench/gemm_time
 *
 * Shapes (in x out, bf16 weights): tandem-tiny's q_a, q_b, kv and head, and the Flash slice's
 * q_a, q_b, kv, the indexer's q and weights, the router, wo_b, the grouped wo_a (8 groups of
 * 4096 x 1024) and the head, at 1, 2 and 8 rows, with the bandwidth of the weight reads at 1. */
#include <string.h>

#include "bench/graph_time.h"

#define MAX_COPIES 64

struct gemm {
    const struct td_backend *b;
    float *y, *x;
    void *w[MAX_COPIES];
    int copies, next, n, in, out, groups;
};

static void gemm_call(void *ctx) {
    struct gemm *q = ctx;
    void *w = q->w[q->next++ % q->copies];
    if (q->groups > 1)
        q->b->ops.matmul_grouped(q->y, q->x, w, TD_DTYPE_BF16, q->n, q->groups, q->in / q->groups,
                                 q->out / q->groups);
    else
        q->b->ops.matmul(q->y, q->x, w, TD_DTYPE_BF16, q->n, q->in, q->out, NULL, TD_DTYPE_F32);
}

int main(void) {
    const struct td_backend *b = bench_cuda("gemm_time");
    if (!b) return 77;
    static const struct {
        const char *name;
        int in, out, groups;
    } shapes[] = {{"tiny q_a", 256, 128, 1},      {"tiny q_b", 128, 512, 1},
                  {"tiny kv", 256, 64, 1},        {"tiny head", 256, 8192, 1},
                  {"flash q_a", 4096, 1024, 1},   {"flash q_b", 1024, 32768, 1},
                  {"flash kv", 4096, 512, 1},     {"flash idx q", 1024, 8192, 1},
                  {"flash idx w", 4096, 64, 1},   {"flash router", 4096, 256, 1},
                  {"flash wo_a", 32768, 8192, 8}, {"flash wo_b", 8192, 4096, 1},
                  {"flash head", 4096, 129280, 1}};
    static const int rows[] = {1, 2, 8};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int in = shapes[s].in, out = shapes[s].out, groups = shapes[s].groups;
        size_t wbytes = (size_t)in * out * 2 / groups;
        struct gemm q;
        memset(&q, 0, sizeof q);
        q.b = b, q.in = in, q.out = out, q.groups = groups;
        q.y = b->alloc((size_t)8 * out * 4), q.x = b->alloc((size_t)8 * in * 4);
        q.copies = (int)((256u << 20) / wbytes) + 1;
        if (q.copies > MAX_COPIES) q.copies = MAX_COPIES;
        for (int c = 0; c < q.copies; c++) {
            q.w[c] = b->alloc(wbytes);
            if (!q.w[c]) return 1;
            b->ops.fill_uniform(q.w[c], TD_DTYPE_BF16, (int64_t)(wbytes / 2), 1 + c, -0.05f, 0.05f);
        }
        if (!q.y || !q.x) return 1;
        b->ops.fill_uniform(q.x, TD_DTYPE_F32, (int64_t)8 * in, 2, -1.0f, 1.0f);
        printf("%-13s %5d x %6d:", shapes[s].name, in, out);
        double us1 = 0;
        for (int r = 0; r < 3; r++) {
            q.n = rows[r];
            int calls = q.copies * (wbytes > (64u << 20) ? 2 : 4);
            double us = graph_us(b, gemm_call, &q, calls, 5);
            if (us < 0) return 1;
            if (r == 0) us1 = us;
            printf("  n %d %7.2f us", q.n, us);
        }
        printf("  (%.1f MB: %.2f TB/s at 1 row)\n", wbytes / 1e6, wbytes / us1 / 1e6);
        for (int c = 0; c < q.copies; c++)
            b->release(q.w[c]);
        b->release(q.x);
        b->release(q.y);
    }
    return 0;
}
