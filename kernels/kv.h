/* kv.h: the precision of the key caches (the sliding-window keys, the compressed entries and
 * the indexer keys), and the one rule that encodes and decodes a cached row.
 *
 *   fp32  a row is d floats (the HF oracle's precision)
 *   bf16  a row is d bf16 values, each rounded to nearest even
 *   fp8   the reference's KV quantization (released_formats.md 2.3 and 2.6): the first n8 dims in
 *         e4m3 with one power-of-two scale per 64 of them, the trailing `tail` dims (the RoPE
 *         dims of a main key) in bf16. A row's record: n8 codes, ceil(n8 / 64) e8m0 scale bytes,
 *         the bf16 tail at the next even offset, the record rounded up to 8 bytes. For a block
 *         of 64: amax = max(|x|, 1e-4), s = 2^ceil(log2(amax / 448)) (by the bits of amax / 448),
 *         code = e4m3(clamp(x / s, +-448)), rounded to nearest even; the value is code * s.
 *         The Flash shapes: a main key (512 dims, 64 RoPE) 584 bytes against 2048 in fp32; an
 *         indexer key (128 dims, all in e4m3) 136 against 512.
 * A row's value is what kv_round leaves in fp32, and kv_get decodes exactly that value from the
 * record kv_put wrote: a key reads the same bits from this step's rows and from the cache. */
#ifndef TD_KERNELS_KV_H
#define TD_KERNELS_KV_H

#include <math.h>
#include <stdint.h>

#include "rows.h"

#ifdef __cplusplus
extern "C" {
#endif

enum td_kv_dtype { TD_KV_F32 = 0, TD_KV_BF16, TD_KV_FP8 };

#define KV_FP8_BLOCK 64
#define KV_FP8_MAX   448.0f

struct kv_fmt {
    int dtype;   /* enum td_kv_dtype */
    int d;       /* dims a row */
    int n8;      /* fp8: the leading dims in e4m3 (d - tail) */
    int tail_at; /* fp8: byte offset of the bf16 tail */
    int rec;     /* bytes a row */
};

TD_HD static inline struct kv_fmt kv_fmt_of(int dtype, int d, int tail) {
    struct kv_fmt f = {dtype, d, 0, 0, 4 * d};
    if (dtype == TD_KV_BF16) f.rec = 2 * d;
    if (dtype == TD_KV_FP8) {
        f.n8 = d - tail;
        f.tail_at = (f.n8 + (f.n8 + KV_FP8_BLOCK - 1) / KV_FP8_BLOCK + 1) & ~1;
        f.rec = (f.tail_at + 2 * tail + 7) & ~7;
    }
    return f;
}

/* an argument block's format, a zero one (never set) read as fp32 rows of d */
TD_HD static inline struct kv_fmt kv_fmt_or_f32(struct kv_fmt f, int d) {
    return f.rec ? f : kv_fmt_of(TD_KV_F32, d, 0);
}

union kv_bits {
    float f;
    uint32_t u;
};

TD_HD static inline float kv_from_bits(uint32_t u) {
    union kv_bits b;
    b.u = u;
    return b.f;
}

TD_HD static inline uint32_t kv_to_bits(float f) {
    union kv_bits b;
    b.f = f;
    return b.u;
}

/* fp32 -> bf16, nearest even (a NaN stays a NaN) */
TD_HD static inline uint16_t kv_bf16_of(float x) {
    uint32_t u = kv_to_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

TD_HD static inline float kv_bf16_val(uint16_t h) {
    return kv_from_bits((uint32_t)h << 16);
}

/* the e8m0 byte of a block's scale from its amax: the exponent of amax / 448, plus one when
 * that is not a power of two (ceil of log2) */
TD_HD static inline uint8_t kv_fp8_scale_of(float amax) {
    uint32_t u = kv_to_bits((amax > 1e-4f ? amax : 1e-4f) / KV_FP8_MAX);
    int e = (int)((u >> 23) & 255) + ((u & 0x7fffffu) != 0);
    return (uint8_t)(e > 254 ? 254 : e);
}

/* 2^(b - 127) for a scale byte of kv_fp8_scale_of (1 .. 254: normal floats) */
TD_HD static inline float kv_fp8_scale_val(uint8_t b) {
    return kv_from_bits((uint32_t)b << 23);
}

/* x (already divided by its scale) as e4m3fn, nearest even, saturated at +-448 */
TD_HD static inline uint8_t kv_e4m3_of(float x) {
    uint8_t sign = x < 0.0f ? 0x80 : 0;
    float a = x < 0.0f ? -x : x;
    if (!(a < KV_FP8_MAX)) return (uint8_t)(sign | (a == a ? 0x7e : 0x7f)); // 448, or NaN
    if (a < 0x1p-6f) {                   // subnormal: multiples of 2^-9
        float q = rintf(a * 512.0f);     // (exact: a power-of-two scaling)
        return (uint8_t)(sign | (int)q); // (q = 8 is 2^-6, code 0x08)
    }
    uint32_t u = kv_to_bits(a);
    int e = (int)((u >> 23) & 255) - 127;                  // -6 .. 8
    float m = kv_from_bits((u & 0x7fffffu) | 0x3f800000u); // [1, 2)
    int q = (int)rintf((m - 1.0f) * 8.0f);                 // (exact: 3 bits kept of 23)
    if (q == 8) e++, q = 0;
    int code = ((e + 7) << 3) | q;
    return (uint8_t)(sign | (code > 0x7e ? 0x7e : code));
}

TD_HD static inline float kv_e4m3_val(uint8_t q) {
    int e = (q >> 3) & 15, m = q & 7;
    if (e == 15 && m == 7) return kv_from_bits(0x7fc00000u); // 0x7f, 0xff: NaN
    float v = e ? kv_from_bits((uint32_t)(e + 120) << 23 | (uint32_t)m << 20) : (float)m * 0x1p-9f;
    return q & 0x80 ? -v : v;
}

/* column c of a cached row */
TD_HD static inline float kv_get(const void *row, struct kv_fmt f, int c) {
    const unsigned char *p = (const unsigned char *)row;
    if (f.dtype == TD_KV_F32) return ((const float *)row)[c];
    if (f.dtype == TD_KV_BF16) return kv_bf16_val(((const uint16_t *)row)[c]);
    if (c >= f.n8) return kv_bf16_val(((const uint16_t *)(p + f.tail_at))[c - f.n8]);
    return kv_e4m3_val(p[c]) * kv_fp8_scale_val(p[f.n8 + c / KV_FP8_BLOCK]);
}

/* the record of a row of d floats, and x rounded in place to the values it holds */
void kv_put_ref(void *row, float *x, struct kv_fmt f);

/* A step's rows into a cache: x[t] ([n_tok, d] fp32) is rounded in place to the cache's
 * precision (every row: what reads them reads the cache's values), every row's record goes to
 * step[t] when step is set, and the
 * record of each row with at[t] >= 0 is written at row kv_store_row of the cache (the
 * sliding-window ring at swa_write, the paged entries at emit); at NULL: rounded only. */
struct kv_store_args {
    void *cache;
    struct kv_fmt fmt;
    int cache_rows; /* a ring's rows a slot: row t goes to row slot(t) * cache_rows + at[t] */
    int per;        /* > 0: the cache is a paged history of blocks of `per` entries instead, and
                       row t goes to entry at[t] of its sequence (rows_entry) */
    float *x;
    const int32_t *at;
    void *step; /* [n_tok] every row's record too (what the attention reads this step), or NULL */
    struct rows_view rows; /* n_tok, row_seq, slot */
};
void kv_store_ref(const struct kv_store_args *a);

/* the cache row that step row t of sequence sq goes to */
TD_HD static inline long long kv_store_row(const struct kv_store_args *a, int t, int sq) {
    return a->per ? rows_entry(&a->rows, sq, a->at[t], a->per)
                  : (long long)a->rows.slot[sq] * a->cache_rows + a->at[t];
}

/* CUDA launcher (kernels/kv.cu), queued on the backend's stream; builds with nvcc only. */
void kv_store_cuda(const struct kv_store_args *a);

#ifdef __cplusplus
}
#endif
#endif
