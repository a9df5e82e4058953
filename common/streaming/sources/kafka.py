"""Kafka topics as a stream source, pure planning (Structured Streaming's KafkaMicroBatchStream):
which partitions a query reads, where it starts, how far each batch goes, what was lost, and the
rules of the source's configuration.

The offset (what the offset log holds, JSON) is `{topic: {str(partition): next offset}}`, every
partition the query reads; a batch's range for a partition is [start offset, end offset): the
end is the offset the next batch starts at. Tasks read their partitions with assign + seek and
stop at the end, never through a consumer group's commits, so a batch run again reads the same
records (as long as retention did not delete them).

- **Where a query starts** (its first batch has no start offset): "earliest" (each partition's
  low watermark), "latest" (its end), `{"timestamp": ms}` (the first record at or after that
  time; the end where there is none) or `{topic: {partition: offset}}` (-2 earliest, -1 latest,
  partitions not named start at the earliest). The JobManager resolves them once and keeps them
  in the checkpoint (as Spark keeps its initial offsets), so a first batch run again begins
  where it began.
- **New partitions and topics** (a topic created later that matches the pattern) start at their
  beginning, offset 0.
- **Data loss** (a start offset below the partition's low watermark: retention deleted records
  the query had not read; a partition that is gone; an end offset before the start: the topic
  was created again) is an error naming the partition and the offsets, or with
  `fail_on_data_loss=False` a skip, counted.
- **The per-trigger limit** `max_offsets_per_trigger` is split over the partitions in
  proportion to what each holds, as Spark's `rateLimit` splits it (a partition with anything
  gets at least one offset).
- **The subtasks** split the partitions: the sorted (topic, partition) pairs of a batch's end,
  pair i to subtask i % parallelism.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from funke.common.ids import echo as _echo
from funke.common.streaming.checkpoint import SourceRange
from funke.common.streaming.sources.base import SourcePlugin

KAFKA = "source.kafka"
STARTINGS = ("earliest", "latest")
END_OFFSETS = ("list", "fetch")  # ListOffsets (the last stable offset on Kafka) | what a fetch reports (Tansu)
VALUE_FORMATS = ("raw", "json", "avro", "confluent-avro")
EARLIEST, LATEST = -2, -1  # in a per-partition starting offset, as Spark's startingOffsets JSON says

MAX_TOPICS = 1000
MAX_TOPIC_LENGTH = 249  # Kafka's own limit
MAX_PATTERN_LENGTH = 1000
MAX_PARTITIONS = 100_000  # partitions named in a starting offset, or read by one query
MAX_PARTITION = 2**31 - 1
MAX_OFFSET = 2**63 - 1
MAX_SCHEMA_CHARS = 1024 * 1024
DEFAULT_TIMEOUT_MS = 30_000  # every wait on the broker (metadata, offsets, a partition reaching its end)
MIN_TIMEOUT_MS, MAX_TIMEOUT_MS = 100, 3_600_000
TIMEOUT_OPTION = "funke.timeout.ms"

_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
# a quantified group that holds a quantifier itself: (a+)+, (a|b*)*, (x{2,}){3} ... can take
# time exponential in a topic name's length to fail to match (Python's re has no timeout)
_NESTED_QUANTIFIER = re.compile(r"\((?:[^()\\]|\\.)*[+*}](?:[^()\\]|\\.)*\)\s*[+*{?]")

# librdkafka consumer settings a query may give in `options` (what each holds); anything else,
# security settings above all, is refused without echoing its value
OPTION_TYPES: dict[str, str] = {
    "client.id": "str", "client.rack": "str", "broker.address.family": "str",
    "fetch.min.bytes": "int", "fetch.max.bytes": "int", "fetch.wait.max.ms": "int",
    "max.partition.fetch.bytes": "int", "fetch.error.backoff.ms": "int", "message.max.bytes": "int",
    "receive.message.max.bytes": "int", "queued.min.messages": "int", "queued.max.messages.kbytes": "int",
    "socket.timeout.ms": "int", "socket.receive.buffer.bytes": "int", "socket.keepalive.enable": "bool",
    "socket.nagle.disable": "bool", "reconnect.backoff.ms": "int", "reconnect.backoff.max.ms": "int",
    "topic.metadata.refresh.interval.ms": "int", "metadata.max.age.ms": "int", "check.crcs": "bool",
    TIMEOUT_OPTION: "int",
}
_FAMILIES = ("any", "v4", "v6")

TopicPartition = tuple[str, int]


class KafkaDataLoss(ValueError):
    """Records the query had not read are gone (the message names each partition and offsets)."""


# ------------------------------------------------------------------------------ configuration rules


def topic_problem(value: object) -> str | None:
    if not isinstance(value, str) or not _TOPIC.fullmatch(value) or value in (".", ".."):
        return (f"must be a Kafka topic name (1 to {MAX_TOPIC_LENGTH} letters, digits, '.', '_' or '-'), "
                f"got {_echo(value)}")
    return None


def topics_problem(value: object) -> str | None:
    if not isinstance(value, list) or not value or len(value) > MAX_TOPICS:
        return f"must be a non-empty list of at most {MAX_TOPICS} topic names, got {_echo(value)}"
    problem = next((p for p in map(topic_problem, value) if p), None)
    if problem is None and len(set(value)) != len(value):
        return f"names a topic twice: {_echo(value)}"
    return problem


def pattern_problem(value: object) -> str | None:
    if not isinstance(value, str) or not value or len(value) > MAX_PATTERN_LENGTH or not value.isprintable():
        return f"must be a regular expression of 1 to {MAX_PATTERN_LENGTH} printable characters, got {_echo(value)}"
    try:
        re.compile(value)
    except re.error as exc:
        return f"{_echo(value)} is not a regular expression ({exc})"
    if _NESTED_QUANTIFIER.search(value):
        return (f"{_echo(value)} repeats a group that holds a repetition itself (such as (a+)+), which can take "
                "exponential time to match; write it without the nesting")
    return None


def starting_problem(value: object) -> str | None:
    """'earliest', 'latest', {"timestamp": ms} or {topic: {partition: offset}} (offset -2:
    earliest, -1: latest)."""
    if value in STARTINGS:
        return None
    if not isinstance(value, Mapping) or not value:
        return f"must be 'earliest', 'latest', {{\"timestamp\": ms}} or {{topic: {{partition: offset}}}}, got {_echo(value)}"
    if "timestamp" in value:
        ms = value["timestamp"]
        if len(value) != 1 or not _is_int(ms) or not 0 <= ms <= MAX_OFFSET:
            return f"{{\"timestamp\": ms}} takes one time in milliseconds since the epoch (0 or more), got {_echo(value)}"
        return None
    named = 0
    for topic, partitions in value.items():
        problem = topic_problem(topic)
        if problem is not None:
            return f"names a topic that {problem}"
        if not isinstance(partitions, Mapping) or not partitions:
            return f"topic {topic!r}: must map partitions to offsets, got {_echo(partitions)}"
        for partition, offset in partitions.items():
            if _partition(partition) is None:
                return f"topic {topic!r}: {_echo(partition)} is not a partition number (0 to {MAX_PARTITION})"
            if not _is_int(offset) or not EARLIEST <= offset <= MAX_OFFSET:
                return (f"topic {topic!r} partition {partition}: the offset must be an integer from 0 "
                        f"(or -2: earliest, -1: latest), got {_echo(offset)}")
        named += len(partitions)
        if named > MAX_PARTITIONS:
            return f"names more than {MAX_PARTITIONS} partitions"
    return None


def options_problem(value: object) -> str | None:
    if not isinstance(value, Mapping):
        return f"must be an object of librdkafka settings, got {type(value).__name__}"
    for key, item in value.items():
        kind = OPTION_TYPES.get(key) if isinstance(key, str) else None
        if kind is None:  # the key only, never the value: it may be a secret
            allowed = ", ".join(sorted(OPTION_TYPES))
            return f"setting {_echo(key)} is not one a query may give (allowed: {allowed})"
        if kind == "int" and (not _is_int(item) or not 0 <= item <= 2**31 - 1):
            return f"setting {key!r} must be an integer from 0 to {2**31 - 1}, got {_echo(item)}"
        if kind == "bool" and not isinstance(item, bool):
            return f"setting {key!r} must be true or false, got {_echo(item)}"
        if kind == "str" and (not isinstance(item, str) or not 1 <= len(item) <= 255 or not item.isprintable()):
            return f"setting {key!r} must be printable text of 1 to 255 characters, got {_echo(item)}"
        if key == "broker.address.family" and item not in _FAMILIES:
            return f"setting {key!r} must be one of {', '.join(_FAMILIES)}, got {_echo(item)}"
        if key == TIMEOUT_OPTION and not MIN_TIMEOUT_MS <= item <= MAX_TIMEOUT_MS:
            return f"setting {key!r} must be from {MIN_TIMEOUT_MS} to {MAX_TIMEOUT_MS} ms, got {item}"
    return None


def value_schema_problem(value: object) -> str | None:
    """A DDL string (json), an Avro schema (JSON text or object), or per schema id an Avro schema
    (confluent-avro); which one the format takes is `config_problems`'."""
    try:
        size = len(value) if isinstance(value, str) else len(json.dumps(value))
    except (TypeError, ValueError, RecursionError):
        return f"must be a schema string or object, got {type(value).__name__}"
    if not isinstance(value, (str, Mapping, list)) or not value:
        return f"must be a non-empty schema string or object, got {_echo(value)}"
    if size > MAX_SCHEMA_CHARS:
        return f"has {size:,} characters; at most {MAX_SCHEMA_CHARS:,}"
    if isinstance(value, str) and "\x00" in value:
        return "contains a NUL character"
    return None


def config_problems(config: Mapping[str, Any]) -> list[str]:
    """The rules of a Kafka source's configuration beyond each key's type."""
    problems = []
    topics, pattern = config.get("topics"), config.get("pattern")
    if (topics is None) == (pattern is None):
        problems.append("give config 'topics' (a list of topic names) or 'pattern' (a regular expression), "
                        "exactly one of them")
    starting = config.get("starting")
    if isinstance(starting, Mapping) and "timestamp" not in starting and starting_problem(starting) is None:
        if isinstance(topics, list):
            strangers = sorted(set(starting) - set(map(str, topics)))
            if strangers:
                problems.append(f"config 'starting' names topics the query does not read: {', '.join(strangers[:20])}")
        elif isinstance(pattern, str) and pattern_problem(pattern) is None:
            strangers = sorted(t for t in starting if not re.fullmatch(pattern, t))
            if strangers:
                problems.append(f"config 'starting' names topics the pattern does not match: {', '.join(strangers[:20])}")
    fmt = config.get("value_format", "raw")
    schema = config.get("value_schema")
    if fmt == "json" and not isinstance(schema, str):
        problems.append("value_format 'json' needs config 'value_schema': a DDL string such as 'id bigint, name string'")
    if fmt == "raw" and schema is not None:
        problems.append("value_format 'raw' takes no 'value_schema' (give the value_format it is for)")
    # the Avro settings' rules (schemas parse, the registry's URL and host, which keys go with
    # which format) are funke.common.streaming.sources.avro's config_problems
    return problems


# ------------------------------------------------------------------------------ offsets


def parse_offsets(offset: Any, what: str = "Kafka offset") -> dict[TopicPartition, int]:
    """An offset `{topic: {str(partition): offset}}` as a map by (topic, partition)."""
    if not isinstance(offset, Mapping):
        raise ValueError(f"not a {what} ({{topic: {{partition: offset}}}}): {_echo(offset)}")
    out: dict[TopicPartition, int] = {}
    for topic, partitions in offset.items():
        if topic_problem(topic) is not None or not isinstance(partitions, Mapping):
            raise ValueError(f"not a {what}: topic {_echo(topic)} -> {_echo(partitions)}")
        for p, o in partitions.items():
            number = _partition(p)
            if number is None or not _is_int(o) or not 0 <= o <= MAX_OFFSET:
                raise ValueError(f"not a {what}: topic {topic!r} partition {_echo(p)} -> {_echo(o)}")
            out[(topic, number)] = o
    return out


def offsets_json(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """The JSON form of an offset, topics and partitions in order."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), o in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = int(o)
    return out


def initial_offsets(starting: Any, partitions: Sequence[TopicPartition], lows: Mapping[TopicPartition, int],
                    ends: Mapping[TopicPartition, int], by_time: Mapping[TopicPartition, int | None] | None = None
                    ) -> dict[str, dict[str, int]]:
    """Where a query without offsets starts in each partition it reads now: `lows`, `ends`
    (what the JobManager side observed; a low not known is 0) and, for a timestamp, `by_time`
    (the offset of the first record at or after it; None: none, the end)."""
    out: dict[TopicPartition, int] = {}
    for tp in partitions:
        low, end = lows.get(tp, 0), ends[tp]
        if starting == "earliest":
            out[tp] = low
        elif starting == "latest":
            out[tp] = end
        elif isinstance(starting, Mapping) and "timestamp" in starting:
            found = (by_time or {}).get(tp)
            out[tp] = end if found is None or found < 0 else found
        elif isinstance(starting, Mapping):
            given = starting.get(tp[0], {})
            o = given.get(str(tp[1]), given.get(tp[1], EARLIEST)) if isinstance(given, Mapping) else EARLIEST
            out[tp] = low if o == EARLIEST else end if o == LATEST else int(o)
        else:
            raise ValueError(f"starting must be 'earliest', 'latest' or offsets, got {_echo(starting)}")
    return offsets_json(out)


def rate_limit(limit: int, begins: Mapping[TopicPartition, int], ends: Mapping[TopicPartition, int]
               ) -> dict[TopicPartition, int]:
    """Spark's `rateLimit`: `limit` offsets split over the partitions in proportion to what each
    holds (end - begin); a partition's share is rounded down, but up to 1 when it is below 1,
    so that small partitions are not starved (the sum may pass the limit by a few)."""
    sizes = {tp: end - begins[tp] for tp, end in ends.items() if end - begins[tp] > 0}
    total = float(sum(sizes.values()))
    if total < 1:
        return dict(ends)
    out = {}
    for tp, end in ends.items():
        if tp not in sizes:
            out[tp] = end
            continue
        prorate = limit * (sizes[tp] / total)
        share = math.ceil(prorate) if prorate < 1 else math.floor(prorate)
        out[tp] = min(end, begins[tp] + share)
    return out


@dataclass(frozen=True, slots=True)
class KafkaObservation:
    """What the JobManager side saw for one batch: per partition of the topics the query reads
    now, its end (the offset after the last record a read_committed consumer may read) and, where
    known, its low watermark (the first offset retention kept); and, for a query without
    offsets, where it starts (`initial_offsets`, kept in the checkpoint)."""
    ends: Mapping[TopicPartition, int]
    lows: Mapping[TopicPartition, int] = field(default_factory=dict)
    initial: Mapping[str, Mapping[str, int]] | None = None


@dataclass(frozen=True, slots=True)
class KafkaPlan:
    range: SourceRange
    skipped: dict[TopicPartition, int]  # offsets lost to retention, per partition (fail_on_data_loss=False)
    losses: tuple[str, ...]  # what was lost, one line each (logged)
    available: dict[TopicPartition, int]  # each partition's end now (the lag is the distance to the range's end)


@dataclass(frozen=True, slots=True)
class PartitionRange:
    """What one partition contributes to a batch: offsets [begin, end)."""
    topic: str
    partition: int
    begin: int
    end: int

    def encode(self) -> str:
        # '/' is in no topic name (letters, digits, '.', '_', '-')
        return f"{self.topic}/{self.partition}/{self.begin}/{self.end}"

    @classmethod
    def decode(cls, text: str) -> "PartitionRange":
        try:
            topic, partition, begin, end = text.rsplit("/", 3)
            out = cls(topic, int(partition), int(begin), int(end))
        except (AttributeError, ValueError):
            raise ValueError(f"not a Kafka partition range 'topic/partition/begin/end': {_echo(text)}") from None
        if topic_problem(topic) is not None or not 0 <= out.partition <= MAX_PARTITION or out.begin < 0 or out.end < 0:
            raise ValueError(f"not a Kafka partition range 'topic/partition/begin/end': {_echo(text)}")
        return out


@dataclass(frozen=True, slots=True)
class KafkaSource:
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    starting: Any = "latest"
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True

    def __post_init__(self) -> None:
        if bool(self.topics) == (self.pattern is not None):
            raise ValueError("a Kafka source reads topics or a pattern, exactly one of them")
        for problem in (topics_problem(list(self.topics)) if self.topics else None,
                        pattern_problem(self.pattern) if self.pattern is not None else None,
                        starting_problem(self.starting)):
            if problem is not None:
                raise ValueError(problem)
        if self.max_offsets_per_trigger is not None and self.max_offsets_per_trigger < 1:
            raise ValueError(f"max_offsets_per_trigger must be at least 1, got {self.max_offsets_per_trigger}")

    def subscribed(self, topic_names: Sequence[str]) -> list[str]:
        """Of the topics there are, the ones the query reads: those of its list, or those its
        pattern matches whole (not the broker's internal topics, `__...`)."""
        if self.pattern is None:
            return sorted(set(self.topics) & set(topic_names))
        matcher = re.compile(self.pattern)
        return sorted(t for t in set(topic_names) if not t.startswith("__") and matcher.fullmatch(t))

    def missing(self, topic_names: Sequence[str]) -> list[str]:
        """The listed topics that do not exist."""
        return sorted(set(self.topics) - set(topic_names))

    def begins(self, start: Any, initial: Mapping[str, Mapping[str, int]] | None) -> dict[TopicPartition, int]:
        """Per partition named, where a range after `start` begins: the start offset's; for the
        query's first batch, its initial offsets."""
        if start is not None:
            return parse_offsets(start, "Kafka start offset")
        if initial is None:
            raise ValueError("the Kafka source's first batch needs the query's initial offsets")
        return parse_offsets(initial, "Kafka initial offset")

    def plan(self, start: Any, observed: KafkaObservation, limited: bool = True, cap: Any = None) -> SourceRange:
        return self.plan_batch(start, observed, limited, cap).range

    def plan_batch(self, start: Any, observed: KafkaObservation, limited: bool = True, cap: Any = None) -> KafkaPlan:
        """The range after `start`: per partition there is now, from where the last range ended
        (a new partition: from 0) up to its end, within the per-trigger limit if `limited`, not
        past `cap` (partitions the cap does not name get nothing). Data loss raises
        `KafkaDataLoss`, or with fail_on_data_loss=False is skipped and counted."""
        begins = self.begins(start, observed.initial)
        ceiling = parse_offsets(cap, "Kafka offset cap") if cap is not None else None
        losses: list[str] = []
        skipped: dict[TopicPartition, int] = {}
        for topic, partition in sorted(set(begins) - set(observed.ends)):
            losses.append(f"topic {topic!r} partition {partition} is gone (deleted?): the query had read it up to "
                          f"offset {begins[(topic, partition)]}")
        firsts: dict[TopicPartition, int] = {}  # the first offset a range may read, per partition
        highs: dict[TopicPartition, int] = {}  # how far it may read
        ends: dict[TopicPartition, int] = {}
        for tp in sorted(observed.ends):
            available, begin = observed.ends[tp], begins.get(tp, 0)
            if available < begin:
                losses.append(f"topic {tp[0]!r} partition {tp[1]}: its end offset {available} is before offset "
                              f"{begin}, where the query goes on (the topic was deleted and created again?)")
                ends[tp] = available
                continue
            first = begin
            low = observed.lows.get(tp)
            if low is not None and low > begin:
                first = min(low, available)
                skipped[tp] = first - begin
                losses.append(f"topic {tp[0]!r} partition {tp[1]}: offsets {begin} to {first - 1} were deleted "
                              f"(retention) before the query read them; the partition now starts at offset {low}")
            high = available
            if ceiling is not None:
                high = max(first, min(available, ceiling.get(tp, begin)))
            firsts[tp], highs[tp] = first, high
        if losses and self.fail_on_data_loss:
            raise KafkaDataLoss("; ".join(losses[:20]) + (f"; and {len(losses) - 20} more" if len(losses) > 20 else "")
                                + ". Set fail_on_data_loss=False to skip what was lost (counted in the progress records)")
        if limited and self.max_offsets_per_trigger is not None:
            highs = rate_limit(self.max_offsets_per_trigger, firsts, highs)
        ends.update(highs)
        rows = sum(max(0, highs[tp] - firsts[tp]) for tp in highs)
        if start is None and not ends:  # nothing to read yet (a pattern that matches no topic): no batch
            return KafkaPlan(SourceRange(None, None, 0), skipped, tuple(losses), dict(observed.ends))
        return KafkaPlan(SourceRange(start, offsets_json(ends), rows), skipped, tuple(losses), dict(observed.ends))

    @staticmethod
    def partition_ranges(source_range: SourceRange, initial: Mapping[str, Mapping[str, int]] | None
                         ) -> list[PartitionRange]:
        """Every partition of a logged range, in (topic, partition) order: [begin, end), begin
        from the range's start (the query's initial offsets for its first batch; 0 for a
        partition the start does not name: new). A range whose end is before its begin (the
        topic was created again, the loss was allowed) reads nothing."""
        if source_range.end is None:
            return []
        ends = parse_offsets(source_range.end, "Kafka end offset")
        begins = parse_offsets(source_range.start, "Kafka start offset") if source_range.start is not None else \
            parse_offsets(initial, "Kafka initial offset") if initial is not None else None
        if begins is None:
            raise ValueError("the Kafka source's first batch needs the query's initial offsets")
        return [PartitionRange(t, p, begins.get((t, p), 0), end) for (t, p), end in sorted(ends.items())]

    @staticmethod
    def share(ranges: Sequence[PartitionRange], subtask: int, parallelism: int) -> list[PartitionRange]:
        """A subtask's partitions of a batch: the i-th of the sorted pairs goes to subtask
        i % parallelism."""
        ordered = sorted(ranges, key=lambda r: (r.topic, r.partition))
        return ordered[subtask::parallelism]


def timeout_s(config: Mapping[str, Any]) -> float:
    """How long any one wait on the broker may take (option funke.timeout.ms)."""
    options = config.get("options") or {}
    return int(options.get(TIMEOUT_OPTION, DEFAULT_TIMEOUT_MS)) / 1000


def librdkafka_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """The query's own librdkafka settings (`options`, the funke ones left out)."""
    return {k: v for k, v in (config.get("options") or {}).items() if k in OPTION_TYPES and not k.startswith("funke.")}


def description(config: Mapping[str, Any]) -> str:
    """What a message says the source reads: its topics or its pattern, and where."""
    what = f"pattern {config['pattern']!r}" if config.get("pattern") is not None else \
        "topic(s) " + ", ".join(map(str, config.get("topics") or ()))[:300]
    return f"Kafka {what} at {str(config.get('bootstrap'))[:300]}"


def _partition(value: object) -> int | None:
    if _is_int(value):
        number = value
    elif isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 10:
        number = int(value)
    else:
        return None
    return number if 0 <= number <= MAX_PARTITION else None  # type: ignore[operator]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _planning(config: Mapping[str, Any], parallelism: int) -> KafkaSource:
    topics = config.get("topics")
    limit = config.get("max_offsets_per_trigger")
    return KafkaSource(tuple(topics) if topics is not None else (), config.get("pattern"),
                       config.get("starting", "latest"), int(limit) if limit is not None else None,
                       bool(config.get("fail_on_data_loss", True)))


PLUGIN = SourcePlugin((KAFKA,), _planning)


def consumer_settings(config: Mapping[str, Any], client: str, *, fail_on_data_loss: bool = True) -> dict[str, Any]:
    """librdkafka settings of a consumer that reads with assign + seek under read_committed and
    commits nothing (`client`: what it is for, in its client and group ids). An offset that is
    gone (retention) is an error when data loss must fail the query, else the partition's
    earliest offset."""
    settings: dict[str, Any] = {
        "bootstrap.servers": str(config["bootstrap"]),
        "client.id": f"funke-{client}"[:200],
        "group.id": f"funke-{client}"[:200],  # never joined: assign() only, nothing committed
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed",
        "enable.partition.eof": True,
        "allow.auto.create.topics": False,
        "auto.offset.reset": "error" if fail_on_data_loss else "earliest",
        "log.connection.close": False,
    }
    settings.update(librdkafka_settings(config))
    return settings
