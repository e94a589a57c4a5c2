/* fileio.c: checked path joins for the loaders (fileio.h). */
#include "fileio.h"
#include "err.h"

#include <string.h>

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
