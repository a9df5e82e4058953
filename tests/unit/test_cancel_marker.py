"""A cancelled attempt's Python workers end themselves when its cancel marker appears."""

from __future__ import annotations

import multiprocessing
import signal
import time

import pyarrow as pa

from funke.common import layout
from funke.taskmanager.operators import udf


def slow_identity(batches):
    for batch in batches:
        time.sleep(0.2)
        yield batch


def batches(n: int):
    for i in range(n):
        yield pa.record_batch({"n": [i]})


def test_the_marker_is_a_local_path_per_attempt_or_none_for_remote_data_dirs():
    assert layout.cancel_marker("/data", "j", "v", 2, 3) == "/data/jobs/j/cancelled/v-s2-a3"
    assert layout.cancel_marker("file:///data/", "j", "v", 0, 1) == "/data/jobs/j/cancelled/v-s0-a1"
    assert layout.cancel_marker("file://localhost/data", "j", "v", 0, 1) == "/data/jobs/j/cancelled/v-s0-a1"
    assert layout.cancel_marker("s3a://bucket/data", "j", "v", 0, 0) is None
    assert layout.cancel_marker("hdfs://nn/data", "j", "v", 0, 0) is None
    # a vertex id never leads out of the job's cancelled/ directory
    assert layout.cancel_marker("/data", "j", "../../etc/x y", 0, 0) == "/data/jobs/j/cancelled/_.._etc_x_y-s0-a0"


def test_a_relative_data_dir_is_resolved_where_the_marker_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert layout.cancel_marker("data", "j", "v", 0, 0) == f"{tmp_path}/data/jobs/j/cancelled/v-s0-a0"


def _consume(fn, n: int) -> None:
    for _ in fn(batches(n)):
        pass


def test_a_worker_kills_itself_once_the_marker_appears(tmp_path):
    marker = tmp_path / "cancelled" / "v-s0-a0"
    watched = udf.cancellable(slow_identity, str(marker))
    worker = multiprocessing.get_context("fork").Process(target=_consume, args=(watched, 1000))  # 200 s of work
    worker.start()
    time.sleep(0.5)
    assert worker.is_alive()
    marker.parent.mkdir()
    marker.touch()
    worker.join(30)
    assert worker.exitcode == -signal.SIGKILL


def test_without_a_marker_the_work_ends_normally(tmp_path):
    watched = udf.cancellable(slow_identity, str(tmp_path / "never"))
    worker = multiprocessing.get_context("fork").Process(target=_consume, args=(watched, 3))
    worker.start()
    worker.join(30)
    assert worker.exitcode == 0


def test_the_process_that_planned_the_job_is_never_killed(tmp_path):
    marker = tmp_path / "marker"
    marker.touch()
    watched = udf.cancellable(slow_identity, str(marker))
    assert [b.column(0).to_pylist() for b in watched(batches(3))] == [[0], [1], [2]]
    assert udf.cancellable(slow_identity, None) is slow_identity
