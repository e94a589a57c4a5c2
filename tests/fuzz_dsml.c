/* fuzz_dsml.c: libFuzzer target for reading a V4 reply's DSML tool calls back
 * (tokenizer/chat_dsml.c), `make fuzz`. The input is the reply, as the model might write it.
 * Nothing may crash, leak or read out of bounds (the input is copied into a buffer of its own
 * size, no NUL after it); a refusal leaves the whole text content; a block read gives at least
 * one call, each with a name and arguments that jansson reads as a JSON object, and content
 * that ends where the mark begins.
 * Seeds: tests/fuzz/fuzz_dsml/ (written by hand).
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/chat.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *s = malloc(size ? size : 1), err[512];
    if (size) memcpy(s, data, size);
    struct chat_reply r;
    int rc = chat_parse_calls(s, size, &r, err, sizeof err);
    if (rc != 1 && (r.content_len != size || r.n_calls || r.calls || r.buf)) abort();
    if (rc == 1) {
        const size_t k = strlen(CHAT_V4_CALLS_MARK);
        if (!r.n_calls || r.content_len + k > size ||
            memcmp(s + r.content_len, CHAT_V4_CALLS_MARK, k))
            abort();
        for (size_t i = 0; i < r.n_calls; i++) {
            json_t *a =
                json_loads(r.calls[i].arguments, JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL, NULL);
            if (!r.calls[i].name[0] || !json_is_object(a)) abort();
            json_decref(a);
        }
        chat_reply_free(&r);
    }
    free(s);
    return 0;
}
