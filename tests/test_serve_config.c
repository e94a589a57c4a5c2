/* test_serve_config.c: the INI configuration of `tandem serve` (serve/config.h).
 *
 *   make build/tests/test_serve_config && build/tests/test_serve_config
 *
 * Run from the repository root (as tests/run.sh does): one case loads etc/tandem.ini. Each error
 * case gives the exact list of error lines a text must produce (file:line and the reason), so a
 * missing, extra or misnumbered error fails. Prints "OK <case>" or "FAIL <case>: <why>" per
 * case; exits 0 iff all pass. TD_TEST_VERBOSE=1 also prints the error messages.
 */
#include "serve/config.h"
#include "check.h"

#include <ini.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int verbose(void) {
    return getenv("TD_TEST_VERBOSE") != NULL;
}

/* the first line where a and b differ, into out */
static void first_diff(const char *a, const char *b, char *out, size_t n) {
    int line = 1;
    const char *la = a, *lb = b;
    for (; *a && *a == *b; a++, b++)
        if (*a == '\n') line++, la = a + 1, lb = b + 1;
    snprintf(out, n, "line %d: '%.*s' vs '%.*s'", line, (int)strcspn(la, "\n"), la,
             (int)strcspn(lb, "\n"), lb);
}

/* a and b are the same configuration: byte for byte, and as INI text */
static void check_same(const struct srv_config *a, const struct srv_config *b, const char *what) {
    char *ta = srv_config_ini(a), *tb = srv_config_ini(b), diff[300] = "";
    CHECK(ta && tb, "srv_config_ini returned NULL");
    if (ta && tb && strcmp(ta, tb)) first_diff(ta, tb, diff, sizeof diff);
    CHECK(!diff[0], "%s: INI text differs at %s", what, diff);
    CHECK(!memcmp(a, b, sizeof *a), "%s: the structs differ (INI text the same)", what);
    free(ta);
    free(tb);
}

/* the lines of err */
static int err_lines(const char *err, char lines[][600], int max) {
    int n = 0;
    for (const char *p = err; *p && n < max;) {
        size_t len = strcspn(p, "\n");
        snprintf(lines[n++], 600, "%.*s", (int)len, p);
        p += len + (p[len] == '\n');
    }
    return n;
}

/* the errors of loading text as "t.ini" must be want[] exactly: as many lines, line i holding
 * want[i] (NULL-terminated) */
static void expect_errors(const char *name, const char *text, const char *const *want) {
    case_begin();
    struct srv_config c;
    static char err[16384];
    int rc = srv_config_load_string(&c, text, "t.ini", err, sizeof err);
    if (verbose()) printf("  %s:\n%s\n", name, err);
    static char lines[64][600];
    int n = err_lines(err, lines, 64), nwant = 0;
    while (want[nwant])
        nwant++;
    CHECK(rc == -1, "rc %d, want -1", rc);
    CHECK(n == nwant, "%d error lines, want %d: \"%s\"", n, nwant, err);
    for (int i = 0; i < n && i < nwant; i++)
        CHECK(strstr(lines[i], want[i]), "error %d is \"%s\", want \"%s\" in it", i + 1, lines[i],
              want[i]);
    case_end(name, "");
}

/* text must load without error; c gets the result */
static int load_ok(struct srv_config *c, const char *text) {
    char err[4096];
    int rc = srv_config_load_string(c, text, "t.ini", err, sizeof err);
    CHECK(rc == 0 && !err[0], "load failed (%d): %s", rc, err);
    return rc;
}

/* text with the %s in fmt replaced by n copies of ch */
static char *with_run(const char *fmt, char ch, size_t n) {
    char *run = malloc(n + 1), *out;
    memset(run, ch, n);
    run[n] = 0;
    size_t len = strlen(fmt) + n + 1;
    out = malloc(len);
    snprintf(out, len, fmt, run);
    free(run);
    return out;
}

// ----------------------------------------------------------------------------
// defaults and etc/tandem.ini

static void test_defaults(void) {
    case_begin();
    struct srv_config c;
    srv_config_defaults(&c);
    CHECK(!strcmp(c.host, "127.0.0.1"), "host %s", c.host);
    CHECK(c.port == 8080, "port %d", c.port);
    CHECK(!c.api_key_file[0] && !c.served_model_name[0] && !c.cors_origins[0], "server strings");
    CHECK(!c.strict_model, "strict_model");
    CHECK(c.max_connections == 512 && c.per_ip_connections == 0, "connections");
    CHECK(c.idle_timeout_s == 30 && c.request_timeout_s == 1800, "timeouts");
    CHECK(c.sse_ping_s == 10 && c.drain_s == 30, "ping/drain");
    CHECK(!c.path[0] && c.max_context == 4096 && !strcmp(c.backend, "auto"), "model");
    CHECK(!c.dummy_weights && !c.deterministic && c.graphs, "model booleans");
    CHECK(!strcmp(c.method, "auto") && c.k == 0 && !c.dspark_dir[0] && c.confidence_min == 0,
          "speculation");
    CHECK(c.max_running == 16 && c.max_batch_tokens == 256 && c.max_cache_mib == 0, "scheduler");
    CHECK(c.temperature == 1.0 && c.top_p == 1.0 && c.top_k == 0, "sampling");
    CHECK(c.max_tokens == 4096 && c.completion_max_tokens == 16 && !c.ignore_eos, "max_tokens");
    CHECK(c.max_waiting == 256 && c.max_prompt_tokens == 0 && c.max_n == 8, "limits");
    CHECK(c.max_stop == 4 && c.max_stop_len == 128, "stop limits");
    CHECK(c.max_body_bytes == 8388608 && c.max_stream_buffer_bytes == 4194304, "byte limits");
    CHECK(c.metrics_enabled && !c.vllm_compat && c.per_request == SRV_PER_REQUEST_NONE, "metrics");
    CHECK(c.log_level == SRV_LOG_INFO && c.log_format == SRV_LOG_TEXT && !c.log_file[0] &&
              !c.log_requests,
          "log");
    char err[1024];
    CHECK(srv_config_check(&c, err, sizeof err) == 0, "the defaults break a rule: %s", err);
    case_end("defaults", "");
}

static void test_etc_ini(void) {
    case_begin();
    struct srv_config c, d;
    char err[4096];
    srv_config_defaults(&d);
    int rc = srv_config_load(&c, "etc/tandem.ini", err, sizeof err);
    CHECK(rc == 0, "etc/tandem.ini: %s", err);
    if (rc == 0) check_same(&c, &d, "etc/tandem.ini vs the defaults");
    case_end("etc_ini_is_defaults", "");
}

struct keyset {
    char keys[128][80];
    int n;
};

static int collect(void *user, const char *section, const char *name, const char *value) {
    struct keyset *s = user;
    (void)value;
    if (s->n < 128) snprintf(s->keys[s->n++], 80, "%s.%s", section, name);
    return 1;
}

static int has_key(const struct keyset *s, const char *k) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->keys[i], k)) return 1;
    return 0;
}

/* etc/tandem.ini names every key srv_config_ini prints, and no other */
static void test_etc_ini_every_key(void) {
    case_begin();
    static struct keyset file, all;
    struct srv_config d;
    srv_config_defaults(&d);
    char *text = srv_config_ini(&d);
    CHECK(ini_parse("etc/tandem.ini", collect, &file) == 0, "etc/tandem.ini does not parse");
    CHECK(text && ini_parse_string(text, collect, &all) == 0, "srv_config_ini does not parse");
    CHECK(all.n > 40, "srv_config_ini shows %d keys", all.n);
    for (int i = 0; i < all.n; i++)
        CHECK(has_key(&file, all.keys[i]), "etc/tandem.ini lacks %s", all.keys[i]);
    for (int i = 0; i < file.n; i++)
        CHECK(has_key(&all, file.keys[i]), "etc/tandem.ini has %s, not a key", file.keys[i]);
    CHECK(file.n == all.n, "etc/tandem.ini sets %d keys, there are %d", file.n, all.n);
    free(text);
    char extra[32];
    snprintf(extra, sizeof extra, "(%d keys)", all.n);
    case_end("etc_ini_every_key", extra);
}

// ----------------------------------------------------------------------------
// each error, with its line

static void test_errors(void) {
    expect_errors("err_unknown_section", "[server]\nport = 1\n[foo]\nx = 1\ny = 2\n",
                  (const char *const[]){"t.ini:3: unknown section [foo] (the sections: server, "
                                        "model, speculation, scheduler, sampling, limits, "
                                        "metrics, log)",
                                        NULL});
    expect_errors("err_section_case", "[Server]\nport = 1\n",
                  (const char *const[]){"t.ini:1: unknown section [Server] (section names are "
                                        "lowercase: [server])",
                                        NULL});
    expect_errors("err_unknown_key", "[server]\nport = 1\n\nprot = 2\n",
                  (const char *const[]){"t.ini:4: unknown key 'prot' in [server]", NULL});
    expect_errors("err_key_case", "[server]\nPort = 1\n",
                  (const char *const[]){"t.ini:2: unknown key 'Port' in [server] (key names are "
                                        "lowercase: port)",
                                        NULL});
    expect_errors("err_key_other_section", "[model]\nport = 1\n",
                  (const char *const[]){"t.ini:2: unknown key 'port' in [model] (port is in "
                                        "[server])",
                                        NULL});
    expect_errors(
        "err_duplicate", "[server]\nport = 1\nhost = x\nport = 2\n",
        (const char *const[]){"t.ini:4: duplicate key server.port (first set on line 2)", NULL});
    expect_errors(
        "err_duplicate_repeated_section",
        "[server]\nport = 1\n[model]\npath = /m\n[server]\nport = 1\n",
        (const char *const[]){"t.ini:6: duplicate key server.port (first set on line 2)", NULL});
    expect_errors("err_bad_int", "[server]\nport = 80x\n",
                  (const char *const[]){"t.ini:2: server.port: '80x' is not an integer", NULL});
    expect_errors("err_empty_int", "[server]\nport =\n",
                  (const char *const[]){"t.ini:2: server.port: '' is not an integer", NULL});
    expect_errors("err_hex_int", "[server]\nport = 0x50\n",
                  (const char *const[]){"t.ini:2: server.port: '0x50' is not an integer", NULL});
    expect_errors(
        "err_out_of_range", "[server]\nport = 70000\n",
        (const char *const[]){"t.ini:2: server.port: 70000 is out of range [0, 65535]", NULL});
    expect_errors("err_out_of_range_huge", "[limits]\nmax_body_bytes = 99999999999999999999\n",
                  (const char *const[]){"t.ini:2: limits.max_body_bytes: 99999999999999999999 is "
                                        "out of range [1, 1073741824]",
                                        NULL});
    expect_errors("err_double_open_ends",
                  "[sampling]\ntop_p = 0\ntemperature = 101\n[speculation]\nconfidence_min = 1\n",
                  (const char *const[]){"t.ini:2: sampling.top_p: 0 is out of range (0, 1]",
                                        "t.ini:3: sampling.temperature: 101 is out of range [0, "
                                        "100]",
                                        "t.ini:5: speculation.confidence_min: 1 is out of range "
                                        "[0, 1)",
                                        NULL});
    expect_errors("err_bad_double", "[sampling]\ntemperature = nan\ntop_p = 0.5.1\n",
                  (const char *const[]){"t.ini:2: sampling.temperature: 'nan' is not a number",
                                        "t.ini:3: sampling.top_p: '0.5.1' is not a number", NULL});
    expect_errors("err_bad_bool", "[server]\nstrict_model = maybe\n",
                  (const char *const[]){"t.ini:2: server.strict_model: 'maybe' is not a boolean "
                                        "(on, off, true, false, yes, no, 1, 0)",
                                        NULL});
    expect_errors("err_bad_enum", "[log]\nlevel = verbose\n",
                  (const char *const[]){"t.ini:2: log.level: 'verbose' is not one of error, "
                                        "warn, info, debug",
                                        NULL});
    expect_errors("err_bad_choice", "[model]\nbackend = metal\n[speculation]\nmethod = eagle\n",
                  (const char *const[]){"t.ini:2: model.backend: 'metal' is not one of auto, "
                                        "cpu, cuda",
                                        "t.ini:4: speculation.method: 'eagle' is not one of auto, "
                                        "none, ngram, random, mtp, dspark",
                                        NULL});
    expect_errors("err_no_value", "[server]\nport\n",
                  (const char *const[]){"t.ini:2: 'port' is not 'key = value'", NULL});
    expect_errors("err_before_section", "port = 1\n[server]\n",
                  (const char *const[]){"t.ini:1: 'port' before any [section]", NULL});
    expect_errors("err_no_bracket", "[server\nport = 1\n[model]\npath = /m\n",
                  (const char *const[]){"t.ini:1: a section header without ']'", NULL});
    expect_errors("err_text_after_header", "[server] x\nport = 1\n",
                  (const char *const[]){"t.ini:1: text after the section header's ']'", NULL});
    expect_errors("err_empty_host", "[server]\nhost =\n",
                  (const char *const[]){"t.ini:2: server.host: must not be empty", NULL});
    expect_errors("err_bad_utf8", "[model]\npath = /m\xff\n",
                  (const char *const[]){"t.ini:2: model.path: is not valid UTF-8", NULL});
}

/* a line of 5000 bytes is an error at its own line, and the lines after keep their numbers */
static void test_long_line(void) {
    char *text = with_run("[server]\nport = 1\nhost = %s\nbogus = 1\nmax_n = 2\n[model]\n"
                          "max_context = x\n",
                          'h', 4993); // "host = " + 4993 = 5000 bytes
    expect_errors("err_long_line", text,
                  (const char *const[]){"t.ini:3: line too long (5000 bytes, at most 4096)",
                                        "t.ini:4: unknown key 'bogus' in [server]",
                                        "t.ini:5: unknown key 'max_n' in [server] (max_n is in "
                                        "[limits])",
                                        "t.ini:7: model.max_context: 'x' is not an integer", NULL});
    free(text);
    // a long comment line is one too; the boundary: 4096 bytes pass, 4097 do not
    text = with_run(";%s\n[server]\nport = 1\n", 'c', 6000);
    expect_errors("err_long_comment", text,
                  (const char *const[]){"t.ini:1: line too long (6001 bytes, at most 4096)", NULL});
    free(text);

    case_begin();
    struct srv_config c;
    text = with_run(";%s\r\n[server]\r\nport = 9\r\n", 'c', 4095); // 4096 bytes before CR LF
    load_ok(&c, text);
    CHECK(c.port == 9, "port %d after a 4096-byte line", c.port);
    free(text);
    text = with_run(";%s\n[server]\nport = 9\n", 'c', 4096);
    char err[512];
    int rc = srv_config_load_string(&c, text, "t.ini", err, sizeof err);
    CHECK(rc == -1 && strstr(err, "t.ini:1: line too long (4097 bytes"), "4097 bytes: %s", err);
    free(text);
    // what libinih does by itself with a long line (Debian's defaults: a 200-byte buffer)
    char extra[128];
    text = with_run("[s]\nv = %s\nw = 1\n", 'x', 300);
    struct keyset raw = {.n = 0};
    int raw_rc = ini_parse_string(text, collect, &raw);
    snprintf(extra, sizeof extra, "(raw inih on a 304-byte line: %d pairs, returned %d)", raw.n,
             raw_rc);
    free(text);
    case_end("long_line_limit", extra);
}

/* an indented line is an error, not a continuation of the line before */
static void test_indented(void) {
    expect_errors(
        "err_continuation", "[server]\nport = 8080\n  indented = 1\n\tport = 2\n",
        (const char *const[]){"t.ini:3: leading whitespace", "t.ini:4: leading whitespace", NULL});
    expect_errors("err_indented_header", "[server]\n [model]\npath = /m\n",
                  (const char *const[]){"t.ini:2: leading whitespace",
                                        "t.ini:3: unknown key 'path' in [server]", NULL});
    case_begin();
    struct srv_config c;
    load_ok(&c, "[server]\n   ; an indented comment is fine\n  \nport = 8081\n");
    CHECK(c.port == 8081, "port %d", c.port);
    case_end("indented_comment_ok", "");
}

static void test_string_len(void) {
    char *text = with_run("[server]\nhost = %s\n", 'a', 600);
    expect_errors(
        "err_string_too_long", text,
        (const char *const[]){"t.ini:2: server.host: too long (600 bytes, at most 511)", NULL});
    free(text);
    case_begin();
    struct srv_config c;
    text = with_run("[model]\npath = %s\n", 'p', SRV_STR - 1);
    load_ok(&c, text);
    CHECK(strlen(c.path) == SRV_STR - 1 && c.path[SRV_STR - 2] == 'p', "path of %zu bytes",
          strlen(c.path));
    free(text);
    text = with_run("[model]\npath = %s\n", 'p', SRV_STR);
    char err[512];
    CHECK(srv_config_load_string(&c, text, "t.ini", err, sizeof err) == -1 &&
              strstr(err, "too long (512 bytes, at most 511)"),
          "512 bytes: %s", err);
    free(text);
    case_end("string_511_ok_512_not", "");
}

/* many errors in one file: every one, in line order */
static void test_many_errors(void) {
    expect_errors("err_many",
                  "; a bad file\n"
                  "[server]\n"
                  "port = 99999\n"      // 3
                  "port = 1\n"          // 4 duplicate (of a key that failed: still set on 3)
                  "hots = x\n"          // 5
                  "  cont = 1\n"        // 6
                  "[nope]\n"            // 7
                  "a = 1\n"             // skipped: [nope] was reported
                  "[sampling]\n"        // 9
                  "top_k = -1\n"        // 10
                  "ignore_eos = sure\n" // 11
                  "[log]\n"
                  "format = xml\n" // 13
                  "level\n",       // 14
                  (const char *const[]){"t.ini:3: server.port: 99999 is out of range",
                                        "t.ini:4: duplicate key server.port (first set on line 3)",
                                        "t.ini:5: unknown key 'hots'",
                                        "t.ini:6: leading whitespace",
                                        "t.ini:7: unknown section [nope]",
                                        "t.ini:10: sampling.top_k: -1 is out of range",
                                        "t.ini:11: sampling.ignore_eos: 'sure' is not a boolean",
                                        "t.ini:13: log.format: 'xml' is not one of text, jsonl",
                                        "t.ini:14: 'level' is not 'key = value'", NULL});
}

/* what inih reads as a value: comments, ':' pairs, CR LF, a BOM, values the rules allow */
static void test_syntax_ok(void) {
    case_begin();
    struct srv_config c;
    load_ok(&c, "\xEF\xBB\xBF; a comment\r\n# another\r\n[server] ; a comment\r\n"
                "host = a;b ; the comment\r\n"
                "cors_origins: http://x/#frag, http://y:8080\r\n"
                "api_key_file = /k=v\r\n"
                "strict_model = TRUE\r\n"
                "[log]\nlevel = DEBUG\nlog_requests = yes\n[model]\ngraphs = 0\nbackend = CUDA\n"
                "[sampling]\ntemperature = 5e-1\ntop_p = +.25\nmax_tokens = +7");
    CHECK(!strcmp(c.host, "a;b"), "host '%s'", c.host);
    CHECK(!strcmp(c.cors_origins, "http://x/#frag, http://y:8080"), "cors '%s'", c.cors_origins);
    CHECK(!strcmp(c.api_key_file, "/k=v"), "api_key_file '%s'", c.api_key_file);
    CHECK(c.strict_model == 1 && c.log_requests == 1 && c.graphs == 0, "booleans");
    CHECK(c.log_level == SRV_LOG_DEBUG, "level %d", (int)c.log_level);
    CHECK(!strcmp(c.backend, "cuda"), "backend '%s' (the canonical name)", c.backend);
    CHECK(c.temperature == 0.5 && c.top_p == 0.25 && c.max_tokens == 7, "numbers");
    case_end("syntax_ok", "");
}

static void test_file_errors(void) {
    case_begin();
    struct srv_config c;
    char err[512];
    int rc = srv_config_load(&c, "/nonexistent/tandem.ini", err, sizeof err);
    CHECK(rc == -1 &&
              !strcmp(err, "cannot open /nonexistent/tandem.ini: No such file or directory"),
          "missing file: %d \"%s\"", rc, err);
    rc = srv_config_load(&c, "tests", err, sizeof err);
    CHECK(rc == -1 && strstr(err, "cannot read tests: Is a directory"), "a directory: \"%s\"", err);
    // a NUL byte, on its line
    char path[] = "/tmp/test_serve_config_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd >= 0) {
        static const char body[] = "[server]\nport = 1\nhost = a\0b\nmax_n = 1\n";
        CHECK(write(fd, body, sizeof body - 1) == (ssize_t)(sizeof body - 1), "write");
        close(fd);
        rc = srv_config_load(&c, path, err, sizeof err);
        char want[128];
        snprintf(want, sizeof want, "%s:3: a NUL byte\n%s:4: unknown key 'max_n'", path, path);
        CHECK(rc == -1 && strstr(err, want), "NUL: \"%s\"", err);
        unlink(path);
    }
    case_end("file_errors", "");
}

/* err too short: as much as fits, then "..."; never past errlen */
static void test_truncation(void) {
    case_begin();
    const char *text = "[server]\nport = x\nhost =\nmax_n = 1\n";
    struct srv_config c;
    char big[1024], small[200];
    memset(small, '#', sizeof small);
    srv_config_load_string(&c, text, "t.ini", big, sizeof big);
    int rc = srv_config_load_string(&c, text, "t.ini", small, 30);
    CHECK(rc == -1, "rc %d", rc);
    CHECK(strlen(small) == 29, "%zu bytes in a 30-byte buffer", strlen(small));
    CHECK(!strncmp(small, big, 26) && !strcmp(small + 26, "..."), "\"%s\" vs \"%s\"", small, big);
    CHECK(small[30] == '#', "wrote past errlen");
    rc = srv_config_load_string(&c, text, "t.ini", small, 3);
    CHECK(rc == -1 && !strcmp(small, ".."), "errlen 3: \"%s\"", small);
    rc = srv_config_load_string(&c, text, "t.ini", NULL, 0);
    CHECK(rc == -1, "err NULL: rc %d", rc);
    // the first line fits, the second does not
    size_t first = strcspn(big, "\n");
    rc = srv_config_load_string(&c, text, "t.ini", small, first + 6);
    CHECK(!strncmp(small, big, first + 2) && strlen(small) == first + 5 &&
              !strcmp(small + first + 2, "..."),
          "\"%s\"", small);
    case_end("err_truncated", "");
}

// ----------------------------------------------------------------------------
// overrides

static void expect_set_error(struct srv_config *c, const char *a, const char *origin,
                             const char *want) {
    char err[512];
    int rc = srv_config_set(c, a, origin, err, sizeof err);
    if (verbose()) printf("  %s: %s\n", a, err);
    CHECK(rc == -1 && !strcmp(err, want), "%s: %d \"%s\", want \"%s\"", a, rc, err, want);
}

static void test_set(void) {
    case_begin();
    struct srv_config c;
    char err[512];
    load_ok(&c, "[server]\nport = 1000\n[model]\npath = /from/file\n");
    CHECK(srv_config_set(&c, "server.port=9000", NULL, err, sizeof err) == 0 && !err[0], "%s", err);
    CHECK(srv_config_set(&c, " model.path = /m ; x ", "--set", err, sizeof err) == -1, "' ;'");
    CHECK(srv_config_set(&c, " model.path = /m ", "--set", err, sizeof err) == 0, "%s", err);
    CHECK(srv_config_set(&c, "sampling.top_p=0.5", NULL, err, sizeof err) == 0, "%s", err);
    CHECK(srv_config_set(&c, "model.graphs=off", NULL, err, sizeof err) == 0, "%s", err);
    CHECK(srv_config_set(&c, "metrics.per_request=detailed", NULL, err, sizeof err) == 0, "%s",
          err);
    CHECK(srv_config_set(&c, "server.cors_origins=a=b", NULL, err, sizeof err) == 0, "%s", err);
    CHECK(c.port == 9000 && !strcmp(c.path, "/m") && c.top_p == 0.5 && !c.graphs &&
              c.per_request == SRV_PER_REQUEST_DETAILED && !strcmp(c.cors_origins, "a=b"),
          "values after --set");
    expect_set_error(&c, "server.port=abc", NULL, "--set server.port: 'abc' is not an integer");
    expect_set_error(&c, "server.port=70000", "--port",
                     "--port server.port: 70000 is out of range [0, 65535]");
    expect_set_error(&c, "server.nope=1", NULL,
                     "--set server.nope: unknown key (tandem serve --help-config lists the keys)");
    expect_set_error(
        &c, "nope.port=1", NULL,
        "--set nope.port: unknown section (tandem serve --help-config lists the keys)");
    expect_set_error(&c, "port=1", NULL, "--set port=1: expected section.key=value");
    expect_set_error(&c, "server.port", NULL, "--set server.port: expected section.key=value");
    expect_set_error(&c, "server.host=", NULL, "--set server.host: must not be empty");
    expect_set_error(&c, "server.host=a\tb", NULL,
                     "--set server.host: contains a control character");
    expect_set_error(&c, "log.level=loud", NULL,
                     "--set log.level: 'loud' is not one of error, warn, info, debug");
    CHECK(c.port == 9000 && !strcmp(c.host, "127.0.0.1"), "a failed --set changed a value");
    // the rules across keys run on the final configuration
    CHECK(srv_config_set(&c, "speculation.k=8", NULL, err, sizeof err) == 0, "%s", err);
    CHECK(srv_config_set(&c, "scheduler.max_batch_tokens=4", NULL, err, sizeof err) == 0, "%s",
          err);
    CHECK(srv_config_check(&c, err, sizeof err) == -1 &&
              !strcmp(err, "scheduler.max_batch_tokens = 4 is less than 1 + speculation.k = 9: "
                           "a step could not verify one sequence's drafts"),
          "check: \"%s\"", err);
    case_end("set", "");
}

static void test_env(void) {
    case_begin();
    struct srv_config c, d;
    char err[1024];
    srv_config_defaults(&c);
    char *ok_env[] = {"PATH=/bin",
                      "TANDEM_SERVER_PORT=9001",
                      "TANDEM_LOG_LEVEL=debug",
                      "TANDEM_METRICS_ENABLED=off",
                      "TANDEM_LOG_LOG_REQUESTS=on",
                      "TANDEM_SCHEDULER_MAX_CACHE_MIB=2048",
                      "TANDEM_MODEL_PATH=/models/x",
                      "TANDEM_HOME=/elsewhere", // not ours: left alone
                      "tandem_server_port=1",   // not ours either
                      NULL};
    int rc = srv_config_env(&c, ok_env, err, sizeof err);
    CHECK(rc == 0 && !err[0], "env: %d %s", rc, err);
    CHECK(c.port == 9001 && c.log_level == SRV_LOG_DEBUG && !c.metrics_enabled && c.log_requests &&
              c.max_cache_mib == 2048 && !strcmp(c.path, "/models/x"),
          "values after env");
    char *bad_env[] = {"TANDEM_SERVER_PORT=x", "TANDEM_SERVER_PROT=1", "TANDEM_LIMITS_MAX_N=0",
                       "TANDEM_LOG_LEVEL=debug", NULL};
    srv_config_defaults(&d);
    rc = srv_config_env(&d, bad_env, err, sizeof err);
    if (verbose()) printf("  env errors:\n%s\n", err);
    CHECK(rc == -1, "rc %d", rc);
    CHECK(!strcmp(err, "TANDEM_SERVER_PORT (server.port): 'x' is not an integer\n"
                       "TANDEM_SERVER_PROT: no such key in [server] (tandem serve --help-config "
                       "lists the keys)\n"
                       "TANDEM_LIMITS_MAX_N (limits.max_n): 0 is out of range [1, 128]"),
          "env errors: \"%s\"", err);
    CHECK(d.log_level == SRV_LOG_DEBUG, "the good variable was not applied");
    case_end("env", "");
}

/* every mapped flag names a key srv_config_set takes */
static void test_flags(void) {
    case_begin();
    static const char *const map[][3] = {
        {"--draft", "speculation.method", "ngram"},
        {"--port", "server.port", "9"},
        {"--model", "model.path", "/m"},
        {"-m", "model.path", "/m"},
        {"--host", "server.host", "0.0.0.0"},
        {"--backend", "model.backend", "cpu"},
        {"--ranks", "model.ranks", "2"},
        {"--draft-tokens", "speculation.k", "3"},
        {"--dspark-dir", "speculation.dspark_dir", "/d"},
        {"--dspark-threshold", "speculation.confidence_min", "0.5"},
        {"--max-batch-tokens", "scheduler.max_batch_tokens", "64"},
        {"--max-ctx", "model.max_context", "2048"},
        {"--max-seqs", "scheduler.max_running", "4"},
        {"--temperature", "sampling.temperature", "0"},
        {"--top-k", "sampling.top_k", "40"},
        {"--top-p", "sampling.top_p", "0.9"},
        {"--max-tokens", "sampling.max_tokens", "100"},
        {"--api-key-file", "server.api_key_file", "/keys"},
    };
    struct srv_config c, d;
    srv_config_defaults(&c);
    srv_config_defaults(&d);
    char err[512], a[256];
    for (size_t i = 0; i < sizeof map / sizeof *map; i++) {
        const char *k = srv_config_flag_key(map[i][0]);
        CHECK(k && !strcmp(k, map[i][1]), "%s -> %s, want %s", map[i][0], k ? k : "NULL",
              map[i][1]);
        CHECK(!srv_config_flag_bool(map[i][0]), "%s is a value flag", map[i][0]);
        snprintf(a, sizeof a, "%s=%s", k ? k : "?", map[i][2]);
        CHECK(srv_config_set(&c, a, map[i][0], err, sizeof err) == 0, "%s: %s", a, err);
    }
    CHECK(c.port == 9 && !strcmp(c.method, "ngram") && c.k == 3 && c.top_k == 40 &&
              c.max_running == 4 && c.confidence_min == 0.5,
          "values after the flags");
    static const char *const bools[][2] = {{"--deterministic", "model.deterministic=on"},
                                           {"--no-graphs", "model.graphs=off"},
                                           {"--dummy-weights", "model.dummy_weights=on"},
                                           {"--ignore-eos", "sampling.ignore_eos=on"}};
    for (size_t i = 0; i < sizeof bools / sizeof *bools; i++) {
        const char *s = srv_config_flag_bool(bools[i][0]);
        CHECK(s && !strcmp(s, bools[i][1]), "%s -> %s", bools[i][0], s ? s : "NULL");
        CHECK(!srv_config_flag_key(bools[i][0]), "%s is a boolean flag", bools[i][0]);
        CHECK(s && srv_config_set(&d, s, bools[i][0], err, sizeof err) == 0, "%s: %s", s, err);
    }
    CHECK(d.deterministic && !d.graphs && d.dummy_weights && d.ignore_eos, "booleans");
    const char *none[] = {"--seed", "--port=9", "port", "--n", "", "--stats", "-M"};
    for (size_t i = 0; i < sizeof none / sizeof *none; i++)
        CHECK(!srv_config_flag_key(none[i]) && !srv_config_flag_bool(none[i]), "'%s' mapped",
              none[i]);
    case_end("flags", "");
}

// ----------------------------------------------------------------------------
// printing, JSON, hash, cross-key rules, help

/* a configuration with every key away from its default */
static int all_changed(struct srv_config *c) {
    static const char *const sets[] = {
        "server.host=::1",
        "server.port=0",
        "server.api_key_file=/etc/keys; x",
        "server.served_model_name=tiny #1",
        "server.strict_model=on",
        "server.max_connections=9999",
        "server.per_ip_connections=3",
        "server.idle_timeout_s=0",
        "server.request_timeout_s=0",
        "server.sse_ping_s=1",
        "server.drain_s=0",
        "server.cors_origins=*",
        "server.web_ui=off",
        "server.web_ui_dir=/w eb",
        "model.path=/m/\xc3\xbc:x=y",
        "model.max_context=16777216",
        "model.backend=cpu",
        "model.kv_dtype=fp8",
        "model.dummy_weights=on",
        "model.deterministic=on",
        "model.graphs=off",
        "model.ranks=2",
        "model.gpus=4",
        "speculation.method=dspark",
        "speculation.k=16",
        "speculation.dspark_dir=/d",
        "speculation.confidence_min=0.3333333333333333",
        "speculation.policy=fixed",
        "scheduler.max_running=4096",
        "scheduler.max_batch_tokens=1048576",
        "scheduler.prefill_chunk=512",
        "scheduler.prefix_blocks=64",
        "scheduler.history_blocks=4096",
        "scheduler.max_cache_mib=67108864",
        "sampling.temperature=0.1",
        "sampling.top_p=1e-9",
        "sampling.top_k=2147483647",
        "sampling.max_tokens=1",
        "sampling.completion_max_tokens=16777216",
        "sampling.ignore_eos=on",
        "limits.max_waiting=0",
        "limits.max_prompt_tokens=16777215",
        "limits.max_n=128",
        "limits.max_stop=0",
        "limits.max_stop_len=4096",
        "limits.max_body_bytes=1073741824",
        "limits.max_stream_buffer_bytes=4096",
        "metrics.enabled=off",
        "metrics.vllm_compat=on",
        "metrics.per_request=summary",
        "log.level=error",
        "log.format=jsonl",
        "log.file=/var/log/t.log",
        "log.log_requests=on",
    };
    srv_config_defaults(c);
    char err[512];
    for (size_t i = 0; i < sizeof sets / sizeof *sets; i++) {
        if (srv_config_set(c, sets[i], NULL, err, sizeof err)) {
            CHECK(0, "%s: %s", sets[i], err);
            return -1;
        }
    }
    return (int)(sizeof sets / sizeof *sets);
}

static void test_ini_roundtrip(void) {
    case_begin();
    struct srv_config c, d, e;
    int n = all_changed(&c);
    srv_config_defaults(&e);
    char *text = srv_config_ini(&c), *dtext = srv_config_ini(&e);
    CHECK(text && dtext, "srv_config_ini returned NULL");
    // every key changed: no line of the two texts is the same, but the section headers
    int same = 0;
    for (const char *p = text; text && dtext && *p;
         p += strcspn(p, "\n") + (p[strcspn(p, "\n")] != 0)) {
        char line[700];
        snprintf(line, sizeof line, "\n%.*s\n", (int)strcspn(p, "\n"), p);
        same += !strchr("[;\n", line[1]) && strstr(dtext, line) != NULL;
    }
    CHECK(same == 0, "%d key lines of the changed configuration are the defaults'", same);
    if (text) {
        char err[1024];
        int rc = srv_config_load_string(&d, text, "ini", err, sizeof err);
        CHECK(rc == 0, "reading srv_config_ini back: %s\n%s", err, text);
        if (!rc) check_same(&c, &d, "read back");
        rc = srv_config_load_string(&d, dtext, "ini", err, sizeof err);
        CHECK(rc == 0, "reading the defaults back: %s", err);
        if (!rc) check_same(&e, &d, "defaults read back");
        CHECK(strstr(text, "\nconfidence_min = 0.3333333333333333\n") &&
                  strstr(text, "\ntemperature = 0.1\n") && strstr(dtext, "\ntop_p = 1.0\n") &&
                  strstr(dtext, "\napi_key_file =\n") && strstr(dtext, "\ngraphs = on\n") &&
                  strstr(text, "\napi_key_file = /etc/keys; x\n"),
              "the text:\n%s", text);
    }
    free(text);
    free(dtext);
    char extra[32];
    snprintf(extra, sizeof extra, "(%d keys changed)", n);
    case_end("ini_roundtrip", extra);
}

static void test_hash(void) {
    case_begin();
    struct srv_config c, d;
    srv_config_defaults(&c);
    srv_config_defaults(&d);
    unsigned long long h0 = srv_config_hash(&c);
    CHECK(h0 == srv_config_hash(&d), "equal configurations, different hashes");
    c.port = 8081;
    CHECK(srv_config_hash(&c) != h0, "port changed, same hash");
    c.port = 8080;
    CHECK(srv_config_hash(&c) == h0, "port back, different hash");
    snprintf(c.path, sizeof c.path, "/m");
    CHECK(srv_config_hash(&c) != h0, "path changed, same hash");
    srv_config_defaults(&c);
    c.temperature = 0.7;
    CHECK(srv_config_hash(&c) != h0, "temperature changed, same hash");
    srv_config_defaults(&c);
    c.log_format = SRV_LOG_JSONL;
    CHECK(srv_config_hash(&c) != h0, "log.format changed, same hash");
    char extra[40];
    snprintf(extra, sizeof extra, "(defaults %016llx)", h0);
    case_end("hash", extra);
}

static void test_json(void) {
    case_begin();
    struct srv_config c;
    srv_config_defaults(&c);
    json_t *j = srv_config_json(&c);
    CHECK(j && json_is_object(j), "not an object");
    if (j) {
        json_t *port = json_object_get(json_object_get(j, "server"), "port");
        json_t *graphs = json_object_get(json_object_get(j, "model"), "graphs");
        json_t *temp = json_object_get(json_object_get(j, "sampling"), "temperature");
        json_t *level = json_object_get(json_object_get(j, "log"), "level");
        json_t *en = json_object_get(json_object_get(j, "metrics"), "enabled");
        json_t *keyf = json_object_get(json_object_get(j, "server"), "api_key_file");
        json_t *bytes = json_object_get(json_object_get(j, "limits"), "max_body_bytes");
        CHECK(json_is_integer(port) && json_integer_value(port) == 8080, "server.port");
        CHECK(json_is_true(graphs) && json_is_true(en), "booleans");
        CHECK(json_is_real(temp) && json_real_value(temp) == 1.0, "sampling.temperature");
        CHECK(json_is_string(level) && !strcmp(json_string_value(level), "info"), "log.level");
        CHECK(json_is_string(keyf) && !strcmp(json_string_value(keyf), ""), "api_key_file");
        CHECK(json_integer_value(bytes) == 8388608, "limits.max_body_bytes");
        size_t n = 0;
        const char *sec;
        json_t *v;
        json_object_foreach(j, sec, v) n += json_object_size(v);
        CHECK(json_object_size(j) == 8 && n > 40, "%zu sections, %zu keys", json_object_size(j), n);
        json_decref(j);
    }
    case_end("json", "");
}

static void test_cross(void) {
    expect_errors("err_cross_k_batch", "[scheduler]\nmax_batch_tokens = 4\n[speculation]\nk = 8\n",
                  (const char *const[]){"t.ini:4: scheduler.max_batch_tokens = 4 is less than 1 + "
                                        "speculation.k = 9",
                                        NULL});
    expect_errors("err_cross_k_none", "[speculation]\nk = 2\nmethod = none\n",
                  (const char *const[]){"t.ini:3: speculation.k = 2 needs a drafter, but "
                                        "speculation.method = none",
                                        NULL});
    expect_errors("err_cross_dspark",
                  "[speculation]\nmethod = ngram\nconfidence_min = 0.5\n"
                  "dspark_dir = /d\n",
                  (const char *const[]){"t.ini:3: speculation.confidence_min needs "
                                        "speculation.method = dspark (or auto), not ngram",
                                        "t.ini:4: speculation.dspark_dir needs speculation.method "
                                        "= dspark (or auto), not ngram",
                                        NULL});
    expect_errors("err_cross_prompt",
                  "[model]\nmax_context = 100\n[limits]\nmax_prompt_tokens = 100\n",
                  (const char *const[]){"t.ini:4: limits.max_prompt_tokens = 100 must be less than "
                                        "model.max_context = 100",
                                        NULL});
    expect_errors("err_cross_connections", "[limits]\nmax_waiting = 600\n",
                  (const char *const[]){"t.ini:2: server.max_connections = 512 must exceed "
                                        "limits.max_waiting + scheduler.max_running = 616",
                                        NULL});
    case_begin();
    struct srv_config c;
    load_ok(&c, "[limits]\nmax_prompt_tokens = 4095\n[speculation]\nk = 16\nmethod = mtp\n");
    CHECK(c.k == 16 && c.max_prompt_tokens == 4095, "values");
    case_end("cross_ok", "");
}

/* srv_config_load leaves libinih's globals as it found them */
static void test_inih_globals(void) {
    case_begin();
    struct srv_config c;
    int max_line = ini_max_line;
    bool multiline = ini_allow_multiline, stack = ini_use_stack, noval = ini_allow_no_value;
    char *prefixes = ini_start_comment_prefixes;
    char err[256];
    srv_config_load_string(&c, "[server]\nport = 1\n", "t.ini", err, sizeof err);
    srv_config_load(&c, "etc/tandem.ini", err, sizeof err);
    CHECK(ini_max_line == max_line && ini_allow_multiline == multiline && ini_use_stack == stack &&
              ini_allow_no_value == noval && ini_start_comment_prefixes == prefixes,
          "globals changed: max_line %d, multiline %d, stack %d, no_value %d", ini_max_line,
          ini_allow_multiline, ini_use_stack, ini_allow_no_value);
    case_end("inih_globals_restored", "");
}

static void test_help(void) {
    case_begin();
    char *text = NULL, *ini;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    srv_config_help(f);
    fclose(f);
    struct srv_config c;
    srv_config_defaults(&c);
    ini = srv_config_ini(&c);
    CHECK(strstr(text, "  server.port = 8080    (integer in [0, 65535])\n"), "server.port");
    CHECK(strstr(text, "  sampling.top_p = 1.0    (number in (0, 1])\n"), "sampling.top_p");
    CHECK(strstr(text, "  model.backend = auto    (auto | cpu | cuda)\n"), "model.backend");
    CHECK(strstr(text, "  log.file = (empty)    (string)\n"), "log.file");
    // every key of the INI text is in the help
    const char *sec = "";
    char cur[64] = "", want[160];
    for (char *p = ini; p && *p; p += strcspn(p, "\n") + (p[strcspn(p, "\n")] != 0)) {
        size_t n = strcspn(p, "\n");
        if (*p == '[') {
            snprintf(cur, sizeof cur, "%.*s", (int)(n - 2), p + 1);
            sec = cur;
        } else if (*p != ';' && n) {
            snprintf(want, sizeof want, "  %s.%.*s = ", sec, (int)strcspn(p, " "), p);
            CHECK(strstr(text, want), "help lacks '%s'", want);
        }
    }
    if (verbose()) fputs(text, stdout);
    free(text);
    free(ini);
    case_end("help", "");
}

int main(void) {
    test_defaults();
    test_etc_ini();
    test_etc_ini_every_key();
    test_errors();
    test_long_line();
    test_indented();
    test_string_len();
    test_many_errors();
    test_syntax_ok();
    test_file_errors();
    test_truncation();
    test_set();
    test_env();
    test_flags();
    test_ini_roundtrip();
    test_hash();
    test_json();
    test_cross();
    test_inih_globals();
    test_help();
    return check_failures ? 1 : 0;
}
