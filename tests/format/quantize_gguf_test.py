"""pagoda quantize against the `gguf` Python package (gguf-py, ggml's own reader and reference
quantizers), on a small Llama-shaped checkpoint written here with numpy.

Checks: the file reads with gguf.GGUFReader; metadata and tokenizer as llama.cpp's converter
writes them; which tensors keep f32 and which take the type; q/k rows interleaved as
convert_hf_to_gguf.py permutes them; Q8_0/Q4_0/Q4_1/Q5_0/Q5_1 bytes equal gguf.quants.quantize of
the same values; K-quants within their bits' error; `--type f32` of a quantized file (pagoda's
dequantizer) bit-equal to gguf.quants.dequantize; an f16 GGUF generating the same greedy text as
the folder it came from; clear errors for bad input.

usage: quantize_gguf_test.py PAGODA_BINARY
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

PAGODA = sys.argv[1]
HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, VOCAB = 256, 512, 2, 4, 2, 320
HEAD_DIM = HIDDEN // HEADS
LEGACY = {"q8_0": T.Q8_0, "q4_0": T.Q4_0, "q4_1": T.Q4_1, "q5_0": T.Q5_0, "q5_1": T.Q5_1}
K_QUANTS = {"q4_k": (T.Q4_K, 0.12), "q5_k": (T.Q5_K, 0.06), "q6_k": (T.Q6_K, 0.03)}


def run(*args, check=True):
    p = subprocess.run([PAGODA, *args], capture_output=True, text=True, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"pagoda {' '.join(args)} failed ({p.returncode}): {p.stderr}")
    return p


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, array in tensors.items():
        data = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": "F16", "shape": list(array.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for b in blobs:
            f.write(b)


def make_checkpoint(tmp):
    """A Llama folder whose rows are multiples of 256 (K-quant blocks), with make-model's tokenizer."""
    run("make-model", "--arch", "tiny", "--out", f"{tmp}/tiny")
    folder = f"{tmp}/model"
    os.makedirs(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(f"{tmp}/tiny/{name}", folder)
    config = json.load(open(f"{tmp}/tiny/config.json"))
    config.update(hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                  num_key_value_heads=KV_HEADS, vocab_size=VOCAB, head_dim=HEAD_DIM, tie_word_embeddings=False)
    json.dump(config, open(f"{folder}/config.json", "w"))
    rng = np.random.default_rng(5)
    w = lambda *shape: (rng.standard_normal(shape) * 0.05).astype(np.float16)
    t = {"model.embed_tokens.weight": w(VOCAB, HIDDEN)}
    for l in range(LAYERS):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = (1 + w(HIDDEN)).astype(np.float16)
        t[p + "self_attn.q_proj.weight"] = w(HEADS * HEAD_DIM, HIDDEN)
        t[p + "self_attn.k_proj.weight"] = w(KV_HEADS * HEAD_DIM, HIDDEN)
        t[p + "self_attn.v_proj.weight"] = w(KV_HEADS * HEAD_DIM, HIDDEN)
        t[p + "self_attn.o_proj.weight"] = w(HIDDEN, HEADS * HEAD_DIM)
        t[p + "post_attention_layernorm.weight"] = (1 + w(HIDDEN)).astype(np.float16)
        t[p + "mlp.gate_proj.weight"] = w(FFN, HIDDEN)
        t[p + "mlp.up_proj.weight"] = w(FFN, HIDDEN)
        t[p + "mlp.down_proj.weight"] = w(HIDDEN, FFN)
    t["model.norm.weight"] = (1 + w(HIDDEN)).astype(np.float16)
    t["lm_head.weight"] = w(VOCAB, HIDDEN)
    write_safetensors(f"{folder}/model.safetensors", t)
    return folder, t


def permute(w, heads):
    """convert_hf_to_gguf.py's LlamaModel.permute: q/k rows interleaved for llama.cpp's RoPE."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def expected_tensors(source):
    """GGUF name -> f32 values, as llama.cpp's converter would store them."""
    out = {"token_embd.weight": source["model.embed_tokens.weight"], "output_norm.weight": source["model.norm.weight"],
           "output.weight": source["lm_head.weight"]}
    names = {"input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
             "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
             "self_attn.o_proj.weight": "attn_output.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
             "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
             "mlp.down_proj.weight": "ffn_down.weight"}
    for l in range(LAYERS):
        for hf, g in names.items():
            w = source[f"model.layers.{l}.{hf}"]
            if g == "attn_q.weight":
                w = permute(w, HEADS)
            elif g == "attn_k.weight":
                w = permute(w, KV_HEADS)
            out[f"blk.{l}.{g}"] = w
    return {k: v.astype(np.float32) for k, v in out.items()}


def field(reader, key):
    return reader.fields[key].contents()


def tensor_bytes(t):
    return np.asarray(t.data).view(np.uint8).reshape(-1)


def check_file(path, type_name, expected):
    r = gguf.GGUFReader(path)
    assert field(r, "general.architecture") == "llama"
    assert field(r, "llama.block_count") == LAYERS and field(r, "llama.embedding_length") == HIDDEN
    assert field(r, "llama.attention.head_count_kv") == KV_HEADS
    tokens = field(r, "tokenizer.ggml.tokens")
    assert len(tokens) == VOCAB and tokens[VOCAB - 1] == f"[PAD{VOCAB - 1}]", tokens[-3:]
    assert field(r, "tokenizer.ggml.model") == "gpt2" and field(r, "tokenizer.ggml.pre") == "gpt2"
    assert field(r, "tokenizer.ggml.eos_token_id") == 282
    assert len(field(r, "tokenizer.ggml.merges")) == 26
    tensors = {t.name: t for t in r.tensors}
    assert set(tensors) == set(expected), set(tensors) ^ set(expected)
    for name, want in expected.items():
        t = tensors[name]
        assert list(t.shape) == list(reversed(want.shape)), (name, t.shape, want.shape)
        if want.ndim == 1:
            assert t.tensor_type == T.F32, (name, t.tensor_type)
            assert np.array_equal(np.asarray(t.data), want), name
            continue
        qtype = T.Q6_K if name == "output.weight" and type_name in ("q4_k", "q5_k") else \
            {**LEGACY, **{k: v[0] for k, v in K_QUANTS.items()}, "f16": T.F16}[type_name]
        assert t.tensor_type == qtype, (name, t.tensor_type, qtype)
        if qtype in LEGACY.values():
            assert np.array_equal(tensor_bytes(t), gguf.quants.quantize(want, qtype).reshape(-1)), f"{name} {type_name}"
        elif qtype == T.F16:
            assert np.array_equal(np.asarray(t.data).astype(np.float32), want), name
        else:
            got = gguf.quants.dequantize(tensor_bytes(t), qtype).reshape(want.shape)
            bound = {qt: b for qt, b in K_QUANTS.values()}[qtype]
            rel = np.sqrt(np.mean((got - want) ** 2) / np.mean(want ** 2))
            assert bound / 20 < rel < bound, f"{name} {type_name}: relative RMS error {rel}"
    return r


def check_dequantized(quantized_path, f32_path):
    """pagoda's dequantizer (`--type f32` of a quantized file) against gguf-py's, bit for bit."""
    q = {t.name: t for t in gguf.GGUFReader(quantized_path).tensors}
    for t in gguf.GGUFReader(f32_path).tensors:
        want = gguf.quants.dequantize(tensor_bytes(q[t.name]), q[t.name].tensor_type) if q[t.name].tensor_type != T.F32 \
            else np.asarray(q[t.name].data)
        got = np.asarray(t.data)
        assert t.tensor_type == T.F32
        assert np.array_equal(got.view(np.uint32).reshape(-1), want.astype(np.float32).view(np.uint32).reshape(-1)), t.name


def greedy(model):
    return run("generate", "-m", model, "-p", "the cat sat on", "-n", "12", "--temp", "0", "--backend", "cpu",
               "-t", "2").stdout


def main():
    with tempfile.TemporaryDirectory() as tmp:
        folder, source = make_checkpoint(tmp)
        expected = expected_tensors(source)
        for type_name in [*LEGACY, *K_QUANTS, "f16"]:
            out = f"{tmp}/{type_name}.gguf"
            run("quantize", folder, out, "--type", type_name)
            check_file(out, type_name, expected)
            if type_name != "f16":
                run("quantize", out, f"{tmp}/{type_name}.f32.gguf", "--type", "f32")
                check_dequantized(out, f"{tmp}/{type_name}.f32.gguf")
            print(f"ok: {type_name}")

        # GGUF in: the f16 file quantized again gives the bytes the folder gave (same values).
        run("quantize", f"{tmp}/f16.gguf", f"{tmp}/q8_0.again.gguf", "--type", "q8_0")
        a = {t.name: tensor_bytes(t) for t in gguf.GGUFReader(f"{tmp}/q8_0.gguf").tensors}
        b = {t.name: tensor_bytes(t) for t in gguf.GGUFReader(f"{tmp}/q8_0.again.gguf").tensors}
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)

        # The same weights give the same greedy text from the folder and from its f16 GGUF: names,
        # q/k interleaving, metadata and tokenizer all round-trip through pagoda's loader.
        from_folder, from_gguf = greedy(folder), greedy(f"{tmp}/f16.gguf")
        assert from_folder == from_gguf and from_folder.strip(), (from_folder, from_gguf)
        print("ok: f16 GGUF generates the folder's greedy text")

        # Bad input: one line, exit 1.
        for args, message in [
            ((f"{tmp}/tiny", f"{tmp}/x.gguf", "--type", "q4_k"), "not a multiple of q4_k's block size 256"),
            ((folder, f"{tmp}/x.gguf", "--type", "q3_k"), "--type must be one of"),
            ((f"{tmp}/missing", f"{tmp}/x.gguf", "--type", "q8_0"), "does not exist"),
            ((f"{tmp}/q8_0.gguf", f"{tmp}/q8_0.gguf", "--type", "q4_0"), "overwrite the input"),
        ]:
            p = run("quantize", *args, check=False)
            assert p.returncode == 1 and p.stderr.startswith("pagoda: error: ") and message in p.stderr, (args, p.stderr)
            assert p.stderr.count("\n") == 1, p.stderr
        assert not os.path.exists(f"{tmp}/x.gguf"), "a failed quantize left its output behind"
        print("ok: errors")


if __name__ == "__main__":
    main()
