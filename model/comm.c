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
#include <time.h>

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
