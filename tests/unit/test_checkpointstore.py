"""A checkpoint directory on disk (jobmanager/checkpointstore.py): a stable query id across runs,
one run at a time (a second process is refused), write-once atomic entries, leftover temporary
files ignored, a gap named, and purging that keeps recovery's answer."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from funke.common.streaming.checkpoint import CheckpointError, CommitEntry, OffsetEntry, SourceRange
from funke.jobmanager.checkpointstore import CheckpointInUse, CheckpointStore


def entry(batch_id: int, start, end) -> OffsetEntry:
    return OffsetEntry(batch_id, 1000 * batch_id, {"rate": SourceRange(start, end, (end or 0) - (start or 0))})


def test_a_new_checkpoint_gets_a_query_id_that_the_next_run_keeps(tmp_path):
    store = CheckpointStore(str(tmp_path / "cp"))
    first = store.open("run-1 of job wc")
    assert first.plan.next_batch_id == 0 and first.logged == () and first.last_ends == {}
    store.write_offsets(entry(0, None, 10))
    store.write_commit(CommitEntry(0, 5))
    store.write_offsets(entry(1, 10, 25))
    store.close()
    again = CheckpointStore(str(tmp_path / "cp"))
    second = again.open("run-2 of job wc")
    assert second.query_id == first.query_id
    assert second.plan.rerun == (1,) and second.logged == (entry(1, 10, 25),) and second.last_ends == {"rate": 25}
    assert second.plan.next_batch_id == 2
    again.close()


def test_entries_are_written_once_and_a_commit_needs_its_offsets(tmp_path):
    store = CheckpointStore(str(tmp_path / "cp"))
    store.open("run")
    store.write_offsets(entry(0, None, 10))
    store.write_offsets(entry(0, None, 10))  # the same again: fine
    with pytest.raises(CheckpointError, match="written once"):
        store.write_offsets(entry(0, None, 11))
    with pytest.raises(CheckpointError, match="no offset log entry"):
        store.write_commit(CommitEntry(1, 0))
    store.close()
    with pytest.raises(CheckpointError, match="not held"):
        store.write_offsets(entry(1, 10, 20))


def test_leftover_temporary_files_are_ignored_and_a_gap_is_named(tmp_path):
    store = CheckpointStore(str(tmp_path / "cp"))
    store.open("run")
    for b, (s, e) in enumerate([(None, 5), (5, 9), (9, 12)]):
        store.write_offsets(entry(b, s, e))
    store.close()
    (tmp_path / "cp" / "offsets" / ".3.999.tmp").write_text("half")  # a writer killed mid-write
    (tmp_path / "cp" / "offsets" / "notes.txt").write_text("a stranger")
    reader = CheckpointStore(str(tmp_path / "cp"))
    assert reader.open("run").plan.rerun == (0, 1, 2)
    reader.close()
    os.unlink(tmp_path / "cp" / "offsets" / "1")
    with pytest.raises(CheckpointError, match="no entry for batch 1 .*offsets/1"):
        CheckpointStore(str(tmp_path / "cp")).open("run")


def test_a_damaged_entry_names_its_file(tmp_path):
    store = CheckpointStore(str(tmp_path / "cp"))
    store.open("run")
    store.write_offsets(entry(0, None, 5))
    store.close()
    (tmp_path / "cp" / "offsets" / "0").write_bytes(b"v1\n{not json")
    with pytest.raises(CheckpointError, match=r"offsets/0: not readable JSON"):
        CheckpointStore(str(tmp_path / "cp")).open("run")


_HOLD = textwrap.dedent("""
    import sys, time
    from funke.jobmanager.checkpointstore import CheckpointStore
    CheckpointStore(sys.argv[1]).open("run 7 of job 'clicks' (pid holder)")
    print("held", flush=True)
    time.sleep(60)
""")


def test_a_second_run_on_a_checkpoint_in_use_is_refused_and_may_go_once_the_first_is_gone(tmp_path):
    path = str(tmp_path / "cp")
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, path], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(CheckpointInUse, match="in use by run 7 of job 'clicks'"):
            CheckpointStore(path).open("run 8")
    finally:
        holder.kill()
        holder.wait(10)
        holder.stdout.close()
    store = CheckpointStore(path)
    assert store.open("run 8").plan.next_batch_id == 0  # a killed run's lock went with it
    store.close()


def test_purging_keeps_the_last_committed_batches_and_what_recovery_needs(tmp_path):
    store = CheckpointStore(str(tmp_path / "cp"))
    store.open("run")
    end = None
    for b in range(12):
        store.write_offsets(entry(b, end, (end or 0) + 3))
        end = (end or 0) + 3
        if b < 10:
            store.write_commit(CommitEntry(b, b))
    assert store.purge(retain=3) == 14  # offsets 0-6 and commits 0-6
    assert store.offset_ids() == list(range(7, 12)) and store.commit_ids() == [7, 8, 9]
    store.close()
    again = CheckpointStore(str(tmp_path / "cp")).open("run")
    assert again.plan.rerun == (10, 11) and again.plan.next_batch_id == 12 and again.last_ends == {"rate": 36}


def test_a_file_where_the_checkpoint_or_its_logs_go_is_named_as_not_a_directory(tmp_path):
    (tmp_path / "file").write_text("not a checkpoint")
    with pytest.raises(CheckpointError, match=r"checkpoint location .*/file: .*/file is not a directory"):
        CheckpointStore(str(tmp_path / "file")).open("run-1")
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "offsets").write_text("not a log")
    with pytest.raises(CheckpointError, match=r"/ck/offsets is not a directory"):
        CheckpointStore(str(tmp_path / "ck")).open("run-1")
