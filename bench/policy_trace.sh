#!/bin/sh
# policy_trace.sh: where a speculative run's time goes, step by step: tandem bench on
# models/tandem-tiny with TD_POLICY_TRACE=2 for each drafter at one batch (default 32), each
# run's trace kept in DIR/policy_trace_D.txt and summarised by tools/policy_trace.py (steps by
# kind and row bucket, the phases' sums, the slowest steps), then each drafter's run beside
# none's by phase (prompt steps, the full batch's decode steps, the tail; --against).
#   [BACKEND=cuda|cpu] [PROMPTS_DIR=../shared/data/prompts] [SET=humaneval] [N=64 prompts]
#   [MAX_TOKENS=128] [DRAFTS="none mtp dspark"] [DIR=/tmp] sh bench/policy_trace.sh [BATCH]
set -e
BATCH=${1:-32}
PD=${PROMPTS_DIR:-../shared/data/prompts}
SET=${SET:-humaneval}
DIR=${DIR:-/tmp}
[ -f "$PD/$SET.jsonl" ] || { echo "policy_trace.sh: no $PD/$SET.jsonl (PROMPTS_DIR=...)" >&2; exit 1; }
for d in ${DRAFTS:-none mtp dspark}; do
    TD_POLICY_TRACE=2 ./bin/tandem bench --model models/tandem-tiny --prompts "$PD/$SET.jsonl" \
        --n-prompts "${N:-64}" --max-tokens "${MAX_TOKENS:-128}" --backend "${BACKEND:-cuda}" \
        --batch "$BATCH" --draft "$d" > "$DIR/policy_trace_$d.txt" 2>&1
done
for d in ${DRAFTS:-none mtp dspark}; do
    python3 tools/policy_trace.py "$DIR/policy_trace_$d.txt"
done
# each drafter's phases beside none's, where none ran too
for d in ${DRAFTS:-none mtp dspark}; do
    [ "$d" != none ] && [ -f "$DIR/policy_trace_none.txt" ] &&
        python3 tools/policy_trace.py "$DIR/policy_trace_$d.txt" --against "$DIR/policy_trace_none.txt"
done
exit 0
