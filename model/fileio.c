/* fileio.c: checked path joins and regular-file reads for the loaders (fileio.h). */
#include "fileio.h"
#include "kernels/err.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int td_path_join(char *out, size_t cap, const char *dir, const char *name, char *err,
                 size_t errlen) {
    size_t a = strlen(dir), b = strlen(name);
    if (cap) out[0] = 0;
    if (a + 1 + b >= cap) // the 64 bytes of dir shown keep the message one short line
        return td_errf(err, errlen, "path too long: %.64s%s/%s is %zu bytes, the limit is %zu", dir,
                       a > 64 ? "..." : "", name, a + 1 + b, cap ? cap - 1 : 0);
    memcpy(out, dir, a);
    out[a] = '/';
    memcpy(out + a + 1, name, b + 1);
    return 0;
}

int td_file_open(const char *path, size_t max_bytes, size_t *size, char *err, size_t errlen) {
    // O_NONBLOCK: opening a FIFO for reading returns at once instead of waiting for a writer,
    // and fstat on what was opened then says what it is
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) return td_errf(err, errlen, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return td_errf(err, errlen, "cannot stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return td_errf(err, errlen, "%s is not a regular file", path);
    }
    if ((uint64_t)st.st_size > SIZE_MAX || (max_bytes && (uint64_t)st.st_size > max_bytes)) {
        close(fd);
        if (!max_bytes) return td_errf(err, errlen, "%s is too large to read", path);
        return td_errf(err, errlen, "%s is %lld bytes, over the limit of %zu MiB", path,
                       (long long)st.st_size, max_bytes >> 20);
    }
    int fl = fcntl(fd, F_GETFL); // reads block again (a regular file never waits, but be plain)
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    if (size) *size = (size_t)st.st_size;
    return fd;
}

char *td_file_read(const char *path, size_t max_bytes, size_t *len, char *err, size_t errlen) {
    size_t size = 0, got = 0;
    int fd = td_file_open(path, max_bytes, &size, err, errlen);
    if (fd < 0) return NULL;
    char *buf = malloc(size + 1);
    if (!buf) {
        close(fd);
        td_errf(err, errlen, "out of memory reading %s (%zu bytes)", path, size);
        return NULL;
    }
    // the size fstat gave, or less if the file shrank since: never more than the cap allowed
    while (got < size) {
        ssize_t k = read(fd, buf + got, size - got);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            int e = errno;
            close(fd);
            free(buf);
            td_errf(err, errlen, "cannot read %s: %s", path, strerror(e));
            return NULL;
        }
        if (k == 0) break;
        got += (size_t)k;
    }
    close(fd);
    buf[got] = 0;
    if (len) *len = got;
    return buf;
}

struct json_t *td_json_load(const char *path, size_t flags, char *err, size_t errlen) {
    size_t len = 0;
    char *text = td_file_read(path, TD_JSON_MAX_BYTES, &len, err, errlen);
    if (!text) return NULL;
    json_error_t jerr;
    json_t *root = json_loadb(text, len, flags, &jerr);
    free(text);
    if (!root)
        td_errf(err, errlen, "malformed JSON in %s: %s (line %d, column %d)", path, jerr.text,
                jerr.line, jerr.column);
    return root;
}
