/* fuzz_tokenizer.c: libFuzzer target: encode arbitrary bytes with tandem-tiny's tokenizer, then
 * decode the ids (whole and streamed); invalid UTF-8 must be refused, never crash. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t n) {
    static struct tok *t;
    char err[256];
    if (!t && tok_load(&t, "models/tandem-tiny", err, sizeof err)) abort();
    struct tok_ids ids = {0};
    if (tok_encode(t, (const char *)data, n, TOK_ENCODE_ADD_SPECIAL, &ids, err, sizeof err) == 0) {
        char *text = NULL;
        size_t len = 0;
        if (tok_decode(t, ids.ids, ids.n, 0, &text, &len, err, sizeof err) == 0) free(text);
        struct tok_stream s;
        tok_stream_init(&s, t, 0);
        for (size_t i = 0; i < ids.n; i++) {
            const char *piece;
            size_t pl;
            tok_stream_push(&s, ids.ids[i], &piece, &pl, err, sizeof err);
        }
        tok_stream_free(&s);
    }
    tok_ids_free(&ids);
    return 0;
}
