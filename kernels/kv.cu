/* kv.cu: a step's rows into a key cache on the GPU (see kv.h): a warp per 64 dims of a row,
 * lane l holding dims l and l + 32; an fp8 block's scale from the warp's max, exactly as
 * kv_put_ref. */
#include "cuda_common.cuh"
#include "kv.h"

#define KV_WARPS 4

__global__ void kv_store_kernel(struct kv_store_args a, int n_chunks) {
    PDL_START();
    const struct kv_fmt f = a.fmt;
    long long g = blockIdx.x * (long long)KV_WARPS + (threadIdx.x >> 5);
    if (g >= (long long)a.rows.n_tok * n_chunks) return;
    int t = (int)(g / n_chunks), k = (int)(g % n_chunks), lane = threadIdx.x & 31;
    int n8 = f.dtype == TD_KV_FP8 ? f.n8 : 0, nc8 = (n8 + KV_FP8_BLOCK - 1) / KV_FP8_BLOCK;
    int fp8 = k < nc8, c0 = fp8 ? k * KV_FP8_BLOCK : n8 + (k - nc8) * KV_FP8_BLOCK;
    int c1 = min(c0 + KV_FP8_BLOCK, fp8 ? n8 : f.d);
    int sq = a.rows.row_seq[t], live = a.at && sq >= 0 && a.at[t] >= 0;
    unsigned char *dst = live ? (unsigned char *)a.cache + kv_store_row(&a, t, sq) * f.rec : NULL;
    float *x = a.x + (size_t)t * f.d;
    unsigned char *sr = a.step ? (unsigned char *)a.step + (size_t)t * f.rec : NULL;
    float v[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int c = c0 + lane + 32 * i;
        v[i] = c < c1 ? x[c] : 0.0f;
    }
    if (fp8) {
        uint8_t sb = kv_fp8_scale_of(warp_max(fmaxf(fabsf(v[0]), fabsf(v[1]))));
        float s = kv_fp8_scale_val(sb);
        if (dst && lane == 0) dst[n8 + k] = sb;
        if (sr && lane == 0) sr[n8 + k] = sb;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int c = c0 + lane + 32 * i;
            if (c >= c1) continue;
            uint8_t q = kv_e4m3_of(v[i] / s);
            if (dst) dst[c] = q;
            if (sr) sr[c] = q;
            x[c] = kv_e4m3_val(q) * s;
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int c = c0 + lane + 32 * i;
        if (c >= c1) continue;
        if (f.dtype == TD_KV_F32) {
            if (dst) ((float *)dst)[c] = v[i];
            if (sr) ((float *)sr)[c] = v[i];
            continue;
        }
        uint16_t h = kv_bf16_of(v[i]);
        int at = f.dtype == TD_KV_FP8 ? f.tail_at : 0;
        if (dst) ((uint16_t *)(dst + at))[c - n8] = h;
        if (sr) ((uint16_t *)(sr + at))[c - n8] = h;
        x[c] = kv_bf16_val(h);
    }
}

extern "C" void kv_store_cuda(const struct kv_store_args *a) {
    if (!a->rows.n_tok) return;
    int n8 = a->fmt.dtype == TD_KV_FP8 ? a->fmt.n8 : 0;
    int n_chunks = ceil_div(n8, KV_FP8_BLOCK) + ceil_div(a->fmt.d - n8, KV_FP8_BLOCK);
    launch_k(kv_store_kernel, ceil_div((long long)a->rows.n_tok * n_chunks, KV_WARPS),
             32 * KV_WARPS, 0, td_cuda_stream(), *a, n_chunks);
    LAUNCH_CHECK();
}
