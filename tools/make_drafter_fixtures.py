#!/usr/bin/env python3
"""make_drafter_fixtures.py: PyTorch-reference fixtures for the C MTP drafter (tests/test_mtp.c).

Runs on the GPU box (torch 2.11, transformers 5.17), on its CPU in fp32:

    python3 tools/make_drafter_fixtures.py --out tests/fixtures/mtp_tiny [--model models/tandem-tiny]
    python3 tools/make_drafter_fixtures.py --random all        # or --random b_plain_hc2 ...

MTP (tools/mtp_ref.py) for a prompt, on the target's one-shot pass:
  - the target's logits on the prompt give the bonus token (greedy);
  - one MTP catch-up step over every prompt row (row q: the target's final streams H_q and the
    token after q; the last row's token is the bonus) -> logits of every row;
  - a k = 3 greedy chain with recycling (mtp_chain) -> drafts and each step's logits.
Writes ids.txt (the prompt), mtp.json (bonus, drafts, k, catchup_rows,
catchup_logits_first_row) and mtp.safetensors (catchup_logits [8, V] of the last 8 rows,
chain_logits [3, V]).

Default: tandem-tiny (models/tandem-tiny and its trained mtp.0.*), the text prompt PROMPT,
into --out.

--random NAME (a target of tools/make_fixtures.py; "all" = b_plain_hc2 and c_upstream_sharded):
the random target tests/fixtures/NAME as stored (checked first: it must reproduce that
fixture's logits.npy), a random MTP layer (make_fixtures' randomize(): non-trivial norms, HC
parameters, sinks and router biases; rounded to the dtypes it is stored in, F16 where the
target keeps F16) and a prompt of N_IDS random ids, both from one seed. A seed is taken only
when the bonus and every chain step have a top-2 logit gap > 1e-3 relative and no router or
indexer of the target or the MTP has a near tie at its top-k cut (as make_fixtures), else the
next is tried. Writes the self-contained model directory tests/fixtures/mtp_NAME/: config.json
(the target's, as stored: HF keys for b, legacy upstream keys with the MTP entry in
compress_ratios for c), model.safetensors (the target's tensors as stored, HF or upstream
names, + the MTP layer as mtp.0.* in upstream names; the C loader takes both layouts and
keeps mtp.*), and the reference files above.
"""
import argparse
import copy
import glob
import json
import math
import os
import shutil
import sys

import numpy as np
import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tandem_tiny as tt  # noqa: E402
from mtp_ref import TargetTap, V4MTP, load_mtp, mtp_chain  # noqa: E402

PROMPT = "In the beginning God created the heaven and the earth. And the earth was without form"
FIXTURES = os.path.join(tt.REPO, "tests", "fixtures")
RANDOM_ALL = ("b_plain_hc2", "c_upstream_sharded")
K = 3             # chain length
LAST_ROWS = 8     # catch-up rows kept in the fixture
N_IDS = 40        # random prompt: longer than the random targets' window (16)
SEEDS = 64
MIN_TOP2 = 1e-3   # top-2 logit gap / max(1, max|row|) of the bonus and every chain step
MIN_CUT = 2e-5    # top-k cut gap of routers and indexers (make_fixtures' threshold)
# the shared-expert biases (mlp_bias) have no entry in make_fixtures.upstream_names(); the C
# loader's upstream names for them
BIAS_NAMES = {"mlp.shared_experts.gate_proj.bias": "ffn.shared_experts.w1.bias",
              "mlp.shared_experts.up_proj.bias": "ffn.shared_experts.w3.bias",
              "mlp.shared_experts.down_proj.bias": "ffn.shared_experts.w2.bias"}


@torch.no_grad()
def run_mtp(target, mtp, ids, tap):
    """The target's last-row logits and bonus, the MTP catch-up logits [n, V], the chain's drafts
    and step logits [K, V]."""
    lg = target(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
    H = tap.h_final[0].float()
    bonus = int(torch.argmax(lg[-1]))
    nxt = torch.tensor(ids[1:] + [bonus])
    pos = torch.arange(len(ids))
    logits, _ = mtp(H[None], nxt[None], pos[None], target.model.embed_tokens, target.lm_head)
    drafts, _, step_logits = mtp_chain(mtp, target, H, nxt, 0, K)
    return lg[-1], bonus, logits[0].float(), drafts, step_logits.float()


def write_reference(out, ids, meta, catchup, chain):
    """ids.txt, mtp.json (meta + the chain's and catch-up's shape), mtp.safetensors."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "ids.txt"), "w") as f:
        f.write(" ".join(str(i) for i in ids) + "\n")
    meta = dict(meta, k=K, catchup_rows=len(ids), catchup_logits_first_row=len(ids) - LAST_ROWS)
    with open(os.path.join(out, "mtp.json"), "w") as f:
        json.dump(meta, f, indent=1)
    save_file({"catchup_logits": catchup[-LAST_ROWS:].float().contiguous(),
               "chain_logits": chain.float().contiguous()},
              os.path.join(out, "mtp.safetensors"))


def make_tiny(out, model_dir):
    target, up, cfg = tt.load_target(model_dir)
    tok = tt.load_tokenizer(model_dir)
    ids = tok.encode(PROMPT).ids
    mtp = load_mtp(model_dir, cfg, up)
    tap = TargetTap(target)
    _, bonus, logits, drafts, step_logits = run_mtp(target, mtp, ids, tap)
    write_reference(out, ids, {"prompt": PROMPT, "bonus": bonus, "drafts": drafts}, logits,
                    step_logits)
    print(f"prompt {len(ids)} ids, bonus {bonus}, drafts {drafts}, "
          f"max|catchup logit| {logits.abs().max():.3f}")


# ------------------------------------------------------------------------------- random targets

def load_random_target(fx, name, src):
    """The random target tests/fixtures/NAME as an HF model in fp32, its config dict (the spec's,
    scoring_func as stored) and its stored tensors (mtp.* dropped); it must reproduce the
    fixture's logits.npy."""
    from transformers import DeepseekV4ForCausalLM
    specs = {s["name"]: s for s in fx.fixture_specs()}
    if name not in specs:
        raise SystemExit(f"--random {name}: not a target of tools/make_fixtures.py "
                         f"({', '.join(specs)}, or all)")
    spec = specs[name]
    if not os.path.exists(os.path.join(src, "config.json")):
        raise SystemExit(f"{src}: no config.json (python3 tools/make_fixtures.py --out {FIXTURES})")
    stored_cfg = json.load(open(os.path.join(src, "config.json")))
    cfg = copy.deepcopy(spec["cfg"])
    cfg["scoring_func"] = stored_cfg["scoring_func"]  # make_fixtures picks it by what ACT2FN has
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "hc_mult", "sliding_window",
                "n_routed_experts", "num_experts_per_tok", "tie_word_embeddings"):
        if stored_cfg.get(key, cfg[key]) != cfg[key]:
            raise SystemExit(f"{src}/config.json: {key} {stored_cfg.get(key)}, make_fixtures' "
                             f"spec {cfg[key]}")
    stored = {n: t for n, t in tt.read_model_dir(src).items() if not n.startswith("mtp.")}
    model = DeepseekV4ForCausalLM(tt.hf_config(copy.deepcopy(cfg))).float()
    tied = cfg.get("tie_word_embeddings")
    if "model.embed_tokens.weight" in stored:  # HF layout: the model's own names
        own = {n: t for n, t in model.state_dict().items()
               if "inv_freq" not in n and not (tied and n == "lm_head.weight")}
        missing = sorted(set(own) - set(stored))
        extra = sorted(set(stored) - set(own))
        if missing or extra:
            raise SystemExit(f"{src}: missing {missing[:3]}, unexpected {extra[:3]}")
        model.load_state_dict({n: stored[n].to(t.dtype) for n, t in own.items()}, strict=False)
    else:  # upstream layout
        used = tt.hf_from_upstream(model, stored, cfg)
        rest = sorted(set(stored) - used)
        if rest:
            raise SystemExit(f"{src}: unused tensors {rest[:5]}")
    model.eval()
    if tied and not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight):
        raise SystemExit(f"{src}: lm_head is not tied to embed_tokens after loading")
    ids = [int(x) for x in open(os.path.join(src, "ids.txt")).read().split()]
    ref = torch.from_numpy(np.load(os.path.join(src, "logits.npy"))).float()
    with torch.no_grad():
        lg = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
    d = float((lg - ref).abs().max()) / max(1.0, float(ref.abs().max()))
    if not d <= 1e-4:
        raise SystemExit(f"{src}: the reloaded target is off its logits.npy by {d:.3g} relative")
    return spec, cfg, model, stored, d


def mtp_dtype(fx, name, spec):
    """The stored dtype of an MTP tensor (V4MTP names): the block as the target's layers (F16
    where the spec says), hc_head and norms F32, e_proj/h_proj BF16 (as mtp_ref.py)."""
    if name.startswith("block."):
        return fx.storage_dtype("model.layers.0." + name[len("block."):], spec)
    if name in ("e_proj.weight", "h_proj.weight"):
        return torch.bfloat16
    return torch.float32


def random_mtp(fx, cfg, spec, gen):
    mtp = V4MTP(copy.deepcopy(cfg)).float()
    fx.randomize(mtp, cfg, gen)
    with torch.no_grad():
        for name, p in list(mtp.named_parameters()) + list(mtp.named_buffers()):
            if "inv_freq" in name or not p.dtype.is_floating_point:
                continue
            p.copy_(p.to(mtp_dtype(fx, name, spec)).to(p.dtype))
    return mtp.eval()


def mtp_upstream(fx, mtp, spec):
    """{mtp.0.* upstream name: tensor in its stored dtype} (mtp_ref's upstream_state, with the
    spec's dtypes and the shared-expert biases)."""
    out = {}
    for name, t in mtp.state_dict().items():
        if "inv_freq" in name or name.startswith("rotary."):
            continue
        t = t.detach().cpu()
        if t.dtype.is_floating_point:
            t = t.to(mtp_dtype(fx, name, spec))
        if name.startswith("block."):
            rest = name[len("block."):]
            pairs = [("layers.0." + BIAS_NAMES[rest], t)] if rest in BIAS_NAMES else \
                fx.upstream_names("model.layers.0." + rest, t, mtp.bcfg)
            for n2, t2 in pairs:
                assert n2.startswith("layers.0."), n2
                out["mtp.0." + n2[len("layers.0."):]] = t2
        elif name.startswith("hc_head.hc_"):
            out["mtp.0.hc_head_" + name[len("hc_head.hc_"):]] = t
        elif name in ("enorm.weight", "hnorm.weight", "norm.weight", "e_proj.weight",
                      "h_proj.weight"):
            out["mtp.0." + name] = t
        else:
            raise KeyError(f"no upstream name for MTP tensor {name}")
    return out


class RouterGaps:
    """The smallest top-k cut gap of score routers (make_fixtures.router_cut_gap)."""

    def __init__(self, gates):
        self.min_gap = math.inf
        self.handles = [g.register_forward_hook(self._hook(g)) for g in gates]

    def _hook(self, gate):
        def hook(mod, inp, out):
            self.min_gap = min(self.min_gap, tt._fixtures().router_cut_gap(gate, out[0]))
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()


def top2_gap(row):
    v = torch.topk(row, 2).values
    return float(v[0] - v[1]) / max(1.0, float(row.abs().max()))


def make_random(name, fixtures):
    fx = tt._fixtures()
    src = os.path.join(fixtures, name)
    spec, cfg, target, stored, d_target = load_random_target(fx, name, src)
    V = cfg["vocab_size"]
    for seed in range(SEEDS):
        gen = torch.Generator().manual_seed(seed)
        ids = [int(i) for i in torch.randint(0, V, (N_IDS,), generator=gen)]
        mtp = random_mtp(fx, cfg, spec, gen)
        rec, tap = fx.Recorder(target, cfg), TargetTap(target)
        gates = RouterGaps([mtp.block.mlp.gate])
        try:
            last, bonus, logits, drafts, step_logits = run_mtp(target, mtp, ids, tap)
        finally:
            rec.remove()
            tap.remove()
            gates.remove()
        gap = min([top2_gap(last)] + [top2_gap(r) for r in step_logits])
        why = [w for w, bad in (
            (f"top-2 gap {gap:.3g}", gap <= MIN_TOP2),
            (f"target indexer gap {rec.min_gap_idx:.3g}", rec.min_gap_idx <= MIN_CUT),
            (f"target router gap {rec.min_gap_router:.3g}", rec.min_gap_router <= MIN_CUT),
            (f"MTP router gap {gates.min_gap:.3g}", gates.min_gap <= MIN_CUT)) if bad]
        if not why:
            break
        print(f"mtp_{name} seed {seed}: {', '.join(why)} -> next seed")
    else:
        raise SystemExit(f"mtp_{name}: no seed in 0..{SEEDS - 1} without near ties")
    out = os.path.join(fixtures, "mtp_" + name)
    os.makedirs(out, exist_ok=True)
    for f in glob.glob(os.path.join(out, "model*.safetensors*")):
        os.remove(f)
    tensors = dict(stored)
    tensors.update(mtp_upstream(fx, mtp, spec))
    save_file({n: t.contiguous().clone() for n, t in tensors.items()},
              os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    shutil.copyfile(os.path.join(src, "config.json"), os.path.join(out, "config.json"))
    write_reference(out, ids, {"target": os.path.relpath(src, tt.REPO), "seed": seed,
                               "bonus": bonus, "drafts": drafts}, logits, step_logits)
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"mtp_{name}: seed {seed}, prompt {len(ids)} ids, bonus {bonus}, drafts {drafts}, "
          f"min top-2 gap {gap:.3g}, max|catchup logit| {logits.abs().max():.3f}, "
          f"target vs {name}/logits.npy {d_target:.2g}; {size} bytes in {out}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", help="tandem-tiny: the fixture directory (tests/fixtures/mtp_tiny)")
    ap.add_argument("--model", default=tt.MODEL_DIR)
    ap.add_argument("--random", metavar="NAME",
                    help="a random target of tools/make_fixtures.py, or all (" +
                    ", ".join(RANDOM_ALL) + ")")
    ap.add_argument("--fixtures", default=FIXTURES,
                    help="--random: where NAME is read and mtp_NAME written")
    a = ap.parse_args()
    if bool(a.random) == bool(a.out):
        ap.error("give either --out DIR (tandem-tiny) or --random NAME (writes "
                 "FIXTURES/mtp_NAME, FIXTURES = --fixtures)")
    torch.backends.cuda.matmul.allow_tf32 = False
    if not a.random:
        make_tiny(a.out, a.model)
        return
    for name in RANDOM_ALL if a.random == "all" else [a.random]:
        make_random(name, a.fixtures)


if __name__ == "__main__":
    main()
