#!/usr/bin/env python3
"""make_dspark_fixtures.py: PyTorch-reference fixtures for the C DSpark drafter.

    python3 tools/make_dspark_fixtures.py [--only tiny|b|c]     (needs bin/tandem built)

Three configurations, each with a short context (fewer rows than the window) and a long one
(more: the rings wrap):
  tests/fixtures/dspark_tiny/  tandem-tiny's trained drafter (models/tandem-tiny/dspark), the
        prompt "In the beginning God created ..." and it followed by the target's greedy
        continuation to 200 tokens;
  tests/fixtures/dspark_b/     a random drafter (seeded, written to dspark_b/dspark/) over the
        random test target tests/fixtures/b_plain_hc2: hc_mult 2, window 16, sigmoid routing,
        shared-expert biases, capture layers [0, 2], 2 stages, block 4, rank 8; its ids.txt
        cut at 12 and at 120 tokens;
  tests/fixtures/dspark_c/     a random drafter over tests/fixtures/c_upstream_sharded (upstream
        layout, hc_mult 3, window 16, sigmoid routing over 6 experts): capture layers [1, 2, 3],
        3 stages, block 6, rank 16, noise id 7; its ids.txt cut at 9 and at 200 tokens.
The target's side comes from Tandem's reference forward (`tandem logits --capture`, the CPU
forward checked against HF transformers by the foundation fixtures): its logits give the
anchor (greedy) and its captured rows the context. For each case, tools/dspark_ref.py runs one
round at T = 0 (greedy drafts, confidences) and one at T = 1 with a seeded generator (the
sampled chain, its Markov-corrected logits Z and confidences). Before writing, the training
form of the block (one anchor, window_index) must give the round's base logits (the cache
equivalence test of drafters.md 6.4). Writes dspark.json and dspark.safetensors (<case>_U
[g, V] base logits, <case>_Z [g, V] the chain's Z) under each directory.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tandem_tiny as tt  # noqa: E402
from dspark_ref import (V4DSpark, embed_head, load_dspark, st_save, target_config,  # noqa: E402
                        window_index, write_dspark)

TANDEM = os.path.join(tt.REPO, "bin", "tandem")
FIX = os.path.join(tt.REPO, "tests", "fixtures")
PROMPT = "In the beginning God created the heaven and the earth. And the earth was without form"
B_DSPARK = dict(dspark_block_size=4, dspark_noise_token_id=299, dspark_markov_rank=8,
                dspark_target_layer_ids=[0, 2], dspark_num_stages=2)
C_DSPARK = dict(dspark_block_size=6, dspark_noise_token_id=7, dspark_markov_rank=16,
                dspark_target_layer_ids=[1, 2, 3], dspark_num_stages=3)


def run(*args):
    return subprocess.run([TANDEM, *args], capture_output=True, text=True, check=True).stdout


def target_rows(model, ids, layers):
    """the C reference forward: logits [n, V] and captured rows [n, m*D]"""
    with tempfile.TemporaryDirectory() as d:
        ip, lp, cp = (os.path.join(d, f) for f in ("ids.txt", "l.npy", "c.npy"))
        with open(ip, "w") as fh:
            fh.write(" ".join(map(str, ids)) + "\n")
        run("logits", "--model", model, "--ids", ip, "--out", lp, "--capture",
            ",".join(map(str, layers)), "--capture-out", cp)
        return torch.from_numpy(np.load(lp)), torch.from_numpy(np.load(cp))


@torch.no_grad()
def write_cases(out, model, ds, cases):
    embed, head = embed_head(model)
    layers = ds.dcfg["dspark_target_layer_ids"]
    meta = {"model": os.path.relpath(model, tt.REPO), "gamma": ds.gamma, "noise": ds.noise,
            "window": ds.window, "capture_layers": layers, "cases": {}}
    tensors = {}
    for name, ids in cases:
        lg, cap = target_rows(model, ids, layers)
        anchor = int(torch.argmax(lg[-1]))
        g0 = ds.round(cap, anchor, embed, head, 0.0)
        g1 = ds.round(cap, anchor, embed, head, 1.0, torch.Generator().manual_seed(7))
        P = len(ids)  # the training form at this anchor: window_index over every row
        y = ds.block(ds.context(cap[None]), torch.arange(P)[None],
                     torch.tensor([[[anchor] + [ds.noise] * (ds.gamma - 1)]]),
                     torch.arange(P, P + ds.gamma)[None, None], embed,
                     window_index(torch.tensor([[P]]), ds.window))
        dU = float((ds.base_logits(y, head)[0, 0] - g0["U"]).abs().max())
        tt.log(f"{os.path.basename(out)} {name}: {P} rows, anchor {anchor}, greedy {g0['drafts']} "
               f"conf {[round(c, 3) for c in g0['conf']]}, chain {g1['drafts']}; "
               f"training form vs round max|dU| {dU:.1e}")
        assert dU < 1e-3, f"the training-form block differs from the round by {dU}"
        meta["cases"][name] = {"ids": ids, "anchor": anchor, "greedy_drafts": g0["drafts"],
                               "greedy_conf": g0["conf"], "chain": g1["drafts"],
                               "chain_conf": g1["conf"]}
        tensors[f"{name}_U"] = g0["U"].float().contiguous()
        tensors[f"{name}_Z"] = g1["Z"].float().contiguous()
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "dspark.json"), "w") as fh:
        json.dump(meta, fh)
    st_save(tensors, os.path.join(out, "dspark.safetensors"))


def tiny():
    model = tt.MODEL_DIR
    ds = load_dspark(os.path.join(model, "dspark"), target_config(model))
    ids = [int(x) for x in run("tokenize", "--model", model, "--text", PROMPT).split()]
    more = run("generate", "--model", model, "--prompt-ids", " ".join(map(str, ids)), "--draft",
               "none", "--max-tokens", str(200 - len(ids)), "--ignore-eos", "--print-ids")
    write_cases(os.path.join(FIX, "dspark_tiny"), model, ds,
                [("short", ids), ("long", ids + [int(x) for x in more.split()])])


def fixture_random(name, target, dcfg, seed, cuts):
    """a seeded random drafter over a random test target; the target's ids.txt cut at cuts"""
    model = os.path.join(FIX, target)
    out = os.path.join(FIX, "dspark_" + name)
    ds = V4DSpark(target_config(model), dcfg)
    ds.init_random(seed=seed)
    with torch.no_grad():  # the target's embedding has std 1: keep U and the Markov bias at a
        ds.norm.weight.mul_(0.05)  # scale where sampled chains vary (std ~0.4 each)
        g = torch.Generator().manual_seed(seed + 1)
        ds.markov_w1.copy_(torch.randn(ds.markov_w1.shape, generator=g) * 0.4)
        ds.markov_w2.copy_(torch.randn(ds.markov_w2.shape, generator=g) * 0.4)
    ds.round_to_storage()
    write_dspark(os.path.join(out, "dspark"), ds)
    ids = [int(x) for x in open(os.path.join(model, "ids.txt")).read().split()]
    write_cases(out, model, ds, [("short", ids[:cuts[0]]), ("long", ids[:cuts[1]])])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=("tiny", "b", "c"), default=None)
    a = ap.parse_args()
    torch.manual_seed(0)
    if a.only in (None, "b"):
        fixture_random("b", "b_plain_hc2", B_DSPARK, 5, (12, 120))
    if a.only in (None, "c"):
        fixture_random("c", "c_upstream_sharded", C_DSPARK, 9, (9, 200))
    if a.only in (None, "tiny"):
        tiny()


if __name__ == "__main__":
    main()
