#!/usr/bin/env python3
"""gRPC ingress benchmark (issue 46): the same deployment through a node's
gRPC port and through its HTTP/1.1 port, by the same load generator, in one
run. See README.md next to this script.

  tools/bench/grpc/run.py [--build DIR] [--duration 6] [--warmup 2] [--rounds 3]
                          [--concurrency "32"] [--json FILE] [--keep]

The cluster is the one of the HTTP benchmark's case (g): a head that hosts
nothing and a worker d with the node's defaults (the access log on, replica
processes), plus --grpc-port on d. The deployment is the Fixed example (a
blocking handler answering {"ok":true}), 2 replicas on d,
max_ongoing_requests 16. h2load (Debian's nghttp2-client) drives both: one
thread, C connections, one request at a time on each (-m 1), C the
concurrency; over HTTP/1.1 (--h1) GET /fixed/, over HTTP/2 a unary gRPC call
(content-type application/grpc, te: trailers, an empty message) of
/fixed.Fixed/Get. The two are measured one after the other, in reverse order
every other round. Each measurement checks its answers: h2load's 2xx count,
and for gRPC the node's troupe_grpc_requests_total{code="OK"}, which must
have grown by every call (a gRPC error also comes with HTTP status 200).

Prints req/s, mean latency and the CPU time of node d and its replica
processes per request, the ratio gRPC/HTTP per round and its median, and the
goal: gRPC >= 0.8x the HTTP/1.1 path's req/s at the same concurrency.
Exit status: 0 when the goal is met, 1 when not, 2 when the run failed.
"""
import argparse
import resource
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))

# The cluster, /proc and polling helpers of the batching benchmark.
_spec = importlib.util.spec_from_file_location("batching_bench",
                                               os.path.join(HERE, "..", "batching", "run.py"))
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)
Failure, log, free_port, wait_until = bench.Failure, bench.log, bench.free_port, bench.wait_until

APP = "fixed"
REPLICAS = 2
MAX_ONGOING = 16
GOAL = 0.8

DEPLOY = f"""http_options: {{request_timeout_s: 30}}
applications:
  - name: {APP}
    route_prefix: /fixed
    import_path: libtroupe_examples.so:Fixed
    deployments:
      - name: Fixed
        num_replicas: {REPLICAS}
        max_ongoing_requests: {MAX_ONGOING}
        resources: {{noded: 0.01}}
"""

SERIES = re.compile(r'^troupe_grpc_requests_total\{application="' + APP +
                    r'",code="([A-Z_]+)"\}\s+(\S+)', re.M)


def grpc_counts(admin_port):
    """{gRPC code name: calls} of the app on worker d."""
    with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/-/metrics", timeout=5) as r:
        text = r.read().decode()
    return {m.group(1): float(m.group(2)) for m in SERIES.finditer(text)}


# What each measurement runs: HTTP/1.1 with a connection per request in
# flight; gRPC the same way ("grpc"), and as a gRPC client's channel does it,
# every call in flight multiplexed on one connection ("grpc-mux").
KINDS = ("http", "grpc", "grpc-mux")


def h2load(kind, port, conns, seconds, warmup, empty):
    if kind == "http":
        cmd = ["h2load", "--h1", f"http://127.0.0.1:{port}/fixed/"]
    else:
        cmd = ["h2load", "-H", "content-type: application/grpc", "-H", "te: trailers",
               "-d", empty, f"http://127.0.0.1:{port}/fixed.Fixed/Get"]
    shape = ["-c", "1", "-m", str(conns)] if kind == "grpc-mux" else ["-c", str(conns), "-m", "1"]
    cmd += ["-t", "1", *shape, "-D", f"{seconds:g}"]
    if warmup > 0:
        cmd += ["--warm-up-time", f"{warmup:g}"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + warmup + 60)
    if p.returncode != 0:
        raise Failure(f"h2load failed (exit {p.returncode}): {p.stdout[-500:]}{p.stderr[-500:]}")
    out = p.stdout

    def grab(pattern):
        m = re.search(pattern, out)
        if not m:
            raise Failure(f"h2load's output has no '{pattern}': {out[-800:]}")
        return m

    r = {"rps": float(grab(r"finished in [0-9.]+s, ([0-9.]+) req/s").group(1))}
    m = grab(r"requests: (\d+) total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, "
             r"(\d+) errored, (\d+) timeout")
    r["done"], r["succeeded"] = int(m.group(2)), int(m.group(3))
    r["failed"] = int(m.group(4)) + int(m.group(5)) + int(m.group(6))
    r["ok_2xx"] = int(grab(r"status codes: (\d+) 2xx").group(1))
    lat = grab(r"time for request:\s+(\S+)\s+(\S+)\s+(\S+)")
    r["mean_ms"] = to_ms(lat.group(3))
    r["output"] = out
    return r


def to_ms(text):
    m = re.match(r"([0-9.]+)(us|ms|s)$", text)
    if not m:
        return None
    return float(m.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)]


def measure(cluster, kind, conns, args, empty, grpc_port):
    port = cluster.http_port if kind == "http" else grpc_port
    before = grpc_counts(cluster.admin_port)
    replicas = cluster.replicas()
    t0 = (bench.cpu_ticks([cluster.d_pid]), bench.cpu_ticks(replicas))
    g0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = h2load(kind, port, conns, args.duration, args.warmup, empty)
    g1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t1 = (bench.cpu_ticks([cluster.d_pid]), bench.cpu_ticks(replicas))
    # h2load reports the measured period only; the warm-up's calls count in
    # the node's metrics too. (Its own CPU time covers the warm-up too: per
    # request it is a little high.)
    n = r["done"]
    per = lambda ticks: ticks * 1e6 / bench.CLK_TCK / n if n else None
    r["cpu_us_per_req"] = per(t1[0] - t0[0] + t1[1] - t0[1])
    r["node_us_per_req"] = per(t1[0] - t0[0])
    r["replicas_us_per_req"] = per(t1[1] - t0[1])
    r["h2load_us_per_req"] = ((g1.ru_utime + g1.ru_stime - g0.ru_utime - g0.ru_stime) * 1e6 / n
                              if n else None)
    problems = []
    if r["failed"] or r["ok_2xx"] != r["succeeded"] or r["succeeded"] != n:
        problems.append(f"{n} done, {r['succeeded']} succeeded, {r['ok_2xx']} 2xx, "
                        f"{r['failed']} failed")
    if kind != "http":
        after = wait_until("the gRPC calls in the node's metrics", 20,
                           lambda: (lambda a: a if a.get("OK", 0) - before.get("OK", 0) >= n
                                    else None)(grpc_counts(cluster.admin_port)),
                           interval=0.1, alive=cluster.check_alive)
        others = {k: v - before.get(k, 0) for k, v in after.items()
                  if k != "OK" and v - before.get(k, 0) > 0}
        # h2load ends its connections with the calls then in flight (one per
        # connection at most): those end CANCELLED, and it counts none of them.
        if others.get("CANCELLED", 0) <= conns:
            others.pop("CANCELLED", None)
        if others:
            problems.append(f"calls that did not end OK: {others}")
    r["problems"] = problems
    return r


def check_answers(cluster, grpc_port, empty):
    """One HTTP GET and one gRPC call answer what Fixed answers."""
    with urllib.request.urlopen(f"http://127.0.0.1:{cluster.http_port}/fixed/", timeout=10) as r:
        body = r.read()
    if body != b'{"ok":true}':
        raise Failure(f"GET /fixed/ answered {body!r}")
    out = subprocess.run(["curl", "-sS", "--http2-prior-knowledge", "-D", "-", "-o", "-",
                          "-H", "content-type: application/grpc", "-H", "te: trailers",
                          "--data-binary", "@" + empty,
                          f"http://127.0.0.1:{grpc_port}/fixed.Fixed/Get"],
                         capture_output=True, timeout=20).stdout
    want = b"\0\0\0\0\x0b" + b'{"ok":true}'
    if b"grpc-status: 0" not in out or want not in out:
        raise Failure(f"the gRPC call answered {out[-300:]!r}")


def median(values):
    v = sorted(x for x in values if x is not None)
    return v[len(v) // 2] if v else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--duration", type=float, default=6)
    ap.add_argument("--warmup", type=float, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", default="32")
    ap.add_argument("--json", help="write every measurement to this file")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (node logs)")
    args = ap.parse_args()
    if args.rounds < 1 or args.duration <= 0:
        log("run.py: --rounds must be >= 1 and --duration > 0")
        return 2
    concurrencies = [int(c) for c in args.concurrency.split()]
    for tool in ("h2load", "curl"):
        if shutil.which(tool) is None:
            log(f"run.py: {tool} is missing (Debian: apt-get install nghttp2-client curl)")
            return 2

    def on_term(signum, frame):
        raise KeyboardInterrupt()
    signal.signal(signal.SIGTERM, on_term)

    work = tempfile.mkdtemp(prefix="troupe-bench-grpc.")
    empty = os.path.join(work, "empty-message.bin")
    with open(empty, "wb") as f:
        f.write(b"\0\0\0\0\0")  # a gRPC message of 0 bytes
    grpc_port = free_port()
    cluster = bench.Cluster(args.build, work, d_args=["--grpc-port", str(grpc_port)])
    results = []
    failed = False
    try:
        cluster.start()
        path = os.path.join(work, "fixed.yaml")
        with open(path, "w") as f:
            f.write(DEPLOY)
        r = cluster.ctl("deploy", path, "--wait", "--wait-timeout", "120", timeout=150)
        if r.returncode != 0:
            raise Failure(f"troupectl deploy failed: {r.stdout}{r.stderr}")
        wait_until("both replicas as processes of worker d", 60,
                   lambda: len(cluster.replicas()) == REPLICAS, alive=cluster.check_alive)
        check_answers(cluster, grpc_port, empty)
        print(f"gRPC benchmark: troupe {bench.git_commit()}, {bench.nproc()} cores, load "
              f"{bench.loadavg()}; Fixed, {REPLICAS} replica processes on worker d (node "
              f"defaults), h2load -t1 -m1, {args.duration:g} s after {args.warmup:g} s")
        print(f"{'round':>5} {'conc':>5} {'path':<5} {'req/s':>9} {'mean ms':>8} "
              f"{'cpu us/req':>11}  notes")
        for rnd in range(1, args.rounds + 1):
            for c in concurrencies:
                order = list(KINDS) if rnd % 2 else list(reversed(KINDS))
                row = {"round": rnd, "concurrency": c}
                for kind in order:
                    m = measure(cluster, kind, c, args, empty, grpc_port)
                    row[kind] = m
                    failed |= bool(m["problems"])
                    cpu = m["cpu_us_per_req"]
                    print(f"{rnd:>5} {c:>5} {kind:<5} {m['rps']:>9.0f} "
                          f"{m['mean_ms'] or 0:>8.2f} {cpu or 0:>11.1f}  "
                          f"node {m['node_us_per_req'] or 0:.1f}, replicas "
                          f"{m['replicas_us_per_req'] or 0:.1f}, h2load "
                          f"{m['h2load_us_per_req'] or 0:.1f} us/req  "
                          f"{'; '.join(m['problems'])}", flush=True)
                row["ratio"] = row["grpc"]["rps"] / row["http"]["rps"]
                row["ratio_mux"] = row["grpc-mux"]["rps"] / row["http"]["rps"]
                print(f"{rnd:>5} {c:>5} gRPC/HTTP {row['ratio']:.2f}, multiplexed "
                      f"{row['ratio_mux']:.2f}", flush=True)
                results.append(row)
        print()
        met_all = True
        for c in concurrencies:
            rows = [r for r in results if r["concurrency"] == c]
            http_rps = median([r["http"]["rps"] for r in rows])
            for key, kind, what in (("ratio", "grpc", "a connection per call"),
                                    ("ratio_mux", "grpc-mux", "one connection, multiplexed")):
                med = median([r[key] for r in rows])
                met = med is not None and med >= GOAL
                met_all &= met
                ratios = ", ".join(format(r[key], ".2f") for r in rows)
                print(f"concurrency {c}, gRPC {what}: {median([r[kind]['rps'] for r in rows]):.0f} "
                      f"req/s against HTTP/1.1's {http_rps:.0f}: median {med:.2f} over "
                      f"{len(rows)} rounds ({ratios}); goal >= {GOAL}: "
                      f"{'met' if met else 'NOT met'}")
        if args.json:
            for r in results:
                for kind in KINDS:
                    r[kind].pop("output", None)
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
        if failed:
            log("run.py: some answers were wrong (see the notes); the figures do not count")
            return 2
        return 0 if met_all else 1
    except Failure as e:
        log(f"run.py: {e}")
        for name in cluster.logs:
            log(f"--- {name}'s log (last lines):\n{cluster.tail(name)}")
        return 2
    except KeyboardInterrupt:
        log("run.py: interrupted")
        return 2
    finally:
        exits = cluster.stop()
        for name, how in exits.items():
            if how != "exit 0":
                log(f"run.py: {name}: {how}")
        if args.keep:
            log(f"run.py: work dir kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
