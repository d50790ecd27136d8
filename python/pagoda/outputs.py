"""What LLM.generate returns, in vLLM's shape: one RequestOutput per prompt."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional


@dataclass
class Logprob:
    logprob: float
    rank: Optional[int] = None  # 1 for the most likely token; None when outside the top list
    decoded_token: Optional[str] = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: List[int]
    cumulative_logprob: Optional[float]
    logprobs: Optional[List[Dict[int, Logprob]]]  # per generated token, when asked for
    finish_reason: Optional[str]  # "stop" (EOS, a stop token or string) or "length"

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: List[int]
    outputs: List[CompletionOutput] = field(default_factory=list)
    finished: bool = True
