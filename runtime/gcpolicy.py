"""When the JobManager keeps Python's cycle collector out of the way.

Building a job's ExecutionGraph and Scheduler makes millions of objects at P = 100 000 (subtasks,
attempts, partitions, regions, the slot-sharing plan), every one of which lives as long as the
job: no garbage at all. Yet the collector ran all along, each full collection walking everything
made so far: at P = 100 000 job initialization took 3.06 s with it and 1.47 s without
(bench_scheduler.py). So the JobManager builds a job with the collector paused (`paused`).

It stays at CPython's thresholds otherwise. Collecting the oldest generation ten times less often
(thresholds (700, 20, 100)) made scheduling at P = 10 000 about 30% faster too, but left the
graphs of ended jobs (cyclic: subtasks point at their job vertex and back) waiting that much longer
to be freed: under tests/integration/test_api_fuzz.py's barrage of 600 jobs the JobManager grew by
370-400 MiB instead of 90-330 MiB.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


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
