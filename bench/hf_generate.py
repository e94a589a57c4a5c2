#!/usr/bin/env python3
"""hf_generate.py: the HF transformers baseline for `tandem generate` on the same GPU.

    python3 bench/hf_generate.py --model tests/fixtures/a_tiny_yarn --prompt-len 64 \
        --max-tokens 128 --batch 1 [--device cuda]

Greedy decoding with DeepseekV4ForCausalLM (fp32: HF 5.17's V4 does not run in bf16 without an
FP8 config, dsv4.md 1.3), the prompt = the fixture's first prompt-len ids, repeated `batch`
times (V4's compressors take no padding). Prints one line: hf tokens/s and the first row's ids
(with --prefill: one timed forward over the prompts, prefill tokens/s).
"""
import argparse
import time

import torch
from transformers import DeepseekV4ForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prompt-ids", default=None, help="the prompt as ids (else the fixture's)")
    ap.add_argument("--upstream", action="store_true",
                    help="the model dir is in the upstream layout (models/tandem-tiny)")
    ap.add_argument("--prefill", action="store_true",
                    help="time one forward over the prompt instead (prefill tokens/s)")
    a = ap.parse_args()
    if a.prompt_ids:
        ids = [int(x) for x in a.prompt_ids.split()]
    else:
        ids = [int(x) for x in open(f"{a.model}/ids.txt").read().split()][: a.prompt_len]
    if a.upstream:
        import os
        import sys
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
        import tandem_tiny
        model = tandem_tiny.load_target(a.model)
        model = (model[0] if isinstance(model, tuple) else model).to(a.device).eval()
    else:
        model = DeepseekV4ForCausalLM.from_pretrained(a.model, dtype=torch.float32)
        model = model.to(a.device).eval()
    x = torch.tensor([ids] * a.batch, device=a.device)
    if a.prefill:
        with torch.no_grad():
            model(input_ids=x, use_cache=False)  # warm-up
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model(input_ids=x, use_cache=False)
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
        n = len(ids) * a.batch
        print(f"hf prefill batch {a.batch}: {n} tokens in {dt:.3f} s = {n / dt:.1f} tokens/s")
        return
    kw = dict(max_new_tokens=a.max_tokens, min_new_tokens=a.max_tokens, do_sample=False)
    with torch.no_grad():
        model.generate(x, **dict(kw, max_new_tokens=4, min_new_tokens=4))  # warm-up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model.generate(x, **kw)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
    n = a.max_tokens * a.batch
    print(f"hf batch {a.batch}: {n} tokens in {dt:.3f} s = {n / dt:.1f} tokens/s; "
          f"ids {' '.join(str(int(v)) for v in out[0, len(ids):len(ids) + 16])}")


if __name__ == "__main__":
    main()
