#!/usr/bin/env bash
# Install Debian's chromium for the browser tests (tests/test_html.py), if it is not there.
# Idempotent: does nothing when a chromium is already on PATH. Needs root or sudo.
# The tests drive it through playwright (the `test` extra) with executable_path, so no
# browser is downloaded; set CHROMIUM=/path/to/chromium to use another one.
set -euo pipefail
for name in ${CHROMIUM:-} chromium chromium-browser; do
  if command -v "$name" >/dev/null 2>&1; then
    echo "[install-chromium] found $(command -v "$name"): $("$name" --version 2>/dev/null || true)"
    exit 0
  fi
done
sudo=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "[install-chromium] need root or sudo" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
if ! $sudo apt-get install -y -q chromium; then
  $sudo apt-get update -q
  $sudo apt-get install -y -q chromium
fi
chromium --version
