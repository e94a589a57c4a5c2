/* comm.c: the self and threads communicators (comm.h). The threads world runs each op as
 * phases: every rank publishes its call and its buffer, the last to come checks that all
 * called the same op and opens the phase; each rank then reads the others' buffers, and a
 * second phase keeps every buffer alive until all have read. */
#include "model/comm.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <stdint.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "kernels/err.h"

// ---------------------------------------------------------------------------------------------
// self: one rank

static int self_all_reduce(struct td_comm *c, float *buf, size_t n) {
    (void)c, (void)buf, (void)n;
    return 0;
}

static int self_all_gather(struct td_comm *c, const void *send, void *recv, size_t bytes) {
    (void)c;
    if (recv != send) memmove(recv, send, bytes);
    return 0;
}

static int self_broadcast(struct td_comm *c, void *buf, size_t bytes, int root) {
    (void)c, (void)buf, (void)bytes, (void)root;
    return 0;
}

static int self_barrier(struct td_comm *c) {
    (void)c;
    return 0;
}

static void self_abort(struct td_comm *c, const char *reason) {
    (void)c, (void)reason;
}

static int self_poll_error(struct td_comm *c, char *err, size_t errlen) {
    (void)c, (void)err, (void)errlen;
    return 0;
}

static const struct td_comm_ops self_ops = {.name = "self",
                                            .all_reduce_sum_f32 = self_all_reduce,
                                            .all_gather = self_all_gather,
                                            .broadcast = self_broadcast,
                                            .barrier = self_barrier,
                                            .abort = self_abort,
                                            .poll_error = self_poll_error};

void td_comm_self(struct td_comm *c) {
    *c = (struct td_comm){.rank = 0, .world = 1, .ops = &self_ops, .impl = NULL};
}

// ---------------------------------------------------------------------------------------------
// threads: W ranks in one process

enum op { OP_ALL_REDUCE = 1, OP_ALL_GATHER, OP_BROADCAST, OP_BARRIER };

static const char *op_name(int op) {
    return op == OP_ALL_REDUCE   ? "all_reduce"
           : op == OP_ALL_GATHER ? "all_gather"
           : op == OP_BROADCAST  ? "broadcast"
                                 : "barrier";
}

struct call {
    int op, root;
    size_t n;        /* floats (all_reduce) or bytes */
    long seq;        /* the rank's op count, from 1 */
    const void *src; /* what the others read */
};

struct rank_state {
    struct call call;
    int here; /* arrived at the open phase */
    long seq;
    float *scratch;
    size_t scratch_n;
};

struct td_comm_world {
    int world;
    double timeout_s;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;
    long gen;
    int gen_rc; /* the last phase's result, as its last rank saw it */
    int failed;
    char why[384];
    struct rank_state *r;
};

static void describe(const struct call *c, char *s, size_t n) {
    if (c->op == OP_ALL_REDUCE)
        snprintf(s, n, "all_reduce of %zu floats", c->n);
    else if (c->op == OP_BROADCAST)
        snprintf(s, n, "broadcast of %zu bytes from rank %d", c->n, c->root);
    else if (c->op == OP_ALL_GATHER)
        snprintf(s, n, "all_gather of %zu bytes", c->n);
    else
        snprintf(s, n, "barrier");
}

/* under mu: the first failure's reason stays; every waiter wakes */
static void fail_locked(struct td_comm_world *w, const char *fmt, ...) {
    if (!w->failed) {
        w->failed = 1;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(w->why, sizeof w->why, fmt, ap);
        va_end(ap);
    }
    pthread_cond_broadcast(&w->cv);
}

/* under mu, by the last rank to come: do all the calls match rank 0's? */
static void check_calls_locked(struct td_comm_world *w) {
    const struct call *a = &w->r[0].call;
    for (int q = 1; q < w->world; q++) {
        const struct call *b = &w->r[q].call;
        if (b->op == a->op && b->n == a->n && b->root == a->root) continue;
        char da[96], db[96];
        describe(a, da, sizeof da), describe(b, db, sizeof db);
        fail_locked(w, "comm: the ranks disagree at op %ld: rank 0 called %s, rank %d %s", a->seq,
                    da, q, db);
        return;
    }
}

static struct timespec deadline_after(double s) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    long long ns = (long long)t.tv_nsec + (long long)((s - (double)(long long)s) * 1e9);
    t.tv_sec += (time_t)s + (time_t)(ns / 1000000000LL);
    t.tv_nsec = (long)(ns % 1000000000LL);
    return t;
}

/* One phase: returns 0 when every rank has come, -1 when the world fails first. An opening
 * phase (the op's first: the last rank to come compares the calls) gives up at once on a failed
 * world; a closing one (the buffers read) waits for the ranks that are all inside the op
 * anyway, so no rank leaves while another still reads its buffer. Its result is the one the
 * last rank to come saw, so every rank gets the same. */
static int phase(struct td_comm_world *w, int rank, int opening) {
    pthread_mutex_lock(&w->mu);
    if (opening && w->failed) {
        pthread_mutex_unlock(&w->mu);
        return -1;
    }
    long g = w->gen;
    w->r[rank].here = 1;
    if (++w->arrived == w->world) {
        if (opening) check_calls_locked(w);
        w->arrived = 0;
        for (int q = 0; q < w->world; q++)
            w->r[q].here = 0;
        w->gen_rc = opening && w->failed ? -1 : 0;
        w->gen++;
        pthread_cond_broadcast(&w->cv);
        int rc = w->gen_rc;
        pthread_mutex_unlock(&w->mu);
        return rc;
    }
    struct timespec until = deadline_after(w->timeout_s);
    int timed_out = 0;
    while (w->gen == g && !(opening && w->failed) && !timed_out) {
        int rc = pthread_cond_timedwait(&w->cv, &w->mu, &until);
        if (rc == ETIMEDOUT && w->gen == g) {
            char missing[160] = "";
            size_t o = 0;
            for (int q = 0; q < w->world && o < sizeof missing - 8; q++)
                if (!w->r[q].here)
                    o +=
                        (size_t)snprintf(missing + o, sizeof missing - o, "%s%d", o ? ", " : "", q);
            fail_locked(w,
                        "comm: rank %d waited %.1f s in %s (its op %ld) for rank %s, which did "
                        "not come",
                        rank, w->timeout_s, op_name(w->r[rank].call.op), w->r[rank].call.seq,
                        missing);
            timed_out = 1;
        }
    }
    int rc = w->gen != g ? w->gen_rc : -1; // (the gen moves again only once this rank comes)
    pthread_mutex_unlock(&w->mu);
    return rc;
}

/* publishes rank's call and opens the op (every rank came and called the same) */
static int open_op(struct td_comm *c, int op, size_t n, int root, const void *src) {
    struct td_comm_world *w = c->impl;
    struct rank_state *me = &w->r[c->rank];
    pthread_mutex_lock(&w->mu);
    me->call = (struct call){.op = op, .root = root, .n = n, .seq = ++me->seq, .src = src};
    pthread_mutex_unlock(&w->mu);
    return phase(w, c->rank, 1);
}

static int th_all_reduce(struct td_comm *c, float *buf, size_t n) {
    struct td_comm_world *w = c->impl;
    struct rank_state *me = &w->r[c->rank];
    if (n > me->scratch_n) { // (before the op: a rank out of memory fails the world, never hangs)
        float *s = realloc(me->scratch, n * sizeof(float));
        if (!s) {
            pthread_mutex_lock(&w->mu);
            fail_locked(w, "comm: rank %d is out of memory for an all_reduce of %zu floats",
                        c->rank, n);
            pthread_mutex_unlock(&w->mu);
            return -1;
        }
        me->scratch = s, me->scratch_n = n;
    }
    if (open_op(c, OP_ALL_REDUCE, n, 0, buf)) return -1;
    for (size_t i = 0; i < n; i++) { // rank order: the same bits on every rank
        float s = ((const float *)w->r[0].call.src)[i];
        for (int q = 1; q < w->world; q++)
            s += ((const float *)w->r[q].call.src)[i];
        me->scratch[i] = s;
    }
    if (phase(w, c->rank, 0)) return -1; // every rank has read every buffer
    memcpy(buf, me->scratch, n * sizeof(float));
    return 0;
}

static int th_all_gather(struct td_comm *c, const void *send, void *recv, size_t bytes) {
    struct td_comm_world *w = c->impl;
    if (open_op(c, OP_ALL_GATHER, bytes, 0, send)) return -1;
    for (int q = 0; q < w->world; q++)
        memmove((char *)recv + (size_t)q * bytes, w->r[q].call.src, bytes);
    return phase(w, c->rank, 0);
}

static int th_broadcast(struct td_comm *c, void *buf, size_t bytes, int root) {
    struct td_comm_world *w = c->impl;
    if (root < 0 || root >= w->world) {
        pthread_mutex_lock(&w->mu);
        fail_locked(w, "comm: rank %d broadcast from rank %d of a world of %d", c->rank, root,
                    w->world);
        pthread_mutex_unlock(&w->mu);
        return -1;
    }
    if (open_op(c, OP_BROADCAST, bytes, root, buf)) return -1;
    if (c->rank != root) memcpy(buf, w->r[root].call.src, bytes);
    return phase(w, c->rank, 0);
}

static int th_barrier(struct td_comm *c) {
    return open_op(c, OP_BARRIER, 0, 0, NULL);
}

static void th_abort(struct td_comm *c, const char *reason) {
    struct td_comm_world *w = c->impl;
    pthread_mutex_lock(&w->mu);
    fail_locked(w, "comm: rank %d aborted: %s", c->rank, reason ? reason : "(no reason)");
    pthread_mutex_unlock(&w->mu);
}

static int th_poll_error(struct td_comm *c, char *err, size_t errlen) {
    struct td_comm_world *w = c->impl;
    pthread_mutex_lock(&w->mu);
    int failed = w->failed;
    if (failed) td_errf(err, errlen, "%s", w->why);
    pthread_mutex_unlock(&w->mu);
    return failed ? -1 : 0;
}

static const struct td_comm_ops threads_ops = {.name = "threads",
                                               .all_reduce_sum_f32 = th_all_reduce,
                                               .all_gather = th_all_gather,
                                               .broadcast = th_broadcast,
                                               .barrier = th_barrier,
                                               .abort = th_abort,
                                               .poll_error = th_poll_error};

int td_comm_threads_world(struct td_comm_world **out, int world, double timeout_s, char *err,
                          size_t errlen) {
    *out = NULL;
    if (world < 1 || world > 1024)
        return td_errf(err, errlen, "comm: a world of %d ranks (1 to 1024)", world);
    if (!(timeout_s > 0.0) || timeout_s > 86400.0)
        return td_errf(err, errlen, "comm: a timeout of %g s (more than 0, at most a day)",
                       timeout_s);
    struct td_comm_world *w = calloc(1, sizeof *w);
    if (!w || !(w->r = calloc((size_t)world, sizeof *w->r))) {
        free(w);
        return td_errf(err, errlen, "comm: out of memory for a world of %d ranks", world);
    }
    w->world = world;
    w->timeout_s = timeout_s;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); // (deadline_after's clock)
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    *out = w;
    return 0;
}

void td_comm_threads(struct td_comm *c, struct td_comm_world *w, int rank) {
    *c = (struct td_comm){.rank = rank, .world = w->world, .ops = &threads_ops, .impl = w};
}

void td_comm_world_free(struct td_comm_world *w) {
    if (!w) return;
    for (int q = 0; q < w->world; q++)
        free(w->r[q].scratch);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w->r);
    free(w);
}

// ---------------------------------------------------------------------------------------------
// sockets: W processes, rank 0 joined to each other rank by a stream socket. Every op goes
// through rank 0: each other rank sends its call (and its data), rank 0 checks that the calls
// match its own, sums or gathers in rank order and sends each the result. A closed socket is a
// rank that ended; an abort travels as a message.

enum { MSG_CALL = 1, MSG_RESULT, MSG_ABORT };
#define SOCK_MAGIC 0x434d4454u /* "TDMC" */

struct sock_msg {
    uint32_t magic;
    int32_t type, op, root;
    uint64_t n; /* floats or bytes of the call; an abort: its reason's bytes */
    int64_t seq;
};

struct sock_comm {
    int *fd; /* rank 0: [world] (fd[q] to rank q, fd[0] unused); others: fd[0] to rank 0 */
    double timeout_s;
    int failed;
    char why[384];
    long seq;
    float *tmp;
    size_t tmp_n;
};

static void sock_fail(struct td_comm *c, const char *fmt, ...) {
    struct sock_comm *s = c->impl;
    if (s->failed) return;
    s->failed = 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->why, sizeof s->why, fmt, ap);
    va_end(ap);
}

/* all n bytes, or -1 (the peer closed, an error, or no byte for timeout_s when it is set) */
static int sock_read(struct td_comm *c, int q, int fd, void *buf, size_t n) {
    struct sock_comm *s = c->impl;
    for (size_t got = 0; got < n;) {
        if (s->timeout_s > 0) {
            struct pollfd pf = {.fd = fd, .events = POLLIN};
            int r = poll(&pf, 1, (int)(s->timeout_s * 1000));
            if (r == 0) {
                sock_fail(c, "comm: rank %d waited %.1f s for rank %d, which did not answer",
                          c->rank, s->timeout_s, q);
                return -1;
            }
            if (r < 0 && errno == EINTR) continue;
        }
        ssize_t r = recv(fd, (char *)buf + got, n - got, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            sock_fail(c, "comm: rank %d's connection closed (its process ended)", q);
            return -1;
        }
        got += (size_t)r;
    }
    return 0;
}

static int sock_write(struct td_comm *c, int q, int fd, const void *buf, size_t n) {
    for (size_t put = 0; put < n;) {
        ssize_t r = send(fd, (const char *)buf + put, n - put, MSG_NOSIGNAL);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            sock_fail(c, "comm: rank %d's connection closed (its process ended)", q);
            return -1;
        }
        put += (size_t)r;
    }
    return 0;
}

/* the failure's reason to the rank at fd (best effort: it may be gone) */
static void sock_tell(const struct sock_comm *s, int fd) {
    struct sock_msg m = {.magic = SOCK_MAGIC, .type = MSG_ABORT, .n = strlen(s->why)};
    if (send(fd, &m, sizeof m, MSG_NOSIGNAL) == (ssize_t)sizeof m)
        send(fd, s->why, m.n, MSG_NOSIGNAL);
}

/* rank 0: the failure's reason to every other rank */
static void sock_tell_all(struct td_comm *c) {
    const struct sock_comm *s = c->impl;
    for (int q = 1; q < c->world; q++)
        sock_tell(s, s->fd[q]);
}

/* a header from rank q (an abort's reason read and taken): 0, or -1 */
static int sock_header(struct td_comm *c, int q, int fd, struct sock_msg *m) {
    if (sock_read(c, q, fd, m, sizeof *m)) return -1;
    if (m->magic != SOCK_MAGIC) {
        sock_fail(c, "comm: rank %d sent a message that is not ours", q);
        return -1;
    }
    if (m->type == MSG_ABORT) {
        char why[384] = "";
        size_t n = m->n < sizeof why - 1 ? m->n : sizeof why - 1;
        if (!sock_read(c, q, fd, why, n)) sock_fail(c, "%s", why);
        return -1;
    }
    return 0;
}

/* a rank past 0: its call (and data) to rank 0, then rank 0's result into res */
static int sock_call(struct td_comm *c, int op, size_t n, int root, const void *data, size_t data_n,
                     void *res, size_t res_n) {
    struct sock_comm *s = c->impl;
    if (s->failed) return -1;
    struct sock_msg me = {
        .magic = SOCK_MAGIC, .type = MSG_CALL, .op = op, .root = root, .n = n, .seq = ++s->seq};
    struct sock_msg r;
    if (sock_write(c, 0, s->fd[0], &me, sizeof me) ||
        (data_n && sock_write(c, 0, s->fd[0], data, data_n)) || sock_header(c, 0, s->fd[0], &r))
        return -1;
    return res_n && sock_read(c, 0, s->fd[0], res, res_n) ? -1 : 0;
}

/* rank 0: every other rank's call, checked against its own, its data (data_n(q) bytes, when
 * root allows) into dst + (q - 1) * stride */
static int sock_gather(struct td_comm *c, int op, size_t n, int root, char *dst, size_t stride,
                       size_t data_n, int only_root) {
    struct sock_comm *s = c->impl;
    if (s->failed) return -1;
    long seq = ++s->seq;
    for (int q = 1; q < c->world; q++) {
        struct sock_msg m;
        if (sock_header(c, q, s->fd[q], &m)) {
            sock_tell_all(c);
            return -1;
        }
        if (m.op != op || m.n != n || m.root != root) {
            struct call a = {.op = op, .n = n, .root = root};
            struct call b = {.op = m.op, .n = m.n, .root = m.root};
            char da[96], db[96];
            describe(&a, da, sizeof da), describe(&b, db, sizeof db);
            sock_fail(c, "comm: the ranks disagree at op %ld: rank 0 called %s, rank %d %s", seq,
                      da, q, db);
            sock_tell_all(c);
            return -1;
        }
        if (data_n && (!only_root || q == root) &&
            sock_read(c, q, s->fd[q], dst + (size_t)(q - 1) * stride, data_n)) {
            sock_tell_all(c);
            return -1;
        }
    }
    return 0;
}

/* rank 0: each other rank's result (bytes of data, but none to skip) */
static int sock_results(struct td_comm *c, const void *data, size_t bytes, int skip) {
    struct sock_comm *s = c->impl;
    struct sock_msg r = {.magic = SOCK_MAGIC, .type = MSG_RESULT, .seq = s->seq};
    for (int q = 1; q < c->world; q++)
        if (sock_write(c, q, s->fd[q], &r, sizeof r) ||
            (bytes && q != skip && sock_write(c, q, s->fd[q], data, bytes))) {
            sock_tell_all(c);
            return -1;
        }
    return 0;
}

static int sock_tmp(struct td_comm *c, size_t bytes) {
    struct sock_comm *s = c->impl;
    if (bytes <= s->tmp_n) return 0;
    void *t = realloc(s->tmp, bytes);
    if (!t) {
        sock_fail(c, "comm: rank 0 is out of memory for %zu bytes of an op", bytes);
        sock_tell_all(c);
        return -1;
    }
    s->tmp = t, s->tmp_n = bytes;
    return 0;
}

static int sock_all_reduce(struct td_comm *c, float *buf, size_t n) {
    struct sock_comm *s = c->impl;
    size_t b = n * sizeof(float);
    if (c->rank) return sock_call(c, OP_ALL_REDUCE, n, 0, buf, b, buf, b);
    if (sock_tmp(c, b * (size_t)(c->world - 1)) ||
        sock_gather(c, OP_ALL_REDUCE, n, 0, (char *)s->tmp, b, b, 0))
        return -1;
    const float *t = (const float *)s->tmp;
    for (size_t i = 0; i < n; i++) { // rank order: the threads world's bits
        float v = buf[i];
        for (int q = 1; q < c->world; q++)
            v += t[(size_t)(q - 1) * n + i];
        buf[i] = v;
    }
    return sock_results(c, buf, b, 0);
}

static int sock_all_gather(struct td_comm *c, const void *send, void *recv, size_t bytes) {
    if (c->rank) return sock_call(c, OP_ALL_GATHER, bytes, 0, send, bytes, recv, bytes * c->world);
    memmove(recv, send, bytes);
    if (sock_gather(c, OP_ALL_GATHER, bytes, 0, (char *)recv + bytes, bytes, bytes, 0)) return -1;
    return sock_results(c, recv, bytes * c->world, 0);
}

static int sock_broadcast(struct td_comm *c, void *buf, size_t bytes, int root) {
    if (root < 0 || root >= c->world) {
        sock_fail(c, "comm: rank %d broadcast from rank %d of a world of %d", c->rank, root,
                  c->world);
        return -1;
    }
    if (c->rank)
        return sock_call(c, OP_BROADCAST, bytes, root, c->rank == root ? buf : NULL,
                         c->rank == root ? bytes : 0, c->rank == root ? NULL : buf,
                         c->rank == root ? 0 : bytes);
    // a root past 0 sends its bytes to rank 0 first (into buf), which sends them on
    if (sock_gather(c, OP_BROADCAST, bytes, root, (char *)buf, 0, root ? bytes : 0, 1)) return -1;
    return sock_results(c, buf, bytes, root);
}

static int sock_barrier(struct td_comm *c) {
    if (c->rank) return sock_call(c, OP_BARRIER, 0, 0, NULL, 0, NULL, 0);
    return sock_gather(c, OP_BARRIER, 0, 0, NULL, 0, 0, 0) || sock_results(c, NULL, 0, 0) ? -1 : 0;
}

static void sock_abort(struct td_comm *c, const char *reason) {
    struct sock_comm *s = c->impl;
    sock_fail(c, "comm: rank %d aborted: %s", c->rank, reason ? reason : "(no reason)");
    if (c->rank)
        sock_tell(s, s->fd[0]);
    else
        sock_tell_all(c);
}

static int sock_poll_error(struct td_comm *c, char *err, size_t errlen) {
    struct sock_comm *s = c->impl;
    if (s->failed) td_errf(err, errlen, "%s", s->why);
    return s->failed ? -1 : 0;
}

static int sock_peers_gone(struct td_comm *c, char *err, size_t errlen) {
    struct sock_comm *s = c->impl;
    for (int q = 0; q < c->world; q++) {
        // (a unix socket whose peer closed shows POLLHUP whatever is asked for)
        struct pollfd p = {.fd = s->fd[q], .events = 0};
        if (s->fd[q] >= 0 && poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR)))
            return td_errf(err, errlen, "comm: rank %d's connection closed (its process ended)", q);
    }
    return 0;
}

static const struct td_comm_ops sock_ops = {.name = "sockets",
                                            .all_reduce_sum_f32 = sock_all_reduce,
                                            .all_gather = sock_all_gather,
                                            .broadcast = sock_broadcast,
                                            .barrier = sock_barrier,
                                            .abort = sock_abort,
                                            .poll_error = sock_poll_error,
                                            .peers_gone = sock_peers_gone};

int td_comm_sockets(struct td_comm *c, int rank, int world, const int *fds, double timeout_s,
                    char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    if (world < 1 || world > 1024 || rank < 0 || rank >= world)
        return td_errf(err, errlen, "comm: rank %d of a world of %d (1 to 1024 ranks)", rank,
                       world);
    struct sock_comm *s = calloc(1, sizeof *s);
    if (!s || !(s->fd = calloc((size_t)world, sizeof(int)))) {
        free(s);
        return td_errf(err, errlen, "comm: out of memory");
    }
    for (int q = 0; q < world; q++)
        s->fd[q] = rank ? (q ? -1 : fds[0]) : (q ? fds[q] : -1);
    s->timeout_s = timeout_s;
    *c = (struct td_comm){.rank = rank, .world = world, .ops = &sock_ops, .impl = s};
    return 0;
}

void td_comm_sockets_free(struct td_comm *c) {
    struct sock_comm *s = c ? c->impl : NULL;
    if (!s) return;
    for (int q = 0; q < c->world; q++)
        if (s->fd[q] >= 0) close(s->fd[q]);
    free(s->fd);
    free(s->tmp);
    free(s);
    c->impl = NULL;
}

#ifndef TD_HAVE_NCCL
// ---------------------------------------------------------------------------------------------
// NCCL: not in this build (comm_nccl.cu)

int td_comm_nccl(struct td_comm *c, struct td_comm *ctrl, void *stream, double timeout_s, char *err,
                 size_t errlen) {
    (void)ctrl, (void)stream, (void)timeout_s;
    memset(c, 0, sizeof *c);
    return td_errf(err, errlen,
                   "comm: this build has no NCCL (make found no nccl.h: NVIDIA's wheel, pip's "
                   "nvidia-nccl-cu13, or NCCL_HOME=DIR)");
}

void td_comm_nccl_free(struct td_comm *c) {
    (void)c;
}

int td_comm_nccl_version(void) {
    return 0;
}
#endif
