/* comm.h: the ranks of one model split over several workers, and what they exchange
 * (parallel.md section 5.3). A small table beside td_backend: each op works on raw buffers of
 * the rank's backend, in the backend's queue order, and returns 0, or -1 once the world has
 * failed (a rank aborted, ranks disagreed about the op, or one did not come in time), with the
 * reason from poll_error. No op ever waits for ever: a rank that dies ends the others' ops.
 *
 *   struct td_comm_world *w;  // W ranks as threads of one process (the CPU tests)
 *   if (td_comm_threads_world(&w, world, 10.0, err, sizeof err)) return -1;
 *   struct td_comm c;         // in rank r's thread (each rank its own)
 *   td_comm_threads(&c, w, r);
 *   if (c.ops->all_reduce_sum_f32(&c, buf, n)) c.ops->poll_error(&c, err, sizeof err);
 *   td_comm_world_free(w);    // once every rank's thread is done
 *
 * td_comm_self makes the one-rank communicator, whose ops do nothing.
 *
 * Sums are exact functions of their inputs: all_reduce_sum_f32 adds the ranks' values in rank
 * order 0, 1, .., W - 1 (the same bits on every rank and in every run); the expert combine that
 * needs bits equal to one rank's sends disjoint slots (one nonzero addend each), which any order
 * sums exactly.
 */
#ifndef TD_COMM_H
#define TD_COMM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct td_comm;

struct td_comm_ops {
    const char *name;
    /* buf[0 .. n) = the sum over ranks of each rank's buf, added in rank order */
    int (*all_reduce_sum_f32)(struct td_comm *c, float *buf, size_t n);
    /* recv[r * bytes .. (r + 1) * bytes) = rank r's send[0 .. bytes), on every rank */
    int (*all_gather)(struct td_comm *c, const void *send, void *recv, size_t bytes);
    /* every rank's buf[0 .. bytes) = root's */
    int (*broadcast)(struct td_comm *c, void *buf, size_t bytes, int root);
    int (*barrier)(struct td_comm *c);
    /* ends the world: every rank's waiting and later ops return -1 with this reason */
    void (*abort)(struct td_comm *c, const char *reason);
    /* 0 while the world is whole; else -1 and why it failed */
    int (*poll_error)(struct td_comm *c, char *err, size_t errlen);
    /* -1 and which when another rank's process has ended, read without taking any message and
     * safe beside the rank's own ops from another thread (a device communicator's watchdog);
     * NULL where the implementation cannot tell */
    int (*peers_gone)(struct td_comm *c, char *err, size_t errlen);
};

struct td_comm {
    int rank, world;
    int device; /* 1: the ops take device buffers and are queued on the backend's stream: they
                   return once queued (legal inside a graph capture), a failure shows later in
                   poll_error; 0: host buffers, done when the op returns */
    const struct td_comm_ops *ops;
    void *impl;
};

/* one rank: the ops do nothing (the one-GPU and CPU engines) */
void td_comm_self(struct td_comm *c);

/* W ranks as threads of one process, each calling the ops from its own thread. An op that waits
 * longer than timeout_s seconds for the other ranks fails the world, naming the op, its number
 * in the rank's sequence and the ranks that had not come. Ranks that call different ops (or the
 * same op with other sizes or roots) at the same point fail it too, naming both calls. */
struct td_comm_world;
int td_comm_threads_world(struct td_comm_world **out, int world, double timeout_s, char *err,
                          size_t errlen);
void td_comm_threads(struct td_comm *c, struct td_comm_world *w, int rank);
void td_comm_world_free(struct td_comm_world *w);

/* W processes joined by stream sockets (a socketpair made before a fork, later a TCP
 * rendezvous): rank 0 holds fds[q], its socket to rank q (fds[0] unused); another rank holds
 * fds[0], its socket to rank 0. Every op goes through rank 0, which checks that the calls match,
 * sums in rank order (the threads world's bits) or gathers, and answers each rank. A rank whose
 * process ends closes its socket: the others' ops fail naming it. timeout_s > 0: an op that
 * waits longer for a rank fails too; 0: it waits (a follower waits for the leader's next step
 * as long as the leader lives). The sockets are the communicator's from here (closed by
 * td_comm_sockets_free). */
int td_comm_sockets(struct td_comm *c, int rank, int world, const int *fds, double timeout_s,
                    char *err, size_t errlen);
void td_comm_sockets_free(struct td_comm *c);

/* NCCL: W processes, one GPU each (built where NCCL's header is found: td_comm_nccl_version()
 * is then its version). Collective: rank 0 makes NCCL's unique id and sends it over ctrl, the
 * ranks' host communicator (which stays theirs for control traffic: plans, manifests); every
 * rank joins non-blocking on its current GPU, and a join that takes longer than timeout_s fails
 * on every rank. NCCL_NVLS_ENABLE=0 is set first (no NVLink multicast: parallel.md 2.5). The
 * ops take device buffers on stream (a cudaStream_t: the backend's queue) and return once
 * queued (c->device is 1); sums are NCCL's, exact where one rank's addend is nonzero (the
 * experts' slots). A watchdog thread aborts the communicator (ncclCommAbort, which ends
 * kernels waiting on a rank) when NCCL reports an error or ctrl's peers_gone names a rank
 * whose process ended, so a rank that dies ends the others' waits with its reason. */
int td_comm_nccl(struct td_comm *c, struct td_comm *ctrl, void *stream, double timeout_s, char *err,
                 size_t errlen);
void td_comm_nccl_free(struct td_comm *c);
int td_comm_nccl_version(void); /* NCCL's version code (e.g. 22805), 0 when built without it */

#ifdef __cplusplus
}
#endif
#endif
