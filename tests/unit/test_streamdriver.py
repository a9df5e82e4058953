"""The JobMaster's streaming driver (jobmanager/streamdriver.py) on a real event loop, a real
checkpoint directory and real sink files. Batches are run by a runner that stands in for the
TaskManagers (they do not run micro-batches yet): it reads exactly a batch's ranges — the rate
source's rows, a file source's files from the seen-files log — and stages the sink output the
way sink subtasks will, committed by the real sink protocol. A run abandoned between the
write-ahead log entry and the commit is recovered by the next run: every row exactly once."""

from __future__ import annotations

import asyncio
import os

import pytest

from funke.common.streaming import microbatch as mb
from funke.common.streaming.checkpoint import OffsetEntry
from funke.common.streaming.sources import FilesSource, RateSource
from funke.jobmanager import streamsinks
from funke.jobmanager.checkpointstore import CheckpointInUse, CheckpointStore
from funke.common.scheduling.batchflow import SinkStarted, SinkWritten
from funke.jobmanager.streamdriver import StreamDriver
from funke.jobmanager.streaming import FilesPlanner, RatePlanner


class StagingRunner:
    """Runs a batch like a one-subtask sink would: the rows of the batch's ranges into the sink's
    staging directory; commits with the sink protocol. `hold` keeps a batch from finishing."""

    def __init__(self, target: str, rate: RateSource | None = None, files: tuple[str, str, CheckpointStore] | None = None):
        self.target, self.rate, self.files = target, rate, files
        self.hold: asyncio.Event | None = None
        self.ran: list[int] = []

    async def run(self, entry: OffsetEntry, output) -> None:
        output(SinkStarted(entry.batch_id, "sink"))
        self.ran.append(entry.batch_id)
        if self.hold is not None:
            await self.hold.wait()
        lines = []
        for name, r in entry.sources.items():
            if name == "rate":
                lines += [f"{v}" for v, _ in self.rate.rows(r, 0)]
            else:
                directory, source, checkpoint = self.files
                for f in FilesSource.files(r, checkpoint.seen_files(source)):
                    with open(os.path.join(directory, f)) as fh:
                        lines += fh.read().split()
        attempt = len([b for b in self.ran if b == entry.batch_id]) - 1
        staged = streamsinks.staging_dir(self.target, entry.batch_id, 0, attempt)
        os.makedirs(staged, exist_ok=True)
        with open(os.path.join(staged, "part-0.txt"), "w") as fh:
            fh.write("\n".join(lines) + ("\n" if lines else ""))
        output(SinkWritten(entry.batch_id, "sink"))

    async def commit(self, batch_id: int) -> None:
        attempt = len([b for b in self.ran if b == batch_id]) - 1
        await asyncio.to_thread(streamsinks.commit_batch, self.target, batch_id, {0: attempt})

    async def settle(self) -> None:
        return None


def sink_lines(target: str) -> list[str]:
    lines = []
    for b in streamsinks.committed_batches(target):
        for name in streamsinks.committed_files(target, b):
            with open(os.path.join(target, name)) as fh:
                lines += fh.read().split()
    return lines


def driver(tmp_path, runner, trigger, planners, events=None, clock=None) -> StreamDriver:
    kw = {"clock": clock} if clock else {}
    return StreamDriver("test query", trigger, CheckpointStore(str(tmp_path / "checkpoint")), planners, ["sink"],
                        runner, publish=(events.append if events is not None else (lambda e: None)), **kw)


def test_available_now_over_a_rate_source_commits_every_due_row_once(tmp_path):
    rate = RateSource(rows_per_second=100, max_rows_per_trigger=40)
    target = str(tmp_path / "out")
    events: list[mb.Publish] = []

    async def scenario() -> str:
        d = driver(tmp_path, StagingRunner(target, rate=rate), mb.AvailableNow(), {"rate": RatePlanner(rate)}, events)
        await d.start("run 1")
        reason = await asyncio.wait_for(d.done, 30)
        await d.close()
        return reason

    assert asyncio.run(scenario()).startswith("available-now")
    values = [int(v) for v in sink_lines(target)]
    assert values == list(range(len(values))) and len(values) >= 1
    assert all(p.info["numInputRows"] <= 40 for p in events if p.kind == "QueryProgress")
    checkpoint = tmp_path / "checkpoint"
    assert sorted(os.listdir(checkpoint / "offsets")) == sorted(os.listdir(checkpoint / "commits"))


def test_files_dropped_while_the_query_runs_are_each_counted_once(tmp_path):
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    target = str(tmp_path / "out")
    store = CheckpointStore(str(tmp_path / "checkpoint"))
    files = FilesSource(max_files_per_trigger=2)

    async def scenario() -> None:
        runner = StagingRunner(target, files=(str(incoming), "words", store))
        d = StreamDriver("words", mb.ProcessingTime(30), store, {"words": FilesPlanner("words", str(incoming), files, store)},
                         ["sink"], runner)
        await d.start("run 1")
        for n in range(7):
            tmp = incoming / f".f{n}.tmp"  # written aside, renamed in: never read half-written
            tmp.write_text(f"w{n}a w{n}b\n")
            tmp.rename(incoming / f"f{n}.txt")
            await asyncio.sleep(0.02)
        deadline = asyncio.get_running_loop().time() + 20
        while len(sink_lines(target)) < 14 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        d.stop()
        assert await asyncio.wait_for(d.done, 20) == "stopped"
        await d.close()

    asyncio.run(scenario())
    assert sorted(sink_lines(target)) == sorted(f"w{n}{s}" for n in range(7) for s in "ab")
    assert store.seen_files("words") == [f"f{n}.txt" for n in range(7)]


def test_a_run_abandoned_after_its_log_entry_is_finished_by_the_next_run_exactly_once(tmp_path):
    rate = RateSource(rows_per_second=50)
    target = str(tmp_path / "out")
    clock = [1000.0]

    async def first_run() -> None:
        runner = StagingRunner(target, rate=rate)
        d = driver(tmp_path, runner, mb.ProcessingTime(1000), {"rate": RatePlanner(rate)}, clock=lambda: clock[0])
        await d.start("run 1")
        clock[0] += 2.5
        d._handle(mb.Tick(int(clock[0] * 1000)))  # batch 0
        deadline = asyncio.get_running_loop().time() + 10
        while not streamsinks.is_committed(target, 0):
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        while d.coordinator.batches:  # batch 0's commit log entry
            await asyncio.sleep(0.01)
        runner.hold = asyncio.Event()  # batch 1 is logged, runs, never finishes: the run dies
        clock[0] += 1.0
        d._handle(mb.Tick(int(clock[0] * 1000)))
        while 1 not in runner.ran:
            await asyncio.sleep(0.01)
        await d.close()

    async def second_run() -> StagingRunner:
        runner = StagingRunner(target, rate=rate)
        d = driver(tmp_path, runner, mb.AvailableNow(), {"rate": RatePlanner(rate)}, clock=lambda: clock[0])
        await d.start("run 2")
        assert await asyncio.wait_for(d.done, 20)
        await d.close()
        return runner

    asyncio.run(first_run())
    checkpoint = tmp_path / "checkpoint"
    assert sorted(os.listdir(checkpoint / "offsets")) == ["0", "1"] and os.listdir(checkpoint / "commits") == ["0"]
    assert not streamsinks.is_committed(target, 1)
    clock[0] += 1.0  # more rows are due by the second run
    runner = asyncio.run(second_run())
    assert runner.ran[0] == 1  # the logged batch first, with its logged range
    values = [int(v) for v in sink_lines(target)]
    # every row due from the first batch's time (the rate source's base) to the second run's end
    assert values == list(range(len(values))) and len(values) == rate.due(1_002_500, int(clock[0] * 1000)) == 101


def test_two_runs_on_one_checkpoint_are_refused(tmp_path):
    rate = RateSource(rows_per_second=10)

    async def scenario() -> None:
        a = driver(tmp_path, StagingRunner(str(tmp_path / "a"), rate=rate), mb.ProcessingTime(1000), {"rate": RatePlanner(rate)})
        b = driver(tmp_path, StagingRunner(str(tmp_path / "b"), rate=rate), mb.ProcessingTime(1000), {"rate": RatePlanner(rate)})
        await a.start("run 1 of job clicks")
        with pytest.raises(CheckpointInUse, match="in use by run 1 of job clicks"):
            await b.start("run 2 of job clicks")
        await a.close()

    asyncio.run(scenario())


def test_a_failing_step_fails_the_run_with_its_error(tmp_path):
    class Broken(StagingRunner):
        async def commit(self, batch_id: int) -> None:
            raise OSError("the sink's file system is gone")

    rate = RateSource(rows_per_second=100)

    async def scenario() -> None:
        d = driver(tmp_path, Broken(str(tmp_path / "out"), rate=rate), mb.Once(), {"rate": RatePlanner(rate)})
        await d.start("run 1")
        with pytest.raises(OSError, match="file system is gone"):
            await asyncio.wait_for(d.done, 20)
        await d.close()

    asyncio.run(scenario())
