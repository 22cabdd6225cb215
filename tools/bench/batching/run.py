#!/usr/bin/env python3
"""Request batching benchmark (issue 44): the XGBoost example with batching
off, with a fixed wait and with the adaptive wait, at several concurrencies.
See README.md next to this script.

  tools/bench/batching/run.py [--build DIR] [--duration 6] [--warmup 2] [--rounds 3]
                              [--concurrency "1 16 64 256"] [--json FILE] [--keep]

Starts a cluster of real troupe-node processes on 127.0.0.1 with free
ports, as tools/bench/http/run.sh does for its case (g): a head that hosts
nothing and a worker D with the node's defaults. It deploys the XGBoost
example (libtroupe_xgboost.so:XGBoostModel, 2 replicas, isolation process,
max_ongoing_requests 256) with `troupectl deploy`, once per batching mode
(redeployed in place; each mode waits until the deployment is HEALTHY and
its replicas batch as configured):
  off    max_batch_size 1
  fixed  max_batch_size 32, batch_wait_timeout_s 0.005
  auto   max_batch_size 32, batch_wait_timeout_s auto
and for each mode and concurrency C runs wrk (-t1 -cC, a warm-up of
--warmup s, then --duration s with --latency) POSTing 30-feature rows. It
reports req/s, p50, p99, non-2xx answers and socket errors, the mean batch
size and batch wait over the measured run (troupe_deployment_batch_size and
troupe_deployment_batch_wait_seconds of worker D's /-/metrics) and the CPU
time of worker D and its troupe-replica processes per request. --rounds N
repeats the whole matrix (the modes in reverse order every other round),
prints a table per round and one of the medians, and checks the issue's
goals on the medians. Every process it starts is stopped at the end, also
on failure or Ctrl-C.

Exit status: 0 when the matrix was measured (goals MET or NOT MET), 1 when
the cluster or a deploy failed, 2 on bad arguments or when wrk, a binary or
the plugin is missing.
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import http.client
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
APP = "xgboost"
DEPLOYMENT = "XGBoostModel"
REPLICAS = 2
MAX_ONGOING = 256
N_FEATURES = 30
MODES = {
    "off": {"max_batch_size": 1},
    "fixed": {"max_batch_size": 32, "batch_wait_timeout_s": "0.005"},
    "auto": {"max_batch_size": 32, "batch_wait_timeout_s": "auto"},
}
MODE_ORDER = ["off", "fixed", "auto"]


class Failure(Exception):
    """The cluster or a deploy failed: the run cannot go on."""


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def free_port():
    # A loopback TCP port that was free a moment ago (tools/bench/lib.sh).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(what, deadline_s, check, interval=0.2, alive=None):
    """Polls check() until it returns something truthy (returned), or raises
    Failure after deadline_s seconds. alive(), when given, is called on each
    try and may raise (a node died)."""
    deadline = time.monotonic() + deadline_s
    while True:
        if alive:
            alive()
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise Failure(f"{what}: not within {deadline_s:g} s")
        time.sleep(interval)  # poll interval, not a wait for something


# --- wrk ---------------------------------------------------------------------------

def wrk_lua(path, rows, protocol="native"):
    if protocol == "oip":
        # The Open Inference Protocol's REST body of one row (docs/inference.md).
        bodies = [json.dumps({"inputs": [{"name": "features", "datatype": "FP32",
                                          "shape": [1, len(row)], "data": row}]},
                             separators=(",", ":")) for row in rows]
    else:
        bodies = [json.dumps({"features": [row]}, separators=(",", ":")) for row in rows]
    with open(path, "w") as f:
        f.write('wrk.method = "POST"\n')
        f.write('wrk.headers["Content-Type"] = "application/json"\n')
        f.write("local bodies = {\n")
        for b in bodies:
            f.write(f"  [==[{b}]==],\n")  # long brackets: the body holds "]]"
        f.write("}\n")
        f.write("local i = 0\n")
        f.write("request = function()\n")
        f.write("  i = i % #bodies + 1\n")
        f.write("  return wrk.format(nil, nil, nil, bodies[i])\n")
        f.write("end\n")
    return bodies


def to_ms(text):
    m = re.fullmatch(r"([0-9.]+)(us|ms|s|m|h)", text)
    if not m:
        return None
    v = float(m.group(1))
    return v * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}[m.group(2)]


def parse_wrk(out):
    r = {"requests": None, "rps": None, "p50_ms": None, "p99_ms": None, "non2xx": 0,
         "socket_errors": ""}
    m = re.search(r"^\s*(\d+) requests in ", out, re.M)
    if m:
        r["requests"] = int(m.group(1))
    m = re.search(r"^Requests/sec:\s*([0-9.]+)", out, re.M)
    if m:
        r["rps"] = float(m.group(1))
    for pct, key in (("50", "p50_ms"), ("99", "p99_ms")):
        m = re.search(rf"^\s*{pct}%\s+(\S+)", out, re.M)
        if m:
            r[key] = to_ms(m.group(1))
    m = re.search(r"Non-2xx or 3xx responses:\s*(\d+)", out)
    if m:
        r["non2xx"] = int(m.group(1))
    m = re.search(r"Socket errors:\s*(.*)", out)
    if m:
        r["socket_errors"] = m.group(1).strip()
    return r


def run_wrk(url, lua, connections, seconds, latency):
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "30s", "-s", lua]
    if latency:
        cmd.append("--latency")
    cmd.append(url)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    # wrk says nothing on stderr unless it failed, e.g. on an error in the
    # Lua script, after which it would send GETs without it.
    if p.returncode != 0 or p.stderr.strip():
        raise Failure(f"wrk failed (exit {p.returncode}): {p.stderr.strip()[:500]}")
    return p.stdout


# --- /proc ---------------------------------------------------------------------------

CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_stat(pid):
    """(ppid, utime + stime in ticks) of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    # fields[0] is field 3 (state): ppid is field 4, utime 14, stime 15.
    return int(fields[1]), int(fields[11]) + int(fields[12])


def proc_cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def replica_pids(node_pid):
    """The troupe-replica processes whose parent is node_pid."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = proc_stat(int(name))
        if st is None or st[0] != node_pid:
            continue
        argv = proc_cmdline(int(name))
        if argv and os.path.basename(argv[0].decode(errors="replace")).startswith("troupe-replica"):
            out.append(int(name))
    return sorted(out)


def cpu_ticks(pids):
    total = 0
    for pid in pids:
        st = proc_stat(pid)
        if st:
            total += st[1]
    return total


# --- metrics -------------------------------------------------------------------------

METRIC_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def scrape(admin_port):
    """The app's series of worker D's /-/metrics, summed over its replicas:
    {name: value}, and the replica ids seen."""
    with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/-/metrics", timeout=5) as r:
        text = r.read().decode()
    want = ("troupe_deployment_requests_total", "troupe_deployment_errors_total",
            "troupe_deployment_batch_size_sum", "troupe_deployment_batch_size_count",
            "troupe_deployment_batch_wait_seconds_sum", "troupe_deployment_batch_wait_seconds_count")
    sums = {k: 0.0 for k in want}
    waits = {}  # the batch wait histogram's buckets: le (s) -> cumulative count
    replicas = set()
    for line in text.splitlines():
        m = METRIC_LINE.match(line)
        if not m or (m.group(1) not in sums
                      and m.group(1) != "troupe_deployment_batch_wait_seconds_bucket"):
            continue
        labels = m.group(2) or ""
        if f'application="{APP}"' not in labels:
            continue
        if m.group(1) == "troupe_deployment_batch_wait_seconds_bucket":
            le = re.search(r'le="([^"]*)"', labels)
            if le:
                bound = float(le.group(1))  # "+Inf" too
                waits[bound] = waits.get(bound, 0.0) + float(m.group(3))
            continue
        sums[m.group(1)] += float(m.group(3))
        rm = re.search(r'replica="([^"]*)"', labels)
        if rm:
            replicas.add(rm.group(1))
    sums["batch_wait_buckets"] = waits
    return sums, replicas


def wait_p99_ms(before, after):
    """The bound of the batch wait histogram's bucket that holds the 99th
    percentile of the batches counted between two scrapes (ms; inf: above
    the largest bound), or None when none was counted."""
    b, a = before["batch_wait_buckets"], after["batch_wait_buckets"]
    bounds = sorted(a)
    if not bounds:
        return None
    total = a[bounds[-1]] - b.get(bounds[-1], 0.0)
    if total <= 0:
        return None
    for bound in bounds:
        if a[bound] - b.get(bound, 0.0) >= 0.99 * total:
            return bound * 1e3
    return None


# --- the cluster ---------------------------------------------------------------------

class Cluster:
    def __init__(self, build, work, d_args=()):
        self.bin = os.path.join(build, "bin")
        self.d_args = list(d_args)  # more of worker d's options (tools/bench/grpc)
        self.work = work
        self.procs = {}  # name -> Popen
        self.logs = {}
        self.seen_replicas = set()  # troupe-replica pids seen (stopped at the end if left)
        self.ctl_port = free_port()
        self.http_port = free_port()
        self.admin_port = free_port()

    def start(self):
        self._start("head", ["--head", "--port", str(self.ctl_port),
                             "--state-dir", os.path.join(self.work, "h"),
                             "--http-port", str(free_port()), "--admin-port", "0",
                             "--resources", "cpu=1"])
        self._start("d", ["--join", f"127.0.0.1:{self.ctl_port}", "--node-id", "d",
                          "--state-dir", os.path.join(self.work, "d"),
                          "--http-port", str(self.http_port), "--admin-port", str(self.admin_port),
                          "--resources", "cpu=2,noded=1", *self.d_args])

        def two_alive():
            r = self.ctl("nodes", "--json")
            if r.returncode != 0:
                return False
            try:
                nodes = json.loads(r.stdout)
            except ValueError:
                return False
            return sum(1 for n in nodes if n.get("state") == "ALIVE") == 2

        wait_until("the head and worker d ALIVE", 30, two_alive, alive=self.check_alive)

    def _start(self, name, args):
        path = os.path.join(self.work, f"{name}.log")
        f = open(path, "w")
        self.logs[name] = path
        self.procs[name] = subprocess.Popen([os.path.join(self.bin, "troupe-node"), *args],
                                            stdout=f, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL)
        f.close()

    @property
    def d_pid(self):
        return self.procs["d"].pid

    def check_alive(self):
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise Failure(f"troupe-node {name} exited with status {p.returncode}")

    def ctl(self, *args, timeout=30):
        try:
            return subprocess.run([os.path.join(self.bin, "troupectl"), "--address",
                                   f"127.0.0.1:{self.ctl_port}", "--timeout", "5", *args],
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(args, 124, "", "troupectl timed out")

    def status(self):
        r = self.ctl("status", "--json")
        if r.returncode != 0:
            return None
        try:
            return json.loads(r.stdout)
        except ValueError:
            return None

    def replicas(self):
        """The troupe-replica processes of worker D (remembered for cleanup)."""
        pids = replica_pids(self.d_pid)
        self.seen_replicas.update(pids)
        return pids

    def tail(self, name, n=30):
        try:
            with open(self.logs[name], errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def stop(self):
        """SIGTERM to the nodes, 30 s each to exit, then SIGKILL; then any
        troupe-replica process of worker D still there. Returns how each
        node ended ({name: text})."""
        exits = {}
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for name, p in self.procs.items():
            try:
                rc = p.wait(timeout=30)
                exits[name] = (f"exit {rc}" if rc >= 0 else
                               f"killed by signal {-rc} ({signal.Signals(-rc).name})")
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                exits[name] = "still running 30 s after SIGTERM; killed (SIGKILL)"
        for pid in sorted(self.seen_replicas):
            st = proc_stat(pid)
            argv = proc_cmdline(pid)
            if st is None or not argv or b"troupe-replica" not in argv[0]:
                continue
            exits[f"replica pid {pid}"] = "left behind by its node; killed (SIGKILL)"
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        return exits


def deploy_yaml(mode, nthread=None):
    m = MODES[mode]
    lines = [
        "http_options: {request_timeout_s: 30}",
        "applications:",
        f"  - name: {APP}",
        "    route_prefix: /xgboost",
        "    open_inference: true",
        f"    import_path: libtroupe_xgboost.so:{DEPLOYMENT}",
        "    args: {}" if nthread is None else f"    args: {{nthread: {nthread}}}",
        "    deployments:",
        f"      - name: {DEPLOYMENT}",
        f"        num_replicas: {REPLICAS}",
        f"        max_ongoing_requests: {MAX_ONGOING}",
        f"        max_batch_size: {m['max_batch_size']}",
    ]
    if "batch_wait_timeout_s" in m:
        lines.append(f"        batch_wait_timeout_s: {m['batch_wait_timeout_s']}")
    lines.append("        resources: {noded: 0.01}")
    return "\n".join(lines) + "\n"


def post(conn, body):
    conn.request("POST", "/xgboost", body=body, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    return r.status, r.read()


def deploy_mode(cluster, mode, bodies, nthread=None):
    """Deploys `mode`, waits until the deployment is HEALTHY with its 2
    replicas RUNNING on worker d as troupe-replica processes, and until its
    replicas batch as the mode says (batches counted for fixed and auto,
    none for off). Returns the replica ids."""
    path = os.path.join(cluster.work, f"deploy-{mode}.yaml")
    with open(path, "w") as f:
        f.write(deploy_yaml(mode, nthread))
    r = cluster.ctl("deploy", path, "--wait", "--wait-timeout", "120", timeout=150)
    if r.returncode != 0:
        raise Failure(f"troupectl deploy ({mode}) failed: {r.stdout}{r.stderr}")

    def healthy():
        st = cluster.status()
        if not st:
            return None
        app = st.get("applications", {}).get(APP)
        if not app or app.get("status") != "RUNNING":
            return None
        dep = app.get("deployments", {}).get(DEPLOYMENT)
        if not dep or dep.get("status") != "HEALTHY":
            return None
        reps = dep.get("replicas", [])
        if len(reps) != REPLICAS or any(x.get("state") != "RUNNING" or x.get("node") != "d"
                                        for x in reps):
            return None
        return sorted(x.get("id", "") for x in reps)

    ids = wait_until(f"{APP}/{DEPLOYMENT} HEALTHY with {REPLICAS} replicas RUNNING on d",
                     120, healthy, interval=0.25, alive=cluster.check_alive)
    wait_until(f"{REPLICAS} troupe-replica processes under worker d", 30,
               lambda: len(cluster.replicas()) == REPLICAS, alive=cluster.check_alive)

    # The answer is a prediction, and the replicas batch as configured: a
    # config change reaches running replicas after the deploy returns.
    want_batches = MODES[mode]["max_batch_size"] > 1
    probes = 20

    def batching_as_configured():
        before, _ = scrape(cluster.admin_port)
        conn = http.client.HTTPConnection("127.0.0.1", cluster.http_port, timeout=30)
        try:
            for i in range(probes):
                status, body = post(conn, bodies[i % len(bodies)])
                if status != 200:
                    raise Failure(f"probe POST /xgboost answered {status}: {body[:300]!r}")
                preds = json.loads(body).get("predictions")
                if not (isinstance(preds, list) and len(preds) == 1
                        and isinstance(preds[0], (int, float))):
                    raise Failure(f"probe POST /xgboost answered {body[:300]!r}, "
                                  "not {\"predictions\": [p]}")
        finally:
            conn.close()
        after = wait_until("the probes in the replicas' metrics", 15,
                           lambda: grown(cluster, before, "troupe_deployment_requests_total",
                                         probes),
                           interval=0.1)
        batches = (after["troupe_deployment_batch_size_count"]
                   - before["troupe_deployment_batch_size_count"])
        return (batches > 0) == want_batches

    wait_until(f"replicas batching as mode {mode} says ("
               f"{'batches counted' if want_batches else 'no batches counted'})",
               60, batching_as_configured, interval=0.2, alive=cluster.check_alive)
    return ids


def grown(cluster, before, name, n):
    """The metrics when `name` has grown by at least n since `before`."""
    try:
        now, _ = scrape(cluster.admin_port)
    except OSError:
        return None
    return now if now[name] - before[name] >= n else None


def measure(cluster, url, lua, c, duration, warmup):
    res = {"concurrency": c}
    m0, _ = scrape(cluster.admin_port)
    if warmup > 0:
        w = parse_wrk(run_wrk(url, lua, c, warmup, False))
        n_w = (w["requests"] or 0) - w["non2xx"]
        # Warm-up's requests counted before the measured run starts.
        wait_until("the warm-up's requests in the replicas' metrics", 20,
                   lambda: grown(cluster, m0, "troupe_deployment_requests_total", n_w),
                   interval=0.1, alive=cluster.check_alive)
    m1, reps1 = scrape(cluster.admin_port)
    pids = [cluster.d_pid] + cluster.replicas()
    t0 = cpu_ticks(pids)
    out = run_wrk(url, lua, c, duration, True)
    t1 = cpu_ticks(pids)
    res.update(parse_wrk(out))
    res["wrk_output"] = out
    n = res["requests"] or 0
    ok = n - res["non2xx"]
    res["metrics_note"] = ""
    try:
        m2 = wait_until("the measured requests in the replicas' metrics", 20,
                        lambda: grown(cluster, m1, "troupe_deployment_requests_total", ok),
                        interval=0.1, alive=cluster.check_alive)
    except Failure as e:
        m2, _ = scrape(cluster.admin_port)
        res["metrics_note"] = str(e)
    _, reps2 = scrape(cluster.admin_port)
    if reps1 != reps2:
        res["metrics_note"] += f" replicas changed during the run: {sorted(reps1)} -> {sorted(reps2)}"
    d = {k: m2[k] - m1[k] for k in m2 if k != "batch_wait_buckets"}
    res["replica_requests"] = d["troupe_deployment_requests_total"]
    res["replica_errors"] = d["troupe_deployment_errors_total"]
    batches = d["troupe_deployment_batch_size_count"]
    res["batches"] = batches
    # No batch counted (batching off): every request ran alone.
    res["batch_mean"] = d["troupe_deployment_batch_size_sum"] / batches if batches > 0 else 1.0
    res["batch_wait_ms"] = (d["troupe_deployment_batch_wait_seconds_sum"] * 1e3 / batches
                            if batches > 0 else None)
    res["batch_wait_p99_ms"] = wait_p99_ms(m1, m2)
    res["cpu_us_per_req"] = (t1 - t0) * 1e6 / CLK_TCK / n if n > 0 else None
    res["pids"] = pids
    return res


# --- output --------------------------------------------------------------------------

def fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


HEADER = (f"{'mode':<6} {'conc':>5} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'non-2xx':>8} "
          f"{'batch':>6} {'wait ms':>8} {'wait p99':>8} {'cpu us/req':>11}  notes")


def row(mode, r):
    notes = []
    if r.get("socket_errors"):
        notes.append("socket errors: " + r["socket_errors"])
    if r.get("replica_errors"):
        notes.append(f"{r['replica_errors']:.0f} handler errors (5xx)")
    if r.get("metrics_note"):
        notes.append(r["metrics_note"].strip())
    return (f"{mode:<6} {r['concurrency']:>5} {fmt(r.get('rps'), '.0f'):>9} "
            f"{fmt(r.get('p50_ms'), '.2f'):>8} {fmt(r.get('p99_ms'), '.2f'):>8} "
            f"{fmt(r.get('non2xx'), 'd'):>8} {fmt(r.get('batch_mean'), '.2f'):>6} "
            f"{fmt(r.get('batch_wait_ms'), '.2f'):>8} {wait_p99(r.get('batch_wait_p99_ms')):>8} "
            f"{fmt(r.get('cpu_us_per_req'), '.0f'):>11}"
            f"  {'; '.join(notes)}").rstrip()


def wait_p99(ms):
    if ms is None:
        return "n/a"
    return f"<={ms:g}" if ms != float("inf") else ">1000"


def median_of(values):
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def goals(med, concurrencies):
    out = {}
    if 64 in concurrencies:
        off = med[("off", 64)]
        best_mode = max(("fixed", "auto"), key=lambda m: med[(m, 64)]["rps"] or 0)
        best = med[(best_mode, 64)]
        if off["rps"] and best["rps"] and off["p99_ms"] is not None and best["p99_ms"] is not None:
            ratio = best["rps"] / off["rps"]
            met = ratio >= 3 and best["p99_ms"] <= off["p99_ms"]
            each = {m: (med[(m, 64)]["rps"] / off["rps"] if med[(m, 64)]["rps"] else None)
                    for m in ("fixed", "auto")}
            text = (f"c=64: max(fixed, auto) req/s / off's = {ratio:.2f} ({best_mode} "
                    f"{best['rps']:.0f} vs off {off['rps']:.0f}; fixed {fmt(each['fixed'], '.2f')}x, "
                    f"auto {fmt(each['auto'], '.2f')}x), {best_mode}'s p99 {best['p99_ms']:.2f} ms "
                    f"vs off's {off['p99_ms']:.2f} ms; goal >= 3x with p99 no worse: "
                    f"{'MET' if met else 'NOT MET'}")
            out["c64_throughput"] = {"ratio": ratio, "mode": best_mode, "p99_ms": best["p99_ms"],
                                     "off_p99_ms": off["p99_ms"], "met": met, "text": text}
        else:
            out["c64_throughput"] = {"met": None,
                                     "text": "c=64: max(fixed, auto) >= 3x off's req/s: n/a "
                                             "(a measurement is missing)"}
    else:
        out["c64_throughput"] = {"met": None,
                                 "text": "c=64: max(fixed, auto) >= 3x off's req/s: n/a "
                                         "(64 not in --concurrency)"}
    if 1 in concurrencies:
        off, auto = med[("off", 1)], med[("auto", 1)]
        if off["p50_ms"] is not None and auto["p50_ms"] is not None:
            diff = auto["p50_ms"] - off["p50_ms"]
            met = diff <= 1.0
            text = (f"c=1: auto's p50 - off's p50 = {diff:+.3f} ms ({auto['p50_ms']:.3f} vs "
                    f"{off['p50_ms']:.3f}); goal <= 1 ms: {'MET' if met else 'NOT MET'}")
            out["c1_latency"] = {"diff_ms": diff, "met": met, "text": text}
        else:
            out["c1_latency"] = {"met": None, "text": "c=1: auto's p50 - off's p50 <= 1 ms: n/a "
                                                      "(a measurement is missing)"}
    else:
        out["c1_latency"] = {"met": None, "text": "c=1: auto's p50 - off's p50 <= 1 ms: n/a "
                                                  "(1 not in --concurrency)"}
    return out


def git_commit():
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return head + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def nproc():
    # What nproc prints: the CPUs this process may run on.
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


# --- main ----------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(
        description="Request batching benchmark (issue 44): XGBoost with batching off, "
                    "fixed and auto at several concurrencies. See README.md.")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"),
                    help="CMake build directory (default: ./build of the repository)")
    ap.add_argument("--duration", type=float, default=6, help="seconds per measured run (6)")
    ap.add_argument("--warmup", type=float, default=2, help="seconds of warm-up before each (2)")
    ap.add_argument("--rounds", type=int, default=3, help="repeats of the whole matrix (3)")
    ap.add_argument("--concurrency", default="1 16 64 256",
                    help='wrk connections, space-separated ("1 16 64 256")')
    ap.add_argument("--modes", default="off fixed auto",
                    help='batching modes to run, of "off fixed auto" (all)')
    ap.add_argument("--nthread", type=int, default=None,
                    help="the deployment's args.nthread (XGBoost's threads per prediction); "
                         "default: not set, XGBoost's own default (every core)")
    ap.add_argument("--protocol", choices=("native", "oip"), default="native",
                    help="what wrk posts: the example's own REST API (POST /xgboost "
                         '{"features": [row]}, the default) or the Open Inference Protocol '
                         "(POST /v2/models/xgboost/infer with one FP32 [1, 30] tensor)")
    ap.add_argument("--json", metavar="FILE", help="write every figure to FILE as JSON")
    ap.add_argument("--keep", action="store_true",
                    help="keep the work dir (node logs, wrk output) and print its path")
    args = ap.parse_args()

    try:
        concurrencies = [int(x) for x in args.concurrency.split()]
    except ValueError:
        ap.error(f"--concurrency takes whole numbers, not '{args.concurrency}'")
    if not concurrencies or any(c < 1 for c in concurrencies):
        ap.error("--concurrency needs at least one number >= 1")
    modes = args.modes.split()
    if not modes or any(m not in MODES for m in modes):
        ap.error(f"--modes takes some of: {' '.join(MODE_ORDER)}")
    modes = [m for m in MODE_ORDER if m in modes]
    if args.rounds < 1:
        ap.error("--rounds takes a positive whole number")
    if args.duration < 1 or args.warmup < 0:
        ap.error("--duration must be >= 1 and --warmup >= 0")
    duration = int(round(args.duration))
    warmup = int(round(args.warmup))

    build = os.path.abspath(args.build)
    for b in ("troupe-node", "troupe-replica", "troupectl"):
        if not os.access(os.path.join(build, "bin", b), os.X_OK):
            log(f"run.py: {build}/bin/{b} not found; build first "
                f"(cmake --build {build} --target troupe-node troupe-replica troupectl troupe_xgboost)")
            return 2
    if not os.path.isfile(os.path.join(build, "plugins", "libtroupe_xgboost.so")):
        log(f"run.py: {build}/plugins/libtroupe_xgboost.so not found; it is built with Debian's "
            "libxgboost-dev (apt-get install libxgboost-dev, then build troupe_xgboost)")
        return 2
    if shutil.which("wrk") is None:
        log("run.py: wrk is missing; install it (Debian: apt-get install wrk, as "
            "tools/bench/http/run.sh does) and run again")
        return 2

    # SIGTERM ends the run like Ctrl-C: the finally below stops every process.
    def on_term(signum, _frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, on_term)

    print(f"commit {git_commit()}; nproc {nproc()}, "
          f"load average {loadavg()}", flush=True)
    print(f"XGBoostModel, {REPLICAS} replicas, isolation process, max_ongoing_requests "
          f"{MAX_ONGOING}, on worker d (a head that hosts nothing, node defaults); "
          f"wrk -t1 -cC -d{duration}s --latency after a {warmup} s warm-up; "
          f"modes {' '.join(modes)}; concurrency {' '.join(map(str, concurrencies))}; "
          f"{args.rounds} round(s); protocol {args.protocol}; args.nthread "
          f"{'not set (XGBoost default)' if args.nthread is None else args.nthread}", flush=True)

    load_start = loadavg()
    work = tempfile.mkdtemp(prefix="troupe-bench-batching.")
    cluster = Cluster(build, work)
    rng = random.Random(44)
    rows = [[round(rng.uniform(-2, 2), 4) for _ in range(N_FEATURES)] for _ in range(8)]
    lua = os.path.join(work, "post.lua")
    bodies = wrk_lua(lua, rows)
    url = f"http://127.0.0.1:{cluster.http_port}/xgboost"
    if args.protocol == "oip":
        # The probes stay on the example's own API; wrk posts the protocol's.
        lua = os.path.join(work, "post-oip.lua")
        wrk_lua(lua, rows, "oip")
        url = f"http://127.0.0.1:{cluster.http_port}/v2/models/{APP}/infer"

    results = []  # per round: {(mode, c): result}
    replica_ids = {}
    exits = {}
    rc = 0
    interrupted = False
    try:
        cluster.start()
        for rnd in range(1, args.rounds + 1):
            order = modes if rnd % 2 else list(reversed(modes))
            this = {}
            for mode in order:
                ids = deploy_mode(cluster, mode, bodies, args.nthread)
                replica_ids.setdefault(mode, []).append(ids)
                for c in concurrencies:
                    r = measure(cluster, url, lua, c, duration, warmup)
                    r["mode"] = mode
                    r["round"] = rnd
                    this[(mode, c)] = r
                    with open(os.path.join(work, f"wrk-{mode}-c{c}-r{rnd}.txt"), "w") as f:
                        f.write(r["wrk_output"])
                    log(f"round {rnd}: {row(mode, r)}")
            results.append(this)
            print(f"\nround {rnd} (load average {loadavg()}):")
            print(HEADER)
            for mode in modes:
                for c in concurrencies:
                    print(row(mode, this[(mode, c)]))
            sys.stdout.flush()
    except Failure as e:
        log(f"run.py: {e}")
        for name in cluster.procs:
            log(f"--- the end of node {name}'s log ({cluster.logs[name]}):\n{cluster.tail(name)}")
        rc = 1
    except KeyboardInterrupt:
        interrupted = True
        rc = 130
    finally:
        exits = cluster.stop()
        if args.keep:
            log(f"run.py: the work dir is kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    if interrupted:
        log("run.py: interrupted; every process stopped")
        return rc

    med = {}
    if results:
        done = len(results)
        print(f"\nmedians of {done} round(s) (load average {loadavg()}):")
        print(HEADER)
        for mode in modes:
            for c in concurrencies:
                rs = [results[i][(mode, c)] for i in range(done) if (mode, c) in results[i]]
                m = {"concurrency": c}
                for k in ("rps", "p50_ms", "p99_ms", "batch_mean", "batch_wait_ms",
                          "cpu_us_per_req"):
                    m[k] = median_of([r.get(k) for r in rs])
                # A bucket's bound: the lower median stays one.
                waits = [r["batch_wait_p99_ms"] for r in rs if r.get("batch_wait_p99_ms") is not None]
                m["batch_wait_p99_ms"] = statistics.median_low(waits) if waits else None
                m["non2xx"] = sum(r.get("non2xx") or 0 for r in rs)
                errs = [r["socket_errors"] for r in rs if r.get("socket_errors")]
                m["socket_errors"] = " | ".join(errs)
                m["replica_errors"] = sum(r.get("replica_errors") or 0 for r in rs)
                m["metrics_note"] = " | ".join(r["metrics_note"].strip() for r in rs
                                               if r.get("metrics_note", "").strip())
                med[(mode, c)] = m
                print(row(mode, m))
        print("(non-2xx: the sum over the rounds; batch: mean requests per batch; wait ms: "
              "mean wait of a batch's oldest request; wait p99: the bucket of the batch wait "
              "histogram that holds its 99th percentile, ms)")
        # Replica ids per deploy: an in-place redeploy keeps them.
        all_ids = {tuple(ids) for per in replica_ids.values() for ids in per}
        if len(all_ids) > 1:
            print(f"note: the replicas changed between deploys (an in-place redeploy should keep "
                  f"them): {sorted(all_ids)}")
        have_all = all(m in modes for m in MODE_ORDER) and len(results) == args.rounds
        if have_all:
            g = goals(med, concurrencies)
            print("\ngoals (issue 44), on the medians:")
            print("  " + g["c64_throughput"]["text"])
            print("  " + g["c1_latency"]["text"])
        else:
            g = {}
            print("\ngoals (issue 44): n/a (they need all three modes and every round)")
    else:
        g = {}
    bad = {k: v for k, v in exits.items() if v != "exit 0"}
    if bad:
        for k, v in bad.items():
            print(f"troupe process did not exit cleanly: {k}: {v}")
    else:
        print("troupe-node exits after SIGTERM: " + ", ".join(f"{k} {v}" for k, v in exits.items()))

    if args.json:
        def strip(r):
            return {k: v for k, v in r.items() if k != "wrk_output"}
        doc = {
            "commit": git_commit(), "nproc": nproc(), "load_average_start": load_start, "load_average_end": loadavg(),
            "settings": {"duration_s": duration, "warmup_s": warmup, "rounds": args.rounds,
                         "concurrency": concurrencies, "modes": {m: MODES[m] for m in modes},
                         "replicas": REPLICAS, "max_ongoing_requests": MAX_ONGOING},
            "rounds": [[strip(r) for r in rr.values()] for rr in results],
            "medians": [dict(mode=k[0], **v) for k, v in med.items()],
            "goals": g, "replica_ids": replica_ids, "node_exits": exits,
        }
        def finite(x):  # strict JSON: no Infinity
            if isinstance(x, float) and x == float("inf"):
                return "inf"
            if isinstance(x, dict):
                return {k: finite(v) for k, v in x.items()}
            if isinstance(x, list):
                return [finite(v) for v in x]
            return x
        with open(args.json, "w") as f:
            json.dump(finite(doc), f, indent=2)
        print(f"figures written to {args.json}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
