#!/usr/bin/env bash
# Make sure a Docker engine answers, for the docker-marked tests (tests/test_docker_integration.py).
# Idempotent: installs Debian's docker.io and debootstrap (for the local base image, made by the
# tests or `nox -s base_image`) when missing, starts dockerd in the background when no engine
# answers, then waits for it (up to 60 s). Needs root or sudo. dockerd's log: /var/log/dockerd.log.
set -euo pipefail
sudo=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "[install-docker] need root or sudo" >&2; exit 1; }
  sudo="sudo"
fi
missing=""
command -v dockerd >/dev/null 2>&1 || missing="$missing docker.io"
command -v debootstrap >/dev/null 2>&1 || missing="$missing debootstrap"
if [ -n "$missing" ]; then
  export DEBIAN_FRONTEND=noninteractive
  if ! $sudo apt-get install -y -q $missing; then
    $sudo apt-get update -q
    $sudo apt-get install -y -q $missing
  fi
fi
if $sudo docker info >/dev/null 2>&1; then
  echo "[install-docker] engine answers: $($sudo docker version --format '{{.Server.Version}}')"
  exit 0
fi
echo "[install-docker] starting dockerd (log: /var/log/dockerd.log)"
$sudo sh -c 'setsid nohup dockerd >/var/log/dockerd.log 2>&1 </dev/null &'
for _ in $(seq 60); do
  if $sudo docker info >/dev/null 2>&1; then
    echo "[install-docker] engine answers: $($sudo docker version --format '{{.Server.Version}}')"
    exit 0
  fi
  sleep 1
done
echo "[install-docker] dockerd did not answer within 60 s; its log ends:" >&2
$sudo tail -20 /var/log/dockerd.log >&2 || true
exit 1
