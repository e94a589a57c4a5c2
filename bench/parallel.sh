#!/bin/sh
# parallel.sh: issue 28's measurements on a machine of several GPUs (--gpus N, NCCL), one run:
#   1. the experts' all-reduce inside a graph at 1, 6 and 64 rows, N = 2 and 4
#      (build/bench/allreduce_time; NVLink multicast off, as tandem runs it);
#   2. the Flash slice in the released precision (bench/flash_slice_fp8: all 256 experts, 4
#      layers, fits one GPU) at 1, 2 and 4 GPUs: decode tokens/s at batch 1 (generate) and 64
#      (bench, distinct prompts), the speedup over one GPU, and its efficiency;
#   3. the released V4-Flash shape (bench/v4_flash: 43 layers, FP8 / FP4, dummy weights, about
#      149 GiB: two H200s at least) on 2 and 4 GPUs: time per output token at batch 1 with no
#      drafter, MTP k = 3 and DSpark (bench/flash_depth/dspark, V4-Flash-0731's head shape) at
#      synthetic acceptance (spec_depth.sh's published rates: lossy, a measurement of cost),
#      against SGLang's 3.26 ms (MTP) and 1.72 ms (DSpark) at TP4 on H200 (parallel.md 1.6).
#   sh bench/parallel.sh            (GPUS="1 2 4", N=64 tokens, TANDEM=path)
# Each rank prints its placed bytes with --stats (rank 0 gathers them). A row whose GPUs are
# missing says so and the script goes on.
set -e
N=${N:-64}
G=${GPUS:-1 2 4}
ACC=${ACC:-0.80,0.80,0.797}                         # MTP k = 3 (spec_depth.sh's rates)
ACC_DSPARK=${ACC_DSPARK:-0.82,0.817,0.821,0.818,0.822} # DSpark, block 5 (the same)
T=${TANDEM:-./bin/tandem}
have=$(nvidia-smi -L 2>/dev/null | wc -l)
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>/dev/null || true
echo "GPUs: $have"
ids() { awk -v n="$1" -v s="$2" -v v=129280 'BEGIN { srand(s); for (i = 0; i < n; i++) printf "%d ", 2 + int(rand() * (v - 2)); print "" }'; }
rate() { sed -n "s/^$1: decode .*= \([0-9.]*\) tokens\/s.*/\1/p" | head -1; }

echo "== 1. all-reduce of the experts' slots in a graph (hidden 4096, 6 + 1 picks)"
for W in 2 4; do
    if [ "$W" -gt "$have" ]; then echo "N $W: not run ($have GPUs)"; continue; fi
    build/bench/allreduce_time $W 4096 7 || echo "N $W: failed"
done

echo "== 2. bench/flash_slice_fp8 over GPUs (decode tokens/s)"
P=$(ids 64 1)
J=/tmp/parallel_prompts.jsonl
: > $J
for i in $(seq 1 64); do echo "{\"ids\": [$(ids 64 $i | sed 's/ *$//; s/ /, /g')]}" >> $J; done
b1_1=""; b64_1=""
for W in $G; do
    if [ "$W" -gt "$have" ]; then echo "GPUs $W: not run ($have GPUs)"; continue; fi
    F="--gpus $W"; [ "$W" = 1 ] && F="--backend cuda" # one GPU: the whole model, no split
    o=$($T generate --dummy-weights --model bench/flash_slice_fp8 $F --ignore-eos \
        --print-ids --stats --prompt-ids "$P" --max-tokens $N --max-ctx 4096 2>&1 >/dev/null || true)
    r1=$(echo "$o" | rate stats)
    o=$($T bench --dummy-weights --model bench/flash_slice_fp8 $F --prompts $J \
        --n-prompts 64 --batch 64 --max-tokens $N --max-ctx 4096 2>&1 || true)
    r64=$(echo "$o" | rate bench)
    [ -z "$r1" ] && { echo "GPUs $W: failed:"; echo "$o" | tail -3; continue; }
    [ "$W" = 1 ] && b1_1=$r1 && b64_1=$r64
    s1=$(awk -v a="$r1" -v b="$b1_1" 'BEGIN { if (b > 0) printf "%.2fx, %.0f%% efficient", a / b, 100 * a / b / '"$W"' }')
    s64=$(awk -v a="$r64" -v b="$b64_1" 'BEGIN { if (b > 0) printf "%.2fx, %.0f%% efficient", a / b, 100 * a / b / '"$W"' }')
    echo "GPUs $W: batch 1 $r1 tokens/s ($s1); batch 64 $r64 tokens/s ($s64)"
done

echo "== 3. bench/v4_flash (released shape) over GPUs: time per output token at batch 1"
for W in 2 4; do
    if [ "$W" -gt "$have" ]; then echo "GPUs $W: not run ($have GPUs)"; continue; fi
    for D in none mtp dspark; do
        A=""
        [ "$D" = mtp ] && A="--draft-tokens 3 --synthetic-acceptance $ACC"
        [ "$D" = dspark ] && A="--dspark-dir bench/flash_depth/dspark --synthetic-acceptance $ACC_DSPARK"
        o=$($T generate --dummy-weights --model bench/v4_flash --gpus $W --draft $D $A \
            --ignore-eos --print-ids --stats --prompt-ids "$P" --max-tokens $N --max-ctx 4096 \
            2>&1 >/dev/null || true)
        r=$(echo "$o" | rate stats)
        if [ -z "$r" ]; then echo "GPUs $W, $D: failed:"; echo "$o" | tail -3; continue; fi
        echo "GPUs $W, $D${A:+ (synthetic acceptance, lossy)}: $r tokens/s = $(awk -v r="$r" 'BEGIN { printf "%.2f", 1000 / r }') ms a token"
    done
done
