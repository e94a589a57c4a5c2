/* cuda_common.cuh: shared device helpers for kernels/<op>.cu: error checks, the stream every
 * launch goes to, dtype-generic loads, block reductions. Included by .cu files only. */
#ifndef TD_CUDA_COMMON_CUH
#define TD_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include "dtype.h"
#include "err.h"
#include "reserve.h"
#include "rows.h"

/* one check for every library status: evaluates x once; anything but ok aborts (err.h's
 * TD_ABORT) with the status's name, its text and the statement. CUDA_CHECK and CUBLAS_CHECK
 * (matmul.cu) are its instances. */
#define TD_STATUS_CHECK(x, type, ok, name_of, text_of)                                             \
    do {                                                                                           \
        type st_ = (x);                                                                            \
        if (st_ != (ok))                                                                           \
            td_abort(__FILE__, __LINE__, "%s (%s): %s", name_of(st_), text_of(st_), #x);           \
    } while (0)
#define CUDA_CHECK(x)                                                                              \
    TD_STATUS_CHECK(x, cudaError_t, cudaSuccess, cudaGetErrorName, cudaGetErrorString)

/* after every launch; TD_SYNC=1 in the environment also synchronises, so an asynchronous fault
 * is reported at the kernel that caused it */
#define LAUNCH_CHECK() td_cuda_after_launch(__FILE__, __LINE__)

extern "C" void td_cuda_after_launch(const char *file, int line);
extern "C" int td_cuda_pdl(void);

/* The calling thread's CUDA context (cuda_ctx.h; cuda_ctx.cu): the stream every launch goes to,
 * and each op's state in its slot, zeroed at its first use and, when the context is freed,
 * given to release (its device buffers) then freed. The state's address is stable for the
 * context's life. */
enum td_ctx_slot {
    TD_CTX_BACKEND, /* model/backend_cuda.cu: the staging arena, the side stream */
    TD_CTX_MATMUL,
    TD_CTX_MOE,
    TD_CTX_GREEDY,
    TD_CTX_HC,
    TD_CTX_INDEXER,
    TD_CTX_ATTENTION,
    TD_CTX_SLOTS
};
extern "C" cudaStream_t td_cuda_stream(void);
void *td_cuda_state(int slot, size_t bytes, void (*release)(void *state));
template <class T> static inline T &td_cuda_ctx_state(int slot, void (*release)(void *) = nullptr) {
    return *(T *)td_cuda_state(slot, sizeof(T), release);
}
/* the process's context's stream, made once (the backend's start): 0, or -1 */
int td_cuda_process_stream(void);
int td_cuda_has_process_stream(void);

/* Programmatic dependent launch. Every kernel starts with PDL_START(): it waits until the grid
 * before it in the stream has finished and its writes are visible (griddepcontrol.wait; at
 * once when there is none), then lets the next grid be launched (launch_dependents). With
 * every launch made by launch_k, which allows that early launch, the next kernel's blocks are
 * already resident when this one ends, instead of being launched after it: the gap between two
 * small kernels of a step. A kernel must not read anything before PDL_START(). TD_PDL=0 in the
 * environment launches without it (A/B). */
#define PDL_START()                                                                                \
    do {                                                                                           \
        asm volatile("griddepcontrol.wait;" ::: "memory");                                         \
        asm volatile("griddepcontrol.launch_dependents;");                                         \
    } while (0)

/* Weights (written when a model is placed, never by a step's kernels) may be read before
 * PDL_START. prefetch_l2 asks for bytes [p, p + bytes) of them in L2 (one request per 128-byte
 * line, spread over the block's threads), so the reads after the wait find them there while the
 * grid before is still running; nothing waits for it. Small kernels call it for the weights they
 * read: a read that misses L2 costs a kernel of a few microseconds about one microsecond. */
__device__ __forceinline__ void prefetch_l2_line(const void *p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

__device__ __forceinline__ void prefetch_l2(const void *p, size_t bytes) {
    if (!p) return;
    const char *c = (const char *)((uintptr_t)p & ~(uintptr_t)127);
    size_t span = (size_t)((const char *)p - c) + bytes;
    for (size_t o = (size_t)threadIdx.x * 128; o < span; o += (size_t)blockDim.x * 128)
        prefetch_l2_line(c + o);
}

/* the same for columns [c0, c1) of rows 0 .. rows - 1 of a row-major matrix of `width` columns
 * of esz bytes each */
__device__ __forceinline__ void prefetch_l2_cols(const void *p, int esz, int rows, int width,
                                                 int c0, int c1) {
    if (!p || c1 <= c0) return;
    int per = ((c1 - c0) * esz + 127) / 128 + 1; // lines a row's span can touch
    for (int q = threadIdx.x; q < rows * per; q += blockDim.x) {
        int r = q / per;
        const char *a = (const char *)p + ((size_t)r * width + c0) * esz;
        const char *line = (const char *)((uintptr_t)a & ~(uintptr_t)127) + (size_t)(q % per) * 128;
        if (line < (const char *)p + ((size_t)r * width + c1) * esz) prefetch_l2_line(line);
    }
}

/* The plan entries of row t that a plan-driven kernel reads first (row t of every per-row
 * array, the first line of the per-sequence ones), asked into L2 by thread 0 before the PDL
 * wait: the plan is written at the step's start, and by a layer's kernels the step's weights
 * have pushed it out of L2, so each link of a chain such as row_seq -> slot -> ring row would
 * wait out a DRAM latency. (A prefetch is a hint: it returns nothing and cannot read stale
 * data.) */
__device__ __forceinline__ void prefetch_row_plan(const struct rows_view &r, int t) {
    if (threadIdx.x) return;
    const int32_t *row[] = {r.input_ids, r.positions, r.row_seq, r.swa_indptr,
                            r.swa_write, r.vis,       r.emit,    r.write};
    for (int i = 0; i < (int)(sizeof row / sizeof *row); i++)
        if (row[i]) prefetch_l2_line(row[i] + t);
    const int32_t *seq[] = {r.slot, r.len_before, r.qo_indptr};
    for (int i = 0; i < (int)(sizeof seq / sizeof *seq); i++)
        if (seq[i]) prefetch_l2_line(seq[i]);
}

/* cluster > 1: blocks x .. x + cluster - 1 of the grid form a thread-block cluster (Hopper),
 * whose blocks can read each other's shared memory */
template <typename... P, typename... A>
static inline void launch_kc(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, int cluster,
                             cudaStream_t stream, A &&...args) {
    cudaLaunchAttribute at[2];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = td_cuda_pdl();
    at[1].id = cudaLaunchAttributeClusterDimension;
    at[1].val.clusterDim.x = cluster;
    at[1].val.clusterDim.y = 1;
    at[1].val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = at;
    cfg.numAttrs = cluster > 1 ? 2 : 1;
    cudaLaunchKernelEx(&cfg, kernel, static_cast<A &&>(args)...);
}

template <typename... P, typename... A>
static inline void launch_k(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
                            cudaStream_t stream, A &&...args) {
    launch_kc(kernel, grid, block, smem, 1, stream, static_cast<A &&>(args)...);
}

/* one element as fp32 when its type is known at compile time (loads the compiler can batch) */
__device__ __forceinline__ float as_f32(float v) {
    return v;
}
__device__ __forceinline__ float as_f32(__nv_bfloat16 v) {
    return __bfloat162float(v);
}
__device__ __forceinline__ float as_f32(__half v) {
    return __half2float(v);
}

/* one element as fp32 when its dtype is known only at run time */
__device__ __forceinline__ float ld_f32(const void *p, int dtype, long long i) {
    switch (dtype) {
    case TD_DTYPE_F32: return ((const float *)p)[i];
    case TD_DTYPE_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case TD_DTYPE_F16: return __half2float(((const __half *)p)[i]);
    default: return 0.0f;
    }
}

struct sum_op {
    __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct max_op {
    __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

/* op over the warp, a butterfly: every lane gets the same result */
template <typename Op> __device__ __forceinline__ float warp_reduce(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v = Op()(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
    return warp_reduce<sum_op>(v);
}

__device__ __forceinline__ float warp_max(float v) {
    return warp_reduce<max_op>(v);
}

/* v's bits made order-preserving as an unsigned: a > b exactly when key(a) > key(b), and -0
 * gets +0's key, as a > comparison ties them (NaN: above +inf) */
__device__ __forceinline__ unsigned ordered_key(float v) {
    unsigned u = __float_as_uint(v == 0.0f ? 0.0f : v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* A (value, index) pair as one 64-bit key whose unsigned order is the order of a first strict
 * maximum: the larger value, then the lower index (the value's ordered_key above the
 * complemented index). Keys from blocks that run in any order fold with atomicMax. */
__device__ __forceinline__ unsigned long long argmax_key(float v, int i) {
    return ((unsigned long long)ordered_key(v) << 32) | (unsigned)(~i);
}

__device__ __forceinline__ int argmax_key_index(unsigned long long k) {
    return (int)~(unsigned)(k & 0xffffffffu);
}

__device__ __forceinline__ unsigned long long warp_max_key(unsigned long long k) {
    for (int o = 16; o > 0; o >>= 1) {
        unsigned long long other = __shfl_xor_sync(0xffffffffu, k, o);
        k = other > k ? other : k;
    }
    return k;
}

/* the largest argmax_key over the block; every thread gets it (a max: any order gives the same) */
__device__ __forceinline__ unsigned long long block_max_key(unsigned long long k) {
    __shared__ unsigned long long part[32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    k = warp_max_key(k);
    __syncthreads();
    if (lane == 0) part[w] = k;
    __syncthreads();
    unsigned long long r = 0;
    int nw = blockDim.x >> 5;
    for (int i = 0; i < nw; i++)
        r = part[i] > r ? part[i] : r;
    return r;
}

/* op over the block (blockDim.x a multiple of 32, <= 1024), from init; every thread gets the
 * result. The order is fixed by the thread layout, not by the data. */
template <typename Op> __device__ __forceinline__ float block_reduce(float v, float init) {
    __shared__ float part[32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    v = warp_reduce<Op>(v);
    __syncthreads();
    if (lane == 0) part[w] = v;
    __syncthreads();
    float r = init;
    int nw = blockDim.x >> 5;
    for (int i = 0; i < nw; i++)
        r = Op()(r, part[i]);
    return r;
}

__device__ __forceinline__ float block_sum(float v) {
    return block_reduce<sum_op>(v, 0.0f);
}

/* the sum over warps w0 .. of the block (the others have left or are busy), in warp order;
 * every calling thread gets it. Named barrier 1: at most one call per kernel. */
__device__ __forceinline__ float block_sum_from(float v, int w0) {
    __shared__ float part[32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_reduce<sum_op>(v);
    if (lane == 0) part[w] = v;
    asm volatile("bar.sync 1, %0;" ::"r"((nw - w0) * 32) : "memory");
    float r = 0.0f;
    for (int i = w0; i < nw; i++)
        r += part[i];
    return r;
}

__device__ __forceinline__ float block_max(float v) {
    return block_reduce<max_op>(v, -INFINITY);
}

/* the block's exclusive prefix sum of v in thread order (blockDim.x a multiple of 32, <= 1024)
 * and, in *total, its sum; every thread calls it */
__device__ __forceinline__ int block_excl_scan(int v, int *total) {
    __shared__ int wsum[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int x = v;
    for (int o = 1; o < 32; o <<= 1) {
        int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads(); // an earlier call's reads of wsum are done
    if (lane == 31) wsum[warp] = x;
    __syncthreads();
    int before = 0, all = 0;
    for (int i = 0; i < nw; i++) {
        before += i < warp ? wsum[i] : 0;
        all += wsum[i];
    }
    *total = all;
    return before + x - v;
}

/* out[j] = exp(in[j] - mx) / (sum_j exp(in[j] - mx) + exp(sink - mx)) for j < n, mx the
 * largest of in[] and sink (an attention sink; -INFINITY: none), over the block; out may be
 * in. Each thread writes the entries it read. */
__device__ __forceinline__ void block_softmax(float *out, const float *in, int n, float sink) {
    float mx = sink;
    for (int j = threadIdx.x; j < n; j += blockDim.x)
        mx = fmaxf(mx, in[j]);
    mx = block_max(mx);
    float den = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x)
        den += expf(in[j] - mx);
    den = block_sum(den) + expf(sink - mx);
    for (int j = threadIdx.x; j < n; j += blockDim.x)
        out[j] = expf(in[j] - mx) / den;
}

/* RoPE at one position, frequency i: cos and sin of the fp32 angle pos * inv_freq[i], taken in
 * double and rounded, times the attention factor (as the CPU reference makes them) */
__device__ __forceinline__ void rope_cos_sin(float pos, const float *inv_freq, int i, float af,
                                             float *c, float *s) {
    double sd, cd;
    sincos((double)(pos * inv_freq[i]), &sd, &cd);
    *c = (float)cd * af;
    *s = (float)sd * af;
}

/* the interleaved pair (x0, x1) rotated by (c, s) */
__device__ __forceinline__ float2 rope_pair(float x0, float x1, float c, float s) {
    return make_float2(x0 * c - x1 * s, x1 * c + x0 * s);
}

/* the clamped SwiGLU of one gate / up pair: silu(min(g, limit)) * clamp(u, -limit, limit) */
__device__ __forceinline__ float swiglu_clamped(float g, float u, float limit) {
    g = fminf(g, limit), u = fminf(fmaxf(u, -limit), limit);
    return g / (1.0f + expf(-g)) * u;
}

/* Thread 0 of each of `blocks` blocks folds its (argmax_key, non-finite flag) into a row's
 * scratch key / bad (atomicMax: a max, the same in any order) and counts itself in done. True in
 * the last block to arrive, which gets the row's whole fold in *best, *bad and leaves the
 * scratch zero for the next use. */
__device__ __forceinline__ bool fold_argmax_last(unsigned long long *key, int *badf, int *done,
                                                 unsigned long long *best, int *bad, int blocks) {
    atomicMax(key, *best);
    if (*bad) atomicOr(badf, 1);
    __threadfence(); // the fold is visible before the block counts itself done
    if (atomicAdd(done, 1) != blocks - 1) return false;
    __threadfence();
    *best = atomicExch(key, 0ull);
    *bad = atomicExch(badf, 0);
    *done = 0;
    return true;
}

/* an op's start-up check of the model's vector widths (head_dim, and index_head_dim when it has
 * an indexer) with its rotary dims, by the op's rule ok(width, rot_dim): 0, or -1 with the
 * numbers ("backend cuda: <op>: W channels with R rotary dims; ...") */
static inline int reserve_widths(const struct td_reserve *r, bool (*ok)(int, int), const char *op,
                                 int max, char *err, size_t errlen) {
    int widths[2] = {r->head_dim, r->index_head_dim};
    for (int i = 0; i < 2; i++)
        if (widths[i] && !ok(widths[i], r->rot_dim))
            return td_errf(err, errlen,
                           "backend cuda: %s: %d channels with %d rotary dims; the kernel takes "
                           "even widths of at most %d with even rotary dims of at most 512 and "
                           "the width",
                           op, widths[i], r->rot_dim, max);
    return 0;
}

/* a measuring switch from the environment: 1 when NAME is set to a non-zero integer */
static inline int td_env_on(const char *name) {
    const char *v = getenv(name);
    return v && atoi(v) != 0;
}

static inline int ceil_div(long long a, int b) {
    return (int)((a + b - 1) / b);
}

/* a float scratch buffer of at least `need` elements: grown (by half again), never freed nor
 * moved back, since a captured graph keeps the address it was captured with */
static inline float *grow_scratch(float **buf, size_t *cap, size_t need) {
    if (need > *cap) {
        *cap = need + need / 2;
        CUDA_CHECK(cudaMalloc(buf, *cap * sizeof(float)));
    }
    return *buf;
}

#endif
