"""transformers beside the lab's Llama engine, on the same GGUF (transformers dequantizes it to
f32): the tokenizer's ids for test strings, and for prompts given as token ids the logits after
the prompt, a greedy continuation with the gap between the two best logits at every step, and the
eager decode rate. Reads a JSON request on stdin, writes logits as raw little-endian f32 files
and a JSON answer on stdout."""
import json
import os
import sys
import time

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer


def greedy(model, ids, n):
    """n greedy tokens after ids with the KV cache, on the raw logits (no logits processor, no stop
    at end of sequence: the lab's engine runs the same way), the lowest id winning a tie; the gap
    between the two best logits at every step, and the logits after the prompt."""
    x, past, tokens, gaps, first = torch.tensor([ids], device="cuda"), None, [], [], None
    for _ in range(n):
        out = model(input_ids=x, past_key_values=past, use_cache=True)
        logits = out.logits[0, -1].float()
        first = logits if first is None else first
        top = torch.topk(logits, 2).values
        gaps.append((top[0] - top[1]).item())
        t = int(torch.argmax(logits).item())
        tokens.append(t)
        past, x = out.past_key_values, torch.tensor([[t]], device="cuda")
    return tokens, gaps, first


def main():
    req = json.load(sys.stdin)
    folder, name = os.path.split(os.path.abspath(req["gguf"]))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=torch.float32).to("cuda").eval()
    answer = {
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "device": torch.cuda.get_device_name()},
        "encodings": [tok(t, add_special_tokens=False)["input_ids"] for t in req.get("texts", [])],
        "prompts": [],
    }
    n = int(req["new_tokens"])
    for i, ids in enumerate(req["prompts"]):
        with torch.no_grad():
            tokens, gaps, first = greedy(model, ids, n)
            path = os.path.join(req["out_dir"], f"logits{i}.bin")
            first.cpu().numpy().astype("<f4").tofile(path)
            # The eager rate: the same continuation again, timed as a whole.
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            greedy(model, ids, n)
            torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
        top = torch.topk(first, 16)
        answer["prompts"].append({
            "greedy": tokens, "gaps": gaps, "logits": path, "decode_tokens_s": n / seconds,
            "top": [[int(i), float(v)] for v, i in zip(top.values.tolist(), top.indices.tolist())],
        })
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
