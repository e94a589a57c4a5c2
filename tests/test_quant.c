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

int main(void) {
    every_byte("e4m3_every_byte", "e4m3.f32", td_e4m3_to_f32);
    every_byte("e8m0_every_byte", "e8m0.f32", td_e8m0_to_f32);
    test_e2m1();
    dequant_case("fp8_block_dequant", 0, 130, 200);
    dequant_case("fp4_packed_dequant", 1, 6, 64);
    test_nan_scale();
    return check_failures ? 1 : 0;
}
