"""Event time on a real cluster: watermarks logged with each batch, windows over event time with
out-of-order and late rows, late rows never dropped silently, through kill -9 of TaskManagers at
every phase of a batch.

The input is the rate source (row i is value i) with an event time made from the value alone:
25 ms a row, a jitter of up to 480 ms backwards (out of order within the watermark's delay of
1 s), and every 20th row 4 s behind (late). So what the query must emit is known from the
offset log: each committed batch's rows (its range) and the watermark it ran with (its entry).
"""

from __future__ import annotations

import collections
import datetime
import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from funke.common.api.dsl import ExecutionEnvironment
from funke.common.streaming.eventtime import WindowSpec, is_late, windows_of
from funke.common.streaming.progress import iso_ms
from funke.jobmanager.checkpointstore import CheckpointStore
from tests.integration.test_streaming import (
    PHASES,
    Events,
    cluster,  # noqa: F401 (fixtures: the shared streaming cluster, restored for each test)
    committed_rows,
    kill_at_every_phase,
    stream_cluster,  # noqa: F401
    wait_status,
)

pytestmark = pytest.mark.cluster

KEYS = 3
BASE_MS = 1_700_000_000_000
EVENT_TIME = (f"timestamp_millis({BASE_MS} + value * 25 + ((value * 7919) % 13) * 40 "
              "- CASE WHEN value % 20 = 7 THEN 4000 ELSE 0 END) AS ts")


def event_ms(v: int) -> int:
    return BASE_MS + v * 25 + (v * 7919 % 13) * 40 - (4000 if v % 20 == 7 else 0)


def rows_of(r) -> tuple[int, int]:
    """The rate source's rows a batch read: its logged range as (first, end)."""
    start = int(r.start["rows"]) if r.start is not None else 0
    return start, int(r.end["rows"]) if r.end is not None else start


def run_then_stop(client, job, batches: int) -> str:
    """Submits `job`, lets its batches up to `batches` complete, stops it gracefully: FINISHED."""
    job_id = client.submit(job)
    events = Events(client, job_id)
    events.wait("BatchCompleted", min_batch=batches)
    client.stop(job_id, timeout_s=60)
    assert wait_status(client, job_id, ("FINISHED", "FAILED", "CANCELED")) == "FINISHED"
    events.drain()
    return job_id


def window_job(name: str, out: Path, late: Path, checkpoint: Path, *, mode: str, size: str, slide: str | None = None,
               lateness: str | None = None, rows_per_second: int = 40) -> ExecutionEnvironment:
    env = ExecutionEnvironment(name, parallelism=2)
    events = env.read_stream.rate(rows_per_second).select(f"value % {KEYS} AS k", "value", EVENT_TIME)
    windows = events.with_watermark("ts", "1 s").key_by("k").window("ts", size, slide)
    if lateness is not None:
        windows = windows.allowed_lateness(lateness)
    result = windows.aggregate("count(1) AS n", "sum(value) AS total")
    result.write_parquet(str(out))
    result.late_data().write_parquet(str(late))
    env.set_output_mode(mode).set_trigger("500 ms").set_checkpoint_location(str(checkpoint))
    env.set_restart_strategy("fixed-delay", attempts=20, delay="500 ms")
    return env


def _ms(table: pa.Table, name: str) -> list[int | None]:
    column = table.column(name)
    return column.cast(pa.timestamp("ms", tz=getattr(column.type, "tz", None))).cast(pa.int64()).to_pylist()


def read_windows(path: Path) -> list[tuple]:
    t = pq.read_table(path)
    return list(zip(t.column("k").to_pylist(), _ms(t, "window_start"), _ms(t, "window_end"),
                    t.column("n").to_pylist(), t.column("total").to_pylist()))


def read_late(path: Path) -> list[tuple]:
    t = pq.read_table(path)
    return list(zip(t.column("value").to_pylist(), _ms(t, "ts"), _ms(t, "window_start"), _ms(t, "window_end"),
                    _ms(t, "watermark")))


class Direct:
    """What the committed batches must have emitted, from the offset log alone: per batch its
    rows and watermark; per (row, window) whether it was late; per window the on-time totals."""

    def __init__(self, checkpoint: Path, window: WindowSpec):
        store = CheckpointStore(str(checkpoint))
        self.batches = store.commit_ids()
        assert self.batches == list(range(self.batches[0], self.batches[-1] + 1))
        self.watermark: dict[int, int | None] = {}
        self.late: dict[int, list[tuple]] = collections.defaultdict(list)  # batch -> (value, ts, start, end, wm)
        self.totals: dict[tuple, list[int]] = {}  # (k, start, end) -> [n, total] of its on-time rows
        self.changed: dict[int, set[tuple]] = collections.defaultdict(set)  # batch -> windows it changed
        self.after: dict[int, dict[tuple, tuple]] = {}  # batch -> the windows it changed, their totals after it
        self.window = window
        for b in self.batches:
            entry = store.read_offsets(b)
            (r,) = entry.sources.values()
            start, end = rows_of(r)
            wm = entry.watermark_ms
            self.watermark[b] = wm
            for v in range(start, end):
                ts = event_ms(v)
                for ws, we in windows_of(ts, window):
                    if is_late(we, window.lateness_ms, wm):
                        self.late[b].append((v, ts, ws, we, wm))
                    else:
                        key = (v % KEYS, ws, we)
                        total = self.totals.setdefault(key, [0, 0])
                        total[0] += 1
                        total[1] += v
                        self.changed[b].add(key)
            self.after[b] = {key: tuple(self.totals[key]) for key in self.changed[b]}

    def closes_in(self, key: tuple) -> int | None:
        """The first batch whose watermark closes the window (None: still open)."""
        for b in self.batches:
            if is_late(key[2], self.window.lateness_ms, self.watermark[b]):
                return b
        return None


def check_append(out: Path, late: Path, direct: Direct) -> tuple[int, int]:
    """Each window emitted once, in the batch whose watermark closed it, with the totals of every
    on-time row; every late (row, window) in the late-data sink, with the watermark it missed.
    Returns (windows, late rows)."""
    emitted = committed_rows(out, read_windows)
    seen: dict[tuple, int] = {}
    for batch, rows in emitted.items():
        for k, ws, we, n, total in rows:
            key = (k, ws, we)
            assert key not in seen, f"window {key} emitted in batch {seen[key]} and again in batch {batch}"
            seen[key] = batch
            assert direct.totals.get(key) == [n, total], f"batch {batch}, window {key}: {n, total} != {direct.totals.get(key)}"
            assert direct.closes_in(key) == batch, f"window {key} emitted in batch {batch}, closed in {direct.closes_in(key)}"
    closed = {key for key in direct.totals if direct.closes_in(key) is not None}
    assert set(seen) == closed, f"closed windows not emitted: {sorted(closed - set(seen))[:5]}, " \
                                f"emitted and not closed: {sorted(set(seen) - closed)[:5]}"
    late_rows = committed_rows(late, read_late)
    for b in direct.batches:
        assert sorted(late_rows.get(b, [])) == sorted(direct.late[b]), f"batch {b}: late rows differ"
    return len(seen), sum(len(v) for v in direct.late.values())


def test_tumbling_windows_in_append_mode_emit_each_window_once_and_every_late_row_through_kills_at_every_phase(
        stream_cluster, tmp_path):
    out, late, checkpoint = tmp_path / "windows", tmp_path / "late", tmp_path / "checkpoint"
    client = stream_cluster.client
    job_id = client.submit(window_job("tumbling windows", out, late, checkpoint, mode="append", size="1 s").build())
    events = Events(client, job_id)
    kill_at_every_phase(stream_cluster, job_id, events)
    direct = Direct(checkpoint, WindowSpec(1000, 1000))
    windows, late_rows = check_append(out, late, direct)
    assert windows >= 3 and late_rows >= 1, (windows, late_rows)
    # the progress records say what each batch saw: its watermark as logged, its late rows
    records = [r for r in client.progress(job_id) if r["batchId"] in direct.watermark]
    assert records
    for r in records:
        wm = direct.watermark[r["batchId"]]
        assert r["eventTime"].get("watermark") == (iso_ms(wm) if wm is not None else None), r["eventTime"]
        assert r["numLateRows"] == len(direct.late[r["batchId"]]), (r["batchId"], r["numLateRows"])
    print(f"tumbling windows through kills at {len(PHASES)} phases: {len(direct.batches)} batches, {windows} windows "
          f"emitted once each, {late_rows} late rows all in the late-data sink, 0 lost")


def test_sliding_windows_with_allowed_lateness_in_update_mode_emit_each_change_with_exact_totals(
        stream_cluster, tmp_path):
    out, late, checkpoint = tmp_path / "windows", tmp_path / "late", tmp_path / "checkpoint"
    client = stream_cluster.client
    run_then_stop(client, window_job("sliding windows", out, late, checkpoint, mode="update", size="2 s",
                                      slide="1 s", lateness="2 s").build(), 10)
    direct = Direct(checkpoint, WindowSpec(2000, 1000, 2000))
    emitted = committed_rows(out, read_windows)
    updates = 0
    for b in direct.batches:
        rows = emitted.get(b, [])
        got = {(k, ws, we): (n, total) for k, ws, we, n, total in rows}
        assert len(got) == len(rows), f"batch {b}: a window emitted twice"
        # update mode: the windows the batch changed, with their totals over every on-time row so far
        assert got == direct.after[b], f"batch {b}: emitted {sorted(got.items())[:3]}, expected " \
                                       f"{sorted(direct.after[b].items())[:3]}"
        updates += len(rows)
    late_rows = committed_rows(late, read_late)
    for b in direct.batches:
        assert sorted(late_rows.get(b, [])) == sorted(direct.late[b]), f"batch {b}: late rows differ"
    assert updates > 0
    print(f"sliding windows, update mode: {len(direct.batches)} batches, {updates} window updates, "
          f"{sum(len(v) for v in direct.late.values())} late rows in the late-data sink")


DEDUP_TIME = ("timestamp_millis({base} + (CASE WHEN value % 15 = 14 THEN value DIV 3 - 40 ELSE value DIV 3 END) * 75 "
              "+ pmod((CASE WHEN value % 15 = 14 THEN value DIV 3 - 40 ELSE value DIV 3 END) * 7919, 13) * 40) AS ts")


def dedup_id(v: int) -> int:
    return v // 3 - 40 if v % 15 == 14 else v // 3


def dedup_ms(v: int) -> int:
    i = dedup_id(v)
    return BASE_MS + i * 75 + (i * 7919 % 13) * 40


def test_drop_duplicates_within_watermark_emits_each_id_once_and_forgets_it_once_the_watermark_passes(
        stream_cluster, tmp_path):
    """Each id is sent three times with one event time (so within the watermark's delay), and
    every fifteenth row re-sends an id from 3 s of event time before, by then older than the
    watermark: late, counted, left out. The state keeps only the ids within the delay."""
    out, checkpoint = tmp_path / "unique", tmp_path / "checkpoint"
    client = stream_cluster.client
    env = ExecutionEnvironment("dedup within watermark", parallelism=2)
    (env.read_stream.rate(40)
        .select("value", "CASE WHEN value % 15 = 14 THEN value DIV 3 - 40 ELSE value DIV 3 END AS id",
                DEDUP_TIME.format(base=BASE_MS))
        .with_watermark("ts", "1 s")
        .drop_duplicates_within_watermark("id")
        .write_parquet(str(out)))
    env.set_trigger("500 ms").set_checkpoint_location(str(checkpoint))
    job_id = run_then_stop(client, env.build(), 12)
    store = CheckpointStore(str(checkpoint))
    emitted = committed_rows(out, lambda p: pq.read_table(p).column("id").to_pylist())
    first: dict[int, int] = {}  # id -> the batch of its first on-time row
    late = {}
    for b in store.commit_ids():
        entry = store.read_offsets(b)
        (r,) = entry.sources.values()
        start, end = rows_of(r)
        wm = entry.watermark_ms
        late[b] = 0
        for v in range(start, end):
            if wm is not None and dedup_ms(v) < wm:
                late[b] += 1
            else:
                first.setdefault(dedup_id(v), b)
    got = collections.Counter(i for ids in emitted.values() for i in ids)
    assert all(n == 1 for n in got.values()), [i for i, n in got.items() if n > 1][:5]
    assert set(got) == set(first), (sorted(set(first) - set(got))[:5], sorted(set(got) - set(first))[:5])
    for b, ids in emitted.items():
        assert all(first[i] == b for i in ids), f"batch {b} emitted an id first seen on time in another batch"
    assert sum(late.values()) > 0
    records = {r["batchId"]: r for r in client.progress(job_id)}
    assert all(records[b]["numLateRows"] == n for b, n in late.items() if b in records)
    # the state holds the ids within the watermark's delay only, not every id ever seen
    (operator,) = records[max(records)]["stateOperators"]
    assert 0 < operator["numRowsTotal"] < len(got) / 2, (operator["numRowsTotal"], len(got))
    print(f"dedup within watermark: {sum(got.values())} ids emitted once each of {store.commit_ids()[-1] + 1} "
          f"batches, {sum(late.values())} late rows counted, {operator['numRowsTotal']} ids in state at the end")


SESSION_TIME = (f"timestamp_millis({BASE_MS} + value * 25 + (value DIV 40) * 2000 + ((value * 7919) % 13) * 40 "
                "- CASE WHEN value % 20 = 7 THEN 4000 ELSE 0 END) AS ts")


def session_ms(v: int) -> int:
    return BASE_MS + v * 25 + (v // 40) * 2000 + (v * 7919 % 13) * 40 - (4000 if v % 20 == 7 else 0)


def session_job(out: Path, late: Path, checkpoint: Path) -> ExecutionEnvironment:
    env = ExecutionEnvironment("session windows", parallelism=2)
    result = (env.read_stream.rate(40)
              .select(f"value % {KEYS} AS k", "value", SESSION_TIME)
              .with_watermark("ts", "1 s")
              .key_by("k")
              .session_window("ts", "1 s")
              .aggregate("count(1) AS n", "sum(value) AS total"))
    result.write_parquet(str(out))
    result.late_data().write_parquet(str(late))
    env.set_output_mode("append").set_trigger("500 ms").set_checkpoint_location(str(checkpoint))
    env.set_restart_strategy("fixed-delay", attempts=20, delay="500 ms")
    return env


def direct_sessions(checkpoint: Path, gap: int) -> tuple[dict[int, list[tuple]], dict[int, list[tuple]]]:
    """Per committed batch, the sessions its watermark closed (k, start, end, n, total) and its
    late rows, computed from the offset log: a key's on-time rows merge into sessions of
    [time, time + gap) spans that overlap."""
    store = CheckpointStore(str(checkpoint))
    open_: dict[int, list[list]] = collections.defaultdict(list)  # k -> [start, end, n, total]
    closed: dict[int, list[tuple]] = {}
    late: dict[int, list[tuple]] = {}
    for b in store.commit_ids():
        entry = store.read_offsets(b)
        (r,) = entry.sources.values()
        start, end = rows_of(r)
        wm = entry.watermark_ms
        late[b] = []
        for v in range(start, end):
            ts = session_ms(v)
            if is_late(ts + gap, 0, wm):
                late[b].append((v, ts, ts, ts + gap, wm))
                continue
            spans = open_[v % KEYS] + [[ts, ts + gap, 1, v]]
            spans.sort()
            merged: list[list] = []
            for s in spans:
                if merged and s[0] < merged[-1][1]:
                    m = merged[-1]
                    m[1], m[2], m[3] = max(m[1], s[1]), m[2] + s[2], m[3] + s[3]
                else:
                    merged.append(list(s))
            open_[v % KEYS] = merged
        closed[b] = []
        for k, spans in open_.items():
            closed[b] += [(k, *s) for s in spans if is_late(s[1], 0, wm)]
            open_[k] = [s for s in spans if not is_late(s[1], 0, wm)]
    return closed, late


def test_session_windows_merge_across_batches_and_a_restart_and_close_once_when_the_watermark_passes(
        stream_cluster, tmp_path):
    out, late, checkpoint = tmp_path / "sessions", tmp_path / "late", tmp_path / "checkpoint"
    client = stream_cluster.client
    for run in range(2):  # stopped and started again on its checkpoint: open sessions come back from the state
        done = max(CheckpointStore(str(checkpoint)).commit_ids()) if run else 0
        run_then_stop(client, session_job(out, late, checkpoint).build(), done + 8)
    closed, late_rows = direct_sessions(checkpoint, 1000)
    emitted = committed_rows(out, read_windows)
    for b in closed:
        assert sorted(emitted.get(b, [])) == sorted(closed[b]), f"batch {b}: {sorted(emitted.get(b, []))[:3]} vs " \
                                                                 f"{sorted(closed[b])[:3]}"
    got_late = committed_rows(late, read_late)
    for b in late_rows:
        assert sorted(got_late.get(b, [])) == sorted(late_rows[b]), f"batch {b}: late rows differ"
    sessions = sum(len(v) for v in closed.values())
    assert sessions >= 6 and any(n > 1 for rows in closed.values() for *_, n, _ in rows)
    print(f"session windows over {len(closed)} batches and a restart: {sessions} sessions closed, each once, as "
          f"computed directly; {sum(len(v) for v in late_rows.values())} late rows in the late-data sink")


def _clicks(*rows: tuple[str, str, str]) -> bytes:
    return b"".join(json.dumps({"user": u, "page": p, "ts": f"2026-11-27T{t}Z"}).encode() + b"\n" for u, p, t in rows)


def _at(t: str) -> int:
    return int(datetime.datetime.fromisoformat(f"2026-11-27T{t}+00:00").timestamp() * 1000)


def test_the_clicks_example_writes_views_per_minute_sessions_and_late_clicks_by_event_time(stream_cluster, tmp_path):
    """examples/clicks_over_event_time.py on files that arrive one batch after another: each
    minute's views and each session written once its watermark passes, the late click aside."""
    from tests.unit.test_dsl import load_example

    incoming, out, checkpoint = tmp_path / "in", tmp_path / "out", tmp_path / "checkpoint"
    incoming.mkdir()
    module = load_example("clicks_over_event_time")
    client = stream_cluster.client
    job_id = client.submit(module.build(["--input", str(incoming), "--output", str(out), "--checkpoint",
                                         str(checkpoint)]))
    events = Events(client, job_id)
    batch = -1
    files = [_clicks(("ann", "/a", "10:00:05"), ("bob", "/b", "10:00:20"), ("ann", "/a", "10:00:50")),
             _clicks(("ann", "/c", "10:01:10"), ("bob", "/a", "10:01:40")),   # watermark 10:00:40 then 10:01:30
             _clicks(("cyd", "/a", "10:00:30"), ("dan", "/d", "10:03:00"))]  # cyd's minute is written: late
    for i, data in enumerate(files):
        (tmp_path / f"{i}.tmp").write_bytes(data)
        (tmp_path / f"{i}.tmp").rename(incoming / f"clicks-{i}.jsonl")
        batch = events.wait("BatchCompleted", min_batch=batch + 1)
        while CheckpointStore(str(checkpoint)).read_offsets(batch).sources and not any(
                r.start != r.end for r in CheckpointStore(str(checkpoint)).read_offsets(batch).sources.values()):
            batch = events.wait("BatchCompleted", min_batch=batch + 1)  # a batch without data: the next one
    # the watermark moves to 10:02:50 with dan's click: a batch without new data closes what it passes
    deadline = time.time() + 60
    while not any(r[1] == _at("10:01:00") for rows in committed_rows(out / "views", _views).values() for r in rows):
        assert time.time() < deadline, "the minute 10:01 was never written"
        time.sleep(0.5)
    client.stop(job_id, timeout_s=60)
    assert wait_status(client, job_id, ("FINISHED", "FAILED", "CANCELED")) == "FINISHED"
    events.drain()
    views = sorted(r for rows in committed_rows(out / "views", _views).values() for r in rows)
    assert views == [("/a", _at("10:00:00"), 2), ("/a", _at("10:01:00"), 1), ("/b", _at("10:00:00"), 1),
                     ("/c", _at("10:01:00"), 1)]
    sessions = sorted(r for rows in committed_rows(out / "sessions", _sessions).values() for r in rows)
    # ann's clicks at 10:00:05 and 10:00:50 are 45 s apart: two sessions, the second joined by 10:01:10
    assert sessions == [("ann", _at("10:00:05"), _at("10:00:35"), 1), ("ann", _at("10:00:50"), _at("10:01:40"), 2),
                        ("bob", _at("10:00:20"), _at("10:00:50"), 1), ("bob", _at("10:01:40"), _at("10:02:10"), 1)]
    late = [r for rows in committed_rows(out / "late", read_late_clicks).values() for r in rows]
    assert late == [("cyd", _at("10:00:00"), _at("10:01:00"), _at("10:01:30"))]
    print(f"clicks example: views {views}, sessions {sessions}, late {late}")


def _views(path: Path) -> list[tuple]:
    t = pq.read_table(path)
    return list(zip(t.column("page").to_pylist(), _ms(t, "window_start"), t.column("count").to_pylist()))


def _sessions(path: Path) -> list[tuple]:
    t = pq.read_table(path)
    return list(zip(t.column("user").to_pylist(), _ms(t, "window_start"), _ms(t, "window_end"),
                    t.column("clicks").to_pylist()))


def read_late_clicks(path: Path) -> list[tuple]:
    t = pq.read_table(path)
    return list(zip(t.column("user").to_pylist(), _ms(t, "window_start"), _ms(t, "window_end"), _ms(t, "watermark")))


def test_a_stream_joined_with_a_static_table_joins_every_batch_once_and_left_outer_keeps_unmatched_stream_rows(
        stream_cluster, tmp_path):
    out, checkpoint = tmp_path / "joined", tmp_path / "checkpoint"
    client = stream_cluster.client
    env = ExecutionEnvironment("stream static join", parallelism=2)
    names = env.from_collection([(0, "zero"), (1, "one"), (2, "two"), (2, "deux")], "k bigint, name string")
    (env.read_stream.rate(40).select("value % 4 AS k", "value")
        .join(names, on="k", how="left")
        .write_parquet(str(out)))
    env.set_trigger("500 ms").set_checkpoint_location(str(checkpoint))
    run_then_stop(client, env.build(), 5)
    store = CheckpointStore(str(checkpoint))
    got = committed_rows(out, lambda p: list(zip(*(pq.read_table(p).column(c).to_pylist()
                                                    for c in ("value", "k", "name")))))
    lookup = {0: ["zero"], 1: ["one"], 2: ["two", "deux"], 3: [None]}
    for b in store.commit_ids():
        (r,) = store.read_offsets(b).sources.values()
        start, end = rows_of(r)
        expected = sorted((v, v % 4, n) for v in range(start, end) for n in lookup[v % 4])
        assert sorted(got.get(b, []), key=str) == sorted(expected, key=str), f"batch {b}"
    # a static branch written on its own, or a full outer join, would repeat the table every batch: refused
    bad = ExecutionEnvironment("static sink", parallelism=1)
    bad.read_stream.rate(1).write_parquet(str(tmp_path / "a"))
    bad.from_collection([(0, "zero")], "k bigint, name string").write_parquet(str(tmp_path / "b"))
    with pytest.raises(Exception, match="writes a static data set"):
        client.submit(bad.build())


LEFT_TIME = (f"timestamp_millis({BASE_MS} + value * 50 + ((value * 7919) % 13) * 20 "
             "- CASE WHEN value % 20 = 7 THEN 4000 ELSE 0 END) AS ts")
RIGHT_TIME = f"timestamp_millis({BASE_MS} + value * 60 + ((value * 31) % 7) * 30) AS ts"


def left_ms(v: int) -> int:
    return BASE_MS + v * 50 + (v * 7919 % 13) * 20 - (4000 if v % 20 == 7 else 0)


def left_key(v: int) -> int:
    return 9 if v % 20 == 3 else v % 5


def right_ms(w: int) -> int:
    return BASE_MS + w * 60 + (w * 31 % 7) * 30


def test_an_interval_join_of_two_streams_emits_each_pair_once_and_each_unmatched_left_row_once_its_match_cannot_come(
        stream_cluster, tmp_path):
    out, checkpoint = tmp_path / "joined", tmp_path / "checkpoint"
    client = stream_cluster.client
    env = ExecutionEnvironment("interval join", parallelism=2)
    # every 20th left row has a key the right stream never has: it is emitted unmatched, once
    clicks = env.read_stream.rate(20).select("CASE WHEN value % 20 = 3 THEN 9 ELSE value % 5 END AS k", "value AS a",
                                             LEFT_TIME).with_watermark("ts", "1 s")
    views = env.read_stream.rate(20).select("value % 5 AS k", "value AS b", RIGHT_TIME).with_watermark("ts", "1 s")
    clicks.interval_join(views, "k", "-300 ms", "300 ms", how="left").write_parquet(str(out))
    env.set_trigger("500 ms").set_checkpoint_location(str(checkpoint))
    job = env.build()
    left_source = next(v.id for v in job.vertices if any("value AS a" in str(op.config) for op in v.operators))
    run_then_stop(client, job, 12)
    store = CheckpointStore(str(checkpoint))
    lefts, rights, last_wm = {}, {}, None
    late = 0
    for b in store.commit_ids():
        entry = store.read_offsets(b)
        wm = entry.watermark_ms
        last_wm = wm
        for source, r in entry.sources.items():
            start, end = rows_of(r)
            for v in range(start, end):
                ts = left_ms(v) if source == left_source else right_ms(v)
                if wm is not None and ts < wm:
                    late += 1
                    continue
                (lefts if source == left_source else rights)[v] = ts
    pairs = {(a, b) for a, ta in lefts.items() for b, tb in rights.items()
             if left_key(a) == b % 5 and ta - 300 <= tb <= ta + 300}
    matched = {a for a, _ in pairs}
    outer = {(a, None) for a, ta in lefts.items() if a not in matched and last_wm is not None and ta + 301 <= last_wm}
    rows = [r for rs in committed_rows(out, lambda p: list(zip(pq.read_table(p).column("a").to_pylist(),
                                                                pq.read_table(p).column("b").to_pylist()))).values()
            for r in rs]
    counted = collections.Counter(rows)
    assert all(n == 1 for n in counted.values()), [r for r, n in counted.items() if n > 1][:5]
    assert set(counted) == pairs | outer, (sorted((pairs | outer) - set(counted))[:5], sorted(set(counted) - pairs - outer)[:5])
    assert len(pairs) > 20 and outer and late
    print(f"interval join: {len(pairs)} pairs and {len(outer)} unmatched left rows, each once; {late} late rows")
