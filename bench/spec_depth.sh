#!/bin/sh
# spec_depth.sh: what speculation costs and gains at V4-Flash's depth. bench/flash_depth is
# V4-Flash's shape (43 layers in its mix, hidden 4096, 64 x 512 heads, its attention, indexer
# and compressors, vocab 129280, FP8 dense and FP4 experts as released) with 192 of its 256
# routed experts a layer, as many as fit one H200 beside a drafter; its MTP layer; and
# bench/flash_depth/dspark, a 3-stage DSpark head of V4-Flash-0731's shape (block 5, Markov rank
# 256, captured layers 40-42). Weights are made on the GPU (--dummy-weights), so acceptance is
# synthetic (--synthetic-acceptance, lossy) at published V4-Flash rates:
#   DSpark: drafts 1-5 accepted with probability 0.82 0.67 0.55 0.45 0.37 (mean accepted length
#   3.86, vllm-project/vllm#46995); MTP k = 1: 0.80; MTP k = 3: 0.80 0.64 0.51 (0.8 a position).
# Those are the chances that position j is reached and accepted; the engine takes each draft's
# chance given the ones before it, P_j / P_(j-1).
# For none, MTP k = 1 and 3 and DSpark at each batch (64-token prompts of random ids, N new
# tokens each, as many prompts as the batch, tandem bench): tokens/s, the speedup over none,
# the mean accepted length, and the bandwidth bound of the speedup,
#   mean accepted length x t_decode / (t_verify + t_draft),
# each t the bytes of weights that step reads (tools/step_bytes.py: uniform routing over the
# rows) over the copy bandwidth measured in the same run.
#   sh bench/spec_depth.sh [N]   (N default 64; BATCHES="1 8 32 64", POLICIES="fixed adaptive",
#   ROWS=512 rows a step, MODEL=DIR, TANDEM=binary; BACKEND=cpu MODEL=models/tandem-tiny
#   BATCHES="1 2" N=8 is a smoke test, with the bandwidth taken as 1 TB/s)
set -e
N=${1:-64}
M=${MODEL:-bench/flash_depth}
B_LIST=${BATCHES:-1 8 32 64}
POLS=${POLICIES:-fixed adaptive}
T="${TANDEM:-./bin/tandem}"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
V=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' $M/config.json)
awk -v v="$V" 'BEGIN { srand(7); for (p = 0; p < 64; p++) { printf "{\"ids\": ["; for (i = 0; i < 64; i++) printf "%s%d", i ? ", " : "", 2 + int(rand() * (v - 2)); print "]}" } }' > $W/prompts.jsonl
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || true
# one configuration: tokens/s and mean accepted length from bench --csv
run() { # name batch policy flags...
    name=$1 b=$2 pol=$3
    shift 3
    np=$b; [ $np -lt 4 ] && np=4
    line=$($T bench --model $M --dummy-weights --backend ${BACKEND:-cuda} --prompts $W/prompts.jsonl \
        --n-prompts $np --max-tokens $N --batch $b --max-ctx 1024 --max-batch-tokens ${ROWS:-512} --csv \
        --draft-policy $pol "$@" 2>$W/err | tail -1)
    case "$line" in *,*) ;; *) echo "spec_depth: $name at batch $b failed:" >&2; cat $W/err >&2; exit 1 ;; esac
    echo "$name,$b,$pol,$(echo "$line" | awk -F, '{ print $10 "," $16 }')" >> $W/results.csv
    echo "$name batch $b ($pol): $(echo "$line" | awk -F, '{ print $10 " tokens/s, mean accepted length " $16 }')"
}
for b in $B_LIST; do run none $b fixed --draft none; done
for pol in $POLS; do
    for b in $B_LIST; do
        run mtp1 $b $pol --draft mtp --draft-tokens 1 --synthetic-acceptance 0.80
        run mtp3 $b $pol --draft mtp --draft-tokens 3 --synthetic-acceptance 0.80,0.80,0.797
        run dspark $b $pol --draft dspark --synthetic-acceptance 0.82,0.817,0.821,0.818,0.822
    done
done
python3 - "$M" "$W/results.csv" "${BACKEND:-cuda}" <<'PY'
import json, os, sys
sys.path.insert(0, "tools")
import step_bytes as sb
M, path = sys.argv[1], sys.argv[2]
c = json.load(open(os.path.join(M, "config.json")))
d = json.load(open(os.path.join(M, "dspark", "config.json")))
bw = sb.copy_bandwidth() if sys.argv[3] == "cuda" else 1e12
res = {}
for line in open(path):
    name, b, pol, tps, mal = line.strip().split(",")
    res[(name, int(b), pol)] = (float(tps), float(mal))
def t(nbytes):
    return nbytes / bw
def bound(name, B, L):
    dec = t(sb.target_bytes(c, B))
    if name == "dspark":
        k = d["dspark_block_size"]
        ver = t(sb.target_bytes(c, B * (k + 1)))
        dr = t(sb.dspark_bytes(c, d, B * k))
    else:
        k = 1 if name == "mtp1" else 3
        ver = t(sb.target_bytes(c, B * (k + 1)))
        # the catch-up over the committed rows (about L a sequence), then k - 1 chain steps
        dr = t(sb.mtp_bytes(c, max(1, round(B * L)))) + (k - 1) * t(sb.mtp_bytes(c, B))
    return L * dec / (ver + dr), dec
print(f"copy bandwidth {bw / 1e12:.2f} TB/s (read + write, torch); bounds from the bytes each step reads at it")
pols = sorted({p for (_, _, p) in res if p != "fixed"} | {"fixed"}, key=lambda p: p != "fixed")
batches = sorted({b for (_, b, _) in res})
for pol in pols:
    print(f"\n| batch | none tok/s (decode step at the bound, ms) | mtp k=1 | mtp k=3 | dspark |  ({pol})")
    print("|---|---|---|---|---|")
    for B in batches:
        base = res.get(("none", B, "fixed"))
        if not base:
            continue
        cells = []
        for name in ("mtp1", "mtp3", "dspark"):
            r = res.get((name, B, pol))
            if not r:
                cells.append("-")
                continue
            bd, dec = bound(name, B, r[1])
            x = r[0] / base[0]
            cells.append(f"{x:.2f}x of bound {bd:.2f}x ({100 * x / bd:.0f}%), L {r[1]:.2f}")
        _, dec = bound("mtp1", B, 1)
        print(f"| {B} | {base[0]:.1f} ({1000 * dec:.2f}) | " + " | ".join(cells) + " |")
PY
