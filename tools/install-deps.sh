#!/bin/sh
# Installs every Debian package the build and the tests need. Idempotent.
set -e
PKGS="build-essential make libjansson-dev libxxhash-dev libinih-dev clang-format libpcre2-dev libutf8proc-dev"
missing=""
for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi
