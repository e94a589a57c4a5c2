#!/bin/sh
# kv_dtype.sh: the key caches' precision (--kv-dtype fp32 | bf16 | fp8) on one model, from one run
# each: the caches' bytes and bytes a token of context (the stats line), and decode tokens/s at
# batch 1 and 8 after a P-token prompt (the rate after every completion's first token).
#   MODEL=bench/flash_slice_fp8 P=4000 sh bench/kv_dtype.sh [N]
set -e
N=${1:-64}
M=${MODEL:-bench/flash_slice_fp8}
P=${P:-4000}
V=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' $M/config.json)
IDS=$(awk -v n="$P" -v v="$V" 'BEGIN { srand(7); for (i = 0; i < n; i++) printf "%d ", 2 + int(rand() * (v - 2)); print "" }')
T="${TANDEM:-./bin/tandem} generate --dummy-weights --model $M --backend ${BACKEND:-cuda} --ignore-eos --print-ids --stats --max-ctx $((P + N + 64))"
[ "${BACKEND:-cuda}" = cuda ] && nvidia-smi --query-gpu=name --format=csv,noheader
for K in fp32 bf16 fp8; do
    for B in 1 8; do
        o=$($T --kv-dtype $K --prompt-ids "$IDS" --max-tokens "$N" --n $B 2>&1 >/dev/null)
        [ $B = 1 ] && echo "$o" | sed -n 's/^stats: backend .*placed, \(.* key caches .*\)/\1/p'
        r=$(echo "$o" | sed -n 's/^stats: decode .*= \([0-9.]*\) tokens\/s.*/\1/p')
        echo "$K decode batch $B at context $P: $r tokens/s"
    done
done
