#!/bin/sh
# Runs every test binary given, counts its OK/FAIL/SKIP lines and prints one
# closing line "N passed, N failed, N skipped". A binary that exits non-zero
# without printing FAIL counts as one failure.
build=$1; shift
pass=0; fail=0; skip=0
for t in "$@"; do
    out=$("$t" 2>&1); rc=$?
    printf '%s\n' "$out"
    p=$(printf '%s\n' "$out" | grep -c '^OK ')
    f=$(printf '%s\n' "$out" | grep -c '^FAIL ')
    s=$(printf '%s\n' "$out" | grep -c '^SKIP ')
    if [ $rc -ne 0 ] && [ $rc -ne 77 ] && [ "$f" -eq 0 ]; then
        echo "FAIL $t exited with $rc"; f=1
    fi
    pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
done
echo "tests ($build): $pass passed, $fail failed, $skip skipped"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
