"""Keyed state of a streaming query: key groups, output modes, and the versioned state store's
files (which to read for a version, which a new version makes obsolete).

Key groups (Flink's): a keyed operator's state is split into `max_parallelism` key groups; a
key's group is `pmod(hash(keys), max_parallelism)` with Spark's `hash` (Murmur3, the same on
every host), and subtask i of n owns the contiguous range of groups whose `group * n //
max_parallelism` is i. The exchange into a keyed operator routes rows the same way, so a
subtask receives exactly the keys of its groups, and a query restored at another parallelism
finds each group's state whole. The max parallelism is fixed once a query has state.

The store (one directory per key group under `<checkpoint>/state/<vertex>/<operator>/`): batch b
reads version b (the state after batches 0..b-1) and writes version b+1 as a *delta* file (the
keys it changed), every group the subtask owns, even unchanged ones, so that a batch run again
after a failure rewrites every file its first attempt may have left. Every `SNAPSHOT_EVERY`
versions a *snapshot* (the group's whole state) is written too, so loading a version reads one
snapshot and at most SNAPSHOT_EVERY - 1 deltas; versions older than the query's
min-batches-to-retain are deleted once a newer snapshot covers them. Nothing reads version b+1
before batch b is committed, so what a failed batch wrote is never seen.

Pure: names and numbers in, names and numbers out. This module is also pickled by value into
Spark's Python workers (`funke.taskmanager.operators.keyedstate`), so it imports nothing of funke.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["DELTA", "KEY_GROUP_COLUMN", "MAX_STATES", "MAX_TTL_MS", "METADATA", "OUTPUT_MODES", "REMOVED_COLUMN",
           "SNAPSHOT", "SNAPSHOT_EVERY", "STATE_KINDS", "TIMERS_COLUMN", "EVENT_TIMERS_COLUMN", "MissingState", "LoadPlan", "StateMetrics",
           "expires_column", "files_to_delete", "group_dir_name", "key_group_range", "key_groups_problem", "load_plan",
           "metadata_text", "operator_dir", "parse_file_name", "state_file_name", "state_specs_problem",
           "subtask_of_key_group"]

# Structured Streaming's output modes. `append` (each result row emitted once, final) needs to
# know when a key's result can no longer change: event time and watermarks, not yet here.
OUTPUT_MODES = ("update", "complete")
KEY_GROUP_COLUMN = "__funke_key_group"
SNAPSHOT_EVERY = 10  # Spark's spark.sql.streaming.stateStore.minDeltasForSnapshot
DELTA = "delta"
SNAPSHOT = "snapshot"
_FILE = re.compile(r"^(\d{1,18})\.(delta|snapshot)$")
# A delta file whose last column is this one marks the keys a version removed (True): a
# keyed process function's key whose states were all cleared, or expired, and has no timer.
REMOVED_COLUMN = "__funke_removed"
# A keyed process function's state row: the key, its states, when each state with a TTL
# expires (epoch ms), its processing-time timers (epoch ms, ascending), its event-time timers
# (the same; a state written before event-time timers existed has no such column), REMOVED_COLUMN.
TIMERS_COLUMN = "__funke_timers"
EVENT_TIMERS_COLUMN = "__funke_event_timers"

# A keyed process function's state handles (the operator's config "state": a list of
# {"name", "kind", "type", "key_type" (map state), "ttl_ms" (optional)}).
STATE_KINDS = ("value", "list", "map")
MAX_STATES = 32
MAX_TTL_MS = 10 * 365 * 86_400_000  # ten years
_STATE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_MAX_TYPE_LENGTH = 1000


def expires_column(state: str) -> str:
    return f"__funke_expires_{state}"


def state_specs_problem(value: object) -> str | None:
    """Why `value` is not a keyed process function's list of state handles (None: it is).
    Names are identifiers, unique; types are Spark DDL type texts (Spark parses them when the
    task starts); a TTL is whole milliseconds from 1 to MAX_TTL_MS."""
    if not isinstance(value, list):
        return f"must be a list of state handles, got {type(value).__name__}"
    if len(value) > MAX_STATES:
        return f"has {len(value)} state handles; at most {MAX_STATES}"
    seen: set[str] = set()
    for i, spec in enumerate(value):
        if not isinstance(spec, dict):
            return f"item {i} must be an object, got {type(spec).__name__}"
        name = spec.get("name")
        if not isinstance(name, str) or not _STATE_NAME.match(name):
            return f"item {i}: name must be an identifier of at most 64 characters, got {str(name)[:80]!r}"
        if name in seen:
            return f"item {i}: a state named {name!r} is declared twice"
        seen.add(name)
        kind = spec.get("kind")
        if kind not in STATE_KINDS:
            return f"state {name!r}: kind must be one of {', '.join(STATE_KINDS)}, got {str(kind)[:80]!r}"
        allowed = {"name", "kind", "type", "ttl_ms"} | ({"key_type"} if kind == "map" else set())
        extra = sorted(str(k)[:80] for k in spec if k not in allowed)
        if extra:
            return f"state {name!r}: unknown field(s) {extra} (a {kind} state takes {sorted(allowed)})"
        for field_ in ("type", "key_type") if kind == "map" else ("type",):
            text = spec.get(field_)
            if not isinstance(text, str) or not text.strip() or len(text) > _MAX_TYPE_LENGTH or "\x00" in text:
                return (f"state {name!r}: {field_} must be a Spark type such as 'bigint' (at most "
                        f"{_MAX_TYPE_LENGTH} characters), got {str(text)[:80]!r}")
        ttl = spec.get("ttl_ms")
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int) or not 1 <= ttl <= MAX_TTL_MS):
            return f"state {name!r}: ttl_ms must be whole milliseconds from 1 to {MAX_TTL_MS} (ten years), got {ttl!r}"
    return None


def key_group_range(max_parallelism: int, parallelism: int, subtask: int) -> range:
    """The key groups subtask `subtask` of `parallelism` owns (Flink's range assignment)."""
    if not 1 <= parallelism <= max_parallelism or not 0 <= subtask < parallelism:
        raise ValueError(f"subtask {subtask} of {parallelism} with {max_parallelism} key groups")
    return range(-(-subtask * max_parallelism // parallelism), -(-(subtask + 1) * max_parallelism // parallelism))


def subtask_of_key_group(key_group: int, max_parallelism: int, parallelism: int) -> int:
    """The subtask that owns `key_group` (the inverse of key_group_range)."""
    return key_group * parallelism // max_parallelism


# In an operator's state directory: how many key groups its state was written in (JSON).
METADATA = "_metadata.json"


def operator_dir(checkpoint: str, vertex_id: str) -> str:
    """Where the state of the keyed operator heading `vertex_id` lives (one per vertex for now:
    a keyed operator heads its chain)."""
    return f"{checkpoint.rstrip('/')}/state/{vertex_id}/op-0"


def metadata_text(key_groups: int) -> str:
    return '{"key_groups": %d}\n' % key_groups


def key_groups_problem(recorded: str, vertex_id: str, key_groups: int) -> str | None:
    """Why an operator with `key_groups` cannot use state recorded (METADATA's text) with
    another number (None: it can)."""
    import json

    try:
        was = int(json.loads(recorded)["key_groups"])
    except (ValueError, KeyError, TypeError):
        return f"vertex {vertex_id!r}: its state's {METADATA} cannot be read: {recorded[:200]!r}"
    if was == key_groups:
        return None
    return (f"vertex {vertex_id!r}: the checkpoint holds its keyed state in {was} key groups (its max parallelism "
            f"when the state was first written), and the job says {key_groups}: every key would look for its "
            f"state in another group. Keep the max parallelism at {was} (set_max_parallelism({was})), or start "
            f"the query on a new checkpoint location")


def group_dir_name(key_group: int) -> str:
    return f"kg-{key_group:05d}"


def state_file_name(version: int, kind: str) -> str:
    return f"{version}.{kind}"


def parse_file_name(name: str) -> tuple[int, str] | None:
    """(version, DELTA or SNAPSHOT) of a store file's name; None for anything else (a
    temporary file of a write in progress, say)."""
    m = _FILE.match(name)
    return (int(m.group(1)), m.group(2)) if m else None


@dataclass(frozen=True, slots=True)
class StateMetrics:
    """What a keyed operator's state looked like after one batch, over the key groups measured
    (Structured Streaming's StateOperatorProgress): keys held, keys the batch wrote, keys it
    removed, bytes of the files the batch wrote, bytes of the state's files on disk, the time
    the workers spent loading, merging and writing the state (not counting the rows' own
    computation), an estimate of the state's size in the workers' memory, and the time of
    making the version's delta."""
    rows_total: int = 0
    rows_updated: int = 0
    rows_removed: int = 0
    bytes_written: int = 0
    bytes_on_disk: int = 0
    update_ms: float = 0.0
    memory_bytes: int = 0  # an estimate of what the workers hold of the state in memory
    commit_ms: float = 0.0  # making the version's delta (its Arrow data; the file write after it not counted)

    def __add__(self, other: StateMetrics) -> StateMetrics:
        return StateMetrics(self.rows_total + other.rows_total, self.rows_updated + other.rows_updated,
                            self.rows_removed + other.rows_removed, self.bytes_written + other.bytes_written,
                            self.bytes_on_disk + other.bytes_on_disk, self.update_ms + other.update_ms,
                            self.memory_bytes + other.memory_bytes, self.commit_ms + other.commit_ms)

    def progress(self, operator: str, key_groups: int) -> dict:
        """Its entry in a progress record's `stateOperators` (Structured Streaming's keys, and
        funke's for the files)."""
        return {"operatorName": operator, "numRowsTotal": self.rows_total, "numRowsUpdated": self.rows_updated,
                "numRowsRemoved": self.rows_removed, "allUpdatesTimeMs": round(self.update_ms),
                "commitTimeMs": round(self.commit_ms), "memoryUsedBytes": self.memory_bytes,
                "numKeyGroups": key_groups, "checkpointBytesWritten": self.bytes_written,
                "stateOnDiskBytes": self.bytes_on_disk}


class MissingState(Exception):
    """A version cannot be loaded from the files there are (a file was deleted by hand, or
    retention removed what an old checkpoint needs)."""


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """How to build a version: start from `snapshot` (None: empty), apply `deltas` in order."""
    snapshot: int | None
    deltas: tuple[int, ...]


def load_plan(names: list[str], version: int) -> LoadPlan:
    """Which of a key group's files make `version`. A group with no files at all is empty (its
    operator had no state yet); otherwise every delta after the snapshot used must be there."""
    if version < 0:
        raise ValueError(f"state version {version} is negative")
    deltas: set[int] = set()
    snapshots: set[int] = set()
    for name in names:
        parsed = parse_file_name(name)
        if parsed is not None:
            (deltas if parsed[1] == DELTA else snapshots).add(parsed[0])
    if version == 0 or not (deltas or snapshots):
        return LoadPlan(None, ())
    base = max((s for s in snapshots if s <= version), default=None)
    if base is None:
        # No snapshot yet: the deltas from the first one the group has (a query whose operator
        # started later than its first batch begins there, empty).
        first = min(deltas)
        if first > version:
            raise MissingState(f"version {version} is older than the oldest state kept (version {first})")
        start = first
    else:
        start = base + 1
    needed = tuple(range(start, version + 1))
    missing = [v for v in needed if v not in deltas]
    if missing:
        raise MissingState(f"version {version} needs the changes of version(s) {_span(missing)}, which are gone")
    return LoadPlan(base, needed)


def files_to_delete(names: list[str], version: int, retain: int) -> list[str]:
    """The files no longer needed once `version` is written, keeping every version from
    `version - retain + 1` on loadable: everything older than the newest snapshot at or
    before that version."""
    oldest_kept = version - retain + 1
    snapshots = [p[0] for n in names if (p := parse_file_name(n)) is not None and p[1] == SNAPSHOT]
    floor = max((s for s in snapshots if s <= oldest_kept), default=None)
    if floor is None:
        return []
    return sorted(n for n in names if (p := parse_file_name(n)) is not None and p[0] < floor)


def _span(versions: list[int]) -> str:
    return str(versions[0]) if len(versions) == 1 else f"{versions[0]}..{versions[-1]}"
