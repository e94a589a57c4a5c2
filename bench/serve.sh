#!/bin/sh
# bench/serve.sh: the serving benchmark on the GPU. Builds nothing: it runs the bin/tandem and
# build/bench/serve_load that are there (make bin/tandem build/bench/serve_load). For each drafter
# (none, dspark, auto) it starts `tandem serve --backend cuda`, drives it with serve_load at three
# Poisson rates and at a fixed concurrency, prints one markdown table (a row per drafter x load)
# and leaves every run's JSON, the server logs and the table in OUTDIR. Needs sh, sed, awk and
# python3 (the table, the compare arithmetic, the /metrics dump), no Node.
#
#   sh bench/serve.sh [OUTDIR]                 # the sweep (default OUTDIR .out/serve-<date>)
#   sh bench/serve.sh compare [OUTDIR]         # one client: tokens/s through the server at
#                                              # concurrency 1 vs tandem generate, same prompt
#                                              # and drafter, and their ratio
#
# Environment (defaults in brackets):
#   TANDEM [bin/tandem]  SERVE_LOAD [build/bench/serve_load]  MODEL [models/tandem-tiny]
#   BACKEND [cuda]
#   DATASET [shared/data/prompts/mt-bench.jsonl, else /work/shared/data/prompts/mt-bench.jsonl]
#   DRAFTERS ["none dspark auto"]  RATES ["8 32 128"]  CONC [64]  NUM_REQUESTS [256]
#   MAX_TOKENS [128]  ENDPOINT [chat]  TEMPERATURE [0]  IGNORE_EOS [1]  WARMUP [4]
#   GOODPUT [ttft:500,tpot:50]  SERVE_ARGS ["--max-seqs 64"]  READY_S [300]
#   compare: PROMPT [a fixed English sentence]  CMP_TOKENS [256]  CMP_RUNS [3]
set -u
cd "$(dirname "$0")/.." || exit 1

TANDEM=${TANDEM:-bin/tandem}
SERVE_LOAD=${SERVE_LOAD:-build/bench/serve_load}
MODEL=${MODEL:-models/tandem-tiny}
BACKEND=${BACKEND:-cuda}
DRAFTERS=${DRAFTERS:-none dspark auto}
RATES=${RATES:-8 32 128}
CONC=${CONC:-64}
NUM_REQUESTS=${NUM_REQUESTS:-256}
MAX_TOKENS=${MAX_TOKENS:-128}
ENDPOINT=${ENDPOINT:-chat}
TEMPERATURE=${TEMPERATURE:-0}
IGNORE_EOS=${IGNORE_EOS:-1}
WARMUP=${WARMUP:-4}
GOODPUT=${GOODPUT:-ttft:500,tpot:50}
SERVE_ARGS=${SERVE_ARGS:---max-seqs 64}
READY_S=${READY_S:-300}
PROMPT=${PROMPT:-In the beginning God created the heaven and the earth. And the earth was without form, and void}
CMP_TOKENS=${CMP_TOKENS:-256}
CMP_RUNS=${CMP_RUNS:-3}

mode=sweep
if [ "${1:-}" = compare ]; then mode=compare; shift; fi
OUT=${1:-.out/serve-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT" || exit 1

if [ -z "${DATASET:-}" ]; then
    for d in shared/data/prompts/mt-bench.jsonl /work/shared/data/prompts/mt-bench.jsonl; do
        if [ -f "$d" ]; then DATASET=$d; break; fi
    done
fi
[ -x "$TANDEM" ] || { echo "serve.sh: no $TANDEM (build it first)" >&2; exit 1; }
[ -x "$SERVE_LOAD" ] || { echo "serve.sh: no $SERVE_LOAD (make build/bench/serve_load first)" >&2; exit 1; }
command -v python3 >/dev/null 2>&1 || { echo "serve.sh: no python3" >&2; exit 1; }

SERVER_PID=
URL=
cleanup() { if [ -n "$SERVER_PID" ]; then kill -TERM "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null; fi; }
trap cleanup EXIT
trap 'exit 130' INT TERM

# start_server DRAFTER: starts tandem serve, sets SERVER_PID and URL (returns 1 on failure)
start_server() {
    d=$1
    err="$OUT/serve_$d.stderr"
    # shellcheck disable=SC2086
    "$TANDEM" serve --port 0 --backend "$BACKEND" --model "$MODEL" --draft "$d" $SERVE_ARGS \
        --set "log.file=$OUT/serve_$d.log" 2>"$err" &
    SERVER_PID=$!
    i=0
    while [ $i -lt $((READY_S * 5)) ]; do
        URL=$(sed -n 's#^tandem: serving [^ ]* on \(http://[^ ]*\) .*#\1#p' "$err" | head -1)
        [ -n "$URL" ] && return 0
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            echo "serve.sh: tandem serve --draft $d exited before it was ready:" >&2
            cat "$err" >&2
            SERVER_PID=
            return 1
        fi
        sleep 0.2
        i=$((i + 1))
    done
    echo "serve.sh: tandem serve --draft $d not ready within $READY_S s" >&2
    cat "$err" >&2
    return 1
}

stop_server() {
    [ -n "$SERVER_PID" ] || return 0
    kill -TERM "$SERVER_PID" 2>/dev/null
    wait "$SERVER_PID"
    rc=$?
    [ $rc -eq 0 ] || echo "serve.sh: tandem serve exited with $rc after SIGTERM" >&2
    SERVER_PID=
}

load() { # load JSON LABEL ARGS...: one serve_load run
    json=$1; label=$2; shift 2
    eos=; [ "$IGNORE_EOS" = 1 ] && eos=--ignore-eos
    # shellcheck disable=SC2086
    "$SERVE_LOAD" --url "$URL" --dataset "$DATASET" --endpoint "$ENDPOINT" \
        --num-requests "$NUM_REQUESTS" --max-tokens "$MAX_TOKENS" --temperature "$TEMPERATURE" $eos \
        --goodput "$GOODPUT" --seed 0 --warmup "$WARMUP" --label "$label" --quiet --json "$json" "$@" \
        >"${json%.json}.txt" 2>&1 || echo "serve.sh: serve_load failed for $label (see ${json%.json}.txt)" >&2
}

sweep() {
    [ -n "${DATASET:-}" ] && [ -f "$DATASET" ] || { echo "serve.sh: no dataset (set DATASET)" >&2; exit 1; }
    command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$OUT/gpu.txt" 2>&1
    for d in $DRAFTERS; do
        start_server "$d" || continue
        echo "serve.sh: --draft $d at $URL" >&2
        for r in $RATES; do
            load "$OUT/${d}_rate$r.json" "$d" --rate "$r"
        done
        load "$OUT/${d}_conc$CONC.json" "$d" --concurrency "$CONC"
        python3 -c 'import sys, urllib.request; sys.stdout.buffer.write(urllib.request.urlopen(sys.argv[1], timeout=10).read())' \
            "$URL/metrics" >"$OUT/serve_$d.metrics" 2>/dev/null
        stop_server
    done
    python3 - "$OUT" >"$OUT/table.md" <<'EOF'
import json, os, re, sys
d = sys.argv[1]
rows = [json.load(open(os.path.join(d, f))) for f in sorted(os.listdir(d))
        if re.search(r'_(rate|conc)[0-9.]+\.json$', f)]
order = ['none', 'dspark', 'auto']
def key(r):
    c = r['config']
    x = 1e9 + c['concurrency'] if c['concurrency'] else float(c['rate'])
    return (order.index(r['label']) if r['label'] in order else 99, r['label'] or '', x)
rows.sort(key=key)
def f(x, d=1):
    return 'n/a' if x is None else '%.*f' % (d, x)
print('| drafter | load | ok/failed | req/s | out tok/s | TTFT mean / p99 ms | TPOT mean / p99 ms '
      '| ITL p50 / p99 ms | E2E p50 / p99 ms | goodput req/s | acceptance | mean acc. len |')
print('|---|---|---|---|---|---|---|---|---|---|---|---|')
for r in rows:
    c, s = r['config'], r['speculation']
    load = 'conc %s' % c['concurrency'] if c['concurrency'] else '%s req/s' % c['rate']
    acc = f(s['acceptance_rate'], 3) if s and s['acceptance_rate'] is not None else '-'
    mal = f(s['mean_acceptance_length'], 2) if s and s['mean_acceptance_length'] is not None else '-'
    print('| %s | %s | %d/%d | %s | %s | %s / %s | %s / %s | %s / %s | %s / %s | %s | %s | %s |' % (
        r['label'], load, r['completed'], r['failed'], f(r['request_throughput'], 2),
        f(r['output_throughput'], 0), f(r['ttft_ms']['mean']), f(r['ttft_ms']['p99']),
        f(r['tpot_ms']['mean'], 2), f(r['tpot_ms']['p99'], 2), f(r['itl_ms']['p50'], 2),
        f(r['itl_ms']['p99'], 2), f(r['e2el_ms']['p50'], 0), f(r['e2el_ms']['p99'], 0),
        f(r['goodput'], 2), acc, mal))
if rows:
    c = rows[0]['config']
    print('\n%d runs; %s requests each, %s, max_tokens %s, temperature %s%s, dataset %s, goodput SLO %s ms, '
          'seed %s; TPOT = (E2E - TTFT) / (tokens - 1); acceptance = accepted / draft tokens, mean acc. '
          'len = 1 + accepted / drafts (from /metrics deltas).' % (
              len(rows), c['num_requests'], c['endpoint'], c['max_tokens'], c['temperature'],
              ', ignore_eos' if c['ignore_eos'] else '', os.path.basename(c['dataset']),
              json.dumps(c['goodput_slo_ms'], separators=(',', ':')), c['seed']))
EOF
    cat "$OUT/table.md"
    echo "serve.sh: JSON, logs and table.md in $OUT" >&2
}

compare() {
    ds="$OUT/compare_prompt.jsonl"
    python3 -c 'import json, sys; print(json.dumps({"turns": [sys.argv[1]]}))' "$PROMPT" >"$ds"
    echo "| drafter | server tok/s | generate tok/s | ratio | server decode tok/s | generate decode tok/s | ratio |"
    echo "|---|---|---|---|---|---|---|"
    for d in $DRAFTERS; do
        # tandem generate, CMP_RUNS times: the mean of its own tokens/s lines
        g_all=0; g_dec=0; n=0
        while [ $n -lt "$CMP_RUNS" ]; do
            s=$("$TANDEM" generate --backend "$BACKEND" --model "$MODEL" --draft "$d" "$PROMPT" \
                --max-tokens "$CMP_TOKENS" --ignore-eos --temperature 0 --stats --print-ids 2>&1 >/dev/null)
            a=$(printf '%s\n' "$s" | sed -n 's/^stats: [0-9]* tokens in .* = \([0-9.]*\) tokens\/s.*/\1/p' | head -1)
            b=$(printf '%s\n' "$s" | sed -n 's/^stats: decode .* = \([0-9.]*\) tokens\/s.*/\1/p' | head -1)
            [ -n "$a" ] || { echo "serve.sh: generate --draft $d gave no stats:" >&2; printf '%s\n' "$s" >&2; break; }
            g_all=$(awk "BEGIN{print $g_all + $a}"); g_dec=$(awk "BEGIN{print $g_dec + ${b:-0}}")
            n=$((n + 1))
        done
        [ $n -gt 0 ] || continue
        g_all=$(awk "BEGIN{printf \"%.1f\", $g_all / $n}"); g_dec=$(awk "BEGIN{printf \"%.1f\", $g_dec / $n}")
        # the same prompt through the server, one client, completions (the raw text, as generate
        # encodes it), CMP_RUNS requests after one warm-up
        start_server "$d" || continue
        json="$OUT/compare_$d.json"
        "$SERVE_LOAD" --url "$URL" --dataset "$ds" --endpoint completions --concurrency 1 \
            --num-requests "$CMP_RUNS" --max-tokens "$CMP_TOKENS" --temperature 0 --ignore-eos --warmup 1 \
            --label "$d" --quiet --save-requests --json "$json" >"$OUT/compare_$d.txt" 2>&1
        stop_server
        python3 - "$json" "$d" "$g_all" "$g_dec" <<'EOF' || echo "serve.sh: no server numbers for $d (see $OUT/compare_$d.txt)" >&2
import json, sys
r = json.load(open(sys.argv[1]))
ok = [q for q in r['requests'] if q['ok']]
tok, e2e = sum(q['output_tokens'] for q in ok), sum(q['e2el_ms'] for q in ok) / 1000
dtok, dt = sum(q['output_tokens'] - 1 for q in ok), sum(q['e2el_ms'] - q['ttft_ms'] for q in ok) / 1000
ga, gd = float(sys.argv[3]), float(sys.argv[4])
sa, sd = tok / e2e, dtok / dt
ratio = lambda a, b: '%.3f' % (a / b) if b > 0 else 'n/a'
print('| %s | %.1f | %.1f | %s | %.1f | %.1f | %s |' % (sys.argv[2], sa, ga, ratio(sa, ga), sd, gd, ratio(sd, gd)))
EOF
    done
    echo
    echo "one client, $CMP_TOKENS tokens (ignore_eos, greedy), the mean of $CMP_RUNS runs each; server tok/s = tokens / E2E of each request,"
    echo "decode = (tokens - 1) / (E2E - TTFT); generate's are its --stats lines (the engine loop, no model load)."
}

if [ $mode = compare ]; then compare; else sweep; fi
