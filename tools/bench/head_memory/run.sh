#!/usr/bin/env bash
# The head's memory per replica at growing replica counts (issue 23): real
# troupe-node processes on 127.0.0.1, a head that hosts no replica and four
# workers, and deployments of 1,000 in-process Noop replicas each (a small
# cpu share each, one request at a time), deployed in one apply.
#
#   tools/bench/head_memory/run.sh [--build DIR] [--replicas "1000 3000 5000 10000"]
#
# For each count (a fresh cluster each time) it prints how long
# `troupectl deploy --wait` took, the head's resident memory before the
# deploy and its peak (VmHWM) once every proxy routes to every replica, and
# the growth per replica; then the same after a rolling update of every
# replica (a new `version`: each replica replaced, 20 % of a deployment at a
# time); then whether the growth per replica stayed at most 10 KiB (the
# goal) at every count, the rollout's peak included. Every process it starts is stopped on
# exit, also on failure or Ctrl-C.
set -euo pipefail

BUILD=""
COUNTS="1000 3000 5000 10000"
while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD="$2"; shift 2 ;;
    --replicas) COUNTS="$2"; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
BIN=${BUILD:-$ROOT/build}/bin
for c in $COUNTS; do
  if [ $((c % 1000)) -ne 0 ] || [ "$c" -le 0 ] || [ "$c" -gt 10000 ]; then
    echo "run.sh: --replicas takes multiples of 1000 up to 10000 (the head's default cap), not '$c'" >&2
    exit 2
  fi
done

WORK=$(mktemp -d /tmp/troupe-bench-head-memory.XXXXXX)
PIDS=()
# shellcheck source=tools/bench/lib.sh
. "$ROOT/tools/bench/lib.sh"
stop_all() {
  stop_pids 300
  PIDS=()
}
trap 'stop_all; rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM

kib() { awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status"; }
# Every proxy whose admin port is in $ADMIN_PORTS routes to $1 replicas in all.
routed_everywhere() {
  local port
  for port in $ADMIN_PORTS; do
    python3 - "$port" "$1" <<'PY' || return 1
import json, sys, urllib.request
port, want = sys.argv[1], int(sys.argv[2])
view = json.load(urllib.request.urlopen("http://127.0.0.1:%s/-/routes" % port, timeout=5))
sys.exit(0 if sum(len(d["replicas"]) for d in view["deployments"]) == want else 1)
PY
  done
}

# Applies config $1 (named $2 in errors) and waits until every proxy routes
# to $count replicas: sets TOOK (seconds of deploy --wait), PEAK (the head's
# VmHWM in KiB) and PER (bytes per replica above $before), and marks the goal
# missed when PER is over 10 KiB.
step() {
  local start
  start=$(date +%s.%N)
  if ! "${CTL[@]}" deploy "$1" --wait --wait-timeout 600 >"$1.log" 2>&1; then
    echo "run.sh: $2 of $count replicas failed:" >&2
    cat "$1.log" >&2
    exit 1
  fi
  TOOK=$(python3 -c "print('%.1f' % ($(date +%s.%N) - $start))")
  local deadline=$((SECONDS + 120))
  until routed_everywhere "$count"; do
    if [ $SECONDS -ge $deadline ]; then
      echo "run.sh: not every proxy routes to $count replicas 120 s after $2" >&2
      exit 1
    fi
    sleep 0.5
  done
  PEAK=$(kib "$HEAD_PID" VmHWM)
  PER=$(( (PEAK - before) * 1024 / count ))
  [ "$PER" -le 10240 ] || ALL_MET="not met"
}

ALL_MET=met
for count in $COUNTS; do
  dir="$WORK/$count"
  mkdir -p "$dir"
  CTL_PORT=$(free_port)
  HTTP_PORTS=$(free_port)
  ADMIN_PORTS=$(free_port)
  "$BIN/troupe-node" --head --port "$CTL_PORT" --state-dir "$dir/head" --http-port "$HTTP_PORTS" \
    --admin-port "$ADMIN_PORTS" --resources cpu=0.001 --log-level warn >"$dir/head.log" 2>&1 &
  HEAD_PID=$!
  PIDS+=("$HEAD_PID")
  for w in w1 w2 w3 w4; do
    port=$(free_port)
    admin_port=$(free_port)
    HTTP_PORTS="$HTTP_PORTS $port"
    ADMIN_PORTS="$ADMIN_PORTS $admin_port"
    "$BIN/troupe-node" --join "127.0.0.1:$CTL_PORT" --node-id "$w" --state-dir "$dir/$w" \
      --http-port "$port" --admin-port "$admin_port" --resources cpu=1000 --drain-delay 0 --log-level warn \
      >"$dir/$w.log" 2>&1 &
    PIDS+=($!)
  done
  CTL=("$BIN/troupectl" --address "127.0.0.1:$CTL_PORT" --timeout 60)
  deadline=$((SECONDS + 30))
  until [ "$("${CTL[@]}" nodes --json 2>/dev/null | grep -o '"ALIVE"' | wc -l)" = 5 ]; do
    if [ $SECONDS -ge $deadline ]; then
      echo "run.sh: the five nodes did not come up; logs in $dir" >&2
      cat "$dir"/*.log >&2
      exit 1
    fi
    sleep 0.2
  done
  for version in v1 v2; do
    {
    echo "applications:"
    for d in $(seq 1 $((count / 1000))); do
      cat <<YAML
  - name: n$d
    route_prefix: /n$d
    import_path: libtroupe_examples.so:Noop
    deployments:
      - name: Noop
        version: $version
        num_replicas: 1000
        max_ongoing_requests: 1
        resources: {cpu: 0.01}
        isolation: in_process
YAML
    done
    } >"$dir/deploy-$version.yaml"
  done
  before=$(kib "$HEAD_PID" VmRSS)
  step "$dir/deploy-v1.yaml" "the deploy"
  printf "%6d replicas: deploy --wait %5.1f s; head RSS %6d KiB before, peak %7d KiB; %6d bytes per replica\n" \
    "$count" "$TOOK" "$before" "$PEAK" "$PER"
  step "$dir/deploy-v2.yaml" "the rolling update"
  printf "%6d replicas: rolling update --wait %5.1f s; head peak since the start %7d KiB; %6d bytes per replica\n" \
    "$count" "$TOOK" "$PEAK" "$PER"
  stop_all
done
echo "goal: head memory <= 10 KiB per replica at every count ($COUNTS): $ALL_MET"
