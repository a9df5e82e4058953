"""A streaming job's checkpoint: what its offset log (the write-ahead log of each batch's source
ranges), commit log and metadata say, and where a restarted job goes on from.

Owns the format of the three kinds of entry and the recovery rule; the files themselves are
written and listed by the JobManager (`funke.jobmanager.checkpointstore`). Pure: bytes and batch
ids in, entries, plans and errors out.

    <checkpoint>/metadata           {"id": <query id>}: the query's identity across restarts
    <checkpoint>/offsets/<batch>    "v1" line, then JSON: the batch's time and, per source, the
                                    offset range it reads (start exclusive, end inclusive)
    <checkpoint>/commits/<batch>    "v1" line, then JSON: the batch committed to every sink; "v2"
                                    for an entry that also says whose files hold the keyed state
                                    after it (`funke.common.streaming.state.StateLineage`), which
                                    a funke that cannot read state fenced by run (0.3.0) refuses
                                    to go on from, rather than look for files by their old names

Both kinds of entry may say the epoch of the checkpoint's lease they were written under
(`leaseEpoch`, `funke.common.streaming.checkpointlease`): which run wrote them.

Recovery (Structured Streaming's rule, generalised to several batches in flight as Spark
Streaming's pending JobSets): every batch up to the last commit is done; every batch logged
after it runs again with exactly the logged ranges, in order; the next new batch follows the
last logged one. The logged batches must be contiguous from the first one retained: a gap is an
error that names the missing files, never a silent skip.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from funke.common.streaming.state import StateLineage

VERSION = "v1"
LINEAGE_VERSION = "v2"  # a commit entry with a state lineage
T = TypeVar("T")
MAX_ENTRY_BYTES = 16 * 1024 * 1024


class CheckpointError(ValueError):
    """The checkpoint cannot be used as it is; the message says which files and why."""


@dataclass(frozen=True, slots=True)
class SourceRange:
    """What one source contributes to a batch: offsets after `start`, up to `end` inclusive.
    Offsets are the source's own JSON values (a row count, a file index, per-partition
    positions); `rows` is how many input rows the range holds, if the source knows."""
    start: Any
    end: Any
    rows: int = 0


@dataclass(frozen=True, slots=True)
class OffsetEntry:
    batch_id: int
    batch_time_ms: int  # the trigger time the batch was generated for
    sources: dict[str, SourceRange] = field(default_factory=dict)
    # event time (`funke.common.streaming.eventtime`): the watermark the batch runs with (None:
    # none yet), and per watermark operator the largest event time seen before it
    watermark_ms: int | None = None
    event_time_max: dict[str, int] = field(default_factory=dict)
    # per partition of a per-partition watermark: the batch time it last carried a row in
    event_time_active: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CommitEntry:
    batch_id: int
    committed_at_ms: int
    # event time: per watermark operator the largest event time seen once the batch ran (a run
    # that starts after it goes on from these, not from the ones logged before the batch)
    event_time_max: dict[str, int] = field(default_factory=dict)
    # keyed state: which run's files hold the state the batch left, and since which batch each
    # keyed operator has state (None: the entry says nothing: a query without keyed state, or an
    # entry funke 0.3.0 wrote)
    state: StateLineage | None = None
    event_time_active: dict[str, int] = field(default_factory=dict)  # as OffsetEntry's


@dataclass(frozen=True, slots=True)
class RecoveryPlan:
    """Where a job restarted on its checkpoint goes on."""
    last_committed: int  # -1: no batch committed yet
    rerun: tuple[int, ...]  # logged, not committed: run again with the logged ranges, in order
    next_batch_id: int  # the first batch to plan anew


def _header_and_body(data: bytes, what: str, versions: tuple[str, ...] = (VERSION,)) -> dict:
    if len(data) > MAX_ENTRY_BYTES:
        raise CheckpointError(f"{what}: {len(data)} bytes, more than an entry may have ({MAX_ENTRY_BYTES})")
    text = data.decode("utf-8", errors="replace")
    header, _, body = text.partition("\n")
    if header.strip() not in versions:
        expected = " or ".join(repr(v) for v in versions)
        raise CheckpointError(f"{what}: starts with {header[:40]!r}, expected {expected} (written by a newer funke?)")
    try:
        value = json.loads(body)
    except ValueError as exc:
        raise CheckpointError(f"{what}: not readable JSON ({exc})") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{what}: expected a JSON object")
    return value


def offset_entry_bytes(entry: OffsetEntry, lease_epoch: int = 0) -> bytes:
    """`lease_epoch`: the epoch of the checkpoint's lease the entry is written under (0: not
    said); readers ignore it, it tells which run wrote the entry (`written_under`)."""
    body = {"batchId": entry.batch_id, "batchTimestampMs": entry.batch_time_ms,
            "sources": {name: {"start": r.start, "end": r.end, "rows": r.rows} for name, r in entry.sources.items()}}
    if entry.watermark_ms is not None:
        body["watermarkMs"] = entry.watermark_ms
    if entry.event_time_max:
        body["eventTimeMaxMs"] = dict(entry.event_time_max)
    if entry.event_time_active:
        body["eventTimeActiveMs"] = dict(entry.event_time_active)
    if lease_epoch:
        body["leaseEpoch"] = lease_epoch
    return f"{VERSION}\n{json.dumps(body, sort_keys=True)}".encode()


def _entry(data: bytes, batch_id: int, what: str, read: Callable[[dict], T],
           versions: tuple[str, ...] = (VERSION,)) -> T:
    """An entry of batch `batch_id` (its file name says so), read by `read`; an entry naming
    another batch, or missing a field, is an error naming `what`."""
    raw = _header_and_body(data, what, versions)
    try:
        if int(raw["batchId"]) != batch_id:
            raise CheckpointError(f"{what}: says batch {raw['batchId']}, its file name says {batch_id}")
        return read(raw)
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"{what}: missing or malformed field ({exc})") from None


def parse_offset_entry(data: bytes, batch_id: int, what: str = "offset log entry") -> OffsetEntry:
    def read(raw: dict) -> OffsetEntry:
        sources = {str(name): SourceRange(r["start"], r["end"], int(r.get("rows", 0)))
                   for name, r in dict(raw["sources"]).items()}
        watermark = raw.get("watermarkMs")
        maxes = {str(op): int(ms) for op, ms in dict(raw.get("eventTimeMaxMs") or {}).items()}
        return OffsetEntry(batch_id, int(raw["batchTimestampMs"]), sources,
                           None if watermark is None else int(watermark), maxes, _active(raw))

    return _entry(data, batch_id, what, read)


def commit_entry_bytes(entry: CommitEntry, lease_epoch: int = 0) -> bytes:
    body: dict = {'batchId': entry.batch_id, 'committedAtMs': entry.committed_at_ms}
    if entry.event_time_max:
        body["eventTimeMaxMs"] = dict(entry.event_time_max)
    if entry.event_time_active:
        body["eventTimeActiveMs"] = dict(entry.event_time_active)
    if lease_epoch:
        body["leaseEpoch"] = lease_epoch
    if entry.state is not None:
        body["stateLineage"] = entry.state.to_json()
        return f"{LINEAGE_VERSION}\n{json.dumps(body)}".encode()
    return f"{VERSION}\n{json.dumps(body)}".encode()


def parse_commit_entry(data: bytes, batch_id: int, what: str = "commit log entry") -> CommitEntry:
    def read(raw: dict) -> CommitEntry:
        maxes = {str(op): int(ms) for op, ms in dict(raw.get("eventTimeMaxMs") or {}).items()}
        lineage = raw.get("stateLineage")
        return CommitEntry(batch_id, int(raw["committedAtMs"]), maxes,
                           None if lineage is None else StateLineage.from_json(lineage), _active(raw))

    return _entry(data, batch_id, what, read, (VERSION, LINEAGE_VERSION))


def _active(raw: dict) -> dict[str, int]:
    return {str(key): int(ms) for key, ms in dict(raw.get("eventTimeActiveMs") or {}).items()}


def written_under(data: bytes, what: str = "entry") -> int:
    """The lease epoch an offset or commit entry says it was written under (0: not said)."""
    try:
        return int(_header_and_body(data, what, (VERSION, LINEAGE_VERSION)).get("leaseEpoch", 0))
    except (TypeError, ValueError):
        return 0


def metadata_bytes(query_id: str) -> bytes:
    return json.dumps({"id": query_id}).encode()


def parse_metadata(data: bytes, what: str = "metadata") -> str:
    try:
        raw = json.loads(data)
        query_id = raw["id"]
    except (ValueError, KeyError, TypeError):
        raise CheckpointError(f"{what}: not a checkpoint's metadata (expected {{\"id\": ...}})") from None
    if not isinstance(query_id, str) or not query_id:
        raise CheckpointError(f"{what}: the query id must be a non-empty string")
    return query_id


def _gaps(ids: list[int]) -> list[int]:
    present = set(ids)
    return [i for i in range(min(ids), max(ids) + 1) if i not in present] if ids else []


def plan_recovery(offset_ids: list[int], commit_ids: list[int]) -> RecoveryPlan:
    """Where to go on, given the batch ids of the offset and commit log files (old entries may
    have been purged: the logs start wherever retention left them)."""
    offsets, commits = sorted(set(offset_ids)), sorted(set(commit_ids))
    problems = []
    if (gaps := _gaps(offsets)):
        problems.append("the offset log has no entry for batch " + ", ".join(map(str, gaps[:10]))
                        + (" …" if len(gaps) > 10 else "") + f" (files offsets/{gaps[0]} …): its entries must be contiguous")
    if (gaps := _gaps(commits)):
        problems.append("the commit log has no entry for batch " + ", ".join(map(str, gaps[:10]))
                        + (" …" if len(gaps) > 10 else "") + f" (files commits/{gaps[0]} …)")
    if commits and (not offsets or commits[-1] > offsets[-1]):
        problems.append(f"commits/{commits[-1]} has no offset log entry: the commit log is ahead of the offset log")
    if problems:
        raise CheckpointError("; ".join(problems))
    last_committed = commits[-1] if commits else -1
    if offsets and last_committed < offsets[0] - 1:
        raise CheckpointError(f"the offset log starts at batch {offsets[0]} but the last commit is batch "
                              f"{last_committed}: the entries of batch {last_committed + 1} … {offsets[0] - 1} "
                              f"were purged before they were committed")
    rerun = tuple(b for b in offsets if b > last_committed)
    return RecoveryPlan(last_committed, rerun, (offsets[-1] + 1) if offsets else 0)


def to_purge(offset_ids: list[int], commit_ids: list[int], last_committed: int, retain: int) -> tuple[list[int], list[int]]:
    """The offset and commit entries to delete so that the last `retain` committed batches stay
    (Structured Streaming's minBatchesToRetain); never one after the last commit."""
    if retain < 1:
        raise ValueError(f"at least one batch must be retained, got {retain}")
    below = last_committed - retain + 1
    return [b for b in offset_ids if b < below], [b for b in commit_ids if b < below]
