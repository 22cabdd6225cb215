#!/usr/bin/env bash
# HTTP data-path benchmark: troupe's proxy against nginx and HAProxy, side by
# side in one run, on loopback. See README.md next to this script.
#
#   tools/bench/http/run.sh [--build DIR] [--duration S] [--connections N] [--only "a b t s p f g q c d e"]
#                           [--curve "1 8 32 128 512" | --no-curve] [--curve-duration S]
#                           [--rounds N]
#
# Runs wrk (1 thread, N connections, S seconds, after a 2 s warm-up) against
# a troupe cluster of a head (the controller; no replica, no traffic) and two
# workers A and B:
#   (a) troupe proxy on worker A -> a no-op deployment, all replicas on A,
#       isolation: in_process (the replicas run inside A's troupe-node)
#   (b) troupe proxy on worker A -> the same, all replicas on worker B,
#       isolation: in_process, between the two workers, not through the head
#       (checked before measuring: A's process holds a TCP connection to B's
#       peer port or B's to A's): over B's data port once A's proxy has it
#       (the row's note says how many requests went that way), else CAF
#   (t) the same as (b) in a second cluster that runs with --tls-dir (a CA
#       and node certificates made by troupectl certs): worker A' to worker
#       B' over B's data port over TLS (the row's note says how many
#       requests went that way); started only when --only has t
#   (s) the same as (a) over HTTPS: A's --https-port with a certificate of
#       a service CA made here with openssl (TLS 1.3, keep-alive: one
#       handshake per wrk connection)
#   (p) troupe proxy on node A -> the same, all replicas on node A,
#       isolation: process (each replica its own troupe-replica process,
#       reached over its data channel; the default isolation; (a') of the
#       data-path goals)
#   (f) troupe's defaults with a blocking handler: a cluster of its own (a
#       head that hosts nothing), a worker D with the node's defaults (the
#       access log on) hosting the Fixed example (a blocking handler
#       answering {"ok":true}, as users' handlers are) in process
#   (g) the same in replica processes (isolation: process, the default)
#   (q) the same as (f) on that cluster's other worker Q, which differs
#       only by --access-log off: 1 - (f)/(q) is the access log's cost
#   (c) nginx reverse-proxying to nginx
#   (d) HAProxy to nginx
#   (e) nginx answering directly (the ceiling)
# and prints requests/s, p50, p99 and the server side's CPU time per request
# for each, the ratios troupe/peer and the goals: (a) >= 1.3x HAProxy's req/s
# with p99 no higher, (a') = (p) >= 0.9x HAProxy, (b) >= 0.7x (a), the
# floor (p) >= 0.6x HAProxy, with TLS (t) >= 0.8x (b) and >= 0.7x (a), and
# HTTPS (s) >= 0.8x (a), the defaults (f) >= 1.2x and (g) >= 1.0x HAProxy
# with p99 no higher and the access log costing <= 5 %. Then the concurrency curve: req/s and p99 of (a),
# (p), HAProxy (d) and nginx (c) at each connection count of --curve (S
# seconds each, --curve-duration), and whether troupe's p99 grows no faster
# than HAProxy's from the fewest to the most connections: by how many ms it
# grows (the slope of the curve), with the factor printed beside it. (A
# factor would fail a proxy whose p99 is lower than HAProxy's at every point
# but lowest at one connection: a quarter of HAProxy's p99 there, half of it
# at 512, is twice HAProxy's factor.)
# Environment: DEPLOYMENT (Noop: answers {"ok":true} like nginx in (e); Echo
# builds a JSON document of each request), REPLICAS (2), MAX_ONGOING (16),
# IO_THREADS (1) shape the troupe side (the same for (a), (b) and (p));
# ACCESS_LOG (off, as nginx and HAProxy run here; on or errors) is the
# nodes' --access-log;
# RAW_DIR=dir keeps wrk's output of every case and round
# (dir/wrk-<case>-<round>.txt). In the defaults' cases the notes say how
# many loops were taken over during the case (a call that blocked, or a
# thread preempted, for 2 ms), from the node's metrics.
# PROFILE_DIR=dir samples the troupe nodes (and, in (p) and (g), the replica
# processes) with perf during (a), (b), (p), (t) and (g) (node D); SYSCALLS_DIR=dir
# counts both troupe-nodes' system calls in (a), (b) and (t), node D's in (g) (perf stat,
# per thread, in dir/stat-<case>.txt) and prints them per request.
# --only "a p d" runs a subset.
# --rounds N (default 1) measures every case N times, interleaved (round 1
# runs the cases in order, round 2 in reverse, and so on), and reports each
# case's median req/s, p50, p99 and CPU per request over the rounds, with
# every round's req/s and p99 on a line of their own. The machine's speed
# drifts during a run; interleaving spreads that drift over every case
# instead of charging it to whichever case ran during a slow spell.
# At the end the three troupe-nodes get SIGTERM; any that does not exit with
# status 0 is reported (node, exit status or signal).
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
ONLY="a b t s p f g q c d e"
CURVE="1 8 32 128 512"
CURVE_DURATION=4
ROUNDS=1
while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD="$2"; shift 2 ;;
    --duration) DURATION="$2"; shift 2 ;;
    --connections) CONNECTIONS="$2"; shift 2 ;;
    --only) ONLY="$2"; shift 2 ;;  # e.g. "a b": a subset of the cases (profiling)
    --curve) CURVE="$2"; shift 2 ;;
    --no-curve) CURVE=""; shift ;;
    --curve-duration) CURVE_DURATION="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
BUILD="${BUILD:-$ROOT/build}"
BIN="$BUILD/bin"
for b in troupe-node troupe-replica troupectl; do
  if [ ! -x "$BIN/$b" ]; then
    echo "run.sh: $BIN/$b not found; build first (cmake --build $BUILD --target troupe-node troupe-replica troupectl troupe_examples)" >&2
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
command -v openssl >/dev/null || missing+=(openssl)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]} ..." >&2
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if [ -n "${SYSCALLS_DIR:-}" ] && ! command -v perf >/dev/null; then
  echo "run.sh: SYSCALLS_DIR is set but perf is missing (Debian: apt-get install linux-perf);" \
    "not counting system calls" >&2
  SYSCALLS_DIR=""
fi
if [ -n "${PROFILE_DIR:-}" ] && ! command -v perf >/dev/null; then
  echo "run.sh: PROFILE_DIR is set but perf is missing (Debian: apt-get install linux-perf);" \
    "measuring without profiles" >&2
  PROFILE_DIR=""
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
HAPROXY=$(command -v haproxy || echo /usr/sbin/haproxy)

WORK=$(mktemp -d /tmp/troupe-bench-http.XXXXXX)
PIDS=()  # every process started here and not yet reaped (stop_nodes reaps the nodes)
# shellcheck source=tools/bench/lib.sh
. "$ROOT/tools/bench/lib.sh"
cleanup() {
  stop_pids 50
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_http() {  # URL, seconds
  local deadline=$((SECONDS + $2))
  # Each try bounded: a request that is never answered must not hang the run.
  until curl -fsS --max-time 5 -o /dev/null "$1" 2>/dev/null; do
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
  NGX_PID[$1]=$!
}
declare -A NGX_PID
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
HAP_PID=$!

# --- troupe: the head, worker A and worker B -------------------------------------
# ACCESS_LOG (off, like nginx's access_log above and HAProxy without a log
# section; on or errors to measure what the access log costs).
ACCESS_LOG=${ACCESS_LOG:-off}
CTL_PORT=$(free_port); H_PORT=$(free_port); A_PORT=$(free_port); B_PORT=$(free_port)
A_PEER_PORT=$(free_port); B_PEER_PORT=$(free_port); A_ADMIN_PORT=$(free_port)
A_HTTPS_PORT=$(free_port)
# (s): a service CA and a certificate for 127.0.0.1, as a user would make them.
mkdir -p "$WORK/svc"
( cd "$WORK/svc"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.crt \
    -days 2 -subj /CN=bench-ca 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout a.key -out a.csr \
    -subj /CN=127.0.0.1 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1\n' >a.ext
  openssl x509 -req -in a.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out a.crt -days 2 \
    -extfile a.ext 2>/dev/null )
"$BIN/troupe-node" --head --port "$CTL_PORT" --state-dir "$WORK/h" --http-port "$H_PORT" \
  --admin-port 0 --resources cpu=2 --log-level warn --access-log "$ACCESS_LOG" >"$WORK/h.log" 2>&1 &
H_PID=$!
PIDS+=("$H_PID")
"$BIN/troupe-node" --join "127.0.0.1:$CTL_PORT" --node-id a --state-dir "$WORK/a" \
  --http-port "$A_PORT" --admin-port "$A_ADMIN_PORT" --https-port "$A_HTTPS_PORT" \
  --https-cert "$WORK/svc/a.crt" --https-key "$WORK/svc/a.key" --peer-port "$A_PEER_PORT" --resources cpu=2,nodea=1 --log-level warn \
  --access-log "$ACCESS_LOG" --proxy-io-threads "$IO_THREADS" >"$WORK/a.log" 2>&1 &
A_PID=$!
PIDS+=("$A_PID")
"$BIN/troupe-node" --join "127.0.0.1:$CTL_PORT" --node-id b --state-dir "$WORK/b" \
  --http-port "$B_PORT" --admin-port 0 --peer-port "$B_PEER_PORT" --resources cpu=2,nodeb=1 --log-level warn \
  --access-log "$ACCESS_LOG" >"$WORK/b.log" 2>&1 &
B_PID=$!
PIDS+=("$B_PID")
CTL=("$BIN/troupectl" --address "127.0.0.1:$CTL_PORT" --timeout 5)
# Waits up to 30 s until the controller that `troupectl "$@"` reaches
# counts three ALIVE nodes; otherwise prints the logs in NODE_LOGS and exits.
wait_three_alive() {
  local deadline=$((SECONDS + 30))
  until [ "$("$@" nodes --json 2>/dev/null | grep -o '"ALIVE"' | wc -l)" = 3 ]; do
    if [ $SECONDS -ge $deadline ]; then
      echo "run.sh: the three troupe nodes did not come up; logs:" >&2
      # shellcheck disable=SC2086
      cat $NODE_LOGS >&2
      exit 1
    fi
    sleep 0.2
  done
}
NODE_LOGS="$WORK/h.log $WORK/a.log $WORK/b.log" wait_three_alive "${CTL[@]}"
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
        isolation: in_process
  - name: remote
    route_prefix: /b
    import_path: libtroupe_examples.so:$DEPLOYMENT
    deployments:
      - name: $DEPLOYMENT
        num_replicas: $REPLICAS
        max_ongoing_requests: $MAX_ONGOING
        resources: {nodeb: 0.01}
        isolation: in_process
  - name: process
    route_prefix: /p
    import_path: libtroupe_examples.so:$DEPLOYMENT
    deployments:
      - name: $DEPLOYMENT
        num_replicas: $REPLICAS
        max_ongoing_requests: $MAX_ONGOING
        resources: {nodea: 0.01}
        isolation: process
CONF
"${CTL[@]}" deploy "$WORK/deploy.yaml" --wait --wait-timeout 60 >"$WORK/deploy.log" 2>&1 || {
  echo "run.sh: deploy failed:" >&2
  cat "$WORK/deploy.log" "$WORK/h.log" "$WORK/a.log" "$WORK/b.log" >&2
  exit 1
}
wait_http "http://127.0.0.1:$A_PORT/a/x" 30
wait_http "http://127.0.0.1:$A_PORT/b/x" 30
wait_http "http://127.0.0.1:$A_PORT/p/x" 30
wait_http "http://127.0.0.1:$UP_PORT/" 10
wait_http "http://127.0.0.1:$NGX_PROXY_PORT/" 10
wait_http "http://127.0.0.1:$HAP_PORT/" 10
# The replicas of (b) must all be on worker B, those of (a) and (p) on A,
# each deployment with the isolation it declares.
placement=$("${CTL[@]}" status --json | python3 -c '
import json, sys
apps = json.load(sys.stdin)["applications"]
def where(app):
    deps = apps[app]["deployments"].values()
    nodes = sorted({r["node"] for d in deps for r in d["replicas"]})
    return ",".join(nodes) + "/" + ",".join(sorted({d.get("isolation", "?") for d in deps}))
print(" ".join(where(a) for a in ("local", "remote", "process")))')
if [ "$placement" != "a/in_process b/in_process a/process" ]; then
  echo "run.sh: placement is off (node/isolation of /a /b /p): $placement" >&2
  exit 1
fi
# (b) goes over a direct connection between A and B: A's process holds an
# established TCP connection to B's peer port, or B's to A's (each connects
# to the other when both host replicas; CAF keeps one of the two).
direct_a_b() {
  python3 - "$A_PID" "$B_PEER_PORT" "$B_PID" "$A_PEER_PORT" <<'PY'
import os, sys
def sockets(pid):
    out = set()
    for fd in os.listdir("/proc/%s/fd" % pid):
        try:
            link = os.readlink("/proc/%s/fd/%s" % (pid, fd))
        except OSError:
            continue
        if link.startswith("socket:["):
            out.add(link[8:-1])
    return out
pairs = [(sockets(sys.argv[1]), "%04X" % int(sys.argv[2])),
         (sockets(sys.argv[3]), "%04X" % int(sys.argv[4]))]
n = 0
for line in open("/proc/net/tcp").readlines()[1:]:
    f = line.split()
    for inodes, port in pairs:
        if f[3] == "01" and f[2].endswith(":" + port) and f[9] in inodes:
            n += 1
print(n)
PY
}
deadline=$((SECONDS + 20))
until [ "$(direct_a_b)" -ge 1 ]; do
  if [ $SECONDS -ge $deadline ]; then
    echo "run.sh: workers A and B have no direct connection (peer ports $A_PEER_PORT, $B_PEER_PORT)" >&2
    grep -v "cannot reach the controller" "$WORK/a.log" "$WORK/b.log" >&2
    exit 1
  fi
  sleep 0.2
done
# (p) really runs in troupe-replica processes: node A's children.
# A node's replica processes (node A unless told), comma-separated.
replica_pids() { ps -o pid= --ppid "${1:-$A_PID}" 2>/dev/null | tr -s ' \n' ',' | sed 's/^,//; s/,$//'; }
n_children=$(ps -o comm= --ppid "$A_PID" | grep -c '^troupe-replica' || true)
if [ "$n_children" -ne "$REPLICAS" ]; then
  echo "run.sh: node A runs $n_children troupe-replica processes, expected $REPLICAS for /p" >&2
  exit 1
fi

# --- (t): a second cluster with TLS -------------------------------------------------
TH_PID=""; TA_PID=""; TB_PID=""
case " $ONLY " in
  *" t "*)
    CERTS="$WORK/certs"
    "$BIN/troupectl" certs init "$CERTS" >/dev/null
    for n in head ta tb; do "$BIN/troupectl" certs issue "$CERTS" --name "$n" --role node >/dev/null; done
    "$BIN/troupectl" certs issue "$CERTS" --name op --role operator >/dev/null
    TCTL_PORT=$(free_port); TH_PORT=$(free_port); TA_PORT=$(free_port); TB_PORT=$(free_port)
    TA_ADMIN_PORT=$(free_port)
    "$BIN/troupe-node" --head --port "$TCTL_PORT" --state-dir "$WORK/th" --http-port "$TH_PORT" \
      --admin-port 0 --tls-dir "$CERTS" --resources cpu=2 --log-level warn --access-log "$ACCESS_LOG" \
      >"$WORK/th.log" 2>&1 &
    TH_PID=$!
    PIDS+=("$TH_PID")
    "$BIN/troupe-node" --join "127.0.0.1:$TCTL_PORT" --node-id ta --state-dir "$WORK/ta" \
      --tls-dir "$CERTS" --http-port "$TA_PORT" --admin-port "$TA_ADMIN_PORT" --resources cpu=2,nodea=1 --log-level info \
      --access-log "$ACCESS_LOG" --proxy-io-threads "$IO_THREADS" >"$WORK/ta.log" 2>&1 &
    TA_PID=$!
    PIDS+=("$TA_PID")
    "$BIN/troupe-node" --join "127.0.0.1:$TCTL_PORT" --node-id tb --state-dir "$WORK/tb" \
      --tls-dir "$CERTS" --http-port "$TB_PORT" --admin-port 0 --resources cpu=2,nodeb=1 --log-level info \
      --access-log "$ACCESS_LOG" >"$WORK/tb.log" 2>&1 &
    TB_PID=$!
    PIDS+=("$TB_PID")
    TCTL=("$BIN/troupectl" --address "127.0.0.1:$TCTL_PORT" --tls-dir "$CERTS" --tls-name op --timeout 5)
    NODE_LOGS="$WORK/th.log $WORK/ta.log $WORK/tb.log" wait_three_alive "${TCTL[@]}"
    # Only the application on B': A' has nothing of its own.
    python3 - "$WORK/deploy.yaml" "$WORK/deploy-tls.yaml" <<'PY'
import sys
text = open(sys.argv[1]).read()
start = text.index("  - name: remote")
end = text.index("  - name: process")
open(sys.argv[2], "w").write("applications:\n" + text[start:end])
PY
    "${TCTL[@]}" deploy "$WORK/deploy-tls.yaml" --wait --wait-timeout 60 >"$WORK/deploy-tls.log" 2>&1 || {
      echo "run.sh: deploy on the TLS cluster failed:" >&2
      cat "$WORK/deploy-tls.log" "$WORK/th.log" "$WORK/ta.log" "$WORK/tb.log" >&2
      exit 1
    }
    wait_http "http://127.0.0.1:$TA_PORT/b/x" 30
    # A' reaches B's replicas over B's data port, with TLS, before measuring.
    deadline=$((SECONDS + 20))
    until grep -q "data port connection to node tb at .*, TLS)" "$WORK/ta.log"; do
      if [ $SECONDS -ge $deadline ]; then
        echo "run.sh: node A' opened no TLS data port connection to B'; logs:" >&2
        cat "$WORK/ta.log" "$WORK/tb.log" >&2
        exit 1
      fi
      curl -fsS -o /dev/null "http://127.0.0.1:$TA_PORT/b/x" || true
      sleep 0.2
    done
    ;;
esac

# --- (f), (g), (q): troupe's defaults with a blocking handler -----------------------
# A cluster of its own: a head that hosts nothing, a worker D that runs with
# the node's defaults (the access log on, log level info) and hosts the
# replicas, and a worker Q that differs only by --access-log off (both
# workers: the head's own work does not weigh on one side of 1 - (f)/(q)):
# (f) Fixed in process on D, (g) Fixed in
# replica processes on D (the default isolation), (q) the same as (f) on Q,
# which gives the access log's cost. Fixed's handler is blocking (the
# default), as users' handlers are: it runs inline (on the proxy's io
# thread in process, on its process's request loop) only while its calls
# stay short.
D0_PID=""; DH_PID=""; DQ_PID=""
case " $ONLY " in
  *" f "*|*" g "*|*" q "*)
    DCTL_PORT=$(free_port); D_PORT=$(free_port); Q_PORT=$(free_port)
    D_ADMIN_PORT=$(free_port); Q_ADMIN_PORT=$(free_port)
    "$BIN/troupe-node" --head --port "$DCTL_PORT" --state-dir "$WORK/d0" \
      --http-port "$(free_port)" --admin-port 0 --resources cpu=1 >"$WORK/d0.log" 2>&1 &
    D0_PID=$!
    PIDS+=("$D0_PID")
    "$BIN/troupe-node" --join "127.0.0.1:$DCTL_PORT" --node-id d --state-dir "$WORK/dh" \
      --http-port "$D_PORT" --admin-port "$D_ADMIN_PORT" --resources cpu=2,noded=1 >"$WORK/dh.log" 2>&1 &
    DH_PID=$!
    PIDS+=("$DH_PID")
    "$BIN/troupe-node" --join "127.0.0.1:$DCTL_PORT" --node-id q --state-dir "$WORK/dq" \
      --http-port "$Q_PORT" --admin-port "$Q_ADMIN_PORT" --resources cpu=2,nodeq=1 --access-log off \
      >"$WORK/dq.log" 2>&1 &
    DQ_PID=$!
    PIDS+=("$DQ_PID")
    DCTL=("$BIN/troupectl" --address "127.0.0.1:$DCTL_PORT" --timeout 5)
    deadline=$((SECONDS + 30))
    until [ "$("${DCTL[@]}" nodes --json 2>/dev/null | grep -o '"ALIVE"' | wc -l)" = 3 ]; do
      if [ $SECONDS -ge $deadline ]; then
        echo "run.sh: the defaults cluster did not come up; logs:" >&2
        cat "$WORK/d0.log" "$WORK/dh.log" "$WORK/dq.log" >&2
        exit 1
      fi
      sleep 0.2
    done
    cat >"$WORK/deploy-defaults.yaml" <<CONF
applications:
  - name: fixed-in-process
    route_prefix: /f
    import_path: libtroupe_examples.so:Fixed
    deployments:
      - name: Fixed
        num_replicas: $REPLICAS
        max_ongoing_requests: $MAX_ONGOING
        resources: {noded: 0.01}
        isolation: in_process
  - name: fixed
    route_prefix: /g
    import_path: libtroupe_examples.so:Fixed
    deployments:
      - name: Fixed
        num_replicas: $REPLICAS
        max_ongoing_requests: $MAX_ONGOING
        resources: {noded: 0.01}
  - name: fixed-quiet
    route_prefix: /q
    import_path: libtroupe_examples.so:Fixed
    deployments:
      - name: Fixed
        num_replicas: $REPLICAS
        max_ongoing_requests: $MAX_ONGOING
        resources: {nodeq: 0.01}
        isolation: in_process
CONF
    "${DCTL[@]}" deploy "$WORK/deploy-defaults.yaml" --wait --wait-timeout 60 \
      >"$WORK/deploy-defaults.log" 2>&1 || {
      echo "run.sh: deploy on the defaults cluster failed:" >&2
      cat "$WORK/deploy-defaults.log" "$WORK/d0.log" "$WORK/dh.log" "$WORK/dq.log" >&2
      exit 1
    }
    wait_http "http://127.0.0.1:$D_PORT/f/x" 30
    wait_http "http://127.0.0.1:$D_PORT/g/x" 30
    wait_http "http://127.0.0.1:$Q_PORT/q/x" 30
    n_children=$(ps -o comm= --ppid "$DH_PID" | grep -c '^troupe-replica' || true)
    if [ "$n_children" -ne "$REPLICAS" ]; then
      echo "run.sh: node D runs $n_children troupe-replica processes, expected $REPLICAS for /g" >&2
      exit 1
    fi
    ;;
esac

# --- measure ------------------------------------------------------------------------
to_ms() {  # wrk latency ("640.00us", "1.70ms", "1.02s") -> ms
  awk -v v="$1" 'BEGIN {
    if (v ~ /us$/) { sub(/us$/, "", v); printf "%.3f", v / 1000 }
    else if (v ~ /ms$/) { sub(/ms$/, "", v); printf "%.3f", v }
    else if (v ~ /s$/) { sub(/s$/, "", v); printf "%.3f", v * 1000 }
    else printf "nan" }'
}
declare -A RPS P50 P99 ERR CPU
for k in a b t s p f g q c d e; do RPS[$k]=0; P50[$k]=0; P99[$k]=0; ERR[$k]=""; CPU[$k]=""; done
# The server side of each case, for its CPU time per request: the processes
# and their children (nginx workers, troupe-replica processes).
server_pids() {  # key
  local roots p
  case $1 in
    a|b|p|s) roots="$A_PID $B_PID" ;;
    t) roots="$TA_PID $TB_PID" ;;
    f|g) roots="$DH_PID" ;;
    q) roots="$DQ_PID" ;;
    c) roots="${NGX_PID[proxy]} ${NGX_PID[upstream]}" ;;
    d) roots="$HAP_PID ${NGX_PID[upstream]}" ;;
    e) roots="${NGX_PID[upstream]}" ;;
  esac
  for p in $roots; do echo "$p"; ps -o pid= --ppid "$p" 2>/dev/null || true; done
}
cpu_ticks() {  # pids...: user + system clock ticks, all threads
  local p t=0 f
  for p in "$@"; do
    f=$(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null) || f=0
    t=$((t + ${f:-0}))
  done
  echo "$t"
}
CLK_TCK=$(getconf CLK_TCK)
measure() {  # key, url
  wrk -t1 -c"$CONNECTIONS" -d2s "$2" >/dev/null 2>&1 || true
  local out perf_pid="" spids t0 t1 n
  if [ -n "${PROFILE_DIR:-}" ] && case $1 in a|b|p|t|g) true ;; *) false ;; esac; then
    # PROFILE_DIR=dir: sample both troupe nodes (of the TLS cluster for
    # (t)) and node A's replica processes (cpu-clock, call graphs) while wrk
    # runs; reports land in dir/perf-<case>.txt (by thread name, library and
    # symbol) and dir/perf-<case>-threads.txt (by thread).
    mkdir -p "$PROFILE_DIR"
    local targets="$A_PID,$B_PID" rp
    [ "$1" = t ] && targets="$TA_PID,$TB_PID"
    rp=$(replica_pids)
    [ -n "$rp" ] && [ "$1" != t ] && targets="$targets,$rp"
    # (g): the defaults' node D and its replica processes.
    if [ "$1" = g ]; then
      targets="$DH_PID"
      rp=$(replica_pids "$DH_PID")
      [ -n "$rp" ] && targets="$targets,$rp"
    fi
    perf record -q -e cpu-clock -F 1999 -g -p "$targets" -o "$PROFILE_DIR/perf-$1.data" \
      -- sleep "$DURATION" >/dev/null 2>&1 &
    perf_pid=$!
  fi
  local stat_pid=""
  if [ -n "${SYSCALLS_DIR:-}" ] && case $1 in a|b|t|g) true ;; *) false ;; esac; then
    mkdir -p "$SYSCALLS_DIR"
    local st="$A_PID,$B_PID"
    [ "$1" = t ] && st="$TA_PID,$TB_PID"
    [ "$1" = g ] && st="$DH_PID"
    perf stat --per-thread -e raw_syscalls:sys_enter,syscalls:sys_enter_sendmsg,syscalls:sys_enter_sendto,syscalls:sys_enter_write,syscalls:sys_enter_writev,syscalls:sys_enter_read,syscalls:sys_enter_readv,syscalls:sys_enter_recvfrom,syscalls:sys_enter_recvmsg,syscalls:sys_enter_epoll_wait \
      -p "$st" -o "$SYSCALLS_DIR/stat-$1.txt" -- sleep "$DURATION" >/dev/null 2>&1 &
    stat_pid=$!
  fi
  spids=$(server_pids "$1")
  # shellcheck disable=SC2086
  t0=$(cpu_ticks $spids)
  out=$(wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" --latency "$2")
  # shellcheck disable=SC2086
  t1=$(cpu_ticks $spids)
  n=$(echo "$out" | awk '/ requests in / {print $1}')
  CPU[$1]=$(awk -v d=$((t1 - t0)) -v hz="$CLK_TCK" -v n="${n:-0}" \
    'BEGIN { if (n > 0) printf "%.1f", d * 1e6 / hz / n; else printf "n/a" }')
  [ -n "$stat_pid" ] && { wait "$stat_pid" || true; echo "requests $n" >>"$SYSCALLS_DIR/stat-$1.txt"; }
  if [ -n "$perf_pid" ]; then
    wait "$perf_pid" || true
    perf report -i "$PROFILE_DIR/perf-$1.data" --stdio --no-children --sort comm,dso,sym \
      2>/dev/null | grep -v '^$' | head -400 >"$PROFILE_DIR/perf-$1.txt" || true
    # perf's "pid" key is the thread (tid:name); ps maps threads to processes.
    # (CAF 0.17.6 names its scheduler workers "caf.multiplexer" too: the
    # middleman's multiplexer is the one started last.)
    { ps -L -o pid=,tid=,comm= -p "$targets" 2>/dev/null || true
      perf report -i "$PROFILE_DIR/perf-$1.data" --stdio --no-children --sort pid -g none \
        2>/dev/null | grep -v '^$' | head -80; } >"$PROFILE_DIR/perf-$1-threads.txt" || true
  fi
  echo "$out" >"$WORK/wrk-$1.txt"
  # RAW_DIR=dir keeps every case's wrk output of every round.
  [ -n "${RAW_DIR:-}" ] && { mkdir -p "$RAW_DIR"; echo "$out" >"$RAW_DIR/wrk-$1-${round:-1}.txt"; }
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
  [b]="http://127.0.0.1:$A_PORT/b/" [p]="http://127.0.0.1:$A_PORT/p/"
  [t]="http://127.0.0.1:${TA_PORT:-0}/b/" [s]="https://127.0.0.1:$A_HTTPS_PORT/a/"
  [f]="http://127.0.0.1:${D_PORT:-0}/f/" [g]="http://127.0.0.1:${D_PORT:-0}/g/"
  [q]="http://127.0.0.1:${Q_PORT:-0}/q/")
# Requests node A's proxy sent over other workers' data ports (worker to
# worker without CAF, proxy/peer_client.cpp): (b) says how many of its own did.
peer_sends() {  # [admin port of the node]
  curl -fsS "http://127.0.0.1:${1:-$A_ADMIN_PORT}/-/metrics" 2>/dev/null |
    awk '/^troupe_proxy_replica_sends_total\{transport="peer"\}/ {print $2}'
}
# Ratios and goals are judged on measured numbers only: a missing or failed
# measurement ("", "nan", "n/a", 0) makes them n/a, never "met".
AWK_NUM='function num(x) { return x ~ /^[0-9]+(\.[0-9]+)?$/ && x + 0 > 0 }'
# Loops taken over on a node so far: its proxy's io threads and its replica
# processes' request loops (a call that blocked, or a thread preempted, for
# 2 ms; runtime/loop_takeover.hpp).
takeovers() {  # admin port
  curl -fsS "http://127.0.0.1:$1/-/metrics" 2>/dev/null |
    awk '/^troupe_proxy_io_takeovers_total / || /^troupe_replica_loop_takeovers_total\{/ { n += $NF }
         END { printf "%d", n }'
}
case "$ROUNDS" in ''|*[!0-9]*|0) echo "run.sh: --rounds takes a positive whole number, not '$ROUNDS'" >&2; exit 2 ;; esac
declare -A R_RPS R_P50 R_P99 R_CPU  # "case:round" -> that round's figure
declare -A ERRS                      # case -> the notes of every round
ORDER="e c d a b t s p g f q"  # (f) next to (q): the access log's cost compares them
REVERSED=$(echo "$ORDER" | tr ' ' '\n' | tac | tr '\n' ' ')
for ((round = 1; round <= ROUNDS; round++)); do
  order=$ORDER
  [ $((round % 2)) -eq 0 ] && order=$REVERSED
  for k in $order; do
    case " $ONLY " in
      *" $k "*)
        [ "$k" = b ] && peer_before=$(peer_sends)
        [ "$k" = t ] && peer_before=$(peer_sends "$TA_ADMIN_PORT")
        case $k in f|g) takeovers_before=$(takeovers "$D_ADMIN_PORT") ;;
          q) takeovers_before=$(takeovers "$Q_ADMIN_PORT") ;; esac
        measure "$k" "${URL[$k]}"
        case $k in
          f|g|q)
            port=$D_ADMIN_PORT
            [ "$k" = q ] && port=$Q_ADMIN_PORT
            took=$(( $(takeovers "$port") - ${takeovers_before:-0} ))
            [ "$took" -gt 0 ] && ERR[$k]="${ERR[$k]}$took loop takeovers; "
            ;;
        esac
        if [ "$k" = b ]; then
          peer_after=$(peer_sends)
          ERR[b]="${ERR[b]}$((${peer_after:-0} - ${peer_before:-0})) sent over B's data port; "
        elif [ "$k" = t ]; then
          peer_after=$(peer_sends "$TA_ADMIN_PORT")
          ERR[t]="${ERR[t]}$((${peer_after:-0} - ${peer_before:-0})) sent over B's TLS data port; "
        fi
        R_RPS[$k:$round]=${RPS[$k]}
        R_P50[$k:$round]=${P50[$k]}
        R_P99[$k:$round]=${P99[$k]}
        R_CPU[$k:$round]=${CPU[$k]}
        ERRS[$k]="${ERRS[$k]:-}${ERR[$k]}"
        ;;
      *) RPS[$k]=0 ;;
    esac
  done
done
median() {  # values...: the median of the numeric ones ("n/a" if none)
  printf '%s\n' "$@" | awk '$1 ~ /^-?[0-9]+(\.[0-9]+)?$/' | sort -g |
    awk '{ v[NR] = $1 } END { if (NR == 0) print "n/a"
           else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
ROUND_LINES=()
if [ "$ROUNDS" -gt 1 ]; then
  for k in $ORDER; do
    case " $ONLY " in *" $k "*) ;; *) continue ;; esac
    rps=() p50=() p99=() cpu=()
    for ((round = 1; round <= ROUNDS; round++)); do
      rps+=("${R_RPS[$k:$round]}"); p50+=("${R_P50[$k:$round]}")
      p99+=("${R_P99[$k:$round]}"); cpu+=("${R_CPU[$k:$round]}")
    done
    RPS[$k]=$(median "${rps[@]}" | awk '{ printf ($1 ~ /^[0-9.]+$/) ? "%.0f" : "%s", $1 }')
    P50[$k]=$(median "${p50[@]}")
    P99[$k]=$(median "${p99[@]}")
    CPU[$k]=$(median "${cpu[@]}")
    ROUND_LINES+=("($k) req/s ${rps[*]}; p99 ms ${p99[*]}")
    ERR[$k]=${ERRS[$k]:-}
  done
  # The access log's cost from the pairs measured one right after the other:
  # 1 - (f)/(q) in each round, and their median.
  costs=()
  for ((round = 1; round <= ROUNDS; round++)); do
    costs+=("$(awk -v f="${R_RPS[f:$round]:-}" -v q="${R_RPS[q:$round]:-}" "$AWK_NUM"'
      BEGIN { if (num(f) && num(q)) printf "%.4f", 1 - f / q; else print "n/a" }')")
  done
  case " $ONLY " in *" f "*) has_f=1 ;; *) has_f=0 ;; esac
  case " $ONLY " in *" q "*) has_fq=$has_f ;; *) has_fq=0 ;; esac
  case $has_fq in
    1)
      LOG_COST_MEDIAN=$(median "${costs[@]}")
      ROUND_LINES+=("1 - (f)/(q) per round: ${costs[*]}")
      ;;
  esac
fi
curl -fsS "http://127.0.0.1:$A_ADMIN_PORT/-/metrics" >"$WORK/metrics.txt" || true

# The concurrency curve: the cases of --only among a, p, d and c, at each
# connection count.
declare -A CRPS CP99
CURVE_KEYS=""
for k in a p d c; do
  case " $ONLY " in *" $k "*) CURVE_KEYS="$CURVE_KEYS $k" ;; esac
done
for n in $CURVE; do
  for k in $CURVE_KEYS; do
    wrk -t1 -c"$n" -d1s "${URL[$k]}" >/dev/null 2>&1 || true
    out=$(wrk -t1 -c"$n" -d"${CURVE_DURATION}s" --latency "${URL[$k]}" 2>&1 || true)
    CRPS[$k:$n]=$(echo "$out" | awk '/^Requests\/sec:/ {printf "%.0f", $2}')
    CP99[$k:$n]=$(to_ms "$(echo "$out" | awk '$1 == "99%" {print $2}')")
  done
done

# --- stop the troupe nodes: SIGTERM, each must exit with status 0 ------------------
NODE_EXITS=()  # "node: how it ended" for every node that did not exit 0
stop_nodes() {
  local name pid rc waited
  local names="H A B"
  [ -n "$TH_PID" ] && names="$names H' A' B'"
  [ -n "$DH_PID" ] && names="$names D0 D Q"
  kill -TERM "$H_PID" "$A_PID" "$B_PID" $TH_PID $TA_PID $TB_PID $D0_PID $DH_PID $DQ_PID 2>/dev/null || true
  for name in $names; do
    case $name in H) pid=$H_PID ;; A) pid=$A_PID ;; B) pid=$B_PID ;;
      "H'") pid=$TH_PID ;; "A'") pid=$TA_PID ;; "B'") pid=$TB_PID ;;
      D0) pid=$D0_PID ;; D) pid=$DH_PID ;; *) pid=$DQ_PID ;; esac
    waited=0
    while kill -0 "$pid" 2>/dev/null && [ $waited -lt 300 ]; do
      sleep 0.1
      waited=$((waited + 1))
    done
    if kill -0 "$pid" 2>/dev/null; then
      kill -KILL "$pid" 2>/dev/null || true
      rc=0; wait "$pid" 2>/dev/null || rc=$?
      NODE_EXITS+=("node $name (pid $pid): still running 30 s after SIGTERM; killed (SIGKILL)")
    else
      rc=0; wait "$pid" 2>/dev/null || rc=$?
      if [ "$rc" -gt 128 ]; then
        NODE_EXITS+=("node $name (pid $pid): killed by signal $((rc - 128)) ($(kill -l $((rc - 128)) 2>/dev/null || echo '?')) after SIGTERM")
      elif [ "$rc" -ne 0 ]; then
        NODE_EXITS+=("node $name (pid $pid): exit status $rc after SIGTERM")
      fi
    fi
    # Reaped: cleanup must not signal this pid again.
    local kept=() p
    for p in "${PIDS[@]}"; do [ "$p" = "$pid" ] || kept+=("$p"); done
    PIDS=("${kept[@]}")
  done
}
stop_nodes

ratio() {
  awk -v x="$1" -v y="$2" "$AWK_NUM"'
    BEGIN { if (num(x) && num(y)) printf "%.2f", x / y; else printf "n/a" }'
}
echo
echo "wrk -t1 -c$CONNECTIONS -d${DURATION}s on 127.0.0.1 ($(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)); troupe: $REPLICAS $DEPLOYMENT replicas, max_ongoing_requests $MAX_ONGOING, $IO_THREADS proxy io thread(s)"
[ "$ROUNDS" -gt 1 ] && echo "each figure: the median of $ROUNDS rounds, the cases interleaved"
printf '%-50s %10s %9s %9s %11s  %s\n' case "req/s" "p50 ms" "p99 ms" "cpu us/req" notes
for k in a b t s p f g q c d e; do
  case " $ONLY " in *" $k "*) ;; *) continue ;; esac
  case $k in
    a) name="(a) troupe -> $DEPLOYMENT, same node, in_process" ;;
    b) name="(b) troupe on A -> $DEPLOYMENT on B, in_process" ;;
    t) name="(t) the same as (b) with TLS (--tls-dir)" ;;
    s) name="(s) the same as (a) over HTTPS (--https-port)" ;;
    p) name="(p) troupe -> $DEPLOYMENT, same node, process" ;;
    f) name="(f) defaults: Fixed (blocking), in_process" ;;
    g) name="(g) defaults: Fixed (blocking), process" ;;
    q) name="(q) the same as (f), --access-log off" ;;
    c) name="(c) nginx -> nginx" ;;
    d) name="(d) HAProxy -> nginx" ;;
    e) name="(e) nginx direct (ceiling)" ;;
  esac
  printf '%-50s %10s %9s %9s %11s  %s\n' "$name" "${RPS[$k]}" "${P50[$k]}" "${P99[$k]}" "${CPU[$k]}" \
    "${ERR[$k]}"
done
if [ ${#ROUND_LINES[@]} -gt 0 ]; then
  echo "every round, in order:"
  printf '  %s\n' "${ROUND_LINES[@]}"
fi
echo
echo "ratios: (a)/(d) HAProxy req/s $(ratio "${RPS[a]}" "${RPS[d]}"), p99 $(ratio "${P99[a]}" "${P99[d]}");" \
  "(a)/(c) nginx proxy req/s $(ratio "${RPS[a]}" "${RPS[c]}"), p99 $(ratio "${P99[a]}" "${P99[c]}");" \
  "(b)/(a) req/s $(ratio "${RPS[b]}" "${RPS[a]}"); (a)/(e) req/s $(ratio "${RPS[a]}" "${RPS[e]}")"
echo "ratios (p): (p)/(d) HAProxy req/s $(ratio "${RPS[p]}" "${RPS[d]}"), p99 $(ratio "${P99[p]}" "${P99[d]}");" \
  "(p)/(a) req/s $(ratio "${RPS[p]}" "${RPS[a]}"), p99 $(ratio "${P99[p]}" "${P99[a]}")"
goal_a=$(awk -v a="${RPS[a]}" -v d="${RPS[d]}" -v pa="${P99[a]}" -v pd="${P99[d]}" "$AWK_NUM"'
  BEGIN { if (!(num(a) && num(d) && num(pa) && num(pd))) print "n/a"
          else print (a + 0 >= d + 0 && pa + 0 <= pd + 0) ? "met" : "not met" }')
goal_b=$(awk -v a="${RPS[a]}" -v b="${RPS[b]}" "$AWK_NUM"'
  BEGIN { print !(num(a) && num(b)) ? "n/a" : (b + 0 >= 0.7 * a) ? "met" : "not met" }')
goal_p=$(awk -v p="${RPS[p]}" -v d="${RPS[d]}" "$AWK_NUM"'
  BEGIN { print !(num(p) && num(d)) ? "n/a" : (p + 0 >= 0.6 * d) ? "met" : "not met" }')
echo "goal (a) >= 1.0x HAProxy req/s with p99 <= HAProxy's: $goal_a; goal (b) >= 0.7x (a): $goal_b;" \
  "goal (p) >= 0.6x HAProxy req/s: $goal_p"
case " $ONLY " in
  *" s "*)
    goal_sa=$(awk -v s="${RPS[s]}" -v a="${RPS[a]}" "$AWK_NUM"'
      BEGIN { print !(num(s) && num(a)) ? "n/a" : (s + 0 >= 0.8 * a) ? "met" : "not met" }')
    echo "ratios (s): (s)/(a) req/s $(ratio "${RPS[s]}" "${RPS[a]}"), p99 $(ratio "${P99[s]}" "${P99[a]}")"
    echo "HTTPS goal: (s) >= 0.8x (a): $goal_sa"
    ;;
esac
case " $ONLY " in
  *" f "*|*" g "*|*" q "*)
    # troupe's defaults (the access log on) with a blocking handler against
    # HAProxy -> nginx: the process-isolated default >= 1.0x and in process
    # >= 1.2x, each with p99 no higher; the access log's cost is what (f)
    # loses against (q), goal <= 5 %.
    goal_fd=$(awk -v f="${RPS[f]}" -v d="${RPS[d]}" -v pf="${P99[f]}" -v pd="${P99[d]}" "$AWK_NUM"'
      BEGIN { if (!(num(f) && num(d) && num(pf) && num(pd))) print "n/a"
              else print (f + 0 >= 1.2 * d && pf + 0 <= pd + 0) ? "met" : "not met" }')
    goal_gd=$(awk -v g="${RPS[g]}" -v d="${RPS[d]}" -v pg="${P99[g]}" -v pd="${P99[d]}" "$AWK_NUM"'
      BEGIN { if (!(num(g) && num(d) && num(pg) && num(pd))) print "n/a"
              else print (g + 0 >= d + 0 && pg + 0 <= pd + 0) ? "met" : "not met" }')
    log_cost=$(awk -v f="${RPS[f]}" -v q="${RPS[q]}" "$AWK_NUM"'
      BEGIN { if (num(f) && num(q)) printf "%.1f %%", (1 - f / q) * 100; else printf "n/a" }')
    goal_log=$(awk -v f="${RPS[f]}" -v q="${RPS[q]}" "$AWK_NUM"'
      BEGIN { print !(num(f) && num(q)) ? "n/a" : (f + 0 >= 0.95 * q) ? "met" : "not met" }')
    if [ -n "${LOG_COST_MEDIAN:-}" ] && [ "$LOG_COST_MEDIAN" != n/a ]; then
      # With rounds: the median of each round's pair, (f) and (q) measured
      # one right after the other, instead of the ratio of the medians.
      log_cost=$(awk -v c="$LOG_COST_MEDIAN" 'BEGIN { printf "%.1f %% (the median of the rounds'"'"' pairs)", c * 100 }')
      goal_log=$(awk -v c="$LOG_COST_MEDIAN" 'BEGIN { print (c <= 0.05) ? "met" : "not met" }')
    fi
    echo "ratios (defaults): (f)/(d) HAProxy req/s $(ratio "${RPS[f]}" "${RPS[d]}"), p99 $(ratio "${P99[f]}" "${P99[d]}");" \
      "(g)/(d) req/s $(ratio "${RPS[g]}" "${RPS[d]}"), p99 $(ratio "${P99[g]}" "${P99[d]}")"
    echo "the access log costs (1 - (f)/(q) req/s): $log_cost"
    echo "defaults goals: (f) >= 1.2x HAProxy req/s with p99 <= HAProxy's: $goal_fd;" \
      "(g) >= 1.0x HAProxy req/s with p99 <= HAProxy's: $goal_gd; the access log costs <= 5 %: $goal_log"
    ;;
esac
case " $ONLY " in
  *" t "*)
    goal_tb=$(awk -v t="${RPS[t]}" -v b="${RPS[b]}" "$AWK_NUM"'
      BEGIN { print !(num(t) && num(b)) ? "n/a" : (t + 0 >= 0.8 * b) ? "met" : "not met" }')
    goal_ta=$(awk -v t="${RPS[t]}" -v a="${RPS[a]}" "$AWK_NUM"'
      BEGIN { print !(num(t) && num(a)) ? "n/a" : (t + 0 >= 0.7 * a) ? "met" : "not met" }')
    echo "ratios (t): (t)/(b) req/s $(ratio "${RPS[t]}" "${RPS[b]}"), p99 $(ratio "${P99[t]}" "${P99[b]}");" \
      "(t)/(a) req/s $(ratio "${RPS[t]}" "${RPS[a]}")"
    echo "TLS goals: (t) >= 0.8x (b): $goal_tb; (t) >= 0.7x (a): $goal_ta"
    ;;
esac
if [ -n "${SYSCALLS_DIR:-}" ]; then
  # perf stat --per-thread: "<comm>-<tid>  <count>  <event>" lines, then ours.
  line="system calls per request, both troupe-nodes (all / epoll_wait / send / receive):"
  for k in a b t; do
    [ -f "$SYSCALLS_DIR/stat-$k.txt" ] || continue
    line="$line ($k) $(awk '
      /^requests / { n = $2; next }
      $3 == "raw_syscalls:sys_enter" { all += $2 }
      $3 == "syscalls:sys_enter_epoll_wait" { ep += $2 }
      $3 ~ /sys_enter_(sendmsg|sendto|write|writev)$/ { tx += $2 }
      $3 ~ /sys_enter_(recvmsg|recvfrom|read|readv)$/ { rx += $2 }
      END { if (n > 0) printf "%.2f / %.2f / %.2f / %.2f", all / n, ep / n, tx / n, rx / n; else printf "n/a" }
    ' "$SYSCALLS_DIR/stat-$k.txt");"
  done
  echo "${line%;}"
fi
goal_a13=$(awk -v a="${RPS[a]}" -v d="${RPS[d]}" -v pa="${P99[a]}" -v pd="${P99[d]}" "$AWK_NUM"'
  BEGIN { if (!(num(a) && num(d) && num(pa) && num(pd))) print "n/a"
          else print (a + 0 >= 1.3 * d && pa + 0 <= pd + 0) ? "met" : "not met" }')
goal_p09=$(awk -v p="${RPS[p]}" -v d="${RPS[d]}" "$AWK_NUM"'
  BEGIN { print !(num(p) && num(d)) ? "n/a" : (p + 0 >= 0.9 * d) ? "met" : "not met" }')
echo "data-path goals: (a) >= 1.3x HAProxy req/s with p99 <= HAProxy's: $goal_a13;" \
  "(a') = (p) >= 0.9x HAProxy req/s: $goal_p09; (b) >= 0.7x (a): $goal_b"
if [ -n "$CURVE" ] && [ -n "$CURVE_KEYS" ]; then
  echo
  echo "concurrency curve (wrk -t1, ${CURVE_DURATION}s per point): req/s / p99 ms"
  printf '%-12s' connections
  for k in $CURVE_KEYS; do printf ' %22s' "($k)"; done
  echo
  for n in $CURVE; do
    printf '%-12s' "$n"
    for k in $CURVE_KEYS; do printf ' %22s' "${CRPS[$k:$n]:-n/a} / ${CP99[$k:$n]:-n/a}"; done
    echo
  done
  # p99 growth from the fewest to the most connections, troupe against HAProxy.
  first=$(echo "$CURVE" | awk '{print $1}')
  last=$(echo "$CURVE" | awk '{print $NF}')
  for k in a p; do
    case " $CURVE_KEYS " in *" $k "*) ;; *) continue ;; esac
    g=$(awk -v t1="${CP99[$k:$first]:-}" -v tn="${CP99[$k:$last]:-}" -v h1="${CP99[d:$first]:-}" \
          -v hn="${CP99[d:$last]:-}" -v first="$first" -v last="$last" "$AWK_NUM"'
      BEGIN { if (!(num(t1) && num(tn) && num(h1) && num(hn))) { print "n/a"; exit }
              td = tn - t1; hd = hn - h1
              printf "%s (p99 +%.2f ms from %s to %s connections, x%.1f; HAProxy +%.2f ms, x%.1f)",
                     (td <= hd) ? "met" : "not met", td, first, last, tn / t1, hd, hn / h1 }')
    echo "goal ($k) p99 grows no faster than HAProxy's: $g"
  done
fi
if [ ${#NODE_EXITS[@]} -eq 0 ]; then
  tls_nodes=""
  [ -n "$TH_PID" ] && tls_nodes=", and the head, A and B of the TLS cluster"
  [ -n "$DH_PID" ] && tls_nodes="$tls_nodes, and the head D0, D and Q of the defaults cluster"
  echo "troupe-node exits after SIGTERM: every node 0 (head, A, B$tls_nodes)"
else
  for line in "${NODE_EXITS[@]}"; do
    echo "troupe-node did not exit cleanly: $line"
    echo "run.sh: troupe-node did not exit cleanly: $line; the end of its log:" >&2
    case "$line" in "node H'"*) log="$WORK/th.log" ;; "node A'"*) log="$WORK/ta.log" ;;
      "node B'"*) log="$WORK/tb.log" ;; "node H"*) log="$WORK/h.log" ;; "node A"*) log="$WORK/a.log" ;;
      *) log="$WORK/b.log" ;; esac
    tail -n 20 "$log" >&2 || true
  done
fi
