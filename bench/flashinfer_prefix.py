#!/usr/bin/env python3
"""FlashInfer's decode attention on prefix-tree batches: plain paged decode against cascade.

The peer measurement for pagoda's prefix-aware decode attention. A batch is a prefix tree written
COUNTS_LENGTHS: COUNTS gives, level by level from the root, how many nodes each level has (node i
of level L has parent i // (COUNTS[L] // COUNTS[L-1])), LENGTHS the KV tokens each node of that
level owns; the last level's nodes are the queries. `1,4,16_128,256,1024`: one 128-token root,
4 children of 256 tokens, 16 queries of 1024 private tokens each (each attends to 1408 tokens;
unique KV is 128 + 4*256 + 16*1024 tokens). `256_4096` is 256 unshared sequences.

Per (tree, heads) config:
  * a KV pool in HND layout, K and V separate tensors [num_pages, kv_heads, page_size, head_dim],
    fp16 random values, allocated for that config alone (sized to its pages) and freed after;
  * every node owns ceil(len / page_size) pages drawn from a random permutation of the pool
    (fixed seed), so pages are scattered; one query token per query;
  * BatchDecodeWithPagedKVCacheWrapper (HND) over each query's whole page table (its ancestors'
    pages then its own, root to leaf), use_tensor_cores=False and True; decode_us is the better;
  * MultiLevelCascadeAttentionWrapper with one level per tree level: level L's qo_indptr groups
    the queries (numbered so that every node's queries are contiguous) by their level-L ancestor,
    and its page table holds that ancestor's own pages. Its run() is one
    BatchPrefillWithPagedKVCacheWrapper run per level (backend chosen by FlashInfer: fa3 on sm90,
    else fa2; --cascade-backend overrides) plus merge_state_in_place per upper level;
  * plan() once per config outside the timing; run() timed with the code of
    bench/flashinfer_decode.py (Bench.time_mode: CUDA events, --warmup untimed runs, median of
    --runs, a GPU sleep and then an L2 flush, reading a buffer of 2x the L2 size, before every run);
  * correctness: up to 32 evenly spaced queries per config against a float32 torch reference on
    the GPU; an error above --check-tolerance is flagged ("mismatch" in the JSON, and stderr).

Install and JIT builds: as in bench/flashinfer_decode.py's docstring. The cascade wrapper needs
the batch-prefill module of its backend besides the decode modules; on H100/H200 that is fa3,
one more JIT build of several minutes: run --compile-only first, in a call of its own.

Usage:
  python3 bench/flashinfer_prefix.py --compile-only --out /tmp/fi_prefix_compile.json
  python3 bench/flashinfer_prefix.py --trees "$(./build/pagoda bench prefix-attention --list-trees)" \
      --out bench/results/<device>/flashinfer_prefix.json
  python3 bench/flashinfer_prefix.py --trees '1,4,16_128,256,1024;256_4096' --heads 32/8 --out /tmp/p.json
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import os
import platform
import random
import re
import sys
import time
import traceback
from collections import Counter
from itertools import accumulate

_HERE = os.path.dirname(os.path.abspath(__file__))


def _load_decode_peer():
    """bench/flashinfer_decode.py, for its helpers and its timing code (one definition of both)."""
    spec = importlib.util.spec_from_file_location("flashinfer_decode", os.path.join(_HERE, "flashinfer_decode.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


fd = _load_decode_peer()

SEED = fd.SEED
HEAD_DIM = 128
MAX_CHECKED = 32  # queries per config compared with the torch reference
DEVICE = "cuda:0"  # a test may point this at the CPU, with a stand-in flashinfer
VARIANTS = ("decode_cuda_core", "decode_tensor_core", "cascade")
# ---- batch notation and page tables (pure Python: tested without torch) ---------------------------

def parse_tree(spec: str) -> tuple[list[int], list[int]]:
    """COUNTS_LENGTHS -> (counts, lengths), checking that every level spreads evenly."""
    parts = spec.strip().split("_")
    if len(parts) != 2:
        raise ValueError(f"tree '{spec}': expected COUNTS_LENGTHS, e.g. 1,4,16_128,256,1024")
    try:
        counts, lengths = ([int(x) for x in part.split(",")] for part in parts)
    except ValueError:
        raise ValueError(f"tree '{spec}': COUNTS and LENGTHS must be comma-separated integers") from None
    if len(counts) != len(lengths):
        raise ValueError(f"tree '{spec}': {len(counts)} counts but {len(lengths)} lengths")
    if any(x < 1 for x in counts + lengths):
        raise ValueError(f"tree '{spec}': counts and lengths must be positive")
    for lv in range(1, len(counts)):
        if counts[lv] % counts[lv - 1]:
            raise ValueError(f"tree '{spec}': level {lv} has {counts[lv]} nodes, not a multiple of the "
                             f"{counts[lv - 1]} of level {lv - 1}, so they cannot be spread evenly over them")
    return counts, lengths


def check_page_multiples(spec: str, lengths: list[int], page_size: int) -> None:
    """Only a leaf may end in a partial page: a shared node's last page is followed by its
    children's tokens in every query's page table, so it must be full."""
    for lv, n in enumerate(lengths[:-1]):
        if n % page_size:
            raise ValueError(f"tree '{spec}': level {lv} length {n} is not a multiple of the page size {page_size}")


def split_trees(values: list[str]) -> list[str]:
    return [t for v in values for t in re.split(r"[;\s]+", v) if t]


def parent(counts: list[int], level: int, i: int) -> int:
    return i // (counts[level] // counts[level - 1])


def query_paths(counts: list[int]) -> list[list[int]]:
    """For each query (last-level node), the index of its ancestor on every level, root first."""
    paths = []
    for j in range(counts[-1]):
        path = [j]
        for lv in range(len(counts) - 1, 0, -1):
            path.insert(0, parent(counts, lv, path[0]))
        paths.append(path)
    return paths


def build_layout(counts: list[int], lengths: list[int], page_size: int, seed: int) -> dict:
    """Every node's pages (a slice of a seeded permutation of the pool), the per-query page tables
    for the decode wrapper and the per-level tables for the cascade wrapper, as Python lists."""
    P = page_size
    pages_per = [-(-n // P) for n in lengths]
    num_pages = sum(c * p for c, p in zip(counts, pages_per))
    perm = list(range(num_pages))
    random.Random(seed).shuffle(perm)
    node_pages, pos = [], 0
    for c, p in zip(counts, pages_per):
        node_pages.append([perm[pos + i * p: pos + (i + 1) * p] for i in range(c)])
        pos += c * p

    paths = query_paths(counts)
    levels = []
    for lv, c in enumerate(counts):
        # Cascade level lv: one "request" per level-lv node, holding the queries below it; the
        # queries must be contiguous for qo_indptr to describe them.
        anc = [path[lv] for path in paths]
        if any(a > b for a, b in zip(anc, anc[1:])):
            raise AssertionError(f"queries of level {lv} nodes are not contiguous")
        sizes = Counter(anc)
        levels.append({
            "qo_indptr": [0, *accumulate(sizes[i] for i in range(c))],
            "kv_indptr": [i * pages_per[lv] for i in range(c + 1)],
            "kv_indices": [pg for pages in node_pages[lv] for pg in pages],
            "last_page_len": [lengths[lv] - (pages_per[lv] - 1) * P] * c,
        })

    path_pages = sum(pages_per)
    tables = [[pg for lv, a in enumerate(path) for pg in node_pages[lv][a]] for path in paths]
    return {
        "num_pages": num_pages, "node_pages": node_pages, "levels": levels, "tables": tables,
        "path_len": sum(lengths),
        "decode": {
            "indptr": [j * path_pages for j in range(counts[-1] + 1)],
            "indices": [pg for t in tables for pg in t],
            # Ancestors' lengths are page multiples, so the only partial page is the leaf's last.
            "last_page_len": [sum(lengths) - (path_pages - 1) * P] * counts[-1],
        },
    }


def checked_queries(n: int) -> list[int]:
    m = min(MAX_CHECKED, n)
    return [i * n // m for i in range(m)]


def unique_kv_bytes(counts, lengths, kv_heads, head_dim) -> int:
    return sum(c * n for c, n in zip(counts, lengths)) * kv_heads * head_dim * 2 * 2  # fp16, K and V


def reference(torch, q, k, v, pages: list[int], length: int):
    """float32 attention of one query token q [q_heads, D] over `length` tokens of `pages` (HND
    pool); q head h reads kv head h // (q_heads // kv_heads)."""
    kv_heads, D = k.shape[1], k.shape[3]
    idx = torch.tensor(pages, dtype=torch.long, device=k.device)
    ks = k[idx].permute(1, 0, 2, 3).reshape(kv_heads, -1, D)[:, :length].float()
    vs = v[idx].permute(1, 0, 2, 3).reshape(kv_heads, -1, D)[:, :length].float()
    qg = q.float().reshape(kv_heads, -1, D)  # [kv_heads, group, D]: consecutive q heads share one kv head
    p = torch.softmax(torch.einsum("kgd,knd->kgn", qg, ks) / math.sqrt(D), dim=-1)
    return torch.einsum("kgn,knd->kgd", p, vs).reshape(-1, D)


# ---- arguments -----------------------------------------------------------------------------------

def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trees", action="append", default=None,
                   help="COUNTS_LENGTHS batches separated by ';' or spaces; repeatable. The benchmark's named "
                        "sets come from pagoda: --trees \"$(./build/pagoda bench prefix-attention --tree listed "
                        "--list-trees)\" (or --tree pat)")
    p.add_argument("--heads", type=fd.head_list, default=fd.head_list("32/32,16/8,32/8,64/8"),
                   help="q_heads/kv_heads, comma-separated (default 32/32,16/8,32/8,64/8)")
    p.add_argument("--page-size", type=int, default=16, help="tokens per KV page")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--cascade-backend", choices=["auto", "fa2", "fa3"], default="auto",
                   help="backend of the cascade's per-level prefill wrappers (auto: FlashInfer's choice)")
    p.add_argument("--workspace-mb", type=int, default=256, help="FlashInfer float workspace (split-kv partials)")
    p.add_argument("--check-tolerance", type=float, default=2e-2, help="max abs error allowed against torch")
    p.add_argument("--jit-cache", default="", help="FLASHINFER_WORKSPACE_BASE for the JIT cache (default: as set, else home)")
    p.add_argument("--compile-only", action="store_true",
                   help="plan and run each wrapper once on a tiny tree per head config (JIT builds) and exit")
    p.add_argument("--out", required=True, help="JSON results")
    a = p.parse_args(argv)
    if a.runs < 1 or a.warmup < 0 or a.page_size < 1:
        p.error("--runs and --page-size must be positive, --warmup not negative")
    if a.compile_only:
        a.trees = [f"1,2_{a.page_size},5"]  # two levels, a partial leaf page: every code path, tiny
    elif not a.trees:
        p.error("--trees is required (e.g. the output of `pagoda bench prefix-attention --list-trees`)")
    else:
        a.trees = split_trees(a.trees)
    for t in a.trees:
        try:
            check_page_multiples(t, parse_tree(t)[1], a.page_size)
        except ValueError as e:
            p.error(f"--trees: {e}")
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    fd.setup_jit_environment(args.jit_cache)

    base = {
        "benchmark": "flashinfer_prefix", "peer": "flashinfer", "command": fd.command_line(),
        "commit": fd.git_commit(), "python": platform.python_version(),
        "options": {"trees": args.trees, "heads": [f"{q}/{kv}" for q, kv in args.heads], "head_dim": HEAD_DIM,
                    "page_size": args.page_size, "dtype": "fp16", "layout": "hnd", "runs": args.runs,
                    "warmup": args.warmup, "cascade_backend": args.cascade_backend,
                    "workspace_mb": args.workspace_mb, "check_tolerance": args.check_tolerance,
                    "compile_only": args.compile_only},
    }
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        return fd.fail_json(args, base, f"import torch failed: {type(e).__name__}: {e}", traceback.format_exc())
    base.update(torch_version=torch.__version__, torch_cuda=torch.version.cuda, nvcc=fd.nvcc_version(),
                flashinfer_workspace_base=os.environ.get("FLASHINFER_WORKSPACE_BASE", ""))
    try:
        import flashinfer
    except Exception as e:  # noqa: BLE001
        return fd.fail_json(args, base, f"import flashinfer failed: {type(e).__name__}: {e}", traceback.format_exc())
    base["flashinfer_version"] = getattr(flashinfer, "__version__", "unknown")
    if not torch.cuda.is_available():
        return fd.fail_json(args, base, "torch.cuda.is_available() is False: no CUDA device")
    props = torch.cuda.get_device_properties(0)
    base.update(device=torch.cuda.get_device_name(0), compute_capability=f"{props.major}.{props.minor}",
                sm_count=props.multi_processor_count, memory_bytes=props.total_memory,
                l2_bytes=int(getattr(props, "L2_cache_size", 0) or 0))
    print(f"flashinfer prefix: flashinfer {base['flashinfer_version']}, torch {torch.__version__} "
          f"(CUDA {torch.version.cuda}), nvcc {base['nvcc'] or '?'}, {base['device']}", file=sys.stderr)
    return PrefixBench(args, base, torch, flashinfer).run()


# ---- the GPU part --------------------------------------------------------------------------------

class CascadeRunner:
    """Gives the cascade wrapper the run(q, kv, out=...) that Bench.time_mode calls; its run()
    takes no out= and allocates its outputs itself (that cost is part of what is timed)."""

    def __init__(self, w):
        self.w = w

    def run(self, q, kv, out=None):
        return self.w.run(q, kv)


class PrefixBench:
    # flashinfer_decode.py's timing, shared rather than copied: time_mode reads self.torch,
    # self.args.warmup/.runs, self.cycles_per_us, self.flush, self.flush_sum.
    calibrate_sleep = fd.Bench.calibrate_sleep
    time_mode = fd.Bench.time_mode

    def __init__(self, args, base, torch, flashinfer):
        self.args, self.base, self.torch, self.fi = args, base, torch, flashinfer
        self.dev = torch.device(DEVICE)
        self.dtype = torch.float16
        self.first_ok: set[str] = set()  # variants that planned once
        self.given_up: dict[str, str] = {}  # variant -> error before it ever planned (JIT build)
        self.cascades: dict[int, object] = {}  # num_levels -> wrapper
        l2 = base["l2_bytes"] or 64 * 1024 * 1024
        self.flush = torch.ones(2 * l2 // 4, dtype=torch.float32, device=self.dev)
        self.flush_sum = torch.zeros((), dtype=torch.float32, device=self.dev)
        self.workspace = torch.zeros(args.workspace_mb << 20, dtype=torch.uint8, device=self.dev)
        W = flashinfer.BatchDecodeWithPagedKVCacheWrapper
        self.decoders = {"decode_cuda_core": W(self.workspace, "HND", use_tensor_cores=False),
                         "decode_tensor_core": W(self.workspace, "HND", use_tensor_cores=True)}
        self.cycles_per_us = self.calibrate_sleep()
        base["timing"] = (
            f"CUDA events around wrapper.run() only (plan() once per config, outside): decode run(q, (k, v), out=o); "
            f"cascade run(q, (k, v)), which includes its per-level output allocation and merge_state_in_place; "
            f"{args.warmup} warm-up runs, median of {args.runs} runs, L2 flushed ({2 * l2 // 1000000} MB read) before "
            f"each run, a GPU sleep (max(300 us, 4x the host time of one run())) before the flush so host launch "
            f"cost is hidden; the timing code is bench/flashinfer_decode.py's Bench.time_mode")

    def ints(self, xs):
        return self.torch.tensor(xs, dtype=self.torch.int32, device=self.dev)

    def cascade(self, num_levels: int):
        if num_levels not in self.cascades:
            w = self.fi.MultiLevelCascadeAttentionWrapper(num_levels, self.workspace, kv_layout="HND")
            if self.args.cascade_backend != "auto":
                # The class takes no backend argument; its per-level wrappers resolve "auto" in plan().
                for pw in w._batch_prefill_wrappers:
                    pw._backend = self.args.cascade_backend
            self.cascades[num_levels] = w
        return self.cascades[num_levels]

    def plan(self, name, lay, qh, kvh, c):
        """Plans variant `name`; returns an object with run(q, (k, v), out=o)."""
        P, fp16 = self.args.page_size, self.dtype
        if name == "cascade":
            w = self.cascade(len(lay["levels"]))
            lv = lay["levels"]
            w.plan([self.ints(x["qo_indptr"]) for x in lv], [self.ints(x["kv_indptr"]) for x in lv],
                   [self.ints(x["kv_indices"]) for x in lv], [self.ints(x["last_page_len"]) for x in lv],
                   qh, kvh, HEAD_DIM, P, q_data_type=fp16, kv_data_type=fp16)
            c["cascade_backend"] = [getattr(pw, "_backend", "?") for pw in w._batch_prefill_wrappers]
            return CascadeRunner(w)
        w, d = self.decoders[name], lay["decode"]
        w.plan(self.ints(d["indptr"]), self.ints(d["indices"]), self.ints(d["last_page_len"]), qh, kvh, HEAD_DIM, P,
               pos_encoding_mode="NONE", q_data_type=fp16, kv_data_type=fp16)
        return w

    def run_variant(self, name, lay, q, kv, out, ref, checked, c, timed):
        torch = self.torch
        if name not in self.first_ok:
            print(f"flashinfer prefix: first plan() of {name}: JIT-builds its kernels unless cached (minutes)...",
                  file=sys.stderr, flush=True)
        t0 = time.time()
        runner = self.plan(name, lay, c["q_heads"], c["kv_heads"], c)
        if name not in self.first_ok:
            print(f"flashinfer prefix: {name} ready after {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
            self.first_ok.add(name)
        o = runner.run(q, kv, out=out)
        torch.cuda.synchronize()
        if ref is not None:
            err = (o[checked].float() - ref).abs().max().item()
            c["max_abs_err"][name] = err if math.isfinite(err) else str(err)  # keep the JSON strict
            if not (err <= self.args.check_tolerance):  # NaN fails too
                c["mismatch"].append(name)
                print(f"flashinfer prefix: MISMATCH {c['tree']} h{c['q_heads']}/{c['kv_heads']} {name}: "
                      f"max abs err {err:.3e} > {self.args.check_tolerance}", file=sys.stderr)
        if timed:
            t = self.time_mode(runner, q, kv, out)
            c["timing_detail"][name] = t
            key = "cascade_us" if name == "cascade" else name + "_us"
            c[key] = t["median_us"]

    def run_config(self, spec, qh, kvh, timed) -> dict:
        torch, P = self.torch, self.args.page_size
        counts, lengths = parse_tree(spec)
        lay = build_layout(counts, lengths, P, SEED)
        n = counts[-1]
        c = {"tree": spec, "q_heads": qh, "kv_heads": kvh, "head_dim": HEAD_DIM, "page_size": P,
             "num_queries": n, "levels": len(counts), "path_tokens": lay["path_len"],
             "unique_tokens": sum(a * b for a, b in zip(counts, lengths)), "num_pages": lay["num_pages"],
             "unique_kv_bytes": unique_kv_bytes(counts, lengths, kvh, HEAD_DIM),
             "decode_kv_bytes": n * lay["path_len"] * kvh * HEAD_DIM * 2 * 2,
             "decode_us": None, "decode_cuda_core_us": None, "decode_tensor_core_us": None, "cascade_us": None,
             "max_abs_err": {v: None for v in VARIANTS}, "mismatch": [], "errors": {}, "timing_detail": {}}
        k = v = q = out = ref = None
        try:
            g = torch.Generator(device=self.dev).manual_seed(SEED)
            shape = (lay["num_pages"], kvh, P, HEAD_DIM)
            k = torch.empty(shape, dtype=self.dtype, device=self.dev).uniform_(-1, 1, generator=g)
            v = torch.empty(shape, dtype=self.dtype, device=self.dev).uniform_(-1, 1, generator=g)
            q = torch.empty(n, qh, HEAD_DIM, dtype=self.dtype, device=self.dev).uniform_(-1, 1, generator=g)
            out = torch.empty_like(q)
        except Exception as e:  # noqa: BLE001  (OOM, most likely)
            c["errors"]["pool"] = f"{type(e).__name__}: {e}"[-2000:]
            return self.release(c)
        checked = checked_queries(n)
        try:
            ref = torch.stack([reference(torch, q[j], k, v, lay["tables"][j], lay["path_len"]) for j in checked])
        except Exception as e:  # noqa: BLE001
            c["errors"]["reference"] = f"{type(e).__name__}: {e}"[-2000:]
        checked = torch.tensor(checked, dtype=torch.long, device=self.dev)
        for name in VARIANTS:
            if name in self.given_up:
                c["errors"][name] = f"skipped: failed before it ever planned: {self.given_up[name]}"
                continue
            try:
                self.run_variant(name, lay, q, (k, v), out, ref, checked, c, timed)
            except Exception as e:  # noqa: BLE001
                msg = f"{type(e).__name__}: {e}"[-6000:]
                print(f"flashinfer prefix: {name} failed on {spec} h{qh}/{kvh}:\n{traceback.format_exc()}",
                      file=sys.stderr)
                c["errors"][name] = msg
                # A variant that fails before it ever planned (its JIT build, most likely) is given
                # up for the rest of the sweep; an OOM or a later failure counts for this config only.
                if name not in self.first_ok and not isinstance(e, torch.cuda.OutOfMemoryError):
                    self.given_up[name] = msg
        decode = [c[x] for x in ("decode_cuda_core_us", "decode_tensor_core_us") if c[x] is not None]
        c["decode_us"] = min(decode) if decode else None
        del k, v, q, out, ref
        return self.release(c)

    def release(self, c):
        try:  # a failed kernel can leave an error here; record it and go on with the sweep
            self.torch.cuda.synchronize()
            self.torch.cuda.empty_cache()
        except Exception as e:  # noqa: BLE001
            c["errors"]["release"] = f"{type(e).__name__}: {e}"[-2000:]
        return c

    def run(self) -> int:
        a, base = self.args, self.base
        jobs = [(t, qh, kvh) for t in a.trees for qh, kvh in a.heads]
        configs = []
        t_start = time.time()
        for i, (tree, qh, kvh) in enumerate(jobs):
            c = self.run_config(tree, qh, kvh, timed=not a.compile_only)
            configs.append(c)
            print(f"[{i + 1}/{len(jobs)}] {progress_line(c)}", file=sys.stderr, flush=True)
            obj = dict(base, configs=configs, given_up=self.given_up)
            if i + 1 < len(jobs):  # written as it goes, so a run cut short keeps what it measured
                obj["incomplete"] = f"{i + 1} of {len(jobs)} configs done"
            fd.write_json(a.out, obj)
        if a.compile_only:
            print(f"flashinfer prefix: compile-only done in {time.time() - t_start:.0f} s; "
                  f"given up: {self.given_up or 'none'}", file=sys.stderr)
        else:
            print_table(base, configs)
        return 0


def fmt_us(x) -> str:
    return f"{x:.1f}" if x is not None else "-"


def progress_line(c: dict) -> str:
    errs = ", ".join(f"{k} {v:.1e}" if isinstance(v, float) else f"{k} {v}"
                     for k, v in c["max_abs_err"].items() if v is not None)
    line = (f"{c['tree']} h{c['q_heads']}/{c['kv_heads']}: {c['num_queries']} queries, unique KV "
            f"{c['unique_kv_bytes'] / 1e6:.1f} MB; decode cuda-core {fmt_us(c['decode_cuda_core_us'])} us, "
            f"tensor-core {fmt_us(c['decode_tensor_core_us'])} us, cascade {fmt_us(c['cascade_us'])} us "
            f"({'/'.join(c.get('cascade_backend', ['?']))}); max abs err {errs or '-'}")
    if c["mismatch"]:
        line += f"; MISMATCH: {', '.join(c['mismatch'])}"
    if c["errors"]:
        line += f"; errors in: {', '.join(c['errors'])}"
    return line


def print_table(base: dict, configs: list[dict]) -> None:
    print(f"flashinfer {base.get('flashinfer_version')} prefix-tree decode on {base.get('device')}: "
          f"fp16 HND, head_dim {HEAD_DIM}, page {base['options']['page_size']}")
    w = max([len(c["tree"]) for c in configs] + [4])
    print(f"{'tree':<{w}} {'heads':>6} {'queries':>7} {'uniq MB':>9} {'decode us':>10} {'cascade us':>11} {'check':>6}")
    for c in configs:
        heads = f"{c['q_heads']}/{c['kv_heads']}"
        check = "FAIL" if c["mismatch"] else ("ok" if any(v is not None for v in c["max_abs_err"].values()) else "-")
        print(f"{c['tree']:<{w}} {heads:>6} {c['num_queries']:>7} {c['unique_kv_bytes'] / 1e6:>9.1f} "
              f"{fmt_us(c['decode_us']):>10} {fmt_us(c['cascade_us']):>11} {check:>6}")
    print("decode us: the better of use_tensor_cores=False/True; uniq MB: K+V bytes of all tree nodes, each once")


if __name__ == "__main__":
    sys.exit(main())
