/* chat.h: chat turns -> token ids, built natively from the tokenizer's special tokens.
 *
 *   struct chat c;
 *   if (chat_init(&c, tok, err, sizeof err)) return -1;     // picks the format from the vocab
 *   struct chat_msg m[] = {{.role = CHAT_ROLE_SYSTEM, .content = "Be brief."},
 *                          {.role = CHAT_ROLE_USER, .content = "Hi"}};
 *   struct tok_ids ids = {0};
 *   chat_encode(&c, m, 2, 1, &ids, err, sizeof err);        // 1: open the assistant's turn
 *
 * Formats, chosen by chat_init:
 *   CHAT_FORMAT_DEEPSEEK  the vocab has <｜User｜> and <｜Assistant｜> (DeepSeek V3/V4).
 *     V3 (c.v4 == 0): BOS, the system prompts joined by "\n\n", then per turn <｜User｜>text or
 *       <｜Assistant｜>[think]text EOS, and with a generation prompt <｜Assistant｜>[think].
 *       [think] is nothing (CHAT_THINK_NONE, V3), "</think>" (CHAT_THINK_OFF, V3.1+) or, on the
 *       generation prompt only, "<think>" (CHAT_THINK_ON). chat_init picks CHAT_THINK_OFF when
 *       the vocab has </think> and the config's chat template mentions it, else CHAT_THINK_NONE.
 *     V4 (c.v4 == 1: the vocab has <｜latest_reminder｜>, which V4's encoding_dsv4.py brings):
 *       the reference encode_messages (released_formats.md 4.7). BOS, then every message in
 *       order with no separators: a system's text [+ "\n\n## Tools" section when it has
 *       tools]; <｜User｜> + a run of user texts and tool results (<tool_result>...</tool_result>,
 *       re-ordered to the order of the calls) joined by "\n\n"; a developer's <｜User｜>text
 *       [+ tools]; <｜latest_reminder｜>text; an assistant's [reasoning "</think>"] text [DSML
 *       tool calls] EOS. After the user turn an assistant answers: <｜Assistant｜> + "<think>"
 *       (thinking mode, CHAT_THINK_ON) or "</think>" (chat mode, CHAT_THINK_OFF, the default).
 *       In thinking mode with c.drop_thinking (the default) the reasoning of assistant turns
 *       before the last user turn is dropped (and earlier turns close with "</think>"), unless
 *       a message carries tools; c.effort CHAT_EFFORT_MAX prefixes the "Reasoning Effort"
 *       paragraph in thinking mode.
 *   CHAT_FORMAT_CHATML    the vocab has <|im_start|> and <|im_end|>: "<|im_start|>role\n" text
 *       "<|im_end|>\n" per message, "<|im_start|>assistant\n" as the generation prompt.
 *   CHAT_FORMAT_PLAIN     anything else: BOS if the tokenizer has one, then "System: ",
 *       "User: ", "Assistant: " + text + "\n\n" per message (EOS after an assistant's text when
 *       there is one), and "Assistant:" as the generation prompt.
 * A V4 reply's tool calls come back with chat_parse_calls: the text after the reasoning splits
 * into its content and the DSML tool_calls block that follows it, one name and one JSON object
 * of arguments per invoke.
 * Roles tool and latest_reminder, tool calls and tools need the V4 format; other formats refuse
 * them and read a developer message as a system one and ignore an assistant's reasoning.
 * Texts are encoded without the post-processor (as transformers' apply_chat_template does), the
 * text between two special tokens in one piece, and special-token strings inside a message are
 * matched as tokens, as HF matches them in the rendered template; pass
 * TOK_ENCODE_SPECIAL_AS_TEXT in c.encode_flags to keep them text.
 */
#ifndef TD_CHAT_H
#define TD_CHAT_H

#include <stddef.h>

#include "tokenizer/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

enum chat_role {
    CHAT_ROLE_SYSTEM,
    CHAT_ROLE_USER,
    CHAT_ROLE_ASSISTANT,
    CHAT_ROLE_DEVELOPER,       /* V4: <｜User｜> + text (+ tools); elsewhere a system message */
    CHAT_ROLE_TOOL,            /* V4: a tool's result, merged into the user turn it joins */
    CHAT_ROLE_LATEST_REMINDER, /* V4: <｜latest_reminder｜> + text */
};
enum chat_format { CHAT_FORMAT_DEEPSEEK, CHAT_FORMAT_CHATML, CHAT_FORMAT_PLAIN };
enum chat_think { CHAT_THINK_NONE, CHAT_THINK_OFF, CHAT_THINK_ON };
enum chat_effort { CHAT_EFFORT_HIGH, CHAT_EFFORT_MAX }; /* V4 reasoning_effort (None = high) */

/* an assistant's call of a tool */
struct chat_tool_call {
    const char *id;        /* what a tool message's tool_call_id names; may be NULL */
    const char *name;      /* the function's name */
    const char *arguments; /* a JSON object as text, e.g. {"city": "Paris"} */
};

/* One message. The first two fields are all a plain conversation needs; the rest are V4's and
 * may stay zero. Every string is UTF-8 and NUL-terminated; NULL reads as absent ("" for text). */
struct chat_msg {
    enum chat_role role;
    const char *content;
    const char *reasoning;                   /* assistant: its thinking (reasoning_content) */
    const struct chat_tool_call *tool_calls; /* assistant: [n_tool_calls] */
    size_t n_tool_calls;
    const char *tool_call_id; /* tool: the id of the call it answers (may be NULL when the
                                 latest assistant message made exactly one call) */
    const char *tools;        /* system, developer: the OpenAI "tools" array as JSON text,
                                 [{"type": "function", "function": {"name": ...}}, ...] */
};

struct chat {
    struct tok *tok;
    enum chat_format format;
    enum chat_think think;
    int v4;                  /* DeepSeek V4 rules (see above) */
    int drop_thinking;       /* V4 thinking mode: drop earlier turns' reasoning; 1 by default */
    enum chat_effort effort; /* V4 thinking mode; CHAT_EFFORT_HIGH by default */
    unsigned encode_flags;   /* extra tok_encode flags for message text, 0 by default */
    int32_t bos, eos;        /* -1 if none */
    int32_t user, assistant, think_open, think_close, im_start, im_end; /* -1 if none */
    int32_t dsml;                                                       /* ｜DSML｜; -1 if none */
};

/* Pick the format for tok (which must outlive c). 0, or -1 with a message. */
int chat_init(struct chat *c, struct tok *tok, char *err, size_t errlen);

/* Append the ids of msgs[0..n) to out; add_generation_prompt opens the assistant's turn (V4:
 * 0 leaves off the <｜Assistant｜> a final user turn would get). 0, or -1 with a message (a
 * role or field the format cannot take, a tool result that answers no call, tool arguments or
 * tools that are not valid JSON, invalid UTF-8, out of memory); out unchanged then. */
int chat_encode(const struct chat *c, const struct chat_msg *msgs, size_t n,
                int add_generation_prompt, struct tok_ids *out, char *err, size_t errlen);

/* The same conversation as text (special tokens written out), malloc'd and NUL-terminated;
 * NULL with a message (as chat_encode's) otherwise. For logs and for comparing with a
 * reference encoder's rendering. */
char *chat_render(const struct chat *c, const struct chat_msg *msgs, size_t n,
                  int add_generation_prompt, size_t *len, char *err, size_t errlen);

/* where a V4 reply's tool calls begin: the reference's tool_calls_start_token */
#define CHAT_V4_CALLS_MARK "\n\n<｜DSML｜tool_calls"

/* a tool call read back from a reply */
struct chat_call {
    const char *name;      /* NUL-terminated, in chat_reply.buf */
    const char *arguments; /* a JSON object as text, {"city": "Paris", "days": 2}; in buf */
};

struct chat_reply {
    size_t content_len;      /* the content is the reply's first content_len bytes */
    struct chat_call *calls; /* [n_calls] */
    size_t n_calls;
    char *buf; /* what calls point into */
};

/* Read the tool calls of a V4 reply: text[0..n) is what the model wrote after its reasoning (the
 * "</think>" and what precedes it split off; EOS not included). Returns
 *    1: text[0, r->content_len) is the content and the rest one complete tool_calls block that
 *       ends the text, its r->n_calls >= 1 calls in r (chat_reply_free them);
 *    0: no block begins (no CHAT_V4_CALLS_MARK): the whole text is content, no calls;
 *   -1: a block begins but is cut short or malformed (a tag out of place, a string="false"
 *       value that is not JSON, a parameter given twice, text after the block, out of memory),
 *       why in err; r as for 0, so the caller keeps the whole text as content.
 * Never reads outside text[0..n); memory is a few times n. */
int chat_parse_calls(const char *text, size_t n, struct chat_reply *r, char *err, size_t errlen);
void chat_reply_free(struct chat_reply *r);

#ifdef __cplusplus
}
#endif
#endif
