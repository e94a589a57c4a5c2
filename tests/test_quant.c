/* test_quant.c: the released FP8/FP4 formats decoded as PyTorch decodes them (kernels/quant.h).
 *
 *   make build/tests/test_quant && build/tests/test_quant
 *
 * e4m3_every_byte / e8m0_every_byte   all 256 codes bit for bit against torch's float8_e4m3fn and
 *        float8_e8m0fnu (NaN where torch has NaN; e8m0 byte 0 is the denormal 2^-127)
 * e2m1_codes                          the 16 FP4 codes (released_formats.md 1.6)
 * fp8_block_dequant                   a [130, 200] weight with partial 128x128 blocks on both axes
 * fp4_packed_dequant                  a [6, 64] weight packed two codes a byte, low nibble first
 * e8m0_nan_found                      a scale byte 255 is found at its index
 * e4m3_encode                         every code back to itself; midpoints to the even code;
 *        saturation at 448; NaN
 * act_quant_rules                     the reference's per-128 activation quantization: power-of-two
 *        scales rounded up (amax 448 keeps scale 1, 449 takes 2), amax floored at 1e-4
 * (fixtures: tools/make_quant_fixtures.py, on the GPU box with torch)
 */
#include <stdint.h>

#include "check.h"
#include "kernels/quant.h"

#define QDIR "tests/fixtures/quant/"

/* the whole file into a malloc'd buffer of exactly `bytes`; NULL when its size differs */
static void *slurp(const char *name, size_t bytes) {
    char path[256];
    snprintf(path, sizeof path, QDIR "%s", name);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char *p = malloc(bytes + 1);
    size_t got = p ? fread(p, 1, bytes + 1, f) : 0;
    fclose(f);
    if (got != bytes) {
        free(p);
        return NULL;
    }
    return p;
}

/* the same bits, or both NaN */
static int same_bits(float a, float b) {
    return (isnan(a) && isnan(b)) || !memcmp(&a, &b, sizeof a);
}

static void every_byte(const char *name, const char *file, float (*decode)(uint8_t)) {
    case_begin();
    float *want = slurp(file, 256 * sizeof(float));
    CHECK(want, "no fixture %s", file);
    int bad = -1;
    for (int b = 0; want && b < 256 && bad < 0; b++)
        if (!same_bits(decode((uint8_t)b), want[b])) bad = b;
    CHECK(bad < 0, "byte 0x%02x: %.9g, torch %.9g", bad, bad >= 0 ? decode((uint8_t)bad) : 0.0,
          bad >= 0 && want ? want[bad] : 0.0);
    free(want);
    case_end(name, "(256 codes, bit for bit)");
}

static void test_e2m1(void) {
    case_begin();
    const float want[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    for (int c = 0; c < 16; c++)
        CHECK(same_bits(td_e2m1_to_f32((uint8_t)c), want[c]), "code %d: %g, want %g", c,
              td_e2m1_to_f32((uint8_t)c), want[c]);
    CHECK(td_e2m1_to_f32(0x35) == 3.0f, "only the low nibble counts");
    case_end("e2m1_codes", "");
}

static void dequant_case(const char *name, int fp4, int out, int in) {
    case_begin();
    size_t n = (size_t)out * in, qb = fp4 ? n / 2 : n;
    size_t sb = fp4 ? (size_t)out * (in / 32) : (size_t)((out + 127) / 128) * ((in + 127) / 128);
    uint8_t *q = slurp(fp4 ? "fp4_q.u8" : "fp8_q.u8", qb);
    uint8_t *s = slurp(fp4 ? "fp4_s.u8" : "fp8_s.u8", sb);
    float *want = slurp(fp4 ? "fp4_w.f32" : "fp8_w.f32", n * sizeof(float));
    float *got = malloc(n * sizeof(float));
    CHECK(q && s && want, "a fixture of %s is missing or has another size", name);
    long bad = -1;
    if (q && s && want) {
        if (fp4)
            dequant_fp4_ref(got, q, s, out, in);
        else
            dequant_fp8_ref(got, q, s, out, in);
        for (size_t i = 0; i < n && bad < 0; i++)
            if (!same_bits(got[i], want[i])) bad = (long)i;
    }
    CHECK(bad < 0, "[%ld, %ld]: %.9g, torch %.9g", bad / in, bad % in, bad >= 0 ? got[bad] : 0.0,
          bad >= 0 ? want[bad] : 0.0);
    char extra[64];
    snprintf(extra, sizeof extra, "([%d, %d], bit for bit)", out, in);
    free(q), free(s), free(want), free(got);
    case_end(name, extra);
}

static void test_nan_scale(void) {
    case_begin();
    uint8_t s[40];
    memset(s, 127, sizeof s);
    CHECK(td_e8m0_find_nan(s, sizeof s) == -1, "a clean scale reported NaN");
    s[33] = 255;
    CHECK(td_e8m0_find_nan(s, sizeof s) == 33, "the NaN byte at 33 reported at %ld",
          td_e8m0_find_nan(s, sizeof s));
    CHECK(isnan(td_e8m0_to_f32(255)), "byte 255 is not NaN");
    case_end("e8m0_nan_found", "");
}

static void test_e4m3_encode(void) {
    case_begin();
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7F) == 0x7F) continue; // NaN
        float v = td_e4m3_to_f32((uint8_t)c);
        CHECK(td_f32_to_e4m3(v) == c, "code 0x%02x (%g) encodes as 0x%02x", c, v,
              td_f32_to_e4m3(v));
    }
    // between codes 2 (2^-8) and 3 (1.5 2^-8): to 2; between 3 and 4: to 4; 1.0625 between 1
    // (0x38) and 1.125 (0x39): to 0x38; just above a midpoint: up
    CHECK(td_f32_to_e4m3(1.25f * 0x1p-8f) == 2 && td_f32_to_e4m3(1.75f * 0x1p-8f) == 4 &&
              td_f32_to_e4m3(1.0625f) == 0x38 && td_f32_to_e4m3(1.0626f) == 0x39,
          "midpoints: %d %d 0x%02x 0x%02x", td_f32_to_e4m3(1.25f * 0x1p-8f),
          td_f32_to_e4m3(1.75f * 0x1p-8f), td_f32_to_e4m3(1.0625f), td_f32_to_e4m3(1.0626f));
    CHECK(td_f32_to_e4m3(1000.0f) == 0x7E && td_f32_to_e4m3(-1e30f) == 0xFE &&
              td_f32_to_e4m3(NAN) == 0x7F && td_f32_to_e4m3(464.0f) == 0x7E,
          "saturation or NaN");
    case_end("e4m3_encode", "(every code, midpoints, saturation)");
}

static void test_act_quant(void) {
    case_begin();
    float x[4 * 128], q[4 * 128];
    for (int k = 0; k < 128; k++) {
        x[k] = k == 5 ? 448.0f : 0.5f * k;                 // amax 448: scale 1, codes as they are
        x[128 + k] = k == 9 ? -449.0f : 3.0f;              // amax 449: scale 2
        x[256 + k] = k == 0 ? 3e-5f : 0.0f;                // amax floored at 1e-4: scale 2^-22
        x[384 + k] = (float)k / 128.0f * (k % 2 ? 1 : -1); // amax 127/128: scale 2^-8
    }
    act_quant_ref(q, x, 1, 512);
    int bad = -1;
    for (int k = 0; k < 128 && bad < 0; k++)
        if (q[k] != td_e4m3_to_f32(td_f32_to_e4m3(x[k]))) bad = k;
    CHECK(bad < 0, "block 0 (scale 1): column %d %g -> %g", bad, bad < 0 ? 0.0 : x[bad],
          bad < 0 ? 0.0 : q[bad]);
    CHECK(q[128 + 9] == -448.0f && q[128] == 3.0f, "block 1 (scale 2): %g %g", q[128 + 9], q[128]);
    CHECK(q[256] == td_e4m3_to_f32(td_f32_to_e4m3(3e-5f * 0x1p22f)) * 0x1p-22f, "block 2: %g",
          q[256]);
    float s3 = 0x1p-8f, want = td_e4m3_to_f32(td_f32_to_e4m3(x[384 + 101] / s3)) * s3;
    CHECK(q[384 + 101] == want && q[384 + 101] != x[384 + 101], "block 3: %g -> %g, want %g",
          x[384 + 101], q[384 + 101], want);
    case_end("act_quant_rules", "");
}

int main(void) {
    every_byte("e4m3_every_byte", "e4m3.f32", td_e4m3_to_f32);
    every_byte("e8m0_every_byte", "e8m0.f32", td_e8m0_to_f32);
    test_e2m1();
    dequant_case("fp8_block_dequant", 0, 130, 200);
    dequant_case("fp4_packed_dequant", 1, 6, 64);
    test_nan_scale();
    test_e4m3_encode();
    test_act_quant();
    return check_failures ? 1 : 0;
}
