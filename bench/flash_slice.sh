#!/bin/sh
# flash_slice.sh: the Flash-shaped slice of DeepSeek-V4 (bench/flash_slice/config.json: hidden
# 4096, 64 heads x 512, 256 experts top-6 x 2048 + shared, index 64 x 128 top-512, window 128,
# vocab 129280, layers HCA CSA HCA CSA; 27.3 G parameters, 54.6 GB in bf16) with weights made on
# the GPU (--dummy-weights). Prints, from one run each:
#   decode tokens/s at batch 1, 8 and 64 (64-token prompts, N new tokens, greedy, --ignore-eos):
#   the tokens after every completion's first over the time after it (the prefill step, which
#   reads nearly every expert, is timed apart below); the rate with it in brackets
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
for B in 1 8 64; do
    o=$($T --prompt-ids "$P" --max-tokens "$N" --n $B --max-ctx 4096 2>&1 >/dev/null)
    [ $B = 1 ] && echo "$o" | sed -n 's/^stats: backend .*, target weights \(.*\) placed/weights on the device: \1/p'
    r=$(echo "$o" | sed -n 's/^stats: decode .*= \([0-9.]*\) tokens\/s.*/\1/p')
    echo "decode batch $B: $r tokens/s ($(echo "$o" | tps) with the prefill step)"
    [ $B = 1 ] && R1=$r
done
python3 - "$M/config.json" "$R1" "${BACKEND:-cuda}" <<'PY'
import json, sys, time
c, rate = json.load(open(sys.argv[1])), float(sys.argv[2])
D, V, H, hd, qr = c["hidden_size"], c["vocab_size"], c["num_attention_heads"], c["head_dim"], c["q_lora_rank"]
og, orank, I, k = c["o_groups"], c["o_lora_rank"], c["moe_intermediate_size"], c["num_experts_per_tok"]
E, nc, IH, ihd = c["n_routed_experts"], c["hc_mult"], c["index_n_heads"], c["index_head_dim"]
# bytes an element: the released precision (quantization_config: FP8 dense with one scale byte
# per 128 x 128, routed experts by expert_dtype: FP4 with one per 32) or bf16
q = "quantization_config" in c
ex = c.get("expert_dtype", "fp4") if q else "bf16"
fp8 = 1 + 1 / 16384 if q else 2
fe = {"fp4": 0.5 + 1 / 32, "fp8": 1 + 1 / 16384}.get(ex, 2)
nbytes = 0
for r in c["compress_ratios"][:c["num_hidden_layers"]]:
    nbytes += fp8 * (qr * D + H * hd * qr + hd * D + H * hd * orank + D * og * orank)
    nbytes += 2 * E * D  # the router stays bf16
    nbytes += fe * k * 3 * I * D + fp8 * c.get("n_shared_experts", 1) * 3 * I * D
    if r:  # the compressor (CSA overlaps: two halves), bf16 as released
        nbytes += 2 * (2 if r == c["compress_rate_csa"] else 1) * 2 * hd * D
    if r == c["compress_rate_csa"]:  # indexer: q_b FP8, weights_proj and its compressor bf16
        nbytes += fp8 * IH * ihd * qr + 2 * (IH * D + 2 * 2 * ihd * D)
nbytes += 2 * V * D + 4 * 2 * (2 + nc) * nc * nc * D * c["num_hidden_layers"]
print(f"batch-1 step reads about {nbytes / 1e9:.2f} GB of weights: {nbytes * rate / 1e12:.2f} TB/s at {rate} tokens/s")
if sys.argv[3] == "cuda":
    import torch
    x = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    torch.cuda.synchronize()
    bw = 2 * x.numel() * 10 / (time.perf_counter() - t)
    print(f"device-to-device copy {bw / 1e12:.2f} TB/s (read + write): batch-1 decode reaches "
          f"{100 * nbytes * rate / bw:.0f}% of it")
PY
PF=${PREFILL:-4096}
ids $PF 2 > /tmp/flash_prefill.ids
t=$($T --prompt-ids-file /tmp/flash_prefill.ids --max-tokens 1 --max-ctx $((PF + 8)) --max-batch-tokens $PF 2>&1 >/dev/null | secs)
echo "prefill $PF tokens: $t s = $(awk "BEGIN{printf \"%.0f\", $PF / $t}") tokens/s"
for C in ${CTXS:-4096 32768}; do
    ids $((C - S - 1)) 3 > /tmp/flash_ctx.ids
    d=$($T --prompt-ids-file /tmp/flash_ctx.ids --max-tokens $((S + 1)) --max-ctx $((C + 8)) 2>&1 >/dev/null | sed -n 's/^stats: decode [0-9]* tokens in \([0-9.]*\) s.*/\1/p')
    echo "context $C: decode step $(awk "BEGIN{printf \"%.3f\", $d * 1000 / $S}") ms (batch 1)"
done
