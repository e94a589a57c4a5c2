/* request.c: a /v1/completions or /v1/chat/completions body into a job: every field checked
 * against the OpenAI shapes (server.md sections 1.2 and 7), fields we do not implement but
 * whose absence would change the answer refused, the others accepted and counted. */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/internal.h"

json_t *api_error(const char *type, const char *code, const char *param, const char *fmt, ...) {
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    // the message may quote the request (jansson's parse errors do): bytes that are not UTF-8
    // become '?', so the error object always exists
    for (size_t i = 0, n = strlen(msg); i < n;) {
        size_t k = tok_utf8_valid_prefix(msg + i, n - i);
        i += k;
        if (i < n) msg[i++] = '?';
    }
    return json_pack("{s:{s:s,s:s,s:s?,s:s?}}", "error", "message", msg, "type", type, "param",
                     param, "code", code);
}

#define BAD(param, ...)                                                                            \
    do {                                                                                           \
        *err = api_error("invalid_request_error", NULL, param, __VA_ARGS__);                       \
        return 400;                                                                                \
    } while (0)

void job_free_request(struct job *j) {
    for (int i = 0; i < j->n_stops; i++)
        free(j->stops[i]);
    for (int i = 0; i < j->n_prompts; i++)
        free(j->prompts[i]);
    free(j->prompts);
    free(j->prompt_lens);
    free(j->log_prompt);
    j->n_stops = j->n_prompts = 0;
    j->prompts = NULL;
    j->prompt_lens = NULL;
    j->log_prompt = NULL;
}

/* fields that change what a correct answer is, which we do not implement: refused */
static int unsupported(const json_t *b, json_t **err) {
    const json_t *v;
    if ((v = json_object_get(b, "functions")) && !json_is_null(v))
        BAD("functions", "functions are not supported by this server");
    // tools go into the prompt (the chat format says how, or refuses them); what a V4 model
    // calls comes back as tool_calls (server.c): nothing forces a call
    if ((v = json_object_get(b, "tool_choice")) && !json_is_null(v) &&
        !(json_is_string(v) &&
          (!strcmp(json_string_value(v), "none") || !strcmp(json_string_value(v), "auto"))))
        BAD("tool_choice", "tool_choice other than \"auto\" or \"none\" is not supported");
    if ((v = json_object_get(b, "response_format")) && !json_is_null(v)) {
        const char *t = json_string_value(json_object_get(v, "type"));
        if (!t || strcmp(t, "text"))
            BAD("response_format",
                "response_format %s is not supported (no constrained decoding); only text",
                t ? t : "(no type)");
    }
    if ((v = json_object_get(b, "logprobs")) && !json_is_null(v) && !json_is_false(v) &&
        !(json_is_integer(v) && json_integer_value(v) == 0))
        BAD("logprobs", "logprobs are not supported by this server yet");
    if ((v = json_object_get(b, "top_logprobs")) && !json_is_null(v) &&
        !(json_is_integer(v) && json_integer_value(v) == 0))
        BAD("top_logprobs", "top_logprobs are not supported by this server yet");
    if ((v = json_object_get(b, "best_of")) && !json_is_null(v) &&
        !(json_is_integer(v) && json_integer_value(v) == 1))
        BAD("best_of", "best_of other than 1 is not supported");
    if ((v = json_object_get(b, "echo")) && json_is_true(v)) BAD("echo", "echo is not supported");
    if ((v = json_object_get(b, "suffix")) && json_is_string(v) && json_string_length(v))
        BAD("suffix", "suffix is not supported");
    if ((v = json_object_get(b, "logit_bias")) && json_is_object(v) && json_object_size(v))
        BAD("logit_bias", "logit_bias is not supported");
    const char *zero[] = {"presence_penalty", "frequency_penalty", "min_p", "min_tokens"};
    for (size_t i = 0; i < sizeof zero / sizeof *zero; i++)
        if ((v = json_object_get(b, zero[i])) && !json_is_null(v) &&
            !(json_is_number(v) && json_number_value(v) == 0.0))
            BAD(zero[i], "%s other than 0 is not supported", zero[i]);
    if ((v = json_object_get(b, "repetition_penalty")) && !json_is_null(v) &&
        !(json_is_number(v) && json_number_value(v) == 1.0))
        BAD("repetition_penalty", "repetition_penalty other than 1 is not supported");
    return 0;
}

/* a number field: absent/null keeps *out; else it must be a number in [lo, hi] */
static int num_field(const json_t *b, const char *k, double lo, double hi, double *out,
                     json_t **err) {
    const json_t *v = json_object_get(b, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) BAD(k, "'%s' must be a number", k);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) BAD(k, "'%s' = %g is outside [%g, %g]", k, x, lo, hi);
    *out = x;
    return 0;
}

static int int_field(const json_t *b, const char *k, long long lo, long long hi, long long *out,
                     json_t **err) {
    const json_t *v = json_object_get(b, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v)) BAD(k, "'%s' must be an integer", k);
    long long x = json_integer_value(v);
    if (x < lo || x > hi) BAD(k, "'%s' = %lld is outside [%lld, %lld]", k, x, lo, hi);
    *out = x;
    return 0;
}

static int bool_field(const json_t *b, const char *k, int *out, json_t **err) {
    const json_t *v = json_object_get(b, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) BAD(k, "'%s' must be true or false", k);
    *out = json_is_true(v);
    return 0;
}

static int add_prompt(struct job *j, int32_t *ids, int n) {
    int32_t **p = realloc(j->prompts, (size_t)(j->n_prompts + 1) * sizeof *p);
    if (p) j->prompts = p;
    int *l = p ? realloc(j->prompt_lens, (size_t)(j->n_prompts + 1) * sizeof *l) : NULL;
    if (l) j->prompt_lens = l;
    if (!p || !l) {
        free(ids);
        return -1;
    }
    j->prompts[j->n_prompts] = ids;
    j->prompt_lens[j->n_prompts++] = n;
    return 0;
}

/* 400 context_length_exceeded, with llama.cpp's n_prompt_tokens and n_ctx */
static int ctx_error(const struct srv *s, const struct job *j, size_t n, json_t **err) {
    *err = api_error("invalid_request_error", "context_length_exceeded",
                     j->kind == JOB_CHAT ? "messages" : "prompt",
                     "this model's maximum context length is %d tokens; the prompt has %zu tokens "
                     "(at most %d may be prompt, to leave room to generate)",
                     s->max_ctx, n, s->max_prompt);
    json_t *e = json_object_get(*err, "error");
    json_object_set_new(e, "n_prompt_tokens", json_integer((json_int_t)n));
    json_object_set_new(e, "n_ctx", json_integer(s->max_ctx));
    return 400;
}

/* the ids of one prompt: a string (encoded with the post-processor, as tandem generate does) or
 * an array of token ids */
static int one_prompt(struct srv *s, struct job *j, const json_t *v, const char *param,
                      json_t **err) {
    char e[512];
    if (json_is_string(v)) {
        const char *t = json_string_value(v);
        size_t n = json_string_length(v);
        if (!n) BAD(param, "the prompt is empty");
        struct tok_ids ids = {0};
        if (tok_encode(s->tok, t, n, TOK_ENCODE_ADD_SPECIAL, &ids, e, sizeof e))
            BAD(param, "the prompt cannot be tokenized: %s", e);
        if (s->cfg.log_requests && !j->log_prompt) j->log_prompt = strdup(t);
        if (add_prompt(j, ids.ids, (int)ids.n)) BAD(param, "out of memory");
        return 0;
    }
    if (!json_is_array(v))
        BAD(param, "'prompt' must be a string, an array of strings or token ids");
    size_t n = json_array_size(v);
    if (!n) BAD(param, "the prompt is empty");
    if (n > (size_t)s->max_prompt) return ctx_error(s, j, n, err);
    int32_t *ids = malloc(n * sizeof *ids);
    if (!ids) BAD(param, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_array_get(v, i);
        long long t = json_is_integer(x) ? json_integer_value(x) : -1;
        if (t < 0 || t >= s->vocab) {
            free(ids);
            BAD(param, "prompt token %zu is not a token id in [0, %d)", i, s->vocab);
        }
        ids[i] = (int32_t)t;
    }
    if (add_prompt(j, ids, (int)n)) BAD(param, "out of memory");
    return 0;
}

static int parse_prompt(struct srv *s, struct job *j, const json_t *b, json_t **err) {
    const json_t *p = json_object_get(b, "prompt");
    if (!p || json_is_null(p)) BAD("prompt", "'prompt' is required");
    // a list of prompts: strings, or arrays of ids (an array of integers is one prompt)
    if (json_is_array(p) && json_array_size(p) &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0)))) {
        size_t n = json_array_size(p);
        if (n > (size_t)s->cfg.max_n * 16)
            BAD("prompt", "%zu prompts in one request; at most %d", n, s->cfg.max_n * 16);
        for (size_t i = 0; i < n; i++) {
            int rc = one_prompt(s, j, json_array_get(p, i), "prompt", err);
            if (rc) return rc;
        }
        return 0;
    }
    return one_prompt(s, j, p, "prompt", err);
}

/* message content: a string, or an array of {"type":"text","text":...} parts joined by sep */
static char *content_text(const json_t *c, const char *sep) {
    if (json_is_string(c)) return strdup(json_string_value(c));
    if (json_is_null(c)) return strdup("");
    if (!json_is_array(c)) return NULL;
    size_t len = 0, i;
    json_t *part;
    json_array_foreach(c, i, part) {
        const char *t = json_string_value(json_object_get(part, "type"));
        const char *x = json_string_value(json_object_get(part, "text"));
        if (!t || strcmp(t, "text") || !x) return NULL;
        len += strlen(x) + strlen(sep);
    }
    char *out = malloc(len + 1);
    if (!out) return NULL;
    out[0] = 0;
    json_array_foreach(c, i, part) {
        if (i) strcat(out, sep);
        strcat(out, json_string_value(json_object_get(part, "text")));
    }
    return out;
}

/* what parse_messages allocates, freed together */
struct owned {
    void **p;
    size_t n, cap;
};

/* x, kept for owned_free; NULL (x freed) when out of memory */
static void *own(struct owned *o, void *x) {
    if (!x) return NULL;
    if (o->n == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 16;
        void **p = realloc(o->p, cap * sizeof *p);
        if (!p) {
            free(x);
            return NULL;
        }
        o->p = p, o->cap = cap;
    }
    return o->p[o->n++] = x;
}

static void owned_free(struct owned *o) {
    for (size_t i = 0; i < o->n; i++)
        free(o->p[i]);
    free(o->p);
}

static const struct {
    const char *name;
    enum chat_role role;
} roles[] = {{.name = "system", .role = CHAT_ROLE_SYSTEM},
             {.name = "developer", .role = CHAT_ROLE_DEVELOPER},
             {.name = "user", .role = CHAT_ROLE_USER},
             {.name = "assistant", .role = CHAT_ROLE_ASSISTANT},
             {.name = "tool", .role = CHAT_ROLE_TOOL},
             {.name = "latest_reminder", .role = CHAT_ROLE_LATEST_REMINDER}};

#define BADP(...)                                                                                  \
    do {                                                                                           \
        *err = api_error("invalid_request_error", NULL, param, __VA_ARGS__);                       \
        return 400;                                                                                \
    } while (0)

/* an optional string field: absent or null is NULL */
static int opt_string(const json_t *m, const char *k, const char **out, const char *param,
                      json_t **err) {
    const json_t *v = json_object_get(m, k);
    *out = json_string_value(v);
    if (v && !json_is_null(v) && !json_is_string(v)) BADP("'%s' must be a string", k);
    return 0;
}

/* an assistant's OpenAI tool_calls: [{"id", "type": "function", "function": {"name",
 * "arguments"}}], arguments a JSON string (or, as some clients send, an object) */
static int parse_calls(const json_t *v, struct chat_msg *cm, struct owned *o, const char *p0,
                       json_t **err) {
    char param[80];
    snprintf(param, sizeof param, "%s.tool_calls", p0);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_array(v)) BADP("'tool_calls' must be an array");
    size_t n = json_array_size(v);
    struct chat_tool_call *tc = own(o, calloc(n + 1, sizeof *tc));
    if (!tc) BADP("out of memory");
    for (size_t k = 0; k < n; k++) {
        const json_t *c = json_array_get(v, k), *f = json_object_get(c, "function");
        const json_t *a = json_object_get(f, "arguments");
        const char *type = json_string_value(json_object_get(c, "type"));
        snprintf(param, sizeof param, "%s.tool_calls[%zu]", p0, k);
        if (!json_is_object(c) || !json_is_object(f) || !json_is_string(json_object_get(f, "name")))
            BADP("a tool call needs a \"function\" with a \"name\"");
        if (type && strcmp(type, "function")) BADP("tool call type '%s' is not \"function\"", type);
        if (opt_string(c, "id", &tc[k].id, param, err)) return 400;
        tc[k].name = json_string_value(json_object_get(f, "name"));
        if (json_is_string(a))
            tc[k].arguments = json_string_value(a);
        else if (json_is_object(a) && !(tc[k].arguments = own(o, json_dumps(a, JSON_COMPACT))))
            BADP("out of memory");
        else if (!json_is_object(a))
            BADP("'arguments' must be a JSON object or a string holding one");
    }
    cm->tool_calls = tc;
    cm->n_tool_calls = n;
    return 0;
}

/* one OpenAI message into cm; the chat format checks the rest (chat.h) */
static int parse_message(const json_t *m, size_t i, struct chat_msg *cm, struct owned *o,
                         json_t **err) {
    char param[48];
    snprintf(param, sizeof param, "messages[%zu]", i);
    const char *role = json_string_value(json_object_get(m, "role"));
    if (!json_is_object(m) || !role) BADP("each message needs a 'role' and a 'content'");
    size_t r = 0;
    while (r < sizeof roles / sizeof *roles && strcmp(roles[r].name, role))
        r++;
    if (r == sizeof roles / sizeof *roles)
        BADP("role '%s' is not supported (system, developer, user, assistant, tool, "
             "latest_reminder)",
             role);
    cm->role = roles[r].role;
    const json_t *c = json_object_get(m, "content");
    if (!c && cm->role != CHAT_ROLE_ASSISTANT) BADP("each message needs a 'role' and a 'content'");
    // the reference joins the text blocks of a tool result with blank lines
    char *text = c ? content_text(c, cm->role == CHAT_ROLE_TOOL ? "\n\n" : "") : strdup("");
    if (!text) BADP("'content' must be a string or an array of text parts");
    if (!(cm->content = own(o, text))) BADP("out of memory");
    if (opt_string(m, "tool_call_id", &cm->tool_call_id, param, err)) return 400;
    // DeepSeek's API calls an answer's thinking reasoning_content, vLLM's reasoning
    if (opt_string(m, "reasoning_content", &cm->reasoning, param, err)) return 400;
    if (!cm->reasoning && opt_string(m, "reasoning", &cm->reasoning, param, err)) return 400;
    return parse_calls(json_object_get(m, "tool_calls"), cm, o, param, err);
}

static int parse_messages(struct srv *s, const struct chat *chat, struct job *j, const json_t *b,
                          json_t **err) {
    const json_t *ms = json_object_get(b, "messages"), *tools = json_object_get(b, "tools");
    if (!json_is_array(ms) || !json_array_size(ms))
        BAD("messages", "'messages' must be a non-empty array");
    if (tools && !json_is_null(tools) && !json_is_array(tools))
        BAD("tools", "'tools' must be an array");
    size_t n = json_array_size(ms);
    // the request's tools go on a leading system or developer message (replacing its own),
    // else on a system message of their own in front, as vLLM gives them to encoding_dsv4
    int with_tools = json_array_size(tools) > 0;
    const char *r0 = json_string_value(json_object_get(json_array_get(ms, 0), "role"));
    int front = with_tools && !(r0 && (!strcmp(r0, "system") || !strcmp(r0, "developer")));
    struct owned o = {0};
    struct chat_msg *cm = own(&o, calloc(n + 1, sizeof *cm));
    if (!cm) BAD("messages", "out of memory");
    int rc = 0;
    char e[512];
    for (size_t i = 0; i < n && !rc; i++)
        rc = parse_message(json_array_get(ms, i), i, &cm[i + front], &o, err);
    if (!rc && with_tools) {
        if (front) cm[0] = (struct chat_msg){.role = CHAT_ROLE_SYSTEM};
        if (!(cm[0].tools = own(&o, json_dumps(tools, JSON_COMPACT)))) {
            *err = api_error("invalid_request_error", NULL, "tools", "out of memory");
            rc = 400;
        }
    }
    n += (size_t)front;
    struct tok_ids ids = {0};
    if (!rc && chat_encode(chat, cm, n, 1, &ids, e, sizeof e)) {
        *err = api_error("invalid_request_error", NULL, "messages", "%s%s", e,
                         front ? " (message 0: the request's tools, in front)" : "");
        rc = 400;
    }
    if (!rc && s->cfg.log_requests) j->log_prompt = chat_render(chat, cm, n, 1, NULL, e, sizeof e);
    owned_free(&o);
    if (rc || !ids.n) tok_ids_free(&ids); // a refused encode may have grown it
    if (rc) return rc;
    if (!ids.n) BAD("messages", "the conversation is empty");
    if (add_prompt(j, ids.ids, (int)ids.n)) BAD("messages", "out of memory");
    return 0;
}

static int parse_stops(struct srv *s, struct job *j, const json_t *b, json_t **err) {
    const json_t *st = json_object_get(b, "stop");
    if (st && !json_is_null(st)) {
        json_t *one = json_is_string(st) ? json_array() : NULL;
        if (one) json_array_append(one, (json_t *)st);
        const json_t *arr = one ? one : st;
        int rc = 0;
        if (!json_is_array(arr))
            rc = 1;
        else if ((int)json_array_size(arr) > s->cfg.max_stop) {
            json_decref(one);
            BAD("stop", "%zu stop strings; at most %d", json_array_size(arr), s->cfg.max_stop);
        }
        for (size_t i = 0; !rc && i < json_array_size(arr); i++) {
            const json_t *x = json_array_get(arr, i);
            size_t k = json_string_length(x);
            if (!json_is_string(x)) {
                rc = 1;
                break;
            }
            if (!k || (int)k > s->cfg.max_stop_len) {
                json_decref(one);
                BAD("stop", "stop string %zu has %zu bytes; 1 to %d", i, k, s->cfg.max_stop_len);
            }
            j->stops[j->n_stops++] = strdup(json_string_value(x));
            if (k > j->max_stop) j->max_stop = k;
        }
        json_decref(one);
        if (rc) BAD("stop", "'stop' must be a string or an array of strings");
    }
    const json_t *ids = json_object_get(b, "stop_token_ids");
    if (ids && !json_is_null(ids)) {
        if (!json_is_array(ids) || json_array_size(ids) > TD_MAX_STOP_IDS)
            BAD("stop_token_ids", "'stop_token_ids' must be an array of at most %d token ids",
                TD_MAX_STOP_IDS);
        for (size_t i = 0; i < json_array_size(ids); i++) {
            const json_t *x = json_array_get(ids, i);
            long long t = json_is_integer(x) ? json_integer_value(x) : -1;
            if (t < 0 || t >= s->vocab)
                BAD("stop_token_ids", "stop_token_ids[%zu] is not a token id in [0, %d)", i,
                    s->vocab);
            j->stop_ids[j->n_stop_ids++] = (int32_t)t;
        }
    }
    return 0;
}

/* "draft": "none" decodes this request without drafts; "auto" or the server's own drafter
 * (speculation.method) speculate as the server does; the server runs one drafter, so any other
 * name is refused */
static int parse_draft(const struct srv *s, struct job *j, const json_t *b, json_t **err) {
    const json_t *d = json_object_get(b, "draft");
    if (!d || json_is_null(d)) return 0;
    const char *v = json_string_value(d);
    int have = strcmp(s->drafter, "none") != 0;
    if (v && (!strcmp(v, "none") || !strcmp(v, "auto") || (have && !strcmp(v, s->drafter)))) {
        j->no_draft = !strcmp(v, "none");
        return 0;
    }
    if (!v)
        *err = api_error("invalid_request_error", NULL, "draft",
                         "'draft' must be a string: none, auto%s%s", have ? " or " : "",
                         have ? s->drafter : "");
    else
        *err =
            api_error("invalid_request_error", "drafter_unavailable", "draft",
                      "'draft' is '%s', but this server drafts with %s (one of: none, auto%s%s)", v,
                      have ? s->drafter : "no drafter", have ? ", " : "", have ? s->drafter : "");
    return 400;
}

/* the fields every request may carry; anything else is ignored and counted */
static const char *known[] = {"model",
                              "prompt",
                              "messages",
                              "max_tokens",
                              "max_completion_tokens",
                              "temperature",
                              "top_p",
                              "top_k",
                              "n",
                              "stream",
                              "stream_options",
                              "stop",
                              "stop_token_ids",
                              "seed",
                              "ignore_eos",
                              "return_token_ids",
                              "include_stop_str_in_output",
                              "tools",
                              "functions",
                              "tool_choice",
                              "response_format",
                              "logprobs",
                              "top_logprobs",
                              "best_of",
                              "echo",
                              "suffix",
                              "logit_bias",
                              "presence_penalty",
                              "frequency_penalty",
                              "min_p",
                              "min_tokens",
                              "repetition_penalty",
                              "thinking",
                              "reasoning_effort",
                              "chat_template_kwargs",
                              "user",
                              "request_id",
                              "draft"};

int job_parse(struct srv *s, struct job *j, const char *body, size_t len, int *ignored,
              json_t **err) {
    json_error_t je;
    json_t *b = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    int rc = 0;
    *ignored = 0;
    if (!b) {
        *err = api_error("invalid_request_error", NULL, NULL,
                         "the body is not valid JSON: %s (line %d, column %d)", je.text, je.line,
                         je.column);
        return 400;
    }
    if (!json_is_object(b)) {
        json_decref(b);
        *err = api_error("invalid_request_error", NULL, NULL, "the body must be a JSON object");
        return 400;
    }
#define TRY(x)                                                                                     \
    do {                                                                                           \
        if ((rc = (x))) goto out;                                                                  \
    } while (0)
    const char *key;
    json_t *val;
    json_object_foreach(b, key, val) {
        size_t i = 0;
        while (i < sizeof known / sizeof *known && strcmp(known[i], key))
            i++;
        if (i == sizeof known / sizeof *known) (*ignored)++;
    }
    TRY(unsupported(b, err));
    const json_t *model = json_object_get(b, "model");
    if (model && !json_is_null(model) && !json_is_string(model)) {
        *err = api_error("invalid_request_error", NULL, "model", "'model' must be a string");
        rc = 400;
        goto out;
    }
    if (s->cfg.strict_model && (!model || strcmp(json_string_value(model), s->model_name))) {
        *err = api_error("invalid_request_error", "model_not_found", "model",
                         "the model '%s' does not exist; this server serves '%s'",
                         model ? json_string_value(model) : "", s->model_name);
        rc = 404;
        goto out;
    }
    // sampling: the config's defaults, then the request's
    double temp = s->cfg.temperature, top_p = s->cfg.top_p;
    long long top_k = s->cfg.top_k, n = 1, seed = -1, max_tokens = -1;
    TRY(num_field(b, "temperature", 0.0, 100.0, &temp, err));
    TRY(num_field(b, "top_p", 1e-9, 1.0, &top_p, err));
    TRY(int_field(b, "top_k", -1, 1 << 30, &top_k, err));
    if (top_k < 0) top_k = 0; // vLLM's -1: off
    TRY(int_field(b, "n", 1, s->cfg.max_n, &n, err));
    TRY(int_field(b, "seed", INT64_MIN, INT64_MAX, &seed, err));
    TRY(int_field(b, "max_tokens", 1, INT32_MAX, &max_tokens, err));
    TRY(int_field(b, "max_completion_tokens", 1, INT32_MAX, &max_tokens, err));
    TRY(bool_field(b, "stream", &j->stream, err));
    TRY(bool_field(b, "ignore_eos", &j->ignore_eos, err));
    TRY(bool_field(b, "return_token_ids", &j->return_token_ids, err));
    TRY(bool_field(b, "include_stop_str_in_output", &j->include_stop, err));
    if (!json_object_get(b, "ignore_eos")) j->ignore_eos = s->cfg.ignore_eos;
    const json_t *so = json_object_get(b, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) {
            *err = api_error("invalid_request_error", NULL, "stream_options",
                             "'stream_options' must be an object");
            rc = 400;
            goto out;
        }
        if (!j->stream) {
            *err = api_error("invalid_request_error", NULL, "stream_options",
                             "'stream_options' is only allowed with \"stream\": true");
            rc = 400;
            goto out;
        }
        TRY(bool_field(so, "include_usage", &j->include_usage, err));
    }
    TRY(parse_stops(s, j, b, err));
    TRY(parse_draft(s, j, b, err));
    // thinking: DeepSeek's {"thinking":{"type":"enabled"}}, or chat_template_kwargs.thinking
    // (or vLLM's enable_thinking); reasoning_effort "max" asks V4 for its longest thinking,
    // "none" for none; chat_template_kwargs.drop_thinking false keeps earlier reasoning (V4)
    const json_t *th = json_object_get(b, "thinking");
    const char *tt = json_string_value(json_object_get(th, "type"));
    const json_t *ckw = json_object_get(b, "chat_template_kwargs");
    const json_t *kw = json_object_get(ckw, "thinking"),
                 *kw2 = json_object_get(ckw, "enable_thinking");
    const json_t *re = json_object_get(b, "reasoning_effort"),
                 *dt = json_object_get(ckw, "drop_thinking");
    if (re && !json_is_null(re) && !json_is_string(re)) {
        *err = api_error("invalid_request_error", NULL, "reasoning_effort",
                         "'reasoning_effort' must be a string");
        rc = 400;
        goto out;
    }
    if (dt && !json_is_boolean(dt)) {
        *err = api_error("invalid_request_error", NULL, "chat_template_kwargs",
                         "'drop_thinking' must be true or false");
        rc = 400;
        goto out;
    }
    const char *effort = json_string_value(re);
    j->think = ((tt && !strcmp(tt, "enabled")) || json_is_true(kw) || json_is_true(kw2)) &&
               !(effort && !strcmp(effort, "none"));
    if (j->kind == JOB_CHAT) {
        if (!s->have_chat) {
            *err = api_error("invalid_request_error", NULL, "messages",
                             "this model has no chat format");
            rc = 400;
            goto out;
        }
        struct chat c = s->chat;
        if (j->think && c.think_open >= 0) c.think = CHAT_THINK_ON;
        if (effort && !strcmp(effort, "max")) c.effort = CHAT_EFFORT_MAX;
        if (dt) c.drop_thinking = json_is_true(dt);
        j->think = c.think == CHAT_THINK_ON;
        // what a V4 model calls comes back as tool_calls unless the request said "none"
        const char *tc = json_string_value(json_object_get(b, "tool_choice"));
        j->tool_calls = c.v4 && !(tc && !strcmp(tc, "none"));
        TRY(parse_messages(s, &c, j, b, err));
    } else {
        j->think = 0;
        if (json_array_size(json_object_get(b, "tools"))) {
            *err = api_error("invalid_request_error", NULL, "tools",
                             "tools are for /v1/chat/completions");
            rc = 400;
            goto out;
        }
        TRY(parse_prompt(s, j, b, err));
    }
    for (int i = 0; i < j->n_prompts; i++)
        if (j->prompt_lens[i] > s->max_prompt) {
            rc = ctx_error(s, j, (size_t)j->prompt_lens[i], err);
            goto out;
        }
    if ((long long)j->n_prompts * n > s->cfg.max_n * 16) {
        *err =
            api_error("invalid_request_error", NULL, "n", "%lld choices in one request; at most %d",
                      (long long)j->n_prompts * n, s->cfg.max_n * 16);
        rc = 400;
        goto out;
    }
    j->n = (int)n;
    j->max_tokens = max_tokens > 0        ? (int)max_tokens
                    : j->kind == JOB_CHAT ? s->cfg.max_tokens
                                          : s->cfg.completion_max_tokens;
    j->n_ch = j->n_prompts * j->n;
    if (!(j->ch = calloc((size_t)j->n_ch, sizeof *j->ch))) {
        *err = api_error("server_error", NULL, NULL, "out of memory");
        rc = 500;
        goto out;
    }
    // without a seed each request draws one (its choices still use seed + i)
    uint64_t base = seed >= 0 || seed < -1 ? (uint64_t)seed
                                           : ((uint64_t)rand() << 32) ^ (uint64_t)rand() ^
                                                 (uint64_t)(j->t_arrival * 1e9);
    for (int p = 0; p < j->n_prompts; p++)
        for (int i = 0; i < j->n; i++) {
            struct choice *c = &j->ch[p * j->n + i];
            c->eid = -1;
            c->index = p * j->n + i;
            c->prompt = p;
            c->sampling = (struct td_sampling){.temperature = (float)temp,
                                               .top_k = (int)top_k,
                                               .top_p = (float)top_p,
                                               .seed = base + (uint64_t)i};
            j->prompt_tokens += j->prompt_lens[p];
        }
out:
    json_decref(b);
    return rc;
}
