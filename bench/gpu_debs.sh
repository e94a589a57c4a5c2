#!/bin/sh
# gpu_debs.sh: the Debian packages a GPU host without them needs to build and run Tandem
# (headers and libraries of tools/install-deps.sh's libraries), downloaded here into DIR (an
# ignored folder: carry it to the device). bench/gpu_check.sh unpacks them there (dpkg -x) and
# builds with make DEPS=DIR/root, or only runs carried binaries with DIR/root's libraries.
#
#   sh bench/gpu_debs.sh .deb        # then carry .deb
set -e
DIR=${1:?usage: sh bench/gpu_debs.sh DIR}
mkdir -p "$DIR"
cd "$DIR"
for p in libjansson-dev libjansson4 libxxhash-dev libxxhash0 libinih-dev libinih1 libpcre2-dev \
    libpcre2-8-0 libutf8proc-dev libutf8proc2 libmicrohttpd-dev libmicrohttpd12; do
    ls "${p}"_*.deb > /dev/null 2>&1 || apt-get download -q "$p"
done
ls -la
