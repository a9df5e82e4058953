"""The JobManager's sink commit: every sink published, or none; the finished attempts only."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from funke.common import layout
from funke.common.scheduling.scheduler import SinkCommit
from funke.jobmanager import committer

JOB = "job-c"


def stage(target: Path, subtask: int, attempt: int, files: dict[str, str]) -> None:
    staged = Path(layout.sink_staging_dir(str(target), JOB, subtask, attempt))
    staged.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (staged / name).write_text(text)


def sink(vertex: str, target: Path, subtask: int, attempt: int, mode: str = "error") -> SinkCommit:
    return SinkCommit(vertex, subtask, attempt, "sink.csv", (("path", str(target)), ("mode", mode)))


def tree(root: Path) -> dict[str, str]:
    """Every file below `root` with its text, except the commit marker in a staging root
    (tested on its own)."""
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != committer.COMMIT_MARKER}


def test_only_the_finished_attempts_are_published_under_deterministic_names(tmp_path):
    out = tmp_path / "out"
    stage(out, 0, 0, {"part-a.csv": "failed attempt\n"})
    stage(out, 0, 1, {"part-x.csv": "s0\n", "_SUCCESS": "", ".part-x.csv.crc": "c"})
    stage(out, 1, 0, {"part-y.csv": "s1 first\n", "part-z.csv": "s1 second\n"})
    committer.commit_outputs(str(tmp_path), JOB, [sink("v", out, 1, 0), sink("v", out, 0, 1)])
    assert tree(tmp_path) == {
        "out/part-00000-000.csv": "s0\n",
        "out/part-00001-000.csv": "s1 first\n",
        "out/part-00001-001.csv": "s1 second\n",
    }


def test_a_taken_target_refuses_the_whole_commit_before_any_sink_is_published(tmp_path):
    first, taken = tmp_path / "a-first", tmp_path / "b-taken"
    taken.mkdir()
    (taken / "mine.csv").write_text("keep me\n")
    stage(first, 0, 0, {"p.csv": "a\n"})
    stage(taken, 0, 0, {"p.csv": "b\n"})
    with pytest.raises(FileExistsError, match="b-taken.*no sink output was published"):
        committer.commit_outputs(str(tmp_path), JOB, [sink("a", first, 0, 0), sink("b", taken, 0, 0)])
    assert not first.exists()
    assert tree(taken) == {"mine.csv": "keep me\n"}
    # the staged output is still where the tasks left it, for clean-up to remove
    assert (Path(layout.sink_staging_dir(str(first), JOB, 0, 0)) / "p.csv").exists()
    committer.cleanup_job(str(tmp_path / "data"), JOB, [str(first), str(taken)], keep_collected=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b-taken"]


def test_overwrite_replaces_the_old_output_and_an_empty_directory_is_not_protected(tmp_path):
    replaced, empty = tmp_path / "replaced", tmp_path / "empty"
    replaced.mkdir()
    (replaced / "old.csv").write_text("old\n")
    (replaced / "nested").mkdir()
    (replaced / "nested" / "older.csv").write_text("older\n")
    empty.mkdir()
    stage(replaced, 0, 0, {"p.csv": "new\n"})
    stage(empty, 0, 2, {"p.csv": "fresh\n"})
    committer.commit_outputs(str(tmp_path), JOB, [sink("r", replaced, 0, 0, mode="overwrite"), sink("e", empty, 0, 2)])
    assert tree(tmp_path) == {"empty/part-00000-000.csv": "fresh\n", "replaced/part-00000-000.csv": "new\n"}


def test_two_sinks_writing_into_the_same_place_are_refused_before_anything_moves(tmp_path):
    out, inner = tmp_path / "out", tmp_path / "out" / "inner"
    stage(out, 0, 0, {"p.csv": "a\n"})
    stage(inner, 0, 0, {"p.csv": "b\n"})
    with pytest.raises(FileExistsError, match="sinks 'a' and 'b' both write into .*no sink output was published"):
        committer.commit_outputs(str(tmp_path), JOB, [sink("a", out, 0, 0), sink("b", inner, 0, 0)])
    assert (Path(layout.sink_staging_dir(str(out), JOB, 0, 0)) / "p.csv").read_text() == "a\n"
    assert (Path(layout.sink_staging_dir(str(inner), JOB, 0, 0)) / "p.csv").read_text() == "b\n"
    assert not [p for p in out.rglob("*") if p.is_file() and ".funke-" not in str(p)]


class FailingMoves:
    """A filesystem whose first move of new output onto `fail_onto` fails (a passing I/O error)."""

    def __init__(self, fs, fail_onto: str, failed: list[str]):
        self._fs, self._fail_onto, self._failed = fs, fail_onto, failed

    def move(self, src: str, dst: str) -> None:
        if dst == self._fail_onto and src.endswith("/commit") and not self._failed:
            self._failed.append(dst)
            raise OSError(f"cannot move onto {dst}")
        self._fs.move(src, dst)

    def __getattr__(self, name):
        return getattr(self._fs, name)


def test_a_failed_publish_rolls_back_every_sink_and_keeps_the_old_output(tmp_path, monkeypatch):
    first, second = tmp_path / "a-first", tmp_path / "b-second"
    for target, old in ((first, "old a\n"), (second, "old b\n")):
        target.mkdir()
        (target / "old.csv").write_text(old)
        stage(target, 0, 0, {"p.csv": "new\n"})
    real, failed = committer.filesystem, []

    def filesystem(uri):
        fs, path = real(uri)
        return FailingMoves(fs, str(second), failed), path

    monkeypatch.setattr(committer, "filesystem", filesystem)
    with pytest.raises(OSError, match="cannot move onto"):
        committer.commit_outputs(str(tmp_path), JOB, [sink("a", first, 0, 0, "overwrite"), sink("b", second, 0, 0, "overwrite")])
    visible = {k: v for k, v in tree(tmp_path).items() if ".funke-" not in k}
    assert failed == [str(second)]
    assert visible == {"a-first/old.csv": "old a\n", "b-second/old.csv": "old b\n"}


def test_leftovers_of_a_commit_that_never_ended_are_not_published(tmp_path):
    out = tmp_path / "out"
    stale = Path(layout.commit_dir(str(out), JOB))
    stale.mkdir(parents=True)
    (stale / "part-00003-000.csv").write_text("stale\n")
    stage(out, 0, 0, {"p.csv": "fresh\n"})
    committer.commit_outputs(str(tmp_path), JOB, [sink("v", out, 0, 0)])
    assert tree(out) == {"part-00000-000.csv": "fresh\n"}


def test_a_finished_attempt_whose_output_is_missing_fails_the_commit_and_publishes_nothing(tmp_path):
    """The JobManager cannot see what a TaskManager wrote (a data directory that is not shared):
    publishing the other subtasks' files alone would lose data without a word."""
    out, other = tmp_path / "out", tmp_path / "other"
    stage(out, 0, 0, {"part-a.csv": "s0\n"})  # subtask 1's staging directory is missing
    stage(other, 0, 0, {"part-b.csv": "b\n"})
    with pytest.raises(FileNotFoundError, match=r"subtask 1 attempt #0 finished, but its output .* is not there.*shared"):
        committer.commit_outputs(str(tmp_path), JOB, [sink("v", out, 0, 0), sink("v", out, 1, 0),
                                                      sink("w", other, 0, 0)])
    assert not out.exists() and not other.exists()


def test_collected_rows_that_are_gone_are_an_error_not_an_empty_result(tmp_path):
    data = tmp_path / "data"
    with pytest.raises(FileNotFoundError, match="no longer in the data directory"):
        committer.read_collected(str(data), JOB, "sink-collect")


@pytest.mark.parametrize("job_id", ["..", "../..", "", "a/b"])
def test_clean_up_refuses_ids_that_would_reach_outside_the_job(tmp_path, job_id):
    data = tmp_path / "data"
    (data / "jobs" / "earlier").mkdir(parents=True)
    (data / "jobs" / "earlier" / "rows.parquet").write_text("keep")
    (tmp_path / "canary").write_text("keep")
    with pytest.raises(ValueError):
        committer.cleanup_job(str(data), job_id, [], keep_collected=False)
    with pytest.raises(ValueError):
        committer.remove_job_data(str(data), job_id)
    assert (data / "jobs" / "earlier" / "rows.parquet").read_text() == "keep"
    assert (tmp_path / "canary").read_text() == "keep"


def test_an_evicted_job_takes_its_collected_rows_and_nothing_else(tmp_path):
    data = tmp_path / "data"
    for job in ("gone", "kept"):
        collected = Path(layout.collect_dir(str(data), job, "sink"))
        collected.mkdir(parents=True)
        (collected / "part-0.parquet").write_text(job)
    committer.remove_job_data(str(data), "gone")
    assert sorted(p.name for p in (data / "jobs").iterdir()) == ["kept"]


def test_a_job_recovered_after_its_commit_replaces_its_own_output_and_never_anothers(tmp_path):
    out = tmp_path / "out"
    stage(out, 0, 0, {"part-a.csv": "first run\n"})
    committer.commit_outputs(str(tmp_path), JOB, [sink("v", out, 0, 0)])
    marker = Path(layout.staging_root(str(out), JOB)) / committer.COMMIT_MARKER
    assert marker.read_text() == JOB and sorted(p.name for p in out.iterdir()) == ["part-00000-000.csv"]
    # A new leader recovered the job (its end was not recorded) and it ran again: attempts
    # start higher, the target is the job's own, so mode 'error' does not refuse it.
    stage(out, 0, 1000, {"part-b.csv": "second run\n"})
    committer.commit_outputs(str(tmp_path), JOB, [sink("v", out, 0, 1000)])
    assert tree(out) == {"part-00000-000.csv": "second run\n"}
    # Another job's commit into the same target is refused as before.
    staged = Path(layout.sink_staging_dir(str(out), "job-other", 0, 0))
    staged.mkdir(parents=True)
    (staged / "p.csv").write_text("other\n")
    with pytest.raises(FileExistsError, match="already exists"):
        committer.commit_outputs(str(tmp_path), "job-other", [sink("v", out, 0, 0)])
    assert tree(out) == {"part-00000-000.csv": "second run\n"}
    # The job's clean-up removes the marker with the staging root.
    committer.cleanup_job(str(tmp_path / "data"), JOB, [str(out)], keep_collected=True)
    assert not marker.exists()


def _ended_job(data: Path, out: Path) -> list[Path]:
    """What a FINISHED file-sink job leaves until its clean-up: partitions written the way Spark
    writes them (data files, checksums, _SUCCESS), a cancel marker, and the sink's staging root
    with its commit marker. Returns the partition directories (what its TaskManagers release)."""
    stage(out, 0, 0, {"part-a.csv": "a\n"})
    committer.commit_outputs(str(data.parent), JOB, [sink("v", out, 0, 0)])
    released = []
    for data_set in range(6):
        for index in range(4):
            partition = Path(layout.partition_dir(str(data), JOB, f"ds{data_set}", index, 0))
            partition.mkdir(parents=True)
            for name in ("part-0.parquet", ".part-0.parquet.crc", "_SUCCESS", "._SUCCESS.crc"):
                (partition / name).write_text("x")
            released.append(partition)
    Path(layout.cancelled_dir(str(data), JOB)).mkdir(parents=True)
    return released


def test_clean_up_racing_the_taskmanagers_release_of_the_same_partitions_removes_everything(tmp_path):
    """The JobManager removes the job's directory while its TaskManagers delete the partitions
    inside it: an entry the other side removed first is not an error, and nothing stays (the
    sink's staging and commit marker beside the target included). 20 races; before clean-ups
    tolerated vanishing entries, about one in three failed and left the staging behind."""
    from funke.taskmanager.taskexecutor import delete_partition_dirs

    for trial in range(20):
        data, out = tmp_path / str(trial) / "data", tmp_path / str(trial) / "out"
        released = _ended_job(data, out)
        taskmanager = threading.Thread(target=delete_partition_dirs, args=([str(p) for p in released],))
        taskmanager.start()
        try:
            committer.cleanup_job(str(data), JOB, [str(out)], keep_collected=True)
        finally:
            taskmanager.join()
        left = sorted(str(p.relative_to(out.parent)) for p in out.parent.rglob("*") if p != data / "jobs")
        assert left == ["data", "out", "out/part-00000-000.csv"], f"race {trial}"


def test_a_failing_clean_up_step_does_not_skip_the_others_and_running_it_again_finishes(tmp_path, monkeypatch):
    data, out = tmp_path / "data", tmp_path / "out"
    _ended_job(data, out)
    remove = committer._remove_under
    failures = []

    def partitions_fail_once(root: str, path: str) -> None:
        if path.endswith("/partitions") and not failures:
            failures.append(path)
            raise OSError(5, "Input/output error", path)
        remove(root, path)

    monkeypatch.setattr(committer, "_remove_under", partitions_fail_once)
    with pytest.raises(committer.CleanupIncomplete, match=r"1 step\(s\).*partitions.*Input/output error"):
        committer.cleanup_job(str(data), JOB, [str(out)], keep_collected=True)
    assert failures
    # every other step ran: the staging beside the target (and its commit marker) and the cancel markers
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "out"]
    assert sorted(p.name for p in (data / "jobs" / JOB).iterdir()) == ["partitions"]
    committer.cleanup_job(str(data), JOB, [str(out)], keep_collected=True)  # what the retry does
    assert not (data / "jobs" / JOB).exists()
    committer.cleanup_job(str(data), JOB, [str(out)], keep_collected=True)  # and again: nothing left, no error


def test_clean_up_keeps_a_finished_jobs_collected_rows_and_nothing_else_of_it(tmp_path):
    data, out = tmp_path / "data", tmp_path / "out"
    _ended_job(data, out)
    collected = Path(layout.collect_dir(str(data), JOB, "sink"))
    collected.mkdir(parents=True)
    (collected / "part-0.parquet").write_text("rows")
    committer.cleanup_job(str(data), JOB, [str(out)], keep_collected=True)
    assert [str(p.relative_to(data)) for p in sorted((data / "jobs").rglob("*"))] == [
        f"jobs/{JOB}", f"jobs/{JOB}/collect", f"jobs/{JOB}/collect/sink", f"jobs/{JOB}/collect/sink/part-0.parquet"]
