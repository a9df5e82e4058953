"""A streaming query as the DSL builds it and validation checks it (common/api/dsl.py,
common/graph/streamingjob.py): stream sources, the trigger and checkpoint options, every problem named;
and the JobManager taking it as one."""

from __future__ import annotations

import asyncio

import pytest

from funke.common.streaming import microbatch as mb
from funke.common.wire.codec import job_graph_from_proto, job_graph_to_proto
from funke.common.configuration import ClusterConfiguration
from funke.common.graph.executiongraph import SlotId
from funke.common import ids
from funke.common.api.dsl import ExecutionEnvironment
from funke.common.graph.jobgraph import FailoverStrategyKind, JobConfiguration, JobType
from funke.common.graph.streamingjob import (
    QuerySettings,
    is_streaming_query,
    query_settings,
    sinks,
    stream_sources,
)
from funke.common.graph.validation import JobGraphInvalid, ValidationContext, find_problems, validate
from funke.jobmanager.dispatcher import Dispatcher, DispatcherError


def word_counts(tmp_path, env: ExecutionEnvironment):
    return (env.read_stream.text(str(tmp_path / "incoming"), max_files_per_trigger=5)
            .flat_map(lambda row: [(w,) for w in row.value.split()], schema="word string")
            .key_by("word").per_batch().count()
            .write_csv(str(tmp_path / "counts")))


def test_reading_a_stream_makes_a_streaming_query_with_its_settings(tmp_path):
    env = ExecutionEnvironment("clicks", parallelism=2)
    word_counts(tmp_path, env)
    env.set_trigger("500 ms").set_checkpoint_location(str(tmp_path / "checkpoint"))
    job = env.build()
    assert job.job_type is JobType.STREAMING and is_streaming_query(job)
    (source,) = stream_sources(job)
    assert source.operators[0].kind == "source.stream.text"
    assert source.operators[0].config["max_files_per_trigger"] == 5
    assert [v.operators[-1].kind for v in sinks(job)] == ["sink.csv"]
    assert query_settings(job) == QuerySettings(mb.ProcessingTime(500), str(tmp_path / "checkpoint"))
    assert query_settings(job_graph_from_proto(job_graph_to_proto(job))) == query_settings(job)  # on the wire
    rate = ExecutionEnvironment("rate")
    rate.read_stream.rate(100, max_rows_per_trigger=1000).discard()
    rate.set_trigger(available_now=True)
    assert query_settings(rate.build()).trigger == mb.AvailableNow()
    once = ExecutionEnvironment("once")
    once.read_stream.rate(1).discard()
    assert query_settings(once.set_trigger(once=True).build()).trigger == mb.Once()
    default = ExecutionEnvironment("default trigger")
    default.read_stream.rate(1).discard()
    assert query_settings(default.build()).trigger == mb.ProcessingTime(1000)


def test_the_dsl_refuses_bad_settings_where_they_are_made(tmp_path):
    env = ExecutionEnvironment("bad")
    with pytest.raises(ValueError, match="exactly one of"):
        env.set_trigger("1 s", once=True)
    with pytest.raises(ValueError, match="exactly one of"):
        env.set_trigger()
    with pytest.raises(ValueError):
        env.read_stream.rate(0)
    with pytest.raises(ValueError):
        env.read_stream.text(str(tmp_path), max_files_per_trigger=0)


def test_every_problem_of_a_streaming_query_is_named(tmp_path):
    env = ExecutionEnvironment("mixed")
    stream = env.read_stream.rate(10)
    static = env.from_collection([(1,)], "value bigint")
    stream.select("value").union(static).discard()
    env.set_option("streaming.trigger", "sometimes").set_option("streaming.concurrent-jobs", "0")
    env.set_option("streaming.checkpoint-location", "relative/../checkpoint")
    with pytest.raises(JobGraphInvalid) as info:
        env.build()
    text = str(info.value)
    assert "mixes the stream with a static data set: only a join may" in text  # a union would repeat it
    assert "streaming.trigger: expected one of processing-time, available-now, once" in text
    assert "streaming.checkpoint-location" in text
    batch = ExecutionEnvironment("batch")
    batch.from_range(3).discard()
    batch.set_option("streaming.trigger", "once")
    problems = [p.message for p in find_problems(_unvalidated(batch))]
    assert any("this job reads no stream" in p for p in problems)


def test_foreach_batch_is_a_streaming_querys_sink_seeing_each_whole_batch_in_one_call(tmp_path):
    env = ExecutionEnvironment("per batch", parallelism=3)
    env.read_stream.rate(10).foreach_batch(lambda df, batch_id: None)
    job = env.build()
    (sink,) = sinks(job)
    assert sink.operators[-1].kind == "sink.foreach_batch" and sink.operators[-1].function
    assert sink.parallelism == 1  # one call per batch sees all of it, as Spark's foreachBatch
    wide = ExecutionEnvironment("per batch, per subtask", parallelism=3)
    wide.read_stream.rate(10).foreach_batch(lambda df, batch_id: None).set_parallelism(3)
    assert sinks(wide.build())[0].parallelism == 3
    bounded = ExecutionEnvironment("bounded")
    bounded.from_range(3).foreach_batch(lambda df, batch_id: None)
    problems = [p.message for p in find_problems(_unvalidated(bounded))]
    assert any("a sink of streaming queries (foreach_batch" in p for p in problems), problems
    with pytest.raises(TypeError):
        ExecutionEnvironment("no function").read_stream.rate(1).foreach_batch("not callable")


def _unvalidated(env: ExecutionEnvironment):
    from funke.common.api.translate import translate

    return translate(env.logical_plan())[0]


@pytest.mark.parametrize("options, match", [
    ({"streaming.trigger": "once", "streaming.trigger.interval": "1 s"}, "only applies to the processing-time"),
    ({"streaming.trigger.interval": "soon"}, "streaming.trigger.interval: invalid duration"),
    ({"streaming.trigger.interval": "0 ms"}, "at least 1 ms"),
    ({"streaming.min-batches-to-retain": "-3"}, "expected an integer from 1"),
])
def test_bad_query_options_are_named(options, match):
    env = ExecutionEnvironment("q")
    env.read_stream.rate(5).discard()
    job = _unvalidated(env)
    job = type(job)(job.name, job.vertices, job.data_sets, job.edges, job.job_type,
                    JobConfiguration(options=options))
    with pytest.raises(ValueError, match=match):
        query_settings(job)
    with pytest.raises(JobGraphInvalid, match=match.split(":")[0]):
        validate(job)


def test_the_jobmanager_runs_a_streaming_query_on_long_lived_tasks_restarted_together(tmp_path):
    env = ExecutionEnvironment("rate to nowhere", parallelism=2)
    env.read_stream.rate(10).map(lambda v: v, schema="value bigint").discard()
    message = job_graph_to_proto(env.build())

    async def scenario() -> None:
        dispatcher = Dispatcher(ClusterConfiguration(data_dir=str(tmp_path / "data")))
        dispatcher.start()
        try:
            job_id = await dispatcher.submit(message)
            jm = dispatcher.jobs[job_id]
            assert jm.scheduler.streaming and jm.query is not None
            assert jm.scheduler.failover_strategy is FailoverStrategyKind.FULL  # not the cluster default, region
            assert jm.query.checkpoint_location == str(tmp_path / "data" / "checkpoints" / "rate_to_nowhere")
            ev = next(iter(jm.graph.execution_vertices()))
            assert jm.scheduler.deployments.deployment(ev, SlotId("tm", 0)).streaming
            with pytest.raises(DispatcherError, match="not a streaming query") as info:
                bounded = ExecutionEnvironment("bounded")
                bounded.from_collection([(1,)], "value bigint").discard()
                dispatcher.stop_query(await dispatcher.submit(job_graph_to_proto(bounded.build())), False, 1.0)
            assert info.value.code == "FAILED_PRECONDITION"
        finally:
            await dispatcher.stop()

    asyncio.run(scenario())


def test_a_socket_source_is_a_receiver_in_slots_of_its_own_and_its_settings_are_checked():
    env = ExecutionEnvironment("socket", parallelism=3)
    (env.read_stream.socket_text("localhost", 9999, receivers=2, block_interval="100 ms", max_rate=500)
        .flat_map(lambda line: line.split(), schema="word string").key_by("word").per_batch().count().print())
    job = env.build()
    (receiver,) = stream_sources(job)
    assert receiver.parallelism == 2 and receiver.slot_sharing_group == "receivers"
    assert receiver.operators[0].config == {"host": "localhost", "port": 9999, "block_interval_ms": 100, "max_rate": 500}
    assert [op.kind for op in receiver.operators] == ["source.socket"]  # what follows has the default group
    assert all(v.slot_sharing_group == "default" for v in job.vertices if v is not receiver)
    for bad in (dict(port=0), dict(port=70000), dict(block_interval="1 ms"), dict(receivers=0), dict(max_rate=0)):
        kwargs = {"port": 9999, **bad}
        port = kwargs.pop("port")
        with pytest.raises((ValueError, TypeError)):
            ExecutionEnvironment("bad").read_stream.socket_text("localhost", port, **kwargs)
    hostile = _unvalidated(env)
    op = hostile.vertices[0].operators[0]
    broken = type(op)(op.kind, op.name, {"host": "evil host/../", "port": 99999}, op.function)
    vertex = type(hostile.vertices[0])(hostile.vertices[0].id, hostile.vertices[0].name, 1, (broken,))
    problems = " ".join(p.message for p in find_problems(type(hostile)(hostile.name, (vertex, *hostile.vertices[1:]),
                                                                        hostile.data_sets, hostile.edges,
                                                                        hostile.job_type, hostile.configuration)))
    assert "host name or IP address" in problems and "TCP port" in problems


def test_a_redis_source_and_sink_are_streaming_and_their_settings_are_checked():
    env = ExecutionEnvironment("redis", parallelism=2)
    env.read_stream.redis(["a", "b"], port=7000, starting="earliest", max_entries_per_trigger=10).write_redis("out", port=7000)
    job = env.build()
    (source,) = stream_sources(job)
    assert source.operators[0].config == {"keys": ["a", "b"], "host": "127.0.0.1", "port": 7000, "db": 0,
                                          "starting": "earliest", "max_entries_per_trigger": 10}
    assert [v.operators[-1].kind for v in sinks(job)] == ["sink.redis"]
    with pytest.raises(ValueError):
        ExecutionEnvironment("x").read_stream.redis([])
    with pytest.raises(ValueError):
        ExecutionEnvironment("x").read_stream.redis("a", starting="middle")
    bounded = ExecutionEnvironment("bounded")
    bounded.from_range(3).write_redis("out")
    assert any("write_redis" in p.message for p in find_problems(_unvalidated(bounded)))
    env.set_option("streaming.backpressure.enabled", "maybe")
    with pytest.raises(JobGraphInvalid, match="streaming.backpressure.enabled: expected true or false"):
        env.build()


@pytest.mark.parametrize("where", ["the checkpoint itself", "inside it", "around it", "a file:// URI of it"])
def test_a_sink_may_not_write_into_over_or_around_the_checkpoint_location(tmp_path, where):
    checkpoint = tmp_path / "queries" / "ck"
    target = {"the checkpoint itself": str(checkpoint), "inside it": str(checkpoint / "out"),
              "around it": str(tmp_path / "queries"), "a file:// URI of it": f"file://{checkpoint}/"}[where]
    env = ExecutionEnvironment("into the checkpoint")
    env.read_stream.rate(5).write_parquet(target)
    env.set_checkpoint_location(str(checkpoint))
    context = ValidationContext(data_dir="/srv/funke-data")
    messages = [str(p) for p in find_problems(_unvalidated(env), context)]
    assert len(messages) == 1 and "overlaps the query's checkpoint location" in messages[0], messages
    assert messages[0].startswith("vertex ") and ids.echo(str(checkpoint)) in messages[0]  # as long paths are shown
    with pytest.raises(JobGraphInvalid, match="checkpoint location"):  # the client's own check says so too
        env.build()
    elsewhere = ExecutionEnvironment("beside the checkpoint")
    elsewhere.read_stream.rate(5).write_parquet(str(tmp_path / "queries" / "ck-out"))
    elsewhere.set_checkpoint_location(str(checkpoint))
    assert find_problems(_unvalidated(elsewhere), context) == []


def test_submit_refuses_a_stream_directory_that_does_not_exist_and_a_checkpoint_that_is_a_file(tmp_path):
    data = tmp_path / "data"
    missing, checkpoint = tmp_path / "incoming", tmp_path / "checkpoint"
    checkpoint.write_text("not a directory")
    env = ExecutionEnvironment("missing input")
    env.read_stream.text(str(missing)).write_csv(str(tmp_path / "out"))
    env.set_checkpoint_location(str(checkpoint))
    job = _unvalidated(env)
    job = type(job)(job.name, job.vertices, job.data_sets, job.edges, job.job_type,
                    JobConfiguration(options={**job.configuration.options, "streaming.concurrent-jobs": "0"}))

    async def scenario() -> None:
        dispatcher = Dispatcher(ClusterConfiguration(data_dir=str(data)))
        dispatcher.start()
        try:
            with pytest.raises(DispatcherError) as info:
                await dispatcher.submit(job_graph_to_proto(job))
            assert info.value.code == "INVALID_ARGUMENT"
            text = str(info.value)
            assert text.startswith("job graph has 3 problem(s):"), text  # listed with the graph's own
            assert f"'{missing}' does not exist" in text and "streaming.concurrent-jobs" in text, text
            assert f"the checkpoint location '{checkpoint}' is a file, not a directory" in text, text
            assert not dispatcher.jobs and not (data / "checkpoints").exists() and not (data / "jobs").exists()
            # a location inside a file cannot be made either; a source path that is a file is no directory
            (tmp_path / "a-file").write_text("x")
            inside = ExecutionEnvironment("inside a file")
            inside.read_stream.text(str(tmp_path / "a-file")).write_csv(str(tmp_path / "out2"))
            inside.set_checkpoint_location(str(tmp_path / "a-file" / "ck"))
            with pytest.raises(DispatcherError) as info:
                await dispatcher.submit(job_graph_to_proto(inside.build()))
            text = str(info.value)
            assert f"'{tmp_path / 'a-file'}' is not a directory" in text, text
            assert f"'{tmp_path / 'a-file' / 'ck'}' cannot be made: '{tmp_path / 'a-file'}' is a file" in text, text
            # once the directory is there and the checkpoint has a place, the same query is taken
            missing.mkdir()
            fine = ExecutionEnvironment("missing input")
            fine.read_stream.text(str(missing)).write_csv(str(tmp_path / "out"))
            fine.set_checkpoint_location(str(tmp_path / "checkpoints" / "q"))
            job_id = await dispatcher.submit(job_graph_to_proto(fine.build()))
            assert job_id in dispatcher.jobs
        finally:
            await dispatcher.stop()

    asyncio.run(scenario())


def test_a_streaming_collect_that_committed_no_batch_reads_as_zero_rows_and_gone_rows_stay_an_error(tmp_path):
    import pyarrow as pa

    from funke.jobmanager import committer

    data = str(tmp_path / "data")
    stream, rows = committer.read_collected(data, "job-s", "sink-collect", none_committed=True)
    assert rows == 0 and pa.ipc.open_stream(stream).read_all().num_rows == 0
    with pytest.raises(FileNotFoundError, match="no longer in the data directory"):  # a FINISHED job's, gone
        committer.read_collected(data, "job-s", "sink-collect")


# ------------------------------------------------------------------------------------ the JobMaster's shell


class TaskManagers:
    """Stands in for the TaskManagers' gateways: each task takes its batch and reports it at once
    (5 rows read), or, with `refuse`, does not take it."""

    def __init__(self, refuse: str = ""):
        self.refuse, self.query = refuse, None
        self.requests: list = []
        self.finished: list = []

    def gateway(self, task_manager_id: str):
        return self

    def run_batch(self, request, refused) -> None:
        from funke.common.wire import codec

        self.requests.append(request)
        for task in request.tasks:
            if self.refuse:
                refused(request.job_id, task.attempt, self.refuse)
                continue
            attempt = codec.attempt_from_proto(task.attempt)
            asyncio.get_running_loop().call_soon(self.query.on_batch_report, attempt, request.batch_id, {}, 5)

    def finish_tasks(self, job_id: str, attempts) -> None:
        from funke.common.wire import codec

        self.finished += [codec.attempt_from_proto(a) for a in attempts]


def _query(tmp_path, tms: TaskManagers, trigger: str | None = None, once: bool = False, on_ended=None):
    from funke.common.graph.executiongraph import ExecutionGraph
    from funke.jobmanager.streamquery import StreamingQuery

    env = ExecutionEnvironment("rate to nowhere", parallelism=2)
    env.read_stream.rate(100).map(lambda v: v, schema="value bigint").discard()
    env.set_checkpoint_location(str(tmp_path / "checkpoint"))
    env.set_trigger(trigger) if trigger else env.set_trigger(once=True)
    graph = ExecutionGraph(env.build(), "job-1", now=0.0)
    for ev in graph.execution_vertices():
        ev.current_execution.slot = SlotId(f"tm-{ev.subtask_index}", 0)
    failures, events = [], []
    query = StreamingQuery(graph, data_dir=str(tmp_path / "data"), resource_manager=tms, holder="job-1 here",
                           all_running=lambda: True, on_failure=failures.append, on_event=events.append,
                           on_stop_timeout=lambda why, kept: failures.append(why),
                           **({"on_ended": on_ended} if on_ended is not None else {}))
    tms.query = query
    return query, graph, failures, events


async def _until(condition, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + 20
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.01)


def test_the_shell_runs_a_query_on_the_tasks_and_tells_them_to_finish_when_it_ends(tmp_path):
    from funke.common.states import JobStatus

    tms = TaskManagers()

    async def scenario() -> None:
        query, graph, failures, events = _query(tmp_path, tms)
        query.after_decision(JobStatus.RUNNING)
        assert query.running and query.runs == 1
        await _until(lambda: query.ended, "the query ends")
        assert query.ended.startswith("once") and not query.running and not failures
        assert sorted(map(str, tms.finished)) == sorted(str(ev.current_execution.attempt_id)
                                                        for ev in graph.execution_vertices())
        (record,) = query.progress
        assert record["batchId"] == 0 and record["numInputRows"] == 10 and query.latest_progress is record
        assert query.query_id == record["id"] and len(tms.requests) >= 2
        assert [e.kind for e in events][-2:] == ["BatchCompleted", "QueryProgress"]
        await query.close()
        CheckpointStore(str(tmp_path / "checkpoint")).open("the next holder")  # let go

    from funke.jobmanager.checkpointstore import CheckpointStore

    asyncio.run(scenario())


def test_a_graceful_stop_on_the_shell_says_what_it_does_and_ends_the_query(tmp_path):
    from funke.common.states import JobStatus

    tms = TaskManagers()

    async def scenario() -> None:
        query, graph, failures, events = _query(tmp_path, tms, trigger="1 h")
        text = query.stop(False, 60)  # before a run: the next one stops at once
        assert text.startswith("stopping once the query's tasks run again"), text
        assert query.stop(True, 60) == "a stop is already under way"
        query.after_decision(JobStatus.RUNNING)
        await _until(lambda: query.ended, "the query ends")
        assert query.ended == "stopped" and not failures and len(tms.finished) == len(list(graph.execution_vertices()))
        await query.close()

    asyncio.run(scenario())


def test_a_rescale_s_stop_keeps_the_tasks_and_tells_the_jobmaster_they_were_kept(tmp_path):
    from funke.common.states import JobStatus

    tms = TaskManagers()

    async def scenario() -> None:
        ended = []
        query, graph, failures, events = _query(tmp_path, tms, trigger="1 h",
                                                on_ended=lambda reason, kept: ended.append((reason, kept)))
        query.stop(False, 60, keep_tasks=True)
        assert query.stopping
        query.after_decision(JobStatus.RUNNING)
        await _until(lambda: ended, "the query ends")
        assert ended == [("stopped", True)] and query.ended == "stopped" and not failures
        assert tms.finished == []  # the JobMaster suspends the job instead (`rescale.SuspendJob`)
        await query.close()

    asyncio.run(scenario())


def test_a_task_refusing_a_batch_fails_the_run_with_why_and_lets_go_of_the_checkpoint(tmp_path):
    from funke.common.states import JobStatus
    from funke.jobmanager.checkpointstore import CheckpointInUse, CheckpointStore

    tms = TaskManagers(refuse="it is not RUNNING here")

    async def scenario() -> None:
        query, graph, failures, events = _query(tmp_path, tms)
        query.after_decision(JobStatus.RUNNING)
        await _until(lambda: failures, "the run fails")
        (failure,) = failures
        assert failure.exception_type == "BatchNotRun" and "did not take batch 0: it is not RUNNING here" in failure.message
        assert not query.running and not query.ended
        await query.close()
        held = CheckpointStore(str(tmp_path / "checkpoint"))  # let go: another holder takes it
        held.open("someone else")
        other, _, other_failures, _ = _query(tmp_path, TaskManagers())
        other.after_decision(JobStatus.RUNNING)  # two runs on one checkpoint: the second fails
        await _until(lambda: other_failures, "the second run fails")
        assert other_failures[0].exception_type == CheckpointInUse.__name__
        assert "in use by someone else" in other_failures[0].message
        held.close()
        await other.close()

    asyncio.run(scenario())
