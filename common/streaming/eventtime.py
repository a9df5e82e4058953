"""Event time in a streaming query: watermarks, windows and late data, as rules and values.

Owns what a watermark is and how it moves, which windows a row belongs to, and when a row is
late — the rules the JobManager's coordinator and the TaskManager's window operators both apply,
so that the two never disagree:

- A **watermark operator** (`with_watermark(column, delay)`, operator kind "watermark") watches
  the largest event time its rows carried; its watermark is that maximum minus the delay.
- **Per partition** (`with_watermark(..., per_partition=True)` on a Kafka stream, as Flink's
  per-partition watermarks): the operator's rows are reported per (topic, partition) under
  `partition_key(operator, topic, partition)`, and its watermark is the **smallest** over the
  partitions' (max - delay), over the partitions that have carried a row. With an **idle
  timeout**, a partition that carried no row in the committed batches of the last
  `idle_timeout` ms of *batch time* (the batches' logged trigger times, never the wall clock:
  a replay decides the same; only committed batches count, so a batch still running, whose
  reports are not all in, never makes a partition look idle) does not hold it back; when every
  partition is idle, the largest of theirs counts. The partitions' maxes, the batch time each
  last carried a row, and the last committed batch's time (the idleness clock, under
  `IDLE_CLOCK`) are logged with the others.
- The **query's watermark** is the minimum over its watermark operators (Structured Streaming's
  default `min` policy; `max` as an option), over the operators that have seen a row. It never
  goes back.
- It is computed from the batches recorded when the next batch is planned, and **logged in that
  batch's offset entry**: a batch run again after a failure runs with exactly the watermark it
  had the first time.
- A **window** `[start, end)` of a row (tumbling: size; sliding: size and slide; times aligned to
  the epoch, as Spark's window()) stays open while `end + allowed lateness > watermark`. A row is
  **late** for a window that is closed: it is never dropped silently; it is counted, and written
  to the query's late-data stream with the window and the watermark it missed, when the query
  asks for one. A row without an event time (null) is late for every window.
- A window's result is emitted once, when the watermark closes it (append mode), or every batch
  it changed (update mode); its state goes once it is closed.

Pure: no clock, no I/O. Times are epoch milliseconds (ints); None is "no watermark yet".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

__all__ = ["IDLE_CLOCK", "PARTITION_SEP", "POLICIES", "WATERMARK", "WATERMARK_POLICY", "EventTimeStats", "WatermarkTracker", "WindowSpec",
           "is_late", "operator_id", "partition_key", "split_partition_key", "window_problem", "windows_of"]

WATERMARK = "watermark"  # the operator kind of with_watermark
WATERMARK_POLICY = "streaming.watermark-policy"  # job option: min (default) or max
POLICIES = ("min", "max")
MAX_DELAY_MS = 10 * 365 * 24 * 3600 * 1000  # ten years: a larger delay or window is a mistake
MAX_WINDOWS_PER_ROW = 1000  # size / slide of a sliding window: each row is in that many windows
IDLE_CLOCK = "@clock"  # the logged active times' entry for the last committed batch's time
PARTITION_SEP = "@"  # operator id @ topic : partition (a Kafka topic name has neither "@" nor ":")


def operator_id(vertex_id: str, index: int) -> str:
    """How reports and the offset log name an operator of a vertex's chain."""
    return f"{vertex_id}/{index}"


def partition_key(operator: str, topic: str, partition: int) -> str:
    """How reports and the offset log name one (topic, partition) of a per-partition operator."""
    return f"{operator}{PARTITION_SEP}{topic}:{int(partition)}"


def split_partition_key(key: str) -> tuple[str, str, int] | None:
    """(operator, topic, partition) of a partition key; None for a plain operator id."""
    op, sep, rest = key.rpartition(PARTITION_SEP)
    topic, colon, partition = rest.rpartition(":")
    if not sep or not op or not colon or not topic or not partition.isdigit():
        return None
    return op, topic, int(partition)


@dataclass(frozen=True, slots=True)
class EventTimeStats:
    """What one watermark operator saw of one batch (on one subtask, or added up): the smallest,
    largest and summed event times and how many rows had one."""
    min_ms: int | None = None
    max_ms: int | None = None
    sum_ms: float = 0.0
    count: int = 0

    def __add__(self, other: EventTimeStats) -> EventTimeStats:
        return EventTimeStats(_pick(min, self.min_ms, other.min_ms), _pick(max, self.max_ms, other.max_ms),
                              self.sum_ms + other.sum_ms, self.count + other.count)

    @property
    def avg_ms(self) -> int | None:
        return round(self.sum_ms / self.count) if self.count else None


def _pick(f, a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return f(a, b)


@dataclass
class WatermarkTracker:
    """The query's watermark (Structured Streaming's WatermarkTracker): per watermark operator
    (`delays`: operator id -> delay ms), the largest event time seen so far; `watermark_ms` the
    query's watermark as last computed (it never goes back). Operators in `partitioned`
    (operator id -> idle timeout ms, None: never idle) keep one max per (topic, partition)
    under its partition key, and in `active` the batch time of the last batch it carried a row
    in; `clock_ms` the batch time of the last committed batch, which idleness is judged by.
    Restored from the last offset log entry (`maxes`, `active` with the clock under
    IDLE_CLOCK, `watermark_ms`) when a run starts."""
    delays: Mapping[str, int]
    policy: str = "min"
    maxes: dict[str, int] = field(default_factory=dict)
    watermark_ms: int | None = None
    partitioned: Mapping[str, int | None] = field(default_factory=dict)
    active: dict[str, int] = field(default_factory=dict)
    clock_ms: int | None = None

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"watermark policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        self.maxes = {key: int(ms) for key, ms in self.maxes.items() if self._known(key)}
        clock = self.active.get(IDLE_CLOCK)
        if clock is not None and (self.clock_ms is None or int(clock) > self.clock_ms):
            self.clock_ms = int(clock)
        self.active = {key: int(ms) for key, ms in self.active.items() if self._known(key) and key in self.maxes}

    def _known(self, key: str) -> bool:
        """Whether a logged or reported key belongs to this graph: a plain operator's id, or a
        partition key of a per-partition operator (a graph that changed leaves the others)."""
        parts = split_partition_key(key)
        if parts is not None and parts[0] in self.partitioned:
            return True
        return key in self.delays and key not in self.partitioned

    def observe(self, key: str, stats: EventTimeStats, batch_time_ms: int | None = None) -> None:
        """A batch (its trigger time `batch_time_ms`) had these event times through an operator,
        or one partition of a per-partition operator (unknown keys are ignored: a report from a
        graph that has changed)."""
        if not self._known(key) or stats.max_ms is None:
            return
        held = self.maxes.get(key)
        if held is None or stats.max_ms > held:
            self.maxes[key] = stats.max_ms
        if key not in self.delays and stats.count > 0 and batch_time_ms is not None:
            self.active[key] = max(batch_time_ms, self.active.get(key, batch_time_ms))

    def committed(self, batch_time_ms: int) -> None:
        """A batch (its trigger time) committed: every report of it is in, the idleness clock
        moves to it."""
        if self.clock_ms is None or batch_time_ms > self.clock_ms:
            self.clock_ms = batch_time_ms

    def logged_active(self) -> dict[str, int]:
        """What an offset or commit log entry holds of the active times: each partition's, and
        the clock."""
        out = dict(self.active)
        if self.partitioned and self.clock_ms is not None:
            out[IDLE_CLOCK] = self.clock_ms
        return out

    def candidates(self) -> dict[str, int]:
        """Per operator that has seen a row, its watermark (max - delay) (a per-partition
        operator's: the smallest over its partitions that are not idle by the clock)."""
        out = {op: ms - self.delays[op] for op, ms in self.maxes.items() if op in self.delays}
        parts: dict[str, list[str]] = {}
        for key in self.maxes:
            split = split_partition_key(key)
            if split is not None and split[0] in self.partitioned:
                parts.setdefault(split[0], []).append(key)
        for op, keys in parts.items():
            live = [k for k in keys if not partition_idle(self.active.get(k), self.clock_ms, self.partitioned[op])]
            out[op] = (min(self.maxes[k] for k in live) if live else max(self.maxes[k] for k in keys)) - self.delays[op]
        return out

    def advance(self) -> int | None:
        """The watermark for the next batch: the policy over the operators' candidates, never
        below the last one."""
        candidates = list(self.candidates().values())
        if not candidates:
            return self.watermark_ms
        chosen = min(candidates) if self.policy == "min" else max(candidates)
        if self.watermark_ms is None or chosen > self.watermark_ms:
            self.watermark_ms = chosen
        return self.watermark_ms


def partition_idle(last_active_ms: int | None, clock_ms: int | None, idle_timeout_ms: int | None) -> bool:
    """Whether a partition that last carried a row in the batch at `last_active_ms` is idle when
    the last committed batch is at `clock_ms`: no row for `idle_timeout_ms` of batch time
    (never, without a timeout or the times)."""
    if idle_timeout_ms is None or last_active_ms is None or clock_ms is None:
        return False
    return clock_ms - last_active_ms >= idle_timeout_ms


@dataclass(frozen=True, slots=True)
class WindowSpec:
    """A window over event time: tumbling (slide == size) or sliding (slide < size), with the
    allowed lateness that keeps each window open after its end."""
    size_ms: int
    slide_ms: int
    lateness_ms: int = 0

    def __post_init__(self) -> None:
        problem = window_problem(self.size_ms, self.slide_ms, self.lateness_ms)
        if problem:
            raise ValueError(problem)


def window_problem(size_ms: object, slide_ms: object, lateness_ms: object = 0) -> str | None:
    """What is wrong with a window's numbers (None: nothing)."""
    for name, v in (("size", size_ms), ("slide", slide_ms), ("allowed lateness", lateness_ms)):
        if isinstance(v, bool) or not isinstance(v, int):
            return f"the window's {name} must be a whole number of milliseconds, got {v!r}"
        if v < 0 or v > MAX_DELAY_MS:
            return f"the window's {name} must be between 0 and ten years, got {v} ms"
    assert isinstance(size_ms, int) and isinstance(slide_ms, int)
    if size_ms <= 0 or slide_ms <= 0:
        return f"a window needs a positive size and slide, got size {size_ms} ms, slide {slide_ms} ms"
    if slide_ms > size_ms:
        return (f"a window's slide ({slide_ms} ms) must not be longer than its size ({size_ms} ms): rows between "
                "windows would belong to none")
    if size_ms // slide_ms > MAX_WINDOWS_PER_ROW:
        return (f"a window of {size_ms} ms sliding by {slide_ms} ms puts each row in {size_ms // slide_ms} windows; "
                f"at most {MAX_WINDOWS_PER_ROW} are allowed")
    return None


def windows_of(ts_ms: int, window: WindowSpec) -> list[tuple[int, int]]:
    """The windows [start, end) a row at `ts_ms` belongs to, earliest first (epoch-aligned, as
    Spark's window())."""
    last_start = ts_ms - ts_ms % window.slide_ms
    out = []
    start = last_start
    while start > ts_ms - window.size_ms:
        out.append((start, start + window.size_ms))
        start -= window.slide_ms
    return out[::-1]


def is_late(window_end_ms: int, lateness_ms: int, watermark_ms: int | None) -> bool:
    """Whether a window is closed: the watermark passed its end plus the allowed lateness."""
    return watermark_ms is not None and window_end_ms + lateness_ms <= watermark_ms


def fold_stats(reports: Iterable[Mapping[str, EventTimeStats]]) -> dict[str, EventTimeStats]:
    """Several subtasks' reports as one per operator."""
    out: dict[str, EventTimeStats] = {}
    for report in reports:
        for op, stats in report.items():
            out[op] = out[op] + stats if op in out else stats
    return out
