"""Benchmark of the JobManager's graph core at scale: source → sink ALL_TO_ALL at P = 10 000.

Times, for BLOCKING and PIPELINED results, the median of N runs of
  ExecutionGraph construction, compute_pipelined_regions, build_slot_sharing_plan and
  regions_to_restart for one failed sink subtask (source partitions finished, and all lost),
then measures peak memory of one construction of all three with tracemalloc, in a separate run so
that tracing does not distort the timings. The goal: graph + regions + plan well under 1 s.

A script, not a test (pytest collects test_*.py only):
    python tests/benchmarks/bench_core.py [--p 10000] [--runs 5]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for tests.conformance

from funke.common.executiongraph import ExecutionGraph, PartitionLocation  # noqa: E402
from funke.common.jobgraph import ResultPartitionType  # noqa: E402
from funke.common.regions import compute_pipelined_regions  # noqa: E402
from funke.common.slotsharing import build_slot_sharing_plan  # noqa: E402
from tests.conformance.graphs import source_sink_all_to_all  # noqa: E402

STEPS = ("ExecutionGraph", "compute_pipelined_regions", "build_slot_sharing_plan",
         "regions_to_restart (inputs available)")
EXTRA = "regions_to_restart (inputs lost)"  # worst case, not part of the total


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    gc.collect()
    started = time.perf_counter()
    value = fn()
    return (time.perf_counter() - started) * 1000.0, value


def one_run(p: int, kind: ResultPartitionType) -> dict[str, float]:
    job = source_sink_all_to_all(p, kind)
    ms: dict[str, float] = {}
    ms["ExecutionGraph"], graph = timed(lambda: ExecutionGraph(job, "bench", now=0.0))
    assert isinstance(graph, ExecutionGraph)
    ms["compute_pipelined_regions"], regions = timed(lambda: compute_pipelined_regions(graph))
    ms["build_slot_sharing_plan"], plan = timed(lambda: build_slot_sharing_plan(graph))
    assert plan.required_slots() == p  # type: ignore[attr-defined]
    failed = [graph.vertices["sink"].task_vertices[p // 2]]
    ms[EXTRA], lost = timed(lambda: regions.regions_to_restart(failed))  # type: ignore[attr-defined]
    for partition in graph.vertices["source"].produced[0].partitions:
        graph.mark_partition_finished(partition, PartitionLocation(0, "tm-1", "x BIGINT"))
    ms[STEPS[3]], kept = timed(lambda: regions.regions_to_restart(failed))  # type: ignore[attr-defined]
    # BLOCKING: only the failed sink's own region; PIPELINED: the one region of everything.
    # With the inputs lost, every vertex is restarted either way.
    assert len(kept) == 1, len(kept)  # type: ignore[arg-type]
    assert sum(len(r) for r in lost) == 2 * p  # type: ignore[union-attr]
    return ms


def peak_memory_mib(p: int, kind: ResultPartitionType) -> float:
    job = source_sink_all_to_all(p, kind)
    gc.collect()
    tracemalloc.start()
    try:
        graph = ExecutionGraph(job, "bench", now=0.0)
        regions = compute_pipelined_regions(graph)
        plan = build_slot_sharing_plan(graph)
        regions.regions_to_restart([graph.vertices["sink"].task_vertices[0]])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del graph, regions, plan
    return peak / (1024 * 1024)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--p", type=int, default=10_000, help="parallelism of source and sink")
    parser.add_argument("--runs", type=int, default=5, help="runs per measurement (median)")
    args = parser.parse_args()

    kinds = (ResultPartitionType.BLOCKING, ResultPartitionType.PIPELINED)
    medians: dict[ResultPartitionType, dict[str, float]] = {}
    for kind in kinds:
        runs = [one_run(args.p, kind) for _ in range(args.runs)]
        medians[kind] = {step: statistics.median(r[step] for r in runs) for step in (*STEPS, EXTRA)}

    width = max(len(s) for s in (*STEPS, EXTRA)) + 2
    print(f"source -> sink ALL_TO_ALL, P = {args.p}, median of {args.runs} runs (ms)")
    print(f"{'step':<{width}}" + "".join(f"{k.value:>12}" for k in kinds))
    for step in STEPS:
        print(f"{step:<{width}}" + "".join(f"{medians[k][step]:>12.1f}" for k in kinds))
    print(f"{'total':<{width}}" + "".join(f"{sum(medians[k][s] for s in STEPS):>12.1f}" for k in kinds))
    print(f"{'graph + regions + plan':<{width}}"
          + "".join(f"{sum(medians[k][s] for s in STEPS[:3]):>12.1f}" for k in kinds))
    print(f"{EXTRA:<{width}}" + "".join(f"{medians[k][EXTRA]:>12.1f}" for k in kinds))
    print()
    print(f"{'peak memory, tracemalloc (MiB)':<{width}}"
          + "".join(f"{peak_memory_mib(args.p, k):>12.1f}" for k in kinds))


if __name__ == "__main__":
    main()
