/* tokenizer.h: HF tokenizer.json byte-level BPE in C, with the same ids as HF tokenizers.
 *
 *   struct tok *t;
 *   char err[512];
 *   if (tok_load(&t, "models/tandem-tiny", err, sizeof err)) return -1; // tokenizer.json (+config)
 *   struct tok_ids ids = {0};
 *   if (tok_encode(t, text, strlen(text), TOK_ENCODE_ADD_SPECIAL, &ids, err, sizeof err))
 *       return -1;
 *   char *s; size_t n;
 *   tok_decode(t, ids.ids, ids.n, 0, &s, &n, err, sizeof err);           // s malloc'd
 *   struct tok_stream st;                                                // token by token:
 *   tok_stream_init(&st, t, 0);
 *   const char *piece; size_t k;
 *   for (size_t i = 0; i < ids.n; i++) {
 *       if (tok_stream_push(&st, ids.ids[i], &piece, &k, err, sizeof err)) break; // a bad id
 *       fwrite(piece, 1, k, out);
 *   }
 *   tok_stream_flush(&st, &piece, &k);  fwrite(piece, 1, k, out);
 *   tok_stream_free(&st); tok_ids_free(&ids); free(s); tok_free(t);
 *
 * What loads (anything else is refused at load, naming the component): model BPE (vocab; merges
 * as "a b" strings or as pairs; unk_token, fuse_unk, byte_fallback, ignore_merges,
 * continuing_subword_prefix, end_of_word_suffix); normalizers NFC NFD NFKC NFKD Lowercase Strip
 * Prepend Append Replace Sequence; pre-tokenizers ByteLevel Split (String or Regex, any behavior,
 * invert) Digits Whitespace WhitespaceSplit Sequence; added tokens (special, lstrip, rstrip,
 * single_word, normalized); post-processors TemplateProcessing ByteLevel Roberta Bert Sequence
 * (single sequence); decoders ByteLevel ByteFallback Fuse Replace Strip Sequence.
 * tokenizer_config.json, when present, gives bos/eos/pad tokens and the chat template.
 *
 * Regexes are Oniguruma syntax in the file; they run on PCRE2 (UTF + UCP, JIT). Input text must
 * be valid UTF-8 (HF's Python API cannot take anything else): tok_encode refuses other bytes with
 * the offset of the first bad one. A struct tok keeps encode scratch (its word cache), so one
 * tokenizer must not encode on two threads at once; decoding is read-only.
 */
#ifndef TD_TOKENIZER_H
#define TD_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct tok;

/* a growable id array; zero-initialise, append with tok_ids_push, free with tok_ids_free */
struct tok_ids {
    int32_t *ids; /* [n] */
    size_t n, cap;
};

enum tok_encode_flags {
    TOK_ENCODE_ADD_SPECIAL = 1u << 0,     /* run the post-processor (HF add_special_tokens) */
    TOK_ENCODE_SPECIAL_AS_TEXT = 1u << 1, /* special added tokens are plain text (HF
                                             encode_special_tokens); others still match */
};

enum tok_decode_flags {
    TOK_DECODE_SKIP_SPECIAL = 1u << 0, /* drop special added tokens */
};

/* Load DIR/tokenizer.json and, if present, DIR/tokenizer_config.json. 0, or -1 with a
 * message; *out is freed with tok_free. */
int tok_load(struct tok **out, const char *dir, char *err, size_t errlen);
/* The same from memory; config_json may be NULL. */
int tok_load_mem(struct tok **out, const char *json, size_t len, const char *config_json, char *err,
                 size_t errlen);
void tok_free(struct tok *t);

/* Encode text[0..len) and append the ids to out. 0, or -1 with a message (invalid UTF-8, out
 * of memory); on failure out keeps what it held before. */
int tok_encode(struct tok *t, const char *text, size_t len, unsigned flags, struct tok_ids *out,
               char *err, size_t errlen);

/* Decode ids to text (*text malloc'd, NUL-terminated, *len without the NUL). HF semantics: the
 * decoder chain runs over the tokens' strings; bytes that are not UTF-8 become U+FFFD. An id
 * that names no token is refused (-1 with a message) where HF would drop it silently. */
int tok_decode(const struct tok *t, const int32_t *ids, size_t n, unsigned flags, char **text,
               size_t *len, char *err, size_t errlen);

int tok_ids_push(struct tok_ids *v, int32_t id); /* 0, or -1 out of memory */
void tok_ids_free(struct tok_ids *v);

int32_t tok_n_vocab(const struct tok *t);                        /* max id + 1 */
int32_t tok_id(const struct tok *t, const char *s, size_t n);    /* added, then model; -1 */
const char *tok_str(const struct tok *t, int32_t id, size_t *n); /* NULL if no such id */
int tok_is_special(const struct tok *t, int32_t id);
int32_t tok_bos(const struct tok *t); /* from tokenizer_config.json; -1 if none */
int32_t tok_eos(const struct tok *t);
const char *tok_chat_template(const struct tok *t); /* NULL if none */

/* Length of the longest valid UTF-8 prefix of s[0..n) (n when all of it is valid). */
size_t tok_utf8_valid_prefix(const char *s, size_t n);

/* Streaming decoder: feed ids one at a time, get back only complete UTF-8. A token that ends
 * inside a character is held until the character completes; bytes that can never complete one
 * come out as U+FFFD, exactly where a whole-sequence decode puts them. For byte-level
 * tokenizers the concatenated output equals tok_decode of all the ids. */
struct tok_stream {
    const struct tok *t;
    unsigned flags;
    unsigned char pend[8]; /* bytes of an incomplete character */
    int n_pend;
    int at_start;   /* nothing emitted yet (for Strip decoders) */
    int strip_left; /* leading characters still to strip */
    char *out;      /* the text handed back, valid until the next call */
    size_t out_n, out_cap;
};

void tok_stream_init(struct tok_stream *s, const struct tok *t, unsigned flags);
/* 0 and the new text in [*text, *text + *len), or -1 with a message for a bad id */
int tok_stream_push(struct tok_stream *s, int32_t id, const char **text, size_t *len, char *err,
                    size_t errlen);
/* the end of the stream: what is still held, as U+FFFD */
void tok_stream_flush(struct tok_stream *s, const char **text, size_t *len);
void tok_stream_free(struct tok_stream *s);

#ifdef __cplusplus
}
#endif
#endif
