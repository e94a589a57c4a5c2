/* cuda_ctx.cu: CUDA contexts (cuda_ctx.h): the process's, made with its backend, and any a
 * thread makes and uses; each holds its queue and the ops' state by slot (cuda_common.cuh
 * td_cuda_state). */
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"
#include "cuda_ctx.h"

struct td_cuda_ctx {
    cudaStream_t stream;
    void *state[TD_CTX_SLOTS];
    void (*release[TD_CTX_SLOTS])(void *state);
};

static struct td_cuda_ctx process_ctx;
static thread_local struct td_cuda_ctx *cur;

static struct td_cuda_ctx *ctx(void) {
    return cur ? cur : &process_ctx;
}

extern "C" cudaStream_t td_cuda_stream(void) {
    return ctx()->stream;
}

void *td_cuda_state(int slot, size_t bytes, void (*release)(void *state)) {
    struct td_cuda_ctx *c = ctx();
    TD_ASSERT(slot >= 0 && slot < TD_CTX_SLOTS);
    if (!c->state[slot]) {
        if (!(c->state[slot] = calloc(1, bytes))) TD_ABORT("out of memory for a CUDA op's state");
        c->release[slot] = release;
    }
    return c->state[slot];
}

int td_cuda_process_stream(void) {
    if (process_ctx.stream) return 0;
    return cudaStreamCreate(&process_ctx.stream) == cudaSuccess ? 0 : -1;
}

int td_cuda_has_process_stream(void) {
    return process_ctx.stream != NULL;
}

extern "C" struct td_cuda_ctx *td_cuda_ctx_new(char *err, size_t errlen) {
    if (!process_ctx.stream) {
        td_errf(err, errlen, "cuda: a context is made after the process's backend (cuda:N)");
        return NULL;
    }
    struct td_cuda_ctx *c = (struct td_cuda_ctx *)calloc(1, sizeof *c);
    if (!c || cudaStreamCreate(&c->stream) != cudaSuccess) {
        cudaGetLastError();
        free(c);
        td_errf(err, errlen, "cuda: cannot make a context (a stream)");
        return NULL;
    }
    return c;
}

extern "C" void td_cuda_ctx_use(struct td_cuda_ctx *c) {
    cur = c;
}

extern "C" void td_cuda_ctx_free(struct td_cuda_ctx *c) {
    if (!c || c == &process_ctx || c == cur) return;
    cudaStreamSynchronize(c->stream);
    struct td_cuda_ctx *was = cur;
    cur = c; // (an op's release frees what it made in this context)
    for (int s = 0; s < TD_CTX_SLOTS; s++)
        if (c->state[s]) {
            if (c->release[s]) c->release[s](c->state[s]);
            free(c->state[s]);
        }
    cur = was;
    cudaStreamDestroy(c->stream);
    free(c);
}
