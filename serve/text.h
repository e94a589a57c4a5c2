/* text.h: the text side of a generated stream: where a stop string cuts it, and how much of it
 * may be sent while more tokens are to come (server.md section 1.9).
 *
 *   size_t at;
 *   int s = stop_find(text, n, from, stops, n_stops, &at);  // first match starting >= from
 *   size_t safe = stop_holdback(text, n, stops, n_stops);    // bytes sendable now
 *
 * A stop string may span tokens and verify steps: the search runs over the whole text decoded
 * so far, starting where a match could still begin (from = what was searched before, less the
 * longest stop string plus one). While a request runs, the tail of its text that is a proper
 * prefix of some stop string is held back (smg-project/smg#2203's rule: never more), so a
 * partial stop never leaks and nothing else waits.
 */
#ifndef TD_SERVE_TEXT_H
#define TD_SERVE_TEXT_H

#include <stddef.h>

/* the index of the stop string whose match in text[0..n) starts first at or after from (the
 * first of equal starts in the list), its start in *at; -1 when none matches */
int stop_find(const char *text, size_t n, size_t from, char *const *stops, int n_stops, size_t *at);

/* the length of text[0..n) that can be sent now: n less its longest suffix that is a proper
 * prefix of a stop string */
size_t stop_holdback(const char *text, size_t n, char *const *stops, int n_stops);

/* given ends[i] = the text length after generated token i (non-decreasing), the tokens plain
 * decoding would have generated when the stop ends at byte m: up to the first token whose text
 * reaches m (the one that completed the stop); later ones, committed by the same verify step,
 * are dropped */
int stop_tokens_kept(const size_t *ends, int n_tokens, size_t m);

/* a growing byte buffer, NUL-terminated (zero-initialise; free p). A failed allocation sets oom
 * and every later write is dropped, so a writer checks once, at the end. The JSON the stream's
 * chunks are written with: a string escaped (bytes that are not UTF-8 become U+FFFD), an
 * integer. */
struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
};
void sbuf_put(struct sbuf *b, const char *s, size_t k);
void sbuf_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sbuf_puts(struct sbuf *b, const char *s);
void sbuf_json_str(struct sbuf *b, const char *s, size_t k);
void sbuf_int(struct sbuf *b, long v);

#endif
