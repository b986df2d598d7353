# Shared by kafka.sh and redis.sh (sourced, not run): logging, the pid-file
# process handling and the status report. The sourcing script sets SERVICE
# (the log prefix), PIDFILE, HOST, PORT and PROCESS_PATTERN (what the
# process's command line must contain, so a recycled pid is never ours).

say() { printf '[%s] %s\n' "$SERVICE" "$*" >&2; }
die() {
  printf '[%s] ERROR: %s\n' "$SERVICE" "$*" >&2
  exit 1
}

# Prints the pid of the server this script started, if it is still alive.
running_pid() {
  [[ -f "$PIDFILE" ]] || return 1
  local pid
  pid="$(cat "$PIDFILE" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "$PROCESS_PATTERN" || return 1
  echo "$pid"
}

port_open() { (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }

# stop_server GRACE_S: SIGTERM, then SIGKILL if it is alive after GRACE_S seconds.
stop_server() {
  local grace="$1" pid
  if ! pid="$(running_pid)"; then
    rm -f "$PIDFILE"
    say "not running"
    return 0
  fi
  say "stopping pid $pid ..."
  kill -TERM "$pid" 2>/dev/null || true
  local i
  for ((i = 0; i < grace * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    say "pid $pid still alive after $grace s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    sleep 0.5
  fi
  rm -f "$PIDFILE"
  say "stopped"
}

# report_status ANSWERS_CMD: exit 0 when our process runs and ANSWERS_CMD succeeds.
report_status() {
  local pid
  if pid="$(running_pid)" && "$1"; then
    say "running (pid $pid) on $HOST:$PORT"
    return 0
  fi
  say "not running"
  return 1
}
