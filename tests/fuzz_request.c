/* fuzz_request.c: libFuzzer target for the server's request parser (serve/request.c job_parse),
 * `make fuzz`. The input is a body: for /v1/chat/completions when it names "messages", else for
 * /v1/completions. Whatever it is, the parser answers 0 or a status with an error object; nothing
 * may crash, leak or read out of bounds. The body also gets JSON-aware mutations (fuzz_json.h).
 * Each body goes to two servers: tandem-tiny's tokenizer (a V3-style DeepSeek chat) and the same
 * with its placeholders renamed <think>, </think>, <｜latest_reminder｜> (DeepSeek V4's chat:
 * tools, tool calls and results). Seeds: tests/fuzz/fuzz_request/ (written by hand: one request of
 * each shape).
 */
#define _GNU_SOURCE /* memmem */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "serve/internal.h"
#include "fuzz_json.h"
#include "v4_vocab.h"

static struct srv S, S4;

/* tandem-tiny's tokenizer with DeepSeek V4's chat tokens */
static struct tok *v4_tok(void) {
    FILE *fp = fopen("models/tandem-tiny/tokenizer.json", "rb");
    static char buf[1 << 20];
    size_t n = fp ? fread(buf, 1, sizeof buf - 1, fp) : 0;
    if (fp) fclose(fp);
    buf[n] = 0;
    char *c = v4_vocab_text(buf, 0);
    const char *cfg = "{\"bos_token\": \"<｜begin▁of▁sentence｜>\", \"eos_token\": "
                      "\"<｜end▁of▁sentence｜>\"}";
    struct tok *t = NULL;
    char err[512];
    if (tok_load_mem(&t, c, strlen(c), cfg, err, sizeof err)) {
        fprintf(stderr, "fuzz_request: the V4 tokenizer: %s\n", err);
        abort();
    }
    free(c);
    return t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    char err[512];
    if (tok_load(&S.tok, "models/tandem-tiny", err, sizeof err)) {
        fprintf(stderr, "fuzz_request: %s (run from the repository root)\n", err);
        abort();
    }
    S.have_chat = chat_init(&S.chat, S.tok, err, sizeof err) == 0;
    srv_config_defaults(&S.cfg);
    S.cfg.log_requests = 1;
    S.vocab = tok_n_vocab(S.tok);
    S.max_ctx = 1024;
    S.max_prompt = 1023;
    snprintf(S.model_name, sizeof S.model_name, "tandem-tiny");
    S4 = S;
    S4.tok = v4_tok();
    S4.have_chat = chat_init(&S4.chat, S4.tok, err, sizeof err) == 0 && S4.chat.v4;
    if (!S4.have_chat) abort();
    return 0;
}

static void one(struct srv *s, const uint8_t *data, size_t size) {
    struct job j;
    memset(&j, 0, sizeof j);
    j.kind = memmem(data, size, "\"messages\"", 10) ? JOB_CHAT : JOB_COMPLETION;
    json_t *err = NULL;
    int ignored = 0;
    int st = job_parse(s, &j, (const char *)data, size, &ignored, &err);
    if (st && !json_is_object(json_object_get(err, "error"))) abort(); // a status needs its error
    if (!st && (j.n_ch < 1 || !j.ch || j.max_tokens < 1)) abort();
    for (int i = 0; !st && i < j.n_prompts; i++)
        if (j.prompt_lens[i] < 1 || j.prompt_lens[i] > s->max_prompt) abort();
    json_decref(err);
    free(j.ch);
    job_free_request(&j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    one(&S, data, size);
    one(&S4, data, size);
    return 0;
}
