#!/usr/bin/python3
"""A gRPC client nobody in troupe wrote: Python's grpcio (Debian's
python3-grpcio), calling the Greeter example (examples/grpc/greeter.proto)
through a node's gRPC port. Its protobuf and gRPC code is generated here, at
test time, from the repository's .proto with Debian's protoc and
grpc_python_plugin. Used by tests/integration/grpc_test.cpp; prints one JSON
object per call on stdout:

  {"code": "OK", "details": "...", "replies": [{message, index, replica_id}],
   "metadata": {...initial metadata...}, "cancel_ns": <CLOCK_MONOTONIC ns>}

Usage: grpc_client.py --port P --proto FILE --gen DIR [--app NAME] [--ca FILE]
                      [--timeout S] [--meta k=v]... CALL [args]
  say NAME                       SayHello
  count NAME N MS [--take K]     CountHellos; with --take, cancels after K replies
  wait MS [--cancel-after S]     Wait; with --cancel-after, cancels after S seconds
  crash                          Crash
  raw METHOD HEX [--repeat N]    a unary call with these bytes as the message
                                 (N calls in turn: "raws", the answers in order)
  big MB                         SayHello whose name is MB MiB long
  many NAME CALLS THREADS        CALLS SayHello calls from THREADS threads:
                                 {"ok": n, "codes": {...}, "replicas": [...]}
"""
import argparse
import importlib
import json
import os
import subprocess
import sys
import threading
import time


def generate(proto, gen):
    os.makedirs(gen, exist_ok=True)
    subprocess.run(["protoc", "-I", os.path.dirname(proto), "--python_out=" + gen,
                    "--grpc_out=" + gen, "--plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin",
                    proto], check=True)
    sys.path.insert(0, gen)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--proto", required=True)
    p.add_argument("--gen", required=True)
    p.add_argument("--app")
    p.add_argument("--timeout", type=float)
    p.add_argument("--meta", action="append", default=[])
    p.add_argument("--ca", help="TLS: the PEM CA file that signed the port's certificate")
    p.add_argument("call")
    p.add_argument("args", nargs="*")
    p.add_argument("--take", type=int)
    p.add_argument("--cancel-after", type=float)
    p.add_argument("--repeat", type=int)
    a = p.parse_args()

    generate(a.proto, a.gen)
    import grpc
    pb = importlib.import_module("greeter_pb2")
    stubs = importlib.import_module("greeter_pb2_grpc")

    target = "127.0.0.1:%d" % a.port
    if a.ca:
        with open(a.ca, "rb") as f:
            creds = grpc.ssl_channel_credentials(root_certificates=f.read())
        channel = grpc.secure_channel(target, creds)
    else:
        channel = grpc.insecure_channel(target)
    stub = stubs.GreeterStub(channel)
    metadata = [tuple(m.split("=", 1)) for m in a.meta]
    if a.app:
        metadata.append(("application", a.app))
    out = {"code": "OK", "details": "", "replies": [], "metadata": {}}

    def reply(r):
        return {"message": r.message, "index": r.index, "replica_id": r.replica_id}

    def failed(e):
        out["code"] = e.code().name
        out["details"] = e.details() or ""

    try:
        if a.call == "say":
            r, call = stub.SayHello.with_call(pb.HelloRequest(name=a.args[0]), timeout=a.timeout,
                                              metadata=metadata)
            out["replies"].append(reply(r))
            out["metadata"] = dict(call.initial_metadata())
        elif a.call == "count":
            it = stub.CountHellos(pb.HelloRequest(name=a.args[0], count=int(a.args[1]),
                                                  interval_ms=int(a.args[2])),
                                  timeout=a.timeout, metadata=metadata)
            for r in it:
                out["replies"].append(reply(r))
                if a.take is not None and len(out["replies"]) >= a.take:
                    out["cancel_ns"] = time.monotonic_ns()
                    it.cancel()
                    break
            if a.take is None:
                out["metadata"] = dict(it.initial_metadata())
        elif a.call == "wait":
            future = stub.Wait.future(pb.HelloRequest(interval_ms=int(a.args[0])),
                                      timeout=a.timeout, metadata=metadata)
            if a.cancel_after is not None:
                time.sleep(a.cancel_after)
                out["cancel_ns"] = time.monotonic_ns()
                future.cancel()
            out["replies"].append(reply(future.result()))
        elif a.call == "big":
            name = "x" * (int(a.args[0]) << 20)
            stub.SayHello(pb.HelloRequest(name=name), timeout=a.timeout, metadata=metadata)
        elif a.call == "crash":
            stub.Crash(pb.HelloRequest(), timeout=a.timeout, metadata=metadata)
        elif a.call == "raw":
            method = channel.unary_unary(a.args[0])
            if a.repeat is None:
                out["raw"] = method(bytes.fromhex(a.args[1]), timeout=a.timeout,
                                    metadata=metadata).hex()
            else:
                out["raws"] = [method(bytes.fromhex(a.args[1]), timeout=a.timeout,
                                      metadata=metadata).hex() for _ in range(a.repeat)]
        elif a.call == "many":
            calls, threads = int(a.args[1]), int(a.args[2])
            codes, replicas, lock = {}, set(), threading.Lock()

            def worker(n):
                for _ in range(n):
                    try:
                        r = stub.SayHello(pb.HelloRequest(name=a.args[0]), timeout=a.timeout,
                                          metadata=metadata)
                        code = "OK" if r.message == "Hello, %s!" % a.args[0] else "WRONG"
                        with lock:
                            replicas.add(r.replica_id)
                    except grpc.RpcError as e:
                        code = e.code().name
                    with lock:
                        codes[code] = codes.get(code, 0) + 1

            ts = [threading.Thread(target=worker, args=(calls // threads,))
                  for _ in range(threads)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            out["codes"] = codes
            out["replicas"] = sorted(replicas)
        else:
            print("unknown call " + a.call, file=sys.stderr)
            return 2
    except grpc.FutureCancelledError:
        out["code"] = "CANCELLED"
    except grpc.RpcError as e:
        failed(e)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
