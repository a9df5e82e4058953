"""Keyed state of a streaming query: key groups, output modes, and the versioned state store's
files (which to read for a version, which a new version makes obsolete).

Key groups (`funke.common.streaming.keygroups`): a keyed operator's state is split into
`max_parallelism` key groups, each a directory of its own, and each subtask owns a contiguous range
of them. The max parallelism is fixed once a query has state (METADATA records it).

The store (one directory per key group under `<checkpoint>/state/<vertex>/<operator>/`): batch b
reads version b (the state after batches 0..b-1) and writes version b+1 as a *delta* file (the
keys it changed), every group the subtask owns, even unchanged ones. Every `SNAPSHOT_EVERY`
versions a *snapshot* (the group's whole state) is written too, so loading a version reads one
snapshot and at most SNAPSHOT_EVERY - 1 deltas; versions older than the query's
min-batches-to-retain are deleted once a newer snapshot covers them.

Fenced by run (as a sink's staging is by attempt): a file's name carries the token of the query
run that wrote it (`<version>.<token>.delta`), each run of a query (one set of attempts: any
failure restarts every task in a new run) has its own, and the commit log says which run
committed each batch (`StateLineage`, in every commit entry and sent with every batch). A version
is read only from the files of the run that committed the batch that wrote it, so what a failed
or deposed attempt wrote, before or after the batch ran again elsewhere, is never read. The
lineage also names, per keyed operator, the first batch that wrote its state: a version a
committed batch wrote must be found (MissingState otherwise, never an empty state), and one
before it is empty. Files named without a token (`<version>.delta`) are funke 0.3.0's, read as it
read them.

Pure: names and numbers in, names and numbers out. This module is also pickled by value into
Spark's Python workers (`funke.taskmanager.operators.keyedstate`), so it imports nothing of funke.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["DELTA", "KEY_GROUP_COLUMN", "LEGACY", "LEGACY_TOKEN", "MAX_STATES", "MAX_TTL_MS", "METADATA",
           "OPERATOR_DESCRIPTION", "OUTPUT_MODES", "REMOVED_COLUMN", "SNAPSHOT", "SNAPSHOT_EVERY", "STATE_KINDS",
           "TIMERS_COLUMN", "EVENT_TIMERS_COLUMN", "MissingState", "LoadPlan", "OperatorLineage", "StateLineage",
           "StateMetrics", "expires_column", "files_to_delete", "group_dir_name",
           "key_groups_problem", "legacy_lineage", "load_plan", "metadata_text", "operator_dir", "parse_file_name",
           "run_token", "state_file_name", "state_key_width", "state_specs_problem"]

# Structured Streaming's output modes. `append` (each result row emitted once, final) needs to
# know when a key's result can no longer change: event time and watermarks, not yet here.
OUTPUT_MODES = ("update", "complete")
KEY_GROUP_COLUMN = "__funke_key_group"
SNAPSHOT_EVERY = 10  # Spark's spark.sql.streaming.stateStore.minDeltasForSnapshot
DELTA = "delta"
SNAPSHOT = "snapshot"
# "<version>.<token>.<kind>": the token of the run that wrote it; "<version>.<kind>": funke 0.3.0's
_FILE = re.compile(r"^(\d{1,18})(?:\.([0-9a-f]{16}))?\.(delta|snapshot)$")
_TEMPORARY = re.compile(r"^(\d{1,18})\..*\.tmp$")  # a write in progress, or of a writer killed mid-write
_TOKEN = re.compile(r"^[0-9a-f]{16}$")
LEGACY_TOKEN = ""  # the files of a version written before files were fenced by run (funke 0.3.0)
_VERTEX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
# A delta file whose last column is this one marks the keys a version removed (True): a
# keyed process function's key whose states were all cleared, or expired, and has no timer.
REMOVED_COLUMN = "__funke_removed"
# A keyed process function's state row (`processlayout.ProcessLayout` declares it): the key, its
# states, when each state with a TTL expires (epoch ms), its processing-time timers (epoch ms,
# ascending), its event-time timers (the same; a state written before event-time timers existed
# has no such column), REMOVED_COLUMN.
TIMERS_COLUMN = "__funke_timers"
EVENT_TIMERS_COLUMN = "__funke_event_timers"

# A keyed process function's state handles (the operator's config "state": a list of
# {"name", "kind", "type", "key_type" (map state), "ttl_ms" (optional)}).
STATE_KINDS = ("value", "list", "map")
MAX_STATES = 32
MAX_TTL_MS = 10 * 365 * 86_400_000  # ten years
_STATE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_MAX_TYPE_LENGTH = 1000


# The columns a keyed operator's state key has after the user's keys: a window's start, a
# session's start, an interval join's side and row id (the others: none).
_KEY_PARTS = {"window_aggregate": 1, "session_aggregate": 1, "interval_join": 2}


def state_key_width(kind: str, n_keys: int) -> int:
    """How many leading columns of a keyed operator's state make a state key."""
    return n_keys + _KEY_PARTS.get(kind, 0)


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


# In an operator's state directory: how many key groups its state was written in (JSON).
METADATA = "_metadata.json"
# And what the operator is (its kind, keys and configuration, JSON), written by the JobManager when
# a run starts, so that the state can be read from the checkpoint alone (`funke state --checkpoint`).
OPERATOR_DESCRIPTION = "_operator.json"


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


def state_file_name(version: int, kind: str, token: str = LEGACY_TOKEN) -> str:
    """A state file's name: `<version>.<token>.<kind>`, or `<version>.<kind>` for token ""."""
    return f"{version}.{token}.{kind}" if token else f"{version}.{kind}"


def parse_file_name(name: str) -> tuple[int, str, str] | None:
    """(version, DELTA or SNAPSHOT, token) of a store file's name (token "": funke 0.3.0's); None
    for anything else (a temporary file of a write in progress, say)."""
    m = _FILE.match(name)
    return (int(m.group(1)), m.group(3), m.group(2) or LEGACY_TOKEN) if m else None


def run_token(run_id: str) -> str:
    """The token a query run names its state files with: 16 hex digits of its run id's SHA-256.
    A run id is a random UUID, new for every run, so no two runs share a token, on one JobManager
    or across a failover to another (attempt numbers would not do: a new leader may count them
    from 0 again)."""
    return hashlib.sha256(run_id.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class OperatorLineage:
    """One keyed operator's view of the lineage for one batch: `runs` ((first batch, token),
    ascending): the files of version v (written by batch v-1) are those of the last run whose
    first batch is at or before v-1; `first`: the first batch that wrote the operator's state
    (versions up to it are empty), None when no committed batch has (no state yet), -1 when not
    known (state funke 0.3.0 wrote: a group without files is empty, as it read it)."""
    runs: tuple[tuple[int, str], ...]
    first: int | None

    def token(self, version: int) -> str | None:
        """The token of the files that make `version` (None: the lineage does not reach back
        that far, or version 0, which no batch wrote)."""
        return _token(self.runs, version)

    def empty(self, version: int) -> bool:
        """Whether `version` is empty by the lineage alone (no files make it)."""
        return version == 0 or self.first is None or (self.first >= 0 and version <= self.first)


def _token(runs: tuple[tuple[int, str], ...], version: int) -> str | None:
    batch = version - 1
    found = None
    for first, token in runs:
        if first > batch:
            break
        found = token
    return found if batch >= 0 else None


# State written before files were fenced (funke 0.3.0), or by a caller with no lineage: every
# file unfenced, a group's first version whatever its files say.
LEGACY = OperatorLineage(((0, LEGACY_TOKEN),), -1)


@dataclass(frozen=True, slots=True)
class StateLineage:
    """Which files hold a query's committed keyed state, in each commit log entry (as of its batch)
    and in each batch sent to the tasks (as of the last commit, with the run that sends it): `runs`
    ((first batch, token), ascending by first batch; see OperatorLineage) and `operators` (keyed
    vertex id -> the first batch that wrote its state, -1 when funke 0.3.0 wrote it). A vertex not
    named has no state yet."""
    runs: tuple[tuple[int, str], ...] = ()
    operators: Mapping[str, int] = field(default_factory=dict)

    def operator(self, vertex_id: str) -> OperatorLineage:
        return OperatorLineage(self.runs, self.operators.get(vertex_id))

    def token(self, version: int) -> str | None:
        """The token of the files that make `version` (see OperatorLineage.token)."""
        return _token(self.runs, version)

    def with_run(self, first_batch: int, token: str) -> StateLineage:
        """The lineage a run sends with its batches: this one, and from `first_batch` on, the
        run's own files (what it writes is read only once the commit log says it committed)."""
        runs = tuple((f, t) for f, t in self.runs if f < first_batch)
        if not runs or runs[-1][1] != token:
            runs += ((first_batch, token),)
        return StateLineage(runs, dict(self.operators))

    def committed(self, batch_id: int, vertices: list[str] | tuple[str, ...], retain: int) -> StateLineage:
        """The lineage once batch `batch_id` committed, as this run's lineage says (the run's own
        entry included): every keyed vertex of the job has state, from this batch on for one that
        had none (a vertex the job no longer has is dropped); the runs no batch within `retain`
        batches (plus two snapshot intervals) wrote are forgotten, so the entry stays small."""
        operators = {v: self.operators.get(v, batch_id) for v in vertices}
        runs = [(f, t) for f, t in self.runs if f <= batch_id]
        oldest = batch_id - retain - 2 * SNAPSHOT_EVERY
        while len(runs) > 1 and runs[1][0] <= oldest:
            runs.pop(0)
        return StateLineage(tuple(runs), operators)

    def to_json(self) -> dict:
        return {"runs": [[f, t] for f, t in self.runs], "operators": dict(sorted(self.operators.items()))}

    @staticmethod
    def from_json(raw: object) -> StateLineage:
        """The lineage of a commit entry or a batch (ValueError saying what is wrong: it comes
        from a file or a request)."""
        if not isinstance(raw, dict):
            raise ValueError(f"the state lineage must be an object, got {type(raw).__name__}")
        runs_raw, operators_raw = raw.get("runs", []), raw.get("operators", {})
        if not isinstance(runs_raw, list) or len(runs_raw) > 100_000:
            raise ValueError("the state lineage's runs must be a list of [first batch, token]")
        runs: list[tuple[int, str]] = []
        for item in runs_raw:
            if (not isinstance(item, list) or len(item) != 2 or isinstance(item[0], bool)
                    or not isinstance(item[0], int) or not 0 <= item[0] < 2**62 or not isinstance(item[1], str)
                    or not (item[1] == LEGACY_TOKEN or _TOKEN.match(item[1]))):
                raise ValueError(f"the state lineage's run {str(item)[:100]} is not [first batch, 16 hex digits]")
            if runs and item[0] <= runs[-1][0]:
                raise ValueError("the state lineage's runs must be in ascending order of their first batch")
            runs.append((item[0], item[1]))
        if not isinstance(operators_raw, dict) or len(operators_raw) > 100_000:
            raise ValueError("the state lineage's operators must be an object (vertex id -> first batch)")
        operators: dict[str, int] = {}
        for vertex, first in operators_raw.items():
            if not isinstance(vertex, str) or not _VERTEX.match(vertex):
                raise ValueError(f"the state lineage names an invalid vertex id {str(vertex)[:100]!r}")
            if isinstance(first, bool) or not isinstance(first, int) or not -1 <= first < 2**62:
                raise ValueError(f"the state lineage's first batch of vertex {vertex!r} must be an integer >= -1, "
                                 f"got {str(first)[:100]}")
            operators[vertex] = first
        return StateLineage(tuple(runs), operators)


def legacy_lineage(vertices: list[str] | tuple[str, ...]) -> StateLineage:
    """What a checkpoint whose last commit entry has no lineage says (funke 0.3.0 wrote it, or
    the query had no keyed operator then): every file unfenced, each keyed vertex's state as its
    files say."""
    return StateLineage(((0, LEGACY_TOKEN),), {v: -1 for v in vertices})


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
    """A version cannot be loaded from the files there are: a file was deleted by hand,
    retention removed what an old checkpoint needs, or the files are on a disk this process does
    not see (a checkpoint location that is not shared by every TaskManager)."""


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """How to build a version: start from `snapshot` (None: empty), apply `deltas` in order;
    `files`: the names to read, in that order."""
    snapshot: int | None
    deltas: tuple[int, ...]
    files: tuple[str, ...] = field(default=(), compare=False)


def load_plan(names: list[str], version: int, lineage: OperatorLineage = LEGACY) -> LoadPlan:
    """Which of a key group's files make `version`, by `lineage`: from the version down, the
    snapshot or else the delta of the run the lineage names for each version, until a snapshot,
    or the operator's first version (empty). A version a committed batch wrote must be there:
    MissingState names the files that are not. Other runs' files are never read. Versions of
    funke 0.3.0 (token "") are read by its rule: a group with no files at all is empty (its
    operator had no state yet); otherwise every delta after the snapshot used must be there."""
    if version < 0:
        raise ValueError(f"state version {version} is negative")
    if lineage.empty(version):
        return LoadPlan(None, ())
    present = set(names)
    newer: list[tuple[int, str]] = []  # (version, token), newest first
    missing: list[str] = []
    base: tuple[int, str] | None = None
    older = LoadPlan(None, ())
    floor = max(lineage.first or 0, 0)  # the operator's first version is empty
    v = version
    while v > floor:
        token = lineage.token(v)
        if token is None:
            raise MissingState(f"version {version} needs version {v}, and the commit log no longer says which run "
                               f"wrote it (retention removed its entry)")
        if token == LEGACY_TOKEN:
            older = _legacy_plan([n for n in names if (p := parse_file_name(n)) is not None and not p[2]], v)
            break
        if state_file_name(v, SNAPSHOT, token) in present:
            base = (v, token)
            break
        if state_file_name(v, DELTA, token) in present:
            newer.append((v, token))
        else:
            missing.append(state_file_name(v, DELTA, token))
        if missing and v % SNAPSHOT_EVERY == 0:
            break  # the snapshot written here is gone too: nothing further down helps
        v -= 1
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise MissingState(f"version {version} (the state after batch {version - 1}, committed) needs {shown}, "
                           f"which {'is' if len(missing) == 1 else 'are'} not there")
    newer.reverse()
    newer_files = tuple(state_file_name(d, DELTA, t) for d, t in newer)
    if base is not None:
        snapshot = state_file_name(base[0], SNAPSHOT, base[1])
        return LoadPlan(base[0], tuple(d for d, _ in newer), (snapshot,) + newer_files)
    return LoadPlan(older.snapshot, older.deltas + tuple(d for d, _ in newer), older.files + newer_files)


def _legacy_plan(names: list[str], version: int) -> LoadPlan:
    """funke 0.3.0's rule over its files (named without a token)."""
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
    files = ((state_file_name(base, SNAPSHOT),) if base is not None else ()) + tuple(state_file_name(d, DELTA)
                                                                                    for d in needed)
    return LoadPlan(base, needed, files)


def files_to_delete(names: list[str], version: int, retain: int, lineage: OperatorLineage = LEGACY) -> list[str]:
    """The files no longer needed once `version` is written: everything older than the newest
    snapshot of the lineage's run at or before `version - retain`, so that the version this batch
    read (version - 1) and the `retain` - 1 before it stay loadable. The floor is counted from
    the version read, which a committed batch wrote, not from the one written: an attempt that
    writes and is then deposed (its batch run again, reading version - 1) deletes nothing the
    run after it reads, and it picks the same floor, since the lineage up to version - 1 is the
    committed one whoever reads it. Any run's files below the floor go (those of runs that never
    committed included), and temporary files left there by killed writers."""
    oldest_kept = version - retain
    floor = None
    for name in names:
        parsed = parse_file_name(name)
        if parsed is not None and parsed[1] == SNAPSHOT and parsed[0] <= oldest_kept \
                and parsed[2] == lineage.token(parsed[0]) and (floor is None or parsed[0] > floor):
            floor = parsed[0]
    if floor is None:
        return []
    gone = []
    for name in names:
        m = _FILE.match(name) or _TEMPORARY.match(name)
        if m is not None and int(m.group(1)) < floor:
            gone.append(name)
    return sorted(gone)


def _span(versions: list[int]) -> str:
    return str(versions[0]) if len(versions) == 1 else f"{versions[0]}..{versions[-1]}"
