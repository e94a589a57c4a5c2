#!/usr/bin/env python3
"""train_mtp.py: train tandem-tiny's V4 MTP drafter (mtp.0.*) by self-distillation.

    python3 tools/train_mtp.py --model models/tandem-tiny --data .corpus --work .train/work \
        [--steps N | --train-seconds S]

The target (read back from --model, upstream layout) is frozen. On random training windows
x_0..x_S, the target runs once (bf16 autocast) and gives, for every row i, its final HC
residual H_i (before hc_head) and its logits. The MTP module of tools/mtp_ref.py then runs:
  pass 1: rows (H_i, x_{i+1}) at positions i        -> q_i, matched to p_target(row i+1)
  pass 2: rows (H'_i from pass 1, x_{i+2}) at i+1   -> matched to p_target(row i+2)
so that the k > 1 chain, which recycles the MTP's own output stream, is trained too
(--unroll 1 turns pass 2 off). Loss: soft cross-entropy against the target's distribution
(= KL up to a constant), pass 2 weighted by --w2. Init: the block is a copy of the target's
last layer (without its compressor), hc_head and norm copies of the target's.
The result is rounded to its stored dtypes and written as mtp.0.* into --model's shards
(rewritten; the target tensors are unchanged). Teacher-forced top-1 agreement with the
target on held-out windows is reported (pass 1 = MTP k=1 greedy acceptance on that text).
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tandem_tiny as tt  # noqa: E402
from mtp_ref import TargetTap, V4MTP  # noqa: E402
from train_target import Balancer, batches, lr_at, token_streams  # noqa: E402


def soft_ce(logits, teacher_logits):
    lq = torch.log_softmax(logits.float(), -1)
    p = torch.softmax(teacher_logits.float(), -1)
    return -(p * lq).sum(-1).mean()


def run_passes(mtp, target, tap, x, unroll):
    """Returns [(mtp logits, teacher logits)] for each pass over a batch x [B, S+1]."""
    S = x.shape[1] - 1
    with torch.no_grad():
        tl = target(input_ids=x[:, :S], use_cache=False).logits
        H = tap.h_final
    embed, head = target.model.embed_tokens, target.lm_head
    pos = torch.arange(S, device=x.device).unsqueeze(0).expand(x.shape[0], -1)
    out = []
    l1, h1 = mtp(H[:, :S - 1], x[:, 1:S], pos[:, :S - 1], embed, head)
    out.append((l1, tl[:, 1:S]))
    if unroll >= 2:
        l2, _ = mtp(h1[:, :S - 2], x[:, 2:S], pos[:, 1:S - 1], embed, head)
        out.append((l2, tl[:, 2:S]))
    return out


@torch.no_grad()
def agreement(mtp, target, tap, stream, seq, n_windows, dev):
    n = min(n_windows, (stream.shape[0] - 1) // seq)
    hits = [0, 0]
    cnt = [0, 0]
    loss = [0.0, 0.0]
    for i in range(0, n, 8):
        idx = torch.arange(i, min(n, i + 8), device=dev)
        x = stream[idx[:, None] * seq + torch.arange(seq + 1, device=dev)]
        for j, (lg, tlg) in enumerate(run_passes(mtp, target, tap, x, 2)):
            hits[j] += int((lg.argmax(-1) == tlg.argmax(-1)).sum())
            cnt[j] += lg.shape[0] * lg.shape[1]
            loss[j] += float(soft_ce(lg, tlg)) * lg.shape[0] * lg.shape[1]
    return [h / max(1, c) for h, c in zip(hits, cnt)], [l / max(1, c) for l, c in zip(loss, cnt)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=tt.MODEL_DIR)
    ap.add_argument("--work", default=os.path.join(tt.REPO, ".train", "work"))
    ap.add_argument("--data", default=os.path.join(tt.REPO, ".corpus"),
                    help="corpus, tokenised into --work when its .npy streams are missing")
    ap.add_argument("--resume", action="store_true",
                    help="start from the mtp.0.* already in --model (fresh optimizer)")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--train-seconds", type=float, default=None)
    ap.add_argument("--train-until", type=float, default=None)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=tt.CONTEXT)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--unroll", type=int, default=2)
    ap.add_argument("--w2", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=2)
    a = ap.parse_args()

    t_start = time.time()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = tt.SMOKE if a.smoke else tt.TARGET
    target, up, cfg = tt.load_target(a.model, cfg, dev)
    for p in target.parameters():
        p.requires_grad_(False)
    tap = TargetTap(target)
    token_streams(a.data, a.model, a.work, 3_000_000 if a.smoke else None)
    train_s = torch.from_numpy(np.load(os.path.join(a.work, "train.npy")).astype(np.int64)).to(dev)
    val_s = torch.from_numpy(np.load(os.path.join(a.work, "val.npy")).astype(np.int64)).to(dev)

    torch.manual_seed(a.seed)
    mtp = V4MTP(cfg).float()
    if a.resume and "mtp.0.e_proj.weight" in up:
        mtp.load_upstream(up)
        tt.log("resumed from the mtp.0.* tensors in " + a.model)
    else:
        mtp.init_from_target(target, seed=a.seed)
    mtp.to(dev).train()
    tt.log(f"MTP: {tt.count_params(mtp):,} parameters (embed/head shared with the target)")
    params = [p for p in mtp.parameters() if p.requires_grad]
    opt = torch.optim.AdamW([{"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.1},
                             {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), fused=(dev == "cuda"))
    bal = Balancer(mtp)
    torch.backends.cuda.matmul.allow_tf32 = True

    until = a.train_until or (time.time() + a.train_seconds if a.train_seconds else None)
    budget = tt.StepBudget(a.steps, until, 5, 20, torch.cuda.synchronize,
                           "--steps, --train-seconds or --train-until")
    total = budget.total
    data = batches(train_s, a.batch, a.seq, a.seed, dev)
    step, t0 = 0, time.time()
    while step < total:
        lr = lr_at(step, total, a.lr, a.warmup)
        for gr in opt.param_groups:
            gr["lr"] = lr
        x = next(data)
        with torch.autocast(dev, dtype=torch.bfloat16):
            outs = run_passes(mtp, target, tap, x, a.unroll)
        losses = [soft_ce(lg, tlg) for lg, tlg in outs]
        loss = losses[0] + (a.w2 * losses[1] if len(losses) > 1 else 0.0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        bal.update()
        step += 1
        dt = budget.after(step)
        if dt:
            total = budget.total
            tt.log(f"calibrated: {dt * 1000:.1f} ms/step -> {total} steps")
        if step % 25 == 0 or step == total or step <= 2:
            tt.log(f"step {step} loss " + " ".join(f"{float(l.detach()):.4f}" for l in losses)
                   + f" lr {lr:.2e} {time.time() - t0:.0f}s")
        if budget.over(10):
            break
    train_time = time.time() - t0

    mtp.eval()
    mtp.round_to_storage()
    torch.backends.cuda.matmul.allow_tf32 = False
    acc, vl = agreement(mtp, target, tap, val_s, a.seq, 4 if a.smoke else 64, dev)
    tt.log(f"held-out teacher-forced top-1 agreement with the target: pass 1 (k=1) {acc[0]:.4f}, "
           f"pass 2 (recycled) {acc[1]:.4f}; soft CE {vl[0]:.4f} / {vl[1]:.4f}")

    tensors = {n: t for n, t in up.items() if not n.startswith("mtp.")}
    tensors.update(mtp.upstream_state())
    n_shards, total_bytes = tt.write_model_dir(a.model, cfg, tensors, shard_bytes=14_000_000)
    tt.log(f"wrote {a.model}: {len(tensors)} tensors, {total_bytes / 1e6:.1f} MB in {n_shards} shards")
    prev = {}
    mp = os.path.join(a.work, "mtp_metrics.json")
    if a.resume and os.path.exists(mp):
        prev = json.load(open(mp))
    metrics = {"resumed_after_steps": prev.get("steps", 0) + prev.get("resumed_after_steps", 0) if a.resume else 0,
               "mtp_params": tt.count_params(mtp), "steps": step, "batch": a.batch, "seq": a.seq,
               "unroll": a.unroll, "w2": a.w2, "lr": a.lr, "train_seconds": round(train_time, 1),
               "val_top1_agreement": [round(v, 4) for v in acc],
               "val_soft_ce": [round(v, 4) for v in vl], "wall_seconds": round(time.time() - t_start, 1)}
    with open(os.path.join(a.work, "mtp_metrics.json"), "w") as fh:
        json.dump(metrics, fh, indent=1)


if __name__ == "__main__":
    main()
