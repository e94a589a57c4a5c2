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
/* memory the host can still give: Linux's MemAvailable (free pages and the page cache it can
 * drop), else the free pages */
static size_t cpu_free_bytes(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[128];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    if (f) fclose(f);
    if (kb) return (size_t)kb << 10;
    long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? (size_t)pages * (size_t)page : (size_t)1 << 32;
}

static const struct td_backend cpu = {
    .name = "cpu",
    .on_device = 0,
    .sample_cuts = 1,
    .ops = {.embed = embed_ref,
            .matmul = matmul_ref,
            .matmul_grouped = matmul_grouped_ref,
            .rmsnorm = rmsnorm_ref,
            .rope_rows = rope_rows_ref,
            .hc_pre = hc_pre_ref,
            .hc_post = hc_post_ref,
            .hc_head = hc_head_ref,
            .compress_emit = compress_emit_ref,
            .ring_store = ring_store_parts_ref,
            .ring_load = ring_load_ref,
            .kv_store = kv_store_ref,
            .indexer_topk = indexer_topk_ref,
            .attention_rows = attention_rows_ref,
            .moe_route_rows = moe_route_rows_ref,
            .moe_experts = moe_experts_ref,
            .moe_experts_slots = moe_experts_slots_ref,
            .moe_combine_slots = moe_combine_slots_ref,
            .add = add_ref,
            .scale = scale_ref,
            .swiglu_act = swiglu_act_ref,
            .add_bcast = add_bcast_ref,
            .copy = cpu_copy,
            .patch_ids = patch_ids_ref,
            .fill_uniform = fill_uniform_ref,
            .fill_quant = fill_quant_ref,
            .markov_greedy = markov_greedy_ref,
            .greedy_slot = greedy_slot_ref,
            .sample_rows = sample_rows_ref,
            .norm_rope = norm_rope_parts_ref,
            .matmul_set = matmul_set_ref},
    .alloc = cpu_alloc,
    .release = cpu_release,
    .to_device = cpu_copy,
    .to_host = cpu_copy,
    .finish = cpu_finish,
    .free_bytes = cpu_free_bytes,
    // NULL (left out): set_deterministic (the references always are), graph_begin, graph_end,
    // graph_launch, graph_free (no step graphs), reserve (no internal scratch to size), mark
    // (no timeline), moe_fold_shared (the shared expert always runs as one more pick)
    .alloc_host = cpu_alloc,
    .release_host = cpu_release,
    .to_host_queued = cpu_copy,
    .wait_queued = cpu_finish,
};

const struct td_backend *td_backend_cpu(void) {
    return &cpu;
}

#ifdef TD_HAVE_CUDA
const struct td_backend *td_backend_cuda(int device, char *err, size_t errlen);
#else
int td_backend_gpus(void) {
    return 0;
}
#endif

const struct td_backend *td_backend_get(const char *name, char *err, size_t errlen) {
    if (!strcmp(name, "cpu")) return &cpu;
    int device = 0;
    if (!strncmp(name, "cuda:", 5)) {
        char *end;
        long v = strtol(name + 5, &end, 10);
        if (!name[5] || *end || v < 0 || v > 1023) {
            td_errf(err, errlen, "backend '%s': expected cuda:N with N a GPU's number", name);
            return NULL;
        }
        device = (int)v;
    }
    int cuda = !strcmp(name, "cuda") || !strncmp(name, "cuda:", 5);
    if (cuda || !strcmp(name, "auto")) {
#ifdef TD_HAVE_CUDA
        const struct td_backend *b = td_backend_cuda(device, err, errlen);
        if (b || cuda) return b;
#else
        (void)device;
        if (cuda) {
            td_errf(err, errlen, "backend cuda: this build has no CUDA (nvcc was not found)");
            return NULL;
        }
#endif
        return &cpu;
    }
    td_errf(err, errlen, "unknown backend '%s' (cpu, cuda, cuda:N or auto)", name);
    return NULL;
}
