"""The JobManager's Prometheus metrics, Flink's names under `funke_jobmanager_`: the cluster
(`numRegisteredTaskManagers`, `taskSlotsTotal`, `taskSlotsAvailable`, `numRunningJobs`) and each
job that has not ended (`job_numRestarts`, `job_uptime`, the time spent in each status as
`job_<status>Time`, and for streaming queries `job_lastBatchDuration` and, per partition of a
broker source, `job_sourceLag`), labelled job_id and job_name. Collected on the JobManager's loop at scrape time from the Dispatcher that serves now
(a standby reports only its own process)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from funke.common.states import JobStatus
from funke.common.streaming import progress
from funke.jobmanager.dispatcher import Dispatcher, DispatcherError

PREFIX = "funke_jobmanager_"
# Flink's names for the time a job spent in a status (ms), e.g. runningTime
STATUS_TIME = {JobStatus.CREATED: "createdTime", JobStatus.RUNNING: "runningTime",
               JobStatus.RESTARTING: "restartingTime", JobStatus.FAILING: "failingTime",
               JobStatus.CANCELLING: "cancellingTime"}


class JobManagerCollector(Collector):
    def __init__(self, current: Callable[[], Dispatcher], clock: Callable[[], float] = time.time) -> None:
        self._current = current
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        try:
            d = self._current()
        except DispatcherError:  # a standby: no cluster to describe
            return
        now = self._clock()
        overview = d.rm.overview()
        cluster = {
            "numRegisteredTaskManagers": ("TaskManagers registered", len(overview.task_managers)),
            "taskSlotsTotal": ("task slots in all", overview.slots_total),
            "taskSlotsAvailable": ("task slots free", overview.slots_free),
            "numRunningJobs": ("jobs that have not ended", sum(1 for jm in d.jobs.values() if not jm.status.is_terminal)),
        }
        for name, (doc, value) in cluster.items():
            yield GaugeMetricFamily(PREFIX + name, doc, value=value)
        labels = ["job_id", "job_name"]
        restarts = GaugeMetricFamily(PREFIX + "job_numRestarts", "failovers of the job so far", labels=labels)
        uptime = GaugeMetricFamily(PREFIX + "job_uptime", "ms since the job last became RUNNING (0 when it is not "
                                   "running)", labels=labels)
        spent = {status: GaugeMetricFamily(PREFIX + "job_" + name, f"ms the job spent {status.value} (all runs)",
                                           labels=labels) for status, name in STATUS_TIME.items()}
        batch = GaugeMetricFamily(PREFIX + "job_lastBatchDuration", "ms the streaming query's latest micro-batch took",
                                  labels=labels)
        lag = GaugeMetricFamily(PREFIX + "job_sourceLag", "records a broker source's partition (Kafka) or stream key "
                                "(Redis) held after the latest batch's end when it was planned",
                                labels=[*labels, "source", "stream", "partition"])
        for jm in list(d.jobs.values()):
            if jm.status.is_terminal:
                continue
            job = [jm.job_id, jm.graph.job_graph.name]
            restarts.add_metric(job, jm.scheduler.num_restarts)
            times, entered, current = _time_per_status(jm.graph.status_history(), jm.graph.status_machine.created_at)
            times[current] = times.get(current, 0.0) + max(now - entered, 0.0)
            uptime.add_metric(job, (now - entered) * 1000 if current is JobStatus.RUNNING else 0)
            for status, family in spent.items():
                family.add_metric(job, times.get(status, 0.0) * 1000)
            query = getattr(jm, "query", None)
            latest = query.progress[-1] if query is not None and query.progress else None
            if latest is not None:
                duration = (latest.get("durationMs") or {}).get("triggerExecution")
                if isinstance(duration, (int, float)):
                    batch.add_metric(job, duration)
                for source, stream, partition, behind in progress.source_lags(latest):
                    lag.add_metric([*job, source, stream, partition], behind)
        yield restarts
        yield uptime
        yield from spent.values()
        yield batch
        yield lag


def _time_per_status(history: list, created_at: float) -> tuple[dict[JobStatus, float], float, JobStatus]:
    """Seconds spent in each status over the recorded transitions, when the current status was
    entered, and which it is."""
    times: dict[JobStatus, float] = {}
    status, since = JobStatus.CREATED, created_at
    for entry in history:
        t = entry.transition
        times[status] = times.get(status, 0.0) + max(t.timestamp - since, 0.0)
        status, since = t.to_state, t.timestamp
    return times, since, status
