/* test_prefix.c: the prefix cache's index of history blocks (engine/prefix.h).
 *
 *   make build/tests/test_prefix && build/tests/test_prefix
 *
 * prefix/key_chain                 a block's key is XXH3-128 of its parent's key (lo, hi as u64
 *                                  little-endian), its ids as u32 little-endian and the extra
 *                                  bytes; any id, the parent or the root changes it
 * prefix/match_full_blocks         a published chain is found block by block, full blocks only,
 *                                  up to where the tokens part; nothing under another root
 * prefix/publish_dedup             a second sequence publishing the same blocks gets the first
 *                                  one's and its own are free again
 * prefix/eviction_leaves_lru       a pool of 6: free blocks first, then cached leaves in the
 *                                  order they were released, never a block above which a
 *                                  published block remains, never a held one; -1 when all held
 * prefix/private_reused_first      a block released unpublished is the next one handed out
 * prefix/forced_collisions         keys cut to 2 bits: 24 chains of 3 blocks that share few of
 *                                  their keys' bits are still told apart by their ids; a prefix
 *                                  never published finds nothing
 * prefix/stats                     lookups, hits, blocks found, evictions, dedups, and the
 *                                  blocks held, cached and free at the end
 */
#include <stdint.h>
#include <string.h>
#include <xxhash.h>

#include "check.h"
#include "engine/prefix.h"

#define B 4

static struct td_pkey root_of(const char *s) {
    return td_prefix_root(s, strlen(s));
}

/* the chain of n_blocks blocks of t: allocated, each published after the one before; ids out */
static void publish_chain(struct td_prefix *p, const int32_t *t, int n_blocks, int32_t *ids) {
    int parent = -1;
    for (int i = 0; i < n_blocks; i++) {
        int id = td_prefix_alloc(p);
        CHECK(id >= 0, "no block for block %d", i);
        if (id < 0) return;
        ids[i] = td_prefix_publish(p, id, parent, t + i * B);
        parent = ids[i];
    }
}

static void key_chain(void) {
    case_begin();
    struct td_pkey r = root_of("model x, fp32 caches, numerics 1");
    int32_t t[3] = {7, -1, 70000};
    unsigned char buf[16 + 12 + 3];
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)(r.lo >> (8 * i)), buf[8 + i] = (unsigned char)(r.hi >> (8 * i));
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++)
            buf[16 + 4 * i + j] = (unsigned char)((uint32_t)t[i] >> (8 * j));
    memcpy(buf + 28, "abc", 3);
    XXH128_hash_t want = XXH3_128bits(buf, sizeof buf);
    struct td_pkey k = td_prefix_key(r, t, 3, "abc", 3);
    CHECK(k.lo == want.low64 && k.hi == want.high64, "the key is not XXH3-128 of the layout");
    XXH128_hash_t w2 = XXH3_128bits(buf, 28); // no extra
    struct td_pkey k2 = td_prefix_key(r, t, 3, NULL, 0);
    CHECK(k2.lo == w2.low64 && k2.hi == w2.high64, "the key without extra bytes");
    int32_t u[3] = {7, -1, 70001};
    struct td_pkey ku = td_prefix_key(r, u, 3, NULL, 0), kr = td_prefix_key(k2, t, 3, NULL, 0);
    struct td_pkey r2 = root_of("model x, bf16 caches, numerics 1");
    struct td_pkey k3 = td_prefix_key(r2, t, 3, NULL, 0);
    CHECK(ku.lo != k2.lo && kr.lo != k2.lo && k3.lo != k2.lo, "an id, the parent or the root "
                                                              "left the key as it was");
    // 300 ids: the hash runs over them in pieces of 64
    int32_t many[300];
    for (int i = 0; i < 300; i++)
        many[i] = i * 131 - 5000;
    unsigned char big[16 + 1200];
    memcpy(big, buf, 16);
    for (int i = 0; i < 300; i++)
        for (int j = 0; j < 4; j++)
            big[16 + 4 * i + j] = (unsigned char)((uint32_t)many[i] >> (8 * j));
    XXH128_hash_t wb = XXH3_128bits(big, sizeof big);
    struct td_pkey kb = td_prefix_key(r, many, 300, NULL, 0);
    CHECK(kb.lo == wb.low64 && kb.hi == wb.high64, "the key of 300 ids");
    case_end("prefix/key_chain", "");
}

static void match_full_blocks(void) {
    case_begin();
    struct td_prefix *p = td_prefix_new(8, B, root_of("m"));
    int32_t t[14], ids[4], got[4];
    for (int i = 0; i < 14; i++)
        t[i] = 100 + i;
    publish_chain(p, t, 3, ids);
    int n = td_prefix_match(p, t, 14, got, 4);
    CHECK(n == 3 && !memcmp(got, ids, sizeof(int32_t) * 3), "found %d of 3 blocks", n);
    CHECK(td_prefix_match(p, t, 11, got, 4) == 2, "11 tokens: not two full blocks");
    CHECK(td_prefix_match(p, t, 14, got, 1) == 1, "at most one block asked");
    int32_t v[12];
    memcpy(v, t, sizeof v);
    v[9] = -3; // the third block differs
    CHECK(td_prefix_match(p, v, 12, got, 4) == 2, "a third block that differs was found");
    v[0] = 0; // the first too
    CHECK(td_prefix_match(p, v, 12, got, 4) == 0, "a first block that differs was found");
    struct td_prefix *q = td_prefix_new(8, B, root_of("another model"));
    int32_t ids2[3];
    publish_chain(q, t, 3, ids2);
    CHECK(td_prefix_match(q, t, 12, got, 4) == 3, "its own chain");
    td_prefix_free(q);
    struct td_prefix *r = td_prefix_new(8, B, root_of("another model"));
    CHECK(td_prefix_match(r, t, 12, got, 4) == 0, "an empty index found blocks");
    td_prefix_free(r);
    td_prefix_free(p);
    case_end("prefix/match_full_blocks", "");
}

static void publish_dedup(void) {
    case_begin();
    struct td_prefix *p = td_prefix_new(8, B, root_of("m"));
    int32_t t[8], a[2], b[2];
    for (int i = 0; i < 8; i++)
        t[i] = 3 * i;
    publish_chain(p, t, 2, a);
    publish_chain(p, t, 2, b); // a second sequence prefilled the same prompt
    CHECK(!memcmp(a, b, sizeof a), "the second sequence holds blocks %d %d, not %d %d", b[0], b[1],
          a[0], a[1]);
    struct td_prefix_stats s;
    td_prefix_stats(p, &s);
    CHECK(s.dedups == 2 && s.in_use == 2 && s.free == 6, "dedups %ld, in use %d, free %d", s.dedups,
          s.in_use, s.free);
    td_prefix_release(p, a, 2);
    td_prefix_stats(p, &s);
    CHECK(s.in_use == 2 && s.cached == 0, "one holder gone: in use %d", s.in_use);
    td_prefix_release(p, b, 2);
    td_prefix_stats(p, &s);
    CHECK(s.in_use == 0 && s.cached == 2, "both gone: cached %d", s.cached);
    td_prefix_free(p);
    case_end("prefix/publish_dedup", "");
}

static void eviction_leaves_lru(void) {
    case_begin();
    struct td_prefix *p = td_prefix_new(6, B, root_of("m"));
    int32_t x[12], y[8], cx[3], cy[2], got[3];
    for (int i = 0; i < 12; i++)
        x[i] = i;
    for (int i = 0; i < 8; i++)
        y[i] = 50 + i;
    publish_chain(p, x, 3, cx);
    publish_chain(p, y, 2, cy);
    td_prefix_release(p, cx, 3); // x released before y
    td_prefix_release(p, cy, 2);
    int f = td_prefix_alloc(p); // the sixth block, free
    CHECK(f >= 0 && f != cx[0] && f != cx[1] && f != cx[2] && f != cy[0] && f != cy[1],
          "a cached block %d went while one was free", f);
    int order[5];
    for (int i = 0; i < 5; i++)
        order[i] = td_prefix_alloc(p);
    // x's leaf first (released first), then y's? no: leaves in release order, each chain from
    // its end: x2, x1 ... x's blocks were released before y's, so x2 (leaf), then x1 (a leaf
    // once x2 is gone), x0, then y1, y0
    int want[5] = {cx[2], cx[1], cx[0], cy[1], cy[0]};
    CHECK(!memcmp(order, want, sizeof want), "evicted %d %d %d %d %d, expected %d %d %d %d %d",
          order[0], order[1], order[2], order[3], order[4], want[0], want[1], want[2], want[3],
          want[4]);
    CHECK(td_prefix_alloc(p) == -1, "a seventh block out of six");
    CHECK(td_prefix_match(p, x, 12, got, 3) == 0, "an evicted chain was found");
    td_prefix_release(p, order, 5);
    td_prefix_release(p, (int32_t[]){f}, 1);
    // a held chain: its blocks stay; a cached block under a held one stays (not a leaf)
    int32_t cz[3];
    publish_chain(p, x, 3, cz);
    td_prefix_release(p, cz, 2); // blocks 0 and 1 cached, block 2 held
    int32_t h[3];
    for (int i = 0; i < 3; i++)
        h[i] = td_prefix_alloc(p);
    CHECK(h[0] >= 0 && h[1] >= 0 && h[2] >= 0, "three free blocks");
    CHECK(td_prefix_alloc(p) == -1, "a block under a held one (or the held one) was evicted");
    CHECK(td_prefix_match(p, x, 12, got, 3) == 3, "the held chain is gone");
    td_prefix_free(p);
    case_end("prefix/eviction_leaves_lru", "");
}

static void private_reused_first(void) {
    case_begin();
    struct td_prefix *p = td_prefix_new(4, B, root_of("m"));
    int a = td_prefix_alloc(p), b = td_prefix_alloc(p);
    td_prefix_release(p, (int32_t[]){b}, 1);
    int c = td_prefix_alloc(p);
    CHECK(c == b, "block %d handed out, %d was released last", c, b);
    (void)a;
    td_prefix_free(p);
    case_end("prefix/private_reused_first", "");
}

static void forced_collisions(void) {
    case_begin();
    enum { CH = 24 };
    struct td_prefix *p = td_prefix_new(CH * 3, B, root_of("m"));
    td_prefix_set_key_bits(p, 2);
    int32_t t[CH][12], ids[CH][3], got[3];
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (int c = 0; c < CH; c++)
        for (int i = 0; i < 12; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            t[c][i] = (int32_t)(s % 5); // few ids: chains share first blocks now and then
        }
    for (int c = 0; c < CH; c++)
        publish_chain(p, t[c], 3, ids[c]);
    for (int c = 0; c < CH; c++) {
        int n = td_prefix_match(p, t[c], 12, got, 3);
        CHECK(n == 3 && !memcmp(got, ids[c], sizeof got), "chain %d: found %d blocks", c, n);
    }
    int32_t never[12] = {9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9};
    CHECK(td_prefix_match(p, never, 12, got, 3) == 0, "a prefix never published was found");
    td_prefix_free(p);
    case_end("prefix/forced_collisions", "");
}

static void stats(void) {
    case_begin();
    struct td_prefix *p = td_prefix_new(5, B, root_of("m"));
    int32_t t[8] = {1, 2, 3, 4, 5, 6, 7, 8}, u[8] = {1, 2, 3, 4, 0, 0, 0, 0}, a[2], got[2];
    publish_chain(p, t, 2, a);
    td_prefix_count(p, td_prefix_match(p, t, 8, got, 2), 8);     // 2 blocks
    td_prefix_count(p, td_prefix_match(p, u, 8, got, 2), 4);     // 1 block
    td_prefix_count(p, td_prefix_match(p, u + 4, 4, got, 2), 0); // none
    td_prefix_match(p, t, 8, got, 2); // a look that is not counted (a request that waits)
    td_prefix_release(p, a, 2);
    CHECK(td_prefix_available(p) == 5, "available %d of 5 (3 free, 2 cached)",
          td_prefix_available(p));
    int h[4];
    for (int i = 0; i < 4; i++) // 3 free, then one eviction
        h[i] = td_prefix_alloc(p);
    CHECK(td_prefix_available(p) == 1, "available %d, 1 cached left", td_prefix_available(p));
    struct td_prefix_stats s;
    td_prefix_stats(p, &s);
    CHECK(s.lookups == 3 && s.hits == 2 && s.hit_blocks == 3 && s.hit_tokens == 12,
          "lookups %ld hits %ld blocks %ld tokens %ld", s.lookups, s.hits, s.hit_blocks,
          s.hit_tokens);
    CHECK(s.evictions == 1 && s.in_use == 4 && s.cached == 1 && s.free == 0,
          "evictions %ld, in use %d, cached %d, free %d", s.evictions, s.in_use, s.cached, s.free);
    CHECK(td_prefix_evict(p, 0) >= 0 && td_prefix_available(p) == 1 && td_prefix_evict(p, 0) == -1,
          "evict: the cached block goes free, then nothing is cached");
    (void)h;
    td_prefix_free(p);
    case_end("prefix/stats", "");
}

/* tails: a finished sequence's last block of fewer than B tokens, published after its full
 * blocks (or after none). The published blocks after a parent, tails and full ones, are found
 * with the ids the tokens share with each (a hit may end inside any of them); a tail never
 * matches as a full block; the same tail twice is one block; a tail is a leaf: the block
 * before it is evicted only after it; an eviction for a tail takes only a tail. */
static void tails(void) {
    case_begin();
    struct td_prefix *p = td_prefix_new(6, B, root_of("m"));
    int32_t t[8] = {1, 2, 3, 4, 5, 6, 7, 8}, a[1];
    publish_chain(p, t, 1, a);
    int x = td_prefix_alloc(p), y = td_prefix_alloc(p), z = td_prefix_alloc(p);
    int tx = td_prefix_publish_tail(p, x, a[0], t + 4, 2);              // 1 2 3 4 | 5 6
    int ty = td_prefix_publish_tail(p, y, -1, (int32_t[]){9, 8, 7}, 3); // 9 8 7
    CHECK(tx == x && ty == y, "tails published as %d, %d (blocks %d, %d)", tx, ty, x, y);
    int32_t more[4] = {5, 6, 0, 0}, other[3] = {5, 0, 0}, root3[4] = {9, 8, 7, 6};
    int ids[4], com[4];
    CHECK(td_prefix_within(p, a[0], more, 3, ids, com, 4) == 1 && ids[0] == x && com[0] == 2,
          "the tail after the block: all 2 of its ids");
    CHECK(td_prefix_within(p, a[0], more, 1, ids, com, 4) == 1 && ids[0] == x && com[0] == 1,
          "at most 1 id: 1 of the tail's");
    CHECK(td_prefix_within(p, a[0], other, 3, ids, com, 4) == 1 && ids[0] == x && com[0] == 1,
          "ids that part after 1: 1 of the tail's");
    CHECK(td_prefix_within(p, -1, root3, 3, ids, com, 4) == 1 && ids[0] == y && com[0] == 3,
          "the root's tail");
    CHECK(td_prefix_within(p, -1, t, 3, ids, com, 4) == 1 && ids[0] == a[0] && com[0] == 3,
          "3 ids inside the full block after the root");
    int32_t got[2];
    CHECK(td_prefix_match(p, (int32_t[]){1, 2, 3, 4, 5, 6, 0, 0}, 8, got, 2) == 1,
          "a tail matched as a full block");
    // the same tail again: the first one, the second's block free again
    int tz = td_prefix_publish_tail(p, z, a[0], t + 4, 2);
    CHECK(tz == x, "the same tail published as %d, not %d", tz, x);
    struct td_prefix_stats s;
    td_prefix_stats(p, &s);
    CHECK(s.dedups == 1, "dedups %ld", s.dedups);
    // release everything, another chain's full block c first: the least recently released
    // tail goes before c when only a tail may go; a full block goes only after its tail (a
    // leaf first)
    int32_t c[1];
    publish_chain(p, (int32_t[]){4, 4, 4, 4}, 1, c);
    CHECK(td_prefix_evict(p, 1) == -1, "a tail was evicted while none was cached");
    td_prefix_release(p, c, 1);
    td_prefix_release(p, (int32_t[]){x, x, y, a[0]}, 4);
    int first = td_prefix_evict(p, 1), second = td_prefix_evict(p, 0);
    int third = td_prefix_evict(p, 0), fourth = td_prefix_evict(p, 0);
    CHECK(
        first == x && second == c[0] && third == y && fourth == a[0],
        "evicted %d, %d, %d, %d: the tail %d, the block %d, the root's tail %d, then the block %d",
        first, second, third, fourth, x, c[0], y, a[0]);
    CHECK(td_prefix_within(p, -1, root3, 3, ids, com, 4) == 0, "an evicted tail was found");
    td_prefix_free(p);
    case_end("prefix/tails", "");
}

int main(void) {
    key_chain();
    match_full_blocks();
    publish_dedup();
    eviction_leaves_lru();
    private_reused_first();
    forced_collisions();
    stats();
    tails();
    return check_failures ? 1 : 0;
}
