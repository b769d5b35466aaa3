#!/usr/bin/env python3
"""PyTorch peers for lab, run beside lab's own kernels on the same inputs.

Reads one JSON request on stdin, runs the op on the GPU with the timing protocol lab uses
(warm-up, L2 scrubbed before every repetition, CUDA events around the op alone), writes the
op's output as raw little-endian bytes to the requested file, and prints one JSON line:
{"variant", "raw_ms", "warmup", "torch", "device"}.

Request: {"op": "softmax" | "add", "dtype": "f32" | "bf16" | "f16", "shape": [...],
          "inputs": [paths], "output": path, "warmup": n, "min_reps": n, "max_reps": n,
          "budget_ms": x, "l2_scrub_bytes": n}
"""
import json
import sys

import numpy as np
import torch

DTYPES = {"f32": (torch.float32, np.float32), "bf16": (torch.bfloat16, np.uint16), "f16": (torch.float16, np.float16)}


def load(path, dtype, shape):
    tdtype, ndtype = DTYPES[dtype]
    t = torch.from_numpy(np.fromfile(path, dtype=ndtype).reshape(shape))
    if dtype == "bf16":
        t = t.view(torch.bfloat16)
    return t.cuda()


def save(t, path, dtype):
    t = t.contiguous().cpu()
    if dtype == "bf16":
        t = t.view(torch.int16)
    t.numpy().tofile(path)


def ops(req, inputs):
    """The op under test as a closure, its name, and its output tensor."""
    op = req["op"]
    if op == "softmax":
        (x,) = inputs
        out = {}

        def f():
            out["y"] = torch.softmax(x, dim=-1)

        return f, "torch.softmax", out
    if op == "add":
        a, b = inputs
        c = torch.empty_like(a)
        out = {"y": c}

        def f():
            torch.add(a, b, out=c)

        return f, "torch.add", out
    raise SystemExit(f"torch_peers: unknown op {op!r}")


def time_op(f, req):
    scrub = torch.empty(max(req["l2_scrub_bytes"], 1 << 20), dtype=torch.uint8, device="cuda")

    def run(n):
        pairs = []
        for _ in range(n):
            scrub.zero_()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            f()
            e.record()
            pairs.append((s, e))
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in pairs]

    warm = run(max(req["warmup"], 1))
    median = float(np.median(warm))
    reps = int(min(max(req["budget_ms"] / max(median, 1e-6), req["min_reps"]), req["max_reps"]))
    return warm, run(reps)


def main():
    req = json.load(sys.stdin)
    if not torch.cuda.is_available():
        raise SystemExit("torch_peers: torch sees no CUDA device")
    inputs = [load(p, req["dtype"], req["shape"]) for p in req["inputs"]]
    f, variant, out = ops(req, inputs)
    warm, raw = time_op(f, req)
    f()  # the checked output comes from a run after timing, like lab's own
    torch.cuda.synchronize()
    save(out["y"], req["output"], req["dtype"])
    print(json.dumps({"variant": variant, "raw_ms": raw, "warmup": len(warm),
                      "torch": torch.__version__, "device": torch.cuda.get_device_name()}))


if __name__ == "__main__":
    main()
