"""pagoda: an LLM inference engine (C++ and CUDA) with an offline API in vLLM's shape.

    import pagoda
    llm = pagoda.LLM()                      # the CLI's default model, SmolLM2-135M-Instruct
    out = llm.generate(["The capital of France is"], pagoda.SamplingParams(temperature=0, max_tokens=16))
    print(out[0].outputs[0].text)

pagoda.ops holds the attention kernels as ops on DLPack tensors (docs/python.md).
torch is not needed to import pagoda.
"""
from pagoda import ops
from pagoda._core import cuda_built
from pagoda.llm import LLM
from pagoda.outputs import CompletionOutput, Logprob, RequestOutput
from pagoda.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob", "ops", "cuda_built"]
