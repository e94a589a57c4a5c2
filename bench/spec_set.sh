#!/bin/sh
# spec_set.sh: speculative decoding on models/tandem-tiny over a set of held-out prompts, one
# request at a time (batch 1, greedy, --ignore-eos): for --draft none / ngram / mtp (k = 1, 3)
# / dspark, the tokens/s over all prompts (sum of tokens / sum of generation seconds, from each
# run's --stats line), the speedup over none in the same run, and the mean accepted length
# (the mean of the prompts' own).
#   [BACKEND=cuda|cpu] [PROMPTS=bench/prompts/tiny_val.ids] [TANDEM=bin/tandem]
#   [DRAFTS="none;dspark"] sh bench/spec_set.sh [N_PROMPTS] [MAX_TOKENS]
# (TANDEM: another build's binary, for an A/B of two builds in one session; DRAFTS: the
# drafters to run, separated by ';', the first being the baseline of the ratios)
set -e
M=models/tandem-tiny
K=${1:-16}
N=${2:-128}
BK=${BACKEND:-cuda}
F=${PROMPTS:-bench/prompts/tiny_val.ids}
T=${TANDEM:-./bin/tandem}
DRAFTS=${DRAFTS:-none;ngram --draft-tokens 3;mtp --draft-tokens 1;mtp --draft-tokens 3;dspark}
if [ "$BK" = cuda ]; then nvidia-smi --query-gpu=name --format=csv,noheader; else
    echo "cpu: $(nproc) cores, $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)"; fi
echo "$K prompts of $F, $N new tokens each, batch 1, T = 0"
base=""
echo "$DRAFTS" | tr ';' '\n' | while read -r d; do
    head -n "$K" "$F" | while read -r P; do
        $T generate --backend "$BK" --model $M --prompt-ids "$P" --max-tokens "$N" \
            --ignore-eos --stats --print-ids --draft $d 2>&1 >/dev/null |
            sed -n 's/^stats: \([0-9]*\) tokens in \([0-9.]*\) s.*/\1 \2/p; s/^stats: mean accepted length \([0-9.]*\).*/L \1/p'
    done > /tmp/spec_set.$$
    r=$(awk '$1 == "L" { l += $2; k++; next } { t += $1; s += $2 } END { printf "%.1f %.3f", t / s, k ? l / k : 1 }' /tmp/spec_set.$$)
    tps=${r% *}
    [ -z "$base" ] && base=$tps
    echo "  $d: $tps tok/s ($(awk "BEGIN{printf \"%.2f\", $tps/$base}")x none), mean accepted length ${r#* }"
done
rm -f /tmp/spec_set.$$
