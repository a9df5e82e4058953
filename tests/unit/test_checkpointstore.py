"""A checkpoint directory on disk (jobmanager/checkpointstore.py): a stable query id across runs,
one run at a time (a second process is refused), a lease a paused run cannot keep (a newer
leader, or expiry, takes it over, and the old run's writes are refused), write-once atomic entries, leftover temporary
files ignored, a gap named, and purging that keeps recovery's answer."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from funke.common.streaming.checkpoint import CheckpointError, CommitEntry, OffsetEntry, SourceRange, written_under
from funke.jobmanager.checkpointstore import CheckpointFenced, CheckpointInUse, CheckpointStore


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


# ---------------------------------------------------------------------------- the lease

SCOPE = "filesystem:/ha/default"

_PAUSABLE = textwrap.dedent("""
    import json, sys
    from funke.common.streaming.checkpoint import OffsetEntry, SourceRange
    from funke.jobmanager.checkpointstore import CheckpointStore
    store = CheckpointStore(sys.argv[1])
    store.open("job q on JobManager a (pid holder)", leader_epoch=1, scope=sys.argv[2])
    print("held", flush=True)
    for line in sys.stdin:  # woken up: it goes on writing where it was
        try:
            store.write_offsets(OffsetEntry(0, 5, {"rate": SourceRange(None, 99, 99)}))
            print("wrote", flush=True)
        except Exception as exc:
            print(type(exc).__name__ + ": " + str(exc), flush=True)
""")


def test_a_paused_holder_is_taken_over_by_a_newer_leader_and_its_writes_when_it_wakes_are_refused(tmp_path):
    """SIGSTOP of the process that holds the checkpoint: the run of the next leader takes it at
    once (a lock would keep it until the paused process died); woken, the old run writes nothing."""
    import signal

    path = str(tmp_path / "cp")
    holder = subprocess.Popen([sys.executable, "-c", _PAUSABLE, path, SCOPE], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        holder.send_signal(signal.SIGSTOP)
        with pytest.raises(CheckpointInUse, match="in use by job q on JobManager a"):  # no HA: it waits for expiry
            CheckpointStore(path).open("a run without HA")
        store = CheckpointStore(path)
        resumption = store.open("job q on JobManager b", leader_epoch=2, scope=SCOPE)
        assert resumption.plan.next_batch_id == 0 and store.epoch == 2
        store.write_offsets(entry(0, None, 10))
        holder.send_signal(signal.SIGCONT)
        holder.stdin.write("go\n")
        holder.stdin.flush()
        answer = holder.stdout.readline().strip()
        assert answer.startswith("CheckpointFenced: ") and "lease epoch 1) may not write to it any more: it was " \
            "taken over by job q on JobManager b (lease epoch 2)" in answer, answer
        assert store.read_offsets(0) == entry(0, None, 10)
        store.write_commit(CommitEntry(0, 7))
        store.close()
    finally:
        holder.kill()
        holder.wait(10)
        holder.stdin.close()
        holder.stdout.close()
    data = (tmp_path / "cp" / "offsets" / "0").read_bytes()
    assert written_under(data) == 2 and written_under((tmp_path / "cp" / "commits" / "0").read_bytes()) == 2


def test_every_write_of_a_run_taken_over_is_refused_and_its_close_leaves_the_new_lease(tmp_path):
    old = CheckpointStore(str(tmp_path / "cp"))
    old.open("old run", leader_epoch=1, scope=SCOPE)
    old.write_offsets(entry(0, None, 10))
    new = CheckpointStore(str(tmp_path / "cp"))
    assert new.open("new run", leader_epoch=2, scope=SCOPE).plan.rerun == (0,)
    for write in (lambda: old.write_offsets(entry(1, 10, 20)), lambda: old.write_commit(CommitEntry(0, 1)),
                  lambda: old.add_seen_files("files", ["a.csv"]), lambda: old.purge(1), old.renew, old.check):
        with pytest.raises(CheckpointFenced, match="taken over by new run"):
            write()
    old.close()  # idempotent, and it does not release what is not its own
    assert not new.lease().released and new.lease().epoch == 2
    new.write_commit(CommitEntry(0, 1))
    new.renew()
    assert sorted(os.listdir(tmp_path / "cp" / "commits")) == ["0"] and not (tmp_path / "cp" / "offsets" / "1").exists()
    new.close()
    assert new.lease().released
    third = CheckpointStore(str(tmp_path / "cp"))  # a released lease is taken at once, by anyone
    assert third.open("third run").plan.next_batch_id == 1 and third.epoch == 3
    third.close()


def test_without_high_availability_a_lease_not_renewed_is_taken_once_it_expired(tmp_path):
    now = [1000.0]
    first = CheckpointStore(str(tmp_path / "cp"), lease_s=10, clock=lambda: now[0])
    first.open("first run")
    now[0] += 6
    first.renew()  # renewed: 10 s more from now
    now[0] += 9
    with pytest.raises(CheckpointInUse, match=r"in use by first run \(its lease \(epoch 1\) runs 1.0 s more"):
        CheckpointStore(str(tmp_path / "cp"), lease_s=10, clock=lambda: now[0]).open("second run")
    now[0] += 1.5  # the first run was paused: nothing renewed its lease
    second = CheckpointStore(str(tmp_path / "cp"), lease_s=10, clock=lambda: now[0])
    second.open("second run")
    with pytest.raises(CheckpointFenced, match="taken over by second run"):
        first.write_offsets(entry(0, None, 5))
    second.write_offsets(entry(0, None, 5))
    second.close()


def test_a_holder_whose_renewal_was_late_but_not_taken_over_renews_and_writes(tmp_path):
    now = [1000.0]
    store = CheckpointStore(str(tmp_path / "cp"), lease_s=10, clock=lambda: now[0])
    store.open("run")
    now[0] += 60  # starved, or paused: nobody took the checkpoint meanwhile
    store.write_offsets(entry(0, None, 5))
    assert store.lease().renewed_at == now[0] and store.lease().epoch == 1
    store.close()


def test_a_stale_write_in_the_window_never_replaces_an_entry_of_the_run_that_took_over(tmp_path):
    """A run paused between its check of the lease and its write lands the write late: an entry
    is created with link(), so what its successor wrote stays as it is."""
    old = CheckpointStore(str(tmp_path / "cp"))
    old.open("old run", leader_epoch=1, scope=SCOPE)
    new = CheckpointStore(str(tmp_path / "cp"))
    new.open("new run", leader_epoch=2, scope=SCOPE)
    new.write_offsets(entry(0, None, 10))
    old.check = lambda: None  # the check passed before the pause
    with pytest.raises(CheckpointError, match="written once"):
        old.write_offsets(entry(0, None, 12))
    assert new.read_offsets(0) == entry(0, None, 10)
    assert written_under((tmp_path / "cp" / "offsets" / "0").read_bytes()) == 2
    new.close()


def test_an_unreadable_lease_spends_its_epoch(tmp_path):
    store = CheckpointStore(str(tmp_path / "cp"))
    store.open("first")
    store.close()
    lease = (tmp_path / "cp" / "lease" / "1").read_bytes()
    (tmp_path / "cp" / "lease" / "2").write_bytes(lease.replace(b'"epoch": 1', b'"epoch": 2').replace(
        b'"released": true', b'"released": false').replace(b'"renewed_at": ', b'"renewed_at": 1e10 + '))
    # the file of epoch 2 is not valid JSON (a stranger's): no lease, yet its epoch is spent
    other = CheckpointStore(str(tmp_path / "cp"))
    other.open("second")
    assert other.epoch == 3
    other.close()
