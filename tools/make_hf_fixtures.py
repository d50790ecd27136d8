#!/usr/bin/env python3
"""Produce tiny Hugging Face safetensors checkpoints and their transformers reference logits.

pagoda's model test for the safetensors path (tests/model/hf_checkpoint_test.cpp) loads each folder
written here (config.json + model.safetensors, exactly as `save_pretrained` writes them) and
compares its forward pass with transformers'. The models are random and tiny (a few hundred KB),
so they are committed and the test needs no download.

Models (tests/model/fixtures/hf/<name>/):

  llama          LlamaConfig, separate lm_head, rope_theta 10000, float32 weights; hidden 48 with
                 4 heads of head_dim 16 (q_dim 64 != hidden), so config.json's head_dim matters.
  llama3_scaled  LlamaConfig with Llama 3.1 RoPE scaling ("rope_type": "llama3"), rope_theta
                 500000, tied embeddings, bfloat16 weights.
  qwen2          Qwen2Config (q/k/v biases), separate lm_head, float16 weights.

Each folder also holds:

  logits.f32     [num_prompt_tokens, vocab] little-endian float32: logits at every prompt position.
  golden.json    prompt ids, logits shape, the 16-token greedy continuation, the greedy top1-top2
                 margins, the config values the C++ test checks, versions.

The reference runs in float32 on the weights as saved: each model is reloaded from its folder with
dtype=float32, so bf16 / f16 weights are the rounded values, upcast exactly.

Usage (from the repo root; ~20 s on 2 busy cores):
    python3 tools/make_hf_fixtures.py [--out-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys

# Passive OpenMP waiting: spin-waiting threads make torch ~10x slower on a shared 2-core machine.
os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

import torch  # noqa: E402

torch.set_num_threads(2)

import safetensors  # noqa: E402
import transformers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT_DIR = os.path.join(REPO_ROOT, "tests", "model", "fixtures", "hf")
PROMPT_LEN = 20
N_NEW_TOKENS = 16
# The C++ test compares logits to 1e-4 x the logit range; a greedy step whose top1-top2 margin is
# below MIN_MARGIN_OVER_TOL times that would make "same continuation" depend on summation order.
TEST_REL_TOL = 1e-4
MIN_MARGIN_OVER_TOL = 20.0
MIN_DISTINCT_GREEDY = 4

COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
)

MODELS = {
    "llama": dict(
        cls=LlamaForCausalLM,
        config=lambda: LlamaConfig(
            **{**COMMON, "hidden_size": 48, "intermediate_size": 96},
            head_dim=16,
            rope_theta=10000.0,
            tie_word_embeddings=False,
        ),
        dtype=torch.float32,
        seed=1,
    ),
    "llama3_scaled": dict(
        cls=LlamaForCausalLM,
        config=lambda: LlamaConfig(
            **COMMON,
            head_dim=16,
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            tie_word_embeddings=True,
        ),
        dtype=torch.bfloat16,
        seed=2,
    ),
    "qwen2": dict(
        cls=Qwen2ForCausalLM,
        config=lambda: Qwen2Config(**COMMON, rope_theta=10000.0, tie_word_embeddings=False),
        dtype=torch.float16,
        seed=3,
    ),
}


def init_weights(model: torch.nn.Module) -> None:
    """Wider than transformers' default init (std 0.02), so logits are far from uniform and greedy
    steps have clear winners: normal(0, 0.1) everywhere, RMSNorm weights normal(1, 0.1)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(1.0, 0.1)
            else:
                p.normal_(0.0, 0.1)


@torch.no_grad()
def greedy(model, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    """Manual argmax loop, full recompute each step (no KV cache), no EOS stop."""
    seq = list(ids)
    out, margins = [], []
    for _ in range(n):
        logits = model(torch.tensor([seq])).logits[0, -1].float()
        top2 = torch.topk(logits, 2)
        margins.append(float(top2.values[0] - top2.values[1]))
        out.append(int(top2.indices[0]))
        seq.append(out[-1])
    return out, margins


def make(name: str, spec: dict, out_dir: str) -> dict:
    folder = os.path.join(out_dir, name)
    shutil.rmtree(folder, ignore_errors=True)
    torch.manual_seed(spec["seed"])
    config = spec["config"]()
    model = spec["cls"](config).eval()
    init_weights(model)
    model.to(spec["dtype"]).save_pretrained(folder, safe_serialization=True)
    os.remove(os.path.join(folder, "generation_config.json"))  # pagoda does not read it

    # Reference: the saved folder, reloaded in float32 (bf16 / f16 values upcast exactly).
    ref = spec["cls"].from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    for (n1, p1), (n2, p2) in zip(model.named_parameters(), ref.named_parameters()):
        assert n1 == n2 and torch.equal(p1.float(), p2), f"{name}: {n1} did not round-trip"

    # A prompt whose greedy continuation has clear winners at every step (see MIN_MARGIN_OVER_TOL).
    gen = torch.Generator().manual_seed(1000 + spec["seed"])
    for attempt in range(50):
        ids = torch.randint(0, config.vocab_size, (PROMPT_LEN,), generator=gen).tolist()
        with torch.no_grad():
            logits = ref(torch.tensor([ids])).logits[0].float()  # [n, vocab]
        cont, margins = greedy(ref, ids, N_NEW_TOKENS)
        tol = TEST_REL_TOL * float(logits.max() - logits.min())
        # Random tiny models like to repeat one token; ask for a few distinct ones so a wrong
        # decode step cannot hide in a loop of the same id.
        if min(margins) >= MIN_MARGIN_OVER_TOL * tol and len(set(cont)) >= MIN_DISTINCT_GREEDY:
            break
    else:
        sys.exit(f"{name}: no prompt with greedy margins >= {MIN_MARGIN_OVER_TOL} x tolerance "
                 f"and {MIN_DISTINCT_GREEDY} distinct greedy tokens")

    logits.numpy().astype("<f4").tofile(os.path.join(folder, "logits.f32"))
    saved = json.load(open(os.path.join(folder, "config.json")))
    rope = saved.get("rope_parameters") or saved.get("rope_scaling") or {}
    golden = {
        "model": name,
        "weights_dtype": str(spec["dtype"]).removeprefix("torch."),
        "prompt_ids": ids,
        "prompt_attempts": attempt + 1,
        "logits_file": "logits.f32",
        "logits_shape": list(logits.shape),
        "logits_range": float(logits.max() - logits.min()),
        "greedy_ids": cont,
        "greedy_margins": margins,
        "greedy_min_margin_over_tolerance": min(margins) / tol,
        # What pagoda's ModelConfig should read from config.json (whatever keys this transformers
        # version writes: v5 moves rope_theta and rope_scaling into "rope_parameters").
        "expected_config": {
            "architecture": saved["model_type"],
            "vocab_size": config.vocab_size,
            "hidden_size": config.hidden_size,
            "intermediate_size": config.intermediate_size,
            "num_layers": config.num_hidden_layers,
            "num_q_heads": config.num_attention_heads,
            "num_kv_heads": config.num_key_value_heads,
            "head_dim": getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
            "max_context": config.max_position_embeddings,
            "rms_norm_eps": config.rms_norm_eps,
            "rope_theta": float(rope.get("rope_theta", saved.get("rope_theta", 10000.0))),
            "rope_llama3": rope.get("rope_type") == "llama3",
            "rope_factor": rope.get("factor", 1.0),
            "rope_low_freq_factor": rope.get("low_freq_factor", 1.0),
            "rope_high_freq_factor": rope.get("high_freq_factor", 4.0),
            "rope_original_max_position": rope.get("original_max_position_embeddings", 8192),
            "tie_word_embeddings": config.tie_word_embeddings,
            "qkv_bias": name == "qwen2",
        },
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "safetensors": safetensors.__version__,
        },
        "command": "python3 tools/make_hf_fixtures.py",
    }
    text = json.dumps(golden, indent=1)
    # One line per list of numbers: the ids read as a sequence, not one per line.
    text = re.sub(r"\[\s*([-0-9.e,\s]+?)\s*\]", lambda m: "[" + re.sub(r"\s+", " ", m.group(1)) + "]", text)
    with open(os.path.join(folder, "golden.json"), "w") as f:
        f.write(text + "\n")
    sizes = {f: os.path.getsize(os.path.join(folder, f)) for f in sorted(os.listdir(folder))}
    print(f"{name}: {sizes}, logit range {golden['logits_range']:.3f}, "
          f"min greedy margin {golden['greedy_min_margin_over_tolerance']:.0f} x tolerance")
    return golden


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", default=DEFAULT_OUT_DIR)
    args = parser.parse_args()
    for name, spec in MODELS.items():
        make(name, spec, args.out_dir)


if __name__ == "__main__":
    main()
