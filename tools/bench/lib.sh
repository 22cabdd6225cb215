# Shared by the benchmark scripts in tools/bench (sourced, not run).

# SIGTERM to every pid in the array PIDS, then waits up to $1 tenths of a
# second for each to exit before SIGKILL, and reaps them all.
stop_pids() {
  local tenths=$1 pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq "$tenths"); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
}

# A loopback TCP port that was free a moment ago.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
