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
set -e
M=${MODEL:-models/tandem-tiny}
S=${S:-2048}
Q=${Q:-64}
R=${R:-16}
B=${B:-1}
T=${T:-16}
N=${N:-$(( (S / 256 + 2) * 2 + 8 ))}
V=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' $M/config.json)
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
