"""The TaskExecutor shell against an in-process JobManager gateway: no JobManager process, no
gRPC toward it, leases from a fake HA service. What the registration core decides (common/task/
registration.py, tested alone in test_registration.py) is seen carried out here: registering,
retrying, following a new leader, losing the registration and registering again, reports that
are refused or cut off."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from funke.common.leadership import Lease
from funke.common.states import ExecutionState
from funke.common.task import taskexecutorstate as core
from funke.common.task.registration import Registration
from funke.taskmanager.jobmanagergateway import GatewayError, RegistrationRequest
from funke.taskmanager.taskexecutor import TaskExecutor, TaskExecutorConfig
from tests.unit.test_taskexecutorstate import NOOP_SOURCE, deployment, gate

WAIT_S = 20.0
E = ExecutionState


class FakeStream:
    def __init__(self, gateway: FakeGateway):
        self._gateway = gateway
        self._answers: asyncio.Queue[bool | None] = asyncio.Queue()
        self.closed = False

    async def send(self, registration_id: str) -> None:
        self._gateway.heartbeats.append(registration_id)
        await self._answers.put(self._gateway.reregister)

    async def read(self) -> bool | None:
        return await self._answers.get()

    def end(self) -> None:
        self._answers.put_nowait(None)

    def close(self) -> None:
        self.closed = True


class FakeGateway:
    """A JobManager (or several, one per address) as the TaskExecutor sees it."""

    def __init__(self):
        self.address = "jm-a:1"
        self.connected: list[str] = []
        self.requests: list[tuple[str, RegistrationRequest]] = []
        self.answers: list[GatewayError | str] = []  # per registration, in order; "hang"; empty: accept
        self.epochs = {"jm-a:1": 1, "jm-b:1": 2}
        self.given_up: list[str] = []  # what was cut off: "register@<address>", "reports@<address>"
        self.streams: list[FakeStream] = []
        self.heartbeats: list[str] = []
        self.reregister = False
        self.reports: list[tuple[str, tuple]] = []
        self.report_answers: list[GatewayError | str] = []
        self._report_call: asyncio.Future | None = None

    def connect(self, address: str) -> None:
        self.connected.append(address)
        self.address = address

    async def _hang(self, what: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            self.given_up.append(f"{what}@{self.address}")

    async def register(self, request: RegistrationRequest, timeout_s: float) -> Registration:
        self.requests.append((self.address, request))
        answer = self.answers.pop(0) if self.answers else "accept"
        if answer == "hang":
            await self._hang("register")
        if isinstance(answer, GatewayError):
            raise answer
        return Registration(f"reg-{len(self.requests)}", 0.02, 10.0, "/data", self.epochs.get(self.address, 0))

    def heartbeat(self) -> FakeStream:
        self.streams.append(FakeStream(self))
        return self.streams[-1]

    async def update_task_states(self, reports, current, timeout_s: float) -> bool:
        if not current():
            return False
        self.reports.append((self.address, tuple(reports)))
        answer = self.report_answers.pop(0) if self.report_answers else "ok"
        if answer == "hang":
            self._report_call = asyncio.ensure_future(self._hang("reports"))
            try:
                await self._report_call
            finally:
                self._report_call = None
        if isinstance(answer, GatewayError):
            raise answer
        return True

    def cancel_reports(self) -> None:
        if self._report_call is not None:
            self._report_call.cancel()

    async def close(self) -> None:
        pass


class FakeLeases:
    def __init__(self, address: str = "jm-a:1", epoch: int = 1):
        self.lease: Lease | None = Lease("jm", epoch, address, 1e12, 1e6)

    def elect(self, address: str, epoch: int) -> None:
        self.lease = Lease("jm", epoch, address, 1e12, 1e6)

    def leader(self) -> Lease | None:
        return self.lease

    def close(self) -> None:
        pass


async def until(what: str, condition: Callable[[], object]) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"waited {WAIT_S} s for {what}"
        await asyncio.sleep(0.01)


def run(scenario: Callable[[TaskExecutor, FakeGateway], Awaitable[None]], leases: FakeLeases | None = None,
        answers: tuple = ()) -> None:
    """Run `scenario` against a started TaskExecutor; its first registrations get `answers`."""
    gateway = FakeGateway()
    gateway.answers = list(answers)
    executor = TaskExecutor(TaskExecutorConfig("tm-1", jobmanager_address="jm-a:1", number_of_slots=2,
                                               use_spark=False), gateway=gateway, ha=leases)

    async def main() -> None:
        running = asyncio.create_task(executor.run())
        try:
            await until("the TaskExecutor to start", lambda: executor.address or running.done())
            await scenario(executor, gateway)
        finally:
            executor.stop()
            await asyncio.wait_for(running, WAIT_S)

    asyncio.run(main())
    assert executor.failure == ""


def test_it_registers_its_slots_and_address_and_heartbeats_name_the_registration():
    async def scenario(x: TaskExecutor, gw: FakeGateway) -> None:
        await until("a heartbeat", lambda: len(gw.heartbeats) >= 3)
        address, request = gw.requests[0]
        assert (address, request.task_manager_id, request.number_of_slots) == ("jm-a:1", "tm-1", 2)
        assert request.address == x.address and request.token
        assert set(gw.heartbeats) == {"reg-1"} and x.core.registration_id == "reg-1"

    run(scenario)


def test_an_unanswered_and_a_refused_registration_are_asked_again(caplog):
    async def scenario(x: TaskExecutor, gw: FakeGateway) -> None:
        await until("the third attempt to be accepted", lambda: x.registration is not None)
        assert len(gw.requests) == 3
        assert len({r.token for _, r in gw.requests}) == 3  # a new secret per attempt

    with caplog.at_level(logging.INFO, logger="funke.taskmanager"):
        run(scenario, answers=(GatewayError("UNAVAILABLE", "starting"),
                               GatewayError("FAILED_PRECONDITION", "cannot reach")))
    text = caplog.text
    assert "JobManager at jm-a:1 does not answer yet (UNAVAILABLE: starting); retrying" in text
    assert "the JobManager at jm-a:1 refused the registration: cannot reach; retrying" in text


def test_a_closed_heartbeat_stream_forgets_every_task_and_registers_again():
    async def scenario(x: TaskExecutor, gw: FakeGateway) -> None:
        await until("registered", lambda: x.registration is not None)
        waiting = deployment(inputs=[gate(range(1))])  # a no-op that waits for its input
        assert any(isinstance(i, core.TaskAccepted) for i in x.handle(core.SubmitTask(waiting, "reg-1")))
        assert x.core.live_tasks() == 1
        gw.streams[0].end()
        await until("the second registration", lambda: x.core.registration_id == "reg-2")
        assert x.core.live_tasks() == 0 and gw.streams[0].closed
        assert gw.requests[1][1].token != gw.requests[0][1].token

    run(scenario)


def test_a_heartbeat_answer_asking_to_register_again_is_obeyed():
    async def scenario(x: TaskExecutor, gw: FakeGateway) -> None:
        await until("registered", lambda: x.registration is not None)
        gw.reregister = True
        await until("another registration", lambda: len(gw.requests) >= 2)

    run(scenario)


def test_a_registration_waiting_on_a_hung_leader_is_given_up_for_the_new_leader(caplog):
    leases = FakeLeases("jm-a:1", 1)

    async def scenario(x: TaskExecutor, gw: FakeGateway) -> None:
        await until("the registration the old leader never answers", lambda: gw.requests)
        leases.elect("jm-b:1", 2)
        await until("registered with the new leader", lambda: x.registration is not None)
        assert gw.given_up == ["register@jm-a:1"]
        assert [a for a, _ in gw.requests] == ["jm-a:1", "jm-b:1"] and x.registration.leader_epoch == 2

    with caplog.at_level(logging.INFO, logger="funke.taskmanager"):
        run(scenario, leases, answers=("hang",))
    assert "a new leader was elected (epoch 2, at jm-b:1) while registering with jm-a:1" in caplog.text
    assert "does not answer yet" not in caplog.text


def test_a_report_waiting_on_a_hung_leader_is_given_up_when_the_taskmanager_follows_the_new_leader():
    leases = FakeLeases("jm-a:1", 1)

    async def scenario(x: TaskExecutor, gw: FakeGateway) -> None:
        await until("registered", lambda: x.registration is not None)
        gw.report_answers = ["hang"]
        x.handle(core.SubmitTask(deployment(ops=NOOP_SOURCE), "reg-1"))
        await until("a report the old leader never answers", lambda: gw.reports)
        leases.elect("jm-b:1", 2)
        await until("registered with the new leader", lambda: x.registration and x.registration.leader_epoch == 2)
        await until("the hung report to be cut off", lambda: "reports@jm-b:1" in gw.given_up
                    or "reports@jm-a:1" in gw.given_up)
        assert len(gw.reports) == 1  # written off with the old registration: not sent to the new leader

    run(scenario, leases)


def test_a_refused_progress_report_fails_the_task_here_and_its_refused_end_lets_it_go():
    async def scenario(x: TaskExecutor, gw: FakeGateway) -> None:
        await until("registered", lambda: x.registration is not None)
        refusal = GatewayError("NOT_FOUND", "no such attempt")
        gw.report_answers = [refusal, refusal]
        waiting = deployment(inputs=[gate(range(1))])
        x.handle(core.SubmitTask(waiting, "reg-1"))
        await until("the end reported and refused", lambda: len(gw.reports) == 2)
        [end] = gw.reports[1][1]
        assert end.state is E.FAILED and end.failure.exception_type == "ReportRefused"
        assert "NOT_FOUND: no such attempt" in end.failure.message
        await until("the task let go", lambda: not x.core.tasks)

    run(scenario)


def test_a_jobs_vertex_is_decoded_once_and_forgotten_when_the_core_drops_the_job():
    from funke.common.wire.codec import vertex_to_proto
    from funke.taskmanager.taskexecutorservice import DecodedVertices

    vertices = DecodedVertices()
    m = vertex_to_proto(deployment().vertex)
    first = vertices.get("job-1", m)
    assert first == deployment().vertex and vertices.get("job-1", m) is first  # the P subtasks share it
    other = vertices.get("job-2", m)
    assert other is not first
    vertices.drop("job-1")
    assert vertices.get("job-1", m) is not first and vertices.get("job-2", m) is other
    vertices.drop()  # "" : every job
    assert vertices.get("job-2", m) is not other
