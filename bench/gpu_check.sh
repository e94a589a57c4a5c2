#!/bin/sh
# gpu_check.sh: what a session's first device call runs, as one command, so that the call reports
# everything even when a new kernel faults. Output to stdout and to $OUT/suite.log, $OUT/ab.log:
#   0. bench/wr_probe: the FP4 experts' register-operand tile (TD_MOE_WGMMA=2) alone
#   1. the GPU suite, every group in a process of its own (a fault or a hang ends only its
#      group; TD_TEST_GROUP_S=240 each), the off-by-default FP8 tensor-core case included
#   2. the 4096-token prefill of the Flash slice, released precision and BF16, by default and
#      with each switch that is off until the suite has checked it, one run each in turn,
#      PASSES times (default 2): the A/B in one binary on one card
#   3. PROFILE="ENV" (e.g. PROFILE="TD_MOE_WGMMA=2"): the released prefill by kernel under ENV
#      (bench/step_kernels.sh)
# Binaries: build-cu/pack.tar.xz when it is there (bench/gpu_pack.sh on a CPU host with nvcc;
# carry it), else bin/tandem and build/tests/test_gpu when both are there, else built here.
# DEBS=DIR: the .deb files of bench/gpu_debs.sh, unpacked into DIR/root for the build (make
# DEPS=DIR/root) and the libraries.
#   OUT=$OUT DEBS=.deb sh bench/gpu_check.sh       (carry .deb and build-cu/pack.tar.xz)
# SWITCHES="A;B=1 C=1;..." replaces the list below (each entry an environment; "-" the default).
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if [ -n "$DEBS" ]; then
    for f in "$DEBS"/*.deb; do dpkg -x "$f" "$DEBS/root"; done
    export LD_LIBRARY_PATH="$PWD/$DEBS/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
if [ -f build-cu/pack.tar.xz ]; then
    mkdir -p bin build/tests build-cu/pk
    xz -dc build-cu/pack.tar.xz | tar xf - -C build-cu/pk
    cp build-cu/pk/tandem bin/tandem && cp build-cu/pk/test_gpu build/tests/test_gpu
    mkdir -p build/bench && cp build-cu/pk/wr_probe build/bench/wr_probe
    echo "binaries of $(tr '\n' ' ' < build-cu/pk/COMMIT)(build-cu/pack.tar.xz)"
elif [ ! -x bin/tandem ] || [ ! -x build/tests/test_gpu ]; then
    echo "building (make -j$(nproc)${DEBS:+ DEPS=$DEBS/root})"
    make -j"$(nproc)" ${DEBS:+DEPS=$DEBS/root} bin/tandem build/tests/test_gpu > "$OUT/build.log" 2>&1 ||
        { tail -30 "$OUT/build.log"; exit 1; }
fi
# NCCL: a pack built here links libnccl.so.2 by this host's path; there, pip's (torch's) copy
NL=$(python3 -c 'import nvidia.nccl as n, os; print(os.path.join(list(n.__path__)[0], "lib"))' 2>/dev/null)
[ -n "$NL" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$NL"
ldd bin/tandem | grep "not found" && echo "gpu_check: bin/tandem misses the libraries above"

echo "== 0. the FP4 register-operand tile alone (bench/wr_probe.cu)"
[ -x build/bench/wr_probe ] || { mkdir -p build/bench && nvcc -std=c++17 -O3 \
    -gencode=arch=compute_90a,code=sm_90a -I. bench/wr_probe.cu kernels/err.c kernels/quant_ref.c \
    -o build/bench/wr_probe; }
timeout 120 build/bench/wr_probe

echo "== 1. the GPU suite"
start=$(date +%s)
TD_TEST_GROUP_S=${TD_TEST_GROUP_S:-240} TD_TEST_FP8_LT=1 sh tests/run.sh build build/tests/test_gpu \
    > "$OUT/suite.log" 2>&1
grep -v '^OK ' "$OUT/suite.log"
echo "suite: $(grep -c '^OK ' "$OUT/suite.log") OK, $(($(date +%s) - start)) s"

echo "== 2. the 4096-token prefill, one run each in turn (s for the prompt and one token)"
V=129280
awk -v v=$V 'BEGIN { srand(2); for (i = 0; i < 4096; i++) printf "%d ", 2 + int(rand() * (v - 2)); print "" }' \
    > /tmp/gpu_check.ids
SWITCHES=${SWITCHES:-"-;TD_MOE_WGMMA=2;TD_ATT_WGMMA=1;TD_ATT_STAGE=1;TD_ATT_RING=1;TD_ATT_RING=1 TD_ATT_STAGE=1;TD_MOE_WGMMA=2 TD_ATT_WGMMA=1"}
for M in bench/flash_slice_fp8 bench/flash_slice; do
    for pass in $(seq 1 "${PASSES:-2}"); do
        echo "$SWITCHES" | tr ';' '\n' | while read -r sw; do
            [ "$sw" = - ] && sw=
            # shellcheck disable=SC2086 # sw is a list of VAR=value words
            o=$(env $sw ./bin/tandem generate --dummy-weights --model $M --backend cuda \
                --ignore-eos --print-ids --stats --prompt-ids-file /tmp/gpu_check.ids \
                --max-tokens 1 --max-ctx 4104 --max-batch-tokens 4096 2>&1 >/dev/null)
            t=$(echo "$o" | sed -n 's/^stats: .* in \([0-9.]*\) s = .*/\1/p' | head -1)
            echo "$M pass $pass ${sw:-default}: ${t:+$t s}${t:-FAILED: $(echo "$o" | tail -1)}"
        done
    done
done | tee "$OUT/ab.log"

if [ -n "$PROFILE" ]; then
    echo "== 3. the released prefill by kernel, $PROFILE"
    # shellcheck disable=SC2086
    env $PROFILE PREFILL=4096 MODEL=bench/flash_slice_fp8 sh bench/step_kernels.sh 2>&1 | tail -40
fi
