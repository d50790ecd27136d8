#!/usr/bin/env python3
"""bench/ncu_stalls.py against a source page written by hand: two launches of a warp-specialized
kernel (the hotter one must be read), one launch of a kernel without setmaxnreg, and the split of
the samples and executions between the producers' code and the rest."""
import gzip
import os
import subprocess
import sys
import tempfile
import unittest

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")
sys.path.insert(0, BENCH)
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import ncu_stalls  # noqa: E402

HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)",'
          '"Instructions Executed","stall_barrier","stall_long_sb","stall_wait","stall_wait (Not Issued)"')


def table(kernel: str, rows: list[tuple[str, int, int, int, int, int]]) -> str:
    """rows: (source, samples, executed, barrier, long_sb, wait) per instruction."""
    lines = [f'"Kernel Name","{kernel}",', HEADER]
    for i, (source, samples, executed, barrier, long_sb, wait) in enumerate(rows):
        lines.append(f'"0x{i:04x}","{source}","{samples}","{samples}","{executed:,}","{barrier}","{long_sb}",'
                     f'"{wait}","0"')
    return "\n".join(lines) + "\n"


SPECIALIZED = [
    ("USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xc8", 1, 8, 0, 0, 1),
    ("SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R5], R4", 60, 4000, 0, 60, 0),  # the others wait for data
    ("HMMA.16816.F32 R4, R8, R12, R4", 20, 2000, 0, 0, 20),
    ("EXIT", 0, 8, 0, 0, 0),
    ("USETMAXREG.DEALLOC.CTAPOOL 0x68", 0, 4, 0, 0, 0),  # the producers' code from here
    ("BAR.SYNC.DEFER_BLOCKING 0x2, 0x80", 10, 1000, 10, 0, 0),
    ("LDGSTS.E.BYPASS.128 [R21], desc[UR8][R6.64]", 30, 1000, 0, 0, 30),
    ("LDGSTS.E.BYPASS.128 [R21+0x4000], desc[UR8][R8.64]", 20, 1000, 0, 0, 20),
    ("EXIT", 0, 4, 0, 0, 0),  # to here
    ("BRA 0x0", 1, 4, 0, 0, 1),
]


class NcuStallsTest(unittest.TestCase):
    def setUp(self):
        cold = [(source, samples // 10, executed, 0, 0, samples // 10) for source, samples, executed, *_ in SPECIALIZED]
        plain = [("LDG.E R4, desc[UR4][R2.64]", 5, 100, 0, 5, 0), ("EXIT", 0, 10, 0, 0, 0)]
        self.text = table("prefix_tiled_kernel", cold) + table("decode_tiled_kernel", plain) + \
            table("prefix_tiled_kernel", SPECIALIZED)

    def launches(self):
        return ncu_stalls.read_launches(self.text.splitlines())

    def test_reads_every_launch_and_picks_the_hotter(self):
        launches = self.launches()
        self.assertEqual([(l.kernel, l.samples()) for l in launches],
                         [("prefix_tiled_kernel", 14), ("decode_tiled_kernel", 5), ("prefix_tiled_kernel", 142)])

    def test_split_at_the_producers_setmaxnreg(self):
        hot = self.launches()[2]
        roles = ncu_stalls.split_roles(hot)
        self.assertEqual(list(roles), ["producers", "others"])
        self.assertEqual([r[1] for r in roles["producers"]], [s for s, *_ in SPECIALIZED[4:9]])
        self.assertEqual(hot.samples(roles["producers"]), 60)
        self.assertEqual(hot.samples(roles["others"]), 82)
        self.assertEqual(ncu_stalls.split_roles(self.launches()[1]).keys(), {"all warps"})

    def test_report(self):
        report = ncu_stalls.describe(self.launches()[2], top=3)
        self.assertIn("prefix_tiled_kernel: 142 samples, 10 instructions", report)
        # producers: wait 50 of 60 samples, barrier 10; 3008 instructions executed, 2000 of them
        # by the two copies that each ran 1000 times (with the barrier: 3 x 1000).
        self.assertIn("producers: 60 samples (42.3%), 3008 instructions executed", report)
        self.assertIn("stalls: wait 83.3%, barrier 16.7%", report)
        self.assertIn("3 x       1000 =         3000 executed, 60 samples", report)
        self.assertIn("others: 82 samples (57.7%), 6020 instructions executed", report)
        self.assertIn("stalls: long_sb 73.2%, wait 26.8%", report)
        # Each role's hottest instructions, indexed in the kernel: the producers' first copy (index
        # 6, 30 of the 142 samples) heads theirs though the others' wait (60) is hotter.
        producers, others = report.split("others:")
        hottest = producers.split("hottest instructions")[1].splitlines()[1]
        self.assertIn("    6  21.1%  LDGSTS.E.BYPASS.128 [R21], desc[UR8][R6.64]", hottest)
        self.assertIn("wait 100%", hottest)
        hottest = others.split("hottest instructions")[1].splitlines()[1:]
        self.assertIn("    1  42.3%  SYNCS.PHASECHK.TRANS64.TRYWAIT", hottest[0])
        self.assertIn("long_sb 100%", hottest[0])
        self.assertEqual(len(hottest), 3)  # top=3, of the role's 6 instructions

    def test_command_line_reads_gzip_and_reports_each_kernel(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "ncu.sass.csv.gz")
            with gzip.open(path, "wt") as f:
                f.write(self.text)
            run = subprocess.run([sys.executable, os.path.join(BENCH, "ncu_stalls.py"), path],
                                 capture_output=True, text=True, check=True)
            self.assertIn("decode_tiled_kernel: 5 samples", run.stdout)
            self.assertIn("prefix_tiled_kernel: 142 samples", run.stdout)
            empty = os.path.join(d, "empty.csv")
            with open(empty, "w") as f:
                f.write("==PROF== nothing profiled\n")
            run = subprocess.run([sys.executable, os.path.join(BENCH, "ncu_stalls.py"), empty],
                                 capture_output=True, text=True)
            self.assertEqual(run.returncode, 1)
            self.assertIn("no instruction table", run.stderr)

    def test_bad_input_is_a_clear_error(self):
        with tempfile.TemporaryDirectory() as d:
            cases = {  # file contents -> the error
                None: "No such file",
                table("k", [("EXIT", 1, 4, 0, 0, 1)]).replace('"Instructions Executed",', ""):
                    "the table of k has no 'Instructions Executed' column",
                table("k", [("EXIT", 1, 4, 0, 0, 1)]).replace('"EXIT","1"', '"EXIT","n/a"'):
                    "'Warp Stall Sampling (All Samples)' of 'EXIT' is 'n/a', not a count",
            }
            for i, (text, error) in enumerate(cases.items()):
                path = os.path.join(d, f"{i}.csv")
                if text is not None:
                    with open(path, "w") as f:
                        f.write(text)
                run = subprocess.run([sys.executable, os.path.join(BENCH, "ncu_stalls.py"), path],
                                     capture_output=True, text=True)
                self.assertEqual(run.returncode, 1, error)
                self.assertIn(error, run.stderr)
                self.assertNotIn("Traceback", run.stderr)
            run = subprocess.run([sys.executable, os.path.join(BENCH, "ncu_stalls.py"), path, "--top", "0"],
                                 capture_output=True, text=True)
            self.assertEqual(run.returncode, 2)
            self.assertIn("--top 0: at least 1", run.stderr)


if __name__ == "__main__":
    unittest.main()
