/* probs_time.c: the host's sampling distribution (td_probs: softmax, top-k, top-p) of one
 * logits row of V4's vocabulary (129280), for a flat row and a peaked one (logits 3 x a
 * normal draw), under the settings a client sends:
 *
 *   make bench-bins && build/bench/probs_time [repeats]
 *
 * Each line: the row, the setting, milliseconds a call (the mean of repeated calls) and the
 * tokens kept. The host draws only what the device does not: a sampled request's verification
 * of drafts, and top-k or top-p rows (a plain temperature row is drawn on the GPU). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "verify/sample.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    int V = 129280, reps = argc > 1 ? atoi(argv[1]) : 20;
    if (reps < 1) reps = 1;
    float *lg = malloc((size_t)V * sizeof *lg), *p = malloc((size_t)V * sizeof *p);
    static const struct td_sampling set[] = {
        {1.0f, 0, 1.0f, 1}, {1.0f, 0, 0.9f, 1}, {1.0f, 40, 1.0f, 1}, {0.7f, 50, 0.95f, 1}};
    static const char *name[] = {"T 1", "T 1, top-p 0.9", "T 1, top-k 40",
                                 "T 0.7, top-k 50, top-p 0.95"};
    for (int peaked = 0; peaked < 2; peaked++) {
        uint64_t s = 1;
        for (int i = 0; i < V; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            double u1 = ((s >> 11) & 0xFFFFF) / 1048576.0 + 1e-9,
                   u2 = ((s >> 31) & 0xFFFFF) / 1048576.0;
            lg[i] = peaked ? (float)(3.0 * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2))
                           : (float)(10.0 * u2 - 5.0);
        }
        for (size_t c = 0; c < sizeof set / sizeof *set; c++) {
            double t0 = now();
            for (int r = 0; r < reps; r++)
                td_probs(p, lg, V, &set[c]);
            double ms = (now() - t0) * 1e3 / reps;
            int kept = 0;
            for (int i = 0; i < V; i++)
                kept += p[i] > 0.0f;
            printf("%-6s %-28s %8.3f ms  %6d kept\n", peaked ? "peaked" : "flat", name[c], ms,
                   kept);
        }
    }
    free(lg), free(p);
    return 0;
}
