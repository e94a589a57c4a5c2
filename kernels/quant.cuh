/* quant.cuh: the block-quantized weights (quant.h: Q8, Q4) as the CUDA GEMMs read them, and
 * BF16 alike: a matrix is a wmat, and a warp's lane loads 8 consecutive weights of a row as raw
 * bits (wraw: all of a step's loads in flight before the first is used), then turns them into
 * 8 exact bf16 values in registers (wraw_row, as four pairs in the order wpair_a / wpair_b say).
 *
 * The decode is bit placement and two exact multiplications by powers of two:
 *   e4m3 s.eeee.mmm -> bf16 bits s.0000eeee.mmm0000, which is the code's value times 2^-120
 *   (subnormal codes land on bf16 subnormals, exactly); then x 2^120 x 2^(scale - 127).
 *   e2m1 s.ee.m -> bf16 bits s.0000000ee.m000000, the code's value times 2^-126; then
 *   x 2^126 x 2^(scale - 127).
 * bf16 multiplication keeps subnormals, so every step is exact (quant.h says for which scales). */
#ifndef TD_KERNELS_QUANT_CUH
#define TD_KERNELS_QUANT_CUH

#include "cuda_common.cuh"
#include "quant.h"

enum { WF_BF16 = 0, WF_Q8 = 1, WF_Q4 = 2 };

/* the format of a weight dtype (BF16, Q8, Q4); -1 for the rest */
static inline int wf_of(enum td_dtype t) {
    return t == TD_DTYPE_BF16 ? WF_BF16 : t == TD_DTYPE_Q8 ? WF_Q8 : t == TD_DTYPE_Q4 ? WF_Q4 : -1;
}

/* one matrix of a tensor [rows, in]: its rows row0 .. of the tensor at p */
struct wmat {
    const void *p;    /* the tensor's row 0 (codes for Q8 / Q4) */
    const uint8_t *s; /* Q8 / Q4: the tensor's scales, else NULL */
    int row0;         /* this matrix's first row in the tensor (a group, a pair's second tile) */
    int srow;         /* scale bytes a row of scales: Q8 ceil(in / 128), Q4 in / 32 */
};

/* the wmat of rows row0 .. of tensor p [rows, in] of dtype t (host or device code) */
__host__ __device__ __forceinline__ struct wmat wmat_of(const void *p, enum td_dtype t,
                                                        long long rows, int in, int row0) {
    struct wmat w;
    w.p = p, w.row0 = row0, w.s = NULL, w.srow = 0;
    if (t == TD_DTYPE_Q8 || t == TD_DTYPE_Q4) {
        w.s = (const uint8_t *)p + td_quant_code_bytes(t, rows, in);
        w.srow = t == TD_DTYPE_Q8 ? (in + 127) / 128 : in / 32;
    }
    return w;
}

/* the raw bits of 8 weights of two rows (g and g + 8 of a tile) */
template <int F> struct wraw;
template <> struct wraw<WF_BF16> { uint4 a, b; };
template <> struct wraw<WF_Q8> {
    uint2 a, b;
    unsigned sa, sb; // their scale bytes
};
template <> struct wraw<WF_Q4> {
    unsigned a, b;
    unsigned sa, sb;
};

// 8 bf16 weights of row o from k (zeros past in or past out), as four bf16 pairs
template <bool VEC>
__device__ __forceinline__ uint4 bf16_w8(const __nv_bfloat16 *w, int o, int out, int in, int k) {
    if (o >= out) return make_uint4(0, 0, 0, 0);
    const __nv_bfloat16 *r = w + (size_t)o * in + k;
    if (VEC && k + 8 <= in) return *(const uint4 *)r;
    unsigned short h[8];
    for (int j = 0; j < 8; j++)
        h[j] = k + j < in ? *(const unsigned short *)(r + j) : 0;
    return make_uint4(h[0] | (unsigned)h[1] << 16, h[2] | (unsigned)h[3] << 16,
                      h[4] | (unsigned)h[5] << 16, h[6] | (unsigned)h[7] << 16);
}

// 8 e4m3 codes of tensor row r from k (zeros past in), and the byte of their scale
template <bool VEC>
__device__ __forceinline__ uint2 q8_w8(const wmat &w, int r, int in, int k, unsigned *s) {
    const uint8_t *p = (const uint8_t *)w.p + (size_t)r * in + k;
    *s = w.s[(size_t)(r / 128) * w.srow + k / 128];
    if (VEC && k + 8 <= in) return *(const uint2 *)p;
    unsigned v[2] = {0, 0};
    for (int j = 0; j < 8; j++)
        if (k + j < in) v[j / 4] |= (unsigned)p[j] << (8 * (j % 4));
    return make_uint2(v[0], v[1]);
}

// 8 e2m1 codes (4 bytes) of tensor row r from k (a multiple of 8; in is one of 32), and their scale
__device__ __forceinline__ unsigned q4_w8(const wmat &w, int r, int in, int k, unsigned *s) {
    *s = w.s[(size_t)r * w.srow + k / 32];
    return *(const unsigned *)((const uint8_t *)w.p + ((size_t)r * in + k) / 2);
}

/* the raw bits of rows o and o + 8 of w (local rows; zeros past out), k .. k + 7 */
template <int F, bool VEC>
__device__ __forceinline__ void wraw_load(wraw<F> &v, const wmat &w, int o, int out, int in,
                                          int k) {
    if constexpr (F == WF_BF16) {
        const __nv_bfloat16 *p = (const __nv_bfloat16 *)w.p + (size_t)w.row0 * in;
        v.a = bf16_w8<VEC>(p, o, out, in, k);
        v.b = bf16_w8<VEC>(p, o + 8, out, in, k);
    } else if constexpr (F == WF_Q8) {
        v.a = make_uint2(0, 0), v.b = make_uint2(0, 0), v.sa = v.sb = 127;
        if (o < out) v.a = q8_w8<VEC>(w, w.row0 + o, in, k, &v.sa);
        if (o + 8 < out) v.b = q8_w8<VEC>(w, w.row0 + o + 8, in, k, &v.sb);
    } else {
        v.a = v.b = 0, v.sa = v.sb = 127;
        if (o < out && k < in) v.a = q4_w8(w, w.row0 + o, in, k, &v.sa);
        if (o + 8 < out && k < in) v.b = q4_w8(w, w.row0 + o + 8, in, k, &v.sb);
    }
}

__device__ __forceinline__ unsigned bf16x2_mul(unsigned a, unsigned b) {
    __nv_bfloat162 r = __hmul2(*(__nv_bfloat162 *)&a, *(__nv_bfloat162 *)&b);
    return *(unsigned *)&r;
}

// bf16 bits of 2^(s - 127) in both halves (s = 0: the subnormal 2^-127)
__device__ __forceinline__ unsigned e8m0_bf16x2(unsigned s) {
    unsigned h = s ? s << 7 : 0x0040u;
    return h | h << 16;
}

/* The mma paths decode 8 weights into four bf16 pairs in the order their bits give cheaply
 * (wpair_a / wpair_b: the two elements of pair i), and pair x the same way (mma_tile.cuh):
 * the reduction over k is a sum, so weights and x need only agree. BF16 keeps its pairs
 * (0,1) (2,3) (4,5) (6,7); Q8 decodes bytes p and p + 2 of a word with one shift for both,
 * (0,2) (1,3) (4,6) (5,7); Q4 nibbles p and p + 4, (0,4) (1,5) (2,6) (3,7). A pair is then
 * multiplied by 2^(bias gap) and by 2^(scale - 127), each exact. */
template <int F> __host__ __device__ constexpr int wpair_a(int i) {
    return F == WF_Q4 ? i : F == WF_Q8 ? (i >> 1) * 4 + (i & 1) : 2 * i;
}
template <int F> __host__ __device__ constexpr int wpair_b(int i) {
    return F == WF_Q4 ? i + 4 : F == WF_Q8 ? (i >> 1) * 4 + (i & 1) + 2 : 2 * i + 1;
}

/* r[0..3] (bf16 pairs of codes times 2^-GAP) times 2^GAP, then times 2^(s - 127). ONE: the
 * caller knows s < 128 (every lane's: quant_one), so 2^(GAP + s - 127) is one normal bf16 and
 * one multiplication by it gives the same exact value (both round the code times 2^(s - 127)
 * once, where it is not representable) */
template <int GAP, bool ONE = false>
__device__ __forceinline__ uint4 pairs_scaled(unsigned *r, unsigned s) {
    if constexpr (ONE) {
        const unsigned m = ((s + GAP) << 7) * 0x10001u;
#pragma unroll
        for (int j = 0; j < 4; j++)
            r[j] = bf16x2_mul(r[j], m);
    } else {
        const unsigned c = ((127 + GAP) << 7) * 0x10001u, m = e8m0_bf16x2(s);
#pragma unroll
        for (int j = 0; j < 4; j++)
            r[j] = bf16x2_mul(bf16x2_mul(r[j], c), m);
    }
    return make_uint4(r[0], r[1], r[2], r[3]);
}

/* true when every lane's scale bytes (or-ed into o) are below 128: the decode then takes
 * one multiplication a pair (pairs_scaled ONE). Real checkpoints' scales are below 2^0 (bytes
 * below 127); a larger one takes the two multiplications, the same values. Every lane of the
 * warp calls it. */
__device__ __forceinline__ bool quant_one(unsigned o) {
    return __all_sync(0xffffffffu, o < 128u);
}

/* 8 e4m3 codes as exact bf16 values times 2^(s - 127), pairs (0,2) (1,3) (4,6) (5,7):
 * s.eeee.mmm -> bf16 bits s.0000eeee.mmm0000, the code times 2^-120 */
template <bool ONE = false> __device__ __forceinline__ uint4 q8_pairs(uint2 q, unsigned s) {
    unsigned r[4] = {((q.x << 4) & 0x07F007F0u) | ((q.x << 8) & 0x80008000u),
                     ((q.x >> 4) & 0x07F007F0u) | (q.x & 0x80008000u),
                     ((q.y << 4) & 0x07F007F0u) | ((q.y << 8) & 0x80008000u),
                     ((q.y >> 4) & 0x07F007F0u) | (q.y & 0x80008000u)};
    return pairs_scaled<120, ONE>(r, s);
}

/* 8 e2m1 codes (element e in bits 4e .. 4e + 3 of q) as exact bf16 values times 2^(s - 127),
 * pairs (0,4) (1,5) (2,6) (3,7): s.ee.m -> bf16 bits s.0000000ee.m000000, the code times 2^-126 */
template <bool ONE = false> __device__ __forceinline__ uint4 q4_pairs(unsigned q, unsigned s) {
    unsigned r[4] = {((q << 6) & 0x01C001C0u) | ((q << 12) & 0x80008000u),
                     ((q << 2) & 0x01C001C0u) | ((q << 8) & 0x80008000u),
                     ((q >> 2) & 0x01C001C0u) | ((q << 4) & 0x80008000u),
                     ((q >> 6) & 0x01C001C0u) | (q & 0x80008000u)};
    return pairs_scaled<126, ONE>(r, s);
}

/* the 8 weights of one row of a raw load (its a or b bits and scale) as pairs in F's order */
template <int F, bool ONE = false, typename B>
__device__ __forceinline__ uint4 wraw_row(const B &bits, unsigned s) {
    if constexpr (F == WF_BF16)
        return bits;
    else if constexpr (F == WF_Q8)
        return q8_pairs<ONE>(bits, s);
    else
        return q4_pairs<ONE>(bits, s);
}
template <int F, bool ONE = false> __device__ __forceinline__ uint4 wraw_a(const wraw<F> &v) {
    if constexpr (F == WF_BF16)
        return v.a;
    else
        return wraw_row<F, ONE>(v.a, v.sa);
}
template <int F, bool ONE = false> __device__ __forceinline__ uint4 wraw_b(const wraw<F> &v) {
    if constexpr (F == WF_BF16)
        return v.b;
    else
        return wraw_row<F, ONE>(v.b, v.sb);
}

/* the or of a raw load's scale bytes (0 for bf16) */
template <int F> __device__ __forceinline__ unsigned wraw_sor(const wraw<F> &v) {
    if constexpr (F == WF_BF16)
        return 0;
    else
        return v.sa | v.sb;
}

/* pairs in F's order as the 8 weights in order (bf16 pairs (0,1) .. (6,7)) */
template <int F> __device__ __forceinline__ uint4 pairs_in_order(uint4 p) {
    if constexpr (F == WF_Q8)
        return make_uint4(__byte_perm(p.x, p.y, 0x5410), __byte_perm(p.x, p.y, 0x7632),
                          __byte_perm(p.z, p.w, 0x5410), __byte_perm(p.z, p.w, 0x7632));
    else if constexpr (F == WF_Q4)
        return make_uint4(__byte_perm(p.x, p.y, 0x5410), __byte_perm(p.z, p.w, 0x5410),
                          __byte_perm(p.x, p.y, 0x7632), __byte_perm(p.z, p.w, 0x7632));
    else
        return p;
}

/* The quantized tiles' loads: 16 bytes of a row a lane (as many bytes in flight as a bf16
 * load of 8 weights, which Q8 and Q4 need to stream at the bandwidth bf16 does): 16 e4m3 codes
 * (QR = 2 groups of 8 weights) or 32 e2m1 codes (QR = 4), within one scale block either way */
template <int F> struct qr { static constexpr int R = F == WF_Q8 ? 2 : 4; };

struct qraw {
    uint4 a, b;      // rows g and g + 8
    unsigned sa, sb; // their scale bytes
};

// 16 bytes of codes of tensor row r from k (8 * QR weights; zeros past in), and their scale
template <int F, bool VEC>
__device__ __forceinline__ uint4 q16_load(const wmat &w, int r, int in, int k, unsigned *s) {
    constexpr int R = qr<F>::R;
    const uint8_t *p;
    if constexpr (F == WF_Q8) {
        *s = w.s[(size_t)(r / 128) * w.srow + k / 128];
        p = (const uint8_t *)w.p + (size_t)r * in + k;
    } else {
        *s = w.s[(size_t)r * w.srow + k / 32];
        p = (const uint8_t *)w.p + ((size_t)r * in + k) / 2;
    }
    if (VEC && k + 8 * R <= in) return *(const uint4 *)p;
    unsigned v[4] = {0, 0, 0, 0};
    int bytes = F == WF_Q8 ? in - k : (in - k) / 2; // (in and k are multiples of 32 for Q4)
    for (int j = 0; j < 16 && j < bytes; j++)
        v[j / 4] |= (unsigned)p[j] << (8 * (j % 4));
    return make_uint4(v[0], v[1], v[2], v[3]);
}

/* rows o and o + 8 of w (local rows; zeros past out) from k */
template <int F, bool VEC>
__device__ __forceinline__ void qraw_load(qraw &v, const wmat &w, int o, int out, int in, int k) {
    v.a = v.b = make_uint4(0, 0, 0, 0), v.sa = v.sb = 127;
    if (o < out && k < in) v.a = q16_load<F, VEC>(w, w.row0 + o, in, k, &v.sa);
    if (o + 8 < out && k < in) v.b = q16_load<F, VEC>(w, w.row0 + o + 8, in, k, &v.sb);
}

__device__ __forceinline__ unsigned u4_word(uint4 v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/* group j (of QR) of a 16-byte load as 8 bf16 weights, pairs in F's order */
template <int F> __device__ __forceinline__ uint4 q16_pairs(uint4 v, int j, unsigned s) {
    if constexpr (F == WF_Q8)
        return q8_pairs(make_uint2(u4_word(v, 2 * j), u4_word(v, 2 * j + 1)), s);
    else
        return q4_pairs(u4_word(v, j), s);
}

/* weight (o, k) of tensor p [rows, in] of dtype t as fp32, any dtype the GEMMs take (the
 * fp32 paths: batch-invariant mode, small tensors) */
__device__ __forceinline__ float ldw_f32(const void *p, int t, long long rows, int in, int o,
                                         int k) {
    if (t == TD_DTYPE_Q8 || t == TD_DTYPE_Q4) {
        struct wmat w = wmat_of(p, (enum td_dtype)t, rows, in, 0);
        const uint8_t *q = (const uint8_t *)p;
        if (t == TD_DTYPE_Q8) {
            uint8_t c = q[(size_t)o * in + k];
            unsigned s = w.s[(size_t)(o / 128) * w.srow + k / 128];
            unsigned v = bf16x2_mul(bf16x2_mul(((c & 0x7Fu) << 4) | ((c & 0x80u) << 8), 0x7B80u),
                                    e8m0_bf16x2(s));
            return __uint_as_float(v << 16);
        }
        uint8_t b = q[((size_t)o * in + k) / 2], n = k % 2 ? b >> 4 : b & 15;
        unsigned s = w.s[(size_t)o * w.srow + k / 32];
        unsigned v =
            bf16x2_mul(bf16x2_mul(((n & 0x7u) << 6) | ((n & 0x8u) << 12), 0x7E80u), e8m0_bf16x2(s));
        return __uint_as_float(v << 16);
    }
    return ld_f32(p, t, (long long)o * in + k);
}

#endif
