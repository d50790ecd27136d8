#!/usr/bin/env python3
"""bench/compare_prefix.py against figures worked out by hand.

A run of three configurations, a PAT reference and FlashInfer's cascade times, written as the
benchmarks write them. The expected targets, geometric means and speed-ups are computed here
from the targets' definitions (docs/experiments/prefix-attention.md), not by the script. Then the script runs as a command on the same
files and its markdown must carry the same figures.
"""
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")
sys.path.insert(0, BENCH)
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import compare_prefix  # noqa: E402


def config(tree, q_heads, kv_heads, us, bound_us, frac, floor_us):
    return {
        "tree": tree, "q_heads": q_heads, "kv_heads": kv_heads, "unique_kv_bytes": 1e6,
        "bound": {"bound_us": bound_us, "which": "memory"},
        "prefix": {"median_us": us, "frac": frac, "of_bound": bound_us / us, "host_us": us / 4},
        "decode": {"median_us": 2 * us, "host_us": 3.0},
        "floor": {"prefix_us": floor_us, "decode_us": floor_us + 1},
    }


RUN = {
    "device": "test GPU", "sm_count": 1, "dtype": "fp16", "head_dim": 128, "block_size": 16,
    "stream_read_gbps": 1000.0, "mma_peak_tflops": 100.0, "commit": "test",
    "configs": [
        # Sharing; PAT 0.30 -> target 0.45, met by 0.50. Of the bound 10 / 20.
        config("1,2_64,32", 32, 8, us=20.0, bound_us=10.0, frac=0.50, floor_us=5.0),
        # Sharing; PAT 0.70 -> target min(1.05, 0.95) = 0.95, missed by 0.80. Of the bound 8 / 10.
        config("1,4_64,32", 32, 32, us=10.0, bound_us=8.0, frac=0.80, floor_us=5.0),
        # No sharing: no PAT target, not in the geometric mean.
        config("256_4096", 32, 8, us=100.0, bound_us=98.0, frac=0.98, floor_us=5.0),
    ],
}
PAT_MD = """| batch | heads | queries | unique KV MB | PAT µs | PAT frac |
| --- | --- | --- | --- | --- | --- |
| `1,2_64,32` | 32/8 | 2 | 1 | 9.0 | 0.30 |
| `1,4_64,32` | 32/32 | 4 | 1 | 9.0 | 0.70 |
| `256_4096` | 32/8 | 256 | 1 | 9.0 | 0.99 |
"""
FLASHINFER = {"configs": [
    {"tree": "1,2_64,32", "q_heads": 32, "kv_heads": 8, "decode_us": 30.0, "cascade_us": 40.0},  # 2.0x
    {"tree": "1,4_64,32", "q_heads": 32, "kv_heads": 32, "decode_us": 30.0, "cascade_us": 9.0},  # 0.9x
]}

GEOMEAN = math.sqrt(0.5 * 0.8)
ABOVE_FLOOR = math.sqrt(10 / (20 - 5) * 8 / (10 - 5))
BOUND_PLUS_FLOOR = math.sqrt(10 / (10 + 5) * 8 / (8 + 5))


class ComparePrefixTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.run_path = self.path("prefix_attention.json", json.dumps(RUN))
        self.pat_path = self.path("pat_reference.md", PAT_MD)
        self.fi_path = self.path("flashinfer_prefix.json", json.dumps(FLASHINFER))

    def tearDown(self):
        self.dir.cleanup()

    def path(self, name, text):
        p = os.path.join(self.dir.name, name)
        with open(p, "w") as f:
            f.write(text)
        return p

    def test_summary(self):
        pat = compare_prefix.load_pat(self.pat_path)
        self.assertEqual(pat[("1,4_64,32", "32/32")], 0.70)
        fi = {(c["tree"], f"{c['q_heads']}/{c['kv_heads']}"): c for c in FLASHINFER["configs"]}
        rows, s = compare_prefix.summarize(RUN, pat, fi)
        self.assertEqual([r["target"] for r in rows], [0.30 * 1.5, 0.95, None])
        self.assertEqual((s["met"], s["total_targets"]), (1, 2))
        self.assertAlmostEqual(s["geomean"], GEOMEAN)
        self.assertEqual((s["beat_cascade"], s["cascade_rows"]), (1, 2))
        self.assertAlmostEqual(rows[0]["vs_cascade"], 2.0)
        self.assertAlmostEqual(s["above_floor"], ABOVE_FLOOR)
        self.assertAlmostEqual(s["bound_plus_floor"], BOUND_PLUS_FLOOR)
        self.assertEqual(s["at_floor"], 0)
        self.assertEqual(s["floors"]["32/8"], (5.0, 6.0))
        self.assertEqual(s["host_us"], (5.0, 3.0))  # the median of 20 / 4, 10 / 4 and 100 / 4
        # The target times: 0.50 x 20 / 0.45 = 22.2 against 10 + 5; 0.80 x 10 / 0.95 = 8.4 against 8 + 5.
        self.assertEqual(s["past_floor"], ["`1,4_64,32` 32/32"])

    def test_runs_without_host_times(self):
        run = json.loads(json.dumps(RUN))
        for c in run["configs"]:
            del c["prefix"]["host_us"], c["decode"]["host_us"]
        rows, s = compare_prefix.summarize(run, {}, {})
        self.assertIsNone(s["host_us"])
        self.assertNotIn("host time", compare_prefix.render(run, rows, s))

    def test_batch_at_the_floor_is_left_out(self):
        run = json.loads(json.dumps(RUN))
        run["configs"][1]["prefix"]["median_us"] = 5.0  # at the floor: no time above it
        _, s = compare_prefix.summarize(run, {}, {})
        self.assertEqual(s["at_floor"], 1)
        self.assertAlmostEqual(s["above_floor"], 10 / 15)
        self.assertEqual(s["total_targets"], 0)

    def test_batches_pat_does_not_list_stay_out_of_the_target(self):
        run = json.loads(json.dumps(RUN))
        # Sharing, no PAT figure (another tree of the PAT artifact): of the bound 5 / 20.
        run["configs"].append(config("1,8_64,32", 16, 8, us=20.0, bound_us=5.0, frac=0.25, floor_us=5.0))
        rows, s = compare_prefix.summarize(run, compare_prefix.load_pat(self.pat_path), {})
        self.assertIsNone(rows[3]["target"])
        self.assertEqual((s["met"], s["total_targets"]), (1, 2))
        self.assertAlmostEqual(s["geomean"], GEOMEAN)
        self.assertAlmostEqual(s["geomean_all"], (0.5 * 0.8 * 0.25) ** (1 / 3))
        self.assertEqual((s["shared"], s["listed"]), (3, 2))
        text = compare_prefix.render(run, rows, s)
        self.assertIn(f"- the same over all 3 configurations with sharing in this run, 1 of them without PAT "
                      f"figures: {(0.5 * 0.8 * 0.25) ** (1 / 3):.3f}\n", text)
        # The bound plus the floor: 5 / (5 + 5) joins the listed two in the mean over all three.
        every = (10 / 15 * 8 / 13 * 5 / 10) ** (1 / 3)
        self.assertAlmostEqual(s["bound_plus_floor"], every)
        self.assertAlmostEqual(s["bound_plus_floor_listed"], BOUND_PLUS_FLOOR)
        self.assertIn(f"would reach {every:.3f} of the bound ({BOUND_PLUS_FLOOR:.3f} over the listed ones)\n", text)

    def test_command_writes_the_figures(self):
        md = os.path.join(self.dir.name, "out.md")
        subprocess.run([sys.executable, os.path.join(BENCH, "compare_prefix.py"), self.run_path,
                        "--flashinfer", self.fi_path, "--pat", self.pat_path, "--md", md],
                       check=True, stdout=subprocess.DEVNULL)
        with open(md) as f:
            text = f.read()
        self.assertIn("- PAT targets met: 1 of 2\n", text)
        self.assertIn(f"over the listed batches with sharing (those PAT lists): {GEOMEAN:.3f} (target 0.6)", text)
        self.assertNotIn("configurations with sharing in this run", text)  # every one is listed
        self.assertIn("- at least FlashInfer's cascade speed: 1 of 2\n", text)
        self.assertIn(f"bound / (time - floor): {ABOVE_FLOOR:.3f}; a kernel taking the bound plus the floor "
                      f"would reach {BOUND_PLUS_FLOOR:.3f} of the bound\n", text)  # every one is listed
        self.assertIn("| `1,4_64,32` | 32/32 | 1.0 | 8.0 m | 10.0 | 0.80 | 0.80 | 0.70 | 0.95 | **no** |", text)
        self.assertIn("- `256_4096` 32/8: 0.980 of the bound (target 0.95), 2.000x the paged decode kernel", text)
        self.assertIn("layer): pagoda 5.0 µs, paged decode kernel 3.0 µs\n", text)
        self.assertIn("are under the floor's meets them): 1 (`1,4_64,32` 32/32)\n", text)


if __name__ == "__main__":
    unittest.main()
