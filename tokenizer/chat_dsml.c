/* chat_dsml.c: a V4 reply's tool calls read back from its DSML block (chat.h), the way back of
 * chat_v4.c's put_calls, by the rules of the reference encoding_dsv4.parse_tool_calls:
 *
 *   CONTENT "\n\n<｜DSML｜tool_calls>\n"
 *     "<｜DSML｜invoke name=\"NAME\">\n"                       one per call, "\n" between them
 *       "<｜DSML｜parameter name=\"K\" string=\"true|false\">V</｜DSML｜parameter>"  "\n" between
 *     "\n</｜DSML｜invoke>"
 *   "\n</｜DSML｜tool_calls>"                                  and nothing after it (then EOS)
 *
 * Each tag is found as the reference finds it, as the first of the tags that may come next (a
 * parameter's value runs to the first "/｜DSML｜parameter" and may hold any other text), and the
 * text between two tags must be what the layout puts there (">\n"). The arguments are written as
 * the reference's decode_dsml_to_arguments writes them, {"K": V, ...} with ", " and ": ": a
 * string="true" value as a JSON string, a string="false" value verbatim once jansson has read it
 * as one JSON value (so the model's spelling of a number stays). Anything else is a failure and
 * the caller keeps the whole text as content: nothing is guessed.
 */
#define _GNU_SOURCE /* memmem */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/err.h"
#include "tokenizer/chat.h"
#include "tokenizer/tok_internal.h"

#define DSML_TOK "｜DSML｜"

/* a tag: the text before the DSML token and the text after it */
struct tag {
    const char *pre, *post;
};

static const struct tag t_invoke = {.pre = "<", .post = "invoke"},
                        t_invoke_end = {.pre = "</", .post = "invoke"},
                        t_param = {.pre = "<", .post = "parameter"},
                        t_param_end = {.pre = "/", .post = "parameter"},
                        t_calls_end = {.pre = "</", .post = "tool_calls>"};

/* the first of the tags a and b (b may be NULL) that lies in [p, end): its start in *at, which
 * one in *which, its end returned; NULL when neither is there. One scan over the DSML tokens. */
static const char *next_tag(const char *p, const char *end, const struct tag *a,
                            const struct tag *b, const char **at, const struct tag **which) {
    const size_t nd = strlen(DSML_TOK);
    for (const char *q = p; (q = memmem(q, (size_t)(end - q), DSML_TOK, nd)); q += nd)
        for (int k = 0; k < 2; k++) {
            const struct tag *t = k ? b : a;
            size_t npre = t ? strlen(t->pre) : 0, npost = t ? strlen(t->post) : 0;
            if (!t || (size_t)(q - p) < npre || memcmp(q - npre, t->pre, npre) ||
                (size_t)(end - q) - nd < npost || memcmp(q + nd, t->post, npost))
                continue;
            *at = q - npre;
            *which = t;
            return q + nd + npost;
        }
    return NULL;
}

static int is(const char *s, const char *end, const char *w) {
    return (size_t)(end - s) == strlen(w) && !memcmp(s, w, (size_t)(end - s));
}

static int utf8(const char *s, size_t n) {
    return tok_utf8_valid_prefix(s, n) == n;
}

/* a name: UTF-8 without NUL (a name is handed on NUL-terminated, a key would not load back) */
static int name_ok(const char *s, size_t n) {
    return utf8(s, n) && !memchr(s, 0, n);
}

struct dsml {
    const char *text;   /* the reply, for the byte offsets of messages */
    struct tok_buf buf; /* the names and arguments, each NUL-terminated */
    size_t *off;        /* [2 * n_calls]: each call's name and arguments offsets in buf */
    size_t n_calls, cap;
    json_t *keys; /* the current call's parameter names (a set) */
    char *err;
    size_t errlen;
};

static int put(struct dsml *d, const char *s, size_t n) {
    return tok_buf_put(&d->buf, s, n) ? td_errf(d->err, d->errlen, "out of memory") : 0;
}

static int puts0(struct dsml *d, const char *s) {
    return put(d, s, strlen(s) + 1); // with its NUL
}

/* s[0, n) (UTF-8) as a JSON string, escaped by jansson */
static int put_json_str(struct dsml *d, const char *s, size_t n) {
    json_t *v = json_stringn(s, n);
    char *j = v ? json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    int rc = j ? put(d, j, strlen(j)) : td_errf(d->err, d->errlen, "out of memory");
    free(j);
    json_decref(v);
    return rc;
}

/* JSON's whitespace, as jansson skips it */
static int jspace(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* a parameter's text between "<｜DSML｜parameter" and "/｜DSML｜parameter",
 * ` name="K" string="true|false">V<`, onto the call's arguments as `"K": V` */
static int put_param(struct dsml *d, const char *s, const char *e, int first) {
    static const char head[] = " name=\"", s_true[] = "\" string=\"true\">",
                      s_false[] = "\" string=\"false\">";
    size_t c = d->n_calls - 1, at = (size_t)(s - d->text);
    if ((size_t)(e - s) < strlen(head) + 1 || memcmp(s, head, strlen(head)) || e[-1] != '<')
        return td_errf(d->err, d->errlen,
                       "call %zu: a parameter at byte %zu is not ' name=\"K\" "
                       "string=\"true|false\">VALUE<'",
                       c, at);
    const char *k = s + strlen(head), *v = NULL, *kend = NULL;
    e--; // the value ends at the closing tag's '<'
    int str = 0;
    for (const char *q = k; q < e && !kend; q++) { // the first `" string="true|false">`
        if (*q != '"') continue;
        if ((size_t)(e - q) >= strlen(s_true) && !memcmp(q, s_true, strlen(s_true)))
            kend = q, v = q + strlen(s_true), str = 1;
        else if ((size_t)(e - q) >= strlen(s_false) && !memcmp(q, s_false, strlen(s_false)))
            kend = q, v = q + strlen(s_false);
    }
    if (!kend)
        return td_errf(d->err, d->errlen,
                       "call %zu: the parameter at byte %zu has no string=\"true\" or "
                       "string=\"false\"",
                       c, at);
    size_t nk = (size_t)(kend - k);
    int shown = nk > 40 ? 40 : (int)nk;
    if (!name_ok(k, nk) || !utf8(v, (size_t)(e - v)))
        return td_errf(d->err, d->errlen,
                       "call %zu: the parameter at byte %zu is not UTF-8 (or its name holds NUL)",
                       c, at);
    if (json_object_getn(d->keys, k, nk))
        return td_errf(d->err, d->errlen, "call %zu: the parameter \"%.*s\" is given twice", c,
                       shown, k);
    if (json_object_setn_new(d->keys, k, nk, json_null()))
        return td_errf(d->err, d->errlen, "out of memory");
    if ((!first && put(d, ", ", 2)) || put_json_str(d, k, nk) || put(d, ": ", 2)) return -1;
    if (str) return put_json_str(d, v, (size_t)(e - v));
    if (memchr(v, 0, (size_t)(e - v))) // jansson reads past it; the copy below would end there
        return td_errf(d->err, d->errlen,
                       "call %zu: the parameter \"%.*s\" (string=\"false\") is not valid JSON: "
                       "it holds a NUL byte",
                       c, shown, k);
    json_error_t je;
    json_t *j = json_loadb(v, (size_t)(e - v),
                           JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL, &je);
    if (!j)
        return td_errf(d->err, d->errlen,
                       "call %zu: the parameter \"%.*s\" (string=\"false\") is not valid JSON: %s",
                       c, shown, k, je.text);
    json_decref(j);
    while (v < e && jspace(*v))
        v++;
    while (e > v && jspace(e[-1]))
        e--;
    return put(d, v, (size_t)(e - v));
}

/* one invoke, from after its "<｜DSML｜invoke" to after its "</｜DSML｜invoke"; *p moves on */
static int put_invoke(struct dsml *d, const char **p, const char *end) {
    size_t c = d->n_calls, at0 = (size_t)(*p - d->text);
    const char *at, *q;
    const struct tag *w;
    if (!(q = next_tag(*p, end, &t_param, &t_invoke_end, &at, &w)))
        return td_errf(d->err, d->errlen, "call %zu (byte %zu): the invoke does not end", c, at0);
    // ` name="NAME">\n`: the reference's ^\s*name="(.*?)">\n$, whose $ allows one more "\n"
    const char *s = *p, *e = at;
    while (s < e && (jspace(*s) || *s == '\f' || *s == '\v'))
        s++;
    if ((size_t)(e - s) > 6 && !memcmp(s, "name=\"", 6)) {
        s += 6;
        e = (size_t)(e - s) >= 4 && !memcmp(e - 4, "\">\n\n", 4) ? e - 4
            : (size_t)(e - s) >= 3 && !memcmp(e - 3, "\">\n", 3) ? e - 3
                                                                 : NULL;
    } else {
        e = NULL;
    }
    if (!e || e == s || !name_ok(s, (size_t)(e - s)))
        return td_errf(d->err, d->errlen,
                       "call %zu (byte %zu): the invoke is not ' name=\"NAME\">' and a newline", c,
                       at0);
    if (d->n_calls == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 4, *o = realloc(d->off, 2 * cap * sizeof *o);
        if (!o) return td_errf(d->err, d->errlen, "out of memory");
        d->off = o, d->cap = cap;
    }
    d->off[2 * c] = d->buf.n;
    int rc = put(d, s, (size_t)(e - s)) || put(d, "", 1);
    d->off[2 * c + 1] = d->buf.n;
    d->n_calls++;
    json_object_clear(d->keys);
    rc = rc || put(d, "{", 1);
    for (int first = 1; !rc && w == &t_param; first = 0) {
        const char *v0 = q;
        if (!(q = next_tag(v0, end, &t_param_end, NULL, &at, &w)))
            return td_errf(d->err, d->errlen, "call %zu: a parameter does not end", c);
        if (put_param(d, v0, at, first)) return -1;
        const char *gap = q;
        if (!(q = next_tag(gap, end, &t_param, &t_invoke_end, &at, &w)))
            return td_errf(d->err, d->errlen, "call %zu: the invoke does not end", c);
        if (!is(gap, at, ">\n"))
            return td_errf(d->err, d->errlen,
                           "call %zu: \">\" and a newline were expected at byte %zu", c,
                           (size_t)(gap - d->text));
    }
    *p = q;
    return rc || puts0(d, "}") ? -1 : 0;
}

int chat_parse_calls(const char *text, size_t n, struct chat_reply *r, char *err, size_t errlen) {
    memset(r, 0, sizeof *r);
    r->content_len = n;
    const char *end = text + n,
               *m = memmem(text, n, CHAT_V4_CALLS_MARK, strlen(CHAT_V4_CALLS_MARK));
    if (!m) return 0;
    struct dsml d = {.text = text, .keys = json_object(), .err = err, .errlen = errlen};
    int rc = d.keys ? 0 : td_errf(err, errlen, "out of memory");
    const char *p = m + strlen(CHAT_V4_CALLS_MARK), *at, *q;
    const struct tag *w = NULL;
    while (!rc) { // ">\n" then an invoke or the block's end
        if (!(q = next_tag(p, end, &t_invoke, &t_calls_end, &at, &w))) {
            rc = td_errf(err, errlen,
                         "the tool_calls block at byte %zu does not end (%zu calls "
                         "read)",
                         (size_t)(m - text), d.n_calls);
            break;
        }
        if (!is(p, at, ">\n")) {
            rc = td_errf(err, errlen, "\">\" and a newline were expected at byte %zu",
                         (size_t)(p - text));
            break;
        }
        p = q;
        if (w == &t_calls_end) break;
        rc = put_invoke(&d, &p, end);
    }
    if (!rc && p != end)
        rc = td_errf(err, errlen, "%zu bytes of text follow the tool_calls block",
                     (size_t)(end - p));
    if (!rc && !d.n_calls) rc = td_errf(err, errlen, "the tool_calls block holds no invoke");
    if (!rc && !(r->calls = malloc(d.n_calls * sizeof *r->calls)))
        rc = td_errf(err, errlen, "out of memory");
    json_decref(d.keys);
    if (rc) {
        free(d.off);
        tok_buf_free(&d.buf);
        free(r->calls);
        memset(r, 0, sizeof *r);
        r->content_len = n;
        return -1;
    }
    r->buf = d.buf.p;
    r->n_calls = d.n_calls;
    r->content_len = (size_t)(m - text);
    for (size_t i = 0; i < d.n_calls; i++)
        r->calls[i] = (struct chat_call){.name = d.buf.p + d.off[2 * i],
                                         .arguments = d.buf.p + d.off[2 * i + 1]};
    free(d.off);
    return 1;
}

void chat_reply_free(struct chat_reply *r) {
    free(r->calls);
    free(r->buf);
    memset(r, 0, sizeof *r);
}
