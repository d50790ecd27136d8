#!/usr/bin/env python3
"""Joins `pagoda bench attention` results with bench/flashinfer_decode.py results.

  python3 bench/compare_attention.py PAGODA_JSON FLASHINFER_JSON [--md OUT.md] [--variant tiled,...]

Per config (joined on batch, context, q_heads, kv_heads, head_dim, block_size, dtype): pagoda's
time (the best of the chosen variants), FlashInfer's best time (the faster of its modes, named),
and ratio = FlashInfer time / pagoda time (> 1: pagoda is faster). Then the geometric mean of the
ratios (overall and per head shape) and the worst and best configs for pagoda.
"""
from __future__ import annotations

import argparse
import json
import math
import sys

# ---- JSON key names, in one place -------------------------------------------------------------
CONFIGS = "configs"          # list of per-config objects, in both files
JOIN_KEYS = ("batch", "context", "q_heads", "kv_heads", "head_dim", "block_size", "dtype")
VARIANTS = "variants"        # per config: {variant or mode name: {TIME: ..., ...} or {"skipped": ...}}
TIME = "median_us"
KV_BYTES = "kv_bytes"
SKIPPED = "skipped"
# pagoda variants whose best (lowest TIME) is taken unless --variant says otherwise: "tiled" is
# the engine's default (DecodeOptions{}).
PAGODA_VARIANTS = ("tiled",)
# FlashInfer modes (bench/flashinfer_decode.py): use_tensor_cores False / True.
FLASHINFER_MODES = ("cuda_cores", "tensor_cores")
DTYPE_ALIASES = {"f16": "fp16", "float16": "fp16", "half": "fp16", "bfloat16": "bf16"}
# -----------------------------------------------------------------------------------------------


def load(path: str, what: str) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"compare_attention: cannot read {what} JSON {path}: {e}")
    if not isinstance(data, dict):
        sys.exit(f"compare_attention: {path} is not a JSON object")
    if data.get("error"):
        sys.exit(f"compare_attention: {what} run failed ({path}): {data['error']}")
    if not isinstance(data.get(CONFIGS), list):
        sys.exit(f"compare_attention: {path} has no '{CONFIGS}' list")
    return data


def key_of(c: dict):
    try:
        k = []
        for name in JOIN_KEYS:
            v = c[name]
            if name == "dtype":
                v = DTYPE_ALIASES.get(str(v).lower(), str(v).lower())
            else:
                v = int(v)
            k.append(v)
        return tuple(k)
    except (KeyError, TypeError, ValueError):
        return None


def timing(c: dict, name: str) -> float | None:
    t = (c.get(VARIANTS) or {}).get(name)
    if isinstance(t, dict) and isinstance(t.get(TIME), (int, float)) and t[TIME] > 0:
        return float(t[TIME])
    return None


def best(c: dict, names) -> tuple[float, str] | None:
    found = [(t, n) for n in names if (t := timing(c, n)) is not None]
    return min(found) if found else None


def index(data: dict, what: str) -> dict:
    out = {}
    for c in data[CONFIGS]:
        if not isinstance(c, dict):
            continue
        k = key_of(c)
        if k is None:
            print(f"compare_attention: {what}: a config lacks one of {JOIN_KEYS}; ignored", file=sys.stderr)
            continue
        if k in out:
            print(f"compare_attention: {what}: config {k} appears twice; the last one is used", file=sys.stderr)
        out[k] = c
    return out


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def name_of(k) -> str:
    b, ctx, qh, kvh, *_ = k
    return f"b{b}-c{ctx}-h{qh}/{kvh}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pagoda_json")
    p.add_argument("flashinfer_json")
    p.add_argument("--variant", default=",".join(PAGODA_VARIANTS),
                   help=f"pagoda variant(s) to take the best of, comma-separated (default {','.join(PAGODA_VARIANTS)})")
    p.add_argument("--modes", default=",".join(FLASHINFER_MODES),
                   help=f"FlashInfer modes to take the best of (default {','.join(FLASHINFER_MODES)})")
    p.add_argument("--md", default="", help="write a markdown table here")
    a = p.parse_args(argv)
    variants = [v.strip() for v in a.variant.split(",") if v.strip()]
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    if not variants or not modes:
        p.error("--variant and --modes need at least one name")

    pg = load(a.pagoda_json, "pagoda")
    fi = load(a.flashinfer_json, "FlashInfer")
    pg_by, fi_by = index(pg, "pagoda"), index(fi, "FlashInfer")

    rows, missing = [], []  # missing: (key, why)
    # pagoda's order (its sweep: heads, then batch, then context), then what only FlashInfer has.
    for k in list(pg_by) + [k for k in fi_by if k not in pg_by]:
        pc, fc = pg_by.get(k), fi_by.get(k)
        if pc is None or fc is None:
            missing.append((k, "only in " + ("FlashInfer" if pc is None else "pagoda")))
            continue
        pb = best(pc, variants)
        fb = best(fc, modes)
        if pb is None or fb is None:
            whys = []
            if pb is None:
                whys.append("pagoda: " + str(pc.get(SKIPPED) or f"no timing for {'/'.join(variants)}"))
            if fb is None:
                whys.append("FlashInfer: " + str(fc.get(SKIPPED) or f"no timing for {'/'.join(modes)}"))
            missing.append((k, "; ".join(whys)))
            continue
        kv_bytes = pc.get(KV_BYTES) or fc.get(KV_BYTES) or 0
        mode_times = {m: timing(fc, m) for m in modes}
        rows.append({"key": k, "kv_bytes": kv_bytes, "pagoda_us": pb[0], "pagoda_variant": pb[1],
                     "fi_us": fb[0], "fi_mode": fb[1], "fi_modes": mode_times, "ratio": fb[0] / pb[0]})

    if not rows:
        print("compare_attention: no config has timings in both files", file=sys.stderr)
        for k, why in missing[:20]:
            print(f"  {name_of(k)}: {why}", file=sys.stderr)
        return 1

    ratios = [r["ratio"] for r in rows]
    gm = geomean(ratios)
    worst = min(rows, key=lambda r: r["ratio"])
    best_row = max(rows, key=lambda r: r["ratio"])
    faster = sum(1 for x in ratios if x > 1)
    by_heads: dict[tuple[int, int], list[float]] = {}
    for r in rows:
        by_heads.setdefault((r["key"][2], r["key"][3]), []).append(r["ratio"])

    fi_version = fi.get("flashinfer_version", "?")
    header = [
        f"pagoda ({pg.get('device', '?')}, commit {pg.get('commit', '?')}) vs FlashInfer {fi_version} "
        f"({fi.get('device', '?')}, torch {fi.get('torch_version', '?')})",
        f"pagoda: best of {'/'.join(variants)}; FlashInfer: best of {'/'.join(modes)} "
        f"(cuda_cores: use_tensor_cores=False, tensor_cores: use_tensor_cores=True); "
        f"ratio = FlashInfer us / pagoda us (> 1: pagoda faster)",
    ]
    if pg.get("device") and fi.get("device") and pg["device"] != fi["device"]:
        header.append(f"WARNING: different devices ({pg['device']} vs {fi['device']}): the ratios mean little")

    def fmt_modes(r):
        return " ".join(f"{m}={t:.1f}" if t is not None else f"{m}=-" for m, t in r["fi_modes"].items())

    for line in header:
        print(line)
    print(f"{'batch':>6} {'context':>8} {'heads':>6} {'KV MB':>9} {'pagoda us':>10} {'variant':>17} "
          f"{'FI best us':>10} {'FI mode':>13} {'FI/pagoda':>9}")
    for r in rows:
        b, ctx, qh, kvh, *_ = r["key"]
        print(f"{b:>6} {ctx:>8} {f'{qh}/{kvh}':>6} {r['kv_bytes'] / 1e6:>9.1f} {r['pagoda_us']:>10.1f} "
              f"{r['pagoda_variant']:>17} {r['fi_us']:>10.1f} {r['fi_mode']:>13} {r['ratio']:>8.2f}x")
    summary = [
        f"{len(rows)} configs compared; pagoda faster in {faster}, FlashInfer faster in {len(rows) - faster}",
        f"geometric mean FlashInfer/pagoda: {gm:.3f}x",
        "per heads: " + ", ".join(f"{q}/{kv} {geomean(v):.3f}x ({len(v)})" for (q, kv), v in sorted(by_heads.items())),
        f"worst for pagoda: {name_of(worst['key'])} {worst['ratio']:.3f}x "
        f"(pagoda {worst['pagoda_us']:.1f} us, FlashInfer {worst['fi_mode']} {worst['fi_us']:.1f} us)",
        f"best for pagoda: {name_of(best_row['key'])} {best_row['ratio']:.3f}x "
        f"(pagoda {best_row['pagoda_us']:.1f} us, FlashInfer {best_row['fi_mode']} {best_row['fi_us']:.1f} us)",
    ]
    if missing:
        summary.append(f"{len(missing)} configs not compared: "
                       + "; ".join(f"{name_of(k)} ({why})" for k, why in missing[:8])
                       + (" ..." if len(missing) > 8 else ""))
    for line in summary:
        print(line)

    if a.md:
        md = [f"# Decode attention: pagoda vs FlashInfer {fi_version}", ""]
        md += [f"- {line}" for line in header] + [""]
        md.append("| batch | context | heads | KV MB | pagoda µs | pagoda variant | FlashInfer µs "
                  "(per mode) | best mode | FlashInfer/pagoda |")
        md.append("|---:|---:|---:|---:|---:|---|---|---|---:|")
        for r in rows:
            b, ctx, qh, kvh, *_ = r["key"]
            md.append(f"| {b} | {ctx} | {qh}/{kvh} | {r['kv_bytes'] / 1e6:.1f} | {r['pagoda_us']:.1f} | "
                      f"{r['pagoda_variant']} | {fmt_modes(r)} | {r['fi_mode']} | {r['ratio']:.2f}x |")
        md += [""] + [f"- {line}" for line in summary]
        if missing:
            md += ["", "Not compared:", ""] + [f"- {name_of(k)}: {why}" for k, why in missing]
        with open(a.md, "w") as f:
            f.write("\n".join(md) + "\n")
        print(f"compare_attention: wrote {a.md}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
