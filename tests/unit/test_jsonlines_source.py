"""The JSON-lines source (common/streaming/sources/jsonlines.py, its JobManager side
jobmanager/streaming/jsonlines.py): offsets are byte offsets per file, a range ends at a complete
line, appended lines and new files are taken, and a logged range names the same bytes again."""

from __future__ import annotations

import pytest

from funke.common.streaming.checkpoint import SourceRange
from funke.common.streaming.sources import SOURCE_PLUGINS
from funke.common.streaming.sources.jsonlines import FileSlice, JsonLinesSource
from funke.jobmanager.streaming.jsonlines import JsonLinesPlanner, last_line_end


def test_a_range_takes_appended_lines_and_new_files_from_where_the_last_ended():
    source = JsonLinesSource()
    assert source.plan(None, {}) == SourceRange(None, None, 0)
    assert source.plan(None, {"a.jsonl": 0}) == SourceRange(None, None, 0)  # no complete line yet
    first = source.plan(None, {"a.jsonl": 20})
    assert first == SourceRange(None, {"a.jsonl": 20}, 0)
    second = source.plan(first.end, {"a.jsonl": 35, "b.jsonl": 10})
    assert second.end == {"a.jsonl": 35, "b.jsonl": 10}
    assert JsonLinesSource.slices(second) == [FileSlice("a.jsonl", 20, 35), FileSlice("b.jsonl", 0, 10)]
    idle = source.plan(second.end, {"a.jsonl": 35, "b.jsonl": 10})
    assert idle.start == idle.end  # nothing new: the coordinator skips the batch


def test_a_file_that_shrank_or_vanished_keeps_its_offset():
    source = JsonLinesSource()
    assert source.plan({"a.jsonl": 50}, {"a.jsonl": 10}).end == {"a.jsonl": 50}
    assert source.plan({"a.jsonl": 50}, {}).end == {"a.jsonl": 50}


def test_limits_and_caps_bound_a_range_and_latest_ignores_the_limit():
    source = JsonLinesSource(max_files_per_trigger=1)
    complete = {"a": 10, "b": 20, "c": 30}
    assert source.plan(None, complete).end == {"a": 10}
    assert source.plan({"a": 10}, complete).end == {"a": 10, "b": 20}
    assert source.latest(None, complete) == complete
    assert source.plan(None, complete, limited=False, cap={"a": 5, "b": 20}).end == {"a": 5, "b": 20}


def test_subtasks_split_a_range_by_file_name():
    r = SourceRange({"a": 5}, {"a": 9, "b": 3, "c": 4}, 0)
    assert [s.name for s in JsonLinesSource.slices_of(r, 0, 2)] == ["a", "c"]
    assert [s.name for s in JsonLinesSource.slices_of(r, 1, 2)] == ["b"]
    with pytest.raises(ValueError):
        JsonLinesSource.slices_of(r, 2, 2)


@pytest.mark.parametrize("bad", [[1], {"a": -1}, {"a": True}, {"../a": 1}, {"": 2}, "x"])
def test_a_wrong_offset_is_refused(bad):
    with pytest.raises(ValueError, match="not a JSON-lines source offset"):
        JsonLinesSource().plan(bad, {})


def test_the_registry_builds_its_planning_from_the_operator_config():
    plugin = SOURCE_PLUGINS["source.stream.jsonlines"]
    assert plugin.watches_directory and not plugin.receiver
    assert plugin.planning({"path": "/x", "schema": "a int", "max_files_per_trigger": 2}, 3) == JsonLinesSource(2)


def test_the_jobmanager_side_stops_at_the_last_complete_line(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(b'{"n": 1}\n{"n": 2}\n{"n": 3')  # the last line is being written
    (tmp_path / ".hidden").write_bytes(b'{"n": 9}\n')
    assert last_line_end(str(tmp_path / "a.jsonl"), 0) == 18
    assert last_line_end(str(tmp_path / "a.jsonl"), 18) == 18
    planner = JsonLinesPlanner(str(tmp_path), JsonLinesSource())
    first = planner.plan(None, 0, True, None)
    assert first.end == {"a.jsonl": 18}
    with open(tmp_path / "a.jsonl", "ab") as f:
        f.write(b'}\n')
    (tmp_path / "b.jsonl").write_bytes(b'{"n": 4}\n')
    second = planner.plan(first.end, 0, True, None)
    assert JsonLinesSource.slices(second) == [FileSlice("a.jsonl", 18, 27), FileSlice("b.jsonl", 0, 9)]
    # the logged range names the same bytes, whatever is appended later
    with open(tmp_path / "a.jsonl", "ab") as f:
        f.write(b'{"n": 5}\n')
    assert JsonLinesSource.slices(second) == [FileSlice("a.jsonl", 18, 27), FileSlice("b.jsonl", 0, 9)]
