/* fuzz_tokjson.c: libFuzzer target for tokenizer.json (tok_load_mem), `make fuzz`. The input is a
 * tokenizer.json, optionally followed by a NUL byte and a tokenizer_config.json (seeds:
 * tests/fuzz/fuzz_tokjson/). A tokenizer that loads encodes a few fixed texts (with and without
 * the post-processor, special tokens as text), decodes the ids whole (with and without special
 * tokens) and streamed, decodes its first 512 ids together and 64 one by one, and renders a chat.
 * Anything may be refused; nothing may crash, leak, hang or read out of bounds. The JSON before
 * the NUL also gets JSON-aware mutations (fuzz_json.h).
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"
#include "fuzz_json.h"

static const char *texts[] = {
    "Hello world",
    " the  quick\tbrown\n\nfox 12345 6789.0",
    "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x99\x82 e\xcc\x81 \xe2\x80\x99x",
    "<s></s><unk>[CLS]<|endoftext|><\xef\xbd\x9cUser\xef\xbd\x9c>\xe2\x96\x81"
    "a",
    "a",
    "",
};

static void decode_all(const struct tok *t, const struct tok_ids *ids) {
    char err[256], *text;
    size_t n;
    for (unsigned f = 0; f < 2; f++)
        if (!tok_decode(t, ids->ids, ids->n, f ? TOK_DECODE_SKIP_SPECIAL : 0, &text, &n, err,
                        sizeof err))
            free(text);
    struct tok_stream s;
    tok_stream_init(&s, t, 0);
    const char *piece;
    for (size_t i = 0; i < ids->n; i++)
        tok_stream_push(&s, ids->ids[i], &piece, &n, err, sizeof err);
    tok_stream_flush(&s, &piece, &n);
    tok_stream_free(&s);
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t n) {
    const unsigned char *nul = memchr(data, 0, n);
    size_t json_n = nul ? (size_t)(nul - data) : n;
    char *cfg = NULL, err[512];
    if (nul) { // tokenizer_config.json is read as a NUL-terminated string
        size_t k = n - json_n - 1;
        if (!(cfg = malloc(k + 1))) return 0;
        memcpy(cfg, nul + 1, k);
        cfg[k] = 0;
    }
    struct tok *t;
    if (tok_load_mem(&t, (const char *)data, json_n, cfg, err, sizeof err) == 0) {
        struct tok_ids ids = {0};
        static const unsigned flags[] = {0, TOK_ENCODE_ADD_SPECIAL,
                                         TOK_ENCODE_ADD_SPECIAL | TOK_ENCODE_SPECIAL_AS_TEXT};
        for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
            for (size_t f = 0; f < sizeof flags / sizeof flags[0]; f++) {
                ids.n = 0;
                if (!tok_encode(t, texts[i], strlen(texts[i]), flags[f], &ids, err, sizeof err))
                    decode_all(t, &ids);
            }
        ids.n = 0; // every id up to 512, holes and all (decode refuses those)
        for (int32_t id = 0; id < tok_n_vocab(t) && id < 512; id++)
            tok_ids_push(&ids, id);
        decode_all(t, &ids);
        for (size_t i = 0; i < ids.n && i < 64; i++) {
            struct tok_ids one = {.ids = ids.ids + i, .n = 1, .cap = 1};
            decode_all(t, &one);
            tok_is_special(t, ids.ids[i]);
            size_t len;
            tok_str(t, ids.ids[i], &len);
        }
        tok_ids_free(&ids);
        struct chat c;
        if (!chat_init(&c, t, err, sizeof err)) {
            struct chat_msg m[] = {{.role = CHAT_ROLE_SYSTEM, .content = "S"},
                                   {.role = CHAT_ROLE_USER, .content = "Hi 12"},
                                   {.role = CHAT_ROLE_ASSISTANT, .content = "Yes."}};
            struct tok_ids cids = {0};
            chat_encode(&c, m, 3, 1, &cids, err, sizeof err);
            tok_ids_free(&cids);
            size_t len;
            free(chat_render(&c, m, 3, 1, &len, err, sizeof err));
        }
        tok_free(t);
    }
    free(cfg);
    return 0;
}
