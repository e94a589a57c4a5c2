/* split.c: which experts a rank runs, and the ranks' manifests (split.h) */
#include "model/split.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "kernels/err.h"

unsigned long long td_split_fingerprint(const struct td_model *m) {
    XXH3_state_t *h = XXH3_createState();
    if (!h) return 0;
    XXH3_64bits_reset(h);
    const struct td_config *c = &m->cfg;
    int32_t dims[] = {c->dim,   c->n_layers, c->n_experts, c->n_experts_tok, c->moe_inter,
                      c->vocab, c->hc_mult,  c->n_heads,   c->head_dim};
    XXH3_64bits_update(h, dims, sizeof dims);
    XXH3_64bits_update(h, &m->dummy_seed, sizeof m->dummy_seed);
    for (int i = 0; i < m->st.n_entries; i++) { // sorted by name: the same order on every rank
        const struct st_entry *e = &m->st.entries[i];
        int32_t dt = (int32_t)e->t.dtype, nd = e->t.ndim;
        XXH3_64bits_update(h, e->name, strlen(e->name) + 1);
        XXH3_64bits_update(h, &dt, sizeof dt);
        XXH3_64bits_update(h, &nd, sizeof nd);
        XXH3_64bits_update(h, e->t.shape, (size_t)nd * sizeof e->t.shape[0]);
        size_t n = e->nbytes < 64 ? e->nbytes : 64;
        if (n) { // its first and last bytes (every byte of 150 GB would take minutes)
            XXH3_64bits_update(h, e->t.data, n);
            XXH3_64bits_update(h, (const char *)e->t.data + e->nbytes - n, n);
        }
    }
    unsigned long long v = XXH3_64bits_digest(h);
    XXH3_freeState(h);
    return v;
}

/* what every rank must agree on (but its rank and experts) */
struct manifest {
    char build[32];
    char gpu[32]; /* the device's PCI bus id ("" without one) */
    int32_t world, rank, lo, hi, n_layers, n_experts;
    int32_t cc, nccl; /* compute capability, NCCL's version (0: none) */
    uint64_t model;
};

static int check_manifests(const struct manifest *all, int W, char *err, size_t errlen) {
    const struct manifest *a = &all[0];
    for (int r = 0; r < W; r++) {
        const struct manifest *b = &all[r];
        if (b->rank != r || b->world != W)
            return td_errf(err, errlen, "split: slot %d of the gather holds rank %d of %d ranks", r,
                           b->rank, b->world);
        if (strncmp(a->build, b->build, sizeof a->build))
            return td_errf(err, errlen,
                           "split: rank %d runs another build (%.32s) than rank 0 (%.32s)", r,
                           b->build, a->build);
        if (b->n_layers != a->n_layers || b->n_experts != a->n_experts || b->model != a->model)
            return td_errf(
                err, errlen,
                "split: rank %d loaded another model than rank 0 (%d layers, %d experts, "
                "weights %016llx against %d, %d, %016llx): every rank must load the "
                "same checkpoint",
                r, b->n_layers, b->n_experts, (unsigned long long)b->model, a->n_layers,
                a->n_experts, (unsigned long long)a->model);
        if (b->n_experts < 1 || b->n_experts % W)
            return td_errf(err, errlen,
                           "split: %d ranks do not divide the model's %d routed experts (each rank "
                           "runs the same number; use a world size that divides %d)",
                           W, b->n_experts, b->n_experts);
        if (b->lo != (r ? all[r - 1].hi : 0) || (r == W - 1 && b->hi != b->n_experts))
            return td_errf(err, errlen, "split: rank %d runs experts [%d, %d), not the next part",
                           r, b->lo, b->hi);
        if (b->cc != a->cc)
            return td_errf(err, errlen,
                           "split: rank %d's GPU is compute capability %d.%d, rank 0's %d.%d: "
                           "every rank needs the same kind of GPU",
                           r, b->cc / 10, b->cc % 10, a->cc / 10, a->cc % 10);
        if (!a->nccl) continue;
        if (b->nccl != a->nccl)
            return td_errf(err, errlen, "split: rank %d runs NCCL %d, rank 0 NCCL %d", r, b->nccl,
                           a->nccl);
        for (int q = 0; q < r; q++) // (NCCL runs one rank a GPU)
            if (!strncmp(all[q].gpu, b->gpu, sizeof b->gpu))
                return td_errf(err, errlen,
                               "split: ranks %d and %d are on one GPU (%.32s): with NCCL every "
                               "rank needs its own",
                               q, r, b->gpu);
    }
    return 0;
}

/* s's experts and mask for cfg's layers on its communicator's rank */
static int own_init(struct td_split *s, const struct td_config *cfg, char *err, size_t errlen) {
    int W = s->comm->world, r = s->comm->rank, E = cfg->n_experts;
    s->lo = r * (E / W);
    s->hi = (r + 1) * (E / W);
    s->per_layer = E + 1;
    s->n_layers = cfg->n_layers;
    if (!(s->own = calloc((size_t)cfg->n_layers * (size_t)s->per_layer, 1)))
        return td_errf(err, errlen, "split: out of memory");
    for (int li = 0; li < cfg->n_layers; li++) {
        unsigned char *o = s->own + (size_t)li * s->per_layer;
        for (int e = s->lo; e < s->hi; e++)
            o[e] = 1;
        o[E] = li % W == r; // the shared expert, as one more pick
    }
    s->own_run = s->own;
    return 0;
}

int td_split_init(struct td_split *s, const struct td_model *m, struct td_comm *comm,
                  struct td_comm *data, const struct td_backend *b, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    const struct td_config *cfg = &m->cfg;
    int W = comm->world, r = comm->rank, E = cfg->n_experts;
    if (W < 1 || r < 0 || r >= W)
        return td_errf(err, errlen, "split: rank %d of a world of %d", r, W);
    struct manifest me = {.world = W,
                          .rank = r,
                          .lo = r * (E / W),
                          .hi = (r + 1) * (E / W),
                          .n_layers = cfg->n_layers,
                          .n_experts = E,
                          .model = td_split_fingerprint(m)};
    strncpy(me.build, __DATE__ " " __TIME__, sizeof me.build - 1);
    if (b && b->identify) me.cc = b->identify(me.gpu, sizeof me.gpu);
    me.nccl = data ? td_comm_nccl_version() : 0;
    struct manifest *all = calloc((size_t)W, sizeof *all);
    if (!all) return td_errf(err, errlen, "split: out of memory");
    int rc = comm->ops->all_gather(comm, &me, all, sizeof me);
    if (rc)
        comm->ops->poll_error(comm, err, errlen);
    else
        rc = check_manifests(all, W, err, errlen);
    free(all);
    if (rc) return -1;
    s->comm = comm;
    s->data = data;
    return own_init(s, cfg, err, errlen);
}

int td_split_serve(struct td_split *s, const struct td_split *target, const struct td_model *m,
                   char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    int W = target->comm->world, E = m->cfg.n_experts;
    if (E < 1 || E % W)
        return td_errf(err, errlen,
                       "split: %d ranks do not divide the drafter's %d routed experts (each rank "
                       "runs the same number)",
                       W, E);
    s->comm = target->comm;
    s->data = target->data;
    s->leads = s->serves = 1;
    return own_init(s, &m->cfg, err, errlen);
}

int td_split_place(struct td_split *s, const struct td_backend *b, char *err, size_t errlen) {
    if (!b->on_device || s->placed) return 0;
    size_t bytes = (size_t)s->n_layers * (size_t)s->per_layer;
    void *d = b->alloc(bytes);
    if (!d) return td_errf(err, errlen, "split: out of %s memory for the experts' mask", b->name);
    b->to_device(d, s->own, bytes);
    s->own_run = d, s->placed = b;
    return 0;
}

void td_split_free(struct td_split *s) {
    if (s->placed) s->placed->release((void *)s->own_run);
    free(s->own);
    memset(s, 0, sizeof *s);
}
