#!/usr/bin/env python3
"""The engine's decode attention modes side by side: `pagoda bench throughput` runs of one workload
under --attention paged, prefix and auto (and --enforce-eager), as a markdown table.

Each row is one run: its workload (offline: requests x prompt tokens, of which the first N are the
same in every prompt; a replay: the trace, its scaling and the prefix cache's hit rate), its
attention and whether decode steps were replayed as CUDA graphs, the mean and median TPOT, for an
offline run the decode-only steps' median time against their bound (weights plus unique KV bytes
over the streaming-read bandwidth measured in the run) and the fraction of it reached (a replay has
no roofline: "-"), how many steps attended prefix-aware and how many were replayed as CUDA graphs
(and captured), and the host time spent making each step ready. The last column is the run's mean
TPOT over that of the paged run of the same workload with CUDA graphs.

Usage:
  python3 bench/compare_attention_modes.py shared_paged.json shared_prefix.json ... --md attention_modes.md
"""
from __future__ import annotations

import argparse
import json
import sys


def workload(run: dict) -> str:
    c = run["config"]
    if c.get("mode") == "replay":
        s = c["scaling"]
        return (f"{c['trace'].rsplit('/', 1)[-1]}: {s['requests_replayed']} of {s['requests_in_trace']} requests, "
                f"lengths x {s['length_scale']:g}, outputs x {s.get('output_scale', s['length_scale']):g} "
                f"({100 * run['figures']['prefix_hit_rate']:.0f}% prefix hits)")
    return f"{c['batch']} x {c['input']} (shared {c.get('shared_prefix', 0)}) -> {c['output']}"


def table(runs: list[dict]) -> str:
    paged_tpot = {workload(r): r["figures"]["tpot_ms"]["mean"] for r in runs
                  if r["config"]["attention"] == "paged" and r["config"]["cuda_graphs"]}
    lines = [
        f"pagoda bench throughput on {runs[0]['device']}: {runs[0]['model_shape']['architecture']}, "
        f"{runs[0]['model_shape']['layers']} layers, {runs[0]['model_shape']['q_heads']}/"
        f"{runs[0]['model_shape']['kv_heads']} heads, commit {runs[0]['commit']}",
        "",
        "| workload | attention | CUDA graphs | TPOT mean ms | TPOT p50 ms | decode step median ms | bound ms "
        "| of bound | prefix steps / steps | graph replays (captures) | planning us/step | TPOT / paged |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in runs:
        f, roof, w = r["figures"], r["roofline"], workload(r)
        vs_paged = f"{f['tpot_ms']['mean'] / paged_tpot[w]:.3f}" if w in paged_tpot else "-"
        steps = (f"{roof['median_step_ms']:.2f} | {roof['bound_step_ms']:.2f} | {roof['fraction_of_bound']:.3f}"
                 if roof else "- | - | -")
        lines.append(
            f"| {w} | {r['config']['attention']} | {'yes' if r['config']['cuda_graphs'] else 'no'} "
            f"| {f['tpot_ms']['mean']:.2f} | {f['tpot_ms']['p50']:.2f} | {steps} "
            f"| {f['prefix_attention_steps']} / {f['steps']} | {f['graph_replays']} ({f['graph_captures']}) "
            f"| {f['step_planning_us_mean']:.0f} | {vs_paged} |")
    lines += ["", "bound: per decode-only step of an offline run, (weights + the KV of the running sequences, a "
              "shared prefix's blocks once) / streaming-read bandwidth measured in the run; of bound = bound / "
              "measured over the decode-only steps."]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="bench throughput JSON files")
    parser.add_argument("--md", help="write the table here too")
    args = parser.parse_args(argv)
    runs = []
    for path in args.runs:
        with open(path) as f:
            runs.append(json.load(f))
    md = table(runs)
    print(md, end="")
    if args.md:
        with open(args.md, "w") as f:
            f.write(md)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
