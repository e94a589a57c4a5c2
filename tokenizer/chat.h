/* chat.h: chat turns -> token ids, built natively from the tokenizer's special tokens.
 *
 *   struct chat c;
 *   if (chat_init(&c, tok, err, sizeof err)) ...            // picks the format from the vocab
 *   struct chat_msg m[] = {{.role = CHAT_ROLE_SYSTEM, .content = "Be brief."},
 *                          {.role = CHAT_ROLE_USER, .content = "Hi"}};
 *   struct tok_ids ids = {0};
 *   chat_encode(&c, m, 2, 1, &ids, err, sizeof err);        // 1: open the assistant's turn
 *
 * Formats, chosen by chat_init:
 *   CHAT_FORMAT_DEEPSEEK  the vocab has <｜User｜> and <｜Assistant｜> (DeepSeek V3/V4):
 *       BOS, the system prompts joined by "\n\n", then per turn <｜User｜>text or
 *       <｜Assistant｜>[think]text EOS, and with a generation prompt <｜Assistant｜>[think].
 *       [think] is nothing (CHAT_THINK_NONE, V3), "</think>" (CHAT_THINK_OFF, V3.1+ and V4
 *       non-thinking) or, on the generation prompt only, "<think>" (CHAT_THINK_ON). chat_init
 *       picks CHAT_THINK_OFF when the vocab has </think> and the config's chat template mentions
 *       it, else CHAT_THINK_NONE; the caller may change c.think.
 *   CHAT_FORMAT_CHATML    the vocab has <|im_start|> and <|im_end|>: "<|im_start|>role\n" text
 *       "<|im_end|>\n" per message, "<|im_start|>assistant\n" as the generation prompt.
 *   CHAT_FORMAT_PLAIN     anything else: BOS if the tokenizer has one, then "System: ",
 *       "User: ", "Assistant: " + text + "\n\n" per message (EOS after an assistant's text when
 *       there is one), and "Assistant:" as the generation prompt.
 * Texts are encoded without the post-processor (as transformers' apply_chat_template does), and
 * special-token strings inside a message are matched as tokens, as HF matches them in the
 * rendered template; pass TOK_ENCODE_SPECIAL_AS_TEXT in c.encode_flags to keep them text.
 */
#ifndef TD_CHAT_H
#define TD_CHAT_H

#include <stddef.h>

#include "tokenizer/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

enum chat_role { CHAT_ROLE_SYSTEM, CHAT_ROLE_USER, CHAT_ROLE_ASSISTANT };
enum chat_format { CHAT_FORMAT_DEEPSEEK, CHAT_FORMAT_CHATML, CHAT_FORMAT_PLAIN };
enum chat_think { CHAT_THINK_NONE, CHAT_THINK_OFF, CHAT_THINK_ON };

struct chat_msg {
    enum chat_role role;
    const char *content; /* UTF-8, NUL-terminated */
};

struct chat {
    struct tok *tok;
    enum chat_format format;
    enum chat_think think;
    unsigned encode_flags; /* extra tok_encode flags for message text, 0 by default */
    int32_t bos, eos;      /* -1 if none */
    int32_t user, assistant, think_open, think_close, im_start, im_end; /* -1 if none */
};

/* Pick the format for tok (which must outlive c). 0, or -1 with a message. */
int chat_init(struct chat *c, struct tok *tok, char *err, size_t errlen);

/* Append the ids of msgs[0..n) to out; add_generation_prompt opens the assistant's turn.
 * 0, or -1 with a message (invalid UTF-8 in a message, out of memory); out unchanged then. */
int chat_encode(const struct chat *c, const struct chat_msg *msgs, size_t n,
                int add_generation_prompt, struct tok_ids *out, char *err, size_t errlen);

/* The same conversation as text (special tokens written out), malloc'd and NUL-terminated;
 * NULL if out of memory. For logs and for comparing with a template engine's rendering. */
char *chat_render(const struct chat *c, const struct chat_msg *msgs, size_t n,
                  int add_generation_prompt, size_t *len);

#ifdef __cplusplus
}
#endif
#endif
