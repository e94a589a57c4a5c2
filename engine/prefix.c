/* prefix.c: the prefix cache's index of history blocks (see prefix.h). Published blocks sit in an
 * open-addressed table by key (linear probing, tombstones, rebuilt when they pile up); cached
 * ones on a doubly linked list in release order; free ones on a stack, so a block freed last is
 * reused first. */
#include "engine/prefix.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "kernels/err.h"

struct pblock {
    struct td_pkey key;
    int parent, children, holds, published;
    int ntok;       /* the tokens it holds: B, or fewer for a tail (td_prefix_publish_tail) */
    int kid, sib;   /* its first published child, and its next sibling (-1: none) */
    int prev, next; /* the cached list (published, no holds), or the free stack (next) */
    int slot;       /* its table slot while published */
};

struct td_prefix {
    int n, B, key_bits, cap, live, tombs;
    struct td_pkey root;
    struct pblock *b;
    int32_t *tokens; /* [n][B]: each published block's ids */
    int *table;      /* cap slots: -1 empty, -2 a removed entry, else a block */
    int free_top, lru_head, lru_tail;
    int n_free, n_cached; /* blocks on the free stack and the cached list */
    int root_kid;         /* the first published block of no parent */
    struct td_prefix_stats st;
};

static void put_u64(unsigned char *o, uint64_t v) {
    for (int i = 0; i < 8; i++)
        o[i] = (unsigned char)(v >> (8 * i));
}

static struct td_pkey of_xxh(XXH128_hash_t h) {
    return (struct td_pkey){.lo = h.low64, .hi = h.high64};
}

struct td_pkey td_prefix_root(const void *fingerprint, size_t n) {
    return of_xxh(XXH3_128bits(fingerprint, n));
}

struct td_pkey td_prefix_key(struct td_pkey parent, const int32_t *tokens, int n, const void *extra,
                             size_t n_extra) {
    XXH3_state_t *s = XXH3_createState();
    TD_ASSERT(s && XXH3_128bits_reset(s) == XXH_OK);
    unsigned char head[16], buf[4 * 64];
    put_u64(head, parent.lo), put_u64(head + 8, parent.hi);
    XXH3_128bits_update(s, head, sizeof head);
    for (int i0 = 0; i0 < n; i0 += 64) { // the ids as u32 little-endian, 64 at a time
        int m = n - i0 < 64 ? n - i0 : 64;
        for (int i = 0; i < m; i++)
            for (int j = 0; j < 4; j++)
                buf[4 * i + j] = (unsigned char)((uint32_t)tokens[i0 + i] >> (8 * j));
        XXH3_128bits_update(s, buf, (size_t)4 * m);
    }
    if (n_extra) XXH3_128bits_update(s, extra, n_extra);
    struct td_pkey k = of_xxh(XXH3_128bits_digest(s));
    XXH3_freeState(s);
    return k;
}

static struct td_pkey masked(const struct td_prefix *p, struct td_pkey k) {
    int b = p->key_bits;
    if (b >= 128) return k;
    if (b >= 64) return (struct td_pkey){.lo = k.lo, .hi = k.hi & ((1ull << (b - 64)) - 1)};
    return (struct td_pkey){.lo = k.lo & ((1ull << b) - 1), .hi = 0};
}

static int home(const struct td_prefix *p, struct td_pkey k) {
    struct td_pkey m = masked(p, k);
    return (int)((m.lo ^ (m.hi * 0x9E3779B97F4A7C15ull)) & (uint64_t)(p->cap - 1));
}

static const int32_t *toks(const struct td_prefix *p, int id) {
    return p->tokens + (size_t)id * p->B;
}

/* the published block of this key, parent and n tokens, or -1 */
static int find(const struct td_prefix *p, struct td_pkey key, int parent, const int32_t *tokens,
                int n) {
    struct td_pkey m = masked(p, key);
    for (int s = home(p, key);; s = (s + 1) & (p->cap - 1)) {
        int q = p->table[s];
        if (q == -1) return -1;
        if (q < 0) continue;
        struct td_pkey mq = masked(p, p->b[q].key);
        if (mq.lo == m.lo && mq.hi == m.hi && p->b[q].parent == parent && p->b[q].ntok == n &&
            !memcmp(toks(p, q), tokens, (size_t)n * sizeof *tokens))
            return q;
    }
}

/* the head of parent's list of published children (-1: the root's) */
static int *kids_of(struct td_prefix *p, int parent) {
    return parent < 0 ? &p->root_kid : &p->b[parent].kid;
}

static void kid_unlink(struct td_prefix *p, int id) {
    int *q = kids_of(p, p->b[id].parent);
    while (*q != id)
        q = &p->b[*q].sib;
    *q = p->b[id].sib, p->b[id].sib = -1;
}

static void insert(struct td_prefix *p, int id) {
    int s = home(p, p->b[id].key);
    while (p->table[s] >= 0)
        s = (s + 1) & (p->cap - 1);
    if (p->table[s] == -2) p->tombs--;
    p->table[s] = id, p->b[id].slot = s, p->live++;
}

static void rebuild(struct td_prefix *p) {
    for (int s = 0; s < p->cap; s++)
        p->table[s] = -1;
    p->live = p->tombs = 0;
    for (int i = 0; i < p->n; i++)
        if (p->b[i].published) insert(p, i);
}

static void remove_key(struct td_prefix *p, int id) {
    p->table[p->b[id].slot] = -2, p->b[id].slot = -1, p->live--, p->tombs++;
    if (p->tombs > p->cap / 4) rebuild(p);
}

static void lru_unlink(struct td_prefix *p, int id) {
    struct pblock *x = &p->b[id];
    if (x->prev >= 0)
        p->b[x->prev].next = x->next;
    else
        p->lru_head = x->next;
    if (x->next >= 0)
        p->b[x->next].prev = x->prev;
    else
        p->lru_tail = x->prev;
    x->prev = x->next = -1;
}

static void lru_append(struct td_prefix *p, int id) {
    struct pblock *x = &p->b[id];
    x->prev = p->lru_tail, x->next = -1;
    if (p->lru_tail >= 0)
        p->b[p->lru_tail].next = id;
    else
        p->lru_head = id;
    p->lru_tail = id;
}

struct td_prefix *td_prefix_new(int n_blocks, int block_tokens, struct td_pkey root) {
    TD_ASSERT(n_blocks > 0 && block_tokens > 0);
    struct td_prefix *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = n_blocks, p->B = block_tokens, p->key_bits = 128, p->root = root;
    for (p->cap = 16; p->cap < 2 * n_blocks; p->cap *= 2) {
    }
    p->b = calloc((size_t)n_blocks, sizeof *p->b);
    p->tokens = malloc((size_t)n_blocks * block_tokens * sizeof *p->tokens);
    p->table = malloc((size_t)p->cap * sizeof *p->table);
    if (!p->b || !p->tokens || !p->table) {
        td_prefix_free(p);
        return NULL;
    }
    p->lru_head = p->lru_tail = p->root_kid = -1;
    p->free_top = -1;
    for (int i = n_blocks - 1; i >= 0; i--) // block 0 on top
        p->b[i] = (struct pblock){.parent = -1, .prev = -1, .next = p->free_top, .slot = -1},
        p->free_top = i;
    p->n_free = n_blocks;
    rebuild(p);
    return p;
}

void td_prefix_free(struct td_prefix *p) {
    if (!p) return;
    free(p->b), free(p->tokens), free(p->table), free(p);
}

void td_prefix_set_key_bits(struct td_prefix *p, int bits) {
    TD_ASSERT(bits >= 1 && bits <= 128);
    p->key_bits = bits;
    rebuild(p);
}

int td_prefix_match(struct td_prefix *p, const int32_t *tokens, int n_tokens, int32_t *ids,
                    int max) {
    int n = 0, parent = -1;
    struct td_pkey k = p->root;
    for (int i = 0; n < max && (i + 1) * p->B <= n_tokens; i++) {
        k = td_prefix_key(k, tokens + (size_t)i * p->B, p->B, NULL, 0);
        int q = find(p, k, parent, tokens + (size_t)i * p->B, p->B);
        if (q < 0) break;
        ids[n++] = q, parent = q;
    }
    return n;
}

int td_prefix_within(struct td_prefix *p, int parent, const int32_t *tokens, int max, int *ids,
                     int *common, int cap) {
    int n = 0;
    for (int q = *kids_of(p, parent); q >= 0 && n < cap; q = p->b[q].sib) {
        const int32_t *t = toks(p, q);
        int m = max < p->b[q].ntok ? max : p->b[q].ntok, c = 0;
        while (c < m && t[c] == tokens[c])
            c++;
        if (c) ids[n] = q, common[n++] = c;
    }
    return n;
}

void td_prefix_count(struct td_prefix *p, int n, int tokens) {
    p->st.lookups++, p->st.hits += n > 0, p->st.hit_blocks += n, p->st.hit_tokens += tokens;
}

int td_prefix_available(const struct td_prefix *p) {
    return p->n_free + p->n_cached;
}

/* the least recently released cached leaf (a tail, with tails_only), unpublished and taken off
 * every list (the caller decides where it goes), or -1 */
static int take_leaf(struct td_prefix *p, int tails_only) {
    int id = p->lru_head;
    while (id >= 0 && (p->b[id].children || (tails_only && p->b[id].ntok == p->B)))
        id = p->b[id].next;
    if (id < 0) return -1;
    lru_unlink(p, id);
    remove_key(p, id);
    if (p->b[id].parent >= 0) p->b[p->b[id].parent].children--;
    kid_unlink(p, id);
    p->b[id].published = 0;
    p->n_cached--;
    p->st.evictions++;
    return id;
}

int td_prefix_evict(struct td_prefix *p, int tails_only) {
    int id = take_leaf(p, tails_only);
    if (id < 0) return -1;
    p->b[id] = (struct pblock){.parent = -1, .prev = -1, .next = p->free_top, .slot = -1};
    p->free_top = id, p->n_free++;
    return id;
}

int td_prefix_alloc(struct td_prefix *p) {
    int id = p->free_top;
    if (id >= 0) {
        p->free_top = p->b[id].next, p->n_free--;
    } else if ((id = take_leaf(p, 0)) < 0) {
        return -1; // every block is held
    }
    p->b[id] = (struct pblock){.parent = -1, .holds = 1, .prev = -1, .next = -1, .slot = -1};
    return id;
}

void td_prefix_hold(struct td_prefix *p, const int32_t *ids, int n) {
    for (int i = 0; i < n; i++) {
        struct pblock *x = &p->b[ids[i]];
        TD_ASSERT(x->published); // only a hit's blocks are shared
        if (!x->holds++) lru_unlink(p, ids[i]), p->n_cached--;
    }
}

void td_prefix_release(struct td_prefix *p, const int32_t *ids, int n) {
    for (int i = 0; i < n; i++) {
        struct pblock *x = &p->b[ids[i]];
        TD_ASSERT(x->holds > 0);
        if (--x->holds) continue;
        if (x->published) {
            lru_append(p, ids[i]), p->n_cached++;
        } else {
            x->next = p->free_top, p->free_top = ids[i], p->n_free++;
        }
    }
}

/* publication of private block id holding n tokens (B, or fewer: a tail) after parent */
static int publish_n(struct td_prefix *p, int id, int parent, const int32_t *tokens, int n) {
    struct pblock *x = &p->b[id];
    TD_ASSERT(x->holds > 0 && !x->published && n >= 1 && n <= p->B);
    TD_ASSERT(parent < 0 || (p->b[parent].published && p->b[parent].ntok == p->B));
    struct td_pkey k = td_prefix_key(parent < 0 ? p->root : p->b[parent].key, tokens, n, NULL, 0);
    int q = find(p, k, parent, tokens, n);
    if (q >= 0) {
        p->st.dedups++;
        td_prefix_hold(p, &q, 1);
        td_prefix_release(p, (int32_t[]){id}, 1);
        return q;
    }
    x->key = k, x->parent = parent, x->published = 1, x->children = 0, x->ntok = n;
    memcpy(p->tokens + (size_t)id * p->B, tokens, (size_t)n * sizeof *tokens);
    if (parent >= 0) p->b[parent].children++;
    x->kid = -1, x->sib = *kids_of(p, parent), *kids_of(p, parent) = id;
    insert(p, id);
    if (p->live + p->tombs > p->cap / 2) rebuild(p);
    return id;
}

int td_prefix_publish(struct td_prefix *p, int id, int parent, const int32_t *tokens) {
    return publish_n(p, id, parent, tokens, p->B);
}

int td_prefix_publish_tail(struct td_prefix *p, int id, int parent, const int32_t *tokens, int n) {
    TD_ASSERT(n < p->B);
    return publish_n(p, id, parent, tokens, n);
}

void td_prefix_stats(const struct td_prefix *p, struct td_prefix_stats *s) {
    *s = p->st; // (the counts as kept, not a pass over the blocks: the server asks every step)
    s->cached = p->n_cached, s->free = p->n_free;
    s->in_use = p->n - p->n_cached - p->n_free;
}

int td_prefix_holds(const struct td_prefix *p, int id) {
    return id >= 0 && id < p->n ? p->b[id].holds : 0;
}

int td_prefix_published(const struct td_prefix *p, int id) {
    return id >= 0 && id < p->n && p->b[id].published;
}
