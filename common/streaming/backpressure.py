"""Backpressure for receivers: the rate a receiver source should take records at, so that batches
keep up with the trigger (Spark Streaming's `spark.streaming.backpressure.enabled` and its PID
rate estimator).

Owns the estimate for one source: after each batch, from how many records it held, how long it
took to process and how long it waited, a new rate (records/s for the whole source), never below
`min_rate`. The first batch only measures (the rate it shows is the starting point). The
JobMaster divides the rate among the source's receivers and sends it with the next batch; a
receiver takes no more than min(its max_rate, that share).

The rule, as a controller on the processing rate: the error is how far the last rate is above
what the batch was processed at; the scheduling delay, as records waiting, is the accumulated
error; their weighted sum (proportional 1.0, integral 0.2, derivative 0.0 by default, Spark's)
is taken off the last rate.

Pure: numbers in, a number out.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RateEstimator:
    interval_ms: int
    proportional: float = 1.0
    integral: float = 0.2
    derivative: float = 0.0
    min_rate: float = 100.0
    _latest_time_ms: int = -1
    _latest_rate: float = -1.0
    _latest_error: float = -1.0
    _first: bool = True

    def __post_init__(self) -> None:
        if self.interval_ms < 1:
            raise ValueError(f"the batch interval must be at least 1 ms, got {self.interval_ms}")
        if min(self.proportional, self.integral, self.derivative) < 0 or self.min_rate <= 0:
            raise ValueError("the estimator's gains must not be negative and its minimum rate must be positive")

    def update(self, batch_time_ms: int, records: int, processing_ms: int, scheduling_ms: int) -> float | None:
        """A batch's figures in; the new rate out (None: no new estimate, from this batch — the
        first one, one without records or time, or one older than the last)."""
        if batch_time_ms <= self._latest_time_ms or records <= 0 or processing_ms <= 0:
            return None
        since_s = (batch_time_ms - self._latest_time_ms) / 1000 if self._latest_time_ms >= 0 else 1.0
        processed_per_s = records / processing_ms * 1000
        self._latest_time_ms = batch_time_ms
        if self._first:
            self._first = False
            self._latest_rate, self._latest_error = processed_per_s, 0.0
            return None
        error = self._latest_rate - processed_per_s
        waiting = max(0, scheduling_ms) * processed_per_s / self.interval_ms
        change = (error - self._latest_error) / since_s
        rate = max(self.min_rate, self._latest_rate - self.proportional * error - self.integral * waiting
                   - self.derivative * change)
        self._latest_rate, self._latest_error = rate, error
        return rate
