"""The JobManager side's registries of streaming sources and sinks, by operator kind: the query
shell (`funke.jobmanager.streamquery`) builds each source's and sink's side from here and never
switches on kinds. One line per plugin; the interfaces are in `base`."""

from __future__ import annotations

from typing import Callable

from funke.jobmanager.streaming.base import SinkContext, SinkSide, SourceContext, SourceSide
from funke.jobmanager.streaming.delta import DeltaPlanner
from funke.jobmanager.streaming.files import FilesPlanner
from funke.jobmanager.streaming.jsonlines import JsonLinesPlanner
from funke.jobmanager.streaming.kafka import KafkaPlanner
from funke.jobmanager.streaming.rate import RatePlanner
from funke.jobmanager.streaming.receiver import ReceiverPlanner
from funke.jobmanager.streaming.redis import RedisPlanner
from funke.jobmanager.streaming.sinks import CollectSink, DeltaSink, FileSink, KafkaSink, RedisSink

SOURCE_SIDES: dict[str, Callable[[SourceContext], SourceSide]] = {
    "source.rate": RatePlanner.open,
    "source.stream.text": FilesPlanner.open,
    "source.stream.csv": FilesPlanner.open,
    "source.stream.json": FilesPlanner.open,
    "source.stream.parquet": FilesPlanner.open,
    "source.socket": ReceiverPlanner.open,
    "source.redis": RedisPlanner.open,
    "source.stream.jsonlines": JsonLinesPlanner.open,
    "source.stream.delta": DeltaPlanner.open,
    "source.kafka": KafkaPlanner.open,
}

SINKS: dict[str, Callable[[SinkContext], SinkSide]] = {
    "sink.parquet": FileSink,
    "sink.csv": FileSink,
    "sink.json": FileSink,
    "sink.text": FileSink,
    "sink.collect": CollectSink,
    "sink.redis": RedisSink,
    "sink.delta": DeltaSink,
    "sink.kafka": KafkaSink,
}


def sink_side(kind: str, context: SinkContext) -> SinkSide:
    """A sink's side; sinks that commit nothing on the JobManager (print, foreach_batch, discard,
    noop) get the base one."""
    return SINKS.get(kind, SinkSide)(context)


__all__ = ["SINKS", "SOURCE_SIDES", "FilesPlanner", "JsonLinesPlanner", "RatePlanner", "ReceiverPlanner",
           "DeltaPlanner", "KafkaPlanner", "RedisPlanner", "SinkContext", "SinkSide", "SourceContext", "SourceSide", "sink_side"]
