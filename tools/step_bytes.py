#!/usr/bin/env python3
"""step_bytes.py: the bytes of weights a forward step reads, counted from a config.json in the
precision it names (quantization_config: FP8 dense with one e8m0 byte per 128 x 128, routed
experts by expert_dtype, FP4 with one byte per 32; else bf16), and the device's copy bandwidth.

    python3 tools/step_bytes.py CONFIG.json [--rows R] [--rate TOK_S] [--copy-bw] [--total]

--rows R: a target step of R rows (default 1): every dense matrix, the routed experts R rows
touch if routing is uniform (E * (1 - (1 - k/E)^R) of E a layer) and the shared ones, the
compressors and indexers, the HC mixing (fp32) and the head (bf16). Caches are not counted
(short contexts: a 64-token prompt's window and entries are a few MB). --rate: the bandwidth a
measured tokens/s implies for a batch-1 step. --copy-bw: the device-to-device copy bandwidth
(torch, 4 GiB copied 10 times, bytes read + written). --total: the bytes every weight of the
target, its MTP layer and a DSpark head would take (which expert count fits a device).

As a module (bench/spec_depth.sh): target_bytes, mtp_bytes, dspark_bytes, copy_bandwidth.
"""
import json
import sys
import time


class Prec:
    """bytes an element of each kind of weight takes"""

    def __init__(self, c):
        q = "quantization_config" in c
        ex = c.get("expert_dtype", "fp4") if q else "bf16"
        self.dense = 1 + 1 / 16384 if q else 2
        self.expert = {"fp4": 0.5 + 1 / 32, "fp8": 1 + 1 / 16384}.get(ex, 2)


def experts_touched(c, rows):
    """the routed experts of a layer that rows rows touch, uniform routing"""
    E, k = c["n_routed_experts"], c["num_experts_per_tok"]
    return E * (1 - (1 - k / E) ** rows)


def layer_bytes(c, ratio, rows, all_experts=False):
    """one decoder layer of compress ratio `ratio` (0: sliding window only) over rows rows"""
    p = Prec(c)
    D, H, hd, qr = c["hidden_size"], c["num_attention_heads"], c["head_dim"], c["q_lora_rank"]
    og, orank, I = c["o_groups"], c["o_lora_rank"], c["moe_intermediate_size"]
    E, nc, IH, ihd = c["n_routed_experts"], c["hc_mult"], c["index_n_heads"], c["index_head_dim"]
    n = p.dense * (qr * D + H * hd * qr + hd * D + H * hd * orank + D * og * orank)
    n += 2 * E * D  # the router stays bf16
    touched = E if all_experts else experts_touched(c, rows)
    n += p.expert * touched * 3 * I * D + p.dense * c.get("n_shared_experts", 1) * 3 * I * D
    if ratio:  # the compressor (CSA overlaps: two halves), bf16 as released
        n += 2 * (2 if ratio == c["compress_rate_csa"] else 1) * 2 * hd * D
    if ratio == c["compress_rate_csa"]:  # indexer: q_b FP8, weights_proj and its compressor bf16
        n += p.dense * IH * ihd * qr + 2 * (IH * D + 2 * 2 * ihd * D)
    n += 4 * 2 * (2 + nc) * nc * nc * D  # hc_attn and hc_ffn mixing, fp32
    return n


def head_bytes(c):
    return 2 * c["vocab_size"] * c["hidden_size"]


def target_bytes(c, rows, all_experts=False):
    L = c["num_hidden_layers"]
    return sum(layer_bytes(c, r, rows, all_experts) for r in c["compress_ratios"][:L]) + head_bytes(c)


def mtp_bytes(c, rows, all_experts=False):
    """one pass of the MTP layer (sliding window) over rows rows: e_proj, h_proj, the layer, the
    target's head"""
    D = c["hidden_size"]
    return Prec(c).dense * 2 * D * D + layer_bytes(c, 0, rows, all_experts) + head_bytes(c)


def dspark_bytes(c, d, rows, all_experts=False):
    """one DSpark block pass over rows rows (every sequence's block): main_proj over the captured
    layers, the stages, the head, and the Markov head's W2 once a slot"""
    D, V = c["hidden_size"], c["vocab_size"]
    n_cap, S = len(d["dspark_target_layer_ids"]), d.get("dspark_num_stages", 3)
    n = Prec(c).dense * n_cap * D * D + S * layer_bytes(c, 0, rows, all_experts) + head_bytes(c)
    return n + d["dspark_block_size"] * 2 * V * d["dspark_markov_rank"]


def copy_bandwidth():
    import torch
    x = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    torch.cuda.synchronize()
    return 2 * x.numel() * 10 / (time.perf_counter() - t)


def main(argv):
    if len(argv) < 2 or argv[1].startswith("-"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    c = json.load(open(argv[1]))
    rows, rate, bw, total = 1, None, None, "--total" in argv
    if "--rows" in argv:
        rows = int(argv[argv.index("--rows") + 1])
    if "--rate" in argv:
        rate = float(argv[argv.index("--rate") + 1])
    if total:
        t, m = target_bytes(c, 0, True), mtp_bytes(c, 0, True) - head_bytes(c)
        print(f"all weights: target {t / 1e9:.2f} GB, its MTP layer {m / 1e9:.2f} GB")
        return 0
    n = target_bytes(c, rows)
    line = f"a {rows}-row step reads about {n / 1e9:.2f} GB of weights"
    if rate:
        line += f": {n * rate / 1e12:.2f} TB/s at {rate} tokens/s"
    print(line)
    if "--copy-bw" in argv:
        bw = copy_bandwidth()
        line = f"device-to-device copy {bw / 1e12:.2f} TB/s (read + write)"
        if rate:
            line += f": batch-1 decode reaches {100 * n * rate / bw:.0f}% of it"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
