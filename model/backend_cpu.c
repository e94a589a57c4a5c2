/* backend_cpu.c: the CPU backend: kernels/<op>_ref.c over host memory. */
#include "backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/elementwise.h"
#include "kernels/err.h"
#include "kernels/matmul.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"

static void *cpu_alloc(size_t bytes) {
    return calloc(1, bytes ? bytes : 1);
}
static void cpu_release(void *p) {
    free(p);
}
static void cpu_copy(void *dst, const void *src, size_t bytes) {
    memcpy(dst, src, bytes);
}
static int cpu_finish(char *err, size_t errlen) {
    (void)err;
    (void)errlen;
    return 0;
}
static size_t cpu_free_bytes(void) {
    long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? (size_t)pages * (size_t)page : (size_t)1 << 32;
}

static const struct td_backend cpu = {
    "cpu",
    0,
    {embed_ref,
     matmul_ref,
     matmul_grouped_ref,
     rmsnorm_ref,
     rope_rows_ref,
     hc_pre_ref,
     hc_post_ref,
     hc_head_ref,
     compress_emit_ref,
     ring_store_parts_ref,
     indexer_topk_ref,
     attention_rows_ref,
     moe_route_rows_ref,
     moe_experts_ref,
     add_ref,
     scale_ref,
     swiglu_act_ref,
     add_bcast_ref,
     cpu_copy,
     fill_uniform_ref,
     markov_greedy_ref,
     greedy_slot_ref,
     argmax_rows_ref,
     norm_rope_parts_ref,
     matmul_set_ref},
    cpu_alloc,
    cpu_release,
    cpu_copy,
    cpu_copy,
    cpu_finish,
    cpu_free_bytes,
    NULL,
    NULL,
    NULL,
    NULL,
    NULL,
    NULL,
    NULL,
    cpu_alloc,
    cpu_release,
    cpu_copy,
    cpu_finish,
    NULL,
};

const struct td_backend *td_backend_cpu(void) {
    return &cpu;
}

#ifdef TD_HAVE_CUDA
const struct td_backend *td_backend_cuda(char *err, size_t errlen);
#endif

const struct td_backend *td_backend_get(const char *name, char *err, size_t errlen) {
    if (!strcmp(name, "cpu")) return &cpu;
    if (!strcmp(name, "cuda") || !strcmp(name, "auto")) {
#ifdef TD_HAVE_CUDA
        const struct td_backend *b = td_backend_cuda(err, errlen);
        if (b || !strcmp(name, "cuda")) return b;
#else
        if (!strcmp(name, "cuda")) {
            td_errf(err, errlen, "backend cuda: this build has no CUDA (nvcc was not found)");
            return NULL;
        }
#endif
        return &cpu;
    }
    td_errf(err, errlen, "unknown backend '%s' (cpu, cuda or auto)", name);
    return NULL;
}
