/* test_cli.c: `tandem logits` end to end, and its refusals of bad arguments.
 *
 *   make bin/tandem build/tests/test_cli && build/tests/test_cli     (from the repo root)
 *
 * TD_TANDEM names the binary (default ./bin/tandem; the sanitizer run uses its own build).
 * Bad arguments must exit non-zero with one line on stderr, never crash; a good run with
 * --chunks must write the same bits as the one-call run, and both must match HF. generate with
 * --draft dspark on the default model with its head moved into its own files prints what it
 * prints with the head in dspark/ (ids and acceptance). cli/generate_ranks: --ranks N (the
 * model split over N processes) prints one rank's tokens, and fails closed.
 */
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "v4_vocab.h"
#include "app/npy.h"
#include "embed_dspark.h"

static char root[64];

/* run `args` through bin/tandem; returns the exit status, stderr's text in msg */
static int tandem(const char *args, char *msg, size_t n) {
    char cmd[2048], errf[128];
    snprintf(errf, sizeof errf, "%s/stderr", root);
    const char *bin = getenv("TD_TANDEM") ? getenv("TD_TANDEM") : "./bin/tandem";
    snprintf(cmd, sizeof cmd, "%s %s 2>%s >/dev/null", bin, args, errf);
    int st = system(cmd);
    FILE *fp = fopen(errf, "r");
    size_t k = fp ? fread(msg, 1, n - 1, fp) : 0;
    msg[k] = 0;
    if (fp) fclose(fp);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void slurp(const char *path, char *buf, size_t n) {
    FILE *fp = fopen(path, "r");
    size_t k = fp ? fread(buf, 1, n - 1, fp) : 0;
    buf[k] = 0;
    if (fp) fclose(fp);
}

/* ./bin/tandem (or TD_TANDEM) with args, its stdout into root/name and then out[n], its
 * stderr dropped; its exit status */
static int tandem_stdout(const char *args, const char *name, char *out, size_t n) {
    char cmd[2048], path[160];
    const char *bin = getenv("TD_TANDEM") ? getenv("TD_TANDEM") : "./bin/tandem";
    snprintf(path, sizeof path, "%s/%s", root, name);
    snprintf(cmd, sizeof cmd, "%s %s > %s 2>/dev/null", bin, args, path);
    int st = system(cmd);
    slurp(path, out, n);
    return st;
}

static void write_text(const char *name, const char *text) {
    char path[160];
    snprintf(path, sizeof path, "%s/%s", root, name);
    FILE *fp = fopen(path, "w");
    fputs(text, fp);
    fclose(fp);
}

/* models/tandem-tiny with a DeepSeek V4 vocabulary: its three unused placeholder tokens renamed
 * <think>, </think> and <｜latest_reminder｜> in dir's tokenizer files, the rest linked;
 * comma_closes: </think> is instead a special token of ","'s id (19), which the model writes */
static int v4_model(const char *dir, int comma_closes) {
    static const char *names[] = {"README.md",
                                  "config.json",
                                  "dspark",
                                  "generation_config.json",
                                  "model-00001-of-00002.safetensors",
                                  "model-00002-of-00002.safetensors",
                                  "model.safetensors.index.json"};
    char cwd[512], from[1024], to[1024];
    if (!getcwd(cwd, sizeof cwd) || mkdir(dir, 0755)) return -1;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        snprintf(from, sizeof from, "%s/models/tandem-tiny/%s", cwd, names[i]);
        snprintf(to, sizeof to, "%s/%s", dir, names[i]);
        if (symlink(from, to)) return -1;
    }
    const char *files[] = {"tokenizer.json", "tokenizer_config.json"};
    for (int f = 0; f < 2; f++) {
        static char buf[1 << 20];
        snprintf(from, sizeof from, "models/tandem-tiny/%s", files[f]);
        slurp(from, buf, sizeof buf);
        char *c = v4_vocab_text(buf, comma_closes);
        snprintf(to, sizeof to, "%s/%s", dir, files[f]);
        FILE *fp = fopen(to, "w");
        if (fp) fputs(c, fp), fclose(fp);
        free(c);
        if (!fp) return -1;
    }
    return 0;
}

/* the "tandem: prompt: " lines of chat's stderr, in order, into p[0..max) (malloc'd) */
static int prompts(const char *err, char **p, int max) {
    int n = 0;
    for (const char *q = err; n < max && (q = strstr(q, "tandem: prompt: "));) {
        q += strlen("tandem: prompt: ");
        const char *e = strchr(q, '\n');
        p[n++] = strndup(q, e ? (size_t)(e - q) : strlen(q));
        q = e ? e : q + strlen(q);
    }
    return n;
}

static void bad(const char *name, const char *args, const char *want) {
    char msg[2048], full[1024];
    snprintf(full, sizeof full, args, root, root, root);
    case_begin();
    int rc = tandem(full, msg, sizeof msg);
    CHECK(rc != 0 && rc < 128, "exit status %d", rc);
    CHECK(strstr(msg, want), "stderr '%s' lacks '%s'", msg, want);
    int lines = 0;
    for (char *p = msg; *p; p++)
        lines += *p == '\n';
    CHECK(lines == 1, "%d lines on stderr: '%s'", lines, msg);
    case_end(name, "");
}

/* --ranks N: the model split over N processes (rank 0 leading, each follower this command
 * again, joined by a socketpair): one rank's tokens at 2 and 4 ranks (MTP, sampled); 3 ranks of
 * 8 experts refused; a follower that ends (TD_TEST_RANK_DIES) ends the run with its reason and
 * every rank's exit status, no hang; a follower started by hand refused; --gpus beside --ranks
 * or on the CPU refused */
static void ranks_cases(void) {
    case_begin();
    const char *bin = getenv("TD_TANDEM") ? getenv("TD_TANDEM") : "./bin/tandem";
    char args[1024], out[3][1024], msg[4096], cmd[2048];
    const char *gen = "generate --backend cpu --model models/tandem-tiny --prompt-ids \"5 17 99 "
                      "1023 44 8 300 12 7 7 9\" --max-tokens 16 --print-ids --draft mtp "
                      "--temperature 1 --seed 3";
    const int ranks[3] = {1, 2, 4};
    for (int i = 0; i < 3; i++) {
        snprintf(args, sizeof args, "%s --ranks %d", gen, ranks[i]);
        char name[32];
        snprintf(name, sizeof name, "ranks%d.txt", ranks[i]);
        CHECK(tandem_stdout(args, name, out[i], sizeof out[i]) == 0, "--ranks %d failed", ranks[i]);
    }
    CHECK(strlen(out[0]) > 20 && !strcmp(out[0], out[1]) && !strcmp(out[0], out[2]),
          "--ranks 1, 2 and 4 printed '%s', '%s', '%s'", out[0], out[1], out[2]);
    snprintf(args, sizeof args, "%s --ranks 3", gen);
    CHECK(tandem(args, msg, sizeof msg) != 0 &&
              strstr(msg, "3 ranks do not divide the model's 8 routed experts"),
          "--ranks 3: '%s'", msg);
    // --gpus: beside --ranks, and on the CPU backend (or a build without CUDA or NCCL), refused
    // before any follower starts
    snprintf(args, sizeof args, "%s --ranks 2 --gpus 2", gen);
    CHECK(tandem(args, msg, sizeof msg) != 0 && strstr(msg, "--ranks 2 and --gpus 2: one of them"),
          "--ranks 2 --gpus 2: '%s'", msg);
    snprintf(args, sizeof args, "%s --gpus 2", gen);
    CHECK(tandem(args, msg, sizeof msg) != 0 && strstr(msg, "generate: --gpus 2") &&
              !strstr(msg, "rank 1"),
          "--gpus 2 --backend cpu: '%s'", msg);
    char errf[160];
    snprintf(errf, sizeof errf, "%s/ranks_dies.txt", root);
    snprintf(cmd, sizeof cmd, "env TD_TEST_RANK_DIES=1 timeout 60 %s %s --ranks 4 >/dev/null 2>%s",
             bin, gen, errf);
    int st = system(cmd);
    slurp(errf, msg, sizeof msg);
    CHECK(st != 0 && WEXITSTATUS(st) != 124 &&
              strstr(msg, "comm: rank 1's connection closed (its process ended)") &&
              strstr(msg, "tandem: rank 1 exited with 3") &&
              strstr(msg, "tandem: rank 2 exited with 1"),
          "a follower that ends: status %d, '%s'", st, msg);
    snprintf(cmd, sizeof cmd, "env TANDEM_RANK=1 timeout 60 %s %s >/dev/null 2>%s", bin, gen, errf);
    st = system(cmd);
    slurp(errf, msg, sizeof msg);
    CHECK(st != 0 && strstr(msg, "a follower is started by its leader (--ranks N)"),
          "a follower by hand: '%s'", msg);
    case_end("cli/generate_ranks", "");
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/td_cli_XXXXXX");
    if (!mkdtemp(root)) return 1;
    const char *fx = "tests/fixtures/b_plain_hc2";
    char args[1024], msg[2048], err[256];

    write_text("ids_ok", "1 2 3\n4\t5 6 7 8 9 10\n");
    write_text("ids_range", "1 2 300\n");
    write_text("ids_text", "1 2 x3\n");
    write_text("ids_neg", "1 -2 3\n");
    write_text("ids_empty", "  \n");

    char a0[512];
    // good runs: one call, chunked; equal bits
    case_begin();
    snprintf(args, sizeof args, "logits --model %s --ids %s/ids.txt --out %s/one.npy", fx, fx,
             root);
    CHECK(tandem(args, msg, sizeof msg) == 0, "one-call run failed: %s", msg);
    snprintf(args, sizeof args,
             "logits --model %s --ids %s/ids.txt --out %s/chunked.npy --chunks 37,1,1,1,5,1,274",
             fx, fx, root);
    CHECK(tandem(args, msg, sizeof msg) == 0, "chunked run failed: %s", msg);
    int64_t r1 = 0, c1 = 0, r2 = 0, c2 = 0, r3 = 0, c3 = 0;
    char path[256];
    snprintf(path, sizeof path, "%s/one.npy", root);
    float *one = npy_read_f32(path, &r1, &c1, err, sizeof err);
    snprintf(path, sizeof path, "%s/chunked.npy", root);
    float *ch = npy_read_f32(path, &r2, &c2, err, sizeof err);
    snprintf(path, sizeof path, "%s/logits.npy", fx);
    float *ref = npy_read_f32(path, &r3, &c3, err, sizeof err);
    CHECK(one && ch && ref && r1 == 320 && c1 == 300 && r2 == r1 && c2 == c1 && r3 == r1,
          "shapes %lldx%lld %lldx%lld", (long long)r1, (long long)c1, (long long)r2, (long long)c2);
    if (!check_case_failed) {
        CHECK(!memcmp(one, ch, (size_t)r1 * c1 * 4), "--chunks changed the logits");
        CHECK(rel_row_err(one, ref, r1, c1, NULL) <= 1e-3, "logits differ from HF");
    }
    free(one);
    free(ch);
    free(ref);
    case_end("logits_chunked_equals_one_call", "");

    // --capture: per position, the mean streams of the layers named, the same bits chunked
    case_begin();
    float *cap[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        snprintf(args, sizeof args,
                 "logits --model %s --ids %s/ids.txt --out %s/c%d.npy --capture 0,2 --capture-out "
                 "%s/cap%d.npy%s",
                 fx, fx, root, i, root, i, i ? " --chunks 37,1,1,1,5,1,274" : "");
        CHECK(tandem(args, msg, sizeof msg) == 0, "capture run failed: %s", msg);
        snprintf(path, sizeof path, "%s/cap%d.npy", root, i);
        cap[i] = npy_read_f32(path, &r1, &c1, err, sizeof err);
        CHECK(cap[i] && r1 == 320 && c1 == 2 * 64, "capture shape %lldx%lld", (long long)r1,
              (long long)c1);
    }
    if (!check_case_failed)
        CHECK(!memcmp(cap[0], cap[1], (size_t)320 * 128 * 4), "--chunks changed the capture");
    free(cap[0]);
    free(cap[1]);
    case_end("logits_capture_chunked_equals_one_call", "");
    snprintf(a0, sizeof a0,
             "logits --model %s --ids %%s/ids_ok --out %%s/o.npy --capture 2,1 "
             "--capture-out %%s/c.npy",
             fx);
    bad("generate_kv_dtype_unknown",
        "generate --model models/tandem-tiny --prompt-ids \"1\" --kv-dtype fp16",
        "--kv-dtype 'fp16': expected fp32, bf16 or fp8");
    // at the default (automatic) row budget too, a missing dspark/ says why it was looked for
    bad("generate_dspark_without_head",
        "generate --model tests/fixtures/b_plain_hc2 --backend cpu --prompt-ids \"5 6\" "
        "--max-tokens 2 --draft dspark",
        "dspark/config.json: No such file or directory (the checkpoint carries no DSpark head of "
        "its own");
    bad("capture_not_ascending", a0, "ascending layer indices");
    snprintf(a0, sizeof a0,
             "logits --model %s --ids %%s/ids_ok --out %%s/o.npy --capture 0,3 "
             "--capture-out %%s/c.npy",
             fx);
    bad("capture_layer_out_of_range", a0, "in [0, 3)");
    snprintf(a0, sizeof a0, "logits --model %s --ids %%s/ids_ok --out %%s/o.npy --capture 0", fx);
    bad("capture_without_out", a0, "go together");

    snprintf(args, sizeof args, "logits --model %s --ids %%s/ids_ok --out %%s/o.npy", fx);
    case_begin();
    snprintf(msg, sizeof msg, args, root, root);
    CHECK(tandem(msg, msg, sizeof msg) == 0, "10 ids failed");
    case_end("logits_small", "");

    char a[512];
    snprintf(a, sizeof a, "logits --model %s --ids %%s/missing --out %%s/o.npy", fx);
    bad("missing_ids_file", a, "cannot open ids file");
    snprintf(a, sizeof a, "logits --model %s --ids %%s/ids_range --out %%s/o.npy", fx);
    bad("id_out_of_range", a, "outside [0, 300)");
    snprintf(a, sizeof a, "logits --model %s --ids %%s/ids_text --out %%s/o.npy", fx);
    bad("id_not_a_number", a, "is not a token id");
    snprintf(a, sizeof a, "logits --model %s --ids %%s/ids_neg --out %%s/o.npy", fx);
    bad("id_negative", a, "is not a token id");
    snprintf(a, sizeof a, "logits --model %s --ids %%s/ids_empty --out %%s/o.npy", fx);
    bad("ids_empty", a, "no token ids");
    snprintf(a, sizeof a, "logits --model %s --ids %%s/ids_ok --out %%s/o.npy --chunks 3,3", fx);
    bad("chunks_wrong_sum", a, "sums to 6");
    snprintf(a, sizeof a, "logits --model %s --ids %%s/ids_ok --out %%s/o.npy --chunks 5,0,5", fx);
    bad("chunks_zero", a, "positive integers");
    snprintf(a, sizeof a, "logits --model %s --ids %%s/ids_ok --out %%s/o.npy --chunks 5,,5", fx);
    bad("chunks_empty_item", a, "positive integers");
    snprintf(a, sizeof a, "logits --model %s --ids %%s/ids_ok --out %%s/o.npy --chunks 5,5,", fx);
    bad("chunks_trailing_comma", a, "trailing comma");
    snprintf(a, sizeof a, "logits --model %s --ids %%s/ids_ok --out %%s/o.npy --chunks a", fx);
    bad("chunks_not_numbers", a, "positive integers");
    snprintf(a, sizeof a, "logits --model %%s/nope --ids %%s/ids_ok --out %%s/o.npy");
    bad("model_dir_missing", a, "config.json");
    snprintf(a, sizeof a, "logits --model %s --ids %%s/ids_ok --out %%s/no/such/dir/o.npy", fx);
    bad("out_unwritable", a, "cannot write");
    bad("missing_model_flag", "logits --ids %s/ids_ok --out %s/o.npy", "--model DIR is required");
    bad("missing_value", "logits --model", "needs a value");
    bad("unknown_option", "logits --bogus 1", "unknown option");
    bad("unknown_command", "frobnicate", "unknown command");
    // issue 20: an ids file of more ids than any context (2^24) is refused as it is read (the
    // count was an int doubled past 2^30, the reallocs unchecked); the 'x' after them is
    // reached only without the limit
    snprintf(a, sizeof a, "%s/ids_many", root);
    FILE *many = fopen(a, "w");
    if (many) {
        static char zeros[1 << 16];
        for (size_t i = 0; i < sizeof zeros; i += 2)
            memcpy(zeros + i, "0\n", 2);
        for (int i = 0; i < (1 << 24) / (int)(sizeof zeros / 2); i++)
            fwrite(zeros, 1, sizeof zeros, many);
        fputs("0 x\n", many);
        fclose(many);
    }
    snprintf(a, sizeof a, "logits --model %s --ids %%s/ids_many --out %%s/o.npy", fx);
    bad("ids_too_many", a, "holds more than 16777216 token ids");

    // generate: --n completions, one line each with --print-ids; speculation changes nothing
    case_begin();
    char out1[4096], out2[4096];
    const char *bin = getenv("TD_TANDEM") ? getenv("TD_TANDEM") : "./bin/tandem";
    snprintf(args, sizeof args,
             "%s generate --model %s --prompt-ids \"5 6 7 5 6 7 5\" --max-tokens 12 --n 3 "
             "--print-ids --ignore-eos > %s/g1.txt 2>/dev/null && %s generate --model %s "
             "--prompt-ids-file %s/ids_ok --max-tokens 12 --n 3 --draft ngram --draft-tokens 4 "
             "--print-ids --ignore-eos > %s/g2.txt 2>/dev/null",
             bin, fx, root, bin, fx, root, root);
    CHECK(system(args) == 0, "generate failed");
    snprintf(path, sizeof path, "%s/g1.txt", root);
    FILE *fp = fopen(path, "r");
    size_t k1 = fp ? fread(out1, 1, sizeof out1 - 1, fp) : 0;
    if (fp) fclose(fp);
    out1[k1] = 0;
    int lines = 0, items = 0;
    for (char *q = out1; *q; q++)
        lines += *q == '\n';
    for (char *q = strtok(out1, " \n"); q; q = strtok(NULL, " \n"))
        items++;
    CHECK(lines == 3 && items == 36, "--n 3 --max-tokens 12 printed %d lines, %d ids", lines,
          items);
    snprintf(path, sizeof path, "%s/g2.txt", root);
    fp = fopen(path, "r");
    size_t k2 = fp ? fread(out2, 1, sizeof out2 - 1, fp) : 0;
    if (fp) fclose(fp);
    out2[k2] = 0;
    CHECK(k2 > 0, "no output with --draft ngram");
    case_end("generate_print_ids", "");

    // --stats: the decode rate counts the tokens after every completion's first (the three
    // prompts prefill in one step: 3 x 12 - 3)
    case_begin();
    char smsg[4096];
    snprintf(args, sizeof args,
             "generate --model %s --prompt-ids \"5 6 7 5 6 7 5\" --max-tokens 12 --n 3 "
             "--print-ids --ignore-eos --draft none --stats",
             fx);
    CHECK(tandem(args, smsg, sizeof smsg) == 0, "generate --stats failed: %s", smsg);
    const char *dl = strstr(smsg, "stats: decode ");
    long dn = -1;
    double dt = -1, dr = -1;
    CHECK(dl && sscanf(dl, "stats: decode %ld tokens in %lf s = %lf", &dn, &dt, &dr) == 3,
          "no decode line in '%s'", smsg);
    CHECK(dn == 33 && dt > 0 && dr > 0, "decode %ld tokens in %g s = %g tokens/s", dn, dt, dr);
    case_end("generate_stats_decode_rate", "");

    // a text prompt three ways, the same ids: TEXT, --prompt TEXT and --prompt-file F (a file,
    // and standard input); --prompt takes a text that begins with '-'; a missing file is named
    case_begin();
    {
        const char *tiny = "models/tandem-tiny", *gen = "generate --max-tokens 6 --print-ids "
                                                        "--ignore-eos --draft none --model";
        char o[4][256], cmd[1024], m[1024];
        write_text("prompt.txt", "The capital of France is");
        snprintf(cmd, sizeof cmd, "%s %s \"The capital of France is\"", gen, tiny);
        int r0 = tandem_stdout(cmd, "pt0.txt", o[0], sizeof o[0]);
        snprintf(cmd, sizeof cmd, "%s %s --prompt \"The capital of France is\"", gen, tiny);
        int r1 = tandem_stdout(cmd, "pt1.txt", o[1], sizeof o[1]);
        snprintf(cmd, sizeof cmd, "%s %s --prompt-file %s/prompt.txt", gen, tiny, root);
        int r2 = tandem_stdout(cmd, "pt2.txt", o[2], sizeof o[2]);
        snprintf(cmd, sizeof cmd, "%s %s --prompt-file - < %s/prompt.txt", gen, tiny, root);
        int r3 = tandem_stdout(cmd, "pt3.txt", o[3], sizeof o[3]);
        CHECK(!r0 && !r1 && !r2 && !r3 && strlen(o[0]) > 6 && !strcmp(o[0], o[1]) &&
                  !strcmp(o[0], o[2]) && !strcmp(o[0], o[3]),
              "exit %d %d %d %d, ids '%s' '%s' '%s' '%s'", r0, r1, r2, r3, o[0], o[1], o[2], o[3]);
        snprintf(cmd, sizeof cmd, "%s %s --prompt \"-5 degrees\"", gen, tiny);
        CHECK(tandem(cmd, m, sizeof m) == 0, "--prompt '-5 degrees': %s", m);
        snprintf(cmd, sizeof cmd, "%s %s --prompt-file %s/no_such_prompt.txt", gen, tiny, root);
        CHECK(tandem(cmd, m, sizeof m) != 0 && strstr(m, "--prompt-file: cannot open") &&
                  strstr(m, "no_such_prompt.txt"),
              "a missing prompt file: '%s'", m);
        snprintf(cmd, sizeof cmd, "%s %s --prompt-file %s/prompt.txt \"more\"", gen, tiny, root);
        CHECK(tandem(cmd, m, sizeof m) != 0 && strstr(m, "exactly one of"), "two prompts: '%s'", m);
    }
    case_end("generate_prompt_file", "");

    // --kv-dtype: the caches' precision reaches the engine (the stats line names it and its
    // bytes a token, fp8 fewer than fp32)
    case_begin();
    {
        char kmsg[2][4096];
        const char *kv[2] = {"fp32", "fp8"};
        double tb[2] = {0, 0};
        for (int i = 0; i < 2; i++) {
            snprintf(args, sizeof args,
                     "generate --model models/tandem-tiny --backend cpu --prompt-ids \"5 6 7\" "
                     "--max-tokens 6 --print-ids --ignore-eos --draft none --stats --kv-dtype %s",
                     kv[i]);
            CHECK(tandem(args, kmsg[i], sizeof kmsg[i]) == 0, "--kv-dtype %s failed", kv[i]);
            char want[64];
            snprintf(want, sizeof want, ", %s key caches ", kv[i]);
            const char *l = strstr(kmsg[i], want);
            const char *b = l ? strstr(l, "MiB (") : NULL;
            CHECK(b && sscanf(b, "MiB (%lf B a token", &tb[i]) == 1, "no '%s' in '%s'", want,
                  kmsg[i]);
        }
        CHECK(tb[1] > 0 && tb[1] < tb[0], "fp8 %g B a token, fp32 %g", tb[1], tb[0]);
    }
    case_end("generate_kv_dtype", "");

    // the drafters keep their caches in the same precision, and speculation stays lossless:
    // greedy MTP and DSpark on fp8 caches give plain decoding's tokens on fp8 caches
    case_begin();
    {
        const char *dr[3] = {"none", "mtp", "dspark"};
        char out[3][4096];
        for (int i = 0; i < 3; i++) {
            snprintf(args, sizeof args,
                     "generate --model models/tandem-tiny --backend cpu --prompt-ids \"5 6 7 8\" "
                     "--max-tokens 24 --print-ids --ignore-eos --kv-dtype fp8 --draft %s",
                     dr[i]);
            CHECK(tandem(args, out[i], sizeof out[i]) == 0, "--kv-dtype fp8 --draft %s: %s", dr[i],
                  out[i]);
        }
        for (int i = 1; i < 3; i++)
            CHECK(!strcmp(out[i], out[0]), "--draft %s on fp8 caches gave '%s', plain '%s'", dr[i],
                  out[i], out[0]);
    }
    case_end("generate_kv_dtype_drafters_lossless", "");

    // --draft auto on the CPU backend decodes without a drafter (the default model ships
    // DSpark, which is slower than none on the CPU); --draft dspark still speculates
    case_begin();
    snprintf(args, sizeof args,
             "generate --model models/tandem-tiny --backend cpu --prompt-ids \"5 6 7\" "
             "--max-tokens 8 --print-ids --ignore-eos --stats");
    CHECK(tandem(args, smsg, sizeof smsg) == 0, "generate (auto) failed: %s", smsg);
    CHECK(strstr(smsg, "stats: backend cpu, draft none (up to 0 tokens a round)") &&
              !strstr(smsg, "mean accepted length"),
          "auto drafted on the CPU, or printed speculation's numbers without a drafter: '%s'",
          smsg);
    snprintf(args, sizeof args,
             "generate --model models/tandem-tiny --backend cpu --prompt-ids \"5 6 7\" "
             "--max-tokens 8 --print-ids --ignore-eos --stats --draft dspark --draft-policy fixed");
    CHECK(tandem(args, smsg, sizeof smsg) == 0, "generate --draft dspark failed: %s", smsg);
    CHECK(strstr(smsg, "draft dspark") && strstr(smsg, "mean accepted length") &&
              !strstr(smsg, "(0 of 0 drafts)"),
          "--draft dspark did not draft: '%s'", smsg);
    case_end("generate_auto_draft_on_cpu_is_none", "");

    // the default model with its dspark/ moved into its own files (tests/embed_dspark.h, as
    // V4-Flash-0731 carries its head): --draft dspark runs it with no folder and drafts as the
    // folder does: the same ids, the same acceptance, position by position
    case_begin();
    char emb[128], so[2][4096], se[2][4096], *acc[2][2];
    snprintf(emb, sizeof emb, "%s/embedded", root);
    CHECK(!embed_dspark(emb, "models/tandem-tiny", "models/tandem-tiny/dspark", NULL, 0, NULL, NULL,
                        err, sizeof err),
          "%s", err);
    for (int v = 0; v < 2 && !check_case_failed; v++) {
        snprintf(args, sizeof args,
                 "%s generate --model %s --backend cpu --prompt-ids \"5 6 7 5 6 7 5\" "
                 "--max-tokens 24 --n 2 --print-ids --ignore-eos --draft dspark --draft-policy "
                 "fixed --stats > "
                 "%s/emb%d.out 2> %s/emb%d.err",
                 bin, v ? emb : "models/tandem-tiny", root, v, root, v);
        CHECK(system(args) == 0, "generate --draft dspark (%s) failed", v ? emb : "the folder");
        snprintf(path, sizeof path, "%s/emb%d.out", root, v);
        slurp(path, so[v], sizeof so[v]);
        snprintf(path, sizeof path, "%s/emb%d.err", root, v);
        slurp(path, se[v], sizeof se[v]);
        acc[v][0] = strstr(se[v], "stats: mean accepted length");
        acc[v][1] = strstr(se[v], "stats: acceptance by draft position");
        CHECK(strstr(se[v], "draft dspark (up to 5 tokens a round)") && acc[v][0] && acc[v][1],
              "no DSpark stats in '%s'", se[v]);
        for (int j = 0; !check_case_failed && j < 2; j++)
            *strchr(acc[v][j], '\n') = 0;
    }
    CHECK(check_case_failed || (so[0][0] && !strcmp(so[0], so[1])),
          "the ids differ: '%s' from the folder, '%s' embedded", so[0], so[1]);
    for (int j = 0; !check_case_failed && j < 2; j++)
        CHECK(!strcmp(acc[0][j], acc[1][j]), "'%s' from the folder, '%s' embedded", acc[0][j],
              acc[1][j]);
    case_end("generate_dspark_embedded_equals_folder", "");

    // bench on the default model: a tiny prompt set, CSV out
    write_text("p.jsonl", "{\"turns\": [\"What is a cat?\"]}\n{\"text\": \"Once upon a time\"}\n");
    write_text("bad.jsonl", "{\"turns\": [\"ok\"]}\n[1, 2]\n");
    case_begin();
    snprintf(args, sizeof args,
             "bench --model models/tandem-tiny --prompts %s/p.jsonl --max-tokens 4 --batch 2 "
             "--draft mtp --csv --backend cpu",
             root);
    CHECK(tandem_stdout(args, "bench.csv", out2, sizeof out2) == 0, "bench failed");
    CHECK(strstr(out2, "tokens_per_s") && strstr(out2, ",mtp,3,2,2,") &&
              strstr(out2, ",itl_p50,itl_p99,queue_p50,queue_p90,prefill_p50,prefill_p90\n"),
          "bench CSV: '%s'", out2);
    case_end("bench_csv", "");
    // three prompts, one slot: the later ones wait for it, and the first token's time is split
    // into that wait and the prefill
    write_text("p3.jsonl", "{\"text\": \"one\"}\n{\"text\": \"two two\"}\n{\"text\": \"three\"}\n");
    case_begin();
    snprintf(args, sizeof args,
             "bench --model models/tandem-tiny --prompts %s/p3.jsonl --max-tokens 4 --batch 1 "
             "--draft none --backend cpu",
             root);
    CHECK(tandem_stdout(args, "bench_ttft.txt", out2, sizeof out2) == 0, "bench failed");
    double q50 = -1, q90 = -1, p50 = -1, p90 = -1, t50 = -1, t90 = -1;
    const char *ft = strstr(out2, "bench: time to first token p50 ");
    const char *sp = strstr(out2, "bench: of the first token's time, waiting for a slot p50 ");
    if (ft) sscanf(ft, "bench: time to first token p50 %lf s p90 %lf s", &t50, &t90);
    if (sp)
        sscanf(sp,
               "bench: of the first token's time, waiting for a slot p50 %lf s p90 %lf s, "
               "prefill p50 %lf s p90 %lf s",
               &q50, &q90, &p50, &p90);
    CHECK(q50 > 0 && q90 >= q50 && p50 > 0 && p90 >= p50 && q90 < t90 && p50 <= t90,
          "first token %g / %g s, waiting %g / %g s, prefill %g / %g s: '%s'", t50, t90, q50, q90,
          p50, p90, out2);
    case_end("bench_first_token_split", "");
    // a long prompt arriving beside the decodes, capped at 8 rows a step: the gaps between the
    // decodes' tokens and when it arrived
    case_begin();
    snprintf(args, sizeof args,
             "bench --model models/tandem-tiny --prompts %s/p.jsonl --max-tokens 6 --batch 2 "
             "--long-prompt 40 --prefill-chunk 8 --backend cpu",
             root);
    CHECK(tandem_stdout(args, "late.txt", out2, sizeof out2) == 0, "bench --long-prompt failed");
    CHECK(strstr(out2, "bench: between a request's tokens p50 ") &&
              strstr(out2, "bench: a prompt of 40 tokens arrived at "),
          "bench --long-prompt: '%s'", out2);
    case_end("bench_long_prompt", "");
    // a sweep: one table row a batch, a column a drafter, and an SVG with a line a drafter
    case_begin();
    snprintf(args, sizeof args,
             "bench --model models/tandem-tiny --prompts %s/p.jsonl --max-tokens 4 --sweep 1,2 "
             "--draft none,ngram --draft-policy fixed --backend cpu --plot %s/sweep.svg",
             root, root);
    CHECK(tandem_stdout(args, "sweep.txt", out2, sizeof out2) == 0, "bench --sweep failed");
    CHECK(strstr(out2, "| batch | none tok/s | ngram tok/s |") && strstr(out2, "\n| 1 | ") &&
              strstr(out2, "\n| 2 | ") && strstr(out2, "x) |") && strstr(out2, "plot in "),
          "sweep table: '%s'", out2);
    snprintf(path, sizeof path, "%s/sweep.svg", root);
    slurp(path, out2, sizeof out2);
    int n_lines = 0;
    for (const char *q = out2; (q = strstr(q, "<polyline")); q++)
        n_lines++;
    CHECK(!strncmp(out2, "<svg ", 5) && strstr(out2, "</svg>") && n_lines == 2,
          "sweep plot: %d lines in '%.200s'", n_lines, out2);
    case_end("bench_sweep_table_and_plot", "");
    // rounds of a sweep: medians, and each ratio's median with its range
    case_begin();
    snprintf(args, sizeof args,
             "%s bench --model models/tandem-tiny --prompts %s/p.jsonl --max-tokens 4 --sweep 1 "
             "--repeat 2 --draft none,ngram --draft-policy fixed --backend cpu --plot "
             "%s/sweep2.svg > %s/sweep2.txt 2>%s/sweep2.err",
             bin, root, root, root, root);
    CHECK(system(args) == 0, "bench --sweep --repeat failed");
    snprintf(path, sizeof path, "%s/sweep2.txt", root);
    slurp(path, out2, sizeof out2);
    const char *cell = strstr(out2, "\n| 1 | ");
    CHECK(strstr(out2, "medians of 2 rounds (ratio: median, range)") && cell &&
              strstr(cell, "x, ") && strchr(cell, '-'),
          "sweep rounds table: '%s'", out2);
    snprintf(path, sizeof path, "%s/sweep2.err", root);
    slurp(path, out2, sizeof out2);
    CHECK(strstr(out2, "none at batch 1 (round 1 of 2)") &&
              strstr(out2, "ngram at batch 1 (round 2 of 2)"),
          "sweep rounds progress: '%s'", out2);
    case_end("bench_sweep_repeat", "");
    // TD_POLICY_TRACE=2: a line a step in the format tools/policy_trace.py reads, as many as
    // the run's steps, and the cost tables
    case_begin();
    snprintf(args, sizeof args,
             "TD_POLICY_TRACE=2 %s bench --model models/tandem-tiny --prompts %s/p.jsonl "
             "--max-tokens 4 --batch 2 --draft mtp --backend cpu > %s/trace.txt 2>%s/trace.err",
             bin, root, root, root);
    CHECK(system(args) == 0, "bench with TD_POLICY_TRACE=2 failed");
    snprintf(path, sizeof path, "%s/trace.err", root);
    slurp(path, out2, sizeof out2);
    int n_trace = 0, bad_lines = 0;
    for (const char *q = out2; (q = strstr(q, "policy: step ")); q++) {
        long step, offered, verified, accepted, out;
        int rows, decoding, used = 0;
        long caught;
        double us, tt, tv, td, tp;
        char next[16];
        if (sscanf(q,
                   "policy: step %ld, %d rows, %ld offered, %ld verified, %ld accepted, %lf us "
                   "(target %lf, verify %lf, drafter %lf, policy %lf, caught up %ld), %d "
                   "decoding, %ld out; next %15s%n",
                   &step, &rows, &offered, &verified, &accepted, &us, &tt, &tv, &td, &tp, &caught,
                   &decoding, &out, next, &used) != 14 ||
            tp > td || caught < 0 || step != n_trace + 1 || verified > offered ||
            accepted > verified || decoding < 0 || decoding + verified > rows || out < 0 ||
            out > rows)
            bad_lines++;
        n_trace++;
    }
    long n_steps = 0;
    snprintf(path, sizeof path, "%s/trace.txt", root);
    char out3[4096];
    slurp(path, out3, sizeof out3);
    const char *sl = strstr(out3, " steps\n");
    while (sl && sl > out3 && sl[-1] >= '0' && sl[-1] <= '9')
        sl--;
    if (sl) n_steps = strtol(sl, NULL, 10);
    CHECK(n_trace > 0 && !bad_lines && n_trace == n_steps &&
              strstr(out2, "policy: rows <=  plain us (steps)  drafting us (steps)") &&
              strstr(out2, "policy: acceptance counts (memory 32 steps, floor 0): 1: ") &&
              strstr(out2, "policy: host a step (us): schedule ") &&
              strstr(out2, "policy: graphs: target "),
          "trace: %d step lines (%d malformed), bench ran %ld steps: '%.300s'", n_trace, bad_lines,
          n_steps, out2);
    case_end("bench_policy_trace", "");
    bad("bench_repeat_without_sweep",
        "bench --model models/tandem-tiny --prompts %s/p.jsonl --repeat 2 --draft none",
        "--repeat R repeats a --sweep");
    bad("bench_bad_repeat",
        "bench --model models/tandem-tiny --prompts %s/p.jsonl --sweep 1 --repeat 0",
        "--repeat '0'");
    bad("bench_bad_sweep",
        "bench --model models/tandem-tiny --prompts %s/p.jsonl --sweep 1,0 --draft none",
        "--sweep '1,0'");
    bad("bench_long_prompt_with_sweep",
        "bench --model models/tandem-tiny --prompts %s/p.jsonl --sweep 1 --long-prompt 9",
        "--long-prompt N is for one run");
    bad("bench_long_prompt_too_long",
        "bench --model models/tandem-tiny --prompts %s/p.jsonl --long-prompt 5000 --max-ctx 64 "
        "--backend cpu",
        "--long-prompt 5000: ");
    bad("bench_bad_prompt_line", "bench --model models/tandem-tiny --prompts %s/bad.jsonl",
        "bad.jsonl:2");
    bad("bench_missing_prompts", "bench --model models/tandem-tiny",
        "--prompts FILE.jsonl is required");

    // --dummy-weights: a directory holding only config.json runs, the same tokens each time
    {
        char dir[200], cmd[600], got[2][256];
        snprintf(dir, sizeof dir, "%s/cfgonly", root);
        snprintf(cmd, sizeof cmd,
                 "mkdir -p %s && cp tests/fixtures/c_upstream_sharded/config.json %s/", dir, dir);
        case_begin();
        CHECK(system(cmd) == 0, "copy config");
        for (int r = 0; r < 2; r++) {
            snprintf(args, sizeof args,
                     "%s generate --model %s --dummy-weights --backend cpu --prompt-ids \"5 6 7\" "
                     "--max-tokens 8 --print-ids > %s/dummy%d.txt 2>/dev/null",
                     bin, dir, root, r);
            CHECK(system(args) == 0, "generate --dummy-weights failed");
            snprintf(path, sizeof path, "%s/dummy%d.txt", root, r);
            slurp(path, got[r], sizeof got[r]);
        }
        int n_ids = 0, used, v;
        for (const char *q = got[0]; sscanf(q, "%d%n", &v, &used) == 1; q += used)
            n_ids++;
        CHECK(n_ids == 8 && !strcmp(got[0], got[1]), "dummy runs: '%s' vs '%s'", got[0], got[1]);
        case_end("generate_dummy_weights_config_only", "");
        snprintf(a, sizeof a, "generate --model %s --prompt-ids \"1 2\"", dir);
        bad("generate_config_only_without_dummy", a, "no model.safetensors");
    }

    snprintf(a, sizeof a, "generate --model %s --prompt-ids \"1 2\" --draft bogus", fx);
    bad("generate_bad_drafter", a, "expected auto, none, ngram, random, mtp or dspark");
    snprintf(a, sizeof a, "generate --model %s --prompt-ids \"1 2\" --draft dspark", fx);
    bad("generate_dspark_missing", a, "dspark: the drafter's config: cannot open");
    snprintf(a, sizeof a, "generate --model %s --prompt-ids \"1 2\" --dspark-threshold 0.5", fx);
    bad("generate_threshold_without_dspark", a, "need --draft dspark");
    snprintf(a, sizeof a,
             "generate --model %s --prompt-ids \"1 2\" --draft dspark --dspark-threshold 1.5", fx);
    bad("generate_bad_threshold", a, "--dspark-threshold");
    snprintf(a, sizeof a, "generate --model %s --prompt-ids \"1 2\" --draft-policy greedy", fx);
    bad("generate_bad_draft_policy", a, "expected adaptive or fixed");
    snprintf(
        a, sizeof a,
        "generate --model %s --prompt-ids \"1 2\" --draft ngram --synthetic-acceptance 0.8,1.2",
        fx);
    bad("generate_bad_synthetic_acceptance", a, "rates in [0, 1]");
    snprintf(a, sizeof a, "generate --model %s --prompt-ids \"1 2\" --synthetic-acceptance 0.8",
             fx);
    bad("generate_synthetic_without_drafter", a, "--synthetic-acceptance needs a drafter");
    snprintf(a, sizeof a, "chat --model %s --draft ngram --synthetic-acceptance 0.8", fx);
    bad("chat_refuses_synthetic_acceptance", a, "is for generate and bench");
    snprintf(a, sizeof a, "generate --model %s --prompt-ids \"1 2\" --temperature -1", fx);
    bad("generate_bad_temperature", a, "--temperature");
    snprintf(a, sizeof a, "generate --model %s --prompt-ids \"1 2\" --top-p 0", fx);
    bad("generate_bad_top_p", a, "--top-p");
    snprintf(a, sizeof a, "generate --model %s --prompt-ids \"1 2\" --draft-tokens 3", fx);
    bad("generate_draft_tokens_without_drafter", a, "needs a drafter");
    snprintf(a, sizeof a, "generate --model %s --prompt-ids \"1 x\"", fx);
    bad("generate_bad_prompt", a, "not a token id");
    snprintf(a, sizeof a, "generate --model %s --prompt-ids \"1 999\"", fx);
    bad("generate_prompt_out_of_range", a, "outside [0, 300)");
    snprintf(a, sizeof a, "generate --model %s", fx);
    bad("generate_no_prompt", a, "exactly one of");
    snprintf(a, sizeof a, "generate --model %s --prompt-ids \"1\" --max-tokens 0", fx);
    bad("generate_zero_tokens", a, "--max-tokens");

    // chat on a DeepSeek V4 vocabulary: each turn's prompt as the V4 encoder writes it; with
    // --think the reasoning streams to stderr and stays out of the next prompt (tandem-tiny
    // never writes </think>, so all of a reply is reasoning and its answer is empty)
    {
        char dir[200], out[4096], errs[8192], *p[4] = {NULL};
        snprintf(dir, sizeof dir, "%s/v4", root);
        case_begin();
        CHECK(!v4_model(dir, 0), "cannot make %s", dir);
        for (int think = 1; think >= 0; think--) {
            snprintf(args, sizeof args,
                     "printf 'hello\\nagain\\n' | %s chat --model %s --max-tokens 8 --draft none "
                     "--backend cpu --show-prompt%s > %s/chat.out 2> %s/chat.err",
                     bin, dir, think ? " --think" : "", root, root);
            CHECK(system(args) == 0, "chat%s failed", think ? " --think" : "");
            snprintf(path, sizeof path, "%s/chat.out", root);
            slurp(path, out, sizeof out);
            snprintf(path, sizeof path, "%s/chat.err", root);
            slurp(path, errs, sizeof errs);
            int n = prompts(errs, p, 4);
            CHECK(n == 2, "%d prompts in '%s'", n, errs);
            if (n != 2) break;
#define BOS   "<｜begin▁of▁sentence｜>"
#define TURN1 BOS "<｜User｜>hello<｜Assistant｜>"
            if (think) {
                CHECK(!strcmp(p[0], TURN1 "<think>"), "turn 1 '%s'", p[0]);
                CHECK(!strcmp(p[1], TURN1 "</think><｜end▁of▁sentence｜><｜User｜>again"
                                          "<｜Assistant｜><think>"),
                      "turn 2 keeps the reasoning: '%s'", p[1]);
                // the reasoning came out on stderr between the prompts, the answers on stdout
                const char *r =
                    strchr(strstr(errs, "<think>\n") ? strstr(errs, "<think>\n") : errs, '\n');
                CHECK(r && r[1] && r[1] != '\n' && strncmp(r + 1, "tandem:", 7),
                      "no reasoning on stderr: '%s'", errs);
                CHECK(!strcmp(out, "\n\n"), "stdout '%s', not two empty answers", out);
            } else {
                CHECK(!strcmp(p[0], TURN1 "</think>"), "turn 1 '%s'", p[0]);
                char want[1024], first[512];
                snprintf(first, sizeof first, "%.*s", (int)strcspn(out, "\n"), out);
                snprintf(want, sizeof want,
                         TURN1
                         "</think>%s<｜end▁of▁sentence｜><｜User｜>again<｜Assistant｜></think>",
                         first);
                CHECK(first[0] && !strcmp(p[1], want), "turn 2 '%s', not '%s'", p[1], want);
            }
            for (int i = 0; i < n; i++)
                free(p[i]), p[i] = NULL;
        }
        case_end("chat_v4_think",
                 "(--think: reasoning apart and dropped; without: the answer kept)");
        // with "," as a special </think>: tandem-tiny's first token ends the (empty) reasoning,
        // the rest is the answer, on stdout and in the next prompt
        snprintf(dir, sizeof dir, "%s/v4comma", root);
        case_begin();
        CHECK(!v4_model(dir, 1), "cannot make %s", dir);
        snprintf(args, sizeof args,
                 "printf 'hello\\nagain\\n' | %s chat --model %s --max-tokens 8 --draft none "
                 "--backend cpu --show-prompt --think > %s/chat.out 2> %s/chat.err",
                 bin, dir, root, root);
        CHECK(system(args) == 0, "chat --think failed");
        snprintf(path, sizeof path, "%s/chat.out", root);
        slurp(path, out, sizeof out);
        snprintf(path, sizeof path, "%s/chat.err", root);
        slurp(path, errs, sizeof errs);
        char first[512], want[1024];
        snprintf(first, sizeof first, "%.*s", (int)strcspn(out, "\n"), out);
        snprintf(want, sizeof want,
                 TURN1 "</think>%s<｜end▁of▁sentence｜><｜User｜>again<｜Assistant｜><think>",
                 first);
        int n = prompts(errs, p, 4);
        CHECK(n == 2 && first[0] && !strcmp(p[1], want), "answer '%s', turn 2 '%s'", first,
              n == 2 ? p[1] : errs);
        CHECK(strstr(errs, "<think>\n\n"), "the reasoning is not empty: '%s'", errs);
        for (int i = 0; i < n; i++)
            free(p[i]);
        case_end("chat_v4_think_answer",
                 "(the answer after </think> on stdout and in the history)");
    }
    bad("chat_think_without_think_tokens",
        "chat --model models/tandem-tiny --think --draft none --backend cpu < /dev/null",
        "--think needs a DeepSeek vocabulary with <think> and </think>");
    bad("chat_bad_reasoning_effort", "chat --reasoning-effort extreme",
        "--reasoning-effort 'extreme': expected high or max");
    ranks_cases();

    snprintf(args, sizeof args, "rm -rf %s", root);
    if (system(args)) return 1;
    return check_failures ? 1 : 0;
}
