#!/usr/bin/env bash
# Make sure a Docker engine answers, for the docker-marked tests (tests/test_docker_integration.py).
# Idempotent: installs Debian's docker.io and debootstrap (for the local base image, made by the
# tests or `nox -s base_image`) when missing, starts dockerd in the background when no engine
# answers (after removing pid files a killed dockerd left), then waits for it (up to 60 s).
# Needs root or sudo. dockerd's log: /var/log/dockerd.log.
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
# A dockerd that was killed (a machine reused between CI runs) leaves its pid files behind, and a
# new dockerd refuses to start while they name a pid: remove any whose pid is not a live (not
# zombie) dockerd/containerd; a pid can also have been reused by an unrelated process.
for pidfile in /var/run/docker.pid /var/run/docker/containerd/containerd.pid; do
  if $sudo test -f "$pidfile"; then
    pid="$($sudo cat "$pidfile" 2>/dev/null || true)"
    # /proc/PID/stat is "PID (COMM) STATE ...": read as root, no procps needed
    stat="$($sudo cat "/proc/${pid:-0}/stat" 2>/dev/null || true)"
    comm="${stat#*(}"; comm="${comm%%)*}"
    state="${stat##*) }"; state="${state%% *}"
    case "$state:$comm" in
      Z:*|:*) stale=1 ;;
      *:dockerd|*:containerd) stale=0 ;;
      *) stale=1 ;;
    esac
    if [ "$stale" = 1 ]; then
      what="not running"; [ -n "$stat" ] && what="$comm, state $state"
      echo "[install-docker] removing stale $pidfile (pid ${pid:-none}: $what)"
      $sudo rm -f "$pidfile"
    fi
  fi
done
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
