#!/usr/bin/env python3
"""q8h_numerics.py: the numerics of the FP8 skinny GEMM in half precision (kernels/mma_tile.cuh,
mma_rows_q8h), modelled on the CPU: x as two f16 terms of x 2^e per row and chunk of 64 k, codes
exact in f16, each chunk's products summed in fp32, times 2^-e and the block scale, added in chunk
order; against an fp64 dot of the decoded weights, for the rows test_gpu's op/matmul_q8_range
uses (2^60, 2^-60, elements over 2^-40 .. 2^40, plain). It checks the method's error against the
GPU test's bound (1e-4 of the row's largest output), not the kernel: the tensor cores' own
summation order and rounding are the GPU suite's to check. Standard library only.

    python3 tools/q8h_numerics.py
"""
import random, struct, math
def f16(v): return struct.unpack('e', struct.pack('e', v))[0]
def f32(v): return struct.unpack('f', struct.pack('f', v))[0]
def e4m3(c):
    s = -1.0 if c & 0x80 else 1.0; e = (c >> 3) & 15; m = c & 7
    if e == 15 and m == 7: return float('nan')
    return s * (m / 8.0 * 2.0**-6 if e == 0 else (1 + m / 8.0) * 2.0**(e - 7))
random.seed(1)
IN, OUT = 1024, 8
codes = [[random.randrange(256) for _ in range(IN)] for _ in range(OUT)]
for r in codes:
    for i, c in enumerate(r):
        if (c & 0x7f) == 0x7f: r[i] = c & 0x80 | 0x7e
scales = [[118 + random.randrange(17) for _ in range((IN + 127) // 128)] for _ in range(1)]  # OUT <= 128
def row(kind):
    if kind == 0: return [math.ldexp(random.uniform(-1, 1), 60) for _ in range(IN)]
    if kind == 1: return [math.ldexp(random.uniform(-1, 1), -60) for _ in range(IN)]
    if kind == 2: return [math.ldexp(random.uniform(-1, 1), random.randrange(81) - 40) for _ in range(IN)]
    return [random.uniform(-1, 1) for _ in range(IN)]
worst = 0
for kind in range(4):
    x = row(kind)
    ref = []; got = []
    for o in range(OUT):
        w = [e4m3(codes[o][k]) * 2.0**(scales[0][k // 128] - 127) for k in range(IN)]
        ref.append(sum(a * b for a, b in zip(x, w)))
        c = 0.0
        for c0 in range(0, IN, 64):
            m = max(abs(v) for v in x[c0:c0 + 64])
            E = (struct.unpack('I', struct.pack('f', m))[0] >> 23) & 255
            e = min(max(141 - E, -126), 126)
            acc = 0.0
            for k in range(c0, c0 + 64):
                y = f32(x[k] * 2.0**e); hi = f16(y); lo = f16(f32(y - hi))
                wc = e4m3(codes[o][k])
                acc = f32(acc + f32(hi * wc)); acc = f32(acc + f32(lo * wc))
            c = f32(c + f32(f32(acc * 2.0**-e) * 2.0**(scales[0][c0 // 128] - 127)))
        got.append(c)
    scale = max(abs(v) for v in ref)
    err = max(abs(a - b) for a, b in zip(got, ref)) / scale
    worst = max(worst, err)
    print("row kind", kind, "max |err| / max |ref|:", "%.2e" % err)
print("worst %.2e (test bound 1e-4)" % worst)
