#!/usr/bin/env bash
# The compose stack without Docker: real Kafka (KRaft, jars from Maven Central) and
# Debian's redis-server via scripts/services/, then the fleetplan processes on this machine.
#
#   scripts/stack-local.sh up       # start everything (idempotent), print where things are
#   scripts/stack-local.sh status   # which processes are running
#   scripts/stack-local.sh logs     # tail every process log
#   scripts/stack-local.sh down     # stop the fleetplan processes (by pid file; Kafka and
#                                   # Redis keep running: scripts/services/down.sh stops them)
#
# Settings (environment): FLEETPLAN_STACK_DIR (default out/stack), FLEETPLAN_DEPLOYMENT
# (default demo), FLEETPLAN_STACK_BACKEND (virtual | log; default virtual).
# Metrics: bridge :9464, connector :9465, worker :9466 (Prometheus and Grafana are
# compose-only; point your own at these ports).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUN="${FLEETPLAN_STACK_DIR:-$ROOT/out/stack}"
DEPLOYMENT="${FLEETPLAN_DEPLOYMENT:-demo}"
BACKEND="${FLEETPLAN_STACK_BACKEND:-virtual}"
BIN="$ROOT/.venv/bin"
export FLEETPLAN_KAFKA_BOOTSTRAP="127.0.0.1:${FLEETPLAN_KAFKA_PORT:-19092}"
export FLEETPLAN_REDIS_URL="redis://127.0.0.1:${FLEETPLAN_REDIS_PORT:-16379}/0"

PROCESSES=(bridge worker connector fleet)

say() { printf '[stack] %s\n' "$*" >&2; }
die() {
  printf '[stack] ERROR: %s\n' "$*" >&2
  exit 1
}

command_of() {
  case "$1" in
    bridge) echo "$BIN/fleetplan bridge --pull tcp://127.0.0.1:5557 --sub bind:tcp://127.0.0.1:5556 --metrics-port 9464 --max-ahead 300" ;;
    worker) echo "$BIN/fleetplan worker --metrics-port 9466 --config $ROOT/examples/configs/quickstart.yaml --profile h200-llama3.1-8b" ;;
    connector) echo "$BIN/fleetplan connector --backend $BACKEND --metrics-port 9465 --instance-id local-connector" ;;
    fleet)
      # with the virtual backend the demo fleet scales to the live decisions (sim/follow.py);
      # with the log backend nothing is applied, so it is scaled by its own in-process planner
      local follow=""
      [[ "$BACKEND" == virtual ]] && follow="--policy fleetplan.sim.follow:FollowDecisions"
      echo "$BIN/fleetplan simulate --trace $ROOT/examples/traces/azure_conv_10min.csv --profile h200-llama3.1-8b --config $ROOT/examples/configs/quickstart.yaml --rate-scale 20 --deployment $DEPLOYMENT --publish tcp://127.0.0.1:5557 --realtime $follow" ;;
  esac
}

running() {
  local pidfile="$RUN/$1.pid"
  [[ -f "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

start_one() {
  local name="$1"
  if running "$name"; then
    say "$name already running (pid $(cat "$RUN/$name.pid"))"
    return
  fi
  # shellcheck disable=SC2046 # the command line is split on purpose
  (cd "$ROOT" && exec $(command_of "$name")) >>"$RUN/$name.log" 2>&1 &
  echo $! >"$RUN/$name.pid"
  sleep 1
  if ! running "$name"; then
    tail -n 20 "$RUN/$name.log" >&2 || true
    die "$name exited at start (log: ${RUN#"$ROOT"/}/$name.log)"
  fi
  say "$name started (pid $(cat "$RUN/$name.pid"), log ${RUN#"$ROOT"/}/$name.log)"
}

up() {
  [[ -x "$BIN/fleetplan" ]] || die "no virtualenv: run \`make install\` first"
  [[ "$BACKEND" == virtual || "$BACKEND" == log ]] || die "FLEETPLAN_STACK_BACKEND must be virtual or log"
  mkdir -p "$RUN"
  bash "$ROOT/scripts/services/up.sh"
  for name in "${PROCESSES[@]}"; do
    start_one "$name"
  done
  say "up: Kafka $FLEETPLAN_KAFKA_BOOTSTRAP, Redis $FLEETPLAN_REDIS_URL, deployment $DEPLOYMENT"
  say "metrics: http://127.0.0.1:9464/metrics (bridge), :9466 (worker), :9465 (connector)"
}

down() {
  local name pid
  for ((i = ${#PROCESSES[@]} - 1; i >= 0; i--)); do
    name="${PROCESSES[i]}"
    [[ -f "$RUN/$name.pid" ]] || continue
    pid="$(cat "$RUN/$name.pid")"
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid"
      for _ in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
      done
      kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
      say "$name stopped"
    fi
    rm -f "$RUN/$name.pid"
  done
}

status() {
  local name
  for name in "${PROCESSES[@]}"; do
    if running "$name"; then
      printf '%-13s running (pid %s)\n' "$name" "$(cat "$RUN/$name.pid")"
    else
      printf '%-13s stopped\n' "$name"
    fi
  done
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  logs) tail -n 50 -F "$RUN"/*.log ;;
  *) die "usage: $0 up|down|status|logs" ;;
esac
