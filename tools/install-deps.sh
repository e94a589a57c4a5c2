#!/bin/sh
# Installs every Debian package the build and the tests need. Idempotent.
set -e
# chromium: the chat page's test drives it headless (puppeteer-core, pinned in package.json)
PKGS="build-essential make libjansson-dev libxxhash-dev libinih-dev clang-format libpcre2-dev libutf8proc-dev libmicrohttpd-dev curl chromium"
missing=""
for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
# the server tests' clients run on Node (the official openai package, pinned in package.json);
# Debian's nodejs and npm unless a Node with npm is already installed
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    missing="$missing nodejs npm"
fi
if [ -n "$missing" ]; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi
