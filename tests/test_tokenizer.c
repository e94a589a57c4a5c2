/* test_tokenizer.c: the tokenizer against HF tokenizers' own output, plus chat, CLI and speed.
 *
 *   make build/tests/test_tokenizer && build/tests/test_tokenizer     (from the repo root)
 *
 * Fixtures: tests/fixtures/tokenizers/<name>/ made by tools/make_tokenizer_fixtures.py (HF
 * tokenizers 0.23.2, transformers 5.17). Per tokenizer: ids with and without the post-processor
 * must be identical to HF's, decode (with and without special tokens) must give HF's text, the
 * streamed decode must give the same text, and where HF round-trips exactly so must we. Chat
 * ids must equal transformers' apply_chat_template. _components/ checks pre-tokenizer pieces and
 * normalizer output for every Split behavior and normalizer we load. The speed case encodes
 * synthetic English (GPT-2 vocabulary words) and, outside TD_TEST_QUICK, needs >= 10 MB/s.
 */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "check.h"
#include "tokenizer/chat.h"
#include "app/cli.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"

#define FIXDIR "tests/fixtures/tokenizers"

// ---------------------------------------------------------------- helpers

static char *slurp(const char *path, size_t *n) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *p = malloc((size_t)len + 1);
    if (p && fread(p, 1, (size_t)len, fp) != (size_t)len) {
        free(p);
        p = NULL;
    }
    fclose(fp);
    if (p) p[len] = 0;
    if (n) *n = (size_t)len;
    return p;
}

/* the JSON objects of a .jsonl file as an array (NULL if the file is missing) */
static json_t *read_jsonl(const char *path) {
    size_t n;
    char *s = slurp(path, &n);
    if (!s) return NULL;
    json_t *arr = json_array();
    for (char *line = s; line < s + n;) {
        char *nl = memchr(line, '\n', (size_t)(s + n - line));
        size_t len = nl ? (size_t)(nl - line) : (size_t)(s + n - line);
        if (len) {
            json_error_t e;
            json_t *o = json_loadb(line, len, JSON_ALLOW_NUL, &e);
            if (o) json_array_append_new(arr, o);
        }
        line += len + 1;
    }
    free(s);
    return arr;
}

/* a short printable rendering of text, for failure messages */
static const char *show(const char *s, size_t n) {
    static char buf[4][96];
    static int k;
    char *b = buf[k++ & 3];
    size_t o = 0;
    for (size_t i = 0; i < n && o < 80; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != 0x7f && c != '\\')
            b[o++] = (char)c;
        else
            o += (size_t)snprintf(b + o, 96 - o, "\\x%02x", c);
    }
    snprintf(b + o, 96 - o, "%s", n > 0 && o >= 80 ? "..." : "");
    return b;
}

/* ids of a JSON array into v (cleared first) */
static void json_ids(json_t *a, struct tok_ids *v) {
    v->n = 0;
    size_t i;
    json_t *x;
    json_array_foreach(a, i, x) tok_ids_push(v, (int32_t)json_integer_value(x));
}

/* -1 if equal, else the first differing index */
static long ids_diff(const struct tok_ids *a, const struct tok_ids *b) {
    size_t n = a->n < b->n ? a->n : b->n;
    for (size_t i = 0; i < n; i++)
        if (a->ids[i] != b->ids[i]) return (long)i;
    return a->n == b->n ? -1 : (long)n;
}

static int same_text(const char *a, size_t an, json_t *want) {
    return json_is_string(want) && json_string_length(want) == an &&
           !memcmp(a, json_string_value(want), an);
}

static char *stream_decode(const struct tok *t, const struct tok_ids *ids, unsigned flags,
                           size_t *len, int *bad_chunk) {
    struct tok_stream s;
    tok_stream_init(&s, t, flags);
    struct tok_buf all = {0};
    char err[256];
    const char *p;
    size_t k;
    *bad_chunk = 0;
    for (size_t i = 0; i < ids->n; i++) {
        if (tok_stream_push(&s, ids->ids[i], &p, &k, err, sizeof err)) *bad_chunk = 1;
        if (tok_utf8_valid_prefix(p, k) != k) *bad_chunk = 1; // every chunk is whole UTF-8
        tok_buf_put(&all, p, k);
    }
    tok_stream_flush(&s, &p, &k);
    tok_buf_put(&all, p, k);
    tok_buf_put(&all, "", 0);
    tok_stream_free(&s);
    *len = all.n;
    return all.p;
}

static struct tok *load_fixture(const char *name) {
    char dir[256], err[512];
    snprintf(dir, sizeof dir, FIXDIR "/%s", name);
    struct tok *t;
    if (tok_load(&t, dir, err, sizeof err)) {
        case_fail("load: %s", err);
        return NULL;
    }
    return t;
}

// ---------------------------------------------------------------- HF fixtures

static void test_fixture(const char *name) {
    char path[512], cname[128], extra[64];
    snprintf(path, sizeof path, FIXDIR "/%s/cases.jsonl", name);
    json_t *cases = read_jsonl(path);
    snprintf(path, sizeof path, FIXDIR "/%s/meta.json", name);
    json_t *meta = json_load_file(path, 0, NULL);
    int lossless = json_is_true(json_object_get(meta, "lossless"));

    case_begin();
    struct tok *t = load_fixture(name);
    CHECK(cases && json_array_size(cases) > 0, "no cases.jsonl");
    struct tok_ids got = {0}, want = {0};
    char err[512];
    size_t i;
    json_t *c;
    size_t n_cases = t && cases ? json_array_size(cases) : 0;
    for (i = 0; i < n_cases; i++) {
        c = json_array_get(cases, i);
        json_t *text = json_object_get(c, "text");
        const char *s = json_string_value(text);
        size_t n = json_string_length(text);
        for (int plain = 0; plain < 2; plain++) {
            got.n = 0;
            json_ids(json_object_get(c, plain ? "ids_plain" : "ids"), &want);
            if (tok_encode(t, s, n, plain ? 0 : TOK_ENCODE_ADD_SPECIAL, &got, err, sizeof err)) {
                case_fail("'%s': %s", show(s, n), err);
                continue;
            }
            long d = ids_diff(&got, &want);
            CHECK(d < 0, "'%s'%s: id %ld is %d, HF %d (%zu vs %zu ids)", show(s, n),
                  plain ? " (no special)" : "", d, d < (long)got.n ? got.ids[d] : -1,
                  d < (long)want.n ? want.ids[d] : -1, got.n, want.n);
        }
    }
    snprintf(cname, sizeof cname, "tok_%s_encode", name);
    snprintf(extra, sizeof extra, "(%zu texts, ids equal to HF)", n_cases);
    case_end(cname, extra);

    case_begin();
    if (!t) case_fail("no tokenizer");
    int n_lossless = 0;
    for (i = 0; i < n_cases; i++) {
        c = json_array_get(cases, i);
        json_t *text = json_object_get(c, "text");
        static const char *keys[][2] = {
            {"ids", "decoded"}, {"ids", "decoded_skip"}, {"ids_plain", "decoded_plain"}};
        for (int k = 0; k < 3; k++) {
            json_ids(json_object_get(c, keys[k][0]), &want);
            char *out;
            size_t len;
            unsigned fl = k == 1 ? TOK_DECODE_SKIP_SPECIAL : 0;
            if (tok_decode(t, want.ids, want.n, fl, &out, &len, err, sizeof err)) {
                case_fail("decode: %s", err);
                continue;
            }
            json_t *w = json_object_get(c, keys[k][1]);
            CHECK(same_text(out, len, w), "%s of '%s': got '%s', HF '%s'", keys[k][1],
                  show(json_string_value(text), json_string_length(text)), show(out, len),
                  show(json_string_value(w), json_string_length(w)));
            if (k == 2 && lossless) {
                CHECK(same_text(out, len, text), "round trip of '%s' gives '%s'",
                      show(json_string_value(text), json_string_length(text)), show(out, len));
                n_lossless++;
            }
            // streamed, token by token: same text, only whole characters per chunk
            int bad_chunk;
            size_t sl;
            char *st = stream_decode(t, &want, fl, &sl, &bad_chunk);
            CHECK(!bad_chunk, "stream of '%s' handed out a partial character",
                  show(json_string_value(text), json_string_length(text)));
            CHECK(sl == len && !memcmp(st, out, len), "stream of '%s' gives '%s', decode '%s'",
                  show(json_string_value(text), json_string_length(text)), show(st, sl),
                  show(out, len));
            free(st);
            free(out);
        }
    }
    snprintf(cname, sizeof cname, "tok_%s_decode", name);
    snprintf(extra, sizeof extra, "(%zu texts, HF text; stream equal%s)", n_cases,
             lossless ? "; exact round trip" : "");
    case_end(cname, extra);

    // chat, where the fixture has transformers' apply_chat_template output
    snprintf(path, sizeof path, FIXDIR "/%s/chat.jsonl", name);
    json_t *chats = read_jsonl(path);
    if (chats && t) {
        case_begin();
        struct chat ch;
        if (chat_init(&ch, t, err, sizeof err)) case_fail("chat_init: %s", err);
        CHECK(ch.format == CHAT_FORMAT_DEEPSEEK, "format %d, not DeepSeek", ch.format);
        json_array_foreach(chats, i, c) {
            json_t *msgs = json_object_get(c, "messages");
            struct chat_msg m[16] = {{.content = NULL}};
            size_t nm = 0, k;
            json_t *x;
            json_array_foreach(msgs, k, x) {
                const char *role = json_string_value(json_object_get(x, "role"));
                m[nm].role = !strcmp(role, "system") ? CHAT_ROLE_SYSTEM
                             : !strcmp(role, "user") ? CHAT_ROLE_USER
                                                     : CHAT_ROLE_ASSISTANT;
                m[nm++].content = json_string_value(json_object_get(x, "content"));
            }
            int gen = json_is_true(json_object_get(c, "add_generation_prompt"));
            got.n = 0;
            json_ids(json_object_get(c, "ids"), &want);
            if (chat_encode(&ch, m, nm, gen, &got, err, sizeof err)) case_fail("chat: %s", err);
            long d = ids_diff(&got, &want);
            CHECK(d < 0, "chat %zu: id %ld is %d, HF %d", i, d, d < (long)got.n ? got.ids[d] : -1,
                  d < (long)want.n ? want.ids[d] : -1);
            size_t len;
            char *txt = chat_render(&ch, m, nm, gen, &len, err, sizeof err);
            CHECK(txt && same_text(txt, len, json_object_get(c, "text")), "chat %zu renders '%s'",
                  i, txt ? show(txt, len) : "(null)");
            free(txt);
        }
        snprintf(cname, sizeof cname, "tok_%s_chat", name);
        snprintf(extra, sizeof extra, "(%zu conversations, think %s)", json_array_size(chats),
                 ch.think == CHAT_THINK_OFF ? "off" : "none");
        case_end(cname, extra);
    }
    json_decref(chats);
    tok_ids_free(&got);
    tok_ids_free(&want);
    tok_free(t);
    json_decref(cases);
    json_decref(meta);
}

// ---------------------------------------------------------------- components

static struct tok *component_tok(const char *kind, json_t *cfg, char *err, size_t errlen) {
    json_t *root = json_pack("{s:{s:s,s:{},s:[]}}", "model", "type", "BPE", "vocab", "merges");
    json_object_set(root, kind, cfg);
    char *js = json_dumps(root, JSON_COMPACT);
    struct tok *t = NULL;
    tok_load_mem(&t, js, strlen(js), NULL, err, errlen);
    free(js);
    json_decref(root);
    return t;
}

struct pieces {
    const struct tok *t;
    struct tok_buf all; /* pieces separated by \x01 */
};

static int collect(void *ctx, const char *s, size_t n) {
    struct pieces *p = ctx;
    if (p->t->byte_level) // HF shows byte-level pieces in the byte alphabet
        for (size_t i = 0; i < n; i++) {
            unsigned char b = (unsigned char)s[i];
            tok_buf_put(&p->all, p->t->byte_utf8[b], p->t->byte_utf8_n[b]);
        }
    else
        tok_buf_put(&p->all, s, n);
    return tok_buf_put(&p->all, "\x01", 1);
}

static void test_components(void) {
    json_t *rows = read_jsonl(FIXDIR "/_components/pretok.jsonl");
    case_begin();
    CHECK(rows && json_array_size(rows), "no pretok.jsonl");
    size_t i, k, total = 0;
    json_t *r, *c;
    char err[512];
    json_array_foreach(rows, i, r) {
        json_t *cfg = json_object_get(r, "pre_tokenizer");
        struct tok *t = component_tok("pre_tokenizer", cfg, err, sizeof err);
        if (!t) {
            case_fail("config %zu: %s", i, err);
            continue;
        }
        json_array_foreach(json_object_get(r, "cases"), k, c) {
            json_t *text = json_object_get(c, "text");
            struct pieces p = {.t = t, .all = {0}};
            tok_pretokenize(t, json_string_value(text), json_string_length(text), collect, &p);
            struct tok_buf want = {0};
            size_t j;
            json_t *x;
            json_array_foreach(json_object_get(c, "pieces"), j, x) {
                tok_buf_put(&want, json_string_value(x), json_string_length(x));
                tok_buf_put(&want, "\x01", 1);
            }
            char *cs = json_dumps(cfg, JSON_COMPACT);
            CHECK(p.all.n == want.n && (!want.n || !memcmp(p.all.p, want.p, want.n)),
                  "%.60s on '%s': pieces '%s', HF '%s'", cs,
                  show(json_string_value(text), json_string_length(text)), show(p.all.p, p.all.n),
                  show(want.p, want.n));
            free(cs);
            tok_buf_free(&p.all);
            tok_buf_free(&want);
            total++;
        }
        tok_free(t);
    }
    char extra[64];
    snprintf(extra, sizeof extra, "(%zu configurations, %zu texts)",
             rows ? json_array_size(rows) : 0, total);
    case_end("tok_pretokenizers", extra);
    json_decref(rows);

    rows = read_jsonl(FIXDIR "/_components/norm.jsonl");
    case_begin();
    CHECK(rows && json_array_size(rows), "no norm.jsonl");
    total = 0;
    json_array_foreach(rows, i, r) {
        json_t *cfg = json_object_get(r, "normalizer");
        struct tok *t = component_tok("normalizer", cfg, err, sizeof err);
        if (!t) {
            case_fail("config %zu: %s", i, err);
            continue;
        }
        struct tok_buf out = {0};
        json_array_foreach(json_object_get(r, "cases"), k, c) {
            json_t *text = json_object_get(c, "text"), *w = json_object_get(c, "normalized");
            tok_normalize(t, json_string_value(text), json_string_length(text), &out, err,
                          sizeof err);
            char *cs = json_dumps(cfg, JSON_COMPACT);
            CHECK(same_text(out.p ? out.p : "", out.n, w), "%.50s on '%s': '%s', HF '%s'", cs,
                  show(json_string_value(text), json_string_length(text)), show(out.p, out.n),
                  show(json_string_value(w), json_string_length(w)));
            free(cs);
            total++;
        }
        tok_buf_free(&out);
        tok_free(t);
    }
    snprintf(extra, sizeof extra, "(%zu normalizers, %zu texts)", rows ? json_array_size(rows) : 0,
             total);
    case_end("tok_normalizers", extra);
    json_decref(rows);
}

// ---------------------------------------------------------------- behaviour HF cannot show

static void test_invalid_utf8(void) {
    case_begin();
    struct tok *t = load_fixture("gpt2");
    static const struct {
        const char *s;
        size_t n, at;
    } bad[] = {{.s = "abc\xff", .n = 4, .at = 3},          {.s = "\xc0\xaf", .n = 2, .at = 0},
               {.s = "x\xed\xa0\x80", .n = 4, .at = 1},    {.s = "ok \xe2\x82", .n = 5, .at = 3},
               {.s = "\xf4\x90\x80\x80", .n = 4, .at = 0}, {.s = "\x80", .n = 1, .at = 0},
               {.s = "caf\xc3\xa9 \xc3", .n = 7, .at = 6}};
    struct tok_ids ids = {0};
    char err[256], want[64];
    for (size_t i = 0; t && i < sizeof bad / sizeof bad[0]; i++) {
        ids.n = 0;
        int rc = tok_encode(t, bad[i].s, bad[i].n, 0, &ids, err, sizeof err);
        snprintf(want, sizeof want, "at offset %zu", bad[i].at);
        CHECK(rc == -1 && ids.n == 0, "'%s' was accepted", show(bad[i].s, bad[i].n));
        CHECK(rc == -1 && strstr(err, "not valid UTF-8") && strstr(err, want), "'%s': message '%s'",
              show(bad[i].s, bad[i].n), err);
    }
    // a NUL inside the text is a character like any other
    ids.n = 0;
    CHECK(t && !tok_encode(t, "a\0b", 3, 0, &ids, err, sizeof err) && ids.n >= 2, "NUL refused");
    tok_ids_free(&ids);
    tok_free(t);
    case_end("tok_invalid_utf8_refused", "(the message names the first bad byte's offset)");
}

static void test_stream_split_chars(void) {
    case_begin();
    struct tok *t = load_fixture("gpt2");
    char err[256];
    struct tok_ids ids = {0};
    const char *emoji = "\xf0\x9f\x98\x80"; // U+1F600: GPT-2 splits it over two tokens
    if (t) tok_encode(t, emoji, 4, 0, &ids, err, sizeof err);
    CHECK(ids.n >= 2, "😀 is %zu token(s), expected a split", ids.n);
    struct tok_stream s;
    const char *p;
    size_t k, got = 0;
    if (t) {
        tok_stream_init(&s, t, 0);
        for (size_t i = 0; i < ids.n; i++) {
            tok_stream_push(&s, ids.ids[i], &p, &k, err, sizeof err);
            CHECK(i + 1 < ids.n ? k == 0 : k == 4 && !memcmp(p, emoji, 4),
                  "after token %zu: %zu bytes out", i, k);
            got += k;
        }
        tok_stream_flush(&s, &p, &k);
        CHECK(k == 0 && got == 4, "flush gave %zu bytes", k);
        // a cut character at the end comes out as one U+FFFD, as HF's lossy decode
        tok_stream_free(&s);
        tok_stream_init(&s, t, 0);
        tok_stream_push(&s, ids.ids[0], &p, &k, err, sizeof err);
        tok_stream_flush(&s, &p, &k);
        CHECK(k == 3 && !memcmp(p, "\xef\xbf\xbd", 3), "cut character flushed as '%s'", show(p, k));
        CHECK(tok_stream_push(&s, -1, &p, &k, err, sizeof err) == -1 && strstr(err, "-1"),
              "id -1 accepted");
        tok_stream_free(&s);
    }
    // random id sequences (mostly invalid UTF-8): the stream always equals the whole decode
    uint64_t x = 88172645463325252ull;
    int mism = 0;
    for (int r = 0; t && r < (quick_mode() ? 100 : 1000); r++) {
        ids.n = 0;
        xorshift64(&x);
        int len = 1 + (int)(x % 24);
        for (int j = 0; j < len; j++) {
            xorshift64(&x);
            tok_ids_push(&ids, (int32_t)(x % 50257));
        }
        char *whole;
        size_t wn, sn;
        int bad_chunk;
        tok_decode(t, ids.ids, ids.n, 0, &whole, &wn, err, sizeof err);
        char *st = stream_decode(t, &ids, 0, &sn, &bad_chunk);
        mism += bad_chunk || sn != wn || memcmp(st, whole, wn);
        free(st);
        free(whole);
    }
    CHECK(mism == 0, "%d random sequences stream differently", mism);
    tok_ids_free(&ids);
    tok_free(t);
    case_end("tok_stream_split_characters", "");
}

/* random valid UTF-8 (ASCII, Latin, CJK, emoji, combining marks, controls) and a 200k-space run
 * round-trip exactly through the byte-level tokenizers without a normalizer */
static void test_random_round_trip(void) {
    static const uint32_t lo[] = {0x20,   0x00,    0xC0,    0x300, 0x4E00,
                                  0xAC00, 0x1F300, 0x10000, 0xE000};
    static const uint32_t span[] = {95, 32, 400, 112, 2000, 500, 700, 60000, 100};
    const char *names[] = {"gpt2", "deepseek_v3"};
    case_begin();
    uint64_t x = 0x2545F4914F6CDD1Dull;
    int fails = 0, total = 0;
    struct tok_buf s = {0};
    struct tok_ids ids = {0};
    char err[256];
    for (int k = 0; k < 2; k++) {
        struct tok *t = load_fixture(names[k]);
        for (int r = 0; t && r < (quick_mode() ? 50 : 300); r++) {
            s.n = 0;
            xorshift64(&x);
            int len = 1 + (int)(x % 64);
            for (int j = 0; j < len; j++) {
                xorshift64(&x);
                int c = (int)(x % 9);
                uint32_t cp = lo[c] + (uint32_t)((x >> 8) % span[c]);
                if (cp >= 0xD800 && cp < 0xE000) cp = 'x';
                char u[4];
                tok_buf_put(&s, u, (size_t)tok_utf8_put(u, cp));
            }
            ids.n = 0;
            char *back = NULL;
            size_t bn = 0;
            int bad = tok_encode(t, s.p, s.n, 0, &ids, err, sizeof err) ||
                      tok_decode(t, ids.ids, ids.n, 0, &back, &bn, err, sizeof err) || bn != s.n ||
                      memcmp(back, s.p, s.n);
            if (bad && !fails) case_fail("%s: '%s' does not round-trip", names[k], show(s.p, s.n));
            fails += bad;
            total++;
            free(back);
        }
        // one huge piece: the merge heap, not the cache, does the work
        s.n = 0;
        for (int j = 0; j < 200000; j++)
            tok_buf_put(&s, j % 1000 ? " " : "\n", 1);
        ids.n = 0;
        char *back = NULL;
        size_t bn = 0;
        CHECK(t && !tok_encode(t, s.p, s.n, 0, &ids, err, sizeof err) &&
                  !tok_decode(t, ids.ids, ids.n, 0, &back, &bn, err, sizeof err) && bn == s.n &&
                  !memcmp(back, s.p, s.n),
              "%s: 200k whitespace run does not round-trip", names[k]);
        free(back);
        tok_free(t);
    }
    char extra[64];
    snprintf(extra, sizeof extra, "(%d random texts, %d differ)", total, fails);
    tok_buf_free(&s);
    tok_ids_free(&ids);
    case_end("tok_random_round_trip", extra);
}

/* the spans of pattern pat over text as "s e m;" triples; -1 when pat does not compile */
static int re_spans_text(const char *pat, const char *text, struct tok_buf *out, char *err,
                         size_t errlen) {
    struct tok_re re;
    if (tok_re_compile(&re, pat, strlen(pat), 0, err, errlen)) return -1;
    struct tok_spans sp = {0};
    int rc = tok_re_spans(&re, text, strlen(text), &sp);
    for (size_t i = 0; !rc && i < sp.n; i++) {
        char one[64];
        snprintf(one, sizeof one, "%zu %zu %d;", sp.v[i].off, sp.v[i].len, sp.v[i].is_match);
        tok_buf_put(out, one, strlen(one));
    }
    free(sp.v);
    tok_re_free(&re);
    return rc;
}

/* Oniguruma's syntax as DeepSeek's tokenizer.json may spell it (released_formats.md 4.6): a
 * \uHHHH escape is a code point (PCRE2 alone refuses it), inside a class and outside; \s is
 * Oniguruma's White_Space, without U+180E */
static void test_oniguruma_escapes(void) {
    case_begin();
    char err[512] = "";
    const char *text = "漢字かなカナabc 123　龥ゟヿ\xe1\xa0\x8e x";
    struct tok_buf lit = {0}, esc = {0};
    int a = re_spans_text("[一-龥぀-ゟ゠-ヿ]+", text, &lit, err, sizeof err);
    CHECK(!a, "the literal CJK class: %s", err);
    int b = re_spans_text("[\\u4e00-\\u9fa5\\u3040-\\u309f\\u30a0-\\u30ff]+", text, &esc, err,
                          sizeof err);
    CHECK(!b, "the CJK class in \\u escapes does not compile: %s", err);
    CHECK(!a && !b && lit.n == esc.n && !memcmp(lit.p, esc.p, lit.n),
          "\\u escapes split '%s' as %.*s, the literal class as %.*s", text, (int)esc.n, esc.p,
          (int)lit.n, lit.p);
    tok_buf_free(&lit), tok_buf_free(&esc);
    struct tok_buf one = {0};
    CHECK(!re_spans_text("\\u0041+", "xAAy", &one, err, sizeof err) && one.n &&
              !strcmp(one.p, "0 1 0;1 2 1;3 1 0;"),
          "\\u0041+ over xAAy: %s %s", one.p ? one.p : "", err);
    tok_buf_free(&one);
    // \s: U+3000 is white space for both engines, U+180E only for PCRE2's own \s
    struct tok_buf ws = {0};
    CHECK(!re_spans_text("\\s",
                         "a\xe3\x80\x80"
                         "b\xe1\xa0\x8e"
                         "c",
                         &ws, err, sizeof err) &&
              ws.n && !strcmp(ws.p, "0 1 0;1 3 1;4 5 0;"),
          "\\s over a U+3000 b U+180E c: %s %s", ws.p ? ws.p : "", err);
    tok_buf_free(&ws);
    // an escape PCRE2 cannot take still fails with the pattern named
    struct tok_buf bad = {0};
    CHECK(re_spans_text("\\u12", "x", &bad, err, sizeof err) && strstr(err, "does not compile"),
          "a short \\u escape: %s", err);
    tok_buf_free(&bad);
    case_end("tok_oniguruma_escapes", "(\\uHHHH in and out of classes, \\s without U+180E)");
}

static void refuse(const char *name, const char *json, const char *want) {
    case_begin();
    struct tok *t = NULL;
    char err[512] = "";
    int rc = tok_load_mem(&t, json, strlen(json), NULL, err, sizeof err);
    CHECK(rc == -1 && !t, "accepted");
    CHECK(strstr(err, want), "message '%s' lacks '%s'", err, want);
    tok_free(t);
    case_end(name, "");
}

#define MODEL                                                                                      \
    "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\"]}"

static void test_refusals(void) {
    refuse("tok_refuses_wordpiece", "{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}",
           "WordPiece");
    refuse("tok_refuses_metaspace",
           "{" MODEL ",\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":["
           "{\"type\":\"Digits\"},{\"type\":\"Metaspace\",\"replacement\":\"_\"}]}}",
           "pre_tokenizer.pretokenizers[1]: pre-tokenizer Metaspace is not supported");
    refuse("tok_refuses_bert_normalizer",
           "{" MODEL ",\"normalizer\":{\"type\":\"BertNormalizer\"}}", "BertNormalizer");
    refuse("tok_refuses_wordpiece_decoder", "{" MODEL ",\"decoder\":{\"type\":\"WordPiece\"}}",
           "decoder WordPiece");
    refuse("tok_refuses_unknown_post", "{" MODEL ",\"post_processor\":{\"type\":\"Foo\"}}",
           "post-processor Foo");
    // 2^32 + 5 narrowed to int32 was id 5, a real token
    refuse("tok_refuses_post_id_past_int32",
           "{" MODEL ",\"post_processor\":{\"type\":\"RobertaProcessing\","
           "\"cls\":[\"a\",0],\"sep\":[\"a\",4294967301]}}",
           "post-processor id 4294967301 is not a token id");
    refuse("tok_refuses_truncation", "{" MODEL ",\"truncation\":{\"max_length\":8}}", "truncation");
    refuse("tok_refuses_bad_regex",
           "{" MODEL ",\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},"
           "\"behavior\":\"Isolated\",\"invert\":false}}",
           "does not compile");
    refuse("tok_refuses_bad_merge",
           "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a c\"]}}",
           "merges[0]: 'c' is not in the vocab");
    refuse("tok_refuses_dropout",
           "{\"model\":{\"type\":\"BPE\",\"dropout\":0.1,\"vocab\":{},\"merges\":[]}}", "dropout");
    refuse("tok_refuses_bad_json", "{\"model\": [", "tokenizer.json: line 1");
    // issue 20: valid JSON that is not an object said "line -1: " and no reason
    refuse("tok_refuses_array_tokenizer_json", "[1, 2]",
           "tokenizer.json: the top level is an array, not an object");
    case_begin();
    const char *model = "{" MODEL "}";
    struct tok *tc = NULL;
    char cerr[512] = "";
    CHECK(tok_load_mem(&tc, model, strlen(model), "[]", cerr, sizeof cerr) == -1 && !tc,
          "accepted");
    CHECK(!strcmp(cerr, "tokenizer_config.json: the top level is an array, not an object"),
          "message '%s'", cerr);
    tok_free(tc);
    case_end("tok_refuses_array_tokenizer_config", "");
    case_begin();
    struct tok *t;
    char err[512];
    CHECK(tok_load(&t, "/nonexistent/dir", err, sizeof err) == -1 && strstr(err, "cannot open"),
          "missing dir: '%s'", err);
    case_end("tok_refuses_missing_dir", "");
}

/* the peak resident set of this process so far, in MiB */
static long peak_rss_mib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / 1024;
}

/* issue 9: the id tables were sized by the largest id, so one id of 2^30 - 1 in a 68-byte file
 * reserved 13 GB (5.4 GB resident) and loaded */
static void test_huge_ids(void) {
    static const struct {
        const char *name, *json, *want;
    } c[] = {
        {.name = "tok_refuses_huge_vocab_id",
         .json = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 1073741823}, \"merges\": []}}",
         .want = "model.vocab[\"a\"]: id 1073741823 is past the tokens the file holds (ids must be "
                 "below 1026)"},
        {.name = "tok_refuses_huge_added_id",
         .json = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
                 "\"added_tokens\":[{\"id\":1073741823,\"content\":\"<x>\"}]}",
         .want =
             "added_tokens[0]: id 1073741823 is past the tokens the file holds (ids must be below "
             "1028)"},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        case_begin();
        long before = peak_rss_mib();
        struct tok *t = NULL;
        char err[512] = "";
        int rc = tok_load_mem(&t, c[i].json, strlen(c[i].json), NULL, err, sizeof err);
        long grew = peak_rss_mib() - before;
        CHECK(rc == -1 && !t, "accepted (the peak resident set grew %ld MiB)", grew);
        CHECK(strstr(err, c[i].want), "message '%s' lacks '%s'", err, c[i].want);
        CHECK(grew < 256, "the peak resident set grew %ld MiB", grew);
        tok_free(t);
        case_end(c[i].name, "");
    }
    // holes in the id space stay allowed up to the bound (2 * 3 entries + 1024)
    case_begin();
    const char *holes = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":7},\"merges\":[]},"
                        "\"added_tokens\":[{\"id\":1029,\"content\":\"<x>\"}]}";
    struct tok *t = NULL;
    char err[512] = "";
    CHECK(!tok_load_mem(&t, holes, strlen(holes), NULL, err, sizeof err), "refused: %s", err);
    if (t) {
        CHECK(tok_n_vocab(t) == 1030 && tok_id(t, "<x>", 3) == 1029 && tok_id(t, "b", 1) == 7 &&
                  !tok_str(t, 3, NULL),
              "n_vocab %d, <x> %d", tok_n_vocab(t), tok_id(t, "<x>", 3));
        tok_free(t);
    }
    case_end("tok_id_holes_below_the_bound", "");
}

/* issue 17: a word that encodes to nothing (no vocab entry, no unk) into an empty id list formed
 * NULL + 0 when it was cached; Strip's start and stop were cast to int unchecked, and the
 * starts of Strip decoders after Fuse were summed in an int that overflowed */
static void test_strip_and_empty_words(void) {
    case_begin();
    const char *json = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}";
    struct tok *t = NULL;
    char err[512] = "";
    CHECK(!tok_load_mem(&t, json, strlen(json), NULL, err, sizeof err), "load: %s", err);
    for (int rep = 0; t && rep < 2; rep++) { // the second time from the word cache
        struct tok_ids ids = {0};
        CHECK(!tok_encode(t, "b", 1, 0, &ids, err, sizeof err) && ids.n == 0, "'b': %zu ids",
              ids.n);
        CHECK(!tok_encode(t, "ba", 2, 0, &ids, err, sizeof err) && ids.n == 1 && ids.ids[0] == 0,
              "'ba': %zu ids", ids.n);
        tok_ids_free(&ids);
    }
    tok_free(t);
    case_end("tok_encode_word_to_nothing", "");

#define STRIP_TOK(start, stop)                                                                     \
    "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"_\":0},\"merges\":[]},\"decoder\":{\"type\":"       \
    "\"Sequence\",\"decoders\":[{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\"_\","        \
    "\"start\":" start ",\"stop\":" stop                                                           \
    "},{\"type\":\"Strip\",\"content\":\"_\",\"start\":" start ",\"stop\":" stop "}]}}"
    refuse("tok_refuses_strip_negative_start", STRIP_TOK("-1", "0"),
           "decoder.decoders[1]: Strip start -1 is out of range (0..1048576)");
    refuse("tok_refuses_strip_huge_start", STRIP_TOK("2147483647", "0"),
           "decoder.decoders[1]: Strip start 2147483647 is out of range (0..1048576)");
    refuse("tok_refuses_strip_huge_stop", STRIP_TOK("1", "1099511627776"),
           "decoder.decoders[1]: Strip stop 1099511627776 is out of range (0..1048576)");
#undef STRIP_TOK

    // 2100 Strip decoders of the largest start: their sum is past INT_MAX
    case_begin();
    struct tok_buf j = {0};
    const char *head = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"_\":0,\"a\":1},\"merges\":[]},"
                       "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Fuse\"}";
    const char *strip = ",{\"type\":\"Strip\",\"content\":\"_\",\"start\":1048576,\"stop\":0}";
    tok_buf_put(&j, head, strlen(head));
    for (int i = 0; i < 2100; i++)
        tok_buf_put(&j, strip, strlen(strip));
    tok_buf_put(&j, "]}}", 3);
    t = NULL;
    CHECK(!tok_load_mem(&t, j.p, j.n, NULL, err, sizeof err), "load: %s", err);
    if (t) {
        int32_t v[] = {0, 0, 1, 0};
        struct tok_ids ids = {.ids = v, .n = 4, .cap = 4};
        char *text = NULL;
        size_t n = 0;
        CHECK(!tok_decode(t, v, 4, 0, &text, &n, err, sizeof err) && text && !strcmp(text, "a_"),
              "decode '%s'", text ? text : err);
        int bad = 0;
        char *st = stream_decode(t, &ids, 0, &n, &bad);
        CHECK(!bad && st && !strcmp(st, "a_"), "stream '%s'", st ? st : "");
        free(text);
        free(st);
        tok_free(t);
    }
    tok_buf_free(&j);
    case_end("tok_stream_strip_starts_summed", "(2100 Strip decoders after Fuse)");
}

/* tok_load(dir) must fail within 10 s with a message holding want. It runs in a child whose
 * alarm ends it, so a load that blocks fails its case instead of the whole run. */
static void load_refused(const char *name, const char *dir, const char *want) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(10);
        case_begin();
        struct tok *t = NULL;
        char err[1024] = "";
        int rc = tok_load(&t, dir, err, sizeof err);
        CHECK(rc == -1 && !t, "loaded");
        CHECK(strstr(err, want), "message '%s' lacks '%s'", err, want);
        tok_free(t);
        case_end(name, "");
        _exit(check_case_failed); // no exit handlers: the parent's state is not the child's
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid || WIFSIGNALED(st)) {
        case_begin();
        case_fail("%s", pid < 0                                      ? "fork failed"
                        : WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM ? "hung (no answer after 10 s)"
                                                                     : "the load crashed");
        case_end(name, "");
    } else if (WEXITSTATUS(st)) {
        check_failures++;
    }
}

/* issue 12: a FIFO named tokenizer.json blocked the load forever, and tokenizer_config.json
 * linked to /dev/zero was read until memory ran out; the files had no size limit */
static void test_special_files(void) {
    char dir[] = "/tmp/td_tok_specialXXXXXX", path[512], good[512], msg[1024];
    if (!mkdtemp(dir) || !realpath(FIXDIR "/charbpe/tokenizer.json", good)) {
        case_begin();
        case_fail("setup");
        case_end("tok_refuses_fifo_tokenizer_json", "");
        return;
    }
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    mkfifo(path, 0600);
    snprintf(msg, sizeof msg, "%s is not a regular file", path);
    load_refused("tok_refuses_fifo_tokenizer_json", dir, msg);
    unlink(path);
    // a tokenizer.json past 256 MiB (sparse: nothing is written)
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
        if (ftruncate(fd, (off_t)(256u << 20) + 1)) perror("ftruncate");
        close(fd);
    }
    snprintf(msg, sizeof msg, "%s is 268435457 bytes, over the limit of 256 MiB", path);
    load_refused("tok_refuses_huge_tokenizer_json", dir, msg);
    unlink(path);
    // a good tokenizer.json beside a bad tokenizer_config.json
    if (symlink(good, path)) perror("symlink");
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (symlink("/dev/zero", path)) perror("symlink");
    snprintf(msg, sizeof msg, "%s is not a regular file", path);
    load_refused("tok_refuses_dev_zero_tokenizer_config", dir, msg);
    unlink(path);
    mkfifo(path, 0600);
    load_refused("tok_refuses_fifo_tokenizer_config", dir, msg);
    unlink(path);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
        if (ftruncate(fd, (off_t)(16u << 20) + 1)) perror("ftruncate");
        close(fd);
    }
    snprintf(msg, sizeof msg, "%s is 16777217 bytes, over the limit of 16 MiB", path);
    load_refused("tok_refuses_huge_tokenizer_config", dir, msg);
    unlink(path);
    // issue 20: the message names the file it is about, tokenizer_config.json, and why
    FILE *fp = fopen(path, "w");
    if (fp) {
        fputs("\"x\"\n", fp);
        fclose(fp);
    }
    snprintf(msg, sizeof msg, "%s: the top level is a string, not an object", path);
    load_refused("tok_refuses_string_tokenizer_config", dir, msg);
    unlink(path);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    unlink(path);
    rmdir(dir);
}

/* The V4 chat format's rendered tool-free examples (released_formats.md 4.7, from the reference
 * encoding_dsv4.py) come out of the V3.1 layout too: tandem8k has </think> but no
 * <｜latest_reminder｜>, so this is the V3 path (the V4 encoder itself: tests/test_chat.c). Chat
 * mode closes the think block at the generation prompt, thinking mode opens it, and an earlier
 * assistant turn keeps only its answer after </think> */
static void test_chat_v4_examples(void) {
    case_begin();
    struct tok *t = load_fixture("tandem8k");
    char err[512];
    struct chat c;
    CHECK(t && !chat_init(&c, t, err, sizeof err), "tandem8k: %s", t ? err : "missing");
    if (!check_case_failed) {
        const char *sys = "You are a helpful assistant.";
        struct chat_msg one[] = {{.role = CHAT_ROLE_SYSTEM, .content = sys},
                                 {.role = CHAT_ROLE_USER, .content = "What is 2+2?"}};
        struct chat_msg two[] = {{.role = CHAT_ROLE_SYSTEM, .content = sys},
                                 {.role = CHAT_ROLE_USER, .content = "hello"},
                                 {.role = CHAT_ROLE_ASSISTANT, .content = "Hello! I am DeepSeek."},
                                 {.role = CHAT_ROLE_USER, .content = "1+1=?"}};
        struct {
            const char *name;
            enum chat_think think;
            const struct chat_msg *m;
            int n;
            const char *want;
        } ex[] = {
            {.name = "chat, one turn",
             .think = CHAT_THINK_OFF,
             .m = one,
             .n = 2,
             .want = "<｜begin▁of▁sentence｜>You are a helpful assistant.<｜User｜>What is "
                     "2+2?<｜Assistant｜></think>"},
            {.name = "thinking, one turn",
             .think = CHAT_THINK_ON,
             .m = one,
             .n = 2,
             .want = "<｜begin▁of▁sentence｜>You are a helpful assistant.<｜User｜>What is "
                     "2+2?<｜Assistant｜><think>"},
            {.name = "thinking, second turn",
             .think = CHAT_THINK_ON,
             .m = two,
             .n = 4,
             .want = "<｜begin▁of▁sentence｜>You are a helpful "
                     "assistant.<｜User｜>hello<｜Assistant｜></think>Hello! I am "
                     "DeepSeek.<｜end▁of▁sentence｜><｜User｜>1+1=?<｜Assistant｜><think>"},
        };
        for (size_t i = 0; i < sizeof ex / sizeof *ex; i++) {
            c.think = ex[i].think;
            size_t n;
            char *got = chat_render(&c, ex[i].m, ex[i].n, 1, &n, err, sizeof err);
            CHECK(got && !strcmp(got, ex[i].want), "%s: '%s'", ex[i].name, got ? show(got, n) : "");
            free(got);
        }
    }
    if (t) tok_free(t);
    case_end("tok_chat_v4_examples", "(chat and thinking, one and two turns, on the V3.1 layout)");
}

static void test_chat_layouts(void) {
    // generic fallbacks, checked against the documented layouts (HF has no fixture for them)
    case_begin();
    const char *chatml =
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]},"
        "\"added_tokens\":[{\"id\":0,\"content\":\"<|im_start|>\",\"special\":true},"
        "{\"id\":1,\"content\":\"<|im_end|>\",\"special\":true}],"
        "\"pre_tokenizer\":{\"type\":\"ByteLevel\"},\"decoder\":{\"type\":\"ByteLevel\"}}";
    struct tok *t = NULL;
    char err[512];
    struct chat c;
    struct chat_msg m[] = {{.role = CHAT_ROLE_SYSTEM, .content = "S"},
                           {.role = CHAT_ROLE_USER, .content = "U"},
                           {.role = CHAT_ROLE_ASSISTANT, .content = "A"}};
    if (tok_load_mem(&t, chatml, strlen(chatml), NULL, err, sizeof err)) case_fail("%s", err);
    if (t) {
        chat_init(&c, t, err, sizeof err);
        CHECK(c.format == CHAT_FORMAT_CHATML, "format %d", c.format);
        size_t n;
        char *s = chat_render(&c, m, 3, 1, &n, err, sizeof err);
        const char *want = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
                           "<|im_start|>assistant\nA<|im_end|>\n<|im_start|>assistant\n";
        CHECK(s && !strcmp(s, want), "chatml '%s'", s ? show(s, n) : "");
        free(s);
        tok_free(t);
    }
    t = load_fixture("gpt2");
    if (t) {
        chat_init(&c, t, err, sizeof err);
        CHECK(c.format == CHAT_FORMAT_PLAIN, "gpt2 format %d", c.format);
        size_t n;
        char *s = chat_render(&c, m, 3, 1, &n, err, sizeof err);
        const char *want = "<|endoftext|>System: S\n\nUser: U\n\nAssistant: A<|endoftext|>\n\n"
                           "Assistant:";
        CHECK(s && !strcmp(s, want), "plain '%s'", s ? show(s, n) : "");
        free(s);
        struct tok_ids ids = {0};
        CHECK(!chat_encode(&c, m, 3, 1, &ids, err, sizeof err) && ids.n > 5 && ids.ids[0] == 50256,
              "plain ids");
        tok_ids_free(&ids);
        tok_free(t);
    }
    // DeepSeek with thinking on: the generation prompt opens <think>, past turns close it
    t = load_fixture("tandem8k");
    if (t) {
        chat_init(&c, t, err, sizeof err);
        CHECK(c.think == CHAT_THINK_OFF, "tandem8k think %d", c.think);
        c.think = CHAT_THINK_ON;
        size_t n;
        char *s = chat_render(&c, m, 3, 1, &n, err, sizeof err);
        const char *want = "<｜begin▁of▁sentence｜>S<｜User｜>U<｜Assistant｜></think>A"
                           "<｜end▁of▁sentence｜><｜Assistant｜><think>";
        CHECK(s && !strcmp(s, want), "thinking '%s'", s ? show(s, n) : "");
        free(s);
        tok_free(t);
    }
    case_end("tok_chat_fallback_layouts", "(ChatML, plain, DeepSeek thinking)");
}

// ---------------------------------------------------------------- CLI

/* run fn(argc, argv) with stdout and stderr in files; returns its status */
static int run_cli(int (*fn)(int, char **), const char *const *args, char *out, size_t outn,
                   char *errs, size_t errn) {
    char *argv[16];
    int argc = 0;
    while (args[argc]) {
        argv[argc] = (char *)args[argc];
        argc++;
    }
    fflush(stdout);
    fflush(stderr);
    char po[] = "/tmp/td_tok_outXXXXXX", pe[] = "/tmp/td_tok_errXXXXXX";
    int fo = mkstemp(po), fe = mkstemp(pe);
    int so = dup(1), se = dup(2);
    dup2(fo, 1);
    dup2(fe, 2);
    int rc = fn(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(so, 1);
    dup2(se, 2);
    close(so);
    close(se);
    ssize_t k = pread(fo, out, outn - 1, 0);
    out[k > 0 ? k : 0] = 0;
    k = pread(fe, errs, errn - 1, 0);
    errs[k > 0 ? k : 0] = 0;
    close(fo);
    close(fe);
    unlink(po);
    unlink(pe);
    return rc;
}

static void test_cli(void) {
    char out[4096], errs[4096];
    const char *gpt2 = FIXDIR "/gpt2", *ds = FIXDIR "/deepseek_v3";
    case_begin();
    const char *a1[] = {"--model", gpt2, "--text", "Hello world", NULL};
    int rc = run_cli(cmd_tokenize, a1, out, sizeof out, errs, sizeof errs);
    CHECK(rc == 0 && !strcmp(out, "15496 995\n"), "tokenize: rc %d, '%s' '%s'", rc, out, errs);
    const char *a2[] = {"--model", ds, "--text", "Hi <｜User｜>", NULL};
    rc = run_cli(cmd_tokenize, a2, out, sizeof out, errs, sizeof errs);
    CHECK(rc == 0 && !strncmp(out, "0 ", 2), "tokenize adds BOS: '%s'", out);
    const char *a3[] = {"--model", ds, "--text", "Hi", "--no-special", NULL};
    rc = run_cli(cmd_tokenize, a3, out, sizeof out, errs, sizeof errs);
    CHECK(rc == 0 && strncmp(out, "0 ", 2) && strchr(out, '\n'), "--no-special: '%s'", out);
    const char *d1[] = {"--model", gpt2, "--ids", "15496 995 50256", NULL};
    rc = run_cli(cmd_detokenize, d1, out, sizeof out, errs, sizeof errs);
    CHECK(rc == 0 && !strcmp(out, "Hello world<|endoftext|>"), "detokenize: '%s'", out);
    const char *d2[] = {"--model", gpt2, "--ids", "15496,995 50256", "--skip-special", NULL};
    rc = run_cli(cmd_detokenize, d2, out, sizeof out, errs, sizeof errs);
    CHECK(rc == 0 && !strcmp(out, "Hello world"), "--skip-special: '%s'", out);
    // the file route, with bytes that are not UTF-8
    const char *path = "/tmp/td_tok_bad.txt";
    FILE *fp = fopen(path, "wb");
    fputs("ok \xff\xfe", fp);
    fclose(fp);
    const char *a4[] = {"--model", gpt2, "--file", path, NULL};
    rc = run_cli(cmd_tokenize, a4, out, sizeof out, errs, sizeof errs);
    CHECK(rc == 1 && strstr(errs, "not valid UTF-8") && strstr(errs, "offset 3") && !*out,
          "invalid file: rc %d '%s'", rc, errs);
    fp = fopen(path, "wb");
    fputs("Hello world", fp);
    fclose(fp);
    rc = run_cli(cmd_tokenize, a4, out, sizeof out, errs, sizeof errs);
    CHECK(rc == 0 && !strcmp(out, "15496 995\n"), "file: '%s'", out);
    unlink(path);
    case_end("tok_cli", "(tokenize, detokenize, --file, --no-special, --skip-special)");

    static const struct {
        int det;
        const char *args[8];
        int rc;
        const char *want;
    } bad[] = {
        {.det = 0, .args = {"--text", "x", NULL}, .rc = 2, .want = "--model DIR is required"},
        {.det = 0, .args = {"--model", FIXDIR "/gpt2", NULL}, .rc = 2, .want = "exactly one of"},
        {.det = 0,
         .args = {"--model", FIXDIR "/gpt2", "--text", "x", "--file", "y", NULL},
         .rc = 2,
         .want = "exactly one"},
        {.det = 0,
         .args = {"--model", "/nonexistent", "--text", "x", NULL},
         .rc = 1,
         .want = "cannot open"},
        {.det = 0,
         .args = {"--model", FIXDIR "/gpt2", "--file", "/nonexistent", NULL},
         .rc = 1,
         .want = "cannot open"},
        {.det = 0,
         .args = {"--model", FIXDIR "/gpt2", "--file", "/dev/zero", NULL},
         .rc = 1,
         .want = "more than 256 MiB of text"},
        {.det = 0,
         .args = {"--model", FIXDIR "/gpt2", "--bogus", NULL},
         .rc = 2,
         .want = "unknown option"},
        {.det = 0,
         .args = {"--model", FIXDIR "/gpt2", "--text", "\xc3(", NULL},
         .rc = 1,
         .want = "not valid UTF-8"},
        {.det = 1,
         .args = {"--model", FIXDIR "/gpt2", "--ids", "1 x", NULL},
         .rc = 2,
         .want = "not a list of token ids"},
        {.det = 1,
         .args = {"--model", FIXDIR "/gpt2", "--ids", "-3", NULL},
         .rc = 2,
         .want = "not a list"},
        {.det = 1,
         .args = {"--model", FIXDIR "/gpt2", "--ids", "99999999", NULL},
         .rc = 1,
         .want = "names no token"},
        {.det = 1,
         .args = {"--model", FIXDIR "/gpt2", NULL},
         .rc = 2,
         .want = "--ids LIST is required"},
        {.det = 1,
         .args = {"--model", FIXDIR "/gpt2", "--ids", NULL},
         .rc = 2,
         .want = "needs a value"},
    };
    case_begin();
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rc = run_cli(bad[i].det ? cmd_detokenize : cmd_tokenize, bad[i].args, out, sizeof out, errs,
                     sizeof errs);
        int lines = 0;
        for (char *p = errs; *p; p++)
            lines += *p == '\n';
        CHECK(rc == bad[i].rc && strstr(errs, bad[i].want) && lines == 1,
              "case %zu: rc %d, stderr '%s' (want %d, '%s')", i, rc, errs, bad[i].rc, bad[i].want);
    }
    case_end("tok_cli_refusals", "(one line on stderr, exit 2 for arguments, 1 for input)");
}

// ---------------------------------------------------------------- speed

/* synthetic English: GPT-2's own word tokens, Zipf-like, with punctuation and line breaks */
static char *english(const struct tok *t, size_t bytes, size_t *n) {
    int32_t *words = malloc((size_t)t->n_vocab * sizeof *words), nw = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        size_t len;
        const char *s = tok_str(t, id, &len);
        if (!s || len < 3 || memcmp(s, "\xc4\xa0", 2)) continue; // "Ġword"
        int ok = 1;
        for (size_t i = 2; i < len; i++)
            ok &= (s[i] >= 'a' && s[i] <= 'z');
        if (ok) words[nw++] = id;
    }
    char *text = malloc(bytes + 64);
    size_t o = 0;
    uint64_t x = 2463534242ull;
    while (o < bytes && nw) {
        xorshift64(&x);
        double u = (double)(x >> 11) / 9007199254740992.0;
        size_t len;
        const char *s = tok_str(t, words[(int32_t)(u * u * u * nw)], &len);
        text[o++] = ' ';
        memcpy(text + o, s + 2, len - 2);
        o += len - 2;
        if (x % 11 == 0) text[o++] = ',';
        if (x % 17 == 0) text[o++] = '.';
        if (x % 97 == 0) text[o++] = '\n';
    }
    free(words);
    *n = o;
    return text;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static void test_speed(void) {
    case_begin();
    struct tok *g = load_fixture("gpt2");
    char extra[160] = "";
    if (g) {
        size_t n;
        char *text = english(g, quick_mode() ? (1u << 19) : (8u << 20), &n);
        double best = 0;
        const char *names[] = {"gpt2", "deepseek_v3"};
        size_t off = (size_t)snprintf(extra, sizeof extra, "(%.1f MB synthetic English:", n / 1e6);
        for (int k = 0; k < 2; k++) {
            best = 0;
            for (int rep = 0; rep < 2; rep++) { // a fresh tokenizer: the word cache starts cold
                struct tok *t = load_fixture(names[k]);
                if (!t) break;
                struct tok_ids ids = {0};
                char err[256];
                double t0 = now();
                for (size_t at = 0; at < n;) { // 64 KiB chunks cut at line ends, as the bench
                    size_t end = at + 65536 < n ? at + 65536 : n;
                    while (end < n && text[end - 1] != '\n')
                        end++;
                    if (tok_encode(t, text + at, end - at, 0, &ids, err, sizeof err))
                        case_fail("%s", err);
                    at = end;
                }
                double mbs = n / (now() - t0) / 1e6;
                best = mbs > best ? mbs : best;
                tok_ids_free(&ids);
                tok_free(t);
            }
            off +=
                (size_t)snprintf(extra + off, sizeof extra - off, " %s %.1f MB/s", names[k], best);
            if (!quick_mode())
                CHECK(best >= 10, "%s encodes at %.1f MB/s, under 10", names[k], best);
        }
        snprintf(extra + off, sizeof extra - off, ")");
        free(text);
        tok_free(g);
    }
    case_end("tok_encode_speed", extra);
}

int main(void) {
    DIR *d = opendir(FIXDIR);
    char *names[64];
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) && n < 64) {
        char p[512];
        snprintf(p, sizeof p, FIXDIR "/%s/tokenizer.json", e->d_name);
        struct stat st;
        if (e->d_name[0] != '.' && !stat(p, &st)) names[n++] = strdup(e->d_name);
    }
    if (d) closedir(d);
    for (int i = 0; i < n; i++) // a stable order
        for (int j = i + 1; j < n; j++)
            if (strcmp(names[j], names[i]) < 0) {
                char *x = names[i];
                names[i] = names[j];
                names[j] = x;
            }
    case_begin();
    CHECK(n >= 3, "only %d tokenizer fixtures under " FIXDIR, n);
    case_end("tok_fixtures_present", "");
    for (int i = 0; i < n; i++) {
        test_fixture(names[i]);
        free(names[i]);
    }
    test_components();
    test_oniguruma_escapes();
    test_invalid_utf8();
    test_stream_split_chars();
    test_random_round_trip();
    test_refusals();
    test_huge_ids();
    test_special_files();
    test_strip_and_empty_words();
    test_chat_layouts();
    test_chat_v4_examples();
    test_cli();
    test_speed();
    return check_failures ? 1 : 0;
}
