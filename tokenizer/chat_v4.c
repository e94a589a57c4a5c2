/* chat_v4.c: the DeepSeek V4 chat layout (chat.h; released_formats.md 4.7), the rules of the
 * reference encoding_dsv4.encode_messages written anew in C.
 *
 * The reference works on Python objects: it json.loads a tool call's arguments and writes tool
 * schemas and non-string argument values back with json.dumps. So this file carries a strict
 * JSON reader and a writer that spells values as json.dumps(ensure_ascii=False) does: ", " and
 * ": " separators, only '"', '\\' and control characters escaped, floats as Python's repr.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/err.h"
#include "tokenizer/chat_internal.h"

// ---------------------------------------------------------------------------------------------
// JSON: a tree of nodes in one array, children linked by index

enum jtype { J_NULL, J_FALSE, J_TRUE, J_NUM, J_STR, J_ARR, J_OBJ };

struct jnode {
    enum jtype t;
    size_t off, len; /* J_NUM: the number's text in the source; J_STR: the decoded bytes in
                        jdoc.str */
    long kid, next;  /* J_ARR: first element; J_OBJ: first key (a J_STR; its value follows it);
                        -1 for none */
};

struct jdoc {
    const char *src;
    size_t n_src, at; /* the reader's position in src */
    struct jnode *v;
    size_t n, cap;
    struct tok_buf str;
    const char *what; /* for messages: "message 3: tool call 0 arguments" */
    char *err;
    size_t errlen;
};

#define JSON_MAX_DEPTH 100

static int jerr(struct jdoc *d, const char *why) {
    return td_errf(d->err, d->errlen, "%s: not valid JSON: %s at byte %zu", d->what, why, d->at);
}

static long jnew(struct jdoc *d, enum jtype t) {
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 32;
        struct jnode *v = realloc(d->v, cap * sizeof *v);
        if (!v) return td_errf(d->err, d->errlen, "out of memory");
        d->v = v, d->cap = cap;
    }
    d->v[d->n] = (struct jnode){.t = t, .kid = -1, .next = -1};
    return (long)d->n++;
}

static void jspace(struct jdoc *d) {
    while (d->at < d->n_src && (d->src[d->at] == ' ' || d->src[d->at] == '\t' ||
                                d->src[d->at] == '\n' || d->src[d->at] == '\r'))
        d->at++;
}

static int jlit(struct jdoc *d, const char *w) {
    size_t n = strlen(w);
    if (d->n_src - d->at < n || memcmp(d->src + d->at, w, n)) return 0;
    d->at += n;
    return 1;
}

static int hex4(const char *s, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        int h = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (h < 0) return -1;
        v = v * 16 + (unsigned)h;
    }
    *out = v;
    return 0;
}

/* a string at d->at (its opening quote), decoded into d->str */
static long jstring(struct jdoc *d) {
    long id = jnew(d, J_STR);
    if (id < 0) return -1;
    d->v[id].off = d->str.n;
    d->at++;
    for (;;) {
        if (d->at >= d->n_src) return jerr(d, "the string does not end");
        unsigned char c = (unsigned char)d->src[d->at];
        if (c == '"') break;
        if (c < 0x20) return jerr(d, "a control character inside a string");
        if (c != '\\') {
            size_t run = d->at;
            while (run < d->n_src && d->src[run] != '"' && d->src[run] != '\\' &&
                   (unsigned char)d->src[run] >= 0x20)
                run++;
            if (tok_buf_put(&d->str, d->src + d->at, run - d->at))
                return td_errf(d->err, d->errlen, "out of memory");
            d->at = run;
            continue;
        }
        if (d->at + 1 >= d->n_src) return jerr(d, "the string does not end");
        char e = d->src[d->at + 1], one = 0;
        const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t", *p = strchr(from, e);
        if (e && p) {
            one = to[p - from];
            d->at += 2;
            if (tok_buf_put(&d->str, &one, 1)) return td_errf(d->err, d->errlen, "out of memory");
            continue;
        }
        if (e != 'u') return jerr(d, "an unknown escape");
        unsigned cp, lo;
        if (d->n_src - d->at < 6 || hex4(d->src + d->at + 2, &cp))
            return jerr(d, "a \\u escape without four hex digits");
        if (cp >= 0xDC00 && cp < 0xE000) return jerr(d, "a lone low surrogate");
        if (cp >= 0xD800 && cp < 0xDC00) { // a pair: the low half must follow
            const char *q = d->src + d->at + 6;
            if (d->n_src - d->at < 12 || q[0] != '\\' || q[1] != 'u' || hex4(q + 2, &lo) ||
                lo < 0xDC00 || lo >= 0xE000)
                return jerr(d, "a lone high surrogate");
            d->at += 6;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        d->at += 6;
        char u[4];
        if (tok_buf_put(&d->str, u, (size_t)tok_utf8_put(u, cp)))
            return td_errf(d->err, d->errlen, "out of memory");
    }
    d->at++;
    d->v[id].len = d->str.n - d->v[id].off;
    return id;
}

static int is_digit(char c) {
    return c >= '0' && c <= '9';
}

static long jnumber(struct jdoc *d) {
    size_t s = d->at, i = s;
    const char *p = d->src;
    if (i < d->n_src && p[i] == '-') i++;
    if (i < d->n_src && p[i] == '0')
        i++;
    else if (i < d->n_src && is_digit(p[i]))
        while (i < d->n_src && is_digit(p[i]))
            i++;
    else
        return jerr(d, "a value was expected");
    if (i < d->n_src && p[i] == '.') {
        if (++i >= d->n_src || !is_digit(p[i])) return jerr(d, "a digit must follow '.'");
        while (i < d->n_src && is_digit(p[i]))
            i++;
    }
    if (i < d->n_src && (p[i] == 'e' || p[i] == 'E')) {
        i++;
        if (i < d->n_src && (p[i] == '+' || p[i] == '-')) i++;
        if (i >= d->n_src || !is_digit(p[i])) return jerr(d, "a digit must follow the exponent");
        while (i < d->n_src && is_digit(p[i]))
            i++;
    }
    long id = jnew(d, J_NUM);
    if (id < 0) return -1;
    d->v[id].off = s;
    d->v[id].len = i - s;
    d->at = i;
    return id;
}

struct key {
    const char *p;
    size_t n;
};

static int cmp_key(const void *a, const void *b) {
    const struct key *x = a, *y = b;
    int c = memcmp(x->p, y->p, x->n < y->n ? x->n : y->n);
    return c ? c : (x->n > y->n) - (x->n < y->n);
}

/* json.loads keeps the last of two equal keys; refused here rather than guessed at */
static int jdup_keys(struct jdoc *d, long obj) {
    size_t n = 0;
    for (long k = d->v[obj].kid; k >= 0; k = d->v[d->v[k].next].next)
        n++;
    if (n < 2) return 0;
    struct key *keys = malloc(n * sizeof *keys);
    if (!keys) return td_errf(d->err, d->errlen, "out of memory");
    n = 0;
    for (long k = d->v[obj].kid; k >= 0; k = d->v[d->v[k].next].next)
        keys[n++] = (struct key){.p = d->str.p + d->v[k].off, .n = d->v[k].len};
    qsort(keys, n, sizeof *keys, cmp_key);
    int rc = 0;
    for (size_t i = 1; i < n && !rc; i++)
        if (!cmp_key(&keys[i - 1], &keys[i]))
            rc = td_errf(d->err, d->errlen, "%s: the key \"%.*s\" appears twice in one object",
                         d->what, (int)keys[i].n, keys[i].p);
    free(keys);
    return rc;
}

static long jvalue(struct jdoc *d, int depth) {
    jspace(d);
    if (d->at >= d->n_src) return jerr(d, "a value was expected");
    if (depth > JSON_MAX_DEPTH) return jerr(d, "more than 100 levels of nesting");
    char c = d->src[d->at];
    if (c == '"') return jstring(d);
    if (jlit(d, "null")) return jnew(d, J_NULL);
    if (jlit(d, "true")) return jnew(d, J_TRUE);
    if (jlit(d, "false")) return jnew(d, J_FALSE);
    if (c != '[' && c != '{') return jnumber(d);
    int obj = c == '{';
    long id = jnew(d, obj ? J_OBJ : J_ARR), last = -1;
    if (id < 0) return -1;
    d->at++;
    jspace(d);
    if (d->at < d->n_src && d->src[d->at] == (obj ? '}' : ']')) {
        d->at++;
        return id;
    }
    for (;;) {
        long k = -1;
        if (obj) { // "key" :
            jspace(d);
            if (d->at >= d->n_src || d->src[d->at] != '"') return jerr(d, "a key was expected");
            if ((k = jstring(d)) < 0) return -1;
            jspace(d);
            if (d->at >= d->n_src || d->src[d->at] != ':') return jerr(d, "':' was expected");
            d->at++;
        }
        long v = jvalue(d, depth + 1);
        if (v < 0) return -1;
        if (k >= 0) d->v[k].next = v;
        long head = k >= 0 ? k : v;
        if (last < 0)
            d->v[id].kid = head;
        else
            d->v[last].next = head;
        last = v;
        jspace(d);
        if (d->at < d->n_src && d->src[d->at] == ',') {
            d->at++;
            continue;
        }
        if (d->at < d->n_src && d->src[d->at] == (obj ? '}' : ']')) break;
        return jerr(d, obj ? "',' or '}' was expected" : "',' or ']' was expected");
    }
    d->at++;
    return obj && jdup_keys(d, id) ? -1 : id;
}

/* parse text as one JSON value; 0, or -1 with a message naming what */
static int jparse(struct jdoc *d, const char *text, const char *what, char *err, size_t errlen) {
    memset(d, 0, sizeof *d);
    d->src = text;
    d->n_src = strlen(text);
    d->what = what;
    d->err = err;
    d->errlen = errlen;
    // the strings' buffer exists even when every string is empty ("{\"\": 1}"): offsets into it
    // are taken from d->str.p, never from NULL
    if (tok_buf_put(&d->str, "", 0)) return td_errf(err, errlen, "%s: out of memory", what);
    if (jvalue(d, 0) < 0) return -1;
    jspace(d);
    if (d->at < d->n_src) return jerr(d, "text after the value");
    return 0;
}

static void jfree(struct jdoc *d) {
    free(d->v);
    tok_buf_free(&d->str);
}

/* an object's member named key, or -1 */
static long jget(const struct jdoc *d, long obj, const char *key) {
    size_t n = strlen(key);
    for (long k = d->v[obj].kid; k >= 0; k = d->v[d->v[k].next].next)
        if (d->v[k].len == n && !memcmp(d->str.p + d->v[k].off, key, n)) return d->v[k].next;
    return -1;
}

// ---- the writer: json.dumps(value, ensure_ascii=False)

static int put_c(struct tok_buf *b, const char *s) {
    return tok_buf_put(b, s, strlen(s));
}

/* repr(float(x)): the shortest digits that read back as x, in fixed notation when the decimal
 * point falls within 16 digits of the first one (else d.ddde+XX), with ".0" on integers */
static int py_float(struct tok_buf *b, double x) {
    if (isinf(x)) return put_c(b, x < 0 ? "-Infinity" : "Infinity");
    if (x == 0) return put_c(b, signbit(x) ? "-0.0" : "0.0");
    char e[40];
    for (int p = 0; p < 17; p++) {
        snprintf(e, sizeof e, "%.*e", p, x);
        if (strtod(e, NULL) == x) break;
    }
    char dig[24], out[64];
    int nd = 0, neg = e[0] == '-';
    const char *s = e + neg;
    for (; *s && *s != 'e'; s++)
        if (*s != '.') dig[nd++] = *s;
    while (nd > 1 && dig[nd - 1] == '0')
        nd--;
    int decpt = atoi(s + 1) + 1; // x = 0.dig * 10^decpt
    size_t o = 0;
    if (neg) out[o++] = '-';
    if (decpt > 16 || decpt <= -4) {
        out[o++] = dig[0];
        if (nd > 1) {
            out[o++] = '.';
            memcpy(out + o, dig + 1, (size_t)nd - 1);
            o += (size_t)nd - 1;
        }
        o += (size_t)snprintf(out + o, sizeof out - o, "e%c%02d", decpt - 1 < 0 ? '-' : '+',
                              abs(decpt - 1));
    } else if (decpt <= 0) {
        out[o++] = '0', out[o++] = '.';
        for (int i = 0; i < -decpt; i++)
            out[o++] = '0';
        memcpy(out + o, dig, (size_t)nd);
        o += (size_t)nd;
    } else {
        for (int i = 0; i < decpt || i < nd; i++) {
            if (i == decpt) out[o++] = '.';
            out[o++] = i < nd ? dig[i] : '0';
        }
        if (decpt >= nd) out[o++] = '.', out[o++] = '0';
    }
    return tok_buf_put(b, out, o);
}

static int py_string(struct tok_buf *b, const char *s, size_t n) {
    int rc = tok_buf_put(b, "\"", 1);
    for (size_t i = 0; i < n && !rc;) {
        size_t r = i;
        while (r < n && (unsigned char)s[r] >= 0x20 && s[r] != '"' && s[r] != '\\')
            r++;
        rc = tok_buf_put(b, s + i, r - i);
        if (r == n || rc) break;
        char esc[8];
        unsigned char c = (unsigned char)s[r];
        const char *p = strchr("\"\\\b\f\n\r\t", c);
        if (c && p)
            snprintf(esc, sizeof esc, "\\%c", "\"\\bfnrt"[p - "\"\\\b\f\n\r\t"]);
        else
            snprintf(esc, sizeof esc, "\\u%04x", c);
        rc = put_c(b, esc);
        i = r + 1;
    }
    return rc ? rc : tok_buf_put(b, "\"", 1);
}

static int py_dump(struct tok_buf *b, const struct jdoc *d, long id) {
    const struct jnode *v = &d->v[id];
    switch (v->t) {
    case J_NULL: return put_c(b, "null");
    case J_FALSE: return put_c(b, "false");
    case J_TRUE: return put_c(b, "true");
    case J_STR: return py_string(b, d->str.p + v->off, v->len);
    case J_NUM: {
        const char *s = d->src + v->off;
        if (!memchr(s, '.', v->len) && !memchr(s, 'e', v->len) && !memchr(s, 'E', v->len))
            return v->len == 2 && !memcmp(s, "-0", 2) ? put_c(b, "0") : tok_buf_put(b, s, v->len);
        char num[512];
        if (v->len >= sizeof num) { // strtod needs the text NUL-terminated
            char *big = strndup(s, v->len);
            int rc = big ? py_float(b, strtod(big, NULL)) : -1;
            free(big);
            return rc;
        }
        memcpy(num, s, v->len);
        num[v->len] = 0;
        return py_float(b, strtod(num, NULL));
    }
    case J_ARR:
    case J_OBJ: {
        int obj = v->t == J_OBJ, rc = tok_buf_put(b, obj ? "{" : "[", 1);
        for (long k = v->kid; k >= 0 && !rc; k = d->v[obj ? d->v[k].next : k].next) {
            if (k != v->kid) rc = put_c(b, ", ");
            if (!rc && obj) rc = py_dump(b, d, k) || put_c(b, ": ");
            if (!rc) rc = py_dump(b, d, obj ? d->v[k].next : k);
        }
        return rc ? rc : tok_buf_put(b, obj ? "}" : "]", 1);
    }
    }
    return -1;
}

// ---------------------------------------------------------------------------------------------
// the layout

/* templates: \1 is the ｜DSML｜ token, \2 <think>, \3 </think> (put_marked) */
#define DSML "\1"
static const char tools_head[] =
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can "
    "invoke tools by writing a \"<" DSML "tool_calls>\" block like the following:\n\n<" DSML
    "tool_calls>\n<" DSML "invoke name=\"$TOOL_NAME\">\n<" DSML
    "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" DSML
    "parameter>\n...\n</" DSML "invoke>\n<" DSML "invoke name=\"$TOOL_NAME2\">\n...\n</" DSML
    "invoke>\n</" DSML "tool_calls>\n\nString parameters should be specified as is and set "
    "`string=\"true\"`. For all other types (numbers, booleans, arrays, objects), pass the value "
    "in JSON format and set `string=\"false\"`.\n\nIf thinking_mode is enabled (triggered by "
    "\2), you MUST output your complete reasoning inside \2...\3 BEFORE any tool calls or final "
    "response.\n\nOtherwise, output directly after \3 with tool calls or final response.\n\n### "
    "Available Tool Schemas\n\n";
static const char tools_tail[] = "\n\nYou MUST strictly follow the above defined tool name and "
                                 "parameter schemas to invoke tool calls.\n";
static const char effort_max[] =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\nYou MUST be very thorough "
    "in your thinking and comprehensively decompose the problem to resolve the root cause, "
    "rigorously stress-testing your logic against all potential paths, edge cases, and "
    "adversarial scenarios.\nExplicitly write out your entire deliberation process, documenting "
    "every intermediate step, considered alternative, and rejected hypothesis to ensure "
    "absolutely no assumption is left unchecked.\n\n";

/* a template: text, with \1 \2 \3 as the special tokens they stand for */
static int put_marked(struct sink *k, const char *s) {
    static const char *special[] = {NULL, "｜DSML｜", "<think>", "</think>"};
    int rc = 0;
    while (*s && !rc) {
        size_t r = strcspn(s, "\1\2\3");
        rc = chat_put_text(k, s, r);
        if (!rc && s[r]) rc = chat_put_special(k, special[(int)s[r]]);
        s += r + (s[r] != 0);
    }
    return rc;
}

/* a merged run of messages rendered as one turn: a user turn is every user and tool message
 * in a row (tool results re-ordered to the order of the calls they answer) */
struct turn {
    enum chat_role role; /* SYSTEM, USER, DEVELOPER, ASSISTANT or LATEST_REMINDER */
    size_t first, n;     /* the messages [first, first + n) */
};

struct v4 {
    struct sink *k;
    const struct chat_msg *m;
    size_t n_msgs;
    long *call;  /* [n_msgs]: a tool message's index among its assistant's calls */
    size_t *ord; /* [n_msgs]: the messages in rendering order */
    struct turn *t;
    size_t n_turns;
    int thinking, drop;
};

/* "## Tools" with one json.dumps line per tool's "function"; tools is the OpenAI array */
static int put_tools(struct sink *k, const char *tools, size_t i) {
    char what[64];
    snprintf(what, sizeof what, "message %zu: tools", i);
    struct jdoc d;
    int rc = jparse(&d, tools, what, k->err, k->errlen);
    struct tok_buf line = {0};
    if (!rc && d.v[0].t != J_ARR) rc = td_errf(k->err, k->errlen, "%s: not a JSON array", what);
    if (!rc && d.v[0].kid >= 0) rc = chat_put_str(k, "\n\n") || put_marked(k, tools_head);
    size_t j = 0;
    for (long e = rc ? -1 : d.v[0].kid; e >= 0 && !rc; e = d.v[e].next, j++) {
        long f = d.v[e].t == J_OBJ ? jget(&d, e, "function") : -1;
        if (f < 0 || d.v[f].t != J_OBJ) {
            rc = td_errf(k->err, k->errlen, "%s[%zu]: no \"function\" object", what, j);
            break;
        }
        line.n = 0;
        rc = (j && put_c(&line, "\n")) || py_dump(&line, &d, f);
        if (!rc) rc = chat_put_text(k, line.p, line.n);
    }
    if (!rc && d.v[0].kid >= 0) rc = chat_put_str(k, tools_tail);
    tok_buf_free(&line);
    jfree(&d);
    return rc;
}

/* 1 when message i carries a non-empty tools array (which keeps all reasoning) */
static int has_tools(struct sink *k, const struct chat_msg *m, size_t i, int *out) {
    *out = 0;
    if (!m->tools) return 0;
    char what[64];
    snprintf(what, sizeof what, "message %zu: tools", i);
    struct jdoc d;
    int rc = jparse(&d, m->tools, what, k->err, k->errlen);
    if (!rc && d.v[0].t != J_ARR) rc = td_errf(k->err, k->errlen, "%s: not a JSON array", what);
    if (!rc) *out = d.v[0].kid >= 0;
    jfree(&d);
    return rc;
}

/* "\n\n<DSML tool_calls>\n" invokes "\n</DSML tool_calls>": one invoke per call, one parameter
 * per key of its arguments, strings verbatim and other values as JSON */
static int put_calls(struct sink *k, const struct chat_msg *m, size_t i) {
    int rc = put_marked(k, "\n\n<" DSML "tool_calls>\n");
    struct tok_buf val = {0};
    for (size_t j = 0; j < m->n_tool_calls && !rc; j++) {
        const struct chat_tool_call *tc = &m->tool_calls[j];
        char what[64];
        snprintf(what, sizeof what, "message %zu: tool call %zu arguments", i, j);
        if (!tc->name || !tc->name[0]) {
            rc = td_errf(k->err, k->errlen, "message %zu: tool call %zu has no name", i, j);
            break;
        }
        if (!tc->arguments) {
            rc = td_errf(k->err, k->errlen, "%s: none given (a JSON object)", what);
            break;
        }
        struct jdoc d;
        rc = jparse(&d, tc->arguments, what, k->err, k->errlen);
        if (!rc && d.v[0].t != J_OBJ)
            rc = td_errf(k->err, k->errlen, "%s: a JSON object was expected", what);
        if (!rc) rc = put_marked(k, j ? "\n<" DSML "invoke name=\"" : "<" DSML "invoke name=\"");
        if (!rc) rc = chat_put_str(k, tc->name) || chat_put_str(k, "\">\n");
        for (long key = rc ? -1 : d.v[0].kid; key >= 0 && !rc; key = d.v[d.v[key].next].next) {
            const struct jnode *kn = &d.v[key], *vn = &d.v[kn->next];
            rc = put_marked(k, key == d.v[0].kid ? "<" DSML "parameter name=\""
                                                 : "\n<" DSML "parameter name=\"");
            if (!rc) rc = chat_put_text(k, d.str.p + kn->off, kn->len);
            if (!rc)
                rc = chat_put_str(k,
                                  vn->t == J_STR ? "\" string=\"true\">" : "\" string=\"false\">");
            val.n = 0;
            if (!rc && vn->t == J_STR) rc = chat_put_text(k, d.str.p + vn->off, vn->len);
            if (!rc && vn->t != J_STR)
                rc = py_dump(&val, &d, kn->next) || chat_put_text(k, val.p, val.n);
            if (!rc) rc = put_marked(k, "</" DSML "parameter>");
        }
        if (!rc) rc = put_marked(k, "\n</" DSML "invoke>");
        jfree(&d);
    }
    tok_buf_free(&val);
    return rc ? rc : put_marked(k, "\n</" DSML "tool_calls>");
}

/* which call of the latest assistant message with tool calls each tool message answers */
static int match_results(struct v4 *s) {
    const struct chat_msg *m = s->m;
    long calls = -1; // the latest assistant message with tool calls
    for (size_t i = 0; i < s->n_msgs; i++) {
        if (m[i].role == CHAT_ROLE_ASSISTANT && m[i].n_tool_calls) calls = (long)i;
        if (m[i].role != CHAT_ROLE_TOOL) continue;
        if (calls < 0)
            return td_errf(s->k->err, s->k->errlen,
                           "message %zu (tool): no assistant message with tool calls comes "
                           "before this tool result",
                           i);
        const struct chat_msg *a = &m[calls];
        const char *id = m[i].tool_call_id;
        s->call[i] = -1;
        if (!id || !id[0]) {
            if (a->n_tool_calls != 1)
                return td_errf(s->k->err, s->k->errlen,
                               "message %zu (tool): no tool_call_id, and message %ld made %zu "
                               "tool calls",
                               i, calls, a->n_tool_calls);
            s->call[i] = 0;
            continue;
        }
        for (size_t j = 0; j < a->n_tool_calls; j++) // the last of equal ids, as a dict keeps
            if (a->tool_calls[j].id && !strcmp(a->tool_calls[j].id, id)) s->call[i] = (long)j;
        if (s->call[i] < 0)
            return td_errf(s->k->err, s->k->errlen,
                           "message %zu (tool): tool_call_id \"%s\" matches no tool call of "
                           "message %ld",
                           i, id, calls);
    }
    return 0;
}

/* a tool result's place: the call it answers, then where it stood (a stable sort) */
struct slot {
    long call;
    size_t msg;
};

static int cmp_slot(const void *a, const void *b) {
    const struct slot *x = a, *y = b;
    return x->call != y->call ? (x->call > y->call) - (x->call < y->call)
                              : (x->msg > y->msg) - (x->msg < y->msg);
}

/* the turns, with each user turn's tool results sorted into call order among their slots */
static int make_turns(struct v4 *s) {
    const struct chat_msg *m = s->m;
    struct slot *res = malloc((s->n_msgs + 1) * sizeof *res);
    if (!res) return td_errf(s->k->err, s->k->errlen, "out of memory");
    for (size_t i = 0; i < s->n_msgs;) {
        enum chat_role r = m[i].role;
        size_t e = i + 1;
        if (r == CHAT_ROLE_USER || r == CHAT_ROLE_TOOL) {
            r = CHAT_ROLE_USER;
            while (e < s->n_msgs && (m[e].role == CHAT_ROLE_USER || m[e].role == CHAT_ROLE_TOOL))
                e++;
            size_t nr = 0;
            for (size_t j = i; j < e; j++)
                if (m[j].role == CHAT_ROLE_TOOL)
                    res[nr++] = (struct slot){.call = s->call[j], .msg = j};
            qsort(res, nr, sizeof *res, cmp_slot);
            for (size_t j = i, r2 = 0; j < e; j++) // the text blocks keep their places
                if (m[j].role == CHAT_ROLE_TOOL) s->ord[j] = res[r2++].msg;
        }
        s->t[s->n_turns++] = (struct turn){.role = r, .first = i, .n = e - i};
        i = e;
    }
    free(res);
    return 0;
}

static int put_turn(struct v4 *s, size_t ti, long last_user, int gen) {
    struct sink *k = s->k;
    const struct chat *c = k->c;
    const struct turn *t = &s->t[ti];
    const struct chat_msg *m = &s->m[t->first];
    int rc = 0;
    if (ti == 0 && s->thinking && c->effort == CHAT_EFFORT_MAX) rc = chat_put_str(k, effort_max);
    switch (t->role) {
    case CHAT_ROLE_SYSTEM:
        rc = rc || chat_put_str(k, m->content) || (m->tools && put_tools(k, m->tools, t->first));
        break;
    case CHAT_ROLE_DEVELOPER:
        if (!m->content || !m->content[0])
            return td_errf(k->err, k->errlen, "message %zu (developer): the content is empty",
                           t->first);
        rc = rc || chat_put_tok(k, c->user) || chat_put_str(k, m->content) ||
             (m->tools && put_tools(k, m->tools, t->first));
        break;
    case CHAT_ROLE_USER:
        rc = rc || chat_put_tok(k, c->user);
        for (size_t j = 0; j < t->n && !rc; j++) {
            const struct chat_msg *b = &s->m[s->ord[t->first + j]];
            if (j) rc = chat_put_str(k, "\n\n");
            if (!rc && b->role == CHAT_ROLE_TOOL)
                rc = chat_put_special(k, "<tool_result>") || chat_put_str(k, b->content) ||
                     chat_put_special(k, "</tool_result>");
            else if (!rc)
                rc = chat_put_str(k, b->content);
        }
        break;
    case CHAT_ROLE_LATEST_REMINDER:
        rc = rc || chat_put_special(k, "<｜latest_reminder｜>") || chat_put_str(k, m->content);
        break;
    case CHAT_ROLE_ASSISTANT:
        // thinking mode keeps the reasoning of the answer to the last user turn, and of every
        // turn when nothing is dropped; earlier turns were closed by their user turn's </think>
        if (s->thinking && (!s->drop || (long)ti > last_user))
            rc = rc || chat_put_str(k, m->reasoning) || chat_put_special(k, "</think>");
        rc = rc || chat_put_str(k, m->content) || (m->n_tool_calls && put_calls(k, m, t->first)) ||
             chat_put_tok(k, c->eos);
        break;
    case CHAT_ROLE_TOOL: TD_ABORT("a tool message outside a user turn");
    }
    if (rc || (t->role != CHAT_ROLE_USER && t->role != CHAT_ROLE_DEVELOPER)) return rc;
    // the assistant's turn opens after a user turn that is last or followed by an answer or a
    // reminder; without a generation prompt, not after the last one (only reminders after it)
    if (ti + 1 < s->n_turns && s->t[ti + 1].role != CHAT_ROLE_ASSISTANT &&
        s->t[ti + 1].role != CHAT_ROLE_LATEST_REMINDER)
        return 0;
    size_t after = ti + 1;
    while (after < s->n_turns && s->t[after].role == CHAT_ROLE_LATEST_REMINDER)
        after++;
    if (!gen && after == s->n_turns) return 0;
    int open = s->thinking && (!s->drop || (long)ti >= last_user);
    return chat_put_tok(k, c->assistant) || chat_put_special(k, open ? "<think>" : "</think>");
}

int chat_build_v4(struct sink *k, const struct chat_msg *m, size_t n, int gen) {
    struct v4 s = {.k = k,
                   .m = m,
                   .n_msgs = n,
                   .thinking = k->c->think == CHAT_THINK_ON,
                   .call = malloc((n + 1) * sizeof *s.call),
                   .ord = malloc((n + 1) * sizeof *s.ord),
                   .t = malloc((n + 1) * sizeof *s.t)};
    int rc = 0;
    if (!s.call || !s.ord || !s.t) rc = td_errf(k->err, k->errlen, "out of memory");
    for (size_t i = 0; i < n && !rc; i++)
        s.ord[i] = i;
    if (!rc) rc = match_results(&s);
    // any message with tools keeps every turn's reasoning (the reference turns drop_thinking
    // off), else thinking mode drops the reasoning before the last user turn
    int tools = 0;
    for (size_t i = 0; i < n && !rc && !tools; i++)
        rc = has_tools(k, &m[i], i, &tools);
    s.drop = s.thinking && k->c->drop_thinking && !tools;
    if (!rc) rc = make_turns(&s);
    long last_user = -1;
    for (size_t i = 0; i < s.n_turns && !rc; i++)
        if (s.t[i].role == CHAT_ROLE_USER || s.t[i].role == CHAT_ROLE_DEVELOPER)
            last_user = (long)i;
    if (s.drop && !rc) { // developer turns before the last user turn go entirely
        size_t w = 0;
        long lu = -1;
        for (size_t i = 0; i < s.n_turns; i++) {
            if (s.t[i].role == CHAT_ROLE_DEVELOPER && (long)i < last_user) continue;
            if ((long)i == last_user) lu = (long)w;
            s.t[w++] = s.t[i];
        }
        s.n_turns = w;
        last_user = lu;
    }
    if (!rc) rc = chat_put_tok(k, k->c->bos);
    for (size_t i = 0; i < s.n_turns && !rc; i++)
        rc = put_turn(&s, i, last_user, gen);
    free(s.call);
    free(s.ord);
    free(s.t);
    return rc ? -1 : 0;
}
