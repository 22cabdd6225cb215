#!/usr/bin/python3
"""An Open Inference Protocol client nobody in troupe wrote: Python's grpcio
(Debian's python3-grpcio) with code generated here, at test time, from the
repository's schemas/grpc_predict_v2.proto by Debian's protoc and
grpc_python_plugin. Used by tests/integration/oip_test.cpp; prints one JSON
object on stdout:

  {"code": "OK", "details": "...", ...what the call answered}

Usage: oip_client.py --port P --proto FILE --gen DIR [--timeout S] CALL [args]
  live | ready | server-meta        ServerLive, ServerReady, ServerMetadata
  model-ready NAME [VERSION]        ModelReady: {"ready": bool}
  model-meta NAME [VERSION]         ModelMetadata: {"name", "versions", "platform",
                                    "inputs": [{name, datatype, shape}], "outputs": [...]}
  infer NAME ROWS_FILE [--raw] [--version V] [--datatype T] [--shape a,b]
                                    ModelInfer of the rows in ROWS_FILE (a JSON list
                                    of lists of numbers) as input "features": typed
                                    fp32_contents, or raw_input_contents with --raw;
                                    --datatype and --shape override what is declared.
                                    {"model_name", "model_version", "id", "outputs":
                                    [{name, datatype, shape, "data": [...], "raw": bool}]}
  raw-infer HEX                     ModelInfer with these bytes as the message
  big NAME MB                       ModelInfer of one FP32 input of MB MiB (raw contents)
"""
import argparse
import importlib
import json
import struct
import sys

# Code generation from the .proto, shared with the Greeter's client (same
# directory, so on sys.path).
from grpc_client import generate


def tensors(message, raws):
    out = []
    for i, t in enumerate(message):
        entry = {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
        if i < len(raws):
            entry["raw"] = True
            if t.datatype == "FP32":
                entry["data"] = [v[0] for v in struct.iter_unpack("<f", raws[i])]
            elif t.datatype == "INT64":
                entry["data"] = [v[0] for v in struct.iter_unpack("<q", raws[i])]
            else:
                entry["data"] = raws[i].hex()
        else:
            entry["raw"] = False
            c = t.contents
            entry["data"] = list(c.fp32_contents) or list(c.int64_contents) or \
                list(c.int_contents) or list(c.fp64_contents) or list(c.bool_contents) or \
                [b.decode() for b in c.bytes_contents]
        out.append(entry)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--proto", required=True)
    p.add_argument("--gen", required=True)
    p.add_argument("--timeout", type=float, default=30)
    p.add_argument("--raw", action="store_true")
    p.add_argument("--version", default="")
    p.add_argument("--datatype", default="FP32")
    p.add_argument("--shape")
    p.add_argument("call")
    p.add_argument("args", nargs="*")
    a = p.parse_args()

    generate(a.proto, a.gen)
    import grpc
    pb = importlib.import_module("grpc_predict_v2_pb2")
    stubs = importlib.import_module("grpc_predict_v2_pb2_grpc")
    channel = grpc.insecure_channel("127.0.0.1:%d" % a.port)
    stub = stubs.GRPCInferenceServiceStub(channel)
    out = {"code": "OK", "details": ""}
    try:
        if a.call == "live":
            out["live"] = stub.ServerLive(pb.ServerLiveRequest(), timeout=a.timeout).live
        elif a.call == "ready":
            out["ready"] = stub.ServerReady(pb.ServerReadyRequest(), timeout=a.timeout).ready
        elif a.call == "server-meta":
            r = stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=a.timeout)
            out.update(name=r.name, version=r.version, extensions=list(r.extensions))
        elif a.call == "model-ready":
            r = stub.ModelReady(pb.ModelReadyRequest(name=a.args[0], version=(a.args[1:] or [""])[0]),
                                timeout=a.timeout)
            out["ready"] = r.ready
        elif a.call == "model-meta":
            r = stub.ModelMetadata(
                pb.ModelMetadataRequest(name=a.args[0], version=(a.args[1:] or [""])[0]),
                timeout=a.timeout)
            specs = lambda ts: [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
                                for t in ts]
            out.update(name=r.name, versions=list(r.versions), platform=r.platform,
                       inputs=specs(r.inputs), outputs=specs(r.outputs))
        elif a.call == "infer":
            with open(a.args[1]) as f:
                rows = json.load(f)
            flat = [float(v) for row in rows for v in row]
            shape = [int(d) for d in a.shape.split(",")] if a.shape else \
                [len(rows), len(rows[0]) if rows else 0]
            req = pb.ModelInferRequest(model_name=a.args[0], model_version=a.version,
                                       id="oip-client")
            t = req.inputs.add(name="features", datatype=a.datatype, shape=shape)
            if a.raw:
                req.raw_input_contents.append(struct.pack("<%df" % len(flat), *flat))
            else:
                t.contents.fp32_contents.extend(flat)
            r = stub.ModelInfer(req, timeout=a.timeout)
            out.update(model_name=r.model_name, model_version=r.model_version, id=r.id,
                       outputs=tensors(r.outputs, list(r.raw_output_contents)))
        elif a.call == "big":
            n = (int(a.args[1]) << 20) // 4
            req = pb.ModelInferRequest(model_name=a.args[0])
            req.inputs.add(name="features", datatype="FP32", shape=[n // 30, 30])
            req.raw_input_contents.append(bytes((n // 30) * 30 * 4))
            stub.ModelInfer(req, timeout=a.timeout)
        elif a.call == "raw-infer":
            method = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
            out["raw"] = method(bytes.fromhex(a.args[0]), timeout=a.timeout).hex()
        else:
            print("unknown call " + a.call, file=sys.stderr)
            return 2
    except grpc.RpcError as e:
        out["code"] = e.code().name
        out["details"] = e.details() or ""
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
