#!/bin/sh
# tests/serve/run.sh: the server tests, driven by Node's test runner and the openai package.
# Installs the pinned packages (npm ci) when node_modules is missing or older than the lock,
# runs tests/serve/*.test.mjs (or the files given) one file at a time, and prints one line per
# test, "OK name" / "FAIL name: why" / "SKIP name", as tests/run.sh counts them. Exits 0 when
# nothing failed, 1 otherwise, 77 (skipped) when there is no node.
#
#   sh tests/serve/run.sh                                  # bin/tandem, models/tandem-tiny
#   TD_TANDEM=/path/to/tandem TD_MODEL=/path/to/model sh tests/serve/run.sh tests/serve/wire.test.mjs
cd "$(dirname "$0")/../.." || exit 1
if ! command -v node >/dev/null 2>&1; then
    echo "SKIP serve: no node in PATH"
    exit 77
fi
if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
    npm ci --no-audit --no-fund >&2 || { echo "FAIL serve: npm ci failed"; exit 1; }
fi
if [ $# -eq 0 ] && [ -n "$TD_TEST_QUICK" ]; then # the sanitizer run: the server's hard paths
    set -- tests/serve/wire.test.mjs tests/serve/disconnect.test.mjs \
        tests/serve/concurrency.test.mjs tests/serve/errors.test.mjs
fi
if [ $# -eq 0 ]; then set -- tests/serve/*.test.mjs; fi
limit=${TD_SERVE_TIMEOUT:-600}   # the whole run, seconds (each wait inside is bounded too)
out=$(mktemp) || exit 1
if command -v timeout >/dev/null 2>&1; then to="timeout -k 10 $limit"; else to=; fi
# the lines go out as they come (tee); the runner's exit status through a file
{ $to node --test --test-concurrency=1 --test-reporter=./tests/serve/reporter.mjs \
    --test-reporter-destination=stdout "$@"; echo $? >"$out.rc"; } | tee "$out"
rc=$(cat "$out.rc" 2>/dev/null || echo 1)
fails=$(grep -c '^FAIL ' "$out")
passes=$(grep -c '^OK ' "$out")
rm -f "$out" "$out.rc"
if [ "$rc" -ne 0 ] && [ "$fails" -eq 0 ]; then
    echo "FAIL serve: node --test exited with $rc after $passes passes"
    exit 1
fi
[ "$fails" -eq 0 ]
