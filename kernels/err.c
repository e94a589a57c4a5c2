/* err.c: the message formatter every loader shares, and the one fatal path. */
#include "err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

int td_errf(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

void td_abort(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "tandem: fatal at %s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stderr);
    abort();
}

void *td_xmalloc_at(size_t bytes, const char *file, int line) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) td_abort(file, line, "out of memory for %zu bytes", bytes);
    return p;
}

void *td_xcalloc_at(size_t n, size_t size, const char *file, int line) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) td_abort(file, line, "out of memory for %zu x %zu bytes", n, size);
    return p;
}
