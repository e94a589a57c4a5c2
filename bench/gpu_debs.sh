#!/bin/sh
# gpu_debs.sh: the Debian packages a GPU host without them needs to build and run Tandem
# (headers and libraries of tools/install-deps.sh's libraries), downloaded here into DIR (an
# ignored folder: carry it to the device). bench/gpu_check.sh unpacks them there (dpkg -x) and
# builds with make DEPS=DIR/root, or only runs carried binaries with DIR/root's libraries.
#
# RUNTIME=1: the libraries alone (0.5 MB against 1.7), enough for carried binaries
# (bench/gpu_pack.sh): the working tree, the pack and these must stay within a call's 64 MiB.
#
#   sh bench/gpu_debs.sh .deb        # then carry .deb
set -e
DIR=${1:?usage: sh bench/gpu_debs.sh DIR}
mkdir -p "$DIR"
cd "$DIR"
PKGS="libjansson4 libxxhash0 libinih1 libpcre2-8-0 libutf8proc2 libmicrohttpd12"
[ -n "$RUNTIME" ] || PKGS="$PKGS libjansson-dev libxxhash-dev libinih-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev"
for p in $PKGS; do
    ls "${p}"_*.deb > /dev/null 2>&1 || apt-get download -q "$p"
done
ls -la
