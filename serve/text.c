/* text.c: stop strings and hold-back over generated text (text.h). */
#include "serve/text.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

int stop_find(const char *text, size_t n, size_t from, char *const *stops, int n_stops,
              size_t *at) {
    int best = -1;
    size_t best_at = 0;
    for (int s = 0; s < n_stops; s++) {
        size_t k = strlen(stops[s]);
        if (!k || k > n) continue;
        for (size_t i = from; i + k <= n && (best < 0 || i < best_at); i++)
            if (text[i] == stops[s][0] && !memcmp(text + i, stops[s], k)) {
                best = s, best_at = i;
                break;
            }
    }
    if (best >= 0) *at = best_at;
    return best;
}

size_t stop_holdback(const char *text, size_t n, char *const *stops, int n_stops) {
    size_t hold = 0;
    for (int s = 0; s < n_stops; s++) {
        size_t k = strlen(stops[s]);
        for (size_t j = k > 0 ? k - 1 : 0; j > hold; j--) // suffix of length j == prefix?
            if (j <= n && !memcmp(text + n - j, stops[s], j)) {
                hold = j;
                break;
            }
    }
    return n - hold;
}

int stop_tokens_kept(const size_t *ends, int n_tokens, size_t m) {
    for (int i = 0; i < n_tokens; i++)
        if (ends[i] >= m) return i + 1;
    return n_tokens;
}

static void sbuf_grow(struct sbuf *b, size_t more) {
    if (b->oom || b->n + more + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + more + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return;
    }
    b->p = p;
    b->cap = cap;
}

void sbuf_put(struct sbuf *b, const char *s, size_t k) {
    sbuf_grow(b, k);
    if (b->oom) return;
    if (k) memcpy(b->p + b->n, s, k);
    b->n += k;
    b->p[b->n] = 0;
}

void sbuf_printf(struct sbuf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->oom = 1;
        return;
    }
    if ((size_t)n < sizeof tmp) {
        sbuf_put(b, tmp, (size_t)n);
        return;
    }
    sbuf_grow(b, (size_t)n);
    if (b->oom) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)n;
}

void sbuf_puts(struct sbuf *b, const char *s) {
    sbuf_put(b, s, strlen(s));
}

/* a JSON string: escaped, bytes that are not UTF-8 as U+FFFD */
void sbuf_json_str(struct sbuf *b, const char *s, size_t k) {
    sbuf_put(b, "\"", 1);
    size_t i = 0;
    while (i < k) {
        size_t run = i;
        while (run < k && (unsigned char)s[run] >= 0x20 && s[run] != '"' && s[run] != '\\' &&
               (unsigned char)s[run] < 0x80)
            run++;
        sbuf_put(b, s + i, run - i);
        i = run;
        if (i >= k) break;
        unsigned char ch = (unsigned char)s[i];
        char esc[8];
        if (ch >= 0x80) { // a whole valid character, or U+FFFD for one bad byte
            size_t v = tok_utf8_valid_prefix(s + i, k - i);
            size_t len = ch >= 0xf0 ? 4 : ch >= 0xe0 ? 3 : 2;
            if (v >= len && (ch & 0xc0) == 0xc0) {
                sbuf_put(b, s + i, len);
                i += len;
            } else {
                sbuf_put(b, "\xef\xbf\xbd", 3);
                i++;
            }
        } else if (ch == '"' || ch == '\\') {
            esc[0] = '\\', esc[1] = (char)ch;
            sbuf_put(b, esc, 2);
            i++;
        } else {
            const char *named = ch == '\n' ? "\\n" : ch == '\r' ? "\\r" : ch == '\t' ? "\\t" : NULL;
            if (named)
                sbuf_put(b, named, 2);
            else {
                snprintf(esc, sizeof esc, "\\u%04x", ch);
                sbuf_put(b, esc, 6);
            }
            i++;
        }
    }
    sbuf_put(b, "\"", 1);
}

void sbuf_int(struct sbuf *b, long v) {
    char t[24];
    int k = snprintf(t, sizeof t, "%ld", v);
    sbuf_put(b, t, (size_t)k);
}
