#!/usr/bin/env python3
"""q8h_numerics.py: the numerics of the FP8 GEMM in half precision (kernels/mma_tile.cuh:
mma_rows_q8h), modelled on the CPU: x as two f16 terms of x 2^e per row and chunk of 64 k, codes
exact in f16, each chunk's products summed in fp32, times 2^-e and the 128 x 128 block scale,
added in chunk order; against an fp64
dot of the decoded weights, for the rows test_gpu's op/matmul_q8_range uses (2^60, 2^-60,
elements over 2^-40 .. 2^40, plain). It checks the method's error against the GPU tests' bound
(1e-4 of the row's largest output), not the kernels: the tensor cores' own summation order and
rounding are the GPU suite's to check. Standard library only.

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
def row(kind):
    if kind == 0: return [math.ldexp(random.uniform(-1, 1), 60) for _ in range(IN)]
    if kind == 1: return [math.ldexp(random.uniform(-1, 1), -60) for _ in range(IN)]
    if kind == 2: return [math.ldexp(random.uniform(-1, 1), random.randrange(81) - 40) for _ in range(IN)]
    return [random.uniform(-1, 1) for _ in range(IN)]
def run(name, code, scale, chunk, g):
    """code(o, k): the f16 value the kernel multiplies (exact); scale(o, k): the block's power
    of two; the weight is code * 2^g * 2^scale"""
    worst = 0
    for kind in range(4):
        x = row(kind)
        ref, got = [], []
        for o in range(OUT):
            ref.append(sum(x[k] * code(o, k) * 2.0**(scale(o, k) + g) for k in range(IN)))
            c = 0.0
            for c0 in range(0, IN, chunk):
                m = max(abs(v) for v in x[c0:c0 + chunk])
                E = (struct.unpack('I', struct.pack('f', m))[0] >> 23) & 255
                e = min(max(141 - E, -126), 126)
                acc = 0.0
                for k in range(c0, c0 + chunk):
                    y = f32(x[k] * 2.0**e); hi = f16(y); lo = f16(f32(y - hi))
                    wc = code(o, k)
                    assert f16(wc) == wc
                    acc = f32(acc + f32(hi * wc)); acc = f32(acc + f32(lo * wc))
                c = f32(c + f32(f32(acc * 2.0**(g - e)) * 2.0**scale(o, c0)))
            got.append(c)
        err = max(abs(a - b) for a, b in zip(got, ref)) / max(abs(v) for v in ref)
        worst = max(worst, err)
        print(name, "row kind", kind, "max |err| / max |ref|:", "%.2e" % err)
    return worst
q8 = [[random.randrange(256) for _ in range(IN)] for _ in range(OUT)]
for r in q8:
    for i, c in enumerate(r):
        if (c & 0x7f) == 0x7f: r[i] = c & 0x80 | 0x7e
s8 = [118 + random.randrange(17) for _ in range((IN + 127) // 128)]  # OUT <= 128: one block row
worst = run("FP8", lambda o, k: e4m3(q8[o][k]), lambda o, k: s8[k // 128] - 127, 64, 0)
print("worst %.2e (test bound 1e-4)" % worst)
