#!/usr/bin/env bash
# `make test` calls this first: the viewer's end-to-end test drives a headless Chromium (Debian's packages
# chromium + chromium-driver). Installed when missing and possible (root, or sudo without a password);
# otherwise a message says what to run, and the viewer test fails with the same advice.
set -u
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "make test: chromium is missing and this is not a Debian/Ubuntu machine: install Chromium so that" \
    "'chromium' is on PATH (the viewer test needs it)" >&2
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
  else
    echo "make test: chromium is missing; run: sudo apt-get install -y chromium chromium-driver" >&2
    exit 0
  fi
fi
echo "make test: installing Debian's chromium and chromium-driver for the viewer test" >&2
if ! ($SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium chromium-driver >/dev/null); then
  echo "make test: could not install chromium; run: apt-get install -y chromium chromium-driver" >&2
fi
exit 0
