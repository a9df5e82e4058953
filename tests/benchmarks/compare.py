"""A regression guard that is not a timing assert: compare two benchmark result files and print the
figures that got worse by more than a ratio.

    python tests/benchmarks/compare.py BEFORE.json AFTER.json [--ratio 1.2] [--all]

The files are what `deploy/dev.py bench` writes (.funke/bench/results-*.json) or any one
benchmark's --json. Every number found at the same place in both is compared when its name says
which way is better: durations (`..._ms`, `..._s`, `seconds`, `p50`, `p99`, `median`, `max`, `min`,
`duration`, `delay`, `pause`) are better lower, rates (`per_s`, `per_second`, `rows_per_s`,
`throughput`) and ratios named `..._ratio` of throughput are better higher; other numbers (counts,
sizes, settings) are shown with --all only. Lists of records are matched by their text fields
(a scheduler row by its p, partition type and step), not by position. Exit 1 when anything got
worse by more than --ratio, so a script can stop on it; the machines are shared and noisy, so
compare runs made one after the other, and read a flagged row again before believing it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

LOWER_IS_BETTER = re.compile(r"(_ms$|_s$|^s$|seconds|p50|p99|median|^max|^min|duration|delay|pause|_mib$|memory)")
HIGHER_IS_BETTER = re.compile(r"(per_s$|per_second|throughput|rows_per_s|tasks_per_s|lines_per_s)")
SKIPPED = {"table", "machine", "cores", "seconds_requested", "sweep_top"}


def leaves(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], float]]:
    """(path, number) for every number in `value`; a list of records is keyed by each record's
    text and boolean fields, so reordered rows still match."""
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        yield path, float(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            if str(k) not in SKIPPED:
                yield from leaves(v, path + (str(k),))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if isinstance(item, dict):
                label = ",".join(f"{k}={v}" for k, v in sorted(item.items()) if isinstance(v, (str, bool))
                                 or (isinstance(v, int) and k in ("p", "parallelism", "runs", "kills")))
                yield from leaves(item, path + (f"[{label or i}]",))
            else:
                yield from leaves(item, path + (f"[{i}]",))


def direction(path: tuple[str, ...]) -> int:
    """-1: lower is better, +1: higher is better, 0: not a figure to judge."""
    name = path[-1].lower()
    if HIGHER_IS_BETTER.search(name) or (name.endswith("ratio") and "throughput" in name):
        return 1
    if LOWER_IS_BETTER.search(name) or name.endswith("ratio"):
        return -1
    return 0


def compare(before: Any, after: Any, ratio: float) -> list[tuple[str, float, float, float, str]]:
    """(path, before, after, how much worse (after/before for lower-is-better), verdict) per
    number in both files that has a direction, worst first."""
    old = dict(leaves(before))
    rows = []
    for path, new in leaves(after):
        if path not in old:
            continue
        was, sense = old[path], direction(path)
        if sense == 0 or was == 0 or new == 0:
            continue
        worse = new / was if sense < 0 else was / new
        verdict = "WORSE" if worse > ratio else "better" if worse < 1 / ratio else "same"
        rows.append(("/".join(path), was, new, worse, verdict))
    return sorted(rows, key=lambda r: -r[3])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    p.add_argument("--ratio", type=float, default=1.2, help="how much worse counts as a regression (default 1.2)")
    p.add_argument("--all", action="store_true", help="print every compared figure, not only the regressions")
    args = p.parse_args(argv)
    if args.ratio <= 1:
        p.error("--ratio must be above 1")
    rows = compare(json.loads(args.before.read_text()), json.loads(args.after.read_text()), args.ratio)
    worse = [r for r in rows if r[4] == "WORSE"]
    shown = rows if args.all else worse
    for path, was, new, factor, verdict in shown:
        print(f"{verdict:6}  {factor:5.2f}x  {was:>14,.3f} -> {new:<14,.3f}  {path}")
    print(f"{len(rows)} figures compared, {len(worse)} worse by more than {args.ratio:g}x, "
          f"{sum(1 for r in rows if r[4] == 'better')} better by more than that", file=sys.stderr)
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
