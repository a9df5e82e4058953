"""env.execute() / execute_async() without a cluster: how the executor is found, how a job file
that calls execute() itself is taken by `funke submit`, where a job goes, what a result holds,
the owner watch that stops a mini cluster's processes, and a streaming collect sink read batch
by batch. (Running jobs for real: tests/integration/test_execute.py.)"""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
import textwrap

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from funke.common.api import execution
from funke.common.api.dsl import ExecutionEnvironment
from funke.common.graph.jobgraph import JobGraph
from funke.deploy import execution as ex
from funke.deploy.jobfile import load_job_file
from funke.jobmanager import committer, streamsinks
from funke.common import layout
from funke.runtime import owner
from funke.v1 import job_pb2


def word_env(parallelism: int = 2) -> ExecutionEnvironment:
    env = ExecutionEnvironment("words", parallelism=parallelism)
    env.from_collection([("a",), ("b",)], "word string").key_by("word").count().collect()
    return env


# ---------------------------------------------------------------- finding the executor


def test_the_installed_executor_is_found_through_its_entry_point():
    assert isinstance(execution.current_executor(), ex.Executor)


def test_execute_hands_the_built_graph_to_the_executor_of_the_context():
    seen = []

    class Recorder:
        def execute(self, job, *, wait, **options):
            seen.append((job, wait, options))
            return "done"

    env = word_env()
    with execution.executor_context(Recorder()):
        assert env.execute("renamed", jobmanager="h:1") == "done"
        assert env.execute_async() == "done"
    (job, wait, options), (_, wait_async, _) = seen
    assert isinstance(job, JobGraph) and job.name == "renamed"
    assert (wait, wait_async, options) == (True, False, {"jobmanager": "h:1"})


def test_under_capturing_execute_raises_with_the_graph_past_a_scripts_except_exception():
    env = word_env()
    with execution.capturing(), pytest.raises(execution.JobCaptured) as caught:
        try:
            env.execute()
        except Exception:  # a script's own handler must not swallow it
            pytest.fail("JobCaptured was caught as an Exception")
    assert caught.value.job.name == "words" and caught.value.wait


def test_funke_submit_takes_the_job_of_a_script_that_executes_it_itself(tmp_path):
    script = tmp_path / "alone.py"
    marker = tmp_path / "after-execute"
    script.write_text(textwrap.dedent(f"""
        from funke.common.api.dsl import ExecutionEnvironment
        env = ExecutionEnvironment("run alone", parallelism=3)
        env.from_range(10).map(lambda x: x + 1, schema="id bigint").collect()
        result = env.execute()
        open({str(marker)!r}, "w").write("the rest of the script ran")
    """))
    job = load_job_file(script)
    assert job.name == "run alone" and {v.parallelism for v in job.vertices} == {3}
    assert not marker.exists()  # the script stopped at execute(), as Flink's plan extraction does


def test_funke_submit_takes_execute_async_inside_build_too(tmp_path):
    script = tmp_path / "built.py"
    script.write_text(textwrap.dedent("""
        from funke.common.api.dsl import ExecutionEnvironment
        def build(args):
            env = ExecutionEnvironment("built " + " ".join(args))
            env.from_range(3).collect()
            client = env.execute_async()
            client.cancel()  # never reached under funke submit
    """))
    assert load_job_file(script, ["x"]).name == "built x"


def test_examples_wordcount_still_submits_as_a_job_file():
    job = load_job_file(os.path.join(os.path.dirname(__file__), "..", "..", "examples", "wordcount.py"), [])
    assert job.name == "word count" and ex._collect_sinks(job)


# ---------------------------------------------------------------- where a job goes


def test_an_explicit_address_wins_then_the_environment(monkeypatch, tmp_path):
    monkeypatch.setattr(ex.MiniCluster, "current", classmethod(lambda cls, n=1: pytest.fail("no mini cluster")))
    environ = {"FUNKE_JOBMANAGER": "127.0.0.1:7001", "FUNKE_CLUSTER_DIR": str(tmp_path)}
    with ex.connect("127.0.0.1:7000", environ) as client:
        assert client.address == "127.0.0.1:7000"
    with ex.connect(None, environ) as client:
        assert client.address == "127.0.0.1:7001"


def test_a_cluster_dir_whose_jobmanager_is_gone_falls_back_to_the_mini_cluster(monkeypatch, tmp_path):
    (tmp_path / "pids").mkdir()
    (tmp_path / "pids" / "jobmanager.pid").write_text("999999999\n")  # no such process
    (tmp_path / "jobmanager.address").write_text("127.0.0.1:7002\n")
    started = []

    class FakeMini:
        def client(self):
            return "mini client"

    monkeypatch.setattr(ex.MiniCluster, "current", classmethod(lambda cls, n=1: started.append(n) or FakeMini()))
    assert ex.connect(None, {"FUNKE_CLUSTER_DIR": str(tmp_path)}, slots_needed=3) == "mini client"
    assert started == [3]


def test_a_running_local_cluster_is_used(monkeypatch, tmp_path):
    """The JobManager recorded in the cluster dir is this very process (alive, and taken for a
    JobManager): its address is used and no mini cluster starts."""
    (tmp_path / "pids").mkdir()
    (tmp_path / "pids" / "jobmanager.pid").write_text(f"{os.getpid()}\n")
    (tmp_path / "jobmanager.address").write_text("127.0.0.1:7003\n")
    monkeypatch.setattr(ex.clusterdir, "_is_ours", lambda pid, name: True)
    monkeypatch.setattr(ex.MiniCluster, "current", classmethod(lambda cls, n=1: pytest.fail("no mini cluster")))
    with ex.connect(None, {"FUNKE_CLUSTER_DIR": str(tmp_path)}) as client:
        assert client.address == "127.0.0.1:7003"


def test_the_slots_a_job_needs_are_its_largest_parallelism_per_slot_sharing_group():
    env = ExecutionEnvironment("slots", parallelism=2)
    a = env.from_range(10).set_parallelism(3)
    a.map(lambda x: x, schema="id bigint").set_parallelism(2).collect()
    a.map(lambda x: x, schema="id bigint").set_parallelism(4).slot_sharing_group("other").discard()
    assert ex.required_slots(env.build()) == 3 + 4


# ---------------------------------------------------------------- results


def _details(status: int, failure: job_pb2.Failure | None = None) -> job_pb2.JobDetails:
    d = job_pb2.JobDetails(job_id="j1", name="words", status=status, created_at=Timestamp(seconds=100))
    d.status_history.add(timestamp=Timestamp(seconds=102, nanos=500_000_000), to_status=status)
    v = d.vertices.add(id="count", name="Count", parallelism=2)
    for i, (rin, rout) in enumerate(((5, 2), (7, 3))):
        s = v.subtasks.add(subtask_index=i)
        s.current.io.records_in, s.current.io.records_out, s.current.io.bytes_in = rin, rout, 10
    if failure is not None:
        d.failure.CopyFrom(failure)
    return d


def test_a_result_holds_duration_metrics_and_the_rows_as_rows_arrow_and_pandas():
    table = pa.table({"word": ["a", "b"], "count": [2, 1]})
    result = ex.JobExecutionResult(_details(job_pb2.JOB_STATUS_FINISHED), {"count": table})
    assert (result.status, result.is_successful, result.get_net_runtime()) == ("FINISHED", True, 2500)
    assert result.metrics["count"] == ex.VertexMetrics("count", "Count", 2, 12, 5, 20, 0)
    assert result.to_arrow() is table and result.to_arrow("count") is table
    assert [(r.word, r["count"]) for r in result.collect()] == [("a", 2), ("b", 1)]
    assert result.to_pandas().to_dict("list") == {"word": ["a", "b"], "count": [2, 1]}


def test_a_sink_is_named_by_its_handle_or_id_and_a_wrong_one_is_refused():
    env = ExecutionEnvironment("two", parallelism=1)
    first = env.from_range(3).collect()
    env.from_range(4).collect()
    job = env.build()
    tables = {v: pa.table({"id": [1]}) for v in ex._collect_sinks(job)}
    result = ex.JobExecutionResult(_details(job_pb2.JOB_STATUS_FINISHED), tables)
    assert result.to_arrow(first) is tables[first.vertex_id]
    with pytest.raises(ValueError, match="2 collect\\(\\) sinks"):
        result.to_arrow()
    with pytest.raises(ValueError, match="not a collect\\(\\) sink"):
        result.to_arrow("nope")


def test_a_failed_job_raises_with_its_root_cause_and_traceback():
    failure = job_pb2.Failure(exception_type="ZeroDivisionError", message="division by zero",
                              traceback='Traceback (most recent call last):\n  File "job.py", line 3\n')
    result = ex.JobExecutionResult(_details(job_pb2.JOB_STATUS_FAILED, failure), {})
    error = ex.JobFailed(result)
    assert "FAILED: ZeroDivisionError: division by zero" in str(error) and 'File "job.py", line 3' in str(error)
    assert error.result is result and not result.is_successful


# ---------------------------------------------------------------- the owner watch


def test_an_owner_token_names_a_running_process_and_tells_it_from_a_newcomer():
    pid, start = owner.parse_owner(owner.owner_token(os.getpid()))
    assert pid == os.getpid() and owner.owner_alive(pid, start)
    assert not owner.owner_alive(pid, start + 1)  # same pid, another start: a newcomer
    for bad in ("", "12", "x:1", "0:5", "-3:5", "1:2:3"):
        with pytest.raises(ValueError):
            owner.parse_owner(bad)


def test_the_watch_calls_back_once_its_owner_has_ended():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.6)"])
    token = owner.owner_token(child.pid)
    gone = []

    async def watch():
        await asyncio.wait_for(owner.watch_owner(token, lambda: gone.append(True), poll_s=0.05), 10)

    try:
        asyncio.run(watch())
    finally:
        child.wait()
    assert gone == [True]


def test_the_processes_refuse_a_malformed_owner():
    from funke.jobmanager.main import parse_args
    from funke.taskmanager.main import build_parser

    for parse in (parse_args, build_parser().parse_args):
        with pytest.raises(SystemExit):
            parse(["--owner", "not-a-pid"])


# ---------------------------------------------------------------- a streaming collect sink batch by batch


def test_the_collected_batches_are_read_from_their_manifests_in_order(tmp_path):
    data = str(tmp_path)
    target = layout.collect_dir(data, "job1", "sink")
    for batch, values in ((0, [1, 2]), (1, []), (2, [3])):
        staged = streamsinks.staging_dir(target, "job1", batch, 0, 0)
        os.makedirs(staged)
        if values:
            pq.write_table(pa.table({"n": values}), f"{staged}/part-0.parquet")
        streamsinks.commit_batch(target, "job1", batch, {0: 0})
    stray = streamsinks.staging_dir(target, "job1", 3, 0, 0)  # staged, not committed: not a batch yet
    os.makedirs(stray)
    pq.write_table(pa.table({"n": [99]}), f"{stray}/part-0.parquet")

    def read(from_batch, most):
        out = []
        for batch_id, stream, rows in committer.read_collected_batches(data, "job1", "sink", from_batch, most):
            table = pa.ipc.open_stream(io.BytesIO(stream)).read_all()
            out.append((batch_id, table.column("n").to_pylist() if table.num_columns else [], rows))
        return out

    assert read(0, 100) == [(0, [1, 2], 2), (1, [], 0), (2, [3], 1)]
    assert read(1, 1) == [(1, [], 0)]
    assert read(3, 100) == []
    assert committer.read_collected_batches(data, "no-such-job", "sink", 0, 100) == []


def test_a_killed_owners_mini_cluster_directory_goes_once_its_processes_stopped(monkeypatch, tmp_path):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_token = owner.owner_token(dead.pid)
    dead.wait()
    orphan, owned, foreign = (tmp_path / f"{ex._PREFIX}{n}" for n in ("orphan", "owned", "foreign"))
    for d, token in ((orphan, dead_token), (owned, owner.owner_token(os.getpid())), (foreign, None)):
        d.mkdir()
        if token:
            (d / ex._OWNER_FILE).write_text(token + "\n")
    ex._remove_orphans()
    assert (orphan.exists(), owned.exists(), foreign.exists()) == (False, True, True)


# ---------------------------------------------------------------- tracebacks name the user's file


def test_a_shipped_function_raises_in_a_worker_with_its_file_and_source_lines(tmp_path):
    """In a fresh interpreter without funke on its path (as a worker of a Spark cluster may be),
    the function's traceback names its file and shows its lines, nested functions included."""
    import cloudpickle

    from funke.common.api.dsl import _pickled

    (tmp_path / "userjob.py").write_text("def parse(x):\n    def inner(z):\n        return z // (x - x)\n"
                                         "    return inner(x + 1)\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import userjob

        cloudpickle.register_pickle_by_value(userjob)  # as jobfile does for a job file's modules
        payload = _pickled(userjob.parse, "map")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("userjob", None)
    (tmp_path / "userjob.py").unlink()  # the worker has no such file
    worker = ("import cloudpickle, sys, traceback\nfn = cloudpickle.loads(sys.stdin.buffer.read())\n"
              "print(type(fn).__name__, fn.__name__)\ntry:\n    fn(3)\nexcept Exception:\n    traceback.print_exc()\n")
    site = os.path.dirname(os.path.dirname(cloudpickle.__file__))
    run = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {site!r})\n" + worker],
                         input=payload, capture_output=True, cwd="/", timeout=60)
    out, err = run.stdout.decode(), run.stderr.decode()
    assert out.strip() == "function parse", out + err
    path = tmp_path / "userjob.py"
    assert f'File "{path}", line 4, in parse\n    return inner(x + 1)' in err, err
    assert f'File "{path}", line 3, in inner\n    return z // (x - x)' in err, err
    assert "<dynamic-code>" not in err


USER_FORMS = textwrap.dedent('''\
    import functools

    from funke.common.api.state import KeyedProcessFunction


    class Sessions(KeyedProcessFunction):
        def process(self, key, rows, ctx):
            raise ValueError("class instance")  # frame: process


    class Parser:
        def parse(self, value):
            return check(value)  # frame: parse


    def check(value):
        raise ValueError("a helper")  # frame: check


    def nested_maker():
        def nested(value):
            raise ValueError("nested")  # frame: nested
        return nested


    def fold(a, b, scale=1):
        raise ValueError("fold")  # frame: fold


    lam = lambda value: value // 0  # frame: <lambda>
    ''')

# name -> (how the worker calls the unpickled object, the frames (function names) it must show)
FORM_CALLS = {
    "Sessions()": ("fn.process(1, [], None)", ["process"]),
    "Parser().parse": ("fn(2)", ["parse", "check"]),
    "lam": ("fn(3)", ["<lambda>"]),
    "nested_maker()": ("fn(4)", ["nested"]),
    "functools.partial(fold, scale=2)": ("fn(5, 6)", ["fold"]),
}


@pytest.mark.parametrize("form", list(FORM_CALLS))
def test_every_form_of_user_code_raises_in_a_worker_with_its_file_lines_and_names(tmp_path, form):
    """A class instance, a bound method and the helper it calls, a lambda, a nested function, a
    partial of a fold: every code object carried by value keeps its file and lines, in a worker
    without funke and without the file."""
    import cloudpickle

    from funke.common.api.dsl import _pickled

    (tmp_path / "userforms.py").write_text(USER_FORMS)
    sys.path.insert(0, str(tmp_path))
    try:
        import userforms

        cloudpickle.register_pickle_by_value(userforms)  # as jobfile does for a job file's modules
        payload = _pickled(eval(form, vars(userforms)), "map", need_callable=False)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("userforms", None)
        cloudpickle.unregister_pickle_by_value(userforms)
    (tmp_path / "userforms.py").unlink()  # the worker has no such file
    call, names = FORM_CALLS[form]
    worker = ("import cloudpickle, sys, traceback\nfn = cloudpickle.loads(sys.stdin.buffer.read())\n"
              f"try:\n    {call}\nexcept Exception:\n    traceback.print_exc()\n")
    site = os.path.dirname(os.path.dirname(cloudpickle.__file__))
    run = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {site!r})\n" + worker],
                         input=payload, capture_output=True, cwd="/", timeout=60)
    err = run.stderr.decode()
    path = tmp_path / "userforms.py"
    numbered = {line.split("# frame: ")[1]: (n, line.strip()) for n, line in enumerate(USER_FORMS.splitlines(), 1)
                if "# frame: " in line}
    for name in names:
        line, source = numbered[name]
        assert f'File "{path}", line {line}, in {name}\n    {source}' in err, err
    assert "<dynamic-code>" not in err, err


def test_a_files_lines_travel_once_however_many_of_its_functions_are_shipped(tmp_path):
    import cloudpickle

    from funke.common.api.dsl import _pickled

    body = "".join(f"def f{i}(x):\n    return x + {i}  # {'padding ' * 8}\n\n\n" for i in range(40))
    (tmp_path / "manyfuncs.py").write_text(body + "def all_of(x):\n    return [" +
                                           ", ".join(f"f{i}(x)" for i in range(40)) + "]\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import manyfuncs

        cloudpickle.register_pickle_by_value(manyfuncs)
        extra = {f: len(_pickled(f, "map")) - len(cloudpickle.dumps(f)) for f in (manyfuncs.f0, manyfuncs.all_of)}
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("manyfuncs", None)
        cloudpickle.unregister_pickle_by_value(manyfuncs)
    size = len((tmp_path / "manyfuncs.py").read_bytes())
    one, all_of = extra.values()
    assert size < one < size + 3000  # the lines, and the function that puts them in linecache
    assert all_of < one + 41 * 20, (all_of, one)  # the lines once, not once per function
