#!/usr/bin/env python3
"""policy_trace.py: a summary of TD_POLICY_TRACE=2 output (tandem bench or generate, stderr).

    python3 tools/policy_trace.py FILE [FILE ...] [--slow N] [--against NONE]

For each file (the engine prints the step lines; test_cli bench_policy_trace checks their
format): its tokens/s line, the steps by kind (plain: no drafts on offer; drafting) and
row bucket (count, mean, sum in ms), the phases' sums (target, verify, drafter), and the N
slowest steps (default 5) as the trace printed them: where a run's time went, step by step;
and the policy's price of a catch-up at exit (its `policy: catch-up` line).

--against NONE (the trace of the same bench with --draft none): each run's steps by phase,
side by side: steps with prompt rows; decode steps of the full batch (at least half the most
sequences the run decoded at once); the tail (fewer); each phase's steps, time, tokens out and
tokens per ms; and a plain decode step's cost beside none's at the same rows (the median of
each, over the row counts both ran): what a drafter costs where it drafts nothing. The step
lines must carry their decoding sequences and tokens out (the engine prints them since
session 26).
"""
import re
import sys

STEP = re.compile(r"policy: step (\d+), (\d+) rows, (\d+) offered, (\d+) verified, (\d+) accepted, "
                  r"([\d.]+) us \(target ([\d.]+), verify ([\d.]+), drafter ([\d.]+), policy ([\d.]+), "
                  r"caught up (\d+)\)(?:, (\d+) decoding, (\d+) out)?; next (\S+)")


def bucket(rows):
    b = 1
    while b < rows:
        b *= 2
    return b


def step_of(line):
    """a TD_POLICY_TRACE=2 step line's fields (None for any other line); dec and out are -1 in
    traces from before session 26, whose lines lack them"""
    m = STEP.match(line.strip())
    if not m:
        return None
    g = m.groups()
    return {"rows": int(g[1]), "offered": int(g[2]), "verified": int(g[3]),
            "accepted": int(g[4]), "us": float(g[5]), "target": float(g[6]),
            "verify": float(g[7]), "drafter": float(g[8]), "policy": float(g[9]),
            "caught": int(g[10]), "dec": int(g[11]) if g[11] else -1,
            "out": int(g[12]) if g[12] else -1, "plain": int(g[2]) == 0, "line": line.strip()}


def summary(path, n_slow):
    steps, rate, price = [], None, None
    with open(path, errors="replace") as f:
        for line in f:
            s = step_of(line)
            if s:
                steps.append(s)
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
        k = ("plain" if s["plain"] else "drafting", bucket(s["rows"]))
        n, t = kinds.get(k, (0, 0.0))
        kinds[k] = (n + 1, t + s["us"])
    print("kind      rows <=   steps   mean us    sum ms")
    for (kind, b), (n, t) in sorted(kinds.items(), key=lambda x: (x[0][1], x[0][0])):
        print(f"{kind:9} {b:7d} {n:7d} {t / n:9.1f} {t / 1e3:9.1f}")
    tot = [sum(s[k] for s in steps) / 1e3 for k in ("us", "target", "verify", "drafter", "policy")]
    print(f"all {len(steps)} steps: {tot[0]:.1f} ms (target {tot[1]:.1f}, verify {tot[2]:.1f}, "
          f"drafter {tot[3]:.1f}, of it the policy {tot[4]:.1f}); drafts verified "
          f"{sum(s['verified'] for s in steps)}, accepted {sum(s['accepted'] for s in steps)}")
    caught = [s for s in steps if s["caught"] > 0]
    print(f"catch-ups: {len(caught)} drafter phases made up {sum(s['caught'] for s in caught)} "
          f"rows in {sum(s['drafter'] for s in caught) / 1e3:.1f} ms")
    if price:  # the policy's own price of them, at exit
        print(price)
    print(f"slowest {n_slow}:")
    for s in sorted(steps, key=lambda s: -s["us"])[:n_slow]:
        print("  " + s["line"])
    return 0


def load(path):
    """the step lines of a trace (step_of)"""
    with open(path, errors="replace") as f:
        return [s for s in map(step_of, f) if s]


def phases(steps):
    """{phase: [steps, us, tokens out]}: prompt (rows beyond the decoding rows and drafts),
    decode (at least half the most sequences decoded at once), tail"""
    top = max((s["dec"] for s in steps), default=0)
    ph = {"prompt": [0, 0.0, 0], "decode": [0, 0.0, 0], "tail": [0, 0.0, 0]}
    for s in steps:
        k = ("prompt" if s["rows"] > s["dec"] + s["verified"]
             else "decode" if 2 * s["dec"] >= top else "tail")
        ph[k][0] += 1
        ph[k][1] += s["us"]
        ph[k][2] += s["out"]
    return ph


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else 0.0


def against(path, base):
    a, b = load(path), load(base)
    if not a or not b or min(s["dec"] for s in a + b) < 0:
        print(f"--against: {path} or {base} has no step lines with their decoding sequences")
        return 1
    pa, pb = phases(a), phases(b)
    print(f"== {path} against {base}")
    print("phase     steps   ms      out  tok/ms  |  steps   ms      out  tok/ms  |  ms more")
    for k in ("prompt", "decode", "tail"):
        x, y = pa[k], pb[k]
        rx = x[2] / (x[1] / 1e3) if x[1] else 0.0
        ry = y[2] / (y[1] / 1e3) if y[1] else 0.0
        print(f"{k:8} {x[0]:6d} {x[1] / 1e3:6.1f} {x[2]:7d} {rx:7.1f}  | {y[0]:6d} "
              f"{y[1] / 1e3:6.1f} {y[2]:7d} {ry:7.1f}  | {(x[1] - y[1]) / 1e3:+7.1f}")
    plain = {}
    for s in a:
        if s["plain"] and s["rows"] == s["dec"]:
            plain.setdefault(s["rows"], [[], []])[0].append(s["us"])
    for s in b:
        if s["rows"] == s["dec"] and s["rows"] in plain:
            plain[s["rows"]][1].append(s["us"])
    both = [(r, v) for r, v in sorted(plain.items()) if v[0] and v[1]]
    if both:
        n = sum(len(v[0]) for _, v in both)
        more = sum(len(v[0]) * (median(v[0]) - median(v[1])) for _, v in both)
        top = max(both, key=lambda rv: len(rv[1][0]))
        print(f"plain decode steps: {n} at row counts none ran too, {more / 1e3:+.1f} ms against "
              f"none's medians (at {top[0]} rows, {len(top[1][0])} steps: "
              f"{median(top[1][0]):.1f} us against {median(top[1][1]):.1f})")
    return 0


def main(argv):
    n_slow, files, base = 5, [], None
    i = 0
    while i < len(argv):
        if argv[i] == "--slow" and i + 1 < len(argv):
            n_slow = int(argv[i + 1])
            i += 2
            continue
        if argv[i] == "--against" and i + 1 < len(argv):
            base = argv[i + 1]
            i += 2
            continue
        files.append(argv[i])
        i += 1
    if not files:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    if base:
        return max(against(f, base) for f in files)
    return max(summary(f, n_slow) for f in files)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
