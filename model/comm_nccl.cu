/* comm_nccl.cu: the NCCL communicator (comm.h td_comm_nccl), one GPU a process. Built where
 * make finds nccl.h (TD_HAVE_NCCL); comm.c says why not elsewhere.
 *
 * The communicator is non-blocking (ncclConfig_t.blocking = 0): a call may return
 * ncclInProgress, and is queued once ncclCommGetAsyncError says ncclSuccess. A watchdog thread
 * polls NCCL's error and the host communicator's peers every 50 ms and aborts the communicator
 * at the first failure: ncclCommAbort ends the kernels that wait on a rank that is gone, so the
 * host's wait on the stream returns and the step reports the reason. */
#ifdef TD_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "model/comm.h"
#include "kernels/err.h"

struct nccl_comm {
    ncclComm_t comm;
    cudaStream_t stream;
    struct td_comm *ctrl;
    double timeout_s;
    float *one; /* a float on the device (barrier) */
    pthread_t dog;
    int dog_on;
    pthread_mutex_t mu;
    int stop;            /* the watchdog ends */
    int failed, aborted; /* (under mu) */
    char why[512];       /* the first failure */
};

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Every NCCL call on the communicator is made under mu, so the watchdog's abort (which frees
 * it) never runs beside another call, and a call after the abort sees the failure first. */

/* the first failure's reason is kept; the communicator is aborted once (any thread, mu not held) */
static void fail_abort(struct nccl_comm *s, const char *fmt, ...) {
    pthread_mutex_lock(&s->mu);
    if (!s->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(s->why, sizeof s->why, fmt, ap);
        va_end(ap);
        s->failed = 1;
    }
    if (!s->aborted && s->comm) ncclCommAbort(s->comm); // (frees it: no call uses it after)
    s->aborted = 1;
    pthread_mutex_unlock(&s->mu);
}

static int is_failed(struct nccl_comm *s) {
    pthread_mutex_lock(&s->mu);
    int f = s->failed;
    pthread_mutex_unlock(&s->mu);
    return f;
}

/* r once NCCL has settled it: ncclInProgress is polled (the communicator's error) until it is
 * something else or limit_s seconds have passed (0: no limit); ncclInternalError when the
 * communicator was aborted meanwhile */
static ncclResult_t settled(struct nccl_comm *s, ncclResult_t r, double limit_s) {
    double t0 = now_s();
    while (r == ncclInProgress && !(limit_s > 0 && now_s() - t0 > limit_s)) {
        usleep(100);
        pthread_mutex_lock(&s->mu);
        if (s->aborted || ncclCommGetAsyncError(s->comm, &r) != ncclSuccess) r = ncclInternalError;
        pthread_mutex_unlock(&s->mu);
    }
    return r;
}

/* a call's result: 0 once queued (or done), else the world fails with what and why */
static int settle(struct nccl_comm *s, ncclResult_t r, const char *what) {
    r = settled(s, r, s->timeout_s);
    if (r == ncclSuccess) return 0;
    if (r == ncclInProgress)
        fail_abort(s, "comm: NCCL's %s did not complete in %.0f s (a rank did not join)", what,
                   s->timeout_s);
    else if (!is_failed(s)) { // (an abort's own reason stays)
        char last[300] = "";
        pthread_mutex_lock(&s->mu);
        if (!s->aborted) snprintf(last, sizeof last, "%s", ncclGetLastError(s->comm));
        pthread_mutex_unlock(&s->mu);
        fail_abort(s, "comm: NCCL's %s failed: %s (%s)", what, ncclGetErrorString(r), last);
    }
    return -1;
}

/* call() on the communicator under mu, then settled: 0, or -1 once the world has failed */
template <class F> static int nc_call(struct nccl_comm *s, const char *what, F call) {
    pthread_mutex_lock(&s->mu);
    int failed = s->failed;
    ncclResult_t r = failed ? ncclInternalError : call();
    pthread_mutex_unlock(&s->mu);
    return failed ? -1 : settle(s, r, what);
}

static void *watchdog(void *arg) {
    struct td_comm *c = (struct td_comm *)arg;
    struct nccl_comm *s = (struct nccl_comm *)c->impl;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        int stop = s->stop || s->aborted;
        pthread_mutex_unlock(&s->mu);
        if (stop) break;
        ncclResult_t r = ncclSuccess;
        char why[400], last[300] = "";
        pthread_mutex_lock(&s->mu);
        if (s->aborted || ncclCommGetAsyncError(s->comm, &r) != ncclSuccess) r = ncclSuccess;
        if (r != ncclSuccess && r != ncclInProgress)
            snprintf(last, sizeof last, "%s", ncclGetLastError(s->comm));
        pthread_mutex_unlock(&s->mu);
        if (r != ncclSuccess && r != ncclInProgress)
            fail_abort(s, "comm: NCCL failed on rank %d: %s (%s)", c->rank, ncclGetErrorString(r),
                       last);
        else if (s->ctrl && s->ctrl->ops->peers_gone &&
                 s->ctrl->ops->peers_gone(s->ctrl, why, sizeof why))
            fail_abort(s, "%s", why);
        usleep(50 * 1000);
    }
    return NULL;
}

static int nc_all_reduce(struct td_comm *c, float *buf, size_t n) {
    struct nccl_comm *s = (struct nccl_comm *)c->impl;
    return nc_call(s, "all-reduce", [&] {
        return ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, s->comm, s->stream);
    });
}

static int nc_all_gather(struct td_comm *c, const void *send, void *recv, size_t bytes) {
    struct nccl_comm *s = (struct nccl_comm *)c->impl;
    return nc_call(s, "all-gather",
                   [&] { return ncclAllGather(send, recv, bytes, ncclUint8, s->comm, s->stream); });
}

static int nc_broadcast(struct td_comm *c, void *buf, size_t bytes, int root) {
    struct nccl_comm *s = (struct nccl_comm *)c->impl;
    if (is_failed(s)) return -1;
    if (root < 0 || root >= c->world) {
        fail_abort(s, "comm: rank %d broadcast from rank %d of a world of %d", c->rank, root,
                   c->world);
        return -1;
    }
    return nc_call(s, "broadcast", [&] {
        return ncclBroadcast(buf, buf, bytes, ncclUint8, root, s->comm, s->stream);
    });
}

/* an all-reduce of one float, waited for on the host (the watchdog ends a wait on a dead rank) */
static int nc_barrier(struct td_comm *c) {
    struct nccl_comm *s = (struct nccl_comm *)c->impl;
    if (nc_all_reduce(c, s->one, 1)) return -1;
    cudaError_t e = cudaStreamSynchronize(s->stream);
    if (e != cudaSuccess && !is_failed(s))
        fail_abort(s, "comm: a barrier's wait failed: %s", cudaGetErrorString(e));
    return is_failed(s) ? -1 : 0;
}

static void nc_abort(struct td_comm *c, const char *reason) {
    struct nccl_comm *s = (struct nccl_comm *)c->impl;
    fail_abort(s, "comm: rank %d aborted: %s", c->rank, reason ? reason : "(no reason)");
    if (s->ctrl) s->ctrl->ops->abort(s->ctrl, reason); // the other ranks hear it there
}

static int nc_poll_error(struct td_comm *c, char *err, size_t errlen) {
    struct nccl_comm *s = (struct nccl_comm *)c->impl;
    pthread_mutex_lock(&s->mu);
    int f = s->failed;
    if (f) td_errf(err, errlen, "%s", s->why);
    pthread_mutex_unlock(&s->mu);
    return f ? -1 : 0;
}

static const struct td_comm_ops nccl_ops = {.name = "nccl",
                                            .all_reduce_sum_f32 = nc_all_reduce,
                                            .all_gather = nc_all_gather,
                                            .broadcast = nc_broadcast,
                                            .barrier = nc_barrier,
                                            .abort = nc_abort,
                                            .poll_error = nc_poll_error,
                                            .peers_gone = NULL};

extern "C" int td_comm_nccl_version(void) {
    int v = 0;
    return ncclGetVersion(&v) == ncclSuccess ? v : 0;
}

extern "C" int td_comm_nccl(struct td_comm *c, struct td_comm *ctrl, void *stream, double timeout_s,
                            char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    setenv("NCCL_NVLS_ENABLE", "0", 1); // before NCCL's first call in this process
    int rank = ctrl->rank, world = ctrl->world;
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ncclResult_t r = rank == 0 ? ncclGetUniqueId(&id) : ncclSuccess;
    if (r != ncclSuccess) { // the others wait in the broadcast: they hear why
        char why[300];
        snprintf(why, sizeof why, "NCCL's unique id: %s", ncclGetErrorString(r));
        ctrl->ops->abort(ctrl, why);
        return td_errf(err, errlen, "comm: rank 0: %s", why);
    }
    if (ctrl->ops->broadcast(ctrl, &id, sizeof id, 0))
        return ctrl->ops->poll_error(ctrl, err, errlen);
    struct nccl_comm *s = (struct nccl_comm *)calloc(1, sizeof *s);
    if (!s) return td_errf(err, errlen, "comm: out of memory");
    pthread_mutex_init(&s->mu, NULL);
    s->stream = (cudaStream_t)stream, s->ctrl = ctrl, s->timeout_s = timeout_s;
    if (cudaMalloc(&s->one, sizeof(float)) != cudaSuccess) {
        cudaGetLastError();
        free(s);
        return td_errf(err, errlen, "comm: out of device memory");
    }
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    *c = (struct td_comm){.rank = rank, .world = world, .device = 1, .ops = &nccl_ops, .impl = s};
    r = ncclCommInitRankConfig(&s->comm, world, id, rank, &cfg);
    if (settle(s, r, "join") == 0 && !pthread_create(&s->dog, NULL, watchdog, c)) s->dog_on = 1;
    if (!s->dog_on) {
        if (!s->failed) fail_abort(s, "comm: cannot start the watchdog thread");
        nc_poll_error(c, err, errlen);
        ctrl->ops->abort(ctrl, err);
        td_comm_nccl_free(c);
        return -1;
    }
    return 0;
}

extern "C" void td_comm_nccl_free(struct td_comm *c) {
    struct nccl_comm *s = c ? (struct nccl_comm *)c->impl : NULL;
    if (!s) return;
    if (s->dog_on) {
        pthread_mutex_lock(&s->mu);
        s->stop = 1;
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->dog, NULL);
    }
    if (s->comm && !s->aborted) { // finalized (its queued work done), then destroyed; an abort
                                  // frees it itself, and ends a finalize that hangs
        ncclResult_t r = settled(s, ncclCommFinalize(s->comm), 10.0);
        if (r == ncclSuccess)
            ncclCommDestroy(s->comm);
        else
            ncclCommAbort(s->comm);
    }
    cudaFree(s->one);
    pthread_mutex_destroy(&s->mu);
    free(s);
    c->impl = NULL;
}
#endif
