"""The checks of what users pass to the DataStream DSL, and the conversions they share.

Every DSL call (`handles.py`, `datastream.py`, `streamreader.py`, `environment.py`) checks its
arguments here before it records an operator, so a mistake fails at the line that made it, with
a message naming the call: positive integers, labels, column names, SQL text, durations (to
milliseconds), paths (to absolute locations), ports, Spark options (to strings), the rows of
`from_collection`, and functions (to cloudpickle bytes, `sourcemap.dumps`; imported on first use).
Pure: no I/O but the current directory a relative path is resolved against.
"""

from __future__ import annotations

import datetime
import json
import os
from typing import Any, Mapping, Sequence

from funke.common import ids
from funke.common.graph.jobgraph import JobType


def _positive_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return value


def _location(path: object) -> str:
    """A file location as the cluster must see it: the JobManager and TaskManagers do not share
    the client's working directory, so a relative local path is made absolute here. URIs with a
    scheme (hdfs://, s3a://, file://) and globs are kept as written."""
    text = _non_empty_str(path, "path")
    return text if "://" in text else os.path.abspath(text)


def _label(value: object, what: str) -> str:
    problem = ids.label_problem(value, what)
    if problem is not None:
        raise ValueError(problem)
    return value  # type: ignore[return-value]


def _non_empty_str(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    return value


def _column_name(value: object, operation: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{operation}(): the column must be a non-empty name, got {value!r}")
    return value


def _millis(value: object, what: str) -> int:
    """A duration in whole milliseconds: Flink's syntax ("10 s", "1 min") or an int of ms."""
    from funke.common.durations import DurationError, parse_duration
    from funke.common.streaming.eventtime import MAX_DELAY_MS

    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"{what}: expected a duration such as \"10 s\" or a number of ms, got {value!r}")
    if isinstance(value, int):
        ms = value
    else:
        try:
            ms = round(parse_duration(value) * 1000)
        except DurationError as e:
            raise ValueError(f"{what}: {e}") from None
    if not 0 <= ms <= MAX_DELAY_MS:
        raise ValueError(f"{what}: must be between 0 and ten years, got {value!r}")
    return ms


def _signed_millis(value: object, what: str) -> int:
    """A duration that may be negative ("-5 min", or an int of ms)."""
    if isinstance(value, str) and value.strip().startswith("-"):
        return -_millis(value.strip()[1:], what)
    if isinstance(value, int) and not isinstance(value, bool) and value < 0:
        return -_millis(-value, what)
    return _millis(value, what)


def _job_type(value: str | JobType) -> JobType:
    if isinstance(value, JobType):
        return value
    if isinstance(value, str) and value.upper() in JobType.__members__:
        return JobType[value.upper()]
    raise ValueError(f"job_type must be \"batch\" or \"streaming\", got {value!r}")


def _output_schema(schema: object, operation: str) -> str:
    if schema is None:
        raise TypeError(
            f"{operation}() needs the schema of its output as a Spark DDL string, e.g. "
            f"{operation}(fn, schema=\"word string, n int\"): funke cannot infer what a Python "
            "function returns"
        )
    if not isinstance(schema, str) or not schema.strip():
        raise TypeError(f"{operation}(): schema must be a Spark DDL string such as \"word string\", got {schema!r}")
    return schema


def _sql(text: object, what: str) -> str:
    if not isinstance(text, str) or not text.strip():
        raise TypeError(f"{what} must be a non-empty SQL string, got {text!r}")
    return text


def _keys(on: str | Sequence[str], operation: str) -> tuple[str, ...]:
    keys = (on,) if isinstance(on, str) else tuple(on)
    if not keys or not all(isinstance(k, str) and k for k in keys):
        raise ValueError(f"{operation}() needs one or more column names, got {on!r}")
    if len(set(keys)) != len(keys):
        raise ValueError(f"{operation}(): a key column is repeated in {list(keys)}")
    return keys


def _port(port: object, what: str) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"{what}: port must be from 1 to 65535, got {port!r}")
    return port


def _db(db: object) -> int:
    if isinstance(db, bool) or not isinstance(db, int) or db < 0:
        raise ValueError(f"redis: db must be a database number from 0, got {db!r}")
    return db


def _pickled(fn: object, operation: str, need_callable: bool = True) -> bytes:
    if need_callable and not callable(fn):
        raise TypeError(f"{operation}() needs a function, got {type(fn).__name__}")
    from funke.common.api import sourcemap

    try:
        return sourcemap.dumps(fn)  # cloudpickle's payload; tracebacks keep the user's files and lines
    except Exception as exc:  # anything the function captures may refuse to pickle
        raise TypeError(
            f"{operation}(): the function cannot be serialised for the TaskManagers ({exc}); "
            "check what it captures (open files, locks, Spark sessions...)"
        ) from exc


def _option_text(value: object) -> str:
    """Option values as Flink's Configuration holds them: text."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime.timedelta):
        # Whole milliseconds when exact, else microseconds: Flink durations take no fractions.
        micros = round(value.total_seconds() * 1_000_000)
        return f"{micros // 1000} ms" if micros % 1000 == 0 else f"{micros} µs"
    if isinstance(value, (str, int, float)):
        return str(value)
    raise TypeError(f"option value must be a string, number, bool or timedelta, got {value!r}")


def _spark_options(options: Mapping[str, Any], where: str) -> dict[str, str]:
    """Spark reader/writer options as text (Spark turns them into strings anyway); None drops
    the option, so callers can pass optional settings through."""
    result: dict[str, str] = {}
    for key, value in options.items():
        if value is None:
            continue
        if isinstance(value, bool):
            result[key] = "true" if value else "false"
        elif isinstance(value, (str, int, float)):
            result[key] = str(value)
        else:
            raise TypeError(f"{where}: option {key!r} must be a string, number or bool, got {value!r}")
    return result


def _range_config(start: object, end: object, step: object) -> dict[str, int]:
    for what, value in (("start", start), ("end", end), ("step", step)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"range {what} must be an integer, got {value!r}")
    if step == 0:
        raise ValueError("range step must not be 0")
    return {"start": start, "end": end, "step": step}  # type: ignore[dict-item]


def _ddl_column_names(ddl: str) -> list[str]:
    """Top-level column names of a Spark DDL schema ("a int, b map<string,int>",
    "struct<a:int>", "`my col` string"): enough to order dict rows, not a full parser."""
    text = ddl.strip()
    if text.lower().startswith("struct<") and text.endswith(">"):
        text = text[len("struct<"):-1]
    fields: list[str] = []
    depth, quoted, start = 0, False, 0
    for i, ch in enumerate(text):
        if ch == "`":
            quoted = not quoted
        elif not quoted and ch in "<(":
            depth += 1
        elif not quoted and ch in ">)":
            depth -= 1
        elif not quoted and ch == "," and depth == 0:
            fields.append(text[start:i])
            start = i + 1
    fields.append(text[start:])
    names: list[str] = []
    for f in fields:
        f = f.strip()
        if f.startswith("`"):
            names.append(f[1:f.index("`", 1)] if "`" in f[1:] else f[1:])
        else:
            names.append(f.replace(":", " ").split()[0] if f else "")
    if not all(names):
        raise ValueError(f"cannot read the column names of schema {ddl!r}")
    return names


def _collection_row(row: object, columns: list[str], index: int) -> list[Any]:
    if isinstance(row, Mapping):
        unknown = [k for k in row if k not in columns]
        if unknown:
            raise ValueError(f"from_collection(): row {index} has columns {unknown} not in the schema {columns}")
        values = [row.get(c) for c in columns]
    elif isinstance(row, (tuple, list)):  # includes pyspark Rows, which are tuples
        values = list(row)
    else:
        values = [row]
    if len(values) != len(columns):
        raise ValueError(
            f"from_collection(): row {index} has {len(values)} value(s) but the schema has "
            f"{len(columns)} column(s) {columns}"
        )
    try:
        json.dumps(values, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"from_collection(): row {index} is not JSON-serialisable ({exc}); use JSON types, "
            "or generate()/read_* for other values"
        ) from None
    return values
