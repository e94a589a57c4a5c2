/* bench/serve_load.c: the serving benchmark. Sends prompts from a jsonl file (one object a line
 * with "turns": [text, ...]; the first turn is the prompt) to an OpenAI-compatible server, streamed
 * (SSE, stream_options.include_usage) over plain HTTP/1.1, at Poisson arrivals (--rate, seeded)
 * and/or a cap on requests in flight (--concurrency), and reports what vllm bench serve reports:
 * completed/failed, request/output/total token throughput, goodput at the given SLOs, TTFT, TPOT
 * ((e2e - ttft) / (tokens - 1)), ITL (gaps between chunks) and E2E latency at mean/p50/p90/p99,
 * and speculation from /metrics deltas (acceptance rate = accepted / draft tokens, mean accepted
 * length = 1 + accepted / drafts, per position = accepted at position / drafts).
 *
 *   build/bench/serve_load --url http://127.0.0.1:8080 \
 *       --dataset shared/data/prompts/mt-bench.jsonl --rate 8 --num-requests 200 \
 *       --max-tokens 128 --json out.json
 *
 * Works against any server with /v1/completions or /v1/chat/completions (tandem, vLLM, SGLang,
 * llama.cpp) over plain http:// (no TLS); speculation is read from tandem_spec_* or
 * vllm:spec_decode_* counters when present. One thread per request in flight; a dispatcher thread
 * releases the requests at their arrival times; every time is CLOCK_MONOTONIC. The JSON it writes
 * (--json) has the same keys, and numbers written the same way, as the Node version it replaces.
 */
#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "serve/text.h"

static const char USAGE[] =
    "usage: serve_load --url URL --dataset FILE.jsonl [options]\n"
    "  --url URL          server root (http://host:port) or its /v1\n"
    "  --dataset FILE     jsonl, one {\"turns\": [text, ...]} a line; the first turn is\n"
    "                     the prompt\n"
    "  --endpoint E       chat (default: the first turn as a user message) | completions\n"
    "                     (the raw text)\n"
    "  --rate R           Poisson arrivals, R requests/s (default inf: all at once)\n"
    "  --burstiness B     gamma-distributed gaps of shape B (default 1 = Poisson)\n"
    "  --concurrency C    at most C requests in flight (default: no cap)\n"
    "  --num-requests N   requests to send (default 100; prompts are cycled in a seeded order)\n"
    "  --max-tokens N     max_tokens per request (default 128)\n"
    "  --temperature T    default 0\n"
    "  --ignore-eos       ask the server to ignore EOS (fixed output lengths)\n"
    "  --goodput SLOS     e.g. ttft:500,tpot:50,e2el:10000 (milliseconds): a request is good when\n"
    "                     it meets every SLO given; goodput = good requests / duration\n"
    "  --seed S           arrival and prompt-order seed (default 0); also sent as the request\n"
    "                     seed base (request i gets S + i) when --temperature > 0\n"
    "  --model NAME       default: the server's first /v1/models entry\n"
    "  --api-key KEY      default: $OPENAI_API_KEY or \"none\"\n"
    "  --warmup N         N requests (concurrency 1) before the measurement (default 0)\n"
    "  --timeout-s S      per-request timeout, from the connect to the end of the stream\n"
    "                     (default 600)\n"
    "  --label TEXT       a label stored in the JSON\n"
    "  --json FILE        write the configuration, results and speculation as JSON\n"
    "  --save-requests    include every request's record in the JSON\n"
    "  --quiet            no progress line";

/* ---- small things */

static void oom(void) {
    fputs("serve_load: out of memory\n", stderr);
    exit(1);
}

static void *xrealloc(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) oom();
    return p;
}

static char *xstrdup(const char *s) {
    char *d = strdup(s);
    if (!d) oom();
    return d;
}

/* serve/text.h's growing buffer; this program stops on out of memory rather than drop bytes */
static void buf_add(struct sbuf *b, const void *p, size_t n) {
    sbuf_put(b, p, n);
    if (b->oom) oom();
}

static void buf_str(struct sbuf *b, const char *s) {
    buf_add(b, s, strlen(s));
}
static void buf_ch(struct sbuf *b, char c) {
    buf_add(b, &c, 1);
}

#define buf_printf(b, ...)                                                                         \
    do {                                                                                           \
        sbuf_printf((b), __VA_ARGS__);                                                             \
        if ((b)->oom) oom();                                                                       \
    } while (0)

static void buf_free(struct sbuf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* the message, then exit: die (2) for bad usage or data, fail (1) when the server fails */
static void vquit(int code, const char *fmt, va_list ap) {
    fputs("serve_load: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    exit(code);
}

static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vquit(2, fmt, ap);
}

static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vquit(1, fmt, ap);
}

/* milliseconds since the program started, CLOCK_MONOTONIC */
static struct timespec g_base;

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - g_base.tv_sec) * 1e3 + (double)(t.tv_nsec - g_base.tv_nsec) / 1e6;
}

static struct timespec ms_to_ts(double ms) {
    struct timespec t = g_base;
    if (!(ms < 1e15)) ms = 1e15; /* "forever", and no overflow */
    double s = floor(ms / 1e3);
    t.tv_sec += (time_t)s;
    t.tv_nsec += (long)((ms - s * 1e3) * 1e6);
    while (t.tv_nsec >= 1000000000L) {
        t.tv_nsec -= 1000000000L;
        t.tv_sec++;
    }
    return t;
}

static void sleep_until(double ms) {
    struct timespec t = ms_to_ts(ms);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL) == EINTR) {
    }
}

/* ---- numbers as JavaScript reads and writes them (the JSON and the report match the Node
 * version's: Number("..."), String(x), x.toFixed(d)) */

static int js_space(int c) {
    return c == ' ' || (c >= '\t' && c <= '\r');
}

/* Number(s): NaN when it is not a number; "" is 0 */
static double js_number(const char *s) {
    if (!s) return NAN;
    const char *a = s, *e = s + strlen(s);
    while (a < e && js_space((unsigned char)*a))
        a++;
    while (e > a && js_space((unsigned char)e[-1]))
        e--;
    if (a == e) return 0;
    if (e - a > 2 && a[0] == '0' && strchr("xXoObB", a[1])) {
        int base = (a[1] == 'x' || a[1] == 'X') ? 16 : (a[1] == 'o' || a[1] == 'O') ? 8 : 2;
        double v = 0;
        for (const char *p = a + 2; p < e; p++) {
            int d = isdigit((unsigned char)*p)    ? *p - '0'
                    : isxdigit((unsigned char)*p) ? tolower((unsigned char)*p) - 'a' + 10
                                                  : 99;
            if (d >= base) return NAN;
            v = v * base + d;
        }
        return v;
    }
    const char *p = a;
    int neg = 0;
    if (*p == '+' || *p == '-') neg = *p++ == '-';
    if (e - p == 8 && !memcmp(p, "Infinity", 8)) return neg ? -INFINITY : INFINITY;
    int digits = 0;
    while (p < e && isdigit((unsigned char)*p))
        p++, digits++;
    if (p < e && *p == '.') {
        p++;
        while (p < e && isdigit((unsigned char)*p))
            p++, digits++;
    }
    if (!digits) return NAN;
    if (p < e && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < e && (*p == '+' || *p == '-')) p++;
        int ed = 0;
        while (p < e && isdigit((unsigned char)*p))
            p++, ed++;
        if (!ed) return NAN;
    }
    if (p != e) return NAN;
    char tmp[128];
    size_t n = (size_t)(e - a);
    if (n >= sizeof tmp) return NAN;
    memcpy(tmp, a, n);
    tmp[n] = 0;
    return strtod(tmp, NULL);
}

/* String(x): the shortest digits that read back as x, laid out as ECMAScript's Number::toString */
static void js_num(double x, char *out, size_t cap) {
    if (isnan(x)) {
        snprintf(out, cap, "NaN");
        return;
    }
    if (isinf(x)) {
        snprintf(out, cap, "%s", x < 0 ? "-Infinity" : "Infinity");
        return;
    }
    if (x == 0) {
        snprintf(out, cap, "0");
        return;
    }
    char tmp[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(tmp, sizeof tmp, "%.*e", p - 1, x);
        if (strtod(tmp, NULL) == x) break;
    }
    char dg[24];
    int k = 0, neg = 0;
    const char *s = tmp;
    if (*s == '-') neg = 1, s++;
    for (; *s && *s != 'e'; s++)
        if (isdigit((unsigned char)*s) && k < 20) dg[k++] = *s;
    while (k > 1 && dg[k - 1] == '0')
        k--;
    int n = atoi(s + 1) + 1; /* the decimal point sits after n digits */
    struct sbuf b = {0};
    if (neg) buf_ch(&b, '-');
    if (k <= n && n <= 21) {
        buf_add(&b, dg, (size_t)k);
        for (int i = k; i < n; i++)
            buf_ch(&b, '0');
    } else if (0 < n && n <= 21) {
        buf_add(&b, dg, (size_t)n);
        buf_ch(&b, '.');
        buf_add(&b, dg + n, (size_t)(k - n));
    } else if (-6 < n && n <= 0) {
        buf_str(&b, "0.");
        for (int i = 0; i < -n; i++)
            buf_ch(&b, '0');
        buf_add(&b, dg, (size_t)k);
    } else {
        buf_ch(&b, dg[0]);
        if (k > 1) {
            buf_ch(&b, '.');
            buf_add(&b, dg + 1, (size_t)(k - 1));
        }
        buf_printf(&b, "e%c%d", n - 1 >= 0 ? '+' : '-', abs(n - 1));
    }
    snprintf(out, cap, "%s", b.p);
    buf_free(&b);
}

/* x.toFixed(d): exact decimal rounding, a tie goes away from zero (printf's goes to even) */
static void js_fixed(double x, int d, char *out, size_t cap) {
    if (!isfinite(x) || fabs(x) >= 1e21) {
        js_num(x, out, cap);
        return;
    }
    int neg = x < 0;
    char t[128];
    /* 25 more digits than asked tell a true tie from a near one: a double that close to a tie
     * at d <= 20 digits is the tie itself */
    snprintf(t, sizeof t, "%.*f", d + 25, fabs(x));
    char *dot = strchr(t, '.');
    size_t keep = (size_t)(dot - t) + (d ? (size_t)d + 1 : 0);
    int up = t[(size_t)(dot - t) + (size_t)d + 1] >= '5';
    t[keep] = 0;
    if (up) {
        long i = (long)keep - 1;
        for (; i >= 0; i--) {
            if (t[i] == '.') continue;
            if (t[i] == '9') {
                t[i] = '0';
                continue;
            }
            t[i]++;
            break;
        }
        if (i < 0) {
            memmove(t + 1, t, keep + 1);
            t[0] = '1';
        }
    }
    snprintf(out, cap, "%s%s", neg ? "-" : "", t);
}

/* ---- JSON out, as JSON.stringify writes it (compact, or indented by 2) */

static void json_quote(struct sbuf *b, const char *s, size_t n) {
    buf_ch(b, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"': buf_str(b, "\\\""); break;
        case '\\': buf_str(b, "\\\\"); break;
        case '\b': buf_str(b, "\\b"); break;
        case '\f': buf_str(b, "\\f"); break;
        case '\n': buf_str(b, "\\n"); break;
        case '\r': buf_str(b, "\\r"); break;
        case '\t': buf_str(b, "\\t"); break;
        default:
            if (c < 0x20)
                buf_printf(b, "\\u%04x", c);
            else
                buf_ch(b, (char)c);
        }
    }
    buf_ch(b, '"');
}

static void json_nl(struct sbuf *b, int indent, int depth) {
    if (!indent) return;
    buf_ch(b, '\n');
    for (int i = 0; i < indent * depth; i++)
        buf_ch(b, ' ');
}

static void json_out(struct sbuf *b, json_t *v, int indent, int depth) {
    char num[40];
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        if (!json_object_size(v)) {
            buf_str(b, "{}");
            break;
        }
        const char *k;
        json_t *x;
        int first = 1;
        buf_ch(b, '{');
        json_object_foreach(v, k, x) {
            if (!first) buf_ch(b, ',');
            first = 0;
            json_nl(b, indent, depth + 1);
            json_quote(b, k, strlen(k));
            buf_str(b, indent ? ": " : ":");
            json_out(b, x, indent, depth + 1);
        }
        json_nl(b, indent, depth);
        buf_ch(b, '}');
        break;
    }
    case JSON_ARRAY: {
        if (!json_array_size(v)) {
            buf_str(b, "[]");
            break;
        }
        size_t i;
        json_t *x;
        buf_ch(b, '[');
        json_array_foreach(v, i, x) {
            if (i) buf_ch(b, ',');
            json_nl(b, indent, depth + 1);
            json_out(b, x, indent, depth + 1);
        }
        json_nl(b, indent, depth);
        buf_ch(b, ']');
        break;
    }
    case JSON_STRING: json_quote(b, json_string_value(v), json_string_length(v)); break;
    case JSON_INTEGER: buf_printf(b, "%" JSON_INTEGER_FORMAT, json_integer_value(v)); break;
    case JSON_REAL:
        js_num(json_real_value(v), num, sizeof num);
        buf_str(b, num);
        break;
    case JSON_TRUE: buf_str(b, "true"); break;
    case JSON_FALSE: buf_str(b, "false"); break;
    default: buf_str(b, "null"); break;
    }
}

/* a number, or null where JSON.stringify writes null (NaN, +-Infinity: also "no value" here) */
static json_t *jnum(double x) {
    return isfinite(x) ? json_real(x) : json_null();
}

static json_t *jstr(const char *s) {
    return s ? json_string(s) : json_null();
}

/* JavaScript truthiness of a parsed value (absent = undefined = false) */
static int js_truthy(const json_t *v) {
    if (!v) return 0;
    switch (json_typeof(v)) {
    case JSON_TRUE: return 1;
    case JSON_INTEGER: return json_integer_value(v) != 0;
    case JSON_REAL: return json_real_value(v) != 0;
    case JSON_STRING: return json_string_length(v) > 0;
    case JSON_OBJECT:
    case JSON_ARRAY: return 1;
    default: return 0;
    }
}

/* a parsed number, or NAN (undefined/null/not a number) */
static double jval(const json_t *v) {
    return json_is_number(v) ? json_number_value(v) : NAN;
}

/* ---- arguments */

struct opts {
    const char *url, *dataset, *endpoint;
    int chat;
    double rate, burstiness, concurrency, num_requests, max_tokens, temperature;
    int ignore_eos;
    json_t *goodput; /* {"ttft": ms, ...} in the order given, or NULL */
    double seed;
    const char *model, *api_key;
    double warmup, timeout_s;
    const char *label, *json;
    int save_requests, quiet;
};

static double opt_num(const char *k, const char *v, double min) {
    double x = v && !strcmp(v, "inf") ? INFINITY : js_number(v);
    if (!v || isnan(x) || x < min) {
        if (!v) die("%s: bad value undefined", k);
        struct sbuf q = {0};
        json_quote(&q, v, strlen(v));
        die("%s: bad value %s", k, q.p);
    }
    return x;
}

static json_t *parse_slos(const char *s) {
    json_t *slo = json_object();
    char *copy = xstrdup(s ? s : "");
    for (char *part = copy, *next; part; part = next) {
        next = strchr(part, ',');
        if (next) *next++ = 0;
        if (!*part) continue;
        /* "k:v[:...]": what follows a second ':' is ignored, as split(':') destructuring does */
        struct sbuf q = {0};
        json_quote(&q, part, strlen(part));
        char *v = strchr(part, ':');
        if (v) {
            *v++ = 0;
            v[strcspn(v, ":")] = 0;
        }
        double x = js_number(v);
        if ((strcmp(part, "ttft") && strcmp(part, "tpot") && strcmp(part, "e2el")) || !(x > 0))
            die("--goodput: bad SLO %s (ttft|tpot|e2el:ms)", q.p);
        buf_free(&q);
        json_object_set_new(slo, part, json_real(x));
    }
    free(copy);
    if (!json_object_size(slo)) die("--goodput: no SLO given");
    return slo;
}

static void parse_args(int argc, char **argv, struct opts *o) {
    const char *key = getenv("OPENAI_API_KEY");
    *o = (struct opts){.endpoint = "chat",
                       .rate = INFINITY,
                       .burstiness = 1,
                       .concurrency = INFINITY,
                       .num_requests = 100,
                       .max_tokens = 128,
                       .api_key = key && *key ? key : "none",
                       .timeout_s = 600};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define VAL (i++, v)
        if (!strcmp(a, "--url"))
            o->url = VAL;
        else if (!strcmp(a, "--dataset"))
            o->dataset = VAL;
        else if (!strcmp(a, "--endpoint"))
            o->endpoint = VAL;
        else if (!strcmp(a, "--rate"))
            o->rate = opt_num(a, VAL, 0);
        else if (!strcmp(a, "--burstiness"))
            o->burstiness = opt_num(a, VAL, 1e-9);
        else if (!strcmp(a, "--concurrency"))
            o->concurrency = opt_num(a, VAL, 1);
        else if (!strcmp(a, "--num-requests"))
            o->num_requests = opt_num(a, VAL, 1);
        else if (!strcmp(a, "--max-tokens"))
            o->max_tokens = opt_num(a, VAL, 1);
        else if (!strcmp(a, "--temperature"))
            o->temperature = opt_num(a, VAL, 0);
        else if (!strcmp(a, "--ignore-eos"))
            o->ignore_eos = 1;
        else if (!strcmp(a, "--goodput")) {
            if (o->goodput) json_decref(o->goodput);
            o->goodput = parse_slos(VAL);
        } else if (!strcmp(a, "--seed"))
            o->seed = opt_num(a, VAL, -INFINITY);
        else if (!strcmp(a, "--model"))
            o->model = VAL;
        else if (!strcmp(a, "--api-key"))
            o->api_key = VAL;
        else if (!strcmp(a, "--warmup"))
            o->warmup = opt_num(a, VAL, 0);
        else if (!strcmp(a, "--timeout-s"))
            o->timeout_s = opt_num(a, VAL, 1);
        else if (!strcmp(a, "--label"))
            o->label = VAL;
        else if (!strcmp(a, "--json"))
            o->json = VAL;
        else if (!strcmp(a, "--save-requests"))
            o->save_requests = 1;
        else if (!strcmp(a, "--quiet"))
            o->quiet = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            puts(USAGE);
            exit(0);
        } else
            die("unknown option %s\n%s", a, USAGE);
#undef VAL
    }
    if (!o->url || !o->dataset) die("%s", USAGE);
    if (!o->endpoint || (strcmp(o->endpoint, "chat") && strcmp(o->endpoint, "completions")))
        die("--endpoint: chat or completions, not %s", o->endpoint ? o->endpoint : "undefined");
    o->chat = !strcmp(o->endpoint, "chat");
    if (o->rate == 0) die("--rate: bad value \"0\" (requests/s, > 0, or inf)");
    if (isinf(o->num_requests) || o->num_requests > 1e7) die("--num-requests: at most 10000000");
    if (isinf(o->warmup) || o->warmup > 1e7) die("--warmup: at most 10000000");
    if (isinf(o->rate) && isinf(o->concurrency) && o->num_requests > 4096)
        fprintf(stderr, "note: --rate inf without --concurrency sends all %.0f requests at once\n",
                floor(o->num_requests));
    if (!o->api_key) o->api_key = "none";
    o->num_requests = floor(o->num_requests);
}

/* ---- seeded randomness (mulberry32; gamma by Marsaglia-Tsang), bit for bit the Node version's */

struct rng {
    uint32_t a;
};

static uint32_t to_uint32(double x) { /* ECMAScript ToUint32 (x >>> 0) */
    if (!isfinite(x)) return 0;
    double m = fmod(trunc(x), 4294967296.0);
    if (m < 0) m += 4294967296.0;
    return (uint32_t)m;
}

static struct rng rng_new(double seed) {
    return (struct rng){.a = to_uint32(seed) ^ 0x9e3779b9u};
}

static double rng_next(struct rng *r) {
    r->a += 0x6d2b79f5u;
    uint32_t t = r->a;
    t = (t ^ (t >> 15)) * (t | 1u);
    t ^= t + (t ^ (t >> 7)) * (t | 61u);
    return (double)(t ^ (t >> 14)) / 4294967296.0;
}

static double normal(struct rng *u) {
    double x = 0;
    while (x == 0)
        x = rng_next(u);
    return sqrt(-2 * log(x)) * cos(2 * M_PI * rng_next(u));
}

static double gamma_rand(struct rng *u, double shape, double scale) {
    if (shape < 1) {
        double g = gamma_rand(u, shape + 1, scale);
        double w = rng_next(u);
        return g * pow(w != 0 ? w : 1e-12, 1 / shape);
    }
    double d = shape - 1.0 / 3;
    double c = 1 / sqrt(9 * d);
    for (;;) {
        double x, v;
        do {
            x = normal(u);
            v = 1 + c * x;
        } while (v <= 0);
        v = v * v * v;
        double w = rng_next(u);
        if (w < 1 - 0.0331 * pow(x, 4) || log(w) < 0.5 * x * x + d * (1 - v + log(v)))
            return d * v * scale;
    }
}

/* Arrival offsets (seconds from the start) of n requests at `rate` with gamma(shape =
 * burstiness) gaps of mean 1/rate (vllm bench serve's model; burstiness 1 = Poisson). */
static double *arrivals(long n, double rate, double burstiness, double seed) {
    double *out = xrealloc(NULL, sizeof *out * (size_t)n);
    struct rng u = rng_new(seed * 2 + 1);
    double t = 0;
    for (long i = 0; i < n; i++) {
        out[i] = isfinite(rate) ? t : 0;
        if (isfinite(rate)) t += gamma_rand(&u, burstiness, 1 / (rate * burstiness));
    }
    return out;
}

/* ---- data */

struct prompts {
    json_t **all; /* the prompts, one reference each */
    long total;
    json_t **picked; /* n of them (borrowed), cycled in a seeded order */
};

static void load_prompts(const char *file, long n, double seed, struct prompts *P) {
    FILE *f = fopen(file, "rb");
    if (!f) die("%s: %s", file, strerror(errno));
    struct sbuf text = {0};
    char chunk[65536];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0)
        buf_add(&text, chunk, got);
    if (ferror(f)) die("%s: %s", file, strerror(errno));
    fclose(f);
    memset(P, 0, sizeof *P);
    long cap = 0, lineno = 0;
    for (size_t at = 0; at < text.n;) {
        const char *l = text.p + at;
        const char *nl = memchr(l, '\n', text.n - at);
        size_t len = nl ? (size_t)(nl - l) : text.n - at;
        at += len + 1;
        lineno++;
        size_t k = 0;
        while (k < len && js_space((unsigned char)l[k]))
            k++;
        if (k == len) continue;
        json_error_t e;
        json_t *o = json_loadb(l, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
        if (!o) die("%s:%ld: not JSON: %s", file, lineno, e.text);
        json_t *turns = json_is_object(o) ? json_object_get(o, "turns") : NULL;
        json_t *t = json_is_array(turns) ? json_array_get(turns, 0) : NULL;
        if (json_is_string(t) && json_string_length(t)) {
            if (P->total == cap) {
                cap = cap ? cap * 2 : 64;
                P->all = xrealloc(P->all, sizeof *P->all * (size_t)cap);
            }
            P->all[P->total++] = json_incref(t);
        }
        json_decref(o);
    }
    buf_free(&text);
    if (!P->total) die("%s: no prompts (objects with \"turns\": [text, ...])", file);
    /* a seeded shuffle, cycled to n */
    struct rng u = rng_new(seed * 2 + 2);
    long *order = xrealloc(NULL, sizeof *order * (size_t)P->total);
    for (long i = 0; i < P->total; i++)
        order[i] = i;
    for (long i = P->total - 1; i > 0; i--) {
        long j = (long)floor(rng_next(&u) * (double)(i + 1));
        long tmp = order[i];
        order[i] = order[j];
        order[j] = tmp;
    }
    P->picked = xrealloc(NULL, sizeof *P->picked * (size_t)n);
    for (long i = 0; i < n; i++)
        P->picked[i] = P->all[order[i % P->total]];
    free(order);
}

/* ---- statistics */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* percentile p (0..100) of sorted values, linear interpolation (numpy's default) */
static double pct(const double *v, size_t n, double p) {
    double x = (double)(n - 1) * (p / 100);
    size_t lo = (size_t)floor(x), hi = (size_t)ceil(x);
    return v[lo] + (v[hi] - v[lo]) * (x - (double)lo);
}

/* {n, mean, std, p50, p90, p99, min, max} of the finite values (n is changed: sorted, filtered) */
static json_t *summary(double *v, size_t n) {
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(v[i])) v[m++] = v[i];
    json_t *s = json_object();
    json_object_set_new(s, "n", json_real((double)m));
    const char *keys[] = {"mean", "std", "p50", "p90", "p99", "min", "max"};
    if (!m) {
        for (int i = 0; i < 7; i++)
            json_object_set_new(s, keys[i], json_null());
        return s;
    }
    qsort(v, m, sizeof *v, cmp_double);
    double sum = 0;
    for (size_t i = 0; i < m; i++)
        sum += v[i];
    double mean = sum / (double)m, sq = 0;
    for (size_t i = 0; i < m; i++)
        sq += (v[i] - mean) * (v[i] - mean);
    double val[7] = {
        mean, sqrt(sq / (double)m), pct(v, m, 50), pct(v, m, 90), pct(v, m, 99), v[0], v[m - 1]};
    for (int i = 0; i < 7; i++)
        json_object_set_new(s, keys[i], jnum(val[i]));
    return s;
}

/* ---- HTTP/1.1 over a plain TCP socket */

struct url {
    char *host, *port, *hostport; /* hostport: the Host header */
    char *prefix;                 /* the root's path, no trailing '/' ("" at the top) */
};

static struct url g_url;
static struct addrinfo *g_addrs;
static const char *g_auth = "none"; /* the API key */

static void parse_url(const char *s) {
    const char *p = s;
    if (!strncasecmp(p, "https://", 8))
        die("--url %s: https is not supported (plain http:// only)", s);
    if (strncasecmp(p, "http://", 7)) die("--url %s: not an http:// URL", s);
    p += 7;
    const char *end = p + strcspn(p, "/?#");
    if (memchr(p, '@', (size_t)(end - p)))
        die("--url %s: credentials in the URL are not supported", s);
    if (strpbrk(end, "?#")) die("--url %s: a query or fragment is not supported", s);
    const char *hs = p, *he, *port = NULL;
    if (*p == '[') {
        he = memchr(p, ']', (size_t)(end - p));
        if (!he) die("--url %s: bad IPv6 address", s);
        hs = p + 1;
        if (he + 1 < end) {
            if (he[1] != ':') die("--url %s: bad host", s);
            port = he + 2;
        }
    } else {
        he = memchr(p, ':', (size_t)(end - p));
        if (he)
            port = he + 1;
        else
            he = end;
    }
    if (he == hs) die("--url %s: no host", s);
    g_url.host = strndup(hs, (size_t)(he - hs));
    if (port) {
        long v = 0;
        const char *q = port;
        for (; q < end && isdigit((unsigned char)*q) && v <= 65535; q++)
            v = v * 10 + (*q - '0');
        if (q == port || q != end || v < 1 || v > 65535) die("--url %s: bad port", s);
        g_url.port = strndup(port, (size_t)(end - port));
    } else
        g_url.port = xstrdup("80");
    g_url.hostport = strndup(p, (size_t)(end - p));
    /* the root: trailing '/' and then a trailing /v1 dropped */
    size_t n = strlen(end);
    while (n && end[n - 1] == '/')
        n--;
    if (n >= 3 && !memcmp(end + n - 3, "/v1", 3)) n -= 3;
    g_url.prefix = strndup(end, n);
    if (!g_url.host || !g_url.hostport || !g_url.prefix) oom();
}

static void resolve(const char *url) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    int rc = getaddrinfo(g_url.host, g_url.port, &hints, &g_addrs);
    if (rc) fail("--url %s: cannot resolve %s: %s", url, g_url.host, gai_strerror(rc));
}

enum { H_OK, H_CONNECT, H_TIMEOUT, H_CLOSED, H_PROTO, H_ABORT };

/* the body sink: 0 to go on, < 0 to abort the request (the sink says why) */
typedef int (*sink_fn)(void *ctx, const char *p, size_t n);

struct resp {
    int status;
    struct sbuf body; /* the body when there is no sink or the status is not 2xx */
    /* parsing */
    int phase; /* 0 headers, 1 body, 2 done */
    struct sbuf hdr;
    int chunked, to_sink;
    long long left; /* content-length left, -1 to the close */
    int cphase;     /* chunked: 0 size line, 1 data, 2 CRLF after data, 3 trailers */
    struct sbuf line;
    sink_fn sink;
    void *ctx;
    double t_end; /* when the response was complete (ms) */
};

static int remaining_ms(double deadline) {
    if (isinf(deadline)) return -1;
    double r = deadline - now_ms();
    if (r <= 0) return 0;
    return r > 1e9 ? 1000000000 : (int)ceil(r);
}

/* wait for fd to be ready; 1 ready, 0 timed out */
static int wait_fd(int fd, short ev, double deadline) {
    for (;;) {
        struct pollfd p = {.fd = fd, .events = ev};
        int ms = remaining_ms(deadline);
        if (ms == 0) return 0;
        int rc = poll(&p, 1, ms);
        if (rc > 0) return 1;
        if (rc < 0 && errno != EINTR) return 1; /* let the call itself say what is wrong */
    }
}

static int http_connect(double deadline, char *err, size_t errn, int *fd_out) {
    int last = 0;
    for (struct addrinfo *ai = g_addrs; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            last = errno;
            continue;
        }
        int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
        if (rc < 0 && errno == EINPROGRESS) {
            if (!wait_fd(fd, POLLOUT, deadline)) {
                close(fd);
                snprintf(err, errn, "connect %s: timed out", g_url.hostport);
                return H_TIMEOUT;
            }
            int e = 0;
            socklen_t el = sizeof e;
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el);
            rc = e ? -1 : 0;
            errno = e;
        }
        if (rc == 0) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            *fd_out = fd;
            return H_OK;
        }
        last = errno;
        close(fd);
    }
    snprintf(err, errn, "connect %s: %s", g_url.hostport, strerror(last));
    return H_CONNECT;
}

static int send_all(int fd, const char *p, size_t n, double deadline, char *err, size_t errn) {
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (!wait_fd(fd, POLLOUT, deadline)) {
                snprintf(err, errn, "timed out sending the request");
                return H_TIMEOUT;
            }
            continue;
        }
        snprintf(err, errn, "send: %s", strerror(errno));
        return H_CLOSED;
    }
    return H_OK;
}

static int deliver(struct resp *r, const char *p, size_t n) {
    if (!n) return 0;
    if (r->to_sink) return r->sink(r->ctx, p, n) < 0 ? -2 : 0;
    if (r->body.n + n > ((size_t)64 << 20)) return -1;
    buf_add(&r->body, p, n);
    return 0;
}

/* headers: status and framing; 1 when they are complete, 0 for more, -1 bad */
static int parse_headers(struct resp *r, const char *method) {
    char *h = r->hdr.p;
    if (strncmp(h, "HTTP/1.", 7) || !isdigit((unsigned char)h[9]) || h[8] != ' ') return -1;
    r->status = atoi(h + 9);
    r->chunked = 0;
    r->left = -1;
    for (char *l = strstr(h, "\r\n"); l && l[2]; l = strstr(l + 2, "\r\n")) {
        char *name = l + 2, *colon = strchr(name, ':'), *eol = strstr(name, "\r\n");
        if (!colon || !eol || colon > eol) continue;
        char *v = colon + 1;
        while (*v == ' ' || *v == '\t')
            v++;
        size_t nl = (size_t)(colon - name);
        if (nl == 17 && !strncasecmp(name, "transfer-encoding", nl)) {
            for (char *q = v; q + 7 <= eol; q++)
                if (!strncasecmp(q, "chunked", 7)) r->chunked = 1;
        } else if (nl == 14 && !strncasecmp(name, "content-length", nl))
            r->left = atoll(v);
    }
    if (r->chunked) r->left = -1;
    r->to_sink = r->sink && r->status >= 200 && r->status < 300;
    if (r->status == 204 || r->status == 304 || !strcmp(method, "HEAD"))
        r->phase = 2;
    else if (!r->chunked && r->left == 0)
        r->phase = 2;
    else
        r->phase = 1;
    return 1;
}

/* the response so far; 0 more, 1 complete, -1 malformed, -2 the sink aborted */
static int feed(struct resp *r, const char *method, const char *p, size_t n) {
    while (n && r->phase != 2) {
        if (r->phase == 0) {
            size_t old = r->hdr.n;
            buf_add(&r->hdr, p, n);
            char *e = strstr(r->hdr.p, "\r\n\r\n");
            if (!e) {
                if (r->hdr.n > 65536) return -1;
                return 0;
            }
            size_t hlen = (size_t)(e - r->hdr.p) + 4;
            size_t used = hlen - old;
            p += used;
            n -= used;
            r->hdr.p[hlen - 2] = 0; /* keep the last header's CRLF */
            if (parse_headers(r, method) < 0) return -1;
            if (r->status >= 100 && r->status < 200) { /* an interim response: the next one */
                r->hdr.n = 0;
                r->hdr.p[0] = 0;
                r->phase = 0;
            }
            continue;
        }
        if (!r->chunked) {
            size_t take = r->left >= 0 && (long long)n > r->left ? (size_t)r->left : n;
            int rc = deliver(r, p, take);
            if (rc) return rc;
            p += take;
            n -= take;
            if (r->left >= 0) {
                r->left -= (long long)take;
                if (!r->left) r->phase = 2;
            }
            continue;
        }
        if (r->cphase == 1) {
            size_t take = (long long)n > r->left ? (size_t)r->left : n;
            int rc = deliver(r, p, take);
            if (rc) return rc;
            p += take;
            n -= take;
            r->left -= (long long)take;
            if (!r->left) r->cphase = 2;
            continue;
        }
        /* a line: the chunk size, the CRLF after the data, or a trailer */
        char c = *p++;
        n--;
        if (c != '\n') {
            if (r->line.n > 4096) return -1;
            buf_ch(&r->line, c);
            continue;
        }
        if (r->line.n && r->line.p[r->line.n - 1] == '\r') r->line.p[--r->line.n] = 0;
        if (r->cphase == 0) {
            char *end;
            if (!r->line.n || !isxdigit((unsigned char)r->line.p[0])) return -1;
            long long sz = strtoll(r->line.p, &end, 16);
            if (sz < 0 || (*end && *end != ';' && *end != ' ' && *end != '\t')) return -1;
            r->left = sz;
            r->cphase = sz ? 1 : 3;
        } else if (r->cphase == 2) {
            if (r->line.n) return -1;
            r->cphase = 0;
        } else if (!r->line.n)
            r->phase = 2; /* the end of the trailers */
        r->line.n = 0;
        if (r->line.p) r->line.p[0] = 0;
    }
    return r->phase == 2;
}

/* One exchange on a fresh connection, everything bounded by `deadline` (ms, now_ms's clock).
 * The 2xx body goes to `sink` when given, else to r->body. */
static int http_do(const char *method, const char *path, const char *body, size_t blen,
                   double deadline, sink_fn sink, void *ctx, struct resp *r, char *err,
                   size_t errn) {
    memset(r, 0, sizeof *r);
    r->sink = sink;
    r->ctx = ctx;
    int fd = -1;
    int rc = http_connect(deadline, err, errn, &fd);
    if (rc) return rc;
    struct sbuf req = {0};
    buf_printf(&req, "%s %s HTTP/1.1\r\nHost: %s\r\n", method, path, g_url.hostport);
    buf_printf(&req, "Authorization: Bearer %s\r\n", g_auth);
    buf_str(&req, "Accept: application/json\r\nUser-Agent: tandem-serve_load\r\n");
    if (body) buf_printf(&req, "Content-Type: application/json\r\nContent-Length: %zu\r\n", blen);
    buf_str(&req, "Connection: close\r\n\r\n");
    if (body) buf_add(&req, body, blen);
    rc = send_all(fd, req.p, req.n, deadline, err, errn);
    buf_free(&req);
    char *in = xrealloc(NULL, 65536);
    while (!rc) {
        if (!wait_fd(fd, POLLIN, deadline)) {
            err[0] = 0;
            rc = H_TIMEOUT;
            break;
        }
        ssize_t got = recv(fd, in, 65536, 0);
        if (got < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
            snprintf(err, errn, "recv: %s", strerror(errno));
            rc = H_CLOSED;
            break;
        }
        if (got == 0) {
            if (r->phase == 1 && !r->chunked && r->left < 0) { /* to the close: complete */
                r->t_end = now_ms();
                break;
            }
            snprintf(err, errn, "%s",
                     r->phase == 0 ? "the server closed the connection without a response"
                                   : "the server closed the connection mid-response");
            rc = H_CLOSED;
            break;
        }
        int f = feed(r, method, in, (size_t)got);
        if (f == 1) {
            r->t_end = now_ms();
            /* the response is complete; we asked for Connection: close, so wait a little for
             * the server's close: a server that counts a request (/metrics) just after its last
             * bytes has then counted it when the caller moves on */
            double linger = now_ms() + 250;
            while (wait_fd(fd, POLLIN, linger < deadline ? linger : deadline)) {
                ssize_t k = recv(fd, in, 65536, 0);
                if (k == 0 || (k < 0 && errno != EINTR && errno != EAGAIN)) break;
            }
            break;
        }
        if (f == -1) {
            snprintf(err, errn, "malformed HTTP response");
            rc = H_PROTO;
        } else if (f == -2)
            rc = H_ABORT;
    }
    free(in);
    close(fd);
    buf_free(&r->hdr);
    buf_free(&r->line);
    return rc;
}

static const char *status_class(int status) {
    switch (status) {
    case 400: return "BadRequestError";
    case 401: return "AuthenticationError";
    case 403: return "PermissionDeniedError";
    case 404: return "NotFoundError";
    case 409: return "ConflictError";
    case 422: return "UnprocessableEntityError";
    case 429: return "RateLimitError";
    default: return status >= 500 ? "InternalServerError" : "APIError";
    }
}

/* the openai client's error message: "STATUS error.message" (or the error as JSON, or the raw
 * body, or "STATUS status code (no body)") */
static void api_message(struct sbuf *b, int status, json_t *error, const char *message) {
    struct sbuf msg = {0};
    json_t *m = json_is_object(error) ? json_object_get(error, "message") : NULL;
    if (js_truthy(m)) {
        if (json_is_string(m))
            buf_str(&msg, json_string_value(m));
        else
            json_out(&msg, m, 0, 0);
    } else if (js_truthy(error))
        json_out(&msg, error, 0, 0);
    else if (message)
        buf_str(&msg, message);
    if (status && msg.n)
        buf_printf(b, "%d %s", status, msg.p);
    else if (status)
        buf_printf(b, "%d status code (no body)", status);
    else if (msg.n)
        buf_str(b, msg.p);
    else
        buf_str(b, "(no status code or body)");
    buf_free(&msg);
}

/* "ClassName: message" for a response that is not 2xx */
static void status_error(struct sbuf *b, struct resp *r) {
    json_t *j = r->body.n ? json_loadb(r->body.p, r->body.n, JSON_DECODE_ANY, NULL) : NULL;
    json_t *error = json_is_object(j) ? json_object_get(j, "error") : NULL;
    buf_printf(b, "%s: ", status_class(r->status));
    api_message(b, r->status, error, js_truthy(j) ? NULL : (r->body.p ? r->body.p : ""));
    json_decref(j);
}

static void transport_error(struct sbuf *b, int rc, const char *err) {
    if (rc == H_TIMEOUT)
        buf_printf(b, "APIConnectionTimeoutError: Request timed out.%s%s%s", *err ? " (" : "", err,
                   *err ? ")" : "");
    else
        buf_printf(b, "APIConnectionError: Connection error. (%s)", err);
}

/* ---- metrics (speculation counters) */

struct snap {
    int flavour; /* 0 neither, 1 tandem, 2 vllm */
    int has_generation;
    double generation, drafts, draft_tokens, accepted;
    char **pos; /* per-position accepted tokens: label values and sums */
    double *pos_v;
    size_t npos;
};

static const char *SPEC_NAMES[3][4] = {
    {0},
    {"tandem_spec_drafts_total", "tandem_spec_draft_tokens_total",
     "tandem_spec_accepted_tokens_total", "tandem_spec_accepted_tokens_per_pos_total"},
    {"vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
     "vllm:spec_decode_num_accepted_tokens_total",
     "vllm:spec_decode_num_accepted_tokens_per_pos_total"},
};

struct sample {
    const char *name; /* into the text */
    size_t nlen;
    char *position; /* the position label's raw value, or NULL */
    double value;
};

static int name_char(int c, int first) {
    return isalpha(c) || c == '_' || c == ':' || (!first && isdigit(c));
}

/* The lines `name{labels} value` of the text exposition format (# lines and the rest skipped) */
static size_t parse_prom(const char *text, size_t len, struct sample **out) {
    size_t n = 0, cap = 0;
    *out = NULL;
    for (size_t at = 0; at < len;) {
        const char *l = text + at;
        const char *nl = memchr(l, '\n', len - at);
        size_t ll = nl ? (size_t)(nl - l) : len - at;
        at += ll + 1;
        if (!ll || l[0] == '#') continue;
        size_t i = 0;
        if (!name_char((unsigned char)l[0], 1)) continue;
        while (i < ll && name_char((unsigned char)l[i], i == 0))
            i++;
        size_t name_end = i, lb = 0, le = 0;
        if (i < ll && l[i] == '{') {
            const char *close = memchr(l + i, '}', ll - i);
            if (close) {
                lb = i;
                le = (size_t)(close - l) + 1;
                i = le;
            }
        }
        size_t ws = i;
        while (i < ll && js_space((unsigned char)l[i]) && l[i] != '\n')
            i++;
        if (i == ws || i == ll) continue;
        size_t vs = i;
        while (i < ll && !js_space((unsigned char)l[i]))
            i++;
        char vbuf[64];
        size_t vl = i - vs < sizeof vbuf - 1 ? i - vs : sizeof vbuf - 1;
        memcpy(vbuf, l + vs, vl);
        vbuf[vl] = 0;
        struct sample s = {.name = l, .nlen = name_end, .position = NULL, .value = js_number(vbuf)};
        /* labels: name="value" pairs (escapes kept raw); only "position" is wanted */
        for (size_t j = lb; j < le;) {
            if (!name_char((unsigned char)l[j], 1) || l[j] == ':') {
                j++;
                continue;
            }
            size_t k = j;
            while (k < le && (isalnum((unsigned char)l[k]) || l[k] == '_'))
                k++;
            if (k + 1 >= le || l[k] != '=' || l[k + 1] != '"') {
                j++;
                continue;
            }
            size_t v0 = k + 2, v = v0;
            while (v < le && l[v] != '"')
                v += l[v] == '\\' && v + 1 < le ? 2 : 1;
            if (v >= le || l[v] != '"') {
                j++;
                continue;
            }
            if (k - j == 8 && !memcmp(l + j, "position", 8)) {
                free(s.position);
                s.position = strndup(l + v0, v - v0);
            }
            j = v + 1;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 256;
            *out = xrealloc(*out, sizeof **out * cap);
        }
        (*out)[n++] = s;
    }
    return n;
}

static int sample_is(const struct sample *s, const char *name) {
    return s->nlen == strlen(name) && !memcmp(s->name, name, s->nlen);
}

static void snap_free(struct snap *s) {
    if (!s) return;
    for (size_t i = 0; i < s->npos; i++)
        free(s->pos[i]);
    free(s->pos);
    free(s->pos_v);
    free(s);
}

static struct snap *spec_snapshot(void) {
    char path[2048], err[256];
    snprintf(path, sizeof path, "%s/metrics", g_url.prefix);
    struct resp r;
    int rc = http_do("GET", path, NULL, 0, now_ms() + 10000, NULL, NULL, &r, err, sizeof err);
    if (rc || r.status < 200 || r.status > 299) {
        buf_free(&r.body);
        return NULL;
    }
    struct sample *sm;
    size_t n = parse_prom(r.body.p ? r.body.p : "", r.body.n, &sm);
    struct snap *s = xrealloc(NULL, sizeof *s);
    memset(s, 0, sizeof *s);
    int has[3] = {0};
    for (size_t i = 0; i < n; i++) {
        if (sample_is(&sm[i], SPEC_NAMES[1][0])) has[1] = 1;
        if (sample_is(&sm[i], SPEC_NAMES[2][0])) has[2] = 1;
        if (sample_is(&sm[i], "tandem_generation_tokens_total")) {
            s->has_generation = 1;
            s->generation += sm[i].value;
        }
    }
    s->flavour = has[1] ? 1 : has[2] ? 2 : 0;
    if (s->flavour) {
        const char **nm = SPEC_NAMES[s->flavour];
        for (size_t i = 0; i < n; i++) {
            if (sample_is(&sm[i], nm[0])) s->drafts += sm[i].value;
            if (sample_is(&sm[i], nm[1])) s->draft_tokens += sm[i].value;
            if (sample_is(&sm[i], nm[2])) s->accepted += sm[i].value;
            if (sample_is(&sm[i], nm[3]) && sm[i].position) {
                size_t k = 0;
                while (k < s->npos && strcmp(s->pos[k], sm[i].position))
                    k++;
                if (k == s->npos) {
                    s->pos = xrealloc(s->pos, sizeof *s->pos * (k + 1));
                    s->pos_v = xrealloc(s->pos_v, sizeof *s->pos_v * (k + 1));
                    s->pos[k] = xstrdup(sm[i].position);
                    s->pos_v[k] = 0;
                    s->npos++;
                }
                s->pos_v[k] += sm[i].value;
            }
        }
    }
    for (size_t i = 0; i < n; i++)
        free(sm[i].position);
    free(sm);
    buf_free(&r.body);
    return s;
}

static const struct snap *g_sort_snap;

static int cmp_pos(const void *a, const void *b) {
    double x = js_number(g_sort_snap->pos[*(const size_t *)a]);
    double y = js_number(g_sort_snap->pos[*(const size_t *)b]);
    return x < y ? -1 : x > y;
}

static json_t *spec_delta(const struct snap *a, const struct snap *b) {
    if (!a || !b || !a->flavour || a->flavour != b->flavour) return json_null();
    double drafts = b->drafts - a->drafts;
    double draft_tokens = b->draft_tokens - a->draft_tokens;
    double accepted = b->accepted - a->accepted;
    size_t *idx = xrealloc(NULL, sizeof *idx * (b->npos + 1));
    for (size_t i = 0; i < b->npos; i++)
        idx[i] = i;
    g_sort_snap = b;
    qsort(idx, b->npos, sizeof *idx, cmp_pos);
    json_t *per = json_array();
    for (size_t i = 0; i < b->npos; i++) {
        const char *key = b->pos[idx[i]];
        double before = 0;
        for (size_t k = 0; k < a->npos; k++)
            if (!strcmp(a->pos[k], key)) before = a->pos_v[k];
        double acc = b->pos_v[idx[i]] - before;
        json_t *p = json_object();
        json_object_set_new(p, "position", jnum(js_number(key)));
        json_object_set_new(p, "accepted", jnum(acc));
        json_object_set_new(p, "rate", drafts > 0 ? jnum(acc / drafts) : json_null());
        json_array_append_new(per, p);
    }
    free(idx);
    json_t *d = json_object();
    json_object_set_new(d, "source", json_string(a->flavour == 1 ? "tandem" : "vllm"));
    json_object_set_new(d, "drafts", jnum(drafts));
    json_object_set_new(d, "draft_tokens", jnum(draft_tokens));
    json_object_set_new(d, "accepted_tokens", jnum(accepted));
    json_object_set_new(d, "acceptance_rate",
                        draft_tokens > 0 ? jnum(accepted / draft_tokens) : json_null());
    json_object_set_new(d, "mean_acceptance_length",
                        drafts > 0 ? jnum(1 + accepted / drafts) : json_null());
    json_object_set_new(d, "per_position", per);
    return d;
}

/* ---- one request */

struct rec {
    long i;
    int ok, usage_seen;
    double ttft, e2e, tpot; /* ms; NAN = null */
    double *itl;
    size_t n_itl, cap_itl;
    double output_tokens, prompt_tokens; /* prompt_tokens NAN = null */
    char *error;
    long chunks;
    double start;
};

/* the SSE stream of one request: `data:` events joined and dispatched at a blank line, `:`
 * comments skipped, nothing after `data: [DONE]`, an {"error": ...} event fails the request */
struct sse {
    struct rec *r;
    struct sbuf line, data;
    int has_data, done;
    double t0, last;
    long text_chunks;
    struct sbuf error;
};

static int sse_event(struct sse *s) {
    if (s->done) return 0;
    const char *d = s->data.p ? s->data.p : "";
    if (!strncmp(d, "[DONE]", 6)) {
        s->done = 1;
        return 0;
    }
    json_error_t e;
    json_t *c = json_loadb(d, s->data.n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
    if (!c) {
        buf_printf(&s->error, "SyntaxError: a stream event that is not JSON: %s", e.text);
        return -1;
    }
    struct rec *r = s->r;
    double now = now_ms();
    int rc = 0;
    if (json_is_object(c)) {
        json_t *err = json_object_get(c, "error");
        if (js_truthy(err)) {
            buf_str(&s->error, "APIError: ");
            api_message(&s->error, 0, err, NULL);
            rc = -1;
            goto out;
        }
        json_t *usage = json_object_get(c, "usage");
        if (js_truthy(usage)) {
            r->usage_seen = 1;
            double ct = jval(json_object_get(usage, "completion_tokens"));
            if (!isnan(ct)) r->output_tokens = ct;
            r->prompt_tokens = jval(json_object_get(usage, "prompt_tokens"));
        }
        json_t *choices = json_object_get(c, "choices");
        if (!json_is_array(choices) || !json_array_size(choices)) goto out;
        /* TTFT at the first chunk with choices, even if its text is empty; every later chunk
         * is one ITL sample (vllm bench serve's rule) */
        if (isnan(r->ttft))
            r->ttft = now - s->t0;
        else {
            if (r->n_itl == r->cap_itl) {
                r->cap_itl = r->cap_itl ? r->cap_itl * 2 : 64;
                r->itl = xrealloc(r->itl, sizeof *r->itl * r->cap_itl);
            }
            r->itl[r->n_itl++] = now - s->last;
        }
        s->last = now;
        r->chunks++;
        json_t *ch = json_array_get(choices, 0);
        json_t *piece = json_object_get(ch, "text");
        if (!piece || json_is_null(piece))
            piece = json_object_get(json_object_get(ch, "delta"), "content");
        if (js_truthy(piece)) s->text_chunks++;
    }
out:
    json_decref(c);
    return rc;
}

static int sse_line(struct sse *s, const char *l, size_t n) {
    if (!n) {
        int rc = s->has_data ? sse_event(s) : 0;
        s->data.n = 0;
        if (s->data.p) s->data.p[0] = 0;
        s->has_data = 0;
        return rc;
    }
    if (l[0] == ':') return 0;
    const char *colon = memchr(l, ':', n);
    size_t fl = colon ? (size_t)(colon - l) : n;
    if (fl == 4 && !memcmp(l, "data", 4)) {
        const char *v = colon ? colon + 1 : l + n;
        if (v < l + n && *v == ' ') v++;
        if (s->has_data) buf_ch(&s->data, '\n');
        buf_add(&s->data, v, (size_t)(l + n - v));
        s->has_data = 1;
    }
    return 0;
}

static int sse_feed(void *ctx, const char *p, size_t n) {
    struct sse *s = ctx;
    while (n) {
        const char *nl = memchr(p, '\n', n);
        if (!nl) {
            buf_add(&s->line, p, n);
            return 0;
        }
        buf_add(&s->line, p, (size_t)(nl - p));
        n -= (size_t)(nl - p) + 1;
        p = nl + 1;
        size_t ln = s->line.n;
        if (ln && s->line.p[ln - 1] == '\r') ln--;
        int rc = sse_line(s, s->line.p ? s->line.p : "", ln);
        s->line.n = 0;
        if (rc < 0) return rc;
    }
    return 0;
}

static void one_request(const struct opts *o, const char *model, json_t *prompt, long i,
                        struct rec *r) {
    memset(r, 0, sizeof *r);
    r->i = i;
    r->ttft = r->e2e = r->tpot = r->prompt_tokens = NAN;
    json_t *b = json_object();
    json_object_set_new(b, "model", json_string(model));
    json_object_set_new(b, "stream", json_true());
    json_object_set_new(b, "stream_options", json_pack("{s:b}", "include_usage", 1));
    json_object_set_new(b, "temperature", jnum(o->temperature));
    if (o->ignore_eos) json_object_set_new(b, "ignore_eos", json_true());
    if (o->temperature > 0) json_object_set_new(b, "seed", jnum(o->seed + (double)i));
    if (o->chat) {
        json_object_set_new(b, "messages",
                            json_pack("[{s:s,s:O}]", "role", "user", "content", prompt));
        json_object_set_new(b, "max_completion_tokens", jnum(o->max_tokens));
    } else {
        json_object_set_new(b, "prompt", json_incref(prompt));
        json_object_set_new(b, "max_tokens", jnum(o->max_tokens));
    }
    struct sbuf body = {0};
    json_out(&body, b, 0, 0);
    json_decref(b);
    char path[2048], err[256] = "";
    snprintf(path, sizeof path, "%s/v1/%s", g_url.prefix,
             o->chat ? "chat/completions" : "completions");
    struct sse s = {.r = r};
    double t0 = now_ms();
    r->start = t0;
    s.t0 = s.last = t0;
    struct resp resp;
    int rc = http_do("POST", path, body.p, body.n, t0 + o->timeout_s * 1000, sse_feed, &s, &resp,
                     err, sizeof err);
    r->e2e = (rc == H_OK ? resp.t_end : now_ms()) - t0;
    struct sbuf msg = {0};
    if (rc == H_OK && resp.status >= 200 && resp.status < 300) {
        if (!r->usage_seen) r->output_tokens = (double)s.text_chunks; /* chunks, not tokens */
        r->ok = !isnan(r->ttft);
        if (!r->ok) buf_str(&msg, "stream ended without chunks");
    } else if (rc == H_OK)
        status_error(&msg, &resp);
    else if (rc == H_ABORT)
        buf_str(&msg, s.error.p ? s.error.p : "aborted");
    else
        transport_error(&msg, rc, err);
    if (msg.n) {
        size_t n = msg.n < 300 ? msg.n : 300;
        while (n < msg.n && n && ((unsigned char)msg.p[n] & 0xC0) == 0x80)
            n--; /* UTF-8 */
        r->error = strndup(msg.p, n);
    }
    r->tpot = r->ok && r->output_tokens > 1 ? (r->e2e - r->ttft) / (r->output_tokens - 1) : NAN;
    buf_free(&msg);
    buf_free(&body);
    buf_free(&resp.body);
    buf_free(&s.line);
    buf_free(&s.data);
    buf_free(&s.error);
}

static void rec_free(struct rec *r) {
    free(r->itl);
    free(r->error);
}

/* ---- the run */

static char *server_model(const struct opts *o, const char *url) {
    char path[2048], err[256] = "";
    snprintf(path, sizeof path, "%s/v1/models", g_url.prefix);
    struct resp r;
    int rc = http_do("GET", path, NULL, 0, now_ms() + o->timeout_s * 1000, NULL, NULL, &r, err,
                     sizeof err);
    struct sbuf msg = {0};
    if (rc)
        buf_str(&msg, err);
    else if (r.status < 200 || r.status > 299)
        status_error(&msg, &r);
    if (msg.n) fail("GET http://%s%s/v1/models: %s", g_url.hostport, g_url.prefix, msg.p);
    json_t *j = json_loadb(r.body.p ? r.body.p : "", r.body.n, 0, NULL);
    json_t *id = json_object_get(json_array_get(json_object_get(j, "data"), 0), "id");
    if (!json_is_string(id)) fail("/v1/models has no model (--url %s; give --model)", url);
    char *m = xstrdup(json_string_value(id));
    json_decref(j);
    buf_free(&r.body);
    return m;
}

struct run {
    const struct opts *o;
    const char *model;
    json_t **prompts;
    long n;
    double *offsets;
    struct rec *recs;
    pthread_t *tids;
    char *started;
    double t0;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    long in_flight, peak, finished;
    pthread_attr_t attr;
};

struct job {
    struct run *R;
    long i;
};

static void *request_thread(void *arg) {
    struct job *j = arg;
    struct run *R = j->R;
    one_request(R->o, R->model, R->prompts[j->i], j->i, &R->recs[j->i]);
    pthread_mutex_lock(&R->mu);
    R->finished++;
    R->in_flight--;
    pthread_cond_broadcast(&R->cv);
    pthread_mutex_unlock(&R->mu);
    return NULL;
}

/* releases request i at t0 + offsets[i] once one of the --concurrency slots is free (slots go
 * in arrival order) */
static void *dispatcher(void *arg) {
    struct run *R = arg;
    struct job *jobs = xrealloc(NULL, sizeof *jobs * (size_t)R->n);
    for (long i = 0; i < R->n; i++) {
        sleep_until(R->t0 + R->offsets[i] * 1000);
        pthread_mutex_lock(&R->mu);
        while ((double)R->in_flight >= R->o->concurrency)
            pthread_cond_wait(&R->cv, &R->mu);
        R->in_flight++;
        if (R->in_flight > R->peak) R->peak = R->in_flight;
        pthread_mutex_unlock(&R->mu);
        jobs[i] = (struct job){.R = R, .i = i};
        int rc = pthread_create(&R->tids[i], &R->attr, request_thread, &jobs[i]);
        if (rc) {
            struct rec *r = &R->recs[i];
            memset(r, 0, sizeof *r);
            r->i = i;
            r->ttft = r->tpot = r->prompt_tokens = NAN;
            r->e2e = 0;
            r->start = now_ms();
            char e[128];
            snprintf(e, sizeof e, "Error: cannot start a request thread: %s", strerror(rc));
            r->error = xstrdup(e);
            pthread_mutex_lock(&R->mu);
            R->finished++;
            R->in_flight--;
            pthread_cond_broadcast(&R->cv);
            pthread_mutex_unlock(&R->mu);
        } else
            R->started[i] = 1;
    }
    /* the jobs must outlive their threads: wait for every one to finish */
    pthread_mutex_lock(&R->mu);
    while (R->finished < R->n)
        pthread_cond_wait(&R->cv, &R->mu);
    pthread_mutex_unlock(&R->mu);
    free(jobs);
    return NULL;
}

struct result {
    double duration;
    long peak;
    double t0;
};

static void run_load(const struct opts *o, const char *model, json_t **prompts, long n,
                     struct rec *recs, struct result *res) {
    struct run R = {.o = o, .model = model, .prompts = prompts, .n = n, .recs = recs};
    R.offsets = arrivals(n, o->rate, o->burstiness, o->seed);
    R.tids = xrealloc(NULL, sizeof *R.tids * (size_t)n);
    R.started = calloc((size_t)n, 1);
    if (!R.started) oom();
    pthread_mutex_init(&R.mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&R.cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_attr_init(&R.attr);
    pthread_attr_setstacksize(&R.attr, (size_t)512 << 10);
    R.t0 = now_ms();
    pthread_t disp;
    int rc = pthread_create(&disp, NULL, dispatcher, &R);
    if (rc) fail("cannot start the dispatcher thread: %s", strerror(rc));
    pthread_mutex_lock(&R.mu);
    double next = R.t0 + 1000;
    while (R.finished < n) {
        struct timespec ts = ms_to_ts(next);
        if (pthread_cond_timedwait(&R.cv, &R.mu, &ts) == ETIMEDOUT) {
            if (!o->quiet)
                fprintf(stderr, "\r%ld/%ld done, %ld in flight   ", R.finished, n, R.in_flight);
            next += 1000;
        }
    }
    pthread_mutex_unlock(&R.mu);
    res->duration = (now_ms() - R.t0) / 1000;
    if (!o->quiet) fprintf(stderr, "\r%60s\r", "");
    pthread_join(disp, NULL);
    for (long i = 0; i < n; i++)
        if (R.started[i]) pthread_join(R.tids[i], NULL);
    res->peak = R.peak;
    res->t0 = R.t0;
    pthread_attr_destroy(&R.attr);
    pthread_cond_destroy(&R.cv);
    pthread_mutex_destroy(&R.mu);
    free(R.offsets);
    free(R.tids);
    free(R.started);
}

static json_t *report(const struct opts *o, const char *model, struct rec *recs, long n,
                      const struct result *res, const struct snap *before, const struct snap *after,
                      long dataset_prompts) {
    long n_ok = 0, n_failed = 0;
    double out = 0, in_tok = 0, chunks = 0;
    size_t n_itl = 0;
    int usage_all = 1;
    for (long i = 0; i < n; i++) {
        struct rec *r = &recs[i];
        if (!r->ok) {
            n_failed++;
            continue;
        }
        n_ok++;
        out += r->output_tokens;
        in_tok += isnan(r->prompt_tokens) ? 0 : r->prompt_tokens;
        chunks += (double)r->chunks;
        n_itl += r->n_itl;
        usage_all &= r->usage_seen;
    }
    double good = NAN;
    if (o->goodput) {
        double st = jval(json_object_get(o->goodput, "ttft"));
        double sp = jval(json_object_get(o->goodput, "tpot"));
        double se = jval(json_object_get(o->goodput, "e2el"));
        good = 0;
        for (long i = 0; i < n; i++) {
            struct rec *r = &recs[i];
            if (r->ok && (isnan(st) || r->ttft <= st) &&
                (isnan(sp) || (isnan(r->tpot) ? 0 : r->tpot) <= sp) && (isnan(se) || r->e2e <= se))
                good++;
        }
    }
    /* peak output tokens/s over 1 s windows: each request's tokens spread over its decode time */
    double *per_s = NULL, peak_out = 0;
    size_t n_s = 0;
    for (long i = 0; i < n; i++) {
        struct rec *r = &recs[i];
        if (!r->ok || !(r->output_tokens > 0)) continue;
        double a = r->start + r->ttft, b = r->start + r->e2e, m = r->output_tokens;
        for (double k = 0; k < m; k++) {
            double t = m == 1 ? a : a + ((b - a) * k) / (m - 1);
            double sec = floor((t - res->t0) / 1000);
            if (!(sec >= 0) || sec > 1e7) continue;
            size_t s = (size_t)sec;
            if (s >= n_s) {
                per_s = xrealloc(per_s, sizeof *per_s * (s + 1));
                for (size_t z = n_s; z <= s; z++)
                    per_s[z] = 0;
                n_s = s + 1;
            }
            if (++per_s[s] > peak_out) peak_out = per_s[s];
        }
    }
    free(per_s);

    json_t *R = json_object();
    json_object_set_new(R, "label", jstr(o->label));
    json_object_set_new(R, "model", json_string(model));
    json_t *c = json_object();
    json_object_set_new(c, "url", json_string(o->url));
    json_object_set_new(c, "dataset", json_string(o->dataset));
    json_object_set_new(c, "dataset_prompts", json_real((double)dataset_prompts));
    json_object_set_new(c, "endpoint", json_string(o->endpoint));
    json_object_set_new(c, "rate", isfinite(o->rate) ? json_real(o->rate) : json_string("inf"));
    json_object_set_new(c, "burstiness", jnum(o->burstiness));
    json_object_set_new(c, "concurrency", jnum(o->concurrency));
    json_object_set_new(c, "num_requests", json_real(o->num_requests));
    json_object_set_new(c, "max_tokens", jnum(o->max_tokens));
    json_object_set_new(c, "temperature", jnum(o->temperature));
    json_object_set_new(c, "ignore_eos", json_boolean(o->ignore_eos));
    json_object_set_new(c, "seed", jnum(o->seed));
    json_object_set_new(c, "goodput_slo_ms", o->goodput ? json_incref(o->goodput) : json_null());
    json_object_set_new(c, "warmup", jnum(o->warmup));
    json_object_set_new(R, "config", c);
    json_object_set_new(R, "completed", json_real((double)n_ok));
    json_object_set_new(R, "failed", json_real((double)n_failed));
    json_t *errors = json_array();
    for (long i = 0; i < n && json_array_size(errors) < 10; i++) {
        if (recs[i].ok) continue;
        const char *e = recs[i].error ? recs[i].error : "";
        int seen = 0;
        for (size_t k = 0; k < json_array_size(errors); k++)
            seen |= !strcmp(json_string_value(json_array_get(errors, k)), e);
        if (!seen) json_array_append_new(errors, json_string(e));
    }
    json_object_set_new(R, "errors", errors);
    double d = res->duration;
    json_object_set_new(R, "duration_s", jnum(d));
    json_object_set_new(R, "total_input_tokens", jnum(in_tok));
    json_object_set_new(R, "total_output_tokens", jnum(out));
    json_object_set_new(R, "usage_reported", json_boolean(usage_all));
    json_object_set_new(R, "request_throughput", jnum((double)n_ok / d));
    json_object_set_new(R, "output_throughput", jnum(out / d));
    json_object_set_new(R, "total_token_throughput", jnum((out + in_tok) / d));
    json_object_set_new(R, "goodput", isnan(good) ? json_null() : jnum(good / d));
    json_object_set_new(R, "good_requests", isnan(good) ? json_null() : json_real(good));
    json_object_set_new(R, "peak_concurrency", json_real((double)res->peak));
    json_object_set_new(R, "peak_output_throughput", json_real(peak_out));
    size_t cap = (size_t)n + n_itl + 1, m = 0;
    double *v = xrealloc(NULL, sizeof *v * cap);
    const char *names[] = {"ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"};
    for (int which = 0; which < 4; which++) {
        m = 0;
        for (long i = 0; i < n; i++) {
            struct rec *r = &recs[i];
            if (!r->ok) continue;
            if (which == 0)
                v[m++] = r->ttft;
            else if (which == 1)
                v[m++] = r->tpot;
            else if (which == 3)
                v[m++] = r->e2e;
            else
                for (size_t k = 0; k < r->n_itl; k++)
                    v[m++] = r->itl[k];
        }
        json_object_set_new(R, names[which], summary(v, m));
    }
    free(v);
    json_object_set_new(R, "chunks_per_request", n_ok ? jnum(chunks / (double)n_ok) : json_null());
    json_object_set_new(R, "speculation", spec_delta(before, after));
    json_object_set_new(R, "server_generation_tokens",
                        before && after && before->has_generation && after->has_generation
                            ? jnum(after->generation - before->generation)
                            : json_null());
    if (o->save_requests) {
        json_t *rs = json_array();
        for (long i = 0; i < n; i++) {
            struct rec *r = &recs[i];
            json_t *q = json_object();
            json_object_set_new(q, "i", json_real((double)r->i));
            json_object_set_new(q, "ok", json_boolean(r->ok));
            json_object_set_new(q, "error", jstr(r->error));
            json_object_set_new(q, "start_ms", jnum(r->start - res->t0));
            json_object_set_new(q, "ttft_ms", jnum(r->ttft));
            json_object_set_new(q, "e2el_ms", jnum(r->e2e));
            json_object_set_new(q, "tpot_ms", jnum(r->tpot));
            json_object_set_new(q, "output_tokens", jnum(r->output_tokens));
            json_object_set_new(q, "prompt_tokens", jnum(r->prompt_tokens));
            json_object_set_new(q, "chunks", json_real((double)r->chunks));
            json_t *itl = json_array();
            for (size_t k = 0; k < r->n_itl; k++)
                json_array_append_new(itl, jnum(r->itl[k]));
            json_object_set_new(q, "itl_ms", itl);
            json_array_append_new(rs, q);
        }
        json_object_set_new(R, "requests", rs);
    }
    return R;
}

/* ---- the text report */

static json_t *jget(json_t *o, const char *a, const char *b) {
    json_t *v = json_object_get(o, a);
    return b ? json_object_get(v, b) : v;
}

/* String(x) of a value in the result */
static const char *vstr(const json_t *v, char *buf, size_t cap) {
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_number(v))
        js_num(json_number_value(v), buf, cap);
    else
        snprintf(buf, cap, "%s", json_is_true(v) ? "true" : json_is_false(v) ? "false" : "null");
    return buf;
}

/* f(x, d): null is n/a, a number x.toFixed(d) */
static const char *fx(const json_t *v, int d, char *buf, size_t cap) {
    if (!v || json_is_null(v)) return "n/a";
    if (json_is_number(v)) {
        js_fixed(json_number_value(v), d, buf, cap);
        return buf;
    }
    return vstr(v, buf, cap);
}

static void L(const char *k, const char *v) {
    char key[128];
    snprintf(key, sizeof key, "%s:", k);
    printf("%-42s%s\n", key, v);
}

static void rule(const char *t) {
    int n = (int)strlen(t);
    if (!n) {
        printf("==================================================\n");
        return;
    }
    int l = (50 - n - 2) / 2, r = 50 - n - 2 - l;
    for (int i = 0; i < l; i++)
        putchar('=');
    printf(" %s ", t);
    for (int i = 0; i < r; i++)
        putchar('=');
    putchar('\n');
}

static void print_result(json_t *r) {
    char a[64], b[64];
    rule("Serving Benchmark Result");
    L("Model", vstr(jget(r, "model", NULL), a, sizeof a));
    L("Endpoint", vstr(jget(r, "config", "endpoint"), a, sizeof a));
    L("Request rate (req/s)", vstr(jget(r, "config", "rate"), a, sizeof a));
    json_t *conc = jget(r, "config", "concurrency");
    L("Max concurrency", json_is_null(conc) ? "none" : vstr(conc, a, sizeof a));
    L("Successful requests", vstr(jget(r, "completed", NULL), a, sizeof a));
    L("Failed requests", vstr(jget(r, "failed", NULL), a, sizeof a));
    L("Benchmark duration (s)", fx(jget(r, "duration_s", NULL), 2, a, sizeof a));
    L("Total input tokens", vstr(jget(r, "total_input_tokens", NULL), a, sizeof a));
    struct sbuf t = {0};
    buf_str(&t, vstr(jget(r, "total_output_tokens", NULL), a, sizeof a));
    if (!json_is_true(jget(r, "usage_reported", NULL)))
        buf_str(&t, " (estimated from chunks: no usage)");
    L("Total generated tokens", t.p);
    L("Request throughput (req/s)", fx(jget(r, "request_throughput", NULL), 2, a, sizeof a));
    if (!json_is_null(jget(r, "goodput", NULL))) {
        t.n = 0;
        buf_printf(&t, "%s (%s within ", fx(jget(r, "goodput", NULL), 2, a, sizeof a),
                   vstr(jget(r, "good_requests", NULL), b, sizeof b));
        json_out(&t, jget(r, "config", "goodput_slo_ms"), 0, 0);
        buf_str(&t, " ms)");
        L("Request goodput (req/s)", t.p);
    }
    L("Output token throughput (tok/s)", fx(jget(r, "output_throughput", NULL), 2, a, sizeof a));
    L("Peak output token throughput (tok/s)",
      fx(jget(r, "peak_output_throughput", NULL), 0, a, sizeof a));
    L("Peak concurrent requests", vstr(jget(r, "peak_concurrency", NULL), a, sizeof a));
    L("Total token throughput (tok/s)",
      fx(jget(r, "total_token_throughput", NULL), 2, a, sizeof a));
    const char *sec[4][3] = {{"Time to First Token", "ttft_ms", "TTFT"},
                             {"Time per Output Token (excl. 1st token)", "tpot_ms", "TPOT"},
                             {"Inter-token Latency", "itl_ms", "ITL"},
                             {"End-to-end Latency", "e2el_ms", "E2EL"}};
    for (int i = 0; i < 4; i++) {
        rule(sec[i][0]);
        json_t *s = jget(r, sec[i][1], NULL);
        const char *rows[4][2] = {
            {"Mean", "mean"}, {"Median", "p50"}, {"P90", "p90"}, {"P99", "p99"}};
        for (int k = 0; k < 4; k++) {
            char key[64];
            snprintf(key, sizeof key, "%s %s (ms)", rows[k][0], sec[i][2]);
            L(key, fx(json_object_get(s, rows[k][1]), 2, a, sizeof a));
        }
    }
    json_t *s = jget(r, "speculation", NULL);
    if (json_is_object(s)) {
        rule("Speculative Decoding");
        json_t *ar = json_object_get(s, "acceptance_rate");
        if (json_is_null(ar))
            L("Acceptance rate (%)", "n/a");
        else {
            json_t *pctv = json_real(100 * json_number_value(ar));
            L("Acceptance rate (%)", fx(pctv, 2, a, sizeof a));
            json_decref(pctv);
        }
        L("Acceptance length", fx(json_object_get(s, "mean_acceptance_length"), 2, a, sizeof a));
        L("Drafts", vstr(json_object_get(s, "drafts"), a, sizeof a));
        L("Draft tokens", vstr(json_object_get(s, "draft_tokens"), a, sizeof a));
        L("Accepted tokens", vstr(json_object_get(s, "accepted_tokens"), a, sizeof a));
        json_t *pp = json_object_get(s, "per_position");
        if (json_array_size(pp)) {
            t.n = 0;
            size_t i;
            json_t *p;
            json_array_foreach(pp, i, p) {
                if (i) buf_ch(&t, ' ');
                buf_str(&t, fx(json_object_get(p, "rate"), 3, a, sizeof a));
            }
            L("Per-position acceptance rate", t.p);
        }
    }
    json_t *errs = jget(r, "errors", NULL);
    if (json_array_size(errs)) {
        rule("Errors");
        size_t i;
        json_t *e;
        json_array_foreach(errs, i, e) printf("%s\n", json_string_value(e));
    }
    rule("");
    buf_free(&t);
    fflush(stdout);
}

int main(int argc, char **argv) {
    clock_gettime(CLOCK_MONOTONIC, &g_base);
    signal(SIGPIPE, SIG_IGN);
    struct opts o;
    parse_args(argc, argv, &o);
    g_auth = o.api_key;
    parse_url(o.url);
    /* one socket a request in flight: as many descriptors as allowed */
    struct rlimit rl;
    if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    long n = (long)o.num_requests, warm = (long)floor(o.warmup);
    struct prompts P;
    load_prompts(o.dataset, n + warm, o.seed, &P);
    resolve(o.url);
    char *model = o.model ? xstrdup(o.model) : server_model(&o, o.url);

    for (long i = 0; i < warm; i++) { /* not measured */
        struct rec r;
        one_request(&o, model, P.picked[n + i], n + i, &r);
        rec_free(&r);
    }
    struct snap *before = spec_snapshot();
    struct rec *recs = calloc((size_t)n, sizeof *recs);
    if (!recs) oom();
    struct result res;
    run_load(&o, model, P.picked, n, recs, &res);
    struct snap *after = spec_snapshot();
    json_t *r = report(&o, model, recs, n, &res, before, after, P.total);
    print_result(r);
    if (o.json) {
        struct sbuf js = {0};
        json_out(&js, r, 2, 0);
        buf_ch(&js, '\n');
        FILE *f = fopen(o.json, "wb");
        if (!f || fwrite(js.p, 1, js.n, f) != js.n || fclose(f))
            fail("%s: %s", o.json, strerror(errno));
        buf_free(&js);
    }
    long completed = (long)json_number_value(json_object_get(r, "completed"));
    json_decref(r);
    snap_free(before);
    snap_free(after);
    for (long i = 0; i < n; i++)
        rec_free(&recs[i]);
    free(recs);
    for (long i = 0; i < P.total; i++)
        json_decref(P.all[i]);
    free(P.all);
    free(P.picked);
    free(model);
    json_decref(o.goodput);
    freeaddrinfo(g_addrs);
    free(g_url.host);
    free(g_url.port);
    free(g_url.hostport);
    free(g_url.prefix);
    return completed == 0 ? 1 : 0;
}
