#!/usr/bin/env python3
"""train_target.py: train the tandem-tiny target, HF DeepseekV4ForCausalLM, on the corpus.

    python3 tools/train_target.py --data .corpus --tok models/tandem-tiny \
        --out models/tandem-tiny --work .train/work [--steps N | --train-seconds S]

Runs on a CUDA machine (torch 2.11, transformers 5.17). Steps:
  1. tokenise train/val (tools/tandem_tiny.py encode_stream: BOS + text + EOS per document),
     cached as uint16 .npy under --work;
  2. build DeepseekV4ForCausalLM from tandem_tiny.TARGET (HF init, then a real tid2eid hash),
     train with AdamW on random 1024-token windows (fp32 master weights, bf16 autocast,
     warmup + cosine, clip 1.0), with DeepSeek's auxiliary-loss-free balancing of the
     score-routed MoE layers (e_score_correction_bias += rate * sign(mean load - load));
     with --train-seconds/--train-until the step count is fixed after 30 timed steps
     (printed; --steps N reproduces a run);
  3. round every tensor to its stored dtype (bf16 matrices, fp32 where HF keeps fp32) and
     evaluate there in fp32: validation loss over all non-overlapping windows of the
     held-out split, a few greedy samples;
  4. export models/tandem-tiny in the upstream DeepSeek layout (tandem_tiny.write_model_dir),
     and, under --work, ref_ids.txt + ref_logits.npy (HF fp32 logits of 160 held-out ids) to
     check the C engine against, metrics.json and samples.json.
Optimizer state is not saved: a run is meant to fit in one sitting (about 5 minutes on an H200).
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tandem_tiny as tt  # noqa: E402

PROMPTS = [
    "In the beginning God created",
    "It is a truth universally acknowledged, that",
    "The Fulton County Grand Jury said Friday",
    "dog, domestic dog, Canis familiaris:",
    "Elizabeth looked at Mr. Darcy and",
    "A hacker is",
]


def token_streams(data, tok_dir, work, limit=None):
    """(train uint16, val uint16, val bytes), cached under work."""
    os.makedirs(work, exist_ok=True)
    out = []
    for split in ("train", "val"):
        p = os.path.join(work, f"{split}.npy")
        if not os.path.exists(p):
            tok = tt.load_tokenizer(tok_dir)
            docs = tt.read_docs(data, split, limit if split == "train" else None)
            t0 = time.time()
            s = tt.encode_stream(tok, docs)
            np.save(p, s)
            nbytes = sum(len(t.encode("utf-8")) for _, t in docs)
            with open(os.path.join(work, f"{split}.bytes"), "w") as fh:
                fh.write(str(nbytes))
            tt.log(f"{split}: {len(docs)} docs, {nbytes:,} bytes -> {len(s):,} tokens "
                   f"({nbytes / len(s):.2f} bytes/token) in {time.time() - t0:.1f} s")
        out.append(np.load(p))
    vb = int(open(os.path.join(work, "val.bytes")).read())
    return out[0], out[1], vb


class Balancer:
    """Auxiliary-loss-free load balancing (DeepSeek-V3): after each optimizer step, move each
    score-routed layer's e_score_correction_bias by rate * sign(mean load - expert load)."""

    def __init__(self, module, rate=1e-3):
        self.rate = rate
        self.routers = [m for m in module.modules() if type(m).__name__ == "DeepseekV4TopKRouter"]
        self.counts = {}
        self.handles = [r.register_forward_hook(self._hook) for r in self.routers]

    def _hook(self, mod, inp, out):
        if not torch.is_grad_enabled():
            return
        c = torch.bincount(out[2].reshape(-1), minlength=mod.num_experts).float()
        k = id(mod)
        self.counts[k] = c if k not in self.counts else self.counts[k] + c

    @torch.no_grad()
    def update(self):
        for r in self.routers:
            c = self.counts.pop(id(r), None)
            if c is not None:
                r.e_score_correction_bias.add_(self.rate * torch.sign(c.mean() - c))

    def imbalance(self):
        """max/mean expert load of each router over the last step (before update)."""
        return [float(c.max() / c.mean()) for c in self.counts.values()]


def lr_at(step, total, peak, warmup, floor=0.1):
    if step < warmup:
        return peak * (step + 1) / warmup
    p = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p)))


def batches(stream, batch, seq, seed, device):
    g = torch.Generator(device=device).manual_seed(seed)
    n = stream.shape[0] - seq - 1
    ar = torch.arange(seq + 1, device=device)
    while True:
        offs = torch.randint(0, n, (batch,), device=device, generator=g)
        yield stream[offs[:, None] + ar]


@torch.no_grad()
def eval_loss(model, stream, seq, batch=16, max_windows=None):
    """Mean next-token CE (nats) over non-overlapping windows of stream, fp32."""
    n = (stream.shape[0] - 1) // seq
    if max_windows:
        n = min(n, max_windows)
    tot, cnt = 0.0, 0
    for i in range(0, n, batch):
        idx = torch.arange(i, min(n, i + batch), device=stream.device)
        x = stream[idx[:, None] * seq + torch.arange(seq + 1, device=stream.device)]
        lg = model(input_ids=x[:, :-1], use_cache=False).logits.float()
        tot += F.cross_entropy(lg.reshape(-1, lg.shape[-1]), x[:, 1:].reshape(-1), reduction="sum").item()
        cnt += x[:, 1:].numel()
    return tot / cnt, cnt


@torch.no_grad()
def greedy(model, ids, n, device):
    x = torch.tensor([ids], device=device)
    for _ in range(n):
        t = int(model(input_ids=x, use_cache=False).logits[0, -1].argmax())
        x = torch.cat([x, torch.tensor([[t]], device=device)], 1)
        if t == tt.EOS_ID or x.shape[1] >= tt.CONTEXT:
            break
    return x[0].tolist()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.path.join(tt.REPO, ".corpus"))
    ap.add_argument("--tok", default=tt.MODEL_DIR)
    ap.add_argument("--out", default=tt.MODEL_DIR)
    ap.add_argument("--work", default=os.path.join(tt.REPO, ".train", "work"))
    ap.add_argument("--smoke", action="store_true", help="tandem_tiny.SMOKE config, a few steps")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--train-seconds", type=float, default=None)
    ap.add_argument("--train-until", type=float, default=None, help="epoch seconds")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=tt.CONTEXT)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--balance-rate", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sample-tokens", type=int, default=48)
    a = ap.parse_args()

    t_start = time.time()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = tt.SMOKE if a.smoke else tt.TARGET
    train_np, val_np, val_bytes = token_streams(a.data, a.tok, a.work, 3_000_000 if a.smoke else None)
    train_s = torch.from_numpy(train_np.astype(np.int64)).to(dev)
    val_s = torch.from_numpy(val_np.astype(np.int64)).to(dev)

    torch.manual_seed(a.seed)
    from transformers import DeepseekV4ForCausalLM
    model = DeepseekV4ForCausalLM(tt.hf_config(cfg)).float()
    tt.set_hash_tables(model, cfg)
    model.to(dev).train()
    n_params = tt.count_params(model)
    tt.log(f"model: {n_params:,} parameters ({n_params - 2 * cfg['vocab_size'] * cfg['hidden_size']:,} "
           f"without embed/head); train {len(train_np):,} tokens, val {len(val_np):,}")

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=(dev == "cuda"))
    bal = Balancer(model, a.balance_rate)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    until = a.train_until or (time.time() + a.train_seconds if a.train_seconds else None)
    budget = tt.StepBudget(a.steps, until, 10, 30, torch.cuda.synchronize,
                           "--steps, --train-seconds or --train-until")
    total = budget.total
    data = batches(train_s, a.batch, a.seq, a.seed, dev)
    V = cfg["vocab_size"]
    step, t_train0 = 0, time.time()
    losses = []
    while step < total:
        lr = lr_at(step, total, a.lr, a.warmup)
        for gr in opt.param_groups:
            gr["lr"] = lr
        x = next(data)
        with torch.autocast(dev, dtype=torch.bfloat16):
            logits = model(input_ids=x[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, V), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        imb = bal.imbalance() if step % 50 == 0 else None
        bal.update()
        step += 1
        dt = budget.after(step)
        if dt:
            total = budget.total
            tt.log(f"calibrated: {dt * 1000:.1f} ms/step, {a.batch * a.seq / dt:,.0f} tokens/s -> "
                   f"{total} steps ({total * a.batch * a.seq / 1e6:.1f} M tokens)")
        if step % 50 == 0 or step == total or step <= 3:
            l = loss.item()
            losses.append((step, l))
            tt.log(f"step {step}/{total if total < 10 ** 9 else '?'} loss {l:.4f} lr {lr:.2e} "
                   f"gnorm {float(gn):.2f} {time.time() - t_train0:.0f}s"
                   + (f" imbalance {max(imb):.2f}" if imb else ""))
        if budget.over(15):
            tt.log("past the deadline; stopping early")
            break
    torch.cuda.synchronize()
    train_time = time.time() - t_train0
    tokens = step * a.batch * a.seq
    tt.log(f"trained {step} steps, {tokens:,} tokens in {train_time:.0f} s "
           f"({tokens / train_time:,.0f} tokens/s incl. warmup)")

    # ---- rounded to the stored dtypes, evaluated in fp32
    model.eval()
    tt.round_to_storage(model)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    vloss, vcnt = eval_loss(model, val_s, a.seq, max_windows=4 if a.smoke else None)
    tloss, _ = eval_loss(model, train_s[: len(val_np) + 1], a.seq, max_windows=4 if a.smoke else None)
    bpb = vloss * vcnt / math.log(2) / (val_bytes * vcnt / len(val_np))
    tt.log(f"val loss {vloss:.4f} nats/token (ppl {math.exp(vloss):.2f}, ~{bpb:.3f} bits/byte) over "
           f"{vcnt:,} tokens; train-prefix loss {tloss:.4f}")

    tok = tt.load_tokenizer(a.tok)
    samples = []
    for p in PROMPTS:
        ids = tok.encode(p).ids
        out = greedy(model, ids, a.sample_tokens, dev)
        text = tok.decode(out[len(ids):], skip_special_tokens=False)
        samples.append({"prompt": p, "ids": out, "completion": text})
        tt.log(f"  [{p}] -> {text!r}")

    # ---- export
    tensors = tt.target_upstream(model, cfg)
    n_shards, total_bytes = tt.write_model_dir(a.out, cfg, tensors, shard_bytes=14_000_000)
    same = tt.check_legacy_config(cfg)
    tt.log(f"wrote {a.out}: {len(tensors)} tensors, {total_bytes / 1e6:.1f} MB in {n_shards} shards; "
           f"HF reads the legacy config the same: {same}")

    ref = val_np[:160].astype(np.int64).tolist()
    with torch.no_grad():
        rl = model(input_ids=torch.tensor([ref], device=dev), use_cache=False).logits[0].float().cpu()
    np.save(os.path.join(a.work, "ref_logits.npy"), rl.numpy().astype("<f4"))
    with open(os.path.join(a.work, "ref_ids.txt"), "w") as fh:
        fh.write(" ".join(map(str, ref)) + "\n")

    metrics = {
        "params": n_params, "steps": step, "batch": a.batch, "seq": a.seq, "tokens": tokens,
        "train_seconds": round(train_time, 1), "tokens_per_second": round(tokens / train_time),
        "lr": a.lr, "warmup": a.warmup, "wd": a.wd, "seed": a.seed,
        "train_tokens": int(len(train_np)), "val_tokens": int(len(val_np)), "val_bytes": val_bytes,
        "val_loss": round(vloss, 4), "val_ppl": round(math.exp(vloss), 3), "val_bits_per_byte": round(bpb, 4),
        "train_prefix_loss": round(tloss, 4), "loss_curve": losses,
        "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
        "torch": torch.__version__, "wall_seconds": round(time.time() - t_start, 1),
    }
    import transformers
    metrics["transformers"] = transformers.__version__
    with open(os.path.join(a.work, "target_metrics.json"), "w") as fh:
        json.dump(metrics, fh, indent=1)
    with open(os.path.join(a.work, "samples.json"), "w") as fh:
        json.dump(samples, fh, indent=1, ensure_ascii=False)
    tt.log(f"done in {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
