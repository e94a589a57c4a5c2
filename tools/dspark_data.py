#!/usr/bin/env python3
"""dspark_data.py: the DSpark drafter's training data, made by Tandem's own target forward.

    python3 tools/dspark_data.py --model models/tandem-tiny --data .train/data \
        --out .train/dspark_data [--windows 160 --seq 512 --jobs 2 --split train]

Random windows of --seq tokens are cut from the split's token stream (BOS + text + EOS per
document, encoded with `tandem tokenize`, as tools/train_target.py built it); for each,
`tandem logits --capture` runs the target (the fp32 CPU reference forward, checked against HF
transformers to ~1e-6 by the foundation fixtures) and gives every position's logits and the
mean HC stream after each capture layer. Writes, under --out:
  ids.npy    int32   [N, S]
  cap.npy    float32 [N, S, m * D]   captured context rows
  logits.npy float16 [N, S, V]       the target's logits (teacher)
  meta.json  the window offsets, capture layers, split, model
With --continue-tokens N each window keeps its first seq - N tokens and gets the target's own
continuation (`tandem generate`, temperatures --continue-temps in turn) for the rest: the
drafter then also learns on text as it meets it at inference (DeepSpec trains on
target-regenerated answers).
This lets the drafter train where HF transformers is not installed (torch alone is enough).
"""
import argparse
import concurrent.futures as cf
import json
import os
import random
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tandem_tiny as tt  # noqa: E402

TANDEM = os.path.join(tt.REPO, "bin", "tandem")


def encode_docs(model, docs, limit_tokens):
    """BOS + ids + EOS per document until limit_tokens, via `tandem tokenize`."""
    out, n = [], 0
    with tempfile.TemporaryDirectory() as d:
        for i, (_, text) in enumerate(docs):
            p = os.path.join(d, "doc.txt")
            with open(p, "w", encoding="utf-8") as fh:
                fh.write(text)
            r = subprocess.run([TANDEM, "tokenize", "--model", model, "--file", p, "--no-special"],
                               capture_output=True, text=True, check=True)
            ids = [tt.BOS_ID] + [int(x) for x in r.stdout.split()] + [tt.EOS_ID]
            out.append(np.array(ids, dtype=np.int32))
            n += len(ids)
            if n >= limit_tokens:
                break
    return np.concatenate(out)


def continue_window(model, ids, n_new, temperature, seed):
    """ids[:-n_new] followed by the target's own continuation of n_new tokens (`tandem
    generate`, no drafter): text as the drafter will meet it at inference"""
    prompt = " ".join(map(str, ids[:len(ids) - n_new].tolist()))
    out = subprocess.run([TANDEM, "generate", "--model", model, "--prompt-ids", prompt,
                          "--max-tokens", str(n_new), "--ignore-eos", "--print-ids", "--draft",
                          "none", "--temperature", str(temperature), "--seed", str(seed),
                          "--backend", "cpu"], capture_output=True, text=True, check=True).stdout
    return np.concatenate([ids[:len(ids) - n_new], np.array(out.split(), dtype=np.int32)])


def run_window(model, layers, ids, work):
    ip, lp, cp = (os.path.join(work, f) for f in ("ids.txt", "logits.npy", "cap.npy"))
    with open(ip, "w") as fh:
        fh.write(" ".join(map(str, ids.tolist())) + "\n")
    subprocess.run([TANDEM, "logits", "--model", model, "--ids", ip, "--out", lp, "--capture",
                    ",".join(map(str, layers)), "--capture-out", cp], check=True,
                   capture_output=True)
    return np.load(lp).astype(np.float16), np.load(cp)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=tt.MODEL_DIR)
    ap.add_argument("--data", default=os.path.join(tt.REPO, ".train", "data"))
    ap.add_argument("--out", default=os.path.join(tt.REPO, ".train", "dspark_data"))
    ap.add_argument("--split", default="train")
    ap.add_argument("--windows", type=int, default=160)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--layers", default="3,4,5")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--continue-tokens", type=int, default=0,
                    help="replace each window's last N tokens by the target's own continuation")
    ap.add_argument("--continue-temps", default="0,1",
                    help="temperatures of those continuations, taken in turn")
    a = ap.parse_args()
    layers = [int(x) for x in a.layers.split(",")]
    rng = random.Random(a.seed)
    docs = tt.read_docs(a.data, a.split)
    rng.shuffle(docs)  # a mix of every source
    stream = encode_docs(a.model, docs, a.windows * a.seq * 2)
    offs = sorted(rng.sample(range(len(stream) - a.seq), a.windows))
    wins = np.stack([stream[o:o + a.seq] for o in offs])
    tt.log(f"{len(stream):,} tokens from {a.split}; {a.windows} windows of {a.seq}")
    if a.continue_tokens:
        temps = [float(t) for t in a.continue_temps.split(",")]
        with cf.ThreadPoolExecutor(a.jobs) as ex:
            futs = [ex.submit(continue_window, a.model, wins[j], a.continue_tokens,
                              temps[j % len(temps)], a.seed * 1000 + j) for j in range(a.windows)]
            wins = np.stack([f.result() for f in futs])
        tt.log(f"each window's last {a.continue_tokens} tokens are the target's (T = {temps})")
    os.makedirs(a.out, exist_ok=True)
    V = None
    logits = caps = None
    with tempfile.TemporaryDirectory() as tmp, cf.ThreadPoolExecutor(a.jobs) as ex:
        works = [os.path.join(tmp, str(j)) for j in range(a.windows)]
        for w in works:
            os.makedirs(w)
        futs = [ex.submit(run_window, a.model, layers, wins[j], works[j]) for j in range(a.windows)]
        for j, f in enumerate(futs):
            lg, cp = f.result()
            if logits is None:
                V = lg.shape[1]
                logits = np.lib.format.open_memmap(os.path.join(a.out, "logits.npy"), "w+",
                                                   np.float16, (a.windows, a.seq, V))
                caps = np.lib.format.open_memmap(os.path.join(a.out, "cap.npy"), "w+",
                                                 np.float32, (a.windows, a.seq, cp.shape[1]))
            logits[j] = lg
            caps[j] = cp
            for fn in ("logits.npy", "cap.npy"):
                os.remove(os.path.join(works[j], fn))
            if (j + 1) % 10 == 0:
                tt.log(f"{j + 1}/{a.windows} windows")
    logits.flush()
    caps.flush()
    np.save(os.path.join(a.out, "ids.npy"), wins)
    with open(os.path.join(a.out, "meta.json"), "w") as fh:
        json.dump({"model": os.path.relpath(a.model, tt.REPO), "split": a.split, "seq": a.seq,
                   "continue_tokens": a.continue_tokens, "continue_temps": a.continue_temps,
                   "windows": a.windows,
                   "offsets": offs, "layers": layers, "seed": a.seed}, fh)
    tt.log(f"wrote {a.out}")


if __name__ == "__main__":
    main()
