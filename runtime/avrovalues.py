"""Avro values of a Kafka source, decoded: the bytes of a batch's records become an Arrow table
with the columns `funke.common.streaming.sources.avro` maps the schema to; and the Schema Registry
client that gives the writer schema of a Confluent-framed value by its id. The TaskManager's
Kafka source calls `decode` for each batch; the JobManager calls `resolve_value_schema` at submit
when a confluent-avro source names no schema to decode into (then the registry's latest schema of
the topic's subject is pinned in the job, so every batch has the same columns).

Two value formats:
- "avro": plain Avro binary, written with the source's `value_schema`;
- "confluent-avro": Confluent's wire format, a magic byte 0, the writer schema's id (4 bytes, big
  endian) and the Avro binary. The writer schema is taken from the source's `schemas` ({id: schema
  JSON}) or fetched from `schema_registry` (GET /schemas/ids/{id} of Confluent's REST API, and
  GET /subjects/{subject}/versions/{version} for the schemas it refers to, if any; with a timeout,
  never following a redirect, each id fetched once per process). The value is read with the writer
  schema and resolved into the reader schema (`value_schema`) by Avro's rules.

A value that cannot be decoded fails the batch with `ValueDecodeError`, naming the topic, the
partition and the offset of its record (and, for Confluent's format, the schema id); an id the
registry does not know is `UnknownSchemaId`; a registry that does not answer in time is
`RegistryUnavailable` (every request has a timeout: nothing here waits forever). A record without
a value (a tombstone) becomes a row whose columns are all null.
"""

from __future__ import annotations

import decimal
import io
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Mapping, Sequence

import fastavro
import pyarrow as pa

from funke.common.streaming.sources import avro
from funke.common.streaming.sources.avro import AvroSchemaError, SqlType

REGISTRY_TIMEOUT_S = 10.0  # one request to the Schema Registry, from connecting to the last byte
MAX_RESPONSE_BYTES = 4 * 1024 * 1024  # a registry's answer (one schema, as JSON)
MAX_CACHED_SCHEMAS = 10_000  # writer schemas kept per process, over every registry
MAX_REFERENCES = 100  # schemas one schema refers to, over every level (Confluent's schema references)
MAX_REFERENCE_DEPTH = 10
MAGIC_BYTE = 0
HEADER_BYTES = 5  # magic byte + schema id
_ACCEPT = "application/vnd.schemaregistry.v1+json, application/vnd.schemaregistry+json, application/json"

# Confluent's error codes (the body of a 404)
SUBJECT_NOT_FOUND = 40401
VERSION_NOT_FOUND = 40402
SCHEMA_NOT_FOUND = 40403


class ValueDecodeError(ValueError):
    """A record's value that is not what the source's value settings say it is."""

    def __init__(self, where: tuple[str, int, int], reason: str, value_format: str = "avro"):
        self.topic, self.partition, self.offset = where
        self.reason = reason
        super().__init__(f"cannot decode the value of the record at offset {self.offset} of topic "
                         f"{self.topic!r} partition {self.partition} as {value_format}: {reason}")


class RegistryError(RuntimeError):
    """The Schema Registry answered, but not with what was asked for."""


class UnknownSchemaId(RegistryError, ValueDecodeError):
    """A Confluent-framed value whose writer schema id is neither given nor known to the registry."""

    def __init__(self, where: tuple[str, int, int] | None, schema_id: int, known_to: str):
        self.schema_id = schema_id
        if where is not None:
            ValueDecodeError.__init__(self, where, f"its schema id {schema_id} is not known to {known_to}",
                                      "confluent-avro")
        else:  # asked for without a record (the registry client alone)
            self.topic, self.partition, self.offset, self.reason = "", -1, -1, f"not known to {known_to}"
            Exception.__init__(self, f"schema id {schema_id} is not known to {known_to}")


class UnknownSubject(RegistryError):
    """A subject the registry has no schema for (looked up at submit)."""


class RegistryUnavailable(RegistryError):
    """The registry could not be reached, or did not answer within the timeout (transient)."""


# ---------------------------------------------------------------------------------------------
# The Schema Registry client


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect could lead to a host funke.io.allowed-hosts does not allow: answer it as an error."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _RefuseRedirects())


class SchemaRegistry:
    """The parts of Confluent's Schema Registry REST API a reader needs: a schema by id, and the
    latest schema of a subject. The URL was checked at submit (`avro.registry_url_problem`)."""

    def __init__(self, url: str, timeout: float = REGISTRY_TIMEOUT_S):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._schemas: dict[int, str] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SchemaRegistry({self.url!r})"

    def schema(self, schema_id: int) -> str:
        """The Avro schema (JSON text) registered under `schema_id`; UnknownSchemaId if the
        registry has none (Confluent's error 40403)."""
        with self._lock:
            cached = self._schemas.get(schema_id)
        if cached is not None:
            return cached
        body = self._get(f"/schemas/ids/{int(schema_id)}", {SCHEMA_NOT_FOUND: lambda: UnknownSchemaId(
            None, schema_id, f"the Schema Registry at {self.url}")})
        text = self._avro_schema(body, f"schema id {schema_id}")
        with self._lock:
            if len(self._schemas) >= MAX_CACHED_SCHEMAS:
                self._schemas.clear()  # ids are stable: a re-fetch is the only cost
            self._schemas[schema_id] = text
        return text

    def latest(self, subject: str) -> tuple[int, str]:
        """(id, schema JSON text) of the latest version of `subject`."""
        quoted = urllib.parse.quote(subject, safe="")
        unknown = lambda: UnknownSubject(f"the Schema Registry at {self.url} has no subject {subject!r}")  # noqa: E731
        body = self._get(f"/subjects/{quoted}/versions/latest", {SUBJECT_NOT_FOUND: unknown, VERSION_NOT_FOUND: unknown})
        number = body.get("id")
        if isinstance(number, bool) or not isinstance(number, int):
            raise RegistryError(f"the Schema Registry at {self.url} answered the latest version of subject "
                                f"{subject!r} without a schema id")
        return number, self._avro_schema(body, f"subject {subject!r}")

    def _avro_schema(self, body: Mapping[str, Any], what: str, budget: list[int] | None = None,
                     depth: int = 0) -> str:
        """The schema of a registry's answer as one self-contained JSON text: the named types of
        the schemas it refers to (Confluent's schema references, fetched by subject and version)
        written out where the schema first uses them."""
        kind = body.get("schemaType", "AVRO")
        if kind != "AVRO":
            raise RegistryError(f"{what} in the Schema Registry at {self.url} is a {str(kind)[:40]} schema, not Avro")
        text = body.get("schema")
        if not isinstance(text, str):
            raise RegistryError(f"the Schema Registry at {self.url} answered {what} without a schema")
        references = body.get("references") or []
        if not references:
            return text
        budget = [MAX_REFERENCES] if budget is None else budget
        if not isinstance(references, list) or depth >= MAX_REFERENCE_DEPTH or len(references) > budget[0]:
            raise RegistryError(f"{what} in the Schema Registry at {self.url} refers to more schemas than funke "
                                f"follows ({MAX_REFERENCES} in all, {MAX_REFERENCE_DEPTH} deep)")
        budget[0] -= len(references)
        named: dict[str, Any] = {}
        try:
            for ref in references:
                name, subject, version = _reference(ref, what, self.url)
                if name in named:
                    continue  # two references to one type (a diamond)
                quoted = urllib.parse.quote(subject, safe="")
                unknown = lambda: UnknownSubject(  # noqa: E731
                    f"{what} in the Schema Registry at {self.url} refers to subject {subject!r} version "
                    f"{version}, which the registry does not have")
                answer = self._get(f"/subjects/{quoted}/versions/{version}",
                                   {SUBJECT_NOT_FOUND: unknown, VERSION_NOT_FOUND: unknown})
                ref_text = self._avro_schema(answer, f"subject {subject!r} version {version}", budget, depth + 1)
                fresh: dict[str, Any] = {}  # two referenced schemas may both hold a third one's types
                fastavro.parse_schema(json.loads(ref_text), named_schemas=fresh, _write_hint=False)
                for type_name, definition in fresh.items():
                    named.setdefault(type_name, definition)
            parsed = fastavro.parse_schema(json.loads(text), named_schemas=named, _write_hint=False)
        except RegistryError:
            raise
        except Exception as exc:  # noqa: BLE001 - fastavro and json raise several kinds
            raise RegistryError(f"{what} in the Schema Registry at {self.url} does not parse with the schemas it "
                                f"refers to: {str(exc)[:300]}") from None
        return json.dumps(_inline_references(parsed, named, set()))

    def _get(self, path: str, not_found: Mapping[int, Callable[[], Exception]]) -> dict[str, Any]:
        """GET `path` as JSON. A 404 whose Confluent error code is in `not_found` raises what that
        makes; every other failure names the registry, the request and the cause."""
        request = urllib.request.Request(self.url + path, headers={"Accept": _ACCEPT}, method="GET")
        deadline = time.monotonic() + self.timeout
        try:
            with _OPENER.open(request, timeout=self.timeout) as response:
                raw = _read_bounded(response, deadline)
        except _TooLarge:
            raise RegistryError(f"the Schema Registry at {self.url} answered GET {path} with more than "
                                f"{MAX_RESPONSE_BYTES:,} bytes") from None
        except urllib.error.HTTPError as exc:
            with exc:
                try:
                    raw = _read_bounded(exc, deadline) if exc.fp is not None else b""
                except (OSError, _TooLarge):  # the status says enough without its body
                    raw = b""
            body = _json_or_none(raw)
            code = body.get("error_code") if isinstance(body, dict) else None
            if exc.code == 404 and code in not_found:
                raise not_found[code]() from None
            if 300 <= exc.code < 400:
                raise RegistryError(f"the Schema Registry at {self.url} answered GET {path} with a redirect "
                                    f"(HTTP {exc.code}), which funke does not follow: give the registry's own URL") \
                    from None
            detail = body.get("message") if isinstance(body, dict) else None
            if exc.code == 404 and code is None:
                detail = f"without Confluent's error code: is {self.url} a Schema Registry's URL?"
            failure = RegistryUnavailable if exc.code >= 500 or exc.code == 429 else RegistryError
            raise failure(f"the Schema Registry at {self.url} answered GET {path} with HTTP {exc.code}"
                                + (f" ({str(detail)[:200]})" if detail else "")) from None
        except TimeoutError:
            raise RegistryUnavailable(f"the Schema Registry at {self.url} did not answer GET {path} within "
                                      f"{self.timeout:g} s") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, TimeoutError):
                raise RegistryUnavailable(f"the Schema Registry at {self.url} did not answer GET {path} within "
                                          f"{self.timeout:g} s") from None
            raise RegistryUnavailable(f"the Schema Registry at {self.url} could not be reached: {reason}") from None
        body = _json_or_none(raw)
        if not isinstance(body, dict):
            raise RegistryError(f"the Schema Registry at {self.url} answered GET {path} with something other than "
                                f"a JSON object (is {self.url} a Schema Registry?)")
        return body


def _reference(ref: Any, what: str, url: str) -> tuple[str, str, int]:
    if isinstance(ref, dict):
        name, subject, version = ref.get("name"), ref.get("subject"), ref.get("version")
        if isinstance(name, str) and isinstance(subject, str) and 0 < len(subject) <= 1000 \
                and isinstance(version, int) and not isinstance(version, bool):
            return name, subject, version
    raise RegistryError(f"{what} in the Schema Registry at {url} has a schema reference funke cannot read: "
                        f"{str(ref)[:200]}")


def _inline_references(s: Any, named: Mapping[str, Any], written: set[str]) -> Any:
    """A parsed schema (full names everywhere) with the first use of each name of `named` that it
    does not define itself replaced by that type's definition, fastavro's own keys dropped."""
    if isinstance(s, str):
        if s in named and s not in written:
            return _inline_references(named[s], named, written)  # which marks it written
        return s
    if isinstance(s, list):
        return [_inline_references(b, named, written) for b in s]
    if not isinstance(s, dict):
        return s
    out = {k: v for k, v in s.items() if not k.startswith("__")}
    if out.get("type") in ("record", "error", "enum", "fixed") and isinstance(out.get("name"), str):
        if out["name"] in written:
            return out["name"]  # defined once already (it came in through two references)
        written.add(out["name"])
    if out.get("type") in ("record", "error"):
        out["fields"] = [{**f, "type": _inline_references(f["type"], named, written)} for f in out["fields"]]
    elif out.get("type") == "array":
        out["items"] = _inline_references(out["items"], named, written)
    elif out.get("type") == "map":
        out["values"] = _inline_references(out["values"], named, written)
    elif isinstance(out.get("type"), (dict, list)) or out.get("type") in named:
        out["type"] = _inline_references(out["type"], named, written)
    return out


class _TooLarge(Exception):
    pass


def _read_bounded(response: Any, deadline: float) -> bytes:
    """The body, at most MAX_RESPONSE_BYTES, read before `deadline` (a server that trickles bytes
    must not hold a batch past the timeout)."""
    chunks, size = [], 0
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError("the answer took longer than the timeout")
        chunk = response.read(65536)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_RESPONSE_BYTES:
            raise _TooLarge()
        chunks.append(chunk)


def _json_or_none(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


_REGISTRIES: dict[str, SchemaRegistry] = {}
_REGISTRIES_LOCK = threading.Lock()


def registry(url: str, timeout: float = REGISTRY_TIMEOUT_S) -> SchemaRegistry:
    """The process's client of the registry at `url` (its schemas cached across batches)."""
    key = url.rstrip("/")
    with _REGISTRIES_LOCK:
        found = _REGISTRIES.get(key)
        if found is None or found.timeout != timeout:
            found = _REGISTRIES[key] = SchemaRegistry(key, timeout)
        return found


def resolve_value_schema(config: Mapping[str, Any], topics: Sequence[str],
                         timeout: float = REGISTRY_TIMEOUT_S) -> dict[str, Any]:
    """`config` with the reader schema pinned, for the JobManager at submit: as it is when it
    names one (`avro.reader_schema`); for a confluent-avro source with a registry, the latest
    schema of the subject `<topic>-value` (Confluent's TopicNameStrategy) of its one topic.
    ValueError when no schema can be found that way; RegistryError subclasses for the registry's
    answers (UnknownSubject, RegistryUnavailable)."""
    out = dict(config)
    if config.get("value_format") not in avro.AVRO_FORMATS or avro.reader_schema(config) is not None:
        return out
    if config.get("schema_registry") is None or len(topics) != 1:
        raise ValueError("config 'value_schema' is needed: the schema every value is decoded into (the source's "
                         "columns); without it, funke takes the registry's latest schema of the subject "
                         "'<topic>-value', which needs one topic (not a pattern) and 'schema_registry'")
    _, text = registry(config["schema_registry"], timeout).latest(f"{topics[0]}-value")
    avro.load_schema(text)  # a schema without columns is refused here, at submit
    out["value_schema"] = text
    return out


# ---------------------------------------------------------------------------------------------
# Decoding


def arrow_type(t: SqlType, raw: bool = False) -> pa.DataType:
    """The Arrow type of a column type (what Spark makes of it is the same column type). `raw`:
    the type values are first read into, timestamps in the unit of their Avro number (the table
    is then cast to the column types)."""
    if t.name in ("timestamp", "timestamp_ntz"):
        return pa.timestamp(t.unit if raw else "us", tz="UTC" if t.name == "timestamp" else None)
    simple = {"void": pa.null(), "boolean": pa.bool_(), "int": pa.int32(), "bigint": pa.int64(),
              "float": pa.float32(), "double": pa.float64(), "binary": pa.binary(), "string": pa.string(),
              "date": pa.date32()}
    if t.name in simple:
        return simple[t.name]
    if t.name == "decimal":
        return pa.decimal128(t.precision, t.scale)
    if t.name == "struct":
        return pa.struct([pa.field(n, arrow_type(c, raw), c.nullable) for n, c in t.fields])
    # an array's elements and a map's values are nullable, as Spark DDL (ARRAY<...>, MAP<...>) says
    if t.name == "array":
        return pa.list_(pa.field("element", arrow_type(t.element, raw), True))  # type: ignore[arg-type]
    if t.name == "map":
        return pa.map_(pa.string(), pa.field("value", arrow_type(t.element, raw), True))  # type: ignore[arg-type]
    raise ValueError(f"no Arrow type for {t.name!r}")


def arrow_schema(schema: Any, raw: bool = False) -> pa.Schema:
    """The Arrow schema of the columns a value of `schema` becomes (`avro.value_columns`)."""
    return pa.schema([pa.field(n, arrow_type(t, raw), True) for n, t in avro.value_columns(schema)])


class _Reader:
    """One reader schema, ready to decode into: its parsed form to read with, the Arrow schema
    values are read into and the one of its columns, and the function that turns what fastavro
    returns into the columns' values (None: nothing to turn)."""

    def __init__(self, schema: Any):
        typed = avro.load_schema(schema)
        self.parsed = avro.read_schema(schema)
        self.arrow = arrow_schema(schema)
        self.raw = arrow_schema(schema, raw=True)
        self.is_record = avro.is_record_value(typed)
        self.convert = _converter(typed, avro.named_types(typed), 0)


_READERS: dict[str, _Reader] = {}
_READERS_LOCK = threading.Lock()


def _reader(schema: Any) -> _Reader:
    key = schema if isinstance(schema, str) else json.dumps(schema, sort_keys=True)
    with _READERS_LOCK:
        found = _READERS.get(key)
    if found is None:
        found = _Reader(schema)
        with _READERS_LOCK:
            if len(_READERS) >= 256:
                _READERS.clear()
            _READERS[key] = found
    return found


def decode(values: Sequence[bytes | None], config: Mapping[str, Any],
           where: Sequence[tuple[str, int, int]]) -> pa.Table:
    """The values of a batch's records as a table with the reader schema's columns, one row per
    value in order. `where[i]` is (topic, partition, offset) of `values[i]`, for error messages.
    `config`: the source's value settings (value_format "avro" or "confluent-avro",
    value_schema, schemas, schema_registry)."""
    if len(values) != len(where):
        raise ValueError(f"decode() got {len(values)} values but {len(where)} positions")
    fmt = config.get("value_format")
    if fmt not in avro.AVRO_FORMATS:
        raise ValueError(f"decode() decodes the Avro value formats {avro.AVRO_FORMATS}, not {fmt!r}")
    reader_schema = avro.reader_schema(config)
    if reader_schema is None:
        raise ValueError("config 'value_schema' is missing: a confluent-avro source is given its reader schema at "
                         "submit (funke.runtime.avrovalues.resolve_value_schema)")
    reader = _reader(reader_schema)
    writers = _Writers(config, reader)
    rows: list[Any] = []
    for value, at in zip(values, where):
        if value is None:
            rows.append({})
            continue
        record = writers.read(value, at, fmt)
        if reader.convert is not None and record is not None:
            record = reader.convert(record)
        rows.append(record if reader.is_record else {"value": record})
    table = _table(rows, reader.raw, where, fmt)
    return table if reader.raw == reader.arrow else table.cast(reader.arrow)


class _Writers:
    """The writer schemas of one batch's values: the reader's for plain Avro; by id for
    Confluent's format, from `schemas`, else from the registry."""

    def __init__(self, config: Mapping[str, Any], reader: _Reader):
        self.reader = reader
        self.given = avro.schema_ids(config["schemas"]) if config.get("schemas") else {}
        self.url = config.get("schema_registry")
        self.by_id: dict[int, Any] = {}

    def read(self, value: bytes, at: tuple[str, int, int], fmt: str) -> Any:
        buffer = io.BytesIO(value)
        if fmt == "avro":
            writer, target, schema_id = self.reader.parsed, None, None
        else:
            if len(value) < HEADER_BYTES or value[0] != MAGIC_BYTE:
                raise ValueDecodeError(at, f"it is not in Confluent's wire format (a magic byte 0 and a 4-byte schema "
                                           f"id before the Avro data); it starts with {bytes(value[:HEADER_BYTES])!r}",
                                       fmt)
            schema_id = int.from_bytes(value[1:HEADER_BYTES], "big")
            writer, target = self._writer(schema_id, at), self.reader.parsed
            buffer.seek(HEADER_BYTES)
        try:
            record = fastavro.schemaless_reader(buffer, writer, target, return_named_type=True)
        except Exception as exc:  # noqa: BLE001 - fastavro raises many kinds for bad data or schemas
            raise ValueDecodeError(at, _decode_reason(exc, schema_id), fmt) from None
        left = len(value) - buffer.tell()
        if left:
            raise ValueDecodeError(at, f"{left} byte(s) are left after the Avro value"
                                       f"{'' if schema_id is None else f' of schema id {schema_id}'}: it was not "
                                       f"written with this schema", fmt)
        return record

    def _writer(self, schema_id: int, at: tuple[str, int, int]) -> Any:
        found = self.by_id.get(schema_id)
        if found is not None:
            return found
        if schema_id in self.given:
            text = self.given[schema_id]
        elif self.url is not None:
            try:
                text = registry(self.url).schema(schema_id)
            except UnknownSchemaId:
                raise UnknownSchemaId(at, schema_id, f"the Schema Registry at {self.url.rstrip('/')}") from None
            except RegistryError as exc:  # the same kind (transient or not), saying which record needed it
                topic, partition, offset = at
                raise type(exc)(f"{exc} (the writer schema id {schema_id} of the value at offset {offset} of "
                                f"topic {topic!r} partition {partition})") from None
        else:
            ids = ", ".join(map(str, sorted(self.given)))
            raise UnknownSchemaId(at, schema_id, f"the source's 'schemas' (ids {ids})")
        try:
            parsed = avro.read_schema(text)
        except AvroSchemaError as exc:
            raise ValueDecodeError(at, f"the writer schema of its schema id {schema_id} {exc}", "confluent-avro") from None
        self.by_id[schema_id] = parsed
        return parsed


def _decode_reason(exc: Exception, schema_id: int | None) -> str:
    text = str(exc) or type(exc).__name__
    text = text if len(text) <= 300 else text[:300] + "..."
    if type(exc).__name__ == "SchemaResolutionError":
        return f"the writer schema of its schema id {schema_id} cannot be read as the value_schema: {text}"
    if isinstance(exc, (EOFError, StopIteration)):
        return f"it ends before the Avro value does ({type(exc).__name__}{': ' + str(exc) if str(exc) else ''})"
    return f"{type(exc).__name__}: {text}"


def _table(rows: list[Any], schema: pa.Schema, where: Sequence[tuple[str, int, int]], fmt: str) -> pa.Table:
    try:
        return pa.Table.from_pylist(rows, schema=schema)
    except (pa.ArrowException, TypeError, ValueError, OverflowError, decimal.InvalidOperation):
        pass
    for row, at in zip(rows, where):  # the whole batch failed: name the first value that does
        try:
            pa.Table.from_pylist([row], schema=schema)
        except (pa.ArrowException, TypeError, ValueError, OverflowError, decimal.InvalidOperation) as exc:
            raise ValueDecodeError(at, f"it does not fit its columns ({schema}): {str(exc)[:300]}", fmt) from None
    raise ValueError("the batch's values do not fit their columns, but each value alone does")  # not reached


# What fastavro returns -> the columns' values. fastavro is asked for each union branch of a named
# type as (full name, value) (return_named_type), so a union's branch is known, not guessed; other
# branches are told apart by their Python type, which is one per branch (avro.value_columns refuses
# unions whose branches share one). Dates and timestamps are read as numbers.


def _converter(s: Any, named: Mapping[str, Any], depth: int) -> Callable[[Any], Any] | None:
    if isinstance(s, str):
        return _converter(named[s], named, depth + 1) if s in named else None
    if isinstance(s, list):
        return _union_converter(s, named, depth)
    t = s.get("type")
    if t in ("record", "error"):
        convs = [(f["name"], c) for f in s["fields"] if (c := _converter(f["type"], named, depth + 1)) is not None]
        if not convs:
            return None

        def record(d: dict[str, Any]) -> dict[str, Any]:
            for name, conv in convs:
                if d.get(name) is not None:
                    d[name] = conv(d[name])
            return d
        return record
    if t == "array":
        c = _converter(s["items"], named, depth + 1)
        return None if c is None else (lambda xs: [None if x is None else c(x) for x in xs])
    if t == "map":
        c = _converter(s["values"], named, depth + 1)
        return None if c is None else (lambda m: {k: None if x is None else c(x) for k, x in m.items()})
    if isinstance(t, (dict, list)):
        return _converter(t, named, depth + 1)
    return None


def _definition(s: Any, named: Mapping[str, Any]) -> Any:
    return named.get(s, s) if isinstance(s, str) else s


def _named(s: Any, named: Mapping[str, Any]) -> str | None:
    d = _definition(s, named)
    return d["name"] if isinstance(d, dict) and d.get("type") in ("record", "error", "enum", "fixed") else None


def _union_converter(s: list[Any], named: Mapping[str, Any], depth: int) -> Callable[[Any], Any] | None:
    shape = avro.union_shape(s)
    if shape.kind == "merged":
        return None
    if shape.kind == "nullable":
        branch = shape.branches[0]
        inner = _converter(branch, named, depth + 1)
        if _named(branch, named) is None:
            return inner  # the value itself (never None here: callers skip nulls)
        if inner is None:
            return lambda v: v[1]
        return lambda v: inner(v[1])
    members: list[tuple[Callable[[Any], bool], str, Callable[[Any], Any] | None]] = []
    by_name: dict[str, tuple[str, Callable[[Any], Any] | None]] = {}
    for i, branch in enumerate(shape.branches):
        conv = _converter(branch, named, depth + 1)
        name = _named(branch, named)
        if name is not None:
            by_name[name] = (f"member{i}", conv)
        else:
            members.append((_python_test(_definition(branch, named)), f"member{i}", conv))

    def member(v: Any) -> dict[str, Any]:
        if isinstance(v, tuple) and len(v) == 2 and v[0] in by_name:
            column, conv = by_name[v[0]]
            return {column: v[1] if conv is None else conv(v[1])}
        for test, column, conv in members:
            if test(v):
                return {column: v if conv is None else conv(v)}
        raise ValueError(f"a union's value of Python type {type(v).__name__} matches none of its branches")
    return member


def _python_test(s: Any) -> Callable[[Any], bool]:
    """What fastavro returns for a branch that is not a named type."""
    t = s if isinstance(s, str) else s.get("type")
    logical = s.get("logicalType") if isinstance(s, dict) else None
    if logical == "decimal":
        return lambda v: isinstance(v, decimal.Decimal)
    tests: dict[str, Callable[[Any], bool]] = {
        "boolean": lambda v: isinstance(v, bool),
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "long": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, float),
        "double": lambda v: isinstance(v, float),
        "bytes": lambda v: isinstance(v, bytes),
        "string": lambda v: isinstance(v, str),
        "array": lambda v: isinstance(v, list),
        "map": lambda v: isinstance(v, dict),
    }
    return tests.get(t, lambda v: False)
