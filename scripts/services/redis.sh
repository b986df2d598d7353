#!/usr/bin/env bash
# Real Redis for the tests (Debian's redis-server) on 127.0.0.1, no persistence.
#
#   scripts/services/redis.sh install   # apt-get install redis-server if it is missing
#   scripts/services/redis.sh start     # install if needed, start, wait for PONG
#   scripts/services/redis.sh stop      # stop the server started by `start` (by its pid file)
#   scripts/services/redis.sh status    # exit 0 when it answers PING, 1 otherwise
#
# Every command is idempotent. Settings (environment):
#   FLEETPLAN_REDIS_PORT        port (default 16379)
#   FLEETPLAN_SERVICES_TIMEOUT  seconds to wait for readiness (default 120)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SVC="$ROOT/.services/redis"
PIDFILE="$SVC/redis.pid"
LOG="$SVC/redis.log"

HOST=127.0.0.1
PORT="${FLEETPLAN_REDIS_PORT:-16379}"
TIMEOUT="${FLEETPLAN_SERVICES_TIMEOUT:-120}"

SERVICE=redis
PROCESS_PATTERN='redis-server'
# shellcheck source=scripts/services/common.sh
source "$ROOT/scripts/services/common.sh"

as_root() {
  if [[ "$(id -u)" == 0 ]]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    die "installing redis-server needs root (or sudo): apt-get install -y redis-server"
  fi
}

install() {
  command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 && return 0
  command -v apt-get >/dev/null 2>&1 || die "redis-server is missing and apt-get is not available; install Redis 7+ by hand"
  say "installing redis-server with apt-get ..."
  local t0=$SECONDS
  export DEBIAN_FRONTEND=noninteractive
  mkdir -p "$ROOT/.services"
  if ! as_root apt-get install -y -q --no-install-recommends redis-server >"$ROOT/.services/apt.log" 2>&1; then
    say "apt-get install failed; running apt-get update and retrying"
    as_root apt-get update -q >>"$ROOT/.services/apt.log" 2>&1 || true
    if ! as_root apt-get install -y -q --no-install-recommends redis-server >>"$ROOT/.services/apt.log" 2>&1; then
      tail -n 20 "$ROOT/.services/apt.log" >&2 || true
      die "apt-get install redis-server failed (full log: .services/apt.log)"
    fi
  fi
  command -v redis-server >/dev/null 2>&1 || die "redis-server still not on PATH after apt-get install"
  say "installed $(redis-server --version | cut -d' ' -f3) in $((SECONDS - t0)) s"
}

ping() { [[ "$(redis-cli -h "$HOST" -p "$PORT" ping 2>/dev/null)" == PONG ]]; }

stop() { stop_server 10; }

start() {
  mkdir -p "$SVC"
  # fd 9 holds the lock; it is closed for redis-server (9>&- below) so the
  # lock ends with this script, not with the server.
  exec 9>"$SVC/.lock"
  flock -w 300 9 || die "timed out waiting for another redis.sh to finish (lock .services/redis/.lock)"

  install
  local pid
  if pid="$(running_pid)" && ping; then
    say "already running (pid $pid) on $HOST:$PORT"
    return 0
  fi
  if [[ -n "${pid:-}" ]]; then
    say "pid $pid is alive but does not answer; restarting it"
    stop
  fi
  rm -f "$PIDFILE"
  if port_open "$PORT"; then
    die "port $PORT on $HOST is already taken by another process (not started by this script). Free it, or set FLEETPLAN_REDIS_PORT (and FLEETPLAN_REDIS_URL for the tests)."
  fi

  : >"$LOG"
  redis-server --bind "$HOST" --port "$PORT" --daemonize yes \
    --dir "$SVC" --pidfile "$PIDFILE" --logfile "$LOG" \
    --save '' --appendonly no --databases 16 9>&- ||
    die "redis-server failed to start (see .services/redis/redis.log)"

  local deadline=$((SECONDS + TIMEOUT))
  until ping; do
    if ((SECONDS >= deadline)); then
      tail -n 30 "$LOG" >&2 || true
      die "redis did not answer PING on $HOST:$PORT within ${TIMEOUT} s (log above)"
    fi
    sleep 0.1
  done
  say "ready on $HOST:$PORT (pid $(cat "$PIDFILE"))"
}

status() { report_status ping; }

case "${1:-start}" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) die "usage: $0 {install|start|stop|status}" ;;
esac
