/* tok_encode.c: text -> ids, HF tokenizers' encode pipeline step by step.
 *
 *   1. added tokens with normalized=false are cut out of the raw text (leftmost-longest);
 *   2. each remaining piece is normalized, then added tokens with normalized=true are cut out;
 *   3. each remaining piece goes through the pre-tokenizer steps (Split, Digits, ByteLevel...),
 *      depth first, so no list of pieces is ever built;
 *   4. each final piece is BPE-merged by rank (a heap, HF's order: lowest rank, then leftmost),
 *      through a cache keyed by the piece's raw bytes;
 *   5. the post-processor's ids go around the whole sequence.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "kernels/err.h"
#include "tokenizer/tok_internal.h"

// ---------------------------------------------------------------- normalizers

static int norm_step(const struct tok_norm *x, const char *s, size_t n, struct tok_buf *out) {
    out->n = 0;
    switch (x->kind) {
    case TOK_NORM_NFC:
    case TOK_NORM_NFD:
    case TOK_NORM_NFKC:
    case TOK_NORM_NFKD: {
        if (n == 0) return tok_buf_put(out, "", 0);
        int opts = UTF8PROC_STABLE;
        opts |= x->kind == TOK_NORM_NFC || x->kind == TOK_NORM_NFKC ? UTF8PROC_COMPOSE
                                                                    : UTF8PROC_DECOMPOSE;
        if (x->kind == TOK_NORM_NFKC || x->kind == TOK_NORM_NFKD) opts |= UTF8PROC_COMPAT;
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t k = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                                          (utf8proc_option_t)opts);
        if (k < 0) return -1;
        int rc = tok_buf_put(out, dst, (size_t)k);
        free(dst);
        return rc;
    }
    case TOK_NORM_LOWERCASE:
        // HF lowercases char by char (Rust's char::to_lowercase), so no final-sigma context;
        // U+0130 is the one code point whose lowercase is two

        for (size_t i = 0; i < n;) {
            uint32_t cp;
            i += (size_t)tok_utf8_next((const unsigned char *)s + i, n - i, &cp);
            char u[8];
            int k;
            if (cp == 0x130) {
                memcpy(u, "i\xCC\x87", 3);
                k = 3;
            } else {
                k = tok_utf8_put(u, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp));
            }
            if (tok_buf_put(out, u, (size_t)k)) return -1;
        }
        return tok_buf_put(out, "", 0);
    case TOK_NORM_STRIP: {
        size_t a = 0, b = n;
        while (x->a && a < b) {
            uint32_t cp;
            int k = tok_utf8_next((const unsigned char *)s + a, b - a, &cp);
            if (!tok_is_white_space(cp)) break;
            a += (size_t)k;
        }
        while (x->b && b > a) {
            size_t p = b - 1;
            while (p > a && ((unsigned char)s[p] & 0xC0) == 0x80)
                p--;
            uint32_t cp;
            tok_utf8_next((const unsigned char *)s + p, b - p, &cp);
            if (!tok_is_white_space(cp)) break;
            b = p;
        }
        return tok_buf_put(out, s + a, b - a);
    }
    case TOK_NORM_PREPEND:
        if (n && tok_buf_put(out, x->str, x->str_len)) return -1;
        return tok_buf_put(out, s, n);
    case TOK_NORM_APPEND:
        if (tok_buf_put(out, s, n)) return -1;
        return n ? tok_buf_put(out, x->str, x->str_len) : 0;
    case TOK_NORM_REPLACE: {
        struct tok_spans sp = {0};
        int rc = tok_re_spans((struct tok_re *)&x->re, s, n, &sp);
        for (size_t i = 0; !rc && i < sp.n; i++)
            rc = sp.v[i].is_match ? tok_buf_put(out, x->str, x->str_len)
                                  : tok_buf_put(out, s + sp.v[i].off, sp.v[i].len);
        free(sp.v);
        return rc ? rc : tok_buf_put(out, "", 0);
    }
    }
    return -1;
}

int tok_normalize(struct tok *t, const char *s, size_t n, struct tok_buf *out, char *err,
                  size_t errlen) {
    // ping-pong between out and t->ntmp so that the last step lands in out
    struct tok_buf *a = out, *b = &t->ntmp;
    if (t->n_norm % 2 == 0) {
        a = &t->ntmp;
        b = out;
    }
    const char *cur = s;
    size_t cn = n;
    for (size_t i = 0; i < t->n_norm; i++) {
        struct tok_buf *dst = i % 2 == 0 ? a : b;
        if (norm_step(&t->norm[i], cur, cn, dst))
            return td_errf(err, errlen, "normalizer step %zu failed (out of memory)", i);
        cur = dst->p;
        cn = dst->n;
    }
    if (t->n_norm == 0) {
        out->n = 0;
        if (tok_buf_put(out, s, n)) return -1;
    }
    return 0;
}

// ---------------------------------------------------------------- added tokens

static uint32_t prev_char(const char *s, size_t end) {
    size_t p = end - 1;
    while (p > 0 && ((unsigned char)s[p] & 0xC0) == 0x80)
        p--;
    uint32_t cp;
    tok_utf8_next((const unsigned char *)s + p, end - p, &cp);
    return cp;
}

int tok_added_spans(const struct tok *t, const struct tok_trie *trie, const char *s, size_t n,
                    int special_as_text, struct tok_spans *out) {
    out->n = 0;
    if (n == 0) return tok_spans_push(out, 0, 0, 0);
    if (!trie->nodes) return tok_spans_push(out, 0, n, 0);
    size_t start_offset = 0, pos = 0;
    const unsigned char *u = (const unsigned char *)s;
    while (pos < n) {
        if (!trie->first[u[pos]]) {
            pos++;
            continue;
        }
        // longest pattern starting here
        int32_t node = 0, best = -1;
        size_t best_end = 0;
        for (size_t i = pos; i < n; i++) {
            int32_t k = trie->nodes[node].child;
            while (k >= 0 && trie->nodes[k].byte != u[i])
                k = trie->nodes[k].sibling;
            if (k < 0) break;
            node = k;
            if (trie->nodes[k].added >= 0) {
                best = trie->nodes[k].added;
                best_end = i + 1;
            }
        }
        if (best < 0) {
            pos++;
            continue;
        }
        size_t start = pos, stop = best_end;
        pos = best_end; // the next match starts after this one, kept or not (HF's iterator)
        const struct tok_added *a = &t->added[best];
        if (special_as_text && a->special) continue;
        if (start < start_offset) continue; // inside the previous token's rstrip
        if (a->single_word) {
            int before = start > 0 && tok_is_word_char(prev_char(s, start));
            uint32_t cp = 0;
            if (stop < n) tok_utf8_next(u + stop, n - stop, &cp);
            int after = stop < n && tok_is_word_char(cp);
            if (before || after) continue;
        }
        if (a->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t p = ns - 1;
                while (p > 0 && (u[p] & 0xC0) == 0x80)
                    p--;
                uint32_t cp;
                tok_utf8_next(u + p, ns - p, &cp);
                if (!tok_is_white_space(cp)) break;
                ns = p;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (a->rstrip) {
            while (stop < n) {
                uint32_t cp;
                int k = tok_utf8_next(u + stop, n - stop, &cp);
                if (!tok_is_white_space(cp)) break;
                stop += (size_t)k;
            }
        }
        if (start_offset < start && tok_spans_push(out, start_offset, start - start_offset, 0))
            return -1;
        if (tok_spans_push(out, start, stop - start, best + 1)) return -1;
        start_offset = stop;
    }
    if (start_offset != n && tok_spans_push(out, start_offset, n - start_offset, 0)) return -1;
    return 0;
}

// ---------------------------------------------------------------- pre-tokenizers

/* spans of single characters that satisfy pred, with the gaps between them */
static int char_spans(const char *s, size_t n, int (*pred)(uint32_t), struct tok_spans *out) {
    out->n = 0;
    if (n == 0) return tok_spans_push(out, 0, 0, 0);
    size_t last = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = tok_utf8_next((const unsigned char *)s + i, n - i, &cp);
        if (pred(cp)) {
            if (last < i && tok_spans_push(out, last, i - last, 0)) return -1;
            if (tok_spans_push(out, i, (size_t)k, 1)) return -1;
            last = i + (size_t)k;
        }
        i += (size_t)k;
    }
    if (last < n && tok_spans_push(out, last, n - last, 0)) return -1;
    return 0;
}

/* HF NormalizedString::split: turn (span, is_match) into (span, should_remove), in sp */
static int apply_behavior(struct tok_spans *sp, enum tok_split_behavior b, struct tok_spans *tmp) {
    size_t w = 0;
    int prev = 0;
    switch (b) {
    case TOK_SPLIT_ISOLATED:
        for (size_t i = 0; i < sp->n; i++)
            sp->v[i].is_match = 0;
        return 0;
    case TOK_SPLIT_REMOVED: return 0;
    case TOK_SPLIT_CONTIGUOUS:
    case TOK_SPLIT_MERGED_WITH_PREVIOUS:
        for (size_t i = 0; i < sp->n; i++) {
            struct tok_span c = sp->v[i];
            int merge = b == TOK_SPLIT_CONTIGUOUS ? c.is_match == prev : c.is_match && !prev;
            prev = c.is_match;
            if (merge && w > 0) {
                sp->v[w - 1].len = c.off + c.len - sp->v[w - 1].off;
            } else {
                sp->v[w++] = (struct tok_span){.off = c.off, .len = c.len, .is_match = 0};
            }
        }
        sp->n = w;
        return 0;
    case TOK_SPLIT_MERGED_WITH_NEXT:
        // fold from the right: a match joins the piece after it
        tmp->n = 0;
        for (size_t i = sp->n; i-- > 0;) {
            struct tok_span c = sp->v[i];
            if (c.is_match && !prev && tmp->n > 0) {
                struct tok_span *l = &tmp->v[tmp->n - 1];
                l->len = l->off + l->len - c.off;
                l->off = c.off;
            } else if (tok_spans_push(tmp, c.off, c.len, 0)) {
                return -1;
            }
            prev = c.is_match;
        }
        for (size_t i = 0; i < tmp->n; i++)
            sp->v[i] = tmp->v[tmp->n - 1 - i];
        sp->n = tmp->n;
        return 0;
    }
    return -1;
}

static int pre_run(struct tok *t, size_t step, const char *s, size_t n, tok_piece_fn fn,
                   void *ctx) {
    if (n == 0) return 0; // HF drops empty splits
    if (step == t->n_pre) return fn(ctx, s, n);
    struct tok_pre *p = &t->pre[step];
    struct tok_spans *sp = &t->spans[step];
    switch (p->kind) {
    case TOK_PRE_SPLIT:
        if (tok_re_spans(&p->re, s, n, sp)) return -1;
        if (p->invert)
            for (size_t i = 0; i < sp->n; i++)
                sp->v[i].is_match = !sp->v[i].is_match;
        if (apply_behavior(sp, p->behavior, &t->span_tmp)) return -1;
        break;
    case TOK_PRE_DIGITS:
        if (char_spans(s, n, tok_is_numeric, sp)) return -1;
        if (apply_behavior(sp, p->a ? TOK_SPLIT_ISOLATED : TOK_SPLIT_CONTIGUOUS, &t->span_tmp))
            return -1;
        break;
    case TOK_PRE_WS_SPLIT:
        if (char_spans(s, n, tok_is_white_space, sp)) return -1;
        break; // Removed: the matches carry should_remove = 1 already
    case TOK_PRE_BYTE_LEVEL:
        if (p->a && s[0] != ' ') {
            struct tok_buf *b = &t->scratch[step];
            b->n = 0;
            if (tok_buf_put(b, " ", 1) || tok_buf_put(b, s, n)) return -1;
            s = b->p;
            n = b->n;
        }
        if (!p->b) return pre_run(t, step + 1, s, n, fn, ctx);
        if (tok_re_spans(&p->re, s, n, sp)) return -1;
        for (size_t i = 0; i < sp->n; i++)
            sp->v[i].is_match = 0;
        break;
    }
    for (size_t i = 0; i < sp->n; i++) {
        struct tok_span c = sp->v[i]; // copy: deeper steps use other span lists, not this one
        if (c.is_match) continue;
        if (pre_run(t, step + 1, s + c.off, c.len, fn, ctx)) return -1;
    }
    return 0;
}

int tok_pretokenize(struct tok *t, const char *s, size_t n, tok_piece_fn fn, void *ctx) {
    return pre_run(t, 0, s, n, fn, ctx);
}

// ---------------------------------------------------------------- BPE

struct sym {
    int32_t id, prev, next, alive;
};

struct merge {
    int32_t rank, pos, id;
};

static inline int merge_less(struct merge a, struct merge b) {
    return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos;
}

static void heap_push(struct merge *h, size_t *n, struct merge m) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!merge_less(m, h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = m;
}

static struct merge heap_pop(struct merge *h, size_t *n) {
    struct merge top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && merge_less(h[c + 1], h[c])) c++;
        if (!merge_less(h[c], last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

static int reserve(void **p, size_t *cap, size_t n, size_t size) {
    if (n <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < n)
        c *= 2;
    void *q = realloc(*p, c * size);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

struct enc {
    struct tok *t;
    struct tok_ids *out;
    size_t n_sym;
};

static int add_sym(struct enc *e, int32_t id) {
    struct tok *t = e->t;
    if (reserve(&t->sym, &t->sym_cap, e->n_sym + 1, sizeof(struct sym))) return -1;
    struct sym *v = t->sym;
    int32_t i = (int32_t)e->n_sym++;
    v[i] = (struct sym){.id = id, .prev = i - 1, .next = -1, .alive = 1};
    if (i > 0) v[i - 1].next = i;
    return 0;
}

/* HF BPE::merge_word's per-character lookup: the char (with subword prefix unless first, with
 * word suffix if last), else its bytes as <0xXX> tokens, else unk (fused or not), else dropped */
static int initial_symbols(struct enc *e, const char *w, size_t n) {
    struct tok *t = e->t;
    struct tok_buf key = {0};
    int32_t unk = -1, rc = 0;
    for (size_t i = 0; i < n && !rc;) {
        uint32_t cp;
        int k = tok_utf8_next((const unsigned char *)w + i, n - i, &cp);
        int first = i == 0, last = i + (size_t)k == n;
        const char *c = w + i;
        size_t cn = (size_t)k;
        if ((!first && t->subword_prefix) || (last && t->word_suffix)) {
            key.n = 0;
            if (!first && t->subword_prefix)
                rc |= tok_buf_put(&key, t->subword_prefix, strlen(t->subword_prefix));
            rc |= tok_buf_put(&key, c, cn);
            if (last && t->word_suffix)
                rc |= tok_buf_put(&key, t->word_suffix, strlen(t->word_suffix));
            c = key.p;
            cn = key.n;
        }
        i += (size_t)k;
        const struct tok_map_slot *hit = rc ? NULL : tok_map_get(&t->vocab, c, cn);
        if (hit) {
            if (unk >= 0) rc |= add_sym(e, unk);
            unk = -1;
            rc |= add_sym(e, hit->val);
            continue;
        }
        if (t->byte_fallback) {
            size_t j = 0;
            while (j < cn && t->byte_fallback_id[(unsigned char)c[j]] >= 0)
                j++;
            if (j == cn) {
                for (j = 0; j < cn; j++)
                    rc |= add_sym(e, t->byte_fallback_id[(unsigned char)c[j]]);
                continue; // HF leaves a pending unk pending here
            }
        }
        if (t->unk_id >= 0) {
            if (unk >= 0 && !t->fuse_unk) rc |= add_sym(e, unk);
            unk = t->unk_id;
        }
    }
    if (!rc && unk >= 0) rc |= add_sym(e, unk);
    tok_buf_free(&key);
    return rc ? -1 : 0;
}

static int merge_all(struct enc *e) {
    struct tok *t = e->t;
    size_t n = e->n_sym, hn = 0;
    if (n < 2) return 0;
    if (reserve(&t->heap, &t->heap_cap, 2 * n, sizeof(struct merge))) return -1;
    struct sym *v = t->sym;
    struct merge *h = t->heap;
    for (size_t i = 0; i + 1 < n; i++) {
        const struct tok_merge_slot *m = tok_merges_get(&t->merges, v[i].id, v[i + 1].id);
        if (m) heap_push(h, &hn, (struct merge){.rank = m->rank, .pos = (int32_t)i, .id = m->id});
    }
    while (hn) {
        struct merge top = heap_pop(h, &hn);
        struct sym *a = &v[top.pos];
        if (!a->alive || a->next < 0) continue;
        struct sym *b = &v[a->next];
        const struct tok_merge_slot *m = tok_merges_get(&t->merges, a->id, b->id);
        if (!m || m->id != top.id) continue; // stale entry
        a->id = top.id;
        b->alive = 0;
        a->next = b->next;
        if (b->next >= 0) v[b->next].prev = top.pos;
        // at most two new pairs per merge, and n - 1 merges: the heap never exceeds 2n
        if (a->prev >= 0) {
            m = tok_merges_get(&t->merges, v[a->prev].id, a->id);
            if (m) heap_push(h, &hn, (struct merge){.rank = m->rank, .pos = a->prev, .id = m->id});
        }
        if (a->next >= 0) {
            m = tok_merges_get(&t->merges, a->id, v[a->next].id);
            if (m) heap_push(h, &hn, (struct merge){.rank = m->rank, .pos = top.pos, .id = m->id});
        }
    }
    return 0;
}

static int bpe_piece(void *ctx, const char *s, size_t n) {
    struct enc *e = ctx;
    struct tok *t = e->t;
    int cacheable = n <= TOK_CACHE_MAX_WORD;
    if (cacheable) {
        const struct tok_map_slot *hit = tok_map_get(&t->cache, s, n);
        if (hit) {
            // indexed only when the word has ids: an empty one may leave cache_ids.p NULL
            const int32_t *ids = (const int32_t *)(void *)t->cache_ids.p;
            for (int32_t i = 0; i < hit->val2; i++)
                if (tok_ids_push(e->out, ids[hit->val + i])) return -1;
            return 0;
        }
    }
    // the word as the model sees it: bytes mapped to the byte-level alphabet
    const char *w = s;
    size_t wn = n;
    if (t->byte_level) {
        t->word.n = 0;
        for (size_t i = 0; i < n; i++) {
            unsigned char b = (unsigned char)s[i];
            if (tok_buf_put(&t->word, t->byte_utf8[b], t->byte_utf8_n[b])) return -1;
        }
        w = t->word.p;
        wn = t->word.n;
    }
    e->n_sym = 0;
    const struct tok_map_slot *whole = t->ignore_merges ? tok_map_get(&t->vocab, w, wn) : NULL;
    if (whole) {
        if (add_sym(e, whole->val)) return -1;
    } else if (t->byte_level && !t->subword_prefix && !t->word_suffix) {
        int fast = 1;
        for (size_t i = 0; i < n; i++)
            fast &= t->byte_id[(unsigned char)s[i]] >= 0;
        if (fast) {
            for (size_t i = 0; i < n; i++)
                if (add_sym(e, t->byte_id[(unsigned char)s[i]])) return -1;
        } else if (initial_symbols(e, w, wn)) {
            return -1;
        }
        if (merge_all(e)) return -1;
    } else {
        if (initial_symbols(e, w, wn) || merge_all(e)) return -1;
    }
    struct sym *v = t->sym;
    size_t first = e->out->n;
    for (size_t i = 0; i < e->n_sym; i++)
        if (v[i].alive && tok_ids_push(e->out, v[i].id)) return -1;
    if (cacheable) {
        size_t k = e->out->n - first;
        if (t->cache.count >= TOK_CACHE_MAX_ENTRIES) { // start over rather than evict
            tok_map_clear(&t->cache);
            t->cache_ids.n = 0;
        }
        size_t off = t->cache_ids.n / sizeof(int32_t);
        // a word that encodes to nothing copies nothing: out->ids may be NULL, and NULL + 0 is
        // undefined
        if ((k && tok_buf_put(&t->cache_ids, e->out->ids + first, k * sizeof(int32_t))) ||
            tok_map_set(&t->cache, s, n, (int32_t)off, (int32_t)k))
            return -1;
        // keep the id area 4-byte aligned: tok_buf_put NUL-terminates past n, never moves n
    }
    return 0;
}

// ---------------------------------------------------------------- encode

int tok_ids_push(struct tok_ids *v, int32_t id) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 256;
        int32_t *p = realloc(v->ids, cap * sizeof *p);
        if (!p) return -1;
        v->ids = p;
        v->cap = cap;
    }
    v->ids[v->n++] = id;
    return 0;
}

void tok_ids_free(struct tok_ids *v) {
    free(v->ids);
    memset(v, 0, sizeof *v);
}

static int encode_normalized(struct enc *e, const char *s, size_t n, int special_as_text) {
    struct tok *t = e->t;
    struct tok_spans *sp = &t->span_add[1];
    if (tok_added_spans(t, &t->trie_norm, s, n, special_as_text, sp)) return -1;
    for (size_t i = 0; i < sp->n; i++) {
        struct tok_span c = sp->v[i];
        if (c.is_match) {
            if (tok_ids_push(e->out, t->added[c.is_match - 1].id)) return -1;
        } else if (tok_pretokenize(t, s + c.off, c.len, bpe_piece, e)) {
            return -1;
        }
    }
    return 0;
}

static int is_ascii(const char *s, size_t n) {
    size_t i = 0;
    uint64_t acc = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        acc |= w;
    }
    for (; i < n; i++)
        acc |= (unsigned char)s[i];
    return !(acc & 0x8080808080808080ull);
}

int tok_encode(struct tok *t, const char *text, size_t len, unsigned flags, struct tok_ids *out,
               char *err, size_t errlen) {
    size_t ok = tok_utf8_valid_prefix(text, len);
    if (ok != len)
        return td_errf(err, errlen, "input is not valid UTF-8: byte 0x%02x at offset %zu",
                       (unsigned char)text[ok], ok);
    size_t n0 = out->n;
    struct enc e = {.t = t, .out = out, .n_sym = 0};
    int sat = (flags & TOK_ENCODE_SPECIAL_AS_TEXT) != 0, rc = 0;
    if (flags & TOK_ENCODE_ADD_SPECIAL)
        for (size_t i = 0; i < t->n_post_prefix && !rc; i++)
            rc = tok_ids_push(out, t->post_prefix[i]);
    struct tok_spans *sp = &t->span_add[0];
    if (!rc) rc = tok_added_spans(t, &t->trie_raw, text, len, sat, sp);
    for (size_t i = 0; !rc && i < sp->n; i++) {
        struct tok_span c = sp->v[i];
        if (c.is_match) {
            rc = tok_ids_push(out, t->added[c.is_match - 1].id);
        } else if (c.len) {
            if (t->n_norm && !(t->norm_ascii_same && is_ascii(text + c.off, c.len))) {
                if (tok_normalize(t, text + c.off, c.len, &t->nbuf, err, errlen)) {
                    out->n = n0;
                    return -1;
                }
                rc = encode_normalized(&e, t->nbuf.p, t->nbuf.n, sat);
            } else {
                rc = encode_normalized(&e, text + c.off, c.len, sat);
            }
        }
    }
    if (flags & TOK_ENCODE_ADD_SPECIAL)
        for (size_t i = 0; i < t->n_post_suffix && !rc; i++)
            rc = tok_ids_push(out, t->post_suffix[i]);
    if (rc) {
        out->n = n0;
        return td_errf(err, errlen, "encoding failed: out of memory or a regex match error");
    }
    return 0;
}
