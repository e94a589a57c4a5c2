/* cli.h: the tandem subcommands that live in the library (app/main.c dispatches to them), and
 * what they share (cli.c).
 *
 * Each command takes the arguments after its name (argv[0] is the first option), writes its
 * result to stdout and returns the process exit status: 0 on success, 2 for bad arguments, 1
 * when the work itself fails (model files, input text). Errors are one line on stderr.
 */
#ifndef TD_CLI_H
#define TD_CLI_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

struct td_engine_params;
struct td_engine_stats;

/* tandem generate [--model DIR] ("TEXT" | --prompt-ids "1 2 3" | --prompt-ids-file F) [options]
 * (cli_generate.c): completions of one prompt, as text (streamed for one) or ids; --stats */
int cmd_generate(int argc, char **argv);

/* tandem chat [--model DIR] [--system TEXT] [--think] [options] (cli_generate.c): a session in
 * the model's chat format, one line of input a turn; --think: thinking mode, the reasoning
 * shown on stderr and kept out of later prompts */
int cmd_chat(int argc, char **argv);

/* tandem bench [--model DIR] --prompts FILE.jsonl [options] (cli_bench.c): batch throughput,
 * latency and acceptance over a prompt set */
int cmd_bench(int argc, char **argv);

/* tandem tokenize --model DIR (--text T | --file F) [--no-special]
 * prints the ids HF Tokenizer.encode(text).ids gives, space-separated, on one line */
int cmd_tokenize(int argc, char **argv);

/* tandem detokenize --model DIR --ids "1 2 3" [--skip-special]
 * writes the decoded text to stdout with nothing added */
int cmd_detokenize(int argc, char **argv);

// ---------------------------------------------------------------------------------------------
// shared by the commands (cli.c)

/* "tandem: <fmt ...>" and a newline on stderr; returns 2 (bad arguments): `return die(...)` */
__attribute__((format(printf, 1, 2))) static inline int die(const char *fmt, ...) {
    char line[4096]; // one write: a --ranks run's processes share the stream
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "tandem: %s\n", line);
    return 2;
}

/* tandem --help (and generate --help): the commands, then generate's and logits' options */
void cli_usage(FILE *fp);

/* the drafter options' help, for generate, chat and bench; its %s is cli_draft_usage_names() */
#define CLI_DRAFT_USAGE                                                                            \
    "  --draft NAME           %s (auto: dspark when\n"                                             \
    "                         the model ships DIR/dspark/ and the backend is the GPU, else\n"      \
    "                         none; mtp reads the checkpoint's mtp.0.* layer)\n"                   \
    "  --draft-tokens K       draft tokens per round, 1..16 (default 3; dspark: its block\n"       \
    "                         size, and at most that)\n"                                           \
    "  --dspark-dir DIR       the DSpark drafter (default: the model's dspark/)\n"                 \
    "  --dspark-threshold C   verify only the drafts before the first slot whose confidence is\n"  \
    "                         below C, in [0, 1) (default 0: all; lossless either way)\n"          \
    "  --draft-policy P       adaptive (default: each step verifies the drafts that pay, by\n"     \
    "                         measured acceptance and step times) | fixed (every draft)\n"

/* the drafter names as CLI_DRAFT_USAGE lists them: "auto | none | ngram | ..." (draft/drafter.c) */
const char *cli_draft_usage_names(void);

/* "PREFIX: draft policy P; drafts verified a step (offered), by decoding sequences: ..." */
void cli_print_policy(FILE *fp, const char *prefix, const struct td_engine_params *ep,
                      const struct td_engine_stats *s);
/* with --synthetic-acceptance, one line saying the output is lossy (nothing otherwise) */
void cli_print_synthetic(FILE *fp, const char *cmd, const struct td_engine_params *ep);

/* argv[0] of the process (main sets it), where cli_default_model looks beside the binary;
 * the whole command line too (a --ranks leader starts its followers with it) */
extern const char *cli_argv0;
extern int cli_argc;
extern char **cli_argv;

/* --ranks N: the model split over N ranks (model/split.h), processes of this host joined by
 * sockets. cli_ranks_start: when this process is a follower (TANDEM_RANK set by its leader), it
 * joins (*follower = 1); else with n > 1 it starts n - 1 followers, copies of this command line,
 * each joined to it by a socketpair (TANDEM_RANK, TANDEM_WORLD, TANDEM_COMM_FD), and leads.
 * rk->comm is then the engine's params.comm; with n = 1 and no TANDEM_RANK nothing happens
 * (rk->active 0). cli_ranks_finish closes the sockets (a follower still running ends) and waits
 * for every follower: 0, or 1 after printing which one failed. 0, or -1 with a message. */
struct cli_ranks {
    struct td_comm *comm;
    int active, world;
    int gpus;         /* 1: one GPU a rank, NCCL between them (--gpus N) */
    char backend[24]; /* with gpus: this rank's, "cuda:<rank>" */
    int pid[64];
};
/* ranks and gpus: --ranks N and --gpus N as given (1 and 0 when absent); with gpus, rank r runs
 * on GPU r and the followers learn it (TANDEM_GPUS), and --gpus 1 runs the split path over NCCL
 * at one rank. Refused, before any follower starts, with cmd's name: both given, --gpus in a
 * build without CUDA or NCCL, past the host's GPUs, or beside another backend than cuda */
int cli_ranks_start(struct cli_ranks *rk, const char *cmd, long ranks, long gpus,
                    const char *backend, int *follower, char *err, size_t errlen);
/* the engine's params of this rank: its communicator, and with --gpus its GPU and NCCL */
void cli_ranks_params(const struct cli_ranks *rk, struct td_engine_params *ep);
int cli_ranks_finish(struct cli_ranks *rk);
/* a follower's whole life: the engine of ep (its comm set) follows its leader; the exit code */
int cli_ranks_follow(struct td_engine_params *ep);

/* the default model: models/tandem-tiny under the working directory, else beside the binary
 * argv0; NULL when neither has one */
const char *cli_default_model(const char *argv0);

/* whitespace-separated token ids (non-negative integers, at most 1 << 24) from fp, or from the
 * file at path, named `what` (the path) in messages: 0 and *out (malloc'd, *n_out >= 1), or -1
 * with a message */
int cli_scan_ids(FILE *fp, const char *what, int32_t **out, int *n_out, char *err, size_t errlen);
int cli_read_ids(const char *path, int32_t **out, int *n_out, char *err, size_t errlen);

/* the bytes of the file at path ("-": standard input; a pipe is fine, more than 256 MiB is
 * refused), 0-terminated: malloc'd, their count in *n (the text may hold 0 bytes of its own), or
 * NULL with a message */
char *cli_read_text(const char *path, size_t *n, char *err, size_t errlen);

/* flag's value v as an integer in [lo, hi] / a number in [lo, hi]: 0, or -1 after printing
 * "tandem: FLAG 'V': expected ..." */
int cli_parse_int(const char *flag, const char *v, long lo, long hi, long *out);
int cli_parse_float(const char *flag, const char *v, double lo, double hi, double *out);

/* the options generate, chat and bench share (--model, --backend, --max-batch-tokens, --max-ctx
 * and the drafter's), flag a with value v: 1: taken; 0: not one; -1: a bad value (printed).
 * --draft-tokens goes to *draft_tokens (cli_draft_finish turns it into max_draft). */
int cli_engine_option(const char *a, const char *v, struct td_engine_params *ep,
                      long *draft_tokens);

/* the value-less engine flags generate and bench share (--deterministic, --no-graphs,
 * --dummy-weights): 1 when a was one */
int cli_engine_flag(const char *a, struct td_engine_params *ep);

/* the request options generate, chat and bench share */
struct cli_req_opts {
    long max_tokens, seed;
    double temperature;
    long top_k;
    double top_p;
};

/* 1 when a was a request option (its value v parsed into r), -1 after printing a bad value's
 * error, 0 when a is another option */
int cli_request_option(const char *a, const char *v, struct cli_req_opts *r);

/* an option of command cmd with a value, flag a with value v (NULL: a was the last argument):
 * 1: one of the shared engine or request options (ro NULL: engine options only), taken; 0:
 * another option, with a value; -1: no value, or a bad one (printed; exit 2). The caller skips
 * v unless -1. */
int cli_value_option(const char *cmd, const char *a, const char *v, struct td_engine_params *ep,
                     long *draft_tokens, struct cli_req_opts *ro);

/* the drafter options against drafter `name` (--draft-tokens, --dspark-threshold, --dspark-dir
 * need a drafter, or dspark): 0, or 2 after printing why not, as "tandem: CMD: ...". Before the
 * engine exists name is --draft as given (for auto the checks that need its pick wait); after,
 * the drafter the engine runs (td_engine_draft), auto's pick included */
int cli_draft_options_ok(const char *cmd, const char *name, const struct td_engine_params *ep,
                         long draft_tokens);

/* check the drafter options (cli_draft_options_ok on --draft as given) and set max_draft and at
 * least 1 + max_draft max_batch_tokens; auto goes to the engine as it is. 0, or 2 after an error */
int cli_draft_finish(const char *cmd, struct td_engine_params *ep, long draft_tokens);

#ifdef __cplusplus
}
#endif
#endif
