"""A new leader's Dispatcher recovering from the HA stores, in process: stored jobs start again,
an ended job whose clean-up a dead leader cut short is finished (graph removed, result clean,
its data cleaned up, a streaming sink's staging inside its target too) and never run, orphans
in the data directory are swept, and stepping down records the suspension and keeps the job
for the next leader."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import os

import pytest

from funke.common import layout
from funke.common.graph.jobgraph import OperatorSpec
from funke.common.wire.codec import job_graph_to_proto
from funke.common.configuration import ClusterConfiguration
from funke.common.leadership import Contender
from funke.common.states import JobStatus
from funke.runtime.hafilesystem import Fenced, FileSystemHaServices, JobResult
from funke.jobmanager.dispatcher import Dispatcher, DispatcherError
from funke.jobmanager.highavailability import HaContext
from tests.unit.test_jobmaster import noop_job


def test_a_new_leader_recovers_stored_jobs_finishes_cut_short_clean_ups_and_sweeps_orphans(tmp_path):
    data = tmp_path / "data"
    services = FileSystemHaServices(str(tmp_path / "ha"))
    services.create_dirs()
    old = Contender("old:1:1", "127.0.0.1:1", 60)
    services.contend(old, now=0.0)
    out = tmp_path / "out"
    for job_id in ("run-1", "done-1"):
        job = noop_job(job_id)
        if job_id == "done-1":  # a streaming query's Parquet sink: its staging is inside the target
            src, sink = job.vertices
            job = dataclasses.replace(job, vertices=(src, dataclasses.replace(sink, operators=(
                OperatorSpec("noop"), OperatorSpec("sink.parquet", config={"path": str(out)})))))
        services.put_job_graph("old:1:1", 1, job_id, job_graph_to_proto(job).SerializeToString())
    staged = layout.stream_sink_staging_dir(str(out), "done-1", 7, 0, 0)  # a batch not committed
    os.makedirs(staged)
    open(os.path.join(staged, "part-0.parquet"), "w").close()
    (out / "_funke_sink_log").mkdir()
    (out / "_funke_sink_log" / "6").write_text('{"batchId": 6, "files": ["batch-6-0-part-0.parquet"]}')
    (out / "batch-6-0-part-0.parquet").write_text("committed")
    services.put_history("old:1:1", 1, "run-1", [{"from": "CREATED", "to": "RUNNING", "at": 5.0, "epoch": 1,
                                                   "job_manager": "old:1"}])
    services.put_dirty_result("old:1:1", 1, JobResult("done-1", "FINISHED", 9.0, 1))
    for job_id in ("run-1", "done-1", "orphan-1"):
        os.makedirs(data / "jobs" / job_id / "partitions" / "x")
    services.release(old)

    async def scenario() -> None:
        new = Contender("new:2:2", "127.0.0.1:2", 60)
        services.contend(new)
        writer = concurrent.futures.ThreadPoolExecutor(1)
        ha = HaContext(services, "new:2:2", 2, "new:2", writer)
        dispatcher = Dispatcher(ClusterConfiguration(data_dir=str(data)), ha=ha)
        dispatcher.start()
        try:
            assert await dispatcher.recover() == ["run-1"]
            if dispatcher._writes:  # the clean-up write of done-1 may be through already
                await asyncio.wait(list(dispatcher._writes))
            await ha.flush()
            assert services.job_graph_ids() == ["run-1"]
            assert services.results()["done-1"].clean
            # the orphan swept; done-1 cleaned up (no collected rows to keep: nothing of it stays)
            assert sorted(os.listdir(data / "jobs")) == ["run-1"]
            # and its sink's folder holds what a reader needs: the committed file, the manifest
            assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == [
                "_funke_sink_log", "_funke_sink_log/6", "batch-6-0-part-0.parquet"]
            job = dispatcher.job("run-1")
            assert job.status is JobStatus.CREATED  # waiting for TaskManagers under the new leader
            history = [(t.from_status, t.to_status, t.leader_epoch) for t in job.details().status_history]
            assert len(history) == 2 and history[-1][2] == 1  # RUNNING -> SUSPENDED, said for epoch 1
            assert min(s.current.id.attempt_number for v in job.details().vertices for s in v.subtasks) == 1000
            with pytest.raises(DispatcherError, match="already ran and ended FINISHED"):
                await dispatcher.start_job(noop_job("done-1"))
        finally:
            await dispatcher.stop("stepping down")
            writer.shutdown()
        stored = [r for r in services.history("run-1") if "to" in r]
        assert stored[-1]["to"] == "SUSPENDED" and stored[-1]["epoch"] == 2
        assert services.job_graph_ids() == ["run-1"]

    asyncio.run(scenario())


def test_a_job_result_write_is_tried_again_while_the_store_is_unreachable_and_never_by_a_deposed_leader():
    calls: list[tuple] = []

    def flaky(holder, epoch, job_id):  # the store: down for two calls, then back
        calls.append((holder, epoch, job_id))
        if len(calls) <= 2:
            raise ConnectionRefusedError("ZooKeeper is down")
        return "stored"

    async def scenario() -> None:
        writer = concurrent.futures.ThreadPoolExecutor(1)
        leading = [True]
        ha = HaContext(None, "me:1:1", 3, "me:1", writer, leads=lambda: leading[0])
        assert await ha.write_until_done(flaky, "job-1") == "stored"
        assert calls == [("me:1:1", 3, "job-1")] * 3
        calls.clear()
        leading[0] = False  # deposed while the store is down: give up, as fenced
        with pytest.raises(Fenced, match="epoch 3 lost leadership"):
            await ha.write_until_done(flaky, "job-2")
        assert len(calls) == 1
        writer.shutdown()

    asyncio.run(scenario())
