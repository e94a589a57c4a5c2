/* dot.h: the host references' dot product: fp32 inputs, double sums in one fixed order.
 *
 * Four partial sums over the columns i = 0, 4, 8, .. / 1, 5, 9, .. / .., joined as
 * (s0 + s1) + (s2 + s3), the tail added last. Independent chains let the CPU overlap the adds
 * (one serial chain waits a full add latency per column: tandem-tiny's CPU step spent 84% of its
 * time there); the order never depends on the batch, so a row's bits stay its own. Every host
 * sum that must equal matmul_ref's bits (the Markov chain's, test oracles) calls this. */
#ifndef TD_DOT_H
#define TD_DOT_H

static inline double td_dot(const float *a, const float *b, int n) {
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += (double)a[i] * b[i];
        s1 += (double)a[i + 1] * b[i + 1];
        s2 += (double)a[i + 2] * b[i + 2];
        s3 += (double)a[i + 3] * b[i + 3];
    }
    double s = (s0 + s1) + (s2 + s3);
    for (; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

#endif
