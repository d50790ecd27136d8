#!/usr/bin/env python3
"""Hugging Face transformers `generate` on a `pagoda make-model` checkpoint: the peer of
`pagoda bench throughput --batch B --input I --output O`.

The same workload as pagoda's offline run: B prompts of I token ids each, the very ids pagoda
submits (regenerated here with pagoda's counter-based formula, src/pagoda/bench/counter_random.h,
from the same --seed and the tokenizer's size), all in one batch, greedy, exactly O new tokens each
(min_new_tokens = max_new_tokens = O, so end-of-sequence never stops a row early). Timed from the
call of generate to its return, after a CUDA synchronize, prefill included, as pagoda's output
tokens/s is (output tokens / wall time of the run).

Runs:
  eager           attn_implementation="eager", the default dynamic KV cache;
  static_compile  (--static-cache-compile) cache_implementation="static" and the model's forward
                  under torch.compile(mode="reduce-overhead", fullgraph=True), the recipe of the
                  transformers docs for fast generation; any failure is caught and reported in the
                  JSON instead of the figures.
Each run is preceded by an untimed warm-up generate of --warmup-output tokens (static_compile: two,
the compile happens there).

  python3 bench/hf_generate.py --model /tmp/llama2-7b --batch 64 --input 512 --output 256 \
      --static-cache-compile --json bench/results/<device>/hf_llama2-7b.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
import traceback

MASK64 = (1 << 64) - 1


def mix64(x: int) -> int:
    """splitmix64's output function, on Python ints kept to 64 bits (as C++'s uint64_t wraps)."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def synthetic_tokens(stream: int, count: int, vocab: int) -> list[int]:
    """counter_random(stream, i) % vocab for i < count: pagoda's synthetic_tokens()."""
    base = mix64(stream & MASK64)
    return [mix64((base + i) & MASK64) % vocab for i in range(count)]


def offline_prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """The prompts of pagoda's offline workload: request r uses stream (seed << 32) + r."""
    return [synthetic_tokens(((seed << 32) + r) & MASK64, length, vocab) for r in range(batch)]


def tokenizer_size(model_dir: str, config_vocab: int) -> int:
    """Token ids pagoda draws from: the tokenizer's size (its ids + 1), capped by the model's vocab."""
    try:
        with open(os.path.join(model_dir, "tokenizer.json")) as f:
            tok = json.load(f)
        ids = list(tok["model"]["vocab"].values()) + [t["id"] for t in tok.get("added_tokens", [])]
        return min(max(ids) + 1, config_vocab)
    except (OSError, KeyError, ValueError):
        return config_vocab


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def timed_generate(torch, model, input_ids, new_tokens: int, **kwargs) -> float:
    attention_mask = torch.ones_like(input_ids)
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, **kwargs)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    expected = (input_ids.shape[0], input_ids.shape[1] + new_tokens)
    if tuple(out.shape) != expected:
        raise RuntimeError(f"generate returned shape {tuple(out.shape)}, expected {expected}")
    return seconds


def figures(seconds: float, batch: int, input_len: int, output_len: int) -> dict:
    return {"seconds": seconds, "output_tokens": batch * output_len,
            "output_tok_s": batch * output_len / seconds,
            "total_tok_s": batch * (input_len + output_len) / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a pagoda make-model folder")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--input", type=int, required=True, help="prompt tokens per request")
    parser.add_argument("--output", type=int, required=True, help="new tokens per request")
    parser.add_argument("--seed", type=int, default=0, help="pagoda bench throughput's --seed (default 0)")
    parser.add_argument("--dtype", choices=("auto", "fp16", "bf16"), default="auto",
                        help="default: the checkpoint's torch_dtype")
    parser.add_argument("--warmup-output", type=int, default=4, help="new tokens of the warm-up generate")
    parser.add_argument("--static-cache-compile", action="store_true",
                        help="also run with a static cache and torch.compile")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    if min(args.batch, args.input, args.output, args.warmup_output) < 1:
        sys.exit("hf_generate: --batch, --input, --output and --warmup-output must be >= 1")

    import torch
    import transformers

    if not torch.cuda.is_available():
        sys.exit("hf_generate: no CUDA device")
    with open(os.path.join(args.model, "config.json")) as f:
        config = json.load(f)
    if args.dtype == "auto":
        dtype = torch.bfloat16 if config.get("torch_dtype", config.get("dtype")) == "bfloat16" else torch.float16
    else:
        dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    major, minor = (int(v) for v in transformers.__version__.split(".")[:2])
    # transformers 4.56 renamed from_pretrained's torch_dtype to dtype.
    dtype_kwarg = {"dtype": dtype} if (major, minor) >= (4, 56) else {"torch_dtype": dtype}

    print(f"hf_generate: loading {args.model} ({dtype}) on {torch.cuda.get_device_name()}", file=sys.stderr)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, attn_implementation="eager",
                                                              **dtype_kwarg).to("cuda").eval()
    vocab = tokenizer_size(args.model, config["vocab_size"])
    prompts = torch.tensor(offline_prompts(args.batch, args.input, vocab, args.seed), dtype=torch.long, device="cuda")
    # No padding (every prompt has the same length); pad_token_id only silences generate's warning.
    common = {"pad_token_id": config.get("eos_token_id")}

    runs: dict = {}
    print("hf_generate: eager: warm-up...", file=sys.stderr)
    timed_generate(torch, model, prompts, args.warmup_output, **common)
    print(f"hf_generate: eager: batch {args.batch}, {args.input} in, {args.output} out...", file=sys.stderr)
    runs["eager"] = figures(timed_generate(torch, model, prompts, args.output, **common),
                            args.batch, args.input, args.output)
    print(f"hf_generate: eager: {runs['eager']['output_tok_s']:.1f} output tok/s", file=sys.stderr)

    if args.static_cache_compile:
        try:
            model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
            static = dict(common, cache_implementation="static")
            print("hf_generate: static cache + torch.compile: warm-up (compiles)...", file=sys.stderr)
            for _ in range(2):
                timed_generate(torch, model, prompts, args.warmup_output, **static)
            runs["static_compile"] = figures(timed_generate(torch, model, prompts, args.output, **static),
                                             args.batch, args.input, args.output)
            print(f"hf_generate: static cache + torch.compile: {runs['static_compile']['output_tok_s']:.1f} "
                  "output tok/s", file=sys.stderr)
        except Exception as e:  # noqa: BLE001 -- any failure of the optional path is a result
            runs["static_compile"] = {"error": f"{type(e).__name__}: {e}"[:2000],
                                      "traceback": traceback.format_exc()[-4000:]}
            print(f"hf_generate: static cache + torch.compile failed: {type(e).__name__}: {e}", file=sys.stderr)

    result = {
        "benchmark": "hf_generate",
        "command": " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv),
        "commit": git_commit(),
        "device": torch.cuda.get_device_name(),
        "host": platform.node(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "model": args.model,
        "model_type": config.get("model_type"),
        "layers": config.get("num_hidden_layers"),
        "dtype": str(dtype).replace("torch.", ""),
        "attn_implementation": "eager",
        "config": {"batch": args.batch, "input": args.input, "output": args.output, "seed": args.seed,
                   "token_id_range": vocab},
        "max_memory_allocated_bytes": torch.cuda.max_memory_allocated(),
        "runs": runs,
    }
    print(json.dumps({k: result[k] for k in ("device", "config", "runs")}, indent=1, default=str)[:3000])
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
        print(f"hf_generate: wrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
