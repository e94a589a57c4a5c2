/* rope.cu: interleaved partial RoPE on the trailing dims, per row position (see rope.h).
 * The angle is the fp32 product pos * inv_freq as in HF; cos/sin are taken in double and
 * rounded, as the CPU reference does. */
#include "cuda_common.cuh"
#include "rope.h"

/* grid (rows, pair spans): a block's cos/sin per frequency first (a double sincos each; once
 * per frequency, not per vector: 64 heads of the Flash slice made each 64 times, 10 us a
 * call), then one pair per thread. A single block per row walked the Flash slice's 2048 query
 * pairs 16 at a time: 8 us a call, one memory round trip after another. */
#define ROPE_PAIRS   256
#define ROPE_MAX_ROT 512 /* a block's cos/sin tables hold 256 frequencies */
__global__ void rope_rows_kernel(float *x, int n_vec, int d, int rot, const int32_t *positions,
                                 const float *inv_freq, float af, int inverse) {
    if (threadIdx.x == 0) prefetch_l2_line(positions + blockIdx.x), prefetch_l2_line(inv_freq);
    PDL_START();
    __shared__ float cs[ROPE_MAX_ROT / 2], sn[ROPE_MAX_ROT / 2];
    int t = blockIdx.x, half = rot / 2;
    float pos = (float)positions[t];
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float s;
        rope_cos_sin(pos, inv_freq, i, af, &cs[i], &s);
        sn[i] = inverse ? -s : s;
    }
    __syncthreads();
    for (int k = blockIdx.y * ROPE_PAIRS + threadIdx.x;
         k < n_vec * half && k < (blockIdx.y + 1) * ROPE_PAIRS; k += blockDim.x) {
        int v = k / half, i = k % half;
        float c = cs[i], s = sn[i];
        float *r = x + ((size_t)t * n_vec + v) * d + (d - rot);
        float2 y = rope_pair(r[2 * i], r[2 * i + 1], c, s);
        r[2 * i] = y.x;
        r[2 * i + 1] = y.y;
    }
}

extern "C" int rope_cuda_reserve(const struct td_reserve *r, char *err, size_t errlen) {
    if (r->rot_dim > ROPE_MAX_ROT)
        return td_errf(err, errlen,
                       "backend cuda: %d rotary dims, the rope kernel takes at most %d", r->rot_dim,
                       ROPE_MAX_ROT);
    return 0;
}

extern "C" void rope_rows_cuda(float *x, int n, int n_vec, int d, int rot_dim,
                               const int32_t *positions, const float *inv_freq,
                               float attention_factor, int inverse) {
    if (!n || !rot_dim) return;
    TD_ASSERT(rot_dim <= ROPE_MAX_ROT); // rope_cuda_reserve refuses such models first
    int spans = ceil_div(n_vec * (rot_dim / 2), ROPE_PAIRS);
    launch_k(rope_rows_kernel, dim3(n, spans), ROPE_PAIRS, 0, td_cuda_stream(), x, n_vec, d,
             rot_dim, positions, inv_freq, attention_factor, inverse);
    LAUNCH_CHECK();
}
