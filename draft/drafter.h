/* drafter.h: the two interfaces drafters implement. A request drafter (ngram, random)
 * proposes for one request at a time from its tokens; a model drafter (MTP, DSpark: a network
 * fed by the target's own rows) runs once per target step over every live sequence
 * (td_model_drafter, below).
 *
 *   struct td_drafter *d = draft_init("ngram", vocab, err, sizeof err);   // NULL: err says why
 *   if (!d) return -1;
 *   struct td_draft_req req = {.id = id, .tokens = tokens, .n_tokens = n, .sampling = &s};
 *   int32_t drafts[4];
 *   int q_onehot, k = d->propose(d, &req, 4, drafts, q, &q_onehot);   // q [4, vocab], or one-hot
 *   // verify drafts[0 .. k): n_accepted of them are accepted
 *   if (d->observe) d->observe(d, &req, n_accepted);                   // stateful drafters
 *   draft_free(d);
 *
 * A drafter proposes up to k tokens to follow a request's committed tokens and says which
 * distribution each was drawn from: either one-hot (q_onehot = 1: the draft is certain, as a
 * lookup or a greedy drafter is) or the rows q[k][vocab] it sampled them from. Verification is
 * lossless only if q is exactly that distribution.
 */
#ifndef TD_DRAFTER_H
#define TD_DRAFTER_H

#include <stddef.h>
#include <stdint.h>

#include "verify/sample.h"

#ifdef __cplusplus
extern "C" {
#endif

struct td_draft_req {
    int id;                /* request id */
    const int32_t *tokens; /* [n_tokens] prompt + generated; the last one is the anchor */
    int n_tokens;
    const struct td_sampling *sampling;
};

struct td_drafter {
    const char *name;
    int vocab;
    /* drafts[k]; q[k * vocab] when !*q_onehot. Returns how many were proposed (0 .. k). */
    int (*propose)(struct td_drafter *d, const struct td_draft_req *r, int k, int32_t *drafts,
                   float *q, int *q_onehot);
    /* the first n_accepted proposals were accepted (stateful drafters); may be NULL */
    void (*observe)(struct td_drafter *d, const struct td_draft_req *r, int n_accepted);
    void *impl;
};

/* a request drafter made from its table (proto) for a vocabulary: a malloc'd copy with vocab
 * set, NULL when out of memory (ngram.c, random.c) */
struct td_drafter *draft_request_new(const struct td_drafter *proto, int vocab);

/* A model drafter (MTP, DSpark) runs once per target step over every live sequence, on the
 * rows that step committed. One sequence's part of a call: */
struct td_draft_seq {
    int slot;            /* the target's state slot; the drafter uses the same one */
    int pos0;            /* position of the first committed row (0: a new sequence) */
    int n;               /* committed rows (>= 1) */
    const int32_t *next; /* [n] the token after each row: next[n - 1], the token at pos0 + n,
                            is the round's anchor */
    const int32_t *toks; /* [pos0 + n + 1] every token so far (toks[p] at position p: next is
                            toks + pos0 + 1): MTP reads its rows' tokens here, those it skipped
                            included (required there; DSpark reads next) */
    int k;               /* drafts wanted (0: catch up or insert only) */
    const struct td_sampling *sampling;
    int32_t *drafts; /* [k] out */
    float *q;        /* [k, vocab] out: the distribution each draft came from (greedy rounds:
                        one-hot at the draft, not written) */
    float *conf;     /* [k] out, or NULL: DSpark's confidence of each slot */
    int n_drafts;    /* out: drafts made (< k at a confidence cut or a non-finite row) */
    const int32_t *dev_drafts; /* out: NULL, or (deferred greedy round) where the [k] drafts
                                  are in backend memory; drafts and n_drafts (k until then)
                                  are filled by collect */
    int caught;                /* out: rows this call made up for it, having drafted nothing
                                  for them (within its window: MTP's keys before its step's
                                  rows, DSpark's context its steps did not insert) */
};

struct td_forward_io;
struct td_state;
struct td_plan;

/* The rows a model drafter whose own caches are st makes up for the sequence in slot before
 * it drafts after its committed end end: those its window reaches that it skipped while it
 * drafted nothing (end - max(len, end - window); 0 when it holds them). DSpark's catch-up
 * makes exactly these; MTP's the ones before its step's rows. */
int draft_rows_behind(const struct td_state *st, int slot, int end);

/* The engine's view of a model drafter: one table, whichever it is. */
struct td_model_drafter {
    void *impl;
    /* what the target forward must leave for it (MTP: its final streams; DSpark: the mean
     * streams of its capture layers) */
    void (*target_io)(void *impl, struct td_forward_io *io);
    /* every row of the target step just queued (plan p), before the verify decides which stay,
     * or NULL. DSpark inserts them all here, by position, so its insertion runs on the device
     * while the host verifies; run then moves its length back to the committed one (the
     * rejected rows lie at or past it, where no block reads, until the next step overwrites
     * them, as in the target's own rings). */
    int (*insert_step)(void *impl, const struct td_plan *p, char *err, size_t errlen);
    /* catch up or insert every sequence's committed rows, then draft for those with k >= 1 */
    int (*run)(void *impl, struct td_draft_seq *seqs, int n, char *err, size_t errlen);
    /* a deferred round's drafts to the host (seqs as given to run; at once when none is due) */
    int (*collect)(void *impl, struct td_draft_seq *seqs, char *err, size_t errlen);
    /* a new sequence in slot whose first len positions the target took from the prefix cache:
     * the drafter starts it at len (0: an ordinary new sequence, as a first call at position 0
     * starts one). It reads nothing before len: the engine prefills at least its window
     * (state()->window) of the prompt after a hit, which rebuilds what it reads */
    void (*begin)(void *impl, int slot, int len);
    /* its own caches (its graphs' counts live there) */
    const struct td_state *(*state)(const void *impl);
    /* the bytes its placed weights take (0: it runs the loaded files in place) */
    size_t (*weight_bytes)(const void *impl);
    /* its model as loaded (the ranks of a split model compare its fingerprint) */
    const struct td_model *(*model)(const void *impl);
    void (*free)(void *impl);
};

/* ---- the registry: every name td_engine_params.draft, --draft and speculation.method take,
 * listed once (drafter.c). Front ends check a name with draft_lookup and list the names with
 * draft_names / draft_names_join; td_engine_init turns "auto" into a drafter (draft_pick_auto)
 * and td_engine_draft says which. */

enum draft_kind {
    DRAFT_KIND_AUTO,    /* not a drafter: the engine picks one (draft_pick_auto) */
    DRAFT_KIND_NONE,    /* no drafter: the target decodes alone */
    DRAFT_KIND_REQUEST, /* proposes per request from its tokens (td_drafter, draft_init) */
    DRAFT_KIND_MTP,     /* the checkpoint's MTP layer (mtp.h), a model drafter */
    DRAFT_KIND_DSPARK,  /* a DSpark network (dspark.h), a model drafter */
};

struct draft_info {
    const char *name;
    enum draft_kind kind;
    int default_tokens; /* draft tokens a round when none are asked for (0: none, or for dspark
                           its block size; auto: the pick's) */
    struct td_drafter *(*init)(int vocab); /* DRAFT_KIND_REQUEST: makes one; else NULL */
};

/* every name in the registry's order, "auto" first, then NULL */
extern const char *const draft_names[];

/* the entry called exactly name, or NULL + "unknown drafter 'x' (known: auto, none, ...)" */
const struct draft_info *draft_lookup(const char *name, char *err, size_t errlen);

/* every name into out[n], sep between two and last before the final one:
 * (", ", " or ") gives "auto, none, ngram, random, mtp or dspark" */
void draft_names_join(char *out, size_t n, const char *sep, const char *last);

/* what "auto" stands for, where own says what the checkpoint carries in its own files (model.h's
 * td_model_own_drafter: 0 nothing, TD_OWN_MTP, TD_OWN_DSPARK). On the CPU (!on_device): none.
 * On a device: with dspark_dir given, dspark when it holds a readable config.json, else none;
 * else dspark when the checkpoint carries a DSpark head or model_dir/dspark/ holds a readable
 * config.json, else mtp when it carries an MTP layer, else none. Never NULL. */
const struct draft_info *draft_pick_auto(int on_device, const char *model_dir,
                                         const char *dspark_dir, int own);

/* A request drafter ("ngram": prompt lookup; "random": uniform tokens, a test tool). NULL +
 * message for any other name ("none", "mtp", "dspark" and "auto" are the engine's business). */
struct td_drafter *draft_init(const char *name, int vocab, char *err, size_t errlen);

void draft_free(struct td_drafter *d);

#ifdef __cplusplus
}
#endif
#endif
