"""The README's main command (`python3 deploy/dev.py demo`): the word count on a fresh local
cluster, checked against a direct count.

Owns the demo's script: start a multi-process cluster (one JobManager, 2 TaskManagers x 2 slots)
in `.funke/demo-<timestamp>/` under the repository root, submit `examples/wordcount.py` with
parallelism 2 and its counts collected, show the progress as `funke submit` does, then print the
top words, whether the cluster's counts equal a `collections.Counter` over the same files, the
job's status history, and where the wall time went: the cluster's start, each TaskManager's
SparkSession ready and its registration, the job's submission, RUNNING and FINISHED. The cluster
is stopped whatever happens; its directory (with every process's log) stays for inspection.

Exit code 0 only if the job FINISHED and the counts match.

A demo runner, not an example of a job: besides the public API (`funke.client`) it uses funke's
inside (the local cluster launcher, the CLI's renderers) to check what it shows. A job
file imports only `funke`, `funke.state` and `funke.client`.
"""

from __future__ import annotations

import collections
import datetime
import glob
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from funke.client import FunkeError, JobManagerClient, execution_state_name, job_status_name, load_job_file
from funke.common.graph.jobgraph import JobGraph, OperatorSpec
from funke.deploy import localcluster
from funke.deploy.cli import collect_sinks, follow_job, format_duration, render_failure, render_history, render_rows
from funke.v1 import job_pb2, jobmanager_pb2

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "wordcount.py"
TASKMANAGERS, SLOTS, PARALLELISM = 2, 2, 2
TOP = 15
# Spark's text source ends a line at \n, \r\n or \r.
_LINE_ENDS = re.compile(r"\r\n|\r|\n")


def _say(message: str = "") -> None:
    print(message, flush=True)


def _fresh_dir() -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = ROOT / ".funke" / f"demo-{stamp}"
    candidate, n = base, 1
    while candidate.exists():  # two demos in the same second
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


# --------------------------------------------------------------------------------------------
# The direct count: the same files, the same tokeniser
# --------------------------------------------------------------------------------------------


def _operator(job: JobGraph, kind: str) -> OperatorSpec:
    found = [op for v in job.vertices for op in v.operators if op.kind == kind]
    if len(found) != 1:
        raise RuntimeError(f"the word count's job graph has {len(found)} {kind!r} operators, expected 1")
    return found[0]


def tokeniser_and_input(job: JobGraph, source_kind: str = "source.text") -> tuple[Callable[[str], Iterable[str]], str]:
    """The flat_map function and the input path of the word count, taken from the job graph
    the example built: the very function the TaskManagers run (the example defines it inside
    build() so that it ships by value), so the two counts cannot drift apart."""
    import cloudpickle

    words = cloudpickle.loads(_operator(job, "flat_map").function)
    path = str(_operator(job, source_kind).config["path"])
    return words, path


def input_files(path: str) -> list[Path]:
    """What Spark reads for a text source path: a file, every file of a directory, or a glob."""
    if os.path.isdir(path):
        candidates = [p for p in Path(path).iterdir() if p.is_file()]
    else:
        candidates = [Path(p) for p in glob.glob(path, recursive=True) if os.path.isfile(p)]
    # Spark skips hidden and "_"-prefixed files (its markers), and so do we.
    return sorted(p for p in candidates if not p.name.startswith((".", "_")))


def direct_count(files: Sequence[Path], words: Callable[[str], Iterable[str]]) -> collections.Counter[str]:
    return count_texts([f.read_text(encoding="utf-8") for f in files], words)


def count_texts(texts: Iterable[str], words: Callable[[str], Iterable[str]]) -> collections.Counter[str]:
    """Words of texts, split into lines as Spark's text source does."""
    counts: collections.Counter[str] = collections.Counter()
    for text in texts:
        for line in _LINE_ENDS.split(text):
            counts.update(words(line))
    return counts


def differences(cluster: dict[str, int], direct: dict[str, int], limit: int = 10) -> list[str]:
    words = sorted(set(cluster) | set(direct), key=lambda w: (-(direct.get(w, 0)), w))
    lines = [f"  {w!r}: cluster {cluster.get(w, 'missing')}, direct {direct.get(w, 'missing')}"
             for w in words if cluster.get(w) != direct.get(w)]
    if len(lines) > limit:
        lines = lines[:limit] + [f"  ... and {len(lines) - limit} more"]
    return lines


# --------------------------------------------------------------------------------------------
# Where the time went
# --------------------------------------------------------------------------------------------


def _epoch(ts) -> float | None:
    return ts.seconds + ts.nanos / 1e9 if ts.seconds or ts.nanos else None


def _resource_time(tm: jobmanager_pb2.TaskManagerInfo, key: str) -> float | None:
    try:
        value = float(tm.resources.get(key, ""))
    except ValueError:
        return None
    return value if value > 0 else None


def timing_lines(started: float, cluster_ready: float, overview: jobmanager_pb2.ClusterOverview | None,
                 submitted: float | None, details: job_pb2.JobDetails | None, finished: float) -> list[str]:
    """The demo's steps in seconds since its start (every argument in epoch seconds; the
    processes run on this machine, so their clocks are the demo's): the cluster's start, per
    TaskManager when its process started, its SparkSession was ready and it registered, then the
    job's submission, each status it entered (the JobManager's times) and the result in hand."""

    def at(t: float | None) -> str:
        return f"{t - started:.2f} s" if t is not None else "-"

    lines = ["where the time went (seconds since the demo started):",
             f"  cluster start: {at(cluster_ready)} (the JobManager serving, every TaskManager registered)"]
    for tm in sorted(overview.task_managers, key=lambda t: t.id) if overview is not None else ():
        lines.append(f"  {tm.id}: process started {at(_resource_time(tm, 'started_at'))}, Spark session ready "
                     f"{at(_resource_time(tm, 'spark_ready_at'))}, registered {at(_epoch(tm.registered_at))}")
    steps = [f"submitted {at(submitted)}"] if submitted is not None else []
    for transition in details.status_history if details is not None else ():
        steps.append(f"{job_status_name(transition.to_status)} {at(_epoch(transition.timestamp))}")
    steps.append(f"result checked {at(finished)}")
    took = f" ({finished - submitted:.2f} s from submission to result)" if submitted is not None else ""
    lines.append(f"  job: {', '.join(steps)}{took}")
    # each subtask: where it ran, when it entered each state, and how long its TaskManager says it worked
    for vertex in details.vertices if details is not None else ():
        for subtask in vertex.subtasks:
            ex = subtask.current
            moves = [f"{execution_state_name(t.to_state)} {at(_epoch(t.timestamp))}" for t in ex.history
                     if execution_state_name(t.to_state) in ("DEPLOYING", "RUNNING", "FINISHED")]
            work = f" (its work {ex.io.seconds:.2f} s)" if ex.HasField("io") and ex.io.seconds else ""
            lines.append(f"    {subtask.name} on {ex.task_manager_id or '-'}: {', '.join(moves) or 'not deployed'}{work}")
    return lines


# --------------------------------------------------------------------------------------------
# The demo
# --------------------------------------------------------------------------------------------


def run(cluster: localcluster.ClusterInfo, started: float, cluster_ready_at: float) -> int:
    """Submit the word count to `cluster`, follow it, check and print the outcome; `started`
    and `cluster_ready_at` (time.time) split the wall time."""
    job = load_job_file(EXAMPLE, ["--parallelism", str(PARALLELISM)])
    sinks = collect_sinks(job)
    if len(sinks) != 1:
        raise RuntimeError(f"the word count should collect its counts in one sink, found {len(sinks)}")
    words, input_path = tokeniser_and_input(job)
    files = input_files(input_path)

    with JobManagerClient(cluster.address, credentials=localcluster.credentials(cluster.dir)) as client:
        overview = client.cluster_overview()
        submitted = time.time()
        job_id = client.submit(job)
        _say(f"submitted job {job_id} {job.name!r} (parallelism {PARALLELISM}) reading {input_path}")
        follow_job(client, job_id, sys.stdout, tty=sys.stdout.isatty())
        details = client.get_job(job_id)
        status = job_status_name(details.status)
        rows = client.result(job_id, sinks[0]) if status == "FINISHED" else []
    finished = time.time()

    matches = False
    if status == "FINISHED":
        cluster_counts = {str(r["word"]): int(r["count"]) for r in rows}
        top = sorted(cluster_counts.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP]
        _say()
        _say(f"top {len(top)} of {len(cluster_counts)} distinct words ({sum(cluster_counts.values())} words in all):")
        _say("\n".join(render_rows(["#", "word", "count"],
                                   [{"#": i, "word": w, "count": n} for i, (w, n) in enumerate(top, 1)])))
        expected = direct_count(files, words)
        duplicates = len(rows) - len(cluster_counts)
        matches = cluster_counts == dict(expected) and duplicates == 0
        _say()
        where = f"{len(files)} file(s) matching {input_path}"
        if matches:
            _say(f"counts match a direct collections.Counter over the same {where}: yes")
        else:
            _say(f"counts match a direct collections.Counter over the same {where}: NO")
            if duplicates:
                _say(f"  the cluster returned {duplicates} duplicate word row(s)")
            _say("\n".join(differences(cluster_counts, dict(expected))))

    _say()
    _say(f"job {job_id} {status}")
    _say("\n".join(render_history(details)))
    if details.HasField("failure"):
        _say("failure (root cause first):")
        _say("\n".join(render_failure(details.failure)))
    _say()
    _say("\n".join(timing_lines(started, cluster_ready_at, overview, submitted, details, finished)))
    _say(f"wall time: {format_duration(finished - started)} in all "
         f"(cluster start {format_duration(cluster_ready_at - started)}, "
         f"job {format_duration(finished - cluster_ready_at)})")
    return 0 if status == "FINISHED" and matches else 1


def main(argv: Sequence[str] | None = None) -> int:
    if argv:
        print(f"funke demo: takes no arguments, got {' '.join(argv)}", file=sys.stderr)
        return 2
    started = time.time()
    cluster_dir = _fresh_dir()
    _say(f"starting a local cluster: 1 JobManager and {TASKMANAGERS} TaskManagers x {SLOTS} slots "
         f"in {cluster_dir.relative_to(ROOT)}/ ...")
    try:
        try:
            cluster = localcluster.start(localcluster.ClusterSpec(cluster_dir, TASKMANAGERS, SLOTS))
        except localcluster.ClusterError as exc:
            print(f"funke demo: the cluster did not start: {exc}", file=sys.stderr)
            return 1
        ready = time.time()
        _say(f"JobManager at {cluster.address}; TaskManagers "
             + ", ".join(tm.name for tm in cluster.taskmanagers) + " registered")
        if cluster.dashboard_url:
            _say(f"web dashboard at {cluster.dashboard_url} while it runs (log in with the token in "
                 f"{(cluster.dir / 'security' / 'client.token').relative_to(ROOT)})")
        return run(cluster, started, ready)
    except FunkeError as exc:
        print(f"funke demo: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("funke demo: interrupted", file=sys.stderr)
        return 130
    finally:
        localcluster.stop(cluster_dir)
        _say(f"cluster stopped; its logs are in {cluster_dir / 'log'}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
