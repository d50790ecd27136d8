#!/usr/bin/env python3
"""Plot `pagoda bench attention` results against their bound.

Reads the JSON that `pagoda bench attention` writes (bench/results/<device>/attention.json) and
writes next to it:
  attention.png  fraction of the streaming-read bound vs KV tokens per step (batch x context),
                 one panel per head shape, one marker per kernel variant; below, the L2 prefetch
                 speedup (median without prefetch / with it) of both kernels
  attention.md   the same figures as a table

Usage: python3 bench/plot_attention.py [bench/results/nvidia-h200/attention.json]
The markdown needs only the standard library; the PNG needs matplotlib (pip install matplotlib).
"""

import argparse
import json
import sys
from pathlib import Path

VARIANT_STYLE = {  # marker, colour
    "tiled": ("o", "tab:blue"),
    "tiled_prefetch": ("o", "lightsteelblue"),
    "baseline": ("s", "tab:red"),
    "baseline_prefetch": ("s", "lightsalmon"),
}


def heads_of(config):
    return f"{config['q_heads']}/{config['kv_heads']}"


def timing(config, variant):
    v = config.get("variants", {}).get(variant)
    return v if v and "median_us" in v else None


def fmt(value, spec):
    return "-" if value is None else format(value, spec)


def write_markdown(results, path):
    configs = results.get("configs", [])
    lines = [
        f"# Decode attention on {results.get('device', '?')}",
        "",
        f"Bound: streaming read {results.get('stream_read_gbps', float('nan')):.1f} GB/s measured in the same run "
        f"({results.get('sm_count', '?')} SMs, L2 {results.get('l2_bytes', 0) / 1e6:.0f} MB). "
        "frac = (unique K/V + q + out bytes / median time) / that bandwidth; "
        "pf = median without L2 prefetch / with it (> 1: prefetch helps).",
        "",
        f"Commit `{results.get('commit', '?')}`; {results.get('timing', '')}.",
        "",
        f"`{results.get('command', '')}`",
        "",
    ]
    if results.get("incomplete"):
        lines += [f"**Incomplete run**: {results['incomplete']}", ""]
    lines += [
        "| batch | context | heads | KV MB | items | split (tokens/item) "
        "| tiled µs | tiled GB/s | tiled frac | tiled pf | baseline µs | baseline frac | baseline pf |",
        "|---:|---:|:--:|---:|---:|:--:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in configs:
        head = f"| {c['batch']} | {c['context']} | {heads_of(c)} | {c['kv_bytes'] / 1e6:.1f} "
        if "skipped" in c:
            lines.append(head + f"| skipped: {c['skipped']} " + "| " * 8 + "|")
            continue
        tiled, base = timing(c, "tiled"), timing(c, "baseline")
        speedup = c.get("prefetch_speedup", {})
        split = f"{c['kv_tokens_per_item']}" if c.get("split") else "no"
        lines.append(
            head
            + f"| {c.get('num_items', '-')} | {split} "
            + f"| {fmt(tiled and tiled['median_us'], '.1f')} | {fmt(tiled and tiled['gbps'], '.0f')} "
            + f"| {fmt(tiled and tiled['frac'], '.2f')} | {fmt(speedup.get('tiled'), '.2f')} "
            + f"| {fmt(base and base['median_us'], '.1f')} | {fmt(base and base['frac'], '.2f')} "
            + f"| {fmt(speedup.get('baseline'), '.2f')} |"
        )
    lines.append("")
    path.write_text("\n".join(lines))


def write_plot(results, path, plt):
    configs = [c for c in results.get("configs", []) if "skipped" not in c]
    heads = []
    for c in configs:
        if heads_of(c) not in heads:
            heads.append(heads_of(c))
    if not heads:
        print("plot_attention: no config ran; no plot", file=sys.stderr)
        return False
    variants = [v for v in VARIANT_STYLE if any(timing(c, v) for c in configs)]
    variants += sorted({v for c in configs for v in c.get("variants", {}) if v not in VARIANT_STYLE and timing(c, v)})

    fig, axes = plt.subplots(2, len(heads), figsize=(4.2 * len(heads), 7.5), squeeze=False, sharex=True)
    for col, h in enumerate(heads):
        ax = axes[0][col]
        mine = [c for c in configs if heads_of(c) == h]
        for v in variants:
            marker, colour = VARIANT_STYLE.get(v, ("^", None))
            points = [(c["batch"] * c["context"], timing(c, v)["frac"]) for c in mine if timing(c, v)]
            if points:
                xs, ys = zip(*sorted(points))
                ax.scatter(xs, ys, marker=marker, color=colour, label=v, s=28, alpha=0.85)
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, max([1.05, *(timing(c, v)["frac"] * 1.05 for c in mine for v in variants if timing(c, v))]))
        ax.set_title(f"heads {h} (q/kv)")
        ax.grid(True, which="both", alpha=0.3)
        if col == 0:
            ax.set_ylabel("fraction of streaming-read bound")
            ax.legend(fontsize=8)

        ax = axes[1][col]
        if col > 0:
            ax.sharey(axes[1][0])
        for kernel, colour in (("baseline", "tab:red"), ("tiled", "tab:blue")):
            points = sorted(
                (c["batch"] * c["context"], c["prefetch_speedup"][kernel])
                for c in mine
                if c.get("prefetch_speedup", {}).get(kernel) is not None
            )
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, marker="s" if kernel == "baseline" else "o", color=colour, linestyle="none",
                        label=f"{kernel}: time off / on")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("KV tokens per step (batch x context)")
        ax.grid(True, which="both", alpha=0.3)
        if col == 0:
            ax.set_ylabel("L2 prefetch speedup")
            ax.legend(fontsize=8)

    fig.suptitle(
        f"pagoda decode attention, {results.get('device', '?')}: "
        f"bound {results.get('stream_read_gbps', float('nan')):.0f} GB/s streaming read "
        f"(commit {results.get('commit', '?')})"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", nargs="?", help="attention.json (default: the only bench/results/*/attention.json)")
    args = parser.parse_args()

    if args.json:
        path = Path(args.json)
    else:
        found = sorted(Path(__file__).resolve().parent.glob("results/*/attention.json"))
        if len(found) != 1:
            sys.exit(f"plot_attention: name the results file ({len(found)} bench/results/*/attention.json found)")
        path = found[0]
    try:
        results = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"plot_attention: cannot read {path}: {e}")
    if results.get("benchmark") != "attention" or not isinstance(results.get("configs"), list):
        sys.exit(f"plot_attention: {path} is not the output of `pagoda bench attention`")

    md = path.with_suffix(".md")
    write_markdown(results, md)
    print(f"plot_attention: wrote {md}")

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_attention: matplotlib is not installed (pip install matplotlib); wrote the table, not the plot")
    png = path.with_suffix(".png")
    if write_plot(results, png, plt):
        print(f"plot_attention: wrote {png}")


if __name__ == "__main__":
    main()
