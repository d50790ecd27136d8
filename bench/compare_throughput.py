#!/usr/bin/env python3
"""Joins `pagoda bench throughput --json` (offline runs) with bench/hf_generate.py results into a
markdown table of output tokens/s and pagoda's speedup over each Hugging Face run.

  python3 bench/compare_throughput.py --pagoda P.json [P2.json ...] --hf H.json [H2.json ...] [--md OUT.md]

Runs are joined on the workload (batch, input, output, seed) and the checkpoint folder's name;
a pagoda run without a matching HF run (or the reverse) is listed with the speedup left empty.
Both tools count output tokens / wall time of the whole run, prefill included. pagoda's roofline
column is its decode-only steps' bound time / measured time (`roofline.fraction_of_bound`).
"""
from __future__ import annotations

import argparse
import json
import os
import sys


def load(path: str, benchmark: str) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"compare_throughput: cannot read {path}: {e}")
    if not isinstance(data, dict) or data.get("benchmark") != benchmark:
        sys.exit(f"compare_throughput: {path} is not a '{benchmark}' result")
    return data


def model_name(path: str) -> str:
    return os.path.basename(os.path.normpath(path))


def workload_key(model: str, config: dict) -> tuple:
    return (model_name(model), config.get("batch"), config.get("input"), config.get("output"), config.get("seed", 0))


def fmt_rate(value: float | None) -> str:
    return "" if value is None else f"{value:,.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pagoda", nargs="+", required=True, help="pagoda bench throughput JSON files (offline)")
    parser.add_argument("--hf", nargs="+", required=True, help="bench/hf_generate.py JSON files")
    parser.add_argument("--md", help="also write the table to this file")
    args = parser.parse_args()

    pagoda_runs = [load(p, "throughput") for p in args.pagoda]
    hf_runs = {}
    for path in args.hf:
        h = load(path, "hf_generate")
        hf_runs[workload_key(h["model"], h["config"])] = h
    for p in pagoda_runs:
        if p["config"].get("mode") != "offline":
            sys.exit(f"compare_throughput: {p['command']}: only offline runs have an HF peer")

    lines = [
        "| model | batch | in | out | pagoda tok/s | roofline | HF eager tok/s | speedup | "
        "HF static+compile tok/s | speedup |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    notes = []
    devices = set()
    for p in pagoda_runs:
        c = p["config"]
        key = workload_key(p["model"], c)
        devices.add(p["device"])
        ours = p["figures"]["output_tok_s"]
        roof = p.get("roofline") or {}
        roofline = f"{100 * roof['fraction_of_bound']:.1f}%" if roof.get("decode_steps") else ""
        h = hf_runs.pop(key, None)
        cells = []
        for run in ("eager", "static_compile"):
            r = (h or {}).get("runs", {}).get(run)
            if r and "output_tok_s" in r:
                cells += [fmt_rate(r["output_tok_s"]), f"{ours / r['output_tok_s']:.2f}x"]
            elif r and "error" in r:
                cells += ["failed", ""]
                notes.append(f"- {key[0]} batch {c['batch']}: HF {run} failed: {r['error'].splitlines()[0][:200]}")
            else:
                cells += ["", ""]
        if h and h["device"] != p["device"]:
            notes.append(f"- {key[0]} batch {c['batch']}: pagoda ran on {p['device']}, HF on {h['device']}")
        lines.append(f"| {key[0]} ({p['weight_dtype']}) | {c['batch']} | {c['input']} | {c['output']} | "
                     f"{fmt_rate(ours)} | {roofline} | " + " | ".join(cells) + " |")
    for key, h in hf_runs.items():
        notes.append(f"- HF run without a pagoda run: {key[0]} batch {key[1]}, {key[2]} in, {key[3]} out")
    text = "\n".join(lines) + "\n"
    text += f"\nDevice: {', '.join(sorted(devices))}. Output tokens/s over the whole run, prefill included; " \
            "speedup = pagoda / HF.\n"
    if notes:
        text += "\n" + "\n".join(notes) + "\n"
    print(text, end="")
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
