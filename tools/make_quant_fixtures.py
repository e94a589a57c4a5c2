#!/usr/bin/env python3
"""make_quant_fixtures.py: the released FP8/FP4 formats decoded by PyTorch, for tests/test_quant.c.

Runs where torch (2.11, with float8_e4m3fn and float8_e8m0fnu) is installed (the GPU box; CPU only):

    python3 tools/make_quant_fixtures.py --out tests/fixtures/quant

Writes raw little-endian files:
    e4m3.f32   the 256 e4m3fn bytes as torch decodes them (float8_e4m3fn -> float32)
    e8m0.f32   the 256 e8m0 bytes as torch decodes them (float8_e8m0fnu -> float32; 255 NaN)
    fp8_q.u8, fp8_s.u8, fp8_w.f32   a [130, 200] FP8 weight with its [2, 2] 128x128 block scales
               (partial blocks on both axes) and torch's dequantization q.float() * scale
    fp4_q.u8, fp4_s.u8, fp4_w.f32   a [6, 64] FP4 weight packed [6, 32] (element 2j in the low
               nibble of byte j) with its [6, 2] per-32 scales, dequantized as vLLM's
               fp4_dequant.py does (low and high nibbles stacked, then flattened, times the scale)
Scale bytes are drawn from 100..140 (2^-27 .. 2^13): no NaN byte, as in a real checkpoint.
"""
import argparse
import os

import torch

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    g = torch.Generator().manual_seed(22)

    def put(name, t):
        with open(os.path.join(a.out, name), "wb") as f:
            f.write(t.contiguous().numpy().tobytes())

    every = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    put("e4m3.f32", every.view(torch.float8_e4m3fn).float())
    put("e8m0.f32", every.view(torch.float8_e8m0fnu).float())

    out, inn = 130, 200
    q = torch.randint(0, 256, (out, inn), generator=g, dtype=torch.int32).to(torch.uint8)
    q[q == 0x7F] = 0x7E  # no NaN codes in a weight
    q[q == 0xFF] = 0xFE
    s = torch.randint(100, 141, ((out + 127) // 128, (inn + 127) // 128), generator=g,
                      dtype=torch.int32).to(torch.uint8)
    sf = s.view(torch.float8_e8m0fnu).float()
    full = sf.repeat_interleave(128, 0)[:out].repeat_interleave(128, 1)[:, :inn]
    put("fp8_q.u8", q)
    put("fp8_s.u8", s)
    put("fp8_w.f32", q.view(torch.float8_e4m3fn).float() * full)

    out, inn = 6, 64
    p = torch.randint(0, 256, (out, inn // 2), generator=g, dtype=torch.int32).to(torch.uint8)
    s = torch.randint(100, 141, (out, inn // 32), generator=g, dtype=torch.int32).to(torch.uint8)
    lut = torch.tensor(E2M1)
    codes = torch.stack([p & 0x0F, (p >> 4) & 0x0F], dim=-1).reshape(out, inn).long()
    w = lut[codes] * s.view(torch.float8_e8m0fnu).float().repeat_interleave(32, 1)
    put("fp4_q.u8", p)
    put("fp4_s.u8", s)
    put("fp4_w.f32", w)
    print("wrote", sorted(os.listdir(a.out)))


if __name__ == "__main__":
    main()
