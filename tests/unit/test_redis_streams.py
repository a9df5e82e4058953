"""Redis Streams as a source and a sink (common/streaming/sources/, jobmanager/streaming/redis.py
RedisPlanner, jobmanager/redissink.py): entry-id offsets per key, per-trigger limits, where a
query starts, the lag; and a sink's batch appended once, in one transaction, whatever runs it
again. Against a real redis-server on loopback."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis

from funke.common.streaming.checkpoint import SourceRange
from funke.common.streaming.sources import RedisStreamsSource, stream_id
from funke.jobmanager import redissink
from funke.jobmanager.streaming import RedisPlanner
from funke.jobmanager.streamsinks import SinkCommitError, staging_dir


@pytest.fixture
def client(redis_server):
    c = redis.Redis(port=redis_server)
    c.flushall()
    yield c
    c.close()


def test_entry_ids_compare_as_numbers_and_anything_else_is_refused():
    assert stream_id("10-2") > stream_id("9-99") and stream_id("5-0") == (5, 0)
    for bad in ("5", "a-1", "1-2-3", 7, None, "-1-0"):
        with pytest.raises(ValueError):
            stream_id(bad)


def test_a_range_per_key_within_the_limit_and_the_cap_and_where_a_query_starts():
    source = RedisStreamsSource(("a", "b"), "earliest", max_entries_per_trigger=2)
    first = source.plan(None, {"a": ["1-0", "2-0", "3-0"], "b": []}, {})
    assert first == SourceRange(None, {"a": "2-0", "b": "0-0"}, 2)
    assert source.bounds(first) == {"a": ("0-0", "2-0"), "b": ("0-0", "0-0")}
    second = source.plan(first.end, {"a": ["3-0"], "b": ["4-1", "4-2", "4-3"]}, {}, limited=False, cap={"a": "9-0", "b": "4-2"})
    assert second.end == {"a": "3-0", "b": "4-2"} and second.rows == 3
    # latest: the first batch starts after what is there now, even with nothing new
    latest = RedisStreamsSource(("a",))
    assert latest.plan(None, {"a": []}, {"a": "7-0"}) == SourceRange(None, {"a": "7-0"}, 0)
    # ... and reads none of the entries there were: its range is empty (it read them all before)
    assert latest.bounds(SourceRange(None, {"a": "7-0"}, 0)) == {"a": ("7-0", "7-0")}
    # entries added between the two lookups are the next batch's, not the first's
    assert latest.plan(None, {"a": ["8-0"]}, {"a": "7-0"}) == SourceRange(None, {"a": "7-0"}, 0)
    assert latest.plan({"a": "7-0"}, {"a": ["8-0"]}, {}) == SourceRange({"a": "7-0"}, {"a": "8-0"}, 1)
    assert RedisStreamsSource(("a",), "earliest").plan(None, {"a": []}, {}) == SourceRange(None, None, 0)
    for bad in ({"a": "x"}, {"c": "1-0"}, ["a"]):
        with pytest.raises(ValueError):
            source.plan(bad, {}, {})
    with pytest.raises(ValueError):
        RedisStreamsSource(("a", "a"))


def test_the_planner_reads_ids_from_redis_and_measures_the_lag(client, redis_server):
    for i in range(5):
        client.xadd("clicks", {"n": str(i)}, id=f"100-{i}")
    planner = RedisPlanner(RedisStreamsSource(("clicks",), "earliest", 2),
                           lambda: redis.Redis(port=redis_server))
    first = planner.plan(None, 0, True, None)
    assert first.end == {"clicks": "100-1"} and first.rows == 2 and planner.lag == {"clicks": 3}
    second = planner.plan(first.end, 0, True, None)
    assert second.end == {"clicks": "100-3"} and planner.lag == {"clicks": 1}
    assert planner.latest(second.end, 0) == {"clicks": "100-4"}
    latest = RedisPlanner(RedisStreamsSource(("clicks",)), lambda: redis.Redis(port=redis_server))
    assert latest.plan(None, 0, True, None).end == {"clicks": "100-4"}  # from now on


def stage(tmp_path, batch_id: int, subtask: int, attempt: int, rows: list[dict]) -> str:
    target = str(tmp_path / "redis-sink")
    directory = staging_dir(target, "job-r", batch_id, subtask, attempt)
    os.makedirs(directory)
    pq.write_table(pa.Table.from_pylist(rows), os.path.join(directory, "part-0.parquet"))
    return target


def test_a_batch_is_appended_once_in_one_transaction_whatever_commits_it_again(client, redis_server, tmp_path):
    connect = lambda: redis.Redis(port=redis_server)  # noqa: E731
    target = stage(tmp_path, 4, 0, 1, [{"word": "a", "n": 1}, {"word": "b", "n": None}])
    stage(tmp_path, 4, 1, 0, [{"word": "c", "n": 3}])
    assert redissink.commit_batch(connect, "out", "q1", "sink", target, "job-r", 4, {0: 1, 1: 0}) == 3
    entries = [{k.decode(): v.decode() for k, v in f.items()} for _, f in client.xrange("out")]
    assert entries == [{"word": "a", "n": "1"}, {"word": "b"}, {"word": "c", "n": "3"}]
    assert client.ttl(redissink.marker_key("q1", "sink", 4)) > 0
    # the batch run again (a failure between the sink's commit and the commit log): nothing more
    stage(tmp_path, 4, 0, 2, [{"word": "a", "n": 1}, {"word": "b", "n": None}])
    stage(tmp_path, 4, 1, 1, [{"word": "c", "n": 3}])
    assert redissink.commit_batch(connect, "out", "q1", "sink", target, "job-r", 4, {0: 2, 1: 1}) == 0
    assert client.xlen("out") == 3
    # another query (another id) writing its batch 4 is its own
    target2 = stage(tmp_path / "other", 4, 0, 0, [{"word": "z"}])
    assert redissink.commit_batch(connect, "out", "q2", "sink", target2, "job-r", 4, {0: 0}) == 1
    with pytest.raises(SinkCommitError):
        redissink.commit_batch(connect, "out", "q1", "sink", target, "job-r", 5, {0: 0})
    assert client.xlen("out") == 4
