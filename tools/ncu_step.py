#!/usr/bin/env python3
"""ncu_step.py: one decode step's kernels from an Nsight Compute CSV (bench/step_kernels.sh).

    python3 tools/ncu_step.py FILE.csv [--first KERNEL] [--order]

FILE.csv: `ncu --metrics gpu__time_duration.sum --csv ...` over a run of a few steps. A step
starts at each launch of KERNEL (default embed_kernel, the forward's first); the last complete
step (between the last two starts) is shown: per kernel name, its launches, total and mean
microseconds, largest total first (--order: every launch in order instead), then the step's
kernel count and sum. Kernels run one at a time under ncu, so the sum is more than the step
takes in a graph with programmatic dependent launch (TD_TIMELINE gives that). Where the CSV also
holds dram__bytes_read.sum (METRICS=... in bench/step_kernels.sh), each kernel's bytes read
from device memory and its rate are shown too.
"""
import csv
import re
import sys


def name_of(raw):
    n = re.sub(r'^void ', '', raw.strip())
    return re.sub(r'[<(].*', '', n)


def load(path):
    """[(kernel name, us, bytes read or None)], a launch each, in order"""
    rows = list(csv.reader(open(path)))
    h = next(i for i, r in enumerate(rows) if 'Kernel Name' in r)
    hd = rows[h]
    ki, vi, ui = hd.index('Kernel Name'), hd.index('Metric Value'), hd.index('Metric Unit')
    mi = hd.index('Metric Name') if 'Metric Name' in hd else None
    idi = hd.index('ID') if 'ID' in hd else None
    out, at = [], {}
    for n, r in enumerate(rows[h + 1:]):
        if len(r) <= vi or not r[vi]:
            continue
        v = float(r[vi].replace(',', ''))
        unit, metric = r[ui], r[mi] if mi is not None else 'gpu__time_duration.sum'
        key = r[idi] if idi is not None else n
        if key not in at:
            at[key] = len(out)
            out.append([name_of(r[ki]), 0.0, None])
        e = out[at[key]]
        if metric.startswith('dram__bytes'):
            scale = {'byte': 1, 'Kbyte': 1e3, 'Mbyte': 1e6, 'Gbyte': 1e9}.get(unit, 1)
            e[2] = v * scale
        else:
            e[1] = v / 1000.0 if unit in ('nsecond', 'ns') else v * 1000.0 \
                if unit in ('msecond', 'ms') else v if unit in ('usecond', 'us') else v / 1000.0
    return [tuple(e) for e in out]


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    first = argv[argv.index('--first') + 1] if '--first' in argv else 'embed_kernel'
    ks = load(argv[1])
    starts = [i for i, k in enumerate(ks) if k[0] == first]
    if len(starts) < 2:
        print(f'ncu_step: fewer than two launches of {first} in {argv[1]}', file=sys.stderr)
        return 1
    step = ks[starts[-2]:starts[-1]]
    has_bytes = any(b is not None for _, _, b in step)
    rate = lambda t, b: f' {b / 1e6:10.2f} {b / t / 1e3 if t else 0:8.1f}' if has_bytes else ''
    if '--order' in argv:
        for n, us, b in step:
            print(f'{us:9.2f}{rate(us, b or 0)}  {n}')
    else:
        agg = {}
        for n, us, b in step:
            c, t, bb = agg.get(n, (0, 0.0, 0.0))
            agg[n] = (c + 1, t + us, bb + (b or 0))
        extra = f' {"MB read":>10s} {"GB/s":>8s}' if has_bytes else ''
        print(f'{"kernel":40s} {"launches":>8s} {"total us":>9s} {"mean us":>8s}{extra}')
        for n, (c, t, bb) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
            print(f'{n:40s} {c:8d} {t:9.1f} {t / c:8.2f}{rate(t, bb)}')
    tot = sum(us for _, us, _ in step)
    tb = sum(b or 0 for _, _, b in step)
    print(f'step: {len(step)} kernels, {tot:.1f} us' +
          (f', {tb / 1e6:.1f} MB read, {tb / tot / 1e3:.1f} GB/s' if has_bytes and tot else ''))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
