"""Word count end to end on a real cluster: separate JobManager and TaskManager processes, real
gRPC, real PySpark, real files. The result must equal a direct count exactly."""

from __future__ import annotations

import collections
import random
import re
import tempfile
import time
from pathlib import Path

import pytest

from funke.deploy.jobfile import load_job_file
from funke.common.states import ExecutionState, JobStatus
from funke.common.conformance import Step, assert_event_stream
from funke.taskmanager.sparkruntime import scratch_dir_of
from tests.integration.conftest import REPO, as_json, listing, wait_cleaned_up, wait_for_end

pytestmark = pytest.mark.cluster

WORDCOUNT = REPO / "examples" / "wordcount.py"
# the example's tokenisation, restated: lower case, anything but letters separates words
SEPARATORS = re.compile(r"[\W\d_]+")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[str, collections.Counter]:
    """12 files of generated text (Zipf-like word frequencies, mixed case and punctuation)."""
    d = tmp_path_factory.mktemp("corpus")
    rng = random.Random(20261122)
    vocabulary = [f"{rng.choice(['', 'Un', 'Re'])}{''.join(rng.choices('abcdefghijklmnopqrstuvwxyz', k=rng.randint(2, 9)))}"
                  for _ in range(3000)]
    weights = [1 / (i + 1) for i in range(len(vocabulary))]
    expected: collections.Counter = collections.Counter()
    for n in range(12):
        lines = []
        for _ in range(2000):
            words = rng.choices(vocabulary, weights, k=rng.randint(0, 14))
            line = " ".join(w + rng.choice(["", "", ",", ".", "!", " 42", "'s"]) for w in words)
            lines.append(line)
            expected.update(w for w in SEPARATORS.split(line.lower()) if w)
        (d / f"part-{n:02d}.txt").write_text("\n".join(lines) + "\n")
    return str(d / "*.txt"), expected


@pytest.mark.parametrize("parallelism", [1, 4])
def test_word_count_equals_a_direct_count(spark_cluster, corpus, parallelism):
    pattern, expected = corpus
    job = load_job_file(WORDCOUNT, ["--input", pattern, "--parallelism", str(parallelism)])
    job_id = spark_cluster.client.submit(job)
    events, details = wait_for_end(spark_cluster.client, job_id)
    assert JobStatus[_status(details)] is JobStatus.FINISHED, details.failure
    rows = spark_cluster.client.result(job_id)
    assert collections.Counter({r["word"]: r["count"] for r in rows}) == expected
    assert len(rows) == len(expected)  # no word twice
    # two vertices (Flink-style chains), each run at the requested parallelism, on both TaskManagers;
    # at parallelism 1 one: no exchange between single subtasks, the count chains to the source
    if parallelism == 1:
        assert [(v.name, v.parallelism) for v in details.vertices] == [
            ("Source: text -> FlatMap -> Count -> Sink: Collect", 1)]
    else:
        assert [v.parallelism for v in details.vertices] == [parallelism, parallelism]
    used = {s.current.task_manager_id for v in details.vertices for s in v.subtasks}
    if parallelism == 4:
        assert used == {"tm-1", "tm-2"}


def test_watch_stream_is_a_legal_path_through_the_state_tables(spark_cluster, corpus):
    pattern, _ = corpus
    job_id = spark_cluster.client.submit(load_job_file(WORDCOUNT, ["--input", pattern, "--parallelism", "2"]))
    events = list(spark_cluster.client.watch(job_id))
    assert events[0].WhichOneof("event") == "snapshot"
    assert [e.sequence for e in events[1:]] == list(range(events[0].sequence + 1, events[0].sequence + len(events)))
    job_steps, execution_steps = steps_of(events)
    snapshot = events[0].snapshot
    paths = assert_event_stream(job_steps, execution_steps,
                                initial_job=_status(snapshot) if not snapshot.status_history else
                                _status_name(snapshot.status_history[-1].to_status),
                                initial_executions=_snapshot_states(snapshot))
    assert paths["job"][-1] == "FINISHED"
    # every one of the 4 subtasks went all the way, through the states the TaskManager reports
    finished = [p for e, p in paths.items() if e != "job"]
    assert len(finished) == 4 and all(p[-1] == "FINISHED" for p in finished)
    assert all("RUNNING" in p for p in finished)  # paths start at the snapshot's state


SINK_JOB = """
import time
from funke.common.api.dsl import ExecutionEnvironment

def slow_or_cursed(n):
    if n == 39:
        if {cursed}:
            raise ValueError("record 39 is cursed")
        time.sleep(6)  # holds subtask 2/2 while subtask 1/2 has finished and staged its file
    return n

env = ExecutionEnvironment("sink commit", parallelism=2)
env.set_restart_strategy("none")
env.from_collection([(i,) for i in range(40)], "n bigint").map(slow_or_cursed, schema="n bigint").write_csv({out!r})
job = env.build()
"""


def test_file_sink_output_appears_only_when_the_job_finished(spark_cluster, tmp_path):
    out = tmp_path / "numbers"
    job_file = tmp_path / "sink_job.py"
    job_file.write_text(SINK_JOB.format(cursed=False, out=str(out)))
    job_id = spark_cluster.client.submit(load_job_file(job_file))
    seen_partial = False
    deadline = time.monotonic() + 180  # a slow or busy machine takes longer, never shorter than the sleep
    while time.monotonic() < deadline:
        details = spark_cluster.client.get_job(job_id)
        states = [_state_name(s.current.state) for s in details.vertices[0].subtasks]
        if _status(details) == "RUNNING" and states.count("FINISHED") == 1:
            staged = [p for p in tmp_path.iterdir() if p.name.startswith(".numbers.funke-")]
            assert staged and not out.exists(), "output visible before the job FINISHED"
            seen_partial = True
        if _status(details) in ("FINISHED", "FAILED", "CANCELED"):
            break
        time.sleep(0.05)
    assert seen_partial, "never observed one finished subtask while the other ran"
    assert _status(details) == "FINISHED"
    names = sorted(p.name for p in out.iterdir())
    assert all(re.fullmatch(r"part-0000[01]-\d{3}\.csv", n) for n in names), names
    assert {n[:10] for n in names} == {"part-00000", "part-00001"}  # both subtasks' output, renamed by subtask
    numbers = sorted(int(line) for f in out.iterdir() for line in f.read_text().splitlines()[1:])
    assert numbers == list(range(40))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".numbers.funke-")]  # staging removed


def test_a_failed_job_leaves_nothing_at_the_sink_target(spark_cluster, tmp_path):
    out = tmp_path / "numbers"
    job_file = tmp_path / "sink_job.py"
    job_file.write_text(SINK_JOB.format(cursed=True, out=str(out)))
    job_id = spark_cluster.client.submit(load_job_file(job_file))
    _, details = wait_for_end(spark_cluster.client, job_id)
    assert _status(details) == "FAILED"
    deadline = time.time() + 10  # clean-up runs off the JobManager's main thread
    while time.time() < deadline and [p for p in tmp_path.iterdir() if p.name.startswith(".numbers.funke-")]:
        time.sleep(0.1)
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".numbers.funke-")]


def test_after_a_word_count_the_output_folder_holds_exactly_the_target_and_the_data_dir_nothing(spark_cluster, corpus,
                                                                                               tmp_path):
    """The job's partitions, which its TaskManagers release while the JobManager removes the
    job's directory, and the sink's staging beside the target (with its commit marker) are all
    gone once the job FINISHED: several TaskManagers, several subtasks per vertex."""
    out = tmp_path / "folder" / "counts"
    out.parent.mkdir()
    job = load_job_file(WORDCOUNT, ["--input", corpus[0], "--parallelism", "4", "--output", str(out)])
    job_id = spark_cluster.client.submit(job)
    _, details = wait_for_end(spark_cluster.client, job_id)
    assert JobStatus[_status(details)] is JobStatus.FINISHED, details.failure
    assert {s.current.task_manager_id for v in details.vertices for s in v.subtasks} == {"tm-1", "tm-2"}
    wait_cleaned_up(out, spark_cluster.dir / "data", job_id)
    assert all(re.fullmatch(r"part-\d{5}-\d{3}\.csv", p.name) for p in out.iterdir()), listing(out)


def test_cli_lists_and_describes_jobs_as_json(spark_cluster, corpus):
    pattern, _ = corpus
    submitted = spark_cluster.funke("submit", str(WORDCOUNT), "--json", "--", "--input", pattern, "--parallelism", "2")
    result = as_json(submitted)
    assert result["status"] == "FINISHED"
    job_id = result["job_id"]
    listed = as_json(spark_cluster.funke("list", "--json"))
    jobs = listed["jobs"] if isinstance(listed, dict) else listed
    assert any(j["job_id"] == job_id and j["status"].endswith("FINISHED") for j in jobs)
    status = as_json(spark_cluster.funke("status", job_id, "--json"))
    assert status["job_id"] == job_id
    history = [h["to_status"] for h in status["status_history"]]
    assert [h.removeprefix("JOB_STATUS_") for h in history] == ["RUNNING", "FINISHED"]
    for vertex in status["vertices"]:
        for sub in vertex["subtasks"]:
            assert sub["current"]["task_manager_id"] in ("tm-1", "tm-2")


def test_a_failing_user_function_fails_the_job_with_its_python_traceback(spark_cluster, tmp_path):
    job_file = tmp_path / "cursed.py"
    job_file.write_text(
        "from funke.common.api.dsl import ExecutionEnvironment\n"
        "\n"
        "def check_record(n):\n"
        "    if n == 7:\n"
        "        raise ValueError(f'record {n} is cursed')\n"
        "    return n\n"
        "\n"
        "env = ExecutionEnvironment('cursed', parallelism=2)\n"
        "env.set_restart_strategy('none')\n"
        "env.from_range(20).map(check_record, schema='id bigint').collect()\n"
        "job = env.build()\n"
    )
    submitted = spark_cluster.funke("submit", str(job_file), check=False)
    assert submitted.returncode == 1
    job_id = re.search(r"[0-9a-f]{32}", submitted.stdout + submitted.stderr).group(0)
    details = spark_cluster.client.get_job(job_id)
    assert _status(details) == "FAILED"
    status = spark_cluster.funke("status", job_id)
    text = status.stdout
    assert "FAILED" in text
    assert "ValueError: record 7 is cursed" in text
    assert "in check_record" in text  # the user's own frame, from the Python worker
    # the root cause comes first, the restart strategy second
    failure = details.failure.message
    assert failure.index("record 7 is cursed") < failure.index("recovery is suppressed")


def steps_of(events) -> tuple[list[Step], list[Step]]:
    job_steps, execution_steps = [], []
    for e in events[1:]:
        kind = e.WhichOneof("event")
        if kind == "job_status":
            t = e.job_status
            job_steps.append(Step("job", _status_name(t.from_status), _status_name(t.to_status), _seconds(t.timestamp)))
        elif kind == "execution_state":
            c = e.execution_state
            entity = f"{c.attempt.vertex_id}[{c.attempt.subtask_index}]#{c.attempt.attempt_number}"
            t = c.transition
            execution_steps.append(Step(entity, _state_name(t.from_state), _state_name(t.to_state), _seconds(t.timestamp)))
    return job_steps, execution_steps


def _snapshot_states(snapshot) -> dict[str, str]:
    return {f"{v.id}[{s.subtask_index}]#{s.current.id.attempt_number}": _state_name(s.current.state)
            for v in snapshot.vertices for s in v.subtasks}


def _seconds(ts) -> float:
    return ts.seconds + ts.nanos / 1e9


def _status(details) -> str:
    return _status_name(details.status)


def _status_name(value: int) -> str:
    from funke.v1 import job_pb2

    return job_pb2.JobStatus.Name(value).removeprefix("JOB_STATUS_")


def _state_name(value: int) -> str:
    from funke.v1 import job_pb2

    return job_pb2.ExecutionState.Name(value).removeprefix("EXECUTION_STATE_")


__all__ = ["steps_of", "ExecutionState"]


def join_example_is_exact(client) -> None:
    """The join example, run on the cluster, equals the sums of its own tables."""
    from examples.join import CUSTOMERS, ORDERS

    job_id = client.submit(load_job_file(REPO / "examples" / "join.py", ["--parallelism", "2"]))
    _, details = wait_for_end(client, job_id)
    assert _status(details) == "FINISHED", details.failure
    names = dict(CUSTOMERS)
    expected: dict[str, tuple[float, int]] = {}
    for _, customer, amount in ORDERS:
        if customer in names:
            revenue, n = expected.get(names[customer], (0.0, 0))
            expected[names[customer]] = (revenue + amount, n + 1)
    assert {r["name"]: (r["revenue"], r["orders"]) for r in client.result(job_id)} == expected


def test_the_join_example_sums_revenue_per_customer(spark_cluster):
    join_example_is_exact(spark_cluster.client)


def test_a_streaming_job_deploys_eagerly_and_consumers_wait_for_pipelined_partitions(spark_cluster, corpus):
    from funke.common.api.dsl import ExecutionEnvironment

    pattern, expected = corpus
    env = ExecutionEnvironment("streaming word count", job_type="streaming", parallelism=2)
    (env.read_text(pattern)
        .flat_map(lambda line: [w for w in SEPARATORS.split(line.lower()) if w], schema="word string")
        .key_by("word").count().collect())
    job = env.build()
    assert {e.result_partition_type.value for e in job.edges} == {"PIPELINED"}
    job_id = spark_cluster.client.submit(job)
    events, details = wait_for_end(spark_cluster.client, job_id)
    assert _status(details) == "FINISHED", details.failure
    assert collections.Counter({r["word"]: r["count"] for r in spark_cluster.client.result(job_id)}) == expected
    # eager: every task was deployed before any producer finished
    deployed, first_finished = [], None
    for e in events[1:]:
        if e.WhichOneof("event") == "execution_state":
            to = _state_name(e.execution_state.transition.to_state)
            if to == "DEPLOYING":
                deployed.append(e.sequence)
            elif to == "FINISHED" and first_finished is None:
                first_finished = e.sequence
    snapshot_deploying = sum(1 for v in events[0].snapshot.vertices for s in v.subtasks
                             if _state_name(s.current.state) != "CREATED")
    assert len(deployed) + snapshot_deploying == 4
    assert all(seq < first_finished for seq in deployed)


def test_spark_keeps_its_files_in_the_taskmanagers_scratch_directory(spark_cluster, corpus):
    """Block manager, shuffle files and the JVM's temp files of each TaskManager's SparkSession
    live under `<temp>/funke-taskmanager-<pid>` (removed at stop: checked by the fixture), not
    loose in the temp directory."""
    job = load_job_file(WORDCOUNT, ["--input", corpus[0], "--parallelism", "2"])
    job_id = spark_cluster.client.submit(job)
    _, details = wait_for_end(spark_cluster.client, job_id)
    assert JobStatus[_status(details)] is JobStatus.FINISHED, details.failure
    taskmanagers = {name: pid for name, pid in spark_cluster.pids().items() if name.startswith("tm-")}
    assert sorted(taskmanagers) == ["tm-1", "tm-2"]
    for name, pid in taskmanagers.items():
        scratch = Path(scratch_dir_of(tempfile.gettempdir(), pid))
        assert any(p.name.startswith("blockmgr-") for p in (scratch / "spark").iterdir()), \
            f"{name}: no block manager under {scratch / 'spark'}"
        assert any((scratch / "jvm").iterdir()), f"{name}: the JVM wrote nothing under {scratch / 'jvm'}"
