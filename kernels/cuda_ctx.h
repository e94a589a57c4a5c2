/* cuda_ctx.h: a CUDA context: the queue every launcher puts its kernels on, and what the ops
 * keep between calls (cuBLASLt's handle, workspace and plans, each op's scratch, batch-invariant
 * mode, the backend's staging arena, side stream and timeline). A process has one, made with
 * its backend (td_backend_get("cuda:N")); a thread may make its own and use it from then on, so
 * that several ranks of a split model can live in one process on one GPU, each with its own
 * queue and state (parallel.md's one-GPU multi-rank test):
 *
 *   struct td_cuda_ctx *c = td_cuda_ctx_new(err, sizeof err);  // on the process's GPU
 *   if (!c) return -1;
 *   td_cuda_ctx_use(c);       // this thread's launchers and backend ops use it from here
 *   ...                       // engines made and run in this thread
 *   td_cuda_ctx_use(NULL);    // the process's again
 *   td_cuda_ctx_free(c);      // its queue drained, its state released
 *
 * A context's state is made at its first use by each op, outside any graph capture (each op's
 * reserve does it at start-up). */
#ifndef TD_CUDA_CTX_H
#define TD_CUDA_CTX_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct td_cuda_ctx;
/* a new context on the process's GPU (its backend made first), or NULL with a message */
struct td_cuda_ctx *td_cuda_ctx_new(char *err, size_t errlen);
/* the calling thread's context from now on (NULL: the process's) */
void td_cuda_ctx_use(struct td_cuda_ctx *c);
/* waits for c's queue, then releases its state and queue; not the process's, nor one in use */
void td_cuda_ctx_free(struct td_cuda_ctx *c);

#ifdef __cplusplus
}
#endif
#endif
