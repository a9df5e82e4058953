"""A streaming job's checkpoint (common/streaming/checkpoint.py): the entries' format, and where a restarted
job goes on from its offset and commit logs; a gap is an error naming the files."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from funke.common.streaming.checkpoint import (
    CheckpointError,
    CommitEntry,
    OffsetEntry,
    RecoveryPlan,
    SourceRange,
    commit_entry_bytes,
    metadata_bytes,
    offset_entry_bytes,
    parse_commit_entry,
    parse_metadata,
    parse_offset_entry,
    plan_recovery,
    to_purge,
)


def test_entries_round_trip_and_say_their_version_first():
    entry = OffsetEntry(7, 1_700_000_000_000, {"rate": SourceRange(100, 150, 50),
                                              "files": SourceRange(None, {"files": 3}, 1200)})
    data = offset_entry_bytes(entry)
    assert data.startswith(b"v1\n")
    assert parse_offset_entry(data, 7) == entry
    commit = CommitEntry(7, 1_700_000_000_500)
    assert parse_commit_entry(commit_entry_bytes(commit), 7) == commit
    assert parse_metadata(metadata_bytes("q-1")) == "q-1"


@pytest.mark.parametrize("data, match", [
    (b"v2\n{}", "expected 'v1'"),
    (b"v1\nnot json", "not readable JSON"),
    (b"v1\n[1]", "expected a JSON object"),
    (b'v1\n{"batchId": 8, "batchTimestampMs": 0, "sources": {}}', "file name says 7"),
    (b'v1\n{"batchId": 7, "sources": {}}', "missing or malformed"),
    (b'v1\n{"batchId": 7, "batchTimestampMs": 0, "sources": {"a": {"end": 1}}}', "missing or malformed"),
    (b"", "expected 'v1'"),
])
def test_a_damaged_offset_entry_is_an_error_that_says_why(data, match):
    with pytest.raises(CheckpointError, match=match):
        parse_offset_entry(data, 7, "offsets/7")


def test_damaged_metadata_and_commits_are_errors():
    for bad in (b"", b"[]", b'{"id": ""}', b'{"id": 3}'):
        with pytest.raises(CheckpointError):
            parse_metadata(bad)
    with pytest.raises(CheckpointError, match="file name says 2"):
        parse_commit_entry(commit_entry_bytes(CommitEntry(3, 0)), 2)


def test_recovery_goes_on_after_the_last_commit_and_reruns_what_was_logged_after_it():
    assert plan_recovery([], []) == RecoveryPlan(-1, (), 0)
    assert plan_recovery([0, 1, 2], [0, 1, 2]) == RecoveryPlan(2, (), 3)
    assert plan_recovery([0, 1, 2], [0, 1]) == RecoveryPlan(1, (2,), 3)
    assert plan_recovery([0, 1, 2, 3], [0]) == RecoveryPlan(0, (1, 2, 3), 4)
    assert plan_recovery([0], []) == RecoveryPlan(-1, (0,), 1)
    # purged up to batch 40: the logs start later
    assert plan_recovery(list(range(40, 50)), list(range(40, 49))) == RecoveryPlan(48, (49,), 50)


def test_a_gap_or_a_commit_without_its_offsets_is_an_error_naming_the_files():
    with pytest.raises(CheckpointError, match=r"offset log has no entry for batch 2, 3 \(files offsets/2"):
        plan_recovery([0, 1, 4], [0, 1])
    with pytest.raises(CheckpointError, match="commit log has no entry for batch 1"):
        plan_recovery([0, 1, 2], [0, 2])
    with pytest.raises(CheckpointError, match="commits/3 has no offset log entry"):
        plan_recovery([0, 1, 2], [0, 1, 2, 3])
    with pytest.raises(CheckpointError, match="purged before they were committed"):
        plan_recovery([5, 6], [1, 2])


@given(st.integers(0, 30), st.integers(0, 30), st.integers(0, 5), st.integers(1, 10))
def test_purging_keeps_the_last_retained_batches_and_recovery_still_agrees(logged, committed, start, retain):
    committed = min(max(committed, 1 if start else 0), logged)  # logs purged to `start` kept a commit
    offsets = list(range(start, start + logged))
    commits = list(range(start, start + committed))
    last = commits[-1] if commits else start - 1
    if not offsets:
        return
    before = plan_recovery(offsets, commits)
    drop_offsets, drop_commits = to_purge(offsets, commits, last, retain)
    kept_offsets = [b for b in offsets if b not in drop_offsets]
    kept_commits = [b for b in commits if b not in drop_commits]
    assert all(b > last - retain for b in kept_offsets + kept_commits) or not (drop_offsets or drop_commits)
    assert all(b <= last for b in drop_offsets)  # nothing uncommitted is purged
    if kept_offsets:
        after = plan_recovery(kept_offsets, kept_commits)
        assert (after.rerun, after.next_batch_id) == (before.rerun, before.next_batch_id)
