/* npy.h: NumPy .npy files of little-endian float32 in C order (version 1.0 headers). */
#ifndef TD_NPY_H
#define TD_NPY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Write data[rows, cols]. 0, or -1 with a message. */
int npy_write_f32(const char *path, const float *data, int64_t rows, int64_t cols, char *err,
                  size_t errlen);

/* Read a 2-D '<f4' C-order array; returns a malloc'd buffer (caller frees) or NULL + message. */
float *npy_read_f32(const char *path, int64_t *rows, int64_t *cols, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
