"""Keyed state where the rows are: the keyed operators over a stream, run inside Spark's Python
workers, and the state store they stand on. One module per audience:

- `store`: storage — a key group's state version (get, put, remove, items, commit, abort, its
  metrics), the worker's cache of the versions it holds and catching one up, the timer queues
  and lookups derived from a version, the per-group loop every operator's batch runs in;
- `folds`: the running folds — the running aggregate, the running reduce, drop_duplicates;
- `eventtime`: the event-time operators — window and session window aggregates, the interval
  join, drop_duplicates_within_watermark, whose state the batch's watermark bounds;
- `process`: the keyed process function's API (state handles, timers, its context) and operator.

Imports go one way: `process`, `eventtime` and `folds` stand on `store` (`eventtime` also on the
partial aggregates of `folds`); `store` on the pure rules (`funke.common.streaming.state`,
`.timers`, `.processlayout`) and the store's files (`funke.runtime.statefiles`). Every module is
pickled by value into the workers: a worker needs pyarrow and cloudpickle, not funke.
"""

from funke.taskmanager.operators.keyedstate.eventtime import (
    deduplicate_within_batches,
    interval_join_batches,
    session_aggregate_batches,
    window_aggregate_batches,
)
from funke.taskmanager.operators.keyedstate.folds import (
    AggregateSpec,
    deduplicate_batches,
    running_aggregate_batches,
    running_reduce_batches,
)
from funke.taskmanager.operators.keyedstate.process import process_batches
from funke.taskmanager.operators.keyedstate.store import (
    MARKER_COLUMN,
    StateStore,
    StateValueError,
    StateVersion,
    measure,
)

__all__ = ["MARKER_COLUMN", "AggregateSpec", "StateStore", "StateValueError", "StateVersion", "deduplicate_batches",
           "deduplicate_within_batches", "interval_join_batches", "measure", "process_batches",
           "running_aggregate_batches", "running_reduce_batches", "session_aggregate_batches",
           "window_aggregate_batches"]
