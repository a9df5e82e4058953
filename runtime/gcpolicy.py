"""How the JobManager keeps Python's cycle collector out of the way of large jobs.

A job's ExecutionGraph and Scheduler are millions of objects at P = 100 000 (subtasks, attempts,
partitions, regions, transitions), alive as long as the job. The collector's full collections
walk every one of them, and with CPython's thresholds they run every ~70 000 allocations, which
scheduling reaches within milliseconds:

- building a job: no garbage at all, yet the collector ran all along; the JobManager builds a
  job with it paused (`paused`): P = 100 000 initialization 3.06 -> 1.47 s (bench_scheduler.py);
- running large jobs: with 200 000 subtasks running, the collections stalled the JobManager's
  loop until a TaskManager's heartbeat connection closed and the job failed (bench_deploy.py
  --p 100000 --task-managers 8, twice); at P = 10 000 they were about 30% of scheduling. So while
  the running jobs have LARGE_JOBS_SUBTASKS subtasks or more, young collections wait for 100 000
  allocations and full ones for 100 middle ones (`running_subtasks`): 200 000 tasks FINISHED in
  25-28 s. Below that, CPython's thresholds: the graphs of ended jobs (cyclic: subtasks point at
  their job vertex and back) are freed soon. With the large thresholds always on, a barrage of
  600 small jobs (tests/integration/test_api_fuzz.py) grew the JobManager by 370-400 MiB, against
  90-330 MiB with CPython's.
- deciding: a JobMaster's decision (one scheduler event and carrying out its actions) runs with
  the collector paused. Its actions (a transition record for every subtask it moved, a
  deployment for every subtask it placed) are freed by reference counting when it ends, before a
  collection could walk them: P = 100 000 PIPELINED global failover 4.26 -> 3.26 s
  (bench_scheduler.py, whose decisions are paused alike).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

# From this many subtasks of running jobs on, LARGE_JOBS_THRESHOLDS; below, CPython's defaults.
# (allocations before a young collection, young collections before a middle one, middle ones
# before a full one)
LARGE_JOBS_SUBTASKS = 10_000
LARGE_JOBS_THRESHOLDS = (100_000, 20, 100)
DEFAULT_THRESHOLDS = (700, 10, 10)


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No cyclic collection inside (the process's collector; it runs again at the end, as it was)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def running_subtasks(count: int) -> tuple[int, int, int]:
    """The running jobs have `count` subtasks in all: the collector's thresholds for that."""
    gc.set_threshold(*(LARGE_JOBS_THRESHOLDS if count >= LARGE_JOBS_SUBTASKS else DEFAULT_THRESHOLDS))
    return gc.get_threshold()
