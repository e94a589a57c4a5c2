/* fileio.h: how the loaders name and open the files of a model directory.
 *
 *   char path[TD_PATH_MAX], err[512];
 *   if (td_path_join(path, sizeof path, dir, "config.json", err, sizeof err)) return -1;
 *   json_t *root = td_json_load(path, 0, err, sizeof err);   // NULL: err says why
 *   if (!root) return -1;
 *   json_int_t vocab = json_integer_value(json_object_get(root, "vocab_size"));
 *   json_decref(root);
 *
 * A joined path is never truncated (a cut name can be another file): a join that does not fit
 * is refused as too long. TD_PATH_MAX is the kernel's limit, so every path it can open fits.
 * Files are opened only when they are regular files: a FIFO named config.json would block a
 * plain open() until some writer came, and a device can be read forever. The check is made on
 * the open descriptor (open non-blocking, then fstat), so nothing can swap the file in between.
 * JSON files are refused past TD_JSON_MAX_BYTES before anything is read.
 */
#ifndef TD_FILEIO_H
#define TD_FILEIO_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TD_PATH_MAX       4096               /* Linux PATH_MAX: longer cannot be opened */
#define TD_JSON_MAX_BYTES ((size_t)64 << 20) /* configs are kilobytes, big tokenizers ~10 MB */

struct json_t; /* jansson's json_t */

/* out[cap] = dir "/" name. 0, or -1 with "path too long" and the lengths in err (out is then
 * an empty string). */
int td_path_join(char *out, size_t cap, const char *dir, const char *name, char *err,
                 size_t errlen);

/* Open path for reading (O_CLOEXEC) if it is a regular file of at most max_bytes (0: any
 * size), without blocking on a FIFO or device. The descriptor, its size in *size (may be NULL);
 * or -1 with one line naming the file: "cannot open P: <reason>", "P is not a regular file",
 * "P is N bytes, over the limit of M MiB". */
int td_file_open(const char *path, size_t max_bytes, size_t *size, char *err, size_t errlen);

/* The whole regular file at path (at most max_bytes) in a malloc'd buffer, NUL-terminated, its
 * length in *len (may be NULL); NULL with the message of td_file_open, or of the read. */
char *td_file_read(const char *path, size_t max_bytes, size_t *len, char *err, size_t errlen);

/* The JSON document in the regular file at path (at most TD_JSON_MAX_BYTES), parsed with
 * jansson's json_loadb flags (e.g. JSON_REJECT_DUPLICATES); the caller json_decref()s it. NULL
 * with one line: td_file_open's, or "malformed JSON in P: <why> (line L, column C)". */
struct json_t *td_json_load(const char *path, size_t flags, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
