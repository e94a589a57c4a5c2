#!/usr/bin/env python3
"""train_dspark.py: train tandem-tiny's V4 DSpark drafter (dspark/, mtp.{0,1,2}.*) by
self-distillation on the frozen target.

    python3 tools/dspark_data.py --out .train/dspark_data                 # train windows
    python3 tools/dspark_data.py --split val --windows 16 --out .train/dspark_val
    python3 tools/train_dspark.py --model models/tandem-tiny --data .train/dspark_data \
        --val .train/dspark_val [--steps N | --train-seconds S] [--threads 2]

The target's side of every window (logits and captured context of every position) was made
by tools/dspark_data.py with Tandem's reference forward, so training needs torch alone (it
runs on the CPU as well as on a GPU). In each window, --anchors random anchor positions a get
a block [x_a, noise x (g-1)] at positions a .. a+g-1, all blocks of a window in one forward
(dspark_ref.window_index: a block sees the context rows a-W .. a-1 and its own rows). Slot k is
compared with the target's distribution at row a+k (the token at a+k+1), teacher-forced: its
Markov predecessor is x_{a+k} (slot 0: the anchor itself). Loss per slot, weighted exp(-k/4)
(drafters.md 1.9):
    soft cross-entropy against the target distribution (KL up to a constant)
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


def draw_anchors(B, S, g, A, gen):
    """[B, A] distinct anchors per window in [1, S - g], ascending."""
    r = torch.rand(B, S - g, generator=gen).argsort(-1)[:, :A] + 1
    return r.sort(-1).values


def run_blocks(ds, x, cap, tl, anchors, embed, head):
    """x [B, S] ids, cap [B, S, m*D], tl [B, S, V] teacher logits, anchors [B, A].
    Returns (Z, conf logits, teacher logits), each [B, A, g, ..]: the block of anchor a sees
    the context rows a-W .. a-1 (dspark_ref.window_index) and its own rows."""
    g = ds.gamma
    B, S = x.shape
    rows = anchors[:, :, None] + torch.arange(g)                          # [B, A, g] positions
    ids = torch.full_like(rows, ds.noise)
    ids[:, :, 0] = torch.gather(x, 1, anchors)
    flat = rows.reshape(B, -1)
    prev = torch.gather(x, 1, flat).view(rows.shape)                      # x_{a+k}
    teacher = torch.gather(tl, 1, flat[:, :, None].expand(-1, -1, tl.shape[-1])).float()
    main_x = ds.context(cap)
    y = ds.block(main_x, torch.arange(S)[None].expand(B, -1), ids, rows, embed,
                 window_index(anchors, ds.window))
    Z, c = ds.markov(ds.base_logits(y, head), y, prev)
    return Z, c, teacher.view(*rows.shape, -1)


def losses(g, Z, c, teacher, l1w, bcew):
    lq = torch.log_softmax(Z, -1)
    p = torch.softmax(teacher, -1)
    ce = -(p * lq).sum(-1)
    if l1w:
        tv = (lq.exp() - p).abs().sum(-1)
    else:  # the acceptance target only (no gradient through it): cheaper
        with torch.no_grad():
            tv = (lq.exp() - p).abs().sum(-1)
    acc = (1 - 0.5 * tv).detach().clamp(0, 1)
    bce = F.binary_cross_entropy_with_logits(c, acc, reduction="none")
    w = torch.exp(-torch.arange(g, dtype=torch.float32) / 4.0)           # over the last axis
    mean = lambda t: (t * w).sum() / (w.sum() * t[..., 0].numel())  # noqa: E731
    return mean(ce) + l1w * mean(tv) + bcew * mean(bce), (mean(ce), mean(tv), mean(bce))


@torch.no_grad()
def evaluate(ds, win, A, embed, head):
    """Per slot: teacher-forced top-1 agreement (argmax Z == argmax target), mean 1 - TV (the
    T = 1 acceptance given a correct predecessor), mean confidence."""
    g = ds.gamma
    gen = torch.Generator().manual_seed(123)
    hits, acc1, conf, cnt = torch.zeros(g), torch.zeros(g), torch.zeros(g), 0
    for i in range(0, win.n, 4):
        x, cap, tl = win.get(list(range(i, min(win.n, i + 4))))
        an = draw_anchors(x.shape[0], x.shape[1], g, A, gen)
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
                    help="tools/dspark_data.py outputs, comma-separated")
    ap.add_argument("--val", default=os.path.join(tt.REPO, ".train", "dspark_val"))
    ap.add_argument("--out", default=None, help="default: --model/dspark")
    ap.add_argument("--resume", action="store_true", help="start from --out's weights")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--train-seconds", type=float, default=None)
    ap.add_argument("--batch", type=int, default=4, help="windows per step")
    ap.add_argument("--anchors", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--l1", type=float, default=0.0)
    ap.add_argument("--bce", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--seed", type=int, default=3)
    a = ap.parse_args()
    out = a.out or dspark_dir(a.model)
    if a.threads:
        torch.set_num_threads(a.threads)
    t_start = time.time()
    cfg = target_config(a.model)
    up = read_model_dir(a.model)
    embed, head = up["embed.weight"].float(), up["head.weight"].float()
    train, val = Windows(a.data), Windows(a.val)
    if train.meta["layers"] != DSPARK["dspark_target_layer_ids"]:
        raise SystemExit(f"{a.data} captured layers {train.meta['layers']}")

    torch.manual_seed(a.seed)
    if a.resume:
        ds = load_dspark(out, cfg)
        tt.log("resumed from " + out)
    else:
        ds = V4DSpark(cfg)
        ds.init_from_target(up, seed=a.seed)
    ds.train()
    params = [p for p in ds.parameters() if p.requires_grad]
    tt.log(f"DSpark: {sum(p.numel() for p in params):,} parameters (embed/head shared with the target)")
    opt = torch.optim.AdamW([{"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.1},
                             {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95))
    until = time.time() + a.train_seconds if a.train_seconds else None
    total = a.steps or 10 ** 9
    if a.steps is None and until is None:
        raise SystemExit("give --steps or --train-seconds")
    gen = torch.Generator().manual_seed(a.seed)
    load = torch.zeros(len(ds.stages), ds.stages[0].ffn.E)
    step, t0 = 0, time.time()
    while step < total:
        lr = lr_at(step, total, a.lr, a.warmup)
        for gr in opt.param_groups:
            gr["lr"] = lr
        idx = torch.randperm(train.n, generator=gen)[:a.batch].tolist()
        x, cap, tl = train.get(idx)
        an = draw_anchors(x.shape[0], x.shape[1], ds.gamma, a.anchors, gen)
        Z, c, t = run_blocks(ds, x, cap, tl, an, embed, head)
        loss, parts = losses(ds.gamma, Z, c, t, a.l1, a.bce)
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
        if step == 3 and a.steps is None:
            dt = (time.time() - t0) / 3
            total = max(step + 1, step + int((until - time.time()) / dt))
            tt.log(f"calibrated: {dt:.2f} s/step -> {total} steps")
        if step % 20 == 0 or step == total or step <= 2:
            tt.log(f"step {step} loss {float(loss):.4f} (ce {float(parts[0]):.4f} tv "
                   f"{float(parts[1]):.4f} bce {float(parts[2]):.4f}) lr {lr:.2e} "
                   f"max load {float(load.max()):.2f} {time.time() - t0:.0f}s")
        if until and time.time() > until + 30:
            break
    train_time = time.time() - t0
    ds.eval()
    ds.round_to_storage()
    ev = evaluate(ds, val, a.anchors, embed, head)
    tt.log(f"held-out ({val.n} windows), teacher-forced, per slot: top-1 agreement {ev['top1']}, "
           f"T=1 acceptance {ev['accept_T1']}, mean confidence {ev['confidence']}")
    n, nbytes = write_dspark(out, ds)
    tt.log(f"wrote {out}: {n} tensors, {nbytes / 1e6:.1f} MB")
    prev = {}
    mp = os.path.join(out, "training.json")
    if a.resume and os.path.exists(mp):
        prev = json.load(open(mp))
    runs = prev.get("runs", []) + [{
        "steps": step, "batch_windows": a.batch, "anchors": a.anchors, "lr": a.lr, "l1": a.l1,
        "bce": a.bce, "train_seconds": round(train_time, 1), "threads": torch.get_num_threads(),
        "device": "cpu",
        "data": {k: v for k, v in train.meta.items() if k != "offsets"} | {
            "sets": [{k: v for k, v in m.items() if k != "offsets"} for m in train.meta["sets"]]},
        "val": ev,
        "wall_seconds": round(time.time() - t_start, 1)}]
    with open(mp, "w") as fh:
        json.dump({"runs": runs}, fh, indent=1)


if __name__ == "__main__":
    main()
