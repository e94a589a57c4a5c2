/* cli_bench.c: `tandem bench`, batch throughput over a prompt set (see cli.h; tandem bench
 * --help lists the options).
 *
 *   tandem bench --prompts prompts.jsonl --n-prompts 64 --batch 16 --draft dspark [--csv]
 *
 * Every prompt is submitted at once (each generates exactly --max-tokens tokens), the engine
 * steps until idle, and one report (or CSV line) gives tokens/s, requests/s, time to the first
 * and the last token (p50, p90) and the drafter's acceptance.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "app/cli.h"
#include "engine/engine.h"
#include "kernels/err.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

// ---------------------------------------------------------------------------------------------
// bench: batch throughput over a prompt set

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* what one configuration measured (the sweep's cell) */
struct bench_cell {
    double tps, mal;
    double acc[TD_MAX_DRAFT]; /* acceptance by draft position */
    int n_acc;
    char draft[32], backend[16];
};

/* --turns 2: each prompt's second turn, asked once its first is answered, as a chat client asks
 * it: the first turn, the reply decoded to text, the second turn, in the chat format */
struct bench_turns {
    const struct tok *tk;
    const struct chat *ch;
    char **first, **second; /* [np] the turns' texts */
};

/* request i's second turn, submitted: the conversation so far (first turn, reply) and the second
 * turn, encoded; its id, or -1 with a message */
static int submit_second(struct td_engine *e, const struct bench_turns *tt, int i, int first_id,
                         const struct td_request_params *rp0, char *err, size_t errlen) {
    const int32_t *out;
    int n_out;
    td_engine_output(e, first_id, &out, &n_out, NULL, NULL, NULL);
    char *reply = NULL;
    size_t len;
    struct tok_ids ids = {0};
    int id = -1;
    if (!tok_decode(tt->tk, out, (size_t)n_out, TOK_DECODE_SKIP_SPECIAL, &reply, &len, err,
                    errlen)) {
        struct chat_msg m[3] = {{.role = CHAT_ROLE_USER, .content = tt->first[i]},
                                {.role = CHAT_ROLE_ASSISTANT, .content = reply},
                                {.role = CHAT_ROLE_USER, .content = tt->second[i]}};
        if (!chat_encode(tt->ch, m, 3, 1, &ids, err, errlen)) {
            struct td_request_params rp = *rp0;
            rp.prompt = ids.ids, rp.n_prompt = (int)ids.n;
            id = td_engine_submit(e, &rp, err, errlen);
        }
    }
    free(reply);
    tok_ids_free(&ids);
    return id;
}

/* one configuration: every prompt submitted at once, the engine stepped until idle; printed as
 * the report (or the CSV line) unless quiet; 0 or the exit status. late > 0 (--long-prompt): a
 * prompt of that many ids arrives once the first batch of requests decodes, and asks for one
 * token (its prefill beside their decoding shows in the gaps between their tokens) */
static int bench_run(struct td_engine_params ep, long draft_tokens, long batch,
                     const struct tok_ids *ids, int np, const struct cli_req_opts *ro, long late,
                     const struct bench_turns *tt, int csv, int quiet, struct bench_cell *cell) {
    char err[1024];
    ep.max_seqs = (int)batch + (late > 0); // (a slot for the late prompt)
    struct td_engine *e;
    int *rid = NULL, *rid2 = NULL,
        rc = td_engine_init(&e, &ep, err, sizeof err) ? die("%s", err) : 0;
    long *first_len = NULL; // --turns 2: each first turn's tokens, prompt and reply
    if (rc) return rc;
    double *ttft = NULL, *done_t = NULL, *last_t = NULL, *gap = NULL, *queue = NULL, *pre = NULL;
    int *last_n = NULL, n_gap = 0, late_id = -1, started = 0;
    int32_t *late_ids = NULL;
    double late_at = -1, late_first = -1;
    double all_at = -1; // when every request had its first token (all decoding together)
    long all_out = 0;   // their tokens out by then
    if (!rc) rc = cli_draft_options_ok("bench", td_engine_draft(e), &ep, draft_tokens); // auto's
    if (!rc) cli_print_synthetic(stderr, "bench", &ep);
    if (rc) goto out;
    rid = td_xmalloc((size_t)np * sizeof *rid);
    rid2 = td_xmalloc((size_t)np * sizeof *rid2);
    first_len = td_xcalloc((size_t)np, sizeof *first_len);
    ttft = td_xmalloc((size_t)np * sizeof *ttft);
    done_t = td_xmalloc((size_t)np * sizeof *done_t);
    // inter-token latency: a request's gaps between the steps that bring it tokens (one gap a
    // step, whatever it brings: a long prompt's prefill beside it shows as long gaps)
    last_t = td_xmalloc((size_t)np * sizeof *last_t);
    last_n = td_xcalloc((size_t)np, sizeof *last_n);
    gap = td_xmalloc(((size_t)np * (size_t)ro->max_tokens + 1) * sizeof *gap);
    long prompt_tokens = 0;
    double t0 = now_s();
    for (int i = 0; i < np; i++) {
        struct td_request_params rp = {.prompt = ids[i].ids,
                                       .n_prompt = (int)ids[i].n,
                                       .max_tokens = (int)ro->max_tokens,
                                       .sampling = {.temperature = (float)ro->temperature,
                                                    .top_k = (int)ro->top_k,
                                                    .top_p = (float)ro->top_p,
                                                    .seed = (uint64_t)(ro->seed + i)},
                                       .ignore_eos = 1};
        prompt_tokens += (long)ids[i].n;
        ttft[i] = done_t[i] = -1;
        rid2[i] = -1;
        if ((rid[i] = td_engine_submit(e, &rp, err, sizeof err)) < 0) {
            rc = die("%s", err);
            goto out;
        }
    }
    int live;
    do {
        live = td_engine_step(e, err, sizeof err);
        double t = now_s() - t0;
        for (int i = 0; i < np; i++) {
            int nt;
            enum td_req_status st;
            td_engine_output(e, rid[i], NULL, &nt, &st, NULL, NULL);
            if (nt > 0 && ttft[i] < 0) ttft[i] = t;
            if (nt > last_n[i]) {
                if (last_n[i] > 0 && n_gap < np * ro->max_tokens) gap[n_gap++] = t - last_t[i];
                if (!last_n[i]) started++;
                last_t[i] = t, last_n[i] = nt;
            }
            if ((st == TD_REQ_FINISHED || st == TD_REQ_FAILED) && done_t[i] < 0) {
                done_t[i] = t;
                if (tt && st == TD_REQ_FINISHED) { // its second turn, now
                    struct td_request_params rp = {
                        .max_tokens = (int)ro->max_tokens,
                        .sampling = {.temperature = (float)ro->temperature,
                                     .top_k = (int)ro->top_k,
                                     .top_p = (float)ro->top_p,
                                     .seed = (uint64_t)(ro->seed + np + i)},
                        .ignore_eos = 1};
                    first_len[i] = (long)ids[i].n + nt;
                    if ((rid2[i] = submit_second(e, tt, i, rid[i], &rp, err, sizeof err)) < 0) {
                        rc = die("bench: request %d's second turn: %s", i, err);
                        goto out;
                    }
                    if (!live) live = 1; // (the step before may have seen none)
                }
            }
        }
        if (all_at < 0 && started == np && batch >= np) {
            all_at = t;
            for (int i = 0; i < np; i++)
                all_out += last_n[i];
        }
        if (late > 0 && late_id < 0 && live > 0 && started >= (np < batch ? np : batch)) {
            int V = td_engine_vocab(e);
            late_ids = td_xmalloc((size_t)late * sizeof *late_ids);
            for (long j = 0; j < late; j++) // a fixed sequence over the vocabulary
                late_ids[j] = (int32_t)(2 + (j * 7919 + 13) % (V > 2 ? V - 2 : 1));
            struct td_request_params rp = {.prompt = late_ids,
                                           .n_prompt = (int)late,
                                           .max_tokens = 1,
                                           .sampling = {.temperature = 0.0f, .top_p = 1.0f},
                                           .ignore_eos = 1};
            if ((late_id = td_engine_submit(e, &rp, err, sizeof err)) < 0) {
                rc = die("bench: --long-prompt %ld: %s", late, err);
                goto out;
            }
            late_at = t;
        } else if (late_id >= 0 && late_first < 0) {
            int nt;
            td_engine_output(e, late_id, NULL, &nt, NULL, NULL, NULL);
            if (nt > 0) late_first = t;
        }
    } while (live > 0);
    if (live < 0) {
        rc = die("%s", err);
        goto out;
    }
    double wall = now_s() - t0;
    const struct td_engine_stats *s = td_engine_stats(e);
    // a request's time to its first token, split: waiting for a slot (submitted to admitted)
    // and its prefill (admitted to the first token); at a batch below the prompts the first is
    // most of it for the later ones
    queue = td_xmalloc((size_t)np * sizeof *queue);
    pre = td_xmalloc((size_t)np * sizeof *pre);
    for (int i = 0; i < np; i++) {
        struct td_request_stats rs;
        queue[i] = pre[i] = 0;
        if (!td_engine_request_stats(e, rid[i], &rs) && rs.t_admit >= 0 && rs.t_first >= 0)
            queue[i] = rs.t_admit - rs.t_submit, pre[i] = rs.t_first - rs.t_admit;
    }
    qsort(queue, (size_t)np, sizeof *queue, cmp_double);
    qsort(pre, (size_t)np, sizeof *pre, cmp_double);
    qsort(ttft, (size_t)np, sizeof *ttft, cmp_double);
    qsort(done_t, (size_t)np, sizeof *done_t, cmp_double);
    qsort(gap, (size_t)n_gap, sizeof *gap, cmp_double);
    double itl50 = n_gap ? gap[n_gap / 2] : 0, itl99 = n_gap ? gap[(size_t)n_gap * 99 / 100] : 0;
    double mal = s->rounds ? (double)(s->accepted + s->rounds) / s->rounds : 1.0;
    if (cell) {
        cell->tps = s->tokens_out / wall, cell->mal = mal, cell->n_acc = 0;
        snprintf(cell->draft, sizeof cell->draft, "%s", td_engine_draft(e));
        snprintf(cell->backend, sizeof cell->backend, "%s", td_engine_backend(e));
        for (int j = 0; j < TD_MAX_DRAFT && s->proposed_at[j] && td_engine_draft_tokens(e); j++)
            cell->acc[cell->n_acc++] = (double)s->accepted_at[j] / s->proposed_at[j];
    }
    if (quiet) {
    } else if (csv) {
        printf(
            "model,backend,draft,k,prompts,batch,prompt_tokens,output_tokens,seconds,tokens_per_s,"
            "requests_per_s,ttft_p50,ttft_p90,latency_p50,latency_p90,mean_accepted_length,"
            "draft_policy,synthetic_acceptance,itl_p50,itl_p99,queue_p50,queue_p90,prefill_p50,"
            "prefill_p90\n");
        char syn[16 * TD_MAX_DRAFT + 16] = "none";
        for (int j = 0, o = 0; j < ep.n_synthetic; j++)
            o += snprintf(syn + o, sizeof syn - (size_t)o, "%s%g%s", j ? ";" : "",
                          ep.synthetic_accept[j], j == ep.n_synthetic - 1 ? " (lossy)" : "");
        printf("%s,%s,%s,%d,%d,%ld,%ld,%ld,%.3f,%.1f,%.3f,%.4f,%.4f,%.4f,%.4f,%.3f,%s,%s,%.6f,"
               "%.6f,%.4f,%.4f,%.4f,%.4f\n",
               ep.model_dir, td_engine_backend(e), td_engine_draft(e), td_engine_draft_tokens(e),
               np, batch, prompt_tokens, s->tokens_out, wall, s->tokens_out / wall, np / wall,
               ttft[np / 2], ttft[np * 9 / 10], done_t[np / 2], done_t[np * 9 / 10], mal,
               ep.draft_policy == TD_POLICY_FIXED ? "fixed" : "adaptive", syn, itl50, itl99,
               queue[np / 2], queue[np * 9 / 10], pre[np / 2], pre[np * 9 / 10]);
    } else {
        const char *tag = ep.n_synthetic ? "bench [synthetic acceptance, lossy]" : "bench";
        printf("%s: %s on %s, draft %s k=%d, %d prompts (%ld tokens), batch %ld\n", tag,
               ep.model_dir, td_engine_backend(e), td_engine_draft(e), td_engine_draft_tokens(e),
               np, prompt_tokens, batch);
        printf("%s: %ld output tokens in %.3f s = %.1f tokens/s, %.2f requests/s, %ld steps\n", tag,
               s->tokens_out, wall, s->tokens_out / wall, np / wall, s->steps);
        printf("%s: time to first token p50 %.3f s p90 %.3f s; to the last p50 %.3f s p90 %.3f s\n",
               tag, ttft[np / 2], ttft[np * 9 / 10], done_t[np / 2], done_t[np * 9 / 10]);
        printf("%s: of the first token's time, waiting for a slot p50 %.3f s p90 %.3f s, prefill "
               "p50 %.3f s p90 %.3f s\n",
               tag, queue[np / 2], queue[np * 9 / 10], pre[np / 2], pre[np * 9 / 10]);
        printf("%s: between a request's tokens p50 %.2f ms p99 %.2f ms (%d gaps: the steps that "
               "brought it tokens)\n",
               tag, 1e3 * itl50, 1e3 * itl99, n_gap);
        long out_all = 0; // the prompts' tokens (a late prompt's one left out)
        for (int i = 0; i < np; i++)
            out_all += last_n[i];
        if (all_at >= 0 && out_all > all_out && wall > all_at)
            printf("%s: decode %ld tokens in %.3f s = %.1f tokens/s (after every request's first "
                   "token, %.3f s in)\n",
                   tag, out_all - all_out, wall - all_at, (out_all - all_out) / (wall - all_at),
                   all_at);
        if (late_id >= 0)
            printf("%s: a prompt of %ld tokens arrived at %.3f s, its first token %.1f ms later\n",
                   tag, late, late_at, 1e3 * (late_first - late_at));
        struct td_prefix_stats ps;
        if (!td_engine_prefix_stats(e, &ps)) {
            long cached = 0;
            for (int i = 0; i < np; i++) {
                struct td_request_stats rs;
                if (!td_engine_request_stats(e, rid[i], &rs)) cached += rs.cached_tokens;
            }
            printf("%s: prefix cache: %ld of %ld prompt tokens from the cache (%.1f%%), %ld of %ld "
                   "lookups hit, %ld blocks evicted; blocks held %d, cached %d, free %d\n",
                   tag, cached, prompt_tokens, prompt_tokens ? 100.0 * cached / prompt_tokens : 0.0,
                   ps.hits, ps.lookups, ps.evictions, ps.in_use, ps.cached, ps.free);
        }
        if (tt) { // the second turns: what the cache gave of each first turn, and their TTFT
            long cached = 0, firsts = 0;
            int n2 = 0;
            double *t2 = td_xmalloc((size_t)np * sizeof *t2);
            for (int i = 0; i < np; i++) {
                struct td_request_stats rs;
                if (rid2[i] < 0 || td_engine_request_stats(e, rid2[i], &rs) || rs.t_first < 0)
                    continue;
                cached += rs.cached_tokens, firsts += first_len[i];
                t2[n2++] = rs.t_first - rs.t_submit;
            }
            qsort(t2, (size_t)n2, sizeof *t2, cmp_double);
            printf("%s: second turns: %d; %ld of their first turns' %ld tokens (prompt and reply) "
                   "from the cache (%.1f%%); time to first token p50 %.3f s p90 %.3f s\n",
                   tag, n2, cached, firsts, firsts ? 100.0 * cached / firsts : 0.0,
                   n2 ? t2[n2 / 2] : 0.0, n2 ? t2[n2 * 9 / 10] : 0.0);
            free(t2);
        }
        if (s->rounds && td_engine_draft_tokens(e)) {
            printf("%s: mean accepted length %.3f, acceptance by draft position:", tag, mal);
            for (int j = 0; j < TD_MAX_DRAFT && s->proposed_at[j]; j++)
                printf(" %d:%.3f", j + 1, (double)s->accepted_at[j] / s->proposed_at[j]);
            printf("\n");
            cli_print_policy(stdout, tag, &ep, s);
        }
    }
out:
    free(rid);
    free(rid2);
    free(first_len);
    free(ttft);
    free(done_t);
    free(last_t);
    free(last_n);
    free(gap);
    free(queue);
    free(pre);
    free(late_ids);
    td_engine_free(e);
    return rc;
}

#define SWEEP_MAX 16 /* batches, and drafters, in a sweep */

static const char *const COLOUR[8] = {"#444444", "#2f6fde", "#23a55a", "#d9822b",
                                      "#9b4dca", "#c4361f", "#1a9aa8", "#8c6d1f"};

/* the sweep's plot: tokens/s against batch (log scale) per drafter, and each drafter's
 * acceptance by draft position at the first batch; 0 or -1 (errno) */
static int sweep_svg(const char *path, const char *title, struct bench_cell (*c)[SWEEP_MAX], int nd,
                     const long *bs, int nb) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    const int W = 960, H = 450, x0 = 70, y0 = 60, pw = 480, ph = 300;
    double ymax = 1;
    for (int d = 0; d < nd; d++)
        for (int b = 0; b < nb; b++)
            if (c[d][b].tps > ymax) ymax = c[d][b].tps;
    double step = 1;
    while (ymax / step > 8)
        step *= ymax / step > 40 ? 10 : 2;
    ymax = step * (double)(long)(ymax / step + 1);
    double lx0 = 0, lx1 = 0;
    for (int b = 0; b < nb; b++) {
        double l = log2((double)bs[b]);
        if (!b || l < lx0) lx0 = l;
        if (!b || l > lx1) lx1 = l;
    }
    if (lx1 == lx0) lx1 = lx0 + 1;
#define PX(bb) (x0 + (log2((double)(bb)) - lx0) / (lx1 - lx0) * pw)
#define PY(v)  (y0 + ph - (v) / ymax * ph)
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%%\" "
            "height=\"100%%\" fill=\"white\"/>\n<text x=\"%d\" y=\"22\" font-size=\"14\">",
            W, H, x0);
    for (const char *p = title; *p; p++) // the title, escaped
        fputs(*p == '<' ? "&lt;" : *p == '&' ? "&amp;" : (char[2]){*p, 0}, f);
    fprintf(f, "</text>\n");
    for (double v = 0; v <= ymax + 1e-9; v += step) {
        fprintf(f,
                "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>"
                "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.0f</text>\n",
                x0, x0 + pw, PY(v), PY(v), x0 - 6, PY(v) + 4, v);
    }
    for (int b = 0; b < nb; b++)
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%ld</text>\n", PX(bs[b]),
                y0 + ph + 16, bs[b]);
    fprintf(f,
            "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">batch (sequences decoding at "
            "once)</text>\n<text x=\"16\" y=\"%d\" transform=\"rotate(-90 16 %d)\" "
            "text-anchor=\"middle\">tokens/s</text>\n",
            x0 + pw / 2, y0 + ph + 34, y0 + ph / 2, y0 + ph / 2);
    for (int d = 0; d < nd; d++) {
        fprintf(f, "<polyline fill=\"none\" stroke-width=\"2\" stroke=\"%s\" points=\"",
                COLOUR[d % 8]);
        for (int b = 0; b < nb; b++)
            fprintf(f, "%.1f,%.1f ", PX(bs[b]), PY(c[d][b].tps));
        fprintf(f, "\"/>\n");
        for (int b = 0; b < nb; b++)
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", PX(bs[b]),
                    PY(c[d][b].tps), COLOUR[d % 8]);
        fprintf(f, // the legend, in a row below the axis
                "<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"4\" fill=\"%s\"/>"
                "<text x=\"%d\" y=\"%d\" fill=\"%s\">%s</text>\n",
                x0 + 110 * d, y0 + ph + 50, COLOUR[d % 8], x0 + 110 * d + 18, y0 + ph + 56,
                COLOUR[d % 8], c[d][0].draft);
    }
    // acceptance by draft position at the first batch
    int ax = x0 + pw + 80, aw = W - ax - 20, npos = 0;
    for (int d = 0; d < nd; d++)
        if (c[d][0].n_acc > npos) npos = c[d][0].n_acc;
    fprintf(f, "<text x=\"%d\" y=\"%d\">acceptance by draft position (batch %ld)</text>\n", ax,
            y0 - 16, bs[0]);
    for (int q = 0; q <= 4; q++)
        fprintf(f,
                "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>"
                "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.2f</text>\n",
                ax, ax + aw, y0 + ph - q * ph / 4.0, y0 + ph - q * ph / 4.0, ax - 6,
                y0 + ph - q * ph / 4.0 + 4, q / 4.0);
    int groups = 0;
    for (int d = 0; d < nd; d++)
        groups += c[d][0].n_acc > 0;
    double gw = npos ? (double)aw / npos : aw, bw = groups ? gw * 0.8 / groups : 0;
    for (int j = 0; j < npos; j++) {
        for (int d = 0, g = 0; d < nd; d++) {
            if (!c[d][0].n_acc) continue;
            if (j < c[d][0].n_acc)
                fprintf(f,
                        "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                        "fill=\"%s\"/>\n",
                        ax + j * gw + gw * 0.1 + g * bw, y0 + ph - c[d][0].acc[j] * ph, bw,
                        c[d][0].acc[j] * ph, COLOUR[d % 8]);
            g++;
        }
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%d</text>\n",
                ax + j * gw + gw / 2, y0 + ph + 16, j + 1);
    }
    if (!npos) fprintf(f, "<text x=\"%d\" y=\"%d\">(no drafter)</text>\n", ax + 10, y0 + ph / 2);
    fprintf(f, "</svg>\n");
#undef PX
#undef PY
    return fclose(f);
}

#define REPEAT_MAX 16 /* --repeat */

static double median(const double *v, int n) {
    double s[REPEAT_MAX];
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

/* --sweep B1,B2,...: every drafter of --draft D1,D2,... at every batch, one table and a plot.
 * The runs go batch by batch, every drafter's beside the others' (a ratio's baseline is
 * measured next to it in time), `repeat` rounds of that: each cell's tokens/s is the median of
 * its rounds, each ratio the median of the rounds' own ratios, with their range. */
static int bench_sweep(const struct td_engine_params *ep0, long draft_tokens, const char *sweep,
                       const struct tok_ids *ids, int np, const struct cli_req_opts *ro,
                       const char *plot, int repeat) {
    long bs[SWEEP_MAX];
    int nb = 0, nd = 0;
    for (const char *q = sweep; *q;) {
        char *end;
        long b = strtol(q, &end, 10);
        if (end == q || b < 1 || b > 4096 || (*end && *end != ',') || nb == SWEEP_MAX)
            return die("bench: --sweep '%s': expected up to %d batches in [1, 4096], "
                       "comma-separated",
                       sweep, SWEEP_MAX);
        bs[nb++] = b;
        q = *end ? end + 1 : end;
    }
    if (!nb) return die("bench: --sweep needs at least one batch");
    char names[SWEEP_MAX][32];
    struct td_engine_params eps[SWEEP_MAX];
    for (const char *q = ep0->draft; *q;) {
        size_t k = strcspn(q, ",");
        if (nd == SWEEP_MAX || k == 0 || k >= sizeof names[0])
            return die("bench: --draft '%s': up to %d drafter names, comma-separated", ep0->draft,
                       SWEEP_MAX);
        memcpy(names[nd], q, k);
        names[nd][k] = 0;
        eps[nd] = *ep0;
        eps[nd].draft = names[nd];
        if (cli_draft_finish("bench", &eps[nd], draft_tokens)) return 2;
        nd++;
        q += k + (q[k] == ',');
    }
    static struct bench_cell cells[SWEEP_MAX][SWEEP_MAX]; // the first round's, then medians
    static double tps[SWEEP_MAX][SWEEP_MAX][REPEAT_MAX], ratio[REPEAT_MAX];
    for (int r = 0; r < repeat; r++)
        for (int b = 0; b < nb; b++)
            for (int d = 0; d < nd; d++) {
                struct bench_cell c;
                if (repeat > 1)
                    fprintf(stderr, "bench: sweep: %s at batch %ld (round %d of %d) ...\n",
                            names[d], bs[b], r + 1, repeat);
                else
                    fprintf(stderr, "bench: sweep: %s at batch %ld ...\n", names[d], bs[b]);
                int rc = bench_run(eps[d], draft_tokens, bs[b], ids, np, ro, 0, NULL, 0, 1, &c);
                if (rc) return rc;
                if (!r) cells[d][b] = c;
                tps[d][b][r] = c.tps;
            }
    for (int d = 0; d < nd; d++)
        for (int b = 0; b < nb; b++)
            cells[d][b].tps = median(tps[d][b], repeat);
    int ref = 0; // ratios against none when it is swept, else the first drafter
    for (int d = 0; d < nd; d++)
        if (!strcmp(cells[d][0].draft, "none")) ref = d;
    const char *tag =
        ep0->n_synthetic ? "bench sweep [synthetic acceptance, lossy]" : "bench sweep";
    char title[512];
    char rounds[64] = "";
    if (repeat > 1)
        snprintf(rounds, sizeof rounds, ", medians of %d rounds (ratio: median, range)", repeat);
    snprintf(title, sizeof title, "%s: %s on %s, %d prompts x %ld tokens, draft policy %s%s", tag,
             ep0->model_dir, cells[0][0].backend, np, ro->max_tokens,
             ep0->draft_policy == TD_POLICY_FIXED ? "fixed" : "adaptive", rounds);
    printf("%s\n| batch |", title);
    for (int d = 0; d < nd; d++)
        printf(" %s tok/s |", cells[d][0].draft);
    printf("\n|---|");
    for (int d = 0; d < nd; d++)
        printf("---|");
    printf("\n");
    for (int b = 0; b < nb; b++) {
        printf("| %ld |", bs[b]);
        for (int d = 0; d < nd; d++) {
            if (d == ref) {
                printf(" %.1f |", cells[d][b].tps);
                continue;
            }
            double lo = 0, hi = 0;
            for (int r = 0; r < repeat; r++) {
                ratio[r] = tps[d][b][r] / tps[ref][b][r];
                lo = !r || ratio[r] < lo ? ratio[r] : lo;
                hi = !r || ratio[r] > hi ? ratio[r] : hi;
            }
            if (repeat > 1)
                printf(" %.1f (%.2fx, %.2f-%.2f) |", cells[d][b].tps, median(ratio, repeat), lo,
                       hi);
            else
                printf(" %.1f (%.2fx) |", cells[d][b].tps, ratio[0]);
        }
        printf("\n");
    }
    for (int d = 0; d < nd; d++) {
        if (!cells[d][0].n_acc) continue;
        printf("%s: %s at batch %ld: mean accepted length %.3f, acceptance by draft position:", tag,
               cells[d][0].draft, bs[0], cells[d][0].mal);
        for (int j = 0; j < cells[d][0].n_acc; j++)
            printf(" %d:%.3f", j + 1, cells[d][0].acc[j]);
        printf("\n");
    }
    if (sweep_svg(plot, title, cells, nd, bs, nb))
        return die("bench: cannot write the plot %s: %s", plot, strerror(errno));
    printf("%s: plot in %s\n", tag, plot);
    return 0;
}

int cmd_bench(int argc, char **argv) {
    struct td_engine_params ep = td_engine_defaults();
    const char *prompts_path = NULL;
    struct cli_req_opts ro = {128, 0, 0.0, 0, 1.0};
    long n_prompts = 64, batch = 16, draft_tokens = -1, repeat = 0, long_prompt = 0, n_turns = 1,
         ranks = 1, gpus = 0;
    int raw = 0, csv = 0;
    const char *sweep = NULL, *plot = "bench-sweep.svg";
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf(
                "usage: tandem bench [--model DIR] --prompts FILE.jsonl [options]\n"
                "  --prompts FILE       JSON lines with \"turns\": [text, ...] (the first turn is\n"
                "                       the prompt), \"text\": text, or \"ids\": [token ids]\n"
                "                       (no tokenizer needed)\n"
                "  --n-prompts N        prompts to run (default 64; fewer if the file has fewer)\n"
                "  --max-tokens N       tokens per request (default 128)\n"
                "  --batch B            requests decoding at once (default 16)\n"
                "  drafter options (default --draft none):\n" CLI_DRAFT_USAGE
                "  --synthetic-acceptance P1,P2,...  LOSSY: draft j is accepted with\n"
                "                       probability Pj whatever the target says (speculation's\n"
                "                       cost on shapes no drafter is trained for; every line\n"
                "                       says so)\n"
                "  --temperature T      default 0 (greedy);  --top-k K;  --top-p P\n"
                "  --seed S             request i uses S + i\n"
                "  --raw                prompts as plain text (default: the chat format)\n"
                "  --backend B          auto | cpu | cuda | cuda:N;  --deterministic;  "
                "--no-graphs\n"
                "  --max-batch-tokens N rows per step (default: 256, or with MTP or DSpark a\n"
                "                       full round of every sequence, batch x (1 + drafts), if\n"
                "                       more);  --max-ctx N\n"
                "  --prefill-chunk N    prompt rows a step at most (default 0: no cap)\n"
                "  --dummy-weights      generated weights of DIR/config.json's shapes\n"
                "  --csv                one CSV header line and one result line\n"
                "  --turns 2            each prompt's second turn (\"turns\" lines) is asked once\n"
                "                       its first is answered: the first turn, the reply as text\n"
                "                       and the second turn in the chat format (a conversation;\n"
                "                       with --prefix-blocks, how much of the first turn the\n"
                "                       cache gives it)\n"
                "  --ranks N            split the model's experts over N processes (as generate)\n"
                "  --gpus N             split them over N GPUs, NCCL between (as generate)\n"
                "  --long-prompt N      a prompt of N ids arrives once the first batch decodes,\n"
                "                       in a slot of its own (one token asked): its prefill's\n"
                "                       effect on their gaps (with --n-prompts = --batch)\n"
                "  --sweep B1,B2,...    every drafter of --draft D1,D2,... (e.g. none,dspark,mtp)\n"
                "                       at every batch: one table (tokens/s, speedup over none)\n"
                "                       and a plot, --plot FILE.svg (default bench-sweep.svg);\n"
                "                       the runs go batch by batch, the drafters side by side\n"
                "  --repeat R           with --sweep: R rounds of it (up to 16); each cell the\n"
                "                       median of its rounds, each ratio the median of the\n"
                "                       rounds' ratios with their range\n"
                "Every request generates exactly --max-tokens tokens (EOS does not stop it).\n"
                "Prints tokens/s, requests/s, time to first token and to the last (median, p90),\n"
                "the first token's time split into waiting for a slot and prefill (median, p90),\n"
                "the time between a request's tokens (median, p99: its gaps between the steps\n"
                "that bring it tokens), the decode rate once every request has its first token\n"
                "(when --batch holds them all), the mean accepted length and acceptance by\n"
                "draft position.\n",
                cli_draft_usage_names());
            return 0;
        }
        if (!strcmp(a, "--raw")) {
            raw = 1;
            continue;
        }
        if (!strcmp(a, "--csv")) {
            csv = 1;
            continue;
        }
        if (cli_engine_flag(a, &ep)) continue;
        int rc = cli_value_option("bench", a, v, &ep, &draft_tokens, &ro);
        if (rc < 0) return 2;
        i++;
        if (rc) continue;
        if (!strcmp(a, "--prompts"))
            prompts_path = v;
        else if (!strcmp(a, "--n-prompts"))
            rc = cli_parse_int(a, v, 1, 1 << 20, &n_prompts);
        else if (!strcmp(a, "--batch"))
            rc = cli_parse_int(a, v, 1, 4096, &batch);
        else if (!strcmp(a, "--ranks"))
            rc = cli_parse_int(a, v, 1, 64, &ranks);
        else if (!strcmp(a, "--gpus"))
            rc = cli_parse_int(a, v, 1, 64, &gpus);
        else if (!strcmp(a, "--sweep"))
            sweep = v;
        else if (!strcmp(a, "--plot"))
            plot = v;
        else if (!strcmp(a, "--repeat"))
            rc = cli_parse_int(a, v, 1, REPEAT_MAX, &repeat);
        else if (!strcmp(a, "--long-prompt"))
            rc = cli_parse_int(a, v, 1, 1 << 24, &long_prompt);
        else if (!strcmp(a, "--turns"))
            rc = cli_parse_int(a, v, 1, 2, &n_turns);
        else
            return die("bench: unknown option '%s' (see tandem bench --help)", a);
        if (rc) return 2;
    }
    if (!prompts_path) return die("bench: --prompts FILE.jsonl is required");
    if (!ep.model_dir && !(ep.model_dir = cli_default_model(cli_argv0)))
        return die("bench: no model: give --model DIR (models/tandem-tiny was not found)");
    if (sweep && csv) return die("bench: --sweep prints a table; it takes no --csv");
    if (repeat && !sweep) return die("bench: --repeat R repeats a --sweep; give --sweep B1,B2,...");
    if (long_prompt && sweep)
        return die("bench: --long-prompt N is for one run; it takes no --sweep");
    if (n_turns > 1 && (sweep || raw || long_prompt))
        return die("bench: --turns 2 is for one run in the chat format (no --sweep, --raw or "
                   "--long-prompt)");
    if (!sweep && cli_draft_finish("bench", &ep, draft_tokens)) return 2;

    char err[1024];
    struct tok *tk = NULL; // loaded at the first line with text (lines of ids need none)
    struct chat ch;
    FILE *fp = fopen(prompts_path, "r");
    if (!fp) return die("bench: cannot open %s", prompts_path);
    struct tok_ids *ids = td_xcalloc((size_t)n_prompts, sizeof *ids);
    char **first = td_xcalloc((size_t)n_prompts, sizeof *first),
         **second = td_xcalloc((size_t)n_prompts, sizeof *second);
    int np = 0, lineno = 0, bad = 0;
    char *line = NULL;
    size_t cap = 0;
    while (np < n_prompts && getline(&line, &cap, fp) > 0) {
        lineno++;
        json_error_t je;
        json_t *doc = json_loads(line, 0, &je);
        json_t *turns = doc ? json_object_get(doc, "turns") : NULL;
        const char *text = json_is_array(turns) ? json_string_value(json_array_get(turns, 0))
                           : doc                ? json_string_value(json_object_get(doc, "text"))
                                                : NULL;
        json_t *jids = doc ? json_object_get(doc, "ids") : NULL;
        const char *text2 =
            json_is_array(turns) ? json_string_value(json_array_get(turns, 1)) : NULL;
        int rc = -1;
        if (n_turns > 1 && (!text || !text2)) {
            snprintf(err, sizeof err, "%s:%d: --turns 2 needs \"turns\" of two texts at least",
                     prompts_path, lineno);
        } else if (json_is_array(jids) && !text) { // token ids as they are
            size_t j, n = json_array_size(jids);
            json_t *v;
            rc = n ? 0 : -1;
            json_array_foreach(jids, j, v) {
                if (rc || !json_is_integer(v) || json_integer_value(v) < 0 ||
                    json_integer_value(v) > INT32_MAX) {
                    rc = -1;
                    break;
                }
                rc = tok_ids_push(&ids[np], (int32_t)json_integer_value(v));
            }
            if (rc)
                snprintf(err, sizeof err,
                         "%s:%d: \"ids\" must be a non-empty array of token ids (integers >= 0)",
                         prompts_path, lineno);
        } else if (!text) {
            snprintf(err, sizeof err,
                     "%s:%d: not a JSON object with \"turns\", \"text\" or \"ids\"", prompts_path,
                     lineno);
        } else if (!tk && (tok_load(&tk, ep.model_dir, err, sizeof err) ||
                           (!raw && chat_init(&ch, tk, err, sizeof err)))) {
            // the first line with text needed the tokenizer (and the chat format): neither loads
        } else if (raw) {
            rc = tok_encode(tk, text, strlen(text), TOK_ENCODE_ADD_SPECIAL, &ids[np], err,
                            sizeof err);
        } else {
            struct chat_msg msg = {.role = CHAT_ROLE_USER, .content = text};
            rc = chat_encode(&ch, &msg, 1, 1, &ids[np], err, sizeof err);
            if (!rc && n_turns > 1 &&
                (!(first[np] = strdup(text)) || !(second[np] = strdup(text2)))) {
                snprintf(err, sizeof err, "bench: out of memory");
                rc = -1;
            }
        }
        json_decref(doc);
        np++; // (a bad line's partial ids and texts are freed below too)
        if (rc) {
            bad = 1;
            break;
        }
    }
    free(line);
    fclose(fp);
    int rc = 0, follower = 0;
    struct cli_ranks rk = {0}; // --ranks: the model split over processes, this one leading
    if (bad)
        rc = die("%s", err);
    else if (!np)
        rc = die("bench: %s holds no prompts", prompts_path);
    else if ((ranks > 1 || gpus) && sweep)
        rc = die("bench: --ranks and --gpus run one bench; they take no --sweep");
    else if (cli_ranks_start(&rk, "bench", ranks, gpus, ep.backend, &follower, err, sizeof err))
        rc = die("%s", err);
    cli_ranks_params(&rk, &ep);
    if (rc) {
    } else if (follower) { // the leader's engine's steps (bench_run's params)
        ep.max_seqs = (int)batch + (long_prompt > 0);
        rc = cli_ranks_follow(&ep);
    } else if (!sweep) {
        struct bench_turns tt = {.tk = tk, .ch = &ch, .first = first, .second = second};
        rc = bench_run(ep, draft_tokens, batch, ids, np, &ro, long_prompt, n_turns > 1 ? &tt : NULL,
                       csv, 0, NULL);
    } else {
        rc = bench_sweep(&ep, draft_tokens, sweep, ids, np, &ro, plot, repeat ? (int)repeat : 1);
    }
    if (!follower && cli_ranks_finish(&rk) && !rc) rc = 1;
    for (int i = 0; i < np; i++)
        tok_ids_free(&ids[i]), free(first[i]), free(second[i]);
    free(ids), free(first), free(second);
    tok_free(tk);
    return rc;
}
