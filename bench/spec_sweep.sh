#!/bin/sh
# spec_sweep.sh: speculation at every load on models/tandem-tiny, one call: for each prompt set
# (MT-Bench, GSM8K, HumanEval from PROMPTS_DIR), tandem bench --sweep of none / dspark / mtp at
# batches 1 8 16 32 64 under the adaptive policy, R rounds (--repeat: medians, each speedup with
# its range); the fixed policy at batch 1 (the adaptive one should keep 95% of it); then, with
# --deterministic on the GPU, the md5 of greedy output of none, mtp and dspark at batch 1, 8 and
# 64 (speculation is lossless: the three must be equal at each batch).
#   [BACKEND=cuda|cpu] [PROMPTS_DIR=../shared/data/prompts] [BATCHES=1,8,16,32,64]
#   [N=64 prompts] [MAX_TOKENS=128] [PLOTS=dir] sh bench/spec_sweep.sh [R]
set -e
R=${1:-3}
BK=${BACKEND:-cuda}
PD=${PROMPTS_DIR:-../shared/data/prompts}
BS=${BATCHES:-1,8,16,32,64}
N=${N:-64}
MT=${MAX_TOKENS:-128}
OUT=${PLOTS:-/tmp}
M=models/tandem-tiny
if [ "$BK" = cuda ]; then nvidia-smi --query-gpu=name --format=csv,noheader; else
    echo "cpu: $(nproc) cores"; fi
B="./bin/tandem bench --model $M --n-prompts $N --max-tokens $MT --backend $BK"
for set in mt-bench gsm8k humaneval; do
    [ -f "$PD/$set.jsonl" ] || { echo "spec_sweep.sh: no $PD/$set.jsonl (PROMPTS_DIR=...)" >&2; exit 1; }
    echo "== $set, adaptive"
    $B --prompts "$PD/$set.jsonl" --sweep "$BS" --repeat "$R" --draft none,dspark,mtp \
        --plot "$OUT/spec_sweep_$set.svg" 2>/dev/null
done
echo "== mt-bench, fixed, batch 1"
$B --prompts "$PD/mt-bench.jsonl" --sweep 1 --repeat "$R" --draft none,dspark,mtp \
    --draft-policy fixed --plot "$OUT/spec_sweep_fixed.svg" 2>/dev/null | grep -v "plot in"
P=$(awk 'BEGIN { srand(3); for (i = 0; i < 40; i++) printf "%d ", 2 + int(rand() * 8190); print "" }')
D=""; [ "$BK" = cuda ] && D=--deterministic
echo "== greedy output, md5 (none mtp dspark)"
for b in 1 8 64; do
    line="batch $b:"
    for d in none mtp dspark; do
        h=$(./bin/tandem generate --model $M --backend $BK $D --ignore-eos --print-ids \
            --prompt-ids "$P" --n $b --max-tokens "$MT" --draft $d 2>/dev/null | md5sum | cut -c1-12)
        line="$line $h"
    done
    echo "$line"
done
