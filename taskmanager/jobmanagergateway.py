"""What the TaskExecutor needs of the JobManager, as Flink's TaskExecutor sees its
ResourceManagerGateway and JobMasterGateway: register, keep a heartbeat stream open, report task
states. The shell (`taskexecutor.py`) talks to this interface only; `grpcgateway.py` is the real
one, and tests run the shell against an in-process fake.

Failures are `GatewayError` carrying the gRPC status code's name, which the registration core
(`common/task/registration.py`) classifies (a refusal, a report refused for good, "not now").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Mapping, Protocol

from funke.common.graph.deployment import TaskReport
from funke.common.task.registration import Registration


class GatewayError(Exception):
    """The JobManager answered with an error, or could not be reached."""

    def __init__(self, code: str, detail: str):
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


@dataclass(frozen=True, slots=True)
class RegistrationRequest:
    task_manager_id: str
    address: str  # where the JobManager calls us
    number_of_slots: int
    resources: Mapping[str, str]
    token: str  # from now on the only one the TaskExecutor service takes


class HeartbeatStream(Protocol):
    async def send(self, registration_id: str) -> None:
        """One heartbeat with the current slot report."""

    async def read(self) -> bool | None:
        """The next answer: whether it asks to register again; None when the stream ended."""

    def close(self) -> None: ...


class JobManagerGateway(Protocol):
    address: str  # the JobManager's, as last connected to

    def connect(self, address: str) -> None:
        """Talk to the JobManager at `address` from now on (a new leader)."""

    async def register(self, request: RegistrationRequest, timeout_s: float) -> Registration: ...

    def heartbeat(self) -> HeartbeatStream: ...

    async def update_task_states(self, reports: Sequence[TaskReport], current: Callable[[], bool],
                                 timeout_s: float) -> bool:
        """Send the reports in one call; False (nothing sent) once `current()` says they are
        for a registration that is over. CancelledError when `cancel_reports` cut the call off."""

    def cancel_reports(self) -> None:
        """Cut off the report call in flight, if any."""

    async def close(self) -> None: ...
