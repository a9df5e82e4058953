"""The JobMaster: runs one job on the JobManager's main thread.

Owns the job's Scheduler (the sans-IO core in `funke.common.scheduling.scheduler`) and carries out the
actions it returns: slot requests go to the ResourceManager, deployments and cancellations to the
TaskManagers' gateways, timers to the event loop, sink commits and clean-up to executor threads.
It also fans the job's state changes out to WatchJob subscribers, in order, with sequence numbers,
and keeps the job's live rescales (the sans-IO core in `funke.common.scheduling.rescale`): it carries
out what is the JobMaster's of their actions (stop the query keeping its tasks, suspend the job) and
hands the rest to the Dispatcher.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import os
import time
import traceback
from typing import TYPE_CHECKING, Callable, Sequence

from funke.common.wire import codec, jobviews
from funke.common.streaming import microbatch as mb
from funke.common.scheduling import rescale as rs
from funke.common.scheduling import scheduler as s
from funke.common.wire.codec import DeploymentEncoder
from funke.runtime import gcpolicy
from funke.common.graph.deployment import TaskReport
from funke.common.graph.executiongraph import ExecutionGraph, FailureInfo, SlotId
from funke.common.scheduling.scheduler import Scheduler
from funke.common.states import ExecutionState, JobStatus, RescaleState
from funke.jobmanager import committer
from funke.jobmanager.mailbox import Mailbox
from funke.jobmanager.streamquery import StreamingQuery
from funke.v1 import cluster_pb2, job_pb2, jobmanager_pb2

if TYPE_CHECKING:
    from funke.jobmanager.resourcemanager import ResourceManager

log = logging.getLogger("funke.jobmanager")

END_OF_STREAM = None
# A watcher's queue holds at most this many events. One that falls further behind (its client
# stopped reading) has them replaced by RESYNC: it is sent a fresh snapshot instead, so a slow
# client costs the JobManager a bounded amount of memory and still sees the job as it is.
WATCH_QUEUE_LIMIT = 1000
RESYNC = object()
# The live rescales a job keeps the story of (`funke status`): the newest.
RESCALES_KEPT = 20


class JobMaster:
    def __init__(
        self,
        graph: ExecutionGraph,
        scheduler: Scheduler,
        *,
        resource_manager: "ResourceManager",
        mailbox: Mailbox,
        data_dir: str,
        descriptors: DeploymentEncoder,
        restart_description: str,
        on_terminal: Callable[["JobMaster"], None] = lambda jm: None,
        on_status: Callable[["JobMaster"], None] = lambda jm: None,
        on_progress: Callable[["JobMaster"], None] = lambda jm: None,
        lease_scope: str = "",
        rescales: list[rs.Rescale] | None = None,
    ):
        self.graph = graph
        self.scheduler = scheduler
        self.job_id = graph.job_id
        self.rm = resource_manager
        self.mailbox = mailbox
        self.data_dir = data_dir
        self.descriptors = descriptors
        self.restart_description = restart_description
        self._on_terminal = on_terminal
        self._on_status = on_status  # after each job status change (high availability records it)
        self._on_progress = on_progress  # after a subtask FINISHED (high availability records it)
        # The data clean-up of a job that ended (blocking I/O): the dispatcher runs it, retried
        # until it succeeds and, with high availability, once the job's end is recorded (until
        # then a new leader may run the job again, and needs the commit marker).
        self.pending_cleanup: Callable[[], None] | None = None
        # A streaming query's closing (its last commit's thread waited for): the clean-up runs
        # after it, so that it never removes the staging of a commit under way.
        self.query_closed: asyncio.Task | None = None
        self.waiting_for_resources = ""
        self._internal_error = False
        # The job's live rescales, oldest first, carried from run to run (the last may be under
        # way); this run is the next run of the last one while that is STARTING.
        self.rescales: list[rs.Rescale] = rescales if rescales is not None else []
        carried = self.rescale
        self._next_run_of = carried if carried is not None and carried.state is RescaleState.STARTING else None
        self._rescale_outlook = ""  # what the query's stop for a rescale said it does
        self._broken = False  # the scheduler could not even fail the job: it gets no more events
        self._loop = asyncio.get_running_loop()
        self._timers: set[asyncio.TimerHandle] = set()
        self._watchers: set[asyncio.Queue] = set()
        self._sequence = 0
        self._details: tuple[tuple[int, int], job_pb2.JobDetails] | None = None  # (sequence, progress), built
        self.sink_targets = committer.sink_targets(data_dir, self.job_id, graph.job_graph)
        # A streaming query: its micro-batches run on the job's long-lived tasks.
        self.query: StreamingQuery | None = None
        if scheduler.streaming:
            inc = graph.incarnation
            self.query = StreamingQuery(
                graph, data_dir=data_dir, resource_manager=resource_manager,
                holder=f"job {self.job_id} on JobManager {inc.job_manager or 'local'} (pid {os.getpid()})",
                all_running=lambda: (self.scheduler.state_counts.get(ExecutionState.RUNNING, 0)
                                     == self.graph.number_of_vertices()),
                on_failure=lambda failure: self.mailbox.run(
                    lambda: self._decide(lambda now: self.scheduler.on_global_failure(failure, now))),
                on_event=self._on_streaming_event,
                on_stop_timeout=lambda why, kept: self.mailbox.run(lambda: self._stop_timed_out(why, kept)),
                on_ended=lambda reason, kept: self.mailbox.run(lambda: self._query_ended(reason, kept)),
                leader_epoch=inc.leader_epoch, lease_scope=lease_scope)

    @property
    def status(self) -> JobStatus:
        return self.graph.status

    @property
    def sequence(self) -> int:
        """The sequence number of the last event published to watchers."""
        return self._sequence

    @property
    def collect_vertices(self) -> tuple[str, ...]:
        return tuple(v.id for v in self.graph.job_graph.vertices if v.operators and v.operators[-1].kind == "sink.collect")

    def details(self) -> job_pb2.JobDetails:
        """The job as GetJob, WatchJob's snapshots and the REST API show it. Built once per
        change: every change publishes an event (the sequence moves), and a job of 20 000 subtasks
        takes the loop about 0.1 s to describe, which a dashboard polling five endpoints a second
        would otherwise pay five times. Callers must not modify what they get."""
        latest = self.query.latest_progress if self.query is not None else None
        key = (self._sequence, id(latest), len(self.rescales), len(self.rescales[-1].history) if self.rescales else 0)
        if self._details is not None and self._details[0] == key:
            return self._details[1]
        details = jobviews.job_details(self.graph, self.scheduler, waiting_for_resources=self.waiting_for_resources,
                                    restart_description=self.restart_description)
        if latest is not None:
            details.latest_progress_json = json.dumps(latest, sort_keys=True)
        details.rescales.extend(codec.rescale_to_proto(r) for r in self.rescales)
        self._details = (key, details)
        return details

    def summary(self) -> job_pb2.JobSummary:
        return jobviews.job_summary(self.graph, self.scheduler)

    # ------------------------------------------------------------------ events (main thread)

    def start(self) -> None:
        log.info("job %s (%s): %d tasks, %d slots needed", self.job_id, self.graph.job_graph.name,
                 self.graph.number_of_vertices(), self.scheduler.plan.required_slots())
        self._decide(lambda now: self.scheduler.start(now))

    def restore(self, finished: list[s.FinishedSubtask], cause: str) -> None:
        """Before `start`: take over the subtasks an earlier leader saw finish (their output is
        there), so that they do not run again."""
        self._decide(lambda now: self.scheduler.restore_finished(finished, now, cause))

    def cancel(self) -> JobStatus:
        self._decide(lambda now: self.scheduler.cancel(now))
        return self.status

    def suspend(self, cause: str) -> None:
        self._decide(lambda now: self.scheduler.suspend(now, cause))

    def stop(self, drain: bool, timeout_s: float) -> str:
        """A streaming query's graceful stop (see `StreamingQuery.stop`)."""
        assert self.query is not None
        if self.status.is_terminal:
            return f"the job is already {self.status.value}"
        return self.query.stop(drain, timeout_s)

    # ------------------------------------------------------------------ live rescale

    @property
    def rescale(self) -> rs.Rescale | None:
        """The live rescale under way, if any."""
        return self.rescales[-1] if self.rescales and self.rescales[-1].active else None

    def begin_rescale(self, rescale: rs.Rescale) -> None:
        """A rescale REQUESTED (the Dispatcher checks it): from now on it has a story here."""
        assert self.query is not None and self.rescale is None
        self.rescales.append(rescale)
        del self.rescales[:-RESCALES_KEPT]

    def rescale_accepted(self, now: float) -> str:
        """The Dispatcher found the cluster can run it: the query stops at a batch boundary and
        the job is then suspended, for its next run at the new parallelism (the Dispatcher starts
        it). Returns what will happen."""
        self._rescale_outlook = ""
        self.on_rescale(rs.Accepted(now, "rescale-accepted"))
        timeout_s = self.rescales[-1].timeout_s
        outlook = self._rescale_outlook.split("; if it has not ended within")[0]
        return (outlook.replace("then the query ends FINISHED", "then the job is SUSPENDED")
                + f" (or after {timeout_s:g} s, the batch in flight then running again after the rescale)")

    def on_rescale(self, event: rs.Event) -> list[rs.Action]:
        """Feed the rescale under way one event; carry out its actions that are the JobMaster's
        and return the Dispatcher's (start the next run, archive the job)."""
        rescale = self.rescale
        assert rescale is not None, f"job {self.job_id}: no rescale under way for {event}"
        rest: list[rs.Action] = []
        for action in rescale.handle(event):
            log.info("job %s: rescale %s (stimulus %s)", self.job_id, type(action).__name__, action.stimulus_id)
            match action:
                case rs.StopQuery(timeout_s=timeout_s):
                    assert self.query is not None
                    self._rescale_outlook = self.query.stop(False, timeout_s, keep_tasks=True)
                case rs.SuspendJob(cause=cause):
                    if not self.status.is_terminal:
                        self.suspend(cause)
                case _:
                    rest.append(action)
        return rest

    def _query_ended(self, reason: str, tasks_kept: bool) -> None:
        if tasks_kept and not self.status.is_terminal:  # the rescale's stop: its tasks wait to be suspended
            self.on_rescale(rs.QueryStopped(reason, time.time(), "query-stopped"))

    def _stop_timed_out(self, why: str, tasks_kept: bool) -> None:
        if self.status.is_terminal:
            return
        if tasks_kept:
            log.warning("job %s: %s; suspending it for the rescale all the same", self.job_id, why)
            self.on_rescale(rs.StopTimedOut(time.time(), "stop-timed-out"))
            return
        log.warning("job %s: %s; cancelling the job", self.job_id, why)
        self._decide(lambda now: self.scheduler.cancel(now))

    def _on_streaming_event(self, event: mb.Publish) -> None:
        if event.kind in ("BatchCompleted", "QueryProgress"):
            log.debug("job %s: %s %d", self.job_id, event.kind, event.batch_id)
        self._sequence += 1
        if self._watchers:
            at = datetime.datetime.fromtimestamp(event.at_ms / 1000, tz=datetime.timezone.utc)
            message = jobmanager_pb2.JobEvent(sequence=self._sequence, streaming=jobmanager_pb2.StreamingEvent(
                kind=event.kind, batch_id=event.batch_id, info_json=json.dumps(event.info, sort_keys=True)))
            message.streaming.at.FromDatetime(at)
            self._publish(message)

    def on_task_states(self, updates: Sequence[cluster_pb2.TaskExecutionState]) -> None:
        """A TaskManager's reports, in the order it sent them: state changes go to the scheduler
        as one event (a call from a TaskManager carries hundreds under load), a streaming task's
        micro-batch reports to the query. A report that does not decode (an unknown state number
        from a newer or broken TaskManager) is logged and dropped: it says nothing the job can use."""
        changes: list[TaskReport] = []
        for update in updates:
            try:
                report = codec.report_from_proto(update)
            except ValueError as exc:
                log.warning("job %s: ignoring a task report that does not decode: %s", self.job_id, exc)
                continue
            if report.batch_id is None:
                changes.append(report)
                continue
            if changes:  # what came before the batch's report is applied before it
                self._task_states(changes)
                changes = []
            # a streaming task wrote a micro-batch; it stays RUNNING
            if report.io is not None:
                self.scheduler.add_batch_io(report.attempt, report.io)
            if self.query is not None:
                self.query.on_batch_report(report.attempt, report.batch_id,
                                           {p.data_set_id: p.schema for p in report.produced}, report.input_rows,
                                           report.io)
        if changes:
            self._task_states(changes)

    def _task_states(self, reports: list[TaskReport]) -> None:
        self._decide(lambda now: self.scheduler.on_task_states(reports, now))

    def on_allocations(self, allocations: Sequence[tuple[int, Sequence[SlotId]]]) -> None:
        """Slot requests the ResourceManager served in one pass."""
        self._decide(lambda now: self.scheduler.on_allocations(allocations, now))

    def on_deploy_failed(self, attempt: job_pb2.ExecutionAttemptId, failure: FailureInfo) -> None:
        self._decide(lambda now: self.scheduler.on_deploy_failed(codec.attempt_from_proto(attempt), failure, now))

    def on_slot_request_failed(self, request_id: int, message: str) -> None:
        self._decide(lambda now: self.scheduler.on_slot_request_failed(request_id, message, now))

    def on_waiting_for_resources(self, message: str) -> None:
        self._set_waiting(message)

    def on_task_manager_lost(self, task_manager_id: str, cause: str) -> None:
        self._decide(lambda now: self.scheduler.on_task_manager_lost(task_manager_id, cause, now))

    def on_internal_error(self, exc: BaseException, undelivered: list) -> None:
        """Something raised between a decision and its effect: the job fails at once (no
        restart: it would meet the same error), its slots are freed, the cause is in its
        exception history (once: later errors of the job only fail their own undelivered
        deployments). Each round moves the job towards a terminal status and a terminal job
        takes no more, so a handler that always raises cannot loop."""
        if self.status.is_terminal or self._broken:
            return
        failure = FailureInfo("JobManagerError", f"the JobManager could not carry out a decision for this "
                              f"job: {type(exc).__name__}: {str(exc)[:2000]}",
                              "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-20_000:])
        first, self._internal_error = not self._internal_error, True
        try:
            actions = self.scheduler.on_internal_error(failure, time.time(), undelivered, record=first)
        except Exception:
            # The scheduler cannot even fail the job: its books are broken. Keep the JobManager
            # serving (no retry: it would raise again), and give the job's slots back.
            log.critical("job %s: the scheduler could not fail the job; releasing its slots and leaving it "
                         "as it is", self.job_id, exc_info=True)
            self._broken = True  # no more events for it: each would raise again
            self.rm.release_job(self.job_id, "the job's scheduler failed")
            return
        self._apply(actions)

    # ------------------------------------------------------------------ watching

    def snapshot(self) -> jobmanager_pb2.JobEvent:
        return jobmanager_pb2.JobEvent(sequence=self._sequence, snapshot=self.details())

    def subscribe(self) -> tuple[jobmanager_pb2.JobEvent, asyncio.Queue]:
        """The current snapshot, and a queue of every later event (ending with END_OF_STREAM;
        RESYNC in it: take a new snapshot, and skip the events it already holds)."""
        queue: asyncio.Queue = asyncio.Queue()
        snapshot = self.snapshot()
        if self.status.is_terminal:
            queue.put_nowait(END_OF_STREAM)
        else:
            self._watchers.add(queue)
        return snapshot, queue

    def unsubscribe(self, queue: asyncio.Queue) -> None:
        self._watchers.discard(queue)

    def _publish(self, event: jobmanager_pb2.JobEvent, end: bool = False) -> None:
        for queue in self._watchers:
            if queue.qsize() < WATCH_QUEUE_LIMIT:
                queue.put_nowait(event)
            elif queue.qsize() == WATCH_QUEUE_LIMIT:
                while not queue.empty():
                    queue.get_nowait()
                queue.put_nowait(RESYNC)
            if end:
                queue.put_nowait(END_OF_STREAM)
        if end:
            self._watchers.clear()

    def _set_waiting(self, message: str) -> None:
        if message == self.waiting_for_resources:
            return
        self.waiting_for_resources = message
        if message:
            log.warning("job %s waiting for resources: %s", self.job_id, message)
        self._sequence += 1
        self._publish(jobmanager_pb2.JobEvent(sequence=self._sequence, waiting_for_resources=message))

    # ------------------------------------------------------------------ actions

    def _decide(self, event) -> None:
        """Feed one event to the scheduler and carry out what it decides. Should the scheduler
        itself raise (a bug), the job fails as for any other internal error."""
        if self._broken:
            return
        # A decision's actions (a transition record per subtask it moved, deployments...) die
        # with it: with the collector paused they are freed before it could walk them (gcpolicy).
        with gcpolicy.paused():
            try:
                actions = event(time.time())
            except Exception as exc:
                log.exception("job %s: the scheduler raised", self.job_id)
                error = exc  # `exc` is unbound once the except clause ends; the letter runs later
                self.mailbox.run(lambda: self.on_internal_error(error, []))
                return
            self._apply(actions)
            del actions

    def _apply(self, actions: list[s.Action]) -> None:
        """Carry out every action, even after one of them raised: the others (releasing slots,
        publishing transitions) must still happen. Deployments and cancellations that raised
        never left the JobManager; the job learns of the error next, as an event of its own."""
        error: BaseException | None = None
        undelivered = []
        for action in actions:
            try:
                _HANDLERS[type(action)](self, action)
            except Exception as exc:
                log.exception("job %s: carrying out %s failed", self.job_id, type(action).__name__)
                error = error or exc
                if isinstance(action, s.DeployTask):
                    undelivered.append(action.attempt)
                elif isinstance(action, s.CancelTask):
                    undelivered.append(action.attempt)
        if error is not None:
            self.mailbox.run(lambda: self.on_internal_error(error, undelivered))
        if self.query is not None:
            try:
                self.query.after_decision(self.status)
            except Exception as exc:  # the query could not start or end a run: the job fails
                log.exception("job %s: the streaming query", self.job_id)
                failed = exc  # `exc` is unbound once the except clause ends
                self.mailbox.run(lambda: self.on_internal_error(failed, []))
            if self._next_run_of is not None and self.query.running:  # the next run of a rescale runs
                rescale, self._next_run_of = self._next_run_of, None
                if rescale.active:
                    self.on_rescale(rs.NextRunRunning(time.time(), f"run-{self.query.runs}-started"))

    def _on_job_status(self, a: s.JobStatusChanged) -> None:
        t = a.transition
        log.info("job %s: %s -> %s%s", self.job_id, t.from_state.value, t.to_state.value, f" ({t.cause})" if t.cause else "")
        self._sequence += 1
        inc = self.graph.incarnation
        self._publish(jobviews.event_to_proto(self._sequence, a, inc.leader_epoch, inc.job_manager),
                      end=t.to_state.is_terminal)
        self._on_status(self)

    def _on_execution_state(self, a: s.ExecutionStateChanged) -> None:
        if a.transition.to_state is ExecutionState.FINISHED:
            self._on_progress(self)
        elif a.transition.to_state is ExecutionState.FAILED:
            log.info("job %s: %s attempt #%d FAILED: %s", self.job_id, a.task_name, a.attempt.attempt_number, a.failure)
        self._sequence += 1
        if self._watchers:  # a P = 10 000 job makes 60 000 of these; build them only for a reader
            self._publish(jobviews.event_to_proto(self._sequence, a))

    def _on_request_slots(self, a: s.RequestSlots) -> None:
        self.rm.request_slots(self.job_id, a.requests, a.timeout_s)

    def _on_cancel_request(self, a: s.CancelSlotRequest) -> None:
        self.rm.cancel_request(self.job_id, a.request_id)

    def _on_release_slot(self, a: s.ReleaseSlot) -> None:
        self.rm.release_slot(a.slot, self.job_id, a.cause)

    def _on_deploy(self, a: s.DeployTask) -> None:
        descriptor = self.descriptors.encode_task(a.vertex, a.attempt, a.task_name, a.slot, a.gates, a.stimulus_id)
        gateway = self.rm.gateway(a.slot.task_manager_id)
        if gateway is None:
            failure = FailureInfo("DeploymentFailed", f"TaskManager {a.slot.task_manager_id} is gone")
            self.mailbox.run(lambda: self.on_deploy_failed(descriptor.attempt, failure))
        else:
            gateway.submit(descriptor, self.descriptors.size_of(a.vertex.vertex.id))

    def _on_cancel_task(self, a: s.CancelTask) -> None:
        gateway = self.rm.gateway(a.task_manager_id)
        if gateway is not None:
            gateway.cancel(self.job_id, codec.attempt_to_proto(a.attempt), a.stimulus_id)

    def _on_update_partition(self, a: s.UpdatePartitionInfo) -> None:
        gateway = self.rm.gateway(a.task_manager_id)
        if gateway is not None:
            gateway.update_partition(self.job_id, codec.partition_update_to_proto(a.update))

    def _on_release_partitions(self, a: s.ReleasePartitions) -> None:
        gateway = self.rm.gateway(a.task_manager_id)
        if gateway is not None:
            gateway.release_partitions(self.job_id, [codec.partition_ref_to_proto(r) for r in a.partitions])

    def _on_timer(self, a: s.StartTimer) -> None:
        def fire() -> None:
            self._timers.discard(handle)
            self.mailbox.run(lambda: self._decide(lambda now: self.scheduler.on_timer(a.timer, now)))

        handle = self._loop.call_later(max(0.0, a.at - time.time()), fire)
        self._timers.add(handle)

    def _on_commit(self, a: s.CommitOutputs) -> None:
        future = self._loop.run_in_executor(None, committer.commit_outputs, self.data_dir, self.job_id, a.sinks)

        def done(f: asyncio.Future) -> None:
            error = None
            if f.exception() is not None:
                exc = f.exception()
                error = FailureInfo(type(exc).__name__, str(exc),
                                    "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
            self.mailbox.run(lambda: self._decide(lambda now: self.scheduler.on_outputs_committed(now, error)))

        future.add_done_callback(done)

    def _on_cleanup(self, a: s.JobCleanup) -> None:
        if self.query is not None:
            closing = self._loop.create_task(self.query.close())
            closing.add_done_callback(lambda f: f.cancelled() or f.exception() and log.warning(
                "job %s: closing the streaming query: %s", self.job_id, f.exception()))
            self.query_closed = closing
        for handle in self._timers:
            handle.cancel()
        self._timers.clear()
        self._set_waiting("")
        self.rm.release_job(self.job_id, f"job {a.status.value}")
        for tm in a.task_managers:
            gateway = self.rm.gateway(tm)
            if gateway is not None:
                gateway.release_partitions(self.job_id, [], whole_job=True)
        if a.status is not JobStatus.SUSPENDED:  # a suspended job's files are the next leader's
            keep = a.status is JobStatus.FINISHED
            targets = list(self.sink_targets)
            self.pending_cleanup = lambda: committer.cleanup_job(self.data_dir, self.job_id, targets, keep)
        # After the other actions of this decision: the dispatcher then keeps only a summary.
        self.mailbox.run(lambda: self._on_terminal(self))


_HANDLERS = {
    s.JobStatusChanged: JobMaster._on_job_status,
    s.ExecutionStateChanged: JobMaster._on_execution_state,
    s.RequestSlots: JobMaster._on_request_slots,
    s.CancelSlotRequest: JobMaster._on_cancel_request,
    s.ReleaseSlot: JobMaster._on_release_slot,
    s.DeployTask: JobMaster._on_deploy,
    s.CancelTask: JobMaster._on_cancel_task,
    s.UpdatePartitionInfo: JobMaster._on_update_partition,
    s.ReleasePartitions: JobMaster._on_release_partitions,
    s.StartTimer: JobMaster._on_timer,
    s.CommitOutputs: JobMaster._on_commit,
    s.JobCleanup: JobMaster._on_cleanup,
}
