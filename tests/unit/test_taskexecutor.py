"""The TaskManager process as its JobManager sees it.

The test plays the JobManager: a small grpc.aio server (ResourceManager + JobMaster) on its own
event loop thread records registrations, heartbeats and task state updates, and can restart or
ask for re-registration. The TaskManager is the real thing, `python -m funke.taskmanager.main
--no-spark`, driven over its TaskExecutor service with no-op chains (no Spark needed).
"""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from funke.common import layout
from funke.common.security import Realm
from funke.runtime import security
from funke.v1 import cluster_pb2, cluster_pb2_grpc, job_pb2, jobgraph_pb2

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")
WAIT_S = 10.0
HEARTBEAT_INTERVAL_S = 0.1


# ---------------------------------------------------------------------------- fake JobManager


class FakeJobManager:
    """ResourceManager and JobMaster, recording what the TaskManager tells them.

    Runs a grpc.aio server on a private event loop thread, so the (synchronous) tests can block
    on its records through `wait_for`."""

    def __init__(self, data_dir: str):
        self.data_dir = data_dir
        # The TaskManagers' token, which this JobManager asks for as a real one does.
        self.cluster_token_file = Path(data_dir) / "cluster.token"
        self.cluster_token, _ = security.ensure_token(self.cluster_token_file)
        self._cond = threading.Condition()
        self.registrations: list[cluster_pb2.RegisterTaskManagerRequest] = []
        self.registration_ids: list[str] = []  # the answer to each of `registrations`
        self.heartbeats: list[cluster_pb2.HeartbeatRequest] = []
        self.heartbeat_streams: list[int] = []  # which stream each of `heartbeats` came on
        self.updates: list[cluster_pb2.TaskExecutionState] = []
        self.update_calls = 0
        self.streams_opened = 0
        self._known: dict[str, str] = {}  # TaskManager id -> its current registration id
        # (request, registration id) -> deployments to send before answering a registration, as a
        # real JobManager may: its SubmitTasks then overtakes the answer
        self.deploy_on_register: Callable[[cluster_pb2.RegisterTaskManagerRequest, str],
                                          list[cluster_pb2.TaskDeploymentDescriptor]] | None = None
        self.early_results: list[cluster_pb2.TaskSubmissionResult] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fake-jobmanager", daemon=True)
        self._thread.start()
        self._server: grpc.aio.Server | None = None
        self.port = self._call(self._start(0))

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _call(self, coro, timeout: float = WAIT_S):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _start(self, port: int) -> int:
        tokens = lambda realm: (self.cluster_token,) if realm is Realm.CLUSTER else ()  # noqa: E731
        server = grpc.aio.server(interceptors=[security.Authenticator("fake JobManager", tokens)])
        cluster_pb2_grpc.add_ResourceManagerServicer_to_server(_ResourceManager(self), server)
        cluster_pb2_grpc.add_JobMasterServicer_to_server(_JobMaster(self), server)
        bound = server.add_insecure_port(f"127.0.0.1:{port}")
        assert bound, f"could not bind 127.0.0.1:{port}"
        await server.start()
        self._server = server
        return bound

    async def _stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)  # grace 0: open heartbeat streams break at once
            self._server = None

    def restart(self) -> None:
        """A JobManager restart: streams break, the new one (same port) knows no registration."""
        self._call(self._stop())
        with self._cond:
            self._known.clear()
        self._call(self._start(self.port))

    def forget(self, task_manager_id: str) -> None:
        """Answer the TaskManager's next heartbeat with `reregister`."""
        with self._cond:
            self._known.pop(task_manager_id, None)

    def close(self) -> None:
        self._call(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(WAIT_S)

    def wait_for(self, what: str, predicate: Callable[[], T], timeout: float = WAIT_S) -> T:
        """Block until `predicate()` (evaluated under the record lock) is truthy; returns it."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                result = predicate()
                if result:
                    return result
                left = deadline - time.monotonic()
                if left <= 0:
                    pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
                self._cond.wait(left)

    def states_of(self, job_id: str, attempt: job_pb2.ExecutionAttemptId) -> list[str]:
        with self._cond:
            return [job_pb2.ExecutionState.Name(u.state).removeprefix("EXECUTION_STATE_")
                    for u in self.updates if u.job_id == job_id and u.attempt == attempt]

    def last_update(self, job_id: str, attempt: job_pb2.ExecutionAttemptId) -> cluster_pb2.TaskExecutionState:
        with self._cond:
            return [u for u in self.updates if u.job_id == job_id and u.attempt == attempt][-1]

    def wait_for_state(self, job_id: str, attempt: job_pb2.ExecutionAttemptId, state: str,
                       timeout: float = WAIT_S) -> list[str]:
        return self.wait_for(f"{attempt.vertex_id}[{attempt.subtask_index}] to report {state}",
                             lambda: state in self.states_of(job_id, attempt) and self.states_of(job_id, attempt),
                             timeout)

    # called on the server loop
    def _register(self, request: cluster_pb2.RegisterTaskManagerRequest) -> str:
        with self._cond:
            self.registrations.append(request)
            registration_id = f"{request.task_manager_id}#{len(self.registrations)}"
            self.registration_ids.append(registration_id)
            self._known[request.task_manager_id] = registration_id
            self._cond.notify_all()
            return registration_id

    def _heartbeat(self, request: cluster_pb2.HeartbeatRequest, stream: int) -> bool:
        with self._cond:
            self.heartbeats.append(request)
            self.heartbeat_streams.append(stream)
            self._cond.notify_all()
            return self._known.get(request.task_manager_id) == request.registration_id

    def _stream_opened(self) -> int:
        with self._cond:
            self.streams_opened += 1
            self._cond.notify_all()
            return self.streams_opened

    def _update(self, request: cluster_pb2.UpdateTaskExecutionStateRequest) -> None:
        with self._cond:
            self.update_calls += 1
            self.updates.extend(request.updates)
            self._cond.notify_all()


class _ResourceManager(cluster_pb2_grpc.ResourceManagerServicer):
    def __init__(self, jm: FakeJobManager):
        self.jm = jm

    async def RegisterTaskManager(self, request, context):
        registration_id = self.jm._register(request)
        deploy = self.jm.deploy_on_register
        if deploy is not None and (tasks := deploy(request, registration_id)):
            async def overtake() -> None:
                async with security.aio_channel(request.address, request.registration_token, None) as channel:
                    response = await cluster_pb2_grpc.TaskExecutorStub(channel).SubmitTasks(
                        cluster_pb2.SubmitTasksRequest(tasks=tasks, registration_id=registration_id), timeout=WAIT_S)
                with self.jm._cond:
                    self.jm.early_results.extend(response.results)
                    self.jm._cond.notify_all()

            asyncio.get_running_loop().create_task(overtake())
            await asyncio.sleep(0.5)  # the deployment reaches the TaskManager first
        return cluster_pb2.RegisterTaskManagerResponse(
            registration_id=registration_id, heartbeat_interval_seconds=HEARTBEAT_INTERVAL_S,
            heartbeat_timeout_seconds=5.0, data_dir=self.jm.data_dir)

    async def Heartbeat(self, request_iterator, context):
        stream = self.jm._stream_opened()
        async for request in request_iterator:
            known = self.jm._heartbeat(request, stream)
            yield cluster_pb2.HeartbeatResponse(reregister=not known)


class _JobMaster(cluster_pb2_grpc.JobMasterServicer):
    def __init__(self, jm: FakeJobManager):
        self.jm = jm

    async def UpdateTaskExecutionState(self, request, context):
        self.jm._update(request)
        return cluster_pb2.UpdateTaskExecutionStateResponse()


# ---------------------------------------------------------------------------- the TaskManager


class TaskManagerProcess:
    def __init__(self, jm: FakeJobManager, log_path: Path, tm_id: str):
        self.id = tm_id
        self.jm = jm
        self.log_path = log_path
        self._log = open(log_path, "w")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "funke.taskmanager.main", "--no-spark", "--jobmanager", jm.address,
             "--slots", "2", "--id", tm_id, "--log-level", "DEBUG",
             "-D", f"security.auth.cluster-token-file={jm.cluster_token_file}"],
            stdout=subprocess.PIPE, stderr=self._log, text=True, cwd=REPO, env=env)
        self.stdout: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self._channel: grpc.Channel | None = None
        self._channel_token = ""

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.stdout.put(line.rstrip("\n"))

    def registration(self, index: int = 0) -> cluster_pb2.RegisterTaskManagerRequest:
        mine = lambda: [r for r in self.jm.registrations if r.task_manager_id == self.id]  # noqa: E731
        [registration] = self.jm.wait_for(f"registration #{index + 1} of {self.id}",
                                          lambda: len(mine()) > index and [mine()[index]])
        return registration

    def registration_id(self, index: int = 0) -> str:
        """What the fake JobManager answered to the TaskManager's `index`th registration."""
        self.registration(index)
        with self.jm._cond:
            return [i for r, i in zip(self.jm.registrations, self.jm.registration_ids)
                    if r.task_manager_id == self.id][index]

    @property
    def executor(self) -> cluster_pb2_grpc.TaskExecutorStub:
        """The TaskExecutor service, called as the JobManager of its latest registration (the
        only caller it takes: with that registration's token)."""
        self.registration()
        with self.jm._cond:
            latest = [r for r in self.jm.registrations if r.task_manager_id == self.id][-1]
        if self._channel is None or self._channel_token != latest.registration_token:
            if self._channel is not None:
                self._channel.close()
            self._channel = security.channel(latest.address, latest.registration_token, None)
            self._channel_token = latest.registration_token
        return cluster_pb2_grpc.TaskExecutorStub(self._channel)

    @property
    def channel(self) -> grpc.Channel:
        self.executor  # noqa: B018 - opens the channel
        assert self._channel is not None
        return self._channel

    def log_tail(self, lines: int = 40) -> str:
        self._log.flush()
        return "\n".join(self.log_path.read_text().splitlines()[-lines:])

    def kill(self) -> None:
        if self._channel is not None:
            self._channel.close()
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)  # this process only, by its pid
            self.proc.wait(WAIT_S)
        self._log.close()


@pytest.fixture(scope="module")
def jm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeJobManager]:
    fake = FakeJobManager(str(tmp_path_factory.mktemp("data")))
    yield fake
    fake.close()


def _start_tm(jm: FakeJobManager, tmp: Path) -> TaskManagerProcess:
    tm_id = f"tm-test-{uuid.uuid4().hex[:6]}"
    return TaskManagerProcess(jm, tmp / f"{tm_id}.log", tm_id)


@pytest.fixture(scope="module")
def tm(jm: FakeJobManager, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TaskManagerProcess]:
    """One TaskManager shared by the tests that leave it as they found it."""
    process = _start_tm(jm, tmp_path_factory.mktemp("tm"))
    process.registration()
    yield process
    process.kill()


@pytest.fixture
def own_tm(jm: FakeJobManager, tmp_path: Path) -> Iterator[TaskManagerProcess]:
    """A TaskManager for a test that restarts, confuses or stops it."""
    process = _start_tm(jm, tmp_path)
    process.registration()
    yield process
    process.kill()


@pytest.fixture
def job(tm: TaskManagerProcess) -> Iterator[str]:
    """A fresh job id; its slots on the shared TaskManager are freed afterwards."""
    job_id = f"job-{uuid.uuid4().hex[:8]}"
    yield job_id
    for slot in range(2):
        tm.executor.FreeSlots(cluster_pb2.FreeSlotsRequest(slot_indexes=[slot], job_id=job_id, cause="test over"),
                             timeout=WAIT_S)


# ---------------------------------------------------------------------------- descriptors


def attempt(vertex: str, subtask: int = 0, number: int = 0) -> job_pb2.ExecutionAttemptId:
    return job_pb2.ExecutionAttemptId(vertex_id=vertex, subtask_index=subtask, attempt_number=number)


def producer(job_id: str, subtask: int, slot: int, parallelism: int = 2,
             data_set: str = "ds-words") -> cluster_pb2.TaskDeploymentDescriptor:
    return cluster_pb2.TaskDeploymentDescriptor(
        job_id=job_id, job_name="test job", attempt=attempt("source", subtask),
        task_name=f"Source ({subtask + 1}/{parallelism})", parallelism=parallelism, slot_index=slot,
        vertex=jobgraph_pb2.JobVertex(id="source", name="Source", parallelism=parallelism, operators=[
            jobgraph_pb2.OperatorSpec(kind="source.noop", name="Source", config_json="{}")]),
        outputs=[cluster_pb2.ResultPartitionDeploymentDescriptor(
            data_set_id=data_set, partition_index=subtask, num_subpartitions=1,
            partitioner=jobgraph_pb2.PARTITIONER_FORWARD,
            partition_type=jobgraph_pb2.RESULT_PARTITION_TYPE_PIPELINED)])


def consumer(job_id: str, slot: int = 0, data_set: str = "ds-words", vertex: str = "sink",
             subtask: int = 0) -> cluster_pb2.TaskDeploymentDescriptor:
    """A 1-parallel consumer of partition 0 of `data_set`, whose producer has not finished yet."""
    return cluster_pb2.TaskDeploymentDescriptor(
        job_id=job_id, job_name="test job", attempt=attempt(vertex, subtask),
        task_name=f"Sink ({subtask + 1}/1)", parallelism=1, slot_index=slot,
        vertex=jobgraph_pb2.JobVertex(id=vertex, name="Sink", parallelism=1, operators=[
            jobgraph_pb2.OperatorSpec(kind="noop", name="Noop", config_json="{}"),
            jobgraph_pb2.OperatorSpec(kind="sink.noop", name="Sink", config_json="{}")]),
        inputs=[cluster_pb2.InputGateDeploymentDescriptor(
            input_index=0, data_set_id=data_set, partition_start=0, partition_end=1,
            producer_attempts=[-1])])


def submit(tm: TaskManagerProcess, *tasks: cluster_pb2.TaskDeploymentDescriptor) -> list[cluster_pb2.TaskSubmissionResult]:
    response = tm.executor.SubmitTasks(cluster_pb2.SubmitTasksRequest(tasks=tasks), timeout=WAIT_S)
    assert [r.attempt for r in response.results] == [t.attempt for t in tasks]
    return list(response.results)


def submit_ok(tm: TaskManagerProcess, *tasks: cluster_pb2.TaskDeploymentDescriptor) -> None:
    for result in submit(tm, *tasks):
        assert result.accepted, result.error


# ---------------------------------------------------------------------------- tests


def test_registers_its_slots_and_the_address_it_serves_on(tm: TaskManagerProcess) -> None:
    registration = tm.registration()
    assert registration.number_of_slots == 2
    host, port = registration.address.rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0
    assert registration.resources["pid"] == str(tm.proc.pid)
    assert "cores" in registration.resources
    # when its process started (before the registration, not in the future), and no Spark here
    started = float(registration.resources["started_at"])
    assert time.time() - 120 < started <= time.time()
    assert registration.resources["spark_ready_at"] == ""
    assert [(s.index, s.job_id, len(s.running)) for s in registration.slot_report.slots] == [(0, "", 0), (1, "", 0)]
    # launchers wait for this one line on stdout
    line = tm.stdout.get(timeout=WAIT_S)
    assert line == f"TaskManager {tm.id} registered with {tm.jm.address} (2 slots)"
    health = health_pb2_grpc.HealthStub(tm.channel).Check(health_pb2.HealthCheckRequest(), timeout=WAIT_S)
    assert health.status == health_pb2.HealthCheckResponse.SERVING


def test_heartbeats_flow_on_one_stream_with_slot_reports(tm: TaskManagerProcess, jm: FakeJobManager) -> None:
    registration_id = tm.registration_id()
    with jm._cond:
        before = len(jm.heartbeats)
    beats = jm.wait_for("5 more heartbeats", lambda: (mine := [
        (h, stream) for h, stream in zip(jm.heartbeats[before:], jm.heartbeat_streams[before:])
        if h.task_manager_id == tm.id]) and len(mine) >= 5 and mine)
    assert {h.registration_id for h, _ in beats} == {registration_id}
    assert all(len(h.slot_report.slots) == 2 for h, _ in beats)
    assert len({stream for _, stream in beats}) == 1  # the same stream all along


def test_noop_tasks_report_initializing_running_finished_in_order(tm: TaskManagerProcess, jm: FakeJobManager,
                                                                  job: str) -> None:
    tasks = [producer(job, 0, slot=0), producer(job, 1, slot=1)]
    submit_ok(tm, *tasks)
    for t in tasks:
        assert jm.wait_for_state(job, t.attempt, "FINISHED") == ["INITIALIZING", "RUNNING", "FINISHED"]
        final = jm.last_update(job, t.attempt)
        assert final.task_manager_id == tm.id
        assert not final.HasField("failure")
        assert [(p.data_set_id, p.partition_index) for p in final.produced] == [
            ("ds-words", t.attempt.subtask_index)]


def test_consumer_waits_for_its_input_until_partition_info_arrives(tm: TaskManagerProcess, jm: FakeJobManager,
                                                                   job: str) -> None:
    # That it does not move before (nor for another data set's update) is the core's decision,
    # tested without a process in test_taskexecutorstate.py; here: the RPC reaches the core.
    waiting = consumer(job)
    submit_ok(tm, waiting)
    jm.wait_for_state(job, waiting.attempt, "RUNNING")
    tm.executor.UpdatePartitionInfo(cluster_pb2.UpdatePartitionInfoRequest(job_id=job, updates=[
        cluster_pb2.PartitionInfoUpdate(data_set_id="ds-other", partition_index=0, producer_attempt=0)]),
        timeout=WAIT_S)
    tm.executor.UpdatePartitionInfo(cluster_pb2.UpdatePartitionInfoRequest(job_id=job, updates=[
        cluster_pb2.PartitionInfoUpdate(data_set_id="ds-words", partition_index=0, producer_attempt=0)]),
        timeout=WAIT_S)
    assert jm.wait_for_state(job, waiting.attempt, "FINISHED") == ["INITIALIZING", "RUNNING", "FINISHED"]


def test_cancelling_a_waiting_task_ends_it_canceled(tm: TaskManagerProcess, jm: FakeJobManager, job: str) -> None:
    waiting = consumer(job)
    submit_ok(tm, waiting)
    jm.wait_for_state(job, waiting.attempt, "RUNNING")
    tm.executor.CancelTasks(cluster_pb2.CancelTasksRequest(job_id=job, attempts=[waiting.attempt]), timeout=WAIT_S)
    assert jm.wait_for_state(job, waiting.attempt, "CANCELED") == ["INITIALIZING", "RUNNING", "CANCELED"]


def test_a_cancel_that_overtakes_the_deployment_rejects_it(tm: TaskManagerProcess, jm: FakeJobManager,
                                                           job: str) -> None:
    late = consumer(job, vertex="late")
    tm.executor.CancelTasks(cluster_pb2.CancelTasksRequest(job_id=job, attempts=[late.attempt]), timeout=WAIT_S)
    [result] = submit(tm, late)
    assert not result.accepted and "cancelled before it was deployed" in result.error


def test_invalid_or_foreign_slots_are_rejected_with_an_error(tm: TaskManagerProcess, jm: FakeJobManager,
                                                             job: str) -> None:
    [result] = submit(tm, consumer(job, slot=7))
    assert not result.accepted and "slot index 7" in result.error

    # slot sharing: a second task of the same job fits into the same slot ...
    first, second = consumer(job, vertex="a"), consumer(job, vertex="b")
    submit_ok(tm, first, second)
    # ... a task of another job does not
    other_job = f"{job}-other"
    [result] = submit(tm, consumer(other_job, slot=0))
    assert not result.accepted and f"held by job {job}" in result.error

    # once the JobManager frees the slot, what still ran there is cancelled and the slot is free
    tm.executor.FreeSlots(cluster_pb2.FreeSlotsRequest(slot_indexes=[0], job_id=job, cause="test"), timeout=WAIT_S)
    for t in (first, second):
        jm.wait_for_state(job, t.attempt, "CANCELED")
    submit_ok(tm, producer(other_job, 0, slot=0, parallelism=1))
    jm.wait_for_state(other_job, attempt("source"), "FINISHED")
    tm.executor.FreeSlots(cluster_pb2.FreeSlotsRequest(slot_indexes=[0], job_id=other_job), timeout=WAIT_S)


def test_reports_are_batched_and_finished_tasks_leave_their_slot(tm: TaskManagerProcess, jm: FakeJobManager,
                                                         job: str) -> None:
    tasks = [consumer(job, vertex=f"v{i}") for i in range(20)]
    with jm._cond:
        calls_before = jm.update_calls
    submit_ok(tm, *tasks)
    for t in tasks:
        jm.wait_for_state(job, t.attempt, "RUNNING")
    tm.executor.UpdatePartitionInfo(cluster_pb2.UpdatePartitionInfoRequest(job_id=job, updates=[
        cluster_pb2.PartitionInfoUpdate(data_set_id="ds-words", partition_index=0, producer_attempt=0)]),
        timeout=WAIT_S)
    for t in tasks:
        assert jm.wait_for_state(job, t.attempt, "FINISHED") == ["INITIALIZING", "RUNNING", "FINISHED"]
    assert jm.update_calls - calls_before < 3 * len(tasks)  # some updates shared a call
    # finished tasks leave their slot (which stays the job's until FreeSlot)
    with jm._cond:
        before = len(jm.heartbeats)
    jm.wait_for("a slot report with the job's slot and no running task", lambda: any(
        [(s.job_id, list(s.running)) for s in h.slot_report.slots] == [(job, []), ("", [])]
        for h in jm.heartbeats[before:] if h.task_manager_id == tm.id))


def test_release_partitions_deletes_what_it_names_and_whole_jobs(tm: TaskManagerProcess, jm: FakeJobManager,
                                                                  job: str) -> None:
    def partition(index: int, attempt_number: int = 0) -> Path:
        path = Path(layout.partition_dir(jm.data_dir, job, "ds-words", index, attempt_number))
        path.mkdir(parents=True)
        (path / "part-0.parquet").write_bytes(b"rows")
        return path

    # no-op producers write nothing; stand in for the files a real producer leaves behind
    p0, p1, foreign = partition(0), partition(1), partition(5, attempt_number=3)
    submit_ok(tm, producer(job, 0, slot=0), producer(job, 1, slot=1))
    for subtask in (0, 1):
        jm.wait_for_state(job, attempt("source", subtask), "FINISHED")

    tm.executor.ReleasePartitions(cluster_pb2.ReleasePartitionsRequest(job_id=job, partitions=[
        cluster_pb2.ResultPartitionRef(data_set_id="ds-words", partition_index=5, producer_attempt=3)]),
        timeout=WAIT_S)
    assert not foreign.exists() and p0.exists() and p1.exists()
    # whole_job: everything this TaskManager produced for the job
    tm.executor.ReleasePartitions(cluster_pb2.ReleasePartitionsRequest(job_id=job, whole_job=True), timeout=WAIT_S)
    assert not p0.exists() and not p1.exists()


def test_registers_again_after_the_jobmanager_restarts_or_forgets_it(own_tm: TaskManagerProcess,
                                                                     jm: FakeJobManager) -> None:
    tm = own_tm
    job_id = "job-restart"
    waiting = consumer(job_id)
    submit_ok(tm, waiting)
    jm.wait_for_state(job_id, waiting.attempt, "RUNNING")

    jm.restart()
    again = tm.registration(1)
    # the JobManager wrote the old registration's tasks off; the TaskManager forgot them
    assert [(s.job_id, len(s.running)) for s in again.slot_report.slots] == [("", 0), ("", 0)]
    assert again.address == tm.registration(0).address
    new_id = tm.registration_id(1)
    with jm._cond:
        before = len(jm.heartbeats)
    jm.wait_for("heartbeats of the new registration", lambda: any(
        h.registration_id == new_id for h in jm.heartbeats[before:]))

    jm.forget(tm.id)  # the next heartbeat is answered with `reregister`
    tm.registration(2)
    # That the forgotten task reports nothing more is the core's decision (test_taskexecutorstate.py).
    assert jm.states_of(job_id, waiting.attempt) == ["INITIALIZING", "RUNNING"]


def test_sigterm_stops_it_cleanly_within_ten_seconds(own_tm: TaskManagerProcess, jm: FakeJobManager) -> None:
    tm = own_tm
    job_id = "job-sigterm"
    waiting = consumer(job_id)
    submit_ok(tm, waiting)
    jm.wait_for_state(job_id, waiting.attempt, "RUNNING")

    started = time.monotonic()
    os.kill(tm.proc.pid, signal.SIGTERM)
    assert tm.proc.wait(10) == 0, tm.log_tail()
    assert time.monotonic() - started < 10
    # the JobManager learned why its task ended: it never asked for a cancellation
    assert jm.states_of(job_id, waiting.attempt)[-1] == "FAILED"
    assert "shutting down" in jm.last_update(job_id, waiting.attempt).failure.message


# ---------------------------------------------------------------------------- shared input gates


def update(tm: TaskManagerProcess, job_id: str, data_set: str, *partitions: int, producer_attempt: int = 0) -> None:
    tm.executor.UpdatePartitionInfo(cluster_pb2.UpdatePartitionInfoRequest(job_id=job_id, updates=[
        cluster_pb2.PartitionInfoUpdate(data_set_id=data_set, partition_index=p, producer_attempt=producer_attempt)
        for p in partitions]), timeout=WAIT_S)


def all_to_all_consumer(job_id: str, subtask: int, parallelism: int, partitions: int,
                        data_set: str = "ds-shared") -> cluster_pb2.TaskDeploymentDescriptor:
    """Subtask `subtask` of an ALL_TO_ALL consumer: it reads its subpartition of every one of
    `partitions` partitions, none available when it is deployed (eager, pipelined)."""
    d = consumer(job_id, slot=subtask % 2, data_set=data_set, subtask=subtask)
    d.parallelism = parallelism
    d.task_name = f"Sink ({subtask + 1}/{parallelism})"
    del d.inputs[:]
    d.inputs.add(input_index=0, data_set_id=data_set, partition_start=0, partition_end=partitions,
                 subpartition=subtask, uniform_attempt=-1)
    return d


def thread_count(tm: TaskManagerProcess) -> int:
    for line in Path(f"/proc/{tm.proc.pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no thread count in /proc")


def test_an_update_that_arrives_before_the_submission_counts(tm: TaskManagerProcess, jm: FakeJobManager,
                                                            job: str) -> None:
    update(tm, job, "ds-early", 0)
    early = consumer(job, data_set="ds-early")
    submit_ok(tm, early)
    assert jm.wait_for_state(job, early.attempt, "FINISHED") == ["INITIALIZING", "RUNNING", "FINISHED"]


def test_one_update_wakes_every_consumer_sharing_a_gate_and_none_holds_a_thread(
        tm: TaskManagerProcess, jm: FakeJobManager, job: str) -> None:
    n = 300
    tasks = [all_to_all_consumer(job, i, n, partitions=2) for i in range(n)]
    threads_before = thread_count(tm)
    submit_ok(tm, *tasks)
    for t in tasks:
        jm.wait_for_state(job, t.attempt, "RUNNING")
    # 300 tasks waiting for their inputs, and no thread for any of them
    assert thread_count(tm) < threads_before + 10
    update(tm, job, "ds-shared", 0)  # 1 of 2 (that nobody moves yet: test_taskexecutorstate.py)
    update(tm, job, "ds-shared", 1)  # one update, every consumer
    for t in tasks:
        assert jm.wait_for_state(job, t.attempt, "FINISHED") == ["INITIALIZING", "RUNNING", "FINISHED"]


def test_cancelling_tasks_waiting_on_a_shared_gate_ends_them_at_once_and_spares_the_others(
        tm: TaskManagerProcess, jm: FakeJobManager, job: str) -> None:
    n = 40
    tasks = [all_to_all_consumer(job, i, n, partitions=1, data_set="ds-cancel") for i in range(n)]
    submit_ok(tm, *tasks)
    for t in tasks:
        jm.wait_for_state(job, t.attempt, "RUNNING")
    cancelled, kept = tasks[::2], tasks[1::2]
    tm.executor.CancelTasks(cluster_pb2.CancelTasksRequest(job_id=job, attempts=[t.attempt for t in cancelled]),
                            timeout=WAIT_S)
    for t in cancelled:
        assert jm.wait_for_state(job, t.attempt, "CANCELED") == ["INITIALIZING", "RUNNING", "CANCELED"]
    assert all(jm.states_of(job, t.attempt) == ["INITIALIZING", "RUNNING"] for t in kept)
    update(tm, job, "ds-cancel", 0)
    for t in kept:
        assert jm.wait_for_state(job, t.attempt, "FINISHED") == ["INITIALIZING", "RUNNING", "FINISHED"]
    # reports leave in order: the kept ones' FINISHED came after anything the cancelled ones said
    assert all(jm.states_of(job, t.attempt) == ["INITIALIZING", "RUNNING", "CANCELED"] for t in cancelled)


def test_news_of_an_older_producer_attempt_does_not_release_a_later_consumer(
        tm: TaskManagerProcess, jm: FakeJobManager, job: str) -> None:
    update(tm, job, "ds-retry", 0, producer_attempt=0)
    # the producer runs again (attempt 1) here: partition 0 of attempt 0 is stale from now on
    again = producer(job, 0, slot=1, parallelism=1, data_set="ds-retry")
    again.attempt.attempt_number = 1
    submit_ok(tm, again)
    jm.wait_for_state(job, again.attempt, "FINISHED")
    waiting = consumer(job, data_set="ds-retry")
    submit_ok(tm, waiting)
    jm.wait_for_state(job, waiting.attempt, "RUNNING")
    # (that attempt 0 does not count: test_taskexecutorstate.py, without a process)
    update(tm, job, "ds-retry", 0, producer_attempt=1)
    assert jm.wait_for_state(job, waiting.attempt, "FINISHED") == ["INITIALIZING", "RUNNING", "FINISHED"]


def test_calls_for_another_registration_are_refused(tm: TaskManagerProcess, jm: FakeJobManager, job: str) -> None:
    """A deployment sent to a registration that is over (the TaskManager registered again since)
    must not start: the JobManager has already given that slot up."""
    with jm._cond:
        current = [i for r, i in zip(jm.registrations, jm.registration_ids) if r.task_manager_id == tm.id][-1]
    stale = consumer(job, vertex="stale")
    response = tm.executor.SubmitTasks(cluster_pb2.SubmitTasksRequest(tasks=[stale], registration_id="tm-old#0"),
                                       timeout=WAIT_S)
    assert not response.results[0].accepted and "lost the JobManager" in response.results[0].error
    fresh = consumer(job, vertex="fresh")
    response = tm.executor.SubmitTasks(cluster_pb2.SubmitTasksRequest(tasks=[fresh], registration_id=current),
                                       timeout=WAIT_S)
    assert response.results[0].accepted, response.results[0].error


def test_a_deployment_that_overtakes_the_answer_to_the_registration_is_accepted(
        own_tm: TaskManagerProcess, jm: FakeJobManager) -> None:
    """A JobManager deploys into a registration's slots as soon as it makes it; its SubmitTasks
    can reach the TaskManager before the answer to RegisterTaskManager does. The TaskManager waits
    for the registration in progress instead of refusing the deployment as stale (found by CI: a
    job recovered by a new leader failed that way)."""
    job_id = f"job-{uuid.uuid4().hex[:8]}"
    task = producer(job_id, 0, slot=0, parallelism=1)
    jm.deploy_on_register = lambda request, _: [task] if request.task_manager_id == own_tm.id else []
    try:
        jm.forget(own_tm.id)  # its next heartbeat is told to register again
        jm.wait_for("the deployment sent ahead of the registration's answer", lambda: jm.early_results)
    finally:
        jm.deploy_on_register = None
    (result,) = jm.early_results
    assert result.accepted, result.error
    assert jm.wait_for_state(job_id, task.attempt, "FINISHED") == ["INITIALIZING", "RUNNING", "FINISHED"]


def test_a_streaming_task_runs_the_micro_batches_it_is_sent_and_finishes_when_told(
        tm: TaskManagerProcess, jm: FakeJobManager, job: str) -> None:
    from funke.common.wire.codec import run_batch_to_proto
    from funke.common.streaming.checkpoint import SourceRange
    from funke.common.graph.executiongraph import ExecutionAttemptId
    from funke.common.streaming.sources import BatchInput

    task = producer(job, 0, slot=0, parallelism=1)
    task.streaming = True
    bounded = consumer(job, slot=1, vertex="bounded")
    submit_ok(tm, task, bounded)
    assert jm.wait_for_state(job, task.attempt, "RUNNING") == ["INITIALIZING", "RUNNING"]
    with jm._cond:
        registration = jm._known[tm.id]
    source = ExecutionAttemptId("source", 0, 0)
    for batch_id in (0, 1):
        batch = BatchInput(batch_id, 1000 * batch_id, {"source": SourceRange(batch_id * 10, batch_id * 10 + 10, 10)})
        response = tm.executor.RunBatches(run_batch_to_proto(job, registration, batch, [(source, [])]), timeout=WAIT_S)
        assert response.results[0].accepted, response.results[0].error
    done = jm.wait_for("both batches reported", lambda: [
        u for u in jm.updates if u.job_id == job and u.attempt == task.attempt and u.HasField("batch_id")]
        if len([u for u in jm.updates if u.job_id == job and u.HasField("batch_id")]) == 2 else None)
    assert [(u.batch_id, job_pb2.ExecutionState.Name(u.state)) for u in done] == [
        (0, "EXECUTION_STATE_RUNNING"), (1, "EXECUTION_STATE_RUNNING")]
    assert [p.data_set_id for p in done[0].produced] == ["ds-words"]
    # a task that is not a streaming one runs no batch, and says why
    other = ExecutionAttemptId("bounded", 0, 0)
    response = tm.executor.RunBatches(run_batch_to_proto(job, registration, BatchInput(2, 0), [(other, [(0, [0], "")])]),
                                      timeout=WAIT_S)
    assert not response.results[0].accepted and "not a streaming task" in response.results[0].error
    tm.executor.FinishTasks(cluster_pb2.FinishTasksRequest(job_id=job, registration_id=registration,
                                                           attempts=[task.attempt]), timeout=WAIT_S)
    assert jm.wait_for_state(job, task.attempt, "FINISHED")[-1] == "FINISHED"


def test_the_process_imports_the_task_runtime_and_the_metrics_server_only_after_starting_spark() -> None:
    # Spark's JVM boots for seconds: a TaskManager launches it before it loads PySpark's SQL
    # runtime, aiohttp and the operators (while the JVM boots), not after.
    probe = ("import sys, funke.taskmanager.main; "
             "print(sorted(m for m in ('pyspark', 'aiohttp', 'funke.taskmanager.task', 'funke.runtime.metricsserver') "
             "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


def test_py4j_retry_chatter_on_the_root_logger_is_dropped_and_nothing_else():
    """py4j logs a command it sends again with logging.info (the root logger) and a traceback;
    the TaskManager's handlers drop exactly that, not py4j's errors nor anyone else's INFO."""
    import logging

    import py4j.java_gateway

    from funke.taskmanager.main import quiet_py4j_retries

    def record(name: str, level: int, path: str) -> logging.LogRecord:
        return logging.LogRecord(name, level, path, 1, "Exception while sending command.", None, None)

    py4j_file = py4j.java_gateway.__file__
    assert not quiet_py4j_retries(record("root", logging.INFO, py4j_file))
    assert quiet_py4j_retries(record("root", logging.ERROR, py4j_file))  # its errors still show
    assert quiet_py4j_retries(record("root", logging.INFO, __file__))  # anyone else's root INFO too
    assert quiet_py4j_retries(record("funke.taskmanager", logging.INFO, __file__))
