#!/usr/bin/env python3
"""Prefix-aware decode attention against its targets: pagoda, PAT and FlashInfer on one table.

Reads `pagoda bench prefix-attention` JSON, optionally bench/flashinfer_prefix.py JSON from the same
device session, and the public PAT kernel's figures (bench/workloads/pat_reference.md), and writes
a markdown table plus a plot. Each row holds:

  * frac: unique KV bytes / median time / streaming-read bandwidth measured in pagoda's run. PAT's
    `frac` is the same measure on its own H200 run (device-normalized, so it compares across GPUs);
  * target: min(1.5 x PAT frac, 0.95) for batches with sharing (docs/experiments/prefix-attention.md);
  * of bound: max(unique bytes / bandwidth, FLOPs / mma.sync peak) / time;
  * FlashInfer's BatchDecodeWithPagedKVCacheWrapper (better of its two kernels) and
    MultiLevelCascadeAttentionWrapper, and pagoda's speed-up over the cascade;
  * the paged decode kernel (backend/cuda/decode_attention.h) on the same batch.

Below the table: the targets met (the geometric mean of the bound over the batches PAT lists,
bench/workloads' listed set, and over every batch with sharing where the run holds others, such
as the rest of the PAT artifact's trees), and (for runs that time it) the launch floor, one
sequence of one block with the same heads, next to which the small batches are measured: the
geometric mean of bound / (time - floor), and what a kernel taking exactly the bound plus the
floor would score, over every batch with sharing.

Usage:
  python3 bench/compare_prefix.py prefix_attention.json --flashinfer flashinfer_prefix.json \
      --pat bench/workloads/pat_reference.md --md prefix_attention.md --plot prefix_attention.png
"""
from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys


def load_pat(path: str) -> dict[tuple[str, str], float]:
    """(tree, 'q/kv') -> PAT frac, from the markdown table of pat_reference.md."""
    pat = {}
    with open(path) as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) == 6 and cells[0].startswith("`"):
                try:
                    pat[(cells[0].strip("`"), cells[1])] = float(cells[5])
                except ValueError:
                    pass
    return pat


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def summarize(run: dict, pat: dict[tuple[str, str], float], fi: dict) -> tuple[list[dict], dict]:
    """One row per configuration of the run, and the targets over them.

    fi: (tree, 'q/kv') -> bench/flashinfer_prefix.py configuration. The summary holds met /
    total_targets (PAT-based targets), geomean and listed (of the bound, over the batches with
    sharing that PAT lists: the target's measure, and how many), geomean_all and shared (the same
    over all the run's batches with sharing), beat_cascade / cascade_rows, floors
    ('q/kv' -> (pagoda, paged decode kernel) µs) and, where the run timed floors,
    above_floor (geomean of bound / (time - floor)), at_floor (batches timed at or under it),
    bound_plus_floor and bound_plus_floor_listed (what a kernel taking the bound plus the floor
    would score over all the batches with sharing, and over the listed ones: the ceiling the
    target of 0.6 is a share of) and past_floor
    (the PAT targets whose time, unique bytes / (target x streaming read), is under the bound
    plus the floor: only a launch whose fixed costs are under the floor's can meet them), and host_us
    ((pagoda, paged decode kernel) median host µs to enqueue one call, or None for runs without it).
    """
    rows, listed_bound, shared_bound, met, total_targets, beat_cascade, cascade_rows = [], [], [], 0, 0, 0, 0
    above_floor, at_bound_plus_floor, listed_bound_plus_floor, floors, at_floor, past_floor = [], [], [], {}, 0, []
    for c in run["configs"]:
        key = (c["tree"], f"{c['q_heads']}/{c['kv_heads']}")
        sharing = "_" in c["tree"] and "," in c["tree"].split("_")[0]
        frac = c["prefix"]["frac"]
        of_bound = c["prefix"]["of_bound"]
        pat_frac = pat.get(key)
        target = min(1.5 * pat_frac, 0.95) if (pat_frac is not None and sharing) else None
        if target is not None:
            total_targets += 1
            met += frac >= target
        if sharing:
            shared_bound.append(of_bound)
            if pat_frac is not None:
                listed_bound.append(of_bound)
        if "floor" in c:  # runs since the fourteenth session time a launch floor per head shape
            floor = c["floor"]["prefix_us"]
            floors[key[1]] = (floor, c["floor"]["decode_us"])
            if sharing:
                bound = c["bound"]["bound_us"]
                ceiling = bound / (bound + floor)
                at_bound_plus_floor.append(ceiling)
                if pat_frac is not None:
                    listed_bound_plus_floor.append(ceiling)
                if c["prefix"]["median_us"] > floor:
                    above_floor.append(bound / (c["prefix"]["median_us"] - floor))
                else:  # a batch timed at or under the floor has no time above it to compare
                    at_floor += 1
                # frac x time is unique bytes / streaming read, whatever the time was
                if target is not None and frac * c["prefix"]["median_us"] / target < bound + floor:
                    past_floor.append(f"`{key[0]}` {key[1]}")
        f = fi.get(key, {})
        cascade = f.get("cascade_us")
        speedup = cascade / c["prefix"]["median_us"] if cascade else None
        if speedup is not None:
            cascade_rows += 1
            beat_cascade += speedup >= 1.0
        rows.append({
            "tree": c["tree"], "heads": key[1], "unique_mb": c["unique_kv_bytes"] / 1e6,
            "bound_us": c["bound"]["bound_us"], "which": c["bound"]["which"][0],
            "us": c["prefix"]["median_us"], "frac": frac, "of_bound": of_bound,
            "pat": pat_frac, "target": target, "decode_us": c["decode"]["median_us"],
            "fi_decode_us": f.get("decode_us"), "fi_cascade_us": cascade, "vs_cascade": speedup,
        })
    timed_host = [c for c in run["configs"] if "host_us" in c["prefix"]]  # runs since the twenty-eighth session
    host_us = (statistics.median(c["prefix"]["host_us"] for c in timed_host),
               statistics.median(c["decode"]["host_us"] for c in timed_host)) if timed_host else None
    summary = {
        "met": met, "total_targets": total_targets, "geomean": geomean(listed_bound),
        "geomean_all": geomean(shared_bound), "shared": len(shared_bound), "listed": len(listed_bound),
        "beat_cascade": beat_cascade, "cascade_rows": cascade_rows, "floors": floors,
        "above_floor": geomean(above_floor), "at_floor": at_floor,
        "bound_plus_floor": geomean(at_bound_plus_floor), "bound_plus_floor_listed": geomean(listed_bound_plus_floor),
        "past_floor": past_floor, "host_us": host_us,
    }
    return rows, summary


def render(run: dict, rows: list[dict], summary: dict) -> str:
    """The markdown table and the targets below it."""
    def fmt(v, spec):
        return "-" if v is None else format(v, spec)

    lines = [
        f"pagoda prefix attention on {run['device']} ({run['sm_count']} SMs), {run['dtype']}, head_dim "
        f"{run['head_dim']}, block {run['block_size']}; streaming read {run['stream_read_gbps']:.0f} GB/s, "
        f"mma.sync {run['mma_peak_tflops']:.0f} TFLOP/s (both measured in the run), commit {run['commit']}",
        "",
        "| batch | heads | unique MB | bound µs | pagoda µs | frac | of bound | PAT frac | target | met "
        "| paged decode kernel µs | FI decode µs | FI cascade µs | vs cascade |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        ok = "-" if r["target"] is None else ("yes" if r["frac"] >= r["target"] else "**no**")
        lines.append(
            f"| `{r['tree']}` | {r['heads']} | {r['unique_mb']:.1f} | {r['bound_us']:.1f} {r['which']} "
            f"| {r['us']:.1f} | {r['frac']:.2f} | {r['of_bound']:.2f} | {fmt(r['pat'], '.2f')} "
            f"| {fmt(r['target'], '.2f')} | {ok} | {r['decode_us']:.1f} | {fmt(r['fi_decode_us'], '.1f')} "
            f"| {fmt(r['fi_cascade_us'], '.1f')} | {fmt(r['vs_cascade'], '.2f')}x |")
    nosharing = [r for r in rows if r["tree"] == "256_4096"]
    lines += [
        "",
        "bound: m = memory (unique KV bytes / streaming read), c = compute (FLOPs / mma.sync peak). frac: "
        "unique KV bytes / time / streaming read. target: min(1.5 x PAT frac, 0.95).",
        "",
        f"- PAT targets met: {summary['met']} of {summary['total_targets']}",
        f"- geometric mean of the bound reached over the listed batches with sharing (those PAT lists): "
        f"{summary['geomean']:.3f} (target 0.6)",
    ]
    if summary["shared"] > summary["listed"]:
        lines.append(f"- the same over all {summary['shared']} configurations with sharing in this run, "
                     f"{summary['shared'] - summary['listed']} of them without PAT figures: "
                     f"{summary['geomean_all']:.3f}")
    if summary["cascade_rows"]:
        lines.append(f"- at least FlashInfer's cascade speed: {summary['beat_cascade']} of {summary['cascade_rows']}")
    if summary["floors"]:
        at_floor = summary["at_floor"]
        lines += [
            "- launch floor (one sequence of one block, same heads, same run; pagoda / paged decode kernel µs): "
            + ", ".join(f"{h} {p:.1f} / {d:.1f}" for h, (p, d) in summary["floors"].items()),
            f"- over the batches with sharing, geometric mean of bound / (time - floor): {summary['above_floor']:.3f}"
            + (f" ({at_floor} timed at or under the floor left out)" if at_floor else "")
            + f"; a kernel taking the bound plus the floor would reach {summary['bound_plus_floor']:.3f} of the bound"
            + (f" ({summary['bound_plus_floor_listed']:.3f} over the listed ones)"
               if summary["shared"] > summary["listed"] and summary["listed"] else ""),
        ]
    if summary["past_floor"]:
        lines.append(f"- PAT targets whose time is under the bound plus the launch floor (only a launch whose fixed "
                     f"costs are under the floor's meets them): {len(summary['past_floor'])} "
                     f"({', '.join(summary['past_floor'])})")
    if summary["host_us"]:
        lines.append("- host time to enqueue one call (median over the configurations; a decode step pays it per "
                     "layer): pagoda {:.1f} µs, paged decode kernel {:.1f} µs".format(*summary["host_us"]))
    for r in nosharing:
        lines.append(f"- `256_4096` {r['heads']}: {r['of_bound']:.3f} of the bound (target 0.95), "
                     f"{r['decode_us'] / r['us']:.3f}x the paged decode kernel (target 0.98)")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pagoda", help="pagoda bench prefix-attention JSON")
    ap.add_argument("--flashinfer", help="bench/flashinfer_prefix.py JSON from the same session")
    ap.add_argument("--pat", required=True, help="bench/workloads/pat_reference.md")
    ap.add_argument("--md", help="write the markdown table here")
    ap.add_argument("--plot", help="write a PNG plot here (needs matplotlib)")
    args = ap.parse_args()

    with open(args.pagoda) as f:
        run = json.load(f)
    pat = load_pat(args.pat)
    fi = {}
    if args.flashinfer:
        with open(args.flashinfer) as f:
            for c in json.load(f)["configs"]:
                fi[(c["tree"], f"{c['q_heads']}/{c['kv_heads']}")] = c

    rows, summary = summarize(run, pat, fi)
    text = render(run, rows, summary)
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)

    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        labels = [f"{r['tree']}\n{r['heads']}" for r in rows]
        x = range(len(rows))
        fig, ax = plt.subplots(figsize=(max(12, len(rows) * 0.55), 5.5))
        width = 0.28
        ax.bar([i - width for i in x], [r["frac"] for r in rows], width, label="pagoda frac")
        ax.bar(list(x), [r["pat"] or 0 for r in rows], width, label="PAT frac (H200, published)")
        fi_frac = [r["unique_mb"] * 1e6 / (r["fi_cascade_us"] * 1e-6) / (run["stream_read_gbps"] * 1e9)
                   if r["fi_cascade_us"] else 0 for r in rows]
        ax.bar([i + width for i in x], fi_frac, width, label="FlashInfer cascade frac")
        ax.scatter(list(x), [r["target"] if r["target"] is not None else float("nan") for r in rows],
                   marker="_", s=300, color="black", label="target", zorder=3)
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, rotation=90, fontsize=7)
        ax.set_ylabel("unique KV bytes / time / streaming-read bandwidth")
        ax.set_title(f"Prefix-aware decode attention, {run['device']}")
        ax.set_ylim(0, 1.1)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
