"""The stream sources of the DataStream DSL (`env.read_stream`): `StreamReader`'s rate, file,
JSON-lines, Delta, Redis Streams, Kafka and socket sources. Calling one makes the job a streaming query.

`ExecutionEnvironment` in the annotations is `environment.py`'s; it is not imported here
(environment.py imports this module).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from funke.common.api.arguments import _db, _location, _output_schema, _port, _positive_int, _spark_options
from funke.common.api.datastream import DataStream
from funke.common.api.translate import RECEIVERS_GROUP
from funke.common.graph.jobgraph import JobType
from funke.common.graph.streamingjob import REDIS, SOCKET


class StreamReader:
    """The unbounded sources of an ExecutionEnvironment (`env.read_stream`). Each micro-batch
    reads exactly the offset range its write-ahead log entry names, so a batch run again after a
    failure reads the same rows."""

    def __init__(self, env: ExecutionEnvironment):
        self._env = env

    def _stream(self, kind: str, name: str, config: dict[str, Any]) -> DataStream:
        self._env.job_type = JobType.STREAMING
        return self._env._source(kind, name, config)

    def rate(self, rows_per_second: int, max_rows_per_trigger: int | None = None) -> DataStream:
        """Rows `value` (bigint, 0, 1, 2, ...) and `timestamp` (when each row was due),
        `rows_per_second` of them (Spark's rate source); value i is read by subtask
        i % parallelism."""
        config: dict[str, Any] = {"rows_per_second": _positive_int(rows_per_second, "rows_per_second")}
        if max_rows_per_trigger is not None:
            config["max_rows_per_trigger"] = _positive_int(max_rows_per_trigger, "max_rows_per_trigger")
        return self._stream("source.rate", "Source: rate", config)

    def _files(self, fmt: str, path: str, schema: str | None, max_files_per_trigger: int | None,
               options: Mapping[str, Any]) -> DataStream:
        kind = f"source.stream.{fmt}"
        config: dict[str, Any] = {"path": _location(path)}
        if schema is not None:
            config["schema"] = _output_schema(schema, kind)
        if max_files_per_trigger is not None:
            config["max_files_per_trigger"] = _positive_int(max_files_per_trigger, "max_files_per_trigger")
        if spark_options := _spark_options(options, kind):
            config["options"] = spark_options
        return self._stream(kind, f"Source: {fmt} files", config)

    def text(self, path: str, max_files_per_trigger: int | None = None, **options: Any) -> DataStream:
        """Each new file in directory `path`, once, one record per line in column `value`. Write
        files elsewhere and rename them in: a file is taken as soon as it is listed."""
        return self._files("text", path, None, max_files_per_trigger, options)

    def csv(self, path: str, schema: str, header: bool = True, max_files_per_trigger: int | None = None,
            **options: Any) -> DataStream:
        return self._files("csv", path, schema, max_files_per_trigger, {"header": header, **options})

    def json(self, path: str, schema: str, max_files_per_trigger: int | None = None, **options: Any) -> DataStream:
        return self._files("json", path, schema, max_files_per_trigger, options)

    def parquet(self, path: str, schema: str, max_files_per_trigger: int | None = None, **options: Any) -> DataStream:
        return self._files("parquet", path, schema, max_files_per_trigger, options)

    def json_lines(self, path: str, schema: str, max_files_per_trigger: int | None = None) -> DataStream:
        """The lines of the JSON-lines files in directory `path`, read incrementally: lines
        appended to a file and new files are both taken (a line counts once its newline is
        written), each parsed into the columns of `schema`. Offsets are byte offsets per file, so
        a batch run again reads the same lines; write by appending. File i of a batch (by name)
        is read by subtask i % parallelism."""
        kind = "source.stream.jsonlines"
        config: dict[str, Any] = {"path": _location(path), "schema": _output_schema(schema, kind)}
        if max_files_per_trigger is not None:
            config["max_files_per_trigger"] = _positive_int(max_files_per_trigger, "max_files_per_trigger")
        return self._stream(kind, "Source: JSON lines", config)

    def delta(self, path: str, max_versions_per_trigger: int | None = None) -> DataStream:
        """A Delta table's versions as a stream (a local path or file:// URI): the first batch
        reads the table as it is, each later one the files the commits since the last batch
        added (at most `max_versions_per_trigger` versions a batch). Offsets are table versions,
        so a batch run again reads the same files. Appends only: a commit that deletes or
        rewrites data, or changes the schema, fails the query naming its version."""
        config: dict[str, Any] = {"path": _location(path)}
        if max_versions_per_trigger is not None:
            config["max_versions_per_trigger"] = _positive_int(max_versions_per_trigger, "max_versions_per_trigger")
        return self._stream("source.stream.delta", "Source: Delta stream", config)

    def redis(self, keys: str | Sequence[str], *, host: str = "127.0.0.1", port: int = 6379, db: int = 0,
              starting: str = "latest", max_entries_per_trigger: int | None = None) -> DataStream:
        """The entries of Redis stream keys (XADD'ed by anyone), as a broker source: columns
        `stream` (the key), `id`, `fields` (map<string,string>) and `timestamp` (the id's time).
        Offsets are entry ids per key; each batch reads exactly its logged id range (XRANGE), so
        a batch run again reads the same entries, as long as the stream was not trimmed past
        them. `starting`: "latest" (entries added from the query's start on; Spark's Kafka
        default) or "earliest"; `max_entries_per_trigger` per key. Key i is read by subtask
        i % parallelism."""
        keys = [keys] if isinstance(keys, str) else list(keys)
        if not keys or not all(isinstance(k, str) and k for k in keys) or len(set(keys)) != len(keys):
            raise ValueError(f"redis: keys must be distinct non-empty strings, got {keys!r}")
        if starting not in ("earliest", "latest"):
            raise ValueError(f"redis: starting must be 'earliest' or 'latest', got {starting!r}")
        config: dict[str, Any] = {"keys": keys, "host": host, "port": _port(port, "redis"), "db": _db(db),
                                  "starting": starting}
        if max_entries_per_trigger is not None:
            config["max_entries_per_trigger"] = _positive_int(max_entries_per_trigger, "max_entries_per_trigger")
        return self._stream(REDIS, f"Source: redis {', '.join(keys)}"[:200], config)

    def kafka(self, bootstrap: str, topics: str | Sequence[str] | None = None, *, pattern: str | None = None,
              starting: str | Mapping[str, Any] = "latest", max_offsets_per_trigger: int | None = None,
              fail_on_data_loss: bool = True, end_offsets: str = "list", value_format: str = "raw",
              value_schema: str | Mapping[str, Any] | None = None, schema_registry: str | None = None,
              schemas: Mapping[int, Any] | None = None, options: Mapping[str, Any] | None = None) -> DataStream:
        """The records of Kafka topics (`topics`, or every topic whose whole name matches the
        regular expression `pattern`, including topics created later), read by a Python consumer
        (confluent-kafka; no JVM), as Structured Streaming's Kafka source gives them: columns `key`
        and `value` (binary), `topic`, `partition`, `offset`, `timestamp`, `timestampType` and
        `headers` (array<struct<key string, value binary>>). Offsets are per partition; each batch
        reads exactly its logged offset range with assign + seek under read_committed (never a
        consumer group's commits), so a batch run again reads the same records, as long as
        retention did not delete them.

        `bootstrap`: "host:port[,host:port...]" (each host within funke.io.allowed-hosts).
        `starting`: "latest" (Spark's default), "earliest", {"timestamp": ms} or
        {topic: {partition: offset}} (-2: earliest, -1: latest; partitions not named start at the
        earliest); new partitions and topics start at their beginning. `max_offsets_per_trigger`:
        split over the partitions by what each holds. `fail_on_data_loss`: records deleted
        (retention) before the query read them fail the query, naming the partition and offsets;
        False skips them, counted in the progress records. `end_offsets`: "list" (ListOffsets: the
        last stable offset on Kafka) or "fetch" (what a fetch reports: for brokers whose ListOffsets
        is wrong, such as the Tansu test broker). `value_format`: "raw", "json" (`value_schema` a
        DDL string: the value's fields become columns in place of `value`; a value that is not JSON
        fails the batch, naming its topic, partition and offset), "avro" (`value_schema` the
        values' Avro schema) or "confluent-avro" (Confluent's framing, a schema id in each value:
        the writer schemas from `schema_registry`, a URL, or `schemas`, {id: schema}; decoded into
        `value_schema`). `options`: a few librdkafka consumer settings (fetch
        sizes, timeouts; never security settings) and funke.timeout.ms, how long any wait on the
        broker may take (30 s). Partition i of the sorted (topic, partition) pairs is read by
        subtask i % parallelism."""
        from funke.common.streaming import kafkasink
        from funke.common.streaming.sources import kafka as k

        def check(problem: str | None, what: str) -> None:
            if problem is not None:
                raise ValueError(f"kafka: {what} {problem}")

        try:
            kafkasink.bootstrap_servers(bootstrap)  # one rule for the source's and the sink's bootstrap
        except ValueError as exc:
            raise ValueError(f"kafka: bootstrap {exc}") from None
        config: dict[str, Any] = {"bootstrap": bootstrap}
        if (topics is None) == (pattern is None):
            raise ValueError("kafka: give topics (a name or a list of names) or pattern (a regular expression), "
                             "exactly one of them")
        if topics is not None:
            names = [topics] if isinstance(topics, str) else list(topics)
            check(k.topics_problem(names), "topics")
            config["topics"] = names
            shown = ", ".join(names)
        else:
            check(k.pattern_problem(pattern), "pattern")
            config["pattern"] = pattern
            shown = f"/{pattern}/"
        if isinstance(starting, Mapping) and "timestamp" not in starting:  # partitions as JSON keys: strings
            starting = {t: {str(p): o for p, o in ps.items()} if isinstance(ps, Mapping) else ps
                        for t, ps in starting.items()}
        elif isinstance(starting, Mapping):
            starting = dict(starting)
        check(k.starting_problem(starting), "starting")
        config["starting"] = starting
        if max_offsets_per_trigger is not None:
            config["max_offsets_per_trigger"] = _positive_int(max_offsets_per_trigger, "max_offsets_per_trigger")
        if not isinstance(fail_on_data_loss, bool):
            raise ValueError(f"kafka: fail_on_data_loss must be True or False, got {fail_on_data_loss!r}")
        config["fail_on_data_loss"] = fail_on_data_loss
        if end_offsets not in k.END_OFFSETS:
            raise ValueError(f"kafka: end_offsets must be one of {', '.join(map(repr, k.END_OFFSETS))}, got {end_offsets!r}")
        config["end_offsets"] = end_offsets
        if value_format not in k.VALUE_FORMATS:
            raise ValueError(f"kafka: value_format must be one of {', '.join(map(repr, k.VALUE_FORMATS))}, "
                             f"got {value_format!r}")
        config["value_format"] = value_format
        if value_schema is not None:
            check(k.value_schema_problem(value_schema), "value_schema")
            config["value_schema"] = value_schema if isinstance(value_schema, str) else dict(value_schema)
        if schemas is not None:
            if not isinstance(schemas, Mapping):
                raise ValueError(f"kafka: schemas must map schema ids to Avro schemas, got {schemas!r}")
            schemas = {str(key): v for key, v in schemas.items()}  # schema ids as JSON keys
            check(k.value_schema_problem(schemas), "schemas")
            config["schemas"] = schemas
        if schema_registry is not None:
            if not isinstance(schema_registry, str) or not schema_registry.startswith(("http://", "https://")):
                raise ValueError(f"kafka: schema_registry must be an http:// or https:// URL, got {schema_registry!r}")
            config["schema_registry"] = schema_registry
        if options:
            check(k.options_problem(dict(options)), "options")
            config["options"] = dict(options)
        from funke.common.streaming.sources import avro

        for problem in k.config_problems(config) + avro.config_problems(config):
            raise ValueError(f"kafka: {problem}")
        return self._stream(k.KAFKA, f"Source: kafka {shown}"[:200], config)

    def socket_text(self, host: str, port: int, *, receivers: int = 1, block_interval: str = "200 ms",
                    max_rate: int | None = None) -> DataStream:
        """Lines read from a TCP server, one record per line in column `value` (Spark Streaming's
        socketTextStream). Each of `receivers` long-running tasks (in slots of their own) holds a
        connection and stores what it reads every `block_interval` as a block in the checkpoint
        before it counts as received; each batch reads the blocks stored when it is planned.
        `max_rate`: at most this many lines a second per receiver (spark.streaming.receiver.maxRate);
        with the option streaming.backpressure.enabled, less when batches fall behind."""
        from funke.common.durations import DurationError, parse_duration

        if not isinstance(host, str) or not host:
            raise TypeError(f"socket_text: host must be a non-empty string, got {host!r}")
        port = _port(port, "socket_text")
        try:
            interval_ms = round(parse_duration(block_interval) * 1000)
        except DurationError as exc:
            raise ValueError(f"socket_text: block_interval: {exc}") from None
        if interval_ms < 10:
            raise ValueError(f"socket_text: block_interval must be at least 10 ms, got {block_interval!r}")
        config: dict[str, Any] = {"host": host, "port": port, "block_interval_ms": interval_ms}
        if max_rate is not None:
            config["max_rate"] = _positive_int(max_rate, "max_rate")
        stream = self._stream(SOCKET, f"Source: socket {host}:{port}", config)
        stream._t.parallelism = _positive_int(receivers, "receivers")
        stream._t.slot_sharing_group = RECEIVERS_GROUP
        return stream
