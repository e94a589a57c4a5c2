#!/bin/sh
# step_kernels.sh: where one batch-1 decode step's GPU time goes, kernel by kernel (Nsight
# Compute, kernels one at a time, caches left warm as a step leaves them), on the Flash slice
# with weights made on the GPU; tools/ncu_step.py prints the last complete step.
#   sh bench/step_kernels.sh [extra generate flags]   (MODEL=DIR, TANDEM=path, CSV=file.csv)
# PROMPT=N sets the prompt's length (64 random ids); PROFILE_STEPS=A,B profiles only the engine's
# steps A to B (TD_PROFILE_STEPS), so a later step than the fourth token's can be seen, e.g. a
# batch-64 decode at long context: PROMPT=300 PROFILE_STEPS=100,102 sh bench/step_kernels.sh
# --n 64 --max-tokens 40 (steps count prefill chunks too; B at least A + 2: the window ends at
# step B's start, and tools/ncu_step.py finds a step between two starts). With distinct routing
# at batch 64: --n 64 --temperature 1 --seed 1 (copies of one greedy prompt route like one row).
# METRICS=gpu__time_duration.sum,dram__bytes_read.sum adds each kernel's bytes and rate.
# For a step's time in its graph, with programmatic dependent launch, use TD_TIMELINE=1.
# PREFILL=N profiles one prefill step of N random tokens instead (one step of N rows: --max-tokens
# 1, --max-batch-tokens N) with each kernel's bytes read, and adds a table by op with the FLOPs
# the config's shapes do in it and their rate (tools/ncu_step.py --flops), e.g.
#   PREFILL=4096 MODEL=bench/flash_slice sh bench/step_kernels.sh
set -e
M=${MODEL:-bench/flash_slice}
O=${CSV:-/tmp/step_kernels.csv}
V=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' $M/config.json)
P=$(awk -v v="$V" -v n="${PROMPT:-64}" 'BEGIN { srand(1); for (i = 0; i < n; i++) printf "%d ", 2 + int(rand() * (v - 2)); print "" }')
D=""; [ -f "$M/model.safetensors" ] || [ -f "$M/model.safetensors.index.json" ] || D=--dummy-weights
W=""; [ -n "$PROFILE_STEPS" ] && W="--profile-from-start off"
if [ -n "$PREFILL" ]; then
    awk -v v="$V" -v n="$PREFILL" 'BEGIN { srand(2); for (i = 0; i < n; i++) printf "%d ", 2 + int(rand() * (v - 2)); print "" }' > /tmp/step_kernels.ids
    TD_PROFILE_STEPS=1,2 ncu --profile-from-start off --clock-control none --cache-control none \
        --metrics ${METRICS:-gpu__time_duration.sum,dram__bytes_read.sum} --csv \
        ${TANDEM:-./bin/tandem} generate $D --model $M --backend cuda --ignore-eos --print-ids \
        --prompt-ids-file /tmp/step_kernels.ids --max-tokens 1 --max-ctx $((PREFILL + 8)) \
        --max-batch-tokens $PREFILL --draft none "$@" > "$O" 2>/dev/null
    python3 tools/ncu_step.py "$O" --all --flops $M/config.json --prefill $PREFILL
    exit
fi
TD_PROFILE_STEPS=${PROFILE_STEPS:-} ncu $W --clock-control none --cache-control none --metrics ${METRICS:-gpu__time_duration.sum} --csv \
    ${TANDEM:-./bin/tandem} generate $D --model $M --backend cuda --ignore-eos --print-ids \
    --prompt-ids "$P" --max-tokens 4 --max-ctx 4096 --draft none "$@" > "$O" 2>/dev/null
python3 tools/ncu_step.py "$O"
