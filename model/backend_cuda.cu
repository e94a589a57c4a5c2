/* backend_cuda.cu: the CUDA backend: kernels/<op>.cu launchers on one stream, device memory
 * from cudaMalloc. Built only when nvcc is found (TD_HAVE_CUDA). */
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/backend.h"
#include "kernels/cuda_common.cuh"
#include "kernels/elementwise.h"
#include "kernels/matmul.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"

static int sync_each = -1;

extern "C" int td_cuda_pdl(void) {
    static int on = -1;
    if (on < 0) on = !(getenv("TD_PDL") && !atoi(getenv("TD_PDL")));
    return on;
}

extern "C" void td_cuda_after_launch(const char *file, int line) {
    cudaError_t e = cudaGetLastError();
#ifdef TD_DEBUG
    const int sync_default = 1; // a debug build reports a fault at the launch that made it
#else
    const int sync_default = 0;
#endif
    if (sync_each < 0) sync_each = getenv("TD_SYNC") ? atoi(getenv("TD_SYNC")) != 0 : sync_default;
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    cudaStreamIsCapturing(td_cuda_stream(), &cap);
    if (e == cudaSuccess && sync_each && cap == cudaStreamCaptureStatusNone)
        e = cudaStreamSynchronize(td_cuda_stream());
    if (e != cudaSuccess)
        td_abort(file, line, "%s (%s) after this launch", cudaGetErrorName(e),
                 cudaGetErrorString(e));
}

static void cu_copy(void *dst, const void *src, size_t bytes) {
    copy_bytes_cuda(dst, src, bytes); // a kernel: no copy engine between a step's kernels
}

static void *cu_alloc(size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    if (cudaMemset(p, 0, bytes ? bytes : 1) != cudaSuccess) {
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void cu_release(void *p) {
    cudaFree(p);
}

/* Host-to-device copies are queued, not waited for: the bytes go at once into a pinned
 * staging arena (so the caller may reuse its buffer) and a copy from there joins the stream.
 * Behind queued work, up to STAGE_KERNEL bytes (a step's plan) go by a kernel that reads the
 * arena over the bus (copy_bytes_cuda), which stays on the compute engine: the copy engine's
 * copy between two kernels cost 9.0 us for a 10 KB plan, the kernel 5.7 (TD_TIMELINE, a
 * DSpark round's insertion plan behind the verify step). Into an idle queue, and for larger
 * copies, the copy engine: there a kernel's launch is the wait (a round's block plan, uploaded
 * while the device waits for it: 8.3 us by the copy engine, 17.8 by a kernel). The arena is
 * reused after the stream has drained (finish, to_host, or a full arena). A synchronous
 * cudaMemcpy here waited for every queued kernel first: each step's plan upload and each
 * DSpark round's inputs cost a full pipeline drain. */
#define STAGE_KERNEL (64 << 10)
/* a context's (kernels/cuda_ctx.h): the arena, and the side stream below */
struct cu_state {
    char *stage, *stage_dev; /* the arena, and its address on the device */
    size_t stage_cap, stage_used;
    cudaStream_t side;
    cudaEvent_t side_ready, side_done;
};

static void cu_state_release(void *p) {
    struct cu_state *c = (struct cu_state *)p;
    if (c->stage) cudaFreeHost(c->stage);
    if (c->side) {
        cudaStreamSynchronize(c->side);
        cudaEventDestroy(c->side_ready), cudaEventDestroy(c->side_done);
        cudaStreamDestroy(c->side);
    }
}

static struct cu_state &cs(void) {
    return td_cuda_ctx_state<struct cu_state>(TD_CTX_BACKEND, cu_state_release);
}

static void cu_to_device(void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    cudaStreamIsCapturing(td_cuda_stream(), &cap);
    // a graph would replay the arena's later bytes
    if (cap != cudaStreamCaptureStatusNone)
        TD_ABORT("a host-to-device copy inside a graph capture");
    if (cs().stage_used + bytes > cs().stage_cap) {
        CUDA_CHECK(cudaStreamSynchronize(td_cuda_stream())); // the staged copies have landed
        cs().stage_used = 0;
        if (bytes > cs().stage_cap) {
            if (cs().stage) cudaFreeHost(cs().stage);
            cs().stage_cap = bytes > ((size_t)8 << 20) ? bytes : (size_t)8 << 20;
            CUDA_CHECK(cudaHostAlloc((void **)&cs().stage, cs().stage_cap, cudaHostAllocMapped));
            CUDA_CHECK(cudaHostGetDevicePointer((void **)&cs().stage_dev, cs().stage, 0));
        }
    }
    memcpy(cs().stage + cs().stage_used, src, bytes);
    if (bytes <= STAGE_KERNEL && cudaStreamQuery(td_cuda_stream()) == cudaErrorNotReady)
        copy_bytes_cuda(dst, cs().stage_dev + cs().stage_used, bytes);
    else
        CUDA_CHECK(cudaMemcpyAsync(dst, cs().stage + cs().stage_used, bytes, cudaMemcpyHostToDevice,
                                   td_cuda_stream()));
    cs().stage_used += (bytes + 255) & ~(size_t)255;
}

static void *cu_alloc_host(size_t bytes) {
    void *p = NULL;
    if (cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    memset(p, 0, bytes);
    return p;
}

static void cu_release_host(void *p) {
    cudaFreeHost(p);
}

/* on a side stream that waits for the work queued so far: the copy's own latency (6 us per
 * DSpark round in the main stream, TD_TIMELINE) is off the path of the kernels queued next.
 * finish and to_host wait for it too; wait_queued for it alone (side_done, after the last). */

static void cu_to_host_queued(void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    if (!cs().side) {
        CUDA_CHECK(cudaStreamCreate(&cs().side));
        CUDA_CHECK(cudaEventCreateWithFlags(&cs().side_ready, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&cs().side_done, cudaEventDisableTiming));
    }
    CUDA_CHECK(cudaEventRecord(cs().side_ready, td_cuda_stream()));
    CUDA_CHECK(cudaStreamWaitEvent(cs().side, cs().side_ready, 0));
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cs().side));
    CUDA_CHECK(cudaEventRecord(cs().side_done, cs().side));
}

static void tl_after_wait(void);
static int cu_wait_queued(char *err, size_t errlen) {
    cudaError_t e = cs().side ? cudaEventSynchronize(cs().side_done) : cudaSuccess;
    // the queued copy follows every point recorded so far (a step's "target" last): their times
    // are known (a run of steps that only waits here printed no timeline)
    if (e == cudaSuccess && cs().side) tl_after_wait();
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e != cudaSuccess) {
        snprintf(err, errlen, "cuda: %s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

// cudaMemcpy on the legacy stream orders itself with our (blocking) streams and returns after
// everything queued before it (another context's too, in a process of several)
static void cu_to_host(void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
    cs().stage_used = 0;
}

/* the timeline (TD_TIMELINE=1): events recorded at named points, read back at each finish (the
 * process's, whichever context records: a tool for one) */
#define TL_EVENTS 256
#define TL_NAMES  16
static int tl_on = -1, tl_n, tl_names;
static cudaEvent_t tl_ev[TL_EVENTS];
static int tl_at[TL_EVENTS];
static const char *tl_name[TL_NAMES];
static double tl_ms[TL_NAMES][TL_NAMES];
static long tl_count[TL_NAMES][TL_NAMES];

static void tl_print(void) {
    fprintf(stderr, "timeline (device time between points, TD_TIMELINE):\n");
    for (int a = 0; a < tl_names; a++)
        for (int b = 0; b < tl_names; b++)
            if (tl_count[a][b])
                fprintf(stderr, "  %-10s -> %-10s %9.1f us x %ld\n", tl_name[a], tl_name[b],
                        1e3 * tl_ms[a][b] / (double)tl_count[a][b], tl_count[a][b]);
}

// after the stream drained: every recorded point has a time; the last one starts the next run
static void tl_collect(void) {
    for (int i = 1; i < tl_n; i++) {
        float ms = 0.0f;
        if (cudaEventElapsedTime(&ms, tl_ev[i - 1], tl_ev[i]) != cudaSuccess) {
            cudaGetLastError();
            continue;
        }
        tl_ms[tl_at[i - 1]][tl_at[i]] += ms;
        tl_count[tl_at[i - 1]][tl_at[i]]++;
    }
    if (tl_n > 1) {
        cudaEvent_t e = tl_ev[0];
        tl_ev[0] = tl_ev[tl_n - 1], tl_ev[tl_n - 1] = e;
        tl_at[0] = tl_at[tl_n - 1];
        tl_n = 1;
    }
}

static void tl_after_wait(void) {
    if (tl_on > 0) tl_collect();
}

/* the profiler's window (TD_PROFILE_STEPS=A,B): the profiler runs from the A-th "step" point to
 * the B-th (counted from 1), so `ncu --profile-from-start off` sees just those steps' kernels */
static void profile_window(const char *name) {
    static int from = -1, to, steps;
    if (from < 0) {
        const char *s = getenv("TD_PROFILE_STEPS");
        from = 0;
        if (s && sscanf(s, "%d,%d", &from, &to) != 2) from = 0;
    }
    if (!from || strcmp(name, "step")) return;
    steps++;
    if (steps == from) cudaProfilerStart();
    if (steps == to) cudaProfilerStop();
}

static void cu_mark(const char *name) {
    profile_window(name);
    if (tl_on < 0) {
        tl_on = td_env_on("TD_TIMELINE");
        for (int i = 0; tl_on && i < TL_EVENTS; i++)
            if (cudaEventCreate(&tl_ev[i]) != cudaSuccess) tl_on = 0;
        if (tl_on) atexit(tl_print);
    }
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (!tl_on || cudaStreamIsCapturing(td_cuda_stream(), &cap) != cudaSuccess ||
        cap != cudaStreamCaptureStatusNone)
        return;
    int a = 0;
    while (a < tl_names && strcmp(tl_name[a], name))
        a++;
    if (a == TL_NAMES) return;
    if (a == tl_names) tl_name[tl_names++] = name;
    if (tl_n == TL_EVENTS) { // more points than events between two finishes: read them now
        cudaStreamSynchronize(td_cuda_stream());
        tl_collect();
    }
    cudaEventRecord(tl_ev[tl_n], td_cuda_stream());
    tl_at[tl_n++] = a;
}

static int cu_finish(char *err, size_t errlen) {
    cudaError_t e = cudaStreamSynchronize(td_cuda_stream());
    if (e == cudaSuccess && cs().side) e = cudaStreamSynchronize(cs().side);
    if (e == cudaSuccess) cs().stage_used = 0;
    if (e == cudaSuccess && tl_on > 0) tl_collect();
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e != cudaSuccess) {
        snprintf(err, errlen, "cuda: %s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

static size_t cu_free_bytes(void) {
    size_t fr = 0, total = 0;
    if (cudaMemGetInfo(&fr, &total) != cudaSuccess) return 0;
    return fr;
}

static int cu_graph_begin(void) {
    return cudaStreamBeginCapture(td_cuda_stream(), cudaStreamCaptureModeThreadLocal) == cudaSuccess
               ? 0
               : -1;
}

static void *cu_graph_end(void) {
    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    if (cudaStreamEndCapture(td_cuda_stream(), &g) != cudaSuccess || !g) {
        cudaGetLastError();
        return NULL;
    }
    cudaError_t e = cudaGraphInstantiate(&x, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return x;
}

static void cu_graph_launch(void *g) {
    CUDA_CHECK(cudaGraphLaunch((cudaGraphExec_t)g, td_cuda_stream()));
}

static void cu_graph_free(void *g) {
    if (g) cudaGraphExecDestroy((cudaGraphExec_t)g);
}

/* every op's start-up reserve (kernels/<op>.h), in turn: the first refusal is the answer */
static int cu_reserve(const struct td_reserve *r, char *err, size_t errlen) {
    int (*const reserve[])(const struct td_reserve *, char *, size_t) = {
        attention_cuda_reserve,   rope_cuda_reserve,    norm_rope_cuda_reserve,
        compress_cuda_reserve,    moe_cuda_reserve,     markov_cuda_reserve,
        matmul_cuda_reserve,      indexer_cuda_reserve, hc_cuda_reserve,
        sample_rows_cuda_reserve,
    };
    for (size_t i = 0; i < sizeof reserve / sizeof *reserve; i++)
        if (reserve[i](r, err, errlen)) return -1;
    return 0;
}

static void cu_set_deterministic(int on) {
    matmul_cuda_set_deterministic(on);
    moe_cuda_set_deterministic(on);
    attention_cuda_set_deterministic(on);
    hc_cuda_set_deterministic(on);
}

static void *cu_queue(void) {
    return td_cuda_stream();
}

static int cu_identify(char *id, size_t idlen) {
    int dev = 0;
    cudaDeviceProp prop;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess ||
        cudaDeviceGetPCIBusId(id, (int)idlen, dev) != cudaSuccess) {
        cudaGetLastError();
        snprintf(id, idlen, "?");
        return 0;
    }
    return prop.major * 10 + prop.minor;
}

static const struct td_backend cuda_backend = {
    .name = "cuda",
    .on_device = 1,
    .sample_cuts = 1, // top-k / top-p rows too (sample_cut_kernel)
    .ops = {.embed = embed_cuda,
            .matmul = matmul_cuda,
            .matmul_grouped = matmul_grouped_cuda,
            .rmsnorm = rmsnorm_cuda,
            .rope_rows = rope_rows_cuda,
            .hc_pre = hc_pre_cuda,
            .hc_post = hc_post_cuda,
            .hc_head = hc_head_cuda,
            .compress_emit = compress_emit_cuda,
            .ring_store = ring_store_parts_cuda,
            .ring_load = ring_load_cuda,
            .kv_store = kv_store_cuda,
            .indexer_topk = indexer_topk_cuda,
            .attention_rows = attention_rows_cuda,
            .moe_route_rows = moe_route_rows_cuda,
            .moe_experts = moe_experts_cuda,
            .moe_experts_slots = moe_experts_slots_cuda,
            .moe_combine_slots = moe_combine_slots_cuda,
            .add = add_cuda,
            .scale = scale_cuda,
            .swiglu_act = swiglu_act_cuda,
            .add_bcast = add_bcast_cuda,
            .copy = cu_copy,
            .patch_ids = patch_ids_cuda,
            .fill_uniform = fill_uniform_cuda,
            .fill_quant = fill_quant_cuda,
            .markov_greedy = markov_greedy_cuda,
            .greedy_slot = greedy_slot_cuda,
            .sample_rows = sample_rows_cuda,
            .norm_rope = norm_rope_cuda,
            .matmul_set = matmul_set_cuda},
    .alloc = cu_alloc,
    .release = cu_release,
    .to_device = cu_to_device,
    .to_host = cu_to_host,
    .finish = cu_finish,
    .free_bytes = cu_free_bytes,
    .set_deterministic = cu_set_deterministic,
    .graph_begin = cu_graph_begin,
    .graph_end = cu_graph_end,
    .graph_launch = cu_graph_launch,
    .graph_free = cu_graph_free,
    .reserve = cu_reserve,
    .mark = cu_mark,
    .alloc_host = cu_alloc_host,
    .release_host = cu_release_host,
    .to_host_queued = cu_to_host_queued,
    .wait_queued = cu_wait_queued,
    .moe_fold_shared = moe_cuda_fold_shared,
    .queue = cu_queue,
    .identify = cu_identify,
};

extern "C" int td_backend_gpus(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

static int the_device = -1; /* the process's GPU: its contexts' queues and state live there */

extern "C" const struct td_backend *td_backend_cuda(int device, char *err, size_t errlen) {
    if (td_cuda_has_process_stream() && device == the_device) return &cuda_backend;
    if (td_cuda_has_process_stream()) {
        snprintf(err, errlen,
                 "backend cuda:%d: this process already runs on GPU %d (one GPU a process)", device,
                 the_device);
        return NULL;
    }
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        snprintf(err, errlen, "backend cuda: no usable GPU (%s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "no device");
        cudaGetLastError();
        return NULL;
    }
    if (device >= n) {
        snprintf(err, errlen, "backend cuda:%d: this host shows %d GPU%s (0 .. %d)", device, n,
                 n == 1 ? "" : "s", n - 1);
        return NULL;
    }
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess || prop.major < 9) {
        snprintf(err, errlen,
                 "backend cuda: device %d is compute capability %d.%d; this build "
                 "targets sm_90a (rebuild with make CUARCH=...)",
                 device, prop.major, prop.minor);
        return NULL;
    }
    if (cudaSetDevice(device) != cudaSuccess) {
        cudaGetLastError();
        snprintf(err, errlen, "backend cuda: cannot use device %d", device);
        return NULL;
    }
    the_device = device;
    if (td_cuda_process_stream()) {
        snprintf(err, errlen, "backend cuda: cannot create a stream");
        return NULL;
    }
    return &cuda_backend;
}
