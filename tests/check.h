/* check.h: the tests' shared reporting and comparison helpers (header-only, static).
 *
 * Every case prints one line, "OK <name> ..." or "FAIL <name>: <why>"; tests/run.sh counts
 * them. CHECK(cond, fmt, ...) records a failure of the current case without aborting.
 */
#ifndef TD_TESTS_CHECK_H
#define TD_TESTS_CHECK_H

#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int check_failures;    /* cases failed so far */
static int check_case_failed; /* the current case */
static char check_why[512];

static inline void case_begin(void) {
    check_case_failed = 0;
    check_why[0] = 0;
}

static inline void case_fail(const char *fmt, ...) {
    if (check_case_failed) return; // keep the first reason
    check_case_failed = 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(check_why, sizeof check_why, fmt, ap);
    va_end(ap);
}

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) case_fail(__VA_ARGS__);                                                       \
    } while (0)

/* print the case's line; extra is printed after OK (may be "") */
static inline void case_end(const char *name, const char *extra) {
    if (check_case_failed) {
        printf("FAIL %s: %s\n", name, check_why);
        check_failures++;
    } else {
        printf("OK %s%s%s\n", name, extra && *extra ? " " : "", extra ? extra : "");
    }
    fflush(stdout);
}

/* worst over rows of max|a - b| / max(1, max|ref row|); nan/inf positions must agree */
static inline double rel_row_err(const float *out, const float *ref, long rows, long cols,
                                 long *worst_row) {
    double worst = 0;
    for (long t = 0; t < rows; t++) {
        double m = 1.0, d = 0.0;
        for (long v = 0; v < cols; v++) {
            double r = ref[t * cols + v], o = out[t * cols + v];
            if (isnan(r) != isnan(o) || (isinf(r) && r != o)) return INFINITY;
            if (fabs(r) > m) m = fabs(r);
            if (fabs(o - r) > d) d = fabs(o - r);
        }
        if (d / m > worst) {
            worst = d / m;
            if (worst_row) *worst_row = t;
        }
    }
    return worst;
}

/* One-shot style, for cases that stop at their first failure: the case keeps a local
 * `char why[...]` (empty = pass) and a `done:` label; REQUIRE fills why and jumps there, and
 * report() prints the case's line. */
#define REQUIRE(cond)                                                                              \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            snprintf(why, sizeof why, "line %d: %s", __LINE__, #cond);                             \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

static inline void report(const char *name, const char *why) {
    if (why) {
        printf("FAIL %s: %s\n", name, why);
        check_failures++;
    } else {
        printf("OK %s\n", name);
    }
}

/* xorshift64: advances *s and returns it; the tests' one source of reproducible noise */
static inline uint64_t xorshift64(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* A deadline for a case that could hang (a loader blocked opening a FIFO): past `seconds` the
 * process prints "FAIL <name>: still running after the deadline" and exits 1. seconds 0 (or
 * a later call) disarms it. */
static const char *deadline_case;
static inline void deadline_hit(int sig) {
    (void)sig; // only async-signal-safe calls from here
    static const char a[] = "FAIL ", b[] = ": still running after the deadline (hung?)\n";
    if (write(1, a, sizeof a - 1) < 0 || write(1, deadline_case, strlen(deadline_case)) < 0 ||
        write(1, b, sizeof b - 1) < 0)
        _exit(1);
    _exit(1);
}
static inline void case_deadline(const char *name, unsigned seconds) {
    deadline_case = name;
    signal(SIGALRM, deadline_hit);
    alarm(seconds);
}

static inline int quick_mode(void) {
    return getenv("TD_TEST_QUICK") != NULL;
}

#endif
