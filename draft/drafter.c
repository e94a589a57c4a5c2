/* drafter.c: drafter registry. */
#include "drafter.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct td_drafter *draft_ngram_init(int vocab);
struct td_drafter *draft_random_init(int vocab);

struct td_drafter *draft_init(const char *name, int vocab, char *err, size_t errlen) {
    struct td_drafter *d = NULL;
    if (!strcmp(name, "ngram"))
        d = draft_ngram_init(vocab);
    else if (!strcmp(name, "random"))
        d = draft_random_init(vocab);
    else {
        snprintf(err, errlen, "unknown drafter '%s' (known: none, ngram, random)", name);
        return NULL;
    }
    if (!d) snprintf(err, errlen, "out of memory creating drafter %s", name);
    return d;
}

void draft_free(struct td_drafter *d) {
    if (!d) return;
    free(d->impl);
    free(d);
}
