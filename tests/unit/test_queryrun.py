"""One run of a streaming query as one sans-IO core (common/scheduling/queryrun.py): every action
names the stimulus that caused it; batches go to the tasks with the rate limits and the released
batches filled in; backpressure is decided in the core and sent as an action; the tasks are told
to finish when the query ends. The last tests carry the core's actions out with a real
checkpoint directory, real source sides and real sink files (the tasks stand in: they stage a
batch's rows the way sink subtasks do): every row exactly once, also across an abandoned run."""

from __future__ import annotations

import os

import pytest

from funke.common.graph.executiongraph import ExecutionAttemptId, SlotId
from funke.common.graph.jobgraph import JobType, JobVertex, OperatorSpec
from funke.common.scheduling import queryrun as qr
from funke.common.streaming import microbatch as mb
from funke.common.streaming.checkpoint import SourceRange
from funke.common.streaming.sources import FilesSource, RateSource
from funke.common.streaming.state import StateMetrics
from funke.jobmanager import streamsinks
from funke.jobmanager.checkpointstore import CheckpointInUse, CheckpointStore
from funke.jobmanager.streaming import FilesPlanner, RatePlanner
from tests.conformance.graphs import ALL_TO_ALL, PIPELINED, connect, execution_graph, job_graph


def _graph(source_parallelism: int = 2, source: str = "src"):
    job = job_graph("q", [
        JobVertex(source, source, source_parallelism, (OperatorSpec("source.rate", config={}),)),
        JobVertex("sink", "sink", 1, (OperatorSpec("sink.discard"),)),
    ], [connect(source, "sink", ALL_TO_ALL, PIPELINED)], JobType.STREAMING)
    graph = execution_graph(job)
    for ejv in graph.vertices.values():
        for ev in ejv.task_vertices:
            ev.current_execution.slot = SlotId(f"tm-{ev.subtask_index % 2}", 0)
    return graph


def _run(trigger=None, **kw) -> qr.QueryRun:
    run = qr.QueryRun(_graph(), trigger or mb.ProcessingTime(1000), ["src"], ["sink"], run_id="run-1", **kw)
    return run


def _started(run: qr.QueryRun, now: int = 500) -> list:
    return run.handle(qr.RunStarted("query-1", 0, (), {}, now, "run-started-1"))


def _of(actions, kind):
    return [a for a in actions if isinstance(a, kind)]


def _batch(run: qr.QueryRun, batch_id: int, now: int, rows: int = 10, per_subtask=(4, 6), sink_state=None,
           seconds: dict[str, float] | None = None) -> list:
    """Plan, log, run and report one batch through every task; the actions of the last report.
    `sink_state`: what the sink's subtask reports of its keyed state; `seconds`: per vertex, how
    long its subtasks say they ran the batch."""
    if "src" in run.receivers:  # a block per receiver and batch; the tasks count the rows
        span = SourceRange({"0": batch_id, "1": batch_id} if batch_id else None, {"0": batch_id + 1, "1": batch_id + 1}, 0)
    else:
        span = SourceRange(batch_id * rows if batch_id else None, (batch_id + 1) * rows, rows)
    answered = run.handle(qr.OffsetsAnswered(batch_id, {"src": span},
                                             now, f"offsets-answered-{batch_id}"))
    assert _of(answered, qr.WriteOffsetLog)
    logged = run.handle(qr.OffsetsLogged(batch_id, now, f"offsets-logged-{batch_id}"))
    (resolve,) = _of(logged, qr.ResolveBatchInput)
    sent = run.handle(qr.BatchInputResolved(batch_id, {}, now, f"input-resolved-{batch_id}"))
    out = list(sent)
    for action in sent:
        for task in action.tasks:
            out += run.handle(qr.BatchWritten(task.attempt, batch_id, {}, per_subtask[task.attempt.subtask_index],
                                               now + 100, f"report-{task.attempt}-{batch_id}",
                                               seconds=(seconds or {}).get("src")))
    for action in list(out):
        if isinstance(action, qr.RunTasks) and action.vertex_id == "sink":
            (task,) = action.tasks
            out += run.handle(qr.BatchWritten(task.attempt, batch_id, {}, None, now + 200, f"report-{task.attempt}-{batch_id}",
                                               sink_state, seconds=(seconds or {}).get("sink")))
    return out


def _record(run: qr.QueryRun, batch_id: int, now: int) -> list:
    out = run.handle(qr.SinksCommitted(batch_id, now, f"sinks-committed-{batch_id}"))
    return out + run.handle(qr.CommitLogged(batch_id, now, f"commit-logged-{batch_id}"))


def test_every_action_names_the_stimulus_that_caused_it():
    run = _run()
    started = _started(run)
    assert started and all(a.stimulus_id == "run-started-1" for a in started)
    ticked = run.handle(qr.Tick(1000, "tick-1000"))
    assert [type(a) for a in ticked] == [qr.SetTimer, qr.QueryOffsets]
    assert all(a.stimulus_id == "tick-1000" for a in ticked)
    answered = run.handle(qr.OffsetsAnswered(0, {"src": SourceRange(None, 10, 10)}, 1010, "offsets-answered-0"))
    assert answered == [qr.WriteOffsetLog(answered[0].entry, stimulus_id="offsets-answered-0")]
    logged = run.handle(qr.OffsetsLogged(0, 1020, "offsets-logged-0"))
    assert {a.stimulus_id for a in logged} == {"offsets-logged-0"}
    sent = run.handle(qr.BatchInputResolved(0, {}, 1030, "input-resolved-0"))
    assert {type(a) for a in sent} == {qr.RunTasks} and {a.stimulus_id for a in sent} == {"input-resolved-0"}
    with pytest.raises(ValueError, match="stimulus_id"):
        run.handle(qr.Tick(2000, ""))


def test_a_batch_goes_to_the_sources_per_taskmanager_then_the_sink_once_both_reported_and_commits():
    run = _run()
    _started(run)
    run.handle(qr.Tick(1000, "tick-1000"))
    out = _batch(run, 0, 1000)
    sources = [a for a in out if isinstance(a, qr.RunTasks) and a.vertex_id == "src"]
    assert sorted(a.task_manager_id for a in sources) == ["tm-0", "tm-1"]
    assert all(a.released == () and a.batch.ranges["src"] == SourceRange(None, 10, 10) for a in sources)
    (sink,) = [a for a in out if isinstance(a, qr.RunTasks) and a.vertex_id == "sink"]
    assert sink.stimulus_id == "report-src[1]#0-0"  # the report that completed the sink's input
    (commit,) = _of(out, qr.CommitSinks)
    assert commit == qr.CommitSinks(0, {"sink": {0: 0}}, "report-sink[0]#0-0")
    kinds = [a.kind for a in _of(out, qr.Publish)]
    assert kinds == ["OutputOperationStarted", "OutputOperationCompleted"]
    recorded = _record(run, 0, 1300)
    (progress,) = [a for a in _of(recorded, qr.Publish) if a.kind == "QueryProgress"]
    assert progress.info["numInputRows"] == 10 and progress.stimulus_id == "commit-logged-0"


def test_a_keyed_operators_state_after_the_batch_is_in_the_batchs_progress_record_and_only_there():
    run = _run()
    _started(run)
    run.handle(qr.Tick(1000, "tick-1000"))
    _batch(run, 0, 1000, sink_state=StateMetrics(7, 3, 0, 512, 2048, 4.4, 4096, 1.6))
    (progress,) = [a for a in _of(_record(run, 0, 1300), qr.Publish) if a.kind == "QueryProgress"]
    assert progress.info["stateOperators"] == [{
        "operatorName": "sink", "numRowsTotal": 7, "numRowsUpdated": 3, "numRowsRemoved": 0, "allUpdatesTimeMs": 4,
        "commitTimeMs": 2, "memoryUsedBytes": 4096, "numKeyGroups": 128, "checkpointBytesWritten": 512,
        "stateOnDiskBytes": 2048}]
    run.handle(qr.Tick(2000, "tick-2000"))
    _batch(run, 1, 2000)
    (progress,) = [a for a in _of(_record(run, 1, 2300), qr.Publish) if a.kind == "QueryProgress"]
    assert "stateOperators" not in progress.info and run.state_reported == {}


def test_a_batchs_progress_record_says_where_its_addbatch_went_vertex_by_vertex():
    run = _run()
    _started(run)
    run.handle(qr.Tick(1000, "tick-1000"))
    # sources sent the batch at 1000, reported at 1100; the sink sent it then, reported at 1200
    _batch(run, 0, 1000, seconds={"src": 0.08, "sink": 0.0625})
    (progress,) = [a for a in _of(_record(run, 0, 1300), qr.Publish) if a.kind == "QueryProgress"]
    assert progress.info["vertexDurationsMs"] == {
        "src": {"dispatchedMs": 0, "taskMs": 80.0, "reportedMs": 100, "overheadMs": 20.0},
        "sink": {"dispatchedMs": 100, "taskMs": 62.5, "reportedMs": 200, "overheadMs": 37.5}}
    assert run.vertex_times == {}  # the record took them
    run.handle(qr.Tick(2000, "tick-2000"))
    _batch(run, 1, 2000)  # tasks that say nothing of their time
    (progress,) = [a for a in _of(_record(run, 1, 2300), qr.Publish) if a.kind == "QueryProgress"]
    assert progress.info["vertexDurationsMs"]["sink"] == {"dispatchedMs": 100, "taskMs": 0.0, "reportedMs": 200,
                                                          "overheadMs": 100.0}


def test_a_batch_through_every_task_is_released_on_each_taskmanager_with_its_next_batch():
    run = _run()
    _started(run)
    run.handle(qr.Tick(1000, "tick-1000"))
    _batch(run, 0, 1000)
    assert run.released == {"tm-0": {0}, "tm-1": {0}} and run.in_flight == []
    _record(run, 0, 1300)
    run.handle(qr.Tick(2000, "tick-2000"))
    out = _batch(run, 1, 2000)
    released = {(a.task_manager_id, a.vertex_id): a.released for a in _of(out, qr.RunTasks)}
    # each TaskManager hears of batch 0 once, with the first of batch 1's tasks it gets
    assert released == {("tm-0", "src"): (0,), ("tm-1", "src"): (0,), ("tm-0", "sink"): ()}
    assert run.released == {"tm-0": {1}, "tm-1": {1}}


def test_reports_before_the_start_of_stale_attempts_or_of_batches_not_in_flight_change_nothing():
    run = _run()
    assert run.handle(qr.BatchWritten(ExecutionAttemptId("src", 0, 0), 0, {}, 1, 10, "report-early")) == []
    _started(run)
    run.handle(qr.Tick(1000, "tick-1000"))
    run.handle(qr.OffsetsAnswered(0, {"src": SourceRange(None, 10, 10)}, 1000, "a"))
    run.handle(qr.OffsetsLogged(0, 1000, "b"))
    run.handle(qr.BatchInputResolved(0, {}, 1000, "c"))
    assert run.handle(qr.BatchWritten(ExecutionAttemptId("src", 0, 5), 0, {}, 1, 1100, "report-stale")) == []
    assert run.handle(qr.BatchWritten(ExecutionAttemptId("src", 0, 0), 9, {}, 1, 1100, "report-other")) == []
    assert run.handle(qr.BatchInputResolved(0, {}, 1100, "resolved-twice")) == []


def test_backpressure_is_decided_in_the_core_sent_to_the_receivers_and_filled_into_the_next_batches():
    run = _run(receivers={"src": 2}, backpressure=True)
    _started(run)
    sent: list = []
    records = []
    for b in range(3):
        run.handle(qr.Tick(1000 * (b + 1), f"tick-{1000 * (b + 1)}"))
        out = _batch(run, b, 1000 * (b + 1), rows=1000, per_subtask=(400, 600))
        if b == 2:
            assert {a.batch.rate_limits["src"] for a in _of(out, qr.RunTasks)} == {run.rate_limits["src"]}
        recorded = _record(run, b, 1000 * (b + 1) + 900)  # processed slower than the records came
        records += [a.info for a in _of(recorded, qr.Publish) if a.kind == "QueryProgress"]
        sent += _of(recorded, qr.SendRateLimits)
    # the first batch only measures; the second's record brings a rate, sent at once per TaskManager
    assert "rateLimitPerReceiver" not in records[1]["sources"][0]
    limit = run.rate_limits["src"]
    assert sorted((a.task_manager_id, a.rates) for a in sent[:2]) == [
        ("tm-0", ((ExecutionAttemptId("src", 0, 0), limit),)), ("tm-1", ((ExecutionAttemptId("src", 1, 0), limit),))]
    assert all(a.stimulus_id == "commit-logged-1" for a in sent[:2])
    assert records[2]["sources"][0]["rateLimitPerReceiver"] == round(limit, 1)
    # what each receiver read is in its batch's record
    assert records[0]["sources"][0]["receivers"] == {"0": {"blocks": 1, "records": 400, "recordsPerSecond": 0.0},
                                                     "1": {"blocks": 1, "records": 600, "recordsPerSecond": 0.0}}
    assert records[1]["numInputRows"] == 1000 and run.received == {}


def test_the_query_ending_tells_every_task_to_finish_per_taskmanager_then_terminates():
    run = _run(mb.Once())
    started = _started(run)
    assert _of(started, qr.QueryOffsets)
    _batch(run, 0, 600)
    out = _record(run, 0, 900)
    finish = _of(out, qr.SendFinish)
    assert sorted((a.task_manager_id, a.attempts) for a in finish) == [
        ("tm-0", (ExecutionAttemptId("sink", 0, 0), ExecutionAttemptId("src", 0, 0))),
        ("tm-1", (ExecutionAttemptId("src", 1, 0),))]
    assert isinstance(out[-1], qr.Terminate) and out[-1].stimulus_id == "commit-logged-0"
    assert run.finished and run.handle(qr.Tick(5000, "tick-5000")) == []


def test_a_stop_is_said_beforehand_and_asked_of_the_core():
    run = _run()
    assert run.stop_outlook(False) is None  # not started
    _started(run)
    run.handle(qr.Tick(1000, "tick-1000"))
    out = _batch(run, 0, 1000)
    assert run.stop_outlook(False).finishing == (0,)
    assert run.handle(qr.StopRequested(False, 1500, "stop")) == []
    out = _record(run, 0, 1600)
    assert [type(a) for a in out][-2:] == [qr.SendFinish, qr.Terminate] and out[-1].reason == "stopped"


def test_a_rescale_s_stop_ends_the_run_without_finishing_its_tasks():
    run = _run()
    _started(run)
    run.handle(qr.Tick(1000, "tick-1000"))
    _batch(run, 0, 1000)
    assert run.handle(qr.StopRequested(False, 1500, "rescale-accepted", keep_tasks=True)) == []
    out = _record(run, 0, 1600)
    assert isinstance(out[-1], qr.Terminate) and out[-1].reason == "stopped" and run.finished
    assert not [a for a in out if isinstance(a, qr.SendFinish)]  # the job is suspended instead


# ------------------------------------------------------------------------------------ with real I/O

JOB = "job-q"  # the job whose sink subtask stages the batches


class Shell:
    """Carries the core's actions out at once, synchronously: real checkpoint, real source sides
    (`planners(checkpoint)`), a one-subtask sink staging each batch's rows and committing with
    the sink protocol. `hold`: batches whose sink task does not finish."""

    def __init__(self, tmp_path, trigger, planners, target, clock, files=None, hold=()):
        self.checkpoint = CheckpointStore(str(tmp_path / "checkpoint"))
        self.planners = planners(self.checkpoint)
        self.target, self.clock, self.files, self.hold = target, clock, files, set(hold)
        source = next(iter(self.planners))
        job = job_graph("q", [JobVertex(source, source, 1, (OperatorSpec("source.rate", config={}),)),
                              JobVertex("sink", "sink", 1, (OperatorSpec("sink.discard"),))],
                        [connect(source, "sink", ALL_TO_ALL, PIPELINED)], JobType.STREAMING)
        graph = execution_graph(job)
        for ev in graph.execution_vertices():
            ev.current_execution.slot = SlotId("tm", 0)
        self.core = qr.QueryRun(graph, trigger, list(self.planners), ["sink"], run_id="r")
        self.published: list = []
        self.ran: list[int] = []
        self.timer: int | None = None
        self.ended = ""

    def now(self) -> int:
        return int(self.clock[0] * 1000)

    def start(self, holder: str) -> None:
        r = self.checkpoint.open(holder)
        self.feed(qr.RunStarted(r.query_id, r.plan.next_batch_id, tuple(r.logged), dict(r.last_ends), self.now(), "start"))

    def feed(self, event) -> None:
        queue = [event]
        while queue:
            for action in self.core.handle(queue.pop(0)):
                queue += self.carry_out(action)

    def carry_out(self, a) -> list:
        now = self.now()
        match a:
            case qr.QueryOffsets():
                return [qr.OffsetsAnswered(a.batch_id, {n: p.plan(a.starts.get(n), now, a.limited, (a.caps or {}).get(n))
                                                        for n, p in self.planners.items()}, now, "answered")]
            case qr.CaptureTargets():
                return [qr.TargetsCaptured({n: p.latest(a.starts.get(n), now) for n, p in self.planners.items()}, now, "t")]
            case qr.WriteOffsetLog(entry=entry):
                self.checkpoint.write_offsets(entry)
                return [qr.OffsetsLogged(entry.batch_id, now, "logged")]
            case qr.ResolveBatchInput(entry=e):
                files = {n: p.batch_files(e.sources[n]) for n, p in self.planners.items() if n in e.sources}
                return [qr.BatchInputResolved(e.batch_id, {n: f for n, f in files.items() if f is not None}, now, "r")]
            case qr.RunTasks(vertex_id="sink"):
                (task,) = a.tasks
                self.ran.append(a.batch.batch_id)
                if a.batch.batch_id in self.hold:
                    return []
                self.stage(a.batch, task.attempt.attempt_number)
                return [qr.BatchWritten(task.attempt, a.batch.batch_id, {}, None, now, "report-sink")]
            case qr.RunTasks():
                return [qr.BatchWritten(t.attempt, a.batch.batch_id, {}, None, now, "report-src") for t in a.tasks]
            case qr.CommitSinks(batch_id=b):
                streamsinks.commit_batch(self.target, JOB, b, {0: self.ran.count(b) - 1})
                return [qr.SinksCommitted(b, now, "committed")]
            case qr.WriteCommitLog(entry=entry):
                self.checkpoint.write_commit(entry)
                return [qr.CommitLogged(entry.batch_id, now, "recorded")]
            case qr.SetTimer(at_ms=at):
                self.timer = at
            case qr.Publish():
                self.published.append(a)
            case qr.Terminate(reason=reason):
                self.ended = reason
        return []

    def stage(self, batch, attempt: int) -> None:
        lines = []
        for name, r in batch.ranges.items():
            if isinstance(self.planners[name], RatePlanner):
                lines += [f"{v}" for v, _ in self.planners[name].source.rows(r, 0)]
            else:
                for f in batch.files[name]:
                    with open(os.path.join(self.files, f)) as fh:
                        lines += fh.read().split()
        staged = streamsinks.staging_dir(self.target, JOB, batch.batch_id, 0, self.ran.count(batch.batch_id) - 1)
        os.makedirs(staged, exist_ok=True)
        with open(os.path.join(staged, "part-0.txt"), "w") as fh:
            fh.write("\n".join(lines) + ("\n" if lines else ""))


def sink_lines(target: str) -> list[str]:
    lines = []
    for b in streamsinks.committed_batches(target):
        for name in streamsinks.committed_files(target, b):
            with open(os.path.join(target, name)) as fh:
                lines += fh.read().split()
    return lines


def test_available_now_over_a_rate_source_commits_every_due_row_once_within_the_limits(tmp_path):
    rate = RateSource(rows_per_second=50, max_rows_per_trigger=40)
    target, clock = str(tmp_path / "out"), [1000.0]
    first = Shell(tmp_path, mb.ProcessingTime(1000), lambda ck: {"rate": RatePlanner(rate)}, target, clock)
    first.start("run 1")
    clock[0] += 1.0
    first.feed(qr.Tick(first.now(), "tick-1"))  # batch 0: the first row, the rate source's base
    first.checkpoint.close()
    clock[0] += 2.0  # 100 more rows due
    shell = Shell(tmp_path, mb.AvailableNow(), lambda ck: {"rate": RatePlanner(rate)}, target, clock)
    shell.start("run 2")
    assert shell.ended.startswith("available-now")
    values = [int(v) for v in sink_lines(target)]
    assert values == list(range(101))
    assert [p.info["numInputRows"] for p in shell.published if p.kind == "QueryProgress"] == [40, 40, 20]
    checkpoint = tmp_path / "checkpoint"
    assert sorted(os.listdir(checkpoint / "offsets")) == sorted(os.listdir(checkpoint / "commits"))


def test_files_dropped_while_the_query_runs_are_each_counted_once(tmp_path):
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    clock = [1.0]
    shell = Shell(tmp_path, mb.ProcessingTime(30), lambda ck: {"words": FilesPlanner(
        "words", str(incoming), FilesSource(max_files_per_trigger=2), ck)}, str(tmp_path / "out"), clock,
        files=str(incoming))
    shell.start("run 1")
    for n in range(7):
        tmp = incoming / f".f{n}.tmp"  # written aside, renamed in: never read half-written
        tmp.write_text(f"w{n}a w{n}b\n")
        if n % 3:  # some triggers find one file, some two, some a file still being written
            tmp.rename(incoming / f"f{n}.txt")
        clock[0] += 0.03
        shell.feed(qr.Tick(shell.now(), f"tick-{shell.now()}"))
        if not n % 3:
            tmp.rename(incoming / f"f{n}.txt")
    for _ in range(4):  # the last files, at most two a trigger
        clock[0] += 0.03
        shell.feed(qr.Tick(shell.now(), f"tick-{shell.now()}"))
    shell.feed(qr.StopRequested(False, shell.now(), "stop"))
    assert shell.ended == "stopped"
    assert sorted(sink_lines(str(tmp_path / "out"))) == sorted(f"w{n}{s}" for n in range(7) for s in "ab")
    assert sorted(shell.checkpoint.seen_files("words")) == [f"f{n}.txt" for n in range(7)]


def test_a_run_abandoned_after_its_log_entry_is_finished_by_the_next_run_exactly_once(tmp_path):
    rate = RateSource(rows_per_second=50)
    target = str(tmp_path / "out")
    clock = [1000.0]
    first = Shell(tmp_path, mb.ProcessingTime(1000), lambda ck: {"rate": RatePlanner(rate)}, target, clock, hold={1})
    first.start("run 1")
    clock[0] += 2.5
    first.feed(qr.Tick(first.now(), "tick-1"))  # batch 0 runs, commits, is recorded
    assert streamsinks.is_committed(target, 0) and not first.core.coordinator.batches
    clock[0] += 1.0
    first.feed(qr.Tick(first.now(), "tick-2"))  # batch 1 is logged, runs, never finishes: the run dies
    assert first.ran == [0, 1]
    with pytest.raises(CheckpointInUse, match="in use by run 1"):  # two runs on one checkpoint are refused
        CheckpointStore(str(tmp_path / "checkpoint")).open("run 2")
    first.checkpoint.close()
    checkpoint = tmp_path / "checkpoint"
    assert sorted(os.listdir(checkpoint / "offsets")) == ["0", "1"] and os.listdir(checkpoint / "commits") == ["0"]
    assert not streamsinks.is_committed(target, 1)
    clock[0] += 1.0  # more rows are due by the second run
    second = Shell(tmp_path, mb.AvailableNow(), lambda ck: {"rate": RatePlanner(rate)}, target, clock)
    second.ran = [1]  # the sink's attempt of batch 1 in this run is its second
    second.start("run 2")
    assert second.ended and second.ran[1] == 1  # the logged batch first, with its logged range
    values = [int(v) for v in sink_lines(target)]
    # every row due from the first batch's time (the rate source's base) to the second run's end
    assert values == list(range(len(values))) and len(values) == rate.due(1_002_500, int(clock[0] * 1000)) == 101
