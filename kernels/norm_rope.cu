/* norm_rope.cu: RMSNorm, RoPE and the optional ring store of norm_rope.h on the GPU. Grid
 * (rows, vector groups of NR_WARPS): the block's cos/sin per frequency first (a double sincos
 * each, rounded, as rope.cu and the reference), then one warp per vector, each lane holding its
 * channel pairs in registers from the load to the store. */
#include "cuda_common.cuh"
#include "norm_rope.h"

#define NR_WARPS 8
#define NR_PAIRS 8 /* channel pairs per lane: vectors of up to 512 */

/* the parts of one launch: blocks y < groups0 of the grid take part 0, the others part 1 */
struct nr_parts {
    struct norm_rope_args a[NORM_ROPE_PARTS];
    int groups0;
};

__global__ void norm_rope_kernel(const __grid_constant__ struct nr_parts pp) {
    int part = blockIdx.y >= pp.groups0, group = blockIdx.y - (part ? pp.groups0 : 0);
    const struct norm_rope_args &a = pp.a[part];
    prefetch_l2(a.w, (size_t)a.d * td_dtype_size((enum td_dtype)a.w_dtype));
    prefetch_row_plan(a.rows, blockIdx.x);
    if (threadIdx.x == 0) {
        prefetch_l2_line(a.positions + blockIdx.x);
        prefetch_l2_line(a.inv_freq);
        if (a.write) prefetch_l2_line(a.write + blockIdx.x);
    }
    PDL_START();
    __shared__ float cs[256], sn[256];
    int t = blockIdx.x, half = a.rot_dim / 2, lane = threadIdx.x & 31;
    int v = group * NR_WARPS + (threadIdx.x >> 5);
    float pos = (float)a.positions[t];
    for (int i = threadIdx.x; i < half; i += blockDim.x)
        rope_cos_sin(pos, a.inv_freq, i, a.attn_factor, &cs[i], &sn[i]);
    __syncthreads();
    if (v >= a.n_vec) return;
    float2 *xv = (float2 *)(a.x + ((size_t)t * a.n_vec + v) * a.d);
    int np = a.d / 2, p0 = (a.d - a.rot_dim) / 2;
    float2 p[NR_PAIRS];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < NR_PAIRS; k++) {
        int j = lane + 32 * k;
        p[k] = j < np ? xv[j] : make_float2(0.0f, 0.0f);
        ss += p[k].x * p[k].x + p[k].y * p[k].y;
    }
    ss = warp_sum(ss);
    float r = rsqrtf(ss / a.d + a.eps);
    float *dst = NULL;
    if (a.ring && a.write[t] >= 0)
        dst = a.ring +
              ((size_t)a.rows.slot[a.rows.row_seq[t]] * a.ring_rows + a.write[t]) * a.n_vec * a.d +
              (size_t)v * a.d;
#pragma unroll
    for (int k = 0; k < NR_PAIRS; k++) {
        int j = lane + 32 * k;
        if (j >= np) break;
        float x0 = p[k].x * r, x1 = p[k].y * r;
        if (a.w) x0 *= ld_f32(a.w, a.w_dtype, 2 * j), x1 *= ld_f32(a.w, a.w_dtype, 2 * j + 1);
        float2 y = j >= p0 ? rope_pair(x0, x1, cs[j - p0], sn[j - p0]) : make_float2(x0, x1);
        xv[j] = y;
        if (dst) ((float2 *)dst)[j] = y;
    }
}

/* a vector width and rotary dims the kernel takes: even, a warp's lanes hold it */
static bool nr_width_ok(int d, int rot_dim) {
    return d % 2 == 0 && d <= 64 * NR_PAIRS && rot_dim <= d && rot_dim <= 512 && rot_dim % 2 == 0;
}

extern "C" int norm_rope_cuda_reserve(const struct td_reserve *r, char *err, size_t errlen) {
    return reserve_widths(r, nr_width_ok, "norm and rope", 64 * NR_PAIRS, err, errlen);
}

extern "C" void norm_rope_cuda(const struct norm_rope_args *a, int m) {
    struct nr_parts pp = {};
    int groups = 0, warps = 1;
    TD_ASSERT(m <= NORM_ROPE_PARTS);
    for (int i = 0; i < m; i++) {
        const struct norm_rope_args *p = &a[i];
        // norm_rope_cuda_reserve refuses such widths first; the rows are the call's contract
        TD_ASSERT(nr_width_ok(p->d, p->rot_dim) && p->n == a[0].n);
        pp.a[i] = *p;
        if (i == 0) pp.groups0 = ceil_div(p->n_vec, NR_WARPS);
        groups += ceil_div(p->n_vec, NR_WARPS);
        warps = max(warps, min(p->n_vec, NR_WARPS));
    }
    if (!m || !a[0].n || !groups) return;
    if (m == 1) pp.groups0 = groups; // (every block part 0)
    launch_k(norm_rope_kernel, dim3(a[0].n, groups), 32 * warps, 0, td_cuda_stream(), pp);
    LAUNCH_CHECK();
}
