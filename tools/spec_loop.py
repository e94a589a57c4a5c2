#!/usr/bin/env python3
"""spec_loop.py: a PyTorch speculative-decoding loop that measures drafter acceptance.

    python3 tools/spec_loop.py --model models/tandem-tiny --work .train/work \
        [--prompts 8 --prompt-len 128 --new-tokens 128 --k 3 --temps 0,1]

Prompts are held-out text (the validation stream of tools/train_target.py under --work, cut
at document starts). For each temperature, each prompt is decoded with the target alone
verifying MTP drafts (tools/mtp_ref.py mtp_chain: catch-up over every committed row, then
k - 1 recycled steps), drafters.md 3.3/3.4:
  T = 0: accept while the draft equals the target's argmax; the correction/bonus is the
         argmax. The output is checked against plain greedy decoding of the first prompt.
  T > 0: accept with probability min(1, p/q), resample the residual max(p - q, 0) on a
         rejection, sample the bonus from p when all k drafts pass.
Everything is recomputed from scratch each round (no caches; the model is tiny). Reported:
per-position conditional acceptance P(draft k accepted | drafts < k accepted) for k = 1..K
and the mean accepted length per round (accepted drafts + the bonus/correction token).
fp32 throughout, TF32 off.
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tandem_tiny as tt  # noqa: E402
from mtp_ref import TargetTap, load_mtp, mtp_chain  # noqa: E402


@torch.no_grad()
def target_rows(target, tap, ids, dev):
    lg = target(input_ids=torch.tensor([ids], device=dev), use_cache=False).logits[0].float()
    return lg, tap.h_final[0]


def dist(logits, T):
    if T <= 0:
        p = torch.zeros_like(logits)
        p[int(torch.argmax(logits))] = 1.0
        return p
    return torch.softmax(logits / T, -1)


def sample(p, T, gen):
    if T <= 0:
        return int(torch.argmax(p))
    return int(torch.multinomial(p, 1, generator=gen))


@torch.no_grad()
def speculate_mtp(target, tap, mtp, prompt, n_new, k, T, gen, dev):
    """Returns (generated ids, per-position attempts [k], accepts [k], rounds)."""
    seq = list(prompt)
    lg, H = target_rows(target, tap, seq, dev)
    bonus = sample(dist(lg[-1], T), T, gen)
    out = []
    att, acc, rounds = [0] * k, [0] * k, 0
    while len(out) < n_new and bonus != tt.EOS_ID and len(seq) + 1 + k < tt.CONTEXT:
        drafts, q, _ = mtp_chain(mtp, target, H[:len(seq)], torch.tensor(seq[1:] + [bonus], device=dev),
                                 0, k, T, gen)
        lg, H = target_rows(target, tap, seq + [bonus] + drafts, dev)
        base = len(seq)  # row of the bonus token: its logits judge draft 1
        a = 0
        nxt = None
        for j in range(k):
            att[j] += 1
            p = dist(lg[base + j], T)
            d = drafts[j]
            if T <= 0:
                ok = int(torch.argmax(p)) == d
            else:
                ok = float(torch.rand((), generator=gen, device=p.device)) < min(1.0, float(p[d] / q[j][d]))
            if not ok:
                if T <= 0:
                    nxt = int(torch.argmax(p))
                else:
                    r = torch.clamp(p - q[j], min=0)
                    nxt = sample(r / r.sum() if float(r.sum()) > 1e-8 else p, T, gen)
                break
            acc[j] += 1
            a += 1
            if d == tt.EOS_ID:
                break
        rounds += 1
        committed = [bonus] + drafts[:a]
        seq += committed
        out += committed
        if a == k:
            nxt = sample(dist(lg[base + k], T), T, gen)
        if drafts[:a] and drafts[a - 1] == tt.EOS_ID:
            break
        bonus = nxt
    if bonus == tt.EOS_ID and len(out) < n_new:
        out.append(bonus)
    return out[:n_new], att, acc, rounds


@torch.no_grad()
def plain_greedy(target, prompt, n_new, dev):
    seq = list(prompt)
    out = []
    while len(out) < n_new:
        t = int(target(input_ids=torch.tensor([seq], device=dev), use_cache=False).logits[0, -1].argmax())
        out.append(t)
        seq.append(t)
        if t == tt.EOS_ID:
            break
    return out


def prompts_from_val(val, n, plen):
    starts = np.nonzero(val == tt.BOS_ID)[0]
    out = []
    for s in starts:
        if s + plen < len(val) and tt.EOS_ID not in val[s:s + plen]:
            out.append(val[s:s + plen].astype(np.int64).tolist())
        if len(out) == n:
            break
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=tt.MODEL_DIR)
    ap.add_argument("--work", default=os.path.join(tt.REPO, ".train", "work"))
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--temps", default="0,1")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--until", type=float, default=None, help="epoch seconds: stop adding prompts")
    ap.add_argument("--out", default=None)
    ap.add_argument("--ref-logits", type=int, default=0,
                    help="also write HF fp32 logits of the first N held-out ids (ref_ids_N.txt, "
                         "ref_logits_N.npy under --work) to check the C engine against")
    a = ap.parse_args()

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    target, up, cfg = tt.load_target(a.model, None, dev)
    mtp = load_mtp(cfg=cfg, up=up).to(dev)
    tap = TargetTap(target)
    val = np.load(os.path.join(a.work, "val.npy"))
    prompts = prompts_from_val(val, a.prompts, a.prompt_len)
    gen = torch.Generator(device=dev).manual_seed(a.seed)
    res = {"drafter": "mtp", "k": a.k, "prompt_len": a.prompt_len, "new_tokens": a.new_tokens,
           "results": {}}

    if a.ref_logits:
        ref = val[:a.ref_logits].astype(np.int64).tolist()
        with torch.no_grad():
            rl = target(input_ids=torch.tensor([ref], device=dev), use_cache=False).logits[0].float().cpu()
        np.save(os.path.join(a.work, f"ref_logits_{a.ref_logits}.npy"), rl.numpy().astype("<f4"))
        with open(os.path.join(a.work, f"ref_ids_{a.ref_logits}.txt"), "w") as fh:
            fh.write(" ".join(map(str, ref)) + "\n")

    g0 = plain_greedy(target, prompts[0], a.new_tokens, dev)
    s0, _, _, _ = speculate_mtp(target, tap, mtp, prompts[0], a.new_tokens, a.k, 0.0, gen, dev)
    res["greedy_identical"] = g0 == s0
    tt.log(f"T=0 speculative output equals plain greedy on prompt 0: {g0 == s0}")

    temps = [float(t) for t in a.temps.split(",")]
    for ti, T in enumerate(temps):
        att, acc, rounds, toks, n = [0] * a.k, [0] * a.k, 0, 0, 0
        t0 = time.time()
        # each temperature gets an equal share of the time left (at least one prompt each)
        t_end = t0 + (a.until - t0) / (len(temps) - ti) if a.until else None
        for pr in prompts:
            if t_end and n > 0 and time.time() > t_end:
                break
            out, at, ac, r = speculate_mtp(target, tap, mtp, pr, a.new_tokens, a.k, T, gen, dev)
            att = [x + y for x, y in zip(att, at)]
            acc = [x + y for x, y in zip(acc, ac)]
            rounds += r
            toks += sum(ac) + r
            n += 1
        per = [round(c / max(1, t), 4) for c, t in zip(acc, att)]
        mean_len = (sum(acc) + rounds) / max(1, rounds)
        res["results"][str(T)] = {"prompts": n, "rounds": rounds, "per_position_acceptance": per,
                                  "attempts": att, "accepts": acc,
                                  "mean_accepted_length": round(mean_len, 4)}
        tt.log(f"MTP k={a.k} T={T}: per-position acceptance {per}, mean accepted length "
               f"{mean_len:.3f} (bonus included), {n} prompts, {rounds} rounds, {time.time() - t0:.0f}s")
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
