"""pagoda's attention kernels as ops on DLPack tensors (torch, numpy, CuPy, JAX), without copies.

    cache = ops.PagedKVCache(num_blocks, block_size, num_kv_heads, head_dim, dtype, device)
    attn = ops.DecodeAttention(device)               # or ops.PrefixAttention(device)
    attn.plan(block_tables, lengths, num_q_heads, num_kv_heads, head_dim, block_size)   # host, once per batch
    o, lse = attn.run(q, cache)                      # per layer: the executor or kernel alone

On the CPU, q and out are f32 (the CPU executors compute in f32) and the pool f32, f16 or bf16; on
CUDA, q, out and the pool share one dtype, f16 or bf16. lse is always f32, the natural log of each
row's softmax denominator. run() with out= and lse= given allocates nothing and, on CUDA, only
launches on `stream` (default: torch's current stream for torch tensors, else the legacy default
stream), so a CUDA graph can capture it; plan() uploads the plan on that stream and must happen
outside the capture. Every tensor is checked (shape, dtype, device, contiguity) before a kernel
sees it; a mismatch raises ValueError naming the tensor.

    qcache = ops.QuantizedPagedKVCache(num_blocks, block_size, num_kv_heads, head_dim, "int2")  # or "fp8"
    qcache.append(k, v, table)                       # quantized as the engine quantizes it
    attn.plan(..., kv_dtype="int2"); o, lse = attn.run(q, qcache)   # DecodeAttention; q of qcache.dtype
    k_hat, v_hat = qcache.dequantize(table, length)  # what attention reads
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

from pagoda import _core

_ops = _core.ops

_DTYPE_NAMES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "half": "f16", "float": "f32"}


def _dtype_name(dtype) -> str:
    """'f16', torch.float16, numpy.float16, 'float16' -> 'f16'."""
    name = dtype if isinstance(dtype, str) else getattr(dtype, "name", None) or str(dtype).rsplit(".", 1)[-1]
    return _DTYPE_NAMES.get(name, name)


def _device_name(device) -> str:
    """'cpu', 'cuda', 'cuda:1', torch.device('cuda', 1) -> that string."""
    if isinstance(device, str):
        return device
    kind, index = getattr(device, "type", None), getattr(device, "index", None)
    if kind is None:
        return str(device)
    return kind if index is None else f"{kind}:{index}"


def _stream(stream) -> int:
    """-1: the framework's current stream for the tensors given (torch's), resolved in C++."""
    return -1 if stream is None else int(stream)


def _empty(like, shape, dtype: str):
    """An uninitialized tensor of like's framework and device."""
    framework = type(like).__module__.split(".")[0]
    if framework == "torch":
        import torch

        return torch.empty(shape, dtype={"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[dtype],
                           device=like.device)
    if framework == "numpy" and dtype != "bf16":
        import numpy

        return numpy.empty(shape, dtype={"f32": numpy.float32, "f16": numpy.float16}[dtype])
    if framework == "cupy":
        import cupy

        with cupy.cuda.Device(like.device.id):
            return cupy.empty(shape, dtype={"f32": cupy.float32, "f16": cupy.float16}[dtype])
    raise TypeError(f"pass out= and lse=: pagoda allocates outputs for torch, numpy and CuPy arrays, "
                    f"not {type(like).__module__}.{type(like).__name__} of {dtype}")


def _table(t) -> list:
    return t.tolist() if hasattr(t, "tolist") else [int(b) for b in t]


class _DLPackView:
    """A DLPack producer over a pool allocated by PagedKVCache: each __dlpack__ call hands out a
    new capsule of the same memory, which stays alive while any consumer holds it."""

    def __init__(self, capsule, device: str) -> None:
        self._capsule = capsule
        self._device = (1, 0) if device == "cpu" else (2, int(device.split(":")[1]))

    def __dlpack__(self, *args, **kwargs):
        return self._capsule()

    def __dlpack_device__(self):
        return self._device


class _BlockPool:
    """What both caches forward to their pool: the shape, and the block allocator."""

    num_blocks = property(lambda self: self._pool.num_blocks)
    block_size = property(lambda self: self._pool.block_size)
    num_kv_heads = property(lambda self: self._pool.num_kv_heads)
    head_dim = property(lambda self: self._pool.head_dim)
    dtype = property(lambda self: self._pool.dtype)
    device = property(lambda self: self._pool.device)
    num_free_blocks = property(lambda self: self._pool.num_free_blocks)

    def allocate(self, num_tokens: int) -> list:
        """A block table for num_tokens tokens: free block ids (MemoryError when too few are free)."""
        return self._pool.allocate(num_tokens)

    def free(self, block_ids: Sequence[int]) -> None:
        self._pool.free(_table(block_ids))


class PagedKVCache(_BlockPool):
    """One layer's paged K and V pools, HND ([num_blocks, num_kv_heads, block_size, head_dim], the
    default) or NHD ([num_blocks, block_size, num_kv_heads, head_dim]), with a block allocator.

    PagedKVCache(...) allocates zeroed pools (cache.k and cache.v are DLPack tensors over them:
    torch.from_dlpack(cache.k), numpy.from_dlpack(cache.k)); PagedKVCache.wrap(k, v) uses a caller's.
    """

    def __init__(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype="f16",
                 device="cpu", layout: str = "HND", *, _pool=None, _tensors=None) -> None:
        self._tensors = _tensors
        self._pool = _pool if _pool is not None else _ops.KvPool(
            num_blocks, block_size, num_kv_heads, head_dim, _dtype_name(dtype), _device_name(device), layout)

    @classmethod
    def wrap(cls, k_cache, v_cache, layout: str = "HND") -> "PagedKVCache":
        """Pools the caller owns (contiguous, f32/f16/bf16, CPU or CUDA); they must outlive uses of it."""
        return cls(0, 0, 0, 0, _pool=_ops.KvPool(k_cache, v_cache, layout), _tensors=(k_cache, v_cache))

    @property
    def k(self):
        """The K pool: the tensor wrapped; for a pool allocated here, a numpy array over it on the CPU,
        a DLPack producer on CUDA (torch.from_dlpack(cache.k), cupy.from_dlpack(cache.k))."""
        return self._view(0)

    @property
    def v(self):
        return self._view(1)

    def _view(self, i):
        if self._tensors:
            return self._tensors[i]
        if self._pool.device == "cpu":
            return self._pool.k_numpy if i == 0 else self._pool.v_numpy
        return _DLPackView(lambda: self._pool.k if i == 0 else self._pool.v, self._pool.device)

    layout = property(lambda self: self._pool.layout)

    def append(self, k, v, block_table: Sequence[int], start: int = 0, stream: Optional[int] = None) -> None:
        """Writes k and v ([n, num_kv_heads, head_dim], the pool's dtype and device) as tokens
        [start, start + n) of the sequence whose blocks are block_table."""
        self._pool.append(k, v, _table(block_table), start, _stream(stream))


class QuantizedPagedKVCache(_BlockPool):
    """One layer's paged K and V stored as int2 or fp8 (docs/kv-quantization.md), with a block
    allocator. append() quantizes rows with the engine's own quantizer: the codes are those
    `pagoda --kv-cache-dtype int2|fp8 --kv-partition P` stores for layer 0 and this seed. Rows (and
    DecodeAttention's q and out) are f32 on the CPU, f16 or bf16 (dtype) on CUDA, where the CUDA
    backend's kernels quantize and attend (head_dim 64 or 128; int2 with partition and block_size 64).

    int2: asymmetric 2-bit codes per partition of `partition` elements (K along head_dim, V along
    the sequence; a V partition is quantized when its last token arrives, its tokens kept in f16
    until then), stochastic rounding keyed by position; head_dim and block_size must be multiples
    of partition (32, 64 or 128). fp8: e4m3 with one f32 scale per token and kv head.
    """

    def __init__(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 kv_cache_dtype: str = "int2", device="cpu", *, partition: int = 64, seed: int = 0,
                 dtype=None) -> None:
        device = _device_name(device)
        dtype = _dtype_name(dtype) if dtype is not None else ("f32" if device == "cpu" else "f16")
        self._pool = _ops.QuantizedKvPool(num_blocks, block_size, num_kv_heads, head_dim, kv_cache_dtype, partition,
                                          seed, device, dtype)

    kv_cache_dtype = property(lambda self: self._pool.kv_cache_dtype)
    partition = property(lambda self: self._pool.partition)
    seed = property(lambda self: self._pool.seed)

    def append(self, k, v, block_table: Sequence[int], start: int = 0, stream: Optional[int] = None) -> None:
        """Quantizes k and v ([n, num_kv_heads, head_dim] of the pool's dtype and device) into tokens
        [start, start + n) of the sequence whose blocks are block_table. int2 appends go in order
        within a V partition."""
        self._pool.append(k, v, _table(block_table), start, _stream(stream))

    def read(self, block_table: Sequence[int], length: int) -> dict:
        """The stored codes and metadata of tokens [0, length), as numpy arrays (codes one a byte):
        fp8: k_codes, v_codes [length, heads, dim] (e4m3 bits), k_scale, v_scale [length, heads];
        int2: k_codes [length, heads, dim], k_min, k_scale [length, heads, dim / partition];
        v_codes [sealed, heads, dim] (sealed: length rounded down to the partition), v_min, v_scale
        [sealed / partition, heads, dim]; v_tail [length - sealed, heads, dim] (the f16 rows)."""
        return self._pool.read(_table(block_table), length)

    def dequantize(self, block_table: Sequence[int], length: int):
        """(k, v) [length, num_kv_heads, head_dim]: the values attention reads, float64 numpy on
        the CPU; on CUDA torch tensors of the pool's dtype, widened by the backend's kernel."""
        import numpy as np

        if self.device != "cpu":
            import torch

            table = _table(block_table)
            dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[self.dtype]
            shape = (len(table), self.num_kv_heads, self.block_size, self.head_dim)
            k, v = (torch.empty(shape, dtype=dtype, device=self.device) for _ in range(2))
            self._pool.widen(table, length, k, v, -1)
            return tuple(x.transpose(1, 2).reshape(-1, self.num_kv_heads, self.head_dim)[:length] for x in (k, v))
        r = self.read(block_table, length)
        if self.kv_cache_dtype == "fp8":
            return (e4m3_to_float(r["k_codes"]) * r["k_scale"][..., None],
                    e4m3_to_float(r["v_codes"]) * r["v_scale"][..., None])
        p = self.partition
        k = r["k_min"].repeat(p, axis=2) + r["k_scale"].repeat(p, axis=2) * r["k_codes"]
        v_sealed = (r["v_min"].repeat(p, axis=0) + r["v_scale"].repeat(p, axis=0) * r["v_codes"]).astype(np.float64)
        return k.astype(np.float64), np.concatenate([v_sealed, r["v_tail"].astype(np.float64)])


def e4m3_to_float(codes):
    """float64 values of fp8 e4m3 bit patterns (uint8; 4 exponent bits, bias 7, no infinities)."""
    import numpy as np

    c = np.asarray(codes, dtype=np.int64)
    sign = np.where(c & 0x80, -1.0, 1.0)
    exponent, mantissa = (c >> 3) & 0xF, c & 7
    value = np.where(exponent == 0, np.ldexp(mantissa.astype(np.float64), -9),
                     np.ldexp(1.0 + mantissa / 8.0, exponent - 7))
    return np.where((exponent == 15) & (mantissa == 7), np.nan, sign * value)


class _Attention:
    _impl = None

    def __init__(self, device="cpu") -> None:
        self._op = self._impl(_device_name(device))

    def plan(self, block_tables: Sequence[Sequence[int]], lengths: Sequence[int], num_q_heads: int,
             num_kv_heads: int, head_dim: int, block_size: int, *, softmax_scale: Optional[float] = None,
             kv_dtype="f16", stream: Optional[int] = None) -> None:
        """Plans one batch on the host: sequence i attends to its first lengths[i] KV tokens, held in
        block_tables[i] in order. softmax_scale defaults to 1/sqrt(head_dim)."""
        self._op.plan([_table(t) for t in block_tables], _table(lengths), num_q_heads, num_kv_heads, head_dim,
                      block_size, softmax_scale, _dtype_name(kv_dtype), 0 if stream is None else int(stream))

    def run(self, q, kv_cache, out=None, lse=None, stream: Optional[int] = None) -> Tuple[object, object]:
        """Attention of q ([num_seqs, num_q_heads, head_dim], one token per sequence) over the planned
        KV (a PagedKVCache, or for DecodeAttention a QuantizedPagedKVCache planned with kv_dtype
        "int2" or "fp8", q and out of its dtype): returns (out, lse), allocating them in q's
        framework when not given."""
        if out is None:
            quantized = isinstance(kv_cache, QuantizedPagedKVCache)
            out = _empty(q, self._op.out_shape, kv_cache.dtype if quantized else self._op.out_dtype)
        if lse is None:
            lse = _empty(q, self._op.out_shape[:2], "f32")
        if isinstance(kv_cache, QuantizedPagedKVCache):
            if not hasattr(self._op, "run_quantized"):
                raise ValueError(f"{type(self).__name__} runs on f32/f16/bf16 KV; int2 and fp8 caches take "
                                 "DecodeAttention")
            self._op.run_quantized(q, kv_cache._pool, out, lse, _stream(stream))
        else:
            self._op.run(q, kv_cache._pool, out, lse, _stream(stream))
        return out, lse


class DecodeAttention(_Attention):
    """Decode attention over a paged KV cache: one work item per (sequence, KV head), long
    sequences split across items and merged (attention/plan.h)."""

    _impl = _ops.DecodeAttention


class PrefixAttention(_Attention):
    """Prefix-aware decode attention: KV blocks that several sequences share are read once for all
    of them (attention/prefix_plan.h, the PAT paper's packing)."""

    _impl = _ops.PrefixAttention


def merge_states(v, s, v_out=None, s_out=None, stream: Optional[int] = None):
    """Merges attention states over disjoint KV sets (the cascade paper's ⊕), FlashInfer's layout:
    v [seq, num_states, num_heads, head_dim], s [seq, num_states, num_heads] f32 -> (v_out
    [seq, num_heads, head_dim], s_out [seq, num_heads]). f32 v on the CPU, f16 or bf16 on CUDA."""
    shape = tuple(v.shape)
    if len(shape) != 4:
        raise ValueError(f"v must have 4 dimensions [seq, num_states, num_heads, head_dim], not shape {list(shape)}")
    if v_out is None:
        v_out = _empty(v, (shape[0], shape[2], shape[3]), _dtype_name(v.dtype))
    if s_out is None:
        s_out = _empty(v, tuple(v_out.shape[:2]), "f32")
    _ops.merge_states(v, s, v_out, s_out, _stream(stream))
    return v_out, s_out
