"""The client SDK and the `funke` command line, without a cluster: where the JobManager is
looked for, how job files load, how jobs and failures are shown, what an unreachable JobManager
or an unknown job does to the exit code, and the local cluster's handling of its pid files.
An in-process fake JobManager (loopback, port 0) stands in where an answer is needed."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import re
import subprocess
import sys
import textwrap
import time
from concurrent import futures
from pathlib import Path
from typing import Iterator

import cloudpickle
import grpc
import pyarrow as pa
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from funke.deploy.client import (
    FunkeError,
    InvalidJobGraph,
    JobManagerClient,
    JobManagerUnavailable,
    JobNotFound,
)
from funke.deploy.jobfile import JobFileError, load_job_file
from funke.common.graph.jobgraph import JobGraph
from funke.deploy import cli, localcluster
from funke.deploy.cli import jobs, live
from funke.v1 import job_pb2, jobmanager_pb2, jobmanager_pb2_grpc

JS = job_pb2.JobStatus
ES = job_pb2.ExecutionState


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def ts(seconds: float) -> Timestamp:
    return Timestamp(seconds=int(seconds), nanos=int(round((seconds - int(seconds)) * 1e9)))


def free_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write(path: Path, source: str) -> Path:
    path.write_text(textwrap.dedent(source))
    return path


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No JobManager from the environment, and a cluster dir of our own (empty)."""
    monkeypatch.delenv("FUNKE_JOBMANAGER", raising=False)
    cluster_dir = tmp_path / "cluster"
    monkeypatch.setenv("FUNKE_CLUSTER_DIR", str(cluster_dir))
    return cluster_dir


T0 = 1_700_000_000.0


def failed_job() -> job_pb2.JobDetails:
    """A word count whose second source subtask failed: the JobDetails a JobManager would send."""
    tb = ('Traceback (most recent call last):\n  File "/jobs/wc.py", line 12, in words\n'
          "    raise ValueError('bad line')\nValueError: bad line\n")
    failure = job_pb2.Failure(exception_type="ValueError", message="bad line", traceback=tb)
    d = job_pb2.JobDetails(
        job_id="f00d", name="word count", status=JS.JOB_STATUS_FAILED, created_at=ts(T0),
        required_slots=2, restart_strategy="no restarts", failover_strategy="region",
    )
    d.status_history.add(from_status=JS.JOB_STATUS_CREATED, to_status=JS.JOB_STATUS_RUNNING,
                         timestamp=ts(T0 + 0.5), cause="tasks deploying")
    d.status_history.add(from_status=JS.JOB_STATUS_RUNNING, to_status=JS.JOB_STATUS_FAILING,
                         timestamp=ts(T0 + 2.0), cause="ValueError: bad line\nmore detail")
    d.status_history.add(from_status=JS.JOB_STATUS_FAILING, to_status=JS.JOB_STATUS_FAILED,
                         timestamp=ts(T0 + 2.25), cause="no restarts")
    v = d.vertices.add(id="source-text", name="Source: text -> FlatMap", parallelism=2)
    v.subtasks_per_state.update({"FINISHED": 1, "FAILED": 1})
    s0 = v.subtasks.add(subtask_index=0, name="Source: text -> FlatMap (1/2)")
    s0.current.id.CopyFrom(job_pb2.ExecutionAttemptId(vertex_id="source-text", subtask_index=0, attempt_number=0))
    s0.current.state = ES.EXECUTION_STATE_FINISHED
    s0.current.task_manager_id = "tm-1"
    s0.current.slot_index = 0
    s1 = v.subtasks.add(subtask_index=1, name="Source: text -> FlatMap (2/2)")
    s1.current.id.CopyFrom(job_pb2.ExecutionAttemptId(vertex_id="source-text", subtask_index=1, attempt_number=1))
    s1.current.state = ES.EXECUTION_STATE_FAILED
    s1.current.task_manager_id = "tm-2"
    s1.current.slot_index = 1
    s1.current.failure.CopyFrom(failure)
    prior = s1.prior_attempts.add(state=ES.EXECUTION_STATE_CANCELED, task_manager_id="tm-1")
    prior.id.CopyFrom(job_pb2.ExecutionAttemptId(vertex_id="source-text", subtask_index=1, attempt_number=0))
    d.exceptions.add(timestamp=ts(T0 + 2.0), task_name="Source: text -> FlatMap (2/2)",
                     attempt=s1.current.id, task_manager_id="tm-2", failure=failure)
    d.failure.CopyFrom(failure)
    return d


class FakeJobManager(jobmanager_pb2_grpc.JobManagerServicer):
    """Answers like a JobManager for one finished job "j1" that collected two rows."""

    def SubmitJob(self, request, context):
        context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                      "job graph has 2 problem(s):\n  - vertex 'a': parallelism must be positive\n"
                      "  - edge 'a->b': unknown consumer 'b'")

    def GetJob(self, request, context):
        if request.job_id != "j1":
            context.abort(grpc.StatusCode.NOT_FOUND, f"no job with id {request.job_id!r}")
        d = failed_job()
        d.job_id = "j1"
        return d

    def ListJobs(self, request, context):
        return jobmanager_pb2.ListJobsResponse(jobs=[job_pb2.JobSummary(
            job_id="j1", name="word count", status=JS.JOB_STATUS_FINISHED, created_at=ts(T0),
            ended_at=ts(T0 + 3), duration_seconds=3.0, total_tasks=4, tasks_per_state={"FINISHED": 4})])

    def GetJobResult(self, request, context):
        table = pa.table({"word": ["funke", "flink"], "count": [3, 2]})
        sink = io.BytesIO()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        return jobmanager_pb2.JobResult(vertex_id="count", arrow_ipc_stream=sink.getvalue(), row_count=2)


@pytest.fixture
def fake_jobmanager() -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    jobmanager_pb2_grpc.add_JobManagerServicer_to_server(FakeJobManager(), server)
    health_servicer = health.HealthServicer()
    health_servicer.set("funke.v1.JobManager", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None)


# --------------------------------------------------------------------------------------------
# where the JobManager is looked for
# --------------------------------------------------------------------------------------------


def test_jobmanager_flag_wins_over_environment_and_address_file(tmp_path: Path) -> None:
    (tmp_path / "jobmanager.address").write_text("127.0.0.1:7003")
    env = {"FUNKE_JOBMANAGER": "127.0.0.1:7002", "FUNKE_CLUSTER_DIR": str(tmp_path)}
    assert cli.resolve_jobmanager("127.0.0.1:7001", env) == "127.0.0.1:7001"


def test_environment_variable_wins_over_the_address_file(tmp_path: Path) -> None:
    (tmp_path / "jobmanager.address").write_text("127.0.0.1:7003")
    env = {"FUNKE_JOBMANAGER": "127.0.0.1:7002", "FUNKE_CLUSTER_DIR": str(tmp_path)}
    assert cli.resolve_jobmanager(None, env) == "127.0.0.1:7002"


def test_local_cluster_address_file_is_used_without_flag_or_environment(tmp_path: Path) -> None:
    (tmp_path / "jobmanager.address").write_text("127.0.0.1:7003\n")
    assert cli.resolve_jobmanager(None, {"FUNKE_CLUSTER_DIR": str(tmp_path)}) == "127.0.0.1:7003"


def test_default_address_when_nothing_is_configured(tmp_path: Path) -> None:
    assert cli.resolve_jobmanager(None, {"FUNKE_CLUSTER_DIR": str(tmp_path / "none")}) == "127.0.0.1:6123"


def test_cluster_dir_defaults_to_home_dot_funke(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert localcluster.default_cluster_dir({}) == tmp_path / ".funke" / "cluster"


def test_malformed_jobmanager_address_is_a_usage_error(clean_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["list", "--jobmanager", "localhost"]) == 2
    assert "expected HOST:PORT" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# job files
# --------------------------------------------------------------------------------------------


def test_build_receives_the_remaining_arguments(tmp_path: Path) -> None:
    job_file = write(tmp_path / "job.py", """
        from funke.common.api.dsl import ExecutionEnvironment

        def build(args):
            env = ExecutionEnvironment("args=" + " ".join(args))
            env.from_range(3).collect()
            return env.build()
    """)
    job = load_job_file(job_file, ["--parallelism", "4"])
    assert isinstance(job, JobGraph)
    assert job.name == "args=--parallelism 4"


def test_module_level_job_graph_is_used_when_there_is_no_build(tmp_path: Path) -> None:
    job_file = write(tmp_path / "job.py", """
        from funke.common.api.dsl import ExecutionEnvironment
        env = ExecutionEnvironment("module level")
        env.from_range(3).discard()
        job = env.build()
    """)
    assert load_job_file(job_file).name == "module level"


@pytest.mark.parametrize("definition", ["job = env", "def build(args):\n    return env"])
def test_an_execution_environment_is_built(tmp_path: Path, definition: str) -> None:
    job_file = write(tmp_path / "job.py", """
        from funke.common.api.dsl import ExecutionEnvironment
        env = ExecutionEnvironment("from env", parallelism=3)
        env.from_range(3).collect()
    """)
    job_file.write_text(job_file.read_text() + definition + "\n")
    job = load_job_file(job_file)
    assert job.name == "from env"
    assert {v.parallelism for v in job.vertices} == {3}


def test_job_file_runs_as_funke_job_with_its_directory_importable(tmp_path: Path) -> None:
    write(tmp_path / "helper_for_job.py", "NAME = 'from a neighbour'\n")
    job_file = write(tmp_path / "job.py", """
        from funke.common.api.dsl import ExecutionEnvironment
        import helper_for_job
        assert __name__ == "__funke_job__", __name__
        env = ExecutionEnvironment(helper_for_job.NAME)
        env.from_range(1).discard()
        job = env
        if __name__ == "__main__":
            raise SystemExit("the main block must not run")
    """)
    path_before = list(sys.path)
    try:
        assert load_job_file(job_file).name == "from a neighbour"
        assert sys.path == path_before  # the directory is on sys.path only while loading
    finally:
        sys.modules.pop("helper_for_job", None)


def test_module_level_functions_ship_by_value(tmp_path: Path) -> None:
    # The TaskManagers cannot import the job file; a function pickled by reference to the
    # `__funke_job__` module would fail there exactly as it fails here, after the load.
    job_file = write(tmp_path / "job.py", """
        from funke.common.api.dsl import ExecutionEnvironment

        def double(n):
            return 2 * n

        env = ExecutionEnvironment("by value")
        env.from_range(3).map(double, schema="n bigint").collect()
        job = env
    """)
    job = load_job_file(job_file)
    (fn,) = [op.function for v in job.vertices for op in v.operators if op.kind == "map"]
    assert "__funke_job__" not in sys.modules
    assert cloudpickle.loads(fn)(21) == 42


def test_missing_job_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(JobFileError, match="does not exist"):
        load_job_file(tmp_path / "nope.py")


def test_job_file_without_build_or_job_is_rejected(tmp_path: Path) -> None:
    job_file = write(tmp_path / "job.py", "x = 1\n")
    with pytest.raises(JobFileError, match=r"defines neither build\(args\) nor a module-level `job`"):
        load_job_file(job_file)


def test_build_returning_something_else_is_rejected(tmp_path: Path) -> None:
    job_file = write(tmp_path / "job.py", "def build(args):\n    return 42\n")
    with pytest.raises(JobFileError, match=r"build\(args\) is a int, expected a JobGraph or an ExecutionEnvironment"):
        load_job_file(job_file)


def test_an_exception_in_the_job_file_keeps_the_users_traceback(tmp_path: Path) -> None:
    job_file = write(tmp_path / "job.py", """
        def build(args):
            raise KeyError("no such table")
    """)
    with pytest.raises(JobFileError, match=r"build\(args\) raised KeyError") as info:
        load_job_file(job_file)
    assert f'File "{job_file.resolve()}", line 3, in build' in info.value.user_traceback
    assert "runpy" not in info.value.user_traceback


def test_a_dsl_error_while_building_is_reported(tmp_path: Path) -> None:
    job_file = write(tmp_path / "job.py", """
        from funke.common.api.dsl import ExecutionEnvironment
        job = ExecutionEnvironment("no sinks")
    """)
    with pytest.raises(JobFileError, match="has no sinks"):
        load_job_file(job_file)


def test_submit_of_a_broken_job_file_exits_2_with_the_traceback(
        clean_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job_file = write(tmp_path / "job.py", "import no_such_module_anywhere\n")
    assert cli.main(["submit", str(job_file)]) == 2
    err = capsys.readouterr().err
    assert "raised ModuleNotFoundError" in err
    assert "No module named 'no_such_module_anywhere'" in err


# --------------------------------------------------------------------------------------------
# `funke submit` argument handling
# --------------------------------------------------------------------------------------------


def test_our_flags_after_the_job_file_are_ours_and_the_rest_goes_to_the_job() -> None:
    args = cli.build_parser().parse_args(["submit", "wc.py", "--parallelism", "4", "--json", "--detach"])
    jobs.split_submit_args(args, [])
    assert (args.file, args.job_args, args.json, args.detach) == ("wc.py", ["--parallelism", "4"], True, True)


def test_arguments_after_double_dash_all_go_to_the_job(clean_env: Path, tmp_path: Path) -> None:
    job_file = write(tmp_path / "job.py", """
        from pathlib import Path
        def build(args):
            Path(__file__).with_name("args.txt").write_text(" ".join(args))
            raise SystemExit(7)
    """)
    assert cli.main(["submit", str(job_file), "--input", "x", "--", "--json"]) == 7
    assert (tmp_path / "args.txt").read_text() == "--input x --json"


# --------------------------------------------------------------------------------------------
# rendering
# --------------------------------------------------------------------------------------------


def test_status_of_a_failed_job_shows_history_subtasks_and_the_traceback() -> None:
    text = cli.render_job_details(failed_job())
    lines = text.splitlines()
    assert lines[0] == "job f00d  'word count'  FAILED"
    assert "status history: CREATED -> RUNNING -> FAILING -> FAILED  (2.25 s)" in text
    assert f"  {cli.format_time(ts(T0 + 0.5))}  RUNNING  tasks deploying" in lines
    # A multi-line cause is listed by its first line; the failure below has the rest.
    assert f"  {cli.format_time(ts(T0 + 2.0))}  FAILING  ValueError: bad line ..." in lines
    assert "  Source: text -> FlatMap  [source-text]  parallelism 2: 1 FINISHED, 1 FAILED" in lines
    subtask_rows = [line.split() for line in lines if line.startswith("    ") and ("tm-1" in line or "tm-2" in line)]
    assert ["1/2", "FINISHED", "0", "tm-1", "0"] in subtask_rows
    assert ["2/2", "FAILED", "1", "tm-2", "1"] in subtask_rows
    assert ["(was", "CANCELED)", "0", "tm-1", "-"] in subtask_rows
    failure_at = lines.index("failure:")
    assert lines[failure_at + 1] == "  ValueError: bad line"
    assert lines[failure_at + 2] == "    Traceback (most recent call last):"
    assert '      File "/jobs/wc.py", line 12, in words' in lines
    assert "exception history (1):" in lines
    assert f"  {cli.format_time(ts(T0 + 2.0))}  Source: text -> FlatMap (2/2) attempt 1 on tm-2" in lines


def test_status_shows_why_a_job_waits_for_resources() -> None:
    d = job_pb2.JobDetails(job_id="w", name="wide", status=JS.JOB_STATUS_CREATED, created_at=ts(T0),
                           waiting_for_resources="job needs 8 slots but the cluster has 4")
    text = cli.render_job_details(d)
    assert "  waiting for resources: job needs 8 slots but the cluster has 4" in text.splitlines()
    assert "status history: CREATED" in text


def execution_event(vertex: str, subtask: int, attempt: int, to: int) -> jobmanager_pb2.JobEvent:
    change = jobmanager_pb2.ExecutionStateChange(
        attempt=job_pb2.ExecutionAttemptId(vertex_id=vertex, subtask_index=subtask, attempt_number=attempt),
        task_name="Source (x/2)", transition=job_pb2.ExecutionStateTransition(to_state=to, timestamp=ts(T0)))
    return jobmanager_pb2.JobEvent(execution_state=change)


def test_progress_counts_subtask_states_per_vertex_and_ignores_replaced_attempts() -> None:
    snapshot = failed_job()
    snapshot.status = JS.JOB_STATUS_RUNNING
    progress = cli.JobProgress()
    progress.apply(jobmanager_pb2.JobEvent(snapshot=snapshot))
    assert progress.vertex_line("source-text") == "Source: text -> FlatMap  1 FINISHED, 1 FAILED"
    progress.apply(execution_event("source-text", 1, 2, ES.EXECUTION_STATE_RUNNING))
    assert progress.vertex_line("source-text") == "Source: text -> FlatMap  1 RUNNING, 1 FINISHED"
    # A late report about attempt 1, already replaced by attempt 2, changes nothing.
    assert progress.apply(execution_event("source-text", 1, 1, ES.EXECUTION_STATE_CANCELED)) == set()
    assert progress.vertex_line("source-text") == "Source: text -> FlatMap  1 RUNNING, 1 FINISHED"


def test_progress_without_a_terminal_prints_a_line_per_change() -> None:
    snapshot = failed_job()
    snapshot.status = JS.JOB_STATUS_RUNNING
    progress = cli.JobProgress()
    out = io.StringIO()
    view = live.LiveView(progress, out, tty=False)
    view.changed(progress.apply(jobmanager_pb2.JobEvent(snapshot=snapshot)))
    view.changed(progress.apply(execution_event("source-text", 1, 2, ES.EXECUTION_STATE_RUNNING)))
    view.finish()
    assert out.getvalue().splitlines() == [
        "job f00d RUNNING",
        "Source: text -> FlatMap  1 FINISHED, 1 FAILED",
        "Source: text -> FlatMap  1 RUNNING, 1 FINISHED",
    ]
    assert "\x1b[" not in out.getvalue()


def test_progress_on_a_terminal_is_one_live_display_with_a_bar_per_vertex() -> None:
    snapshot = failed_job()
    snapshot.status = JS.JOB_STATUS_RUNNING
    progress = cli.JobProgress()
    out = io.StringIO()
    view = live.LiveView(progress, out, tty=True)
    view.changed(progress.apply(jobmanager_pb2.JobEvent(snapshot=snapshot)))
    view.note(["waiting for resources: 4 slots needed, 2 free"])
    view.changed(progress.apply(execution_event("source-text", 1, 2, ES.EXECUTION_STATE_RUNNING)))
    view.finish()
    text = out.getvalue()
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    # the lasting line is printed once, above the display; the display is redrawn in place
    assert plain.count("waiting for resources: 4 slots needed, 2 free") == 1
    last = plain.split("job f00d RUNNING")[-1]
    assert "Source: text -> FlatMap" in last and "1 RUNNING, 1 FINISHED" in last
    # the bar: half RUNNING (blue), half FINISHED (green), 30 cells in all
    bar = re.search(r"(█+)(█+)", last)
    assert bar is not None and len(bar.group(0)) == 30
    assert "\x1b[34m" + "█" * 15 in text and "\x1b[32m" + "█" * 15 in text


def test_a_streaming_querys_latest_batch_is_in_the_live_display() -> None:
    progress = cli.JobProgress(job_id="q1", status="RUNNING", created_at=time.time())
    event = jobmanager_pb2.JobEvent(sequence=3)
    event.streaming.kind = "QueryProgress"
    event.streaming.info_json = json.dumps({"batchId": 7, "numInputRows": 120, "inputRowsPerSecond": 60.0,
                                            "processedRowsPerSecond": 90.5, "durationMs": {"triggerExecution": 1300}})
    assert progress.apply(event) == {""}
    out = io.StringIO()
    view = live.LiveView(progress, out, tty=True)
    view.changed({""})
    view.finish()
    assert "batch 7, 120 input rows, 60.0 rows/s in, 90.5 rows/s processed, took 1300 ms" in out.getvalue()


def test_outcome_shows_at_most_twenty_collected_rows() -> None:
    d = failed_job()
    d.ClearField("failure")
    d.status = JS.JOB_STATUS_FINISHED
    rows = [{"word": f"w{i}", "count": i} for i in range(25)]
    lines = cli.render_outcome(d, ["word", "count"], rows)
    assert "collected 25 row(s), the first 20 shown; all of them: funke result f00d:" in lines
    assert "  w19   19" in lines and "  w20   20" not in lines


# --------------------------------------------------------------------------------------------
# errors and exit codes
# --------------------------------------------------------------------------------------------


def test_unreachable_jobmanager_exits_2_with_one_clear_line(clean_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    address = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    assert cli.main(["status", "some-job", "--jobmanager", address]) == 2
    assert time.monotonic() - started < 10
    captured = capsys.readouterr()
    assert captured.out == ""
    err_lines = captured.err.strip().splitlines()
    assert len(err_lines) == 1
    assert err_lines[0].startswith(f"funke: cannot reach the JobManager at {address}: ")
    assert err_lines[0].endswith("; start one with `funke cluster start`")


def test_unreachable_jobmanager_from_environment(clean_env: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    address = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv("FUNKE_JOBMANAGER", address)
    assert cli.main(["list"]) == 2
    assert f"cannot reach the JobManager at {address}" in capsys.readouterr().err


def test_client_raises_jobmanager_unavailable_with_the_address() -> None:
    address = f"127.0.0.1:{free_port()}"
    with JobManagerClient(address, timeout=5) as client:
        with pytest.raises(JobManagerUnavailable, match=f"cannot reach the JobManager at {address}"):
            client.list_jobs()
        with pytest.raises(JobManagerUnavailable, match="not serving after 0.3 s"):
            client.wait_until_ready(0.3)


def test_unknown_job_exits_2_with_no_job_message(fake_jobmanager: str, clean_env: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status", "nope", "--jobmanager", fake_jobmanager]) == 2
    assert capsys.readouterr().err.strip() == "funke: no job with id 'nope'"
    with JobManagerClient(fake_jobmanager) as client, pytest.raises(JobNotFound) as info:
        client.get_job("nope")
    assert info.value.code is grpc.StatusCode.NOT_FOUND


def test_invalid_job_graph_lists_every_problem(fake_jobmanager: str, clean_env: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    job_file = write(tmp_path / "job.py", """
        from funke.common.api.dsl import ExecutionEnvironment
        job = ExecutionEnvironment("j")
        job.from_range(2).discard()
    """)
    with JobManagerClient(fake_jobmanager) as client, pytest.raises(InvalidJobGraph) as info:
        client.submit(load_job_file(job_file))
    assert info.value.problems == ("vertex 'a': parallelism must be positive", "edge 'a->b': unknown consumer 'b'")
    assert cli.main(["submit", str(job_file), "--jobmanager", fake_jobmanager]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["funke: the job graph is invalid (2 problem(s)):",
                   "  - vertex 'a': parallelism must be positive",
                   "  - edge 'a->b': unknown consumer 'b'"]


def test_status_command_renders_the_jobmanagers_answer(fake_jobmanager: str, clean_env: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status", "j1", "--jobmanager", fake_jobmanager]) == 0
    assert "ValueError: bad line" in capsys.readouterr().out
    assert cli.main(["status", "j1", "--json", "--jobmanager", fake_jobmanager]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["status"] == "JOB_STATUS_FAILED"
    # Zero values are printed: subtask 0 and attempt 0 are real.
    assert document["vertices"][0]["subtasks"][0]["subtask_index"] == 0


def test_client_decodes_collected_rows(fake_jobmanager: str) -> None:
    with JobManagerClient(fake_jobmanager) as client:
        client.wait_until_ready(5)
        assert client.result("j1") == [{"word": "funke", "count": 3}, {"word": "flink", "count": 2}]


def test_result_and_list_commands(fake_jobmanager: str, clean_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["result", "j1", "--jobmanager", fake_jobmanager]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["word   count", "funke  3", "flink  2", "(2 row(s) from count)"]
    assert cli.main(["result", "j1", "--json", "--jobmanager", fake_jobmanager]) == 0
    assert json.loads(capsys.readouterr().out)["rows"][1] == {"word": "flink", "count": 2}
    assert cli.main(["list", "--jobmanager", fake_jobmanager]) == 0
    listing = capsys.readouterr().out
    assert "j1" in listing and "FINISHED" in listing and "4 FINISHED" in listing


def test_funke_error_keeps_the_grpc_code() -> None:
    error = FunkeError("x", grpc.StatusCode.FAILED_PRECONDITION, "job j is RUNNING")
    assert error.code is grpc.StatusCode.FAILED_PRECONDITION and error.details == "job j is RUNNING"


class RefusingJobManager(jobmanager_pb2_grpc.JobManagerServicer):
    """Answers every call with the status code `code`, as a JobManager that refuses the request
    (or fails at it) does."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def _refuse(self, request, context):
        context.abort(self.code, f"refused: {self.code.name}")

    SubmitJob = ListJobs = GetJob = WatchJob = CancelJob = StopJob = RescaleJob = _refuse
    GetQueryProgress = GetJobResult = GetKeyedState = _refuse


@pytest.fixture
def refusing_jobmanager() -> Iterator[tuple[str, RefusingJobManager]]:
    servicer = RefusingJobManager()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    jobmanager_pb2_grpc.add_JobManagerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        server.stop(grace=None)


# Each job command, and the status codes the JobManager answers its call with (see
# jobmanager/services.py and dispatcher.py) besides UNAVAILABLE: 2 for a refusal (nothing was
# done), 1 for a failure at what was asked. The exit codes are the documented table's
# (docs/getting-started.md, from funke.deploy.cli.exitcodes).
JOB_COMMAND_EXITS = {
    "submit": (["submit", "--detach", "{job_file}"],
               {"INVALID_ARGUMENT": 2, "ALREADY_EXISTS": 2, "RESOURCE_EXHAUSTED": 2, "INTERNAL": 1}),
    "list": (["list"], {"INTERNAL": 1}),
    "status": (["status", "j1"], {"NOT_FOUND": 2, "INTERNAL": 1}),
    "watch": (["watch", "j1"], {"NOT_FOUND": 2, "RESOURCE_EXHAUSTED": 2, "INTERNAL": 1}),
    "cancel": (["cancel", "j1"], {"NOT_FOUND": 2, "INTERNAL": 1}),
    "stop": (["stop", "j1"], {"INVALID_ARGUMENT": 2, "NOT_FOUND": 2, "FAILED_PRECONDITION": 2, "INTERNAL": 1}),
    "rescale": (["rescale", "j1", "-p", "5"], {"INVALID_ARGUMENT": 2, "NOT_FOUND": 2, "FAILED_PRECONDITION": 2,
                                              "RESOURCE_EXHAUSTED": 2, "INTERNAL": 1}),
    "progress": (["progress", "j1"], {"NOT_FOUND": 2, "FAILED_PRECONDITION": 2, "INTERNAL": 1}),
    "result": (["result", "j1"], {"INVALID_ARGUMENT": 2, "NOT_FOUND": 2, "FAILED_PRECONDITION": 2, "DATA_LOSS": 1}),
    "state": (["state", "j1"], {"INVALID_ARGUMENT": 2, "NOT_FOUND": 2, "FAILED_PRECONDITION": 2, "DATA_LOSS": 1}),
}


@pytest.mark.parametrize(("command", "code", "exit_code"), [
    (command, code, exit_code) for command, (_, exits) in JOB_COMMAND_EXITS.items() for code, exit_code in exits.items()])
def test_each_job_command_exits_2_when_the_jobmanager_refuses_and_1_when_it_fails(
        refusing_jobmanager, clean_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        command: str, code: str, exit_code: int) -> None:
    address, servicer = refusing_jobmanager
    servicer.code = getattr(grpc.StatusCode, code)
    job_file = write(tmp_path / "job.py", """
        from funke.common.api.dsl import ExecutionEnvironment
        job = ExecutionEnvironment("j")
        job.from_range(2).discard()
    """)
    argv = [a.format(job_file=job_file) for a in JOB_COMMAND_EXITS[command][0]]
    assert cli.main([*argv, "--jobmanager", address]) == exit_code
    err = capsys.readouterr().err
    assert f"refused: {code}" in err and err.startswith("funke: "), err


def test_the_documented_refusals_are_the_codes_that_exit_2() -> None:
    from funke.deploy.cli import exitcodes

    refused = {c.name for c in grpc.StatusCode if exitcodes.exit_code_of(FunkeError("x", c)) == 2}
    assert refused == {c.name for c in exitcodes.REFUSALS}
    assert {"DATA_LOSS", "INTERNAL", "UNKNOWN", "ABORTED"}.isdisjoint(refused)
    assert exitcodes.exit_code_of(FunkeError("found on this side")) == 1


def test_cluster_commands_exit_2_for_what_they_refuse_before_doing_anything(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = str(tmp_path / "empty")
    refusals = {
        ("cluster", "start", "--workers", "2", "--dir", empty): "--workers is for --spark standalone",
        ("cluster", "start", "--jobmanagers", "2", "--dir", empty): "more than one needs high availability",
        ("cluster", "start", "--ha", "filesystem", "--zookeeper-quorum", "127.0.0.1:2181", "--dir", empty):
            "only used with high availability zookeeper",
        ("cluster", "start", "--host", "0.0.0.0", "--no-spark", "--dir", empty): "--insecure",
        ("cluster", "kill", "tm-1", "--dir", empty): "no running process named tm-1",
        ("cluster", "add-taskmanager", "tm-3", "--dir", empty): "no running cluster recorded",
        ("cluster", "add-jobmanager", "--dir", empty): "runs without high availability",
    }
    for argv, message in refusals.items():
        assert cli.main(list(argv)) == 2, argv
        assert message in capsys.readouterr().err, argv
    assert not (tmp_path / "empty" / "pids").exists() or not list((tmp_path / "empty" / "pids").iterdir())


def test_a_cluster_that_does_not_start_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:  # the JobManager's port, already bound: it cannot serve
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli.main(["cluster", "start", "--taskmanagers", "0", "--no-spark", "--port", str(port),
                         "--timeout", "60", "--dir", str(tmp_path / "c")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("funke: jobmanager exited with code 1 during startup") and f"127.0.0.1:{port}" in err, err
    assert localcluster.read_address(tmp_path / "c") is None


# --------------------------------------------------------------------------------------------
# the local cluster's directory
# --------------------------------------------------------------------------------------------


def test_cluster_stop_on_an_empty_dir_is_a_no_op(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["cluster", "stop", "--dir", str(tmp_path)]) == 0
    assert "no cluster recorded" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


def test_cluster_status_on_an_empty_dir_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["cluster", "status", "--dir", str(tmp_path)]) == 1
    assert f"no cluster recorded in {tmp_path.resolve()}" in capsys.readouterr().out


def test_stop_never_signals_a_recorded_pid_that_is_not_a_funke_process(tmp_path: Path) -> None:
    # A pid file that outlived its process may name a pid reused by something else.
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        (tmp_path / "pids").mkdir()
        (tmp_path / "pids" / "tm-1.pid").write_text(f"{stranger.pid}\n")
        (tmp_path / "jobmanager.address").write_text("127.0.0.1:1")
        outcomes = localcluster.stop(tmp_path, timeout=1)
        assert [(p.name, outcome) for p, outcome in outcomes] == [("tm-1", "not running")]
        assert stranger.poll() is None
        assert not (tmp_path / "pids" / "tm-1.pid").exists()
        assert not (tmp_path / "jobmanager.address").exists()
    finally:
        os.kill(stranger.pid, signal.SIGKILL)
        stranger.wait()


def test_functions_from_modules_beside_the_job_file_travel_by_value(tmp_path):
    """A TaskManager cannot import the job's neighbour modules: their functions must be pickled
    by value, so they unpickle in a process that has never seen the job's directory."""
    import subprocess
    import sys

    from funke.deploy.jobfile import load_job_file

    (tmp_path / "helpers.py").write_text("def double(n):\n    return 2 * n\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "more.py").write_text("def triple(n):\n    return 3 * n\n")
    job_file = tmp_path / "job.py"
    job_file.write_text(
        "from funke.common.api.dsl import ExecutionEnvironment\n"
        "from helpers import double\n"
        "from pkg.more import triple\n"
        "env = ExecutionEnvironment('neighbours')\n"
        "env.from_range(3).map(double, schema='n bigint').map(triple, schema='n bigint').discard()\n"
        "job = env.build()\n"
    )
    job = load_job_file(job_file)
    functions = [op.function for v in job.vertices for op in v.operators if op.function]
    assert len(functions) == 2
    for blob, expected in zip(functions, (42, 63)):
        (tmp_path / "fn.pickle").write_bytes(blob)
        out = subprocess.run(
            [sys.executable, "-c", "import cloudpickle, sys; f = cloudpickle.loads(open(sys.argv[1], 'rb').read()); print(f(21))",
             str(tmp_path / "fn.pickle")],
            capture_output=True, text=True, cwd="/", timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == str(expected)


def test_cluster_start_takes_high_availability_and_refuses_several_jobmanagers_without_it(tmp_path):
    args = cli.build_parser().parse_args(["cluster", "start", "--ha", "filesystem", "--jobmanagers", "2"])
    assert (args.ha, args.jobmanagers) == ("filesystem", 2)
    with pytest.raises(localcluster.ClusterError, match="more than one needs high availability"):
        localcluster.start(localcluster.ClusterSpec(tmp_path / "c", 1, 1, jobmanagers=2))
    with pytest.raises(localcluster.ClusterError, match="expected one of none, filesystem, zookeeper"):
        localcluster.start(localcluster.ClusterSpec(tmp_path / "c", 1, 1, ha="etcd"))
    with pytest.raises(localcluster.ClusterError, match="only used with high availability zookeeper"):
        localcluster.start(localcluster.ClusterSpec(tmp_path / "c", 1, 1, ha="filesystem", zookeeper_quorum="127.0.0.1:2181"))
    with pytest.raises(localcluster.ClusterError, match="zookeeper.quorum: expected host:port"):
        localcluster.start(localcluster.ClusterSpec(tmp_path / "c", 0, 1, ha="zookeeper", zookeeper_quorum="127.0.0.1:99999"))
    assert not (tmp_path / "c" / "pids").exists() or not list((tmp_path / "c" / "pids").iterdir())


def test_an_ha_cluster_directory_names_its_leader_by_the_lease(tmp_path):
    from funke.common.leadership import Contender

    assert localcluster.read_address(tmp_path) is None and localcluster.ha_services(tmp_path) is None
    (tmp_path / localcluster.HA_CONF).write_text(
        f"high-availability.type: filesystem\nhigh-availability.storageDir: {tmp_path / 'ha'}\n")
    services = localcluster.ha_services(tmp_path)
    services.create_dirs()
    assert localcluster.read_address(tmp_path) is None  # no leader yet
    contender = Contender("host:1:2", "127.0.0.1:7001", duration_s=30)
    services.contend(contender)
    assert localcluster.read_address(tmp_path) == "127.0.0.1:7001"
    services.release(contender)
    assert localcluster.read_address(tmp_path) is None  # released: nobody leads


def _progress_record(batch: int, rows: int) -> dict:
    return {"id": "q-1", "runId": "r-2", "batchId": batch, "timestamp": "2026-11-23T10:00:01.000Z",
            "numInputRows": rows, "inputRowsPerSecond": 100.0, "processedRowsPerSecond": 250.5,
            "durationMs": {"latestOffset": 1, "walCommit": 2, "addBatch": 300, "commitOffsets": 4,
                           "triggerExecution": 307},
            "schedulingDelayMs": 5, "totalDelayMs": 312}


def test_streaming_progress_and_listener_events_are_shown_as_a_spark_user_reads_them() -> None:
    table = cli.render_progress([_progress_record(7, 100), _progress_record(8, 40)])
    assert table[0] == "query id q-1  (run r-2)"
    assert table[1].split()[:3] == ["BATCH", "TIMESTAMP", "ROWS"] and "TOTAL DELAY" in table[1]
    assert table[2].split()[:3] == ["7", "2026-11-23T10:00:01.000Z", "100"] and "307" in table[2].split()
    assert cli.render_progress([]) == ["no micro-batch has completed yet"]
    event = jobmanager_pb2.JobEvent(sequence=3, streaming=jobmanager_pb2.StreamingEvent(
        kind="BatchCompleted", batch_id=8, info_json=json.dumps(
            {"schedulingDelayMs": 5, "processingDelayMs": 307, "totalDelayMs": 312})))
    (line,) = cli.render_event(event)
    assert line.endswith("batch 8: BatchCompleted  (scheduling delay 5 ms, processing 307 ms, total 312 ms)")
    progress = jobmanager_pb2.JobEvent(sequence=4, streaming=jobmanager_pb2.StreamingEvent(
        kind="QueryProgress", batch_id=8, info_json=json.dumps(_progress_record(8, 40))))
    (line,) = cli.render_event(progress)
    assert "batch 8, 40 input rows, 100.0 rows/s in, 250.5 rows/s processed, took 307 ms" in line
    details = job_pb2.JobDetails(job_id="j", name="q", latest_progress_json=json.dumps(_progress_record(8, 40)))
    assert "latest micro-batch:\n  batch 8, 40 input rows" in cli.render_job_details(details)


def test_funke_progress_shows_each_receivers_lines_and_rate_and_a_brokers_lag() -> None:
    record = _progress_record(9, 300)
    record["sources"] = [
        {"description": "socket-src", "numInputRows": 300, "inputRowsPerSecond": 150.0, "numBlocks": 12,
         "rateLimitPerReceiver": 80.0,
         "receivers": {"1": {"blocks": 5, "records": 100, "recordsPerSecond": 50.0},
                       "0": {"blocks": 7, "records": 200, "recordsPerSecond": 100.0}}},
        {"description": "redis-src", "numInputRows": 0, "inputRowsPerSecond": 0.0, "lag": {"orders": 17, "returns": 0}},
    ]
    table = cli.render_progress([_progress_record(8, 40), record])
    sources = table[table.index("sources of batch 9:"):]
    assert sources[1] == ("  socket-src: 300 rows, 150.0 rows/s in, 12 blocks, "
                          "backpressure: at most 80.0 lines/s per receiver")
    assert sources[2:4] == ["    receiver 0: 7 blocks, 200 lines, 100.0 lines/s",
                            "    receiver 1: 5 blocks, 100 lines, 50.0 lines/s"]
    assert sources[4] == "  redis-src: 0 rows, 0.0 rows/s in"
    assert sources[5] == "    lag (entries after the batch's end): orders 17, returns 0"
    # a record without sources (an older JobManager's) shows the table alone
    assert not [line for line in cli.render_progress([_progress_record(8, 40)]) if line.startswith("sources")]


def test_funke_progress_shows_what_each_keyed_operators_state_holds() -> None:
    record = _progress_record(9, 300)
    record["stateOperators"] = [{"operatorName": "count", "numRowsTotal": 1500, "numRowsUpdated": 40,
                                 "numRowsRemoved": 2, "allUpdatesTimeMs": 12, "numKeyGroups": 128,
                                 "checkpointBytesWritten": 2048, "stateOnDiskBytes": 3 * 1024 * 1024,
                                 "memoryUsedBytes": 5 * 1024 * 1024, "commitTimeMs": 3}]
    table = cli.render_progress([record])
    assert table[table.index("state after batch 9:") + 1] == (
        "  count: 1500 keys, 40 updated, 2 removed, 2.0 KiB written, 3.0 MiB on disk in 128 key groups, about "
        "5.0 MiB in memory, 12 ms updating and 3 ms committing")
    assert not [line for line in cli.render_progress([_progress_record(8, 40)]) if line.startswith("state")]


def test_funke_progress_shows_each_batchs_event_times_watermark_and_late_rows() -> None:
    from funke.deploy.cli import render

    record = _progress_record(9, 300)
    record["eventTime"] = {"min": "2026-11-27T10:00:00.000Z", "avg": "2026-11-27T10:00:30.000Z",
                           "max": "2026-11-27T10:01:00.000Z", "watermark": "2026-11-27T10:00:50.000Z"}
    record["numLateRows"] = 4
    table = cli.render_progress([record])
    assert ("event time of batch 9: min 2026-11-27T10:00:00.000Z, avg 2026-11-27T10:00:30.000Z, max "
            "2026-11-27T10:01:00.000Z; watermark 2026-11-27T10:00:50.000Z; 4 late rows") in table
    (line,) = render.render_progress_line(record)
    assert "took 307 ms, watermark 2026-11-27T10:00:50.000Z, 4 late rows" in line
    first = {**_progress_record(0, 10), "eventTime": {}, "numLateRows": 0}  # before any watermark
    assert "event time of batch 0: no event times; watermark none yet; 0 late rows" in cli.render_progress([first])
    assert not [line for line in cli.render_progress([_progress_record(8, 40)]) if line.startswith("event time")]


def test_add_jobmanager_wants_a_jobmanager_name_and_a_high_availability_cluster(tmp_path, capsys):
    assert cli.main(["cluster", "add-jobmanager", "tm-1", "--dir", str(tmp_path)]) == 2
    assert "'tm-1' is no JobManager name" in capsys.readouterr().err
    assert cli.main(["cluster", "add-jobmanager", "--dir", str(tmp_path)]) == 2
    assert "runs without high availability: it has one JobManager" in capsys.readouterr().err
    assert localcluster.next_jobmanager_name(tmp_path) == "jobmanager"
