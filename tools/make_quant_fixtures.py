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

With --model SRC --released OUT, SRC (a checkpoint in DeepSeek's upstream names, such as
tests/fixtures/c_upstream_sharded) is written in the released precision (released_formats.md
1.3, 1.8): OUT/model.safetensors with the routed experts FP4 (I8 [out, in/2] + F8_E8M0
[out, in/32]), the other 2-D linears FP8 (F8_E4M3 + F8_E8M0 [ceil(out/128), ceil(in/128)]),
and embed, head, norms, the router, the compressors' wkv/wgate and the indexer's weights_proj
as they were; config.json gains the release's quantization_config and expert_dtype. OUT/ref/
gets the same model with every quantized weight decoded back to F32 (no scales): the oracle
the quantized checkpoint must reproduce bit for bit.
"""
import argparse
import json
import os

import torch

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


KEEP = ("embed.", "head.", "norm", ".ffn.gate.", "compressor.", "weights_proj")


def e8m0_for(amax, top):
    """the scale byte whose power of two brings amax to at most top"""
    e = torch.where(amax > 0, torch.ceil(torch.log2(amax / top)), torch.full_like(amax, -127.0))
    return (e.clamp(-127, 127) + 127).to(torch.uint8)


def quant_fp8(w):
    out, inn = w.shape
    so, si = (out + 127) // 128, (inn + 127) // 128
    pad = torch.zeros(so * 128, si * 128)
    pad[:out, :inn] = w
    blocks = pad.reshape(so, 128, si, 128).abs().amax(dim=(1, 3))
    s = e8m0_for(blocks, 448.0)
    sf = s.view(torch.float8_e8m0fnu).float()
    full = sf.repeat_interleave(128, 0)[:out].repeat_interleave(128, 1)[:, :inn]
    q = (w / full).to(torch.float8_e4m3fn)
    return q.view(torch.uint8), s, q.float() * full


def quant_fp4(w):
    out, inn = w.shape
    lut = torch.tensor(E2M1)
    s = e8m0_for(w.reshape(out, inn // 32, 32).abs().amax(dim=2), 6.0)
    full = s.view(torch.float8_e8m0fnu).float().repeat_interleave(32, 1)
    codes = (w / full).unsqueeze(-1).sub(lut).abs().argmin(dim=-1)  # nearest code
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    return packed.view(torch.int8), s, lut[codes] * full


def make_released(src, out):
    from safetensors.torch import load_file, save_file
    ts = {}
    for f in sorted(os.listdir(src)):
        if f.startswith("model") and f.endswith(".safetensors"):
            ts.update(load_file(os.path.join(src, f)))
    q, ref, n8, n4 = {}, {}, 0, 0
    for name, t in sorted(ts.items()):
        quantize = name.endswith(".weight") and t.dim() == 2 and not any(k in name for k in KEEP)
        if quantize and ".experts." in name:
            w, s, deq = quant_fp4(t.float())
            n4 += 1
        elif quantize:
            w, s, deq = quant_fp8(t.float())
            w = w.view(torch.float8_e4m3fn)
            n8 += 1
        else:
            q[name] = ref[name] = t
            continue
        q[name], q[name[:-len(".weight")] + ".scale"] = w, s.view(torch.float8_e8m0fnu)
        ref[name] = deq
    cfg = json.load(open(os.path.join(src, "config.json")))
    os.makedirs(os.path.join(out, "ref"), exist_ok=True)
    json.dump(cfg, open(os.path.join(out, "ref", "config.json"), "w"), indent=1)
    cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3",
                                  "quant_method": "fp8", "scale_fmt": "ue8m0",
                                  "weight_block_size": [128, 128]}
    cfg["expert_dtype"] = "fp4"
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=1)
    save_file(q, os.path.join(out, "model.safetensors"))
    save_file(ref, os.path.join(out, "ref", "model.safetensors"))
    for f in ("ids.txt",):
        if os.path.exists(os.path.join(src, f)):
            open(os.path.join(out, f), "w").write(open(os.path.join(src, f)).read())
    print(f"released: {n8} FP8 and {n4} FP4 weights, {len(ts) - n8 - n4} kept")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--model", help="with --released: the checkpoint to write in released precision")
    ap.add_argument("--released", metavar="OUT")
    a = ap.parse_args()
    if a.released:
        make_released(a.model, a.released)
        if not a.out:
            return
    os.makedirs(a.out, exist_ok=True)
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
