/* config.c: the INI configuration of `tandem serve` (design/server.md §3.4).
 *
 * One table, keys[] below, holds every key: section, name, type, field, range, enum names,
 * default (as INI text) and a one-line doc. Defaults, the file, --set, the environment, the INI
 * and JSON printers, the hash and --help-config all walk it; nothing here is written per key
 * except the few rules across keys (cross_check).
 *
 * The file goes through libinih (Debian's libinih 55) with our own line reader
 * (ini_parse_stream). The reader hands inih one physical line per call, so it knows each line's
 * number when inih calls on_pair for it, and it vets the lines inih would take silently or
 * without a callback:
 *   - a line over SRV_LINE_MAX bytes: inih's buffer is ini_max_line bytes and a longer line is
 *     cut into pieces parsed as lines of their own (Debian's default 200: a 5000-byte value
 *     became 26 "lines" and every later line number moved by 25). We make the buffer larger
 *     than SRV_LINE_MAX, and the reader reports a longer line and hands inih an empty one;
 *   - an indented line: with multi-line values on, inih appends it to the previous key; off,
 *     it is an ordinary pair. Either way it is reported here, once, and dropped;
 *   - a section header: inih calls no handler for one, ignores text after ']' and keeps the
 *     previous section after a broken one. The reader checks the header, and a bad or unknown
 *     one reaches inih as [SECTION_REPORTED], whose keys on_pair skips (one error, not one per
 *     key).
 * on_pair returns 1 even after an error: inih stops handing no-value lines ("port" alone) to
 * the handler once any error is recorded (verified with Debian's build).
 */
#include "serve/config.h"
#include "kernels/err.h"

#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "draft/drafter.h"
#include "kernels/err.h"

/* enum fields are read and written as int */
_Static_assert(sizeof(enum srv_per_request) == sizeof(int), "enum size");
_Static_assert(sizeof(enum srv_log_format) == sizeof(int), "enum size");
_Static_assert(sizeof(enum srv_log_level) == sizeof(int), "enum size");

// ---------------------------------------------------------------------------------------------
// the key table

enum key_type { KEY_INT, KEY_LONG, KEY_DOUBLE, KEY_BOOL, KEY_STRING, KEY_ENUM };

enum {
    KEY_MIN_OPEN = 1u << 0, /* the range excludes min */
    KEY_MAX_OPEN = 1u << 1, /* the range excludes max */
    KEY_NONEMPTY = 1u << 2, /* a string that may not be "" */
};

struct key {
    const char *section, *name;
    enum key_type type;
    size_t off, size; /* the field in struct srv_config */
    double min, max;  /* numbers: the range, closed unless KEY_MIN_OPEN / KEY_MAX_OPEN */
    unsigned flags;
    const char *const *names; /* KEY_ENUM: the values in enum order; KEY_STRING: the values
                                 allowed, or NULL for any; NULL-terminated */
    const char *def;          /* the default, as INI text */
    const char *doc;          /* one line for --help-config */
};

static const char *const backend_names[] = {"auto", "cpu", "cuda", NULL};
static const char *const kv_names[] = {"fp32", "bf16", "fp8", NULL};
static const char *const per_request_names[] = {"none", "summary", "detailed", NULL};
static const char *const level_names[] = {"error", "warn", "info", "debug", NULL};
static const char *const format_names[] = {"text", "jsonl", NULL};
static const char *const web_ui_names[] = {"auto", "on", "off", NULL};
static const char *const policy_names[] = {"adaptive", "fixed", NULL};

#define SIZE_OF(f)           sizeof(((struct srv_config *)0)->f)
#define FIELD(f)             .off = offsetof(struct srv_config, f), .size = SIZE_OF(f)
#define K(sec, key, kind, f) .section = sec, .name = key, .type = kind, FIELD(f)
#define RANGE(lo, hi)        .min = lo, .max = hi

static const struct key keys[] = {
    // [server]
    {K("server", "host", KEY_STRING, host), .flags = KEY_NONEMPTY, .def = "127.0.0.1",
     .doc = "address to bind: an IPv4 or IPv6 literal or a host name (0.0.0.0 = every interface)"},
    {K("server", "port", KEY_INT, port), RANGE(0, 65535), .def = "8080",
     .doc = "TCP port; 0 = any free port (the server prints the one it bound)"},
    {K("server", "api_key_file", KEY_STRING, api_key_file), .def = "",
     .doc = "file of API keys, one per line, '#' comments; empty = no authentication"},
    {K("server", "served_model_name", KEY_STRING, served_model_name), .def = "",
     .doc = "the model id /v1/models lists; empty = the basename of model.path"},
    {K("server", "strict_model", KEY_BOOL, strict_model), .def = "off",
     .doc = "on = 404 when a request names another model (vLLM); off = any name (llama.cpp)"},
    {K("server", "max_connections", KEY_INT, max_connections), RANGE(1, 65536), .def = "512",
     .doc = "open connections at most; more than limits.max_waiting + scheduler.max_running"},
    {K("server", "per_ip_connections", KEY_INT, per_ip_connections), RANGE(0, 65536), .def = "0",
     .doc = "open connections per client address; 0 = unlimited"},
    {K("server", "idle_timeout_s", KEY_INT, idle_timeout_s), RANGE(0, 86400), .def = "30",
     .doc = "close a keep-alive connection idle this long; 0 = never (streams never time out)"},
    {K("server", "request_timeout_s", KEY_INT, request_timeout_s), RANGE(0, 604800), .def = "1800",
     .doc = "wall-clock limit of one request; 0 = none"},
    {K("server", "sse_ping_s", KEY_INT, sse_ping_s), RANGE(1, 3600), .def = "10",
     .doc = "while a stream is silent, an SSE comment ping (and a check the client is there)"},
    {K("server", "drain_s", KEY_INT, drain_s), RANGE(0, 3600), .def = "30",
     .doc = "after SIGTERM, running requests get this long to finish, then are cancelled"},
    {K("server", "cors_origins", KEY_STRING, cors_origins), .def = "",
     .doc = "origins CORS allows: a comma-separated list or *; empty = no CORS headers"},
    {K("server", "web_ui", KEY_ENUM, web_ui), .names = web_ui_names, .def = "auto",
     .doc = "the chat page at GET /: on | off | auto (on when host is a loopback address)"},
    {K("server", "web_ui_dir", KEY_STRING, web_ui_dir), .def = "",
     .doc = "serve DIR/index.html at / instead of the page built into the binary"},
    // [model]
    {K("model", "path", KEY_STRING, path), .def = "",
     .doc = "the model directory; empty = the default model (models/tandem-tiny)"},
    {K("model", "max_context", KEY_INT, max_context), RANGE(2, 16777216), .def = "4096",
     .doc = "tokens per sequence, prompt and output (capped by the model)"},
    {K("model", "backend", KEY_STRING, backend), .names = backend_names, .def = "auto",
     .doc = "where the steps run; auto = cuda when a GPU is usable, else cpu"},
    {K("model", "kv_dtype", KEY_STRING, kv_dtype), .names = kv_names, .def = "fp32",
     .doc =
         "the key caches' precision: fp32 | bf16 | fp8 (e4m3 with per-64 scales, RoPE dims bf16)"},
    {K("model", "dummy_weights", KEY_BOOL, dummy_weights), .def = "off",
     .doc = "on = generated weights of the model's shapes, no safetensors read (benchmarks)"},
    {K("model", "deterministic", KEY_BOOL, deterministic), .def = "off",
     .doc = "on = batch-invariant kernels (GPU; the CPU always is)"},
    {K("model", "graphs", KEY_BOOL, graphs), .def = "on",
     .doc = "off = run every GPU step eagerly (no CUDA graph replay)"},
    {K("model", "ranks", KEY_INT, ranks), RANGE(1, 64), .def = "1",
     .doc = "split the model's experts over this many processes of this host, started by the "
            "server (a divisor of the routed experts; the CPU backend)"},
    {K("model", "gpus", KEY_INT, gpus), RANGE(0, 64), .def = "0",
     .doc = "split the model's experts over this many GPUs of this host, one process each, "
            "summed by NCCL (the cuda backend); 0 = one GPU, no split"},
    // [speculation]
    {K("speculation", "method", KEY_STRING, method), .names = draft_names, .def = "auto",
     .doc = "the drafter; auto, on the GPU: dspark when the model has one (its own files or "
            "dspark/), else mtp when it has an MTP layer, else none; on the CPU none"},
    {K("speculation", "k", KEY_INT, k), RANGE(0, 16), .def = "0",
     .doc = "draft tokens per round; 0 = the drafter's default"},
    {K("speculation", "dspark_dir", KEY_STRING, dspark_dir), .def = "",
     .doc = "the DSpark drafter's directory; empty = the model's own stages, else "
            "model.path/dspark"},
    {K("speculation", "confidence_min", KEY_DOUBLE, confidence_min), RANGE(0, 1),
     .flags = KEY_MAX_OPEN, .def = "0.0",
     .doc = "DSpark: verify only the drafts before the first below this confidence; 0 = all"},
    {K("speculation", "policy", KEY_ENUM, policy), .names = policy_names, .def = "adaptive",
     .doc = "adaptive: each step verifies the drafts that pay (measured acceptance and step "
            "times); fixed: every draft"},
    // [scheduler]
    {K("scheduler", "max_running", KEY_INT, max_running), RANGE(1, 4096), .def = "16",
     .doc = "sequences decoding at once"},
    {K("scheduler", "max_batch_tokens", KEY_INT, max_batch_tokens), RANGE(1, 1048576), .def = "256",
     .doc = "token rows per forward step (prefill and decode together)"},
    {K("scheduler", "prefill_chunk", KEY_INT, prefill_chunk), RANGE(0, 1048576), .def = "0",
     .doc = "prompt rows a step takes at most, so a long prompt does not stall the decodes "
            "beside it; 0 = as many as the row budget leaves"},
    {K("scheduler", "prefix_blocks", KEY_INT, prefix_blocks), RANGE(0, 16777216), .def = "0",
     .doc = "prefix cache: blocks of 256 tokens (prompts' and replies') kept for reuse, each "
            "with a checkpoint of its windows; 0 = off"},
    {K("scheduler", "history_blocks", KEY_INT, history_blocks), RANGE(0, 16777216), .def = "0",
     .doc = "the compressed history's pool in blocks of 256 tokens, shared by every request (a "
            "request waits for the blocks its prompt and max_tokens reach); 0 = max_running x "
            "max_context / 256, or as many as the cache memory holds when that is less"},
    {K("scheduler", "max_cache_mib", KEY_LONG, max_cache_mib), RANGE(0, 67108864), .def = "0",
     .doc = "KV cache memory in MiB; 0 = automatic"},
    // [sampling]
    {K("sampling", "temperature", KEY_DOUBLE, temperature), RANGE(0, 100), .def = "1.0",
     .doc = "when a request gives none; 0 = greedy"},
    {K("sampling", "top_p", KEY_DOUBLE, top_p), RANGE(0, 1), .flags = KEY_MIN_OPEN, .def = "1.0",
     .doc = "nucleus mass when a request gives none; 1 = off"},
    {K("sampling", "top_k", KEY_INT, top_k), RANGE(0, 2147483647), .def = "0",
     .doc = "keep the k most likely tokens when a request gives none; 0 = off"},
    {K("sampling", "max_tokens", KEY_INT, max_tokens), RANGE(1, 16777216), .def = "4096",
     .doc = "/v1/chat/completions: output tokens when a request gives no limit"},
    {K("sampling", "completion_max_tokens", KEY_INT, completion_max_tokens), RANGE(1, 16777216),
     .def = "16",
     .doc = "/v1/completions: output tokens when a request gives no limit (vLLM's 16)"},
    {K("sampling", "ignore_eos", KEY_BOOL, ignore_eos), .def = "off",
     .doc = "on = do not stop at EOS tokens unless a request says so"},
    // [limits]
    {K("limits", "max_waiting", KEY_INT, max_waiting), RANGE(0, 1000000), .def = "256",
     .doc = "requests queued for a slot; beyond this: 429 with Retry-After"},
    {K("limits", "max_prompt_tokens", KEY_INT, max_prompt_tokens), RANGE(0, 16777216), .def = "0",
     .doc = "prompt tokens at most; 0 = model.max_context - 1"},
    {K("limits", "max_n", KEY_INT, max_n), RANGE(1, 128), .def = "8",
     .doc = "completions per request (n)"},
    {K("limits", "max_stop", KEY_INT, max_stop), RANGE(0, 64), .def = "4",
     .doc = "stop strings per request"},
    {K("limits", "max_stop_len", KEY_INT, max_stop_len), RANGE(1, 4096), .def = "128",
     .doc = "bytes per stop string"},
    {K("limits", "max_body_bytes", KEY_LONG, max_body_bytes), RANGE(1, 1073741824),
     .def = "8388608", .doc = "request body bytes; beyond this: 413"},
    {K("limits", "max_stream_buffer_bytes", KEY_LONG, max_stream_buffer_bytes),
     RANGE(4096, 1073741824), .def = "4194304",
     .doc = "unsent stream bytes per request; a client that lets more pile up is cancelled"},
    // [metrics]
    {K("metrics", "enabled", KEY_BOOL, metrics_enabled), .def = "on",
     .doc = "serve GET /metrics (Prometheus text)"},
    {K("metrics", "vllm_compat", KEY_BOOL, vllm_compat), .def = "off",
     .doc = "also export the vllm:* names (vLLM dashboards, vllm bench)"},
    {K("metrics", "per_request", KEY_ENUM, per_request), .names = per_request_names, .def = "none",
     .doc = "timing and speculation figures in each response body"},
    // [log]
    {K("log", "level", KEY_ENUM, log_level), .names = level_names, .def = "info",
     .doc = "the least severe message logged"},
    {K("log", "format", KEY_ENUM, log_format), .names = format_names, .def = "text",
     .doc = "text lines or one JSON object a line"},
    {K("log", "file", KEY_STRING, log_file), .def = "", .doc = "the log file; empty = stderr"},
    {K("log", "log_requests", KEY_BOOL, log_requests), .def = "off",
     .doc = "one line per request is always logged; on = the prompt text too"},
};

#define NKEYS ((int)(sizeof keys / sizeof *keys))

static const char *const bool_true[] = {"on", "true", "yes", "1", NULL};
static const char *const bool_false[] = {"off", "false", "no", "0", NULL};

static void *field(struct srv_config *c, const struct key *k) {
    return (char *)c + k->off;
}
static const void *cfield(const struct srv_config *c, const struct key *k) {
    return (const char *)c + k->off;
}

static int key_find(const char *section, const char *name) {
    for (int i = 0; i < NKEYS; i++)
        if (!strcmp(keys[i].section, section) && !strcmp(keys[i].name, name)) return i;
    return -1;
}

/* the section s[0..n) is one of the table's */
static int section_known(const char *s, size_t n) {
    for (int i = 0; i < NKEYS; i++)
        if (strlen(keys[i].section) == n && !memcmp(keys[i].section, s, n)) return 1;
    return 0;
}

/* "server, model, ..." */
static void section_list(char *out, size_t n) {
    size_t len = 0;
    out[0] = 0;
    for (int i = 0; i < NKEYS && len < n; i++)
        if (i == 0 || strcmp(keys[i].section, keys[i - 1].section))
            len += snprintf(out + len, n - len, "%s%s", i ? ", " : "", keys[i].section);
}

/* "a, b, c" (sep ", ") or "a | b | c" */
static void names_list(const char *const *names, const char *sep, char *out, size_t n) {
    size_t len = 0;
    out[0] = 0;
    for (int i = 0; names[i] && len < n; i++)
        len += snprintf(out + len, n - len, "%s%s", i ? sep : "", names[i]);
}

/* "[0, 65535]", "(0, 1]" */
static void range_text(const struct key *k, char *out, size_t n) {
    char lo = k->flags & KEY_MIN_OPEN ? '(' : '[', hi = k->flags & KEY_MAX_OPEN ? ')' : ']';
    if (k->type == KEY_DOUBLE)
        snprintf(out, n, "%c%g, %g%c", lo, k->min, k->max, hi);
    else
        snprintf(out, n, "%c%lld, %lld%c", lo, (long long)k->min, (long long)k->max, hi);
}

/* s for a message: at most 48 bytes, "..." when cut (out has 64) */
static const char *clip(char *out, const char *s) {
    if (strlen(s) <= 48) return s;
    snprintf(out, 64, "%.45s...", s);
    return out;
}

// ---------------------------------------------------------------------------------------------
// collected errors

struct errs {
    char *buf; /* the caller's; may be NULL */
    size_t cap, len;
    int n;    /* errors so far (also those that did not fit) */
    int full; /* "..." written: nothing more goes in */
};

static struct errs errs_init(char *err, size_t errlen) {
    struct errs e = {.buf = err, .cap = err ? errlen : 0, .len = 0, .n = 0, .full = 0};
    if (e.cap) e.buf[0] = 0;
    return e;
}

/* one more line; when it does not fit, as much as does and "..." */
__attribute__((format(printf, 2, 3))) static void errs_add(struct errs *e, const char *fmt, ...) {
    char line[6144];
    line[0] = '\n';
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + 1, sizeof line - 1, fmt, ap);
    va_end(ap);
    e->n++;
    if (!e->cap || e->full) return;
    const char *add = e->len ? line : line + 1; // the newline separates lines
    size_t need = strlen(add), room = e->cap - 1 - e->len;
    if (need <= room) {
        memcpy(e->buf + e->len, add, need + 1);
        e->len += need;
        return;
    }
    e->full = 1;
    if (room >= 3) {
        memcpy(e->buf + e->len, add, room - 3);
        memcpy(e->buf + e->len + room - 3, "...", 4);
        e->len += room;
    } else {
        size_t at = e->cap - 1 >= 3 ? e->cap - 1 - 3 : 0;
        for (size_t i = at; i < e->cap - 1; i++)
            e->buf[i] = '.';
        e->buf[e->cap - 1] = 0;
        e->len = e->cap - 1;
    }
}

// ---------------------------------------------------------------------------------------------
// values

/* s[0..n) is valid UTF-8 (no overlong forms, surrogates or code points past U+10FFFF) */
static int utf8_valid(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i], len, min;
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xc2 && c <= 0xdf)
            len = 2, min = 0x80;
        else if ((c & 0xf0) == 0xe0)
            len = 3, min = 0x800;
        else if (c >= 0xf0 && c <= 0xf4)
            len = 4, min = 0x10000;
        else
            return 0;
        if (n - i < len) return 0;
        unsigned cp = c & (0x7fu >> len);
        for (unsigned j = 1; j < len; j++) {
            if ((s[i + j] & 0xc0) != 0x80) return 0;
            cp = cp << 6 | (s[i + j] & 0x3fu);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
        i += len;
    }
    return 1;
}

/* the index of v in names (case-insensitive), or -1 */
static int name_index(const char *const *names, const char *v) {
    for (int i = 0; names[i]; i++)
        if (!strcasecmp(names[i], v)) return i;
    return -1;
}

/* why a string cannot be k's value (NULL: it can). Beyond its own rules, a string must survive
 * srv_config_ini and inih: no control characters, no leading or trailing blank (inih strips
 * them), no ';' after a blank or at the start (inih reads a comment there), valid UTF-8 (JSON). */
static const char *string_problem(const struct key *k, const char *v, char *why, size_t n) {
    size_t len = strlen(v);
    if (len > SRV_STR - 1) {
        snprintf(why, n, "too long (%zu bytes, at most %d)", len, SRV_STR - 1);
        return why;
    }
    if (!len && k->flags & KEY_NONEMPTY) return "must not be empty";
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)v[i];
        if (ch < 0x20 || ch == 0x7f) return "contains a control character";
        if (ch == ';' && (i == 0 || v[i - 1] == ' '))
            return "has a ';' at its start or after a blank, which INI reads as a comment";
    }
    if (len && (v[0] == ' ' || v[len - 1] == ' ')) return "starts or ends with a blank";
    if (!utf8_valid((const unsigned char *)v, len)) return "is not valid UTF-8";
    return NULL;
}

/* parse v (INI text, already stripped) into k's field of c; 0, or -1 with the reason in why */
static int parse_value(const struct key *k, const char *v, struct srv_config *c, char *why,
                       size_t n) {
    char cut[64], range[96], list[160];
    switch (k->type) {
    case KEY_INT:
    case KEY_LONG: {
        const char *p = v + (*v == '+' || *v == '-');
        char *end = NULL;
        errno = 0;
        long long x = 0;
        if (isdigit((unsigned char)*p)) x = strtoll(v, &end, 10); // no blank for it to skip
        if (!end || *end) return td_errf(why, n, "'%s' is not an integer", clip(cut, v));
        range_text(k, range, sizeof range);
        if (errno == ERANGE || x < (long long)k->min || x > (long long)k->max)
            return td_errf(why, n, "%s is out of range %s", clip(cut, v), range);
        if (k->type == KEY_INT)
            *(int *)field(c, k) = (int)x;
        else
            *(long *)field(c, k) = (long)x;
        return 0;
    }
    case KEY_DOUBLE: {
        // decimal only: strtod would also take "nan", "inf" and hex floats
        int digits = 0, other = 0;
        for (const char *p = v; *p; p++) {
            digits += isdigit((unsigned char)*p) != 0;
            other += !isdigit((unsigned char)*p) && !strchr("+-.eE", *p);
        }
        char *end = NULL;
        double x = 0;
        if (digits && !other) x = strtod(v, &end);
        if (!end || *end) return td_errf(why, n, "'%s' is not a number", clip(cut, v));
        int lo_ok = k->flags & KEY_MIN_OPEN ? x > k->min : x >= k->min;
        int hi_ok = k->flags & KEY_MAX_OPEN ? x < k->max : x <= k->max;
        if (!isfinite(x) || !lo_ok || !hi_ok) {
            range_text(k, range, sizeof range);
            return td_errf(why, n, "%s is out of range %s", clip(cut, v), range);
        }
        *(double *)field(c, k) = x;
        return 0;
    }
    case KEY_BOOL: {
        int on = name_index(bool_true, v) >= 0, off = name_index(bool_false, v) >= 0;
        if (!on && !off)
            return td_errf(why, n, "'%s' is not a boolean (on, off, true, false, yes, no, 1, 0)",
                           clip(cut, v));
        *(int *)field(c, k) = on;
        return 0;
    }
    case KEY_ENUM: {
        int i = name_index(k->names, v);
        if (i < 0) {
            names_list(k->names, ", ", list, sizeof list);
            return td_errf(why, n, "'%s' is not one of %s", clip(cut, v), list);
        }
        *(int *)field(c, k) = i;
        return 0;
    }
    case KEY_STRING: {
        const char *bad = string_problem(k, v, why, n);
        if (bad) {
            if (bad != why) snprintf(why, n, "%s", bad);
            return -1;
        }
        if (k->names) {
            int i = name_index(k->names, v);
            if (i < 0) {
                names_list(k->names, ", ", list, sizeof list);
                return td_errf(why, n, "'%s' is not one of %s", clip(cut, v), list);
            }
            v = k->names[i];
        }
        // the whole field is written, so equal configurations compare equal with memcmp
        char *dst = field(c, k);
        memset(dst, 0, SRV_STR);
        memcpy(dst, v, strlen(v));
        return 0;
    }
    }
    return td_errf(why, n, "bad key type");
}

/* k's value in c as INI text (out has SRV_STR + 32 bytes at least) */
static void format_value(const struct key *k, const struct srv_config *c, char *out, size_t n) {
    const void *f = cfield(c, k);
    switch (k->type) {
    case KEY_INT: snprintf(out, n, "%d", *(const int *)f); return;
    case KEY_LONG: snprintf(out, n, "%ld", *(const long *)f); return;
    case KEY_BOOL: snprintf(out, n, "%s", *(const int *)f ? "on" : "off"); return;
    case KEY_STRING: snprintf(out, n, "%s", (const char *)f); return;
    case KEY_ENUM: {
        int i = *(const int *)f, count = 0;
        while (k->names[count])
            count++;
        if (i >= 0 && i < count)
            snprintf(out, n, "%s", k->names[i]);
        else
            snprintf(out, n, "%d", i); // not a value: reading it back fails, as it should
        return;
    }
    case KEY_DOUBLE: {
        // the shortest %g that reads back to the same double, with ".0" on whole numbers
        double x = *(const double *)f;
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(out, n, "%.*g", prec, x);
            if (strtod(out, NULL) == x) break;
        }
        if (!strpbrk(out, ".eEni")) strncat(out, ".0", n - strlen(out) - 1);
        return;
    }
    }
    snprintf(out, n, "?");
}

static size_t type_size(enum key_type t) {
    switch (t) {
    case KEY_INT:
    case KEY_BOOL:
    case KEY_ENUM: return sizeof(int);
    case KEY_LONG: return sizeof(long);
    case KEY_DOUBLE: return sizeof(double);
    case KEY_STRING: return SRV_STR;
    }
    return 0;
}

void srv_config_defaults(struct srv_config *c) {
    memset(c, 0, sizeof *c);
    for (int i = 0; i < NKEYS; i++) {
        const struct key *k = &keys[i];
        char why[256] = "the field's size does not match the key's type";
        if (k->size != type_size(k->type) || parse_value(k, k->def, c, why, sizeof why)) {
            // the table itself is wrong: a programmer error
            TD_ABORT("key %s.%s: default '%s': %s", k->section, k->name, k->def, why);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// the rules across keys

/* an error about keys a and b: "name:line: " with the line of the one set last in the file,
 * "name: " when neither was, nothing without a file */
__attribute__((format(printf, 6, 7))) static void cross_err(struct errs *e, const char *name,
                                                            const int *seen, const char *a,
                                                            const char *b, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line = 0;
    for (int i = 0; seen && i < NKEYS; i++) {
        char full[64];
        snprintf(full, sizeof full, "%s.%s", keys[i].section, keys[i].name);
        if ((!strcmp(full, a) || !strcmp(full, b)) && seen[i] > line) line = seen[i];
    }
    if (!name)
        errs_add(e, "%s", msg);
    else if (line)
        errs_add(e, "%s:%d: %s", name, line, msg);
    else
        errs_add(e, "%s: %s", name, msg);
}

/* the rules the table cannot say; the engine checks the rest (the model's own limits) */
static void cross_check(const struct srv_config *c, const char *name, const int *seen,
                        struct errs *e) {
    const struct draft_info *di = draft_lookup(c->method, NULL, 0); // (a name of draft_names)
    int none = di && di->kind == DRAFT_KIND_NONE;
    int dspark_ok = di && (di->kind == DRAFT_KIND_DSPARK || di->kind == DRAFT_KIND_AUTO);
    if (none && c->k > 0)
        cross_err(e, name, seen, "speculation.k", "speculation.method",
                  "speculation.k = %d needs a drafter, but speculation.method = none", c->k);
    if (c->k > 0 && c->max_batch_tokens < 1 + c->k)
        cross_err(e, name, seen, "scheduler.max_batch_tokens", "speculation.k",
                  "scheduler.max_batch_tokens = %d is less than 1 + speculation.k = %d: a step "
                  "could not verify one sequence's drafts",
                  c->max_batch_tokens, 1 + c->k);
    if (!dspark_ok && c->confidence_min > 0)
        cross_err(e, name, seen, "speculation.confidence_min", "speculation.method",
                  "speculation.confidence_min needs speculation.method = dspark (or auto), not %s",
                  c->method);
    if (!dspark_ok && c->dspark_dir[0])
        cross_err(e, name, seen, "speculation.dspark_dir", "speculation.method",
                  "speculation.dspark_dir needs speculation.method = dspark (or auto), not %s",
                  c->method);
    if (c->max_prompt_tokens > 0 && c->max_prompt_tokens >= c->max_context)
        cross_err(e, name, seen, "limits.max_prompt_tokens", "model.max_context",
                  "limits.max_prompt_tokens = %d must be less than model.max_context = %d (room "
                  "for one output token)",
                  c->max_prompt_tokens, c->max_context);
    long held = (long)c->max_waiting + c->max_running;
    if (c->max_connections <= held)
        cross_err(e, name, seen, "server.max_connections", "limits.max_waiting",
                  "server.max_connections = %d must exceed limits.max_waiting + "
                  "scheduler.max_running = %ld (each waiting or running request holds a "
                  "connection)",
                  c->max_connections, held);
}

int srv_config_check(const struct srv_config *c, char *err, size_t errlen) {
    struct errs e = errs_init(err, errlen);
    cross_check(c, NULL, NULL, &e);
    return e.n ? -1 : 0;
}

// ---------------------------------------------------------------------------------------------
// the INI file

/* a section header the reader has reported: inih keeps its keys under this name, on_pair skips
 * them */
#define SECTION_REPORTED "\x7f"

struct parse {
    struct srv_config *c;
    const char *name;    /* the file, for messages */
    const char *p, *end; /* the text not read yet */
    int line;            /* the line the reader handed inih last */
    int seen[NKEYS];     /* the line each key was set on, 0 = not yet */
    struct errs *e;
};

__attribute__((format(printf, 2, 3))) static void line_err(struct parse *ps, const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    errs_add(ps->e, "%s:%d: %s", ps->name, ps->line, msg);
}

/* vet the line s[0..n) (no line ending) at most limit bytes long: NULL to hand it to inih as it
 * is, else what to hand inih instead (the error is recorded) */
static const char *vet_line(struct parse *ps, const char *s, size_t n, size_t limit) {
    static const char reported[] = "[" SECTION_REPORTED "]\n";
    if (n > limit) {
        line_err(ps, "line too long (%zu bytes, at most %zu)", n, limit);
        return "\n";
    }
    if (memchr(s, 0, n)) {
        line_err(ps, "a NUL byte");
        return "\n";
    }
    size_t i = 0;
    while (i < n && (s[i] == ' ' || s[i] == '\t'))
        i++;
    if (i == n || s[i] == ';' || s[i] == '#') return NULL; // blank, or a comment
    if (i > 0) {
        line_err(ps, "leading whitespace: an indented line would continue the previous value; "
                     "start keys and [sections] in column 1");
        return "\n";
    }
    if (s[0] != '[') return NULL; // key = value: on_pair takes it
    const char *close = memchr(s, ']', n), *end = s + n;
    if (!close) {
        line_err(ps, "a section header without ']'");
        return reported;
    }
    const char *rest = close + 1;
    while (rest < end && (*rest == ' ' || *rest == '\t'))
        rest++;
    if (rest < end && *rest != ';' && *rest != '#') {
        line_err(ps, "text after the section header's ']'");
        return reported;
    }
    size_t len = (size_t)(close - s - 1);
    if (section_known(s + 1, len)) return NULL;
    char lower[64], list[160];
    size_t j = 0;
    for (; j < len && j < sizeof lower - 1; j++)
        lower[j] = (char)tolower((unsigned char)s[1 + j]);
    lower[j] = 0;
    if (len < sizeof lower && section_known(lower, len)) {
        line_err(ps, "unknown section [%.*s] (section names are lowercase: [%s])", (int)len, s + 1,
                 lower);
    } else {
        section_list(list, sizeof list);
        line_err(ps, "unknown section [%.*s%s] (the sections: %s)", len > 48 ? 45 : (int)len, s + 1,
                 len > 48 ? "..." : "", list);
    }
    return reported;
}

/* inih's line reader: one physical line per call, whatever its length */
static char *read_line(char *buf, int num, void *user) {
    struct parse *ps = user;
    if (ps->p >= ps->end) return NULL;
    if (num < 16) { // inih's buffer is ini_max_line bytes: not expected
        errs_add(ps->e, "%s: inih's line buffer is %d bytes: too small", ps->name, num);
        return NULL;
    }
    const char *s = ps->p, *nl = memchr(s, '\n', (size_t)(ps->end - s));
    size_t n = nl ? (size_t)(nl - s) : (size_t)(ps->end - s);
    ps->p = nl ? nl + 1 : ps->end;
    ps->line++;
    if (n && s[n - 1] == '\r') n--;
    if (ps->line == 1 && n >= 3 && !memcmp(s, "\xEF\xBB\xBF", 3)) s += 3, n -= 3; // a BOM
    size_t limit = (size_t)num - 2 < SRV_LINE_MAX ? (size_t)num - 2 : SRV_LINE_MAX;
    const char *instead = vet_line(ps, s, n, limit);
    if (instead) {
        strcpy(buf, instead);
    } else {
        memcpy(buf, s, n);
        buf[n] = '\n';
        buf[n + 1] = 0;
    }
    return buf;
}

/* inih's handler: always 1 (see the file comment); errors go to ps->e */
static int on_pair(void *user, const char *section, const char *name, const char *value) {
    struct parse *ps = user;
    char cut[64], hint[160];
    if (!strcmp(section, SECTION_REPORTED)) return 1;
    if (!*section) {
        line_err(ps, "'%s' before any [section]", clip(cut, name));
        return 1;
    }
    if (!value) {
        line_err(ps, "'%s' is not 'key = value'", clip(cut, name));
        return 1;
    }
    if (!*name) {
        line_err(ps, "no key name before '='");
        return 1;
    }
    int i = key_find(section, name);
    if (i < 0) {
        char lower[64];
        size_t j = 0;
        for (; name[j] && j < sizeof lower - 1; j++)
            lower[j] = (char)tolower((unsigned char)name[j]);
        lower[j] = 0;
        int other = -1;
        for (int o = 0; o < NKEYS && other < 0; o++)
            if (!strcmp(keys[o].name, name)) other = o;
        if (strcmp(lower, name) && key_find(section, lower) >= 0)
            snprintf(hint, sizeof hint, "key names are lowercase: %s", lower);
        else if (other >= 0)
            snprintf(hint, sizeof hint, "%s is in [%s]", name, keys[other].section);
        else
            snprintf(hint, sizeof hint, "tandem serve --help-config lists the keys");
        line_err(ps, "unknown key '%s' in [%s] (%s)", clip(cut, name), section, hint);
        return 1;
    }
    if (ps->seen[i]) {
        line_err(ps, "duplicate key %s.%s (first set on line %d)", section, name, ps->seen[i]);
        return 1;
    }
    ps->seen[i] = ps->line;
    char why[512];
    if (parse_value(&keys[i], value, ps->c, why, sizeof why))
        line_err(ps, "%s.%s: %s", section, name, why);
    return 1;
}

/* libinih's runtime options (Debian's build), X(type, option, ours): set to ours for our parse,
 * then put back. The line buffer lives on the stack, ini_max_line bytes (a VLA in Debian's
 * ini_parse_stream): room for SRV_LINE_MAX bytes, "\n" and NUL, so the reader's limit is ours.
 * Multi-line values off (the reader drops indented lines anyway); "port" alone reaches on_pair
 * with value NULL; vet_line's comment test assumes the prefixes ";#". */
#define INIH_OPTIONS(X)                                                                            \
    X(bool, ini_use_stack, true)                                                                   \
    X(int, ini_max_line, SRV_LINE_MAX + 8)                                                         \
    X(bool, ini_allow_multiline, false)                                                            \
    X(bool, ini_allow_no_value, true)                                                              \
    X(bool, ini_stop_on_first_error, false)                                                        \
    X(bool, ini_allow_inline_comments, true)                                                       \
    X(bool, ini_allow_bom, true)                                                                   \
    X(char *, ini_start_comment_prefixes, ";#")                                                    \
    X(char *, ini_inline_comment_prefixes, ";")

struct inih_options {
#define INIH_FIELD(type, option, ours) type option;
    INIH_OPTIONS(INIH_FIELD)
#undef INIH_FIELD
};

static struct inih_options inih_options_set(void) {
    struct inih_options old;
#define INIH_SET(type, option, ours) old.option = option, option = (ours);
    INIH_OPTIONS(INIH_SET)
#undef INIH_SET
    return old;
}

static void inih_options_restore(const struct inih_options *o) {
#define INIH_PUT(type, option, ours) option = o->option;
    INIH_OPTIONS(INIH_PUT)
#undef INIH_PUT
}

static void parse_text(struct srv_config *c, const char *text, size_t len, const char *name,
                       struct errs *e) {
    struct parse ps = {.c = c, .name = name, .p = text, .end = text + len, .e = e};
    struct inih_options old = inih_options_set();
    int rc = ini_parse_stream(read_line, &ps, on_pair, &ps);
    inih_options_restore(&old);
    if (rc == -2)
        errs_add(e, "%s: out of memory", name);
    else if (rc > 0) // a line inih refused that the reader let through (not expected)
        errs_add(e, "%s:%d: syntax error", name, rc);
    cross_check(c, name, ps.seen, e);
}

int srv_config_load_string(struct srv_config *c, const char *text, const char *name, char *err,
                           size_t errlen) {
    struct errs e = errs_init(err, errlen);
    srv_config_defaults(c);
    parse_text(c, text, strlen(text), name ? name : "<string>", &e);
    return e.n ? -1 : 0;
}

#define FILE_MAX (16L << 20) /* bytes: a configuration file is a few KiB */

int srv_config_load(struct srv_config *c, const char *path, char *err, size_t errlen) {
    struct errs e = errs_init(err, errlen);
    srv_config_defaults(c);
    FILE *f = fopen(path, "rb");
    if (!f) {
        errs_add(&e, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            if (cap >= FILE_MAX) {
                errs_add(&e, "%s: larger than %ld MiB: not a configuration file", path,
                         FILE_MAX >> 20);
                break;
            }
            char *nb = realloc(buf, cap = cap ? 2 * cap : 65536);
            if (!nb) {
                errs_add(&e, "%s: out of memory", path);
                break;
            }
            buf = nb;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) errs_add(&e, "cannot read %s: %s", path, strerror(errno));
            break;
        }
    }
    fclose(f);
    if (!e.n) parse_text(c, buf, len, path, &e);
    free(buf);
    return e.n ? -1 : 0;
}

// ---------------------------------------------------------------------------------------------
// overrides

/* s[0..n) without blanks at either end, as [*b, *b + *bn) */
static void trim(const char *s, size_t n, const char **b, size_t *bn) {
    while (n && isspace((unsigned char)*s))
        s++, n--;
    while (n && isspace((unsigned char)s[n - 1]))
        n--;
    *b = s;
    *bn = n;
}

/* key k = the text v[0..vn) (trimmed here), from `who` (the messages' prefix) */
static void apply(struct srv_config *c, const struct key *k, const char *v, size_t vn,
                  const char *who, struct errs *e) {
    const char *b;
    size_t bn;
    trim(v, vn, &b, &bn);
    char *val = malloc(bn + 1), why[512];
    if (!val) {
        errs_add(e, "%s: out of memory", who);
        return;
    }
    memcpy(val, b, bn);
    val[bn] = 0;
    if (parse_value(k, val, c, why, sizeof why)) errs_add(e, "%s: %s", who, why);
    free(val);
}

int srv_config_set(struct srv_config *c, const char *assignment, const char *origin, char *err,
                   size_t errlen) {
    struct errs e = errs_init(err, errlen);
    char cut[64], sec[64], name[64], who[256];
    if (!origin) origin = "--set";
    const char *eq = strchr(assignment, '='), *kb;
    size_t kn;
    trim(assignment, eq ? (size_t)(eq - assignment) : strlen(assignment), &kb, &kn);
    const char *dot = memchr(kb, '.', kn);
    if (!eq || !dot) {
        errs_add(&e, "%s %s: expected section.key=value", origin, clip(cut, assignment));
        return -1;
    }
    size_t sn = (size_t)(dot - kb), nn = kn - sn - 1;
    int i = -1;
    if (sn < sizeof sec && nn < sizeof name) {
        memcpy(sec, kb, sn);
        sec[sn] = 0;
        memcpy(name, dot + 1, nn);
        name[nn] = 0;
        i = key_find(sec, name);
    }
    if (i < 0) {
        int known = sn < sizeof sec && section_known(kb, sn);
        errs_add(&e, "%s %.*s: %s (tandem serve --help-config lists the keys)", origin,
                 kn > 48 ? 48 : (int)kn, kb, known ? "unknown key" : "unknown section");
        return -1;
    }
    snprintf(who, sizeof who, "%s %s.%s", origin, sec, name);
    apply(c, &keys[i], eq + 1, strlen(eq + 1), who, &e);
    return e.n ? -1 : 0;
}

/* "TANDEM_SERVER_PORT" */
static void env_name(const struct key *k, char *out, size_t n) {
    snprintf(out, n, "TANDEM_%s_%s", k->section, k->name);
    for (char *p = out; *p; p++)
        *p = (char)toupper((unsigned char)*p);
}

extern char **environ;

int srv_config_env(struct srv_config *c, char *const *envp, char *err, size_t errlen) {
    struct errs e = errs_init(err, errlen);
    if (!envp) envp = environ;
    for (; *envp; envp++) {
        const char *ent = *envp, *eq = strchr(ent, '=');
        if (strncmp(ent, "TANDEM_", 7) || !eq) continue;
        size_t n = (size_t)(eq - ent);
        char name[96], who[192];
        int found = 0;
        for (int i = 0; i < NKEYS && !found; i++) {
            env_name(&keys[i], name, sizeof name);
            if (strlen(name) != n || memcmp(name, ent, n)) continue;
            found = 1;
            snprintf(who, sizeof who, "%s (%s.%s)", name, keys[i].section, keys[i].name);
            apply(c, &keys[i], eq + 1, strlen(eq + 1), who, &e);
        }
        // TANDEM_<SECTION>_<typo> is an error; other TANDEM_* variables are not ours
        for (int i = 0; i < NKEYS && !found; i++) {
            if (i && !strcmp(keys[i].section, keys[i - 1].section)) continue;
            snprintf(name, sizeof name, "TANDEM_%s_", keys[i].section);
            for (char *p = name; *p; p++)
                *p = (char)toupper((unsigned char)*p);
            if (!strncmp(ent, name, strlen(name))) {
                errs_add(&e,
                         "%.*s: no such key in [%s] (tandem serve --help-config lists the keys)",
                         n > 64 ? 64 : (int)n, ent, keys[i].section);
                found = 1;
            }
        }
    }
    return e.n ? -1 : 0;
}

// ---------------------------------------------------------------------------------------------
// CLI flags

static const char *const flag_keys[][2] = {
    {"--draft", "speculation.method"},
    {"--port", "server.port"},
    {"--model", "model.path"},
    {"-m", "model.path"},
    {"--host", "server.host"},
    {"--backend", "model.backend"},
    {"--ranks", "model.ranks"},
    {"--gpus", "model.gpus"},
    {"--draft-tokens", "speculation.k"},
    {"--dspark-dir", "speculation.dspark_dir"},
    {"--dspark-threshold", "speculation.confidence_min"},
    {"--draft-policy", "speculation.policy"},
    {"--max-batch-tokens", "scheduler.max_batch_tokens"},
    {"--prefill-chunk", "scheduler.prefill_chunk"},
    {"--prefix-blocks", "scheduler.prefix_blocks"},
    {"--history-blocks", "scheduler.history_blocks"},
    {"--max-ctx", "model.max_context"},
    {"--kv-dtype", "model.kv_dtype"},
    {"--max-seqs", "scheduler.max_running"},
    {"--temperature", "sampling.temperature"},
    {"--top-k", "sampling.top_k"},
    {"--top-p", "sampling.top_p"},
    {"--max-tokens", "sampling.max_tokens"},
    {"--api-key-file", "server.api_key_file"},
};

static const char *const flag_bools[][2] = {
    {"--deterministic", "model.deterministic=on"},
    {"--no-graphs", "model.graphs=off"},
    {"--dummy-weights", "model.dummy_weights=on"},
    {"--ignore-eos", "sampling.ignore_eos=on"},
};

const char *srv_config_flag_key(const char *flag) {
    for (size_t i = 0; i < sizeof flag_keys / sizeof *flag_keys; i++)
        if (!strcmp(flag, flag_keys[i][0])) return flag_keys[i][1];
    return NULL;
}

const char *srv_config_flag_bool(const char *flag) {
    for (size_t i = 0; i < sizeof flag_bools / sizeof *flag_bools; i++)
        if (!strcmp(flag, flag_bools[i][0])) return flag_bools[i][1];
    return NULL;
}

// ---------------------------------------------------------------------------------------------
// printing

char *srv_config_ini(const struct srv_config *c) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return NULL;
    fprintf(f, "; tandem serve: the effective configuration\n");
    for (int i = 0; i < NKEYS; i++) {
        const struct key *k = &keys[i];
        char v[SRV_STR + 64];
        if (i == 0 || strcmp(k->section, keys[i - 1].section))
            fprintf(f, "%s[%s]\n", i ? "\n" : "", k->section);
        format_value(k, c, v, sizeof v);
        fprintf(f, *v ? "%s = %s\n" : "%s =%s\n", k->name, v);
    }
    if (fclose(f)) {
        free(text);
        return NULL;
    }
    return text;
}

static json_t *value_json(const struct key *k, const struct srv_config *c) {
    const void *f = cfield(c, k);
    char v[SRV_STR + 64];
    switch (k->type) {
    case KEY_INT: return json_integer(*(const int *)f);
    case KEY_LONG: return json_integer(*(const long *)f);
    case KEY_DOUBLE: return json_real(*(const double *)f);
    case KEY_BOOL: return json_boolean(*(const int *)f);
    case KEY_STRING:
    case KEY_ENUM: format_value(k, c, v, sizeof v); return json_string(v);
    }
    return NULL;
}

json_t *srv_config_json(const struct srv_config *c) {
    json_t *root = json_object(), *sec = NULL;
    if (!root) return NULL;
    for (int i = 0; i < NKEYS; i++) {
        const struct key *k = &keys[i];
        if (i == 0 || strcmp(k->section, keys[i - 1].section))
            if (!(sec = json_object()) || json_object_set_new(root, k->section, sec)) goto fail;
        if (json_object_set_new(sec, k->name, value_json(k, c))) goto fail; // NULL fails too
    }
    return root;
fail:
    json_decref(root);
    return NULL;
}

unsigned long long srv_config_hash(const struct srv_config *c) {
    char *text = srv_config_ini(c);
    if (!text) return 0;
    uint64_t h = 14695981039346656037ull; // FNV-1a 64
    for (const unsigned char *p = (const unsigned char *)text; *p; p++)
        h = (h ^ *p) * 1099511628211ull;
    free(text);
    return h;
}

void srv_config_help(FILE *f) {
    fprintf(
        f, "tandem serve configuration: the keys of the INI file (-c FILE), section by section.\n"
           "Any key can also be set with --set section.key=value or the environment variable\n"
           "TANDEM_SECTION_KEY (upper case: TANDEM_SERVER_PORT=9000); --set beats the\n"
           "environment, which beats the file, which beats the default. Booleans: on/off,\n"
           "true/false, yes/no, 1/0. Comments: ';' or '#' at a line's start, ';' after a blank.\n");
    for (int i = 0; i < NKEYS; i++) {
        const struct key *k = &keys[i];
        char type[256], range[96], list[160];
        if (i == 0 || strcmp(k->section, keys[i - 1].section)) fprintf(f, "\n[%s]\n", k->section);
        range_text(k, range, sizeof range);
        switch (k->type) {
        case KEY_INT:
        case KEY_LONG: snprintf(type, sizeof type, "integer in %s", range); break;
        case KEY_DOUBLE: snprintf(type, sizeof type, "number in %s", range); break;
        case KEY_BOOL: snprintf(type, sizeof type, "on | off"); break;
        case KEY_ENUM:
            names_list(k->names, " | ", list, sizeof list);
            snprintf(type, sizeof type, "%s", list);
            break;
        case KEY_STRING:
            if (k->names)
                names_list(k->names, " | ", list, sizeof list);
            else
                snprintf(list, sizeof list, "string%s",
                         k->flags & KEY_NONEMPTY ? ", not empty" : "");
            snprintf(type, sizeof type, "%s", list);
            break;
        }
        fprintf(f, "  %s.%s = %s    (%s)\n      %s\n", k->section, k->name,
                *k->def ? k->def : "(empty)", type, k->doc);
    }
}
