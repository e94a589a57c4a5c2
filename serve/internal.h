/* internal.h: what the server's files share (not an API): the server, its jobs (one HTTP
 * generation request each) and their choices (one engine request each).
 *
 * Threads: libmicrohttpd's one polling thread runs every HTTP callback (parsing, tokenizing,
 * answering); the worker thread owns the engine and the tokenizer's decoding and is the only
 * one that touches engine state. They meet in two places, each behind a mutex: the admission
 * queue (srv.mu: HTTP appends jobs, the worker takes them) and each job's output (job.mu: the
 * worker appends bytes and resumes the connection, HTTP reads them or sees the job closed).
 */
#ifndef TD_SERVE_INTERNAL_H
#define TD_SERVE_INTERNAL_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "engine/engine.h"
#include "serve/config.h"
#include "serve/metrics.h"
#include "serve/text.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

struct MHD_Connection;
struct MHD_Daemon;

#define SRV_MAX_STOPS 64

enum job_kind { JOB_COMPLETION, JOB_CHAT };

/* one engine request: a choice of a job */
struct choice {
    int eid;    /* engine id; -1 until submitted */
    int index;  /* its index in the response */
    int prompt; /* which of the job's prompts */
    struct td_sampling sampling;
    int n_seen;           /* tokens read from the engine */
    struct tok_stream ts; /* their text, piece by piece */
    struct sbuf text;     /* decoded so far (cut at a stop) */
    size_t *ends;         /* [n_seen] text length after each token */
    int cap_ends;
    size_t sent;     /* bytes of text already in the stream */
    int piece_tok;   /* the first token whose text is not all in the stream yet */
    size_t searched; /* a stop match can no longer start before this */
    int role_sent, done, failed;
    const char *finish_reason; /* "stop" or "length" once done */
    char stop_reason[160];     /* the stop string matched ("" for EOS and stop ids) */
    int completion_tokens;
    int think_open;   /* chat with thinking: text still goes to reasoning_content */
    size_t think_end; /* where reasoning ended (its "</think>" removed) */
    /* V4 tool calls (job.tool_calls): the content from CHAT_V4_CALLS_MARK on is held back as a
       partial stop string is, and read as calls once the reply ends */
    int calls_seen;          /* the mark has been found, at calls_at */
    size_t calls_at;         /* where it begins in text */
    size_t calls_searched;   /* the mark can no longer begin before this */
    struct chat_reply reply; /* once done: its calls (n_calls 0: none, the text is content) */
    int finish_pending;      /* streamed: its tool_calls went out, its finish_reason is next */
    struct td_request_stats st;
    double t_prev; /* when its last tokens went out (inter-token latency) */
};

struct job {
    pthread_mutex_t mu; /* the fields under "shared" */
    int refs;           /* the connection, the stream response, the worker */
    struct srv *s;
    char rid[48]; /* x-request-id */
    char id[64];  /* cmpl-... / chatcmpl-... */
    /* the request */
    enum job_kind kind;
    int stream, include_usage, return_token_ids, ignore_eos, include_stop, think;
    int no_draft;      /* "draft": "none" (td_request_params.no_draft) */
    int tool_calls;    /* V4 chat (tool_choice not "none"): a DSML block comes back as tool_calls */
    int max_tokens, n; /* tokens per choice, choices per prompt */
    char *stops[SRV_MAX_STOPS];
    int n_stops;
    size_t max_stop;
    int32_t stop_ids[TD_MAX_STOP_IDS];
    int n_stop_ids;
    int32_t **prompts; /* [n_prompts] token ids */
    int *prompt_lens;
    int n_prompts;
    struct choice *ch; /* [n_ch] = n_prompts * n */
    int n_ch;
    double t_arrival, deadline; /* td_engine_clock(); deadline 0: none */
    time_t created;
    int prompt_tokens;
    char *log_prompt; /* the prompt text, when log.log_requests */
    char *head;       /* a stream chunk's opening, up to "choices":[ (worker) */
    size_t n_head;
    /* worker only */
    int submitted, finished;
    struct job *next;
    /* shared (mu) */
    struct MHD_Connection *conn; /* NULL once the connection is gone */
    int fd;
    struct sbuf out; /* bytes for the client: the stream's, or the whole body */
    size_t off_out;  /* of which sent */
    int out_done;    /* out holds everything that will ever be sent */
    int http_status; /* non-streamed: the body's status */
    int suspended, closed;
    int phase; /* enum met_phase while running */
};

struct srv {
    struct srv_config cfg;
    struct td_engine *e;
    struct tok *tok;
    struct chat chat;
    int have_chat;
    struct srv_metrics *m;
    struct MHD_Daemon *d;
    char model_name[SRV_STR], model_dir[SRV_STR], drafter[SRV_STR], fingerprint[64];
    struct td_comm *comm; /* --ranks: the model split over processes, this one leading */
    int max_ctx, max_prompt, vocab, draft_k;
    const char *page; /* the chat page served at / (NULL: server.web_ui is off) */
    size_t n_page;
    char *page_buf; /* page, when read from server.web_ui_dir */
    char **keys;    /* API keys */
    int n_keys;
    FILE *log;
    pthread_mutex_t log_mu;
    /* admission (mu) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct job *q_head, *q_tail;
    long outstanding;                       /* choices accepted and not yet finished */
    int running, waiting, slots_busy, held; /* as the worker last saw them */
    int loading, draining, dead, cancel_all, stop_worker, have_worker;
    int connections, streams;
    pthread_t worker;
    /* test seam: requests with this seed get a non-finite row after 3 tokens */
    int nan_on;
    uint64_t nan_seed;
    int nan_ids[256], nan_pos[256], n_nan;
    /* worker only */
    struct job **jobs;
    int n_jobs, cap_jobs;
    long last_hist[TD_MAX_DRAFT + 1];
    struct sbuf chunk;             /* the chunk being written (reused) */
    double t_step, t_emit, t_busy; /* worker seconds: in td_engine_step, turning tokens into
                                      bytes, and in loops that had work (read racily: a gauge) */
};

/* request.c: a generation request's JSON body into j (its prompts tokenized, every field
 * checked); 0, or the HTTP status with *err_out set to an OpenAI error object */
int job_parse(struct srv *s, struct job *j, const char *body, size_t len, int *ignored,
              struct json_t **err_out);
/* an OpenAI error object {"error":{...}} (message formatted) */
struct json_t *api_error(const char *type, const char *code, const char *param, const char *fmt,
                         ...) __attribute__((format(printf, 4, 5)));
void job_free_request(struct job *j);

#endif
