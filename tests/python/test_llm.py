"""pagoda.LLM on the default model (SmolLM2-135M-Instruct, CPU) against `pagoda generate` and
`pagoda chat`: the same prompt, sampling flags and seed must give the same text."""
import subprocess

import pytest

import pagoda

PROMPT = "The three primary colors are"


@pytest.fixture(scope="module")
def llm():
    return pagoda.LLM(backend="cpu", max_batch=4, kv_memory_mb=64)


def cli_generate(binary, prompt, *flags):
    out = subprocess.run([binary, "generate", "--backend", "cpu", "--kv-memory-mb", "64", "-p", prompt, *flags],
                         check=True, capture_output=True, text=True, timeout=300).stdout
    assert out.startswith(prompt) and out.endswith("\n")
    return out[len(prompt):-1]


def test_greedy_equals_cli(llm, pagoda_binary):
    expected = cli_generate(pagoda_binary, PROMPT, "--temp", "0", "-n", "24", "--seed", "3")
    [out] = llm.generate([PROMPT], pagoda.SamplingParams(temperature=0, max_tokens=24, seed=3), use_tqdm=False)
    assert out.prompt == PROMPT
    assert out.prompt_token_ids == llm.encode(PROMPT)
    [completion] = out.outputs
    assert completion.text == expected
    assert len(completion.token_ids) == 24 and completion.finish_reason == "length"
    assert llm.decode(completion.token_ids) == completion.text


def test_sampled_equals_cli_with_the_same_seed(llm, pagoda_binary):
    # The CLI's sampling defaults (llama.cpp's): temperature 0.8, top-k 40, top-p 0.95, min-p 0.05.
    expected = cli_generate(pagoda_binary, PROMPT, "-n", "20", "--seed", "7")
    params = pagoda.SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, max_tokens=20, seed=7)
    assert llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0].text == expected


def test_batch_and_n(llm):
    prompts = [PROMPT, "Once upon a time", "def fibonacci(n):"]
    greedy = pagoda.SamplingParams(temperature=0, max_tokens=12)
    alone = [llm.generate(p, greedy, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
    together = llm.generate(prompts, greedy, use_tqdm=False)
    assert [o.prompt for o in together] == prompts
    assert [o.outputs[0].token_ids for o in together] == alone
    # n samples with a seed: sample i is the one seed + i gives alone.
    two = llm.generate(PROMPT, pagoda.SamplingParams(n=2, max_tokens=12, seed=11), use_tqdm=False)[0].outputs
    assert [c.index for c in two] == [0, 1]
    for i, c in enumerate(two):
        solo = llm.generate(PROMPT, pagoda.SamplingParams(max_tokens=12, seed=11 + i), use_tqdm=False)
        assert c.token_ids == solo[0].outputs[0].token_ids


def test_stop_and_logprobs(llm):
    params = pagoda.SamplingParams(temperature=0, max_tokens=40, stop=[","], logprobs=3)
    c = llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0]
    assert c.finish_reason == "stop" and "," not in c.text
    assert len(c.logprobs) == len(c.token_ids)
    for token, entry in zip(c.token_ids, c.logprobs):
        ranked = sorted((lp.rank, t, lp.logprob) for t, lp in entry.items() if lp.rank is not None)
        assert [r for r, _, _ in ranked] == [1, 2, 3]
        assert ranked[0][1] == token  # greedy picks the most likely token
        assert all(a[2] >= b[2] for a, b in zip(ranked, ranked[1:])) and ranked[0][2] <= 0
        assert entry[token].decoded_token == llm.decode([token])
    assert c.cumulative_logprob == pytest.approx(sum(e[t].logprob for t, e in zip(c.token_ids, c.logprobs)), rel=1e-5)


def test_chat_equals_cli(llm, pagoda_binary):
    question = "What is the capital of France?"
    out = subprocess.run([pagoda_binary, "chat", "--backend", "cpu", "--kv-memory-mb", "64", "--once", question,
                          "--temp", "0", "-n", "24"], check=True, capture_output=True, text=True, timeout=300).stdout
    expected = out[len(f"> {question}\n"):-1]
    [answer] = llm.chat([{"role": "user", "content": question}], pagoda.SamplingParams(temperature=0, max_tokens=24),
                        use_tqdm=False)
    assert answer.outputs[0].text == expected
    assert "<|im_start|>user\nWhat is the capital of France?<|im_end|>" in answer.prompt


def test_errors_carry_the_cli_messages(llm):
    with pytest.raises(ValueError, match="--kv-cache-dtype must be auto, f16, bf16, fp8 or int2, not 'int4'"):
        pagoda.LLM(kv_cache_dtype="int4")
    with pytest.raises(ValueError, match=r"--max-batch must be in \[1, 4096\]"):
        pagoda.LLM(max_batch=0)
    with pytest.raises(ValueError, match="--backend must be auto, cpu or cuda, not 'tpu'"):
        pagoda.LLM(backend="tpu")
    with pytest.raises(FileNotFoundError):
        pagoda.LLM(model="/nonexistent/model.gguf")
    with pytest.raises(ValueError, match="temperature"):
        pagoda.SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="the prompt is empty"):
        llm.generate([[]], use_tqdm=False)
    with pytest.raises(ValueError, match="the model's context is"):
        llm.generate([[1] * 9000], use_tqdm=False)
    # The engine is usable after a refused request.
    assert llm.generate(PROMPT, pagoda.SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)[0].outputs[0].text


def test_kv_cache_dtype(llm):
    assert llm.backend == "cpu" and llm.kv_cache_dtype == "f32"  # auto: the backend's activations
    # fp8 KV (docs/kv-quantization.md) through the API: the same greedy tokens as f32 KV here.
    greedy = pagoda.SamplingParams(temperature=0, max_tokens=8)
    fp8 = pagoda.LLM(backend="cpu", kv_cache_dtype="fp8", max_batch=4, kv_memory_mb=16)
    assert fp8.kv_cache_dtype == "fp8"
    assert (fp8.generate(PROMPT, greedy, use_tqdm=False)[0].outputs[0].token_ids ==
            llm.generate(PROMPT, greedy, use_tqdm=False)[0].outputs[0].token_ids)
    with pytest.raises(ValueError, match="--kv-partition 128 does not divide the model's head_dim 64"):
        pagoda.LLM(backend="cpu", kv_cache_dtype="int2", kv_partition=128)


def test_tensor_parallel_gives_the_same_greedy_text(llm):
    # Two CPU ranks (model/tensor_parallel_model.h) split heads and the MLP; the sums are reordered,
    # which a short greedy continuation does not notice.
    greedy = pagoda.SamplingParams(temperature=0, max_tokens=8)
    split = pagoda.LLM(backend="cpu", tensor_parallel=2, max_batch=4, kv_memory_mb=16)
    assert (split.generate(PROMPT, greedy, use_tqdm=False)[0].outputs[0].text ==
            llm.generate(PROMPT, greedy, use_tqdm=False)[0].outputs[0].text)
    with pytest.raises(ValueError, match="--tensor-parallel must be in"):
        pagoda.LLM(backend="cpu", tensor_parallel=0)


def test_an_interrupted_run_leaves_the_engine_usable(llm, monkeypatch):
    # Ctrl-C arrives as an exception in the progress callback (or from PyErr_CheckSignals): the
    # run is cancelled, the exception raised, and the next run starts from a drained engine.
    def interrupt(self, done):
        raise KeyboardInterrupt

    monkeypatch.setattr(pagoda.llm._Progress, "update", interrupt)
    params = [pagoda.SamplingParams(temperature=0, max_tokens=n) for n in (1, 64, 64)]
    with pytest.raises(KeyboardInterrupt):
        llm.generate([PROMPT, "Once upon a time", "def fibonacci(n):"], params)
    monkeypatch.undo()
    [out] = llm.generate(PROMPT, pagoda.SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    assert len(out.outputs[0].token_ids) == 3
