#!/usr/bin/env python3
"""make_drafter_fixtures.py: PyTorch-reference fixtures for the C drafters.

    python3 tools/make_drafter_fixtures.py --out tests/fixtures/mtp_tiny [--model models/tandem-tiny]

MTP (tools/mtp_ref.py) on tandem-tiny, fp32 on the CPU, for a fixed prompt:
  - the target's one-shot logits on the prompt give the bonus token (greedy);
  - one MTP catch-up step over every prompt row (row q: the target's final streams H_q and the
    token after q; the last row's token is the bonus) -> logits of every row;
  - a k = 3 greedy chain with recycling (mtp_chain) -> drafts and each step's logits.
Writes ids.txt (the prompt), mtp.json (bonus, drafts) and mtp.safetensors (catchup_logits
[n, V] of the last 8 rows, chain_logits [3, V]). DSpark fixtures join when its reference does.
"""
import argparse
import json
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tandem_tiny as tt  # noqa: E402
from mtp_ref import TargetTap, load_mtp, mtp_chain  # noqa: E402

PROMPT = "In the beginning God created the heaven and the earth. And the earth was without form"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default=tt.MODEL_DIR)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    target, up, cfg = tt.load_target(a.model)
    tok = tt.load_tokenizer(a.model)
    ids = tok.encode(PROMPT).ids
    mtp = load_mtp(a.model, cfg, up)
    tap = TargetTap(target)
    with torch.no_grad():
        lg = target(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
        H = tap.h_final[0].float()
        bonus = int(torch.argmax(lg[-1]))
        nxt = torch.tensor(ids[1:] + [bonus])
        pos = torch.arange(len(ids))
        logits, _ = mtp(H[None], nxt[None], pos[None], target.model.embed_tokens, target.lm_head)
        drafts, _, step_logits = mtp_chain(mtp, target, H, nxt, 0, 3)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "ids.txt"), "w") as f:
        f.write(" ".join(str(i) for i in ids) + "\n")
    with open(os.path.join(a.out, "mtp.json"), "w") as f:
        json.dump({"prompt": PROMPT, "bonus": bonus, "drafts": drafts, "k": 3,
                   "catchup_rows": len(ids), "catchup_logits_first_row": len(ids) - 8}, f, indent=1)
    save_file({"catchup_logits": logits[0, -8:].float().contiguous(),
               "chain_logits": step_logits.float().contiguous()},
              os.path.join(a.out, "mtp.safetensors"))
    print(f"prompt {len(ids)} ids, bonus {bonus}, drafts {drafts}, "
          f"max|catchup logit| {logits.abs().max():.3f}")


if __name__ == "__main__":
    main()
