"""A Kafka source's JobManager side: what the topics hold for planning (confluent-kafka, no JVM).

Per batch it asks the broker for the partitions of the topics the query reads (metadata; a
pattern's topics, new ones included), each partition's end and low watermark, and hands them to
the pure planning (`funke.common.streaming.sources.kafka`). A partition's end is

- "list" (default): ListOffsets under read_committed, which a Kafka broker answers with the last
  stable offset (records of open transactions are left for a later batch);
- "fetch": what a fetch reports, for brokers whose ListOffsets is wrong (Tansu, the test broker):
  a consumer assigned at the start offsets with a small fetch size and partition EOF events takes
  each partition's cached high watermark once the partition answered (a record or its end).

The low watermarks (ListOffsets earliest) tell the data-loss check what retention deleted. A
query's first batch starts at its initial offsets, resolved once (earliest, latest, by timestamp
with offsets_for_times, or as given) and kept in the checkpoint (`sources/<vertex>/kafka-initial`,
as Spark keeps its initial offsets), so that a first batch run again, or a run that starts before
the first batch was logged, begins where the first one did. A logged range resolves, for the
tasks, to every partition's [begin, end) (`BatchInput.files`: "topic/partition/begin/end").

Every call on the broker has a timeout (option funke.timeout.ms, 30 s) and a timeout says what did
not answer. Blocking: the query shell calls it from an executor thread.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from typing import Any

from funke.common import ids
from funke.common.streaming.checkpoint import SourceRange
from funke.common.streaming.sources import kafka as k
from funke.common.streaming.sources.kafka import KafkaObservation, KafkaSource, TopicPartition
from funke.jobmanager.streaming.base import SourceContext, SourceSide
from funke.runtime.hafilesystem import create_once, read_file

log = logging.getLogger(__name__)

INITIAL_FILE = "kafka-initial"
POLL_S = 0.1


class KafkaUnavailable(RuntimeError):
    """The broker did not answer in time, or answered with an error (the message says which call,
    which partitions and what the broker said)."""


class KafkaPlanner(SourceSide):
    """One Kafka source of one run of a query, on the JobManager."""

    def __init__(self, context: SourceContext, source: KafkaSource):
        self.context, self.source = context, source
        self.config = dict(context.config)
        self.mode = str(self.config.get("end_offsets", "list"))
        self.timeout_s = k.timeout_s(self.config)
        self.where = k.description(self.config)
        self._admin: Any = None
        self.lag: dict[TopicPartition, int] = {}  # per partition, after the last planned range
        self.skipped: dict[TopicPartition, int] = {}  # offsets lost to retention this run (fail_on_data_loss=False)
        self.losses, self.last_loss = 0, ""  # data losses skipped this run, and what the last one was

    @classmethod
    def open(cls, context: SourceContext) -> "KafkaPlanner":
        return cls(context, context.planning)

    # ------------------------------------------------------------------ planning

    def plan(self, start: Any, now_ms: int, limited: bool, cap: Any) -> SourceRange:
        partitions = self.partitions()
        initial = self._initial() if start is None else None
        begins = self.source.begins(start, initial) if start is not None or initial is not None else {}
        ends = self.end_offsets(partitions, begins)
        lows = self.low_offsets(partitions)
        if start is None and initial is None:
            initial = self._resolve_initial(partitions, lows, ends)
        planned = self.source.plan_batch(start, KafkaObservation(ends, lows, initial), limited, cap)
        for line in planned.losses:  # fail_on_data_loss=False: a logged skip (plan_batch raised otherwise)
            log.warning("%s: data loss skipped: %s", self.where, line)
        for tp, n in planned.skipped.items():
            self.skipped[tp] = self.skipped.get(tp, 0) + n
        if planned.losses:
            self.losses += len(planned.losses)
            self.last_loss = planned.losses[-1][:500]
        planned_ends = k.parse_offsets(planned.range.end) if planned.range.end is not None else {}
        self.lag = {tp: max(0, ends[tp] - planned_ends.get(tp, ends[tp])) for tp in sorted(ends)}
        return planned.range

    def batch_files(self, source_range: SourceRange) -> tuple[str, ...] | None:
        """Every partition of the range as "topic/partition/begin/end", for the tasks."""
        initial = None
        if source_range.start is None and source_range.end is not None:
            initial = self._stored_initial()
            if initial is None:
                raise k.KafkaDataLoss(f"{self.where}: the checkpoint has no initial offsets ({self._initial_path()}) "
                                      "for the query's first batch: it cannot be run again")
        return tuple(r.encode() for r in KafkaSource.partition_ranges(source_range, initial))

    def progress_details(self) -> dict[str, Any]:
        lag = self.lag
        out: dict[str, Any] = {"lag": k.offsets_json(lag)}
        if lag:  # Structured Streaming's Kafka source metrics (strings, as Spark's)
            values = list(lag.values())
            out["metrics"] = {"minOffsetsBehindLatest": str(min(values)), "maxOffsetsBehindLatest": str(max(values)),
                              "avgOffsetsBehindLatest": str(sum(values) / len(values))}
        if self.losses:  # fail_on_data_loss=False: what was skipped (retention: how many offsets)
            skipped = self.skipped
            out["dataLoss"] = {"losses": self.losses, "skippedOffsets": sum(skipped.values()),
                               "partitions": k.offsets_json(skipped), "last": self.last_loss}
        return out

    def close(self) -> None:
        self._admin = None  # an AdminClient has nothing to close

    # ------------------------------------------------------------------ the broker

    def _fetcher(self) -> Any:
        """A consumer for one planning step (closed after it): one kept between batches would keep
        the partitions it fetched, and librdkafka 2.16 can crash when a topic whose partitions a
        consumer holds is deleted ("Purging toppar fetch queue ... unexpected type")."""
        from confluent_kafka import Consumer

        settings = k.consumer_settings(self.config, f"planner-{self.context.vertex_id}", fail_on_data_loss=False)
        # a fetch only has to answer with the partition's end: as little data as can be, at once
        settings.update({"max.partition.fetch.bytes": 1024, "fetch.wait.max.ms": 10})
        return Consumer(settings, logger=log)

    def _admin_client(self) -> Any:
        if self._admin is None:
            from confluent_kafka.admin import AdminClient

            settings = {key: v for key, v in k.librdkafka_settings(self.config).items()
                        if key in ("client.id", "client.rack", "broker.address.family", "socket.timeout.ms",
                                   "reconnect.backoff.ms", "reconnect.backoff.max.ms", "metadata.max.age.ms",
                                   "socket.keepalive.enable", "socket.nagle.disable")}
            settings.setdefault("client.id", f"funke-planner-{self.context.vertex_id}"[:200])
            self._admin = AdminClient({"bootstrap.servers": str(self.config["bootstrap"]), **settings}, logger=log)
        return self._admin

    def partitions(self) -> list[TopicPartition]:
        """The partitions of the topics the query reads now (a listed topic that does not exist
        is an error; a topic whose metadata has an error is asked again until the timeout)."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                metadata = self._admin_client().list_topics(timeout=max(0.1, deadline - time.monotonic()))
            except Exception as exc:  # noqa: BLE001 - KafkaException: the broker did not answer
                raise KafkaUnavailable(f"{self.where}: no metadata within {self.timeout_s:g} s ({_said(exc)})") from None
            names = [t for t in metadata.topics]
            missing = self.source.missing(names)
            if missing:
                raise KafkaUnavailable(f"{self.where}: topic(s) {', '.join(missing)} do not exist")
            topics = self.source.subscribed(names)
            failing = {t: metadata.topics[t].error for t in topics if metadata.topics[t].error is not None}
            if not failing:
                return sorted((t, p) for t in topics for p in metadata.topics[t].partitions)
            if time.monotonic() >= deadline:
                said = "; ".join(f"{t}: {_said(e)}" for t, e in sorted(failing.items())[:10])
                raise KafkaUnavailable(f"{self.where}: the broker has no usable metadata of topic(s) {said}")
            time.sleep(POLL_S)

    def end_offsets(self, partitions: list[TopicPartition], begins: dict[TopicPartition, int]
                    ) -> dict[TopicPartition, int]:
        """Each partition's end: ListOffsets (read_committed) or what a fetch reports."""
        if not partitions:
            return {}
        if self.mode == "fetch":
            return self._fetched_ends(partitions, begins)
        from confluent_kafka.admin import OffsetSpec

        return self._list_offsets(partitions, OffsetSpec.latest(), "end")

    def low_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        """Each partition's low watermark: the first offset retention kept (ListOffsets earliest)."""
        if not partitions:
            return {}
        from confluent_kafka.admin import OffsetSpec

        return self._list_offsets(partitions, OffsetSpec.earliest(), "low watermark")

    def _list_offsets(self, partitions: list[TopicPartition], spec: Any, what: str) -> dict[TopicPartition, int]:
        from confluent_kafka import IsolationLevel, TopicPartition as KafkaTP

        futures = self._admin_client().list_offsets(
            {KafkaTP(t, p): spec for t, p in partitions}, isolation_level=IsolationLevel.READ_COMMITTED,
            request_timeout=self.timeout_s)
        out: dict[TopicPartition, int] = {}
        failed: list[str] = []
        deadline = time.monotonic() + self.timeout_s + 1
        for tp, future in futures.items():
            try:
                out[(tp.topic, tp.partition)] = int(future.result(timeout=max(0.1, deadline - time.monotonic())).offset)
            except Exception as exc:  # noqa: BLE001 - a timeout, or the broker's error for the partition
                failed.append(f"{tp.topic}/{tp.partition} ({_said(exc)})")
        if failed:
            raise KafkaUnavailable(f"{self.where}: no {what} (ListOffsets) within {self.timeout_s:g} s for "
                                   f"partition(s) {', '.join(sorted(failed)[:20])}")
        return out

    def _fetched_ends(self, partitions: list[TopicPartition], begins: dict[TopicPartition, int]
                      ) -> dict[TopicPartition, int]:
        """Assign every partition at its start offset, take what each fetch answers (a record or
        the partition's end), then each partition's cached high watermark."""
        from confluent_kafka import KafkaError, TopicPartition as KafkaTP

        consumer = self._fetcher()
        consumer.assign([KafkaTP(t, p, begins.get((t, p), 0)) for t, p in partitions])
        waiting = set(partitions)
        ends: dict[TopicPartition, int] = {}
        errors: dict[TopicPartition, str] = {}
        deadline = time.monotonic() + self.timeout_s
        try:
            while waiting:
                for message in ready(consumer, POLL_S):
                    error = message.error()
                    tp = (message.topic(), message.partition())
                    if error is not None and error.code() != KafkaError._PARTITION_EOF:
                        if error.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION,
                                            KafkaError._UNKNOWN_TOPIC) and tp in waiting:
                            raise KafkaUnavailable(f"{self.where}: topic {tp[0]!r} partition {tp[1]} is unknown to "
                                                   f"the broker ({error.str()})")
                        errors[tp] = error.str()
                        continue
                    if tp in waiting:
                        high = self._cached_high(consumer, tp)
                        if high is not None:
                            ends[tp] = high
                            waiting.discard(tp)
                for tp in list(waiting):
                    # a fetch past a partition's end: Kafka answers OFFSET_OUT_OF_RANGE (then the
                    # consumer starts at the earliest offset and answers), Tansu with nothing at all;
                    # its high watermark, behind the start offset, says so (a topic created again)
                    high = self._cached_high(consumer, tp)
                    if high is not None and high < begins.get(tp, 0):
                        ends[tp] = high
                        waiting.discard(tp)
                if waiting and time.monotonic() >= deadline:
                    silent = ", ".join(f"{t}/{p}" + (f" ({errors[(t, p)]})" if (t, p) in errors else "")
                                       for t, p in sorted(waiting)[:20])
                    raise KafkaUnavailable(f"{self.where}: no fetch answered within {self.timeout_s:g} s for "
                                           f"partition(s) {silent} (end_offsets='fetch')")
        finally:
            with contextlib.suppress(Exception):
                consumer.close()
        return ends

    @staticmethod
    def _cached_high(consumer: Any, tp: TopicPartition) -> int | None:
        from confluent_kafka import TopicPartition as KafkaTP

        marks = consumer.get_watermark_offsets(KafkaTP(*tp), cached=True)
        return int(marks[1]) if marks is not None and marks[1] >= 0 else None

    def _by_time(self, partitions: list[TopicPartition], ms: int, lows: dict[TopicPartition, int]
                 ) -> dict[TopicPartition, int | None]:
        """Per partition, the offset of its first record at or after `ms` (None: there is none):
        offsets_for_times; with end_offsets="fetch" (a broker whose ListOffsets is wrong answers
        a time with its first offset: Tansu) the records' own timestamps, read from the low
        watermark on."""
        from confluent_kafka import TopicPartition as KafkaTP

        if self.mode == "fetch":
            return self._scanned_by_time(partitions, ms, lows)
        consumer = self._fetcher()
        try:
            found = consumer.offsets_for_times([KafkaTP(t, p, ms) for t, p in partitions], timeout=self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - KafkaException
            raise KafkaUnavailable(f"{self.where}: no offsets for timestamp {ms} within {self.timeout_s:g} s "
                                   f"({_said(exc)})") from None
        finally:
            with contextlib.suppress(Exception):
                consumer.close()
        out: dict[TopicPartition, int | None] = {}
        for tp in found:
            if tp.error is not None:
                raise KafkaUnavailable(f"{self.where}: topic {tp.topic!r} partition {tp.partition}: no offset for "
                                       f"timestamp {ms} ({_said(tp.error)})")
            out[(tp.topic, tp.partition)] = tp.offset if tp.offset >= 0 else None
        return out

    def _scanned_by_time(self, partitions: list[TopicPartition], ms: int, lows: dict[TopicPartition, int]
                         ) -> dict[TopicPartition, int | None]:
        from confluent_kafka import Consumer, KafkaError, TopicPartition as KafkaTP

        found: dict[TopicPartition, int | None] = {}
        consumer = Consumer(k.consumer_settings(self.config, f"planner-{self.context.vertex_id}-by-time",
                                                fail_on_data_loss=False), logger=log)
        deadline = time.monotonic() + self.timeout_s
        try:
            consumer.assign([KafkaTP(t, p, lows.get((t, p), 0)) for t, p in partitions])
            while len(found) < len(partitions):
                settled: list[TopicPartition] = []
                for message in ready(consumer, POLL_S):
                    tp = (message.topic(), message.partition())
                    if tp in found:
                        continue
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            found[tp] = None  # no record at or after the time: the end
                            settled.append(tp)
                        continue
                    kind, at = message.timestamp()
                    if kind and at >= ms:
                        found[tp] = message.offset()
                        settled.append(tp)
                if settled:
                    consumer.pause([KafkaTP(t, p) for t, p in settled])
                if len(found) < len(partitions) and time.monotonic() >= deadline:
                    silent = ", ".join(f"{t}/{p}" for t, p in sorted(set(partitions) - set(found))[:20])
                    raise KafkaUnavailable(f"{self.where}: the records at timestamp {ms} were not found within "
                                           f"{self.timeout_s:g} s in partition(s) {silent}")
        finally:
            with contextlib.suppress(Exception):
                consumer.close()
        return found

    # ------------------------------------------------------------------ the initial offsets

    def _initial_path(self) -> str:
        ids.require_path_id(self.context.vertex_id, "source name")
        return os.path.join(self.context.checkpoint_location, "sources", self.context.vertex_id, INITIAL_FILE)

    def _stored_initial(self) -> dict[str, dict[str, int]] | None:
        data = read_file(self._initial_path())
        if data is None:
            return None
        try:
            initial = json.loads(data)
            k.parse_offsets(initial, "Kafka initial offset")
        except ValueError as exc:
            raise k.KafkaDataLoss(f"{self.where}: {self._initial_path()} is not readable ({exc})") from None
        return initial

    def _initial(self) -> dict[str, dict[str, int]] | None:
        return self._stored_initial()

    def _resolve_initial(self, partitions: list[TopicPartition], lows: dict[TopicPartition, int],
                         ends: dict[TopicPartition, int]) -> dict[str, dict[str, int]]:
        """The query's initial offsets, resolved now and kept in the checkpoint (written once: a
        run that finds them there uses those)."""
        starting = self.source.starting
        by_time = self._by_time(partitions, int(starting["timestamp"]), lows) \
            if isinstance(starting, dict) and "timestamp" in starting and partitions else None
        initial = k.initial_offsets(starting, partitions, lows, ends, by_time)
        path = self._initial_path()
        self.context.checkpoint.check()  # a run that was taken over writes nothing
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        if not create_once(path, json.dumps(initial, sort_keys=True).encode()):
            stored = self._stored_initial()
            if stored is not None:
                return stored
        log.info("%s: the query starts at %s (starting=%s)", self.where, json.dumps(initial)[:2000], starting)
        return initial


def ready(consumer: Any, timeout_s: float) -> list[Any]:
    """The messages and events a consumer has, once it has any (or nothing after `timeout_s`):
    consume(n, timeout) would wait for n of them or the whole timeout."""
    first = consumer.poll(timeout_s)
    return [] if first is None else [first, *consumer.consume(num_messages=10_000, timeout=0)]


def _said(exc: object) -> str:
    """What the client library said, shortened (it never holds secrets: none are configured)."""
    text = exc.str() if hasattr(exc, "str") and callable(exc.str) else str(exc)
    return ids.echo(text, 300)[1:-1] if len(text) > 300 else text
