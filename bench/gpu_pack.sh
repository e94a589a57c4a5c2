#!/bin/sh
# gpu_pack.sh: bin/tandem and tests/test_gpu built here with nvcc (no GPU needed), stripped and
# xz-compressed into build-cu/pack.tar.xz (about 9 MB; both binaries whole are about 50 MB, too
# much beside the working tree for a device call), for bench/gpu_check.sh: carry
# build-cu/pack.tar.xz and .deb (bench/gpu_debs.sh), and it unpacks the pair there, no build.
#   sh bench/gpu_pack.sh && git rev-parse HEAD
set -e
command -v nvcc > /dev/null || { echo "gpu_pack: no nvcc here"; exit 1; }
make -j"$(nproc)" BUILD=build-cu build-cu/tandem build-cu/tests/test_gpu
rm -rf build-cu/pk && mkdir -p build-cu/pk
cp build-cu/tandem build-cu/tests/test_gpu build-cu/pk/
strip build-cu/pk/tandem build-cu/pk/test_gpu
git rev-parse HEAD > build-cu/pk/COMMIT
git diff --quiet HEAD -- . || echo "(uncommitted changes)" >> build-cu/pk/COMMIT
tar cf - -C build-cu/pk tandem test_gpu COMMIT | xz -T"$(nproc)" -9e > build-cu/pack.tar.xz
ls -la build-cu/pack.tar.xz
