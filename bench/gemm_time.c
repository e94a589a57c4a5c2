/* gemm_time.c: the skinny GEMM (decode and verify rows) per call on the GPU, inside a CUDA graph
 * of back-to-back calls replayed 5 times (graph_time.h). The calls cycle through copies of the
 * weights, at least 256 MB of them, so that each call reads its weights from HBM as a step does
 * (a step reads gigabytes; the 50 MB L2 keeps none of them), not from a warm L2.
 *
 *   make bench-bins && build/bench/gemm_time
 *
 * Shapes (in x out, bf16 weights): tandem-tiny's q_a, q_b, kv and head, and the Flash slice's
 * q_a, q_b, kv, the indexer's q and weights, the router, wo_b, the grouped wo_a (8 groups of
 * 4096 x 1024), the head and a layer's sets of projections (matmul_set), at 1, 2 and 8 rows
 * (GEMM_ROWS=1,16,64: others, up to 64), with the bandwidth of the weight reads at the first.
 * GEMM_ONLY=TEXT times the shapes whose name holds TEXT alone.
 * GEMM_DTYPE=q8 or q4 makes every matrix a packed released-precision one (kernels/quant.h)
 * instead, its bytes the codes and scales. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/quant.h"

#include "bench/graph_time.h"

#define MAX_COPIES 64

struct gemm {
    const struct td_backend *b;
    float *y[MATMUL_SET_MAX], *x;
    void *w[MAX_COPIES][MATMUL_SET_MAX];
    int copies, next, n, in, groups, m, out[MATMUL_SET_MAX];
    enum td_dtype t;
};

static void gemm_call(void *ctx) {
    struct gemm *q = ctx;
    void **w = q->w[q->next++ % q->copies];
    if (q->m > 1) {
        struct matmul_out o[MATMUL_SET_MAX];
        for (int i = 0; i < q->m; i++)
            o[i] = (struct matmul_out){.y = q->y[i], .w = w[i], .dtype = q->t, .out = q->out[i]};
        q->b->ops.matmul_set(q->x, q->n, q->in, q->m, o);
    } else if (q->groups > 1) {
        q->b->ops.matmul_grouped(q->y[0], q->x, w[0], q->t, q->n, q->groups, q->in / q->groups,
                                 q->out[0] / q->groups);
    } else {
        q->b->ops.matmul(q->y[0], q->x, w[0], q->t, q->n, q->in, q->out[0], NULL, TD_DTYPE_F32);
    }
}

int main(void) {
    const struct td_backend *b = bench_cuda("gemm_time");
    if (!b) return 77;
    // a shape: in, groups, then the outputs of a set (one for a plain GEMM)
    static const struct {
        const char *name;
        int in, groups, out[MATMUL_SET_MAX];
    } shapes[] = {{.name = "tiny q_a", .in = 256, .groups = 1, .out = {128}},
                  {.name = "tiny q_b", .in = 128, .groups = 1, .out = {512}},
                  {.name = "tiny kv", .in = 256, .groups = 1, .out = {64}},
                  {.name = "tiny head", .in = 256, .groups = 1, .out = {8192}},
                  {.name = "flash q_a", .in = 4096, .groups = 1, .out = {1024}},
                  {.name = "flash q_b", .in = 1024, .groups = 1, .out = {32768}},
                  {.name = "flash kv", .in = 4096, .groups = 1, .out = {512}},
                  {.name = "flash idx q", .in = 1024, .groups = 1, .out = {8192}},
                  {.name = "flash idx w", .in = 4096, .groups = 1, .out = {64}},
                  {.name = "flash router", .in = 4096, .groups = 1, .out = {256}},
                  {.name = "flash wo_a", .in = 32768, .groups = 8, .out = {8192}},
                  {.name = "flash wo_b", .in = 8192, .groups = 1, .out = {4096}},
                  {.name = "flash head", .in = 4096, .groups = 1, .out = {129280}},
                  // the layer's sets (forward.c): the xn projections of an HCA and a CSA layer,
                  // then q and the indexer's q from the normed low rank
                  {.name = "flash hca xn", .in = 4096, .groups = 1, .out = {1024, 512, 512, 512}},
                  {.name = "flash csa xn",
                   .in = 4096,
                   .groups = 1,
                   .out = {1024, 512, 1024, 1024, 256, 256, 64}},
                  {.name = "flash csa qr", .in = 1024, .groups = 1, .out = {32768, 8192}}};
    int rows[16] = {1, 2, 8}, n_rows = 3, max_rows = 8;
    if (getenv("GEMM_ROWS")) {
        n_rows = 0, max_rows = 1;
        for (const char *p = getenv("GEMM_ROWS"); *p && n_rows < 16;) {
            char *end;
            long r = strtol(p, &end, 10);
            if (end == p || r < 1 || r > 64) {
                fprintf(stderr, "gemm_time: GEMM_ROWS is a list of 1 to 64, not '%s'\n",
                        getenv("GEMM_ROWS"));
                return 2;
            }
            rows[n_rows++] = (int)r;
            max_rows = r > max_rows ? (int)r : max_rows;
            p = *end == ',' ? end + 1 : end;
        }
    }
    const char *dt = getenv("GEMM_DTYPE");
    enum td_dtype t = dt && !strcmp(dt, "q8")   ? TD_DTYPE_Q8
                      : dt && !strcmp(dt, "q4") ? TD_DTYPE_Q4
                                                : TD_DTYPE_BF16;
    const char *only = getenv("GEMM_ONLY"); // shapes whose name holds it
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        if (only && !strstr(shapes[s].name, only)) continue;
        int in = shapes[s].in, groups = shapes[s].groups, m = 0, outs = 0;
        struct gemm q;
        memset(&q, 0, sizeof q);
        while (m < MATMUL_SET_MAX && shapes[s].out[m])
            q.out[m] = shapes[s].out[m], outs += q.out[m++];
            // a matrix's bytes (a grouped one is [out, in / groups])
#define MBYTES(o)                                                                                  \
    (t == TD_DTYPE_BF16 ? (size_t)in / groups * (o)*2 : td_quant_bytes(t, o, in / groups))
        size_t wbytes = 0;
        for (int i = 0; i < m; i++)
            wbytes += MBYTES(q.out[i]);
        q.b = b, q.in = in, q.groups = groups, q.m = m, q.t = t;
        q.x = b->alloc((size_t)max_rows * in * 4);
        for (int i = 0; i < m; i++)
            if (!(q.y[i] = b->alloc((size_t)max_rows * q.out[i] * 4))) return 1;
        q.copies = (int)((256u << 20) / wbytes) + 1;
        if (q.copies > MAX_COPIES) q.copies = MAX_COPIES;
        for (int c = 0; c < q.copies; c++)
            for (int i = 0; i < m; i++) {
                size_t bytes = MBYTES(q.out[i]);
                q.w[c][i] = b->alloc(bytes);
                if (!q.w[c][i]) return 1;
                if (t == TD_DTYPE_BF16)
                    b->ops.fill_uniform(q.w[c][i], TD_DTYPE_BF16, (int64_t)(bytes / 2), 1 + c,
                                        -0.05f, 0.05f);
                else
                    b->ops.fill_quant(q.w[c][i], t, q.out[i], in / groups, 1 + c, 120);
            }
        if (!q.x) return 1;
        b->ops.fill_uniform(q.x, TD_DTYPE_F32, (int64_t)max_rows * in, 2, -1.0f, 1.0f);
        printf("%-13s %5d x %6d:", shapes[s].name, in, outs);
        double us1 = 0;
        for (int r = 0; r < n_rows; r++) {
            q.n = rows[r];
            int calls = q.copies * (wbytes > (64u << 20) ? 2 : 4);
            double us = graph_us(b, gemm_call, &q, calls, 5);
            if (us < 0) return 1;
            if (r == 0) us1 = us;
            printf("  n %d %7.2f us", q.n, us);
        }
        printf("  (%.1f MB: %.2f TB/s at %d rows)\n", wbytes / 1e6, wbytes / us1 / 1e6, rows[0]);
        for (int c = 0; c < q.copies; c++)
            for (int i = 0; i < m; i++)
                b->release(q.w[c][i]);
        b->release(q.x);
        for (int i = 0; i < m; i++)
            b->release(q.y[i]);
    }
    return 0;
}
