"""SamplingParams: vLLM's names and defaults, checked by the engine's own validate()."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Union

from pagoda import _core


@dataclass
class SamplingParams:
    """How each prompt is sampled and when it stops.

    Defaults are vLLM's: temperature 1 (0 is greedy), top_p 1 and top_k 0 (off; -1 also means
    off, as in older vLLM), max_tokens 16. n completions per prompt; with a seed, completion i
    uses seed + i. logprobs=k returns, per generated token, the chosen token's and the k most
    likely tokens' log probabilities (k <= 20).
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: Optional[int] = None
    stop: Optional[Union[str, List[str]]] = None
    stop_token_ids: Optional[List[int]] = None
    ignore_eos: bool = False
    max_tokens: int = 16
    logprobs: Optional[int] = None

    def __post_init__(self) -> None:
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be an integer >= 1, not {self.n!r}")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or self.logprobs < 0):
            raise ValueError(f"logprobs must be None or an integer >= 0, not {self.logprobs!r}")
        self._engine_params(0).validate()

    def _engine_params(self, index: int) -> "_core.EngineSamplingParams":
        """The engine's parameters for completion `index` of a prompt."""
        p = _core.EngineSamplingParams()
        p.temperature = float(self.temperature)
        p.top_p = float(self.top_p)
        p.top_k = 0 if self.top_k == -1 else int(self.top_k)
        p.min_p = float(self.min_p)
        p.repetition_penalty = float(self.repetition_penalty)
        p.presence_penalty = float(self.presence_penalty)
        p.frequency_penalty = float(self.frequency_penalty)
        if self.seed is not None:
            if not 0 <= self.seed < 2**64:
                raise ValueError(f"seed must be in [0, 2^64), not {self.seed}")
            p.seed = (self.seed + index) % 2**64
        p.max_tokens = int(self.max_tokens)
        p.stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        p.stop_token_ids = list(self.stop_token_ids or [])
        p.ignore_eos = bool(self.ignore_eos)
        # logprobs=0 is the chosen token's alone (vLLM); the engine's smallest list holds one more.
        p.logprobs = 0 if self.logprobs is None else max(1, int(self.logprobs))
        return p
