/* tok_internal.h: the tokenizer's private types, shared by tokenizer/tok_*.c only.
 *
 * tok_load.c builds a struct tok from tokenizer.json; tok_encode.c runs the encode pipeline
 * (added tokens, normalizer, pre-tokenizer, BPE, post-processor); tok_decode.c turns ids back
 * into text, whole or streamed; tok_util.c holds the hash maps, UTF-8 helpers and the PCRE2
 * wrapper. Nothing outside the tokenizer includes this header.
 */
#ifndef TD_TOK_INTERNAL_H
#define TD_TOK_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer/tokenizer.h"

// ---------------------------------------------------------------- growable buffers and maps

struct tok_buf {
    char *p;
    size_t n, cap;
};

int tok_buf_put(struct tok_buf *b, const void *src, size_t n); /* 0, or -1 out of memory */
void tok_buf_free(struct tok_buf *b);

/* string -> (val, val2), keys copied into the map's own arena */
struct tok_map_slot {
    uint64_t off;  /* key offset in keys */
    uint32_t hash; /* 0 = empty slot */
    uint32_t len;
    int32_t val, val2;
};

struct tok_map {
    struct tok_map_slot *slots; /* [cap], cap a power of two */
    size_t cap, count;
    struct tok_buf keys;
};

uint32_t tok_hash(const void *s, size_t n);
/* the slot of key, or NULL */
const struct tok_map_slot *tok_map_get(const struct tok_map *m, const char *s, size_t n);
/* insert or overwrite; 0, or -1 out of memory */
int tok_map_set(struct tok_map *m, const char *s, size_t n, int32_t val, int32_t val2);
void tok_map_clear(struct tok_map *m);
void tok_map_free(struct tok_map *m);

/* (left id, right id) -> (rank, merged id) */
struct tok_merge_slot {
    uint64_t key; /* UINT64_MAX = empty */
    int32_t rank, id;
};

struct tok_merges {
    struct tok_merge_slot *slots; /* [cap] */
    size_t cap, count;
};

static inline uint64_t tok_merge_key(int32_t a, int32_t b) {
    return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
}
const struct tok_merge_slot *tok_merges_get(const struct tok_merges *m, int32_t a, int32_t b);
int tok_merges_set(struct tok_merges *m, int32_t a, int32_t b, int32_t rank, int32_t id);
void tok_merges_free(struct tok_merges *m);

// ---------------------------------------------------------------- UTF-8 and Unicode

/* decode one code point at s[0..n); returns its byte length (1..4); input is valid UTF-8 */
static inline int tok_utf8_next(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned c = s[0];
    if (c < 0x80 || n < 2) {
        *cp = c;
        return 1;
    }
    if (c < 0xE0) {
        *cp = ((c & 0x1Fu) << 6) | (s[1] & 0x3Fu);
        return 2;
    }
    if (c < 0xF0 || n < 4) {
        *cp = ((c & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu);
        return 3;
    }
    *cp = ((c & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) | (s[3] & 0x3Fu);
    return 4;
}
int tok_utf8_put(char *out, uint32_t cp); /* writes 1..4 bytes */
/* the character at s[0..n): >0 its length, valid; 0 a valid start that needs more bytes; -k
 * invalid, its maximal invalid subpart (one U+FFFD) being k bytes */
int tok_utf8_char(const unsigned char *s, size_t n);
/* Rust's char::is_whitespace (the White_Space property) */
int tok_is_white_space(uint32_t cp);
/* Rust's char::is_numeric (general categories Nd, Nl, No) */
int tok_is_numeric(uint32_t cp);
/* Rust regex's \w (Alphabetic, M, Nd, Pc, Join_Control), close enough via categories */
int tok_is_word_char(uint32_t cp);
/* append the lossy UTF-8 of bytes to out: every maximal invalid subpart becomes U+FFFD, as
 * Rust's String::from_utf8_lossy does */
int tok_utf8_lossy(struct tok_buf *out, const unsigned char *s, size_t n);

// ---------------------------------------------------------------- regexes (PCRE2, UTF + UCP)

struct tok_re {
    pcre2_code *code;
    pcre2_match_data *md;
};

/* Compile an Oniguruma-syntax pattern (what HF tokenizers uses) with PCRE2. \s \S \w \W \h \H are
 * rewritten to Oniguruma's Unicode meanings first. literal: match the text as is. */
int tok_re_compile(struct tok_re *re, const char *pat, size_t n, int literal, char *err,
                   size_t errlen);
/* Leftmost match at or after from in s[0..n): 1 with [*ms, *me), 0 if none, -1 on a matcher
 * error. */
int tok_re_find(struct tok_re *re, const char *s, size_t n, size_t from, size_t *ms, size_t *me);
void tok_re_free(struct tok_re *re);

/* one piece of a split: bytes [off, off + len) of the subject; is_match as HF's Pattern */
struct tok_span {
    size_t off, len;
    int is_match;
};

struct tok_spans {
    struct tok_span *v;
    size_t n, cap;
};
int tok_spans_push(struct tok_spans *s, size_t off, size_t len, int is_match);

/* HF Pattern::find_matches for a regex: spans covering s[0..n), matches and gaps in order */
int tok_re_spans(struct tok_re *re, const char *s, size_t n, struct tok_spans *out);

// ---------------------------------------------------------------- components

enum tok_norm_kind {
    TOK_NORM_NFC,
    TOK_NORM_NFD,
    TOK_NORM_NFKC,
    TOK_NORM_NFKD,
    TOK_NORM_LOWERCASE,
    TOK_NORM_STRIP,   /* a = strip left, b = strip right */
    TOK_NORM_PREPEND, /* str */
    TOK_NORM_APPEND,  /* str */
    TOK_NORM_REPLACE, /* re -> str */
};

struct tok_norm {
    enum tok_norm_kind kind;
    int a, b;
    char *str; /* owned, may be NULL */
    size_t str_len;
    struct tok_re re;
};

enum tok_split_behavior {
    TOK_SPLIT_REMOVED,
    TOK_SPLIT_ISOLATED,
    TOK_SPLIT_MERGED_WITH_PREVIOUS,
    TOK_SPLIT_MERGED_WITH_NEXT,
    TOK_SPLIT_CONTIGUOUS,
};

enum tok_pre_kind {
    TOK_PRE_SPLIT,      /* re, behavior, invert */
    TOK_PRE_DIGITS,     /* a = individual_digits */
    TOK_PRE_WS_SPLIT,   /* WhitespaceSplit */
    TOK_PRE_BYTE_LEVEL, /* a = add_prefix_space, b = use_regex (re = the GPT-2 pattern) */
};

struct tok_pre {
    enum tok_pre_kind kind;
    enum tok_split_behavior behavior;
    int invert, a, b;
    struct tok_re re;
};

enum tok_dec_kind {
    TOK_DEC_BYTE_LEVEL,
    TOK_DEC_BYTE_FALLBACK,
    TOK_DEC_FUSE,
    TOK_DEC_REPLACE, /* re -> str */
    TOK_DEC_STRIP,   /* cp, a = start, b = stop */
};

struct tok_dec {
    enum tok_dec_kind kind;
    int a, b;
    uint32_t cp;
    char *str; /* owned */
    size_t str_len;
    struct tok_re re;
};

struct tok_added {
    int32_t id;
    char *content; /* owned, NUL-terminated */
    size_t len;
    char *pattern; /* what is matched: content, or its normalized form; owned */
    size_t pattern_len;
    int special, lstrip, rstrip, single_word, normalized;
};

/* byte trie over added-token patterns: leftmost-longest matching */
struct tok_trie_node {
    int32_t child, sibling; /* -1 = none */
    int32_t added;          /* index into tok.added when a pattern ends here, else -1 */
    unsigned char byte;
};

struct tok_trie {
    struct tok_trie_node *nodes; /* [n], nodes[0] is the root */
    size_t n, cap;
    unsigned char first[256]; /* bytes that start some pattern */
};

// ---------------------------------------------------------------- the tokenizer

#define TOK_MAX_PRE           16 /* pre-tokenizer steps after flattening Sequences */
#define TOK_CACHE_MAX_WORD    256
#define TOK_CACHE_MAX_ENTRIES (1u << 17)
#define TOK_STRIP_MAX         (1 << 20) /* a Strip decoder's start and stop (real files: 0, 1) */

struct tok {
    /* id -> text used for decoding (added tokens: content or normalized form) */
    int32_t n_vocab;     /* max id + 1 */
    size_t id_cap;       /* allocated length of str_off, str_len, flag */
    uint64_t *str_off;   /* [n_vocab], offset into strs */
    uint32_t *str_len;   /* [n_vocab], UINT32_MAX = no token has this id */
    unsigned char *flag; /* [n_vocab], TOK_FLAG_* */
    struct tok_buf strs;

    /* BPE model */
    struct tok_map vocab; /* model vocab string -> id */
    struct tok_merges merges;
    int32_t unk_id; /* -1 = none */
    int fuse_unk, byte_fallback, ignore_merges;
    char *subword_prefix, *word_suffix; /* owned, may be NULL */
    int32_t byte_fallback_id[256];      /* "<0xXX>" ids, -1 = absent */

    /* byte-level alphabet */
    int byte_level;         /* a ByteLevel pre-tokenizer maps bytes to chars */
    int32_t byte_id[256];   /* vocab id of each byte's char, -1 = absent */
    char byte_utf8[256][3]; /* each byte's char, UTF-8 */
    unsigned char byte_utf8_n[256];
    int16_t char_byte[0x144]; /* code point -> byte, -1 = not in the alphabet */

    /* added tokens */
    struct tok_added *added; /* [n_added] */
    size_t n_added;
    struct tok_trie trie_raw, trie_norm; /* non-normalized / normalized patterns */

    struct tok_norm *norm; /* [n_norm] */
    size_t n_norm;
    int norm_ascii_same; /* every step leaves ASCII text as it is (NFC, NFD, NFKC, NFKD) */
    struct tok_pre pre[TOK_MAX_PRE];
    size_t n_pre;
    int32_t *post_prefix, *post_suffix; /* post-processor ids around a single sequence */
    size_t n_post_prefix, n_post_suffix;
    struct tok_dec *dec; /* [n_dec] */
    size_t n_dec;
    int has_decoder; /* 0: HF joins tokens with " " */

    /* tokenizer_config.json */
    int32_t bos_id, eos_id, pad_id;
    char *chat_template; /* owned, may be NULL */

    /* encode scratch (why encode is not thread-safe) */
    struct tok_map cache;                /* raw pre-token bytes -> (offset in cache_ids, count) */
    struct tok_buf cache_ids;            /* int32 ids */
    struct tok_spans spans[TOK_MAX_PRE]; /* per pre-tokenizer step */
    struct tok_spans span_tmp, span_add[2]; /* split behaviors; added tokens raw / normalized */
    struct tok_buf scratch[TOK_MAX_PRE];    /* ByteLevel's prefixed piece */
    struct tok_buf word;                    /* the mapped word being merged */
    struct tok_buf nbuf, ntmp; /* normalized text, and the normalizer's second buffer */
    void *sym;                 /* merge symbols */
    void *heap;                /* merge queue */
    size_t sym_cap, heap_cap;
};

enum { TOK_FLAG_SPECIAL = 1u << 0, TOK_FLAG_ADDED = 1u << 1 };

/* tok_encode.c: run the normalizer over s[0..n) into out (cleared first) */
int tok_normalize(struct tok *t, const char *s, size_t n, struct tok_buf *out, char *err,
                  size_t errlen);
/* tok_encode.c: HF AddedVocabulary::find_matches over s[0..n): spans covering s, is_match = the
 * matched token's index in tok.added + 1, or 0 for text between matches */
int tok_added_spans(const struct tok *t, const struct tok_trie *trie, const char *s, size_t n,
                    int special_as_text, struct tok_spans *out);
/* tok_encode.c: pre-tokenize s[0..n) (already normalized) and call fn on every final piece */
typedef int (*tok_piece_fn)(void *ctx, const char *s, size_t n);
int tok_pretokenize(struct tok *t, const char *s, size_t n, tok_piece_fn fn, void *ctx);
/* tok_util.c: add pattern s[0..n) for tok.added[added]; the first of equal patterns keeps it */
int tok_trie_add(struct tok_trie *tr, const char *s, size_t n, int32_t added);
void tok_trie_free(struct tok_trie *tr);

#endif
