#!/usr/bin/env bash
# HTTP data-path benchmark: troupe's proxy against nginx and HAProxy, side by
# side in one run, on loopback. See README.md next to this script.
#
#   tools/bench/http/run.sh [--build DIR] [--duration S] [--connections N]
#
# Runs wrk (1 thread, N connections, S seconds, after a 2 s warm-up) against
#   (a) troupe proxy on node A -> a no-op deployment, all replicas on node A
#   (b) troupe proxy on node A -> the same, all replicas on node B
#   (c) nginx reverse-proxying to nginx
#   (d) HAProxy to nginx
#   (e) nginx answering directly (the ceiling)
# and prints requests/s, p50 and p99 for each, and the ratios troupe/peer.
# Environment: DEPLOYMENT (Noop: answers {"ok":true} like nginx in (e); Echo
# builds a JSON document of each request), REPLICAS (2), MAX_ONGOING (16),
# IO_THREADS (1) shape the troupe side; PROFILE_DIR=dir samples the troupe nodes with perf during
# (a) and (b). --only "a b" runs a subset.
# Installs wrk, nginx and haproxy with apt-get when they are missing. Every
# process it starts is stopped on exit, also on failure or Ctrl-C.
set -euo pipefail

BUILD=""
DURATION=8
CONNECTIONS=32
REPLICAS=${REPLICAS:-2}
MAX_ONGOING=${MAX_ONGOING:-16}
DEPLOYMENT=${DEPLOYMENT:-Noop}
IO_THREADS=${IO_THREADS:-1}
ONLY="a b c d e"
while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD="$2"; shift 2 ;;
    --duration) DURATION="$2"; shift 2 ;;
    --connections) CONNECTIONS="$2"; shift 2 ;;
    --only) ONLY="$2"; shift 2 ;;  # e.g. "a b": a subset of the cases (profiling)
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
BUILD="${BUILD:-$ROOT/build}"
BIN="$BUILD/bin"
for b in troupe-node troupectl; do
  if [ ! -x "$BIN/$b" ]; then
    echo "run.sh: $BIN/$b not found; build first (ninja -C $BUILD troupe-node troupectl troupe_examples)" >&2
    exit 2
  fi
done
if [ ! -f "$BUILD/plugins/libtroupe_examples.so" ]; then
  echo "run.sh: $BUILD/plugins/libtroupe_examples.so not found; build troupe_examples" >&2
  exit 2
fi

missing=()
command -v wrk >/dev/null || missing+=(wrk)
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing+=(nginx)
command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || missing+=(haproxy)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]} ..." >&2
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
HAPROXY=$(command -v haproxy || echo /usr/sbin/haproxy)

WORK=$(mktemp -d /tmp/troupe-bench-http.XXXXXX)
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
wait_http() {  # URL, seconds
  local deadline=$((SECONDS + $2))
  until curl -fsS -o /dev/null "$1" 2>/dev/null; do
    if [ $SECONDS -ge $deadline ]; then
      echo "run.sh: $1 did not answer within $2 s" >&2
      return 1
    fi
    sleep 0.2
  done
}

# --- nginx and HAProxy ----------------------------------------------------------
UP_PORT=$(free_port); NGX_PROXY_PORT=$(free_port); HAP_PORT=$(free_port)
start_nginx() {  # name, server block
  local dir="$WORK/$1"
  mkdir -p "$dir/logs"
  cat >"$dir/nginx.conf" <<CONF
worker_processes 1;
pid $dir/nginx.pid;
error_log $dir/logs/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $dir/body; proxy_temp_path $dir/proxy;
  fastcgi_temp_path $dir/fcgi; uwsgi_temp_path $dir/uwsgi; scgi_temp_path $dir/scgi;
  keepalive_requests 1000000;
  $2
}
CONF
  "$NGINX" -p "$dir" -c "$dir/nginx.conf" -g 'daemon off;' &
  PIDS+=($!)
}
start_nginx upstream "server { listen 127.0.0.1:$UP_PORT; location / { default_type application/json; return 200 '{\"ok\":true}'; } }"
start_nginx proxy "upstream up { server 127.0.0.1:$UP_PORT; keepalive 64; }
  server { listen 127.0.0.1:$NGX_PROXY_PORT; location / { proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection \"\"; } }"
cat >"$WORK/haproxy.cfg" <<CONF
global
  nbthread 1
  maxconn 4096
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
  option http-keep-alive
  http-reuse always
frontend fe
  bind 127.0.0.1:$HAP_PORT
  default_backend be
backend be
  server up 127.0.0.1:$UP_PORT
CONF
"$HAPROXY" -db -f "$WORK/haproxy.cfg" >"$WORK/haproxy.log" 2>&1 &
PIDS+=($!)

# --- troupe: node A (head) and node B ----------------------------------------------
CTL_PORT=$(free_port); A_PORT=$(free_port); B_PORT=$(free_port)
"$BIN/troupe-node" --head --port "$CTL_PORT" --state-dir "$WORK/a" --http-port "$A_PORT" \
  --resources cpu=2,nodea=1 --log-level warn --proxy-io-threads "$IO_THREADS" \
  >"$WORK/a.log" 2>&1 &
A_PID=$!
PIDS+=($A_PID)
"$BIN/troupe-node" --join "127.0.0.1:$CTL_PORT" --node-id b --state-dir "$WORK/b" \
  --http-port "$B_PORT" --resources cpu=2,nodeb=1 --log-level warn >"$WORK/b.log" 2>&1 &
B_PID=$!
PIDS+=($B_PID)
CTL=("$BIN/troupectl" --address "127.0.0.1:$CTL_PORT" --timeout 5)
deadline=$((SECONDS + 30))
until [ "$("${CTL[@]}" nodes --json 2>/dev/null | grep -o '"ALIVE"' | wc -l)" = 2 ]; do
  if [ $SECONDS -ge $deadline ]; then
    echo "run.sh: the two troupe nodes did not come up; logs:" >&2
    cat "$WORK/a.log" "$WORK/b.log" >&2
    exit 1
  fi
  sleep 0.2
done
cat >"$WORK/deploy.yaml" <<CONF
applications:
  - name: local
    route_prefix: /a
    import_path: libtroupe_examples.so:$DEPLOYMENT
    deployments:
      - name: $DEPLOYMENT
        num_replicas: $REPLICAS
        max_ongoing_requests: $MAX_ONGOING
        resources: {nodea: 0.01}
  - name: remote
    route_prefix: /b
    import_path: libtroupe_examples.so:$DEPLOYMENT
    deployments:
      - name: $DEPLOYMENT
        num_replicas: $REPLICAS
        max_ongoing_requests: $MAX_ONGOING
        resources: {nodeb: 0.01}
CONF
"${CTL[@]}" deploy "$WORK/deploy.yaml" --wait --wait-timeout 60 >"$WORK/deploy.log" 2>&1 || {
  echo "run.sh: deploy failed:" >&2
  cat "$WORK/deploy.log" "$WORK/a.log" "$WORK/b.log" >&2
  exit 1
}
wait_http "http://127.0.0.1:$A_PORT/a/x" 30
wait_http "http://127.0.0.1:$A_PORT/b/x" 30
wait_http "http://127.0.0.1:$UP_PORT/" 10
wait_http "http://127.0.0.1:$NGX_PROXY_PORT/" 10
wait_http "http://127.0.0.1:$HAP_PORT/" 10
# The replicas of (b) must all be on node B, those of (a) on node A.
placement=$("${CTL[@]}" status --json | python3 -c '
import json, sys
apps = json.load(sys.stdin)["applications"]
def nodes(app):
    return sorted({r["node"] for d in apps[app]["deployments"].values() for r in d["replicas"]})
print(",".join(nodes("local")) + " " + ",".join(nodes("remote")))')
if [ "$placement" != "head b" ]; then
  echo "run.sh: placement is off: /a served by [${placement% *}], /b by [${placement#* }]" >&2
  exit 1
fi

# --- measure ------------------------------------------------------------------------
to_ms() {  # wrk latency ("640.00us", "1.70ms", "1.02s") -> ms
  awk -v v="$1" 'BEGIN {
    if (v ~ /us$/) { sub(/us$/, "", v); printf "%.3f", v / 1000 }
    else if (v ~ /ms$/) { sub(/ms$/, "", v); printf "%.3f", v }
    else if (v ~ /s$/) { sub(/s$/, "", v); printf "%.3f", v * 1000 }
    else printf "nan" }'
}
declare -A RPS P50 P99 ERR
for k in a b c d e; do RPS[$k]=0; P50[$k]=0; P99[$k]=0; ERR[$k]=""; done
measure() {  # key, url
  wrk -t1 -c"$CONNECTIONS" -d2s "$2" >/dev/null 2>&1 || true
  local out perf_pid=""
  if [ -n "${PROFILE_DIR:-}" ] && { [ "$1" = a ] || [ "$1" = b ]; }; then
    # PROFILE_DIR=dir: sample both troupe nodes (cpu-clock, call graphs)
    # while wrk runs; reports land in dir/perf-<case>.txt.
    mkdir -p "$PROFILE_DIR"
    perf record -q -e cpu-clock -F 1999 -g -p "$A_PID,$B_PID" -o "$PROFILE_DIR/perf-$1.data" \
      -- sleep "$DURATION" >/dev/null 2>&1 &
    perf_pid=$!
  fi
  out=$(wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" --latency "$2")
  if [ -n "$perf_pid" ]; then
    wait "$perf_pid" || true
    perf report -i "$PROFILE_DIR/perf-$1.data" --stdio --no-children --sort comm,dso,sym \
      2>/dev/null | grep -v '^$' | head -400 >"$PROFILE_DIR/perf-$1.txt" || true
  fi
  echo "$out" >"$WORK/wrk-$1.txt"
  RPS[$1]=$(echo "$out" | awk '/^Requests\/sec:/ {printf "%.0f", $2}')
  P50[$1]=$(to_ms "$(echo "$out" | awk '$1 == "50%" {print $2}')")
  P99[$1]=$(to_ms "$(echo "$out" | awk '$1 == "99%" {print $2}')")
  local non2xx errors
  non2xx=$(echo "$out" | awk '/Non-2xx/ {print $NF}')
  errors=$(echo "$out" | awk '/Socket errors/ {print $0}')
  ERR[$1]="${non2xx:+non-2xx $non2xx }${errors}"
}
declare -A URL=([e]="http://127.0.0.1:$UP_PORT/" [c]="http://127.0.0.1:$NGX_PROXY_PORT/"
  [d]="http://127.0.0.1:$HAP_PORT/" [a]="http://127.0.0.1:$A_PORT/a/"
  [b]="http://127.0.0.1:$A_PORT/b/")
for k in e c d a b; do
  case " $ONLY " in *" $k "*) measure "$k" "${URL[$k]}" ;; *) RPS[$k]=0 ;; esac
done
curl -fsS "http://127.0.0.1:$A_PORT/-/metrics" >"$WORK/metrics.txt" || true

ratio() { awk -v x="$1" -v y="$2" 'BEGIN { if (y > 0) printf "%.2f", x / y; else printf "n/a" }'; }
echo
echo "wrk -t1 -c$CONNECTIONS -d${DURATION}s on 127.0.0.1 ($(nproc) cores); troupe: $REPLICAS $DEPLOYMENT replicas, max_ongoing_requests $MAX_ONGOING, $IO_THREADS proxy io thread(s)"
printf '%-46s %10s %9s %9s  %s\n' case "req/s" "p50 ms" "p99 ms" notes
for k in a b c d e; do
  case " $ONLY " in *" $k "*) ;; *) continue ;; esac
  case $k in
    a) name="(a) troupe proxy -> $DEPLOYMENT, same node" ;;
    b) name="(b) troupe proxy on A -> $DEPLOYMENT on node B" ;;
    c) name="(c) nginx -> nginx" ;;
    d) name="(d) HAProxy -> nginx" ;;
    e) name="(e) nginx direct (ceiling)" ;;
  esac
  printf '%-46s %10s %9s %9s  %s\n' "$name" "${RPS[$k]}" "${P50[$k]}" "${P99[$k]}" "${ERR[$k]}"
done
echo
echo "ratios: (a)/(d) HAProxy req/s $(ratio "${RPS[a]}" "${RPS[d]}"), p99 $(ratio "${P99[a]}" "${P99[d]}");" \
  "(a)/(c) nginx proxy req/s $(ratio "${RPS[a]}" "${RPS[c]}"), p99 $(ratio "${P99[a]}" "${P99[c]}");" \
  "(b)/(a) req/s $(ratio "${RPS[b]}" "${RPS[a]}"); (a)/(e) req/s $(ratio "${RPS[a]}" "${RPS[e]}")"
goal_a=$(awk -v a="${RPS[a]}" -v d="${RPS[d]}" -v pa="${P99[a]}" -v pd="${P99[d]}" \
  'BEGIN { print (a >= d && pa <= pd) ? "met" : "not met" }')
goal_b=$(awk -v a="${RPS[a]}" -v b="${RPS[b]}" 'BEGIN { print (b >= 0.7 * a) ? "met" : "not met" }')
echo "goal (a) >= 1.0x HAProxy req/s with p99 <= HAProxy's: $goal_a; goal (b) >= 0.7x (a): $goal_b"
