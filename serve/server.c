/* server.c: tandem serve. libmicrohttpd's polling thread parses and answers; the worker thread
 * owns the engine: it admits jobs, steps, turns committed tokens into text and SSE chunks, and
 * resumes the connections that have bytes to send (server.md section 5.3's pattern).
 *
 *   HTTP thread: body -> job_parse -> admission queue (429 when full) -> stream reader / body
 *   worker:      queue -> td_engine_submit -> td_engine_step -> pump (text, stops) -> job->out
 *                -> MHD_resume_connection; closed or timed-out jobs are cancelled and released
 */
#include "serve/server.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <microhttpd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <unistd.h>

#include "draft/drafter.h"
#include "model/fileio.h"
#include "serve/internal.h"
#include "serve/text.h"

#ifndef TD_VERSION
#define TD_VERSION "0.21"
#endif

static double now(void) {
    return td_engine_clock();
}

// ---------------------------------------------------------------------------------------------
// jobs and their output

static void job_unref(struct job *j) {
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left) return;
    for (int i = 0; i < j->n_ch; i++) {
        tok_stream_free(&j->ch[i].ts);
        chat_reply_free(&j->ch[i].reply);
        free(j->ch[i].text.p);
        free(j->ch[i].ends);
    }
    free(j->ch);
    job_free_request(j);
    free(j->out.p);
    free(j->head);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

/* append bytes for the client and wake its connection (worker; j->mu not held) */
static void job_send(struct job *j, const char *s, size_t k, int last) {
    pthread_mutex_lock(&j->mu);
    if (!j->closed) {
        if (j->off_out == j->out.n) j->off_out = j->out.n = 0;
        sbuf_put(&j->out, s, k);
        if (j->out.oom) j->closed = 1; // out of memory: cancelled, as a gone client is
        if ((long)(j->out.n - j->off_out) > j->s->cfg.max_stream_buffer_bytes)
            j->closed = 1; // a client that stopped reading is cancelled like a disconnect
    }
    if (last) j->out_done = 1;
    if (j->suspended && j->conn && (k || last)) {
        j->suspended = 0;
        MHD_resume_connection(j->conn);
    }
    pthread_mutex_unlock(&j->mu);
}

static void send_json_line(struct job *j, json_t *o, int last) {
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s) return;
    size_t k = strlen(s);
    char *line = malloc(k + 9);
    if (line) {
        memcpy(line, "data: ", 6);
        memcpy(line + 6, s, k);
        memcpy(line + 6 + k, "\n\n", 2);
        job_send(j, line, k + 8, last);
    }
    free(line);
    free(s);
}

/* the non-streamed answer: the whole body, its status */
static void send_body(struct job *j, int status, json_t *o) {
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    pthread_mutex_lock(&j->mu);
    j->http_status = s ? status : 500;
    pthread_mutex_unlock(&j->mu);
    job_send(j, s ? s : "{}", s ? strlen(s) : 2, 1);
    free(s);
}

// ---------------------------------------------------------------------------------------------
// logging: one line per request

static void log_line(struct srv *s, int level, const char *fmt, ...) {
    if (level > (int)s->cfg.log_level) return;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    static const char *names[] = {"error", "warn", "info", "debug"};
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    char ts[32];
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm);
    pthread_mutex_lock(&s->log_mu);
    if (s->cfg.log_format == SRV_LOG_JSONL) {
        json_t *o = json_pack("{s:s,s:s,s:s}", "time", ts, "level", names[level], "msg", msg);
        char *l = json_dumps(o, JSON_COMPACT);
        fprintf(s->log, "%s\n", l ? l : "{}");
        free(l);
        json_decref(o);
    } else {
        fprintf(s->log, "%s %s %s\n", ts, names[level], msg);
    }
    fflush(s->log);
    pthread_mutex_unlock(&s->log_mu);
}

static void log_request(struct srv *s, const struct job *j, const char *outcome) {
    long gen = 0, drafted = 0, accepted = 0, rounds = 0;
    double ttft = -1, end = j->t_arrival;
    for (int i = 0; i < j->n_ch; i++) {
        const struct choice *c = &j->ch[i];
        gen += c->completion_tokens, drafted += c->st.drafted, accepted += c->st.accepted;
        rounds += c->st.rounds;
        if (c->st.t_first > 0 && (ttft < 0 || c->st.t_first - j->t_arrival < ttft))
            ttft = c->st.t_first - j->t_arrival;
        if (c->st.t_end > end) end = c->st.t_end;
    }
    if (end <= j->t_arrival) end = now();
    if (s->cfg.log_format == SRV_LOG_JSONL) {
        json_t *o = json_pack("{s:s,s:s,s:s,s:i,s:I,s:I,s:f,s:f,s:f,s:I,s:I}", "event", "request",
                              "id", j->rid, "outcome", outcome, "choices", j->n_ch, "prompt_tokens",
                              (json_int_t)j->prompt_tokens, "completion_tokens", (json_int_t)gen,
                              "ttft_s", ttft, "latency_s", end - j->t_arrival, "acceptance",
                              drafted ? (double)accepted / drafted : 0.0, "drafted",
                              (json_int_t)drafted, "accepted", (json_int_t)accepted);
        if (j->log_prompt) json_object_set_new(o, "prompt", json_string(j->log_prompt));
        char *l = json_dumps(o, JSON_COMPACT);
        json_decref(o);
        pthread_mutex_lock(&s->log_mu);
        fprintf(s->log, "%s\n", l ? l : "{}");
        fflush(s->log);
        pthread_mutex_unlock(&s->log_mu);
        free(l);
        return;
    }
    log_line(s, SRV_LOG_INFO,
             "request %s %s: %d choice(s), %d prompt + %ld completion tokens, ttft %.3f s, "
             "latency %.3f s, mean accepted length %.2f (%ld of %ld drafts)%s%s",
             j->rid, outcome, j->n_ch, j->prompt_tokens, gen, ttft, end - j->t_arrival,
             rounds ? (double)(accepted + rounds) / rounds : 0.0, accepted, drafted,
             j->log_prompt ? ", prompt: " : "", j->log_prompt ? j->log_prompt : "");
}

// ---------------------------------------------------------------------------------------------
// the worker: text, chunks, endings

static json_t *usage_json(const struct srv *s, const struct job *j) {
    long gen = 0;
    for (int i = 0; i < j->n_ch; i++)
        gen += j->ch[i].completion_tokens;
    json_t *u = json_pack("{s:i,s:I,s:I}", "prompt_tokens", j->prompt_tokens, "completion_tokens",
                          (json_int_t)gen, "total_tokens", (json_int_t)(gen + j->prompt_tokens));
    // the prompt tokens the prefix cache gave (every choice runs the same prompt: the first's)
    json_object_set_new(
        u, "prompt_tokens_details",
        json_pack("{s:i}", "cached_tokens", j->n_ch ? j->ch[0].st.cached_tokens : 0));
    if (s->cfg.per_request != SRV_PER_REQUEST_NONE && j->n_ch == 1) {
        const struct choice *c = &j->ch[0];
        json_t *pos = json_array();
        for (int k = 0; k < s->draft_k && k < TD_MAX_DRAFT; k++)
            json_array_append_new(
                pos, json_real(c->st.proposed_at[k]
                                   ? (double)c->st.accepted_at[k] / (double)c->st.proposed_at[k]
                                   : 0.0));
        json_t *sd = json_pack(
            "{s:f,s:f,s:I,s:I,s:I,s:o}", "mean_acceptance_length",
            c->st.rounds ? (double)(c->st.accepted + c->st.rounds) / c->st.rounds : 0.0,
            "draft_acceptance_rate", c->st.drafted ? (double)c->st.accepted / c->st.drafted : 0.0,
            "num_spec_steps", (json_int_t)c->st.spec_rounds, "num_accepted_draft_tokens",
            (json_int_t)c->st.accepted, "num_draft_tokens", (json_int_t)c->st.drafted,
            "acceptance_by_position", pos);
        double ttft = c->st.t_first > 0 ? c->st.t_first - j->t_arrival : -1;
        json_object_set_new(
            u, "metrics",
            json_pack("{s:f,s:f,s:o}", "time_to_first_token_ms", 1e3 * ttft, "queue_time_ms",
                      c->st.t_admit > 0 ? 1e3 * (c->st.t_admit - j->t_arrival) : -1.0,
                      "speculative_decoding", sd));
    }
    return u;
}

static json_t *envelope(const struct srv *s, const struct job *j, const char *object) {
    return json_pack("{s:s,s:s,s:I,s:s,s:s}", "id", j->id, "object", object, "created",
                     (json_int_t)j->created, "model", s->model_name, "system_fingerprint",
                     s->fingerprint);
}

static void add_text(struct choice *c, const char *p, size_t k) {
    sbuf_put(&c->text, p, k);
}

/* split off reasoning: with thinking on, the text before "</think>" is reasoning_content */
static void split_think(const struct job *j, const struct choice *c, size_t from, size_t to,
                        size_t *r0, size_t *r1, size_t *t0, size_t *t1) {
    if (!j->think) {
        *r0 = *r1 = from, *t0 = from, *t1 = to;
        return;
    }
    size_t te = c->think_open ? to : c->think_end; // reasoning ends here (exclusive)
    size_t cont = c->think_open ? to : c->think_end + 8;
    *r0 = from < te ? from : te, *r1 = to < te ? to : te;
    *t0 = from > cont ? from : cont, *t1 = to;
    if (*t0 > *t1) *t0 = *t1;
}

static json_t *text_json(const char *p, size_t k) {
    json_t *v = json_stringn(p, k);
    return v ? v : json_string("\xef\xbf\xbd");
}

/* a tool call's id: the response's id, the choice and the call, so unique in the response and
 * the same streamed or not */
static void call_id(const struct job *j, const struct choice *c, size_t k, char *out, size_t n) {
    const char *tail = strchr(j->id, '-');
    snprintf(out, n, "call_%s_%d_%zu", tail ? tail + 1 : j->id, c->index, k);
}

/* a choice's tool calls, as the message's "tool_calls" */
static json_t *calls_json(const struct job *j, const struct choice *c) {
    json_t *a = json_array();
    for (size_t k = 0; k < c->reply.n_calls; k++) {
        const struct chat_call *cc = &c->reply.calls[k];
        char id[96];
        call_id(j, c, k, id, sizeof id);
        json_t *f = json_pack("{s:o,s:o}", "name", text_json(cc->name, strlen(cc->name)),
                              "arguments", text_json(cc->arguments, strlen(cc->arguments)));
        json_array_append_new(
            a, json_pack("{s:s,s:s,s:o}", "id", id, "type", "function", "function", f));
    }
    return a;
}

/* the same as a stream's delta: ,"tool_calls":[{"index":k,"id":...,"type":"function",
 * "function":{"name":...,"arguments":...}}, ...], every call whole in one chunk */
static void calls_delta(const struct job *j, const struct choice *c, struct sbuf *b, int any) {
    sbuf_puts(b, any ? ",\"tool_calls\":[" : "\"tool_calls\":[");
    for (size_t k = 0; k < c->reply.n_calls; k++) {
        const struct chat_call *cc = &c->reply.calls[k];
        char id[96];
        call_id(j, c, k, id, sizeof id);
        sbuf_puts(b, k ? ",{\"index\":" : "{\"index\":");
        sbuf_int(b, (long)k);
        sbuf_puts(b, ",\"id\":");
        sbuf_json_str(b, id, strlen(id));
        sbuf_puts(b, ",\"type\":\"function\",\"function\":{\"name\":");
        sbuf_json_str(b, cc->name, strlen(cc->name));
        sbuf_puts(b, ",\"arguments\":");
        sbuf_json_str(b, cc->arguments, strlen(cc->arguments));
        sbuf_puts(b, "}}");
    }
    sbuf_puts(b, "]");
}

/* the new text of a choice as a chunk's choice object, or NULL when there is nothing to say */
/* a chunk being written: the stream's hot path (one chunk per job per step) formats its JSON
 * directly; jansson builds only the once-per-request objects (bodies, usage, errors) */
/* the new text of a choice as one element of a chunk's "choices" (a comma first when it is not
 * the first); 0 when there is nothing to say */
/* a choice's finish_reason value and its stop_reason field */
static void put_finish(const struct choice *c, struct sbuf *b) {
    sbuf_json_str(b, c->finish_reason, strlen(c->finish_reason));
    sbuf_puts(b, ",\"stop_reason\":");
    if (c->stop_reason[0])
        sbuf_json_str(b, c->stop_reason, strlen(c->stop_reason));
    else
        sbuf_puts(b, "null");
}

/* the text [from, to) of a choice, token by token, as [[text, source], ...] (source: 0 the
 * target's own token, j >= 1 a draft accepted at draft position j); the pieces' texts join to
 * that text exactly. Tokens from c->piece_tok on, whose text ends in ends[] */
static void put_pieces(const struct choice *c, const uint8_t *src, size_t from, size_t to,
                       struct sbuf *b) {
    sbuf_put(b, "[", 1);
    for (int i = c->piece_tok, any = 0; i < c->n_seen; i++) {
        size_t a = i ? c->ends[i - 1] : 0, z = c->ends[i];
        if (a < from) a = from;
        if (z > to) z = to;
        if (a >= to) break;
        if (z <= a) continue;
        sbuf_puts(b, any++ ? ",[" : "[");
        sbuf_json_str(b, c->text.p + a, z - a);
        sbuf_put(b, ",", 1);
        sbuf_int(b, src ? src[i] : TD_SRC_TARGET);
        sbuf_put(b, "]", 1);
    }
    sbuf_put(b, "]", 1);
}

/* Tandem's extension of a streamed choice, ignored by OpenAI clients: where each token came
 * from. "sources": one per token of this chunk (as token_ids are); "content" / "reasoning" /
 * "text": the pieces of the delta's field of that name (put_pieces) */
static void put_tandem(const struct job *j, struct choice *c, int n_tok0, int hi, size_t r0,
                       size_t r1, size_t t0, size_t t1, struct sbuf *b) {
    const uint8_t *src = NULL;
    td_engine_output_sources(j->s->e, c->eid, &src);
    sbuf_puts(b, ",\"tandem\":{\"sources\":[");
    for (int i = n_tok0; i < hi; i++) {
        if (i > n_tok0) sbuf_put(b, ",", 1);
        sbuf_int(b, src ? src[i] : TD_SRC_TARGET);
    }
    sbuf_put(b, "]", 1);
    if (r1 > r0) sbuf_puts(b, ",\"reasoning\":"), put_pieces(c, src, r0, r1, b);
    if (t1 > t0) {
        sbuf_puts(b, j->kind == JOB_CHAT ? ",\"content\":" : ",\"text\":");
        put_pieces(c, src, t0, t1, b);
    }
    sbuf_put(b, "}", 1);
    // the tokens whose text is all out: the next chunk's pieces start after them
    size_t out = t1 > r1 ? t1 : r1;
    while (c->piece_tok < c->n_seen && c->ends[c->piece_tok] <= out)
        c->piece_tok++;
}

static int choice_delta(const struct job *j, struct choice *c, size_t upto, int finishing,
                        int n_tok0, struct sbuf *b, int first) {
    if (upto < c->sent) upto = c->sent;
    int has_text = upto > c->sent, role = j->kind == JOB_CHAT && !c->role_sent;
    if (!has_text && !finishing && !(role && c->n_seen > 0)) return 0;
    sbuf_puts(b, first ? "{\"index\":" : ",{\"index\":");
    sbuf_int(b, c->index);
    size_t r0 = c->sent, r1 = c->sent, t0 = c->sent, t1 = upto;
    if (j->kind == JOB_CHAT) {
        sbuf_puts(b, ",\"delta\":{");
        int any = 0;
        if (role) sbuf_puts(b, "\"role\":\"assistant\""), any = 1;
        split_think(j, c, c->sent, upto, &r0, &r1, &t0, &t1);
        if (r1 > r0) {
            sbuf_puts(b, any ? ",\"reasoning_content\":" : "\"reasoning_content\":");
            sbuf_json_str(b, c->text.p + r0, r1 - r0);
            any = 1;
        }
        if (t1 > t0 || role) {
            sbuf_puts(b, any ? ",\"content\":" : "\"content\":");
            sbuf_json_str(b, c->text.p + t0, t1 - t0);
            any = 1;
        }
        // the calls after the content; their finish_reason comes in a chunk of its own
        if (finishing && c->reply.n_calls) calls_delta(j, c, b, any);
        sbuf_puts(b, "}");
        c->role_sent = 1;
    } else {
        sbuf_puts(b, ",\"text\":");
        sbuf_json_str(b, c->text.p + c->sent, upto - c->sent);
    }
    const int32_t *t;
    int n;
    td_engine_output(j->s->e, c->eid, &t, &n, NULL, NULL, NULL);
    int hi = c->done ? c->completion_tokens : c->n_seen;
    if (hi > n) hi = n;
    if (j->return_token_ids) {
        sbuf_puts(b, ",\"token_ids\":[");
        for (int i = n_tok0; i < hi; i++) {
            if (i > n_tok0) sbuf_put(b, ",", 1);
            sbuf_int(b, t[i]);
        }
        sbuf_puts(b, "]");
    }
    put_tandem(j, c, n_tok0, hi, r0, r1, t0, t1, b);
    sbuf_puts(b, ",\"logprobs\":null,\"finish_reason\":");
    if (finishing && c->reply.n_calls) {
        sbuf_puts(b, "null");
        c->finish_pending = 1;
    } else if (finishing) {
        put_finish(c, b);
    } else {
        sbuf_puts(b, "null");
    }
    sbuf_puts(b, "}");
    c->sent = upto;
    return 1;
}

/* the end of a choice whose tool calls went out in the chunk before: an empty delta and
 * finish_reason "tool_calls", as OpenAI ends a streamed call */
static void finish_delta(const struct job *j, struct choice *c, struct sbuf *b, int first) {
    sbuf_puts(b, first ? "{\"index\":" : ",{\"index\":");
    sbuf_int(b, c->index);
    sbuf_puts(b, ",\"delta\":{}");
    if (j->return_token_ids) sbuf_puts(b, ",\"token_ids\":[]");
    sbuf_puts(b, ",\"logprobs\":null,\"finish_reason\":");
    put_finish(c, b);
    sbuf_puts(b, "}");
    c->finish_pending = 0;
}

/* a chunk's opening, up to its choices, written once per job */
static void chunk_head(const struct srv *s, struct job *j) {
    struct sbuf b = {0};
    sbuf_puts(&b, "data: {\"id\":");
    sbuf_json_str(&b, j->id, strlen(j->id));
    sbuf_puts(&b, j->kind == JOB_CHAT ? ",\"object\":\"chat.completion.chunk\",\"created\":"
                                      : ",\"object\":\"text_completion\",\"created\":");
    sbuf_int(&b, (long)j->created);
    sbuf_puts(&b, ",\"model\":");
    sbuf_json_str(&b, s->model_name, strlen(s->model_name));
    sbuf_puts(&b, ",\"system_fingerprint\":");
    sbuf_json_str(&b, s->fingerprint, strlen(s->fingerprint));
    sbuf_puts(&b, ",\"choices\":[");
    j->head = b.p;
    j->n_head = b.n;
}

static enum met_finish met_reason(const struct choice *c) {
    return !strcmp(c->finish_reason ? c->finish_reason : "", "length") ? MET_FINISH_LENGTH
                                                                       : MET_FINISH_STOP;
}

static void count_finished(struct srv *s, struct job *j, enum met_finish why) {
    for (int i = 0; i < j->n_ch; i++) // the engine's numbers, before the requests are released
        if (j->ch[i].eid >= 0) td_engine_request_stats(s->e, j->ch[i].eid, &j->ch[i].st);
    for (int i = 0; i < j->n_ch; i++) {
        const struct choice *c = &j->ch[i];
        struct met_request r = {
            .finish = why == MET_FINISH_STOP ? met_reason(c) : why,
            .prompt_tokens = j->prompt_lens[c->prompt],
            .generation_tokens = c->completion_tokens,
            .queue_s = c->st.t_admit > 0 ? c->st.t_admit - j->t_arrival : -1,
            .ttft_s = c->st.t_first > 0 ? c->st.t_first - j->t_arrival : -1,
            .e2e_s = now() - j->t_arrival,
        };
        met_finished(s->m, &r);
    }
}

/* the job leaves the worker: its engine requests released, its accounting closed */
static void job_retire(struct srv *s, struct job *j) {
    for (int i = 0; i < j->n_ch; i++)
        if (j->ch[i].eid >= 0) {
            td_engine_release(s->e, j->ch[i].eid);
            j->ch[i].eid = -1;
        }
    pthread_mutex_lock(&s->mu);
    s->outstanding -= j->n_ch;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    j->finished = 1;
    // a connection still parked waiting for bytes is woken: MHD sees the end (or the error
    // of a gone client: suspended connections are not polled, so only this closes them)
    pthread_mutex_lock(&j->mu);
    if (j->suspended && j->conn) {
        j->suspended = 0;
        MHD_resume_connection(j->conn);
    }
    pthread_mutex_unlock(&j->mu);
    job_unref(j);
}

/* end a job with an error: an error event in its stream, or the error as its body */
static void job_fail(struct srv *s, struct job *j, int status, const char *type, const char *code,
                     const char *msg, enum met_finish why) {
    for (int i = 0; i < j->n_ch; i++)
        if (j->ch[i].eid >= 0) td_engine_cancel(s->e, j->ch[i].eid);
    json_t *e = api_error(type, code, NULL, "%s", msg);
    count_finished(s, j, why); // counted before the client can read the end
    if (j->stream)
        send_json_line(j, e, 1);
    else
        send_body(j, status, e);
    log_request(s, j, code ? code : type);
    job_retire(s, j);
}

/* V4 tool calls in the content (after the reasoning): while the reply runs, the content from
 * CHAT_V4_CALLS_MARK on is held back, and a tail that may begin it, as a partial stop string
 * is; once it ends, a complete block becomes the choice's calls (content: the text before it;
 * finish_reason "tool_calls") and anything else is released as content. The sendable length. */
static size_t hold_calls(struct srv *s, const struct job *j, struct choice *c, size_t upto) {
    char *mark[1] = {CHAT_V4_CALLS_MARK};
    size_t base = j->think ? c->think_end + 8 : 0, k = strlen(CHAT_V4_CALLS_MARK), at;
    if (base > c->text.n) base = c->text.n;
    if (c->done) {
        char e[256];
        int rc = chat_parse_calls(c->text.p + base, c->text.n - base, &c->reply, e, sizeof e);
        if (rc < 0)
            log_line(s, SRV_LOG_WARN, "request %s choice %d: tool calls kept as text: %s", j->rid,
                     c->index, e);
        if (rc <= 0) return upto;
        c->finish_reason = "tool_calls";
        return base + c->reply.content_len;
    }
    if (!c->calls_seen) { // searched from where a match could still begin, as stops are
        size_t from = c->calls_searched > base ? c->calls_searched : base;
        if (stop_find(c->text.p, c->text.n, from, mark, 1, &at) >= 0)
            c->calls_seen = 1, c->calls_at = at;
        else
            c->calls_searched = c->text.n >= k ? c->text.n - k + 1 : 0;
    }
    size_t h = c->calls_seen ? c->calls_at
                             : base + stop_holdback(c->text.p + base, c->text.n - base, mark, 1);
    return h < upto ? h : upto;
}

/* read what the engine committed for choice c since the last step: text, stops, its end */
static int pump_choice(struct srv *s, struct job *j, struct choice *c, struct sbuf *chunk,
                       int *n_in_chunk) {
    const int32_t *t;
    int n;
    enum td_req_status st;
    enum td_finish fin;
    const char *msg;
    td_engine_output(s->e, c->eid, &t, &n, &st, &fin, &msg);
    int n_tok0 = c->n_seen, ended = st == TD_REQ_FINISHED || st == TD_REQ_FAILED;
    if (n > c->cap_ends) {
        int cap = c->cap_ends ? c->cap_ends : 64;
        while (cap < n)
            cap *= 2;
        size_t *ne = realloc(c->ends, (size_t)cap * sizeof *ne);
        if (!ne) return -1;
        c->ends = ne, c->cap_ends = cap;
    }
    char e[256];
    for (int i = c->n_seen; i < n; i++) {
        const char *p;
        size_t k;
        if (tok_stream_push(&c->ts, t[i], &p, &k, e, sizeof e) == 0) add_text(c, p, k);
        // the decoder skips special tokens: a special </think> still ends the reasoning
        if (c->think_open && t[i] == s->chat.think_close && tok_is_special(s->tok, t[i]))
            add_text(c, "</think>", 8);
        // and a special ｜DSML｜ still marks tool calls
        if (j->tool_calls && t[i] == s->chat.dsml && tok_is_special(s->tok, t[i]))
            add_text(c, "｜DSML｜", strlen("｜DSML｜"));
        c->ends[i] = c->text.n;
    }
    c->n_seen = n;
    if (c->text.oom) return 3; // out of memory for its text: it fails rather than lose text
    if (ended && st == TD_REQ_FINISHED && n > 0) { // what the decoder still holds
        const char *p;
        size_t k;
        tok_stream_flush(&c->ts, &p, &k);
        add_text(c, p, k);
        c->ends[n - 1] = c->text.n;
    }
    if (n > n_tok0 && c->t_prev > 0) met_itl(s->m, now() - c->t_prev, n - n_tok0);
    if (n > n_tok0) c->t_prev = now();
    // thinking: the reasoning ends at the first "</think>"
    if (c->think_open) {
        const char *close = "</think>";
        char *stops1[1] = {(char *)close};
        size_t at;
        if (stop_find(c->text.p, c->text.n, 0, stops1, 1, &at) >= 0)
            c->think_open = 0, c->think_end = at;
    }
    // stop strings: the first match in the text after the reasoning
    if (j->n_stops && (n > n_tok0 || ended)) {
        size_t from = c->searched, at;
        size_t base = j->think ? (c->think_open ? c->text.n : c->think_end + 8) : 0;
        if (from < base) from = base;
        int k = from <= c->text.n ? stop_find(c->text.p, c->text.n, from, j->stops, j->n_stops, &at)
                                  : -1;
        if (k >= 0) {
            size_t cut = at + (j->include_stop ? strlen(j->stops[k]) : 0);
            int keep = stop_tokens_kept(c->ends, n, at + strlen(j->stops[k]));
            td_engine_stop_at(s->e, c->eid, keep);
            c->text.n = cut;
            c->n_seen = keep;
            c->completion_tokens = keep;
            c->done = 1;
            c->finish_reason = "stop";
            snprintf(c->stop_reason, sizeof c->stop_reason, "%s", j->stops[k]);
        } else {
            c->searched = c->text.n >= j->max_stop ? c->text.n - j->max_stop + 1 : 0;
        }
    }
    if (!c->done && ended) {
        if (st == TD_REQ_FAILED) {
            c->failed = 1;
            return strstr(msg, "non-finite") ? 2 : 3;
        }
        if (fin == TD_FINISH_NONE) return 4; // cancelled under us
        c->done = 1;
        c->completion_tokens = n;
        c->finish_reason = fin == TD_FINISH_LENGTH || fin == TD_FINISH_CONTEXT ? "length" : "stop";
    }
    if (!c->done) c->completion_tokens = n;
    if (c->done) td_engine_request_stats(s->e, c->eid, &c->st);
    size_t upto = c->done ? c->text.n : stop_holdback(c->text.p, c->text.n, j->stops, j->n_stops);
    if (j->think && c->think_open && !c->done) { // hold a partial "</think>" back too
        char *close[1] = {"</think>"};
        size_t h = stop_holdback(c->text.p, c->text.n, close, 1);
        if (h < upto) upto = h;
    }
    if (j->tool_calls && !(j->think && c->think_open)) upto = hold_calls(s, j, c, upto);
    if (j->stream) {
        if (choice_delta(j, c, upto, c->done, n_tok0, chunk, !*n_in_chunk)) (*n_in_chunk)++;
    }
    return 0;
}

static const char *phase_name[] = {"queued", "prefill", "decode"};

/* the job's progress after a step; 1 when it left the worker */
static int pump(struct srv *s, struct job *j) {
    struct sbuf *chunk = &s->chunk;
    chunk->n = 0;
    if (j->stream) {
        if (!j->head) chunk_head(s, j);
        sbuf_put(chunk, j->head, j->n_head);
    }
    int all_done = 1, bad = 0, n_in = 0;
    for (int i = 0; i < j->n_ch && !bad; i++) {
        struct choice *c = &j->ch[i];
        if (c->done) continue;
        bad = pump_choice(s, j, c, chunk, &n_in);
        all_done &= c->done;
    }
    if (bad) {
        if (bad == 2)
            job_fail(s, j, 500, "server_error", "nonfinite_logits",
                     "the model produced non-finite logits for this request; no token was "
                     "emitted for that position",
                     MET_FINISH_NONFINITE);
        else
            job_fail(s, j, 500, "server_error", "engine_error", "the request failed in the engine",
                     MET_FINISH_ERROR);
        return 1;
    }
    if (j->stream && n_in) {
        sbuf_puts(chunk, j->include_usage ? "],\"usage\":null}\n\n" : "]}\n\n");
        job_send(j, chunk->p, chunk->n, 0);
        // the choices whose tool calls went out end in the next chunk
        chunk->n = n_in = 0;
        sbuf_put(chunk, j->head, j->n_head);
        for (int i = 0; i < j->n_ch; i++)
            if (j->ch[i].finish_pending) finish_delta(j, &j->ch[i], chunk, !n_in++);
        sbuf_puts(chunk, j->include_usage ? "],\"usage\":null}\n\n" : "]}\n\n");
        if (n_in) job_send(j, chunk->p, chunk->n, 0);
    }
    if (!all_done) return 0;
    count_finished(s, j, MET_FINISH_STOP); // counted before the client can read the end
    if (j->stream) {
        if (j->include_usage) {
            json_t *o =
                envelope(s, j, j->kind == JOB_CHAT ? "chat.completion.chunk" : "text_completion");
            json_object_set_new(o, "choices", json_array());
            json_object_set_new(o, "usage", usage_json(s, j));
            send_json_line(j, o, 0);
        }
        job_send(j, "data: [DONE]\n\n", 14, 1);
    } else {
        json_t *o = envelope(s, j, j->kind == JOB_CHAT ? "chat.completion" : "text_completion");
        json_t *chs2 = json_array();
        for (int i = 0; i < j->n_ch; i++) {
            struct choice *c = &j->ch[i];
            json_t *ch = json_pack("{s:i,s:n,s:s}", "index", c->index, "logprobs", "finish_reason",
                                   c->finish_reason);
            json_object_set_new(ch, "stop_reason",
                                c->stop_reason[0] ? json_string(c->stop_reason) : json_null());
            size_t r0, r1, t0, t1;
            split_think(j, c, 0, c->text.n, &r0, &r1, &t0, &t1);
            if (j->kind == JOB_CHAT) {
                // with tool calls the content is the text before them, null when there is none
                if (c->reply.n_calls) t1 = t0 + c->reply.content_len;
                json_t *m =
                    json_pack("{s:s,s:o}", "role", "assistant", "content",
                              c->reply.n_calls && t1 == t0 ? json_null()
                                                           : text_json(c->text.p + t0, t1 - t0));
                if (c->reply.n_calls) json_object_set_new(m, "tool_calls", calls_json(j, c));
                if (j->think)
                    json_object_set_new(m, "reasoning_content", text_json(c->text.p + r0, r1 - r0));
                json_object_set_new(ch, "message", m);
            } else {
                json_object_set_new(ch, "text", text_json(c->text.p, c->text.n));
            }
            if (j->return_token_ids) {
                const int32_t *t;
                int n;
                td_engine_output(s->e, c->eid, &t, &n, NULL, NULL, NULL);
                json_t *ids = json_array();
                for (int k = 0; k < c->completion_tokens && k < n; k++)
                    json_array_append_new(ids, json_integer(t[k]));
                json_object_set_new(ch, "token_ids", ids);
            }
            json_array_append_new(chs2, ch);
        }
        json_object_set_new(o, "choices", chs2);
        json_object_set_new(o, "usage", usage_json(s, j));
        send_body(j, 200, o);
    }
    log_request(s, j, "ok");
    job_retire(s, j);
    return 1;
}

static int submit_job(struct srv *s, struct job *j) {
    char err[512];
    for (int i = 0; i < j->n_ch; i++) {
        struct choice *c = &j->ch[i];
        struct td_request_params rp = {.prompt = j->prompts[c->prompt],
                                       .n_prompt = j->prompt_lens[c->prompt],
                                       .max_tokens = j->max_tokens,
                                       .sampling = c->sampling,
                                       .ignore_eos = j->ignore_eos,
                                       .stop_ids = j->stop_ids,
                                       .n_stop_ids = j->n_stop_ids,
                                       .no_draft = j->no_draft};
        if ((c->eid = td_engine_submit(s->e, &rp, err, sizeof err)) < 0) {
            job_fail(s, j, 400, "invalid_request_error", NULL, err, MET_FINISH_ERROR);
            return -1;
        }
        tok_stream_init(&c->ts, s->tok, TOK_DECODE_SKIP_SPECIAL);
        c->think_open = j->think;
        if (s->nan_on && c->sampling.seed == s->nan_seed && s->n_nan < 256) {
            s->nan_ids[s->n_nan] = c->eid;
            s->nan_pos[s->n_nan++] = rp.n_prompt + 2;
        }
    }
    j->submitted = 1;
    return 0;
}

static void nan_hook(void *ctx, int request, long position, float *row, int vocab) {
    struct srv *s = ctx;
    (void)vocab;
    for (int i = 0; i < s->n_nan; i++)
        if (s->nan_ids[i] == request && s->nan_pos[i] == position) row[0] = NAN;
}

/* the phase a job is in, for the disconnect counter */
static int job_phase(struct srv *s, const struct job *j) {
    int ph = MET_PHASE_QUEUED;
    for (int i = 0; i < j->n_ch; i++) {
        enum td_req_status st;
        int n = 0;
        if (j->ch[i].eid < 0 || td_engine_output(s->e, j->ch[i].eid, NULL, &n, &st, NULL, NULL))
            continue;
        int p = n > 0 || st == TD_REQ_DECODE ? MET_PHASE_DECODE
                : st == TD_REQ_PREFILL       ? MET_PHASE_PREFILL
                                             : MET_PHASE_QUEUED;
        if (p > ph) ph = p;
    }
    return ph;
}

/* the peer closed its end: a 0-byte peek on its socket */
static int peer_gone(int fd) {
    char c;
    if (fd < 0) return 0;
    ssize_t r = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static void *worker_main(void *arg) {
    struct srv *s = arg;
    double last_probe = 0, last_ping = now();
    char err[1024];
    for (;;) {
        pthread_mutex_lock(&s->mu);
        if (!s->q_head && !s->n_jobs && !s->stop_worker) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 50 * 1000000L;
            if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
            pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        }
        struct job *q = s->q_head;
        s->q_head = s->q_tail = NULL;
        int stop = s->stop_worker, cancel_all = s->cancel_all;
        pthread_mutex_unlock(&s->mu);
        for (; q; q = q->next) {
            if (s->n_jobs == s->cap_jobs) {
                int cap = s->cap_jobs ? 2 * s->cap_jobs : 64;
                struct job **nj = realloc(s->jobs, (size_t)cap * sizeof *nj);
                if (!nj) { // refuse it rather than lose it
                    job_fail(s, q, 503, "unavailable_error", NULL, "out of memory",
                             MET_FINISH_ERROR);
                    continue;
                }
                s->jobs = nj, s->cap_jobs = cap;
            }
            if (submit_job(s, q) == 0) s->jobs[s->n_jobs++] = q;
        }
        if (stop && !s->n_jobs) break;
        double t_loop = now();
        // gone clients, timeouts, shutdown
        double t = now();
        int probe = t - last_probe > 0.1;
        if (probe) last_probe = t;
        for (int i = 0; i < s->n_jobs; i++) {
            struct job *j = s->jobs[i];
            pthread_mutex_lock(&j->mu);
            int fd = j->fd, closed = j->closed;
            pthread_mutex_unlock(&j->mu);
            if (!closed && probe && peer_gone(fd)) {
                pthread_mutex_lock(&j->mu);
                closed = j->closed = 1;
                pthread_mutex_unlock(&j->mu);
            }
            int gone = 1;
            if (closed) {
                int ph = job_phase(s, j);
                met_disconnect(s->m, ph);
                for (int c = 0; c < j->n_ch; c++)
                    if (j->ch[c].eid >= 0) td_engine_cancel(s->e, j->ch[c].eid);
                count_finished(s, j, MET_FINISH_ABORT);
                char o[48];
                snprintf(o, sizeof o, "disconnected (%s)", phase_name[ph]);
                log_request(s, j, o);
                job_retire(s, j);
            } else if (j->deadline > 0 && t > j->deadline) {
                char m[160];
                snprintf(m, sizeof m, "the request timed out after %d s (server.request_timeout_s)",
                         s->cfg.request_timeout_s);
                job_fail(s, j, 504, "timeout_error", "request_timeout", m, MET_FINISH_TIMEOUT);
            } else if (cancel_all) {
                job_fail(s, j, 503, "unavailable_error", "shutting_down",
                         "the server is shutting down; the request was cancelled",
                         MET_FINISH_ABORT);
            } else {
                gone = 0;
            }
            if (gone) s->jobs[i--] = s->jobs[--s->n_jobs];
        }
        // the step
        struct td_engine_load ld;
        td_engine_load(s->e, &ld);
        if (ld.queued + ld.prefill + ld.decode > 0) {
            long rows0 = td_engine_stats(s->e)->rows;
            double t0 = now();
            int live = td_engine_step(s->e, err, sizeof err);
            s->t_step += now() - t0;
            const struct td_engine_stats *es = td_engine_stats(s->e);
            met_step(s->m,
                     ld.prefill && ld.decode ? MET_STEP_MIXED
                     : ld.decode             ? MET_STEP_DECODE
                                             : MET_STEP_PREFILL,
                     now() - t0, (int)(es->rows - rows0));
            met_engine(s->m, es);
            for (int k = 0; k <= TD_MAX_DRAFT; k++) {
                for (long d = s->last_hist[k]; d < es->accepted_hist[k]; d++)
                    met_accepted_per_step(s->m, k);
                s->last_hist[k] = es->accepted_hist[k];
            }
            if (live < 0) { // the engine is broken: every job ends, /readyz says so
                log_line(s, SRV_LOG_ERROR, "engine error: %s", err);
                pthread_mutex_lock(&s->mu);
                s->dead = 1;
                pthread_mutex_unlock(&s->mu);
                while (s->n_jobs) {
                    struct job *j = s->jobs[--s->n_jobs];
                    job_fail(s, j, 500, "server_error", "engine_error", err, MET_FINISH_ERROR);
                }
            }
        }
        double t_pump = now();
        for (int i = 0; i < s->n_jobs; i++)
            if (pump(s, s->jobs[i])) s->jobs[i--] = s->jobs[--s->n_jobs];
        s->t_emit += now() - t_pump;
        // pings: streams silent for sse_ping_s get a comment (and a write that finds a gone peer)
        if (now() - last_ping > s->cfg.sse_ping_s) {
            last_ping = now();
            for (int i = 0; i < s->n_jobs; i++)
                if (s->jobs[i]->stream) job_send(s->jobs[i], ": ping\n\n", 8, 0);
        }
        td_engine_load(s->e, &ld);
        pthread_mutex_lock(&s->mu);
        s->running = ld.prefill + ld.decode;
        s->waiting = ld.queued;
        for (struct job *w = s->q_head; w; w = w->next)
            s->waiting += w->n_ch;
        s->slots_busy = ld.slots_busy;
        s->held = ld.requests_held;
        int conns = s->connections, streams = s->streams;
        pthread_mutex_unlock(&s->mu);
        met_gauges(s->m, s->running, s->waiting, ld.slots_busy, streams, conns);
        if (s->n_jobs || ld.queued + ld.prefill + ld.decode) s->t_busy += now() - t_loop;
    }
    return NULL;
}

// ---------------------------------------------------------------------------------------------
// HTTP

struct conn {
    struct sbuf body;
    int too_large;
    struct job *job; /* a non-streamed generation waiting for its body */
    char rid[48];
    const char *endpoint;
};

static void add_common(struct srv *s, struct MHD_Response *r, const struct conn *cs) {
    MHD_add_response_header(r, "x-request-id", cs->rid);
    if (s->cfg.cors_origins[0]) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", s->cfg.cors_origins);
        MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type");
        MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    }
}

static enum MHD_Result reply(struct srv *s, struct MHD_Connection *c, struct conn *cs, int status,
                             const char *type, const char *body, size_t len) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    add_common(s, r, cs);
    if (status == 429 || status == 503) {
        MHD_add_response_header(r, "Retry-After", "1");
        MHD_add_response_header(r, "x-should-retry", "true");
    }
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    if (s->m) met_http(s->m, cs->endpoint, status); // (none while loading)
    return rc;
}

static enum MHD_Result reply_json(struct srv *s, struct MHD_Connection *c, struct conn *cs,
                                  int status, json_t *o) {
    char *b = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    enum MHD_Result rc =
        reply(s, c, cs, b ? status : 500, "application/json", b ? b : "{}", b ? strlen(b) : 2);
    free(b);
    return rc;
}

static enum MHD_Result reply_error(struct srv *s, struct MHD_Connection *c, struct conn *cs,
                                   int status, const char *type, const char *code, const char *fmt,
                                   ...) __attribute__((format(printf, 7, 8)));
static enum MHD_Result reply_error(struct srv *s, struct MHD_Connection *c, struct conn *cs,
                                   int status, const char *type, const char *code, const char *fmt,
                                   ...) {
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return reply_json(s, c, cs, status, api_error(type, code, NULL, "%s", msg));
}

/* constant time in the key's length: every byte of every key is compared */
static int key_ok(const struct srv *s, const char *got) {
    size_t g = got ? strlen(got) : 0;
    int ok = 0;
    for (int k = 0; k < s->n_keys; k++) {
        size_t n = strlen(s->keys[k]);
        unsigned char d = (unsigned char)(n != g);
        for (size_t i = 0; i < n; i++)
            d |= (unsigned char)(s->keys[k][i] ^ (i < g ? got[i] : 0));
        ok |= !d;
    }
    return ok;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    struct job *j = cls;
    (void)pos;
    pthread_mutex_lock(&j->mu);
    ssize_t rc;
    if (j->closed) {
        rc = MHD_CONTENT_READER_END_WITH_ERROR;
    } else if (j->off_out < j->out.n) {
        size_t k = j->out.n - j->off_out;
        if (k > max) k = max;
        memcpy(buf, j->out.p + j->off_out, k);
        j->off_out += k;
        rc = (ssize_t)k;
    } else if (j->out_done) {
        rc = MHD_CONTENT_READER_END_OF_STREAM;
    } else {
        j->suspended = 1;
        MHD_suspend_connection(j->conn);
        rc = 0;
    }
    pthread_mutex_unlock(&j->mu);
    return rc;
}

static void stream_free(void *cls) {
    struct job *j = cls;
    struct srv *s = j->s;
    pthread_mutex_lock(&s->mu);
    s->streams--;
    pthread_mutex_unlock(&s->mu);
    job_unref(j);
}

static enum MHD_Result handle_generate(struct srv *s, struct MHD_Connection *c, struct conn *cs,
                                       enum job_kind kind) {
    pthread_mutex_lock(&s->mu);
    int draining = s->draining || s->dead;
    pthread_mutex_unlock(&s->mu);
    if (draining) {
        met_rejected(s->m, MET_REJECT_DRAINING);
        return reply_error(s, c, cs, 503, "unavailable_error", NULL,
                           "the server is shutting down or unavailable");
    }
    struct job *j = calloc(1, sizeof *j);
    if (!j) return reply_error(s, c, cs, 500, "server_error", NULL, "out of memory");
    pthread_mutex_init(&j->mu, NULL);
    j->s = s;
    j->kind = kind;
    j->refs = 1; // the worker's, once queued; the connection's and the response's are added
    j->t_arrival = now();
    j->created = time(NULL);
    j->fd = -1;
    snprintf(j->rid, sizeof j->rid, "%s", cs->rid);
    snprintf(j->id, sizeof j->id, "%s-%s", kind == JOB_CHAT ? "chatcmpl" : "cmpl", cs->rid);
    json_t *err = NULL;
    int ignored = 0;
    met_received(s->m);
    int st = job_parse(s, j, cs->body.p ? cs->body.p : "", cs->body.n, &ignored, &err);
    if (ignored) met_ignored_fields(s->m, ignored);
    if (st) {
        const json_t *eo = json_object_get(err, "error");
        const char *code = json_string_value(json_object_get(eo, "code"));
        log_line(s, SRV_LOG_INFO, "request %s rejected %d: %s", j->rid, st,
                 json_string_value(json_object_get(eo, "message")));
        met_rejected(s->m, code && !strcmp(code, "context_length_exceeded")
                               ? MET_REJECT_CONTEXT
                               : MET_REJECT_BAD_REQUEST);
        job_unref(j);
        return reply_json(s, c, cs, st, err);
    }
    if (s->cfg.request_timeout_s > 0) j->deadline = j->t_arrival + s->cfg.request_timeout_s;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = ci ? ci->connect_fd : -1;
    j->conn = c;
    // admission: a bounded queue, 429 beyond it
    pthread_mutex_lock(&s->mu);
    int full = s->outstanding + j->n_ch > (long)s->cfg.max_running + s->cfg.max_waiting;
    if (!full) {
        s->outstanding += j->n_ch;
        j->refs++; // the connection's
        if (j->stream) j->refs++, s->streams++;
        if (s->q_tail)
            s->q_tail->next = j;
        else
            s->q_head = j;
        s->q_tail = j;
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    if (full) {
        met_rejected(s->m, MET_REJECT_QUEUE_FULL);
        log_line(s, SRV_LOG_INFO, "request %s rejected 429: the admission queue is full", j->rid);
        job_unref(j);
        return reply_error(s, c, cs, 429, "rate_limit_error", "queue_full",
                           "the server is busy: %d requests running and %d waiting; retry later",
                           s->cfg.max_running, s->cfg.max_waiting);
    }
    cs->job = j;
    if (j->stream) {
        struct MHD_Response *r =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, j, stream_free);
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        add_common(s, r, cs);
        enum MHD_Result rc = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        met_http(s->m, cs->endpoint, 200);
        return rc;
    }
    pthread_mutex_lock(&j->mu); // the body comes later: wait for it suspended
    if (!j->out_done) {
        j->suspended = 1;
        MHD_suspend_connection(c);
    }
    pthread_mutex_unlock(&j->mu);
    return MHD_YES;
}

/* POST /tokenize: llama.cpp's {content, add_special} or vLLM's {prompt, add_special_tokens} */
static enum MHD_Result handle_tokenize(struct srv *s, struct MHD_Connection *c, struct conn *cs) {
    json_error_t je;
    json_t *b = json_loadb(cs->body.p ? cs->body.p : "", cs->body.n, 0, &je);
    const json_t *t = json_object_get(b, "content");
    int vllm = !t;
    if (!t) t = json_object_get(b, "prompt");
    if (!json_is_string(t)) {
        json_decref(b);
        return reply_error(s, c, cs, 400, "invalid_request_error", NULL,
                           "give 'content' (or 'prompt') as a string");
    }
    const json_t *as = json_object_get(b, vllm ? "add_special_tokens" : "add_special");
    int add = as ? json_is_true(as) : vllm;
    struct tok_ids ids = {0};
    char e[512];
    if (tok_encode(s->tok, json_string_value(t), json_string_length(t),
                   add ? TOK_ENCODE_ADD_SPECIAL : 0, &ids, e, sizeof e)) {
        json_decref(b);
        return reply_error(s, c, cs, 400, "invalid_request_error", NULL, "%s", e);
    }
    json_t *arr = json_array();
    for (size_t i = 0; i < ids.n; i++)
        json_array_append_new(arr, json_integer(ids.ids[i]));
    tok_ids_free(&ids);
    json_decref(b);
    return reply_json(s, c, cs, 200,
                      json_pack("{s:o,s:I,s:i}", "tokens", arr, "count", (json_int_t)ids.n,
                                "max_model_len", s->max_ctx));
}

static enum MHD_Result handle_detokenize(struct srv *s, struct MHD_Connection *c, struct conn *cs) {
    json_error_t je;
    json_t *b = json_loadb(cs->body.p ? cs->body.p : "", cs->body.n, 0, &je);
    const json_t *t = json_object_get(b, "tokens");
    if (!json_is_array(t)) {
        json_decref(b);
        return reply_error(s, c, cs, 400, "invalid_request_error", NULL,
                           "give 'tokens' as an array of token ids");
    }
    size_t n = json_array_size(t);
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    for (size_t i = 0; ids && i < n; i++) {
        const json_t *x = json_array_get(t, i);
        long long v = json_is_integer(x) ? json_integer_value(x) : -1;
        if (v < 0 || v >= s->vocab) {
            free(ids);
            json_decref(b);
            return reply_error(s, c, cs, 400, "invalid_request_error", NULL,
                               "tokens[%zu] is not a token id in [0, %d)", i, s->vocab);
        }
        ids[i] = (int32_t)v;
    }
    char *text = NULL, e[256];
    size_t len = 0;
    int rc = ids ? tok_decode(s->tok, ids, n, 0, &text, &len, e, sizeof e) : -1;
    free(ids);
    json_decref(b);
    if (rc) return reply_error(s, c, cs, 400, "invalid_request_error", NULL, "cannot decode");
    json_t *o =
        json_pack("{s:o,s:o}", "content", text_json(text, len), "prompt", text_json(text, len));
    free(text);
    return reply_json(s, c, cs, 200, o);
}

static json_t *models_json(const struct srv *s) {
    return json_pack("{s:s,s:[{s:s,s:s,s:I,s:s,s:s,s:i}]}", "object", "list", "data", "id",
                     s->model_name, "object", "model", "created", (json_int_t)time(NULL),
                     "owned_by", "tandem", "root", s->model_dir, "max_model_len", s->max_ctx);
}

static enum MHD_Result handle_get(struct srv *s, struct MHD_Connection *c, struct conn *cs,
                                  const char *url) {
    pthread_mutex_lock(&s->mu);
    int ready = !s->draining && !s->dead;
    int running = s->running, waiting = s->waiting, busy = s->slots_busy, held = s->held;
    long outstanding = s->outstanding;
    int full = outstanding >= (long)s->cfg.max_running + s->cfg.max_waiting;
    pthread_mutex_unlock(&s->mu);
    if (!strcmp(url, "/readyz") && ready && full)
        return reply_json(s, c, cs, 503, json_pack("{s:s}", "status", "busy")); // admits nothing
    if (!strcmp(url, "/health") || !strcmp(url, "/v1/health") || !strcmp(url, "/readyz")) {
        if (!ready)
            return reply_json(s, c, cs, 503,
                              json_pack("{s:s}", "status", s->dead ? "error" : "draining"));
        return reply_json(s, c, cs, 200, json_pack("{s:s}", "status", "ok"));
    }
    if (!strcmp(url, "/livez"))
        return reply_json(s, c, cs, 200, json_pack("{s:s}", "status", "ok"));
    if (!strcmp(url, "/")) {
        if (!s->page)
            return reply_error(s, c, cs, 404, "not_found_error", NULL,
                               "the chat page is off (server.web_ui = %s)",
                               s->cfg.web_ui == SRV_WEB_UI_OFF ? "off" : "auto, not on loopback");
        return reply(s, c, cs, 200, "text/html; charset=utf-8", s->page, s->n_page);
    }
    if (!strcmp(url, "/v1/models")) return reply_json(s, c, cs, 200, models_json(s));
    if (!strcmp(url, "/version"))
        return reply_json(s, c, cs, 200, json_pack("{s:s}", "version", TD_VERSION));
    if (!strcmp(url, "/metrics")) {
        if (!s->cfg.metrics_enabled)
            return reply_error(s, c, cs, 501, "not_supported_error", NULL,
                               "metrics are off ([metrics] enabled = off)");
        char *text = NULL;
        size_t len = 0;
        if (met_render(s->m, &text, &len))
            return reply_error(s, c, cs, 500, "server_error", NULL, "out of memory");
        enum MHD_Result rc =
            reply(s, c, cs, 200, "text/plain; version=0.0.4; charset=utf-8", text, len);
        free(text);
        return rc;
    }
    if (!strcmp(url, "/slots")) {
        const char *f = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "fail_on_no_slot");
        if (f && !strcmp(f, "1") && busy >= s->cfg.max_running)
            return reply_error(s, c, cs, 503, "unavailable_error", NULL, "no free slot");
        json_t *o = json_pack("{s:i,s:i,s:i,s:i,s:i,s:I}", "total_slots", s->cfg.max_running,
                              "busy_slots", busy, "running", running, "waiting", waiting,
                              "engine_requests_held", held, "outstanding", (json_int_t)outstanding);
        json_object_set_new(
            o, "worker_seconds",
            json_pack("{s:f,s:f,s:f}", "step", s->t_step, "emit", s->t_emit, "busy", s->t_busy));
        return reply_json(s, c, cs, 200, o);
    }
    if (!strcmp(url, "/props")) {
        json_t *o = json_pack(
            "{s:s,s:s,s:i,s:i,s:s,s:s,s:i,s:s,s:{s:f,s:f,s:i,s:i,s:i}}", "model", s->model_name,
            "model_path", s->model_dir, "max_model_len", s->max_ctx, "total_slots",
            s->cfg.max_running, "drafter", s->drafter, "backend", td_engine_backend(s->e),
            "draft_tokens", s->draft_k, "chat_format",
            !s->have_chat                            ? "none"
            : s->chat.format == CHAT_FORMAT_DEEPSEEK ? (s->chat.v4 ? "deepseek_v4" : "deepseek")
            : s->chat.format == CHAT_FORMAT_CHATML   ? "chatml"
                                                     : "plain",
            "default_generation_settings", "temperature", s->cfg.temperature, "top_p", s->cfg.top_p,
            "top_k", s->cfg.top_k, "max_tokens", s->cfg.max_tokens, "completion_max_tokens",
            s->cfg.completion_max_tokens);
        // the request's "draft" values this server takes
        json_t *ds = json_pack("[s,s]", "none", "auto");
        if (strcmp(s->drafter, "none")) json_array_append_new(ds, json_string(s->drafter));
        json_object_set_new(o, "drafters", ds);
        json_object_set_new(o, "web_ui", json_boolean(s->page != NULL));
        // whether a request can ask for thinking (the chat format has its markers)
        json_object_set_new(o, "thinking", json_boolean(s->have_chat && s->chat.think_open >= 0));
        json_object_set_new(o, "config", srv_config_json(&s->cfg));
        json_object_set_new(o, "system_fingerprint", json_string(s->fingerprint));
        json_object_set_new(o, "build", json_string(TD_VERSION));
        return reply_json(s, c, cs, 200, o);
    }
    return reply_error(s, c, cs, 404, "not_found_error", NULL, "no such endpoint: GET %s", url);
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_size, void **con_cls) {
    struct srv *s = cls;
    struct conn *cs = *con_cls;
    (void)version;
    if (!cs) { // the headers: a fresh request
        if (!(cs = calloc(1, sizeof *cs))) return MHD_NO;
        const char *rid = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-request-id");
        static unsigned long counter;
        if (rid && strlen(rid) < sizeof cs->rid && strlen(rid) > 0 && !strpbrk(rid, "\r\n\"\\"))
            snprintf(cs->rid, sizeof cs->rid, "%s", rid);
        else
            snprintf(cs->rid, sizeof cs->rid, "%lx%04lx", (unsigned long)time(NULL),
                     __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED) & 0xffff);
        cs->endpoint = met_endpoint(url);
        *con_cls = cs;
        return MHD_YES;
    }
    if (*upload_size) { // the body, piece by piece, up to the limit
        if (!cs->too_large) {
            if ((long)(cs->body.n + *upload_size) > s->cfg.max_body_bytes)
                cs->too_large = 1;
            else
                sbuf_put(&cs->body, upload, *upload_size);
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (cs->job) { // a non-streamed generation, resumed: its body is ready
        struct job *j = cs->job;
        pthread_mutex_lock(&j->mu);
        int done = j->out_done, st = j->http_status ? j->http_status : 200, closed = j->closed;
        pthread_mutex_unlock(&j->mu);
        if (closed && !done) return MHD_NO; // the client is gone: close the connection
        if (!done) {                        // resumed early: wait again
            pthread_mutex_lock(&j->mu);
            j->suspended = 1;
            MHD_suspend_connection(c);
            pthread_mutex_unlock(&j->mu);
            return MHD_YES;
        }
        return reply(s, c, cs, st, "application/json", j->out.p + j->off_out,
                     j->out.n - j->off_out);
    }
    if (cs->body.oom) return reply_error(s, c, cs, 500, "server_error", NULL, "out of memory");
    if (cs->too_large) {
        met_rejected(s->m, MET_REJECT_TOO_LARGE);
        return reply_error(s, c, cs, 413, "invalid_request_error", "body_too_large",
                           "the request body is larger than %ld bytes (limits.max_body_bytes)",
                           s->cfg.max_body_bytes);
    }
    pthread_mutex_lock(&s->mu);
    int loading = s->loading;
    pthread_mutex_unlock(&s->mu);
    if (loading) { // nothing but liveness until the model is there
        if (!strcmp(url, "/livez"))
            return reply(s, c, cs, 200, "application/json", "{\"status\":\"ok\"}", 15);
        if (!strcmp(url, "/health") || !strcmp(url, "/v1/health") || !strcmp(url, "/readyz"))
            return reply(s, c, cs, 503, "application/json", "{\"status\":\"loading\"}", 20);
        return reply_error(s, c, cs, 503, "unavailable_error", "loading",
                           "the model is loading; retry later");
    }
    int post = !strcmp(method, "POST"), get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    if (!strcmp(method, "OPTIONS") && s->cfg.cors_origins[0])
        return reply(s, c, cs, 204, "text/plain", "", 0);
    int public = !strcmp(url, "/health") || !strcmp(url, "/v1/health") || !strcmp(url, "/livez") ||
                 !strcmp(url, "/readyz") || !strcmp(url, "/"); // the page asks for a key itself
    if (s->n_keys && !public) {
        const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
        const char *x = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Api-Key");
        const char *key = h && !strncmp(h, "Bearer ", 7) ? h + 7 : x;
        if (!key_ok(s, key)) {
            met_rejected(s->m, MET_REJECT_AUTH);
            return reply_error(s, c, cs, 401, "authentication_error", "invalid_api_key",
                               "a valid API key is required (Authorization: Bearer KEY)");
        }
    }
    int gen_chat = !strcmp(url, "/v1/chat/completions"), gen = !strcmp(url, "/v1/completions");
    if (gen_chat || gen || !strcmp(url, "/tokenize") || !strcmp(url, "/detokenize")) {
        if (!post)
            return reply_error(s, c, cs, 405, "invalid_request_error", "method_not_allowed",
                               "%s takes POST, not %s", url, method);
        if (gen_chat || gen) return handle_generate(s, c, cs, gen_chat ? JOB_CHAT : JOB_COMPLETION);
        return !strcmp(url, "/tokenize") ? handle_tokenize(s, c, cs) : handle_detokenize(s, c, cs);
    }
    if (!strcmp(met_endpoint(url), "other"))
        return reply_error(s, c, cs, 404, "not_found_error", NULL, "no such endpoint: %s %s",
                           method, url);
    if (!get)
        return reply_error(s, c, cs, 405, "invalid_request_error", "method_not_allowed",
                           "%s takes GET, not %s", url, method);
    return handle_get(s, c, cs, url);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode why) {
    struct srv *s = cls;
    struct conn *cs = *con_cls;
    (void)c;
    (void)why;
    if (!cs) return;
    if (cs->job) {
        struct job *j = cs->job;
        pthread_mutex_lock(&j->mu);
        j->conn = NULL;
        j->fd = -1;
        if (!j->out_done || j->off_out < j->out.n) j->closed = 1; // gone before the end
        pthread_mutex_unlock(&j->mu);
        pthread_mutex_lock(&s->mu);
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
        job_unref(j);
    }
    free(cs->body.p);
    free(cs);
    *con_cls = NULL;
}

static void connection_note(void *cls, struct MHD_Connection *c, void **socket_ctx,
                            enum MHD_ConnectionNotificationCode code) {
    struct srv *s = cls;
    (void)c;
    (void)socket_ctx;
    pthread_mutex_lock(&s->mu);
    s->connections += code == MHD_CONNECTION_NOTIFY_STARTED ? 1 : -1;
    pthread_mutex_unlock(&s->mu);
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    struct srv *s = cls;
    if (s->cfg.log_level < SRV_LOG_DEBUG) return;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t k = strlen(msg);
    while (k && msg[k - 1] == '\n')
        msg[--k] = 0;
    log_line(s, SRV_LOG_DEBUG, "http: %s", msg);
}

// ---------------------------------------------------------------------------------------------
// start, serve, drain

static int load_keys(struct srv *s, const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "tandem: serve: cannot open server.api_key_file %s: %s\n", path,
                strerror(errno));
        return -1;
    }
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        size_t k = strcspn(line, "\r\n");
        line[k] = 0;
        char *p = line;
        while (*p == ' ' || *p == '\t')
            p++;
        if (!*p || *p == '#') continue;
        char **nk = realloc(s->keys, (size_t)(s->n_keys + 1) * sizeof *nk);
        if (!nk) break;
        s->keys = nk;
        s->keys[s->n_keys++] = strdup(p);
    }
    fclose(f);
    if (!s->n_keys) {
        fprintf(stderr, "tandem: serve: server.api_key_file %s holds no key\n", path);
        return -1;
    }
    return 0;
}

struct td_engine_params srv_engine_params(const struct srv_config *c, const char *model_dir,
                                          const char *drafter) {
    struct td_engine_params ep = td_engine_defaults();
    ep.model_dir = model_dir;
    ep.backend = c->backend;
    ep.max_seqs = c->max_running;
    ep.max_ctx = c->max_context;
    ep.kv_dtype = td_engine_kv_dtype_parse(c->kv_dtype); // (the config allows only the three names)
    ep.max_batch_tokens = c->max_batch_tokens;
    ep.prefill_chunk = c->prefill_chunk;
    ep.prefix_blocks = c->prefix_blocks;
    ep.history_blocks = c->history_blocks;
    ep.draft = drafter;
    ep.max_draft = c->k;
    ep.dspark_dir = c->dspark_dir[0] ? c->dspark_dir : NULL;
    ep.dspark_threshold = (float)c->confidence_min;
    ep.draft_policy = c->policy == SRV_POLICY_FIXED ? TD_POLICY_FIXED : TD_POLICY_ADAPTIVE;
    ep.no_graphs = !c->graphs;
    ep.deterministic = c->deterministic;
    ep.dummy_weights = c->dummy_weights;
    ep.max_cache_bytes = (size_t)c->max_cache_mib << 20;
    const struct draft_info *di = draft_lookup(c->method, NULL, 0); // (srv_config_check: known)
    if (!ep.max_draft && di) ep.max_draft = di->default_tokens;     // as generate does
    if (ep.max_batch_tokens < 1 + ep.max_draft) ep.max_batch_tokens = 1 + ep.max_draft;
    if (c->gpus) ep.nccl = 1, ep.backend = "cuda:0"; // (a follower's: its own GPU, app/cli.c)
    return ep;
}

static int open_engine(struct srv *s) {
    const struct srv_config *c = &s->cfg;
    struct td_engine_params ep = srv_engine_params(c, s->model_dir, s->drafter);
    ep.comm = s->comm;
    const char *nan = getenv("TANDEM_TEST_NAN");
    if (nan && *nan) {
        s->nan_on = 1;
        s->nan_seed = strtoull(nan, NULL, 10);
        ep.logits_hook = nan_hook;
        ep.hook_ctx = s;
    }
    char err[1024];
    if (td_engine_init(&s->e, &ep, err, sizeof err)) {
        fprintf(stderr, "tandem: serve: %s\n", err);
        return -1;
    }
    // the drafter running, auto's pick included; the pick stands in the configuration as if it
    // had been set (/props, the fingerprint). What generate refuses of auto's pick, serve does
    const char *pick = td_engine_draft(s->e), *why = NULL;
    const struct draft_info *ran = draft_lookup(pick, NULL, 0); // the registry's: never NULL
    if (ran->kind == DRAFT_KIND_NONE && c->k > 0)
        why = "speculation.k needs a drafter";
    else if (ran->kind != DRAFT_KIND_DSPARK && (c->confidence_min > 0 || c->dspark_dir[0]))
        why = "speculation.confidence_min and speculation.dspark_dir need the dspark drafter";
    if (why) {
        fprintf(stderr, "tandem: serve: %s, but speculation.method = %s runs %s\n", why, c->method,
                pick);
        return -1;
    }
    snprintf(s->drafter, sizeof s->drafter, "%s", pick);
    snprintf(s->cfg.method, sizeof s->cfg.method, "%s", pick);
    s->draft_k = td_engine_draft_tokens(s->e);
    s->vocab = td_engine_vocab(s->e);
    s->max_ctx = c->max_context;
    { // the engine caps the context by the model
        char cfgp[TD_PATH_MAX];
        json_t *root = NULL;
        if (!td_path_join(cfgp, sizeof cfgp, s->model_dir, "config.json", err, sizeof err) &&
            (root = json_load_file(cfgp, 0, NULL))) {
            json_int_t mp = json_integer_value(json_object_get(root, "max_position_embeddings"));
            if (mp > 0 && mp < s->max_ctx) s->max_ctx = (int)mp;
        }
        json_decref(root);
    }
    s->max_prompt = c->max_prompt_tokens > 0 && c->max_prompt_tokens < s->max_ctx
                        ? c->max_prompt_tokens
                        : s->max_ctx - 1;
    return 0;
}

static volatile sig_atomic_t g_signal;

/* the chat page (serve/web/index.html, built in by serve/web.S) */
extern const char td_web_page[], td_web_page_end[];

static int is_loopback(const struct sockaddr_storage *a) {
    if (a->ss_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr) >> 24) == 127;
    if (a->ss_family != AF_INET6) return 0;
    const struct in6_addr *v6 = &((const struct sockaddr_in6 *)a)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(v6) || (IN6_IS_ADDR_V4MAPPED(v6) && v6->s6_addr[12] == 127);
}

/* server.web_ui: the page at / (auto: on when the server listens on loopback alone), built in
 * or read once from server.web_ui_dir; 0, or -1 with a message when that file cannot be read */
static int open_page(struct srv *s, const struct sockaddr_storage *addr) {
    if (s->cfg.web_ui == SRV_WEB_UI_OFF || (s->cfg.web_ui == SRV_WEB_UI_AUTO && !is_loopback(addr)))
        return 0;
    if (!s->cfg.web_ui_dir[0]) {
        s->page = td_web_page, s->n_page = (size_t)(td_web_page_end - td_web_page);
        return 0;
    }
    char path[SRV_STR + 16], err[600];
    snprintf(path, sizeof path, "%s/index.html", s->cfg.web_ui_dir);
    if (!(s->page_buf = td_file_read(path, (size_t)64 << 20, &s->n_page, err, sizeof err))) {
        fprintf(stderr, "tandem: serve: server.web_ui_dir: %s\n", err);
        return -1;
    }
    s->page = s->page_buf;
    return 0;
}

int srv_run(const struct srv_config *cfg, struct td_comm *comm) {
    struct srv *s = calloc(1, sizeof *s);
    int rc = 1;
    if (!s) return 1;
    s->cfg = *cfg;
    s->comm = comm;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->log_mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->log = stderr;
    if (cfg->log_file[0] && !(s->log = fopen(cfg->log_file, "a"))) {
        fprintf(stderr, "tandem: serve: cannot open log.file %s: %s\n", cfg->log_file,
                strerror(errno));
        s->log = stderr;
        goto out;
    }
    snprintf(s->model_dir, sizeof s->model_dir, "%s", cfg->path);
    snprintf(s->drafter, sizeof s->drafter, "%s", cfg->method);
    if (cfg->served_model_name[0]) {
        snprintf(s->model_name, sizeof s->model_name, "%s", cfg->served_model_name);
    } else {
        char tmp[SRV_STR];
        snprintf(tmp, sizeof tmp, "%s", cfg->path);
        size_t k = strlen(tmp);
        while (k > 1 && tmp[k - 1] == '/')
            tmp[--k] = 0;
        const char *b = strrchr(tmp, '/');
        snprintf(s->model_name, sizeof s->model_name, "%s", b ? b + 1 : tmp);
    }
    if (cfg->api_key_file[0] && load_keys(s, cfg->api_key_file)) goto out;
    // signals go to this thread alone (sigwait below); every thread made after inherits the mask
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    // the address: an IPv4 or IPv6 literal, or a name (its first address)
    struct sockaddr_storage addr;
    memset(&addr, 0, sizeof addr);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                    *ai = NULL;
    char port_s[16];
    snprintf(port_s, sizeof port_s, "%d", cfg->port);
    int g = getaddrinfo(cfg->host, port_s, &hints, &ai);
    if (g || !ai || ai->ai_addrlen > sizeof addr) {
        fprintf(stderr, "tandem: serve: server.host '%s': %s\n", cfg->host,
                g ? gai_strerror(g) : "no address");
        if (ai) freeaddrinfo(ai);
        goto out;
    }
    memcpy(&addr, ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(ai);
    int v6 = addr.ss_family == AF_INET6;
    if (open_page(s, &addr)) goto out;
    // HTTP first: while the model loads, /livez is 200 and everything else 503 (a checkpoint of
    // 150 GB takes minutes; a supervisor sees a live process that is not ready yet)
    s->loading = 1;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_ITC | MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0);
    s->d = MHD_start_daemon(flags, 0, NULL, NULL, handler, s, MHD_OPTION_SOCK_ADDR,
                            (struct sockaddr *)&addr, MHD_OPTION_NOTIFY_COMPLETED, completed, s,
                            MHD_OPTION_NOTIFY_CONNECTION, connection_note, s,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)cfg->max_connections,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)cfg->per_ip_connections,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->idle_timeout_s,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s, MHD_OPTION_END);
    if (!s->d) {
        fprintf(stderr, "tandem: serve: cannot listen on %s:%d: %s\n", cfg->host, cfg->port,
                strerror(errno));
        goto out;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    int port = di ? di->port : cfg->port;
    const char *lb = v6 && strchr(cfg->host, ':') ? "[" : "", *rb = *lb ? "]" : "";
    fprintf(stderr, "tandem: loading %s, listening on http://%s%s%s:%d (503 until it is ready)\n",
            s->model_dir, lb, cfg->host, rb, port);
    const char *delay = getenv("TANDEM_TEST_LOAD_DELAY_MS"); // test seam: a slow load
    if (delay && *delay) {
        long ms = strtol(delay, NULL, 10);
        struct timespec d = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
        nanosleep(&d, NULL);
    }
    char err[1024];
    if (tok_load(&s->tok, s->model_dir, err, sizeof err)) {
        fprintf(stderr, "tandem: serve: %s\n", err);
        goto out;
    }
    s->have_chat = chat_init(&s->chat, s->tok, err, sizeof err) == 0;
    if (open_engine(s)) goto out;
    snprintf(s->fingerprint, sizeof s->fingerprint, "fp_tandem_%s_%016llx", TD_VERSION,
             srv_config_hash(&s->cfg));
    struct met_info mi = {.model = s->model_name,
                          .drafter = s->drafter,
                          .k = s->draft_k,
                          .version = TD_VERSION,
                          .backend = td_engine_backend(s->e),
                          .config_hash = srv_config_hash(&s->cfg),
                          .slots_total = cfg->max_running,
                          .vllm_compat = cfg->vllm_compat};
    if (!(s->m = met_new(&mi))) {
        fprintf(stderr, "tandem: serve: out of memory\n");
        goto out;
    }
    if (pthread_create(&s->worker, NULL, worker_main, s)) {
        fprintf(stderr, "tandem: serve: cannot start the worker thread\n");
        goto out;
    }
    s->have_worker = 1;
    pthread_mutex_lock(&s->mu);
    s->loading = 0; // what the handlers read under s->mu: the model, the tokenizer, the metrics
    pthread_mutex_unlock(&s->mu);
    fprintf(stderr, "tandem: serving %s on http://%s%s%s:%d (backend %s, drafter %s, %d slots)\n",
            s->model_name, lb, cfg->host, rb, port, td_engine_backend(s->e), s->drafter,
            cfg->max_running);
    log_line(s, SRV_LOG_INFO, "serving %s on http://%s:%d, backend %s, drafter %s (k %d)",
             s->model_name, cfg->host, port, td_engine_backend(s->e), s->drafter, s->draft_k);
    int sig = 0;
    sigwait(&sigs, &sig);
    // drain: stop accepting, let running requests finish for drain_s, cancel the rest
    log_line(s, SRV_LOG_INFO, "%s: draining (up to %d s)", sig == SIGINT ? "SIGINT" : "SIGTERM",
             cfg->drain_s);
    pthread_mutex_lock(&s->mu);
    s->draining = 1;
    pthread_mutex_unlock(&s->mu);
    MHD_socket ls = MHD_quiesce_daemon(s->d);
    if (ls != MHD_INVALID_SOCKET) close(ls);
    double t_end = now() + cfg->drain_s;
    struct timespec pause = {.tv_sec = 0, .tv_nsec = 20 * 1000000L};
    for (;;) {
        pthread_mutex_lock(&s->mu);
        long left = s->outstanding;
        pthread_mutex_unlock(&s->mu);
        sigset_t pend;
        sigpending(&pend);
        int again = sigismember(&pend, SIGTERM) || sigismember(&pend, SIGINT);
        if (!left) break;
        if (now() > t_end || again) {
            pthread_mutex_lock(&s->mu);
            s->cancel_all = 1;
            pthread_cond_signal(&s->cv);
            pthread_mutex_unlock(&s->mu);
        }
        nanosleep(&pause, NULL);
    }
    pthread_mutex_lock(&s->mu);
    s->stop_worker = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->worker, NULL);
    // the last bytes of finished streams go out before the connections close
    for (double t1 = now() + 2.0; now() < t1;) {
        pthread_mutex_lock(&s->mu);
        int busy = s->streams;
        pthread_mutex_unlock(&s->mu);
        if (!busy) break;
        nanosleep(&pause, NULL);
    }
    MHD_stop_daemon(s->d);
    log_line(s, SRV_LOG_INFO, "stopped");
    rc = 0;
out:
    if (rc && s->d) MHD_stop_daemon(s->d); // a failed load: only 503s were answered
    if (rc && s->have_worker) {
        pthread_mutex_lock(&s->mu);
        s->stop_worker = 1;
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->worker, NULL);
    }
    if (s->e) td_engine_free(s->e);
    tok_free(s->tok);
    met_free(s->m);
    for (int i = 0; i < s->n_keys; i++)
        free(s->keys[i]);
    free(s->keys);
    free(s->jobs);
    free(s->chunk.p);
    free(s->page_buf);
    if (s->log && s->log != stderr) fclose(s->log);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->log_mu);
    free(s);
    (void)g_signal;
    return rc;
}
