/* split.h: a model split over ranks, experts first (parallel.md section 5.1 P1). Every rank
 * holds every non-expert weight and runs the whole step on the same rows; rank r runs the routed
 * experts [r E / W, (r + 1) E / W) of every MoE layer, and a layer's shared expert, where it
 * runs as one more pick (model.h ex_shared), on rank layer mod W. A layer's experts write their
 * outputs into the picks' slots, zeros elsewhere, one all-reduce sums the ranks' slots (each
 * element has one nonzero addend, so any order gives the same bits) and each rank then sums a
 * row's slots in ascending expert order, as the one-rank path does: the logits are the same
 * bits at every world size (moe.h moe_experts_slots_ref, moe_combine_slots_ref).
 *
 *   struct td_split sp; // this rank's experts (comm: its rank and the world)
 *   if (td_split_init(&sp, &model, &comm, NULL, NULL, err, sizeof err)) return -1;
 *   struct td_model rank_model = model; // this rank's view: the weights shared, its experts
 *   rank_model.split = &sp;             // the same plans on every rank:
 *   int rc = td_forward_seqs(&rank_model, &st, &seq, 1, logits, NULL, err, sizeof err);
 *   td_split_free(&sp);
 */
#ifndef TD_SPLIT_H
#define TD_SPLIT_H

#include <stddef.h>

#include "model/backend.h"
#include "model/comm.h"
#include "model/model.h"

#ifdef __cplusplus
extern "C" {
#endif

struct td_split {
    struct td_comm *comm; /* the ranks' host communicator: plans, manifests, checks */
    struct td_comm *data; /* NULL: the experts' slots are summed over comm, through the host;
                             else a device communicator (comm.h td_comm_nccl, one GPU a rank)
                             sums them in the backend's queue, and steps replay graphs */
    int lo, hi;           /* the routed experts this rank runs */
    int per_layer;        /* own's row: n_experts + 1 (the shared expert's index n_experts) */
    int n_layers;         /* own's rows */
    unsigned char *own;   /* [n_layers][per_layer] 1: this rank runs the expert of the layer */
    const unsigned char *own_run;    /* own where the forward's backend reads it: own itself, or
                                        td_split_place's copy on a device */
    const struct td_backend *placed; /* the backend holding own_run, when not own */
    int check;  /* 1: after every step the ranks compare a hash of its last residual
                   streams and the world fails at the first that differs (the engine:
                   debug builds, or TD_RANK_CHECK=1) */
    int leads;  /* 1: rank 0 sends each step to the others, which follow it
                   (forward.h td_forward_follow: the engine's way); 0 (td_split_init's):
                   every rank runs its own plans, the same ones (tests) */
    int serves; /* 1 (td_split_serve's): only rank 0 runs the model (a drafter); each of its
                   MoE layers sends the layer's normed rows and picks to the other ranks, which
                   run their experts on them (forward.h td_serve) for the one sum */
};

/* this rank's part of model m's experts. Collective: every rank calls it, and the ranks'
 * manifests (world, model shapes, a fingerprint of the weights: every tensor's name, dtype,
 * shape and first and last bytes, or a dummy model's seed; the build; the device b runs on, and
 * with data the NCCL version) are gathered and compared over comm. -1 with a message, on every
 * rank, when the world does not divide the routed experts (each rank the same count), a rank's
 * manifest differs from rank 0's (naming the rank and what differs), ranks with a device
 * communicator share a GPU or differ in compute capability or NCCL version, or the gather
 * fails (the communicator's reason). data and b may be NULL (host sums; no device). */
int td_split_init(struct td_split *s, const struct td_model *m, struct td_comm *comm,
                  struct td_comm *data, const struct td_backend *b, char *err, size_t errlen);

/* this rank's part of the experts of m, a model that rank 0 alone runs (a drafter) on the ranks
 * and communicators of target's split, whose manifests were compared: experts [r E / W,
 * (r + 1) E / W) of every MoE layer, the shared expert of layer li on rank li mod W, as
 * td_split_init's; serves and leads set. Not collective. -1 with a message when the world does
 * not divide m's routed experts. */
int td_split_serve(struct td_split *s, const struct td_split *target, const struct td_model *m,
                   char *err, size_t errlen);

/* own copied to backend b's memory (a device), for the forward's expert kernels: -1 with a
 * message when it cannot be allocated. A CPU backend reads own itself. */
int td_split_place(struct td_split *s, const struct td_backend *b, char *err, size_t errlen);

/* the fingerprint of m's weights the manifests compare (XXH3-64) */
unsigned long long td_split_fingerprint(const struct td_model *m);
void td_split_free(struct td_split *s);

#ifdef __cplusplus
}
#endif
#endif
