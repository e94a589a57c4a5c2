/* test_check.c: the tests' comparator (check.h close_compare / check_close) says what it should.
 *
 *   make build/tests/test_check && build/tests/test_check
 *
 * close/equal_arrays_pass                 identical arrays pass at zero tolerance, why untouched
 * close/one_off_names_row_col_values      one element off fails, naming [row, col], both values
 *                                         and "1 of N"; several off: the worst and the count
 * close/nan_vs_number_fails               NaN against a number fails either way round, even with
 *                                         an infinite tolerance, naming the first mismatch
 * close/nan_vs_nan_passes, close/inf_signs  +inf vs -inf (and inf vs finite) fails; equal
 *                                         infinities pass
 * close/tolerance_boundaries              |d| == atol + rtol |ref| passes, one ulp more fails
 *                                         (atol alone, rtol alone, both, a negative ref)
 * close/check_close_fails_the_case        check_close records the case's failure with the message
 * close/ref_scale_keeps_max_rel           atol = b * ref_scale(ref), rtol 0 passes exactly what
 *                                         test_gpu.c's old max_rel(got, ref) < b passed
 * groups/a_fault_ends_only_its_group      check.h's groups (the GPU suite's): an abort, a
 *                                         segfault, a failed case and a hang each end their own
 *                                         group with one FAIL line, and the groups after them
 *                                         run; exit 1 (this program run with --groups-demo)
 * groups/in_process                       TD_TEST_FORK=0: the same groups in one process
 * groups/nothing_to_run_on                open() finds no device: SKIP, no group runs, exit 77
 */
#include <stdint.h>

#include "check.h"

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static float frand(void) { // [-1, 1)
    return (float)((xorshift64(&rs) >> 11) * 0x1p-53) * 2.0f - 1.0f;
}

static void equal_pass(void) {
    char why[512] = "", msg[512] = "untouched";
    float a[12], b[12];
    for (int i = 0; i < 12; i++)
        a[i] = b[i] = frand() * 100;
    a[5] = b[5] = NAN, a[6] = b[6] = INFINITY, a[7] = b[7] = -INFINITY;
    REQUIRE(close_compare(msg, sizeof msg, "x", a, b, 3, 4, 0, 0) == 0);
    REQUIRE(!strcmp(msg, "untouched"));
    REQUIRE(close_compare(NULL, 0, "x", a, b, 3, 4, 0, 0) == 0);
    REQUIRE(close_compare(msg, sizeof msg, "x", a, b, 0, 4, 0, 0) == 0); // nothing to compare
done:
    report("close/equal_arrays_pass", why[0] ? why : NULL);
}

static void one_off(void) {
    char why[512] = "", msg[512];
    float ref[12], got[12];
    for (int i = 0; i < 12; i++)
        ref[i] = got[i] = (float)i;
    ref[11] = 1.25f, got[11] = 1.5f; // [2, 3] of [3, 4]
    REQUIRE(close_compare(msg, sizeof msg, "op", got, ref, 3, 4, 1e-3, 0) == 1);
    REQUIRE(strstr(msg, "op: 1 of 12 elements over tolerance"));
    REQUIRE(strstr(msg, "worst [2, 3]: got 1.5, ref 1.25"));
    REQUIRE(!strstr(msg, "NaN/inf"));
    // the same array as [4, 3]: element 11 is [3, 2]
    REQUIRE(close_compare(msg, sizeof msg, "op", got, ref, 4, 3, 1e-3, 0) == 1);
    REQUIRE(strstr(msg, "worst [3, 2]: got 1.5, ref 1.25"));
    // three off: the worst is the furthest over its own tolerance (rtol: a small ref's small
    // |d| is further over than a big ref's bigger one)
    got[1] = 1.125f; // ref 1: |d| 0.125, tolerance 0.01 (12.5x): the worst
    got[10] = 10.5f; // ref 10: |d| 0.5, tolerance 0.1 (5x): the largest |d|
    got[11] = 1.25f; // back in
    got[4] = 4.03f;  // ref 4: |d| 0.03, tolerance 0.04: in
    got[6] = 6.25f;  // ref 6: |d| 0.25, tolerance 0.06 (4.2x)
    REQUIRE(close_compare(msg, sizeof msg, "op", got, ref, 3, 4, 0, 1e-2) == 3);
    REQUIRE(strstr(msg, "op: 3 of 12 elements over tolerance (atol 0, rtol 0.01)"));
    REQUIRE(strstr(msg, "worst [0, 1]: got 1.125, ref 1 (|d| 0.125 > 0.01)"));
    // a truncated message stays a string
    char tiny[16];
    REQUIRE(close_compare(tiny, sizeof tiny, "op", got, ref, 3, 4, 0, 1e-2) == 3);
    REQUIRE(strlen(tiny) == sizeof tiny - 1 && !strncmp(tiny, "op: 3 of 12", 11));
done:
    report("close/one_off_names_row_col_values", why[0] ? why : NULL);
}

static void nan_vs_number(void) {
    char why[512] = "", msg[512];
    float ref[6] = {0, 1, 2, 3, 4, 5}, got[6] = {0, 1, 2, 3, 4, 5};
    got[4] = NAN; // [1, 1] of [2, 3]
    REQUIRE(close_compare(msg, sizeof msg, "y", got, ref, 2, 3, INFINITY, 0) == 1);
    REQUIRE(strstr(msg, "y: 1 of 6 elements over tolerance"));
    REQUIRE(strstr(msg, "first NaN/inf mismatch [1, 1]: got nan, ref 4"));
    REQUIRE(!strstr(msg, "worst"));
    got[4] = 4, ref[2] = NAN, ref[5] = NAN; // the other way round: the first is [0, 2]
    REQUIRE(close_compare(msg, sizeof msg, "y", got, ref, 2, 3, 1, 1) == 2);
    REQUIRE(strstr(msg, "first NaN/inf mismatch [0, 2]: got 2, ref nan"));
    got[0] = 9; // and a finite miss beside it: both parts
    REQUIRE(close_compare(msg, sizeof msg, "y", got, ref, 2, 3, 1, 0) == 3);
    REQUIRE(strstr(msg, "worst [0, 0]: got 9, ref 0") && strstr(msg, "mismatch [0, 2]"));
done:
    report("close/nan_vs_number_fails", why[0] ? why : NULL);
}

static void nan_vs_nan(void) {
    char why[512] = "";
    float ref[4] = {NAN, 1, NAN, 3}, got[4] = {NAN, 1, -NAN, 3};
    REQUIRE(close_compare(NULL, 0, "z", got, ref, 2, 2, 0, 0) == 0);
done:
    report("close/nan_vs_nan_passes", why[0] ? why : NULL);
}

static void inf_signs(void) {
    char why[512] = "", msg[512];
    float ref[4] = {1, INFINITY, -INFINITY, 2}, got[4] = {1, INFINITY, -INFINITY, 2};
    REQUIRE(close_compare(NULL, 0, "w", got, ref, 1, 4, 0, 0) == 0);
    got[2] = INFINITY; // +inf against -inf at [0, 2]
    REQUIRE(close_compare(msg, sizeof msg, "w", got, ref, 1, 4, INFINITY, INFINITY) == 1);
    REQUIRE(strstr(msg, "first NaN/inf mismatch [0, 2]: got inf, ref -inf"));
    got[2] = -INFINITY, got[3] = INFINITY; // inf against a finite ref
    REQUIRE(close_compare(msg, sizeof msg, "w", got, ref, 1, 4, INFINITY, 0) == 1);
    REQUIRE(strstr(msg, "mismatch [0, 3]: got inf, ref 2"));
    got[3] = 2, got[1] = 3e38f; // a finite got against an inf ref
    REQUIRE(close_compare(msg, sizeof msg, "w", got, ref, 1, 4, INFINITY, 0) == 1);
    REQUIRE(strstr(msg, "mismatch [0, 1]"));
done:
    report("close/inf_signs", why[0] ? why : NULL);
}

static void boundaries(void) {
    char why[512] = "";
    // every value below is exact in binary, so |d| and the tolerance are computed exactly
    float r1 = 1.0f, g1 = 1.0f + 0x1p-10f, g1u = nextafterf(g1, 2.0f);
    REQUIRE(close_compare(NULL, 0, "a", &g1, &r1, 1, 1, 0x1p-10, 0) == 0);
    REQUIRE(close_compare(NULL, 0, "a", &g1u, &r1, 1, 1, 0x1p-10, 0) == 1);
    REQUIRE(close_compare(NULL, 0, "a", &g1, &r1, 1, 1, nextafter(0x1p-10, 0), 0) == 1);
    float r4 = 4.0f, g4 = 4.5f, g4u = nextafterf(4.5f, 5.0f); // rtol 1/8 of |ref| 4: 0.5
    REQUIRE(close_compare(NULL, 0, "r", &g4, &r4, 1, 1, 0, 0.125) == 0);
    REQUIRE(close_compare(NULL, 0, "r", &g4u, &r4, 1, 1, 0, 0.125) == 1);
    REQUIRE(close_compare(NULL, 0, "r", &g4, &r4, 1, 1, 0, nextafter(0.125, 0)) == 1);
    float n4 = -4.0f, m4 = -3.5f, m4u = nextafterf(-3.5f, 0.0f); // |ref| for a negative ref
    REQUIRE(close_compare(NULL, 0, "n", &m4, &n4, 1, 1, 0, 0.125) == 0);
    REQUIRE(close_compare(NULL, 0, "n", &m4u, &n4, 1, 1, 0, 0.125) == 1);
    float r2 = 2.0f, g2 = 2.75f, g2u = nextafterf(2.75f, 3.0f); // 0.25 + 0.25 * 2
    REQUIRE(close_compare(NULL, 0, "b", &g2, &r2, 1, 1, 0.25, 0.25) == 0);
    REQUIRE(close_compare(NULL, 0, "b", &g2u, &r2, 1, 1, 0.25, 0.25) == 1);
    REQUIRE(close_compare(NULL, 0, "b", &g2, &r2, 1, 1, 0.25, 0.2) == 1);
    float z = 0.0f, mz = -0.0f, tiny = 0x1p-149f; // zero tolerance: exact, -0 == 0
    REQUIRE(close_compare(NULL, 0, "0", &mz, &z, 1, 1, 0, 0) == 0);
    REQUIRE(close_compare(NULL, 0, "0", &tiny, &z, 1, 1, 0, 0) == 1);
done:
    report("close/tolerance_boundaries", why[0] ? why : NULL);
}

static void check_close_case(void) {
    char why[512] = "";
    float ref[4] = {1, 2, 3, 4}, got[4] = {1, 2, 3, 4.5f};
    case_begin();
    REQUIRE(check_close("fine", got, ref, 2, 2, 0.5, 0) == 1 && !check_case_failed);
    REQUIRE(check_close("off", got, ref, 2, 2, 0.25, 0) == 0 && check_case_failed);
    REQUIRE(!strncmp(check_why, "off: 1 of 4", 11) && strstr(check_why, "worst [1, 1]"));
    REQUIRE(check_close("later", got, ref, 2, 2, 0, 0) == 0); // the first reason is kept
    REQUIRE(!strncmp(check_why, "off: ", 5));
done:
    case_begin(); // leave no failed case behind
    report("close/check_close_fails_the_case", why[0] ? why : NULL);
}

/* test_gpu.c's comparator before check_close, verbatim */
static double max_rel(const float *a, const float *ref, size_t n) {
    double m = 1e-30, d = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) != isnan(ref[i])) return INFINITY;
        m = fmax(m, fabs(ref[i]));
        d = fmax(d, fabs(a[i] - ref[i]));
    }
    return d / fmax(m, 1e-6);
}

/* random outputs near the bound, some with NaNs and infinities in either array: the verdicts
 * agree (cases within 1e-9 of the bound itself are skipped: `<` became `<=` there); both
 * verdicts occur */
static void keeps_max_rel(void) {
    char why[512] = "";
    enum { N = 64 };
    float ref[N], got[N];
    int pass = 0, fail = 0;
    for (int it = 0; it < 20000; it++) {
        double b = it % 3 == 0 ? 1e-4 : it % 3 == 1 ? 1e-5 : 1e-6;
        float amp = it % 7 == 0 ? 1e-7f : (float)(1 + (xorshift64(&rs) % 1000)); // tiny refs too
        double lvl = b * (1.0 + 0.5 * frand()); // max |d| about 0.5 .. 1.5 times the bound
        for (int i = 0; i < N; i++) {
            ref[i] = frand() * amp;
            got[i] = ref[i] + (float)(frand() * lvl * fmax(amp, 1e-6)); // 1e-6: the floor
        }
        uint64_t s = xorshift64(&rs);
        static const float sp[4] = {NAN, INFINITY, -INFINITY, 0.5f};
        if (s % 5 == 0) ref[s % N] = sp[(s >> 8) % 4];
        if (s % 7 == 0) got[(s >> 16) % N] = sp[(s >> 24) % 4];
        if (s % 11 == 0) got[(s >> 32) % N] = ref[(s >> 32) % N] = sp[(s >> 40) % 3];
        double e = max_rel(got, ref, N);
        if (isfinite(e) && fabs(e - b) <= 1e-9 * b) continue;
        int old_ok = e < b;
        int new_ok = !close_compare(NULL, 0, "m", got, ref, 1, N, b * ref_scale(ref, N), 0);
        if (old_ok != new_ok) {
            snprintf(why, sizeof why, "iteration %d: max_rel %.9g against %g says %d, check %d", it,
                     e, b, old_ok, new_ok);
            goto done;
        }
        pass += new_ok, fail += !new_ok;
    }
    REQUIRE(pass > 1000 && fail > 1000);
done:
    report("close/ref_scale_keeps_max_rel", why[0] ? why : NULL);
}

/* --groups-demo MODE: groups as test_gpu.c runs them; MODE crash: some end badly, none: open()
 * finds nothing, inproc: every group passes (TD_TEST_FORK=0 runs them in one process) */
static const char *demo_mode;
static int demo_open(void) {
    if (!strcmp(demo_mode, "none")) {
        printf("SKIP demo: nothing to run on\n");
        return 0;
    }
    return 1;
}
static void demo_ok(const char *name) {
    case_begin();
    case_end(name, "");
}
static int groups_demo(void) {
    int crash = !strcmp(demo_mode, "crash");
    if (group_start("first", demo_open)) {
        demo_ok("demo/first");
        group_end();
    }
    if (crash && group_start("aborts", demo_open)) {
        demo_ok("demo/before_abort");
        abort();
    }
    if (crash && group_start("segfaults", demo_open)) {
        raise(SIGSEGV);
        group_end();
    }
    if (crash && group_start("fails", demo_open)) {
        case_begin();
        CHECK(0, "on purpose");
        case_end("demo/fails", "");
        group_end();
    }
    if (crash && group_start("hangs", demo_open)) {
        pause(); // until TD_TEST_GROUP_S's alarm
        group_end();
    }
    if (group_start("last", demo_open)) {
        demo_ok("demo/last");
        group_end();
    }
    return group_status();
}

/* runs this program with --groups-demo MODE and env, into out; returns its exit status */
static int demo_run(const char *self, const char *env, const char *mode, char *out, size_t cap) {
    char cmd[PATH_MAX + 128];
    snprintf(cmd, sizeof cmd, "%s %s --groups-demo %s 2>/dev/null", env, self, mode);
    FILE *f = popen(cmd, "r");
    size_t n = f ? fread(out, 1, cap - 1, f) : 0;
    out[n] = 0;
    int st = f ? pclose(f) : -1;
    return st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* the lines of want (separated by '|') appear in out in this order */
static int in_order(const char *out, const char *want) {
    char w[1024];
    snprintf(w, sizeof w, "%s", want);
    const char *at = out;
    for (char *l = strtok(w, "|"); l; l = strtok(NULL, "|")) {
        const char *p = strstr(at, l);
        if (!p) return 0;
        at = p + strlen(l);
    }
    return 1;
}

/* a run of the demo: its exit status is status, its output holds the lines of want in order
 * (in_order) and not the text absent */
static void groups_case(const char *self, const char *name, const char *env, const char *mode,
                        int status, const char *want, const char *absent) {
    char why[4608] = "", out[4096];
    int st = demo_run(self, env, mode, out, sizeof out);
    REQUIRE(st == status);
    REQUIRE(in_order(out, want));
    REQUIRE(!strstr(out, absent));
done:
    if (why[0]) snprintf(why + strlen(why), sizeof why - strlen(why), "; output:\n%s", out);
    report(name, why[0] ? why : NULL);
}

static void groups(const char *self) {
    groups_case(self, "groups/a_fault_ends_only_its_group", "TD_TEST_GROUP_S=1", "crash", 1,
                "OK demo/first\n|OK demo/before_abort\n"
                "|FAIL group/aborts: its process died of signal 6"
                "|FAIL group/segfaults: its process " // (a sanitizer's handler exits 1)
                "|FAIL demo/fails: on purpose\n"
                "|FAIL group/hangs: still running after TD_TEST_GROUP_S"
                "|OK demo/last\n",
                "FAIL group/fails"); // its own FAIL line says it all
    groups_case(self, "groups/in_process", "TD_TEST_FORK=0", "inproc", 0,
                "OK demo/first\n|OK demo/last\n", "FAIL");
    groups_case(self, "groups/nothing_to_run_on", "", "none", 77, "SKIP demo: nothing to run on\n",
                "OK ");
}

int main(int argc, char **argv) {
    if (argc > 2 && !strcmp(argv[1], "--groups-demo")) {
        demo_mode = argv[2];
        return groups_demo();
    }
    groups(argv[0]);
    equal_pass();
    one_off();
    nan_vs_number();
    nan_vs_nan();
    inf_signs();
    boundaries();
    check_close_case();
    keeps_max_rel();
    return check_failures ? 1 : 0;
}
