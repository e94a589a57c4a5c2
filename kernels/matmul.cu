/* matmul.cu: y = x W^T on the GPU. BF16 weights: steps of up to SKINNY_ROWS rows (decode and
 * verify) take the skinny kernel below, which reads the fp32 rows and the weights directly
 * (tensor cores, x as two bf16 terms);
 * wider steps go through cuBLASLt (x rounded to bf16, fp32 accumulation and output). Q8 / Q4
 * weights (the released FP8 / FP4, quant.cuh) take the same skinny kernel, their codes decoded
 * to bf16 in registers, up to quant_mma_rows() rows (48), and are decoded to a bf16 copy for
 * cuBLASLt above. Other weight dtypes take a plain fp32 kernel (only small tensors stay fp32 on
 * the device; see td_model_upload). */
#include <cooperative_groups.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <type_traits>
#include <cublasLt.h>
#include <cuda_fp8.h>

#include "compress.h"
#include "cuda_common.cuh"
#include "matmul.h"
#include "mma_tile.cuh"

namespace cg = cooperative_groups;

#define CUBLAS_CHECK(x)                                                                            \
    TD_STATUS_CHECK(x, cublasStatus_t, CUBLAS_STATUS_SUCCESS, cublasLtGetStatusName,               \
                    cublasLtGetStatusString)

/* one GEMM shape's descriptors and algorithm, made once: the heuristic query is a host-side
 * search that cost more than the GEMM itself on small steps, on every call. Plans are made for
 * row buckets (the power of two at or above n) and run at each call's own n: eager steps (long
 * prefill chunks, a drafter's catch-up) come in every width, and a new width's queries, about
 * 0.3 ms each, once cost a tandem-tiny step of 238 rows 10 ms against 1.7 (TD_POLICY_TRACE).
 * An algorithm the library refuses at a smaller n gets that n's own plan (exact). */
struct lt_plan {
    int n, in, out, ldb, ldc, exact;
    int fp8;  /* the FP8 block-scaled form (lt_fp8) */
    int cols; /* the width lb and lc are set to now */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
};
#define LT_PLANS 512

/* a context's (cuda_ctx.h): cuBLASLt's handle, workspace and plans, the scratch below, and
 * batch-invariant mode */
struct mm_state {
    cublasLtHandle_t lt;
    int deterministic; /* batch-invariant mode: no cuBLASLt, fixed-order dots */
    void *lt_ws;
    __nv_bfloat16 *xbuf; /* x rounded to bf16 for cuBLASLt */
    size_t xbuf_cap;
    unsigned *xt_buf; /* FP8 steps' x terms (ensure_xt) */
    float *xt_inv;
    size_t xt_cap;       /* rows x chunks the buffers hold */
    __nv_bfloat16 *wbuf; /* a quantized matrix decoded to bf16 (matmul_cuda_reserve) */
    size_t wbuf_cap;
    uint8_t *f8_x; /* lt_fp8: x's e4m3 codes, their scales, the weight's scales as fp32 */
    float *f8_xs, *f8_ws;
    size_t f8_x_cap, f8_xs_cap, f8_ws_cap;
    struct lt_plan lt_plans[LT_PLANS];
    int n_lt_plans;
};

static void mm_release(void *p) {
    struct mm_state *m = (struct mm_state *)p;
    for (int i = 0; i < m->n_lt_plans; i++) {
        struct lt_plan *q = &m->lt_plans[i];
        cublasLtMatrixLayoutDestroy(q->la), cublasLtMatrixLayoutDestroy(q->lb);
        cublasLtMatrixLayoutDestroy(q->lc), cublasLtMatmulDescDestroy(q->op);
    }
    if (m->lt) cublasLtDestroy(m->lt);
    cudaFree(m->lt_ws), cudaFree(m->xbuf), cudaFree(m->xt_buf), cudaFree(m->xt_inv);
    cudaFree(m->wbuf), cudaFree(m->f8_x), cudaFree(m->f8_xs), cudaFree(m->f8_ws);
}

static struct mm_state &mm(void) {
    return td_cuda_ctx_state<struct mm_state>(TD_CTX_MATMUL, mm_release);
}

extern "C" void matmul_cuda_set_deterministic(int on) {
    mm().deterministic = on;
}
static const size_t lt_ws_bytes = (size_t)32 << 20;

static void ensure_lt(size_t x_elems) {
    if (!mm().lt) {
        CUBLAS_CHECK(cublasLtCreate(&mm().lt));
        CUDA_CHECK(cudaMalloc(&mm().lt_ws, lt_ws_bytes));
    }
    if (x_elems > mm().xbuf_cap) { // grow only, never free: captured graphs keep the old address
        mm().xbuf_cap = x_elems + (x_elems >> 1);
        CUDA_CHECK(cudaMalloc(&mm().xbuf, mm().xbuf_cap * sizeof(__nv_bfloat16)));
    }
}

/* x rounded to bf16 (nearest), 8 values a thread: two 16-byte loads and one store where x is
 * aligned (the scalar form, one value a thread, took 6.2 ms of 52 launches in a 4096-token
 * prefill of the Flash slice, about a quarter of the copy bandwidth; Nsight Compute, H100) */
__global__ void to_bf16_kernel(__nv_bfloat16 *y, const float *x, size_t n) {
    PDL_START();
    size_t i = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) * 8;
    if (i >= n) return;
    if (i + 8 <= n && ((uintptr_t)(x + i) & 15) == 0) {
        float4 a = *(const float4 *)(x + i), b = *(const float4 *)(x + i + 4);
        *(uint4 *)(y + i) = make_uint4(pack_bf16(a.x, a.y), pack_bf16(a.z, a.w),
                                       pack_bf16(b.x, b.y), pack_bf16(b.z, b.w));
        return;
    }
    for (size_t j = i; j < i + 8 && j < n; j++)
        y[j] = __float2bfloat16(x[j]);
}

/* w: a tensor of `rows` rows, of which this matrix is rows row0 .. row0 + out - 1 */
__global__ void matmul_f32_kernel(float *y, const float *x, const void *w, int dt, long long rows,
                                  int row0, int n, int in, int out, int x_stride, int y_stride) {
    PDL_START();
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= (long long)n * out) return;
    int t = (int)(i / out), o = (int)(i % out);
    float acc = 0.0f;
    for (int k = 0; k < in; k++)
        acc += x[(size_t)t * x_stride + k] * ldw_f32(w, dt, rows, in, row0 + o, k);
    y[(size_t)t * y_stride + o] = acc;
}

/* one warp per output element: lanes stride the reduction dim, then a fixed butterfly; the
 * order of every sum depends on `in` alone, never on n (batch-invariant mode) */
__global__ void matmul_warp_kernel(float *y, const float *x, const void *w, int dt, long long rows,
                                   int row0, int n, int in, int out, int x_stride, int y_stride) {
    PDL_START();
    long long e = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (e >= (long long)n * out) return;
    int t = (int)(e / out), o = (int)(e % out);
    const float *xr = x + (size_t)t * x_stride;
    float acc = 0.0f;
    for (int k = lane; k < in; k += 32)
        acc += __bfloat162float(__float2bfloat16(xr[k])) * ldw_f32(w, dt, rows, in, row0 + o, k);
    acc = warp_sum(acc);
    if (lane == 0) y[(size_t)t * y_stride + o] = acc;
}

/* Skinny GEMM, steps of 1 to SKINNY_ROWS rows (decode batches, verify steps): tiles of 16
 * features x 8 rows on tensor cores (mma_tile.cuh), so a row has the same bits alone and in a
 * verify step. It replaced an fp32 kernel with one warp per feature, whose 8-row form re-read
 * x from L1 for every feature: at 8 rows the Flash head took 1270 us against 242 at 1 row;
 * here 261 to 276 us at 1 to 8 rows (bench/gemm_time). */
#define SKINNY_ROWS MATMUL_SKINNY_ROWS

/* Few tiles of features (the step's small projections: 4096 x 256 has 16) would leave most
 * multiprocessors idle, so KS blocks of a cluster can share each tile's k: chunk c of 32 goes
 * to warp c % KW of block (c / KW) % KS, and block 0 adds the other blocks' tiles, in block
 * order, through distributed shared memory. The first weights are requested before the wait
 * for the grid before (mma_rows, early). */
/* The matrices of one skinny launch: one matrix (groups of it along the grid's z), or several
 * that read the same x rows (a set). Matrix i owns tiles tile0[i] .. tile0[i + 1] - 1 of 16
 * features; its row t goes to y[i] + t * ys[i] (+ group * out[i]). */
#define SK_MIX 3 /* a set's form for Q8 and bf16 matrices together (each block takes one) */
struct sk_set {
    int m;
    int rb; /* blocks of 8 rows: a step of more than 8 rows (quantized weights) */
    int tile0[MATMUL_SET_MAX + 1];
    struct wmat w[MATMUL_SET_MAX]; /* one format (quant.cuh) for the set, or Q8 and bf16 (SK_MIX) */
    int fmt[MATMUL_SET_MAX];
    float *y[MATMUL_SET_MAX];
    const void *bias[MATMUL_SET_MAX], *pbias[MATMUL_SET_MAX];
    const int32_t *pos[MATMUL_SET_MAX];
    int bias_dt[MATMUL_SET_MAX], pbias_dt[MATMUL_SET_MAX], rate[MATMUL_SET_MAX];
    int out[MATMUL_SET_MAX], ys[MATMUL_SET_MAX];
    const unsigned *xt; /* x's terms made once for the launch (q8h_xt; NULL: in the kernel) */
    const float *xinv;
    int xchunks;
};

/* block x: cluster rank fastest, then the block of 8 rows, then the tile (the row blocks of a
 * tile run together and share its weights in L2). NT 2 (Q8 in half precision at 8 rows alone):
 * a block's tile is two of 16 features, which its warps take on the same x terms; s.tile0
 * counts such pairs then */
template <int F, bool VEC, int KW, int ACC, int KS, int XR, int NT = 1>
__global__ void __launch_bounds__(32 * KW)
    skinny_mma_kernel(const __grid_constant__ struct sk_set s, const float *x, int n, int in,
                      int x_stride) {
    __shared__ float part[KW > 1 ? KW - 1 : 1][32][4];
    __shared__ float tile[KS > 1 ? NT : 1][KS > 1 ? 32 : 1][4]; // this block's sums, for block 0
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
    int rank = blockIdx.x % KS, q = blockIdx.x / KS, tl = q / s.rb, t0 = q % s.rb * 8;
    int grp = blockIdx.z, i = 0;
    while (i + 1 < s.m && tl >= s.tile0[i + 1])
        i++;
    int out = s.out[i], o0 = (tl - s.tile0[i]) * 16 * NT;
    int rows = min(8, n - t0);
    float c[NT][4];
    struct wmat wg = s.w[i];
    wg.row0 = grp * out;
    constexpr int FB = F == SK_MIX ? WF_BF16 : F; // the format of the set's other matrices
    bool q8h = false;
    if constexpr (XR > 0 && (F == WF_Q8 || F == SK_MIX)) {
        __shared__ q8h_xw xw[KW]; // each warp's x terms (only these forms take the room)
        q8h = F == WF_Q8 || s.fmt[i] == WF_Q8; // (the same for the whole block)
        q8h_xt xt = {};
        if (s.xt)
            xt = {s.xt + (size_t)t0 * s.xchunks * 64, s.xinv + (size_t)t0 * s.xchunks, s.xchunks};
        if (q8h)
            mma_rows_q8h<VEC, XR, NT>(c, x + (size_t)t0 * x_stride + (size_t)grp * in, x_stride,
                                      rows, wg, o0, out, in, rank * KW + warp, KS * KW, true,
                                      xw[warp], xt);
    }
    if constexpr (NT == 1) {
        if (!q8h)
            mma_rows<FB, VEC, KW, ACC>(c, x + (size_t)(t0 + g) * x_stride + (size_t)grp * in,
                                       g < rows, &wg, o0, out, in, rank * KW + warp, KS * KW, true);
    }
    PDL_START(); // (every warp has waited before it writes)
    bool w0 = kw_sum<KW>(c[0], part);
    if constexpr (NT > 1) kw_sum<KW>(c[1], part);
    if (KS > 1) {
        cg::cluster_group cl = cg::this_cluster();
        if (w0)
#pragma unroll
            for (int m = 0; m < NT; m++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    tile[m][lane][j] = c[m][j];
        cl.sync();
        if (w0 && rank == 0)
            for (int q = 1; q < KS; q++) {
                const float *r = cl.map_shared_rank(&tile[0][0][0], q);
#pragma unroll
                for (int m = 0; m < NT; m++)
#pragma unroll
                    for (int j = 0; j < 4; j++)
                        c[m][j] += r[(m * 32 + lane) * 4 + j];
            }
        cl.sync(); // the other blocks' tiles stay until block 0 has read them
        if (rank) return;
    }
    if (!w0) return;
    float *y = s.y[i];
    const void *bias = s.bias[i], *pb = s.pbias[i];
#pragma unroll
    for (int m = 0; m < NT; m++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int o = o0 + 16 * m + mma_feature(j), r = mma_row(j);
            if (o < out && r < rows) {
                float v = c[m][j] + (bias ? ld_f32(bias, s.bias_dt[i], o) : 0.0f);
                if (pb)
                    v += ld_f32(pb, s.pbias_dt[i],
                                (long long)(s.pos[i][t0 + r] % s.rate[i]) * out + o);
                y[(size_t)(t0 + r) * s.ys[i] + (size_t)grp * out + o] = v;
            }
        }
}

/* f(fmt, vec, kw, acc, ks, xr) with each as a compile-time constant (std::integral_constant):
 * the forms the skinny kernel is built in. Q8 in half precision (mma_rows_q8h) keeps one
 * accumulator and splits its lanes over xr x rows, 1 for a step of one row, else 8; xr 0 is
 * Q8's bf16 decode (TD_Q8H=0) and the other formats' only form. */
template <typename Fn>
static void sk_form(int fmt, bool vec, int kw, bool acc1, int ks, int xr, int nt, Fn &&f) {
    auto by_ks = [&](auto v, auto w, auto a) {
        auto by_f = [&](auto k) {
            using one = std::integral_constant<int, 1>;
            using zero = std::integral_constant<int, 0>;
            using eight = std::integral_constant<int, 8>;
            if (fmt == WF_Q8 && !xr) {
                f(std::integral_constant<int, WF_Q8>{}, v, w, a, k, zero{}, one{});
            } else if (fmt == WF_Q8) {
                if (xr == 1)
                    f(std::integral_constant<int, WF_Q8>{}, v, w, one{}, k, one{}, one{});
                else if (nt == 2)
                    f(std::integral_constant<int, WF_Q8>{}, v, w, one{}, k, eight{},
                      std::integral_constant<int, 2>{});
                else
                    f(std::integral_constant<int, WF_Q8>{}, v, w, one{}, k, eight{}, one{});
            } else if (fmt == SK_MIX) {
                if constexpr (decltype(v)::value) { // (built with 16-byte loads alone)
                    if (xr == 1)
                        f(std::integral_constant<int, SK_MIX>{}, v, w, a, k, one{}, one{});
                    else
                        f(std::integral_constant<int, SK_MIX>{}, v, w, a, k, eight{}, one{});
                }
            } else if (fmt == WF_Q4)
                f(std::integral_constant<int, WF_Q4>{}, v, w, a, k, zero{}, one{});
            else
                f(std::integral_constant<int, WF_BF16>{}, v, w, a, k, zero{}, one{});
        };
        if (ks == 8)
            by_f(std::integral_constant<int, 8>{});
        else if (ks == 4)
            by_f(std::integral_constant<int, 4>{});
        else if (ks == 2)
            by_f(std::integral_constant<int, 2>{});
        else
            by_f(std::integral_constant<int, 1>{});
    };
    auto by_kw = [&](auto v) {
        using one = std::integral_constant<int, 1>;
        using four = std::integral_constant<int, 4>;
        if (kw == 16)
            acc1 ? by_ks(v, std::integral_constant<int, 16>{}, one{})
                 : by_ks(v, std::integral_constant<int, 16>{}, four{});
        else if (kw == 8)
            acc1 ? by_ks(v, std::integral_constant<int, 8>{}, one{})
                 : by_ks(v, std::integral_constant<int, 8>{}, four{});
        else
            acc1 ? by_ks(v, four{}, one{}) : by_ks(v, four{}, four{});
    };
    if (vec)
        by_kw(std::true_type{});
    else
        by_kw(std::false_type{});
}

static int n_sms;

/* how many blocks of a form the GPU holds at once (whole clusters), asked once per form */
static int sk_capacity(int fmt, bool vec, int kw, bool acc1, int ks, int xr) {
    static int cap[4][2][3][2][4][3];
    int kwi = kw == 4 ? 0 : kw == 8 ? 1 : 2, ksi = ks == 1 ? 0 : ks == 2 ? 1 : ks == 4 ? 2 : 3;
    int &c = cap[fmt][vec][kwi][acc1][ksi][xr > 1 ? 2 : xr];
    if (c) return c;
    if (!n_sms) CUDA_CHECK(cudaDeviceGetAttribute(&n_sms, cudaDevAttrMultiProcessorCount, 0));
    sk_form(
        fmt, vec, kw, acc1, ks, xr, 1, [&](auto fm, auto v, auto w, auto a, auto k, auto r, auto) {
            auto kern =
                skinny_mma_kernel<decltype(fm)::value, decltype(v)::value, decltype(w)::value,
                                  decltype(a)::value, decltype(k)::value, decltype(r)::value>;
            int got = 0;
            if (k == 1) {
                CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&got, kern, 32 * kw, 0));
                got *= n_sms;
            } else {
                cudaLaunchAttribute at;
                at.id = cudaLaunchAttributeClusterDimension;
                at.val.clusterDim.x = ks, at.val.clusterDim.y = 1, at.val.clusterDim.z = 1;
                cudaLaunchConfig_t cfg = {};
                cfg.gridDim = dim3(ks * n_sms), cfg.blockDim = dim3(32 * kw);
                cfg.attrs = &at, cfg.numAttrs = 1;
                CUDA_CHECK(cudaOccupancyMaxActiveClusters(&got, kern, &cfg));
                got *= ks;
            }
            c = got > 0 ? got : 1;
        });
    return c;
}

/* The form follows the shape alone (so does the order of the sums): kw warps of a block and ks
 * blocks of a cluster share each tile's k (block 0 adds the other blocks' tiles, in block
 * order, through distributed shared memory); one accumulator for matrices of 16 MB and more
 * (bound by the weight reads: the head ran at 261 us with one, 280 with four), else four.
 * A step's weights stream best when every block of the grid is resident at once (a second
 * wave starts only as blocks of the first end, and the multiprocessor idles in between: the
 * 8192 x 4096 output projection, 256 blocks of 16 warps, one a multiprocessor, read 2.86
 * TB/s against the head's 4.03 with many small blocks) and the blocks spread evenly. So of the
 * forms that fit in one wave (sk_capacity) and give every warp at least MT_U chunks, the one
 * with the most resident warps (up to SK_WARPS a multiprocessor) times the balance (mean
 * blocks per multiprocessor over the most), ties to fewer cluster blocks and then fewer warps;
 * when none fits (thousands of tiles: the head), 4 warps a block, many waves. */
#define SK_WARPS 16
static void sk_choose(int fmt, long long tiles, int in, bool vec, bool acc1, int xr, int *kw_out,
                      int *ks_out) {
    int cw = mma_chunk(fmt == SK_MIX ? WF_Q8 : fmt), chunks = (in + cw - 1) / cw;
    double best = 0.0;
    *kw_out = 4, *ks_out = 1;
    for (int ks = 1; ks <= 8; ks *= 2)
        for (int kw = 4; kw <= 16; kw *= 2) {
            if (chunks < kw * ks * MT_U) continue;
            long long blocks = tiles * ks;
            int cap = sk_capacity(fmt, vec, kw, acc1, ks, xr);
            if (xr) {
                int c1 = sk_capacity(fmt, vec, kw, acc1, ks, 1);
                cap = c1 < cap ? c1 : cap;
            }
            if (blocks > cap) continue;
            double per = (double)blocks / n_sms, most = ceil(per);
            double score = fmin(per * kw, (double)SK_WARPS) * (per / most);
            if (score > best * (1.0 + 1e-9)) best = score, *kw_out = kw, *ks_out = ks;
        }
}

/* Q8 in half precision (mma_rows_q8h), and a set's Q8 and bf16 matrices in one launch; TD_Q8H=0
 * takes the bf16 decode (mma_rows_q), a launch per format (the Flash slice in the released
 * precision, H100: 713 / 2517 / 6799 tokens/s at batch 1 / 4 / 64 against 750 / 2575 / 6745
 * with it, bench/RESULTS.md session 29) */
static bool q8h_on(void) {
    static int on = -1;
    if (on < 0) on = !getenv("TD_Q8H") || atoi(getenv("TD_Q8H"));
    return on;
}

/* Q8 in half precision at 2 to 8 rows takes two tiles of 16 features a block (NT 2, their x
 * terms made once) in a launch of at least Q8H_NT2_TILES tiles, else one: at 4 rows (H100,
 * gemm_time, session 30) the head 4096 x 129280 took 193 us against 253, q_b 1024 x 32768 16.3
 * against 21.0, csa qr 1024 x 40960 22.2 against 25.3, while wo_a (512 tiles) took 21.5 against
 * 20.2 and the small ones lost a third: half the blocks leave the GPU less to run. Either gives
 * the same bits. matmul_cuda_set_q8h_nt(1 or 2) or TD_Q8H_NT=1|2 forces one; 0: by the tiles. */
#define Q8H_NT2_TILES 2048
static int g_q8h_nt = -1; /* -1: TD_Q8H_NT not read yet */
void matmul_cuda_set_q8h_nt(int nt) {
    g_q8h_nt = nt == 2 ? 2 : nt == 1 ? 1 : 0;
}
static int q8h_nt(long long tiles) {
    if (g_q8h_nt < 0) {
        const char *e = getenv("TD_Q8H_NT");
        matmul_cuda_set_q8h_nt(e ? atoi(e) : 0);
    }
    return g_q8h_nt ? g_q8h_nt : tiles >= Q8H_NT2_TILES ? 2 : 1;
}

/* A Q8 step of 9 to QUANT_MMA_ROWS rows makes x's terms once (q8h_terms_kernel) for every
 * tile's warps to read (q8h_xt), where each block made its own rows' for its tile, when the
 * launch has at least Q8H_XT_TILES tiles of 16 features: at 64 rows the released slice's FP8
 * GEMMs read 0.6 GB in 2.4 ms (session 30, Nsight Compute), their x terms about 70% of a
 * chunk's instructions. Session 31 (H100, gemm_time at 16 / 64 rows, us): head 523.9 / 1842.6
 * -> 470.9 / 1575.9, q_b 42.3 / 150.2 -> 36.6 / 122.1, wo_b (256 tiles) 35.2 / 120.0 -> 32.4 /
 * 108.3, wo_a 37.8 / 125.1 unchanged, but q_a (64 tiles) 6.6 / 17.2 -> 7.9 / 19.5: the extra
 * launch costs more than a small matrix's terms. The same bits either way.
 * matmul_cuda_set_q8h_xt(1) or TD_Q8H_XT=1 makes them at every such launch, 2 or TD_Q8H_XT=0
 * never (measuring and testing); 0: by the tiles. */
#define QUANT_MMA_ROWS 64
/* The most rows a quantized step takes the skinny kernel at (wider steps decode the matrix to a
 * bf16 copy and run cuBLASLt): each row block of 8 decodes the tile again, while the copy costs
 * a pass whatever the rows. Session 31 (H100, released slice, tandem bench on distinct
 * prompts, tokens/s): batch 32 4258.2 on the skinny kernel against 4052.2 with the copy, batch
 * 64 5298.1 against 5488.4. Both lines cross at about 46 rows if each grows with its row
 * blocks: 48 (not measured between 32 and 64). TD_QUANT_ROWS=N (0 to QUANT_MMA_ROWS) sets it,
 * measuring only. */
#define QUANT_SKINNY_ROWS 48
static int quant_mma_rows(void) {
    static int r = -1;
    if (r < 0) {
        r = getenv("TD_QUANT_ROWS") ? atoi(getenv("TD_QUANT_ROWS")) : QUANT_SKINNY_ROWS;
        r = r < 0 ? 0 : r > QUANT_MMA_ROWS ? QUANT_MMA_ROWS : r;
    }
    return r;
}
#define Q8H_XT_TILES 256
static int g_q8h_xt = -1; /* -1: TD_Q8H_XT not read yet */
void matmul_cuda_set_q8h_xt(int on) {
    g_q8h_xt = on == 1 ? 1 : on == 2 ? 2 : 0;
}
static int q8h_xt_mode(void) {
    if (g_q8h_xt < 0) {
        const char *e = getenv("TD_Q8H_XT");
        matmul_cuda_set_q8h_xt(!e ? 0 : atoi(e) ? 1 : 2);
    }
    return g_q8h_xt;
}
static bool q8h_xt_on(long long tiles) {
    int m = q8h_xt_mode();
    return m == 1 || (!m && tiles >= Q8H_XT_TILES);
}

static void ensure_xt(size_t cells) {
    if (cells <= mm().xt_cap) return;
    if (mm().xt_buf) {
        CUDA_CHECK(cudaFree(mm().xt_buf));
        CUDA_CHECK(cudaFree(mm().xt_inv));
    }
    mm().xt_cap = cells;
    CUDA_CHECK(cudaMalloc(&mm().xt_buf, mm().xt_cap * 64 * sizeof *mm().xt_buf));
    CUDA_CHECK(cudaMalloc(&mm().xt_inv, mm().xt_cap * sizeof *mm().xt_inv));
}

/* a warp a (row, chunk of 64): lane l makes the pair k 2l, 2l + 1 (zeros past in) as hi and lo
 * f16 terms of x times 2^e, e from the chunk's largest |x| (xh_scale), as q8h_chunk does */
__global__ void q8h_terms_kernel(const float *x, int in, int chunks, unsigned *t, float *inv) {
    PDL_START();
    int c = blockIdx.x, r = blockIdx.y, l = threadIdx.x, k = c * 64 + 2 * l;
    const float *xr = x + (size_t)r * in;
    float v0 = k < in ? xr[k] : 0.0f, v1 = k + 1 < in ? xr[k + 1] : 0.0f;
    float m = fmaxf(fabsf(v0), fabsf(v1));
    for (int o = 1; o < 32; o <<= 1)
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float sc, iv;
    xh_scale(m, 0, &sc, &iv);
    unsigned h, lo;
    xh_terms(v0 * sc, v1 * sc, &h, &lo);
    unsigned *q = t + ((size_t)r * chunks + c) * 64;
    q[l] = h, q[32 + l] = lo;
    if (!l) inv[(size_t)r * chunks + c] = iv;
}

/* one launch over the tiles of the set s (one format, or SK_MIX), n rows of x */
static void skinny_mma(struct sk_set &s, int fmt, const float *x, int n, int groups, int in) {
    bool q8h = (fmt == WF_Q8 || fmt == SK_MIX) && q8h_on();
    int xr = !q8h ? 0 : n > 1 ? 8 : 1;
    // NT 2 takes a block's tile as 32 features (s.tile0 counts them); the form below is chosen
    // from tiles of 16 all the same (the same kw and ks as NT 1, so the same bits)
    long long tiles = 0, units = 0, bytes = 0;
    for (int i = 0; i < s.m; i++)
        tiles += ceil_div(s.out[i], 16);
    int nt = fmt == WF_Q8 && xr == 8 && n <= 8 ? q8h_nt(tiles * groups) : 1;
    // 16-byte loads of weights (Q8: of 16 codes, a row's start aligned when in is a multiple of 16)
    bool vec = in % 8 == 0 && (groups * in) % 4 == 0 && (uintptr_t)x % 16 == 0 &&
               ((fmt != WF_Q8 && fmt != SK_MIX) || in % 16 == 0);
    for (int i = 0; i < s.m; i++) {
        int f = fmt == SK_MIX ? s.fmt[i] : fmt;
        s.tile0[i] = (int)units;
        units += ceil_div(s.out[i], 16 * nt);
        bytes += (long long)groups * s.out[i] * in * (f == WF_BF16 ? 2 : 1) / (f == WF_Q4 ? 2 : 1);
        vec = vec && (uintptr_t)s.w[i].p % 16 == 0;
    }
    TD_ASSERT(fmt != SK_MIX || vec); // (matmul_set_cuda mixes only what loads 16 bytes)
    s.tile0[s.m] = (int)units;
    s.xt = NULL, s.xinv = NULL, s.xchunks = 0;
    if (xr == 8 && n > 8 && n <= QUANT_MMA_ROWS && groups == 1 && q8h_xt_on(tiles)) {
        int chunks = ceil_div(in, 64);
        ensure_xt((size_t)n * chunks); // (sized at start-up by matmul_cuda_reserve)
        launch_k(q8h_terms_kernel, dim3(chunks, n), 32, 0, td_cuda_stream(), x, in, chunks,
                 mm().xt_buf, mm().xt_inv);
        LAUNCH_CHECK();
        s.xt = mm().xt_buf, s.xinv = mm().xt_inv, s.xchunks = chunks;
    }
    s.rb = ceil_div(n, 8);
    tiles *= groups;
    bool acc1 = bytes >= (16ll << 20) || (q8h && fmt == WF_Q8);
    int kw, ks;
    // the form from the capacity of both xr at every width (xr 1 stages x in shared memory, xr 8
    // keeps it in registers), so a row's sums keep their order, and their bits, alone and in a
    // step of up to 8 rows
    sk_choose(fmt, tiles * s.rb, in, vec, acc1, xr ? 8 : 0, &kw, &ks);
    sk_form(
        fmt, vec, kw, acc1, ks, xr, nt,
        [&](auto fm, auto v, auto w, auto a, auto k, auto r, auto t) {
            constexpr int KS = decltype(k)::value;
            dim3 grid(s.tile0[s.m] * s.rb * KS, 1, groups);
            launch_kc(
                skinny_mma_kernel<decltype(fm)::value, decltype(v)::value, decltype(w)::value,
                                  decltype(a)::value, KS, decltype(r)::value, decltype(t)::value>,
                grid, 32 * kw, 0, KS, td_cuda_stream(), s, x, n, in, groups * in);
            LAUNCH_CHECK();
        });
}

/* one matrix (of `groups` blocks along the diagonal) as a set of one */
static void skinny_one(float *y, const float *x, const void *w, enum td_dtype dt, int n, int groups,
                       int in, int out, const void *bias, enum td_dtype bias_dtype) {
    struct sk_set s = {};
    s.m = 1;
    s.w[0] = wmat_of(w, dt, (long long)groups * out, in, 0), s.y[0] = y, s.bias[0] = bias;
    s.fmt[0] = wf_of(dt);
    s.bias_dt[0] = bias_dtype, s.out[0] = out, s.ys[0] = groups * out;
    skinny_mma(s, wf_of(dt), x, n, groups, in);
}

__global__ void add_bias_kernel(float *y, const void *b, int dt, int n, int out) {
    PDL_START();
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < (long long)n * out) y[i] += ld_f32(b, dt, i % out);
}

static int lt_trace = -1; /* TD_LT_TRACE=1: each plan made, and its query's time, on stderr */
static int lt_exact = -1; /* TD_LT_EXACT=1: a plan for every width (measuring the buckets) */

static int lt_bucket(int n) {
    int b = 1;
    while (b < n && b < (1 << 30))
        b *= 2;
    return b;
}

static struct lt_plan *lt_plan_for(int n, int in, int out, int ldb, int ldc, int exact, int fp8) {
    int nb = exact ? n : lt_bucket(n);
    for (int i = 0; i < mm().n_lt_plans; i++) {
        struct lt_plan *q = &mm().lt_plans[i];
        if (q->n == nb && q->exact == exact && q->in == in && q->out == out && q->ldb == ldb &&
            q->ldc == ldc && q->fp8 == fp8)
            return q;
    }
    static thread_local struct lt_plan spare; // a full table: the spare is remade for each shape
    struct lt_plan *q = mm().n_lt_plans < LT_PLANS ? &mm().lt_plans[mm().n_lt_plans] : &spare;
    if (q == &spare && spare.op) {
        cublasLtMatrixLayoutDestroy(spare.la);
        cublasLtMatrixLayoutDestroy(spare.lb);
        cublasLtMatrixLayoutDestroy(spare.lc);
        cublasLtMatmulDescDestroy(spare.op);
    }
    if (lt_trace < 0) lt_trace = td_env_on("TD_LT_TRACE");
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    *q = lt_plan(); // every member zero (C++ warns about a partial designated list)
    q->n = nb, q->in = in, q->out = out, q->ldb = ldb, q->ldc = ldc, q->exact = exact;
    q->cols = nb, q->fp8 = fp8;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cudaDataType_t ab = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&q->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(q->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(q->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (fp8) { // the weight's 128 x 128 scales, x's per 128 columns (a context's fixed buffers)
        int32_t am = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                bm = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
        const float *ws = mm().f8_ws, *xs = mm().f8_xs;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(q->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &am,
                                                    sizeof am));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(q->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bm,
                                                    sizeof bm));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(q->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                    &ws, sizeof ws));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(q->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                    &xs, sizeof xs));
    }
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&q->la, ab, in, out, in));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&q->lb, ab, in, nb, ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&q->lc, CUDA_R_32F, out, nb, ldc));
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &lt_ws_bytes, sizeof lt_ws_bytes));
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(mm().lt, q->op, q->la, q->lb, q->lc, q->lc,
                                                       pref, 1, &h, &found);
    if (hs != CUBLAS_STATUS_SUCCESS && !fp8) CUBLAS_CHECK(hs);
    if (hs != CUBLAS_STATUS_SUCCESS) found = 0;
    cublasLtMatmulPreferenceDestroy(pref);
    if (!found && fp8) { // (lt_fp8 falls back to the bf16 copy)
        cublasLtMatrixLayoutDestroy(q->la), cublasLtMatrixLayoutDestroy(q->lb);
        cublasLtMatrixLayoutDestroy(q->lc), cublasLtMatmulDescDestroy(q->op);
        *q = lt_plan();
        return NULL;
    }
    if (!found) TD_ABORT("cuBLASLt has no algorithm for %d x %d x %d", out, nb, in);
    q->algo = h.algo;
    if (q != &spare) mm().n_lt_plans++;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (lt_trace)
        fprintf(stderr, "cuBLASLt: plan %d of %d x %d (rows %d%s): %.1f us\n", mm().n_lt_plans, in,
                out, nb, exact ? ", exact" : "",
                1e6 * (double)(t1.tv_sec - t0.tv_sec) + 1e-3 * (double)(t1.tv_nsec - t0.tv_nsec));
    return q;
}

/* the plan's layouts at n columns (host-side attributes: a launch reads them as it is made) */
static void lt_set_cols(struct lt_plan *q, int n) {
    if (q->cols == n) return;
    uint64_t c = (uint64_t)n;
    CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(q->lb, CUBLASLT_MATRIX_LAYOUT_COLS, &c, sizeof c));
    CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(q->lc, CUBLASLT_MATRIX_LAYOUT_COLS, &c, sizeof c));
    q->cols = n;
}

/* C[out, n] (col-major, ldc) = W[out, in] . B, B = bf16 x rows (col-major in x n, ldb) */
static void lt_gemm(float *y, int ldc, const __nv_bfloat16 *xb, int ldb, const void *w, int n,
                    int in, int out) {
    float alpha = 1.0f, beta = 0.0f;
    if (lt_exact < 0) lt_exact = td_env_on("TD_LT_EXACT");
    for (int exact = lt_exact;; exact = 1) {
        struct lt_plan *q = lt_plan_for(n, in, out, ldb, ldc, exact, 0);
        lt_set_cols(q, n);
        cublasStatus_t st =
            cublasLtMatmul(mm().lt, q->op, &alpha, w, q->la, xb, q->lb, &beta, y, q->lc, y, q->lc,
                           &q->algo, mm().lt_ws, lt_ws_bytes, td_cuda_stream());
        if (st == CUBLAS_STATUS_SUCCESS) return;
        if (exact || st != CUBLAS_STATUS_NOT_SUPPORTED)
            TD_ABORT("cuBLASLt: %d x %d x %d: status %d", out, n, in, (int)st);
    }
}

/* FP8 weights on FP8 tensor cores (lt_fp8; TD_FP8_LT=1 at the first step, or
 * matmul_cuda_set_fp8_lt; off by default): the reference's own numerics for its FP8 linears
 * (released_formats.md 2.3-2.4): each row of x quantized to e4m3 per 128 columns with a
 * power-of-two scale (act_quant: amax floored at 1e-4, s = 2^ceil(log2(amax / 448))), the
 * weight's codes with their 128 x 128 scales, cuBLASLt's block-scaled FP8 GEMM (Hopper), fp32
 * sums. It reads the codes, not a bf16 copy made each step, and runs at FP8's rate; x loses the
 * bits e4m3 drops, which the bf16 path (and the HF oracle) keep. The scale grids' orders
 * (TD_FP8_LT_LAYOUT bits: 1 the weight's grid k-block fastest, 2 x's k-block fastest, else the
 * out / token index fastest) are 1, as a probe of cuBLASLt 13 on an H100 read them (session 40:
 * the weight's [out / 128][in / 128], x's [in / 128][n]); it refused every row count that is not a
 * multiple of 4 (x's scale columns are 16-byte aligned), and D in bf16 beside D in fp32 for
 * these modes. Steps of more than quant_mma_rows() rows, a multiple of 4, of one [out, in] Q8
 * matrix with in % 512 == 0 (the weight grid's rows then need no padding to 4 blocks) take it;
 * other steps and a shape cuBLASLt refuses take the bf16 copy (said once). */
#define F8_BLOCK 128
static int f8_mode = -1;   /* TD_FP8_LT */
static int f8_layout = -1; /* TD_FP8_LT_LAYOUT */

extern "C" void matmul_cuda_set_fp8_layout(int bits) {
    f8_layout = bits < 0 ? -1 : bits & 3; // (-1: TD_FP8_LT_LAYOUT's again)
}

extern "C" void matmul_cuda_set_fp8_lt(int on) {
    f8_mode = on < 0 ? -1 : on ? 1 : 0; // (-1: TD_FP8_LT's again)
}

static bool f8_on(void) {
    if (f8_mode < 0) f8_mode = getenv("TD_FP8_LT") && atoi(getenv("TD_FP8_LT")) ? 1 : 0;
    if (f8_layout < 0)
        f8_layout = getenv("TD_FP8_LT_LAYOUT") ? atoi(getenv("TD_FP8_LT_LAYOUT")) & 3 : 1;
    return f8_mode == 1;
}

/* x rows [n, in] to e4m3 codes q [n, in] and a power-of-two scale a row's 128 columns (quant.h
 * act_quant_ref, the same rules):
 * warp w of block (kb, y) takes row 4 y + w, 4 columns a lane */
__global__ void f8_act_quant_kernel(uint8_t *q, float *s, const float *x, int n, int in,
                                    int layout) {
    PDL_START();
    int lane = threadIdx.x & 31, t = blockIdx.y * 4 + (threadIdx.x >> 5), kb = blockIdx.x;
    if (t >= n) return;
    int c = kb * F8_BLOCK + 4 * lane, kblk = (in + F8_BLOCK - 1) / F8_BLOCK;
    const float *xr = x + (size_t)t * in;
    float v[4], m = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++)
        v[i] = c + i < in ? xr[c + i] : 0.0f, m = fmaxf(m, fabsf(v[i]));
#pragma unroll
    for (int o = 16; o; o >>= 1)
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    m = fmaxf(m, 1e-4f); // (a NaN x stays NaN in its codes, as the reference's does)
    unsigned r = __float_as_uint(m / 448.0f);
    int e = (int)((r >> 23) & 255u) + ((r & 0x7fffffu) != 0); // the biased exponent, rounded up
    float sc = __uint_as_float((unsigned)e << 23), inv = __uint_as_float((unsigned)(254 - e) << 23);
#pragma unroll
    for (int i = 0; i < 4; i++)
        if (c + i < in)
            q[(size_t)t * in + c + i] =
                (uint8_t)__nv_cvt_float_to_fp8(v[i] * inv, __NV_SATFINITE, __NV_E4M3);
    if (lane == 0) s[layout & 2 ? (size_t)t * kblk + kb : (size_t)kb * n + t] = sc;
}

/* the weight's e8m0 scale bytes [oblk, kblk] as fp32 in cuBLASLt's order */
__global__ void f8_w_scales_kernel(float *ws, const uint8_t *sb, int oblk, int kblk, int layout) {
    PDL_START();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= oblk * kblk) return;
    int ob = i / kblk, kb = i % kblk;
    unsigned b = sb[i];
    float v = b ? __uint_as_float(b << 23) : __uint_as_float(0x00400000u); // 2^(b - 127)
    ws[layout & 1 ? (size_t)kb + (size_t)ob * kblk : (size_t)ob + (size_t)kb * oblk] = v;
}

/* whether a step of n rows of an [out, in] matrix of dtype t takes the FP8 tensor cores: the
 * plan (NULL: not this form; a shape cuBLASLt refuses keeps the bf16 copy, said once) */
static struct lt_plan *f8_plan(enum td_dtype t, int n, int in, int out) {
    if (t != TD_DTYPE_Q8 || in % (4 * F8_BLOCK) || out % 16 || n % 4 || !f8_on() ||
        mm().deterministic || (size_t)n * in > mm().f8_x_cap ||
        (size_t)n * (in / F8_BLOCK) > mm().f8_xs_cap ||
        (size_t)ceil_div(out, F8_BLOCK) * (in / F8_BLOCK) > mm().f8_ws_cap)
        return NULL; // (matmul_cuda_reserve sized the buffers: a caller that reserved nothing)
    struct lt_plan *q = lt_plan_for(n, in, out, in, out, 0, 1);
    static bool said;
    if (!q && !said)
        fprintf(stderr,
                "tandem: cuBLASLt has no block-scaled FP8 GEMM for %d x %d x %d here: FP8 "
                "weights take their bf16 copies\n",
                out, n, in);
    said = said || !q;
    return q;
}

/* x [n, in] as e4m3 codes and scales into the context's buffers, once for every FP8 matrix of a
 * step over that x */
static void f8_quant_x(const float *x, int n, int in) {
    launch_k(f8_act_quant_kernel, dim3(in / F8_BLOCK, ceil_div(n, 4)), 128, 0, td_cuda_stream(),
             mm().f8_x, mm().f8_xs, x, n, in, f8_layout);
    LAUNCH_CHECK();
}

/* y [n, out] = x [n, in] . W^T on FP8 tensor cores, x quantized (f8_quant_x) */
static void lt_fp8(struct lt_plan *q, float *y, const void *w, int n, int in, int out) {
    int kblk = in / F8_BLOCK, oblk = ceil_div(out, F8_BLOCK);
    struct wmat m = wmat_of(w, TD_DTYPE_Q8, out, in, 0);
    launch_k(f8_w_scales_kernel, ceil_div(oblk * kblk, 256), 256, 0, td_cuda_stream(), mm().f8_ws,
             m.s, oblk, kblk, f8_layout);
    LAUNCH_CHECK();
    lt_set_cols(q, n);
    float alpha = 1.0f, beta = 0.0f;
    CUBLAS_CHECK(cublasLtMatmul(mm().lt, q->op, &alpha, w, q->la, mm().f8_x, q->lb, &beta, y, q->lc,
                                y, q->lc, &q->algo, mm().lt_ws, lt_ws_bytes, td_cuda_stream()));
}

/* Quantized weights (quant.h): steps of up to quant_mma_rows() rows take the skinny kernel, in
 * blocks of 8 rows whose reads of a tile follow each other (L2 serves all but the first);
 * wider steps (prefill) decode the matrix into a bf16 copy and run cuBLASLt on it, which at
 * such widths is bound by its arithmetic, not by the extra pass (quant_mma_rows, above). */

extern "C" int matmul_cuda_reserve(const struct td_reserve *r, char *err, size_t errlen) {
    (void)err, (void)errlen;
    ensure_lt((size_t)r->rows * r->gemm_in);
    if (r->quant_weight && q8h_xt_mode() != 2)
        ensure_xt((size_t)(r->rows < QUANT_MMA_ROWS ? r->rows : QUANT_MMA_ROWS) *
                  ceil_div(r->gemm_in, 64));
    if (r->rows > quant_mma_rows() && (size_t)r->quant_weight > mm().wbuf_cap) {
        mm().wbuf_cap = (size_t)r->quant_weight; // grow only: captured graphs keep the old address
        CUDA_CHECK(cudaMalloc(&mm().wbuf, mm().wbuf_cap * sizeof(__nv_bfloat16)));
    }
    if (r->rows > quant_mma_rows() && r->quant_weight && f8_on() && !mm().f8_x) {
        // (made once, before any plan: the plans hold the scales' addresses)
        size_t kb = (size_t)ceil_div(r->gemm_in, F8_BLOCK);
        mm().f8_x_cap = (size_t)r->rows * r->gemm_in, mm().f8_xs_cap = (size_t)r->rows * kb;
        mm().f8_ws_cap = (size_t)r->quant_weight / (F8_BLOCK * F8_BLOCK) +
                         2 * (size_t)r->quant_weight / F8_BLOCK + 1;
        CUDA_CHECK(cudaMalloc(&mm().f8_x, mm().f8_x_cap));
        CUDA_CHECK(cudaMalloc(&mm().f8_xs, mm().f8_xs_cap * sizeof(float)));
        CUDA_CHECK(cudaMalloc(&mm().f8_ws, mm().f8_ws_cap * sizeof(float)));
    }
    return 0;
}

static const __nv_bfloat16 *x_as_bf16(const float *x, size_t elems) {
    ensure_lt(elems);
    launch_k(to_bf16_kernel, ceil_div(ceil_div(elems, 8), 256), 256, 0, td_cuda_stream(), mm().xbuf,
             x, elems);
    LAUNCH_CHECK();
    return mm().xbuf;
}

/* 8 weights of a row a thread: the packed matrix [rows, in] as bf16 */
template <int F>
__global__ void dequant_bf16_kernel(__nv_bfloat16 *y, const void *w, long long rows, int in) {
    PDL_START();
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x, per = (in + 7) / 8;
    if (i >= rows * per) return;
    int r = (int)(i / per), k = (int)(i % per) * 8;
    struct wmat m = wmat_of(w, F == WF_Q8 ? TD_DTYPE_Q8 : TD_DTYPE_Q4, rows, in, 0);
    wraw<F> v;
    wraw_load<F, false>(v, m, r, (int)rows, in, k);
    uint4 b = pairs_in_order<F>(wraw_a<F>(v));
    __nv_bfloat16 *yr = y + (size_t)r * in + k;
    if (in % 8 == 0) {
        *(uint4 *)yr = b;
        return;
    }
    const __nv_bfloat16 *h = (const __nv_bfloat16 *)&b;
    for (int j = 0; j < 8 && k + j < in; j++)
        yr[j] = h[j];
}

static const __nv_bfloat16 *w_as_bf16(const void *w, enum td_dtype dt, long long rows, int in) {
    TD_ASSERT((size_t)(rows * in) <= mm().wbuf_cap); // matmul_cuda_reserve sized it
    unsigned blocks = (unsigned)ceil_div(rows * ((in + 7) / 8), 256);
    if (dt == TD_DTYPE_Q8)
        launch_k(dequant_bf16_kernel<WF_Q8>, blocks, 256, 0, td_cuda_stream(), mm().wbuf, w, rows,
                 in);
    else
        launch_k(dequant_bf16_kernel<WF_Q4>, blocks, 256, 0, td_cuda_stream(), mm().wbuf, w, rows,
                 in);
    LAUNCH_CHECK();
    return mm().wbuf;
}

static bool quantized(enum td_dtype t) {
    return t == TD_DTYPE_Q8 || t == TD_DTYPE_Q4;
}

/* Bf16 matrices take the row-blocked skinny kernel up to MATMUL_WIDE_ROWS rows too while their
 * bytes times the row blocks (8 rows each) are at most SKINNY_WIDE_BYTES: every row block
 * re-reads the matrix (from L2 after the first), and against that the cuBLASLt path costs a
 * launch per matrix (a set's matrices one by one, a grouped matrix's groups one by one) and a
 * pass that rounds x to bf16. tandem-tiny's decode step took 132 kernels at batch 1 and 299 at
 * batch 64, 554 and 1042 us (Nsight Compute, context ~300), nearly all the growth in that
 * path. bench/gemm_time (GEMM_ROWS=16,64, H200; skinny against cuBLASLt, us): tandem-tiny's
 * head (4 MiB) 4.94 / 4.65 at 16 rows, 18.3 / 5.0 at 64; the Flash kv (4 MiB) 5.1 / 7.0 and
 * 9.9 / 7.9; the router (2 MiB) 3.9 / 6.8 and 6.9 / 7.7; q_a (8 MiB) 7.3 / 7.6 and 16.6 / 8.4;
 * an HCA layer's set of four 12.7 / 28.9 and 36.2 / 32.0. TD_SKINNY_BYTES=N sets the bound
 * (measuring only). The rows went from 128 to 512 (a DSpark verify step of 64 sequences has
 * 384): tandem-tiny's verify step of 192 rows (batch 32) took 81 cuBLASLt launches and 63
 * passes rounding x to bf16, 478 us of its 1337 against the skinny kernel's 140 at 32 rows
 * (Nsight Compute, H100). */
#define SKINNY_WIDE_BYTES ((size_t)16 << 20)

static size_t skinny_wide_bytes(void) {
    static long long b = -1;
    if (b < 0) b = getenv("TD_SKINNY_BYTES") ? atoll(getenv("TD_SKINNY_BYTES")) : SKINNY_WIDE_BYTES;
    return (size_t)b;
}

/* whether a step of n rows of an [out, in] matrix of dtype t takes the skinny kernel */
static bool skinny(enum td_dtype t, int n, int in, long long out) {
    if (quantized(t)) return n <= quant_mma_rows();
    if (t != TD_DTYPE_BF16) return false;
    size_t reads = (size_t)out * in * 2 * (size_t)ceil_div(n, 8);
    return n <= SKINNY_ROWS || (n <= MATMUL_WIDE_ROWS && reads <= skinny_wide_bytes());
}

extern "C" int matmul_cuda_reads_f32(enum td_dtype t, int n, int in, long long out) {
    return mm().deterministic || skinny(t, n, in, out) || (t != TD_DTYPE_BF16 && !quantized(t));
}

/* the wide steps' form (cuBLASLt on bf16 x, quantized weights decoded first) */
static bool lt_takes(enum td_dtype t) {
    return t == TD_DTYPE_BF16 || quantized(t);
}

static void lt_one(float *y, const __nv_bfloat16 *xb, const void *w, enum td_dtype w_dtype, int n,
                   int in, int out) {
    if (quantized(w_dtype)) w = w_as_bf16(w, w_dtype, out, in);
    lt_gemm(y, out, xb, in, w, n, in, out);
}

static void add_bias(float *y, const void *bias, enum td_dtype bias_dtype, int n, int out) {
    launch_k(add_bias_kernel, ceil_div((long long)n * out, 256), 256, 0, td_cuda_stream(), y, bias,
             bias_dtype, n, out);
    LAUNCH_CHECK();
}

extern "C" void matmul_cuda(float *y, const float *x, const void *w, enum td_dtype w_dtype, int n,
                            int in, int out, const void *bias, enum td_dtype bias_dtype) {
    if (!n || !out) return;
    if (mm().deterministic) {
        launch_k(matmul_warp_kernel, ceil_div((long long)n * out * 32, 256), 256, 0,
                 td_cuda_stream(), y, x, w, w_dtype, (long long)out, 0, n, in, out, in, out);
        LAUNCH_CHECK();
    } else if (skinny(w_dtype, n, in, out)) {
        skinny_one(y, x, w, w_dtype, n, 1, in, out, bias, bias_dtype);
        return; // bias added
    } else if (struct lt_plan *f8 = f8_plan(w_dtype, n, in, out)) {
        f8_quant_x(x, n, in);
        lt_fp8(f8, y, w, n, in, out);
    } else if (lt_takes(w_dtype)) {
        lt_one(y, x_as_bf16(x, (size_t)n * in), w, w_dtype, n, in, out);
    } else {
        launch_k(matmul_f32_kernel, ceil_div((long long)n * out, 128), 128, 0, td_cuda_stream(), y,
                 x, w, w_dtype, (long long)out, 0, n, in, out, in, out);
        LAUNCH_CHECK();
    }
    if (bias) add_bias(y, bias, bias_dtype, n, out);
}

extern "C" void matmul_grouped_cuda(float *y, const float *x, const void *w, enum td_dtype w_dtype,
                                    int n, int groups, int in, int out) {
    if (!n) return;
    long long rows = (long long)groups * out;
    if (mm().deterministic) {
        for (int j = 0; j < groups; j++) {
            launch_k(matmul_warp_kernel, ceil_div((long long)n * out * 32, 256), 256, 0,
                     td_cuda_stream(), y + (size_t)j * out, x + (size_t)j * in, w, w_dtype, rows,
                     j * out, n, in, out, groups * in, groups * out);
            LAUNCH_CHECK();
        }
        return;
    }
    if (skinny(w_dtype, n, in, rows)) {
        skinny_one(y, x, w, w_dtype, n, groups, in, out, NULL, TD_DTYPE_F32);
        return;
    }
    if (lt_takes(w_dtype)) {
        const __nv_bfloat16 *xb = x_as_bf16(x, (size_t)n * groups * in);
        if (quantized(w_dtype)) w = w_as_bf16(w, w_dtype, rows, in);
        for (int j = 0; j < groups; j++)
            lt_gemm(y + (size_t)j * out, groups * out, xb + (size_t)j * in, groups * in,
                    (const __nv_bfloat16 *)w + (size_t)j * out * in, n, in, out);
        return;
    }
    for (int j = 0; j < groups; j++) {
        launch_k(matmul_f32_kernel, ceil_div((long long)n * out, 128), 128, 0, td_cuda_stream(),
                 y + (size_t)j * out, x + (size_t)j * in, w, w_dtype, rows, j * out, n, in, out,
                 groups * in, groups * out);
        LAUNCH_CHECK();
    }
}

/* whether a set's Q8 and bf16 matrices share one skinny launch (SK_MIX): the released precision
 * keeps the compressors, the indexer's weights_proj and compressor and the router in bf16 beside
 * FP8 projections of the same x, which split a layer's sets into a launch per format (the
 * released Flash slice: 37 skinny launches a step against bf16's 21). TD_SKINNY_MIX=0 splits
 * them again (measuring only). */
static bool sk_mix(void) {
    static int on = -1;
    if (on < 0) on = !getenv("TD_SKINNY_MIX") || atoi(getenv("TD_SKINNY_MIX"));
    return on && q8h_on(); // (the mixed form takes Q8 in half precision)
}

/* a set of matrices over the same x: a skinny step is one launch for the set's matrices of each
 * format (bf16 and Q8 together, Q4; the form, and so the order of every sum, follows those
 * shapes alone), anything else one matmul_cuda each */
extern "C" void matmul_set_cuda(const float *x, int n, int in, int m, const struct matmul_out *o) {
    if (!n || !m) return;
    TD_ASSERT(m <= MATMUL_SET_MAX);
    bool done[MATMUL_SET_MAX] = {};
    // the launch group of a matrix: its format, or SK_MIX for Q8 and bf16 when mixing where
    // the mixed form's 16-byte loads hold (the form is built with them alone)
    bool mix = sk_mix() && in % 16 == 0 && (uintptr_t)x % 16 == 0;
    auto group = [&](const struct matmul_out &q) {
        int f = wf_of(q.dtype);
        return mix && (f == WF_Q8 || f == WF_BF16) && (uintptr_t)q.w % 16 == 0 ? SK_MIX : f;
    };
    const __nv_bfloat16 *xb = NULL; // x as bf16, made once for the set's wide matrices
    bool xq = false;                // x as e4m3 codes, the same for its FP8 ones (f8_plan)
    for (int i = 0; i < m; i++) {
        if (done[i]) continue;
        if (mm().deterministic || !skinny(o[i].dtype, n, in, o[i].out)) {
            struct lt_plan *f8 = f8_plan(o[i].dtype, n, in, o[i].out);
            if (f8) {
                if (!xq) f8_quant_x(x, n, in), xq = true;
                lt_fp8(f8, o[i].y, o[i].w, n, in, o[i].out);
                if (o[i].bias) add_bias(o[i].y, o[i].bias, o[i].bias_dtype, n, o[i].out);
            } else if (!mm().deterministic && lt_takes(o[i].dtype)) {
                if (!xb) xb = x_as_bf16(x, (size_t)n * in);
                lt_one(o[i].y, xb, o[i].w, o[i].dtype, n, in, o[i].out);
                if (o[i].bias) add_bias(o[i].y, o[i].bias, o[i].bias_dtype, n, o[i].out);
            } else {
                matmul_cuda(o[i].y, x, o[i].w, o[i].dtype, n, in, o[i].out, o[i].bias,
                            o[i].bias_dtype);
            }
            if (o[i].pos_bias)
                add_pos_bias_cuda(o[i].y, o[i].pos_bias, o[i].pos_bias_dtype, o[i].positions,
                                  o[i].rate, n, o[i].out);
            done[i] = true;
            continue;
        }
        struct sk_set s = {};
        bool q8 = false, bf16 = false;
        for (int j = i; j < m; j++) {
            if (done[j] || group(o[j]) != group(o[i]) || !skinny(o[j].dtype, n, in, o[j].out))
                continue;
            int q = s.m++;
            s.fmt[q] = wf_of(o[j].dtype);
            q8 = q8 || s.fmt[q] == WF_Q8, bf16 = bf16 || s.fmt[q] == WF_BF16;
            s.w[q] = wmat_of(o[j].w, o[j].dtype, o[j].out, in, 0), s.y[q] = o[j].y;
            s.bias[q] = o[j].bias, s.bias_dt[q] = o[j].bias_dtype, s.out[q] = o[j].out;
            s.ys[q] = o[j].out, s.pbias[q] = o[j].pos_bias, s.pbias_dt[q] = o[j].pos_bias_dtype;
            s.pos[q] = o[j].positions, s.rate[q] = o[j].rate;
            done[j] = true;
        }
        skinny_mma(s, q8 && bf16 ? SK_MIX : wf_of(o[i].dtype), x, n, 1, in);
    }
}
