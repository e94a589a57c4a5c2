#!/bin/sh
# prefix.sh: the prefix cache on a shared system prompt: R requests, each an S-token prefix
# shared by all (the same random ids) and its own Q-token question, T tokens out each, run by
# `tandem bench` at batch B with the cache off (--prefix-blocks 0) and on (--prefix-blocks N):
# the time to first token (p50, p90; with batch 1 most of it is waiting for the slot, so the part
# from admission to the first token is printed too), tokens/s, and the share of prompt tokens
# the cache gave.
# With batch 1 every request after the first finds the prefix published; at larger batches the
# first wave prefills together (each publishes the same blocks) and later waves hit.
#   MODEL=models/tandem-tiny BACKEND=cpu S=768 R=8 sh bench/prefix.sh   (its context is 1024)
#   MODEL=bench/flash_slice S=4096 R=64 B=8 DUMMY=1 sh bench/prefix.sh     (on the GPU)
# TURNS=FILE runs conversations instead: each "turns" line of FILE (MT-Bench's) asks its first
# turn, then (tandem bench --turns 2) its second, the first turn and its reply as text before it,
# with the cache off and on: the second turns' time to first token and the share of their first
# turns' tokens (prompt and reply, T tokens) the cache gave (N: blocks, by default enough for
# every conversation's blocks and tail; DRAFT=mtp|dspark: with a drafter, whose window of 128
# tokens before a prompt's end a hit leaves to prefill). A model with a tokenizer:
#   TURNS=../shared/data/prompts/mt-bench.jsonl BACKEND=cpu R=8 B=8 T=256 sh bench/prefix.sh
set -e
M=${MODEL:-models/tandem-tiny}
S=${S:-2048}
Q=${Q:-64}
R=${R:-16}
B=${B:-1}
T=${T:-16}
N0=$N
N=${N:-$(( (S / 256 + 2) * 2 + 8 ))}
V=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' $M/config.json)
if [ -n "$TURNS" ]; then
    [ "${BACKEND:-cuda}" = cuda ] && nvidia-smi --query-gpu=name --format=csv,noheader
    T=${T:-256}
    echo "prefix.sh: $M, $R conversations of $TURNS, the second turn after the first, batch $B, $T tokens out"
    for P in 0 ${N0:-$((R * (2 * (T / 256) + 5) + 8))}; do
        o=$(${TANDEM:-./bin/tandem} bench --model $M --backend ${BACKEND:-cuda} --prompts "$TURNS" \
            --n-prompts $R --batch $B --max-tokens $T --max-ctx $((2 * T + 1024)) --turns 2 \
            --prefix-blocks $P ${DRAFT:+--draft $DRAFT} 2>&1) || true
        echo "prefix blocks $P: $(echo "$o" | sed -n 's/^bench: second turns: //p')"
        echo "$o" | grep -E "tandem:|error" || true
    done
    exit 0
fi
F=/tmp/prefix_bench.jsonl
awk -v s="$S" -v q="$Q" -v r="$R" -v v="$V" 'BEGIN {
    srand(11); for (i = 0; i < s; i++) sys[i] = 2 + int(rand() * (v - 2));
    for (p = 0; p < r; p++) {
        printf "{\"ids\": [";
        for (i = 0; i < s; i++) printf "%s%d", (i ? "," : ""), sys[i];
        for (i = 0; i < q; i++) printf ",%d", 2 + int(rand() * (v - 2));
        print "]}";
    }
}' > $F
D=""; [ -n "$DUMMY" ] && D=--dummy-weights
[ "${BACKEND:-cuda}" = cuda ] && nvidia-smi --query-gpu=name --format=csv,noheader
echo "prefix.sh: $M, $R requests of a shared $S-token prefix and their own $Q tokens, batch $B, $T tokens out"
for P in 0 $N; do
    o=$(${TANDEM:-./bin/tandem} bench $D --model $M --backend ${BACKEND:-cuda} --prompts $F \
        --n-prompts $R --batch $B --max-tokens $T --max-ctx $((S + Q + T + 16)) \
        --prefix-blocks $P 2>&1) || true
    ttft=$(echo "$o" | sed -n 's/^bench: time to first token p50 \([0-9.]*\) s p90 \([0-9.]*\) s.*/p50 \1 s, p90 \2 s/p')
    pre=$(echo "$o" | sed -n 's/^bench: of the first token.s time, .* prefill p50 \([0-9.]*\) s p90 \([0-9.]*\) s/p50 \1 s, p90 \2 s/p')
    tps=$(echo "$o" | sed -n 's/^bench: .* output tokens in .* = \([0-9.]*\) tokens\/s.*/\1/p')
    hit=$(echo "$o" | sed -n 's/^bench: prefix cache: \([0-9]* of [0-9]* prompt tokens from the cache ([0-9.]*%)\).*/\1/p')
    echo "prefix blocks $P: time to first token $ttft (of it admitted to first token $pre); $tps tokens/s${hit:+; $hit}"
    echo "$o" | grep -E "tandem:|error" || true
done
