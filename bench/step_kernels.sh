#!/bin/sh
# step_kernels.sh: where one batch-1 decode step's GPU time goes, kernel by kernel (Nsight
# Compute, kernels one at a time, caches left warm as a step leaves them), on the Flash slice
# with weights made on the GPU; tools/ncu_step.py prints the last complete step.
#   sh bench/step_kernels.sh [extra generate flags]   (MODEL=DIR, TANDEM=path, CSV=file.csv)
# For a step's time in its graph, with programmatic dependent launch, use TD_TIMELINE=1.
set -e
M=${MODEL:-bench/flash_slice}
O=${CSV:-/tmp/step_kernels.csv}
V=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' $M/config.json)
P=$(awk -v v="$V" 'BEGIN { srand(1); for (i = 0; i < 64; i++) printf "%d ", 2 + int(rand() * (v - 2)); print "" }')
D=""; [ -f "$M/model.safetensors" ] || [ -f "$M/model.safetensors.index.json" ] || D=--dummy-weights
ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
    ${TANDEM:-./bin/tandem} generate $D --model $M --backend cuda --ignore-eos --print-ids \
    --prompt-ids "$P" --max-tokens 4 --max-ctx 4096 --draft none "$@" > "$O" 2>/dev/null
python3 tools/ncu_step.py "$O"
