"""pagoda.ops over int2 and fp8 KV caches: the stored codes against an independent re-derivation of
the formats (docs/kv-quantization.md: numpy for int2's stochastic rounding, torch's float8_e4m3fn
for fp8), and decode attention against exact float64 attention over the dequantized cache, within
bounds derived as tests/backend/quantized_kv_test.cpp derives them; bad input refused."""
import math

import numpy as np
import pytest

import pagoda
from pagoda import ops

try:
    import torch
except ImportError:
    torch = None

M64 = (1 << 64) - 1


def splitmix64(x):
    """splitmix64 on uint64 arrays (wrapping arithmetic)."""
    x = (x + np.uint64(0x9E3779B97F4A7C15)) & np.uint64(M64)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def kv_stream(seed, layer, kind, head):
    key = np.uint64((layer << 33) | (kind << 32) | head)
    with np.errstate(over="ignore"):
        return splitmix64(np.uint64(seed) ^ splitmix64(key))


def uniform(stream, index):
    """The draw in [0, 1) of element `index` of `stream`: the top 24 bits of a splitmix64."""
    with np.errstate(over="ignore"):
        bits = splitmix64(stream ^ splitmix64(index.astype(np.uint64)))
    return (bits >> np.uint64(40)).astype(np.float32) * np.float32(2.0**-24)


def quantize_int2(x, u):
    """x [..., n] float32 partitions, u their draws: (codes, min, scale), min and scale rounded to
    f16 first and the codes of the rounded pair, rounding up with probability frac(ratio)."""
    lo, hi = x.min(axis=-1, keepdims=True), x.max(axis=-1, keepdims=True)
    mn = lo.astype(np.float16).astype(np.float32)
    scale = ((hi - lo) / np.float32(3)).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.clip(np.where(scale > 0, (x - mn) / np.where(scale > 0, scale, 1), 0), 0, 3).astype(np.float32)
    floor = np.floor(t)
    codes = np.clip(floor + (u < t - floor), 0, 3).astype(np.uint8)
    return np.where(scale > 0, codes, 0), mn, scale


def fill(rng, cache, length, scale=1.0):
    table = cache.allocate(length)
    if length == 0:
        return table, None, None
    shape = (length, cache.num_kv_heads, cache.head_dim)
    k = (rng.standard_normal(shape) * scale).astype(np.float32)
    v = (rng.standard_normal(shape) * scale).astype(np.float32)
    # In two appends, the second starting inside a V partition's run of tokens.
    cut = cache.partition + 3 if cache.kv_cache_dtype == "int2" else 17
    cache.append(k[:cut], v[:cut], table)
    if length > cut:
        cache.append(k[cut:], v[cut:], table, start=cut)
    return table, k, v


@pytest.mark.parametrize("partition", [32, 64])
def test_int2_codes_equal_the_format(partition):
    rng = np.random.default_rng(3)
    seed, length, heads, dim = 1234, 2 * 64 + partition // 2 + 5, 2, 64
    cache = ops.QuantizedPagedKVCache(8, 64, heads, dim, "int2", partition=partition, seed=seed)
    table, k, v = fill(rng, cache, length)
    got = cache.read(table, length)
    pos = np.arange(length, dtype=np.uint64)[:, None] * np.uint64(dim) + np.arange(dim, dtype=np.uint64)
    sealed = length // partition * partition
    for h in range(heads):
        # K: partitions along head_dim; element d of token t drawn at index t * dim + d.
        u = uniform(kv_stream(seed, 0, 0, h), pos).reshape(length, dim // partition, partition)
        codes, mn, scale = quantize_int2(k[:, h].reshape(length, -1, partition), u)
        np.testing.assert_array_equal(got["k_codes"][:, h], codes.reshape(length, dim))
        np.testing.assert_array_equal(got["k_min"][:, h], mn[..., 0])
        np.testing.assert_array_equal(got["k_scale"][:, h], scale[..., 0])
        # V: partitions along the sequence, of the f16 rows the tail held.
        v16 = v[:, h].astype(np.float16).astype(np.float32)
        cols = v16[:sealed].reshape(-1, partition, dim).transpose(0, 2, 1)
        u = uniform(kv_stream(seed, 0, 1, h), pos[:sealed]).reshape(-1, partition, dim).transpose(0, 2, 1)
        codes, mn, scale = quantize_int2(cols, u)
        np.testing.assert_array_equal(got["v_codes"][:, h], codes.transpose(0, 2, 1).reshape(sealed, dim))
        np.testing.assert_array_equal(got["v_min"][:, h], mn[..., 0])
        np.testing.assert_array_equal(got["v_scale"][:, h], scale[..., 0])
        np.testing.assert_array_equal(got["v_tail"][:, h], v16[sealed:])
    assert got["v_tail"].shape[0] == length - sealed > 0
    # Every code is used: a quantizer that rounded only down (or only to the ends) fails above.
    assert set(np.unique(got["k_codes"])) == {0, 1, 2, 3}


@pytest.mark.skipif(torch is None or not hasattr(torch, "float8_e4m3fn"), reason="torch with float8 is not installed")
def test_fp8_codes_equal_torch_e4m3():
    rng = np.random.default_rng(4)
    cache = ops.QuantizedPagedKVCache(4, 16, 3, 32, "fp8")
    length = 50
    table, k, v = fill(rng, cache, length, scale=3.0)
    k[7, 1] = 0  # an all-zero row: scale 0, codes 0
    cache.append(k[7:8], v[7:8], table, start=7)
    got = cache.read(table, length)
    for name, x in (("k", k), ("v", v)):
        scale = np.abs(x).max(axis=-1) / np.float32(448)
        np.testing.assert_array_equal(got[name + "_scale"], scale)
        safe = np.where(scale > 0, scale, 1)[..., None]
        # e4m3 saturates at 448 where torch's cast would give NaN.
        ratio = torch.from_numpy(np.clip(x / safe, -448, 448).astype(np.float32))
        codes = ratio.to(torch.float8_e4m3fn).view(torch.uint8).numpy()
        np.testing.assert_array_equal(got[name + "_codes"], np.where(scale[..., None] > 0, codes, 0))
    assert not got["k_codes"][7, 1].any() and got["k_scale"][7, 1] == 0
    # The dequantized cache is within e4m3's half-step (2^-4 relative, or 2^-10 scale near zero).
    k_hat, v_hat = cache.dequantize(table, length)
    bound = np.maximum(np.abs(k) * 2.0**-4, np.abs(k).max(axis=-1, keepdims=True) / 448 * 2.0**-10)
    assert (np.abs(k_hat - k) <= bound * 1.0001).all()


def quantize_uint8(x):
    """Round-to-nearest 8-bit codes of one partition, dequantized: the query as int2 attention sees it."""
    lo, hi = np.float32(x.min()), np.float32(x.max())
    scale = (hi - lo) / np.float32(255)
    if scale == 0:
        return np.full(x.shape, lo, dtype=np.float64)
    codes = np.rint(np.clip((x - lo) / scale, 0, 255))
    return lo + np.float64(scale) * codes


def reference(k, v, q, scale, quant, partition):
    """Exact float64 attention of one query row over dequantized k, v [length, dim], and the bound on
    how far attention on the codes may be from it: int2 quantizes q to uint8 per partition (the
    reference uses that q) and the softmax numerators P to uint8 per partition of the sequence,
    which moves each by at most half its partition's step; f32 arithmetic moves each score by a
    relative 1e-5 at most."""
    length, dim = k.shape
    q_hat = q.astype(np.float64)
    if quant == "int2":
        q_hat = np.concatenate([quantize_uint8(q[i:i + partition]) for i in range(0, dim, partition)])
    s = k @ q_hat * scale
    delta = 1e-5 * (1 + np.abs(k * q_hat).sum(axis=1) * scale)
    m = s.max()
    p = np.exp(s - m)
    total = p.sum()
    max_delta = delta.max()
    widen = math.exp(max_delta)
    p_error = np.zeros(dim)
    p_slack = 0.0
    if quant == "int2":
        for start in range(0, length, partition):
            block = p[start:start + partition]
            lo = 0 if len(block) < partition else block.min()  # masked tokens weigh 0
            step = (block.max() * widen - lo / widen) / 255
            p_error += step / 2 * np.abs(v[start:start + partition]).sum(axis=0)
            p_slack += step / 2 * len(block)
    out = p @ v / total
    weighted_abs = p @ np.abs(v) / total
    bound = (math.exp(2 * max_delta) - 1) * weighted_abs + p_error * widen / total + 1e-5 * (1 + weighted_abs)
    lse_bound = max_delta + math.log1p(p_slack * widen / total) + 1e-5
    return out, m + math.log(total), bound, lse_bound


@pytest.mark.parametrize("quant,partition", [("fp8", 64), ("int2", 32), ("int2", 64)])
def test_decode_attention_equals_exact_attention_on_the_dequantized_cache(quant, partition):
    rng = np.random.default_rng(5)
    heads, group, dim, block = 2, 3, 64, 64
    cache = ops.QuantizedPagedKVCache(16, block, heads, dim, quant, partition=partition, seed=9)
    # A sealed run then an open int2 tail, a sequence inside its first partition, and an empty one.
    lengths = [2 * block + partition + 9, partition // 2, 0]
    tables = [fill(rng, cache, n)[0] for n in lengths]
    attn = ops.DecodeAttention("cpu")
    attn.plan(tables, lengths, heads * group, heads, dim, block, softmax_scale=1 / 8, kv_dtype=quant)
    q = (rng.standard_normal((len(lengths), heads * group, dim)) * 1.5).astype(np.float32)
    out, lse = attn.run(q, cache)
    worst = loosest = 0.0
    for s, (table, length) in enumerate(zip(tables, lengths)):
        if length == 0:
            assert not out[s].any() and np.isneginf(lse[s]).all()
            continue
        k_hat, v_hat = cache.dequantize(table, length)
        for h in range(heads * group):
            ref, ref_lse, bound, lse_bound = reference(k_hat[:, h // group], v_hat[:, h // group], q[s, h], 1 / 8,
                                                       quant, partition)
            assert (np.abs(out[s, h] - ref) <= bound).all(), (s, h, np.abs(out[s, h] - ref).max(), bound.min())
            assert abs(lse[s, h] - ref_lse) <= lse_bound, (s, h, lse[s, h], ref_lse, lse_bound)
            worst, loosest = max(worst, np.abs(out[s, h] - ref).max()), max(loosest, bound.max())
    # Unit-normal V gives outputs of a few tenths: a bound near that would test nothing.
    assert loosest < (0.1 if quant == "int2" else 1e-3) and worst > 0


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="partition 64 does not divide head_dim 32"):
        ops.QuantizedPagedKVCache(4, 64, 2, 32, "int2")
    with pytest.raises(ValueError, match="partition 64 does not divide the block size 16"):
        ops.QuantizedPagedKVCache(4, 16, 2, 64, "int2")
    with pytest.raises(ValueError, match="the partition must be 32, 64 or 128"):
        ops.QuantizedPagedKVCache(4, 64, 2, 64, "int2", partition=16)
    with pytest.raises(ValueError, match="kv_cache_dtype must be int2 or fp8"):
        ops.QuantizedPagedKVCache(4, 64, 2, 64, "int4")
    if not pagoda.cuda_built:
        with pytest.raises(Exception, match="built without CUDA"):
            ops.QuantizedPagedKVCache(4, 64, 2, 64, "fp8", device="cuda")
    with pytest.raises(ValueError, match="int2/fp8 pools on the CPU take f32 rows"):
        ops.QuantizedPagedKVCache(4, 64, 2, 64, "fp8", dtype="f16")
    cache = ops.QuantizedPagedKVCache(4, 64, 2, 64, "int2", partition=32)
    table = cache.allocate(40)
    rows = np.zeros((8, 2, 64), dtype=np.float32)
    with pytest.raises(ValueError, match="k is f16; expected f32"):
        cache.append(rows.astype(np.float16), rows, table)
    with pytest.raises(ValueError, match=r"\[n, num_kv_heads, head_dim\]"):
        cache.append(rows[:, :1], rows[:, :1], table)
    with pytest.raises(ValueError, match="outside 1 blocks of 64"):
        cache.append(rows, rows, table, start=60)
    with pytest.raises(RuntimeError, match="middle of a V partition"):
        cache.append(rows, rows, table, start=3)  # int2 V partitions are written in order
    cache.append(rows, rows, table)
    with pytest.raises(ValueError, match="token 0 was never written"):
        cache.read(table, 33)  # its V partition [0, 32) would be sealed
    with pytest.raises(ValueError, match="length 65 outside the 64 tokens"):
        cache.read(table, 65)

    attn = ops.DecodeAttention("cpu")
    q = np.zeros((1, 4, 64), dtype=np.float32)
    attn.plan([table], [8], 4, 2, 64, 64, kv_dtype="fp8")
    with pytest.raises(ValueError, match=r"does not match the plan \(2, 64, 64, fp8\)"):
        attn.run(q, cache)
    attn.plan([table], [8], 4, 2, 64, 64, kv_dtype="int2")
    with pytest.raises(ValueError, match="q is f16; expected f32"):
        attn.run(q.astype(np.float16), cache, out=q.copy(), lse=np.zeros((1, 4), np.float32))
    plain = ops.PagedKVCache(4, 64, 2, 64, "f32")
    with pytest.raises(ValueError, match="the plan is for an int2 KV cache; kv_cache is f32"):
        attn.run(q, plain)
    with pytest.raises(Exception, match="int2 and fp8 caches take DecodeAttention"):
        ops.PrefixAttention("cpu").plan([table], [8], 4, 2, 64, 64, kv_dtype="int2")



needs_cuda = pytest.mark.skipif(not (pagoda.cuda_built and torch is not None and torch.cuda.is_available()),
                                reason="no CUDA device (or pagoda built without CUDA, or no torch)")


@needs_cuda
@pytest.mark.parametrize("quant", ["fp8", "int2"])
def test_cuda_pool_and_decode_equal_the_cpu(quant):
    # f16 rows, so that the CPU pool (f32 rows of the same values) must store the same codes: the
    # GPU's widened cache then equals the CPU's dequantized one up to f16 rounding, where a single
    # different code would be off by a whole quantization step.
    rng = np.random.default_rng(6)
    heads, group, dim, block = 2, 4, 64, 64
    lengths = [2 * block + 9, 40]
    cpu = ops.QuantizedPagedKVCache(16, block, heads, dim, quant, partition=64, seed=5)
    gpu = ops.QuantizedPagedKVCache(16, block, heads, dim, quant, "cuda", partition=64, seed=5, dtype="f16")
    tables = []
    for n in lengths:
        table = cpu.allocate(n)
        assert gpu.allocate(n) == table
        tables.append(table)
        k = rng.standard_normal((n, heads, dim)).astype(np.float16)
        v = rng.standard_normal((n, heads, dim)).astype(np.float16)
        cut = 70  # the second append starts inside a V partition
        for a, b in ((0, min(cut, n)), (min(cut, n), n)):
            if b > a:
                cpu.append(k[a:b].astype(np.float32), v[a:b].astype(np.float32), table, start=a)
                gpu.append(torch.from_numpy(k[a:b]).cuda(), torch.from_numpy(v[a:b]).cuda(), table, start=a)
    for table, n in zip(tables, lengths):
        for want, got in zip(cpu.dequantize(table, n), gpu.dequantize(table, n)):
            got = got.float().cpu().numpy().astype(np.float64)
            assert np.abs(got - want).max() <= np.abs(want).max() * 2.0**-10 + 1e-6
    attn_cpu, attn_gpu = ops.DecodeAttention("cpu"), ops.DecodeAttention("cuda")
    for attn in (attn_cpu, attn_gpu):
        attn.plan(tables, lengths, heads * group, heads, dim, block, softmax_scale=1 / 8, kv_dtype=quant)
    q = (rng.standard_normal((len(lengths), heads * group, dim)) * 1.5).astype(np.float16)
    out, lse = attn_gpu.run(torch.from_numpy(q).cuda(), gpu)
    out, lse = out.float().cpu().numpy(), lse.cpu().numpy()
    for s, (table, n) in enumerate(zip(tables, lengths)):
        k_hat, v_hat = cpu.dequantize(table, n)
        for h in range(heads * group):
            ref, ref_lse, bound, lse_bound = reference(k_hat[:, h // group], v_hat[:, h // group],
                                                       q[s, h].astype(np.float32), 1 / 8, quant, 64)
            # The output is rounded to f16 once more.
            assert (np.abs(out[s, h] - ref) <= bound + np.abs(ref) * 2.0**-10 + 1e-3).all(), (s, h)
            assert abs(lse[s, h] - ref_lse) <= lse_bound + 1e-3, (s, h, lse[s, h], ref_lse)
