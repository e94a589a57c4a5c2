#!/usr/bin/env python3
"""train_dspark.py: train tandem-tiny's V4 DSpark drafter (dspark/, mtp.{0,1,2}.*) by
self-distillation on the frozen target.

    python3 tools/dspark_data.py --out .train/dspark_data                 # train windows
    python3 tools/dspark_data.py --split val --windows 16 --out .train/dspark_val
    python3 tools/train_dspark.py --model models/tandem-tiny --data .train/dspark_data \
        --val .train/dspark_val [--steps N | --train-seconds S] [--threads 2]

The target's side of every window (logits and captured context of every position) was made
by tools/dspark_data.py with Tandem's reference forward, so training needs torch alone (it
runs on the CPU as well as on a GPU). With --live (the GPU box: HF transformers) the target
runs beside the drafter instead, on windows cut from the tokenised corpus:

    python3 tools/train_dspark.py --live --corpus .train/data --work .train/gpuwork \
        --train-seconds 300 --gen-seconds 90 [--init models/tandem-tiny/dspark] --out DIR

  --cont-frac of each batch comes from a pool of windows whose last --cont-tokens tokens
  are the target's own greedy continuation (made first, for up to --gen-seconds): the text
  the drafter meets at T = 0; the rest are fresh corpus windows. Held out: validation windows,
  raw and continued alike. Before training, the live target's logits and capture are checked
  against `tandem logits --capture` (Tandem's fp32 reference forward) on one window.

In each window, --anchors random anchor positions a get
a block [x_a, noise x (g-1)] at positions a .. a+g-1, all blocks of a window in one forward
(dspark_ref.window_index: a block sees the context rows a-W .. a-1 and its own rows). Slot k is
compared with the target's distribution at row a+k (the token at a+k+1), teacher-forced: its
Markov predecessor is x_{a+k} (slot 0: the anchor itself). Loss per slot, weighted exp(-k/4)
(drafters.md 1.9):
    soft cross-entropy against the target distribution (KL up to a constant)
  + --hard * cross-entropy against the target's argmax (T = 0 acceptance; default 0)
  + --l1 * ||softmax(Z) - p_target||_1  (1 - half of it is the T = 1 acceptance; default 0:
                                          the KL term alone, as it costs less on a CPU)
  + --bce * BCE(confidence, 1 - 0.5 ||softmax(Z) - p_target||_1, detached)
Init: stage s = the target's layer N-3+s (its compressor and indexer unused), hc_head/norm the
target's, main_proj the average of the captured layers, Markov W2 = 0, confidence 0.
The result is rounded to its stored dtypes and written to --out (default --model/dspark).
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tandem_tiny as tt  # noqa: E402
from dspark_ref import (DSPARK, V4DSpark, dspark_dir, load_dspark, read_model_dir,  # noqa: E402
                        target_config, window_index, write_dspark)
from train_target import lr_at  # noqa: E402


class Windows:
    """The windows of one or more tools/dspark_data.py outputs (comma-separated dirs)."""

    def __init__(self, dirs):
        parts = [d for d in dirs.split(",") if d]
        metas = [json.load(open(os.path.join(d, "meta.json"))) for d in parts]
        if len({tuple(m["layers"]) for m in metas}) != 1 or len({m["seq"] for m in metas}) != 1:
            raise SystemExit(f"{dirs}: the data sets differ in capture layers or window length")
        self.meta = metas[0] | {"sets": metas}
        self.ids = torch.from_numpy(np.concatenate(
            [np.load(os.path.join(d, "ids.npy")) for d in parts]).astype(np.int64))
        if len(parts) == 1:
            self.cap = np.load(os.path.join(parts[0], "cap.npy"), mmap_mode="r")
            self.logits = np.load(os.path.join(parts[0], "logits.npy"), mmap_mode="r")
        else:
            self.cap = np.concatenate([np.load(os.path.join(d, "cap.npy")) for d in parts])
            self.logits = np.concatenate([np.load(os.path.join(d, "logits.npy")) for d in parts])
        self.n, self.seq = self.ids.shape

    def get(self, idx):
        idx = sorted(idx)
        return (self.ids[idx], torch.from_numpy(np.ascontiguousarray(self.cap[idx])),
                torch.from_numpy(np.ascontiguousarray(self.logits[idx])))


class LiveTarget:
    """The frozen target (HF DeepseekV4ForCausalLM, fp32) on the device, giving each window's
    logits and captured rows (concat over the capture layers of the mean HC stream)."""

    def __init__(self, model_dir, layers, dev):
        from mtp_ref import TargetTap
        self.model, _, self.cfg = tt.load_target(model_dir, None, dev)
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.tap = TargetTap(self.model, layers)
        self.layers, self.dev = layers, dev

    @torch.no_grad()
    def run(self, x):
        """x [B, S] -> (x, cap [B, S, m*D], logits [B, S, V]), fp32"""
        tl = self.model(input_ids=x, use_cache=False).logits.float()
        cap = []
        for i in self.layers:
            o = self.tap.layer_out[i]
            o = o[0] if isinstance(o, (tuple, list)) else o
            if o.dim() != 4 or o.shape[-2] != self.cfg["hc_mult"]:
                raise SystemExit(f"layer {i} output {tuple(o.shape)}: expected [B, S, hc, D]")
            cap.append(o.float().mean(-2))
        return x, torch.cat(cap, -1), tl

    @torch.no_grad()
    def continue_greedy(self, x, n_new):
        """x [B, S]: its last n_new tokens replaced by the target's greedy continuation of the
        rest (no cache: every step recomputes the prefix, as exact as one-shot logits)."""
        x = x.clone()
        S = x.shape[1]
        for t in range(S - n_new, S):
            try:
                lg = self.model(input_ids=x[:, :t], use_cache=False, logits_to_keep=1).logits
            except TypeError:
                lg = self.model(input_ids=x[:, :t], use_cache=False).logits
            x[:, t] = lg[:, -1].float().argmax(-1)
        return x


class LiveWindows:
    """Training batches for --live: fresh windows of the token stream and windows of the
    continued pool; held-out batches from the validation stream (raw and continued)."""

    def __init__(self, target, train_s, val_s, seq, seed):
        self.t, self.seq, self.dev = target, seq, target.dev
        self.train_s, self.val_s = train_s, val_s
        self.gen = torch.Generator(device=self.dev).manual_seed(seed)
        self.pool = torch.empty(0, seq, dtype=torch.long, device=self.dev)
        self.n = 0

    def cut(self, stream, n):
        offs = torch.randint(0, stream.shape[0] - self.seq, (n,), device=self.dev,
                             generator=self.gen)
        return stream[offs[:, None] + torch.arange(self.seq, device=self.dev)]

    def grow_pool(self, seconds, batch, n_new):
        until = time.time() + seconds
        t0 = time.time()
        while time.time() < until:
            self.pool = torch.cat([self.pool, self.t.continue_greedy(self.cut(self.train_s, batch),
                                                                     n_new)])
            tt.log(f"continued pool: {self.pool.shape[0]} windows ({time.time() - t0:.0f} s)")

    def batch(self, B, frac):
        k = int(B * frac) if self.pool.shape[0] else 0
        pick = torch.randint(0, max(1, self.pool.shape[0]), (k,), device=self.dev, generator=self.gen)
        return self.t.run(torch.cat([self.cut(self.train_s, B - k), self.pool[pick]]))

    def held_out(self, n, n_new):
        """n raw + n continued validation windows, as (x, cap, logits) batches of 8"""
        g = torch.Generator(device=self.dev).manual_seed(4321)
        offs = torch.randint(0, self.val_s.shape[0] - self.seq, (n,), device=self.dev, generator=g)
        raw = self.val_s[offs[:, None] + torch.arange(self.seq, device=self.dev)]
        cont = self.t.continue_greedy(raw, n_new)
        return {"raw": [self.t.run(raw[i:i + 8]) for i in range(0, n, 8)],
                "continued": [self.t.run(cont[i:i + 8]) for i in range(0, n, 8)]}


def check_against_tandem(target, x, model_dir):
    """The live target against `tandem logits --capture` (fp32 reference forward) on x [S]."""
    import subprocess
    import tempfile
    exe = os.path.join(tt.REPO, "bin", "tandem")
    _, cap, tl = target.run(x[None])
    with tempfile.TemporaryDirectory() as d:
        ip, lp, cp = (os.path.join(d, f) for f in ("ids.txt", "l.npy", "c.npy"))
        with open(ip, "w") as fh:
            fh.write(" ".join(map(str, x.tolist())) + "\n")
        subprocess.run([exe, "logits", "--model", model_dir, "--ids", ip, "--out", lp, "--capture",
                        ",".join(map(str, target.layers)), "--capture-out", cp], check=True,
                       capture_output=True)
        want_l, want_c = torch.from_numpy(np.load(lp)), torch.from_numpy(np.load(cp))
    dl = float((tl[0].cpu() - want_l).abs().max())
    dc = float((cap[0].cpu() - want_c).abs().max())
    tt.log(f"live target vs tandem logits: max|dlogits| {dl:.2e}, max|dcapture| {dc:.2e}")
    if dl > 2e-2 or dc > 2e-2:
        raise SystemExit("the live target disagrees with Tandem's reference forward")


def draw_anchors(B, S, g, A, gen, dev="cpu"):
    """[B, A] distinct anchors per window in [1, S - g], ascending."""
    r = torch.rand(B, S - g, generator=gen).argsort(-1)[:, :A] + 1
    return r.sort(-1).values.to(dev)


def run_blocks(ds, x, cap, tl, anchors, embed, head):
    """x [B, S] ids, cap [B, S, m*D], tl [B, S, V] teacher logits, anchors [B, A].
    Returns (Z, conf logits, teacher logits), each [B, A, g, ..]: the block of anchor a sees
    the context rows a-W .. a-1 (dspark_ref.window_index) and its own rows."""
    g = ds.gamma
    B, S = x.shape
    rows = anchors[:, :, None] + torch.arange(g, device=x.device)         # [B, A, g] positions
    ids = torch.full_like(rows, ds.noise)
    ids[:, :, 0] = torch.gather(x, 1, anchors)
    flat = rows.reshape(B, -1)
    prev = torch.gather(x, 1, flat).view(rows.shape)                      # x_{a+k}
    teacher = torch.gather(tl, 1, flat[:, :, None].expand(-1, -1, tl.shape[-1])).float()
    main_x = ds.context(cap)
    y = ds.block(main_x, torch.arange(S, device=x.device)[None].expand(B, -1), ids, rows, embed,
                 window_index(anchors, ds.window))
    Z, c = ds.markov(ds.base_logits(y, head), y, prev)
    return Z, c, teacher.view(*rows.shape, -1)


def losses(g, Z, c, teacher, l1w, bcew, hardw=0.0):
    lq = torch.log_softmax(Z, -1)
    p = torch.softmax(teacher, -1)
    ce = -(p * lq).sum(-1)
    if hardw:  # T = 0 acceptance is argmax agreement: cross-entropy on the target's argmax too
        ce = ce - hardw * lq.gather(-1, teacher.argmax(-1, keepdim=True)).squeeze(-1)
    if l1w:
        tv = (lq.exp() - p).abs().sum(-1)
    else:  # the acceptance target only (no gradient through it): cheaper
        with torch.no_grad():
            tv = (lq.exp() - p).abs().sum(-1)
    acc = (1 - 0.5 * tv).detach().clamp(0, 1)
    bce = F.binary_cross_entropy_with_logits(c, acc, reduction="none")
    w = torch.exp(-torch.arange(g, dtype=torch.float32, device=Z.device) / 4.0)  # last axis
    mean = lambda t: (t * w).sum() / (w.sum() * t[..., 0].numel())  # noqa: E731
    return mean(ce) + l1w * mean(tv) + bcew * mean(bce), (mean(ce), mean(tv), mean(bce))


@torch.no_grad()
def evaluate(ds, batches, A, embed, head):
    """Per slot: teacher-forced top-1 agreement (argmax Z == argmax target), mean 1 - TV (the
    T = 1 acceptance given a correct predecessor), mean confidence; over batches of
    (x, cap, teacher logits)."""
    g = ds.gamma
    gen = torch.Generator().manual_seed(123)
    hits, acc1, conf = (torch.zeros(g, device=embed.device) for _ in range(3))
    cnt = 0
    for x, cap, tl in batches:
        an = draw_anchors(x.shape[0], x.shape[1], g, A, gen, x.device)
        Z, c, t = run_blocks(ds, x, cap, tl, an, embed, head)
        B = x.shape[0]
        hits += (Z.argmax(-1) == t.argmax(-1)).float().sum((0, 1))
        tv = (torch.softmax(Z, -1) - torch.softmax(t, -1)).abs().sum(-1)
        acc1 += (1 - 0.5 * tv).sum((0, 1))
        conf += torch.sigmoid(c).sum((0, 1))
        cnt += B * Z.shape[1]
    r = lambda v: [round(float(x) / cnt, 4) for x in v]  # noqa: E731
    return {"top1": r(hits), "accept_T1": r(acc1), "confidence": r(conf)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=tt.MODEL_DIR)
    ap.add_argument("--data", default=os.path.join(tt.REPO, ".train", "dspark_data"),
                    help="tools/dspark_data.py outputs, comma-separated (not with --live)")
    ap.add_argument("--val", default=os.path.join(tt.REPO, ".train", "dspark_val"))
    ap.add_argument("--live", action="store_true",
                    help="run the target (HF transformers) beside the drafter on corpus windows")
    ap.add_argument("--corpus", default=os.path.join(tt.REPO, ".train", "data"),
                    help="--live: the corpus (train/val.jsonl[.xz]), tokenised into --work")
    ap.add_argument("--work", default=os.path.join(tt.REPO, ".train", "gpuwork"))
    ap.add_argument("--seq", type=int, default=512, help="--live: window length")
    ap.add_argument("--cont-tokens", type=int, default=384,
                    help="--live: continued windows keep seq - N corpus tokens")
    ap.add_argument("--gen-seconds", type=float, default=60, help="--live: time for the pool")
    ap.add_argument("--gen-batch", type=int, default=128)
    ap.add_argument("--cont-frac", type=float, default=0.5,
                    help="--live: the share of each batch taken from the continued pool")
    ap.add_argument("--val-windows", type=int, default=32)
    ap.add_argument("--out", default=None, help="default: --model/dspark")
    ap.add_argument("--init", default=None, help="start from this DSpark directory's weights")
    ap.add_argument("--resume", action="store_true", help="--init --out")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--train-seconds", type=float, default=None)
    ap.add_argument("--batch", type=int, default=4, help="windows per step")
    ap.add_argument("--anchors", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--l1", type=float, default=0.0)
    ap.add_argument("--bce", type=float, default=1.0)
    ap.add_argument("--hard", type=float, default=0.0)
    ap.add_argument("--amp", action="store_true", help="bf16 autocast for the drafter")
    ap.add_argument("--save-every", type=float, default=0,
                    help="seconds between interim saves to --out (a run cut short keeps them)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--seed", type=int, default=3)
    a = ap.parse_args()
    out = a.out or dspark_dir(a.model)
    init = out if a.resume else a.init
    if a.threads:
        torch.set_num_threads(a.threads)
    dev = "cuda" if a.live else "cpu"
    t_start = time.time()
    cfg = target_config(a.model)
    up = read_model_dir(a.model)
    embed, head = up["embed.weight"].float().to(dev), up["head.weight"].float().to(dev)
    layers = DSPARK["dspark_target_layer_ids"]
    if a.live:
        from train_target import token_streams
        torch.backends.cuda.matmul.allow_tf32 = False  # the target's logits: fp32, as the engine
        target = LiveTarget(a.model, layers, dev)
        train_np, val_np, _ = token_streams(a.corpus, a.model, a.work)
        train_s = torch.from_numpy(train_np.astype(np.int64)).to(dev)
        val_s = torch.from_numpy(val_np.astype(np.int64)).to(dev)
        check_against_tandem(target, val_s[:a.seq], a.model)
        live = LiveWindows(target, train_s, val_s, a.seq, a.seed)
        held = live.held_out(a.val_windows, a.cont_tokens)
        live.grow_pool(a.gen_seconds, a.gen_batch, a.cont_tokens)
        next_batch = lambda gen: live.batch(a.batch, a.cont_frac)  # noqa: E731
        data_meta = {"live": True, "seq": a.seq, "cont_tokens": a.cont_tokens,
                     "pool_windows": int(live.pool.shape[0]), "train_tokens": int(len(train_np))}
    else:
        train, val = Windows(a.data), Windows(a.val)
        if train.meta["layers"] != layers:
            raise SystemExit(f"{a.data} captured layers {train.meta['layers']}")
        held = {"val": [val.get(list(range(i, min(val.n, i + 4)))) for i in range(0, val.n, 4)]}

        def next_batch(gen):
            return train.get(torch.randperm(train.n, generator=gen)[:a.batch].tolist())
        data_meta = {k: v for k, v in train.meta.items() if k not in ("offsets", "sets")} | {
            "sets": [{k: v for k, v in m.items() if k != "offsets"} for m in train.meta["sets"]]}

    torch.manual_seed(a.seed)
    if init:
        ds = load_dspark(init, cfg)
        tt.log("starting from " + init)
    else:
        ds = V4DSpark(cfg)
        ds.init_from_target(up, seed=a.seed)
    ds.to(dev).train()
    params = [p for p in ds.parameters() if p.requires_grad]
    tt.log(f"DSpark: {sum(p.numel() for p in params):,} parameters (embed/head shared with the target)")
    opt = torch.optim.AdamW([{"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.1},
                             {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95))
    until = time.time() + a.train_seconds if a.train_seconds else None
    # timed from step 5 to 25 after a device sync: the first steps (allocator, kernel choice)
    # ran at twice the later rate, and a run of --train-seconds 270 timed from step 0 fixed
    # 581 steps that took 146 s
    budget = tt.StepBudget(a.steps, until, 5, 25,
                           torch.cuda.synchronize if dev == "cuda" else None)
    total = budget.total
    gen = torch.Generator().manual_seed(a.seed)
    load = torch.zeros(len(ds.stages), ds.stages[0].ffn.E, device=dev)
    step, t0 = 0, time.time()
    saved = t0
    while step < total:
        lr = lr_at(step, total, a.lr, a.warmup)
        for gr in opt.param_groups:
            gr["lr"] = lr
        x, cap, tl = next_batch(gen)
        an = draw_anchors(x.shape[0], x.shape[1], ds.gamma, a.anchors, gen, dev)
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=a.amp):
            Z, c, t = run_blocks(ds, x, cap, tl, an, embed, head)
        loss, parts = losses(ds.gamma, Z.float(), c.float(), t, a.l1, a.bce, a.hard)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        with torch.no_grad():  # auxiliary-loss-free balancing of each stage's router
            for s, st in enumerate(ds.stages):
                cnt = torch.bincount(st.ffn.last_picks.reshape(-1), minlength=st.ffn.E).float()
                st.ffn.bias.add_(1e-3 * torch.sign(cnt.mean() - cnt))
                load[s] = cnt / cnt.mean()
        step += 1
        dt = budget.after(step)
        if dt:
            total = budget.total
            tt.log(f"calibrated: {dt:.3f} s/step -> {total} steps")
        if step % 50 == 0 or step == total or step <= 2:
            tt.log(f"step {step} loss {float(loss):.4f} (ce {float(parts[0]):.4f} tv "
                   f"{float(parts[1]):.4f} bce {float(parts[2]):.4f}) lr {lr:.2e} "
                   f"max load {float(load.max()):.2f} {time.time() - t0:.0f}s")
        if a.save_every and time.time() - saved > a.save_every:
            write_dspark(out, ds)
            saved = time.time()
            tt.log(f"step {step}: interim save to {out}")
        if budget.over(30):
            break
    train_time = time.time() - t0
    ds.eval()
    ds.round_to_storage()
    ev = {}
    for name, batches in held.items():
        ev[name] = evaluate(ds, batches, a.anchors, embed, head)
        tt.log(f"held-out {name} ({sum(b[0].shape[0] for b in batches)} windows), teacher-forced, "
               f"per slot: top-1 agreement {ev[name]['top1']}, T=1 acceptance "
               f"{ev[name]['accept_T1']}, mean confidence {ev[name]['confidence']}")
    n, nbytes = write_dspark(out, ds.cpu())
    tt.log(f"wrote {out}: {n} tensors, {nbytes / 1e6:.1f} MB")
    prev = {}
    mp = os.path.join(init or out, "training.json")
    if init and os.path.exists(mp):
        prev = json.load(open(mp))
    runs = prev.get("runs", []) + [{
        "steps": step, "batch_windows": a.batch, "anchors": a.anchors, "lr": a.lr, "l1": a.l1,
        "bce": a.bce, "hard": a.hard, "amp": a.amp, "train_seconds": round(train_time, 1),
        "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
        "threads": torch.get_num_threads(), "data": data_meta, "val": ev,
        "wall_seconds": round(time.time() - t_start, 1)}]
    with open(os.path.join(out, "training.json"), "w") as fh:
        json.dump({"runs": runs}, fh, indent=1)


if __name__ == "__main__":
    main()
