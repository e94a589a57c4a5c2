/* chat_internal.h: what chat.c and chat_v4.c share: the sink one walk over the messages writes
 * into, as ids (chat_encode) or as text (chat_render) (chat_sink.c), and the V4 layout. */
#ifndef TD_CHAT_INTERNAL_H
#define TD_CHAT_INTERNAL_H

#include "tokenizer/chat.h"
#include "tokenizer/tok_internal.h"

struct sink {
    const struct chat *c;
    struct tok_ids *ids; /* ids mode; NULL in text mode */
    struct tok_buf text; /* text mode: the rendering; ids mode: text not yet encoded */
    char *err;
    size_t errlen;
};

/* chat_sink.c. ids mode: encode the text held since the last special token */
int chat_flush_text(struct sink *k);
/* text: copied, or (ids mode) held until the next special token so that the text between two
 * special tokens is encoded in one piece, as HF encodes the rendered string */
int chat_put_text(struct sink *k, const char *s, size_t n);
int chat_put_str(struct sink *k, const char *s); /* NULL puts nothing */
/* a special token by id; -1 puts nothing (a format's optional token the vocab lacks) */
int chat_put_tok(struct sink *k, int32_t id);
/* a special token by its text: the token when the vocab has it, else the text */
int chat_put_special(struct sink *k, const char *s);

/* the V4 layout (chat_v4.c); messages already checked by chat.c */
int chat_build_v4(struct sink *k, const struct chat_msg *m, size_t n, int gen);

#endif
