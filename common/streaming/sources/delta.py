"""Delta Lake tables (read and written through the `deltalake` package, delta-rs), pure part: the
streaming source's planning, what a table version's commit adds, and the rules every Delta
operator's configuration follows.

The stream's offset is a table version (a JSON integer). The query's first batch reads the
table's snapshot at its end version (every data file of that version); every later batch reads
the data files added by the commits after its start version up to its end version, in commit
order. A batch run again reads the same commits, so the same files, as long as the table's log
still holds them (Delta's log retention, 30 days by default). The stream takes appends: a commit
that removes data (a delete, an update, an overwrite) fails the query, naming the version, as
Structured Streaming's Delta source does without ignoreChanges; files a compaction rewrote
(`dataChange: false`) are not read again. A schema change fails the query too (the query's
operators were built for the schema it started with).

Subtask i of n reads the i-th, (i+n)-th, ... data file of a batch (snapshot files by path,
commit files in commit order).
"""

from __future__ import annotations

import datetime
import json
import posixpath
from dataclasses import dataclass
from typing import Any, Mapping, Sequence
from urllib.parse import unquote

from funke.common.streaming.checkpoint import SourceRange
from funke.common.streaming.sources.base import SourcePlugin

DELTA_STREAM = "source.stream.delta"
DELTA_SOURCE = "source.delta"
DELTA_SINK = "sink.delta"
DELTA_KINDS = frozenset({DELTA_STREAM, DELTA_SOURCE, DELTA_SINK})
DELTA_MODES = ("append", "overwrite")

# Reader features whose tables funke reads as plain Parquet files plus the log: the rest change
# what a data file's rows are (columnMapping: physical column names; typeWidening: narrower
# types in older files), so such tables are refused. deletionVectors: refused only once a data
# file of the snapshot read has one.
READABLE_FEATURES = frozenset({"deletionVectors", "timestampNtz", "v2Checkpoint", "vacuumProtocolCheck",
                               "variantType", "variantType-preview"})
COLUMN_MAPPING = "delta.columnMapping.mode"
APPEND_ONLY = "delta.appendOnly"
_GLOB = "*?[]{}"


@dataclass(frozen=True, slots=True)
class DataFile:
    """A data file of a table: its path relative to the table's directory (decoded from the
    log's URI form), its partition values (column, value) and size; `records` when the log's
    statistics say."""
    path: str
    partition_values: tuple[tuple[str, Any], ...] = ()
    size: int = 0
    records: int | None = None


@dataclass(frozen=True, slots=True)
class Commit:
    """What one table version's commit does, as far as a stream reads it."""
    version: int
    operation: str = ""
    added: tuple[DataFile, ...] = ()  # files added with dataChange (a compaction's are not data)
    removes_data: bool = False  # a remove with dataChange: a delete, update, merge or overwrite
    schema: Any = None  # the schema a metaData action sets (parsed schemaString), None: none
    deletion_vectors: int = 0  # files added with a deletion vector
    configuration: Mapping[str, Any] | None = None  # the table properties a metaData action sets
    reader_features: tuple[str, ...] | None = None  # the reader features a protocol action sets


@dataclass(frozen=True, slots=True)
class DeltaStreamSource:
    """Table versions as offsets: a batch reads the versions after its start up to its end."""
    max_versions_per_trigger: int | None = None

    def __post_init__(self) -> None:
        if self.max_versions_per_trigger is not None and self.max_versions_per_trigger < 1:
            raise ValueError(f"max_versions_per_trigger must be at least 1, got {self.max_versions_per_trigger}")

    def plan(self, start: Any, latest: int | None, limited: bool = True, cap: Any = None) -> SourceRange:
        """The range after `start` (None: the query's first batch, the snapshot at the end
        version); `latest`: the table's newest version now (None: there is no table)."""
        begin = delta_offset(start)
        if latest is None:
            return SourceRange(None, None, 0) if start is None else SourceRange(start, start, 0)
        if begin is not None and latest < begin:
            raise ValueError(f"the table is at version {latest}, before the query's offset {begin}: it was "
                             "replaced or restored since; start the query again on a new checkpoint")
        end = latest
        if begin is not None and limited and self.max_versions_per_trigger is not None:
            end = min(end, begin + self.max_versions_per_trigger)
        if cap is not None:
            end = min(end, delta_offset(cap))  # type: ignore[type-var]
        if begin is not None:
            end = max(end, begin)
        return SourceRange(start, end, 0)

    def latest(self, start: Any, latest: int | None) -> Any:
        return self.plan(start, latest, limited=False).end

    @staticmethod
    def versions(source_range: SourceRange) -> range | None:
        """The commits a range reads (None: the snapshot at its end, the query's first batch)."""
        if source_range.start is None:
            return None
        begin, end = delta_offset(source_range.start), delta_offset(source_range.end)
        return range(begin + 1, max(begin, end) + 1)  # type: ignore[operator]


def delta_offset(offset: Any) -> int | None:
    """A Delta stream offset (a table version) or None (ValueError if it is not one)."""
    if offset is None:
        return None
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"not a Delta source offset (a table version): {offset!r}")
    return offset


def added_files(commits: Sequence[Commit], start_schema: Any) -> list[DataFile]:
    """The data files the commits add, in commit order; ValueError naming the first commit a
    stream cannot read: one that removes data, adds files with deletion vectors, or changes the
    schema from `start_schema` (the schema at the range's start version)."""
    files: list[DataFile] = []
    for c in commits:
        what = f"version {c.version}" + (f" ({c.operation})" if c.operation else "")
        if c.removes_data:
            raise ValueError(f"{what} removes or rewrites data; a Delta stream reads appends only (a delete, "
                             "update, merge or overwrite of the table cannot be streamed): start a new query "
                             "(a new checkpoint) to read the table as it is now")
        if c.deletion_vectors:
            raise ValueError(f"{what} adds {c.deletion_vectors} data file(s) with deletion vectors, which funke "
                             "does not apply")
        if c.schema is not None and start_schema is not None and schema_shape(c.schema) != schema_shape(start_schema):
            raise ValueError(f"{what} changes the table's schema; the query was built for the schema it "
                             "started with: start a new query (a new checkpoint)")
        found = read_problem(c.reader_features, c.configuration or {}) if (
            c.configuration is not None or c.reader_features is not None) else None
        if found is not None:
            raise ValueError(f"{what} changes the table so that funke cannot read it: {found}")
        files += c.added
    return files


def share(files: Sequence[DataFile], subtask: int, parallelism: int) -> list[DataFile]:
    """Subtask `subtask`'s files of a batch or a snapshot."""
    if not 0 <= subtask < parallelism:
        raise ValueError(f"subtask {subtask} of a source with parallelism {parallelism}")
    return list(files[subtask::parallelism])


def parse_commit(version: int, text: str) -> Commit:
    """A commit file's actions (one JSON object a line, as the Delta protocol writes them)."""
    operation, added, removes, schema, dvs = "", [], False, None, 0
    configuration: Mapping[str, Any] | None = None
    features: tuple[str, ...] | None = None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            action = json.loads(line)
        except ValueError:
            raise ValueError(f"version {version}: line {n} of its commit is not JSON") from None
        if not isinstance(action, dict):
            raise ValueError(f"version {version}: line {n} of its commit is not an action")
        if isinstance(action.get("commitInfo"), dict):
            operation = str(action["commitInfo"].get("operation") or "")
        add = action.get("add")
        if isinstance(add, dict) and add.get("dataChange", True):
            if add.get("deletionVector"):
                dvs += 1
            added.append(_data_file(version, add))
        remove = action.get("remove")
        if isinstance(remove, dict) and remove.get("dataChange", True):
            removes = True
        meta = action.get("metaData")
        if isinstance(meta, dict):
            configuration = meta.get("configuration") if isinstance(meta.get("configuration"), dict) else {}
            if isinstance(meta.get("schemaString"), str):
                try:
                    schema = json.loads(meta["schemaString"])
                except ValueError:
                    raise ValueError(f"version {version}: its schema is not JSON") from None
        protocol = action.get("protocol")
        if isinstance(protocol, dict):
            features = tuple(str(f) for f in protocol.get("readerFeatures") or ())
    return Commit(version, operation, tuple(added), removes, schema, dvs, configuration, features)


def _data_file(version: int, add: Mapping[str, Any]) -> DataFile:
    raw = add.get("path")
    if not isinstance(raw, str):
        raise ValueError(f"version {version}: an added file has no path")
    values = add.get("partitionValues") or {}
    if not isinstance(values, dict):
        raise ValueError(f"version {version}: {raw!r} has partition values that are not an object")
    records = None
    stats = add.get("stats")
    if isinstance(stats, str):
        try:
            n = json.loads(stats).get("numRecords")
            records = n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None
        except (ValueError, AttributeError):
            records = None
    size = add.get("size")
    return DataFile(relative_path(raw), tuple(sorted(values.items())),
                    size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else 0, records)


def relative_path(logged: str) -> str:
    """A data file's path from the log (a relative URI reference, percent-encoded) as a path
    relative to the table's directory. A log is data, not trusted: an absolute path or URI, or
    one that climbs out of the table's directory, is refused (ValueError)."""
    path = unquote(logged)
    if (not path or "://" in logged or path.startswith("/") or "\\" in path or "\x00" in path
            or any(seg in ("", ".", "..") for seg in path.split("/")) or any(c in path for c in _GLOB)):
        raise ValueError(f"the table's log names the data file {logged[:200]!r}, which is not a plain path inside "
                         "the table's directory (absolute paths, '..', glob characters and shallow clones are "
                         "not read)")
    return posixpath.normpath(path)


def schema_shape(schema: Any) -> Any:
    """A Delta schema (its JSON form, parsed) without what does not change what a row is: field
    metadata and nullability."""
    if isinstance(schema, dict):
        return {k: schema_shape(v) for k, v in sorted(schema.items())
                if k not in ("metadata", "nullable", "containsNull", "valueContainsNull")}
    if isinstance(schema, list):
        return [schema_shape(v) for v in schema]
    return schema


def schema_difference(table: Any, data: Any) -> str | None:
    """How the schema of the rows to write differs from the table's (both parsed Delta schema
    JSON), or None: same column names and types (nullability aside)."""
    def columns(schema: Any) -> dict[str, Any]:
        return {f.get("name"): schema_shape(f.get("type")) for f in (schema or {}).get("fields", [])}

    have, want = columns(table), columns(data)
    if have == want:
        return None
    parts = []
    missing = [n for n in have if n not in want]
    extra = [n for n in want if n not in have]
    changed = [n for n in want if n in have and have[n] != want[n]]
    if missing:
        parts.append(f"missing columns {missing[:20]}")
    if extra:
        parts.append(f"columns the table does not have {extra[:20]}")
    for n in changed[:20]:
        parts.append(f"column {n!r} is {_type_text(want[n])}, the table's is {_type_text(have[n])}")
    return "; ".join(parts)


def _type_text(t: Any) -> str:
    return t if isinstance(t, str) else json.dumps(t, separators=(",", ":"))[:200]


def read_problem(reader_features: Sequence[str] | None, configuration: Mapping[str, Any],
                 deletion_vectors: int = 0) -> str | None:
    """Why funke cannot read a table version (None: it can)."""
    mode = str(configuration.get(COLUMN_MAPPING) or "none").lower()
    if mode != "none":
        return (f"it uses column mapping ({COLUMN_MAPPING}={mode}: its Parquet files name columns by physical "
                "names), which funke does not read")
    unknown = sorted(set(reader_features or ()) - READABLE_FEATURES)
    if unknown:
        return f"it needs reader features funke does not support: {', '.join(unknown)}"
    if deletion_vectors:
        return f"{deletion_vectors} of its data files have deletion vectors, which funke does not apply"
    return None


def write_problem(configuration: Mapping[str, Any], partition_columns: Sequence[str], mode: str) -> str | None:
    """Why funke cannot write into an existing table (None: it can)."""
    mode_cm = str(configuration.get(COLUMN_MAPPING) or "none").lower()
    if mode_cm != "none":
        return f"it uses column mapping ({COLUMN_MAPPING}={mode_cm}), which funke does not write"
    if partition_columns:
        return f"it is partitioned (by {', '.join(partition_columns)}); funke writes unpartitioned tables only"
    if mode == "overwrite" and str(configuration.get(APPEND_ONLY) or "false").lower() == "true":
        return f"it is append-only ({APPEND_ONLY}=true), so mode 'overwrite' cannot replace its rows"
    return None


def version_at(history: Sequence[tuple[int, int]], timestamp_ms: int) -> int:
    """The table version a timestamp reads (Delta's time travel): the newest version committed
    at or before it. `history`: (version, commit time ms) of the versions in the log."""
    at = [v for v, t in history if t <= timestamp_ms]
    if not at:
        oldest = min(history, default=None)
        since = f"; the oldest version in its log is {oldest[0]}, committed at {_iso(oldest[1])}" if oldest else ""
        raise ValueError(f"the table has no version committed at or before {_iso(timestamp_ms)}{since}")
    return max(at)


def parse_timestamp(text: Any) -> int:
    """An ISO 8601 date and time (UTC when it names no offset) as epoch milliseconds."""
    if not isinstance(text, str) or not text.strip() or len(text) > 64:
        raise ValueError(f"must be an ISO 8601 date and time such as '2024-05-01T12:00:00Z', got {text!r:.80}")
    try:
        moment = datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"must be an ISO 8601 date and time such as '2024-05-01T12:00:00Z', got {text!r:.80}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return int(moment.timestamp() * 1000)


def _iso(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).isoformat(timespec="milliseconds")


def config_problems(kind: str, config: Mapping[str, Any]) -> list[str]:
    """The rules of a Delta operator's configuration beyond each key's type: a table is a local
    directory (a path or file:// URI, no glob), read at a version or a timestamp, not both."""
    problems = []
    path = config.get("path")
    if isinstance(path, str):
        if "://" in path and not path.startswith("file://"):
            problems.append(f"config 'path' {path[:200]!r}: Delta tables are read and written on local paths or "
                            "file:// URIs (the JobManager commits to the table and the TaskManagers read its files)")
        if any(c in path for c in _GLOB):
            problems.append(f"config 'path' {path[:200]!r}: a Delta table is one directory, not a glob "
                            f"(no {' '.join(_GLOB)})")
    if kind == DELTA_SOURCE and config.get("version") is not None and config.get("timestamp") is not None:
        problems.append("give config 'version' or 'timestamp', not both")
    return problems


def _planning(config: Mapping[str, Any], parallelism: int) -> DeltaStreamSource:
    limit = config.get("max_versions_per_trigger")
    return DeltaStreamSource(int(limit) if limit is not None else None)


PLUGIN = SourcePlugin((DELTA_STREAM,), _planning)
