/* tok_decode.c: ids -> text, whole (HF Tokenizer.decode) or streamed token by token.
 *
 * Whole decode follows HF literally: the decoder steps run one after the other over the list of
 * token strings (ByteLevel turns the list into one lossy UTF-8 string, Fuse joins, Replace and
 * Strip work per string, ByteFallback per run of <0xXX> tokens), and the result is the join.
 *
 * Streaming works on bytes: each token's bytes come from the per-token steps, and a small UTF-8
 * assembler emits only whole characters, holding back a character's first bytes until the
 * token that completes it arrives. Invalid bytes become U+FFFD by the same maximal-subpart rule
 * as Rust's from_utf8_lossy, so for a byte-level decoder the streamed text is identical to the
 * whole decode. (Strip after Fuse strips the start of the stream; its stop count, which would
 * need the end, is not applied while streaming.)
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/err.h"
#include "tokenizer/tok_internal.h"

static const char REPL[] = "\xEF\xBF\xBD"; /* U+FFFD */

/* a list of strings: data in buf, [off, off + len) each */
struct slist {
    struct tok_buf buf;
    struct tok_span *v;
    size_t n, cap;
};

static int sl_push(struct slist *l, const char *s, size_t n) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        struct tok_span *v = realloc(l->v, cap * sizeof *v);
        if (!v) return -1;
        l->v = v;
        l->cap = cap;
    }
    size_t off = l->buf.n;
    if (tok_buf_put(&l->buf, s, n)) return -1;
    l->v[l->n++] = (struct tok_span){.off = off, .len = n, .is_match = 0};
    return 0;
}

/* append to the last string (push an empty one first if there is none) */
static int sl_append(struct slist *l, const char *s, size_t n) {
    if (!l->n && sl_push(l, "", 0)) return -1;
    if (tok_buf_put(&l->buf, s, n)) return -1; // the last string ends at buf.n
    l->v[l->n - 1].len += n;
    return 0;
}

static void sl_reset(struct slist *l) {
    l->buf.n = 0;
    l->n = 0;
}

static void sl_free(struct slist *l) {
    tok_buf_free(&l->buf);
    free(l->v);
}

/* ByteLevel for one token: the alphabet's bytes if every char is in it, else the raw bytes */
static int byte_level_token(const struct tok *t, const char *s, size_t n, struct tok_buf *out) {
    size_t start = out->n;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = tok_utf8_next((const unsigned char *)s + i, n - i, &cp);
        if (cp >= 0x144 || t->char_byte[cp] < 0) {
            out->n = start;
            return tok_buf_put(out, s, n);
        }
        char b = (char)t->char_byte[cp];
        if (tok_buf_put(out, &b, 1)) return -1;
        i += (size_t)k;
    }
    return 0;
}

static int replace_into(const struct tok_dec *d, const char *s, size_t n, struct tok_buf *out) {
    if (tok_utf8_valid_prefix(s, n) != n) return tok_buf_put(out, s, n); // not text: leave it
    struct tok_spans sp = {0};
    int rc = tok_re_spans((struct tok_re *)&d->re, s, n, &sp);
    for (size_t i = 0; !rc && i < sp.n; i++)
        rc = sp.v[i].is_match ? tok_buf_put(out, d->str, d->str_len)
                              : tok_buf_put(out, s + sp.v[i].off, sp.v[i].len);
    free(sp.v);
    return rc;
}

/* Strip: up to a leading and b trailing copies of cp */
static void strip_bounds(const struct tok_dec *d, const char *s, size_t n, size_t *a, size_t *b) {
    size_t i = 0, e = n;
    for (int k = 0; k < d->a && i < n; k++) {
        uint32_t cp;
        int len = tok_utf8_next((const unsigned char *)s + i, n - i, &cp);
        if (cp != d->cp) break;
        i += (size_t)len;
    }
    for (int k = 0; k < d->b && e > i; k++) {
        size_t p = e - 1;
        while (p > i && ((unsigned char)s[p] & 0xC0) == 0x80)
            p--;
        uint32_t cp;
        tok_utf8_next((const unsigned char *)s + p, e - p, &cp);
        if (cp != d->cp) break;
        e = p;
    }
    *a = i;
    *b = e;
}

static int is_byte_token(const char *s, size_t n, unsigned char *byte) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return 0;
    unsigned v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        unsigned d = c >= '0' && c <= '9'   ? (unsigned)(c - '0')
                     : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                     : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10)
                                            : 16u;
        if (d > 15) return 0;
        v = v * 16 + d;
    }
    *byte = (unsigned char)v;
    return 1;
}

static int check_id(const struct tok *t, int32_t id, char *err, size_t errlen) {
    if (id < 0 || id >= t->n_vocab || t->str_len[id] == UINT32_MAX)
        return td_errf(err, errlen, "token id %d names no token (vocab holds ids 0..%d)", id,
                       t->n_vocab - 1);
    return 0;
}

// ---------------------------------------------------------------- whole decode

static int dec_step(const struct tok *t, const struct tok_dec *d, struct slist *in,
                    struct slist *out) {
    sl_reset(out);
    struct tok_buf tmp = {0};
    int rc = 0;
    switch (d->kind) {
    case TOK_DEC_BYTE_LEVEL:
        for (size_t i = 0; i < in->n && !rc; i++)
            rc = byte_level_token(t, in->buf.p + in->v[i].off, in->v[i].len, &tmp);
        if (!rc) rc = sl_push(out, "", 0);
        if (!rc) {
            out->buf.n = 0;
            rc = tok_utf8_lossy(&out->buf, (const unsigned char *)tmp.p, tmp.n);
            out->v[0].len = out->buf.n;
        }
        break;
    case TOK_DEC_FUSE:
        rc = sl_push(out, in->buf.p, 0);
        for (size_t i = 0; i < in->n && !rc; i++)
            rc = sl_append(out, in->buf.p + in->v[i].off, in->v[i].len);
        break;
    case TOK_DEC_BYTE_FALLBACK:
        for (size_t i = 0; i <= in->n && !rc; i++) {
            unsigned char byte;
            int is_b = i < in->n && is_byte_token(in->buf.p + in->v[i].off, in->v[i].len, &byte);
            if (is_b) {
                rc = tok_buf_put(&tmp, &byte, 1);
                continue;
            }
            if (tmp.n) { // flush the run: valid UTF-8 as one string, else one U+FFFD per byte
                if (tok_utf8_valid_prefix(tmp.p, tmp.n) == tmp.n)
                    rc = sl_push(out, tmp.p, tmp.n);
                else
                    for (size_t k = 0; k < tmp.n && !rc; k++)
                        rc = sl_push(out, REPL, 3);
                tmp.n = 0;
            }
            if (i < in->n && !rc) rc = sl_push(out, in->buf.p + in->v[i].off, in->v[i].len);
        }
        break;
    case TOK_DEC_REPLACE:
        for (size_t i = 0; i < in->n && !rc; i++) {
            tmp.n = 0;
            rc = replace_into(d, in->buf.p + in->v[i].off, in->v[i].len, &tmp);
            if (!rc) rc = sl_push(out, tmp.p ? tmp.p : "", tmp.n);
        }
        break;
    case TOK_DEC_STRIP:
        for (size_t i = 0; i < in->n && !rc; i++) {
            size_t a, b;
            const char *s = in->buf.p + in->v[i].off;
            strip_bounds(d, s, in->v[i].len, &a, &b);
            rc = sl_push(out, s + a, b - a);
        }
        break;
    }
    tok_buf_free(&tmp);
    return rc;
}

int tok_decode(const struct tok *t, const int32_t *ids, size_t n, unsigned flags, char **text,
               size_t *len, char *err, size_t errlen) {
    *text = NULL;
    *len = 0;
    struct slist a = {0}, b = {0};
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        if (check_id(t, ids[i], err, errlen)) {
            sl_free(&a);
            return -1;
        }
        if ((flags & TOK_DECODE_SKIP_SPECIAL) && (t->flag[ids[i]] & TOK_FLAG_SPECIAL)) continue;
        if (!rc) rc = sl_push(&a, t->strs.p + t->str_off[ids[i]], t->str_len[ids[i]]);
    }
    struct slist *cur = &a, *nxt = &b;
    for (size_t k = 0; k < t->n_dec && !rc; k++) {
        rc = dec_step(t, &t->dec[k], cur, nxt);
        struct slist *s = cur;
        cur = nxt;
        nxt = s;
    }
    struct tok_buf res = {0};
    for (size_t i = 0; i < cur->n && !rc; i++) {
        if (!t->has_decoder && i > 0) rc = tok_buf_put(&res, " ", 1); // HF: tokens.join(" ")
        if (!rc) rc = tok_buf_put(&res, cur->buf.p + cur->v[i].off, cur->v[i].len);
    }
    if (!rc) rc = tok_buf_put(&res, "", 0);
    sl_free(&a);
    sl_free(&b);
    if (rc) {
        tok_buf_free(&res);
        return td_errf(err, errlen, "out of memory decoding %zu ids", n);
    }
    *text = res.p;
    *len = res.n;
    return 0;
}

// ---------------------------------------------------------------- streaming

void tok_stream_init(struct tok_stream *s, const struct tok *t, unsigned flags) {
    memset(s, 0, sizeof *s);
    s->t = t;
    s->flags = flags;
    s->at_start = 1;
    int fused = 0;
    for (size_t k = 0; k < t->n_dec; k++) {
        if (t->dec[k].kind == TOK_DEC_FUSE) fused = 1;
        // saturating: starts are at most TOK_STRIP_MAX each, but a file may hold many Strips,
        // and no stream starts with INT_MAX copies of one character
        if (t->dec[k].kind == TOK_DEC_STRIP && fused)
            s->strip_left =
                s->strip_left > INT_MAX - t->dec[k].a ? INT_MAX : s->strip_left + t->dec[k].a;
    }
}

static int out_put(struct tok_stream *s, const void *p, size_t n) {
    if (s->out_n + n + 1 > s->out_cap) {
        size_t cap = s->out_cap ? s->out_cap : 64;
        while (cap < s->out_n + n + 1)
            cap *= 2;
        char *q = realloc(s->out, cap);
        if (!q) return -1;
        s->out = q;
        s->out_cap = cap;
    }
    memcpy(s->out + s->out_n, p, n);
    s->out_n += n;
    s->out[s->out_n] = 0;
    return 0;
}

/* a whole character is ready: strip it if the stream start still strips, else emit it */
static int emit_char(struct tok_stream *s, const unsigned char *c, size_t n) {
    if (s->strip_left > 0) {
        uint32_t cp;
        tok_utf8_next(c, n, &cp);
        uint32_t want = 0;
        for (size_t k = 0; k < s->t->n_dec; k++)
            if (s->t->dec[k].kind == TOK_DEC_STRIP) want = s->t->dec[k].cp;
        if (cp == want && n == (size_t)tok_utf8_char(c, n)) {
            s->strip_left--;
            return 0;
        }
        s->strip_left = 0;
    }
    return out_put(s, c, n);
}

/* feed bytes through the UTF-8 assembler */
static int feed(struct tok_stream *s, const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        s->pend[s->n_pend++] = p[i];
        for (;;) {
            int k = tok_utf8_char(s->pend, (size_t)s->n_pend);
            if (k == 0) break; // needs more bytes
            if (k > 0) {
                if (emit_char(s, s->pend, (size_t)k)) return -1;
            } else {
                if (emit_char(s, (const unsigned char *)REPL, 3)) return -1;
                k = -k;
            }
            memmove(s->pend, s->pend + k, (size_t)(s->n_pend - k));
            s->n_pend -= k;
            if (!s->n_pend) break;
        }
    }
    return 0;
}

int tok_stream_push(struct tok_stream *s, int32_t id, const char **text, size_t *len, char *err,
                    size_t errlen) {
    const struct tok *t = s->t;
    s->out_n = 0;
    *text = "";
    *len = 0;
    if (check_id(t, id, err, errlen)) return -1;
    if ((s->flags & TOK_DECODE_SKIP_SPECIAL) && (t->flag[id] & TOK_FLAG_SPECIAL)) return 0;
    // the token's bytes through the per-token steps
    struct tok_buf a = {0}, b = {0};
    int rc = tok_buf_put(&a, t->strs.p + t->str_off[id], t->str_len[id]), fused = 0;
    for (size_t k = 0; k < t->n_dec && !rc; k++) {
        const struct tok_dec *d = &t->dec[k];
        b.n = 0;
        switch (d->kind) {
        case TOK_DEC_BYTE_LEVEL: rc = byte_level_token(t, a.p, a.n, &b); break;
        case TOK_DEC_BYTE_FALLBACK: {
            unsigned char byte;
            rc = is_byte_token(a.p, a.n, &byte) ? tok_buf_put(&b, &byte, 1)
                                                : tok_buf_put(&b, a.p, a.n);
            break;
        }
        case TOK_DEC_FUSE:
            fused = 1;
            rc = tok_buf_put(&b, a.p, a.n);
            break;
        case TOK_DEC_REPLACE: rc = replace_into(d, a.p, a.n, &b); break;
        case TOK_DEC_STRIP: {
            size_t x = 0, y = a.n;
            if (!fused) strip_bounds(d, a.p, a.n, &x, &y);
            rc = tok_buf_put(&b, a.p + x, y - x);
            break;
        }
        }
        struct tok_buf tmp = a;
        a = b;
        b = tmp;
    }
    if (!rc && !t->has_decoder && !s->at_start) rc = feed(s, (const unsigned char *)" ", 1);
    if (!rc) rc = feed(s, (const unsigned char *)a.p, a.n);
    s->at_start = 0;
    tok_buf_free(&a);
    tok_buf_free(&b);
    if (rc) return td_errf(err, errlen, "out of memory streaming a token");
    *text = s->out ? s->out : "";
    *len = s->out_n;
    return 0;
}

void tok_stream_flush(struct tok_stream *s, const char **text, size_t *len) {
    s->out_n = 0;
    if (s->n_pend) { // an unfinished character: one U+FFFD, as from_utf8_lossy at the end
        s->n_pend = 0;
        if (emit_char(s, (const unsigned char *)REPL, 3)) s->out_n = 0;
    }
    *text = s->out ? s->out : "";
    *len = s->out_n;
}

void tok_stream_free(struct tok_stream *s) {
    free(s->out);
    memset(s, 0, sizeof *s);
}
