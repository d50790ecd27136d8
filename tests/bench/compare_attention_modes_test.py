#!/usr/bin/env python3
"""bench/compare_attention_modes.py against figures worked out by hand.

Three offline runs of one workload (paged, prefix, prefix without CUDA graphs) and two of another
(prefix, and paged without CUDA graphs, which is no baseline), then two replays of a trace (paged
and auto), written as `pagoda bench throughput --json` writes them. The table must carry each run's
figures and its mean TPOT over the paged run with graphs of its own workload; a replay has no
roofline, and its workload names the trace, its scaling and its prefix hits.
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")
sys.path.insert(0, BENCH)
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import compare_attention_modes  # noqa: E402


def run(attention, graphs, shared, tpot_mean, median_step_ms, prefix_steps, replays, captures):
    return {
        "device": "test GPU", "commit": "test",
        "model_shape": {"architecture": "llama", "layers": 2, "q_heads": 32, "kv_heads": 8},
        "config": {"batch": 4, "input": 64, "output": 8, "shared_prefix": shared, "attention": attention,
                   "cuda_graphs": graphs},
        "figures": {"tpot_ms": {"mean": tpot_mean, "p50": tpot_mean - 1}, "prefix_attention_steps": prefix_steps,
                    "steps": 9, "graph_replays": replays, "graph_captures": captures, "step_planning_us_mean": 50.0},
        "roofline": {"median_step_ms": median_step_ms, "bound_step_ms": 4.0, "fraction_of_bound": 4.0 / median_step_ms},
    }


def replay(attention, tpot_mean):
    r = run(attention, True, 0, tpot_mean, 1.0, prefix_steps=3 if attention == "auto" else 0, replays=5, captures=2)
    r["config"] = {"mode": "replay", "trace": "data/trace.jsonl", "attention": attention, "cuda_graphs": True,
                   "scaling": {"requests_replayed": 100, "requests_in_trace": 400, "length_scale": 0.0625,
                               "output_scale": 0.25}}
    r["figures"]["prefix_hit_rate"] = 0.414
    r["roofline"] = None
    return r


RUNS = [
    run("paged", True, 32, tpot_mean=10.0, median_step_ms=8.0, prefix_steps=0, replays=7, captures=1),
    run("prefix", True, 32, tpot_mean=8.0, median_step_ms=5.0, prefix_steps=8, replays=6, captures=2),
    run("prefix", False, 32, tpot_mean=9.0, median_step_ms=6.0, prefix_steps=8, replays=0, captures=0),
    run("prefix", True, 0, tpot_mean=12.0, median_step_ms=10.0, prefix_steps=8, replays=7, captures=1),
    run("paged", False, 0, tpot_mean=11.0, median_step_ms=9.0, prefix_steps=0, replays=0, captures=0),
    replay("paged", tpot_mean=40.0),
    replay("auto", tpot_mean=38.0),
]


class CompareAttentionModesTest(unittest.TestCase):
    def test_rows(self):
        rows = [line for line in compare_attention_modes.table(RUNS).splitlines() if line.startswith("| 4 x 64")]
        self.assertEqual(len(rows), 5)
        cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
        self.assertEqual(cells[0], ["4 x 64 (shared 32) -> 8", "paged", "yes", "10.00", "9.00", "8.00", "4.00", "0.500",
                                    "0 / 9", "7 (1)", "50", "1.000"])
        self.assertEqual(cells[1][1:3] + cells[1][7:], ["prefix", "yes", "0.800", "8 / 9", "6 (2)", "50", "0.800"])
        self.assertEqual(cells[2][1:3] + cells[2][-1:], ["prefix", "no", "0.900"])
        # The unshared workload's paged run has no CUDA graphs: no baseline, no ratio.
        self.assertEqual(cells[3][0], "4 x 64 (shared 0) -> 8")
        self.assertEqual(cells[3][-1], "-")
        self.assertEqual(cells[4][1:3] + cells[4][-1:], ["paged", "no", "-"])

    def test_replay_rows(self):
        rows = [line for line in compare_attention_modes.table(RUNS).splitlines() if line.startswith("| trace.jsonl")]
        cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
        self.assertEqual(cells[0][0], "trace.jsonl: 100 of 400 requests, lengths x 0.0625, outputs x 0.25 (41% prefix hits)")
        self.assertEqual(cells[0][1:], ["paged", "yes", "40.00", "39.00", "-", "-", "-", "0 / 9", "5 (2)", "50", "1.000"])
        self.assertEqual(cells[1][1:2] + cells[1][-4:], ["auto", "3 / 9", "5 (2)", "50", "0.950"])

    def test_command_writes_markdown(self):
        with tempfile.TemporaryDirectory() as d:
            paths = []
            for i, r in enumerate(RUNS):
                paths.append(os.path.join(d, f"run{i}.json"))
                with open(paths[-1], "w") as f:
                    json.dump(r, f)
            md = os.path.join(d, "modes.md")
            done = subprocess.run([sys.executable, os.path.join(BENCH, "compare_attention_modes.py"), *paths,
                                   "--md", md], capture_output=True, text=True)
            self.assertEqual(done.returncode, 0, done.stderr)
            with open(md) as f:
                self.assertEqual(f.read(), done.stdout)
            self.assertEqual(done.stdout.count("\n| "), len(RUNS) + 2)  # header, rule, a row per run


if __name__ == "__main__":
    unittest.main()
