#!/bin/sh
# gpu_vs_hf.sh: tandem (CUDA backend) against HF transformers, greedy decoding, same GPU, one run.
#   [BATCHES="1 8 64"] sh bench/gpu_vs_hf.sh [MODEL_DIR] [MAX_TOKENS]
# Prints decode tokens/s for each batch: HF (fp32 eager), tandem --draft none, tandem --draft
# ngram (k = 3), tandem without CUDA graphs, and the ratios to HF and to tandem's own no-spec
# mode; then prefill tokens/s of the fixture's whole ids.txt at batch 1, tandem and HF, both
# warm. Every decode rate is the whole run's (prompt and new tokens over the run's time, as HF's
# is), the first of tandem's stats lines (the decode line after it leaves the prefill out).
set -e
run_tps() { sed -n 's/^stats: [0-9]* tokens in .* = \([0-9.]*\) tokens\/s.*/\1/p' | head -1; }
M=${1:-tests/fixtures/a_tiny_yarn}
N=${2:-128}
P=$(tr ' ' '\n' < "$M/ids.txt" | head -64 | tr '\n' ' ')
nvidia-smi --query-gpu=name --format=csv,noheader
for B in ${BATCHES:-1 8 64}; do
    hf=$(python3 bench/hf_generate.py --model "$M" --prompt-len 64 --max-tokens "$N" --batch "$B" 2>/dev/null | tail -1)
    hf_tps=$(echo "$hf" | sed -E 's/.*= ([0-9.]+) tokens.*/\1/')
    none=$(./bin/tandem generate --backend cuda --model "$M" --prompt-ids "$P" --max-tokens "$N" --n "$B" --ignore-eos --stats 2>&1 >/dev/null | run_tps)
    nog=$(./bin/tandem generate --backend cuda --no-graphs --model "$M" --prompt-ids "$P" --max-tokens "$N" --n "$B" --ignore-eos --stats 2>&1 >/dev/null | run_tps)
    ngram=$(./bin/tandem generate --backend cuda --model "$M" --prompt-ids "$P" --max-tokens "$N" --n "$B" --ignore-eos --stats --draft ngram --draft-tokens 3 2>&1 >/dev/null)
    ngram_tps=$(echo "$ngram" | run_tps)
    ngram=$(echo "$ngram" | grep -E "tokens/s|accepted length" | tr '\n' ' ')
    echo "batch $B: hf $hf_tps tok/s | tandem none $none tok/s ($(awk "BEGIN{printf \"%.2f\", $none/$hf_tps}")x hf) | tandem ngram $ngram_tps tok/s ($(awk "BEGIN{printf \"%.2f\", $ngram_tps/$none}")x none) | $hf"
    echo "   ngram: $ngram"
    echo "   tandem none without CUDA graphs: $nog tok/s (graphs $(awk "BEGIN{printf \"%.2f\", $none/$nog}")x)"
done
# prefill: HF times its second forward (the first warms it up), so tandem's is warm too: five
# requests of the ids one at a time (tandem bench, no prefix cache), the median time from a
# request's admission to its first token (the first request's, which loads every kernel, is
# printed apart: generate's run of one prompt)
L=$(wc -w < "$M/ids.txt")
F=/tmp/gpu_vs_hf_prefill.jsonl
ids=$(tr -s ' \n' ',' < "$M/ids.txt" | sed 's/^,//; s/,$//')
for i in 1 2 3 4 5; do echo "{\"ids\": [$ids]}"; done > $F
t=$(./bin/tandem bench --backend cuda --model "$M" --prompts $F --n-prompts 5 --batch 1 --max-tokens 1 \
    --max-batch-tokens "$L" --prefix-blocks 0 --csv 2>/dev/null | tail -1 | cut -d, -f23)
t1=$(./bin/tandem generate --backend cuda --model "$M" --prompt-ids-file "$M/ids.txt" --max-tokens 1 --max-batch-tokens "$L" --stats 2>&1 >/dev/null | sed -n 's/.* in \([0-9.]*\) s = .*/\1/p')
hf=$(python3 bench/hf_generate.py --model "$M" --prompt-len "$L" --prefill 2>/dev/null | tail -1 | sed -E 's/.*= ([0-9.]+) tokens.*/\1/')
echo "prefill $L tokens, batch 1: tandem $(awk "BEGIN{printf \"%.0f\", $L/$t}") tok/s (admission to first token p50 of 5, $t s; a process's first prompt $t1 s), hf $hf tok/s ($(awk "BEGIN{printf \"%.1f\", $L/$t/$hf}")x)"
