/* fuzz_chat.c: libFuzzer target for the DeepSeek V4 chat encoding (tokenizer/chat_v4.c) and its
 * JSON reader and writer, `make fuzz`. The input is a tool call's arguments, then after a NUL a
 * tools array, then after another NUL the tool_call_id of the result, each as text; they go into
 * one fixed conversation, rendered and encoded in chat and thinking mode on tandem-tiny's
 * tokenizer with V4's tokens (its placeholders renamed). Nothing may crash, leak or read out of
 * bounds; chat_render and chat_encode must both succeed, with the ids of the rendered text
 * encoded whole, or both fail with the same message.
 * Seeds: tests/fuzz/fuzz_chat/ (written by hand).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/chat.h"
#include "model/fileio.h"
#include "tokenizer/tok_internal.h"
#include "v4_vocab.h"

static struct tok *T;
static struct chat C;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    char err[512];
    char *json = td_file_read("models/tandem-tiny/tokenizer.json", 1 << 24, NULL, err, sizeof err);
    char *cfg =
        td_file_read("models/tandem-tiny/tokenizer_config.json", 1 << 20, NULL, err, sizeof err);
    if (!json || !cfg) {
        fprintf(stderr, "fuzz_chat: %s (run from the repository root)\n", err);
        abort();
    }
    char *v4 = v4_vocab_text(json, 0);
    if (tok_load_mem(&T, v4, strlen(v4), cfg, err, sizeof err) ||
        chat_init(&C, T, err, sizeof err) || !C.v4) {
        fprintf(stderr, "fuzz_chat: %s\n", err);
        abort();
    }
    free(v4), free(json), free(cfg);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *s = malloc(size + 3);
    memcpy(s, data, size);
    s[size] = s[size + 1] = s[size + 2] = 0;
    const char *args = s, *tools = args + strlen(args) + 1;
    if (tools > s + size) tools = s + size;
    const char *id = tools + strlen(tools) + 1;
    if (id > s + size) id = s + size;
    const struct chat_tool_call calls[] = {{.id = "call_1", .name = "f", .arguments = args},
                                           {.id = "call_2", .name = "g", .arguments = "{}"}};
    const struct chat_msg m[] = {
        {.role = CHAT_ROLE_SYSTEM, .content = "S", .tools = *tools ? tools : NULL},
        {.role = CHAT_ROLE_USER, .content = "U"},
        {.role = CHAT_ROLE_ASSISTANT, .reasoning = "R", .tool_calls = calls, .n_tool_calls = 2},
        {.role = CHAT_ROLE_TOOL, .tool_call_id = "call_2", .content = "r2"},
        {.role = CHAT_ROLE_TOOL, .tool_call_id = id, .content = "r1"},
        {.role = CHAT_ROLE_DEVELOPER, .content = "D"}};
    for (int think = 0; think < 2; think++) {
        C.think = think ? CHAT_THINK_ON : CHAT_THINK_OFF;
        char e1[512] = "", e2[512] = "";
        size_t n;
        char *text = chat_render(&C, m, sizeof m / sizeof *m, 1, &n, e1, sizeof e1);
        struct tok_ids ids = {0}, whole = {0};
        int rc = chat_encode(&C, m, sizeof m / sizeof *m, 1, &ids, e2, sizeof e2);
        if (!text != !!rc) abort(); // one refused what the other took
        if (rc && strcmp(e1, e2)) abort();
        if (text && (tok_encode(T, text, n, 0, &whole, e1, sizeof e1) || whole.n != ids.n ||
                     memcmp(whole.ids, ids.ids, ids.n * sizeof *ids.ids)))
            abort(); // the ids are not the rendered text's
        free(text);
        tok_ids_free(&ids);
        tok_ids_free(&whole);
    }
    free(s);
    return 0;
}
