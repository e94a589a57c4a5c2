/* allreduce_time.c: the all-reduce of a split model's expert slots inside a CUDA graph, per
 * call, warm (issue 28's target): N processes, rank r on GPU r, joined by socketpairs and then
 * NCCL (model/comm.h td_comm_nccl), as `tandem --gpus N` runs them. The slot buffer of a step of
 * R rows is R x (picks + shared) x hidden floats; each size is captured as 50 all-reduces in one
 * graph (graph_time.h), replayed 20 times.
 *
 *   make bench-bins && build/bench/allreduce_time 2 [hidden picks]   (default 4096 7)
 *
 * Rows 1, 6 and 64 (a decode step, an MTP/DSpark round, batch 64). Each size's sum is checked
 * first on every rank (disjoint slots, as the experts write them). Rank 0 prints one line a
 * size; a rank whose sums are wrong says so and the exit status is 1. SKIP (77) without NCCL. */
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/graph_time.h"
#include "model/comm.h"

struct ar {
    struct td_comm *c;
    float *buf;
    size_t n;
};

static void ar_call(void *ctx) {
    struct ar *a = ctx;
    a->c->ops->all_reduce_sum_f32(a->c, a->buf, a->n);
}

static int rank_main(int rank, int world, const int *fds, int hidden, int picks) {
    char err[600], name[16];
    snprintf(name, sizeof name, "cuda:%d", rank);
    const struct td_backend *b = td_backend_get(name, err, sizeof err);
    struct td_comm ctrl, c;
    if (!b || td_comm_sockets(&ctrl, rank, world, fds, 120.0, err, sizeof err) ||
        td_comm_nccl(&c, &ctrl, b->queue(), 120.0, err, sizeof err)) {
        fprintf(stderr, "allreduce_time: rank %d: %s\n", rank, err);
        return 1;
    }
    static const int rows[3] = {1, 6, 64};
    int rc = 0;
    for (int i = 0; i < 3 && !rc; i++) {
        struct ar a = {.c = &c, .n = (size_t)rows[i] * picks * hidden};
        if (!(a.buf = b->alloc(a.n * sizeof(float)))) {
            fprintf(stderr, "allreduce_time: rank %d: out of memory\n", rank);
            rc = 1;
            break;
        }
        // first the sum's values: each rank's slot rows (row r of every W) hold its rank + 1,
        // the others zeros, as the experts' slots are disjoint: every element is its owner's
        float *h = calloc(a.n, sizeof(float));
        size_t row = (size_t)hidden, bad = 0;
        for (size_t i = 0; h && i < a.n; i++)
            h[i] = (int)(i / row % (size_t)world) == rank ? (float)(rank + 1) : 0.0f;
        if (h) b->to_device(a.buf, h, a.n * sizeof(float));
        ar_call(&a);
        if (h) b->to_host(h, a.buf, a.n * sizeof(float));
        for (size_t i = 0; h && i < a.n; i++)
            bad += h[i] != (float)(i / row % (size_t)world + 1);
        int no_mem = !h;
        free(h);
        if (no_mem || bad || b->finish(err, sizeof err)) {
            fprintf(stderr, "allreduce_time: rank %d: %zu of %zu sums wrong\n", rank, bad, a.n);
            rc = 1;
        }
        double us = rc ? -1.0 : graph_us(b, ar_call, &a, 50, 20);
        if (!rc && (us < 0 || c.ops->poll_error(&c, err, sizeof err))) {
            fprintf(stderr, "allreduce_time: rank %d: %s\n", rank, us < 0 ? "graph failed" : err);
            rc = 1;
        }
        if (!rc && rank == 0)
            printf("allreduce_time: N %d, %2d rows (%zu floats, %.0f KiB): %.2f us a call, in a "
                   "graph\n",
                   world, rows[i], a.n, (double)a.n * 4 / 1024, us);
        b->release(a.buf);
    }
    td_comm_nccl_free(&c);
    td_comm_sockets_free(&ctrl);
    return rc;
}

int main(int argc, char **argv) {
    int world = argc > 1 ? atoi(argv[1]) : 2, hidden = argc > 2 ? atoi(argv[2]) : 4096,
        picks = argc > 3 ? atoi(argv[3]) : 7;
    if (world < 1 || world > 16 || hidden < 1 || picks < 1) {
        fprintf(stderr, "usage: allreduce_time [N [hidden picks]]\n");
        return 2;
    }
    if (!td_comm_nccl_version()) {
        printf("SKIP allreduce_time: this build has no NCCL\n");
        return 77;
    }
    int fds[16], peer[16];
    for (int q = 1; q < world; q++) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) return 1;
        fds[q] = sv[0], peer[q] = sv[1];
    }
    pid_t pid[16] = {0};
    fflush(NULL);
    for (int q = 1; q < world; q++) // each follower before any CUDA call (a fork keeps none)
        if (!(pid[q] = fork())) {
            for (int p = 1; p < world; p++)
                if (p != q) close(peer[p]), close(fds[p]);
            close(fds[q]);
            _exit(rank_main(q, world, &peer[q], hidden, picks));
        }
    for (int q = 1; q < world; q++)
        close(peer[q]);
    int rc = rank_main(0, world, fds, hidden, picks);
    for (int q = 1; q < world; q++) {
        int st = 0;
        waitpid(pid[q], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st)) rc = 1;
    }
    return rc;
}
