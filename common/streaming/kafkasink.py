"""The Kafka sink's rules, pure: its configuration (bootstrap servers, topic, key and value
columns, delivery guarantee) and the names and numbers that make a batch's commit happen once.

A sink writes the rows of each batch (of a streaming query; of the whole job for a bounded one)
as records of one topic: the `value` column is the record's value, the `key` column (if any) its
key, each a string (written as UTF-8) or binary column; a null value is a tombstone (no value).

Exactly once (the default): the JobMaster produces a batch's rows in one Kafka transaction whose
`transactional.id` is `funke-<owner>-<sink vertex>` (the owner: the streaming query's id, which
its checkpoint keeps across runs and jobs; a bounded job's id), and commits in the same
transaction the batch's marker: an offset of the consumer group `funke-sink-<owner>-<sink vertex>`
on (topic, partition 0) equal to the batch id + 1, its metadata naming the owner and the batch.
Kafka makes the records and the offset visible together or not at all, so the group's committed
offset says which batches are in: batch b is in once it is above b (`is_in`).

The JobManager side is `funke.jobmanager.kafkasink`; the tasks stage the rows
(`funke.taskmanager.operators.sinks`).
"""

from __future__ import annotations

import json
import re

from funke.common import ids

KAFKA_SINK = "sink.kafka"
EXACTLY_ONCE = "exactly_once"
AT_LEAST_ONCE = "at_least_once"
GUARANTEES = (EXACTLY_ONCE, AT_LEAST_ONCE)

# What the tasks stage: the key and value columns, renamed so (whatever the stream calls them)
KEY_COLUMN = "key"
VALUE_COLUMN = "value"

# Kafka's own rule for topic names (kafka.common.internals.Topic): ASCII letters, digits, '.',
# '_' and '-', at most 249 characters, neither "." nor "..".
MAX_TOPIC_LENGTH = 249
_TOPIC = re.compile(r"[A-Za-z0-9._-]+")
_PORT = re.compile(r"[0-9]{1,5}")
MAX_BOOTSTRAP_SERVERS = 64
MAX_BOOTSTRAP_LENGTH = 4096
MARKER_PARTITION = 0  # every topic has it


def topic_problem(value: object) -> str | None:
    """Why `value` is not a Kafka topic name (None if it is)."""
    if not isinstance(value, str) or not value:
        return f"must be a Kafka topic name, got {ids.echo(value)}"
    if len(value) > MAX_TOPIC_LENGTH:
        return f"is a topic name of {len(value)} characters; Kafka takes at most {MAX_TOPIC_LENGTH}"
    if not _TOPIC.fullmatch(value) or value in (".", ".."):
        return (f"{ids.echo(value)} is not a Kafka topic name: ASCII letters, digits, '.', '_' and '-' only "
                "(and not '.' or '..')")
    return None


def bootstrap_servers(value: object) -> list[tuple[str, int]]:
    """The (host, port) pairs of a bootstrap list "host:port[,host:port...]" (an IPv6 address in
    brackets: "[::1]:9092"); ValueError naming what is wrong. Hosts are returned as written, the
    brackets of an IPv6 address removed; whether they are host names is the caller's rule."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"must be bootstrap servers 'host:port[,host:port...]', got {ids.echo(value)}")
    if len(value) > MAX_BOOTSTRAP_LENGTH:
        raise ValueError(f"has {len(value)} characters; at most {MAX_BOOTSTRAP_LENGTH}")
    items = [item.strip() for item in value.split(",")]
    if len(items) > MAX_BOOTSTRAP_SERVERS:
        raise ValueError(f"names {len(items)} servers; at most {MAX_BOOTSTRAP_SERVERS}")
    servers = []
    for item in items:
        host, sep, port = item.rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        elif ":" in host:
            host = ""  # an IPv6 address needs its brackets, or its port is ambiguous
        if not sep or not host or not _PORT.fullmatch(port) or not 1 <= int(port) <= 65535:
            raise ValueError(f"{ids.echo(item)} is not 'host:port' (a port from 1 to 65535; an IPv6 address in "
                             "brackets, e.g. '[::1]:9092')")
        servers.append((host, int(port)))
    return servers


def transactional_id(owner_id: str, vertex_id: str) -> str:
    """The producer's transactional id: one per query (or bounded job) and sink, the same in
    every run, so a run's `init_transactions` fences the run before it and ends its transaction."""
    return f"funke-{owner_id}-{vertex_id}"


def marker_group(owner_id: str, vertex_id: str) -> str:
    """The consumer group whose committed offset on (topic, 0) says which batches are in."""
    return f"funke-sink-{owner_id}-{vertex_id}"


def marker_offset(batch_id: int) -> int:
    """The offset a batch's transaction commits for the marker group: every batch below it is in."""
    if isinstance(batch_id, bool) or not isinstance(batch_id, int) or batch_id < 0:
        raise ValueError(f"a batch id is a non-negative integer, got {ids.echo(batch_id)}")
    return batch_id + 1


def marker_metadata(owner_id: str, vertex_id: str, batch_id: int) -> str:
    """What the marker's offset commit carries: who committed which batch (for a person reading
    the group's offsets; the offset alone decides)."""
    return json.dumps({"funke": "sink.kafka", "owner": owner_id, "sink": vertex_id, "batch": batch_id},
                      separators=(",", ":"))


def is_in(committed_offset: int | None, batch_id: int) -> bool:
    """Whether the marker group's committed offset (None or negative: none committed) says that
    batch `batch_id` was committed. Batches commit in order, so an offset above the batch's id
    means it is in."""
    return committed_offset is not None and committed_offset >= marker_offset(batch_id)
