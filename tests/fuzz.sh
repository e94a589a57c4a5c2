#!/bin/sh
# fuzz.sh: build every tests/fuzz_*.c with clang's libFuzzer + ASan + UBSan against the C
# sources of the library, and run each for SECONDS (default 30). `make fuzz` runs this.
set -e
SECONDS_EACH=${1:-30}
OUTDIR=build-fuzz
mkdir -p $OUTDIR
SRC=$(ls engine/*.c kernels/*_ref.c kernels/elementwise_ref.c metadata/*.c draft/*.c verify/*.c | grep -v engine/main.c | sort -u)
for f in tests/fuzz_*.c; do
    name=$(basename "$f" .c)
    clang -std=c11 -g -O1 -D_DEFAULT_SOURCE -I. -fsanitize=fuzzer,address,undefined \
        -fno-sanitize-recover=all -o "$OUTDIR/$name" "$f" $SRC -ljansson -lpcre2-8 -lutf8proc -lm
    mkdir -p "$OUTDIR/$name.corpus"
    echo "fuzz $name for $SECONDS_EACH s"
    "$OUTDIR/$name" -max_total_time="$SECONDS_EACH" -max_len=4096 "$OUTDIR/$name.corpus" \
        > "$OUTDIR/$name.log" 2>&1 || { tail -40 "$OUTDIR/$name.log"; exit 1; }
    tail -1 "$OUTDIR/$name.log"
done
