"""Event time from Kafka, per partition (issue 52 item 4), on a real cluster and a real broker
(the session fixture `kafka_broker`): event-time tumbling windows over a 4-partition topic
whose watermark is `with_watermark(..., per_partition=True)`:

- partition 3 carries rows at the start only; with an idle timeout it stops holding the
  watermark back once the batches' logged times are past it, the watermark is the smallest over
  the partitions still active (read back from the offset log), and the windows close and are
  emitted with every partition's rows;
- without an idle timeout the same slow partition holds the watermark back: nothing is emitted,
  every logged watermark stays at its rows' time; one late row into it moves the watermark and
  the windows are emitted.
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

import cloudpickle
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from funke.common.api.dsl import ExecutionEnvironment
from funke.common.streaming.eventtime import IDLE_CLOCK, partition_key
from funke.jobmanager import streamsinks
from funke.jobmanager.checkpointstore import CheckpointStore
from tests.integration.test_kafka_source import produce, stop
from tests.integration.test_streaming import Events, wait_status

pytestmark = pytest.mark.cluster

cloudpickle.register_pickle_by_value(sys.modules[__name__])

T0 = 1_700_000_000_000  # a multiple of the 10 s window
WINDOW = 10_000


@pytest.fixture(scope="module")
def cluster(streaming_cluster):
    streaming_cluster.restore()
    return streaming_cluster


def rows(partition: int, first_ms: int, last_ms: int, step: int = 1000) -> list[tuple[int, bytes, bytes]]:
    return [(partition, str(ms).encode(), str(ms).encode()) for ms in range(first_ms, last_ms + 1, step)]


def submit(cluster, kafka_broker, tmp_path: Path, topic: str, idle_timeout: str | None):
    out, checkpoint = tmp_path / "windows", tmp_path / "checkpoint"
    env = ExecutionEnvironment(f"kafka watermarks {tmp_path.name}", parallelism=2)
    (env.read_stream.kafka(kafka_broker.bootstrap, topic, starting="earliest", **kafka_broker.source_options)
        .select("topic", "partition", "timestamp_millis(CAST(CAST(value AS STRING) AS BIGINT)) AS ts")
        .with_watermark("ts", 0, per_partition=True, idle_timeout=idle_timeout)
        .key_by("partition").window("ts", WINDOW).aggregate("count(1) AS n")
        .write_parquet(str(out)))
    env.set_output_mode("append").set_trigger("500 ms").set_checkpoint_location(str(checkpoint))
    env.set_option("streaming.min-batches-to-retain", "100000")
    job_id = cluster.client.submit(env.build())
    events = Events(cluster.client, job_id)
    wait_status(cluster.client, job_id, ("RUNNING",))
    return job_id, events, out, checkpoint


def emitted(out: Path) -> dict[tuple[int, int], int]:
    """(partition, window start ms) -> count, over the committed batches."""
    got: dict[tuple[int, int], int] = {}
    if not out.exists():
        return got
    for b in streamsinks.committed_batches(str(out)):
        for name in streamsinks.committed_files(str(out), b):
            t = pq.read_table(out / name)
            starts = t.column("window_start").cast(pa.timestamp("ms", tz="UTC")).cast(pa.int64()).to_pylist()
            for p, s, n in zip(t.column("partition").to_pylist(), starts, t.column("n").to_pylist()):
                assert (p, s) not in got, f"window {s} of partition {p} emitted twice"
                got[(p, s)] = n
    return got


def logged(checkpoint: Path) -> list:
    store = CheckpointStore(str(checkpoint))
    try:
        return [store.read_offsets(b) for b in store.offset_ids()]
    except Exception:  # noqa: BLE001 - no log yet
        return []


def wait_for(what: str, check, timeout: float = 40):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout} s")


def records_logged(checkpoint: Path) -> int:
    return sum(r.rows for e in logged(checkpoint) for r in e.sources.values())


def test_an_idle_partition_does_not_hold_the_windows_back(cluster, kafka_broker, tmp_path):
    topic = f"wm-idle-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(topic, 4)
    job_id, events, out, checkpoint = submit(cluster, kafka_broker, tmp_path, topic, "3 s")
    # the start: every partition, in the first window
    produce(kafka_broker.bootstrap, topic, [r for p in range(4) for r in rows(p, T0, T0 + 5_000)])
    wait_for("the first records logged", lambda: records_logged(checkpoint) >= 24)
    # then partitions 0-2 only, over several batches; partition 2 four seconds behind the others
    for step in range(6):
        hi = T0 + 14_000 + step * 3_000  # partitions 0 and 1: 14 to 29 s; partition 2: 10 to 25 s
        produce(kafka_broker.bootstrap, topic, rows(0, hi, hi) + rows(1, hi, hi) + rows(2, hi - 4_000, hi - 4_000))
        time.sleep(1.0)
    got = wait_for("the first two windows emitted", lambda: (lambda g: g if (0, T0 + WINDOW) in g else None)(
        emitted(out)))
    entries = logged(checkpoint)
    stop(cluster, job_id, events)

    assert {p: got.get((p, T0)) for p in range(4)} == {0: 6, 1: 6, 2: 6, 3: 6}
    assert {p: got.get((p, T0 + WINDOW)) for p in range(4)} == {0: 2, 1: 2, 2: 4, 3: None}  # 14, 17 s; 10-19 s
    last = entries[-1]
    assert last.event_time_max[partition_key(_op(last), topic, 3)] == T0 + 5_000
    assert set(last.event_time_active) == {partition_key(_op(last), topic, p) for p in range(4)} | {IDLE_CLOCK}
    clock, active = last.event_time_active[IDLE_CLOCK], last.event_time_active
    assert clock - active[partition_key(_op(last), topic, 3)] >= 3_000  # idle by the batches' times
    # while partition 3 was idle and 0-2 were not, the watermark was partition 2's time (the
    # smallest of the active ones): it lags the others by 4 s
    lagging = {T0 + 10_000 + step * 3_000 for step in range(6)}
    marks = [e.watermark_ms for e in entries if e.watermark_ms is not None]
    assert lagging & set(marks), f"no logged watermark at partition 2's time: {marks}"
    assert marks == sorted(marks)


def test_a_slow_partition_holds_the_watermark_back_without_idleness(cluster, kafka_broker, tmp_path):
    topic = f"wm-slow-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(topic, 4)
    job_id, events, out, checkpoint = submit(cluster, kafka_broker, tmp_path, topic, None)
    produce(kafka_broker.bootstrap, topic, [r for p in range(4) for r in rows(p, T0, T0 + 5_000)])
    wait_for("the first records logged", lambda: records_logged(checkpoint) >= 24)
    produce(kafka_broker.bootstrap, topic, [r for p in range(3) for r in rows(p, T0 + 10_000, T0 + 25_000)])
    wait_for("partitions 0-2 logged", lambda: records_logged(checkpoint) >= 24 + 48)
    time.sleep(4)  # batches go by: with no idle timeout partition 3 holds the watermark for ever
    held = logged(checkpoint)
    assert emitted(out) == {}
    assert all(e.watermark_ms is None or e.watermark_ms <= T0 + 5_000 for e in held), [e.watermark_ms for e in held]
    # one row into partition 3: the watermark moves to the smallest partition's time
    produce(kafka_broker.bootstrap, topic, rows(3, T0 + 22_000, T0 + 22_000))
    got = wait_for("the windows emitted", lambda: (lambda g: g if (0, T0 + WINDOW) in g else None)(emitted(out)))
    entries = logged(checkpoint)
    stop(cluster, job_id, events)
    # the partitions' maxes are in the offset log; the watermark went from partition 3's 5 s to
    # its 22 s, the smallest once it had the row
    last = entries[-1]
    assert last.event_time_max[partition_key(_op(last), topic, 0)] == T0 + 25_000
    assert last.event_time_max[partition_key(_op(last), topic, 3)] == T0 + 22_000
    assert max(e.watermark_ms or 0 for e in entries) == T0 + 22_000
    assert {p: got.get((p, T0)) for p in range(4)} == {0: 6, 1: 6, 2: 6, 3: 6}
    assert got[(0, T0 + WINDOW)] == 10 and (0, T0 + 2 * WINDOW) not in got  # 20-25 s: open, 22 s < 30 s


def _op(entry) -> str:
    """The per-partition watermark operator's id, read off an entry's keys."""
    return next(k.rpartition("@")[0] for k in entry.event_time_max if "@" in k)
