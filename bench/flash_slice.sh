#!/bin/sh
# flash_slice.sh: the Flash-shaped slice of DeepSeek-V4 (bench/flash_slice/config.json: hidden
# 4096, 64 heads x 512, 256 experts top-6 x 2048 + shared, index 64 x 128 top-512, window 128,
# vocab 129280, layers HCA CSA HCA CSA; 27.3 G parameters, 54.6 GB in bf16) with weights made on
# the GPU (--dummy-weights). Prints, from one run each:
#   decode tokens/s at batch 1, 8 and 64 (64-token prompts, N new tokens, greedy, --ignore-eos):
#   the tokens after every completion's first over the time after it (the prefill step, which
#   reads nearly every expert, is timed apart below); the rate with it in brackets. Batches 8
#   and 64 decode distinct prompts (tandem bench, a file of ids a line): copies of one prompt
#   decode the same greedy tokens, route every row to the same 6 experts a layer and read a
#   batch-1 step's expert bytes (sessions before 30 measured that)
#   prefill tokens/s (one 4096-token prompt, one new token)
#   the batch-1 decode step at context 4k and 32k: the S tokens after the first over their time
#   (the difference of two runs, each with a 32k-token prefill of about 9 s, was mostly noise)
#   the bytes of weights a batch-1 decode step reads (every dense matrix, the 6 routed + 1 shared
#   experts of each layer, the head; bf16, HC mixing fp32), the bandwidth that implies at the
#   measured batch-1 rate, and the device-to-device copy bandwidth measured by torch (4 GiB
#   copied 10 times, bytes read + written), both in the same run
#   sh bench/flash_slice.sh [N]
# MODELS="bench/flash_slice bench/flash_slice_fp8" runs each in turn in the same call (the copy
# bandwidth measured once, after the first): bench/flash_slice_fp8 is the slice in the released
# precision (FP8 dense with 128x128 scales, FP4 routed experts, the rest BF16/F32 as released).
# The stats line gives the bytes the placed weights take.
# (MODEL=DIR BACKEND=cpu CTXS="256 512" PREFILL=256 run the same on another config: a smoke test;
# TANDEM=path runs another build's binary)
set -e
N=${1:-64}
if [ -n "$MODELS" ]; then
    for M in $MODELS; do echo "== $M"; MODELS= MODEL=$M sh "$0" "$N"; done
    exit 0
fi
M=${MODEL:-bench/flash_slice}
S=128
V=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' $M/config.json)
T="${TANDEM:-./bin/tandem} generate --dummy-weights --model $M --backend ${BACKEND:-cuda} --ignore-eos --print-ids --stats"
ids() { awk -v n="$1" -v s="$2" -v v="$V" 'BEGIN { srand(s); for (i = 0; i < n; i++) printf "%d ", 2 + int(rand() * (v - 2)); print "" }'; }
secs() { sed -n 's/.* in \([0-9.]*\) s = .*/\1/p' | head -1; }
tps() { sed -n 's/.*= \([0-9.]*\) tokens\/s.*/\1/p' | head -1; }
[ "${BACKEND:-cuda}" = cuda ] && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
P=$(ids 64 1)
o=$($T --prompt-ids "$P" --max-tokens "$N" --max-ctx 4096 2>&1 >/dev/null)
echo "$o" | sed -n 's/^stats: backend .*, weights \(.*\) placed.*/weights on the device: \1/p'
R1=$(echo "$o" | sed -n 's/^stats: decode .*= \([0-9.]*\) tokens\/s.*/\1/p')
echo "decode batch 1: $R1 tokens/s ($(echo "$o" | tps) with the prefill step)"
J=/tmp/flash_prompts.jsonl
: > $J
for i in $(seq 1 64); do echo "{\"ids\": [$(ids 64 $i | sed 's/ *$//; s/ /, /g')]}" >> $J; done
# the GPU's SM clock and power while a batch decodes (nvidia-smi every 100 ms): a step that runs
# slower back to back than alone (session 31: 12.1 ms in the stream, 9.8 ms as one graph) may
# be a lower clock under sustained load (the samples span the whole run, its start-up included)
CLK=/tmp/flash_clocks.csv
for B in 8 64; do
    SMI=""
    if [ "${BACKEND:-cuda}" = cuda ] && command -v nvidia-smi > /dev/null; then
        nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits -lms 100 > $CLK &
        SMI=$!
    fi
    o=$(${TANDEM:-./bin/tandem} bench --dummy-weights --model $M --backend ${BACKEND:-cuda} --prompts $J \
        --n-prompts $B --batch $B --max-tokens "$N" --max-ctx 4096 2>&1)
    if [ -n "$SMI" ]; then kill $SMI 2>/dev/null || true; fi
    r=$(echo "$o" | sed -n 's/^bench: decode .*= \([0-9.]*\) tokens\/s.*/\1/p')
    echo "decode batch $B: $r tokens/s ($(echo "$o" | sed -n 's/^bench: .* output tokens .*= \([0-9.]*\) tokens\/s.*/\1/p') with the prefill steps; distinct prompts)"
    if [ -n "$SMI" ]; then
        sort -t, -k1n $CLK | awk -F, '{c[NR] = $1; if ($2 + 0 > w) w = $2 + 0} END {
            if (NR) printf "  SM clock while it ran: %d to %d MHz (median %d), power up to %.0f W (%d samples)\n",
                c[1], c[NR], c[int((NR + 1) / 2)], w, NR }'
    fi
done
# the bytes a batch-1 step reads (tools/step_bytes.py) and, on the GPU, the copy bandwidth
python3 tools/step_bytes.py $M/config.json --rows 1 --rate "$R1" $([ "${BACKEND:-cuda}" = cuda ] && echo --copy-bw)
PF=${PREFILL:-4096}
ids $PF 2 > /tmp/flash_prefill.ids
t=$($T --prompt-ids-file /tmp/flash_prefill.ids --max-tokens 1 --max-ctx $((PF + 8)) --max-batch-tokens $PF 2>&1 >/dev/null | secs)
echo "prefill $PF tokens: $t s = $(awk "BEGIN{printf \"%.0f\", $PF / $t}") tokens/s"
for C in ${CTXS:-4096 32768}; do
    ids $((C - S - 1)) 3 > /tmp/flash_ctx.ids
    d=$($T --prompt-ids-file /tmp/flash_ctx.ids --max-tokens $((S + 1)) --max-ctx $((C + 8)) 2>&1 >/dev/null | sed -n 's/^stats: decode [0-9]* tokens in \([0-9.]*\) s.*/\1/p')
    echo "context $C: decode step $(awk "BEGIN{printf \"%.3f\", $d * 1000 / $S}") ms (batch 1)"
done
