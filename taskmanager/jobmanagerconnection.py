"""The TaskManager's connection to the JobManager, carried out: the registration core
(`common/task/registration.py`) decides, this driver does what it says through the JobManager
gateway (`jobmanagergateway.py`) and the HA services (Flink: the TaskExecutor's connection to its
ResourceManager, with RetryingRegistration and the heartbeat manager in the core).

One event at a time, on the TaskManager's loop: what the attempts, the lease lookups and the
heartbeat stream learn is posted as an event, and the core's instructions for it are carried out
before the next event is taken. With high availability the JobManager is whoever holds the lease:
each attempt looks the leader up, the lease is read every 0.2 s while an attempt waits (the core
abandons one made to a deposed leader: a paused leader never answers) and at every heartbeat (a
new epoch ends the registration; what the deposed leader still sends names a registration that
is over, and is refused).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import secrets
import time
from typing import Any, Awaitable, Callable, Protocol

from grpc_health.v1 import health, health_pb2

from funke.common.leadership import Lease
from funke.common.security import TOKEN_BYTES, Realm
from funke.common.task import registration as reg
from funke.common.task.registration import Registration
from funke.runtime import datafs
from funke.runtime.haservices import ha_services
from funke.runtime.rpc import advertised_host, host_port
from funke.taskmanager.jobmanagergateway import GatewayError, JobManagerGateway, RegistrationRequest
from funke.taskmanager.taskexecutorconfig import TaskExecutorConfig

log = logging.getLogger("funke.taskmanager")

RPC_TIMEOUT_S = 10.0
# While a registration waits for its answer, how often the leader is looked up again (with high
# availability): a new epoch ends the wait at once instead of after the RPC timeout.
LEADER_POLL_S = 0.2
HEALTH_SERVICES = ("", "funke.v1.TaskExecutor")  # SERVING while registered


class Registrant(Protocol):
    """What the connection needs of its TaskManager (the TaskExecutor): the whole seam."""

    id: str
    config: TaskExecutorConfig
    address: str | None  # where the JobManager calls it: set by each attempt
    bound_port: int

    @property
    def registration_id(self) -> str: ...  # the registration its task core knows ("" before the first)

    def resources(self) -> dict[str, str]: ...  # sent with each registration

    def jobmanager_registered(self, registration: Registration) -> None: ...

    def registered_first_time(self) -> None: ...

    def jobmanager_lost(self, reason: str) -> None: ...


class JobManagerConnection:
    def __init__(self, executor: Registrant, gateway: JobManagerGateway | None,
                 health_servicer: health.aio.HealthServicer, ha: Any = None):
        self._executor = executor
        self.gateway = gateway  # the gRPC one, set by the TaskExecutor's start, unless one is given
        self._health = health_servicer
        cfg = executor.config
        self._ha = ha if ha is not None else ha_services(cfg.ha) if cfg.ha is not None else None
        self._ha_io = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="funke-ha")
        self.core = reg.Connection(executor.id, ha=self._ha is not None)
        # Set while registered; cleared from losing the JobManager until registered again.
        self.registered = asyncio.Event()
        self.token = ""  # sent with the latest registration; "" before the first
        self._events: asyncio.Queue[reg.Event] = asyncio.Queue()
        self._tasks: set[asyncio.Task[None]] = set()  # attempts, lookups, the heartbeat stream
        self._timers: set[asyncio.TimerHandle] = set()
        self._attempt: asyncio.Task[None] | None = None
        self._heartbeats: asyncio.Task[None] | None = None
        self._heartbeat_due: asyncio.Event | None = None

    @property
    def registration(self) -> Registration | None:
        return self.core.registration

    @property
    def address(self) -> str:
        """The JobManager's; with high availability the leader's, as last looked up."""
        return self.gateway.address if self.gateway is not None else self._executor.config.jobmanager_address

    def accepted_tokens(self, realm: Realm) -> tuple[str, ...]:
        return (self.token,) if realm is Realm.REGISTRATION and self.token else ()

    def _post(self, event: reg.Event) -> None:
        self._events.put_nowait(event)

    def _spawn(self, coroutine: Any, name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coroutine, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def run(self) -> None:
        """Runs for the life of the TaskManager."""
        event: reg.Event = reg.Start()
        try:
            while True:
                for instruction in self.core.handle(event, asyncio.get_running_loop().time()):
                    await _INSTRUCTIONS[type(instruction)](self, instruction)
                event = await self._events.get()
        finally:
            self.core.handle(reg.Stop(), asyncio.get_running_loop().time())
            for handle in self._timers:
                handle.cancel()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def close(self) -> None:
        if self._ha is not None:
            await asyncio.get_running_loop().run_in_executor(self._ha_io, self._ha.close)
        self._ha_io.shutdown(wait=False)
        if self.gateway is not None:
            await self.gateway.close()

    async def registration_known(self, registration_id: str) -> None:
        """A JobManager call naming a registration this TaskManager does not know yet may have
        overtaken the answer to our registration: the core says how long to wait for it."""
        for i in self.core.handle(reg.CallArrived(registration_id), asyncio.get_running_loop().time()):
            if isinstance(i, reg.AwaitRegistration) and registration_id != self._executor.registration_id:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.registered.wait(), i.timeout_s)

    # ------------------------------------------------------------------ the instructions

    async def _current_leader(self) -> Lease | None:
        """The lease if it names a live leader, else None. Looked up off the event loop (a
        ZooKeeper read may wait for its server)."""
        assert self._ha is not None
        lease = await asyncio.get_running_loop().run_in_executor(self._ha_io, self._ha.leader)
        return lease if lease is not None and lease.valid(time.time()) else None

    async def _read_lease(self) -> None:
        lease = await self._current_leader()
        self._post(reg.LeaseRead(lease.epoch if lease else None, lease.address if lease else ""))

    async def _look_up_leader(self, i: reg.LookUpLeader) -> None:
        async def look() -> None:
            lease = await self._current_leader()
            self._post(reg.NoLeader() if lease is None else reg.LeaderFound(lease.epoch, lease.address))

        self._spawn(look(), "leader-lookup")

    async def _send_registration(self, i: reg.SendRegistration) -> None:
        self._attempt = self._spawn(self._register(i.address, i.epoch), "registration")

    async def _register(self, address: str, epoch: int | None) -> None:
        assert self.gateway is not None
        x, cfg = self._executor, self._executor.config
        if address:
            if self.gateway.address != address:
                log.info("TaskManager %s follows the leader to %s", x.id, address)
            self.gateway.connect(address)
        loop = asyncio.get_running_loop()
        # Off the loop: a JobManager given by name is resolved to find the route to it.
        host = await loop.run_in_executor(None, advertised_host, cfg.host, cfg.advertise_host, self.address)
        x.address = host_port(host, x.bound_port)
        # A new secret per attempt: from now on only the JobManager that receives it may call us
        # (the one registered with before, a deposed leader included, no longer can).
        self.token = secrets.token_hex(TOKEN_BYTES)
        answer = asyncio.ensure_future(self.gateway.register(RegistrationRequest(
            x.id, x.address, cfg.number_of_slots, x.resources(), self.token), RPC_TIMEOUT_S))
        try:
            while epoch is not None and not answer.done():
                await asyncio.wait({answer}, timeout=LEADER_POLL_S)
                if not answer.done():
                    await self._read_lease()
            registration = await answer
        except GatewayError as e:
            self._post(reg.RegistrationFailed(e.code, e.detail, self.address))
            return
        finally:
            if not answer.done():
                answer.cancel()
                await asyncio.gather(answer, return_exceptions=True)
        if not cfg.data_dir:
            try:  # off the loop: an HDFS client starts a JVM
                await loop.run_in_executor(None, datafs.check, registration.data_dir)
            except datafs.DataDirError as e:  # Spark may still reach it; funke's own file work cannot
                log.error("TaskManager %s: the JobManager's data directory is out of reach here: %s", x.id, e)
        self._post(reg.RegistrationAccepted(registration, self.address))

    async def _abandon_attempt(self, i: reg.AbandonAttempt) -> None:
        if self._attempt is not None:
            self._attempt.cancel()

    async def _start_timer(self, i: reg.StartTimer) -> None:
        self._timers.add(asyncio.get_running_loop().call_later(i.delay_s, self._post, reg.TimerFired(i.timer)))

    async def _serving(self, status: int) -> None:
        for service in HEALTH_SERVICES:
            await self._health.set(service, status)

    async def _now_registered(self, i: reg.Registered) -> None:
        r = i.registration
        log.info("TaskManager %s registered with the JobManager at %s as %s (%d slots, address %s, "
                 "heartbeat every %g s, data dir %s)", self._executor.id, self.address, r.registration_id,
                 self._executor.config.number_of_slots, self._executor.address, r.heartbeat_interval_s,
                 self._executor.config.data_dir or r.data_dir or "(default)")
        cfg = self._executor.config
        on_cluster = bool(cfg.spark_master) and not cfg.spark_master.startswith("local") and not cfg.spark_remote
        if i.first and cfg.use_spark and on_cluster and r.heartbeat_timeout_s != cfg.heartbeat_timeout_s:
            # Spark's network timeouts were derived from this TaskManager's own setting when its
            # session started, before the JobManager could tell its own.
            log.warning("TaskManager %s: the JobManager gives a silent TaskManager up after %g s (heartbeat.timeout), "
                        "this TaskManager's Spark network timeouts were derived from %g s: give it the JobManager's "
                        "-D heartbeat.timeout (or the same --config)", self._executor.id, r.heartbeat_timeout_s,
                        cfg.heartbeat_timeout_s)
        self._executor.jobmanager_registered(r)
        self.registered.set()
        await self._serving(health_pb2.HealthCheckResponse.SERVING)
        if i.first:
            self._executor.registered_first_time()
        self._heartbeat_due = asyncio.Event()
        self._heartbeats = self._spawn(self._heartbeat(r, self._heartbeat_due), "heartbeat")

    async def _send_heartbeat(self, i: reg.SendHeartbeat) -> None:
        if self._heartbeat_due is not None:
            self._heartbeat_due.set()

    async def _heartbeat(self, registration: Registration, due: asyncio.Event) -> None:
        """One heartbeat stream: a heartbeat each time the core asks for one; answers, its end,
        the lease (with high availability) and the interval's passing go to the core."""
        assert self.gateway is not None
        stream = self.gateway.heartbeat()

        async def read_answers() -> None:
            while (reregister := await stream.read()) is not None:
                self._post(reg.HeartbeatAnswered(reregister))
            self._post(reg.HeartbeatEnded("the JobManager closed the heartbeat stream"))

        reader = asyncio.create_task(read_answers(), name="heartbeat-reader")
        try:
            while True:
                await due.wait()
                due.clear()
                await stream.send(registration.registration_id)
                done, _ = await asyncio.wait({reader}, timeout=registration.heartbeat_interval_s)
                if done:
                    reader.result()
                    return
                if self._ha is not None:
                    await self._read_lease()
                self._post(reg.HeartbeatDue())
        except GatewayError as e:
            self._post(reg.HeartbeatEnded(f"heartbeat stream broke: {e}"))
        except asyncio.InvalidStateError:  # written to a stream that had ended cleanly
            self._post(reg.HeartbeatEnded("the heartbeat stream ended"))
        finally:
            reader.cancel()
            stream.close()
            await asyncio.gather(reader, return_exceptions=True)

    async def _lost(self, i: reg.Lost) -> None:
        if self._heartbeats is not None:
            self._heartbeats.cancel()
            await asyncio.gather(self._heartbeats, return_exceptions=True)
            self._heartbeats = self._heartbeat_due = None
        self.registered.clear()
        await self._serving(health_pb2.HealthCheckResponse.NOT_SERVING)
        self._executor.jobmanager_lost(i.reason)
        if self.gateway is not None:
            # Its reports are for the registration just lost: waiting out the RPC timeout of a
            # JobManager that does not answer would hold back the next registration's.
            self.gateway.cancel_reports()

    async def _log(self, i: reg.Log) -> None:
        log.log(i.level, "%s", i.message)

    async def _await_registration(self, i: reg.AwaitRegistration) -> None:
        pass  # see registration_known: asked for by a call, not by the connection


_INSTRUCTIONS: dict[type, Callable[[JobManagerConnection, Any], Awaitable[None]]] = {
    reg.LookUpLeader: JobManagerConnection._look_up_leader,
    reg.SendRegistration: JobManagerConnection._send_registration,
    reg.AbandonAttempt: JobManagerConnection._abandon_attempt,
    reg.StartTimer: JobManagerConnection._start_timer,
    reg.Registered: JobManagerConnection._now_registered,
    reg.SendHeartbeat: JobManagerConnection._send_heartbeat,
    reg.Lost: JobManagerConnection._lost,
    reg.AwaitRegistration: JobManagerConnection._await_registration,
    reg.Log: JobManagerConnection._log,
}
