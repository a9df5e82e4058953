"""The TaskManager's core, driven by events: every decision checked by the instructions it
returns, with no threads, sockets or sleeps. `validate_state()` runs after every event."""

from __future__ import annotations

from dataclasses import replace

import pytest

from funke.common.task import taskexecutorstate as core
from funke.common.graph.deployment import (
    Available,
    Awaiting,
    BatchGate,
    BatchTask,
    InputGateDeployment,
    PartitionRef,
    PartitionUpdate,
    ProducedPartition,
    ResultPartitionSpec,
    TaskDeployment,
)
from funke.common.graph.executiongraph import ExecutionAttemptId, FailureInfo, SlotId
from funke.common.graph.jobgraph import JobVertex, OperatorSpec, PartitionerKind, ResultPartitionType
from funke.common.states import ExecutionState
from funke.common.streaming.sources import BatchInput
from funke.common.task.taskexecutorstate import TaskExecutorState, TaskKey

E = ExecutionState
JOB = "job1"
NOOP_SOURCE = (OperatorSpec("source.noop"),)
NOOP_SINK = (OperatorSpec("noop"), OperatorSpec("sink.noop"))
SPARK_SINK = (OperatorSpec("sink.collect"),)
SCHEMA = '{"type":"struct","fields":[]}'


def deployment(vertex: str = "c", subtask: int = 0, attempt: int = 0, *, slot: int = 0, ops=NOOP_SINK,
               inputs=(), outputs=(), job: str = JOB, parallelism: int = 1, data_dir: str = "/data") -> TaskDeployment:
    return TaskDeployment(
        job_id=job, job_name="test", attempt=ExecutionAttemptId(vertex, subtask, attempt),
        task_name=f"{vertex} ({subtask + 1}/{parallelism})", parallelism=parallelism, slot=SlotId("tm-1", slot),
        vertex=JobVertex(vertex, vertex, parallelism, tuple(ops)), inputs=tuple(inputs), outputs=tuple(outputs),
        data_dir=data_dir)


def gate(partitions: range, *, uniform=None, producers=None, data_set: str = "ds", subpartition=None,
         index: int = 0) -> InputGateDeployment:
    if uniform is None and producers is None:
        uniform = Awaiting(0)
    return InputGateDeployment(index, data_set, partitions, subpartition, uniform,
                               tuple(producers) if producers is not None else None, SCHEMA)


def output(index: int = 0, data_set: str = "out") -> ResultPartitionSpec:
    return ResultPartitionSpec(data_set, index, 1, PartitionerKind.REBALANCE, (), ResultPartitionType.BLOCKING)


class Core:
    """The core under test, checking its books after every event."""

    def __init__(self, slots: int = 4, spark: bool = True):
        self.state = TaskExecutorState("tm-1", slots, spark=spark, data_dir="/data")
        self.instructions: list = []
        self.registration = "reg-1"
        self(core.JobManagerRegistered(self.registration, "/data"))

    def __call__(self, event) -> list:
        out = self.state.handle(event)
        self.state.validate_state()
        self.instructions.extend(out)
        return out

    def submit(self, d: TaskDeployment) -> list:
        return self(core.SubmitTask(d, self.registration))

    def update(self, *updates: tuple[int, int], data_set: str = "ds", job: str = JOB) -> list:
        return self(core.PartitionsAvailable(job, tuple(PartitionUpdate(data_set, i, a, SCHEMA) for i, a in updates),
                                             self.registration))

    def cancel(self, d: TaskDeployment) -> list:
        return self(core.CancelTask(d.job_id, d.attempt, self.registration))

    def report(self, d: TaskDeployment, state: E, failure: FailureInfo | None = None, produced=()) -> list:
        return self(core.TaskReported(key(d), state, failure, tuple(produced)))


def key(d: TaskDeployment) -> TaskKey:
    return TaskKey(d.job_id, d.attempt)


def reports(instructions: list, d: TaskDeployment | None = None) -> list[E]:
    """The states reported (for one task, if given), in order."""
    return [i.report.state for i in instructions if isinstance(i, core.SendReport)
            and (d is None or i.report.attempt == d.attempt)]


def of(instructions: list, kind: type) -> list:
    return [i for i in instructions if isinstance(i, kind)]


# ---------------------------------------------------------------------------------- deployment


def test_a_spark_task_is_accepted_started_and_given_its_inputs_when_it_needs_none():
    c = Core()
    d = deployment(ops=(OperatorSpec("source.range", config={"end": 3}), OperatorSpec("sink.discard")))
    out = c.submit(d)
    assert [type(i) for i in out] == [core.TaskAccepted, core.StartTask, core.InputsReady]
    assert of(out, core.InputsReady)[0].gates == ()
    assert c.state.slot_report()[0].running == (d.attempt,)


@pytest.mark.parametrize("change, reason", [
    (lambda d: replace(d, slot=SlotId("tm-1", 9)), "slot index 9 is out of range"),
    (lambda d: replace(d, job_id=".."), "job id '..' may only contain"),
    (lambda d: replace(d, attempt=ExecutionAttemptId("../x", 0, 0)), "vertex id '../x' may only contain"),
    (lambda d: replace(d, inputs=(gate(range(1), data_set="a/b"),)), "data set id 'a/b'"),
    (lambda d: replace(d, attempt=ExecutionAttemptId("c", 0, -1)), "negative"),
])
def test_a_deployment_that_cannot_run_here_is_rejected_with_the_reason(change, reason):
    c = Core()
    d = change(deployment())
    out = c.submit(d)
    assert [type(i) for i in out] == [core.TaskRejected] and reason in out[0].reason
    assert c.state.tasks == {}



def test_an_id_found_valid_in_one_role_is_still_checked_against_the_limits_of_another():
    c = Core()
    long_id = "v" * 100  # a valid vertex id, too long for a job id
    assert isinstance(c.submit(deployment(vertex=long_id))[0], core.TaskAccepted)
    out = c.submit(deployment(job=long_id, slot=1))
    assert [type(i) for i in out] == [core.TaskRejected] and "longer than 64" in out[0].reason

def test_a_slot_held_by_another_job_a_duplicate_and_another_registration_are_rejected():
    c = Core()
    c.submit(deployment(job="job-a", inputs=[gate(range(1), data_set="ds")]))
    out = c.submit(deployment(job="job-b"))
    assert "slot 0 is held by job job-a" in out[0].reason
    out = c.submit(deployment(job="job-a", inputs=[gate(range(1))]))
    assert "already deployed" in out[0].reason
    out = c(core.SubmitTask(deployment(vertex="late", slot=1), "reg-0"))
    assert "lost the JobManager since it was sent" in out[0].reason and "reg-0" in out[0].reason


def test_without_spark_only_noop_chains_are_accepted():
    c = Core(spark=False)
    out = c.submit(deployment(ops=SPARK_SINK, inputs=[gate(range(1))]))
    assert "runs without Spark" in out[0].reason and "sink.collect" in out[0].reason
    assert isinstance(c.submit(deployment(vertex="n"))[0], core.TaskAccepted)


# ---------------------------------------------------------------------------------- no-op chains


def test_a_noop_chain_without_inputs_runs_to_finished_within_its_submission():
    c = Core()
    d = deployment("src", ops=NOOP_SOURCE, outputs=[output(0)])
    out = c.submit(d)
    assert reports(out) == [E.INITIALIZING, E.RUNNING, E.FINISHED]
    assert not of(out, core.StartTask)  # no thread
    [finished] = [i.report for i in of(out, core.SendReport) if i.report.state is E.FINISHED]
    assert [(p.data_set_id, p.partition_index, p.schema) for p in finished.produced] == [("out", 0, "")]
    assert c.state.slot_report()[0].running == ()  # it left its slot; the slot stays the job's
    assert c.state.slot_report()[0].job_id == JOB


def test_a_consumer_waits_for_its_input_and_an_update_for_another_data_set_changes_nothing():
    c = Core()
    d = deployment(inputs=[gate(range(1), data_set="words")])
    assert reports(c.submit(d)) == [E.INITIALIZING, E.RUNNING]
    assert c.update((0, 0), data_set="other") == []
    assert reports(c.update((0, 0), data_set="words")) == [E.FINISHED]


def test_one_update_completes_the_gate_every_consumer_shares():
    c = Core(slots=1)
    p, n = 500, 300  # ALL_TO_ALL: every consumer reads all p partitions, its own subpartition
    consumers = [deployment("c", i, parallelism=n, inputs=[gate(range(p), subpartition=i)]) for i in range(n)]
    for d in consumers:
        c.submit(d)
    assert c.update(*[(k, 0) for k in range(p - 1)]) == []  # p - 1 partitions: nobody moves
    out = c.update((p - 1, 0))
    assert reports(out) == [E.FINISHED] * n


def test_an_update_recorded_before_the_deployment_counts():
    c = Core()
    c.update((0, 0), (1, 0))
    assert reports(c.submit(deployment(inputs=[gate(range(2))]))) == [E.INITIALIZING, E.RUNNING, E.FINISHED]
    # producers listed per partition, one not finished yet when deployed, its update already here
    c.update((3, 0))
    out = c.submit(deployment("c2", slot=1, inputs=[gate(range(2, 4), producers=[Available(0), Awaiting(0)])]))
    assert reports(out) == [E.INITIALIZING, E.RUNNING, E.FINISHED]


def test_news_of_an_older_producer_attempt_does_not_complete_a_later_consumer():
    c = Core()
    c.update((0, 0))
    # the producer runs again here (attempt 1): partition 0 of attempt 0 is stale from now on
    c.submit(deployment("p", 0, attempt=1, slot=1, ops=NOOP_SOURCE, outputs=[output(0, "ds")]))
    waiting = deployment(inputs=[gate(range(1), uniform=Awaiting(1))])
    assert reports(c.submit(waiting)) == [E.INITIALIZING, E.RUNNING]
    assert c.update((0, 0)) == []  # late news of the old attempt
    assert reports(c.update((0, 1))) == [E.FINISHED]


def test_a_gate_awaiting_a_newer_attempt_forgets_the_older_one_remembered():
    c = Core()
    c.update((0, 0), (1, 0))
    out = c.submit(deployment(inputs=[gate(range(2), uniform=Awaiting(1))]))
    assert reports(out) == [E.INITIALIZING, E.RUNNING]
    assert c.update((0, 1)) == []
    assert reports(c.update((1, 1))) == [E.FINISHED]


def test_a_spark_consumer_is_given_the_newest_attempt_of_each_partition():
    c = Core()
    c.update((0, 1))
    c.update((0, 0))  # late news of an older attempt: ignored
    d = deployment(ops=SPARK_SINK, inputs=[gate(range(3), producers=[Awaiting(1), Available(2), Awaiting(0)])])
    assert not of(c.submit(d), core.InputsReady)  # partition 2 is not there yet
    [ready] = of(c.update((2, 0)), core.InputsReady)
    assert ready.gates[0].attempts == (1, 2, 0) and ready.gates[0].schema == SCHEMA


def test_a_released_partition_makes_later_consumers_wait_again():
    c = Core()
    c.update((0, 0))
    c(core.ReleasePartitions(JOB, (PartitionRef("ds", 0, 0),), False, c.registration))
    out = c.submit(deployment(inputs=[gate(range(1))]))
    assert reports(out) == [E.INITIALIZING, E.RUNNING]
    assert reports(c.update((0, 1))) == [E.FINISHED]


# ---------------------------------------------------------------------------------- stopping


def test_cancelling_a_waiting_noop_task_ends_it_at_once_and_its_gate_never_calls_back():
    c = Core(slots=2)
    cancelled = deployment("c", 0, parallelism=2, inputs=[gate(range(1))])
    sharing = deployment("c", 1, parallelism=2, slot=1, inputs=[gate(range(1))])
    c.submit(cancelled)
    c.submit(sharing)
    out = c.cancel(cancelled)
    assert reports(out) == [E.CANCELED] and out[0].report.failure is None
    out = c.update((0, 0))
    assert reports(out, cancelled) == [] and reports(out, sharing) == [E.FINISHED]


def test_a_cancelled_spark_task_is_interrupted_and_whatever_it_reports_ends_canceled():
    for outcome in (E.FINISHED, E.FAILED, E.CANCELED):
        c = Core()
        d = deployment(ops=SPARK_SINK)
        c.submit(d)
        c.report(d, E.INITIALIZING)
        assert [type(i) for i in c.cancel(d)] == [core.InterruptTask]
        assert c.state.tasks[key(d)].state is E.CANCELING
        assert c.report(d, E.RUNNING) == []  # progress after the cancel is not reported
        out = c.report(d, outcome, FailureInfo("X", "y") if outcome is E.FAILED else None)
        [report] = [i.report for i in of(out, core.SendReport)]
        assert report.state is E.CANCELED and report.failure is None and report.produced == ()


def test_a_cancel_that_overtakes_the_deployment_rejects_it():
    c = Core()
    late = deployment(inputs=[gate(range(1))])
    assert c.cancel(late) == []
    out = c.submit(late)
    assert "cancelled before it was deployed" in out[0].reason
    assert isinstance(c.submit(late)[0], core.TaskAccepted)  # remembered once, not for ever


def test_freeing_a_slot_stops_its_tasks_and_forgets_the_job_once_it_holds_no_slot():
    c = Core(slots=2)
    a = deployment("a", ops=SPARK_SINK, inputs=[gate(range(1))])
    b = deployment("b", slot=1, inputs=[gate(range(1))])
    c.submit(a)
    c.submit(b)
    out = c(core.FreeSlots(JOB, (0,), "released", c.registration))
    assert of(out, core.InterruptTask) == [core.InterruptTask(key(a))] and not of(out, core.DropJob)
    assert c.state.slot_report()[0].job_id is None
    out = c(core.FreeSlots(JOB, (1,), "released", c.registration))
    assert reports(out, b) == [E.CANCELED] and of(out, core.DropJob) == [core.DropJob(JOB)]
    assert reports(c.report(a, E.CANCELED), a) == [E.CANCELED]
    assert c(core.FreeSlots("other-job", (0, 5), "stale", c.registration)) == []  # a free slot, an unknown one


def test_a_shutdown_fails_what_still_runs():
    c = Core(slots=2)
    spark_task, waiting = deployment("s", ops=SPARK_SINK), deployment("w", slot=1, inputs=[gate(range(1))])
    c.submit(spark_task)
    c.submit(waiting)
    out = c(core.ShutdownRequested("TaskManager tm-1 is shutting down"))
    assert of(out, core.InterruptTask) == [core.InterruptTask(key(spark_task))]
    [report] = [i.report for i in of(out, core.SendReport)]
    assert report.state is E.FAILED and report.failure.exception_type == "TaskManagerShutdown"
    [report] = [i.report for i in of(c.report(spark_task, E.CANCELED), core.SendReport)]
    assert report.state is E.FAILED and report.failure.exception_type == "TaskManagerShutdown"
    assert "shutting down" in c.submit(deployment("late", slot=1))[0].reason


# ---------------------------------------------------------------------------------- reports


def test_reports_follow_the_table_and_carry_the_stimulus():
    c = Core()
    d = deployment(ops=SPARK_SINK)
    c.submit(d)
    assert c(core.TaskReported(key(d), E.RUNNING, stimulus_id="tm-1:report-1")) == []  # DEPLOYING -> RUNNING: no
    out = c(core.TaskReported(key(d), E.INITIALIZING, stimulus_id="tm-1:report-2"))
    assert [(i.report.state, i.report.stimulus_id) for i in out] == [(E.INITIALIZING, "tm-1:report-2")]
    c.report(d, E.RUNNING)
    c.report(d, E.FINISHED)
    assert c.report(d, E.FAILED) == []  # nothing after the end
    assert [t.stimulus_id for t in c.state.tasks[key(d)].machine.history][:1] == ["tm-1:report-2"]


def test_a_thread_that_ends_without_a_terminal_report_fails_its_task_after_the_grace():
    c = Core()
    d = deployment(ops=SPARK_SINK)
    c.submit(d)
    c.report(d, E.INITIALIZING)
    [start] = c(core.TaskThreadExited(key(d)))
    assert isinstance(start, core.StartTimer) and start.delay_s == core.MISSING_TERMINAL_GRACE_S
    out = c(core.TimerFired(start.timer))
    [report] = [i.report for i in of(out, core.SendReport)]
    assert report.state is E.FAILED and "ended without reporting" in report.failure.message
    # a terminal report that arrives within the grace wins, and the timer is stale
    d2 = deployment("d2", slot=1, ops=SPARK_SINK)
    c.submit(d2)
    [start] = c(core.TaskThreadExited(key(d2)))
    c.report(d2, E.CANCELED)  # DEPLOYING -> CANCELED is not legal without a cancel: dropped
    c.report(d2, E.FINISHED)
    assert c(core.TimerFired(start.timer)) == []


def test_delivered_terminal_reports_let_the_task_go():
    c = Core()
    d = deployment("src", ops=NOOP_SOURCE)
    out = c.submit(d)
    c(core.ReportsDelivered(tuple(i.report for i in of(out, core.SendReport))))
    assert c.state.tasks == {}


def test_a_partition_lost_before_a_gate_completed_fails_the_task_instead_of_reading_nothing():
    c = Core()
    d = deployment(inputs=[gate(range(2), producers=[Awaiting(0), Awaiting(0)])])
    c.submit(d)
    c.update((0, 0))
    c(core.ReleasePartitions(JOB, (PartitionRef("ds", 0, 0),), False, c.registration))
    out = c.update((1, 0))
    [report] = [i.report for i in of(out, core.SendReport)]
    assert report.state is E.FAILED and report.failure.exception_type == "PartitionUnavailable"


# ---------------------------------------------------------------------------------- release


def test_release_deletes_what_it_names_and_a_whole_job_what_this_taskmanager_wrote():
    c = Core()
    for i in range(2):
        c.submit(deployment("p", i, parallelism=2, slot=i, ops=NOOP_SOURCE, outputs=[output(i, "words")]))
    [delete] = of(c(core.ReleasePartitions(JOB, (PartitionRef("words", 5, 3),), False, c.registration)),
                  core.DeletePartitions)
    assert delete.paths() == ("/data/jobs/job1/partitions/words/p5/a3",)
    [delete] = of(c(core.ReleasePartitions(JOB, (), True, c.registration)), core.DeletePartitions)
    assert delete.paths() == ("/data/jobs/job1/partitions/words/p0/a0", "/data/jobs/job1/partitions/words/p1/a0",
                            "/data/jobs/job1/cancelled")
    assert c(core.ReleasePartitions("..", (), True, c.registration)) == []  # not a job id: nothing is deleted
    assert c(core.ReleasePartitions(JOB, (PartitionRef("../x", 0, 0),), False, c.registration)) == []


# ---------------------------------------------------------------------------------- the JobManager


def test_losing_the_jobmanager_forgets_every_task_and_reports_nothing_more_of_them():
    c = Core()
    spark_task, waiting = deployment("s", ops=SPARK_SINK), deployment("w", slot=1, inputs=[gate(range(1))])
    c.submit(spark_task)
    c.submit(waiting)
    out = c(core.JobManagerLost("heartbeat stream broke"))
    assert of(out, core.InterruptTask) == [core.InterruptTask(key(spark_task))]
    assert of(out, core.RegisterAgain) and of(out, core.DropJob) == [core.DropJob("")]
    assert not of(out, core.SendReport)  # the JobManager already failed them
    assert c.state.tasks == {} and all(s.job_id is None for s in c.state.slot_report())
    assert c.report(spark_task, E.CANCELED) == []  # its thread's late report goes nowhere
    # what was sent to the registration that is over is stale, also once registered again
    assert c(core.PartitionsAvailable(JOB, (PartitionUpdate("ds", 0, 0, ""),), "reg-1")) == []
    c.registration = "reg-2"
    c(core.JobManagerRegistered("reg-2", "/data"))
    assert c(core.CancelTask(JOB, spark_task.attempt, "reg-1")) == []
    assert isinstance(c.submit(spark_task)[0], core.TaskAccepted)  # a new JobManager's attempts start over


def test_the_slot_report_changes_version_only_when_the_slot_table_does():
    c = Core()
    v0 = c.state.slot_version
    c.update((0, 0))
    assert c.state.slot_version == v0
    d = deployment(inputs=[gate(range(1), uniform=Awaiting(3))])
    c.submit(d)
    assert c.state.slot_version > v0
    assert [(s.index, s.job_id, s.running) for s in c.state.slot_report()[:2]] == [
        (0, JOB, (d.attempt,)), (1, None, ())]



def test_a_heartbeat_rewrites_only_the_slots_that_changed_since_the_last_one():
    c = Core(slots=4)
    everything = c.state.slots_changed(-1)
    assert [v.index for v in everything] == [0, 1, 2, 3]
    seen = c.state.slot_version
    assert c.state.slots_changed(seen) == []
    waiting = deployment("a", slot=2, inputs=[gate(range(1))])  # waits for its input: stays in its slot
    c.submit(waiting)
    assert [(v.index, v.job_id, v.running) for v in c.state.slots_changed(seen)] == [(2, JOB, (waiting.attempt,))]
    seen = c.state.slot_version
    c(core.FreeSlots(JOB, (2,), "done", c.registration))
    assert [(v.index, v.job_id, v.running) for v in c.state.slots_changed(seen)] == [(2, None, ())]

def test_calls_for_a_registration_that_is_over_change_nothing():
    """After the TaskManager registered again, what the JobManager sent to its old registration
    is refused or ignored: a stale FreeSlot must not free a slot the new registration gave to a
    job, a stale deployment must not take one. While not registered, every call is stale."""
    c = Core()
    c(core.JobManagerLost("heartbeat stream broke"))
    assert "lost the JobManager" in c(core.SubmitTask(deployment("between", slot=2), "reg-1"))[0].reason
    c.registration = "reg-2"
    c(core.JobManagerRegistered("reg-2", "/data"))
    d = deployment(inputs=[gate(range(1))])
    c.submit(d)
    stale = "reg-1"
    assert "lost the JobManager" in c(core.SubmitTask(deployment("old", slot=1), stale))[0].reason
    assert c(core.FreeSlots(JOB, (0,), "old registration", stale)) == []
    assert c(core.CancelTask(JOB, d.attempt, stale)) == []
    assert c(core.ReleasePartitions(JOB, (), True, stale)) == []
    assert c(core.PartitionsAvailable(JOB, (PartitionUpdate("ds", 0, 0, SCHEMA),), stale)) == []
    assert c.state.slot_report()[0].running == (d.attempt,)
    # a JobManager that names no registration is taken to mean the current one
    assert reports(c(core.PartitionsAvailable(JOB, (PartitionUpdate("ds", 0, 0, SCHEMA),), "")), d) == [E.FINISHED]


# ---------------------------------------------------------------------------------- micro-batches


def streaming(d: TaskDeployment) -> TaskDeployment:
    return replace(d, streaming=True)


def batch_reports(instructions: list) -> list[tuple[int, E, tuple]]:
    return [(i.report.batch_id, i.report.state, i.report.produced) for i in instructions
            if isinstance(i, core.SendReport) and i.report.batch_id is not None]


def test_a_streaming_task_waits_for_no_input_and_runs_each_batch_with_the_attempts_it_names():
    c = Core()
    d = streaming(deployment(ops=SPARK_SINK, inputs=[gate(range(0, 2))]))
    out = c.submit(d)
    assert of(out, core.StartTask) and not of(out, core.InputsReady)  # inputs come per batch
    batch = BatchInput(4, 1000)
    out = c(core.RunBatch(JOB, batch, (BatchTask(d.attempt, (BatchGate(0, (0, 2), SCHEMA),)),), c.registration))
    (given,) = of(out, core.GiveBatch)
    assert given.batch == batch and given.gates[0].attempts == (0, 2) and given.gates[0].partitions == range(0, 2)
    c.report(d, E.INITIALIZING)
    c.report(d, E.RUNNING)
    produced = (ProducedPartition("out", 0, SCHEMA, 3),)
    out = c(core.BatchReported(key(d), 4, produced))
    assert batch_reports(out) == [(4, E.RUNNING, produced)]
    out = c(core.FinishTasks(JOB, (d.attempt,), c.registration))
    assert of(out, core.FinishTask) == [core.FinishTask(key(d))]
    c.report(d, E.FINISHED)
    assert reports(c.instructions, d)[-1] is E.FINISHED


def test_a_batch_for_a_task_that_cannot_run_it_is_rejected_with_the_reason():
    c = Core()
    bounded = deployment("bounded", ops=SPARK_SINK)
    stream = streaming(deployment("stream", ops=SPARK_SINK, inputs=[gate(range(0, 2))], slot=1))
    c.submit(bounded)
    c.submit(stream)
    batch = BatchInput(0, 0)
    out = c(core.RunBatch(JOB, batch, (
        BatchTask(bounded.attempt),
        BatchTask(stream.attempt, (BatchGate(0, (0,), SCHEMA),)),  # one attempt for two partitions
        BatchTask(ExecutionAttemptId("ghost", 0, 0)),
    ), c.registration))
    reasons = {r.key.attempt.vertex_id: r.reason for r in of(out, core.BatchRejected)}
    assert "not a streaming task" in reasons["bounded"]
    assert "no producer attempts for input 0 (2 partition(s))" in reasons["stream"]
    assert "not deployed" in reasons["ghost"] and not of(out, core.GiveBatch)
    stale = c(core.RunBatch(JOB, batch, (BatchTask(stream.attempt, (BatchGate(0, (0, 0), SCHEMA),)),),
                            "reg-old"))
    assert "lost the JobManager" in of(stale, core.BatchRejected)[0].reason
    c.cancel(stream)
    out = c(core.RunBatch(JOB, batch, (BatchTask(stream.attempt, (BatchGate(0, (0, 0), SCHEMA),)),),
                          c.registration))
    assert "stopping" in of(out, core.BatchRejected)[0].reason
    assert not batch_reports(c(core.BatchReported(key(stream), 0)))  # a cancelled task's batch is not reported


def test_rate_limits_reach_running_streaming_tasks_of_the_current_registration_only():
    c = Core()
    receiver = streaming(deployment("receiver", ops=SPARK_SINK))
    bounded = deployment("bounded", ops=SPARK_SINK, slot=1)
    stopping = streaming(deployment("stopping", ops=SPARK_SINK, slot=2))
    for d in (receiver, bounded, stopping):
        c.submit(d)
    c.cancel(stopping)
    out = c(core.SetRateLimits(JOB, ((receiver.attempt, 250.0), (bounded.attempt, 10.0), (stopping.attempt, 10.0),
                                     (ExecutionAttemptId("ghost", 0, 0), 10.0)), c.registration))
    assert of(out, core.LimitRate) == [core.LimitRate(key(receiver), 250.0)]
    for bad in (0.0, -5.0, float("nan"), float("inf")):  # no rate that is not a positive number
        assert not of(c(core.SetRateLimits(JOB, ((receiver.attempt, bad),), c.registration)), core.LimitRate)
    assert not of(c(core.SetRateLimits(JOB, ((receiver.attempt, 99.0),), "reg-old")), core.LimitRate)  # stale


def test_a_noop_streaming_task_runs_its_batches_in_the_core_and_finishes_when_told():
    c = Core(spark=False)
    d = streaming(deployment(ops=NOOP_SOURCE, outputs=[output()]))
    out = c.submit(d)
    assert reports(out, d) == [E.INITIALIZING, E.RUNNING]  # and no FINISHED: it waits for batches
    out = c(core.RunBatch(JOB, BatchInput(0, 0), (BatchTask(d.attempt),), c.registration))
    assert batch_reports(out) == [(0, E.RUNNING, (ProducedPartition("out", 0, ""),))]
    out = c(core.FinishTasks(JOB, (d.attempt,), c.registration))
    assert reports(out, d) == [E.FINISHED]


def test_batches_that_are_through_have_their_partitions_here_deleted_with_the_next_batch():
    c = Core()
    src = streaming(deployment("src", ops=SPARK_SINK, outputs=[output(0, "a"), output(0, "b")], attempt=2))
    sink = streaming(deployment("sink", ops=SPARK_SINK, inputs=[gate(range(0, 1))], slot=1))
    other = streaming(deployment("src", ops=SPARK_SINK, outputs=[output()], job="other-job", slot=2))
    for d in (src, sink, other):
        c.submit(d)
    out = c(core.RunBatch(JOB, BatchInput(7, 0), (BatchTask(src.attempt),), c.registration, released=(5, 3, -1)))
    (delete,) = of(out, core.DeletePartitions)
    assert sorted(delete.paths()) == [f"/data/jobs/{JOB}/partitions/{ds}/p0/a2/batch-{b}" for ds in "ab" for b in (3, 5)]
    assert of(out, core.GiveBatch)  # the batch itself runs as ever
    # nothing to release, or a registration that is over: nothing deleted
    assert not of(c(core.RunBatch(JOB, BatchInput(8, 0), (BatchTask(src.attempt),), c.registration)),
                  core.DeletePartitions)
    assert not of(c(core.RunBatch(JOB, BatchInput(9, 0), (BatchTask(src.attempt),), "reg-old", released=(7,))),
                  core.DeletePartitions)


def test_a_refused_progress_report_fails_the_task_here_and_reports_that():
    c = Core()
    d = deployment(ops=SPARK_SINK)
    c.submit(d)
    out = c.report(d, E.INITIALIZING)
    out = c(core.ReportsRefused(tuple(i.report for i in of(out, core.SendReport)), "NOT_FOUND: unknown attempt"))
    assert [type(i) for i in out] == [core.InterruptTask]
    assert c.state.tasks[key(d)].state is E.CANCELING
    out = c.report(d, E.CANCELED)
    [report] = [i.report for i in of(out, core.SendReport)]
    assert report.state is E.FAILED
    assert report.failure.exception_type == "ReportRefused"
    assert "the JobManager refused its state update (NOT_FOUND: unknown attempt)" in report.failure.message


def test_a_refused_end_lets_the_task_go_and_its_slot_report_no_longer_shows_it():
    c = Core()
    d = deployment("src", ops=NOOP_SOURCE)
    out = c.submit(d)
    assert reports(out) == [E.INITIALIZING, E.RUNNING, E.FINISHED]
    out = c(core.ReportsRefused(tuple(i.report for i in of(out, core.SendReport)), "PERMISSION_DENIED: no"))
    assert out == [] and c.state.tasks == {}
    assert all(s.running == () for s in c.state.slot_report())


def test_a_refused_report_of_a_task_already_cancelled_changes_nothing():
    c = Core()
    d = deployment(ops=SPARK_SINK)
    c.submit(d)
    out = c.report(d, E.INITIALIZING)
    c.cancel(d)
    assert c(core.ReportsRefused(tuple(i.report for i in of(out, core.SendReport)), "NOT_FOUND")) == []
    [report] = [i.report for i in of(c.report(d, E.CANCELED), core.SendReport)]
    assert report.state is E.CANCELED
