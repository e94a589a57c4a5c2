#!/bin/sh
# tests/test_literals.sh: every compound literal of a struct names its fields.
# A positional (struct x){a, b, c} compiles just as well after someone reorders or inserts a
# field of the same type (td_plan_seq ends skip_logits, block; td_backend has to_device,
# to_host), and then silently fills the wrong ones. So each literal's first non-space
# character after the brace, on that line or the next non-blank one, must be '.' (designated)
# or the zero-fill "0}" (or "}"). One line per directory, as tests/run.sh counts them:
# "OK designated_literals/DIR" or "FAIL designated_literals/DIR: file:line literal ...".
# Exits 1 when anything failed, 0 otherwise.
#
#   sh tests/test_literals.sh
cd "$(dirname "$0")/.." || exit 1
fail=0
for dir in model kernels metadata draft verify engine tokenizer serve app bench tests; do
    [ -d "$dir" ] || continue
    files=$(find "$dir" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) |
        LC_ALL=C sort)
    [ -n "$files" ] || continue
    # shellcheck disable=SC2086 # the file names have no spaces
    bad=$(awk '
        function fine(t) { return t ~ /^\./ || t ~ /^0[ \t]*\}/ || t ~ /^\}/ }
        function show(t) { sub(/[; \t]+$/, "", t); return substr(t, 1, 24) }
        FNR == 1 { pend = 0 }
        {
            if (pend) { # the literal ended its line: its first field is on a later one
                t = $0; sub(/^[ \t]+/, "", t)
                if (t == "" || t ~ /^\/\//) next
                if (!fine(t)) printf "%s:%d %s%s\n", FILENAME, pl, plit, show(t)
                pend = 0
            }
            rest = $0
            while (match(rest, /\((const[ \t]+)?struct[ \t]+[A-Za-z_][A-Za-z0-9_]*[ \t]*\)[ \t]*\{/)) {
                lit = substr(rest, RSTART, RLENGTH)
                rest = substr(rest, RSTART + RLENGTH)
                t = rest; sub(/^[ \t]+/, "", t)
                if (t == "" || t ~ /^\/\//) { pend = 1; pl = FNR; plit = lit; break }
                if (!fine(t)) printf "%s:%d %s%s\n", FILENAME, FNR, lit, show(t)
            }
        }' $files)
    if [ -z "$bad" ]; then
        echo "OK designated_literals/$dir"
    else
        n=$(printf '%s\n' "$bad" | wc -l | tr -d ' ')
        echo "FAIL designated_literals/$dir: $n positional compound literal(s), name the fields: $(printf '%s\n' "$bad" | paste -sd ';' - | sed 's/;/; /g')"
        fail=1
    fi
done
exit $fail
