"""The job of the DataStream DSL: `ExecutionEnvironment` holds the job's configuration (restart and
failover strategies, options, trigger, checkpoint location, artifacts), its bounded sources
(`read_*`, `from_range`, `generate`, `from_collection`; the stream sources are `read_stream`'s,
`streamreader.py`), the operators every stream recorded, and `build()`, which hands them to
`translate.py` to make the `JobGraph` (then checked by `graph/validation.py`, imported on first
build). `execute()` and `execute_async()` go to the executor `execution.py` finds.
"""

from __future__ import annotations

import datetime
import json
from typing import Any, Callable, Iterable, Mapping, Self

from funke.common import ids
from funke.common.api.arguments import (
    _collection_row,
    _ddl_column_names,
    _job_type,
    _location,
    _non_empty_str,
    _option_text,
    _output_schema,
    _pickled,
    _positive_int,
    _range_config,
    _spark_options,
)
from funke.common.api.datastream import DataStream
from funke.common.api.streamreader import StreamReader
from funke.common.api.translate import OPERATOR_CHAINING, Exchange, Plan, Transformation, translate
from funke.common.graph.jobgraph import Artifact, FailoverStrategyKind, JobGraph, JobType, RestartStrategyConfig
from funke.common.graph.streamingjob import ALL_OUTPUT_MODES, OUTPUT_MODE


class ExecutionEnvironment:
    """Collects the operators and the job configuration, and builds the JobGraph.

    `job_type` is "batch" (every exchange BLOCKING) or "streaming" (PIPELINED); `parallelism`
    is the default for operators that do not set their own."""

    def __init__(self, name: str, job_type: str | JobType = "batch", parallelism: int = 1) -> None:
        self.name = _non_empty_str(name, "job name")
        self.job_type = _job_type(job_type)
        self.parallelism = _positive_int(parallelism, "parallelism")
        self._transformations: list[Transformation] = []
        self._sinks: list[Transformation] = []
        self._uids: dict[str, Transformation] = {}
        self._restart_strategy: RestartStrategyConfig | None = None
        self._failover_strategy: FailoverStrategyKind | None = None
        self._slot_request_timeout_s: float | None = None
        self._options: dict[str, str] = {}
        self._artifacts: dict[str, Artifact] = {}
        self._built_vertex_ids: dict[int, str] | None = None

    # ---- job configuration ----

    def set_parallelism(self, parallelism: int) -> Self:
        self.parallelism = _positive_int(parallelism, "parallelism")
        return self

    def set_restart_strategy(self, kind: str, **options: Any) -> Self:
        """Flink's strategy name and option suffixes as keywords, underscores for dashes:
        `set_restart_strategy("fixed-delay", attempts=3, delay="10 s")`. Durations are Flink
        duration strings ("10 s", "500 ms"; a bare number means milliseconds) or timedeltas."""
        from funke.common.graph.restart import RestartStrategyError, restart_strategy_from_config

        config = RestartStrategyConfig(
            _non_empty_str(kind, "restart strategy"),
            {key.replace("_", "-"): _option_text(value) for key, value in options.items()},
        )
        try:  # fail here, at the line that set it, rather than at build()
            restart_strategy_from_config(config)
        except RestartStrategyError as exc:
            raise ValueError(f"set_restart_strategy(): {exc}") from None
        self._restart_strategy = config
        return self

    def set_failover_strategy(self, kind: str | FailoverStrategyKind) -> Self:
        """Either "region" (restart only the failed pipelined region) or "full" (every task)."""
        try:
            self._failover_strategy = FailoverStrategyKind(kind.lower() if isinstance(kind, str) else kind)
        except ValueError:
            accepted = ", ".join(k.value for k in FailoverStrategyKind)
            raise ValueError(f"unknown failover strategy {kind!r} (accepted: {accepted})") from None
        return self

    def set_slot_request_timeout(self, seconds: float) -> Self:
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
            raise ValueError(f"slot request timeout must be a positive number of seconds, got {seconds!r}")
        self._slot_request_timeout_s = float(seconds)
        return self

    def set_option(self, key: str, value: Any) -> Self:
        """A Flink-style configuration option, stored as text (booleans as "true"/"false")."""
        self._options[_non_empty_str(key, "option key")] = _option_text(value)
        return self

    def set_output_mode(self, mode: str) -> Self:
        """What each batch of a streaming query emits (Structured Streaming's output modes):
        "append" (the default: each row once; queries without running aggregates), "update"
        (the keys a batch changed, with their new totals) or "complete" (every key's total, every
        batch). A query with a running count/aggregate must say update or complete."""
        if not isinstance(mode, str) or mode.strip().lower() not in ALL_OUTPUT_MODES:
            raise ValueError(f"output mode must be one of {', '.join(ALL_OUTPUT_MODES)}, got {mode!r}")
        return self.set_option(OUTPUT_MODE, mode.strip().lower())

    def set_watermark_policy(self, policy: str) -> Self:
        """How the query's watermark follows several watermarked inputs: "min" (default: the
        slowest input, so no input's rows are late because another ran ahead) or "max" (the
        fastest; Structured Streaming's spark.sql.streaming.multipleWatermarkPolicy)."""
        from funke.common.streaming.eventtime import POLICIES, WATERMARK_POLICY

        if not isinstance(policy, str) or policy.strip().lower() not in POLICIES:
            raise ValueError(f"set_watermark_policy(): expected one of {', '.join(POLICIES)}, got {policy!r}")
        self._options[WATERMARK_POLICY] = policy.strip().lower()
        return self

    def disable_operator_chaining(self) -> Self:
        """Every operator becomes its own JobVertex (Flink's pipeline.operator-chaining.enabled)."""
        return self.set_option(OPERATOR_CHAINING, False)

    def add_artifact(self, name: str, content: bytes) -> Self:
        """A file the job's code needs on the TaskManagers (a module, a zip, a lookup table)."""
        name = ids.require_path_id(_non_empty_str(name, "artifact name"), "artifact name")
        if not isinstance(content, (bytes, bytearray)):
            raise TypeError(f"artifact {name!r}: content must be bytes, got {type(content).__name__}")
        if name in self._artifacts:
            raise ValueError(f"artifact {name!r} is added twice")
        self._artifacts[name] = Artifact(name, bytes(content))
        return self

    # ---- sources ----

    def read_text(self, path: str, **options: Any) -> DataStream:
        """One record per line, in a single string column `value` (Spark's text source)."""
        return self._file_source("source.text", "Source: text", path, None, options)

    def read_parquet(self, path: str, **options: Any) -> DataStream:
        return self._file_source("source.parquet", "Source: parquet", path, None, options)

    def read_csv(self, path: str, schema: str | None = None, header: bool = True, **options: Any) -> DataStream:
        """CSV files; without a schema, columns are read as strings named from the header."""
        return self._file_source("source.csv", "Source: CSV", path, schema, {"header": header, **options})

    def read_json(self, path: str, schema: str | None = None, **options: Any) -> DataStream:
        """JSON Lines files; without a schema Spark infers one."""
        return self._file_source("source.json", "Source: JSON", path, schema, options)

    def read_delta(self, path: str, version: int | None = None,
                   timestamp: str | datetime.datetime | None = None) -> DataStream:
        """A Delta table (a local path or file:// URI) at `version`, or as of `timestamp` (the
        newest version committed at or before it; ISO 8601, UTC when it names no offset), or as
        it is when the job is submitted; its data files are split across the subtasks."""
        config: dict[str, Any] = {"path": _location(path)}
        if version is not None and timestamp is not None:
            raise ValueError("read_delta: give version or timestamp, not both")
        if version is not None:
            if isinstance(version, bool) or not isinstance(version, int) or version < 0:
                raise ValueError(f"read_delta: version must be an integer from 0, got {version!r}")
            config["version"] = version
        if timestamp is not None:
            config["timestamp"] = timestamp.isoformat() if isinstance(timestamp, datetime.datetime) else \
                _non_empty_str(timestamp, "read_delta: timestamp")
        return self._source("source.delta", "Source: Delta", config)

    def from_range(self, start: int, end: int | None = None, step: int = 1) -> DataStream:
        """The numbers [start, end) by `step` in a bigint column `id`; `from_range(n)` is 0..n-1."""
        if end is None:
            start, end = 0, start
        return self._source("source.range", "Source: range", _range_config(start, end, step))

    def generate(self, n: int, fn: Callable[[int], Any], schema: str) -> DataStream:
        """`n` records, record i being `fn(i)` in the given schema (a Spark DDL string)."""
        config = {**_range_config(0, n, 1), "schema": _output_schema(schema, "generate")}
        return self._source("source.range", "Source: generate", config, _pickled(fn, "generate"))

    def from_collection(self, rows: Iterable[Any], schema: str) -> DataStream:
        """A small in-memory data set that travels inside the job graph. Rows are tuples or
        lists in schema order, dicts keyed by column name, or bare values for a single column;
        values must be JSON types (str, int, float, bool, None, lists, dicts)."""
        schema = _output_schema(schema, "from_collection")
        columns = _ddl_column_names(schema)
        normalised = [_collection_row(row, columns, i) for i, row in enumerate(rows)]
        return self._source("source.collection", "Source: collection", {"rows": normalised, "schema": schema})

    # ---- streaming queries ----

    @property
    def read_stream(self) -> StreamReader:
        """Unbounded sources: reading one makes this a streaming query, run as micro-batches
        (`env.read_stream.rate(100)`, `env.read_stream.csv("incoming/", "user string, n int")`)."""
        return StreamReader(self)

    def set_trigger(self, processing_time: str | None = None, *, available_now: bool = False,
                    once: bool = False) -> Self:
        """When micro-batches run: every `processing_time` ("1 s", "500 ms"; the default, 1 s),
        `available_now` (what the sources hold at the start, in batches within their limits,
        then the job FINISHES) or `once` (one batch of everything, then FINISHED)."""
        from funke.common.graph import streamingjob as sj

        chosen = [name for name, on in (("processing_time", processing_time is not None),
                                        ("available_now", available_now), ("once", once)) if on]
        if len(chosen) != 1:
            raise ValueError(f"set_trigger(): give exactly one of processing_time, available_now, once; got {chosen or 'none'}")
        self._options.pop(sj.INTERVAL, None)
        if processing_time is not None:
            self._options[sj.TRIGGER] = "processing-time"
            self._options[sj.INTERVAL] = _option_text(processing_time)
        else:
            self._options[sj.TRIGGER] = "available-now" if available_now else "once"
        return self

    def set_checkpoint_location(self, path: str) -> Self:
        """Where the query keeps its offset and commit logs; a query started again on it goes on
        where it stopped (default: under the JobManager's data directory, by job name)."""
        from funke.common.graph import streamingjob as sj

        self._options[sj.CHECKPOINT] = _location(path)
        return self

    # ---- building ----

    def build(self) -> JobGraph:
        """The JobGraph for every operator that leads to a sink, validated. Operators whose
        results reach no sink are left out, as Spark leaves out what no action needs."""
        from funke.common.graph.validation import validate

        job, vertex_ids = translate(self.logical_plan())
        validate(job)
        self._built_vertex_ids = vertex_ids
        return job

    def execute(self, job_name: str | None = None, **options: Any) -> Any:
        """Build the job, run it and wait until it ends (PyFlink's `env.execute()`). Returns a
        JobExecutionResult (status, duration, metrics, and the rows of `collect()` sinks through
        `.collect()`, `.to_arrow()`, `.to_pandas()`); raises JobFailed if the job did not finish.

        Where it runs: `jobmanager="HOST:PORT"`, else $FUNKE_JOBMANAGER, else the local cluster
        (`funke cluster start`), else an embedded mini cluster that this process starts on first
        use and that ends with it. Under `funke submit`, the cluster that command names."""
        from funke.common.api.execution import current_executor

        if job_name is not None:
            self.name = _non_empty_str(job_name, "job name")
        return current_executor().execute(self.build(), wait=True, **options)

    def execute_async(self, job_name: str | None = None, **options: Any) -> Any:
        """Submit the job and return at once with a JobClient (PyFlink's shape: `get_job_id()`,
        `get_job_status()`, `cancel()`, `get_job_execution_result()`; for a streaming query also
        `stop(drain=...)`, `progress()` and `batches()`). Runs where `execute` would."""
        from funke.common.api.execution import current_executor

        if job_name is not None:
            self.name = _non_empty_str(job_name, "job name")
        return current_executor().execute(self.build(), wait=False, **options)

    def logical_plan(self) -> Plan:
        """The operators and the configuration as they stand: what `build` translates."""
        return Plan(self.name, self.job_type, self.parallelism, tuple(self._transformations), tuple(self._sinks),
                    frozenset(self._uids), dict(self._options), self._restart_strategy, self._failover_strategy,
                    self._slot_request_timeout_s, tuple(self._artifacts.values()))

    # ---- internals used by the handles ----

    def _add(self, kind: str, name: str, config: dict[str, Any], function: bytes = b"", *,
             inputs: tuple[tuple[Transformation, Exchange | None], ...] = ()) -> Transformation:
        try:  # configs travel as JSON; fail at the call that made one that is not
            json.dumps(config, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{name}: configuration is not JSON-serialisable: {exc}") from None
        t = Transformation(len(self._transformations), kind, name, config, function, inputs)
        self._transformations.append(t)
        return t

    def _source(self, kind: str, name: str, config: dict[str, Any], function: bytes = b"") -> DataStream:
        return DataStream(self, self._add(kind, name, config, function))

    def _file_source(self, kind: str, name: str, path: str, schema: str | None,
                     options: Mapping[str, Any]) -> DataStream:
        config: dict[str, Any] = {"path": _location(path)}
        if schema is not None:
            config["schema"] = _output_schema(schema, kind)
        if spark_options := _spark_options(options, kind):
            config["options"] = spark_options
        return self._source(kind, name, config)

    def _register_uid(self, t: Transformation, uid: str) -> None:
        owner = self._uids.get(uid)
        if owner is not None and owner is not t:
            raise ValueError(f"uid {uid!r} is already used by operator {owner.name!r}; uids must be unique in a job")
        if t.uid is not None:
            del self._uids[t.uid]
        t.uid = uid
        self._uids[uid] = t

    def _check_same_env(self, other: object, operation: str) -> None:
        if not isinstance(other, DataStream):
            raise TypeError(f"{operation}() takes DataStreams, got {type(other).__name__}")
        if other._env is not self:
            raise ValueError(f"{operation}(): the streams belong to different ExecutionEnvironments")

    def _vertex_id_of(self, t: Transformation) -> str:
        if self._built_vertex_ids is not None and t.seq in self._built_vertex_ids:
            return self._built_vertex_ids[t.seq]
        return translate(self.logical_plan())[1][t.seq]
