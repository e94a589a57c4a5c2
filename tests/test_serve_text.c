/* test_serve_text.c: the stop-string rules of serve/text.c (server.md section 1.9).
 *
 *   make build/tests/test_serve_text && build/tests/test_serve_text
 */
#include <jansson.h>
#include <stdlib.h>

#include "check.h"
#include "serve/text.h"

static void find_cases(void) {
    case_begin();
    char *stops[] = {"cd", "bcx", "zz"};
    size_t at = 99;
    CHECK(stop_find("abcdef", 6, 0, stops, 3, &at) == 0 && at == 2, "cd at %zu", at);
    CHECK(stop_find("abcdef", 6, 3, stops, 3, &at) == -1, "found before from");
    char *two[] = {"de", "cd"}; // the earliest start wins, not the first in the list
    CHECK(stop_find("abcdef", 6, 0, two, 2, &at) == 1 && at == 2, "earliest: %zu", at);
    char *same[] = {"cde", "cd"}; // equal starts: the first listed
    CHECK(stop_find("abcdef", 6, 0, same, 2, &at) == 0 && at == 2, "equal starts");
    CHECK(stop_find("ab", 2, 0, stops, 3, &at) == -1, "no match in a short text");
    char *empty[] = {""};
    CHECK(stop_find("ab", 2, 0, empty, 1, &at) == -1, "an empty stop matched");
    case_end("stop_find", "");
}

static void holdback_cases(void) {
    case_begin();
    char *stops[] = {"END", "xy"};
    CHECK(stop_holdback("abcE", 4, stops, 2) == 3, "E held: %zu",
          stop_holdback("abcE", 4, stops, 2));
    CHECK(stop_holdback("abcEN", 5, stops, 2) == 3, "EN held");
    CHECK(stop_holdback("abcx", 4, stops, 2) == 3, "x held");
    CHECK(stop_holdback("abc", 3, stops, 2) == 3, "nothing to hold");
    CHECK(stop_holdback("abEND", 5, stops, 2) == 5, "a whole stop is not a proper prefix");
    CHECK(stop_holdback("EN", 2, stops, 2) == 0, "all of a short text held");
    CHECK(stop_holdback("abc", 3, NULL, 0) == 3, "no stops");
    char *u[] = {"\xc3\xa9t\xc3\xa9"}; // "été": its prefix bytes, a split character included
    CHECK(stop_holdback("a\xc3", 2, u, 1) == 1, "a partial UTF-8 prefix of a stop held");
    case_end("stop_holdback", "");
}

static void kept_cases(void) {
    case_begin();
    size_t ends[] = {2, 5, 5, 9}; // tokens "ab", "cde", "" (a skipped special), "fghi"
    CHECK(stop_tokens_kept(ends, 4, 5) == 2, "a stop ending at a boundary: %d",
          stop_tokens_kept(ends, 4, 5));
    CHECK(stop_tokens_kept(ends, 4, 6) == 4, "the token that completes the stop is kept");
    CHECK(stop_tokens_kept(ends, 4, 3) == 2, "a stop ending inside token 2");
    CHECK(stop_tokens_kept(ends, 4, 1) == 1, "a stop ending inside token 1");
    case_end("stop_tokens_kept", "");
}

/* the JSON string writer: jansson reads back what was meant */
static void json_str_cases(void) {
    case_begin();
    struct {
        const char *in;
        size_t n;
        const char *want;
    } t[] = {
        {.in = "plain", .n = 5, .want = "plain"},
        {.in = "q\"b\\s\n\r\t\x01\x1f/", .n = 11, .want = "q\"b\\s\n\r\t\x01\x1f/"},
        {.in = "caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x99\x82",
         .n = 14,
         .want = "caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x99\x82"},
        {.in = "a\xff"
               "b\x80"
               "c",
         .n = 5,
         .want = "a\xef\xbf\xbd"
                 "b\xef\xbf\xbd"
                 "c"},
        {.in = "cut\xe6\x97", .n = 5, .want = "cut\xef\xbf\xbd\xef\xbf\xbd"},
        {.in = "nul\0x",
         .n = 5,
         .want = NULL}, // NUL: jansson refuses \u0000 by default; checked by hand below
    };
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
        struct sbuf b = {0};
        sbuf_json_str(&b, t[i].in, t[i].n);
        if (!t[i].want) {
            CHECK(b.p && !strcmp(b.p, "\"nul\\u0000x\""), "NUL written as %s", b.p);
            free(b.p);
            continue;
        }
        json_error_t je;
        json_t *v = json_loadb(b.p, b.n, JSON_DECODE_ANY, &je);
        CHECK(v && json_is_string(v) && !strcmp(json_string_value(v), t[i].want),
              "case %zu: wrote %s, read %s", i, b.p, v ? json_string_value(v) : je.text);
        json_decref(v);
        free(b.p);
    }
    struct sbuf b = {0};
    sbuf_int(&b, -42);
    sbuf_puts(&b, ",");
    sbuf_int(&b, 2147483647);
    CHECK(!strcmp(b.p, "-42,2147483647"), "ints: %s", b.p);
    free(b.p);
    case_end("sbuf_json_str", "");
}

int main(void) {
    json_str_cases();
    find_cases();
    holdback_cases();
    kept_cases();
    return check_failures ? 1 : 0;
}
