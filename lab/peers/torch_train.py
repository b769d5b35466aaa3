# The lab's training run again in PyTorch: the same Llama (SmolLM2's design), the same initial
# weights (the lab's checkpoint at step 0), the same batches, torch.optim.AdamW with a LambdaLR of
# the lab's schedule, and clip_grad_norm_. fp32 throughout (or f64 on request), deterministic.
#
# Request (JSON on stdin):
#   {"init": checkpoint.safetensors, "batches": safetensors with one I32 tensor "tokens"
#    [steps, rows, seq + 1], "config": the model config (lab::model::llama::Config),
#    "optimizer": the optimizer's settings (lab::train::optim::AdamW),
#    "dtype": optional, "float32" (the default, the lab's) or "float64" (the same run in f64: the
#    trajectory both f32 runs are judged against when they part),
#    "attention": optional, "bfloat16" rounds the attention's inputs and output to bf16 and their
#    gradients with them, as the lab's GPU path does around its 16-bit attention kernels}
# Reply (the last line of stdout, JSON):
#   {"torch", "device", "steps": [{"loss", "lr", "grad_norm", "ms"}, ...]}
#
# The model is written out in plain ops rather than taken from transformers: the lab's RoPE turns
# neighbouring pairs (2i, 2i + 1), as llama.cpp reads a llama GGUF, where transformers' Llama
# turns the halves (i, i + d/2).

import json
import math
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS

import torch
import torch.nn.functional as F
from safetensors import safe_open


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_tables(cfg, seq, device):
    """cos and sin [seq, rope_dims / 2] in f64, as the lab computes its angles."""
    pos = torch.arange(seq, dtype=torch.float64, device=device)
    scaling = cfg["rope_scaling"]
    if isinstance(scaling, dict) and "Linear" in scaling:
        pos = pos / scaling["Linear"]["factor"]
    i = torch.arange(cfg["rope_dims"] // 2, dtype=torch.float64, device=device)
    angle = pos[:, None] * cfg["rope_base"] ** (-2.0 * i / cfg["rope_dims"])
    return angle.cos(), angle.sin()


def rope(x, cos, sin, rope_dims):
    """x [rows, seq, heads, head_dim]: pairs (2i, 2i + 1) of the first rope_dims turned by
    position x frequency, in f64 and rounded back, as the lab does."""
    turned, rest = x[..., :rope_dims].double(), x[..., rope_dims:]
    a, b = turned[..., 0::2], turned[..., 1::2]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    out = torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2).to(x.dtype)
    return torch.cat((out, rest), dim=-1)


def attention(q, k, v, heads, kv_heads):
    """Causal attention, [rows, seq, heads, head_dim]; query head h reads KV head h / group."""
    group = heads // kv_heads
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    seq = q.shape[2]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    mask = torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(1)
    p = scores.masked_fill(mask, float("-inf")).softmax(-1)
    return (p @ v).transpose(1, 2)


def bf16_round(t):
    """t rounded to bf16 and back: forward rounds the value, backward the gradient."""
    return t.to(torch.bfloat16).to(t.dtype)


def loss_of(p, cfg, tokens, cos, sin, attn_bf16=False):
    rows, seq = tokens.shape[0], tokens.shape[1] - 1
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    heads, kv_heads, hd, eps = cfg["heads"], cfg["kv_heads"], cfg["head_dim"], cfg["eps"]
    x = p["token_embd.weight"][inputs]
    for i in range(cfg["layers"]):
        w = lambda n: p[f"blk.{i}.{n}.weight"]  # noqa: E731
        h = rms_norm(x, w("attn_norm"), eps)
        q = (h @ w("attn_q").T).view(rows, seq, heads, hd)
        k = (h @ w("attn_k").T).view(rows, seq, kv_heads, hd)
        v = (h @ w("attn_v").T).view(rows, seq, kv_heads, hd)
        q, k = rope(q, cos, sin, cfg["rope_dims"]), rope(k, cos, sin, cfg["rope_dims"])
        if attn_bf16:
            q, k, v = bf16_round(q), bf16_round(k), bf16_round(v)
        att = attention(q, k, v, heads, kv_heads)
        if attn_bf16:
            att = bf16_round(att)
        att = att.reshape(rows, seq, heads * hd)
        x = x + att @ w("attn_output").T
        h = rms_norm(x, w("ffn_norm"), eps)
        x = x + (F.silu(h @ w("ffn_gate").T) * (h @ w("ffn_up").T)) @ w("ffn_down").T
    h = rms_norm(x, p["output_norm.weight"], eps)
    head = p["token_embd.weight"] if cfg["tied_embeddings"] else p["output.weight"]
    logits = h @ head.T
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def lr_at(o, step):
    """The lab's schedule (optim.rs AdamW::lr_at): linear warmup over `warmup` steps, then cosine
    from lr to min_lr at `steps`, and min_lr past it."""
    if step < o["warmup"]:
        return o["lr"] * (step + 1) / o["warmup"]
    span = max(o["steps"] - o["warmup"], 1)
    progress = min((step - o["warmup"]) / span, 1.0)
    return o["min_lr"] + (o["lr"] - o["min_lr"]) * 0.5 * (1.0 + math.cos(math.pi * progress))


def main():
    req = json.load(sys.stdin)
    cfg, o = req["config"], req["optimizer"]
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = {"float32": torch.float32, "float64": torch.float64}[req.get("dtype", "float32")]

    # Parameters in the checkpoint's own tensors (its Adam moments are zero at step 0 and unused).
    with safe_open(req["init"], framework="pt") as f:
        names = [n for n in f.keys() if not n.startswith("adam.")]
        p = {n: torch.nn.Parameter(f.get_tensor(n).to(device=device, dtype=dtype)) for n in names}
    with safe_open(req["batches"], framework="pt") as f:
        batches = f.get_tensor("tokens").to(device=device, dtype=torch.long)

    # Weight decay on matrices, not on norm weights (trainer.rs: spans of more than one dimension).
    decay = [t for t in p.values() if t.dim() > 1]
    plain = [t for t in p.values() if t.dim() <= 1]
    groups = [{"params": decay, "weight_decay": o["weight_decay"]}, {"params": plain, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_at(o, s) / o["lr"])

    cos, sin = rope_tables(cfg, batches.shape[2] - 1, device)
    steps = []
    for tokens in batches:
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_of(p, cfg, tokens, cos, sin, req.get("attention") == "bfloat16")
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(list(p.values()), o["clip"])
        lr = opt.param_groups[0]["lr"]
        opt.step()
        sched.step()
        loss = loss.item()
        if device == "cuda":
            torch.cuda.synchronize()
        ms = (time.perf_counter() - start) * 1e3
        steps.append({"loss": loss, "lr": lr, "grad_norm": norm.item(), "ms": ms})
        if not math.isfinite(loss):
            break
        print(f"step {len(steps)}: loss {loss:.4f}", file=sys.stderr)

    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print(json.dumps({"torch": torch.__version__, "device": name, "steps": steps}))


if __name__ == "__main__":
    main()
