/* split.c: which experts a rank runs (split.h) */
#include "model/split.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/err.h"

int td_split_init(struct td_split *s, const struct td_config *cfg, struct td_comm *comm, char *err,
                  size_t errlen) {
    memset(s, 0, sizeof *s);
    int W = comm->world, r = comm->rank, E = cfg->n_experts;
    if (W < 1 || r < 0 || r >= W)
        return td_errf(err, errlen, "split: rank %d of a world of %d", r, W);
    if (E < 1 || E % W)
        return td_errf(
            err, errlen,
            "split: %d ranks do not divide the model's %d routed experts (each rank runs "
            "the same number; use a world size that divides %d)",
            W, E, E);
    s->comm = comm;
    s->lo = r * (E / W);
    s->hi = s->lo + E / W;
    s->per_layer = E + 1;
    if (!(s->own = calloc((size_t)cfg->n_layers * (size_t)s->per_layer, 1)))
        return td_errf(err, errlen, "split: out of memory");
    for (int li = 0; li < cfg->n_layers; li++) {
        unsigned char *o = s->own + (size_t)li * s->per_layer;
        for (int e = s->lo; e < s->hi; e++)
            o[e] = 1;
        o[E] = li % W == r; // the shared expert, as one more pick
    }
    return 0;
}

void td_split_free(struct td_split *s) {
    free(s->own);
    memset(s, 0, sizeof *s);
}
