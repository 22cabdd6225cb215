#!/usr/bin/env python3
"""Autoscaling reaction times, measured on a real one-node cluster.

Starts troupe-node (head) on free loopback ports, deploys a Sleep deployment
with autoscaling (min 1, max 6, target 2 ongoing requests per replica), puts
20 concurrent clients on it through the node's HTTP proxy, and reports
  - the time from the load step to 6 RUNNING replicas, and
  - the time from the end of the load to 1 RUNNING replica again,
for the delays configured below (printed with the results). Every process it
starts is stopped at the end, also on failure. Loopback only; bounded in time.

Usage: tools/bench/autoscale/autoscale_bench.py [--build build] [--runs 3]
"""
import argparse, json, os, shutil, signal, socket, subprocess, sys, tempfile, threading, time
import urllib.request

CONFIG = """applications:
  - name: sleepy
    route_prefix: /sleep
    import_path: libtroupe_examples.so:Sleep
    deployments:
      - name: Sleep
        max_ongoing_requests: 5
        graceful_shutdown_timeout_s: 2
        autoscaling_config:
          min_replicas: 1
          max_replicas: 6
          target_ongoing_requests: 2
          metrics_interval_s: {interval}
          look_back_period_s: {look_back}
          upscale_delay_s: {up}
          downscale_delay_s: {down}
"""


def free_port():
    for _ in range(1000):
        port = 20000 + int.from_bytes(os.urandom(2), "little") % 12000
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                pass
    raise RuntimeError("no free port")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(os.path.dirname(__file__), "../../../build"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--look-back", type=float, default=2.0)
    ap.add_argument("--upscale-delay", type=float, default=1.0)
    ap.add_argument("--downscale-delay", type=float, default=5.0)
    args = ap.parse_args()
    bin_dir = os.path.abspath(os.path.join(args.build, "bin"))
    work = tempfile.mkdtemp(prefix="troupe-autoscale-")
    procs = []

    def cleanup(*_):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)

    signal.signal(signal.SIGINT, lambda *_: (cleanup(), sys.exit(130)))
    try:
        port, http = free_port(), free_port()
        address = f"127.0.0.1:{port}"
        log = open(os.path.join(work, "head.log"), "w")
        procs.append(subprocess.Popen(
            [f"{bin_dir}/troupe-node", "--head", "--port", str(port), "--http-port", str(http),
             "--admin-port", "0", "--state-dir", os.path.join(work, "head")], stdout=log, stderr=log))

        def ctl(*a, timeout=60):
            return subprocess.run([f"{bin_dir}/troupectl", "--address", address, *a],
                                  capture_output=True, text=True, timeout=timeout)

        deadline = time.time() + 30
        while ctl("--timeout", "1", "nodes").returncode != 0:
            if time.time() > deadline:
                raise RuntimeError("the node did not come up")
            time.sleep(0.1)  # poll interval
        config = os.path.join(work, "sleep.yaml")
        with open(config, "w") as f:
            f.write(CONFIG.format(interval=args.interval, look_back=args.look_back,
                                  up=args.upscale_delay, down=args.downscale_delay))
        r = ctl("deploy", config, "--wait")
        if r.returncode != 0:
            raise RuntimeError(r.stderr)

        def running():
            r = ctl("status", "--json", timeout=10)
            if r.returncode != 0:
                return -1
            dep = json.loads(r.stdout)["applications"]["sleepy"]["deployments"]["Sleep"]
            return sum(1 for x in dep["replicas"] if x["state"] == "RUNNING")

        def wait_for(n, limit):
            start = time.time()
            while time.time() - start < limit:
                if running() == n:
                    return time.time()
                time.sleep(0.05)  # poll interval
            return None

        results = []
        for run in range(args.runs):
            if wait_for(1, 120) is None:
                raise RuntimeError("did not settle at 1 replica")
            stop = threading.Event()
            stats = {"ok": 0, "failed": 0}
            lock = threading.Lock()

            def client():
                while not stop.is_set():
                    try:
                        with urllib.request.urlopen(f"http://127.0.0.1:{http}/sleep/?ms=200",
                                                    timeout=30) as resp:
                            ok = resp.status == 200
                    except Exception:
                        ok = False
                    with lock:
                        stats["ok" if ok else "failed"] += 1

            threads = [threading.Thread(target=client) for _ in range(20)]
            t0 = time.time()
            for t in threads:
                t.start()
            t_up = wait_for(6, 120)
            stop.set()
            for t in threads:
                t.join()
            t1 = time.time()
            t_down = wait_for(1, 180)
            results.append({"up_s": None if t_up is None else t_up - t0,
                            "down_s": None if t_down is None else t_down - t1,
                            "requests_ok": stats["ok"], "requests_failed": stats["failed"]})
            print(f"run {run + 1}: {results[-1]}", flush=True)

        print()
        print(f"delays: metrics_interval_s {args.interval}, look_back_period_s {args.look_back}, "
              f"upscale_delay_s {args.upscale_delay}, downscale_delay_s {args.downscale_delay}")
        print(f"{'run':>4} {'load -> 6 replicas (s)':>24} {'idle -> 1 replica (s)':>23} "
              f"{'ok':>6} {'failed':>7}")
        for i, r in enumerate(results):
            fmt = lambda v: "timeout" if v is None else f"{v:.2f}"
            print(f"{i + 1:>4} {fmt(r['up_s']):>24} {fmt(r['down_s']):>23} "
                  f"{r['requests_ok']:>6} {r['requests_failed']:>7}")
        return 0 if all(r["up_s"] is not None and r["down_s"] is not None for r in results) else 1
    finally:
        cleanup()


if __name__ == "__main__":
    sys.exit(main())
