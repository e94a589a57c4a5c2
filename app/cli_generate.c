/* cli_generate.c: `tandem generate` and `tandem chat` (see cli.h; tandem --help, tandem chat
 * --help list the options).
 *
 *   tandem generate "Once upon a time" --max-tokens 64            (text out, streamed)
 *   tandem generate --prompt-ids "1 2 3" --n 4 --print-ids --stats --draft mtp
 *   tandem chat --system "Be brief."                              (a line a turn)
 *   tandem chat --think                       (reasoning on stderr, the answer on stdout)
 *
 * Both build an engine from the shared options (cli.c), submit, and step it until it is idle;
 * generate decodes --n completions together, chat one reply a turn, its history re-encoded in
 * the model's chat format each time.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "app/cli.h"
#include "engine/engine.h"
#include "kernels/err.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

/* "1 2 3" -> ids (whitespace separated) */
static int parse_ids_text(const char *text, int32_t **out, int *n_out) {
    char err[256];
    FILE *fp = fmemopen((void *)text, strlen(text), "r");
    int rc = fp ? cli_scan_ids(fp, "--prompt-ids", out, n_out, err, sizeof err) : -1;
    if (fp) fclose(fp);
    if (rc) fprintf(stderr, "tandem: %s\n", fp ? err : "--prompt-ids: out of memory");
    return rc;
}

/* stream request id's new tokens as text */
static void stream_text(struct td_engine *e, int id, struct tok_stream *ts, int *shown) {
    const int32_t *toks;
    int nt;
    td_engine_output(e, id, &toks, &nt, NULL, NULL, NULL);
    for (; *shown < nt; (*shown)++) {
        const char *txt;
        size_t len;
        char err[256];
        if (tok_stream_push(ts, toks[*shown], &txt, &len, err, sizeof err) == 0 && len)
            fwrite(txt, 1, len, stdout);
    }
    fflush(stdout);
}

/* the rest of request id's text, then a newline; ends the stream */
static void stream_finish(struct td_engine *e, int id, struct tok_stream *ts, int *shown) {
    stream_text(e, id, ts, shown);
    const char *txt;
    size_t len;
    tok_stream_flush(ts, &txt, &len);
    if (len) fwrite(txt, 1, len, stdout);
    printf("\n");
    fflush(stdout); // before any stats line on stderr, when both go to one pipe
    tok_stream_free(ts);
}

/* -1 while a completion has no token yet; then the tokens out so far, with the time in *at */
static long all_started(struct td_engine *e, const int *ids, long n, struct timespec *at) {
    long out = 0;
    for (long i = 0; i < n; i++) {
        int nt;
        enum td_req_status st;
        td_engine_output(e, ids[i], NULL, &nt, &st, NULL, NULL);
        if (nt < 1 && st != TD_REQ_FINISHED && st != TD_REQ_FAILED) return -1;
        out += nt;
    }
    clock_gettime(CLOCK_MONOTONIC, at);
    return out;
}

/* seconds from a to b */
static double seconds_between(const struct timespec *a, const struct timespec *b) {
    return (b->tv_sec - a->tv_sec) + 1e-9 * (b->tv_nsec - a->tv_nsec);
}

/* --stats: what the engine counted over sec seconds of steps, of which the last dsec came after
 * every completion had its first token (first_out tokens out by then; -1: that never happened) */
static void print_stats(FILE *fp, struct td_engine *e, const struct td_engine_params *ep,
                        double sec, double dsec, long first_out) {
    const struct td_engine_stats *s = td_engine_stats(e);
    const char *tag = ep->n_synthetic ? "stats [synthetic acceptance, lossy]" : "stats";
    fprintf(fp, "%s: backend %s, draft %s (up to %d tokens a round)", tag, td_engine_backend(e),
            td_engine_draft(e), td_engine_draft_tokens(e));
    size_t wb = td_engine_weight_bytes(e);
    if (wb)
        fprintf(fp, ", weights %.2f %s placed (target and drafter)",
                wb >= 1000000000 ? wb / 1e9 : wb / 1e6, wb >= 1000000000 ? "GB" : "MB");
    fprintf(fp, ", %s key caches %.1f MiB (%.0f B a token of context)", td_engine_kv_dtype(e),
            td_engine_cache_bytes(e) / 1048576.0, td_engine_token_bytes(e));
    if (s->hist_blocks)
        fprintf(fp, ", history pool %d blocks of %d tokens", s->hist_blocks, s->hist_block);
    fprintf(fp, "\n");
    size_t rw, rc;
    for (int r = 0, W = td_engine_ranks(e, -1, &rw, &rc); W > 1 && r < W; r++) {
        td_engine_ranks(e, r, &rw, &rc);
        fprintf(fp, "%s: rank %d of %d: weights %.2f MB placed, key caches %.1f MiB\n", tag, r, W,
                rw / 1e6, rc / 1048576.0);
    }
    fprintf(fp, "%s: %ld tokens in %.3f s = %.1f tokens/s, %ld steps, %ld rows fed\n", tag,
            s->tokens_out, sec, s->tokens_out / (sec > 0 ? sec : 1e-9), s->steps, s->rows);
    // decode alone: the tokens after every completion's first, over the time after it
    if (first_out >= 0 && s->tokens_out > first_out && dsec > 0)
        fprintf(fp,
                "%s: decode %ld tokens in %.4f s = %.1f tokens/s (after the first token of "
                "every completion, %.3f s in)\n",
                tag, s->tokens_out - first_out, dsec, (s->tokens_out - first_out) / dsec,
                sec - dsec);
    if (s->rounds && td_engine_draft_tokens(e)) { // (speculation's numbers, with a drafter)
        fprintf(fp,
                "%s: mean accepted length %.3f (tokens per round incl. bonus), "
                "acceptance %.3f (%ld of %ld drafts)\n",
                tag, (double)(s->accepted + s->rounds) / s->rounds,
                s->drafted ? (double)s->accepted / s->drafted : 0.0, s->accepted, s->drafted);
        fprintf(fp, "%s: acceptance by draft position:", tag);
        for (int j = 0; j < TD_MAX_DRAFT && s->proposed_at[j]; j++)
            fprintf(fp, " %d:%.3f", j + 1, (double)s->accepted_at[j] / s->proposed_at[j]);
        fprintf(fp, "\n%s: conditional acceptance (drafts before all accepted):", tag);
        for (int j = 0; j < TD_MAX_DRAFT && s->reached_at[j]; j++)
            fprintf(fp, " %d:%.3f", j + 1, (double)s->accepted_at[j] / s->reached_at[j]);
        fprintf(fp, "\n");
    }
    if (s->steps)
        fprintf(fp,
                "%s: per step (host wall time; on a GPU the drafter's device work runs "
                "before the next step and counts in target): target %.3f ms, verify %.3f "
                "ms, drafter %.3f ms\n",
                tag, 1e3 * s->t_target / s->steps, 1e3 * s->t_verify / s->steps,
                1e3 * s->t_draft / s->steps);
    if (s->graphs)
        fprintf(fp, "%s: %d step graphs captured in %.1f ms, up to %d rows a step\n", tag,
                s->graphs, 1e3 * s->t_capture, td_engine_rows(e));
    if (s->rounds && td_engine_draft_tokens(e)) cli_print_policy(fp, tag, ep, s);
    if (s->nan_rows) fprintf(fp, "%s: %ld non-finite logits rows\n", tag, s->nan_rows);
    struct td_prefix_stats ps;
    if (!td_engine_prefix_stats(e, &ps))
        fprintf(fp,
                "%s: prefix cache: %ld lookups, %ld hits, %ld blocks found (%ld tokens), %ld "
                "evicted, %ld published twice; blocks held %d, cached %d, free %d\n",
                tag, ps.lookups, ps.hits, ps.hit_blocks, s->prefix_hit_tokens, ps.evictions,
                ps.dedups, ps.in_use, ps.cached, ps.free);
}

int cmd_generate(int argc, char **argv) {
    struct td_engine_params ep = td_engine_defaults();
    ep.draft = "auto";
    const char *prompt_text = NULL, *prompt_file = NULL, *text = NULL, *text_file = NULL;
    struct cli_req_opts ro = {64, 0, 0.0, 0, 1.0};
    long n = 1, draft_tokens = -1, ranks = 1, gpus = 0;
    int print_ids = 0, stats = 0, ignore_eos = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            cli_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--print-ids")) {
            print_ids = 1;
            continue;
        }
        if (!strcmp(a, "--stats")) {
            stats = 1;
            continue;
        }
        if (!strcmp(a, "--ignore-eos")) {
            ignore_eos = 1;
            continue;
        }
        if (cli_engine_flag(a, &ep)) continue;
        if (a[0] != '-' || !a[1]) { // the text prompt
            if (text) return die("generate: more than one text prompt ('%s')", a);
            text = a;
            continue;
        }
        int rc = cli_value_option("generate", a, v, &ep, &draft_tokens, &ro);
        if (rc < 0) return 2;
        i++;
        if (rc) continue;
        if (!strcmp(a, "--prompt") || !strcmp(a, "-p")) { // TEXT, which may begin with '-'
            if (text) return die("generate: more than one text prompt ('%s')", v);
            text = v;
        } else if (!strcmp(a, "--prompt-file"))
            text_file = v;
        else if (!strcmp(a, "--prompt-ids"))
            prompt_text = v;
        else if (!strcmp(a, "--prompt-ids-file"))
            prompt_file = v;
        else if (!strcmp(a, "--n"))
            rc = cli_parse_int(a, v, 1, 4096, &n);
        else if (!strcmp(a, "--ranks"))
            rc = cli_parse_int(a, v, 1, 64, &ranks);
        else if (!strcmp(a, "--gpus"))
            rc = cli_parse_int(a, v, 1, 64, &gpus);
        else
            return die("generate: unknown option '%s' (see tandem generate --help)", a);
        if (rc) return 2;
    }
    if (!ep.model_dir && !(ep.model_dir = cli_default_model(cli_argv0)))
        return die("generate: no model: give --model DIR (models/tandem-tiny was not found)");
    if ((text != NULL) + (text_file != NULL) + (prompt_text != NULL) + (prompt_file != NULL) != 1)
        return die("generate: give exactly one of a text prompt (TEXT or --prompt TEXT), "
                   "--prompt-file F, --prompt-ids and --prompt-ids-file");
    if (cli_draft_finish("generate", &ep, draft_tokens)) return 2;
    ep.max_seqs = (int)(n < 256 ? n : 256);

    char err[1024];
    int32_t *prompt = NULL;
    int n_prompt = 0;
    struct tok *tk = NULL;
    // text in (and out, unless --print-ids) needs the model's tokenizer
    size_t text_len = text ? strlen(text) : 0;
    char *owned = NULL; // --prompt-file's text
    if (text_file) {
        if (!(owned = cli_read_text(text_file, &text_len, err, sizeof err)))
            return die("generate: --prompt-file: %s", err);
        text = owned;
    }
    if ((text || !print_ids) && tok_load(&tk, ep.model_dir, err, sizeof err) != 0) {
        free(owned);
        if (text) return die("%s", err);
        tk = NULL; // ids in, ids out
    }
    if (text) {
        struct tok_ids ti = {0};
        int bad = tok_encode(tk, text, text_len, TOK_ENCODE_ADD_SPECIAL, &ti, err, sizeof err);
        free(owned);
        if (bad) {
            tok_free(tk);
            return die("%s%s%s", text_file ? text_file : "", text_file ? ": " : "", err);
        }
        prompt = ti.ids;
        n_prompt = (int)ti.n;
    } else if (prompt_file) {
        if (cli_read_ids(prompt_file, &prompt, &n_prompt, err, sizeof err)) {
            tok_free(tk);
            return die("%s", err);
        }
    } else if (parse_ids_text(prompt_text, &prompt, &n_prompt)) {
        tok_free(tk);
        return 2;
    }
    struct cli_ranks rk; // --ranks: the model split over processes, this one leading
    int follower;
    if (cli_ranks_start(&rk, "generate", ranks, gpus, ep.backend, &follower, err, sizeof err)) {
        free(prompt);
        tok_free(tk);
        return die("%s", err);
    }
    cli_ranks_params(&rk, &ep);
    if (follower) {
        free(prompt);
        tok_free(tk);
        return cli_ranks_follow(&ep);
    }
    struct td_engine *e;
    int bad = td_engine_init(&e, &ep, err, sizeof err) ? die("%s", err) : 0;
    if (!bad)
        bad = cli_draft_options_ok("generate", td_engine_draft(e), &ep, draft_tokens); // auto's
    if (!bad) cli_print_synthetic(stderr, "generate", &ep);
    if (bad) {
        td_engine_free(e);
        free(prompt);
        tok_free(tk);
        cli_ranks_finish(&rk);
        return bad;
    }
    int *ids = td_xmalloc((size_t)n * sizeof *ids), rc = 0;
    int stream = tk && !print_ids && n == 1, shown = 0;
    struct tok_stream ts;
    if (stream) tok_stream_init(&ts, tk, 0);
    for (long i = 0; i < n; i++) {
        struct td_request_params rp = {.prompt = prompt,
                                       .n_prompt = n_prompt,
                                       .max_tokens = (int)ro.max_tokens,
                                       .sampling = {.temperature = (float)ro.temperature,
                                                    .top_k = (int)ro.top_k,
                                                    .top_p = (float)ro.top_p,
                                                    .seed = (uint64_t)(ro.seed + i)},
                                       .ignore_eos = ignore_eos};
        if ((ids[i] = td_engine_submit(e, &rp, err, sizeof err)) < 0) {
            rc = die("%s", err);
            goto done;
        }
    }
    struct timespec t0, t1, tf = {.tv_sec = 0, .tv_nsec = 0};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int live;
    long first_out = -1; // tokens out when every completion had its first (the prefills' end)
    while ((live = td_engine_step(e, err, sizeof err)) > 0) {
        if (stream) stream_text(e, ids[0], &ts, &shown);
        if (first_out < 0) first_out = all_started(e, ids, n, &tf);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (stream) stream_finish(e, ids[0], &ts, &shown);
    if (live < 0) {
        rc = die("%s", err);
        goto done;
    }
    for (long i = 0; i < n; i++) {
        const int32_t *toks;
        int nt;
        enum td_req_status st;
        const char *msg;
        td_engine_output(e, ids[i], &toks, &nt, &st, NULL, &msg);
        if (tk && !print_ids && !stream) { // text, one completion after another
            char *out = NULL;
            size_t len = 0;
            if (!tok_decode(tk, toks, (size_t)nt, 0, &out, &len, err, sizeof err))
                printf("%s%.*s\n", i ? "\n" : "", (int)len, out);
            free(out);
        } else if (!stream) {
            for (int j = 0; j < nt; j++)
                printf(j ? " %d" : "%d", toks[j]);
            printf("\n");
        }
        if (st == TD_REQ_FAILED) {
            fprintf(stderr, "tandem: completion %ld failed: %s\n", i, msg);
            rc = 1;
        }
    }
    if (stats)
        print_stats(stderr, e, &ep, seconds_between(&t0, &t1), seconds_between(&tf, &t1),
                    first_out);
done:
    free(ids);
    free(prompt);
    tok_free(tk);
    td_engine_free(e); // (a leader's followers end their steps here)
    if (cli_ranks_finish(&rk) && !rc) rc = 1;
    return rc;
}

// ---------------------------------------------------------------------------------------------
// chat: an interactive session in the model's chat format

/* a chat reply as it streams: with thinking on, the text up to the </think> token is reasoning
 * and goes to stderr, the answer after it to stdout */
struct chat_view {
    struct tok_stream ts;
    int shown;     /* tokens of the reply written so far */
    int reasoning; /* still before </think> */
    int32_t close; /* </think>'s id */
};

static void chat_view_push(struct td_engine *e, int id, struct chat_view *v) {
    const int32_t *toks;
    int nt;
    td_engine_output(e, id, &toks, &nt, NULL, NULL, NULL);
    for (; v->shown < nt; v->shown++) {
        const char *txt;
        size_t len;
        char err[256];
        if (v->reasoning && toks[v->shown] == v->close) { // the answer starts
            tok_stream_flush(&v->ts, &txt, &len);
            fwrite(txt, 1, len, stderr);
            fputs("\n", stderr);
            v->reasoning = 0;
            continue;
        }
        if (tok_stream_push(&v->ts, toks[v->shown], &txt, &len, err, sizeof err) == 0 && len)
            fwrite(txt, 1, len, v->reasoning ? stderr : stdout);
    }
    fflush(stdout);
}

/* ids[0..n) as text without special tokens, malloc'd ("" when they do not decode) */
static char *chat_text(struct tok *tk, const int32_t *ids, int n) {
    char *s = NULL, err[256];
    size_t len = 0;
    if (n <= 0 ||
        tok_decode(tk, ids, (size_t)n, TOK_DECODE_SKIP_SPECIAL, &s, &len, err, sizeof err))
        return strdup("");
    return s;
}

int cmd_chat(int argc, char **argv) {
    struct td_engine_params ep = td_engine_defaults();
    ep.draft = "auto";
    const char *system = NULL, *effort = NULL;
    struct cli_req_opts ro = {256, 0, 0.0, 0, 1.0};
    long draft_tokens = -1;
    int think = 0, show_prompt = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: tandem chat [--model DIR] [--system TEXT] [--think] [--reasoning-effort "
                   "E] [--max-tokens N]\n"
                   "                   [--temperature T] [--seed S] [--backend B] [--show-prompt] "
                   "[drafter options]\n"
                   "  --think                thinking mode (a vocabulary with <think>): the "
                   "reasoning\n"
                   "                         streams to stderr, the answer to stdout; earlier "
                   "turns'\n"
                   "                         reasoning stays out of the prompt (DeepSeek V4's "
                   "rule)\n"
                   "  --reasoning-effort E   high (default) | max: DeepSeek V4's maximum-effort "
                   "prompt,\n"
                   "                         with --think\n"
                   "  --show-prompt          each turn's prompt text to stderr, as \"tandem: "
                   "prompt: ...\"\n" CLI_DRAFT_USAGE
                   "Type a message and Enter; an empty line or end of input ends the session.\n",
                   cli_draft_usage_names());
            return 0;
        }
        if (!strcmp(a, "--think")) {
            think = 1;
            continue;
        }
        if (!strcmp(a, "--show-prompt")) {
            show_prompt = 1;
            continue;
        }
        int rc = cli_value_option("chat", a, v, &ep, &draft_tokens, &ro);
        if (rc < 0) return 2;
        i++;
        if (rc) continue;
        if (!strcmp(a, "--system"))
            system = v;
        else if (!strcmp(a, "--reasoning-effort"))
            effort = v;
        else
            return die("chat: unknown option '%s' (see tandem chat --help)", a);
    }
    if (effort && strcmp(effort, "high") && strcmp(effort, "max"))
        return die("chat: --reasoning-effort '%s': expected high or max", effort);
    if (!ep.model_dir && !(ep.model_dir = cli_default_model(cli_argv0)))
        return die("chat: no model: give --model DIR (models/tandem-tiny was not found)");
    if (cli_draft_finish("chat", &ep, draft_tokens)) return 2;
    ep.max_seqs = 1;
    char err[1024];
    struct tok *tk;
    struct chat ch;
    struct td_engine *e;
    if (tok_load(&tk, ep.model_dir, err, sizeof err)) return die("%s", err);
    if (chat_init(&ch, tk, err, sizeof err)) {
        tok_free(tk);
        return die("%s", err);
    }
    if (think && (ch.format != CHAT_FORMAT_DEEPSEEK || ch.think_open < 0 || ch.think_close < 0)) {
        tok_free(tk);
        return die("chat: --think needs a DeepSeek vocabulary with <think> and </think> (%s has "
                   "none)",
                   ep.model_dir);
    }
    if (think) ch.think = CHAT_THINK_ON;
    if (effort && !strcmp(effort, "max")) ch.effort = CHAT_EFFORT_MAX;
    if (td_engine_init(&e, &ep, err, sizeof err)) {
        tok_free(tk);
        return die("%s", err);
    }
    if (cli_draft_options_ok("chat", td_engine_draft(e), &ep, draft_tokens)) { // auto's pick
        td_engine_free(e);
        tok_free(tk);
        return 2;
    }
    // the conversation; owned[i] holds message i's texts (user line, or reply and reasoning)
    struct chat_msg *msgs = NULL;
    char **owned = NULL;
    int n_msgs = 0, n_owned = 0, rc = 0, turn = 0;
    char line[8192];
    int interactive = isatty(0);
    if (system) {
        msgs = realloc(msgs, sizeof *msgs * (n_msgs + 1));
        msgs[n_msgs++] = (struct chat_msg){.role = CHAT_ROLE_SYSTEM, .content = system};
    }
    for (;;) {
        if (interactive) {
            printf("> ");
            fflush(stdout);
        }
        if (!fgets(line, sizeof line, stdin)) break;
        line[strcspn(line, "\r\n")] = 0;
        if (!line[0]) break;
        owned = realloc(owned, sizeof *owned * (n_owned + 3));
        msgs = realloc(msgs, sizeof *msgs * (n_msgs + 2));
        char *text = owned[n_owned++] = strdup(line);
        msgs[n_msgs] = (struct chat_msg){.role = CHAT_ROLE_USER, .content = text};
        n_msgs++;
        struct tok_ids ti = {0};
        if (chat_encode(&ch, msgs, (size_t)n_msgs, 1, &ti, err, sizeof err)) {
            fprintf(stderr, "tandem: %s\n", err);
            tok_ids_free(&ti);
            n_msgs--;
            continue;
        }
        if (show_prompt) {
            char *p = chat_render(&ch, msgs, (size_t)n_msgs, 1, NULL, err, sizeof err);
            fprintf(stderr, "tandem: prompt: %s\n", p ? p : err);
            free(p);
        }
        struct td_request_params rp = {.prompt = ti.ids,
                                       .n_prompt = (int)ti.n,
                                       .max_tokens = (int)ro.max_tokens,
                                       .sampling = {.temperature = (float)ro.temperature,
                                                    .top_k = (int)ro.top_k,
                                                    .top_p = (float)ro.top_p,
                                                    .seed = (uint64_t)(ro.seed + turn++)},
                                       .ignore_eos = 0};
        int id = td_engine_submit(e, &rp, err, sizeof err);
        tok_ids_free(&ti);
        if (id < 0) {
            fprintf(stderr, "tandem: %s\n", err);
            rc = 1;
            break;
        }
        struct chat_view v = {.reasoning = think, .close = ch.think_close};
        tok_stream_init(&v.ts, tk, TOK_DECODE_SKIP_SPECIAL);
        int live;
        while ((live = td_engine_step(e, err, sizeof err)) > 0)
            chat_view_push(e, id, &v);
        chat_view_push(e, id, &v);
        const char *txt;
        size_t len;
        tok_stream_flush(&v.ts, &txt, &len);
        fwrite(txt, 1, len, v.reasoning ? stderr : stdout);
        if (v.reasoning) fputs("\n", stderr);
        printf("\n");
        tok_stream_free(&v.ts);
        if (live < 0) {
            fprintf(stderr, "tandem: %s\n", err);
            rc = 1;
            break;
        }
        // the reply joins the conversation: its answer, and with thinking its reasoning, which
        // the chat format drops from later prompts (or keeps, where its rules say so)
        const int32_t *toks;
        int nt, k = 0;
        td_engine_output(e, id, &toks, &nt, NULL, NULL, NULL);
        while (think && k < nt && toks[k] != ch.think_close)
            k++;
        int answer = think ? (k < nt ? k + 1 : nt) : 0;
        char *reasoning = think ? owned[n_owned++] = chat_text(tk, toks, k) : NULL;
        char *reply = owned[n_owned++] = chat_text(tk, toks + answer, nt - answer);
        msgs[n_msgs++] = (struct chat_msg){
            .role = CHAT_ROLE_ASSISTANT, .content = reply, .reasoning = reasoning};
    }
    for (int i = 0; i < n_owned; i++)
        free(owned[i]);
    free(owned);
    free(msgs);
    td_engine_free(e);
    tok_free(tk);
    return rc;
}
