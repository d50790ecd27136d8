#!/usr/bin/env python3
"""FlashInfer's paged decode attention on the sweep of `pagoda bench attention`.

The peer measurement for pagoda's CUDA decode kernel: FlashInfer's
BatchDecodeWithPagedKVCacheWrapper over the same configs, with the same rules:

  * KV pool in HND layout, K and V separate tensors [num_pages, kv_heads, page_size, head_dim],
    random values; each config views a prefix of one pool allocated and filled once for the whole
    sweep (K in the first half of the prefix, V in the second, as pagoda does);
  * one query token per sequence, every sequence `context` tokens long, its pages drawn from a
    random permutation of the config's pool (indptr / indices / last_page_len);
  * plan() once per config outside the timing; only wrapper.run(q, (k, v), out=o) is timed, with
    CUDA events, L2 flushed (a buffer of 2x the L2 size read, which leaves no dirty lines behind) before every timed run, median of
    --runs after --warmup untimed runs;
  * configs whose pool exceeds 70% of free device memory (or --max-kv-gb) are skipped.

Each config runs twice: use_tensor_cores=False (FlashInfer's CUDA-core decode kernel) and
use_tensor_cores=True (its FA2 prefill kernel used for decode). A correctness check against a
float32 torch reference runs once per head shape (small batch, uneven lengths) for both modes.

Device install (GPU machine, no internet), from the repository root, into the torch venv
(.flashinfer-wheels is filled on a machine with PyPI access; 38 MB, see the end of this note):

  /opt/torch/.venv/bin/python3 -m pip install --no-index --find-links .flashinfer-wheels --no-deps \
      flashinfer-python==0.7.0.post1 "apache-tvm-ffi>=0.1.11,<0.2" click einops ninja nvidia-ml-py \
      tabulate "packaging>=24.2" requests urllib3 idna charset-normalizer certifi tqdm \
      "typing-extensions>=4.13"

--no-deps is needed: flashinfer-python 0.7 declares cuda-tile, nccl4py, nccl-extensions,
nvidia-cudnn-frontend, nvidia-cutlass-dsl and cuda-python, which neither `import flashinfer` nor
the decode path imports and which are not in .flashinfer-wheels (size); torch 2.11 brings
cuda-bindings itself. `pip check` will name those as missing; that is expected. Names already
installed at a version that satisfies the line are left as they are.

The kernels are JIT-compiled by nvcc on the first plan() of each mode (ninja must be on PATH; the
`ninja` wheel puts one in the venv's bin/, which this script adds to PATH; nvcc is found through
CUDA_HOME, else PATH, else /usr/local/cuda). Checked with nvcc 13.0 for sm_90a on a 2-core machine:
the decode module took 2 min, the prefill (tensor-core) module 5.5 min; 16 cores should need well
under half that. They are cached under $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer (default:
home); --jit-cache DIR chooses, and --compile-only builds them in a call of their own.

Wheels (.flashinfer-wheels): flashinfer-python 0.7.0.post1 (the newest release whose wheel fits:
0.7.1 and later are 62-67 MB; its decode kernel source is the same as 0.7.2.post1's),
apache-tvm-ffi 0.1.15.post2 (cp312 manylinux), and small pure-Python wheels.

Usage:
  python3 bench/flashinfer_decode.py --out bench/results/<device>/flashinfer_attention.json
  python3 bench/flashinfer_decode.py --batches 1,8 --contexts 512 --heads 32/8 --runs 20 --out /tmp/fi.json
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shlex
import subprocess
import sys
import time
import traceback

SEED = 20240531
MODES = {"cuda_cores": False, "tensor_cores": True}  # JSON key -> use_tensor_cores


def int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of integers")
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"'{text}': give positive integers")
    return values


def head_list(text: str) -> list[tuple[int, int]]:
    out = []
    for spec in text.split(","):
        m = re.fullmatch(r"\s*(\d+)/(\d+)\s*", spec)
        if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
            raise argparse.ArgumentTypeError(f"'{spec}' is not q_heads/kv_heads (e.g. 32/8)")
        q, kv = int(m.group(1)), int(m.group(2))
        if q % kv:
            raise argparse.ArgumentTypeError(f"{spec}: {kv} KV heads do not divide {q} query heads")
        out.append((q, kv))
    return out


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int_list, default=[1, 8, 32, 64, 128, 256])
    p.add_argument("--contexts", type=int_list, default=[512, 2048, 4096, 8192, 32768])
    p.add_argument("--heads", type=head_list, default=[(32, 32), (32, 8), (28, 4), (40, 8)],
                   help="q_heads/kv_heads, comma-separated (default 32/32,32/8,28/4,40/8)")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV page")
    p.add_argument("--dtype", choices=["fp16", "bf16"], default="fp16")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--modes", default="cuda_cores,tensor_cores",
                   help="cuda_cores (use_tensor_cores=False), tensor_cores (=True), comma-separated")
    p.add_argument("--filter", default="", help="run only configs whose name (e.g. b64-c8192-h32/8) contains this")
    p.add_argument("--max-kv-gb", type=float, default=0.0,
                   help="largest KV pool to allocate, in GB (default 70%% of free device memory)")
    p.add_argument("--workspace-mb", type=int, default=256, help="FlashInfer float workspace (split-kv partials)")
    p.add_argument("--no-check", action="store_true", help="skip the correctness check against torch")
    p.add_argument("--check-tolerance", type=float, default=2e-2, help="max abs error allowed in the check")
    p.add_argument("--jit-cache", default="", help="FLASHINFER_WORKSPACE_BASE for the JIT cache (default: as set, else home)")
    p.add_argument("--compile-only", action="store_true", help="JIT-build the kernels (plan one tiny config) and exit")
    p.add_argument("--out", default="", help="JSON results (default bench/results/<device>/flashinfer_attention.json)")
    a = p.parse_args(argv)
    if a.runs < 1:
        p.error("--runs: at least 1")
    if a.warmup < 0:
        p.error("--warmup: negative")
    if a.head_dim < 1 or a.block_size < 1:
        p.error("--head-dim and --block-size must be positive")
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    for m in modes:
        if m not in MODES:
            p.error(f"--modes: unknown mode '{m}' ({', '.join(MODES)})")
    a.modes = list(dict.fromkeys(modes))
    return a


def command_line() -> str:
    return " ".join(shlex.quote(x) for x in [os.path.basename(sys.executable)] + sys.argv)


def device_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


def git_commit() -> str:
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        return subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
    except Exception:
        return ""


def write_json(path: str, obj: dict) -> None:
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    print(f"flashinfer bench: wrote {path}", file=sys.stderr)


def fail_json(args, base: dict, error: str, tb: str = "") -> int:
    """Prints why and writes a JSON with an "error" field; the exit status stays 0 on purpose."""
    print(f"flashinfer bench: ERROR: {error}", file=sys.stderr)
    if tb:
        print(tb, file=sys.stderr)
    obj = dict(base)
    obj["error"] = error
    if tb:
        obj["traceback"] = tb
    obj["configs"] = []
    write_json(args.out or "bench/results/unknown/flashinfer_attention.json", obj)
    return 0


def median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def setup_jit_environment(jit_cache: str | None) -> None:
    """Where FlashInfer keeps its just-in-time builds, and the ninja it runs to make them."""
    if jit_cache:
        os.environ["FLASHINFER_WORKSPACE_BASE"] = os.path.abspath(jit_cache)
    # FlashInfer runs `ninja` from PATH; the ninja wheel installs it next to this python.
    bindir = os.path.dirname(os.path.abspath(sys.executable))
    if os.path.exists(os.path.join(bindir, "ninja")) and bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")


def blocks_per_sequence(context: int, block_size: int) -> int:
    return (context + block_size - 1) // block_size


def main(argv=None) -> int:
    args = parse_args(argv)
    setup_jit_environment(args.jit_cache)

    base = {
        "benchmark": "attention",
        "peer": "flashinfer",
        "command": command_line(),
        "commit": git_commit(),
        "python": platform.python_version(),
        "options": {
            "batches": args.batches, "contexts": args.contexts,
            "heads": [f"{q}/{kv}" for q, kv in args.heads], "head_dim": args.head_dim,
            "block_size": args.block_size, "dtype": args.dtype, "layout": "hnd", "runs": args.runs,
            "warmup": args.warmup, "modes": args.modes, "filter": args.filter, "max_kv_gb": args.max_kv_gb,
            "workspace_mb": args.workspace_mb,
        },
    }

    try:
        import torch
    except Exception as e:  # noqa: BLE001
        return fail_json(args, base, f"import torch failed: {type(e).__name__}: {e}", traceback.format_exc())
    base["torch_version"] = torch.__version__
    base["torch_cuda"] = torch.version.cuda
    base["nvcc"] = nvcc_version()
    base["flashinfer_workspace_base"] = os.environ.get("FLASHINFER_WORKSPACE_BASE", "")
    has_cuda = torch.cuda.is_available()
    if has_cuda:
        props = torch.cuda.get_device_properties(0)
        device_name = torch.cuda.get_device_name(0)
        base["device"] = device_name
        base["compute_capability"] = f"{props.major}.{props.minor}"
        base["sm_count"] = props.multi_processor_count
        base["memory_bytes"] = props.total_memory
        base["l2_bytes"] = int(getattr(props, "L2_cache_size", 0) or 0)
        if not args.out:
            args.out = f"bench/results/{device_slug(device_name)}/flashinfer_attention.json"

    try:
        import flashinfer
        from flashinfer import BatchDecodeWithPagedKVCacheWrapper
    except Exception as e:  # noqa: BLE001
        return fail_json(args, base, f"import flashinfer failed: {type(e).__name__}: {e}", traceback.format_exc())
    base["flashinfer_version"] = getattr(flashinfer, "__version__", "unknown")
    if not has_cuda:
        return fail_json(args, base, "torch.cuda.is_available() is False: no CUDA device")
    print(f"flashinfer bench: flashinfer {base['flashinfer_version']}, torch {torch.__version__} "
          f"(CUDA {torch.version.cuda}), nvcc {base['nvcc'] or '?'}, {base['device']} "
          f"(sm_{props.major}{props.minor}, {props.multi_processor_count} SMs, L2 {base['l2_bytes'] / 1e6:.1f} MB)",
          file=sys.stderr)

    return Bench(args, base, torch, BatchDecodeWithPagedKVCacheWrapper).run()


def nvcc_version() -> str:
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or ""
    candidates = [os.path.join(cuda_home, "bin", "nvcc")] if cuda_home else []
    candidates += ["nvcc", "/usr/local/cuda/bin/nvcc"]
    for nvcc in candidates:
        try:
            out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout
        except Exception:
            continue
        m = re.search(r"release ([\d.]+), V([\d.]+)", out)
        if m:
            return m.group(2)
    return ""


class Bench:
    def __init__(self, args, base, torch, wrapper_cls):
        self.args, self.base, self.torch, self.wrapper_cls = args, base, torch, wrapper_cls
        self.dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
        self.elem = 2
        self.dev = torch.device("cuda:0")
        self.mode_error: dict[str, str] = {}  # mode -> why it cannot run (e.g. its JIT build failed)
        self.mode_ok: set[str] = set()  # modes that planned at least once
        self.first_plan_s: dict[str, float] = {}  # mode -> seconds of its first plan() (JIT build)
        self.wrappers: dict[str, object] = {}

    # ---- helpers -------------------------------------------------------------------------------

    def wrapper(self, mode: str):
        if mode not in self.wrappers:
            self.wrappers[mode] = self.wrapper_cls(self.workspace, "HND", use_tensor_cores=MODES[mode])
        return self.wrappers[mode]

    def plan(self, mode, indptr, indices, last_page_len, q_heads, kv_heads):
        w = self.wrapper(mode)
        if mode not in self.mode_ok:
            print(f"flashinfer bench: first plan() of {mode}: JIT-builds its kernels unless cached (minutes)...",
                  file=sys.stderr, flush=True)
            t0 = time.time()
        w.plan(indptr, indices, last_page_len, q_heads, kv_heads, self.args.head_dim, self.args.block_size,
               pos_encoding_mode="NONE", q_data_type=self.dtype, kv_data_type=self.dtype)
        if mode not in self.mode_ok:
            self.first_plan_s[mode] = time.time() - t0
            print(f"flashinfer bench: {mode} ready after {self.first_plan_s[mode]:.0f} s", file=sys.stderr, flush=True)
            self.mode_ok.add(mode)
        return w

    def page_table(self, lengths: list[int], num_blocks: int, seed: int):
        """indptr / indices / last_page_len for sequences of `lengths` tokens whose pages are a
        random permutation of range(num_blocks)."""
        torch, bs = self.torch, self.args.block_size
        per = [blocks_per_sequence(n, bs) for n in lengths]
        assert sum(per) <= num_blocks
        g = torch.Generator().manual_seed(seed)
        ids = torch.randperm(num_blocks, generator=g, dtype=torch.int64)[: sum(per)].to(torch.int32)
        indptr = torch.zeros(len(lengths) + 1, dtype=torch.int32)
        indptr[1:] = torch.cumsum(torch.tensor(per, dtype=torch.int64), 0).to(torch.int32)
        last = torch.tensor([n - (p - 1) * bs for n, p in zip(lengths, per)], dtype=torch.int32)
        return indptr.to(self.dev), ids.to(self.dev), last.to(self.dev), ids

    def record_mode_failure(self, mode: str, e: BaseException) -> str:
        """A mode that fails before it ever planned (its JIT build, most likely) is given up for the
        rest of the sweep; a later failure counts against that config only."""
        msg = f"{type(e).__name__}: {e}"[-6000:]
        print(f"flashinfer bench: mode {mode} failed:\n{traceback.format_exc()}", file=sys.stderr)
        if mode not in self.mode_ok and mode not in self.mode_error:
            self.mode_error[mode] = msg
        return msg

    # ---- correctness ---------------------------------------------------------------------------

    def check(self, q_heads: int, kv_heads: int) -> dict:
        """Uneven lengths (one token, a partial page, a full page, several pages), random pages,
        both modes against a float32 torch reference."""
        torch, a = self.torch, self.args
        D, P = a.head_dim, a.block_size
        lengths = [1, P - 3 if P > 3 else 1, P, 5 * P + 7, 300]
        num_blocks = sum(blocks_per_sequence(n, P) for n in lengths) + 11  # a few pages nobody uses
        g = torch.Generator(device=self.dev).manual_seed(SEED + q_heads * 1000 + kv_heads)
        k = torch.empty(num_blocks, kv_heads, P, D, dtype=self.dtype, device=self.dev).uniform_(-1, 1, generator=g)
        v = torch.empty_like(k).uniform_(-1, 1, generator=g)
        q = torch.empty(len(lengths), q_heads, D, dtype=self.dtype, device=self.dev).uniform_(-1, 1, generator=g)
        indptr, indices, last, ids_host = self.page_table(lengths, num_blocks, SEED + 7)

        # Reference: gather each sequence's pages, [kv_heads, n, D], GQA by repeat_interleave.
        group = q_heads // kv_heads
        ref = torch.empty(len(lengths), q_heads, D, dtype=torch.float32, device=self.dev)
        ip = indptr.cpu().tolist()
        for s, n in enumerate(lengths):
            pages = ids_host[ip[s]:ip[s + 1]].to(self.dev).long()
            ks = k[pages].permute(1, 0, 2, 3).reshape(kv_heads, -1, D)[:, :n].float()
            vs = v[pages].permute(1, 0, 2, 3).reshape(kv_heads, -1, D)[:, :n].float()
            ks = ks.repeat_interleave(group, 0)
            vs = vs.repeat_interleave(group, 0)
            scores = torch.einsum("hd,hnd->hn", q[s].float(), ks) / math.sqrt(D)
            ref[s] = torch.einsum("hn,hnd->hd", torch.softmax(scores, -1), vs)

        result = {"lengths": lengths}
        for mode in a.modes:
            if mode in self.mode_error:
                result[mode] = {"error": self.mode_error[mode]}
                continue
            try:
                w = self.plan(mode, indptr, indices, last, q_heads, kv_heads)
                o = w.run(q, (k, v))
                torch.cuda.synchronize()
                err = (o.float() - ref).abs().max().item()
                ok = bool(err <= a.check_tolerance and math.isfinite(err))
                result[mode] = {"max_abs_err": err, "ok": ok}
                status = "ok" if ok else "MISMATCH"
                print(f"check h{q_heads}/{kv_heads} {mode}: max abs err {err:.2e} vs float32 torch: {status}",
                      file=sys.stderr)
            except Exception as e:  # noqa: BLE001
                result[mode] = {"error": self.record_mode_failure(mode, e)}
        del k, v, q
        return result

    # ---- timing --------------------------------------------------------------------------------

    def calibrate_sleep(self) -> float:
        """GPU cycles per microsecond of torch.cuda._sleep, to keep the GPU busy while the host
        queues a timed run (wrapper.run costs tens of µs of Python)."""
        torch = self.torch
        if not hasattr(torch.cuda, "_sleep"):
            return 0.0
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(100_000)
        s.record()
        torch.cuda._sleep(2_000_000)
        e.record()
        torch.cuda.synchronize()
        us = s.elapsed_time(e) * 1e3
        return 2_000_000 / us if us > 0 else 0.0

    def time_mode(self, w, q, kv, out) -> dict:
        torch, a = self.torch, self.args
        for _ in range(a.warmup):
            w.run(q, kv, out=out)
        torch.cuda.synchronize()
        # Host cost of one run() call (no GPU wait), to size the GPU-side sleep below.
        host = []
        for _ in range(3):
            t0 = time.perf_counter()
            w.run(q, kv, out=out)
            host.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
        host_us = median(host)
        sleep_cycles = int(self.cycles_per_us * max(300.0, 4 * host_us)) if self.cycles_per_us else 0
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(a.runs)]
        stops = [torch.cuda.Event(enable_timing=True) for _ in range(a.runs)]
        for i in range(a.runs):
            # Sleep, then flush: while the GPU does both, the host has queued the start event and
            # the kernel(s), so the events time the GPU work and not Python's launch cost.
            if sleep_cycles:
                torch.cuda._sleep(sleep_cycles)
            torch.sum(self.flush, dim=0, out=self.flush_sum)  # a read: leaves L2 clean (see pagoda's L2Flusher)
            starts[i].record()
            w.run(q, kv, out=out)
            stops[i].record()
        torch.cuda.synchronize()
        us = [s.elapsed_time(e) * 1e3 for s, e in zip(starts, stops)]
        return {"median_us": median(us), "min_us": min(us), "max_us": max(us), "host_us": host_us}

    # ---- the sweep -----------------------------------------------------------------------------

    def run(self) -> int:
        torch, a, base = self.torch, self.args, self.base
        D, P, E = a.head_dim, a.block_size, self.elem
        l2 = base["l2_bytes"] or 64 * 1024 * 1024
        self.flush = torch.ones(2 * l2 // 4, dtype=torch.float32, device=self.dev)
        self.flush_sum = torch.zeros((), dtype=torch.float32, device=self.dev)
        self.workspace = torch.zeros(a.workspace_mb * 1024 * 1024, dtype=torch.uint8, device=self.dev)
        self.cycles_per_us = self.calibrate_sleep()
        base["timing"] = (f"CUDA events around wrapper.run(q, (k, v), out=o) only (plan() once per config, outside), "
                          f"{a.warmup} warm-up runs, median of {a.runs} runs, L2 flushed ({2 * l2 // 1000000} MB "
                          f"read) before each run, a GPU sleep before the flush so host launch cost is hidden")

        if a.compile_only:
            t0 = time.time()
            for mode in a.modes:
                try:
                    print(f"flashinfer bench: building {mode} ...", file=sys.stderr)
                    indptr, indices, last, _ = self.page_table([P], 1, SEED)
                    self.plan(mode, indptr, indices, last, a.heads[0][0], a.heads[0][1])
                except Exception as e:  # noqa: BLE001
                    self.record_mode_failure(mode, e)
            base["compile_s"] = time.time() - t0
            base["mode_errors"] = self.mode_error
            base["first_plan_s"] = self.first_plan_s
            print(f"flashinfer bench: compile-only done in {base['compile_s']:.0f} s; errors: {self.mode_error or 'none'}",
                  file=sys.stderr)
            base["configs"] = []
            write_json(a.out, base)
            return 0

        free, _ = torch.cuda.mem_get_info()
        cap = a.max_kv_gb * 1e9 if a.max_kv_gb > 0 else 0.7 * free
        base["options"]["max_kv_gb"] = cap / 1e9
        base["options"]["max_kv_gb_from"] = "flag" if a.max_kv_gb > 0 else "70% of free device memory"

        configs = []
        for q_heads, kv_heads in a.heads:
            for batch in a.batches:
                for context in a.contexts:
                    name = f"b{batch}-c{context}-h{q_heads}/{kv_heads}"
                    if a.filter and a.filter not in name:
                        continue
                    num_blocks = batch * blocks_per_sequence(context, P)
                    c = {
                        "name": name, "batch": batch, "context": context, "q_heads": q_heads,
                        "kv_heads": kv_heads, "head_dim": D, "block_size": P, "dtype": a.dtype, "layout": "hnd",
                        "kv_bytes": batch * context * kv_heads * D * E * 2,
                        "bytes": batch * context * kv_heads * D * E * 2 + 2 * batch * q_heads * D * E,
                        "pool_bytes": num_blocks * P * kv_heads * D * E * 2,
                    }
                    if num_blocks > 2**31 - 1:
                        c["skipped"] = "more KV pages than an int32 page id holds"
                    elif c["pool_bytes"] > cap:
                        c["skipped"] = f"KV pool of {c['pool_bytes'] / 1e9:.1f} GB exceeds the {cap / 1e9:.1f} GB cap"
                    configs.append(c)
        if not configs:
            return fail_json(a, base, f"--filter '{a.filter}' matches no config")

        checks = {}
        if not a.no_check:
            for q_heads, kv_heads in a.heads:
                if any(c["q_heads"] == q_heads and c["kv_heads"] == kv_heads for c in configs):
                    checks[f"{q_heads}/{kv_heads}"] = self.check(q_heads, kv_heads)
        base["checks"] = checks

        pool_elems = max([c["pool_bytes"] // E for c in configs if "skipped" not in c], default=0)
        pool = None
        if pool_elems:
            print(f"flashinfer bench: filling a {pool_elems * E / 1e9:.1f} GB KV pool ...", file=sys.stderr)
            pool = torch.empty(pool_elems, dtype=self.dtype, device=self.dev)
            gen = torch.Generator(device=self.dev).manual_seed(SEED)
            chunk = 1 << 28
            for i in range(0, pool_elems, chunk):
                pool[i:i + chunk].uniform_(-1, 1, generator=gen)
            torch.cuda.synchronize()

        def write(incomplete: str = ""):
            obj = dict(base)
            obj["configs"] = [c for c in configs if "skipped" in c or "variants" in c]
            obj["mode_errors"] = self.mode_error
            obj["first_plan_s"] = self.first_plan_s
            if incomplete:
                obj["incomplete"] = incomplete
            write_json(a.out, obj)

        try:
            for k, c in enumerate(configs):
                head = f"[{k + 1}/{len(configs)}] {c['name']}"
                if "skipped" in c:
                    print(f"{head}: skipped ({c['skipped']})", file=sys.stderr)
                    continue
                batch, context, q_heads, kv_heads = c["batch"], c["context"], c["q_heads"], c["kv_heads"]
                num_blocks = c["pool_bytes"] // (2 * P * kv_heads * D * E)
                half = num_blocks * kv_heads * P * D
                kc = pool[:half].view(num_blocks, kv_heads, P, D)
                vc = pool[half:2 * half].view(num_blocks, kv_heads, P, D)
                indptr, indices, last, _ = self.page_table([context] * batch, num_blocks, SEED + k)
                g = torch.Generator(device=self.dev).manual_seed(SEED ^ (k + 1))
                q = torch.empty(batch, q_heads, D, dtype=self.dtype, device=self.dev).uniform_(-1, 1, generator=g)
                out = torch.empty_like(q)
                line = f"{head}: KV {c['kv_bytes'] / 1e6:.1f} MB"
                c["variants"] = {}
                for mode in a.modes:
                    if mode in self.mode_error:
                        c["variants"][mode] = {"skipped": f"mode failed earlier: {self.mode_error[mode]}"}
                        continue
                    try:
                        w = self.plan(mode, indptr, indices, last, q_heads, kv_heads)
                        t = self.time_mode(w, q, (kc, vc), out)
                    except torch.cuda.OutOfMemoryError as e:
                        torch.cuda.synchronize()
                        c["variants"][mode] = {"skipped": f"out of memory: {e}"[:500]}
                        line += f", {mode} OOM"
                        continue
                    except Exception as e:  # noqa: BLE001
                        c["variants"][mode] = {"error": self.record_mode_failure(mode, e)}
                        line += f", {mode} FAILED"
                        continue
                    t["gbps"] = c["bytes"] / (t["median_us"] * 1e3)
                    t["kv_gbps"] = c["kv_bytes"] / (t["median_us"] * 1e3)
                    # use_tensor_cores=False runs FlashInfer's batch decode kernel (CUDA cores); True runs
                    # its batch prefill kernel of the resolved backend (fa2 for fp16/bf16).
                    t["kernel"] = (f"batch_prefill {getattr(w, '_backend', '?')} (tensor cores)" if MODES[mode]
                                   else "batch_decode (CUDA cores)")
                    c["variants"][mode] = t
                    line += f", {mode} {t['median_us']:.1f} us ({t['kv_gbps']:.0f} GB/s)"
                print(line, file=sys.stderr, flush=True)
                del q, out, kc, vc
        except BaseException as e:  # keep what was measured
            print("flashinfer bench: stopped by an error; writing the configs done so far", file=sys.stderr)
            write(f"{type(e).__name__}: {e}")
            raise

        print_table(base, configs, a.modes)
        write()
        return 0


def print_table(base: dict, configs: list[dict], modes: list[str]) -> None:
    print(f"flashinfer {base.get('flashinfer_version')} decode on {base.get('device')}: "
          f"{configs[0]['dtype']} HND, head_dim {configs[0]['head_dim']}, page {configs[0]['block_size']}")
    cols = "".join(f" {m + ' us':>17} {'GB/s':>7}" for m in modes)
    print(f"{'batch':>6} {'context':>8} {'heads':>6} {'KV MB':>10}{cols}")
    for c in configs:
        heads = f"{c['q_heads']}/{c['kv_heads']}"
        row = f"{c['batch']:>6} {c['context']:>8} {heads:>6} {c['kv_bytes'] / 1e6:>10.1f}"
        if "skipped" in c:
            print(f"{row}  skipped: {c['skipped']}")
            continue
        for m in modes:
            t = c.get("variants", {}).get(m, {})
            if "median_us" in t:
                row += f" {t['median_us']:>17.1f} {t['kv_gbps']:>7.0f}"
            else:
                row += f" {'-':>17} {'-':>7}"
        print(row)
    print("GB/s: unique K+V bytes (batch x context x kv_heads x head_dim x 2 bytes x 2) / median time")


if __name__ == "__main__":
    sys.exit(main())
