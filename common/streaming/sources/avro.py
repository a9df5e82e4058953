"""Avro values of a Kafka source, the pure part: what an Avro schema becomes as columns (so a
query's schema is known at submit, before any record is read) and the checks of a source's value
settings at submit. Decoding the bytes, and fetching writer schemas from a Schema Registry, is
`funke.runtime.avrovalues` (it stands on this module).

The mapping follows Spark's `from_avro` (`SchemaConverters.toSqlType`), so a Structured Streaming
user finds the types they know:

    boolean, int, long, float, double    boolean, int, bigint, float, double
    bytes, fixed                         binary
    string, enum                         string
    record                               struct (a field not in a union with null is NOT NULL)
    array, map                           array, map<string, ...>
    union [null, T]                      T, nullable
    union [int, long] / [float, double]  bigint / double
    any other union                      struct<member0, member1, ...> (each nullable; null is no member)
    date                                 date
    timestamp-millis / -micros           timestamp (UTC)
    local-timestamp-millis / -micros     timestamp_ntz
    decimal(p, s)                        decimal(p, s), p at most 38

Any other logical type (uuid, time-millis, time-micros, duration, timestamp-nanos, ...) is read as
its underlying type, as the Avro specification says of logical types a reader does not know: a
uuid is a string, time-millis an int, time-micros a bigint. A record's fields are the value's
columns; a value whose schema is not a record is one column, `value`. Every top-level column is
nullable: a record without a value (a tombstone) has all of them null. Recursive types have no
column type and are refused.

The value settings of a Kafka source (`value_format` and the keys below) are checked here:
`value_schema` (the Avro schema as JSON text, or as a JSON object) parses; `schemas` maps schema
ids to schema JSON; `schema_registry` is an http(s) URL whose host is one the cluster allows
(funke.io.allowed-hosts) and which holds no credentials (they would be stored in the job graph).
"""

from __future__ import annotations

import functools
import ipaddress
import json
import re
import urllib.parse
from dataclasses import dataclass
from typing import Any, Mapping

import fastavro

from funke.common import ids

VALUE_FORMATS = ("raw", "json", "avro", "confluent-avro")
AVRO_FORMATS = ("avro", "confluent-avro")
MAX_SCHEMA_CHARS = 1024 * 1024  # one schema's JSON text
MAX_SCHEMAS = 1000  # ids given in `schemas`
MAX_SCHEMA_ID = 2**31 - 1  # Confluent's ids are non-negative 32-bit integers
MAX_DEPTH = 64  # nesting of types inside one schema
MAX_DECIMAL_PRECISION = 38  # Spark's DecimalType
REGISTRY_SCHEMES = ("http", "https")
MAX_URL_CHARS = 2000

# The logical types read as themselves; any other is read as its underlying type.
KEPT_LOGICAL = frozenset({"date", "timestamp-millis", "timestamp-micros", "local-timestamp-millis",
                          "local-timestamp-micros", "decimal"})
_PRIMITIVE_SQL = {"null": "void", "boolean": "boolean", "int": "int", "long": "bigint", "float": "float",
                  "double": "double", "bytes": "binary", "string": "string"}
# Only decimals are turned into Python objects while reading: dates and timestamps are read as the
# numbers they are and become dates and timestamps in Arrow, many times faster than datetimes.
DECODED_LOGICAL = frozenset({"decimal"})
_LOGICAL_SQL = {("int", "date"): ("date", ""), ("long", "timestamp-millis"): ("timestamp", "ms"),
                ("long", "timestamp-micros"): ("timestamp", "us"),
                ("long", "local-timestamp-millis"): ("timestamp_ntz", "ms"),
                ("long", "local-timestamp-micros"): ("timestamp_ntz", "us")}
_DDL_NAMES = {"void": "VOID", "boolean": "BOOLEAN", "int": "INT", "bigint": "BIGINT", "float": "FLOAT",
              "double": "DOUBLE", "binary": "BINARY", "string": "STRING", "date": "DATE", "timestamp": "TIMESTAMP",
              "timestamp_ntz": "TIMESTAMP_NTZ"}
_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")


class AvroSchemaError(ValueError):
    """An Avro schema that does not parse, or has no column type."""


@dataclass(frozen=True, slots=True)
class SqlType:
    """A column type an Avro schema maps to. `name` is one of the keys of `_DDL_NAMES`, or
    "decimal", "struct", "array", "map"."""

    name: str
    nullable: bool = False
    fields: tuple[tuple[str, "SqlType"], ...] = ()  # struct
    element: "SqlType | None" = None  # array element, map value
    precision: int = 0  # decimal
    scale: int = 0
    unit: str = ""  # timestamps: what the Avro number counts, "ms" or "us"

    def with_nullable(self, nullable: bool = True) -> "SqlType":
        return SqlType(self.name, nullable, self.fields, self.element, self.precision, self.scale, self.unit)

    def ddl(self) -> str:
        """Spark DDL of the type (nested fields that may not be null say NOT NULL)."""
        if self.name == "struct":
            return "STRUCT<" + ", ".join(f"`{n}`: {t.ddl()}{'' if t.nullable else ' NOT NULL'}"
                                         for n, t in self.fields) + ">"
        if self.name == "array":
            return f"ARRAY<{self.element.ddl()}>"  # type: ignore[union-attr]
        if self.name == "map":
            return f"MAP<STRING, {self.element.ddl()}>"  # type: ignore[union-attr]
        if self.name == "decimal":
            return f"DECIMAL({self.precision},{self.scale})"
        return _DDL_NAMES[self.name]


@dataclass(frozen=True, slots=True)
class UnionShape:
    """How a union becomes a column: `kind` "nullable" (one branch besides null: `branches[0]`),
    "merged" (int and long, or float and double: `merged` is the column type's name) or "struct"
    (a member per branch besides null, in order)."""

    kind: str
    branches: tuple[Any, ...]  # the branches besides null, as the parsed schema has them
    has_null: bool
    merged: str = ""


def is_null(schema: Any) -> bool:
    return schema == "null" or (isinstance(schema, dict) and schema.get("type") == "null")


def union_shape(branches: list[Any]) -> UnionShape:
    """The shape of a union (a list of parsed Avro schemas) as Spark's from_avro gives it."""
    others = tuple(b for b in branches if not is_null(b))
    has_null = len(others) != len(branches)
    if not others:  # only null: a column that is always null
        return UnionShape("nullable", ("null",), True)
    if len(others) == 1:
        return UnionShape("nullable", others, has_null)
    plain = {b for b in others if isinstance(b, str)}
    if len(others) == 2 and plain == {"int", "long"}:
        return UnionShape("merged", others, has_null, "bigint")
    if len(others) == 2 and plain == {"float", "double"}:
        return UnionShape("merged", others, has_null, "double")
    return UnionShape("struct", others, has_null)


def strip_logical_types(schema: Any, keep: frozenset[str] = KEPT_LOGICAL, depth: int = 0) -> Any:
    """The schema (JSON as loaded) with every logical type not in `keep` removed, so it is read as
    its underlying type (a copy; the input is left as it is)."""
    if depth > MAX_DEPTH:
        raise AvroSchemaError(f"the schema nests types more than {MAX_DEPTH} levels deep")
    if isinstance(schema, list):
        return [strip_logical_types(s, keep, depth + 1) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: v for k, v in schema.items() if not (k == "logicalType" and v not in keep)}
    for key in ("type", "items", "values"):
        if isinstance(out.get(key), (dict, list)):
            out[key] = strip_logical_types(out[key], keep, depth + 1)
    if isinstance(out.get("fields"), list):
        out["fields"] = [{**f, "type": strip_logical_types(f.get("type"), keep, depth + 1)} if isinstance(f, dict)
                         else f for f in out["fields"]]
    return out


def load_schema(schema: Any) -> Any:
    """A schema given as JSON text (or as loaded JSON), parsed: logical types not kept stripped,
    names fully qualified (fastavro's parsed form). AvroSchemaError says why not."""
    return _load_text(_text(schema), KEPT_LOGICAL)


def read_schema(schema: Any) -> Any:
    """The parsed schema to read values with: as `load_schema`, and dates and timestamps read as
    their numbers (DECODED_LOGICAL), which the Arrow schema (`funke.runtime.avrovalues`) makes
    dates and timestamps."""
    return _load_text(_text(schema), DECODED_LOGICAL)


def _text(schema: Any) -> str:
    if isinstance(schema, str):
        return schema
    try:
        return json.dumps(schema)
    except (TypeError, ValueError, RecursionError) as exc:
        raise AvroSchemaError(f"is not JSON: {exc}") from None


@functools.lru_cache(maxsize=512)
def _load_text(text: str, keep: frozenset[str]) -> Any:
    if len(text) > MAX_SCHEMA_CHARS:
        raise AvroSchemaError(f"has {len(text):,} characters; at most {MAX_SCHEMA_CHARS:,}")
    try:
        loaded = json.loads(text)
    except json.JSONDecodeError as exc:
        # a bare name such as string is what a user may mean by the schema "string"
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", text.strip()):
            loaded = text.strip()
        else:
            raise AvroSchemaError(f"is not JSON: {exc}") from None
    except RecursionError:
        raise AvroSchemaError(f"nests JSON more than {MAX_DEPTH} levels deep") from None
    stripped = strip_logical_types(loaded, keep)
    try:
        parsed = fastavro.parse_schema(stripped, _write_hint=False)
    except RecursionError:
        raise AvroSchemaError(f"nests types more than {MAX_DEPTH} levels deep") from None
    except Exception as exc:  # noqa: BLE001 - fastavro raises several kinds for a bad schema
        raise AvroSchemaError(f"is not a valid Avro schema: {_short(exc)}") from None
    value_type(parsed)  # refuses what has no column type (recursion, decimals Spark cannot hold)
    return parsed


def _short(exc: BaseException, limit: int = 300) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def named_types(parsed: Any) -> dict[str, Any]:
    """Full name -> definition of every named type of a parsed schema."""
    found: dict[str, Any] = {}

    def walk(s: Any, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise AvroSchemaError(f"the schema nests types more than {MAX_DEPTH} levels deep")
        if isinstance(s, list):
            for b in s:
                walk(b, depth + 1)
        elif isinstance(s, dict):
            if s.get("type") in ("record", "error", "enum", "fixed") and isinstance(s.get("name"), str):
                found.setdefault(s["name"], s)
            for f in s.get("fields", ()) if s.get("type") in ("record", "error") else ():
                walk(f["type"], depth + 1)
            if s.get("type") == "array":
                walk(s["items"], depth + 1)
            elif s.get("type") == "map":
                walk(s["values"], depth + 1)
            elif isinstance(s.get("type"), (dict, list)):
                walk(s["type"], depth + 1)

    walk(parsed, 0)
    return found


def value_type(parsed: Any) -> SqlType:
    """The column type of a parsed schema (see the module docstring)."""
    return _sql(parsed, named_types(parsed), (), 0)


def _sql(s: Any, named: Mapping[str, Any], stack: tuple[str, ...], depth: int) -> SqlType:
    if depth > MAX_DEPTH:
        raise AvroSchemaError(f"the schema nests types more than {MAX_DEPTH} levels deep")
    if isinstance(s, str):
        if s in _PRIMITIVE_SQL:
            return SqlType(_PRIMITIVE_SQL[s])
        if s in stack:
            raise AvroSchemaError(f"type {s!r} contains itself; a recursive type has no column type")
        if s not in named:
            raise AvroSchemaError(f"names an unknown type {s!r}")
        return _sql(named[s], named, stack + (s,), depth + 1)
    if isinstance(s, list):
        shape = union_shape(s)
        if shape.kind == "nullable":
            return _sql(shape.branches[0], named, stack, depth + 1).with_nullable(shape.has_null)
        if shape.kind == "merged":
            return SqlType(shape.merged, shape.has_null)
        members = tuple((f"member{i}", _sql(b, named, stack, depth + 1).with_nullable())
                        for i, b in enumerate(shape.branches))
        return SqlType("struct", True, members)
    t = s.get("type")
    name = s.get("name")
    inner = stack + ((name,) if t in ("record", "error") and isinstance(name, str) and name not in stack else ())
    logical = s.get("logicalType")
    if logical == "decimal" and t in ("bytes", "fixed"):
        precision, scale = s.get("precision"), s.get("scale", 0)
        if not isinstance(precision, int) or not 1 <= precision <= MAX_DECIMAL_PRECISION:
            raise AvroSchemaError(f"decimal precision {precision!r}: Spark's decimals hold 1 to "
                                  f"{MAX_DECIMAL_PRECISION} digits")
        if not isinstance(scale, int) or not 0 <= scale <= precision:
            raise AvroSchemaError(f"decimal scale {scale!r} must be from 0 to the precision {precision}")
        return SqlType("decimal", precision=precision, scale=scale)
    if isinstance(t, str) and (t, logical) in _LOGICAL_SQL:
        name, unit = _LOGICAL_SQL[(t, logical)]
        return SqlType(name, unit=unit)
    if t in _PRIMITIVE_SQL:
        return SqlType(_PRIMITIVE_SQL[t])
    if t in ("record", "error"):
        return SqlType("struct", fields=tuple((f["name"], _sql(f["type"], named, inner, depth + 1))
                                              for f in s["fields"]))
    if t == "enum":
        return SqlType("string")
    if t == "fixed":
        return SqlType("binary")
    if t == "array":
        if _takes_no_bytes(s["items"], named, 0):
            # a block count is all such an array's bytes: 10 bytes could claim 2**62 items
            raise AvroSchemaError("an array of items that take no bytes (null, a record without fields, a fixed "
                                  "of size 0) is refused: one short value could hold billions of items")
        return SqlType("array", element=_sql(s["items"], named, stack, depth + 1))
    if t == "map":
        return SqlType("map", element=_sql(s["values"], named, stack, depth + 1))
    return _sql(t, named, stack, depth + 1)


def _takes_no_bytes(s: Any, named: Mapping[str, Any], depth: int) -> bool:
    if depth > MAX_DEPTH:
        return False
    if isinstance(s, str):
        return s == "null" or (s in named and _takes_no_bytes(named[s], named, depth + 1))
    if isinstance(s, list):
        return False  # a union writes its branch's index
    t = s.get("type")
    if t in ("record", "error"):
        return all(_takes_no_bytes(f["type"], named, depth + 1) for f in s["fields"])
    if t == "fixed":
        return s.get("size") == 0
    return t == "null" or (isinstance(t, (dict, list)) and _takes_no_bytes(t, named, depth + 1))


def value_columns(schema: Any) -> tuple[tuple[str, SqlType], ...]:
    """The columns a value of `schema` (JSON text or loaded JSON) becomes: a record's fields, or
    one column `value`; every one nullable (a record may have no value)."""
    parsed = load_schema(schema)
    t = value_type(parsed)
    _refuse_ambiguous_unions(parsed, named_types(parsed), 0)
    if is_record_value(parsed):
        return tuple((n, c.with_nullable()) for n, c in t.fields)
    return (("value", t.with_nullable()),)


def read_kind(s: Any, named: Mapping[str, Any]) -> str:
    """What a reader gets for a value of `s` (a union's branch), as far as it tells branches apart:
    a named type comes with its name; other types only as a Python value of this kind."""
    d = named.get(s, s) if isinstance(s, str) else s
    if isinstance(d, dict) and d.get("type") in ("record", "error", "enum", "fixed"):
        return "named:" + str(d.get("name"))
    t = d if isinstance(d, str) else d.get("type")
    if isinstance(d, dict) and d.get("logicalType") == "decimal":
        return "decimal"
    return {"boolean": "bool", "int": "number", "long": "number", "float": "float", "double": "float",
            "bytes": "bytes", "string": "str", "array": "list", "map": "dict", "null": "null"}.get(str(t), str(t))


def _refuse_ambiguous_unions(s: Any, named: Mapping[str, Any], depth: int, seen: frozenset[str] = frozenset()) -> None:
    """A union read into a struct of members must have branches a reader tells apart: int and long
    (or a date or timestamp, which are numbers too), or float and double, beside other branches
    are not."""
    if depth > MAX_DEPTH:
        return
    if isinstance(s, str):
        if s in named and s not in seen:
            _refuse_ambiguous_unions(named[s], named, depth + 1, seen | {s})
        return
    if isinstance(s, list):
        shape = union_shape(s)
        if shape.kind == "struct":
            kinds = [read_kind(b, named) for b in shape.branches]
            clash = sorted({k for k in kinds if kinds.count(k) > 1})
            if clash:
                raise AvroSchemaError(f"a union with branches {kinds!r} has more than one branch read as {clash[0]!r} "
                                      f"(int, long, date and timestamps are all numbers): a reader cannot tell "
                                      f"which member a value is; use one of them")
        for b in s:
            _refuse_ambiguous_unions(b, named, depth + 1, seen)
        return
    t = s.get("type")
    if t in ("record", "error"):
        for f in s["fields"]:
            _refuse_ambiguous_unions(f["type"], named, depth + 1, seen | {s.get("name")})
    elif t == "array":
        _refuse_ambiguous_unions(s["items"], named, depth + 1, seen)
    elif t == "map":
        _refuse_ambiguous_unions(s["values"], named, depth + 1, seen)
    elif isinstance(t, (dict, list)):
        _refuse_ambiguous_unions(t, named, depth + 1, seen)


def is_record_value(parsed: Any) -> bool:
    """Whether values of a parsed schema are records (their fields are the columns), not one
    column `value`."""
    return not isinstance(parsed, list) and value_type(parsed).name == "struct"


def spark_ddl(schema: Any) -> str:
    """The Spark DDL of the columns a value of `schema` becomes, e.g.
    "`id` BIGINT, `tags` ARRAY<STRING>"."""
    return ", ".join(f"`{n}` {t.ddl()}" for n, t in value_columns(schema))


def schema_ids(schemas: Any) -> dict[int, Any]:
    """`schemas` ({id: schema JSON}; JSON objects have string keys) with int ids (ValueError for
    anything else)."""
    if not isinstance(schemas, Mapping) or not schemas:
        raise ValueError(f"must be a non-empty object of schema id -> schema, got {ids.echo(schemas)}")
    if len(schemas) > MAX_SCHEMAS:
        raise ValueError(f"gives {len(schemas)} schemas; at most {MAX_SCHEMAS}")
    out: dict[int, Any] = {}
    for key, schema in schemas.items():
        if isinstance(key, bool) or not (isinstance(key, int) or (isinstance(key, str) and key.isdigit()
                                                                   and len(key) <= 10)):
            raise ValueError(f"has the key {ids.echo(key)}; keys are schema ids from 0 to {MAX_SCHEMA_ID}")
        number = int(key)
        if not 0 <= number <= MAX_SCHEMA_ID:
            raise ValueError(f"has the id {number}; ids are from 0 to {MAX_SCHEMA_ID}")
        out[number] = schema
    return out


def reader_schema(config: Mapping[str, Any]) -> Any | None:
    """The schema the values of an Avro source are decoded into (so its columns): `value_schema`,
    or, for confluent-avro without one, the only schema of `schemas`. None when it must be found
    at submit (the registry's latest schema of the topic's subject: funke.runtime.avrovalues)."""
    if config.get("value_schema") is not None:
        return config["value_schema"]
    if config.get("value_format") == "confluent-avro" and config.get("schemas"):
        given = schema_ids(config["schemas"])
        if len(given) == 1:
            return next(iter(given.values()))
    return None


def registry_url_problem(url: object, allowed_hosts: tuple[str, ...] = ()) -> str | None:
    """Why `url` is not a Schema Registry URL a job may use here (None if it is): http or https,
    a host, no credentials, query or fragment; the host one of `allowed_hosts` if any are set."""
    if not isinstance(url, str) or not 1 <= len(url) <= MAX_URL_CHARS or not url.isprintable() or " " in url:
        return f"must be an http(s) URL such as http://registry:8081, got {ids.echo(url)}"
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"{ids.echo(url)} is not a URL: {exc}"
    if parts.scheme.lower() not in REGISTRY_SCHEMES:
        return f"must be an http or https URL, got {ids.echo(url)}"
    if parts.username is not None or parts.password is not None:
        return ("must not hold credentials: they would be stored in the job graph, which clients can read "
                "(give a registry that needs none, or the schemas by id in 'schemas')")
    if parts.query or parts.fragment:
        return f"must be the registry's base URL, without a query or fragment, got {ids.echo(url)}"
    host = parts.hostname or ""
    if not _host_ok(host):
        return f"has no valid host: {ids.echo(url)}"
    if port == 0:
        return f"has port 0: {ids.echo(url)}"
    if allowed_hosts and host.lower() not in allowed_hosts:
        return (f"{ids.echo(host)} is not a host jobs may connect to here "
                f"(funke.io.allowed-hosts: {', '.join(allowed_hosts)})")
    return None


def _host_ok(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return bool(_HOST.fullmatch(host)) and ".." not in host


def config_problems(config: Mapping[str, Any], allowed_hosts: tuple[str, ...] = ()) -> list[str]:
    """The problems of a Kafka source's value settings (each a sentence naming the key), for
    the job graph's validation. Avro schemas are parsed and mapped to columns here, so a schema
    that has none is refused at submit."""
    problems: list[str] = []
    fmt = config.get("value_format", "raw")
    if fmt not in VALUE_FORMATS:
        return [f"config 'value_format' must be one of {', '.join(map(repr, VALUE_FORMATS))}, got {ids.echo(fmt)}"]
    for key in ("schema_registry", "schemas"):
        if config.get(key) is not None and fmt != "confluent-avro":
            problems.append(f"config {key!r} is for value_format 'confluent-avro' (the value_format is {fmt!r})")
    if fmt not in AVRO_FORMATS:
        return problems
    schema = config.get("value_schema")
    if schema is None and fmt == "avro":
        problems.append("config 'value_schema' is needed for value_format 'avro': the values' Avro schema, "
                        "as JSON text")
    elif schema is not None:
        problems.extend(f"config 'value_schema' {p}" for p in _schema_problems(schema))
    if fmt == "avro":
        return problems
    registry, schemas = config.get("schema_registry"), config.get("schemas")
    if registry is None and schemas is None:
        problems.append("value_format 'confluent-avro' needs config 'schema_registry' (the registry's URL) or "
                        "'schemas' (the writer schemas by id)")
    if registry is not None:
        problem = registry_url_problem(registry, allowed_hosts)
        if problem:
            problems.append(f"config 'schema_registry' {problem}")
    if schemas is not None:
        try:
            given = schema_ids(schemas)
        except ValueError as exc:
            problems.append(f"config 'schemas' {exc}")
        else:
            for number, text in sorted(given.items()):
                problems.extend(f"config 'schemas' id {number}: {p}" for p in _schema_problems(text))
            if schema is None and registry is None and len(given) > 1:
                problems.append("config 'value_schema' is needed when 'schemas' gives more than one schema and "
                                "there is no registry: the schema every value is decoded into (its columns)")
    return problems


def _schema_problems(schema: Any) -> list[str]:
    if not isinstance(schema, (str, dict, list)):
        return [f"must be an Avro schema as JSON text, got {ids.echo(schema)}"]
    try:
        load_schema(schema)
    except AvroSchemaError as exc:
        return [str(exc)]
    return []
