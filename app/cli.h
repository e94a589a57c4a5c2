/* cli.h: tandem subcommands that live in the library (app/main.c dispatches to them).
 *
 * Each takes the arguments after its name (argv[0] is the first option), writes its result to
 * stdout and returns the process exit status: 0 on success, 2 for bad arguments, 1 when the
 * work itself fails (model files, input text). Errors are one line on stderr.
 */
#ifndef TD_CLI_H
#define TD_CLI_H

#ifdef __cplusplus
extern "C" {
#endif

/* tandem tokenize --model DIR (--text T | --file F) [--no-special]
 * prints the ids HF Tokenizer.encode(text).ids gives, space-separated, on one line */
int cmd_tokenize(int argc, char **argv);

/* tandem detokenize --model DIR --ids "1 2 3" [--skip-special]
 * writes the decoded text to stdout with nothing added */
int cmd_detokenize(int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif
