#!/bin/sh
# tiny_spec.sh: speculative decoding on models/tandem-tiny, one run: tokens/s of --draft none /
# ngram / mtp (k = 1, 3) / dspark at batch 1 and 16, the speedups over none and the
# acceptance; on the GPU also HF transformers on the same GPU as the baseline.
#   [BACKEND=cuda|cpu] sh bench/tiny_spec.sh [MAX_TOKENS]
set -e
M=models/tandem-tiny
N=${1:-128}
BK=${BACKEND:-cuda}
T="In the beginning God created the heaven and the earth. And the earth was without form, and void"
P=$(./bin/tandem tokenize --model $M --text "$T")
if [ "$BK" = cuda ]; then nvidia-smi --query-gpu=name --format=csv,noheader; else
    echo "cpu: $(nproc) cores, $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)"; fi
tps() { sed -n 's/.*= \([0-9.]*\) tokens\/s.*/\1/p' | head -1; }
for B in 1 16; do
    base=$(./bin/tandem generate --backend $BK --model $M --prompt-ids "$P" --max-tokens "$N" --n "$B" --ignore-eos --stats --print-ids --draft none 2>&1 >/dev/null | tps)
    if [ "$BK" = cuda ]; then
        hf=$(python3 bench/hf_generate.py --model $M --upstream --prompt-ids "$P" --max-tokens "$N" --batch "$B" 2>/dev/null | tail -1 | sed -n 's/.*= \([0-9.]*\) tokens.*/\1/p')
        echo "batch $B: hf $hf tok/s; tandem none $base tok/s ($(awk "BEGIN{printf \"%.1f\", $base/$hf}")x hf)"
    else
        echo "batch $B: tandem none $base tok/s"
    fi
    for d in "ngram --draft-tokens 3" "mtp --draft-tokens 1" "mtp --draft-tokens 3" "dspark"; do
        out=$(./bin/tandem generate --backend $BK --model $M --prompt-ids "$P" --max-tokens "$N" --n "$B" --ignore-eos --stats --print-ids --draft $d 2>&1 >/dev/null)
        t=$(echo "$out" | tps)
        acc=$(echo "$out" | grep -E "mean accepted|by draft" | sed 's/stats: //' | tr '\n' ';')
        echo "  $d: $t tok/s ($(awk "BEGIN{printf \"%.2f\", $t/$base}")x none) $acc"
    done
done
