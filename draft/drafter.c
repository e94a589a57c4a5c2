/* drafter.c: the drafter registry (every name a front end or td_engine_params.draft may give,
 * with what it is), what "auto" picks, and the request drafters' constructor. */
#include "drafter.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/err.h"
#include "model/state.h"
#include "model/fileio.h"
#include "model/model.h"

struct td_drafter *draft_ngram_init(int vocab);
struct td_drafter *draft_random_init(int vocab);

/* The registry, one line a name, in the order help and messages list them: name, kind, draft
 * tokens a round when none are asked for, and the constructor of a request drafter. It is
 * expanded twice, into the table and into draft_names, which serve/config.c's static key table
 * points at (so the names must be a constant array). */
#define DRAFT_REGISTRY(X)                                                                          \
    X("auto", DRAFT_KIND_AUTO, 0, NULL)                                                            \
    X("none", DRAFT_KIND_NONE, 0, NULL)                                                            \
    X("ngram", DRAFT_KIND_REQUEST, 3, draft_ngram_init)                                            \
    X("random", DRAFT_KIND_REQUEST, 3, draft_random_init)                                          \
    X("mtp", DRAFT_KIND_MTP, 3, NULL)                                                              \
    X("dspark", DRAFT_KIND_DSPARK, 0, NULL) /* 0: its block size */

#define DRAFT_ENTRY(name, kind, tokens, init) {name, kind, tokens, init},
#define DRAFT_NAME(name, kind, tokens, init)  name,

static const struct draft_info registry[] = {DRAFT_REGISTRY(DRAFT_ENTRY)};

const char *const draft_names[] = {DRAFT_REGISTRY(DRAFT_NAME) NULL};

#define N_DRAFTERS (int)(sizeof registry / sizeof *registry)

void draft_names_join(char *out, size_t n, const char *sep, const char *last) {
    size_t len = 0;
    if (n) out[0] = 0;
    for (int i = 0; i < N_DRAFTERS && len < n; i++) {
        const char *s = !i ? "" : i == N_DRAFTERS - 1 ? last : sep;
        int w = snprintf(out + len, n - len, "%s%s", s, registry[i].name);
        len += w > 0 ? (size_t)w : 0;
    }
}

const struct draft_info *draft_lookup(const char *name, char *err, size_t errlen) {
    for (int i = 0; name && i < N_DRAFTERS; i++)
        if (!strcmp(name, registry[i].name)) return &registry[i];
    char known[128];
    draft_names_join(known, sizeof known, ", ", ", ");
    td_errf(err, errlen, "unknown drafter '%s' (known: %s)", name ? name : "(null)", known);
    return NULL;
}

/* DIR/config.json is readable (a path too long to join names no drafter) */
static int has_config(const char *dir) {
    char path[TD_PATH_MAX], e[256];
    return !td_path_join(path, sizeof path, dir, "config.json", e, sizeof e) &&
           access(path, R_OK) == 0;
}

const struct draft_info *draft_pick_auto(int on_device, const char *model_dir,
                                         const char *dspark_dir, int own) {
    // A drafter the model carries, when the steps run on a device: DSpark first (its own
    // stages, or a dspark/ folder beside it), then its MTP layer. On the CPU a drafter costs
    // more than it saves (tandem-tiny on 2 cores: DSpark 0.46-0.62x of none, MTP 0.56-0.94x), so
    // auto is none there.
    char dir[TD_PATH_MAX], e[256];
    const char *pick = "none";
    if (!on_device)
        pick = "none";
    else if (dspark_dir) // a folder named beats what the model carries
        pick = has_config(dspark_dir) ? "dspark" : "none";
    else if (own == TD_OWN_DSPARK ||
             (!td_path_join(dir, sizeof dir, model_dir, "dspark", e, sizeof e) && has_config(dir)))
        pick = "dspark";
    else if (own == TD_OWN_MTP)
        pick = "mtp";
    return draft_lookup(pick, NULL, 0);
}

struct td_drafter *draft_init(const char *name, int vocab, char *err, size_t errlen) {
    const struct draft_info *di = draft_lookup(name, err, errlen);
    if (!di) return NULL;
    if (di->kind != DRAFT_KIND_REQUEST) {
        td_errf(err, errlen, "draft_init: '%s' is not a request drafter (the engine handles it)",
                name);
        return NULL;
    }
    struct td_drafter *d = di->init(vocab);
    if (!d) td_errf(err, errlen, "out of memory creating drafter %s", name);
    return d;
}

void draft_free(struct td_drafter *d) {
    if (!d) return;
    free(d->impl);
    free(d);
}

struct td_drafter *draft_request_new(const struct td_drafter *proto, int vocab) {
    struct td_drafter *d = malloc(sizeof *d);
    if (d) {
        *d = *proto;
        d->vocab = vocab;
    }
    return d;
}

int draft_rows_behind(const struct td_state *st, int slot, int end) {
    int from = end - st->window;
    if (from < st->len[slot]) from = st->len[slot];
    return end > from ? end - from : 0;
}
