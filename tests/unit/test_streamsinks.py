"""Exactly-once streaming file sinks (jobmanager/streamsinks.py) on real files: a batch's staged
output is committed once, with a manifest; committing it again changes nothing; an interrupted
commit's leftovers are replaced; a failed attempt's output is never committed; once the job ended
for good its clean-up leaves the target with the committed files and their manifests only."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from funke.common import layout
from funke.jobmanager import committer
from funke.jobmanager.streamsinks import (
    SinkCommitError,
    commit_batch,
    committed_batches,
    committed_files,
    discard_batch,
    is_committed,
    staging_dir,
)


JOB = "job-s"


def stage(target, batch, subtask, attempt, files: dict[str, bytes], job: str = JOB) -> None:
    d = staging_dir(str(target), job, batch, subtask, attempt)
    os.makedirs(d, exist_ok=True)
    for name, data in files.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)


def visible(target) -> dict[str, bytes]:
    """What a plain Spark read of the target would list (hidden names excluded)."""
    return {p.name: p.read_bytes() for p in target.iterdir() if p.is_file() and not p.name.startswith((".", "_"))}


def test_a_batch_is_committed_once_from_the_attempts_chosen(tmp_path):
    target = tmp_path / "out"
    stage(target, 0, 0, 0, {"part-0.parquet": b"s0", "_SUCCESS": b""})
    stage(target, 0, 1, 0, {"part-0.parquet": b"failed attempt"})
    stage(target, 0, 1, 1, {"part-0.parquet": b"s1"})
    assert not visible(target)  # staged output is hidden
    names = commit_batch(str(target), JOB, 0, {0: 0, 1: 1})
    assert names == ["batch-0-0-part-0.parquet", "batch-0-1-part-0.parquet"]
    assert visible(target) == {"batch-0-0-part-0.parquet": b"s0", "batch-0-1-part-0.parquet": b"s1"}
    assert is_committed(str(target), 0) and committed_files(str(target), 0) == names
    assert not (target / f".funke-staging-{JOB}" / "0").exists()
    # a batch run again after a failure between the sink commit and the commit log: no effect,
    # and what the run again staged goes
    stage(target, 0, 0, 2, {"part-0.parquet": b"again"})
    assert commit_batch(str(target), JOB, 0, {0: 2}) == names
    assert not (target / f".funke-staging-{JOB}" / "0").exists()
    assert visible(target)["batch-0-0-part-0.parquet"] == b"s0"
    assert committed_batches(str(target)) == [0]


def test_an_interrupted_commit_is_replaced_not_added_to(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "batch-3-0-part-0.parquet").write_bytes(b"half of an earlier commit")
    (target / "batch-3-9-part-7.parquet").write_bytes(b"from a subtask that no longer exists")
    (target / "batch-30-0-part-0.parquet").write_bytes(b"batch 30: not ours to touch")
    stage(target, 3, 0, 1, {"part-0.parquet": b"new"})
    commit_batch(str(target), JOB, 3, {0: 1})
    assert visible(target) == {"batch-3-0-part-0.parquet": b"new", "batch-30-0-part-0.parquet": b"batch 30: not ours to touch"}


def test_missing_staged_output_or_a_bad_manifest_is_an_error(tmp_path):
    target = tmp_path / "out"
    with pytest.raises(SinkCommitError, match="subtask 0 attempt 0 staged nothing"):
        commit_batch(str(target), JOB, 1, {0: 0})
    (target / "_funke_sink_log").mkdir(parents=True)
    (target / "_funke_sink_log" / "2").write_text("{}")
    with pytest.raises(SinkCommitError, match="not a funke sink manifest"):
        committed_files(str(target), 2)
    for bad in (-1, True, "1", 2**63):
        with pytest.raises(ValueError):
            staging_dir(str(target), JOB, bad, 0, 0)
    for bad_job in ("..", "", "a/b"):
        with pytest.raises(ValueError):
            staging_dir(str(target), bad_job, 0, 0, 0)


def test_a_discarded_batch_leaves_nothing(tmp_path):
    target = tmp_path / "out"
    stage(target, 4, 0, 0, {"part-0.parquet": b"x"})
    discard_batch(str(target), JOB, 4)
    assert not (target / f".funke-staging-{JOB}" / "4").exists() and not is_committed(str(target), 4)


def test_a_query_run_lists_its_target_for_an_interrupted_commit_once(tmp_path, monkeypatch):
    """The target holds every batch's files: only the first commit of a run (and the first after
    a failed one) lists it; a new run's first commit removes what an interrupted commit left."""
    from funke.jobmanager import streamsinks
    from funke.jobmanager.streaming import SinkContext, sink_side

    target = tmp_path / "out"
    side = sink_side("sink.parquet", SinkContext("sink", {"path": str(target)}, str(tmp_path / "data"), JOB))
    listed = []
    names = streamsinks._names
    monkeypatch.setattr(streamsinks, "_names", lambda d: listed.append(d) or names(d))

    def commits_listing_target(batch: int) -> int:
        stage(target, batch, 0, 0, {f"part-{batch}.parquet": b"%d" % batch})
        before = listed.count(str(target))
        side.commit(batch, {0: 0}, "query")
        return listed.count(str(target)) - before

    side.prepare()
    target.mkdir()
    (target / "batch-0-0-part-old.parquet").write_bytes(b"an interrupted commit's")
    assert [commits_listing_target(b) for b in range(4)] == [1, 0, 0, 0]
    assert "batch-0-0-part-old.parquet" not in visible(target)
    with pytest.raises(SinkCommitError):  # a failed commit: the next one looks again
        side.commit(4, {0: 0}, "query")
    assert commits_listing_target(4) == 1
    side.prepare()  # a new run
    (target / "batch-5-0-part-old.parquet").write_bytes(b"an interrupted commit's")
    assert commits_listing_target(5) == 1
    assert sorted(visible(target)) == [f"batch-{b}-0-part-{b}.parquet" for b in range(6)]


def test_a_run_whose_checkpoint_was_taken_over_commits_nothing(tmp_path):
    """The fence (the run's hold on the query's checkpoint) is asked before any file moves, and
    again before the manifest: a JobManager woken after its successor took the query over
    commits nothing, and the manifest is never replaced."""
    target = tmp_path / "out"
    stage(target, 0, 0, 0, {"part-0.parquet": b"the old leader's"})

    def fenced() -> None:
        raise RuntimeError("taken over by the new leader")

    with pytest.raises(RuntimeError, match="taken over"):
        commit_batch(str(target), JOB, 0, {0: 0}, fence=fenced)
    assert not visible(target) and not is_committed(str(target), 0)
    checks = []

    def taken_over_before_the_manifest() -> None:
        checks.append(1)
        if len(checks) == 3:
            raise RuntimeError("taken over by the new leader")

    with pytest.raises(RuntimeError, match="taken over"):
        commit_batch(str(target), JOB, 0, {0: 0}, fence=taken_over_before_the_manifest)
    assert not is_committed(str(target), 0)  # no manifest: the next run's commit replaces the files
    stage(target, 0, 0, 1000, {"part-0.parquet": b"the new leader's"})
    assert commit_batch(str(target), JOB, 0, {0: 1000}) == ["batch-0-0-part-0.parquet"]
    assert visible(target) == {"batch-0-0-part-0.parquet": b"the new leader's"}


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_the_clean_up_of_an_ended_query_leaves_the_committed_files_and_manifests_only(tmp_path):
    """A query ended for good (stopped, finished, cancelled, failed) with a batch committed, one
    staged by a subtask and not committed (cancelled in flight), and the empty directory of a
    batch committed: its job's clean-up leaves what a reader needs and nothing else. Another job
    on the same target (the query submitted again on its checkpoint, running the uncommitted
    batch again) keeps its staging; the clean-up is idempotent."""
    data, target = tmp_path / "data", tmp_path / "out"
    stage(target, 0, 0, 0, {"part-0.parquet": b"committed"})
    commit_batch(str(target), JOB, 0, {0: 0})
    stage(target, 1, 0, 0, {"part-0.parquet": b"in flight when cancelled", "_SUCCESS": b""})
    stage(target, 1, 0, 0, {"part-0.parquet": b"the next job runs batch 1 again"}, job="job-next")
    assert f".funke-staging-{JOB}" in listing(target)
    for _ in range(2):  # retried, or run again by the next leader: nothing left to do is no error
        committer.cleanup_job(str(data), JOB, [str(target)], keep_collected=False)
        assert listing(target) == [".funke-staging-job-next", ".funke-staging-job-next/1",
                                   ".funke-staging-job-next/1/0-0", ".funke-staging-job-next/1/0-0/part-0.parquet",
                                   "_funke_sink_log", "_funke_sink_log/0", "batch-0-0-part-0.parquet"]
    commit_batch(str(target), "job-next", 1, {0: 0})  # the next job commits batch 1 from its own staging
    committer.cleanup_job(str(data), "job-next", [str(target)], keep_collected=False)
    assert listing(target) == ["_funke_sink_log", "_funke_sink_log/0", "_funke_sink_log/1",
                               "batch-0-0-part-0.parquet", "batch-1-0-part-0.parquet"]
    assert (target / "batch-1-0-part-0.parquet").read_bytes() == b"the next job runs batch 1 again"


def test_a_finished_querys_collected_rows_lose_their_staging_and_keep_their_batches(tmp_path):
    data = tmp_path / "data"
    collected = Path(layout.collect_dir(str(data), JOB, "sink"))
    stage(collected, 0, 0, 0, {"part-0.parquet": b"rows"})
    commit_batch(str(collected), JOB, 0, {0: 0})
    stage(collected, 1, 0, 0, {"part-0.parquet": b"not committed"})
    committer.cleanup_job(str(data), JOB, [str(collected)], keep_collected=True)
    sink = f"{JOB}/collect/sink"
    assert listing(data / "jobs") == [JOB, f"{JOB}/collect", sink, f"{sink}/_funke_sink_log",
                                      f"{sink}/_funke_sink_log/0", f"{sink}/batch-0-0-part-0.parquet"]
