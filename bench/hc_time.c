/* hc_time.c: hc_pre and hc_head per call on the GPU, warm: a CUDA graph of 200 calls replayed
 * 5 times (graph_time.h).
 *
 *   make bench-bins && build/bench/hc_time
 *
 * Shapes: nc = 4 streams of d = 256 (tandem-tiny) and d = 4096 (the Flash slice), 1 and 6 or 8
 * tokens, fp32 fn, 0 and 20 Sinkhorn iterations (the difference is the Sinkhorn's cost). */
#include "bench/graph_time.h"
#include "kernels/hc.h"

struct hc {
    const struct td_backend *b;
    float *x, *col, *post, *comb;
    struct hc_weights w;
    int n, nc, d, iters, head;
};

static void hc_call(void *ctx) {
    struct hc *q = ctx;
    const struct hc_weights *w = &q->w;
    if (q->head)
        q->b->ops.hc_head(q->col, q->x, w->fn, w->fn_dtype, w->base, w->base_dtype, w->scale,
                          w->scale_dtype, q->n, q->nc, q->d, 1e-6f, 1e-6f);
    else
        q->b->ops.hc_pre(q->col, q->post, q->comb, q->x, w, q->n, q->nc, q->d, q->iters, 1e-6f,
                         1e-6f, NULL, TD_DTYPE_F32);
}

int main(void) {
    const struct td_backend *b = bench_cuda("hc_time");
    if (!b) return 77;
    static const int shapes[][2] = {{1, 256}, {6, 256}, {1, 4096}, {8, 4096}}; // tokens, d
    const int nc = 4, m = (2 + nc) * nc;
    struct td_reserve rs = {.rows = 8, .hc_mult = nc, .dim = 4096}; // the widest shape below
    char err[200];
    if (b->reserve(&rs, err, sizeof err)) {
        fprintf(stderr, "hc_time: %s\n", err);
        return 1;
    }
    for (int s = 0; s < 4; s++) {
        int n = shapes[s][0], d = shapes[s][1];
        float *fn = b->alloc((size_t)m * nc * d * 4), *base = b->alloc((size_t)m * 4);
        float *scale = b->alloc(12);
        struct hc q = {.b = b, .n = n, .nc = nc, .d = d};
        q.w.fn = fn, q.w.base = base, q.w.scale = scale;
        q.w.fn_dtype = q.w.base_dtype = q.w.scale_dtype = TD_DTYPE_F32;
        q.x = b->alloc((size_t)n * nc * d * 4), q.col = b->alloc((size_t)n * d * 4);
        q.post = b->alloc((size_t)n * nc * 4), q.comb = b->alloc((size_t)n * nc * nc * 4);
        for (int v = 0; v < 3; v++) { // hc_pre 0 iterations, hc_pre 20, hc_head
            q.iters = 20 * (v == 1);
            q.head = v == 2;
            double us = graph_us(b, hc_call, &q, 200, 5);
            if (us < 0) return 1;
            printf("%s n %d nc %d d %d%s: %.2f us per call\n", v == 2 ? "hc_head" : "hc_pre ", n,
                   nc, d,
                   v == 2 ? ""
                   : v    ? ", 20 iterations"
                          : ", 0 iterations",
                   us);
        }
        void *bufs[] = {fn, base, scale, q.x, q.col, q.post, q.comb};
        for (int i = 0; i < 7; i++)
            b->release(bufs[i]);
    }
    return 0;
}
