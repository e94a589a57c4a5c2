#!/bin/sh
# fuzz.sh: build every tests/fuzz_*.c with clang's libFuzzer + ASan + UBSan against the C
# sources of the library, and run each for SECONDS (default 30). `make fuzz` runs this.
#
#   sh tests/fuzz.sh [SECONDS [TARGET...]]      e.g. sh tests/fuzz.sh 60 fuzz_tokjson
#
# Each target starts from its seeds, tests/fuzz/<target>/seed_*, copied into its working corpus
# build-fuzz/<target>.corpus (kept between runs), with the dictionary tests/fuzz/<target>.dict
# (the keys and names its parser knows). Without seeds libFuzzer must guess JSON byte by byte
# and stays in the first lines of the parser; the JSON targets also mutate the parsed tree
# (tests/fuzz_json.h). Crashes are written as build-fuzz/<target>-*.
set -e
SECONDS_EACH=${1:-30}
[ $# -gt 0 ] && shift
TARGETS=${*:-$(ls tests/fuzz_*.c | sed 's|tests/||; s|\.c$||')}
OUTDIR=build-fuzz
CFLAGS="-std=c11 -g -O1 -D_DEFAULT_SOURCE -I. -fsanitize=address,undefined -fno-sanitize-recover=all"
# the library's sources and link flags as the Makefile has them (CPU-only: no nvcc)
mkvar() { env -u MAKEFLAGS -u MAKELEVEL make -s --no-print-directory NVCC=/nonexistent "print-$1" | tail -1; }
LIBS=$(mkvar LDLIBS)
SRC=$(mkvar LIB_SRC)
ASM=$(mkvar LIB_ASM)
[ -n "$LIBS" ] && [ -n "$SRC" ] || { echo "fuzz: no sources or libraries from the Makefile"; exit 1; }
mkdir -p $OUTDIR/obj

# the library once, instrumented for coverage, shared by every target's link
echo "fuzz: building the library ($(echo $SRC | wc -w) files)"
echo $SRC | tr ' ' '\n' | xargs -P "$(nproc)" -I{} sh -c \
    'o='$OUTDIR'/obj/$(echo {} | tr / _).o; clang '"$CFLAGS"' -fsanitize=fuzzer-no-link -c -o $o {}'
for s in $ASM; do clang -c -o "$OUTDIR/obj/$(echo "$s" | tr / _).o" "$s"; done # the chat page
OBJ=$(for s in $SRC $ASM; do echo $OUTDIR/obj/$(echo $s | tr / _).o; done)

failed=
for name in $TARGETS; do
    clang $CFLAGS -fsanitize=fuzzer -o "$OUTDIR/$name" "tests/$name.c" $OBJ $LIBS
    corpus=$OUTDIR/$name.corpus
    mkdir -p "$corpus"
    if [ -d "tests/fuzz/$name" ]; then cp tests/fuzz/$name/seed_* "$corpus"/; fi
    dict=
    if [ -f "tests/fuzz/$name.dict" ]; then dict=-dict=tests/fuzz/$name.dict; fi
    echo "fuzz $name for $SECONDS_EACH s"
    "$OUTDIR/$name" -max_total_time="$SECONDS_EACH" -timeout=25 $dict \
        -artifact_prefix="$OUTDIR/$name-" "$corpus" > "$OUTDIR/$name.log" 2>&1 ||
        { tail -40 "$OUTDIR/$name.log"; failed="$failed $name"; continue; }
    tail -1 "$OUTDIR/$name.log"
done
# every target runs even when one fails; the failing input is $OUTDIR/<target>-crash-*
[ -z "$failed" ] || { echo "fuzz: failures in$failed"; exit 1; }
