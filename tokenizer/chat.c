/* chat.c: DeepSeek, ChatML and plain chat layouts, as ids or as text (see chat.h).
 *
 * One walk over the messages (build) drives both outputs through a small sink: a special
 * token becomes its id or its string, a piece of text is encoded or copied.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/chat.h"

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
    if (c->user >= 0 && c->assistant >= 0) {
        c->format = CHAT_FORMAT_DEEPSEEK;
        if (c->bos < 0) c->bos = find(tok, "<｜begin▁of▁sentence｜>");
        if (c->eos < 0) c->eos = find(tok, "<｜end▁of▁sentence｜>");
        const char *tpl = tok_chat_template(tok);
        c->think = c->think_close >= 0 && tpl && strstr(tpl, "</think>") ? CHAT_THINK_OFF
                                                                         : CHAT_THINK_NONE;
    } else if (c->im_start >= 0 && c->im_end >= 0) {
        c->format = CHAT_FORMAT_CHATML;
    } else {
        c->format = CHAT_FORMAT_PLAIN;
    }
    return 0;
}

/* where build() sends its output */
struct sink {
    const struct chat *c;
    struct tok_ids *ids; /* ids mode */
    char *text;          /* text mode: malloc'd */
    size_t len, cap;
    char *err;
    size_t errlen;
};

static int put_text(struct sink *k, const char *s, size_t n) {
    if (!n) return 0;
    if (k->ids) return tok_encode(k->c->tok, s, n, k->c->encode_flags, k->ids, k->err, k->errlen);
    if (k->len + n + 1 > k->cap) {
        size_t cap = k->cap ? k->cap : 256;
        while (cap < k->len + n + 1)
            cap *= 2;
        char *p = realloc(k->text, cap);
        if (!p) return -1;
        k->text = p;
        k->cap = cap;
    }
    memcpy(k->text + k->len, s, n);
    k->len += n;
    k->text[k->len] = 0;
    return 0;
}

static int put_str(struct sink *k, const char *s) {
    return put_text(k, s, strlen(s));
}

static int put_tok(struct sink *k, int32_t id) {
    if (id < 0) return 0; // a format's optional token the vocab lacks
    if (k->ids) {
        if (tok_ids_push(k->ids, id)) {
            snprintf(k->err, k->errlen, "out of memory");
            return -1;
        }
        return 0;
    }
    size_t n;
    const char *s = tok_str(k->c->tok, id, &n);
    return s ? put_text(k, s, n) : 0;
}

static int build_deepseek(struct sink *k, const struct chat_msg *m, size_t n, int gen) {
    const struct chat *c = k->c;
    int rc = put_tok(k, c->bos), first = 1;
    for (size_t i = 0; i < n && !rc; i++) { // every system prompt, in order, first
        if (m[i].role != CHAT_ROLE_SYSTEM) continue;
        if (!first) rc = put_str(k, "\n\n");
        if (!rc) rc = put_str(k, m[i].content);
        first = 0;
    }
    int32_t turn_think = c->think == CHAT_THINK_NONE ? -1 : c->think_close;
    for (size_t i = 0; i < n && !rc; i++) {
        if (m[i].role == CHAT_ROLE_USER) {
            rc = put_tok(k, c->user);
            if (!rc) rc = put_str(k, m[i].content);
        } else if (m[i].role == CHAT_ROLE_ASSISTANT) {
            rc = put_tok(k, c->assistant);
            if (!rc) rc = put_tok(k, turn_think);
            if (!rc) rc = put_str(k, m[i].content);
            if (!rc) rc = put_tok(k, c->eos);
        }
    }
    if (gen && !rc) {
        rc = put_tok(k, c->assistant);
        if (!rc) rc = put_tok(k, c->think == CHAT_THINK_ON ? c->think_open : turn_think);
    }
    return rc;
}

static const char *role_name(enum chat_role r) {
    return r == CHAT_ROLE_SYSTEM ? "system" : r == CHAT_ROLE_USER ? "user" : "assistant";
}

static int build_chatml(struct sink *k, const struct chat_msg *m, size_t n, int gen) {
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        rc = put_tok(k, k->c->im_start);
        if (!rc) rc = put_str(k, role_name(m[i].role));
        if (!rc) rc = put_str(k, "\n");
        if (!rc) rc = put_str(k, m[i].content);
        if (!rc) rc = put_tok(k, k->c->im_end);
        if (!rc) rc = put_str(k, "\n");
    }
    if (gen && !rc) {
        rc = put_tok(k, k->c->im_start);
        if (!rc) rc = put_str(k, "assistant\n");
    }
    return rc;
}

static int build_plain(struct sink *k, const struct chat_msg *m, size_t n, int gen) {
    static const char *label[] = {"System: ", "User: ", "Assistant: "};
    int rc = put_tok(k, k->c->bos);
    for (size_t i = 0; i < n && !rc; i++) {
        rc = put_str(k, label[m[i].role]);
        if (!rc) rc = put_str(k, m[i].content);
        if (!rc && m[i].role == CHAT_ROLE_ASSISTANT) rc = put_tok(k, k->c->eos);
        if (!rc) rc = put_str(k, "\n\n");
    }
    if (gen && !rc) rc = put_str(k, "Assistant:");
    return rc;
}

static int build(struct sink *k, const struct chat_msg *m, size_t n, int gen) {
    switch (k->c->format) {
    case CHAT_FORMAT_DEEPSEEK: return build_deepseek(k, m, n, gen);
    case CHAT_FORMAT_CHATML: return build_chatml(k, m, n, gen);
    case CHAT_FORMAT_PLAIN: return build_plain(k, m, n, gen);
    }
    return -1;
}

int chat_encode(const struct chat *c, const struct chat_msg *msgs, size_t n,
                int add_generation_prompt, struct tok_ids *out, char *err, size_t errlen) {
    size_t n0 = out->n;
    struct sink k = {.c = c, .ids = out, .err = err, .errlen = errlen};
    if (build(&k, msgs, n, add_generation_prompt)) {
        out->n = n0;
        return -1;
    }
    return 0;
}

char *chat_render(const struct chat *c, const struct chat_msg *msgs, size_t n,
                  int add_generation_prompt, size_t *len) {
    char err[8];
    struct sink k = {.c = c, .err = err, .errlen = sizeof err};
    if (put_text(&k, "", 0) || build(&k, msgs, n, add_generation_prompt)) {
        free(k.text);
        return NULL;
    }
    if (!k.text) { // nothing at all: an empty string
        k.text = calloc(1, 1);
        if (!k.text) return NULL;
    }
    if (len) *len = k.len;
    return k.text;
}
