#!/usr/bin/env python3
"""ncu_step.py: one decode step's kernels from an Nsight Compute CSV (bench/step_kernels.sh).

    python3 tools/ncu_step.py FILE.csv [--first KERNEL] [--order] [--all]
                                       [--flops CONFIG.json --prefill N]

FILE.csv: `ncu --metrics gpu__time_duration.sum --csv ...` over a run of a few steps. A step
starts at each launch of KERNEL (default embed_kernel, the forward's first); the last complete
step (between the last two starts) is shown: per kernel name, its launches, total and mean
microseconds, largest total first (--order: every launch in order instead), then the step's
kernel count and sum. Kernels run one at a time under ncu, so the sum is more than the step
takes in a graph with programmatic dependent launch (TD_TIMELINE gives that). Where the CSV also
holds dram__bytes_read.sum (METRICS=... in bench/step_kernels.sh), each kernel's bytes read
from device memory and its rate are shown too.

--all takes every launch in the file as the step (a profiled window of one step: a prefill).
--flops CONFIG.json --prefill N adds a table by op (routed experts, attention, the indexer's
scores, mHC, dense projections and the rest): each op's kernels, time, the FLOPs a prefill of N
tokens from position 0 does in it by the config's shapes (prefill_flops), and its rate.
"""
import csv
import json
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
        if metric.startswith('dram__bytes_read'):
            scale = {'byte': 1, 'Kbyte': 1e3, 'Mbyte': 1e6, 'Gbyte': 1e9}.get(unit, 1)
            e[2] = v * scale
        elif metric.startswith('gpu__time_duration'):
            e[1] = v / 1000.0 if unit in ('nsecond', 'ns') else v * 1000.0 \
                if unit in ('msecond', 'ms') else v if unit in ('usecond', 'us') else v / 1000.0
    return [tuple(e) for e in out]


# the op a kernel belongs to (by name), for --flops
OPS = [('routed experts', ('moe_wide', 'moe_wg', 'moe_gemm', 'moe_mma')),
       ('attention', ('attention_',)),
       ('indexer scores', ('indexer_score', 'indexer_mma')),
       ('mHC mixes', ('hc_mix', 'hc_pre', 'hc_head')),
       ('dense projections', ('nvjet', 'skinny_mma', 'matmul_', 'dequant_bf16', 'to_bf16',
                              'f8_act_quant', 'cutlass', 'gemm'))]


def op_of(name):
    for op, prefixes in OPS:
        if name.startswith(prefixes):
            return op
    return 'other'


def prefill_flops(cfg, n):
    """FLOPs by op of a prefill of n tokens from position 0 (a multiply-add is 2), from an HF
    DeepSeek-V4 config.json: the head on the last row only, as the forward runs it"""
    D, H, hd = cfg['hidden_size'], cfg['num_attention_heads'], cfg['head_dim']
    I, k = cfg['moe_intermediate_size'], cfg['num_experts_per_tok']
    E, sh = cfg['n_routed_experts'], cfg.get('n_shared_experts', 0)
    ql, og, ol = cfg['q_lora_rank'], cfg['o_groups'], cfg['o_lora_rank']
    ih, idim, topk = cfg['index_n_heads'], cfg['index_head_dim'], cfg['index_topk']
    W, nc = cfg['sliding_window'], cfg['hc_mult']
    rates = cfg.get('compress_ratios') or [0] * cfg['num_hidden_layers']
    rate_csa = cfg.get('compress_rate_csa', 4)
    f = dict.fromkeys([op for op, _ in OPS], 0.0)
    for r in rates[:cfg['num_hidden_layers']]:
        csa, hca = r == rate_csa, r > rate_csa
        dense = D * ql + ql * H * hd + D * hd + H * hd * ol + og * ol * D + D * E + 3 * D * I * sh
        if csa or hca:
            dense += 2 * (2 * hd if csa else hd) * D  # the compressor's wkv and wgate
        if csa:
            dense += ql * ih * idim + D * ih + 2 * 2 * idim * D  # the indexer's q, weights, compressor
        f['dense projections'] += 2.0 * n * dense
        f['routed experts'] += 2.0 * n * k * 3 * D * I
        f['mHC mixes'] += 2 * 2.0 * n * (2 + nc) * nc * nc * D
        for p in range(n):
            keys = min(p + 1, W)
            if csa:
                keys += min(topk, (p + 1) // rate_csa)
                f['indexer scores'] += 2.0 * ((p + 1) // rate_csa) * ih * idim
            elif hca:
                keys += (p + 1) // r
            f['attention'] += 4.0 * keys * H * hd
    f['mHC mixes'] += 2.0 * n * nc * nc * D
    f['dense projections'] += 2.0 * D * cfg['vocab_size']
    return f


def op_table(step, cfg, n):
    fl = prefill_flops(cfg, n)
    agg = {}
    for name, us, b in step:
        c, t, bb = agg.get(op_of(name), (0, 0.0, 0.0))
        agg[op_of(name)] = (c + 1, t + us, bb + (b or 0))
    tot = sum(t for _, t, _ in agg.values())
    print(f'\nprefill of {n} tokens by op (FLOPs from the config; a multiply-add is 2):')
    print(f'{"op":20s} {"launches":>8s} {"ms":>9s} {"share":>6s} {"GFLOP":>9s} {"TFLOP/s":>8s} '
          f'{"GB read":>8s}')
    for op in [o for o, _ in OPS] + ['other']:
        c, t, bb = agg.get(op, (0, 0.0, 0.0))
        g = fl.get(op, 0.0) / 1e9
        rate = f'{g / t * 1e3:8.1f}' if t and g else f'{"":8s}'
        print(f'{op:20s} {c:8d} {t / 1e3:9.2f} {100 * t / tot if tot else 0:5.1f}% {g:9.1f} '
              f'{rate} {bb / 1e9:8.2f}')
    g = sum(fl.values()) / 1e9
    print(f'{"all":20s} {sum(c for c, _, _ in agg.values()):8d} {tot / 1e3:9.2f} {100.0:5.1f}% '
          f'{g:9.1f} {g / tot * 1e3 if tot else 0:8.1f}')


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    first = argv[argv.index('--first') + 1] if '--first' in argv else 'embed_kernel'
    ks = load(argv[1])
    starts = [i for i, k in enumerate(ks) if k[0] == first]
    if '--all' in argv:
        step = ks
    elif len(starts) < 2:
        print(f'ncu_step: fewer than two launches of {first} in {argv[1]}', file=sys.stderr)
        return 1
    else:
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
    if '--flops' in argv:
        cfg = json.load(open(argv[argv.index('--flops') + 1]))
        n = int(argv[argv.index('--prefill') + 1]) if '--prefill' in argv else 1
        op_table(step, cfg, n)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
