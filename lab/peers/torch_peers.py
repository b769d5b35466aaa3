#!/usr/bin/env python3
"""PyTorch peers for lab, run beside lab's own kernels on the same inputs.

Reads one JSON request on stdin, runs the op on the GPU with the timing protocol lab uses
(warm-up rounds until the median settles, L2 scrubbed before every repetition unless "l2" is
"warm", eager calls or CUDA-graph replay, CUDA events around the op alone), writes the op's
output as raw little-endian bytes to the requested file, and prints one JSON line:
{"variant", "raw_ms", "warmup_ms", "launch", "torch", "device"}.

Request: {"op": "softmax" | "add" | "bias_gelu" | "layer_norm" | "rms_norm" | "linear" | "linear_backward" | "sdpa"
                | "sdpa_backward" | "moe_loop" | "moe_grouped_mm" | "moe_dense" | "moe_backward",
          "dtype": "f32" | "bf16" | "f16", "args": {...op arguments...},
          "inputs": [{"path": p, "shape": [...]}], "output": path, "warmup": n, "min_reps": n,
          "max_reps": n, "budget_ms": x, "l2_scrub_bytes": n, "l2": "cold" | "warm",
          "launch": "eager" | "graph", "settled": x, "max_warmup_rounds": n}
The output has the shape of the first input, except linear's ([M, N]), linear_backward's
(dX, dW and db flattened and concatenated, in that order), sdpa_backward's (dQ, dK, dV), moe_dense's (its first rows)
and moe_backward's (dx, d router, d gate_up, d down, flattened and concatenated).
"args": {"input_dtypes": [...]} gives an input a dtype of its own ("i32", "f32"; null: "dtype").

"dataloader" is the loader's peer and reads no inputs: torch.utils.data.DataLoader over the
file args["path"] cut into samples of args["sample_bytes"], in the order of args["order"]
(u64 sample indices), args["workers"] workers, batches of args["batch"], pinned and copied with
non_blocking=True or pageable and copied as they come (args["pin_memory"]). Each repetition is
one epoch on the host clock, ending with the device synchronised; the output is one int64 per
delivered sample, sum(byte_j * (j % 251 + 1)), computed on the GPU after timing.
"""
import json
import os
import sys
import time

import numpy as np
import torch

DTYPES = {"f32": (torch.float32, np.float32), "bf16": (torch.bfloat16, np.uint16), "f16": (torch.float16, np.float16),
          "i32": (torch.int32, np.int32)}


# linear's activations, as the lab's kernels define them (GeLU in its tanh form).
ACTIVATIONS = {
    "relu": torch.nn.functional.relu,
    "gelu": lambda v: torch.nn.functional.gelu(v, approximate="tanh"),
    "none": lambda v: v,
}


def load(path, dtype, shape):
    tdtype, ndtype = DTYPES[dtype]
    t = torch.from_numpy(np.fromfile(path, dtype=ndtype).reshape(shape))
    if dtype == "bf16":
        t = t.view(torch.bfloat16)
    return t.cuda()


def save(t, path, dtype):
    if isinstance(t, (tuple, list)):
        t = torch.cat([g.reshape(-1) for g in t])
    t = t.contiguous().cpu()
    if dtype == "bf16":
        t = t.view(torch.int16)
    t.numpy().tofile(path)


def ops(req, inputs):
    """The op under test as a closure that stores its output in out["y"], and its name."""
    op, args = req["op"], req.get("args", {})
    F = torch.nn.functional
    out = {}
    if op == "softmax":
        (x,) = inputs
        fn, name = (lambda: torch.softmax(x, dim=-1)), "torch.softmax"
    elif op == "add":
        a, b = inputs
        c = torch.empty_like(a)
        fn, name = (lambda: torch.add(a, b, out=c)), "torch.add"
    elif op == "bias_gelu":
        x, b = inputs
        approx = args["approximate"]

        def bias_gelu(x, b):
            return F.gelu(x + b, approximate=approx)

        if args.get("compile"):
            compiled = torch.compile(bias_gelu)
            fn, name = (lambda: compiled(x, b)), f"torch.compile(gelu(x+b, {approx}))"
        else:
            fn, name = (lambda: bias_gelu(x, b)), f"torch gelu(x+b, {approx})"
    elif op == "layer_norm":
        x, g, b = inputs
        fn, name = (lambda: F.layer_norm(x, (x.shape[-1],), g, b, args["eps"])), "torch.layer_norm"
    elif op == "linear":
        x, w, b = inputs
        act = ACTIVATIONS[args["act"]]
        fn, name = (lambda: act(F.linear(x, w, b))), f"torch {args['act']}(linear)"
    elif op == "linear_backward":
        x, w, b, dy = inputs
        act = ACTIVATIONS[args["act"]]
        leaves = [t.detach().requires_grad_() for t in (x, w, b)]
        y = act(F.linear(*leaves))
        # Timed: the backward alone (activation gradient, two GEMMs, bias reduction); the
        # concatenation for the output file happens after timing.
        fn, name = (lambda: torch.autograd.grad(y, leaves, dy, retain_graph=True)), f"torch {args['act']}(linear) backward"
    elif op == "sdpa":
        # [batch, seq, heads, dim] as FlashAttention stores it; SDPA takes [batch, heads, seq, dim]
        # views of the same memory. One backend per request, named in the variant.
        from torch.nn.attention import SDPBackend, sdpa_kernel

        q, k, v = (t.transpose(1, 2) for t in inputs)
        backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                    "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
        backend, gqa = backends[args["backend"]], q.shape[1] != k.shape[1]

        def sdpa():
            with sdpa_kernel(backend):
                y = F.scaled_dot_product_attention(q, k, v, is_causal=args["causal"], enable_gqa=gqa)
            return y.transpose(1, 2)

        fn, name = sdpa, f"torch sdpa ({args['backend']})"
    elif op == "sdpa_backward":
        # Inputs q, k, v, dO as for sdpa; timed: the backward alone (autograd from dO through one
        # forward kept alive), dQ, dK, dV returned in [batch, seq, heads, dim].
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                    "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
        backend = backends[args["backend"]]
        leaves = [t.detach().requires_grad_() for t in inputs[:3]]
        q, k, v = (t.transpose(1, 2) for t in leaves)
        dy = inputs[3].transpose(1, 2)
        with sdpa_kernel(backend):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=args["causal"], enable_gqa=q.shape[1] != k.shape[1])

        def sdpa_backward():
            with sdpa_kernel(backend):
                return torch.autograd.grad(y, leaves, dy, retain_graph=True)

        fn, name = sdpa_backward, f"torch sdpa ({args['backend']}) backward"
    elif op in ("moe_loop", "moe_grouped_mm"):
        # The lab's layer on its routing: x [T, H], gate/up [E, H, 2I] interleaved (column 2i is
        # gate i), down [E, I, H], experts and weights [T, k]; combine in f32 as the lab does.
        x, w13, w2, idx, wts = inputs
        E, k = w13.shape[0], idx.shape[1]

        def swiglu(gu):
            return F.silu(gu[:, 0::2]) * gu[:, 1::2]

        if op == "moe_loop":
            # transformers' Mixtral loop: a boolean mask per expert, a host sync in torch.where.
            mask = F.one_hot(idx.long(), E).permute(2, 1, 0)

            def moe():
                acc = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
                for e in range(E):
                    slot, tok = torch.where(mask[e])
                    if tok.numel() == 0:
                        continue
                    y = swiglu(x[tok] @ w13[e]) @ w2[e]
                    acc.index_add_(0, tok, y.float() * wts[tok, slot, None])
                return acc.to(x.dtype)

            fn, name = moe, "torch per-expert loop"
        else:
            if not hasattr(torch, "_grouped_mm"):
                raise SystemExit(f"torch_peers: torch {torch.__version__} has no torch._grouped_mm")
            flat = idx.reshape(-1).long()

            def moe():
                order = torch.argsort(flat, stable=True)
                offs = torch.cumsum(torch.bincount(flat, minlength=E), 0).to(torch.int32)
                tok = order // k
                xs = x[tok]
                h = swiglu(torch._grouped_mm(xs, w13, offs=offs)).contiguous()
                y = torch._grouped_mm(h, w2, offs=offs)
                acc = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
                acc.index_add_(0, tok, y.float() * wts.reshape(-1)[order, None])
                return acc.to(x.dtype)

            fn, name = moe, "torch._grouped_mm"
    elif op == "moe_backward":
        # The lab's layer and objective, J = sum(out * dout) + d_aux aux + d_z z, on the lab's
        # selection idx (dropless, no noise): scores from the logits rounded to the input type
        # (softmax or sigmoid, renormalised or not), the Switch loss with the load histogram a
        # constant, the z-loss, transformers' per-expert loop, the combine in f32. Timed: the
        # backward alone, through one forward kept alive.
        x, router, w13, w2, dout, idx = inputs
        E, k, T = w13.shape[0], idx.shape[1], x.shape[0]
        leaves = [t.detach().requires_grad_() for t in (x, router, w13, w2)]
        xl, rl, w13l, w2l = leaves
        logits = (xl @ rl).float()
        scores = torch.sigmoid(logits) if args["scoring"] == "sigmoid" else torch.softmax(logits, dim=-1)
        wts = scores.gather(1, idx.long())
        if args["renorm"]:
            wts = wts / wts.sum(dim=-1, keepdim=True)
        load = torch.bincount(idx.reshape(-1).long(), minlength=E).float() / (T * k)
        aux = args["alpha"] * E * (load * (scores / scores.sum(dim=-1, keepdim=True)).mean(dim=0)).sum()
        z = (torch.logsumexp(logits, dim=-1) ** 2).mean()
        mask = F.one_hot(idx.long(), E).permute(2, 1, 0)
        acc = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for e in range(E):
            slot, tok = torch.where(mask[e])
            if tok.numel() == 0:
                continue
            gu = xl[tok] @ w13l[e]
            y = (F.silu(gu[:, 0::2]) * gu[:, 1::2]) @ w2l[e]
            acc = acc.index_add(0, tok, y.float() * wts[tok, slot, None])
        objective = (acc.to(x.dtype).float() * dout.float()).sum() + args["d_aux"] * aux + args["d_z"] * z
        fn, name = (lambda: torch.autograd.grad(objective, leaves, retain_graph=True)), "torch autograd (per-expert loop)"
    elif op == "moe_dense":
        # A dense GEMM of the layer's flops: x repeated k times times expert 0's [gate up down^T].
        x, w13, w2 = inputs
        xr = x.repeat_interleave(args["k"], dim=0).contiguous()
        w = torch.cat([w13[0], w2[0].t()], dim=1).contiguous()
        rows = args["rows"]
        fn, name = (lambda: (xr @ w)[:rows]), "torch dense GEMM (same flops)"
    elif op == "rms_norm":
        x, g = inputs
        fn, name = (lambda: F.rms_norm(x, (x.shape[-1],), g, args["eps"])), "torch.rms_norm"
    else:
        raise SystemExit(f"torch_peers: unknown op {op!r}")

    def f():
        y = fn()
        out["y"] = c if op == "add" else y

    return f, name, out


def capture(f):
    """f captured as a CUDA graph (after warm-up calls on a side stream, as torch requires),
    or None when it cannot be captured; the caller then times it eagerly."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                f()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            f()
        return g
    except Exception as e:  # noqa: BLE001 - any capture failure means "time it eagerly"
        print(f"torch_peers: no graph ({e}); timing eagerly", file=sys.stderr)
        return None


def time_op(f, req):
    l2 = req.get("l2", "clean")
    scrub = torch.empty(max(req["l2_scrub_bytes"], 1 << 20), dtype=torch.uint8, device="cuda")
    graph = capture(f) if req.get("launch") == "graph" else None
    call = graph.replay if graph is not None else f

    def run(n):
        pairs = []
        for _ in range(n):
            if l2 == "cold":
                scrub.zero_()
            elif l2 == "clean":
                scrub.sum()  # read over: L2 left with clean lines only
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            call()
            e.record()
            pairs.append((s, e))
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in pairs]

    # The warm-up rule of lab's Budget::warm_up: rounds until the median settles.
    per_round, warm, best = max(req["warmup"], 1), [], float("inf")
    for i in range(req.get("max_warmup_rounds", 1)):
        r = run(per_round)
        median = float(np.median(r))
        warm += r
        settled = i > 0 and median >= best * (1 - req.get("settled", 0.0))
        best = min(best, median)
        if settled or sum(warm) > req["budget_ms"]:
            break
    median = float(np.median(warm[-per_round:]))
    reps = int(min(max(req["budget_ms"] / max(median, 1e-6), req["min_reps"]), req["max_reps"]))
    return warm, run(reps), call, "graph" if graph is not None else "eager"


class Samples(torch.utils.data.Dataset):
    """Fixed-size samples of a file, read with pread (each worker opens its own descriptor)."""

    def __init__(self, path, sample_bytes):
        self.path, self.size, self.fd = path, sample_bytes, None
        self.n = os.path.getsize(path) // sample_bytes

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.fd is None:
            self.fd = os.open(self.path, os.O_RDONLY)
        return torch.frombuffer(bytearray(os.pread(self.fd, self.size, i * self.size)), dtype=torch.uint8)


def dataloader(req):
    args = req["args"]
    pinned, workers, size = bool(args["pin_memory"]), int(args["workers"]), int(args["sample_bytes"])
    order = np.fromfile(args["order"], dtype=np.uint64).astype(np.int64).tolist()
    loader = torch.utils.data.DataLoader(
        Samples(args["path"], size), batch_size=int(args["batch"]), sampler=order, num_workers=workers,
        pin_memory=pinned, persistent_workers=workers > 0, prefetch_factor=4 if workers > 0 else None)
    weights = torch.arange(size, device="cuda", dtype=torch.int64) % 251 + 1

    def epoch(sums=None):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for x in loader:
            y = x.to("cuda", non_blocking=pinned)
            if sums is not None:
                sums.append((y.to(torch.int64) * weights).sum(1))
        torch.cuda.synchronize()
        return (time.perf_counter() - t) * 1e3

    warm = [epoch() for _ in range(max(1, min(req["warmup"], 2)))]
    raw = [epoch() for _ in range(req["min_reps"])]
    sums = []
    epoch(sums)
    torch.cat(sums).cpu().numpy().astype("<i8").tofile(req["output"])
    name = f"torch DataLoader ({'pin_memory, non_blocking' if pinned else 'pageable'})"
    print(json.dumps({"variant": name, "raw_ms": raw, "warmup_ms": warm, "launch": "host",
                      "torch": torch.__version__, "device": torch.cuda.get_device_name()}))


def main():
    req = json.load(sys.stdin)
    if not torch.cuda.is_available():
        raise SystemExit("torch_peers: torch sees no CUDA device")
    if req["op"] == "dataloader":
        return dataloader(req)
    own = req.get("args", {}).get("input_dtypes") or []
    inputs = [load(i["path"], (own[n] if n < len(own) else None) or req["dtype"], i["shape"]) for n, i in enumerate(req["inputs"])]
    f, variant, out = ops(req, inputs)
    warm, raw, call, launch = time_op(f, req)
    call()  # the checked output comes from a run after timing, like lab's own
    torch.cuda.synchronize()
    save(out["y"], req["output"], req["dtype"])
    print(json.dumps({"variant": variant, "raw_ms": raw, "warmup_ms": warm, "launch": launch,
                      "torch": torch.__version__, "device": torch.cuda.get_device_name()}))


if __name__ == "__main__":
    main()
