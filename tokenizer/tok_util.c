/* tok_util.c: the tokenizer's hash maps, UTF-8 and Unicode helpers and PCRE2 wrapper.
 *
 * Regex patterns in tokenizer.json are written for Oniguruma (HF tokenizers' engine). PCRE2 with
 * UTF + UCP agrees on everything those files use except the shorthand classes, which
 * tok_re_compile rewrites to Oniguruma's Unicode definitions before compiling:
 *   \s  White_Space (PCRE2 adds U+180E)        \w  L, M, Nd, Pc (PCRE2 10.42: L, N, _)
 *   \h  hex digit (PCRE2: horizontal space)
 *   \uHHHH  a code point (PCRE2 refuses it: \x{HHHH})
 * ^ and $ are line anchors in Oniguruma's default syntax, hence PCRE2_MULTILINE.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "kernels/err.h"
#include "tokenizer/tok_internal.h"

// ---------------------------------------------------------------- buffers

int tok_buf_put(struct tok_buf *b, const void *src, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return -1;
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
    b->p[b->n] = 0; // always NUL-terminated, for messages and PCRE2-free callers
    return 0;
}

void tok_buf_free(struct tok_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

int tok_spans_push(struct tok_spans *s, size_t off, size_t len, int is_match) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        struct tok_span *v = realloc(s->v, cap * sizeof *v);
        if (!v) return -1;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = (struct tok_span){.off = off, .len = len, .is_match = is_match};
    return 0;
}

// ---------------------------------------------------------------- string map

uint32_t tok_hash(const void *s, size_t n) {
    // 8 bytes at a time, multiply-xorshift mixing; 0 is kept free to mean "empty slot"
    const unsigned char *p = s;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ w) * 0x94D049BB133111EBull;
    h ^= h >> 29;
    uint32_t r = (uint32_t)(h ^ (h >> 32));
    return r ? r : 1;
}

const struct tok_map_slot *tok_map_get(const struct tok_map *m, const char *s, size_t n) {
    if (!m->cap) return NULL;
    uint32_t h = tok_hash(s, n);
    for (size_t i = h & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        const struct tok_map_slot *e = &m->slots[i];
        if (!e->hash) return NULL;
        if (e->hash == h && e->len == n && !memcmp(m->keys.p + e->off, s, n)) return e;
    }
}

static int map_grow(struct tok_map *m) {
    size_t cap = m->cap ? 2 * m->cap : 1024;
    struct tok_map_slot *slots = calloc(cap, sizeof *slots);
    if (!slots) return -1;
    for (size_t j = 0; j < m->cap; j++) {
        struct tok_map_slot *e = &m->slots[j];
        if (!e->hash) continue;
        size_t i = e->hash & (cap - 1);
        while (slots[i].hash)
            i = (i + 1) & (cap - 1);
        slots[i] = *e;
    }
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return 0;
}

int tok_map_set(struct tok_map *m, const char *s, size_t n, int32_t val, int32_t val2) {
    if ((m->count + 1) * 2 > m->cap && map_grow(m)) return -1;
    uint32_t h = tok_hash(s, n);
    size_t i = h & (m->cap - 1);
    for (;; i = (i + 1) & (m->cap - 1)) {
        struct tok_map_slot *e = &m->slots[i];
        if (!e->hash) break;
        if (e->hash == h && e->len == n && !memcmp(m->keys.p + e->off, s, n)) {
            e->val = val;
            e->val2 = val2;
            return 0;
        }
    }
    uint64_t off = m->keys.n;
    if (tok_buf_put(&m->keys, s, n)) return -1;
    m->slots[i] =
        (struct tok_map_slot){.off = off, .hash = h, .len = (uint32_t)n, .val = val, .val2 = val2};
    m->count++;
    return 0;
}

void tok_map_clear(struct tok_map *m) {
    if (m->slots) memset(m->slots, 0, m->cap * sizeof *m->slots);
    m->count = 0;
    m->keys.n = 0;
}

void tok_map_free(struct tok_map *m) {
    free(m->slots);
    tok_buf_free(&m->keys);
    memset(m, 0, sizeof *m);
}

// ---------------------------------------------------------------- merge map

static inline size_t merge_slot(uint64_t key, size_t cap) {
    key ^= key >> 29;
    key *= 0xbf58476d1ce4e5b9ull;
    key ^= key >> 32;
    return (size_t)key & (cap - 1);
}

const struct tok_merge_slot *tok_merges_get(const struct tok_merges *m, int32_t a, int32_t b) {
    if (!m->cap) return NULL;
    uint64_t key = tok_merge_key(a, b);
    for (size_t i = merge_slot(key, m->cap);; i = (i + 1) & (m->cap - 1)) {
        const struct tok_merge_slot *e = &m->slots[i];
        if (e->key == key) return e;
        if (e->key == UINT64_MAX) return NULL;
    }
}

int tok_merges_set(struct tok_merges *m, int32_t a, int32_t b, int32_t rank, int32_t id) {
    if ((m->count + 1) * 2 > m->cap) {
        size_t cap = m->cap ? 2 * m->cap : 1024;
        struct tok_merge_slot *slots = malloc(cap * sizeof *slots);
        if (!slots) return -1;
        for (size_t i = 0; i < cap; i++)
            slots[i].key = UINT64_MAX;
        for (size_t j = 0; j < m->cap; j++) {
            if (m->slots[j].key == UINT64_MAX) continue;
            size_t i = merge_slot(m->slots[j].key, cap);
            while (slots[i].key != UINT64_MAX)
                i = (i + 1) & (cap - 1);
            slots[i] = m->slots[j];
        }
        free(m->slots);
        m->slots = slots;
        m->cap = cap;
    }
    uint64_t key = tok_merge_key(a, b);
    size_t i = merge_slot(key, m->cap);
    while (m->slots[i].key != UINT64_MAX && m->slots[i].key != key)
        i = (i + 1) & (m->cap - 1);
    if (m->slots[i].key == UINT64_MAX) m->count++;
    // a repeated pair: the later rank wins
    m->slots[i] = (struct tok_merge_slot){.key = key, .rank = rank, .id = id};
    return 0;
}

void tok_merges_free(struct tok_merges *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

// ---------------------------------------------------------------- UTF-8 and Unicode

int tok_utf8_put(char *out, uint32_t cp) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

int tok_utf8_char(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    int need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        need = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else
        return -1;
    for (int i = 1; i <= need; i++) {
        if ((size_t)i >= n) return 0;
        unsigned b = s[i];
        if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return -i;
    }
    return need + 1;
}

size_t tok_utf8_valid_prefix(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        int k = tok_utf8_char(p + i, n - i);
        if (k <= 0) return i;
        i += (size_t)k;
    }
    return n;
}

int tok_utf8_lossy(struct tok_buf *out, const unsigned char *s, size_t n) {
    static const char repl[] = "\xEF\xBF\xBD";
    if (n == 0) return tok_buf_put(out, "", 0);
    size_t i = 0, run = 0; // run: start of the pending valid bytes
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int k = tok_utf8_char(s + i, n - i);
        if (k > 0) {
            i += (size_t)k;
            continue;
        }
        if (tok_buf_put(out, s + run, i - run) || tok_buf_put(out, repl, 3)) return -1;
        i += k == 0 ? n - i : (size_t)-k; // truncated at the end: the rest is one subpart
        run = i;
    }
    return tok_buf_put(out, s + run, n - run);
}

int tok_is_white_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

int tok_is_numeric(uint32_t cp) {
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

int tok_is_word_char(uint32_t cp) {
    if (cp < 0x80)
        return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
               cp == '_';
    if (cp == 0x200C || cp == 0x200D) return 1; // Join_Control
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC: return 1;
    default: return 0;
    }
}

// ---------------------------------------------------------------- regexes

/* Oniguruma's Unicode \s and \w, as class members (no brackets) */
#define WS_MEMBERS                                                                                 \
    "\\t-\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"                         \
    "\\x{202F}\\x{205F}\\x{3000}"
#define WORD_MEMBERS "\\p{L}\\p{M}\\p{Nd}\\p{Pc}"
#define HEX_MEMBERS  "0-9a-fA-F"

static int hex4(const char *p) {
    for (int k = 0; k < 4; k++)
        if (!p[k] || !strchr("0123456789abcdefABCDEF", p[k])) return 0;
    return 1;
}

/* rewrite the shorthand classes and \uHHHH escapes; returns a malloc'd pattern or NULL */
static char *re_translate(const char *pat, size_t n, size_t *out_n) {
    struct tok_buf b = {0};
    int in_class = 0, fail = 0;
    for (size_t i = 0; i < n && !fail; i++) {
        char c = pat[i];
        if (c == '\\' && i + 5 < n && pat[i + 1] == 'u' && hex4(pat + i + 2)) {
            // Oniguruma's \uHHHH (a code point) is PCRE2's \x{HHHH}
            fail |= tok_buf_put(&b, "\\x{", 3) || tok_buf_put(&b, pat + i + 2, 4) ||
                    tok_buf_put(&b, "}", 1);
            i += 5;
            continue;
        }
        if (c == '\\' && i + 1 < n) {
            char e = pat[i + 1];
            const char *members = e == 's' || e == 'S'   ? WS_MEMBERS
                                  : e == 'w' || e == 'W' ? WORD_MEMBERS
                                  : e == 'h' || e == 'H' ? HEX_MEMBERS
                                                         : NULL;
            int negated = e == 'S' || e == 'W' || e == 'H';
            if (members && !(in_class && negated)) {
                if (!in_class) fail |= tok_buf_put(&b, negated ? "[^" : "[", negated ? 2 : 1);
                fail |= tok_buf_put(&b, members, strlen(members));
                if (!in_class) fail |= tok_buf_put(&b, "]", 1);
            } else {
                fail |= tok_buf_put(&b, pat + i, 2); // any other escape, verbatim
            }
            i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = 1;
            fail |= tok_buf_put(&b, &c, 1);
            // a ']' right after '[' or '[^' is a literal member
            if (i + 1 < n && pat[i + 1] == '^') fail |= tok_buf_put(&b, pat + ++i, 1);
            if (i + 1 < n && pat[i + 1] == ']') fail |= tok_buf_put(&b, pat + ++i, 1);
            continue;
        }
        if (in_class && c == '[' && i + 1 < n && pat[i + 1] == ':') {
            const char *end = strstr(pat + i, ":]"); // POSIX class, copied whole
            size_t k = end && (size_t)(end - pat) < n ? (size_t)(end - pat) + 2 - i : 1;
            fail |= tok_buf_put(&b, pat + i, k);
            i += k - 1;
            continue;
        }
        if (in_class && c == ']') in_class = 0;
        fail |= tok_buf_put(&b, &c, 1);
    }
    if (fail || tok_buf_put(&b, "", 0)) {
        tok_buf_free(&b);
        return NULL;
    }
    *out_n = b.n;
    return b.p;
}

int tok_re_compile(struct tok_re *re, const char *pat, size_t n, int literal, char *err,
                   size_t errlen) {
    memset(re, 0, sizeof *re);
    size_t tn = n;
    char *tp = literal ? NULL : re_translate(pat, n, &tn);
    if (!literal && !tp) return td_errf(err, errlen, "out of memory compiling a regex");
    int code;
    PCRE2_SIZE at;
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP | PCRE2_MULTILINE);
    re->code = pcre2_compile((PCRE2_SPTR)(literal ? pat : tp), tn, opts, &code, &at, NULL);
    free(tp);
    if (!re->code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        return td_errf(err, errlen, "regex /%.*s/ does not compile with PCRE2: %s (at offset %zu)",
                       (int)(n > 200 ? 200 : n), pat, (const char *)msg, (size_t)at);
    }
    pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE); // falls back to the interpreter on failure
    re->md = pcre2_match_data_create_from_pattern(re->code, NULL);
    if (!re->md) {
        pcre2_code_free(re->code);
        re->code = NULL;
        return td_errf(err, errlen, "out of memory compiling a regex");
    }
    return 0;
}

int tok_re_find(struct tok_re *re, const char *s, size_t n, size_t from, size_t *ms, size_t *me) {
    int rc = pcre2_match(re->code, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, re->md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) return -1;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(re->md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

int tok_re_spans(struct tok_re *re, const char *s, size_t n, struct tok_spans *out) {
    out->n = 0;
    if (n == 0) return tok_spans_push(out, 0, 0, 0);
    size_t prev = 0, from = 0, last_end = SIZE_MAX;
    while (from <= n) {
        size_t ms, me;
        int f = tok_re_find(re, s, n, from, &ms, &me);
        if (f < 0) return -1;
        if (!f) break;
        if (ms == me && me == last_end) {
            // Oniguruma's find_iter skips an empty match right after the previous one
            if (from >= n) break;
            uint32_t cp;
            from += (size_t)tok_utf8_next((const unsigned char *)s + from, n - from, &cp);
            continue;
        }
        if (prev != ms && tok_spans_push(out, prev, ms - prev, 0)) return -1;
        if (tok_spans_push(out, ms, me - ms, 1)) return -1;
        prev = me;
        last_end = me;
        if (me == ms) {
            if (me >= n) break;
            uint32_t cp;
            from = me + (size_t)tok_utf8_next((const unsigned char *)s + me, n - me, &cp);
        } else {
            from = me;
        }
    }
    if (prev != n && tok_spans_push(out, prev, n - prev, 0)) return -1;
    return 0;
}

void tok_re_free(struct tok_re *re) {
    if (re->md) pcre2_match_data_free(re->md);
    if (re->code) pcre2_code_free(re->code);
    memset(re, 0, sizeof *re);
}

// ---------------------------------------------------------------- added-token trie

int tok_trie_add(struct tok_trie *tr, const char *s, size_t n, int32_t added) {
    if (!tr->nodes) {
        tr->cap = 64;
        tr->nodes = malloc(tr->cap * sizeof *tr->nodes);
        if (!tr->nodes) return -1;
        tr->nodes[0] = (struct tok_trie_node){.child = -1, .sibling = -1, .added = -1, .byte = 0};
        tr->n = 1;
    }
    if (n == 0) return 0; // HF ignores empty added tokens
    tr->first[(unsigned char)s[0]] = 1;
    int32_t cur = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        int32_t k = tr->nodes[cur].child;
        while (k >= 0 && tr->nodes[k].byte != c)
            k = tr->nodes[k].sibling;
        if (k < 0) {
            if (tr->n == tr->cap) {
                struct tok_trie_node *v = realloc(tr->nodes, 2 * tr->cap * sizeof *v);
                if (!v) return -1;
                tr->nodes = v;
                tr->cap *= 2;
            }
            k = (int32_t)tr->n++;
            tr->nodes[k] = (struct tok_trie_node){
                .child = -1, .sibling = tr->nodes[cur].child, .added = -1, .byte = c};
            tr->nodes[cur].child = k;
        }
        cur = k;
    }
    if (tr->nodes[cur].added < 0) tr->nodes[cur].added = added; // first of equal patterns wins
    return 0;
}

void tok_trie_free(struct tok_trie *tr) {
    free(tr->nodes);
    memset(tr, 0, sizeof *tr);
}
