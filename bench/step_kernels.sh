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
set -e
M=${MODEL:-bench/flash_slice}
O=${CSV:-/tmp/step_kernels.csv}
V=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' $M/config.json)
P=$(awk -v v="$V" -v n="${PROMPT:-64}" 'BEGIN { srand(1); for (i = 0; i < n; i++) printf "%d ", 2 + int(rand() * (v - 2)); print "" }')
D=""; [ -f "$M/model.safetensors" ] || [ -f "$M/model.safetensors.index.json" ] || D=--dummy-weights
W=""; [ -n "$PROFILE_STEPS" ] && W="--profile-from-start off"
TD_PROFILE_STEPS=${PROFILE_STEPS:-} ncu $W --clock-control none --cache-control none --metrics ${METRICS:-gpu__time_duration.sum} --csv \
    ${TANDEM:-./bin/tandem} generate $D --model $M --backend cuda --ignore-eos --print-ids \
    --prompt-ids "$P" --max-tokens 4 --max-ctx 4096 --draft none "$@" > "$O" 2>/dev/null
python3 tools/ncu_step.py "$O"
