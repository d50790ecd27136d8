"""pagoda.ops against exact references: attention over each sequence's gathered KV in float64
(numpy), and torch's scaled_dot_product_attention where torch is installed; bad input refused."""
import math

import numpy as np
import pytest

import pagoda
from pagoda import ops

try:
    import torch
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")
needs_cuda = pytest.mark.skipif(not (pagoda.cuda_built and torch is not None and torch.cuda.is_available()),
                                reason="no CUDA device (or pagoda built without CUDA, or no torch)")


def make_batch(rng, lengths, block_size, num_blocks, shared_prefix_blocks=0):
    """Block tables over a shuffled pool; with shared_prefix_blocks, every sequence starts with the
    same blocks (a shared prompt), as prefix caching makes them."""
    free = list(rng.permutation(num_blocks))
    shared = [int(free.pop()) for _ in range(shared_prefix_blocks)]
    tables = []
    for n in lengths:
        blocks = -(-n // block_size)
        own = [int(free.pop()) for _ in range(max(0, blocks - len(shared)))]
        tables.append((shared + own)[:blocks])
    return tables


def gather(pool, table, length, layout):
    """[length, num_kv_heads, head_dim] float64 of one sequence from an HND or NHD pool."""
    blocks = pool[table].astype(np.float64)
    if layout == "HND":
        blocks = blocks.transpose(0, 2, 1, 3)
    return blocks.reshape(-1, blocks.shape[2], blocks.shape[3])[:length]


def reference(q, k_pool, v_pool, tables, lengths, layout, scale):
    """Exact attention (o, lse) of each sequence's one query token over its KV, GQA by head // group."""
    n, hq, d = q.shape
    o = np.zeros((n, hq, d))
    lse = np.full((n, hq), -np.inf)
    for s, (table, length) in enumerate(zip(tables, lengths)):
        if length == 0:
            continue
        k, v = gather(k_pool, table, length, layout), gather(v_pool, table, length, layout)
        group = hq // k.shape[1]
        for h in range(hq):
            scores = k[:, h // group] @ q[s, h].astype(np.float64) * scale
            m = scores.max()
            p = np.exp(scores - m)
            o[s, h] = p @ v[:, h // group] / p.sum()
            lse[s, h] = m + math.log(p.sum())
    return o, lse


def random_cache(rng, num_blocks, block_size, kv_heads, head_dim, dtype, layout="HND"):
    cache = ops.PagedKVCache(num_blocks, block_size, kv_heads, head_dim, dtype=dtype, layout=layout)
    k, v = cache.k, cache.v  # numpy views of the pools: no copy
    assert k.ctypes.data == np.from_dlpack(cache.k).ctypes.data
    k[...] = rng.standard_normal(k.shape)
    v[...] = rng.standard_normal(v.shape)
    return cache, k, v


CASES = [
    # name, lengths, q heads, kv heads, head_dim, block size, shared prefix blocks
    ("gqa4-mixed", [1, 17, 300, 0, 64], 8, 2, 64, 16, 0),
    ("long-alone", [1500], 4, 1, 32, 16, 0),
    ("gqa8-shared", [130, 150, 99, 260], 16, 2, 64, 16, 6),
    ("block32-shared", [64, 70, 200], 4, 1, 128, 32, 2),
]


@pytest.mark.parametrize("op_class", [ops.DecodeAttention, ops.PrefixAttention], ids=["decode", "prefix"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_attention_equals_float64_reference(op_class, case, dtype):
    _, lengths, hq, hkv, d, bs, shared = case
    rng = np.random.default_rng(0)
    num_blocks = sum(-(-n // bs) for n in lengths) + 8
    cache, k, v = random_cache(rng, num_blocks, bs, hkv, d, dtype)
    tables = make_batch(rng, lengths, bs, num_blocks, shared)
    q = rng.standard_normal((len(lengths), hq, d)).astype(np.float32)
    attn = op_class("cpu")
    attn.plan(tables, lengths, hq, hkv, d, bs, kv_dtype=dtype)
    o, lse = attn.run(q, cache)
    ref_o, ref_lse = reference(q, k, v, tables, lengths, "HND", 1 / math.sqrt(d))
    np.testing.assert_allclose(o, ref_o, atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(lse, ref_lse, atol=2e-5, rtol=1e-5)
    # run() again into the same outputs: the plan is reusable and writes in place.
    o2, lse2 = attn.run(q, cache, out=o, lse=lse)
    assert o2 is o and lse2 is lse
    np.testing.assert_allclose(o, ref_o, atol=2e-5, rtol=1e-4)


def test_split_and_packing_happen():
    """The cases above exercise the planners' split and packing, not just one item per sequence."""
    rng = np.random.default_rng(1)
    tables = make_batch(rng, [1500], 16, 200)
    attn = ops.DecodeAttention("cpu")
    attn.plan(tables, [1500], 4, 1, 32, 16)
    assert attn._op.num_merges == 1 and attn._op.num_work_items > 1  # one sequence split for the threads
    shared = make_batch(rng, [130, 150, 99, 260], 16, 200, shared_prefix_blocks=6)
    prefix = ops.PrefixAttention("cpu")
    prefix.plan(shared, [130, 150, 99, 260], 16, 2, 64, 16)
    # The 96 shared tokens are read once, not four times.
    assert prefix._op.kv_tokens == 96 + (130 - 96) + (150 - 96) + (99 - 96) + (260 - 96)


def test_nhd_wrap_and_append():
    rng = np.random.default_rng(2)
    bs, hkv, d, hq = 16, 2, 64, 4
    k_pool = np.zeros((12, bs, hkv, d), np.float32)
    v_pool = np.zeros_like(k_pool)
    cache = ops.PagedKVCache.wrap(k_pool, v_pool, layout="NHD")
    assert (cache.num_blocks, cache.block_size, cache.num_kv_heads, cache.head_dim) == (12, bs, hkv, d)
    lengths = [40, 7]
    tables = [cache.allocate(n) for n in lengths]
    assert [len(t) for t in tables] == [3, 1] and cache.num_free_blocks == 8
    keys = [rng.standard_normal((n, hkv, d)).astype(np.float32) for n in lengths]
    values = [rng.standard_normal((n, hkv, d)).astype(np.float32) for n in lengths]
    # Sequence 0 in two appends that cross a block boundary, sequence 1 in one.
    cache.append(keys[0][:21], values[0][:21], tables[0], start=0)
    cache.append(keys[0][21:], values[0][21:], tables[0], start=21)
    cache.append(keys[1], values[1], tables[1])
    for s, n in enumerate(lengths):
        np.testing.assert_array_equal(gather(k_pool, tables[s], n, "NHD"), keys[s])  # written into the caller's array
        np.testing.assert_array_equal(gather(v_pool, tables[s], n, "NHD"), values[s])
    q = rng.standard_normal((2, hq, d)).astype(np.float32)
    attn = ops.DecodeAttention("cpu")
    attn.plan(tables, lengths, hq, hkv, d, bs, kv_dtype="f32", softmax_scale=0.3)
    o, lse = attn.run(q, cache)
    ref_o, ref_lse = reference(q, k_pool, v_pool, tables, lengths, "NHD", 0.3)
    np.testing.assert_allclose(o, ref_o, atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(lse, ref_lse, atol=2e-5, rtol=1e-5)
    cache.free(tables[0])
    assert cache.num_free_blocks == 11
    with pytest.raises(ValueError, match="not an allocated block"):
        cache.free(tables[0])


def test_merge_states_equals_attention_over_the_union():
    rng = np.random.default_rng(3)
    seq, heads, d = 3, 4, 64
    scores = rng.standard_normal((seq, heads, 50))
    values = rng.standard_normal((seq, heads, 50, d))
    cuts = [0, 20, 21, 50]  # three disjoint KV sets, one of a single token

    def state(lo, hi):
        s = scores[..., lo:hi]
        m = s.max(-1, keepdims=True)
        p = np.exp(s - m)
        return (p[..., None] * values[..., lo:hi, :]).sum(-2) / p.sum(-1)[..., None], (m[..., 0] + np.log(p.sum(-1)))

    parts = [state(a, b) for a, b in zip(cuts, cuts[1:])]
    v = np.stack([o for o, _ in parts], axis=1).astype(np.float32)  # [seq, states, heads, d]
    s = np.stack([l for _, l in parts], axis=1).astype(np.float32)
    v_out, s_out = ops.merge_states(v, s)
    full_o, full_lse = state(0, 50)
    np.testing.assert_allclose(v_out, full_o, atol=1e-5)
    np.testing.assert_allclose(s_out, full_lse, atol=1e-5)


def test_bad_input_is_refused():
    rng = np.random.default_rng(4)
    cache, _, _ = random_cache(rng, 8, 16, 2, 64, "f32")
    attn = ops.DecodeAttention("cpu")
    q = np.zeros((2, 4, 64), np.float32)
    with pytest.raises(ValueError, match="before plan"):
        attn.run(q, cache)
    with pytest.raises(ValueError, match="block_tables has 1 sequences and lengths 2"):
        attn.plan([[0]], [3, 4], 4, 2, 64, 16, kv_dtype="f32")
    with pytest.raises(ValueError, match="blocks"):
        attn.plan([[0], [1]], [3, 40], 4, 2, 64, 16, kv_dtype="f32")  # 40 tokens in one block of 16
    with pytest.raises(ValueError, match="dtype must be"):
        attn.plan([[0], [1]], [3, 4], 4, 2, 64, 16, kv_dtype="int8")
    attn.plan([[0], [9]], [3, 4], 4, 2, 64, 16, kv_dtype="f32")
    with pytest.raises(ValueError, match="the plan reads block 9; kv_cache has 8 blocks"):
        attn.run(q, cache)
    attn.plan([[0], [1]], [3, 4], 4, 2, 64, 16, kv_dtype="f32")
    out, lse = np.zeros((2, 4, 64), np.float32), np.zeros((2, 4), np.float32)
    with pytest.raises(ValueError, match=r"q has shape \[2, 8, 64\]; expected \[2, 4, 64\]"):
        attn.run(np.zeros((2, 8, 64), np.float32), cache, out, lse)
    with pytest.raises(ValueError, match="q must have 3 dimensions"):
        attn.run(np.zeros((2, 256), np.float32), cache, out, lse)
    with pytest.raises(ValueError, match="q is f16; expected f32"):
        attn.run(q.astype(np.float16), cache, out, lse)
    with pytest.raises(ValueError, match="q is not contiguous"):
        attn.run(np.zeros((2, 4, 128), np.float32)[:, :, ::2], cache, out, lse)
    with pytest.raises(ValueError, match="lse has shape"):
        attn.run(q, cache, out, np.zeros((2, 5), np.float32))
    with pytest.raises(ValueError, match="q is f64; pagoda takes f32, f16 or bf16"):
        attn.run(q.astype(np.float64), cache, out, lse)
    other, _, _ = random_cache(rng, 8, 16, 2, 64, "f16")
    with pytest.raises(ValueError, match="does not match the plan"):
        attn.run(q, other, out, lse)
    with pytest.raises(ValueError, match="k has shape"):
        cache.append(np.zeros((3, 1, 64), np.float32), np.zeros((3, 1, 64), np.float32), [0])
    with pytest.raises(ValueError, match="need 2 blocks; block_table has 1"):
        cache.append(np.zeros((3, 2, 64), np.float32), np.zeros((3, 2, 64), np.float32), [0], start=15)
    with pytest.raises(ValueError, match="layout must be HND or NHD"):
        ops.PagedKVCache(4, 16, 2, 64, layout="HDN")
    with pytest.raises(ValueError, match="device must be cpu, cuda or cuda:N"):
        ops.DecodeAttention("gpu")
    with pytest.raises(MemoryError):
        cache.allocate(16 * 9)
    if not pagoda.cuda_built:
        with pytest.raises(RuntimeError, match="built without CUDA"):
            ops.DecodeAttention("cuda")


@needs_torch
@pytest.mark.parametrize("op_class", [ops.DecodeAttention, ops.PrefixAttention], ids=["decode", "prefix"])
def test_torch_tensors_against_sdpa(op_class):
    torch.manual_seed(0)
    bs, hkv, hq, d = 16, 2, 8, 64
    lengths = [200, 37, 1, 150]
    k_pool = torch.randn(40, hkv, bs, d)
    v_pool = torch.randn(40, hkv, bs, d)
    cache = ops.PagedKVCache.wrap(k_pool, v_pool)
    tables = make_batch(np.random.default_rng(5), lengths, bs, 40, shared_prefix_blocks=2)
    q = torch.randn(len(lengths), hq, d)
    attn = op_class("cpu")
    attn.plan(tables, lengths, hq, hkv, d, bs, kv_dtype=torch.float32)
    o, lse = attn.run(q, cache)
    assert isinstance(o, torch.Tensor) and isinstance(lse, torch.Tensor)
    for s, (table, n) in enumerate(zip(tables, lengths)):
        k = k_pool[table].permute(1, 0, 2, 3).reshape(hkv, -1, d)[:, :n]  # [kv heads, n, d]
        v = v_pool[table].permute(1, 0, 2, 3).reshape(hkv, -1, d)[:, :n]
        k, v = k.repeat_interleave(hq // hkv, 0), v.repeat_interleave(hq // hkv, 0)
        ref = torch.nn.functional.scaled_dot_product_attention(q[s][:, None], k, v)[:, 0]
        torch.testing.assert_close(o[s], ref, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(lse[s], torch.logsumexp(q[s][:, None] @ k.transpose(1, 2) / math.sqrt(d), -1)[:, 0],
                                   atol=2e-5, rtol=1e-5)


@needs_cuda
@pytest.mark.parametrize("op_class", [ops.DecodeAttention, ops.PrefixAttention], ids=["decode", "prefix"])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_cuda_kernels_against_sdpa(op_class, dtype):
    torch.manual_seed(0)
    t = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    bs, hkv, hq, d = 16, 8, 32, 128
    lengths = [1000, 37, 1, 600, 4096]
    num_blocks = 600
    k_pool = torch.randn(num_blocks, hkv, bs, d, device="cuda", dtype=t)
    v_pool = torch.randn(num_blocks, hkv, bs, d, device="cuda", dtype=t)
    cache = ops.PagedKVCache.wrap(k_pool, v_pool)
    tables = make_batch(np.random.default_rng(6), lengths, bs, num_blocks, shared_prefix_blocks=8)
    q = torch.randn(len(lengths), hq, d, device="cuda", dtype=t)
    attn = op_class("cuda")
    attn.plan(tables, lengths, hq, hkv, d, bs, kv_dtype=t)
    o, lse = attn.run(q, cache)
    # CUDA graph: capture run() once, replay it on new q values.
    graph = torch.cuda.CUDAGraph()
    o_g, lse_g = torch.empty_like(o), torch.empty_like(lse)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        attn.run(q, cache, out=o_g, lse=lse_g)  # warm up on the capture stream
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        attn.run(q, cache, out=o_g, lse=lse_g)
    q.copy_(torch.randn_like(q))
    graph.replay()
    o, lse = attn.run(q, cache)
    torch.cuda.synchronize()
    torch.testing.assert_close(o_g, o, atol=0, rtol=0)
    for s, (table, n) in enumerate(zip(tables, lengths)):
        k = k_pool[table].permute(1, 0, 2, 3).reshape(hkv, -1, d)[:, :n].float()
        v = v_pool[table].permute(1, 0, 2, 3).reshape(hkv, -1, d)[:, :n].float()
        k, v = k.repeat_interleave(hq // hkv, 0), v.repeat_interleave(hq // hkv, 0)
        ref = torch.nn.functional.scaled_dot_product_attention(q[s].float()[:, None], k, v)[:, 0]
        torch.testing.assert_close(o[s].float(), ref, atol=2e-2, rtol=2e-2)
        ref_lse = torch.logsumexp(q[s].float()[:, None] @ k.transpose(1, 2) / math.sqrt(d), -1)[:, 0]
        torch.testing.assert_close(lse[s], ref_lse, atol=2e-2, rtol=1e-3)


@needs_cuda
def test_cuda_append_and_merge_states():
    torch.manual_seed(1)
    cache = ops.PagedKVCache(8, 16, 2, 128, dtype="f16", device="cuda")
    k_pool, v_pool = torch.from_dlpack(cache.k), torch.from_dlpack(cache.v)
    table = cache.allocate(20)
    k = torch.randn(20, 2, 128, device="cuda", dtype=torch.float16)
    v = torch.randn_like(k)
    cache.append(k, v, table)
    torch.cuda.synchronize()
    torch.testing.assert_close(k_pool[table].permute(0, 2, 1, 3).reshape(-1, 2, 128)[:20], k, atol=0, rtol=0)
    torch.testing.assert_close(v_pool[table].permute(0, 2, 1, 3).reshape(-1, 2, 128)[:20], v, atol=0, rtol=0)
    states = torch.randn(3, 4, 8, 128, device="cuda", dtype=torch.float16)
    lses = torch.randn(3, 4, 8, device="cuda")
    v_out, s_out = ops.merge_states(states, lses)
    ref_v, ref_s = ops.merge_states(states.float().cpu(), lses.cpu())
    torch.testing.assert_close(v_out.float().cpu(), ref_v, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(s_out.cpu(), ref_s, atol=1e-4, rtol=1e-5)
