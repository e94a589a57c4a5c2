#!/bin/sh
# tests/test_make.sh: the build notices a change of flags. An object compiled with other flags
# (a CPU-only build before nvcc or NCCL was found, CFLAGS=...) must be rebuilt, else a stale
# object links beside its replacement (comm.c's NCCL stubs beside comm_nccl.cu) and the link
# fails. Builds one object in a scratch build folder, then asks make (-q) whether it is up to
# date under the same and under other flags. One line per case, as tests/run.sh counts them.
#
#   sh tests/test_make.sh
cd "$(dirname "$0")/.." || exit 1
t=$(mktemp -d) || exit 1
trap 'rm -rf "$t"' EXIT
obj=$t/b/kernels/err.c.o
mk() { env -u MAKEFLAGS -u MAKELEVEL make --no-print-directory NVCC=/nonexistent BUILD="$t/b" "$@" "$obj" > "$t/log" 2>&1; }
fail=0
check() { # name, expected make -q status, flags...
    name=$1 want=$2; shift 2
    mk -q "$@"; got=$?
    if [ "$got" -eq "$want" ]; then echo "OK make_flags/$name"
    else echo "FAIL make_flags/$name: make -q exited $got, expected $want"; cat "$t/log"; fail=1; fi
}
if ! mk; then echo "FAIL make_flags/build: $(tail -3 "$t/log")"; exit 1; fi
check same_flags_up_to_date 0
check other_cflags_rebuild 1 CFLAGS="-O1 -g"
mk CFLAGS="-O1 -g" || { echo "FAIL make_flags/rebuild: $(tail -3 "$t/log")"; exit 1; }
check rebuilt_up_to_date 0 CFLAGS="-O1 -g"
check back_to_defaults_rebuild 1
exit $fail
