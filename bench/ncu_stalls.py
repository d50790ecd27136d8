#!/usr/bin/env python3
"""Where a warp-specialized kernel's warps wait: ncu's per-instruction stall samples, by role.

Input: the source page of an Nsight Compute report with SASS,
    ncu -i REPORT --page source --csv --print-source sass | gzip > FILE.csv.gz
which holds one table per profiled launch. For each kernel, its launch with the most samples is
read. Producer warps that give up registers with setmaxnreg run the code from the kernel's
USETMAXREG.DEALLOC to the next EXIT; the rest is the other warps' code and the set-up.

For each role it prints the stall samples by reason, the instructions executed, and those
instructions grouped by how many times each one ran: in a persistent kernel a count is a loop's
trip count times the warps that run it (per tile, per item, per pass), so the groups show what a
warp executes per unit of work. Then the instructions with the most samples.
  python3 bench/ncu_stalls.py FILE.csv.gz [--top N]
"""
import argparse
import collections
import csv
import gzip
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


class Launch:
    def __init__(self, kernel: str, header: list[str]):
        self.kernel = kernel
        self.column = {name: i for i, name in enumerate(header)}
        for name in ("Source", SAMPLES, EXECUTED):
            if name not in self.column:
                raise ValueError(f"the table of {kernel or 'a kernel'} has no '{name}' column")
        self.reasons = [name for name in header if name.startswith("stall_") and "Not Issued" not in name]
        self.rows: list[list[str]] = []

    def number(self, row: list[str], name: str) -> int:
        text = row[self.column[name]].replace(",", "")
        if not text:
            return 0
        if not text.isdigit():
            raise ValueError(f"'{name}' of {row[self.column['Source']].strip()!r} is {text!r}, not a count")
        return int(text)

    def samples(self, rows=None) -> int:
        return sum(self.number(r, SAMPLES) for r in (self.rows if rows is None else rows))


def read_launches(lines) -> list[Launch]:
    """Every launch's table: a 'Kernel Name' row, a header row, then one row per instruction."""
    launches, kernel = [], ""
    for row in csv.reader(lines):
        if not row:
            continue
        if row[0] == "Kernel Name":
            kernel = row[1] if len(row) > 1 else ""
        elif row[0] == "Address":
            launches.append(Launch(kernel, row))
        elif launches and len(row) == len(launches[-1].column):
            launches[-1].rows.append(row)
    return launches


def split_roles(launch: Launch) -> dict[str, list[list[str]]]:
    """producers: from USETMAXREG.DEALLOC to the next EXIT; others: the rest (all of it if none)."""
    source = launch.column["Source"]
    start = next((i for i, r in enumerate(launch.rows) if "USETMAXREG.DEALLOC" in r[source]), None)
    if start is None:
        return {"all warps": launch.rows}
    end = next((i for i in range(start, len(launch.rows)) if "EXIT" in launch.rows[i][source]), len(launch.rows) - 1)
    return {"producers": launch.rows[start:end + 1], "others": launch.rows[:start] + launch.rows[end + 1:]}


def describe(launch: Launch, top: int) -> str:
    total = launch.samples()
    source = launch.column["Source"]
    index = {id(r): i for i, r in enumerate(launch.rows)}
    out = [f"{launch.kernel}: {total} samples, {len(launch.rows)} instructions"]
    for role, rows in split_roles(launch).items():
        samples = launch.samples(rows)
        reasons = collections.Counter()
        for r in rows:
            for reason in launch.reasons:
                reasons[reason] += launch.number(r, reason)
        executed = sum(launch.number(r, EXECUTED) for r in rows)
        shares = ", ".join(f"{reason[len('stall_'):]} {100 * n / max(samples, 1):.1f}%"
                           for reason, n in reasons.most_common(8) if n)
        out.append(f"\n{role}: {samples} samples ({100 * samples / max(total, 1):.1f}%), "
                   f"{executed} instructions executed")
        out.append(f"  stalls: {shares}")
        by_count = collections.defaultdict(lambda: [0, 0])  # times run -> [instructions, samples]
        for r in rows:
            count = launch.number(r, EXECUTED)
            by_count[count][0] += 1
            by_count[count][1] += launch.number(r, SAMPLES)
        out.append("  instructions by times run (most executed first):")
        for count, (n, s) in sorted(by_count.items(), key=lambda kv: -kv[0] * kv[1][0])[:top]:
            out.append(f"    {n:5d} x {count:10d} = {n * count:12d} executed, {s} samples")
        # Per role: in one list for the whole kernel the producers' few samples sit among, or fall
        # below, the consumers' many.
        out.append("  hottest instructions (index in the kernel, share of its samples):")
        for r in sorted(rows, key=lambda r: -launch.number(r, SAMPLES))[:top]:
            n = launch.number(r, SAMPLES)
            if n == 0:
                break
            why = ", ".join(f"{reason[len('stall_'):]} {100 * launch.number(r, reason) / n:.0f}%"
                            for reason in launch.reasons if launch.number(r, reason) * 5 > n)
            out.append(f"    {index[id(r)]:5d} {100 * n / total:5.1f}%  {r[source].strip()[:60]:60s} {why}")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("file", help="ncu --page source --csv --print-source sass output, gzipped or not")
    p.add_argument("--top", type=int, default=20, help="rows of each list")
    a = p.parse_args()
    if a.top < 1:
        p.error(f"--top {a.top}: at least 1")
    opener = gzip.open if a.file.endswith(".gz") else open
    try:
        with opener(a.file, "rt", newline="") as f:
            launches = [launch for launch in read_launches(f) if launch.rows]
        if not launches:
            raise ValueError("no instruction table")
        kernels = {launch.kernel for launch in launches}
        hottest = [max((l for l in launches if l.kernel == k), key=Launch.samples) for k in sorted(kernels)]
        print("\n\n".join(describe(launch, a.top) for launch in hottest))
    except (OSError, ValueError, csv.Error) as e:
        print(f"ncu_stalls: {a.file}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
