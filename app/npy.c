/* npy.c: minimal .npy writer/reader for 2-D float32 arrays. */
#include "npy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/err.h"

int npy_write_f32(const char *path, const float *data, int64_t rows, int64_t cols, char *err,
                  size_t errlen) {
    char dict[128];
    int n = snprintf(dict, sizeof dict,
                     "{'descr': '<f4', 'fortran_order': False, 'shape': (%lld, %lld), }",
                     (long long)rows, (long long)cols);
    // magic(6) + version(2) + len(2) + dict + padding spaces + '\n', total a multiple of 64
    int total = 10 + n + 1;
    int pad = (64 - total % 64) % 64;
    FILE *fp = fopen(path, "wb");
    if (!fp) return td_errf(err, errlen, "cannot write %s", path);
    unsigned char head[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 0, 0};
    unsigned hl = (unsigned)(n + pad + 1);
    head[8] = hl & 0xff;
    head[9] = hl >> 8;
    int ok = fwrite(head, 1, 10, fp) == 10 && fwrite(dict, 1, (size_t)n, fp) == (size_t)n;
    for (int i = 0; ok && i < pad; i++)
        ok = fputc(' ', fp) != EOF;
    ok = ok && fputc('\n', fp) != EOF;
    size_t cnt = (size_t)(rows * cols);
    ok = ok && fwrite(data, sizeof(float), cnt, fp) == cnt; // x86-64 and arm64 are little-endian
    ok = (fclose(fp) == 0) && ok;
    return ok ? 0 : td_errf(err, errlen, "error writing %s", path);
}

float *npy_read_f32(const char *path, int64_t *rows, int64_t *cols, char *err, size_t errlen) {
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        td_errf(err, errlen, "cannot open %s", path);
        return NULL;
    }
    unsigned char head[10];
    char dict[1024];
    float *out = NULL;
    if (fread(head, 1, 10, fp) != 10 || memcmp(head, "\x93NUMPY", 6) || head[6] != 1) {
        td_errf(err, errlen, "%s: not a version 1 .npy file", path);
        goto done;
    }
    size_t hl = head[8] | (size_t)head[9] << 8;
    if (hl >= sizeof dict || fread(dict, 1, hl, fp) != hl) {
        td_errf(err, errlen, "%s: bad header", path);
        goto done;
    }
    dict[hl] = 0;
    long long r = 0, c = 0;
    const char *sh = strstr(dict, "'shape': (");
    if (!strstr(dict, "'<f4'") || !strstr(dict, "'fortran_order': False") || !sh ||
        sscanf(sh, "'shape': (%lld, %lld)", &r, &c) != 2 || r < 0 || c < 0) {
        td_errf(err, errlen, "%s: expected a 2-D little-endian float32 C-order array", path);
        goto done;
    }
    out = malloc((size_t)(r * c + 1) * sizeof(float));
    if (!out || fread(out, sizeof(float), (size_t)(r * c), fp) != (size_t)(r * c)) {
        td_errf(err, errlen, "%s: truncated data", path);
        free(out);
        out = NULL;
        goto done;
    }
    *rows = r;
    *cols = c;
done:
    fclose(fp);
    return out;
}
