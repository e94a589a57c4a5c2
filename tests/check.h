/* check.h: the tests' shared reporting and comparison helpers (header-only, static).
 *
 * Every case prints one line, "OK <name> ..." or "FAIL <name>: <why>"; tests/run.sh counts
 * them. CHECK(cond, fmt, ...) records a failure of the current case without aborting.
 */
#ifndef TD_TESTS_CHECK_H
#define TD_TESTS_CHECK_H

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
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

/* FNV-1a of n bytes, from h (0xcbf29ce484222325 to start): a digest of a run's bytes */
static inline uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

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

/* Element by element, got against ref, both [rows, cols] row-major: a NaN in one must be a NaN
 * in the other, an infinity must be the same infinity in both, and every other element must
 * satisfy |got - ref| <= atol + rtol * |ref| (in double). Returns how many elements fail (0:
 * close); then why[cap] (may be NULL) says where, e.g.
 *   "<name>: 2 of 12 elements over tolerance (atol 0.001, rtol 0); worst [2, 3]: got 1.5,
 *    ref 1.25 (|d| 0.25 > 0.001); first NaN/inf mismatch [0, 1]: got nan, ref 0.5"
 * the worst being the finite element furthest over its own tolerance (|d| / tolerance; a zero
 * tolerance counts as infinitely far), the NaN/inf part only when there is one. */
static inline long close_compare(char *why, size_t cap, const char *name, const float *got,
                                 const float *ref, long rows, long cols, double atol, double rtol) {
    long n = rows * cols, over = 0, worst = -1, special = -1;
    double worst_key = 0, worst_d = 0, worst_tol = 0;
    for (long i = 0; i < n; i++) {
        double g = got[i], r = ref[i];
        if (!isfinite(g) || !isfinite(r)) {
            if ((isnan(g) && isnan(r)) || g == r) continue; // both NaN, or the same infinity
            over++;
            if (special < 0) special = i;
            continue;
        }
        double d = fabs(g - r), tol = atol + rtol * fabs(r);
        if (d <= tol) continue;
        over++;
        double key = tol > 0 ? d / tol : INFINITY;
        if (worst < 0 || key > worst_key || (key == worst_key && d > worst_d))
            worst = i, worst_key = key, worst_d = d, worst_tol = tol;
    }
    if (!over || !why || !cap) return over;
    int k = snprintf(why, cap, "%s: %ld of %ld elements over tolerance (atol %.3g, rtol %.3g)",
                     name, over, n, atol, rtol);
    if (worst >= 0 && k >= 0 && (size_t)k < cap)
        k += snprintf(why + k, cap - (size_t)k,
                      "; worst [%ld, %ld]: got %.9g, ref %.9g (|d| %.3g > %.3g)", worst / cols,
                      worst % cols, got[worst], ref[worst], worst_d, worst_tol);
    if (special >= 0 && k >= 0 && (size_t)k < cap)
        snprintf(why + k, cap - (size_t)k,
                 "; first NaN/inf mismatch [%ld, %ld]: got %.9g, ref %.9g", special / cols,
                 special % cols, got[special], ref[special]);
    return over;
}

/* close_compare inside a case_begin/case_end case: 1 when close, else 0 and the case fails
 * with close_compare's message (the first failure of a case is the one reported) */
static inline int check_close(const char *name, const float *got, const float *ref, long rows,
                              long cols, double atol, double rtol) {
    char why[sizeof check_why];
    if (!close_compare(why, sizeof why, name, got, ref, rows, cols, atol, rtol)) return 1;
    case_fail("%s", why);
    return 0;
}

/* max(1e-6, max |ref|) over n elements (NaN skipped, an infinity makes it infinite): the scale
 * of a whole-output relative bound, max |got - ref| < b * scale, which check_close enforces as
 * atol = b * scale, rtol = 0 (test_gpu.c's op cases) */
static inline double ref_scale(const float *ref, long n) {
    double m = 1e-6;
    for (long i = 0; i < n; i++)
        m = fmax(m, fabs(ref[i]));
    return m;
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
    check_case_failed = why != NULL;
    if (why) snprintf(check_why, sizeof check_why, "%.500s", why);
    case_end(name, "");
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

/* symlink the file `name` of the folder `from_dir` (relative to the working directory) into dir,
 * by its absolute path: a model folder made of fixtures; 0 or -1 */
static inline int link_fixture(const char *from_dir, const char *name, const char *dir) {
    char from[PATH_MAX], rel[PATH_MAX], to[PATH_MAX];
    snprintf(rel, sizeof rel, "%s/%s", from_dir, name);
    if (!realpath(rel, from)) return -1;
    snprintf(to, sizeof to, "%s/%s", dir, name);
    return symlink(from, to);
}

/* Groups of cases, each in a process of its own (fork) unless TD_TEST_FORK=0: whatever ends a
 * process (a kernel's sticky error, an abort, a segfault, a hang past TD_TEST_GROUP_S seconds,
 * default 300) ends only its group, which the parent reports as one FAIL line, and the next
 * group still runs. The parent prints each group's wall time ("group NAME: S s"). It never
 * opens the device: open() runs in each child, since CUDA does not survive a fork. open()
 * returns 1 when there is something to run on, else 0 after printing its SKIP line; then no
 * later group runs and group_status() is 77 (skipped).
 *
 *   if (group_start("matmul", open)) { test_matmul(); group_end(); }  // GROUP() in test_gpu.c
 *   ...
 *   return group_status();
 */
static int group_inproc = -1; /* TD_TEST_FORK=0: every group in this process */
static int group_none;        /* open() found nothing to run on */
static int group_ran;         /* a group ran (passed or not) */

/* 1: run the group's cases here (in its child, or in-process); 0: go on to the next group (the
 * parent, once the child has ended and been reported) */
static inline int group_start(const char *name, int (*open)(void)) {
    if (group_none) return 0;
    if (group_inproc < 0) {
        const char *f = getenv("TD_TEST_FORK");
        group_inproc = f && !strcmp(f, "0");
    }
    if (group_inproc) {
        if (open()) return group_ran = 1;
        group_none = 1;
        return 0;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        printf("FAIL group/%s: fork: %s\n", name, strerror(errno));
        check_failures++;
        return 0;
    }
    if (pid == 0) {
        const char *lim = getenv("TD_TEST_GROUP_S");
        alarm(lim && atoi(lim) > 0 ? (unsigned)atoi(lim) : 300u); // SIGALRM ends the child
        if (open()) return 1;
        fflush(stdout);
        _exit(77);
    }
    int st = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("group %s: %.1f s\n", name, // (what a device call's budget needs to know)
           (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77) {
        group_none = 1;
        return 0;
    }
    group_ran = 1;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return 0;
    check_failures++;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 2) return 0; // its cases printed their FAIL lines
    if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM)
        printf("FAIL group/%s: still running after TD_TEST_GROUP_S (hung?); the next group runs\n",
               name);
    else if (WIFSIGNALED(st))
        printf("FAIL group/%s: its process died of signal %d (%s); the next group runs\n", name,
               WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
        printf("FAIL group/%s: its process exited with %d; the next group runs\n", name,
               WEXITSTATUS(st));
    fflush(stdout);
    return 0;
}

/* a group's last step, after its cases: the child exits, 2 if a case failed (not 1, which is
 * also a sanitizer's report) */
static inline void group_end(void) {
    if (group_inproc) return;
    fflush(stdout);
    fflush(stderr);
    _exit(check_failures ? 2 : 0);
}

/* main's exit status: 77 when no group found anything to run on, 1 when any failed */
static inline int group_status(void) {
    return group_none && !group_ran ? 77 : check_failures ? 1 : 0;
}

#endif
