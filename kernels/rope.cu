/* rope.cu: interleaved partial RoPE on the trailing dims, per row position (see rope.h).
 * The angle is the fp32 product pos * inv_freq as in HF; cos/sin are taken in double and
 * rounded, as the CPU reference does. */
#include "cuda_common.cuh"
#include "rope.h"

__global__ void rope_rows_kernel(float *x, int n_vec, int d, int rot, const int32_t *positions,
                                 const float *inv_freq, float af, int inverse) {
    int t = blockIdx.x, half = rot / 2;
    float pos = (float)positions[t];
    for (int k = threadIdx.x; k < n_vec * half; k += blockDim.x) {
        int v = k / half, i = k % half;
        float ang = pos * inv_freq[i];
        double sd, cd;
        sincos((double)ang, &sd, &cd);
        float c = (float)cd * af, s = (float)sd * af;
        if (inverse) s = -s;
        float *r = x + ((size_t)t * n_vec + v) * d + (d - rot);
        float a = r[2 * i], b = r[2 * i + 1];
        r[2 * i] = a * c - b * s;
        r[2 * i + 1] = b * c + a * s;
    }
}

extern "C" void rope_rows_cuda(float *x, int n, int n_vec, int d, int rot_dim,
                               const int32_t *positions, const float *inv_freq,
                               float attention_factor, int inverse) {
    if (!n || !rot_dim) return;
    rope_rows_kernel<<<n, 128, 0, td_cuda_stream()>>>(x, n_vec, d, rot_dim, positions, inv_freq,
                                                      attention_factor, inverse);
    LAUNCH_CHECK();
}
