"""The JobManager's cyclic garbage collector settings.

A scheduler event makes and drops thousands of small acyclic objects (transitions, actions,
deployment descriptors), while the ExecutionGraph it works on holds millions that live as long
as the job. With CPython's default first threshold (700 allocations) the collector ran some
hundred times during one `schedule all` of a P = 10 000 job and took about 30% of it
(bench_scheduler.py: 1 036 ms with the defaults, 730 ms with these). The objects freed by
reference counting are not affected; only cycles wait longer to be found, and the scheduler makes
few.
"""

from __future__ import annotations

import gc

# (allocations before a young collection, young collections before a middle one, middle ones
# before a full one); CPython's defaults are (700, 10, 10)
JOBMANAGER_THRESHOLDS = (100_000, 20, 100)


def apply_jobmanager_thresholds() -> tuple[int, int, int]:
    gc.set_threshold(*JOBMANAGER_THRESHOLDS)
    return gc.get_threshold()
