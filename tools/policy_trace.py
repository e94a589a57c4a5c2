#!/usr/bin/env python3
"""policy_trace.py: a summary of TD_POLICY_TRACE=2 output (tandem bench or generate, stderr).

    python3 tools/policy_trace.py FILE [FILE ...] [--slow N]

For each file (the engine prints the step lines; test_cli bench_policy_trace checks their
format): its tokens/s line, the steps by kind (plain: no drafts on offer; drafting) and
row bucket (count, mean, sum in ms), the phases' sums (target, verify, drafter), and the N
slowest steps (default 5) as the trace printed them: where a run's time went, step by step;
and the policy's price of a catch-up at exit (its `policy: catch-up` line).
"""
import re
import sys

STEP = re.compile(r"policy: step (\d+), (\d+) rows, (\d+) offered, (\d+) verified, (\d+) accepted, "
                  r"([\d.]+) us \(target ([\d.]+), verify ([\d.]+), drafter ([\d.]+), policy ([\d.]+), "
                  r"caught up (\d+)\); next (\S+)")


def bucket(rows):
    b = 1
    while b < rows:
        b *= 2
    return b


def summary(path, n_slow):
    steps, rate, price = [], None, None
    with open(path, errors="replace") as f:
        for line in f:
            m = STEP.match(line.strip())
            if m:
                g = m.groups()
                steps.append((int(g[0]), int(g[1]), int(g[2]), int(g[3]), int(g[4]), float(g[5]),
                              float(g[6]), float(g[7]), float(g[8]), g[11], line.strip(),
                              float(g[9]), int(g[10])))
            elif "tokens/s" in line and line.startswith("bench:"):
                rate = line.strip()
            elif line.startswith("policy: catch-up"):
                price = line.strip()
    print(f"== {path}")
    if rate:
        print(rate)
    if not steps:
        print("no step lines (was TD_POLICY_TRACE=2 set?)")
        return 1
    kinds = {}
    for s in steps:
        k = ("drafting" if s[2] > 0 else "plain", bucket(s[1]))
        n, t = kinds.get(k, (0, 0.0))
        kinds[k] = (n + 1, t + s[5])
    print("kind      rows <=   steps   mean us    sum ms")
    for (kind, b), (n, t) in sorted(kinds.items(), key=lambda x: (x[0][1], x[0][0])):
        print(f"{kind:9} {b:7d} {n:7d} {t / n:9.1f} {t / 1e3:9.1f}")
    tot = [sum(s[i] for s in steps) / 1e3 for i in (5, 6, 7, 8, 11)]
    print(f"all {len(steps)} steps: {tot[0]:.1f} ms (target {tot[1]:.1f}, verify {tot[2]:.1f}, "
          f"drafter {tot[3]:.1f}, of it the policy {tot[4]:.1f}); drafts verified "
          f"{sum(s[3] for s in steps)}, accepted {sum(s[4] for s in steps)}")
    caught = [s for s in steps if s[12] > 0]
    print(f"catch-ups: {len(caught)} drafter phases made up {sum(s[12] for s in caught)} rows in "
          f"{sum(s[8] for s in caught) / 1e3:.1f} ms")
    if price:  # the policy's own price of them, at exit
        print(price)
    print(f"slowest {n_slow}:")
    for s in sorted(steps, key=lambda s: -s[5])[:n_slow]:
        print("  " + s[10])
    return 0


def main(argv):
    n_slow, files = 5, []
    i = 0
    while i < len(argv):
        if argv[i] == "--slow" and i + 1 < len(argv):
            n_slow = int(argv[i + 1])
            i += 2
            continue
        files.append(argv[i])
        i += 1
    if not files:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    return max(summary(f, n_slow) for f in files)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
