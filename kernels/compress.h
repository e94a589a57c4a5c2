/* compress.h: one compressed KV entry from its window of raw rows (HCA and CSA, main and
 * indexer compressors). Per channel c: alpha = softmax over slots of gate[s][c] (biased by
 * position_bias already), entry[c] = sum_s alpha_s kv[s][c]. The caller applies the norm and
 * RoPE at the window's first position. */
#ifndef TD_KERNELS_COMPRESS_H
#define TD_KERNELS_COMPRESS_H

#ifdef __cplusplus
extern "C" {
#endif

/* out[d]; kv[s] and gate[s] point at d contiguous floats for each of the n_slots slots.
 * Slots that do not exist (CSA window 0's previous-window half) are simply not passed. */
void compress_pool_ref(float *out, const float *const *kv, const float *const *gate, int n_slots,
                       int d);

#ifdef __cplusplus
}
#endif
#endif
