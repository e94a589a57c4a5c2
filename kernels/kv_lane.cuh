/* kv_lane.cuh: a key record's columns on the device (kv.h's formats), as the kernels that read
 * the caches load them: one column (key_at), a lane's NC contiguous ones (key_lane), 16 of them
 * as bf16 operands of tensor-core tiles (key16_bf16). Every form gives kv_get's values. */
#ifndef TD_KERNELS_KV_LANE_CUH
#define TD_KERNELS_KV_LANE_CUH

#include <type_traits>

#include "cuda_common.cuh"
#include "mma_tile.cuh"

/* f(KT) with KT, the key cache's precision, a compile-time constant */
template <typename F> static void by_kv(int kt, F &&f) {
    if (kt == TD_KV_BF16)
        f(std::integral_constant<int, TD_KV_BF16>{});
    else if (kt == TD_KV_FP8)
        f(std::integral_constant<int, TD_KV_FP8>{});
    else
        f(std::integral_constant<int, TD_KV_F32>{});
}

/* Every read of a key record is a read-only load of global memory (ld.global.nc: the caches
 * and a step's rows are written by earlier kernels, never by the one that reads them). A
 * generic load might alias the shared-memory stores of the tiles the keys go into, so the
 * compiler keeps each one behind the store before it: a thread's loads of a chunk then wait
 * for each other, one trip to L2 each. These may be issued together. */
template <typename T, bool SM = false>
__device__ __forceinline__ T key_ld(const void *p, size_t i) {
    if constexpr (SM)
        return ((const T *)p)[i]; // a record staged in shared memory (ld.global.nc would fault)
    else
        return __ldg((const T *)p + i);
}

/* column c of key record p, the cache's precision KT known at compile time: kv_get's value */
template <int KT, bool SM = false>
__device__ __forceinline__ float key_at(const void *p, const kv_fmt &f, int c) {
    const unsigned char *b = (const unsigned char *)p;
    if constexpr (KT == TD_KV_F32)
        return key_ld<float, SM>(p, c);
    else if constexpr (KT == TD_KV_BF16)
        return kv_bf16_val(key_ld<unsigned short, SM>(p, c));
    else if (c >= f.n8)
        return kv_bf16_val(key_ld<unsigned short, SM>(b + f.tail_at, c - f.n8));
    else
        return kv_e4m3_val(key_ld<unsigned char, SM>(b, c)) *
               kv_fp8_scale_val(key_ld<unsigned char, SM>(b, f.n8 + c / KV_FP8_BLOCK));
}

/* 4 bf16 values (8 bytes, in column order) as floats v[0 .. 3] */
__device__ __forceinline__ void bf16x4_vals(float *v, uint2 w) {
    v[0] = __uint_as_float(w.x << 16), v[1] = __uint_as_float(w.x & 0xFFFF0000u);
    v[2] = __uint_as_float(w.y << 16), v[3] = __uint_as_float(w.y & 0xFFFF0000u);
}

/* A lane's NC contiguous columns c0 .. c0 + NC - 1 of a bf16 or fp8 key p (KT), as the
 * kernel reads typed caches: 8-byte loads (records are 8-byte multiples), a main key's codes
 * within one block of 64 and so one scale byte a lane. e4m3 s.eeee.mmm goes to fp32 bits
 * s.0000eeee.mmm0..., the code times 2^-120 (subnormal codes to fp32 denormals, exactly), then
 * times 2^120 and the block's scale: kv_get's values, bit for bit. A NaN code (low 7 bits all
 * set) and a lane's columns across the codes' end or d take kv_get column by column. */
template <int NC, int KT, bool SM = false>
__device__ __forceinline__ void key_lane(const void *p, const kv_fmt &f, int c0, float *v) {
    const unsigned char *b = (const unsigned char *)p;
    if (c0 + NC <= f.d) {
        if (KT == TD_KV_BF16 || c0 >= f.n8) { // bf16 columns (fp8: the tail, 8-byte aligned)
            const unsigned char *q =
                KT == TD_KV_BF16 ? b + 2 * c0 : b + f.tail_at + 2 * (c0 - f.n8);
            if (((uintptr_t)q & 7) == 0) {
#pragma unroll
                for (int j = 0; j < NC / 4; j++)
                    bf16x4_vals(&v[4 * j], key_ld<uint2, SM>(q, j));
                return;
            }
        } else if (c0 + NC <= f.n8 && c0 / KV_FP8_BLOCK == (c0 + NC - 1) / KV_FP8_BLOCK) {
            const unsigned char *q = b + c0;
            float sc = kv_fp8_scale_val(key_ld<unsigned char, SM>(b, f.n8 + c0 / KV_FP8_BLOCK));
            unsigned nan = 0;
            uint2 w[NC / 8];
#pragma unroll
            for (int j = 0; j < NC / 8; j++) {
                w[j] = key_ld<uint2, SM>(q, j);
                nan |=
                    ((w[j].x & 0x7F7F7F7Fu) + 0x01010101u) | ((w[j].y & 0x7F7F7F7Fu) + 0x01010101u);
            }
            if (!(nan & 0x80808080u)) {
#pragma unroll
                for (int j = 0; j < NC; j++) {
                    unsigned c = ((j & 7) < 4 ? w[j / 8].x : w[j / 8].y) >> (8 * (j & 3));
                    float e = __uint_as_float(((c & 0x80u) << 24) | ((c & 0x7Fu) << 20));
                    v[j] = e * 0x1p120f * sc;
                }
                return;
            }
        }
    }
#pragma unroll
    for (int j = 0; j < NC; j++)
        v[j] = c0 + j < f.d ? key_at<KT, SM>(p, f, c0 + j) : 0.0f;
}

/* 16 columns c0 .. c0 + 15 of key p (NULL: zeros; columns past d: zeros) as floats */
template <int KT, bool SM = false>
__device__ __forceinline__ void key16_vals(float *v, const void *p, const kv_fmt &f, int c0) {
    if (!p) {
#pragma unroll
        for (int i = 0; i < 16; i++)
            v[i] = 0.0f;
    } else if constexpr (KT == TD_KV_F32) {
        const float *x = (const float *)p + c0;
        if (c0 + 16 <= f.d && ((uintptr_t)x & 15) == 0) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float4 y = key_ld<float4, SM>(x, i);
                v[4 * i] = y.x, v[4 * i + 1] = y.y, v[4 * i + 2] = y.z, v[4 * i + 3] = y.w;
            }
        } else {
#pragma unroll
            for (int i = 0; i < 16; i++)
                v[i] = c0 + i < f.d ? key_ld<float, SM>(x, i) : 0.0f;
        }
    } else {
        key_lane<16, KT, SM>(p, f, c0, v);
    }
}

/* 16 values as bf16 pairs, two 16-byte chunks of 8 columns each: hi = bf16(v), and with LO
 * lo = bf16(v - hi), so that hi + lo keeps about 16 bits of an fp32 key (bf16 and fp8 keys are
 * exact in hi alone) */
template <bool LO>
__device__ __forceinline__ void key16_pack(uint4 *hi2, uint4 *lo2, const float *v) {
    unsigned hi[8], lo[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float a = v[2 * i], b = v[2 * i + 1];
        float ha = __bfloat162float(__float2bfloat16_rn(a)),
              hb = __bfloat162float(__float2bfloat16_rn(b));
        hi[i] = pack_bf16(ha, hb);
        lo[i] = pack_bf16(a - ha, b - hb);
    }
    hi2[0] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    hi2[1] = make_uint4(hi[4], hi[5], hi[6], hi[7]);
    if constexpr (LO) {
        lo2[0] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
        lo2[1] = make_uint4(lo[4], lo[5], lo[6], lo[7]);
    }
}

/* columns c0 .. c0 + 15 of key p as bf16 terms (key16_pack) */
template <int KT, bool LO, bool SM = false>
__device__ __forceinline__ void key16_terms(uint4 *hi2, uint4 *lo2, const void *p, const kv_fmt &f,
                                            int c0) {
    float v[16];
    key16_vals<KT, SM>(v, p, f, c0);
    key16_pack<LO>(hi2, lo2, v);
}

/* N groups of 16 columns of key p, group i from column c0 + s i (c0 and s multiples of 16), as
 * key16_terms gives each. A plain record (fp32 16-byte aligned or bf16 8-byte aligned, every
 * column within d) has all N groups' loads issued before the first value is used: one trip to
 * L2 for the lot where group by group takes N (each group's bounds and alignment tests are
 * branches the compiler keeps loads behind). Other records (fp8, NULL, odd shapes) go group by
 * group. */
template <int KT, bool LO, int N, bool SM = false>
__device__ __forceinline__ void key16_terms_n(uint4 (*hi)[2], uint4 (*lo)[2], const void *p,
                                              const kv_fmt &f, int c0, int s) {
    bool plain =
        p && c0 + s * (N - 1) + 16 <= f.d &&
        (KT == TD_KV_F32 ? ((uintptr_t)p & 15) == 0 : KT == TD_KV_BF16 && ((uintptr_t)p & 7) == 0);
    if (plain) {
        float v[N][16];
#pragma unroll
        for (int i = 0; i < N; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                size_t at = (size_t)(c0 + s * i) / 4 + j; // 4 columns: a float4 or a uint2
                if constexpr (KT == TD_KV_F32) {
                    float4 y = key_ld<float4, SM>(p, at);
                    v[i][4 * j] = y.x, v[i][4 * j + 1] = y.y, v[i][4 * j + 2] = y.z,
                             v[i][4 * j + 3] = y.w;
                } else {
                    bf16x4_vals(&v[i][4 * j], key_ld<uint2, SM>(p, at));
                }
            }
#pragma unroll
        for (int i = 0; i < N; i++)
            key16_pack<LO>(hi[i], LO ? lo[i] : NULL, v[i]);
    } else {
#pragma unroll
        for (int i = 0; i < N; i++)
            key16_terms<KT, LO, SM>(hi[i], LO ? lo[i] : NULL, p, f, c0 + s * i);
    }
}

/* the same into dst + c0 (16-byte aligned), and with LO dst_lo + c0 */
template <int KT, bool LO>
__device__ __forceinline__ void key16_bf16(__nv_bfloat16 *dst, __nv_bfloat16 *dst_lo, const void *p,
                                           const kv_fmt &f, int c0) {
    uint4 hi[2], lo[2];
    key16_terms<KT, LO>(hi, lo, p, f, c0);
    ((uint4 *)(dst + c0))[0] = hi[0], ((uint4 *)(dst + c0))[1] = hi[1];
    if constexpr (LO) ((uint4 *)(dst_lo + c0))[0] = lo[0], ((uint4 *)(dst_lo + c0))[1] = lo[1];
}

#endif
