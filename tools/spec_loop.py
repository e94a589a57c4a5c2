#!/usr/bin/env python3
"""spec_loop.py: a PyTorch speculative-decoding loop that measures drafter acceptance.

    python3 tools/spec_loop.py --model models/tandem-tiny --work .train/work \
        [--prompts 8 --prompt-len 128 --new-tokens 128 --k 3 --temps 0,1]         # MTP
    python3 tools/spec_loop.py --drafter dspark --prompts-from .train/dspark_val/ids.npy \
        [--threshold C] [...]                                                      # DSpark

Each prompt is decoded with the target alone verifying the drafter's proposals, drafters.md
3.3/3.4:
  mtp:    the target is HF transformers' DeepseekV4ForCausalLM; prompts are held-out text (the
          validation stream of tools/train_target.py under --work, cut at document starts);
          tools/mtp_ref.py mtp_chain drafts k tokens (catch-up over every committed row, then
          k - 1 recycled steps);
  dspark: the target is Tandem's reference forward (`tandem logits --capture`, checked against
          HF by the foundation fixtures; torch alone is needed), prompts are the first
          --prompt-len ids of held-out windows (tools/dspark_data.py --split val); the
          reference drafter (tools/dspark_ref.py) drafts a block of gamma tokens from the
          captured rows of every committed position and the anchor, Markov-chained; with
          --threshold C a round verifies only the drafts before the first confidence below C.
  T = 0: accept while the draft equals the target's argmax; the correction/bonus is the
         argmax. The output is checked against plain greedy decoding of the first prompt.
  T > 0: accept with probability min(1, p/q), resample the residual max(p - q, 0) on a
         rejection, sample the bonus from p when every draft passes.
Everything is recomputed from scratch each round (no caches; the model is tiny). Reported:
per-position conditional acceptance P(draft k accepted | drafts < k accepted) and the mean
accepted length per round (accepted drafts + the bonus/correction token). fp32, TF32 off.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tandem_tiny as tt  # noqa: E402
from dspark_ref import embed_head, load_dspark, target_config  # noqa: E402
from mtp_ref import load_mtp, mtp_chain  # noqa: E402
TANDEM = os.path.join(tt.REPO, "bin", "tandem")


def hf_target(model_dir, dev, layers=()):
    """(rows(ids) -> (logits [n, V], final streams [n, hc, D], None), target, up, cfg)"""
    from mtp_ref import TargetTap
    target, up, cfg = tt.load_target(model_dir, None, dev)
    tap = TargetTap(target, layers)

    @torch.no_grad()
    def rows(ids):
        lg = target(input_ids=torch.tensor([ids], device=dev), use_cache=False).logits[0].float()
        return lg, tap.h_final[0], None
    return rows, target, up, cfg


def tandem_target(model_dir, layers):
    """rows(ids) -> (logits [n, V], None, captured rows [n, m*D]) from `tandem logits`"""
    def rows(ids):
        with tempfile.TemporaryDirectory() as d:
            ip, lp, cp = (os.path.join(d, f) for f in ("ids.txt", "l.npy", "c.npy"))
            with open(ip, "w") as fh:
                fh.write(" ".join(map(str, ids)) + "\n")
            subprocess.run([TANDEM, "logits", "--model", model_dir, "--ids", ip, "--out", lp,
                            "--capture", ",".join(map(str, layers)), "--capture-out", cp],
                           check=True, capture_output=True)
            return torch.from_numpy(np.load(lp)), None, torch.from_numpy(np.load(cp))
    return rows


def mtp_proposer(mtp, target, k, dev):
    def propose(seq, bonus, H, cap, T, gen):
        d, q, _ = mtp_chain(mtp, target, H[:len(seq)], torch.tensor(seq[1:] + [bonus], device=dev),
                            0, k, T, gen)
        return d, q
    return propose


def dspark_proposer(ds, embed, head, threshold):
    def propose(seq, bonus, H, cap, T, gen):
        r = ds.round(cap[:len(seq)], bonus, embed, head, T, gen)
        L = len(r["drafts"])
        for j, c in enumerate(r["conf"]):  # non-anticipating: c_j is known before draft j
            if c < threshold:
                L = j
                break
        return r["drafts"][:L], r["q"][:L]
    return propose


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
def speculate(rows, propose, prompt, n_new, k, T, gen):
    """Returns (generated ids, per-position attempts [k], accepts [k], rounds)."""
    seq = list(prompt)
    lg, H, cap = rows(seq)
    bonus = sample(dist(lg[-1], T), T, gen)
    out = []
    att, acc, rounds = [0] * k, [0] * k, 0
    while len(out) < n_new and bonus != tt.EOS_ID and len(seq) + 1 + k < tt.CONTEXT:
        drafts, q = propose(seq, bonus, H, cap, T, gen)
        L = len(drafts)
        lg, H, cap = rows(seq + [bonus] + drafts)
        base = len(seq)  # row of the bonus token: its logits judge draft 1
        a = 0
        nxt = None
        for j in range(L):
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
        if a == L:
            nxt = sample(dist(lg[base + L], T), T, gen)
        if drafts[:a] and drafts[a - 1] == tt.EOS_ID:
            break
        bonus = nxt
    if bonus == tt.EOS_ID and len(out) < n_new:
        out.append(bonus)
    return out[:n_new], att, acc, rounds


@torch.no_grad()
def plain_greedy(rows, prompt, n_new):
    seq = list(prompt)
    out = []
    while len(out) < n_new:
        t = int(rows(seq)[0][-1].argmax())
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
    ap.add_argument("--drafter", choices=("mtp", "dspark"), default="mtp")
    ap.add_argument("--k", type=int, default=3, help="MTP drafts per round (DSpark: its block size)")
    ap.add_argument("--threshold", type=float, default=0.0, help="DSpark confidence threshold")
    ap.add_argument("--prompts-from", default=os.path.join(tt.REPO, ".train", "dspark_val", "ids.npy"),
                    help="DSpark: held-out windows [N, S] (tools/dspark_data.py --split val)")
    ap.add_argument("--temps", default="0,1")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--until", type=float, default=None, help="epoch seconds: stop adding prompts")
    ap.add_argument("--out", default=None)
    ap.add_argument("--ref-logits", type=int, default=0,
                    help="MTP: also write HF fp32 logits of the first N held-out ids (ref_ids_N.txt, "
                         "ref_logits_N.npy under --work) to check the C engine against")
    a = ap.parse_args()

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    if a.drafter == "mtp":
        rows, target, up, cfg = hf_target(a.model, dev)
        propose = mtp_proposer(load_mtp(cfg=cfg, up=up).to(dev), target, a.k, dev)
        val = np.load(os.path.join(a.work, "val.npy"))
        prompts = prompts_from_val(val, a.prompts, a.prompt_len)
    else:
        dev = "cpu"
        ds = load_dspark(os.path.join(a.model, "dspark"), target_config(a.model))
        rows = tandem_target(a.model, ds.dcfg["dspark_target_layer_ids"])
        embed, head = embed_head(a.model)
        a.k = ds.gamma
        propose = dspark_proposer(ds, embed, head, a.threshold)
        wins = np.load(a.prompts_from)
        prompts = [w[:a.prompt_len].astype(np.int64).tolist() for w in wins[:a.prompts]]
    gen = torch.Generator(device=dev).manual_seed(a.seed)
    res = {"drafter": a.drafter, "k": a.k, "threshold": a.threshold, "prompt_len": a.prompt_len,
           "new_tokens": a.new_tokens, "results": {}}

    if a.ref_logits:
        ref = val[:a.ref_logits].astype(np.int64).tolist()
        with torch.no_grad():
            rl = rows(ref)[0].cpu()
        np.save(os.path.join(a.work, f"ref_logits_{a.ref_logits}.npy"), rl.numpy().astype("<f4"))
        with open(os.path.join(a.work, f"ref_ids_{a.ref_logits}.txt"), "w") as fh:
            fh.write(" ".join(map(str, ref)) + "\n")

    g0 = plain_greedy(rows, prompts[0], a.new_tokens)
    s0, _, _, _ = speculate(rows, propose, prompts[0], a.new_tokens, a.k, 0.0, gen)
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
            out, at, ac, r = speculate(rows, propose, pr, a.new_tokens, a.k, T, gen)
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
        tt.log(f"{a.drafter} k={a.k} T={T}: per-position acceptance {per}, mean accepted length "
               f"{mean_len:.3f} (bonus included), {n} prompts, {rounds} rounds, {time.time() - t0:.0f}s")
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
