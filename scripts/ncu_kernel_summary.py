#!/usr/bin/env python3
"""Per-kernel device time of the last forward in an ncu CSV (scripts/gpu_kernel_times.sh).

Reads `ncu --metrics gpu__time_duration.sum --csv --print-units base` output (plain or .gz),
takes the kernels after the second-to-last LM-head launch (`--lm-head` names its kernel; the
bench's last prompt or step ends with it) and prints, per kernel name and grid, the total, the
count and the mean in microseconds, largest first.
Usage: ncu_kernel_summary.py FILE [--lm-head SUBSTRING] [--top N]
"""
import argparse
import collections
import csv
import gzip
import re


def read_rows(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        lines = [line for line in f if line.startswith('"')]  # ncu's own messages do not
    rows = []
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        ns = float(r["Metric Value"].replace(",", ""))
        rows.append((r["Kernel Name"], r["Grid Size"], ns / 1000.0))
    return rows


def short_name(name):
    name = re.sub(r"\(corolla::.*$", "", name)
    return name.replace("void ", "").replace("corolla::<unnamed>::", "").replace("corolla::", "")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--lm-head", default="GemvKernel<1, 4, 1>",
                    help="a substring of the LM head's kernel name (the end of each forward)")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    rows = read_rows(args.file)
    ends = [i for i, (name, _, _) in enumerate(rows) if args.lm_head in name]
    start = ends[-2] + 1 if len(ends) >= 2 else 0
    forward = rows[start:]
    totals = collections.OrderedDict()
    for name, grid, us in forward:
        entry = totals.setdefault((short_name(name), grid), [0, 0.0])
        entry[0] += 1
        entry[1] += us
    total = sum(t for _, t in totals.values())
    print(f"{len(forward)} kernels, {total:.0f} us (each timed alone by ncu)")
    for (name, grid), (count, us) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:args.top]:
        print(f"{us:10.1f} us {count:5d}x {us / count:9.1f} us  {name[:100]} {grid}")


if __name__ == "__main__":
    main()
