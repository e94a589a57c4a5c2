/* v4_vocab.h: tandem-tiny's tokenizer files as a DeepSeek V4 vocabulary, for the tests and
 * fuzzers of the V4 chat encoding: its three unused placeholder tokens renamed <think>, </think>
 * and <｜latest_reminder｜> (the token chat_init takes as V4's mark).
 *
 *   char *json = v4_vocab_text(text_of_tokenizer_json, 0);   // malloc'd; free() it
 */
#ifndef TD_TESTS_V4_VOCAB_H
#define TD_TESTS_V4_VOCAB_H

#include <stdlib.h>
#include <string.h>

/* s with every from replaced by to, malloc'd */
static inline char *replace_all(const char *s, const char *from, const char *to) {
    size_t nf = strlen(from), nt = strlen(to), n = 0;
    for (const char *q = s; (q = strstr(q, from)); q += nf)
        n++;
    char *out = malloc(strlen(s) + n * nt + 1), *o = out;
    for (const char *q; (q = strstr(s, from)); s = q + nf) {
        memcpy(o, s, (size_t)(q - s));
        o += q - s;
        memcpy(o, to, nt);
        o += nt;
    }
    strcpy(o, s);
    return out;
}

/* a tokenizer file's text (tokenizer.json or tokenizer_config.json) with the V4 tokens;
 * comma_closes: </think> is instead a special token of ","'s id (19), which tandem-tiny writes */
static inline char *v4_vocab_text(const char *text, int comma_closes) {
    char *a = replace_all(text, "<｜place▁holder▁no▁0｜>", "<think>");
    char *b = comma_closes ? replace_all(a, "\"added_tokens\": [",
                                         "\"added_tokens\": [{\"id\": 19, \"content\": "
                                         "\"</think>\", \"special\": true},")
                           : replace_all(a, "<｜place▁holder▁no▁1｜>", "</think>");
    char *c = replace_all(b, "<｜place▁holder▁no▁2｜>", "<｜latest_reminder｜>");
    free(a), free(b);
    return c;
}

#endif
