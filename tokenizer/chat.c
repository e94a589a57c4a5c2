/* chat.c: DeepSeek V3, ChatML and plain chat layouts, as ids or as text (see chat.h); the V4
 * layout is in chat_v4.c.
 *
 * One walk over the messages (build) drives both outputs through a small sink: a special
 * token becomes its id or its string, a piece of text is encoded or copied.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/err.h"
#include "tokenizer/chat_internal.h"

static int32_t find(struct tok *t, const char *s) {
    return tok_id(t, s, strlen(s));
}

int chat_init(struct chat *c, struct tok *tok, char *err, size_t errlen) {
    (void)err;
    (void)errlen;
    memset(c, 0, sizeof *c);
    c->tok = tok;
    c->bos = tok_bos(tok);
    c->eos = tok_eos(tok);
    c->user = find(tok, "<｜User｜>");
    c->assistant = find(tok, "<｜Assistant｜>");
    c->think_open = find(tok, "<think>");
    c->think_close = find(tok, "</think>");
    c->im_start = find(tok, "<|im_start|>");
    c->im_end = find(tok, "<|im_end|>");
    c->dsml = find(tok, "｜DSML｜");
    c->drop_thinking = 1;
    c->effort = CHAT_EFFORT_HIGH;
    if (c->user >= 0 && c->assistant >= 0) {
        c->format = CHAT_FORMAT_DEEPSEEK;
        if (c->bos < 0) c->bos = find(tok, "<｜begin▁of▁sentence｜>");
        if (c->eos < 0) c->eos = find(tok, "<｜end▁of▁sentence｜>");
        // V4 ships no chat template but encoding_dsv4.py, whose latest_reminder role has its
        // own token; V3 and V3.1/3.2 vocabularies lack it
        c->v4 = find(tok, "<｜latest_reminder｜>") >= 0;
        const char *tpl = tok_chat_template(tok);
        c->think = c->v4 || (c->think_close >= 0 && tpl && strstr(tpl, "</think>"))
                       ? CHAT_THINK_OFF
                       : CHAT_THINK_NONE;
    } else if (c->im_start >= 0 && c->im_end >= 0) {
        c->format = CHAT_FORMAT_CHATML;
    } else {
        c->format = CHAT_FORMAT_PLAIN;
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------
// checks every format shares

static const char *role_name(enum chat_role r) {
    switch (r) {
    case CHAT_ROLE_SYSTEM: return "system";
    case CHAT_ROLE_USER: return "user";
    case CHAT_ROLE_ASSISTANT: return "assistant";
    case CHAT_ROLE_DEVELOPER: return "developer";
    case CHAT_ROLE_TOOL: return "tool";
    case CHAT_ROLE_LATEST_REMINDER: return "latest_reminder";
    }
    return NULL;
}

static int utf8_ok(const char *s, size_t i, const char *what, char *err, size_t errlen) {
    if (!s) return 0;
    size_t n = strlen(s), k = tok_utf8_valid_prefix(s, n);
    if (k < n)
        return td_errf(err, errlen, "message %zu: the %s is not valid UTF-8 (byte %zu)", i, what,
                       k);
    return 0;
}

static int check(const struct chat *c, const struct chat_msg *m, size_t n, char *err,
                 size_t errlen) {
    int v4 = c->format == CHAT_FORMAT_DEEPSEEK && c->v4;
    for (size_t i = 0; i < n; i++) {
        const char *role = role_name(m[i].role);
        if (!role) return td_errf(err, errlen, "message %zu: unknown role %d", i, (int)m[i].role);
        if (utf8_ok(m[i].content, i, "content", err, errlen) ||
            utf8_ok(m[i].reasoning, i, "reasoning", err, errlen) ||
            utf8_ok(m[i].tool_call_id, i, "tool_call_id", err, errlen) ||
            utf8_ok(m[i].tools, i, "tools", err, errlen))
            return -1;
        for (size_t j = 0; j < m[i].n_tool_calls; j++)
            if (utf8_ok(m[i].tool_calls[j].id, i, "tool call id", err, errlen) ||
                utf8_ok(m[i].tool_calls[j].name, i, "tool call name", err, errlen) ||
                utf8_ok(m[i].tool_calls[j].arguments, i, "tool call arguments", err, errlen))
                return -1;
        const char *why = "(this vocab has no <｜latest_reminder｜>)";
        if (!v4 && (m[i].role == CHAT_ROLE_TOOL || m[i].role == CHAT_ROLE_LATEST_REMINDER))
            return td_errf(err, errlen, "message %zu: role %s needs the DeepSeek V4 chat format %s",
                           i, role, why);
        if (!v4 && (m[i].n_tool_calls || m[i].tools))
            return td_errf(err, errlen, "message %zu (%s): %s need the DeepSeek V4 chat format %s",
                           i, role, m[i].n_tool_calls ? "tool calls" : "tools", why);
        if (m[i].n_tool_calls && m[i].role != CHAT_ROLE_ASSISTANT)
            return td_errf(err, errlen, "message %zu (%s): only an assistant makes tool calls", i,
                           role);
        if (m[i].tools && m[i].role != CHAT_ROLE_SYSTEM && m[i].role != CHAT_ROLE_DEVELOPER)
            return td_errf(err, errlen,
                           "message %zu (%s): tools go on a system or developer message", i, role);
        if (m[i].tool_call_id && m[i].role != CHAT_ROLE_TOOL)
            return td_errf(err, errlen, "message %zu (%s): only a tool message has a tool_call_id",
                           i, role);
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------
// V3, ChatML, plain

static int is_system(const struct chat_msg *m) {
    return m->role == CHAT_ROLE_SYSTEM || m->role == CHAT_ROLE_DEVELOPER;
}

static int build_deepseek(struct sink *k, const struct chat_msg *m, size_t n, int gen) {
    const struct chat *c = k->c;
    int rc = chat_put_tok(k, c->bos), first = 1;
    for (size_t i = 0; i < n && !rc; i++) { // every system prompt, in order, first
        if (!is_system(&m[i])) continue;
        if (!first) rc = chat_put_str(k, "\n\n");
        if (!rc) rc = chat_put_str(k, m[i].content);
        first = 0;
    }
    int32_t turn_think = c->think == CHAT_THINK_NONE ? -1 : c->think_close;
    for (size_t i = 0; i < n && !rc; i++) {
        if (m[i].role == CHAT_ROLE_USER) {
            rc = chat_put_tok(k, c->user);
            if (!rc) rc = chat_put_str(k, m[i].content);
        } else if (m[i].role == CHAT_ROLE_ASSISTANT) {
            rc = chat_put_tok(k, c->assistant);
            if (!rc) rc = chat_put_tok(k, turn_think);
            if (!rc) rc = chat_put_str(k, m[i].content);
            if (!rc) rc = chat_put_tok(k, c->eos);
        }
    }
    if (gen && !rc) {
        rc = chat_put_tok(k, c->assistant);
        if (!rc) rc = chat_put_tok(k, c->think == CHAT_THINK_ON ? c->think_open : turn_think);
    }
    return rc;
}

static int build_chatml(struct sink *k, const struct chat_msg *m, size_t n, int gen) {
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        rc = chat_put_tok(k, k->c->im_start);
        if (!rc) rc = chat_put_str(k, is_system(&m[i]) ? "system" : role_name(m[i].role));
        if (!rc) rc = chat_put_str(k, "\n");
        if (!rc) rc = chat_put_str(k, m[i].content);
        if (!rc) rc = chat_put_tok(k, k->c->im_end);
        if (!rc) rc = chat_put_str(k, "\n");
    }
    if (gen && !rc) {
        rc = chat_put_tok(k, k->c->im_start);
        if (!rc) rc = chat_put_str(k, "assistant\n");
    }
    return rc;
}

static int build_plain(struct sink *k, const struct chat_msg *m, size_t n, int gen) {
    int rc = chat_put_tok(k, k->c->bos);
    for (size_t i = 0; i < n && !rc; i++) {
        rc = chat_put_str(k, is_system(&m[i])              ? "System: "
                             : m[i].role == CHAT_ROLE_USER ? "User: "
                                                           : "Assistant: ");
        if (!rc) rc = chat_put_str(k, m[i].content);
        if (!rc && m[i].role == CHAT_ROLE_ASSISTANT) rc = chat_put_tok(k, k->c->eos);
        if (!rc) rc = chat_put_str(k, "\n\n");
    }
    if (gen && !rc) rc = chat_put_str(k, "Assistant:");
    return rc;
}

static int build(struct sink *k, const struct chat_msg *m, size_t n, int gen) {
    if (check(k->c, m, n, k->err, k->errlen)) return -1;
    int rc = -1;
    switch (k->c->format) {
    case CHAT_FORMAT_DEEPSEEK:
        rc = k->c->v4 ? chat_build_v4(k, m, n, gen) : build_deepseek(k, m, n, gen);
        break;
    case CHAT_FORMAT_CHATML: rc = build_chatml(k, m, n, gen); break;
    case CHAT_FORMAT_PLAIN: rc = build_plain(k, m, n, gen); break;
    }
    return rc ? rc : chat_flush_text(k);
}

int chat_encode(const struct chat *c, const struct chat_msg *msgs, size_t n,
                int add_generation_prompt, struct tok_ids *out, char *err, size_t errlen) {
    size_t n0 = out->n;
    struct sink k = {.c = c, .ids = out, .err = err, .errlen = errlen};
    int rc = build(&k, msgs, n, add_generation_prompt);
    tok_buf_free(&k.text);
    if (rc) out->n = n0;
    return rc ? -1 : 0;
}

char *chat_render(const struct chat *c, const struct chat_msg *msgs, size_t n,
                  int add_generation_prompt, size_t *len, char *err, size_t errlen) {
    struct sink k = {.c = c, .err = err, .errlen = errlen};
    if (tok_buf_put(&k.text, "", 0) || build(&k, msgs, n, add_generation_prompt)) {
        if (!k.text.p) td_errf(err, errlen, "out of memory");
        tok_buf_free(&k.text);
        return NULL;
    }
    if (len) *len = k.text.n;
    return k.text.p;
}
