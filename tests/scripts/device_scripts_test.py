#!/usr/bin/env python3
"""scripts/device_ab.sh and scripts/device_prefix.sh on this machine, their GPU parts stubbed.

The device tool brings back at most 8 files from $OUT. These tests check that the scripts
deliver within that: a few results and one archive of everything else. They also check that a
run cut off by its time limit keeps the steps it finished, that the A/B ratios are the
benchmarks' own, and that bad input stops a script before any build.

The stubs stand in for what needs a GPU. A scripts/device_build.sh in a copy of the scripts
writes a build/pagoda that answers `bench prefix-attention --out FILE` with a JSON of fixed times,
read from the tree's stub_us.txt, and `--list-trees` with two trees. The variant under test is a
commit (branch `slower`) that changes stub_us.txt and is reverted by the next, as the
experiments kept in history are. nvidia-smi and ncu are stubs on PATH.
"""
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import unittest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")

STUB_BUILD = r"""#!/usr/bin/env bash
mkdir -p build
cat > build/pagoda <<'EOF'
#!/usr/bin/env bash
[[ " $* " == *" --list-trees "* ]] && { echo "1_16;256_4096"; exit; }
out=
for ((i = 1; i <= $#; ++i)); do [[ ${!i} == --out ]] && { j=$((i + 1)); out=${!j}; }; done
[[ $out == *_2.json && -n ${STUB_SLEEP_ROUND_2:-} ]] && sleep "$STUB_SLEEP_ROUND_2"
us=$(cat "$(dirname "$0")/../stub_us.txt")
cat > "$out" <<JSON
{"configs": [{"tree": "1_16", "q_heads": 32, "kv_heads": 8, "prefix": {"median_us": 5}, "decode": {"median_us": 4}},
             {"tree": "256_4096", "q_heads": 32, "kv_heads": 8, "prefix": {"median_us": $us}, "decode": {"median_us": 900}}]}
JSON
EOF
printf '#!/usr/bin/env bash\necho "[  PASSED  ] 3 tests."\n' > build/gpu_tests
chmod +x build/pagoda build/gpu_tests
"""

STUB_NCU = r"""#!/usr/bin/env bash
for ((i = 1; i <= $#; ++i)); do [[ ${!i} == -o ]] && { j=$((i + 1)); touch "${!j}.ncu-rep"; }; done
if [[ " $* " == *" source "* ]]; then  # the source page: one launch, two instructions
  echo '"Kernel Name","prefix_tiled_kernel",'
  echo '"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_wait"'
  echo '"0x0","USETMAXREG.DEALLOC.CTAPOOL 0x68","2","4","2"'
  echo '"0x1","EXIT","1","4","1"'
  exit
fi
echo "  void prefix_tiled_kernel<__half, 128>(PrefixParams)"
"""


class DeviceScripts(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="device_scripts_test.")
        self.addCleanup(shutil.rmtree, self.dir, True)
        # A tree to run in: the scripts under test, the stub build, and a file the patch changes.
        self.tree = os.path.join(self.dir, "tree")
        os.makedirs(os.path.join(self.tree, "scripts"))
        os.makedirs(os.path.join(self.tree, "bench"))
        shutil.copy(os.path.join(ROOT, "bench", "ncu_stalls.py"), os.path.join(self.tree, "bench"))
        os.makedirs(os.path.join(self.tree, ".device-deps"))
        for name in ("device_ab.sh", "device_prefix.sh", "device_common.sh"):
            shutil.copy(os.path.join(ROOT, "scripts", name), os.path.join(self.tree, "scripts", name))
        self.write(os.path.join(self.tree, "scripts", "device_build.sh"), STUB_BUILD)
        self.write(os.path.join(self.tree, "stub_us.txt"), "1000\n")
        # The repository: the tree, a variant commit, its revert (the tree the device gets is A).
        self.git("init", "-q")
        self.git("add", "-A")
        self.git("commit", "-q", "-m", "tree")
        self.write(os.path.join(self.tree, "stub_us.txt"), "1010\n")
        self.git("commit", "-q", "-am", "experiment: slower")
        self.git("branch", "slower")
        self.git("revert", "--no-edit", "HEAD")
        bin_dir = os.path.join(self.dir, "bin")
        os.makedirs(bin_dir)
        self.write(os.path.join(bin_dir, "nvidia-smi"), "#!/usr/bin/env bash\necho 'NVIDIA Stub'\n")
        self.write(os.path.join(bin_dir, "ncu"), STUB_NCU)
        self.env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"])
        self.out = os.path.join(self.dir, "out")

    def git(self, *args):
        env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                   GIT_COMMITTER_EMAIL="t@t")
        subprocess.run(["git", "-C", self.tree] + list(args), check=True, env=env, capture_output=True)

    @staticmethod
    def write(path, text):
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o755)

    def run_script(self, args, timeout=None, **env):
        if timeout is not None:
            args = ["timeout", str(timeout)] + args
        return subprocess.run(args, cwd=self.tree, env=dict(self.env, OUT=self.out, **env),
                              capture_output=True, text=True)

    def archive(self, name):
        with tarfile.open(os.path.join(self.out, name)) as tar:
            return sorted(os.path.normpath(m.name) for m in tar.getmembers() if m.isfile())

    def archived_text(self, name, member):
        with tarfile.open(os.path.join(self.out, name)) as tar:
            return tar.extractfile("./" + member).read().decode()

    def test_ab_delivers_the_ratios_and_one_archive(self):
        run = self.run_script(["bash", "scripts/device_ab.sh", "slower"], ROUNDS="2", TESTS="")
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertEqual(sorted(os.listdir(self.out)), ["ab.txt", "device_ab.tgz", "gpu.txt"])
        with open(os.path.join(self.out, "ab.txt")) as f:
            ab = f.read()
        # 1010 / 1000 in both rounds; the launch-floor batch 1_16 is not a configuration.
        self.assertIn("slower: time / A geomean 1.0100, range 1.010-1.010", ab)
        self.assertNotIn("1_16", ab)
        files = self.archive("device_ab.tgz")
        for name in ("A_1.json", "A_2.json", "slower_1.json", "slower_2.json", "build_A.log", "ab.txt"):
            self.assertIn(name, files)

    def test_ab_cut_off_keeps_the_finished_round(self):
        # Round 2's bench sleeps past the limit: round 1 must be in the archive all the same.
        run = self.run_script(["bash", "scripts/device_ab.sh", "slower"], timeout=10, ROUNDS="2", TESTS="",
                              STUB_SLEEP_ROUND_2="60")
        self.assertEqual(run.returncode, 124)
        self.assertLessEqual(len(os.listdir(self.out)), 8)
        files = self.archive("device_ab.tgz")
        self.assertIn("A_1.json", files)
        self.assertIn("slower_1.json", files)
        self.assertNotIn("slower_2.json", files)
        with tarfile.open(os.path.join(self.out, "device_ab.tgz")) as tar:
            a1 = json.load(tar.extractfile("./A_1.json"))
        self.assertEqual(a1["configs"][1]["prefix"]["median_us"], 1000)

    def test_ab_bad_input_stops_before_any_build(self):
        cases = [
            ([], {}, "usage: bash scripts/device_ab.sh [--export] COMMIT"),
            (["missing"], {}, "no commit 'missing' here and no .device-ab/missing.patch"),
            (["slower~1"], {}, "'slower~1' is not a commit id or branch name"),
            (["slower"], {"KERNEL": "both"}, "KERNEL is prefix or decode"),
            (["slower"], {"ROUNDS": "0"}, "ROUNDS is a positive whole number, not '0'"),
            (["slower"], {"RUNS": "ten"}, "RUNS is a positive whole number, not 'ten'"),
        ]
        for args, env, message in cases:
            run = self.run_script(["bash", "scripts/device_ab.sh"] + args, **env)
            self.assertEqual(run.returncode, 2, args)
            self.assertIn(message, run.stderr)
            self.assertFalse(os.path.exists(self.out), args)
            self.assertFalse(os.path.exists(os.path.join(self.tree, "build")), args)

    def test_ab_on_another_card_runs_nothing(self):
        run = self.run_script(["bash", "scripts/device_ab.sh", "slower"], TESTS="", GPU="H200")
        self.assertEqual(run.returncode, 3, run.stderr)
        self.assertIn("the card is 'NVIDIA Stub', and GPU=H200 asks for another: nothing run", run.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.tree, "build")))
        self.assertEqual(sorted(os.listdir(self.out)), ["device_ab.tgz", "gpu.txt"])
        run = self.run_script(["bash", "scripts/device_ab.sh", "slower"], TESTS="", GPU="Stub")
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn("ab.txt", os.listdir(self.out))

    def test_ab_two_variants_of_one_name(self):
        run = self.run_script(["bash", "scripts/device_ab.sh", "slower", "slower"], TESTS="")
        self.assertEqual(run.returncode, 2)
        self.assertIn("two variants named 'slower'", run.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.tree, "build")))

    def test_deliver_refuses_more_results_than_come_back(self):
        script = ('source scripts/device_common.sh && device_init t && touch "$out"/r{1..8} && '
                  'deliver r1 r2 r3 r4 r5 r6 r7 r8')
        run = self.run_script(["bash", "-c", script])
        self.assertEqual(run.returncode, 1)
        self.assertIn("more than the 8 files that come back", run.stderr)
        self.assertEqual(os.listdir(self.out), [])

    def test_ab_exported_commit_runs_where_there_is_no_git(self):
        # The device's copy of the tree has no .git: the diff travels as .device-ab/COMMIT.patch.
        run = self.run_script(["bash", "scripts/device_ab.sh", "--export", "slower"])
        self.assertEqual(run.returncode, 0, run.stderr)
        with open(os.path.join(self.tree, ".device-ab", "slower.patch")) as f:
            self.assertIn("-1000\n+1010", f.read())
        self.assertFalse(os.path.exists(self.out))  # exporting runs nothing
        shutil.rmtree(os.path.join(self.tree, ".git"))
        run = self.run_script(["bash", "scripts/device_ab.sh", "slower"], ROUNDS="1", TESTS="")
        self.assertEqual(run.returncode, 0, run.stderr)
        with open(os.path.join(self.out, "ab.txt")) as f:
            self.assertIn("slower: time / A geomean 1.0100", f.read())
        # Without git and without the exported diff, the call says what to do.
        os.remove(os.path.join(self.tree, ".device-ab", "slower.patch"))
        shutil.rmtree(self.out)
        run = self.run_script(["bash", "scripts/device_ab.sh", "slower"], TESTS="")
        self.assertEqual(run.returncode, 2)
        self.assertIn("run 'bash scripts/device_ab.sh --export slower'", run.stderr)
        self.assertFalse(os.path.exists(self.out))

    def test_ab_patch_that_does_not_apply(self):
        self.write(os.path.join(self.tree, "stub_us.txt"), "999\n")
        run = self.run_script(["bash", "scripts/device_ab.sh", "slower"], TESTS="")
        self.assertEqual(run.returncode, 1)
        self.assertIn("does not apply to this tree", run.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.tree, "build")))

    def test_prefix_delivers_results_and_ncu_in_the_archive(self):
        run = self.run_script(["bash", "scripts/device_prefix.sh"], STEPS="tests bench ncu",
                              NCU_CONFIGS="256_4096 32/8;1,4,256_32,256,32")
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn("is not \"TREE HEADS\"", run.stdout)  # the second config lacks its heads
        self.assertEqual(sorted(os.listdir(self.out)), ["device_prefix.tgz", "prefix_attention.json"])
        files = self.archive("device_prefix.tgz")
        for name in ("build.log", "gpu_tests.log", "bench_prefix.log", "prefix_attention.json",
                     "ncu_256_4096_32-8.txt", "ncu_256_4096_32-8.raw.csv.gz", "ncu_256_4096_32-8.sass.csv.gz",
                     "ncu_256_4096_32-8.stalls.txt"):
            self.assertIn(name, files)
        self.assertIn("producers: 3 samples (100.0%), 8 instructions executed",
                      self.archived_text("device_prefix.tgz", "ncu_256_4096_32-8.stalls.txt"))
        self.assertFalse(any(name.endswith(".ncu-rep") for name in files))


if __name__ == "__main__":
    unittest.main()
