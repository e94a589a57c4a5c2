#!/usr/bin/env python3
"""ncu_step.py: one decode step's kernels from an Nsight Compute CSV (bench/step_kernels.sh).

    python3 tools/ncu_step.py FILE.csv [--first KERNEL] [--order]

FILE.csv: `ncu --metrics gpu__time_duration.sum --csv ...` over a run of a few steps. A step
starts at each launch of KERNEL (default embed_kernel, the forward's first); the last complete
step (between the last two starts) is shown: per kernel name, its launches, total and mean
microseconds, largest total first (--order: every launch in order instead), then the step's
kernel count and sum. Kernels run one at a time under ncu, so the sum is more than the step
takes in a graph with programmatic dependent launch (TD_TIMELINE gives that).
"""
import csv
import re
import sys


def name_of(raw):
    n = re.sub(r'^void ', '', raw.strip())
    return re.sub(r'[<(].*', '', n)


def load(path):
    rows = list(csv.reader(open(path)))
    h = next(i for i, r in enumerate(rows) if 'Kernel Name' in r)
    hd = rows[h]
    ki, vi, ui = hd.index('Kernel Name'), hd.index('Metric Value'), hd.index('Metric Unit')
    out = []
    for r in rows[h + 1:]:
        if len(r) <= vi or not r[vi]:
            continue
        v = float(r[vi].replace(',', ''))
        unit = r[ui]
        us = v / 1000.0 if unit in ('nsecond', 'ns') else v * 1000.0 if unit in ('msecond', 'ms') \
            else v if unit in ('usecond', 'us') else v / 1000.0
        out.append((name_of(r[ki]), us))
    return out


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    first = argv[argv.index('--first') + 1] if '--first' in argv else 'embed_kernel'
    ks = load(argv[1])
    starts = [i for i, (n, _) in enumerate(ks) if n == first]
    if len(starts) < 2:
        print(f'ncu_step: fewer than two launches of {first} in {argv[1]}', file=sys.stderr)
        return 1
    step = ks[starts[-2]:starts[-1]]
    if '--order' in argv:
        for n, us in step:
            print(f'{us:9.2f}  {n}')
    else:
        agg = {}
        for n, us in step:
            c, t = agg.get(n, (0, 0.0))
            agg[n] = (c + 1, t + us)
        print(f'{"kernel":40s} {"launches":>8s} {"total us":>9s} {"mean us":>8s}')
        for n, (c, t) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
            print(f'{n:40s} {c:8d} {t:9.1f} {t / c:8.2f}')
    print(f'step: {len(step)} kernels, {sum(us for _, us in step):.1f} us')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
