/* chat_sink.c: the sink every chat layout (chat.c, chat_v4.c) writes into, as ids (chat_encode)
 * or as text (chat_render): a special token becomes its id or its string, a piece of text is
 * encoded or copied (chat_internal.h). */
#include <string.h>

#include "kernels/err.h"
#include "tokenizer/chat_internal.h"

/* ids mode: encode the text held since the last special token */
int chat_flush_text(struct sink *k) {
    if (!k->ids || !k->text.n) return 0;
    int rc =
        tok_encode(k->c->tok, k->text.p, k->text.n, k->c->encode_flags, k->ids, k->err, k->errlen);
    k->text.n = 0;
    return rc;
}

int chat_put_text(struct sink *k, const char *s, size_t n) {
    if (!n) return 0;
    if (tok_buf_put(&k->text, s, n)) return td_errf(k->err, k->errlen, "out of memory");
    return 0;
}

int chat_put_str(struct sink *k, const char *s) {
    return s ? chat_put_text(k, s, strlen(s)) : 0;
}

int chat_put_tok(struct sink *k, int32_t id) {
    if (id < 0) return 0;
    if (k->ids) {
        if (chat_flush_text(k)) return -1;
        if (tok_ids_push(k->ids, id)) return td_errf(k->err, k->errlen, "out of memory");
        return 0;
    }
    size_t n;
    const char *s = tok_str(k->c->tok, id, &n);
    return s ? chat_put_text(k, s, n) : 0;
}

int chat_put_special(struct sink *k, const char *s) {
    int32_t id = tok_id(k->c->tok, s, strlen(s));
    return id >= 0 ? chat_put_tok(k, id) : chat_put_str(k, s);
}
