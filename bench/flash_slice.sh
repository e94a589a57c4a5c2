#!/bin/sh
# flash_slice.sh: the Flash-shaped slice of DeepSeek-V4 (bench/flash_slice/config.json: hidden
# 4096, 64 heads x 512, 256 experts top-6 x 2048 + shared, index 64 x 128 top-512, window 128,
# vocab 129280, layers HCA CSA HCA CSA; 27.3 G parameters, 54.6 GB in bf16) with weights made on
# the GPU (--dummy-weights). Prints, from one run each:
#   decode tokens/s at batch 1, 8 and 64 (64-token prompts, N new tokens, greedy, --ignore-eos)
#   prefill tokens/s (one 4096-token prompt, one new token)
#   the batch-1 decode step at context 4k and 32k: (time for 1 + S tokens - time for 1) / S
#   sh bench/flash_slice.sh [N]
# (MODEL=DIR BACKEND=cpu CTXS="256 512" PREFILL=256 run the same on another config: a smoke test)
set -e
M=${MODEL:-bench/flash_slice}
N=${1:-64}
S=32
V=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' $M/config.json)
T="./bin/tandem generate --dummy-weights --model $M --backend ${BACKEND:-cuda} --ignore-eos --print-ids --stats"
ids() { awk -v n="$1" -v s="$2" -v v="$V" 'BEGIN { srand(s); for (i = 0; i < n; i++) printf "%d ", 2 + int(rand() * (v - 2)); print "" }'; }
secs() { sed -n 's/.* in \([0-9.]*\) s = .*/\1/p' | head -1; }
tps() { sed -n 's/.*= \([0-9.]*\) tokens\/s.*/\1/p' | head -1; }
[ "${BACKEND:-cuda}" = cuda ] && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
P=$(ids 64 1)
for B in 1 8 64; do
    echo "decode batch $B: $($T --prompt-ids "$P" --max-tokens "$N" --n $B --max-ctx 4096 2>&1 >/dev/null | tps) tokens/s"
done
PF=${PREFILL:-4096}
ids $PF 2 > /tmp/flash_prefill.ids
t=$($T --prompt-ids-file /tmp/flash_prefill.ids --max-tokens 1 --max-ctx $((PF + 8)) --max-batch-tokens $PF 2>&1 >/dev/null | secs)
echo "prefill $PF tokens: $t s = $(awk "BEGIN{printf \"%.0f\", $PF / $t}") tokens/s"
for C in ${CTXS:-4096 32768}; do
    ids $((C - S - 1)) 3 > /tmp/flash_ctx.ids
    a=$($T --prompt-ids-file /tmp/flash_ctx.ids --max-tokens 1 --max-ctx $((C + 8)) 2>&1 >/dev/null | secs)
    b=$($T --prompt-ids-file /tmp/flash_ctx.ids --max-tokens $((S + 1)) --max-ctx $((C + 8)) 2>&1 >/dev/null | secs)
    echo "context $C: decode step $(awk "BEGIN{printf \"%.3f\", ($b - $a) * 1000 / $S}") ms (batch 1)"
done
