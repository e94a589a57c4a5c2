/* test_comm.c: the communicators (model/comm.h), ranks as threads of this process.
 *
 *   make build/tests/test_comm && build/tests/test_comm
 *
 * comm/self                        one rank: every op leaves its buffers as they are (all_gather
 *                                  copies send to recv)
 * comm/all_reduce/W<w>             W in 1, 2, 3, 4, 8; 1, 7, 1000 and 4097 floats whose sum
 *                                  depends on the order (1e8 beside 1): every rank gets the
 *                                  serial sum in rank order, bit for bit, 20 times in a row
 * comm/all_gather_broadcast/W<w>   odd byte counts; recv in rank order; a broadcast from every
 *                                  root, in place
 * comm/disagree                    rank 1 calls all_reduce of 6 floats where the others call 5:
 *                                  every rank's op fails, naming both calls; later ops fail too
 * comm/abort                       rank 2 aborts while the others wait in a barrier: they return
 *                                  -1 with its reason, long before the timeout
 * comm/missing_rank                rank 3 never comes: the others fail after the timeout (0.2 s),
 *                                  naming it, and nobody hangs
 * comm/.../sockets               the same cases on the sockets communicator (socketpairs: rank 0
 *                                  answers every op; an abort travels as a message, a rank learns
 *                                  of a failure at its next op)
 * comm/closed_rank/sockets         rank 2 closes its socket: every other rank's op fails naming it
 * comm/refuses                     a world of 0 ranks, a timeout of 0 s
 */
#include <errno.h>
#include <pthread.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "model/comm.h"

#define MAXW 8

typedef void (*rank_fn)(struct td_comm *c, void *arg);

struct job {
    struct td_comm c;
    rank_fn fn;
    void *arg;
};

static void *run_rank(void *p) {
    struct job *j = p;
    j->fn(&j->c, j->arg);
    return NULL;
}

static int sockets; /* 1: the cases run on the sockets communicator (socketpairs) */

/* fn in W threads of one world (threads, or sockets joined by socketpairs); 0 on success */
static int run_world(int W, double timeout_s, rank_fn fn, void *arg) {
    char err[256];
    struct td_comm_world *w = NULL;
    pthread_t th[MAXW];
    struct job jobs[MAXW];
    int fd[MAXW][MAXW];
    if (sockets) {
        for (int q = 1; q < W; q++) {
            int sv[2];
            if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) {
                case_fail("socketpair: %s", strerror(errno));
                return -1;
            }
            fd[0][q] = sv[0], fd[q][0] = sv[1];
        }
    } else if (td_comm_threads_world(&w, W, timeout_s, err, sizeof err)) {
        case_fail("world: %s", err);
        return -1;
    }
    for (int r = 0; r < W; r++) {
        jobs[r] = (struct job){.fn = fn, .arg = arg};
        if (!sockets)
            td_comm_threads(&jobs[r].c, w, r);
        else if (td_comm_sockets(&jobs[r].c, r, W, fd[r], timeout_s, err, sizeof err))
            case_fail("sockets: %s", err);
    }
    for (int r = 0; r < W; r++)
        pthread_create(&th[r], NULL, run_rank, &jobs[r]);
    for (int r = 0; r < W; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; sockets && r < W; r++)
        td_comm_sockets_free(&jobs[r].c);
    td_comm_world_free(w);
    return 0;
}

/* a case's name, with "/sockets" on the sockets communicator */
static const char *cname(const char *name) {
    static char b[128];
    snprintf(b, sizeof b, "%s%s", name, sockets ? "/sockets" : "");
    return b;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* rank r's value i: magnitudes far apart, so that another order of the sum gives other bits */
static float value(int r, size_t i) {
    unsigned h = (unsigned)(r * 2654435761u) ^ (unsigned)(i * 40503u);
    float v = (float)(h % 1000) / 7.0f;
    return (r + (int)i) % 3 == 0 ? v * 1e8f : (h & 1 ? v : -v);
}

// ---------------------------------------------------------------------------------------------

static void self_case(void) {
    case_begin();
    struct td_comm c;
    td_comm_self(&c);
    float b[3] = {1, 2, 3};
    char s[5] = "abcd", r[5] = "";
    char err[64] = "";
    CHECK(c.rank == 0 && c.world == 1, "rank %d of %d", c.rank, c.world);
    CHECK(!c.ops->all_reduce_sum_f32(&c, b, 3) && b[0] == 1 && b[2] == 3, "all_reduce changed");
    CHECK(!c.ops->all_gather(&c, s, r, 5) && !strcmp(r, "abcd"), "all_gather gave '%s'", r);
    CHECK(!c.ops->broadcast(&c, b, 12, 0) && !c.ops->barrier(&c) &&
              !c.ops->poll_error(&c, err, sizeof err),
          "an op failed: %s", err);
    case_end("comm/self", "");
}

#define NSIZES 4
static const size_t sizes[NSIZES] = {1, 7, 1000, 4097};

struct reduce_out {
    int bad[MAXW]; /* rounds whose result was not the serial sum */
    int failed[MAXW];
};

static void reduce_rank(struct td_comm *c, void *arg) {
    struct reduce_out *o = arg;
    float *buf = malloc(4097 * sizeof(float)), *want = malloc(4097 * sizeof(float));
    for (int round = 0; round < 20; round++) {
        size_t n = sizes[round % NSIZES];
        for (size_t i = 0; i < n; i++) {
            buf[i] = value(c->rank, i + (size_t)round);
            float s = value(0, i + (size_t)round);
            for (int q = 1; q < c->world; q++)
                s += value(q, i + (size_t)round);
            want[i] = s;
        }
        if (c->ops->all_reduce_sum_f32(c, buf, n)) {
            o->failed[c->rank]++;
            break;
        }
        if (memcmp(buf, want, n * sizeof(float))) o->bad[c->rank]++;
    }
    free(buf), free(want);
}

static void all_reduce_cases(void) {
    const int worlds[5] = {1, 2, 3, 4, 8};
    for (int k = 0; k < 5; k++) {
        case_begin();
        int W = worlds[k];
        struct reduce_out o = {{0}, {0}};
        run_world(W, 10.0, reduce_rank, &o);
        for (int r = 0; r < W; r++)
            CHECK(!o.bad[r] && !o.failed[r], "rank %d: %d of 20 sums not the serial one, %d failed",
                  r, o.bad[r], o.failed[r]);
        // the order matters for these values (so the check above can fail): the sum in
        // reverse rank order differs somewhere
        int differ = 0;
        for (size_t i = 0; W > 2 && i < 4097; i++) {
            float f = value(0, i), b = value(W - 1, i);
            for (int q = 1; q < W; q++)
                f += value(q, i), b += value(W - 1 - q, i);
            differ += f != b;
        }
        CHECK(W <= 2 || differ > 0, "the test's values sum alike in either order");
        char name[48];
        snprintf(name, sizeof name, "comm/all_reduce/W%d", W);
        case_end(cname(name), "");
    }
}

struct gather_out {
    int bad[MAXW];
};

static void gather_rank(struct td_comm *c, void *arg) {
    struct gather_out *o = arg;
    const size_t bytes[3] = {1, 13, 333};
    unsigned char send[333], recv[MAXW * 333], want[MAXW * 333];
    for (int k = 0; k < 3; k++) {
        for (size_t i = 0; i < bytes[k]; i++)
            send[i] = (unsigned char)(c->rank * 31 + i * 7 + k);
        for (int q = 0; q < c->world; q++)
            for (size_t i = 0; i < bytes[k]; i++)
                want[(size_t)q * bytes[k] + i] = (unsigned char)(q * 31 + i * 7 + k);
        if (c->ops->all_gather(c, send, recv, bytes[k]) ||
            memcmp(recv, want, (size_t)c->world * bytes[k]))
            o->bad[c->rank]++;
    }
    for (int root = 0; root < c->world; root++) {
        unsigned char b[77];
        for (int i = 0; i < 77; i++)
            b[i] = (unsigned char)(c->rank == root ? root + i : 0xee);
        int ok = !c->ops->broadcast(c, b, 77, root);
        for (int i = 0; i < 77; i++)
            ok &= b[i] == (unsigned char)(root + i);
        if (!ok) o->bad[c->rank]++;
    }
    if (c->ops->barrier(c)) o->bad[c->rank]++;
}

static void gather_cases(void) {
    const int worlds[4] = {1, 2, 3, 8};
    for (int k = 0; k < 4; k++) {
        case_begin();
        int W = worlds[k];
        struct gather_out o = {{0}};
        run_world(W, 10.0, gather_rank, &o);
        for (int r = 0; r < W; r++)
            CHECK(!o.bad[r], "rank %d: %d gathers or broadcasts wrong", r, o.bad[r]);
        char name[48];
        snprintf(name, sizeof name, "comm/all_gather_broadcast/W%d", W);
        case_end(cname(name), "");
    }
}

struct fail_out {
    int rc[MAXW], later[MAXW];
    double secs[MAXW];
    char why[MAXW][256];
    int mode; /* 0 disagree, 1 abort, 2 missing rank */
};

static void fail_rank(struct td_comm *c, void *arg) {
    struct fail_out *o = arg;
    float b[6] = {0};
    double t0 = now_s();
    int r = c->rank;
    if (o->mode == 0) {
        o->rc[r] = c->ops->all_reduce_sum_f32(c, b, r == 1 ? 6 : 5);
    } else if (o->mode == 1) {
        if (r == 2) {
            struct timespec d = {0, 50 * 1000 * 1000};
            nanosleep(&d, NULL); // the others are waiting by now
            c->ops->abort(c, "rank 2 found its weights corrupt");
            o->rc[r] = -1;
        } else {
            o->rc[r] = c->ops->barrier(c);
        }
    } else {
        if (r == 3) { // rank 3 does not come until the others have given up
            struct timespec d = {0, 600 * 1000 * 1000};
            nanosleep(&d, NULL);
            o->rc[r] = -1;
        } else {
            o->rc[r] = c->ops->barrier(c);
        }
    }
    o->secs[r] = now_s() - t0;
    c->ops->poll_error(c, o->why[r], sizeof o->why[r]);
    o->later[r] = c->ops->barrier(c) != 0 ? 1 : 0; // the world stays failed
    if (!o->why[r][0])                             // (a socket rank learns of it at its next op)
        c->ops->poll_error(c, o->why[r], sizeof o->why[r]);
}

static void failure_cases(void) {
    const char *names[3] = {"comm/disagree", "comm/abort", "comm/missing_rank"};
    const char *want[3] = {"rank 0 called all_reduce of 5 floats, rank 1 all_reduce of 6 floats",
                           "rank 2 aborted: rank 2 found its weights corrupt",
                           sockets ? "waited 0.2 s for rank" : "for rank 3, which did not come"};
    for (int m = 0; m < 3; m++) {
        case_begin();
        struct fail_out o;
        memset(&o, 0, sizeof o);
        o.mode = m;
        double t0 = now_s();
        run_world(4, m == 2 ? 0.2 : 10.0, fail_rank, &o);
        double wall = now_s() - t0;
        for (int r = 0; r < 4; r++) {
            CHECK(o.rc[r] == -1, "rank %d's op returned %d", r, o.rc[r]);
            CHECK(strstr(o.why[r], want[m]), "rank %d says '%s', not '%s'", r, o.why[r], want[m]);
            if (m == 2 && r < 3)
                CHECK(o.secs[r] >= 0.19 && o.secs[r] < 0.5, "rank %d gave up after %.3f s", r,
                      o.secs[r]);
            CHECK(o.later[r], "rank %d's later barrier passed", r);
        }
        CHECK(wall < (m == 2 ? 3.0 : 2.0), "the world took %.2f s to fail", wall);
        char extra[300];
        snprintf(extra, sizeof extra, "(%s)", o.why[0]);
        CHECK(m != 2 || !sockets || strstr(o.why[0], "for rank 3"), "rank 0 says '%s'", o.why[0]);
        case_end(cname(names[m]), extra);
    }
}

static void refuses(void) {
    case_begin();
    char err[128] = "";
    struct td_comm_world *w = NULL;
    CHECK(td_comm_threads_world(&w, 0, 1.0, err, sizeof err) && !w && strstr(err, "0 ranks"),
          "a world of 0: '%s'", err);
    CHECK(td_comm_threads_world(&w, 2, 0.0, err, sizeof err) && !w && strstr(err, "timeout"),
          "a timeout of 0: '%s'", err);
    case_end("comm/refuses", "");
}

/* sockets: a rank whose process ends (its socket closed, no op called) fails the others' op,
 * naming it */
static void closed_rank(struct td_comm *c, void *arg) {
    struct fail_out *o = arg;
    if (c->rank == 2) {
        td_comm_sockets_free(c); // (run_world's free is then a no-op)
        o->rc[2] = -1;
        snprintf(o->why[2], sizeof o->why[2], "closed");
        return;
    }
    o->rc[c->rank] = c->ops->barrier(c);
    c->ops->poll_error(c, o->why[c->rank], sizeof o->why[c->rank]);
}

static void closed_case(void) {
    case_begin();
    struct fail_out o;
    memset(&o, 0, sizeof o);
    run_world(4, 0.0, closed_rank, &o); // (no timeout: the closed socket ends the wait)
    for (int r = 0; r < 4; r++)
        CHECK(o.rc[r] == -1, "rank %d's op returned %d", r, o.rc[r]);
    CHECK(strstr(o.why[0], "rank 2's connection closed (its process ended)"), "rank 0: '%s'",
          o.why[0]);
    CHECK(strstr(o.why[1], "rank 2's connection closed") && strstr(o.why[3], "rank 2's"),
          "ranks 1 and 3: '%s', '%s'", o.why[1], o.why[3]);
    char extra[300];
    snprintf(extra, sizeof extra, "(%s)", o.why[1]);
    case_end("comm/closed_rank/sockets", extra);
}

/* sockets: peers_gone (a device communicator's watchdog asks it from another thread) is 0
 * while every rank's process lives, and names the rank whose socket closed, taking no message */
static void gone_rank(struct td_comm *c, void *arg) {
    struct fail_out *o = arg;
    o->rc[c->rank] = c->ops->barrier(c);
    if (c->rank == 0 && c->ops->peers_gone(c, o->why[0], sizeof o->why[0])) o->rc[0] = 1;
    if (c->ops->barrier(c)) o->rc[c->rank] = 2;
    if (c->rank == 2) td_comm_sockets_free(c);
    if (c->rank) return;
    for (int i = 0; i < 500; i++) { // at most 5 s for rank 2's close
        if (c->ops->peers_gone(c, o->why[0], sizeof o->why[0])) return;
        usleep(10000);
    }
    o->rc[0] = 3;
}

static void gone_case(void) {
    case_begin();
    struct fail_out o;
    memset(&o, 0, sizeof o);
    run_world(3, 10.0, gone_rank, &o);
    CHECK(o.rc[0] != 1, "peers_gone named a rank while all lived: '%s'", o.why[0]);
    CHECK(o.rc[0] != 3, "peers_gone did not see rank 2's socket close in 5 s");
    for (int r = 0; r < 3; r++)
        CHECK(o.rc[r] != 2 && (r == 0 || !o.rc[r]), "rank %d: %d", r, o.rc[r]);
    CHECK(strstr(o.why[0], "rank 2's connection closed"), "rank 0: '%s'", o.why[0]);
    case_end("comm/peers_gone/sockets", "");
}

/* a build without NCCL (CI's): td_comm_nccl refuses with why, and leaves nothing to free */
static void nccl_absent(void) {
    if (td_comm_nccl_version()) return; // (a build with NCCL: test_gpu runs it)
    case_begin();
    struct td_comm self, c;
    char err[300] = "";
    td_comm_self(&self);
    CHECK(td_comm_nccl(&c, &self, NULL, 1.0, err, sizeof err) == -1 &&
              strstr(err, "this build has no NCCL") && !c.impl,
          "'%s'", err);
    td_comm_nccl_free(&c);
    case_end("comm/nccl_absent", "");
}

int main(void) {
    self_case();
    for (sockets = 0; sockets < 2; sockets++) {
        all_reduce_cases();
        gather_cases();
        failure_cases();
    }
    sockets = 1;
    closed_case();
    gone_case();
    nccl_absent();
    refuses();
    return check_failures ? 1 : 0;
}
