/* prefix.h: the history pool's allocator and the prefix cache's index of its blocks
 * (../shared/design/prefix_cache.md sections 3.4, 3.5 and 3.11): which blocks of B tokens each
 * sequence holds, which full, committed ones are published under which key, and which block goes
 * when a sequence needs one and none is free. Host bookkeeping only: block i's bytes live in the
 * state's history pool at block i (model/state.h), which this index never reads or writes.
 *
 * Keys are XXH3-128 chained over the blocks (libxxhash): the root is the hash of a fingerprint
 * of the model, the cache format and the numerics (so a cache written by other numerics never
 * hits), and block i's key is XXH3-128(key of block i - 1 || block i's B token ids as u32
 * little-endian || extra bytes). A hit also compares the block's token ids and its parent, never
 * the key alone.
 *
 * A block is free, private (held by the one sequence writing it, unpublished) or published
 * (frozen; held by any number of sequences, or by none: cached). Cached blocks go in the order
 * they were last released, and only leaves (no published block after them) go: a chain is
 * shortened from its end. A private block released unpublished (a rolled-back one, a tail no
 * checkpoint could be had for) is free again and the first to be reused.
 *
 * A tail is a published block of fewer than B tokens: what a finished request committed past
 * its last full block (a conversation's next turn begins with all of it). Its key is the same
 * chain over its n ids, so it never matches a full block; it is always a leaf. A hit may end
 * inside any published block, a tail or a full one (td_prefix_within): it takes a copy of the
 * block's bytes, as the sequence goes on writing that block. */
#ifndef TD_ENGINE_PREFIX_H
#define TD_ENGINE_PREFIX_H

#include <stddef.h>
#include <stdint.h>

struct td_pkey {
    uint64_t lo, hi;
};

struct td_prefix_stats {
    long lookups;    /* td_prefix_count calls (admissions that looked) */
    long hits;       /* of those, the ones that found a block */
    long hit_blocks; /* blocks found, over all lookups (tails included) */
    long hit_tokens; /* tokens those blocks gave */
    long evictions;  /* cached blocks taken back for a new owner */
    long dedups;     /* publications that found the same block already published */
    int in_use;      /* blocks some sequence holds (private or published) */
    int cached;      /* published blocks nobody holds */
    int free;        /* blocks holding nothing */
};

struct td_prefix;

/* an index of n_blocks blocks of block_tokens tokens each, all free, under root; NULL when
 * memory for it cannot be had */
struct td_prefix *td_prefix_new(int n_blocks, int block_tokens, struct td_pkey root);
void td_prefix_free(struct td_prefix *p);

/* the root key: XXH3-128 of a fingerprint's bytes */
struct td_pkey td_prefix_root(const void *fingerprint, size_t n);

/* the key of the block of n token ids after the block keyed parent, with extra bytes (NULL, 0:
 * none) */
struct td_pkey td_prefix_key(struct td_pkey parent, const int32_t *tokens, int n, const void *extra,
                             size_t n_extra);

/* The published blocks that begin tokens (n_tokens ids; only full blocks count): up to max of
 * their ids into ids, in order; returns how many. Takes no hold (td_prefix_hold does) and counts
 * nothing (td_prefix_count does: a request that waits may look again). */
int td_prefix_match(struct td_prefix *p, const int32_t *tokens, int n_tokens, int32_t *ids,
                    int max);

/* The published blocks after parent (a full block, or -1: none), full ones and tails, whose
 * first ids tokens begin with: up to cap of them into ids, each with how many of its ids (at
 * most max) the tokens share in common; returns how many. A hit may end inside one of them
 * (the engine copies it and loads its checkpoint when that checkpoint serves the hit's end).
 * Takes no hold. */
int td_prefix_within(struct td_prefix *p, int parent, const int32_t *tokens, int max, int *ids,
                     int *common, int cap);

/* one lookup that found n blocks (a tail counted) giving tokens tokens, in the stats */
void td_prefix_count(struct td_prefix *p, int n, int tokens);

/* blocks a sequence could be given now: the free ones and the cached ones (every cached block
 * can go, leaves first: a block some sequence holds has every block before it held too) */
int td_prefix_available(const struct td_prefix *p);

/* The least recently released cached leaf (with tails_only, the least recently released cached
 * tail), evicted (its key leaves the index) and free again: its id, or -1 when there is none. */
int td_prefix_evict(struct td_prefix *p, int tails_only);

/* A private block, held once by its caller: a free one, else the least recently released cached
 * leaf (evicted: its key leaves the index). -1 when every block is held. */
int td_prefix_alloc(struct td_prefix *p);

/* one more hold on each of ids (published blocks a hit found) */
void td_prefix_hold(struct td_prefix *p, const int32_t *ids, int n);

/* one hold less on each of ids: a published block nobody holds is cached, a private one free */
void td_prefix_release(struct td_prefix *p, const int32_t *ids, int n);

/* Publishes private block id, full and committed, as the block after published block parent
 * (-1: the first block) holding tokens (block_tokens ids). Returns the block the sequence holds
 * from now on: id itself, or the block already published with the same parent and tokens (then
 * the sequence holds that one and id is released: two sequences prefilled the same prefix). The
 * index's blocks carry no extra bytes: a tenant's salt goes into its root. */
int td_prefix_publish(struct td_prefix *p, int id, int parent, const int32_t *tokens);

/* The same for a tail: private block id holding n < block_tokens committed ids after full block
 * parent (-1: none), published as it is (a finished sequence's last block). */
int td_prefix_publish_tail(struct td_prefix *p, int id, int parent, const int32_t *tokens, int n);

void td_prefix_stats(const struct td_prefix *p, struct td_prefix_stats *s);

/* whether block id is published (its bytes frozen) */
int td_prefix_published(const struct td_prefix *p, int id);

/* the holds on block id (0: free or cached) */
int td_prefix_holds(const struct td_prefix *p, int id);

/* test seam: keys compared on their low `bits` bits only (1 .. 128; 128 by default), so that
 * different blocks collide and only their tokens tell them apart */
void td_prefix_set_key_bits(struct td_prefix *p, int bits);

#endif
