#!/bin/sh
# gpu_pack.sh: bin/tandem, tests/test_gpu and bench/wr_probe built here with nvcc (no GPU needed),
# stripped and xz-compressed into build-cu/pack.tar.xz (about 9 MB; the two large binaries whole
# are about 50 MB, too much beside the working tree for a device call), for bench/gpu_check.sh:
# carry build-cu/pack.tar.xz and .deb (bench/gpu_debs.sh), and it unpacks them there, no build.
#   sh bench/gpu_pack.sh && git rev-parse HEAD
set -e
command -v nvcc > /dev/null || { echo "gpu_pack: no nvcc here"; exit 1; }
make -j"$(nproc)" BUILD=build-cu build-cu/tandem build-cu/tests/test_gpu
rm -rf build-cu/pk && mkdir -p build-cu/pk
nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I. bench/wr_probe.cu kernels/err.c \
    kernels/quant_ref.c -o build-cu/pk/wr_probe
cp build-cu/tandem build-cu/tests/test_gpu build-cu/pk/
strip build-cu/pk/tandem build-cu/pk/test_gpu build-cu/pk/wr_probe
git rev-parse HEAD > build-cu/pk/COMMIT
git diff --quiet HEAD -- . || echo "(uncommitted changes)" >> build-cu/pk/COMMIT
tar cf - -C build-cu/pk tandem test_gpu wr_probe COMMIT | xz -T"$(nproc)" -9e > build-cu/pack.tar.xz
ls -la build-cu/pack.tar.xz
