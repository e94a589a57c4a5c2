/* fileio.h: how the loaders name and open the files of a model directory.
 *
 *   char path[TD_PATH_MAX], err[512];
 *   if (td_path_join(path, sizeof path, dir, "config.json", err, sizeof err)) { puts(err); ... }
 *
 * A joined path is never truncated (a cut name can be another file): a join that does not fit
 * is refused as too long. TD_PATH_MAX is the kernel's limit, so every path it can open fits.
 */
#ifndef TD_FILEIO_H
#define TD_FILEIO_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TD_PATH_MAX 4096 /* Linux PATH_MAX: a longer path cannot be opened anyway */

/* out[cap] = dir "/" name. 0, or -1 with "path too long" and the lengths in err (out is then
 * an empty string). */
int td_path_join(char *out, size_t cap, const char *dir, const char *name, char *err,
                 size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
