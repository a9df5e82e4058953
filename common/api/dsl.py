"""The DataStream DSL: how users write funke jobs, the way they would in Flink or PySpark.

The DSL's classes live by what they build, and this module gathers them under the path job
files and funke's own code import them from (`funke.common.api.dsl`; the public package `funke`
re-exports them from their homes):

    environment.py   ExecutionEnvironment: the job's configuration, bounded sources, build()
    streamreader.py  StreamReader: the stream sources (`env.read_stream`)
    datastream.py    DataStream, KeyedStream, WindowedStream, WindowedDataStream: the operators
    handles.py       _OperatorHandle (per-operator settings), DataStreamSink, CollectSink
    arguments.py     the checks of what users pass, with the message they see

`build()` hands the operators it recorded to `translate.py`, which makes the `JobGraph` (chains,
vertex ids, edges). The DSL owns nothing about running a job: the operator kinds and their
configuration keys come from `graph/operators.py`, the rules a graph must satisfy from
`graph/validation.py`, and what each kind does from the TaskManager.

The DSL is pure (no I/O, no Spark): the client imports it to build a job before anything
else, so it must import fast. cloudpickle and the validator (networkx) are imported only when
they are first needed.

    env = ExecutionEnvironment("word count", parallelism=2)
    words = env.read_text("data/*.txt").flat_map(str.split, schema="word string")
    words.key_by("word").count().collect()
    job = env.build()

Calling convention of the Python functions given to `map`, `flat_map`, `filter`, `reduce` and
`generate` (implemented by the TaskManager): a record whose schema has a single column is passed
as the bare value (a line of text is a `str`); a record with several columns is passed as a
`pyspark.sql.Row`. Results follow the same rule against the declared output schema: a bare value
for a single-column schema, otherwise a `Row`, a tuple in schema order or a dict keyed by column
name. `flat_map` returns an iterable of such results, `filter` a truth value, `reduce(a, b)` one
record of the input's schema, and `generate`'s function receives the row number (an int).
`transform` functions take a whole `pyspark.sql.DataFrame` and return one.
"""

from __future__ import annotations

# Every name this module defined or imported from funke before the DSL was split (job files of
# 0.3.0 and common/moved.py's 0.2.0 alias import from here), from its new home.
from funke.common import ids  # noqa: F401
from funke.common.api.arguments import (  # noqa: F401
    _collection_row,
    _column_name,
    _db,
    _ddl_column_names,
    _job_type,
    _keys,
    _label,
    _location,
    _millis,
    _non_empty_str,
    _option_text,
    _output_schema,
    _pickled,
    _port,
    _positive_int,
    _range_config,
    _signed_millis,
    _spark_options,
    _sql,
)
from funke.common.api.datastream import (  # noqa: F401
    _JOIN_TYPES,
    _WRITE_MODES,
    DataStream,
    KeyedStream,
    WindowedDataStream,
    WindowedStream,
    _SinkT,
)
from funke.common.api.environment import ExecutionEnvironment
from funke.common.api.handles import UID_MAX_LENGTH, CollectSink, DataStreamSink, _OperatorHandle  # noqa: F401
from funke.common.api.streamreader import StreamReader
from funke.common.api.translate import (  # noqa: F401
    BATCH_SHUFFLE_MODE,
    OPERATOR_CHAINING,
    RECEIVERS_GROUP,
    Chaining,
    Exchange,
    ExchangeKind,
    Plan,
    Transformation,
    translate,
)
from funke.common.graph.jobgraph import (  # noqa: F401
    Artifact,
    FailoverStrategyKind,
    JobGraph,
    JobType,
    RestartStrategyConfig,
)
from funke.common.graph.operators import JOIN_TYPES, SINK_MODES  # noqa: F401
from funke.common.graph.streamingjob import (  # noqa: F401
    ALL_OUTPUT_MODES,
    OUTPUT_MODE,
    REDIS,
    SOCKET,
    STREAM_SOURCE_KINDS,
)
from funke.common.streaming.sources.delta import DELTA_MODES  # noqa: F401

__all__ = [
    "BATCH_SHUFFLE_MODE",
    "OPERATOR_CHAINING",
    "CollectSink",
    "DataStream",
    "DataStreamSink",
    "ExecutionEnvironment",
    "KeyedStream",
    "StreamReader",
    "WindowedDataStream",
    "WindowedStream",
]
