"""Delta Lake support without Spark: the stream source's pure planning (table versions -> batch
ranges, common/streaming/sources/delta.py), what a commit adds, the configuration rules at
submit, and the JobManager's side on real tables written with `deltalake` (runtime/deltalog.py,
jobmanager/deltatables.py, jobmanager/streaming/delta.py): submit checks, version pinning, and
commits that record a transaction identifier, so a batch committed again adds nothing."""

from __future__ import annotations

import json
import os

import duckdb
import polars
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from funke.common import layout
from funke.common.api.dsl import ExecutionEnvironment
from funke.common.graph.validation import ValidationContext, find_problems
from funke.common.streaming.checkpoint import SourceRange
from funke.common.streaming.sources import SOURCE_PLUGINS
from funke.common.streaming.sources.delta import (
    Commit,
    DataFile,
    DeltaStreamSource,
    added_files,
    parse_commit,
    parse_timestamp,
    relative_path,
    schema_difference,
    share,
    version_at,
)
from funke.jobmanager import deltatables
from funke.jobmanager.streaming.delta import DeltaPlanner
from funke.jobmanager.streamsinks import SinkCommitError
from funke.runtime import deltalog

# ---------------------------------------------------------------------------- pure planning


def test_the_first_batch_reads_the_snapshot_and_later_ones_the_versions_after_the_last():
    source = DeltaStreamSource()
    first = source.plan(None, 3)
    assert first == SourceRange(None, 3, 0)
    assert DeltaStreamSource.versions(first) is None  # the snapshot at version 3
    idle = source.plan(3, 3)
    assert idle.start == idle.end == 3  # nothing new: the coordinator skips the batch
    second = source.plan(3, 7)
    assert second == SourceRange(3, 7, 0)
    assert list(DeltaStreamSource.versions(second)) == [4, 5, 6, 7]
    assert list(DeltaStreamSource.versions(idle)) == []


def test_limits_and_caps_bound_a_range_and_latest_ignores_the_limit():
    source = DeltaStreamSource(max_versions_per_trigger=2)
    assert source.plan(3, 10).end == 5
    assert source.plan(3, 10, limited=False).end == 10
    assert source.plan(3, 10, limited=False, cap=4).end == 4
    assert source.plan(None, 10, cap=6).end == 6  # the first batch: the snapshot at the cap
    assert source.plan(5, 10, cap=4).end == 5  # never before the start
    assert source.latest(3, 10) == 10


def test_no_table_gives_no_batch_and_a_table_older_than_the_offset_is_refused():
    assert DeltaStreamSource().plan(None, None) == SourceRange(None, None, 0)
    assert DeltaStreamSource().plan(4, None) == SourceRange(4, 4, 0)
    with pytest.raises(ValueError, match="before the query's offset 9"):
        DeltaStreamSource().plan(9, 2)


@pytest.mark.parametrize("bad", [-1, True, "3", 1.5, {"version": 1}])
def test_a_wrong_offset_is_refused(bad):
    with pytest.raises(ValueError, match="not a Delta source offset"):
        DeltaStreamSource().plan(bad, 5)


def test_the_registry_builds_its_planning_from_the_operator_config():
    plugin = SOURCE_PLUGINS["source.stream.delta"]
    assert not plugin.receiver
    assert plugin.planning({"path": "/t", "max_versions_per_trigger": 4}, 2) == DeltaStreamSource(4)


def _commit(*actions: dict) -> str:
    return "\n".join(json.dumps(a) for a in actions) + "\n"


def _add(path: str, change: bool = True, **extra) -> dict:
    return {"add": {"path": path, "partitionValues": extra.pop("values", {}), "size": 10, "dataChange": change,
                    "stats": json.dumps({"numRecords": 4}), **extra}}


def test_a_commit_adds_its_data_changing_files_and_a_compaction_adds_none():
    appended = parse_commit(4, _commit({"commitInfo": {"operation": "WRITE"}}, _add("a.parquet"),
                                       _add("p=x%2520y/b.parquet", values={"p": "x y"})))
    assert appended.operation == "WRITE"
    assert appended.added == (DataFile("a.parquet", (), 10, 4), DataFile("p=x%20y/b.parquet", (("p", "x y"),), 10, 4))
    compacted = parse_commit(5, _commit({"commitInfo": {"operation": "OPTIMIZE"}}, _add("c.parquet", change=False),
                                        {"remove": {"path": "a.parquet", "dataChange": False}}))
    assert compacted.added == () and not compacted.removes_data
    assert added_files([appended, compacted], None) == list(appended.added)


def test_a_commit_that_removes_data_changes_the_schema_or_needs_features_fails_naming_its_version():
    schema = {"type": "struct", "fields": [{"name": "n", "type": "long", "nullable": True, "metadata": {}}]}
    deleted = parse_commit(7, _commit({"commitInfo": {"operation": "DELETE"}},
                                      {"remove": {"path": "a.parquet", "dataChange": True}}))
    with pytest.raises(ValueError, match=r"version 7 \(DELETE\) removes or rewrites data"):
        added_files([deleted], schema)
    widened = {"type": "struct", "fields": [{"name": "n", "type": "long"}, {"name": "m", "type": "string"}]}
    altered = parse_commit(8, _commit({"metaData": {"schemaString": json.dumps(widened), "configuration": {}}}))
    with pytest.raises(ValueError, match="version 8 changes the table's schema"):
        added_files([altered], schema)
    same = parse_commit(8, _commit({"metaData": {"schemaString": json.dumps(schema), "configuration": {}}}))
    assert added_files([same], schema) == []  # a property change is fine
    mapped = parse_commit(9, _commit({"metaData": {"schemaString": json.dumps(schema),
                                                   "configuration": {"delta.columnMapping.mode": "name"}}}))
    with pytest.raises(ValueError, match="version 9 changes the table .* column mapping"):
        added_files([mapped], schema)
    with_dv = parse_commit(10, _commit(_add("d.parquet", deletionVector={"storageType": "u"})))
    with pytest.raises(ValueError, match="version 10 adds 1 data file"):
        added_files([with_dv], schema)


@pytest.mark.parametrize("logged", ["/etc/passwd", "file:///etc/passwd", "s3://b/k.parquet", "../x.parquet",
                                    "a/../../x.parquet", "%2E%2E/x.parquet", "a//b.parquet", "", "*.parquet"])
def test_a_log_naming_a_file_outside_the_table_is_refused(logged):
    with pytest.raises(ValueError, match="not a plain path inside the table's directory"):
        relative_path(logged)
    with pytest.raises(ValueError):
        parse_commit(1, _commit(_add(logged)))


def test_subtasks_share_a_batch_by_position():
    files = [DataFile(f"{i}.parquet") for i in range(5)]
    assert [f.path for f in share(files, 0, 2)] == ["0.parquet", "2.parquet", "4.parquet"]
    assert [f.path for f in share(files, 1, 2)] == ["1.parquet", "3.parquet"]
    with pytest.raises(ValueError):
        share(files, 2, 2)


def test_time_travel_reads_the_newest_version_at_or_before_the_timestamp():
    history = [(0, 1_000), (1, 2_000), (2, 3_000)]
    assert version_at(history, 2_500) == 1
    assert version_at(history, 3_000) == 2
    with pytest.raises(ValueError, match="no version committed at or before .* oldest version in its log is 0"):
        version_at(history, 999)
    assert parse_timestamp("1970-01-01T00:00:02Z") == 2_000
    assert parse_timestamp("1970-01-01T00:00:02") == 2_000  # no offset: UTC
    assert parse_timestamp("1970-01-01T01:00:02+01:00") == 2_000
    for bad in ("yesterday", "", 5, None):
        with pytest.raises(ValueError, match="ISO 8601"):
            parse_timestamp(bad)


def test_schema_differences_name_each_column():
    table = {"fields": [{"name": "n", "type": "long", "nullable": False}, {"name": "s", "type": "string"}]}
    assert schema_difference(table, {"fields": [{"name": "n", "type": "long", "nullable": True},
                                                {"name": "s", "type": "string"}]}) is None
    diff = schema_difference(table, {"fields": [{"name": "n", "type": "integer"}, {"name": "x", "type": "string"}]})
    assert "missing columns ['s']" in diff and "columns the table does not have ['x']" in diff
    assert "column 'n' is integer, the table's is long" in diff


# ---------------------------------------------------------------------------- validation at submit


def _messages(env: ExecutionEnvironment, context: ValidationContext | None = None) -> list[str]:
    from funke.common.api.translate import translate

    return [str(p) for p in find_problems(translate(env.logical_plan())[0], context)]


def _delta_job(source_config: dict, sink_config: dict) -> ExecutionEnvironment:
    env = ExecutionEnvironment("delta")
    stream = env.read_delta("/in/t")
    stream._t.config.clear()
    stream._t.config.update(source_config)
    sink = stream.write_delta("/out/t")
    sink._t.config.clear()
    sink._t.config.update(sink_config)
    return env


def test_every_problem_of_a_delta_source_and_sink_is_listed_at_once():
    msgs = _messages(_delta_job({"path": "hdfs://nn/t", "version": 1, "timestamp": "2024-01-01T00:00:00Z"},
                                {"path": "/out/*", "mode": "error"}))
    joined = "\n".join(msgs)
    assert "Delta tables are read and written on local paths or file:// URIs" in joined
    assert "give config 'version' or 'timestamp', not both" in joined
    assert "a Delta table is one directory, not a glob" in joined
    assert "config 'mode' must be one of 'append', 'overwrite'" in joined
    msgs = _messages(_delta_job({"path": "relative/t", "version": -1, "timestamp": "soon"},
                                {"path": "/out/../x", "mode": "append"}))
    joined = "\n".join(msgs)
    assert "is relative" in joined and "must be a table version" in joined and "ISO 8601" in joined
    assert "not in normal form" in joined
    assert _messages(_delta_job({"path": "/in/t", "timestamp": "2024-01-01T00:00:00Z"},
                                {"path": "file:///out/t", "mode": "overwrite"})) == []


def test_delta_paths_stay_inside_the_allowed_paths_and_out_of_the_data_directory():
    context = ValidationContext(data_dir="/srv/data", allowed_paths=("/sandbox",))
    msgs = "\n".join(_messages(_delta_job({"path": "/srv/data/jobs/x"}, {"path": "/elsewhere/t"}), context))
    assert "lies in the cluster's data directory" in msgs
    assert "outside the directories jobs may use here" in msgs
    assert _messages(_delta_job({"path": "/sandbox/in"}, {"path": "/sandbox/out"}), context) == []


def test_the_dsl_refuses_what_it_can_see_at_once(tmp_path):
    env = ExecutionEnvironment("delta")
    with pytest.raises(ValueError, match="not both"):
        env.read_delta("/t", version=1, timestamp="2024-01-01")
    with pytest.raises(ValueError, match="unknown mode"):
        env.from_range(3).write_delta("/t", mode="error")
    config = env.read_delta("rel/t", version=2)._t.config
    assert config == {"path": os.path.abspath("rel/t"), "version": 2}


# ---------------------------------------------------------------------------- tables on disk


def table(path, rows, **kw):
    write_deltalake(str(path), pa.table({"n": pa.array(rows, pa.int64())}), **kw)


def test_submit_checks_name_tables_that_cannot_be_read_or_written(tmp_path):
    table(tmp_path / "ok", [1, 2])
    table(tmp_path / "mapped", [1], configuration={"delta.columnMapping.mode": "name", "delta.minReaderVersion": "2",
                                                   "delta.minWriterVersion": "5"})
    write_deltalake(str(tmp_path / "parts"), pa.table({"n": [1], "p": ["a"]}), partition_by=["p"])
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "data.csv").write_text("1\n")
    (tmp_path / "file").write_text("x")
    env = ExecutionEnvironment("delta")
    env.read_delta(str(tmp_path / "ok"), version=5).write_delta(str(tmp_path / "plain"))
    env.read_delta(str(tmp_path / "ok"), timestamp="2000-01-01T00:00:00Z").write_delta(str(tmp_path / "file"))
    env.read_delta(str(tmp_path / "mapped")).write_delta(str(tmp_path / "parts"))
    env.read_delta(str(tmp_path / "nothing")).write_delta(str(tmp_path / "new"))  # a new table is fine
    stream = ExecutionEnvironment("delta stream")
    stream.read_stream.delta(str(tmp_path / "plain")).write_delta(str(tmp_path / "ok"))
    problems = deltatables.submit_problems(env.build(), None) + deltatables.submit_problems(stream.build(), None)
    msgs = "\n".join(str(p) for p in problems)
    assert "cannot be read at version 5" in msgs
    assert "no version committed at or before 2000-01-01" in msgs
    assert "column mapping" in msgs
    assert "it is partitioned (by p)" in msgs
    assert "holds 1 file(s) ('data.csv')" in msgs
    assert "is not a directory" in msgs
    assert msgs.count("is not a Delta table (no _delta_log") == 2  # the missing one and the plain directory
    assert len(msgs.splitlines()) == 8, msgs


def test_a_bounded_read_without_a_version_is_pinned_to_the_version_at_submit(tmp_path):
    table(tmp_path / "t", [1])
    table(tmp_path / "t", [2], mode="append")
    env = ExecutionEnvironment("delta")
    env.read_delta(str(tmp_path / "t")).union(env.read_delta(str(tmp_path / "t"), version=0)).write_delta(
        str(tmp_path / "out"))
    job = env.build()
    pinned = deltatables.pin_versions(job)
    versions = [op.config.get("version") for v in pinned.vertices for op in v.operators if op.kind == "source.delta"]
    assert sorted(versions) == [0, 1]
    assert deltatables.pin_versions(pinned) is pinned  # nothing left to pin


def stage(directory, rows):
    os.makedirs(directory, exist_ok=True)
    pq.write_table(pa.table({"n": pa.array(rows, pa.int64()), "s": pa.array([f"r{r}" for r in rows], pa.string())}),
                   os.path.join(directory, "part-00000.parquet"))


def rows_of(path) -> list[int]:
    return sorted(DeltaTable(str(path)).to_pyarrow_table().column("n").to_pylist())


def test_a_stream_batch_is_committed_once_with_its_transaction_identifier(tmp_path):
    target = str(tmp_path / "t")
    stage(layout.stream_sink_staging_dir(target, "job-d", 0, 0, 0), [1, 2])
    stage(layout.stream_sink_staging_dir(target, "job-d", 0, 1, 3), [3])
    assert deltatables.commit_stream_batch(target, "query-1", "job-d", 0, {0: 0, 1: 3}, "append") == 2
    assert rows_of(target) == [1, 2, 3]
    assert DeltaTable(target).transaction_version("query-1") == 0
    assert not os.path.exists(os.path.join(layout.stream_staging_root(target, "job-d"), "0"))  # the staging went
    # the batch run again after a crash between the Delta commit and the commit log entry
    stage(layout.stream_sink_staging_dir(target, "job-d", 0, 0, 1), [1, 2])
    stage(layout.stream_sink_staging_dir(target, "job-d", 0, 1, 4), [3])
    assert deltatables.commit_stream_batch(target, "query-1", "job-d", 0, {0: 1, 1: 4}, "append") is None
    assert rows_of(target) == [1, 2, 3] and DeltaTable(target).version() == 0
    # another query's batch 0 is its own
    stage(layout.stream_sink_staging_dir(target, "job-d", 0, 0, 0), [4])
    assert deltatables.commit_stream_batch(target, "query-2", "job-d", 0, {0: 0}, "append") == 1
    assert rows_of(target) == [1, 2, 3, 4]


def test_an_interrupted_commit_is_made_again_from_the_staged_files(tmp_path, monkeypatch):
    target = str(tmp_path / "t")
    stage(tmp_path / "first", [0])
    deltatables.commit(target, "another", 0, {0: str(tmp_path / "first")}, "append")
    staged = {0: str(tmp_path / "s0"), 1: str(tmp_path / "s1")}
    stage(staged[0], [1])
    stage(staged[1], [2])

    def crash(*args, **kwargs):
        raise OSError("the JobManager died before the Delta commit")

    with monkeypatch.context() as m:
        m.setattr(DeltaTable, "create_write_transaction", crash)
        with pytest.raises(OSError):
            deltatables.commit(target, "q", 5, staged, "append")
    placed = sorted(n for n in os.listdir(target) if n.startswith("part-00005-"))
    assert len(placed) == 2  # placed, not committed: no reader sees them
    assert rows_of(target) == [0]
    assert deltatables.commit(target, "q", 5, staged, "append") == 2
    assert rows_of(target) == [0, 1, 2]
    assert sorted(n for n in os.listdir(target) if n.startswith("part-00005-")) == placed
    assert deltatables.commit(target, "q", 5, staged, "append") is None
    assert deltatables.commit(target, "q", 4, staged, "append") is None  # an older batch is committed too
    assert rows_of(target) == [0, 1, 2]


def test_overwrite_replaces_the_rows_and_a_schema_that_does_not_fit_is_refused(tmp_path):
    target = str(tmp_path / "t")
    stage(tmp_path / "a", [1, 2])
    assert deltatables.commit(target, "j", 0, {0: str(tmp_path / "a")}, "append") == 1
    stage(tmp_path / "b", [7])
    assert deltatables.commit(target, "k", 0, {0: str(tmp_path / "b")}, "overwrite") == 1
    assert rows_of(target) == [7]
    other = str(tmp_path / "c")
    os.makedirs(other)
    pq.write_table(pa.table({"n": pa.array([1], pa.int32())}), os.path.join(other, "part-0.parquet"))
    with pytest.raises(SinkCommitError, match="missing columns .*column 'n' is integer, the table's is long"):
        deltatables.commit(target, "m", 0, {0: other}, "append")
    assert rows_of(target) == [7]


def test_a_batch_without_rows_still_records_its_transaction(tmp_path):
    target = str(tmp_path / "t")
    stage(tmp_path / "a", [1])
    deltatables.commit(target, "q", 0, {0: str(tmp_path / "a")}, "append")
    stage(tmp_path / "empty", [])
    assert deltatables.commit(target, "q", 1, {0: str(tmp_path / "empty")}, "append") == 0
    assert DeltaTable(target).transaction_version("q") == 1 and rows_of(target) == [1]
    with pytest.raises(SinkCommitError, match="staged nothing"):
        deltatables.commit(target, "q", 2, {0: str(tmp_path / "missing")}, "append")


def test_what_funke_commits_other_engines_read(tmp_path):
    target = str(tmp_path / "t")
    stage(tmp_path / "a", [1, 2])
    stage(tmp_path / "b", [3])
    deltatables.commit(target, "q", 0, {0: str(tmp_path / "a"), 1: str(tmp_path / "b")}, "append")
    assert sorted(polars.read_delta(target)["n"].to_list()) == [1, 2, 3]
    files = [os.path.join(target, p) for p in DeltaTable(target).file_uris()]
    assert duckdb.sql(f"SELECT sum(n) FROM read_parquet({files!r})").fetchall() == [(6,)]


def test_the_jobmanager_side_plans_versions_and_fails_on_a_commit_it_cannot_stream(tmp_path):
    path = str(tmp_path / "t")
    table(path, [1])
    planner = DeltaPlanner(path, DeltaStreamSource())
    first = planner.plan(None, 0, True, None)
    assert first == SourceRange(None, 0, 0)
    assert [f.records for f in deltalog.range_files(path, first)[0]] == [1]
    table(path, [2, 3], mode="append")
    table(path, [4], mode="append")
    second = planner.plan(first.end, 0, True, None)
    assert second == SourceRange(0, 2, 0)
    files, schema, partitions = deltalog.range_files(path, second)
    assert [f.records for f in files] == [2, 1] and partitions == []
    assert [f["name"] for f in schema["fields"]] == ["n"]
    assert planner.plan(second.end, 0, True, None).end == 2  # idle
    table(path, [9], mode="overwrite")
    with pytest.raises(ValueError, match=r"version 3 \(WRITE\) removes or rewrites data"):
        planner.plan(second.end, 0, True, None)
    # the logged range still reads the same files
    assert [f.records for f in deltalog.range_files(path, second)[0]] == [2, 1]


def test_a_commit_no_longer_in_the_log_is_named(tmp_path):
    path = str(tmp_path / "t")
    table(path, [1])
    table(path, [2], mode="append")
    os.remove(os.path.join(path, "_delta_log", f"{1:020d}.json"))
    with pytest.raises(ValueError, match="the commit of version 1 is not in its log"):
        deltalog.read_commit(path, 1)


def test_commit_parsing_is_what_deltalake_wrote(tmp_path):
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"n": [1, 2], "p": ["a b", "c"]}), partition_by=["p"])
    commit = deltalog.read_commit(path, 0)
    assert isinstance(commit, Commit) and commit.operation and not commit.removes_data
    on_disk = {os.path.relpath(os.path.join(d, f), path) for d, _, fs in os.walk(path) for f in fs
               if f.endswith(".parquet")}
    assert {f.path for f in commit.added} == on_disk
    snapshot = deltalog.snapshot_files(path, deltalog.open_table(path))
    assert {f.path for f in snapshot} == on_disk
    assert {f.partition_values for f in snapshot} == {(("p", "a b"),), (("p", "c"),)}


def test_a_bounded_jobs_failed_delta_commit_rolls_back_the_file_sinks_published_with_it(tmp_path):
    from funke.common.scheduling.scheduler import SinkCommit
    from funke.jobmanager import committer

    files, delta = tmp_path / "files", tmp_path / "t"
    staged = layout.sink_staging_dir(str(files), "job-1", 0, 0)
    os.makedirs(staged)
    pq.write_table(pa.table({"n": [1]}), os.path.join(staged, "part-0.parquet"))
    table(delta, [1])  # n only: the rows staged for it have a column more
    stage(layout.sink_staging_dir(str(delta), "job-1", 0, 0), [5])
    sinks = [SinkCommit("files", 0, 0, "sink.parquet", (("mode", "error"), ("path", str(files)))),
             SinkCommit("delta", 0, 0, "sink.delta", (("mode", "append"), ("path", str(delta))))]
    with pytest.raises(SinkCommitError, match="columns the table does not have"):
        committer.commit_outputs(str(tmp_path / "data"), "job-1", sinks)
    assert not files.exists() and rows_of(delta) == [1]  # nothing half-applied

    fitting = tmp_path / "fitting"
    stage(layout.sink_staging_dir(str(fitting), "job-2", 0, 0), [7])
    os.makedirs(layout.sink_staging_dir(str(files), "job-2", 0, 0))
    pq.write_table(pa.table({"n": [1]}), os.path.join(layout.sink_staging_dir(str(files), "job-2", 0, 0), "p.parquet"))
    committer.commit_outputs(str(tmp_path / "data"), "job-2", [
        SinkCommit("files", 0, 0, "sink.parquet", (("mode", "error"), ("path", str(files)))),
        SinkCommit("delta", 0, 0, "sink.delta", (("mode", "append"), ("path", str(fitting))))])
    assert files.is_dir() and rows_of(fitting) == [7]
    assert DeltaTable(str(fitting)).transaction_version(deltatables.job_app_id("job-2")) == 0
    assert deltatables.commit_job(str(fitting), "job-2", {0: 0}, "append") is None  # a recovered job's commit
    assert rows_of(fitting) == [7]
