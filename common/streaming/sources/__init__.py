"""The streaming sources' registry: operator kind -> the source's common part (`base.SourcePlugin`:
its pure planning and what the runtime must know of it). One line per source; the JobManager's
and the TaskManager's parts are registered in `funke.jobmanager.streaming` and
`funke.taskmanager.streaming`."""

from __future__ import annotations

from funke.common.streaming.sources import delta, files, jsonlines, kafka, rate, receiver, redis
from funke.common.streaming.sources.base import BatchInput, SourcePlanning, SourcePlugin
from funke.common.streaming.sources.files import STREAM_FILE_KINDS, FilesSource, ListedFile
from funke.common.streaming.sources.kafka import KafkaSource
from funke.common.streaming.sources.rate import RateSource
from funke.common.streaming.sources.receiver import (
    BLOCK_SUFFIX,
    ReceiverSource,
    block_file_name,
    parse_block_file_name,
    receiver_blocks_dir,
    stored_blocks,
)
from funke.common.streaming.sources.redis import STARTINGS, RedisStreamsSource, stream_id

PLUGINS: tuple[SourcePlugin, ...] = (
    rate.PLUGIN,
    files.PLUGIN,
    receiver.PLUGIN,
    redis.PLUGIN,
    jsonlines.PLUGIN,
    delta.PLUGIN,
    kafka.PLUGIN,
)
SOURCE_PLUGINS: dict[str, SourcePlugin] = {kind: p for p in PLUGINS for kind in p.kinds}
RECEIVER_KINDS = frozenset(k for k, p in SOURCE_PLUGINS.items() if p.receiver)

__all__ = ["BLOCK_SUFFIX", "PLUGINS", "RECEIVER_KINDS", "SOURCE_PLUGINS", "STARTINGS", "STREAM_FILE_KINDS", "BatchInput",
           "FilesSource", "KafkaSource", "ListedFile", "RateSource", "ReceiverSource", "RedisStreamsSource", "SourcePlanning",
           "SourcePlugin", "block_file_name", "parse_block_file_name", "receiver_blocks_dir", "stored_blocks",
           "stream_id"]
