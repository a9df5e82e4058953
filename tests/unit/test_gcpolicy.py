"""runtime/gcpolicy.py: the collector is paused while a job is built, and comes back as it was."""

from __future__ import annotations

import gc

import pytest

from funke.runtime import gcpolicy


def test_paused_stops_the_collector_inside_and_restores_it_after():
    assert gc.isenabled()
    with gcpolicy.paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        with gcpolicy.paused():
            raise RuntimeError("building the graph failed")
    assert gc.isenabled()  # also after a failure


def test_paused_leaves_a_disabled_collector_disabled():
    gc.disable()
    try:
        with gcpolicy.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_dispatcher_builds_a_job_with_the_collector_paused(monkeypatch):
    from funke.common.configuration import ClusterConfiguration
    from funke.common.graph.jobgraph import ResultPartitionType
    from funke.jobmanager import dispatcher as d
    from tests.conformance.graphs import source_sink_all_to_all

    seen = []
    real = d.ExecutionGraph

    def graph(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(d, "ExecutionGraph", graph)
    dispatcher = d.Dispatcher.__new__(d.Dispatcher)
    dispatcher.config = ClusterConfiguration()
    built, scheduler, _ = dispatcher._build(source_sink_all_to_all(4, ResultPartitionType.BLOCKING), "j", 0.0)
    assert seen == [False] and gc.isenabled()
    assert scheduler.graph is built and len(built.vertices["sink"].task_vertices) == 4


def test_large_running_jobs_get_rarer_collections_and_small_ones_cpythons():
    before = gc.get_threshold()
    try:
        assert gcpolicy.running_subtasks(20_000) == gcpolicy.LARGE_JOBS_THRESHOLDS
        assert gcpolicy.running_subtasks(gcpolicy.LARGE_JOBS_SUBTASKS - 1) == gcpolicy.DEFAULT_THRESHOLDS == (700, 10, 10)
        assert gcpolicy.running_subtasks(0) == gcpolicy.DEFAULT_THRESHOLDS
    finally:
        gc.set_threshold(*before)


def test_the_dispatcher_counts_the_running_jobs_subtasks(monkeypatch):
    from types import SimpleNamespace

    from funke.jobmanager import dispatcher as d

    counted = []
    monkeypatch.setattr(d.gcpolicy, "running_subtasks", counted.append)
    dispatcher = d.Dispatcher.__new__(d.Dispatcher)
    dispatcher.jobs = {"a": SimpleNamespace(graph=SimpleNamespace(number_of_vertices=lambda: 12_000)),
                       "b": SimpleNamespace(graph=SimpleNamespace(number_of_vertices=lambda: 8))}
    dispatcher._count_subtasks()
    del dispatcher.jobs["a"]
    dispatcher._count_subtasks()
    assert counted == [12_008, 8]


def test_a_stopped_dispatcher_leaves_cpythons_thresholds(tmp_path):
    """A leader that loses leadership while a large job runs drops the job without archiving
    it: the rare collections for large jobs must not outlive its dispatcher."""
    import asyncio

    from funke.common.configuration import ClusterConfiguration
    from funke.jobmanager.dispatcher import Dispatcher

    before = gc.get_threshold()
    try:
        gcpolicy.running_subtasks(200_000)

        async def scenario() -> None:
            dispatcher = Dispatcher(ClusterConfiguration(data_dir=str(tmp_path)))
            await dispatcher.stop("the JobManager lost leadership")

        asyncio.run(scenario())
        assert gc.get_threshold() == gcpolicy.DEFAULT_THRESHOLDS
    finally:
        gc.set_threshold(*before)
