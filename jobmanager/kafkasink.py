"""A Kafka sink's commits on the JobManager: the rows its subtasks staged (Parquet files of the
`key` and `value` columns under `layout.kafka_sink_dir`) produced into the topic, each batch of a
streaming query once, or a bounded job's rows once when it FINISHED. The rules and names are
`funke.common.streaming.kafkasink`.

exactly_once. `KafkaSinkProducer.open` makes the producer of one run of a query (or of one
bounded job's commit) with the transactional id `funke-<owner>-<sink>` and calls
init_transactions: the broker fences every earlier producer with that id (its commit fails from
then on) and aborts its open transaction, the one a JobManager left that died mid-commit or
whose run a newer one took over. So after a run starts, no transaction of the sink is open.
Then, per batch (`commit`):

1. the marker group's committed offset on (topic, 0) is read: if it is above the batch's id,
   the batch is in (it runs again after a failure between its sink commit and its commit-log
   entry) and nothing is produced;
2. one transaction holds the batch's rows and the marker: an offset commit of the group for
   batch id + 1 (send_offsets_to_transaction), so both become visible together or not at all;
3. `fence` (the run's hold on its checkpoint) once more, then commit_transaction, the commit
   point. A failure before it aborts the transaction.

A batch without rows opens no transaction (run again, it writes nothing either).

at_least_once. An idempotent producer (its own retries write nothing twice), no transaction and
no marker: a batch's rows are produced and flushed before its commit returns, and a batch that
runs again after a failure between its sink commit and its commit-log entry is written again.

Every call to the broker has a timeout; a failure raises SinkCommitError naming the topic and
what was being done, with the broker's error. Blocking: the JobMaster calls this from a thread.
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import shutil
import time
from typing import Any, Callable, Iterator, Mapping, Sequence

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from funke.common import layout
from funke.common.streaming import kafkasink as rules
from funke.jobmanager.streamsinks import SinkCommitError, batch_staging, no_fence, staging_dir
from funke.runtime import datafs

log = logging.getLogger("funke.jobmanager.kafka")

CALL_TIMEOUT_S = 30.0  # one request to the broker: init_transactions, the marker, send offsets, commit, abort
# The broker aborts a transaction open this long: what a producer that died mid-transaction holds
# read_committed consumers back for when no later run fences it (Kafka's default).
TRANSACTION_TIMEOUT_MS = 60_000
# Producing a batch's rows, from its first to its commit, stays well inside the transaction's timeout.
PRODUCE_TIMEOUT_S = 45.0
READ_BATCH_ROWS = 10_000  # rows read from a staged file at a time
POLL_EVERY = 1_000  # rows produced between serving the delivery reports


class KafkaSinkProducer:
    """The producer of one Kafka sink for one run of a query (or one bounded job's commit)."""

    def __init__(self, config: Mapping[str, Any], owner_id: str, vertex_id: str):
        self.topic = str(config["topic"])
        self.bootstrap = str(config["bootstrap"])
        self.exactly_once = str(config.get("guarantee", rules.EXACTLY_ONCE)) == rules.EXACTLY_ONCE
        self.owner_id, self.vertex_id = owner_id, vertex_id
        self.transactional_id = rules.transactional_id(owner_id, vertex_id)
        self._producer: Any = None
        self._marker: Any = None  # a consumer of the marker group: its committed offset, its metadata
        self._in_transaction = False
        self._delivery_error: str | None = None

    @classmethod
    def open(cls, config: Mapping[str, Any], owner_id: str, vertex_id: str,
             timeout: float = CALL_TIMEOUT_S) -> "KafkaSinkProducer":
        """A producer whose topic exists; for exactly_once with its transactions initialised
        (every earlier producer of the sink fenced, its open transaction aborted)."""
        producer = cls(config, owner_id, vertex_id)
        try:
            producer._open(timeout)
        except BaseException:
            producer.close()
            raise
        return producer

    def _open(self, timeout: float) -> None:
        from confluent_kafka import Consumer, Producer

        settings: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap, "client.id": f"funke-{self.vertex_id}", "logger": log,
            "enable.idempotence": True,
            # keyed records land where Kafka's Java producer (Kafka Streams, Flink) puts them
            "partitioner": "murmur2_random",
            "message.timeout.ms": int(PRODUCE_TIMEOUT_S * 1000),
        }
        if self.exactly_once:
            settings.update({"transactional.id": self.transactional_id, "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS})
        self._producer = Producer(settings)
        self._check_topic(timeout)
        if self.exactly_once:
            # no `logger`: a consumer that is never polled would keep its log lines queued
            self._marker = Consumer({"bootstrap.servers": self.bootstrap,
                                     "group.id": rules.marker_group(self.owner_id, self.vertex_id),
                                     "enable.auto.commit": False, "isolation.level": "read_committed"})
            began = time.monotonic()
            self._call("initialising its transactions (fencing the sink's earlier producers)",
                       self._producer.init_transactions, timeout)
            log.info("Kafka sink %s: transactional id %s initialised in %.2f s (earlier producers fenced, their "
                     "open transaction aborted)", self.vertex_id, self.transactional_id, time.monotonic() - began)

    def _check_topic(self, timeout: float) -> None:
        from confluent_kafka import KafkaError, KafkaException

        try:
            metadata = self._producer.list_topics(self.topic, timeout)
        except KafkaException as exc:
            raise SinkCommitError(f"{self._where()}: the Kafka cluster did not answer within {timeout:g} s: "
                                  f"{_error_text(exc)}") from None
        found = metadata.topics.get(self.topic)
        error = found.error if found is not None else None
        if found is None or (error is not None and error.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART,
                                                                     KafkaError.TOPIC_AUTHORIZATION_FAILED,
                                                                     KafkaError.TOPIC_EXCEPTION)):
            why = error.str() if error is not None else "not in the cluster's metadata"
            raise SinkCommitError(f"{self._where()}: the topic cannot be written: {why} (create it first, or let the "
                                  "broker create topics)")

    def batch_is_in(self, batch_id: int, timeout: float = CALL_TIMEOUT_S) -> bool:
        """Whether the marker group's committed offset says batch `batch_id` was committed."""
        from confluent_kafka import KafkaException, TopicPartition

        group = rules.marker_group(self.owner_id, self.vertex_id)
        try:
            (got,) = self._marker.committed([TopicPartition(self.topic, rules.MARKER_PARTITION)], timeout=timeout)
        except KafkaException as exc:
            raise SinkCommitError(f"{self._where()}: reading the marker of batch {batch_id} (the offset of group "
                                  f"{group!r} on partition {rules.MARKER_PARTITION}) failed: {_error_text(exc)}") from None
        if got.error is not None:
            raise SinkCommitError(f"{self._where()}: reading the marker of batch {batch_id} (group {group!r}, "
                                  f"partition {rules.MARKER_PARTITION}) failed: {got.error.str()}")
        return rules.is_in(got.offset if got.offset >= 0 else None, batch_id)

    def commit(self, batch_id: int, directories: Sequence[str], fence: Callable[[], None] = no_fence) -> int:
        """Produces the rows staged in `directories` (in their order) as batch `batch_id`;
        returns how many records this call wrote (0: none staged, or the batch is in already).
        `fence` raises when the caller may no longer commit (its run was taken over)."""
        files = staged_files(directories)
        if not staged_rows(files):  # an idle batch: no transaction, no marker, no round trip
            return 0
        if self.exactly_once:
            fence()
            if self.batch_is_in(batch_id):
                log.info("Kafka sink %s: batch %d is in %s already (its marker says so): nothing written again",
                         self.vertex_id, batch_id, self.topic)
                return 0
        deadline = time.monotonic() + PRODUCE_TIMEOUT_S
        produced = 0
        self._delivery_error = None
        try:
            for key, value in staged_records(files):
                if produced == 0 and self.exactly_once:
                    self._call(f"beginning the transaction of batch {batch_id}", self._producer.begin_transaction)
                    self._in_transaction = True
                self._produce(batch_id, key, value, deadline)
                produced += 1
                if produced % POLL_EVERY == 0:
                    self._producer.poll(0)
                    self._check_delivered(batch_id)
            if not produced:
                return 0
            if self.exactly_once:
                self._send_marker(batch_id, deadline)
                fence()
                self._commit_transaction(batch_id, deadline)
            else:
                self._flush(batch_id, deadline)
        except BaseException:
            self.abort()
            raise
        return produced

    def _produce(self, batch_id: int, key: bytes | None, value: bytes | None, deadline: float) -> None:
        from confluent_kafka import KafkaException

        while True:
            try:
                self._producer.produce(self.topic, value=value, key=key, on_delivery=self._delivered)
                return
            except BufferError:  # the producer's queue is full: let it send, then try again
                if time.monotonic() > deadline:
                    raise SinkCommitError(f"{self._where()}: batch {batch_id} could not be produced within "
                                          f"{PRODUCE_TIMEOUT_S:g} s (the producer's queue stayed full)") from None
                self._producer.poll(0.05)
                self._check_delivered(batch_id)
            except KafkaException as exc:
                raise SinkCommitError(f"{self._where()}: producing a record of batch {batch_id} failed: "
                                      f"{_error_text(exc)}") from None

    def _delivered(self, error: Any, message: Any) -> None:
        if error is not None and self._delivery_error is None:
            self._delivery_error = f"partition {message.partition()}: {error.str()}"

    def _check_delivered(self, batch_id: int) -> None:
        if self._delivery_error is not None:
            raise SinkCommitError(f"{self._where()}: a record of batch {batch_id} was not delivered: "
                                  f"{self._delivery_error}")

    def _send_marker(self, batch_id: int, deadline: float) -> None:
        from confluent_kafka import TopicPartition

        marker = TopicPartition(self.topic, rules.MARKER_PARTITION, rules.marker_offset(batch_id),
                                metadata=rules.marker_metadata(self.owner_id, self.vertex_id, batch_id))
        self._call(f"adding the marker of batch {batch_id} to its transaction", self._producer.send_offsets_to_transaction,
                   [marker], self._marker.consumer_group_metadata(), _left(deadline))

    def _commit_transaction(self, batch_id: int, deadline: float) -> None:
        from confluent_kafka import KafkaException

        while True:
            try:
                self._producer.commit_transaction(_left(deadline))
                self._in_transaction = False
                return
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                # retriable (a timeout): the same call again resumes the commit
                if error is not None and error.retriable() and time.monotonic() < deadline:
                    continue
                raise SinkCommitError(f"{self._where()}: committing the transaction of batch {batch_id} failed"
                                      f"{self._fenced_note(error)}: {_error_text(exc)}") from None

    def _flush(self, batch_id: int, deadline: float) -> None:
        left = self._producer.flush(_left(deadline))
        self._check_delivered(batch_id)
        if left:
            raise SinkCommitError(f"{self._where()}: {left} record(s) of batch {batch_id} were not delivered within "
                                  f"{PRODUCE_TIMEOUT_S:g} s")

    def abort(self) -> None:
        """Aborts the open transaction, if any (best effort: a producer that cannot reach the
        broker leaves it to the next run's init_transactions, or to the transaction timeout)."""
        if not self._in_transaction:
            return
        self._in_transaction = False
        try:
            self._producer.abort_transaction(CALL_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - fenced, or the broker gone: nothing more to do here
            log.warning("%s: aborting the open transaction failed (the next run's init_transactions, or the "
                        "broker after %d ms, ends it): %s", self._where(), TRANSACTION_TIMEOUT_MS, _error_text(exc))

    def close(self) -> None:
        """Aborts an open transaction and lets go of the connections (idempotent)."""
        if self._producer is not None:
            self.abort()
            with contextlib.suppress(Exception):
                self._producer.purge()  # an at_least_once batch that failed: its rows are not sent
            self._producer = None
        marker, self._marker = self._marker, None
        if marker is not None:
            with contextlib.suppress(Exception):
                marker.close()

    def _call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        from confluent_kafka import KafkaException

        try:
            return fn(*args)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            raise SinkCommitError(f"{self._where()}: {what} failed{self._fenced_note(error)}: "
                                  f"{_error_text(exc)}") from None

    def _fenced_note(self, error: Any) -> str:
        from confluent_kafka import KafkaError

        if error is not None and error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                                                  KafkaError.INVALID_PRODUCER_EPOCH):
            return (f" (transactional id {self.transactional_id!r} was fenced: a newer run of the query, or a "
                    "second query on the same checkpoint, took the sink over)")
        return ""

    def _where(self) -> str:
        return f"Kafka sink {self.vertex_id} (topic {self.topic!r} at {self.bootstrap})"


def commit_batch(producer: KafkaSinkProducer, target: str, job_id: str, batch_id: int, attempts: dict[int, int],
                 fence: Callable[[], None] = no_fence) -> int:
    """A streaming query's batch: the rows the chosen attempt of every subtask staged under
    `target` produced (`KafkaSinkProducer.commit`), then the batch's staging removed (also
    when the batch was in already). Returns how many records this call wrote."""
    directories = [staging_dir(target, job_id, batch_id, subtask, attempt)
                   for subtask, attempt in sorted(attempts.items())]
    produced = producer.commit(batch_id, directories, fence)
    shutil.rmtree(batch_staging(target, job_id, batch_id), ignore_errors=True)
    return produced


def commit_job(data_dir: str, job_id: str, vertex_id: str, config: Mapping[str, Any], attempts: dict[int, int]) -> int:
    """A bounded job's Kafka sink, once it FINISHED: every subtask's rows in one transaction with
    the marker of batch 0 (owner: the job), so a new leader that commits the job again writes
    nothing twice. The staging goes with the job's clean-up."""
    target = layout.kafka_sink_dir(data_dir, job_id, vertex_id)
    directories = [layout.sink_staging_dir(target, job_id, subtask, attempt)
                   for subtask, attempt in sorted(attempts.items())]
    producer = KafkaSinkProducer.open(config, job_id, vertex_id)
    try:
        return producer.commit(0, directories)
    finally:
        producer.close()


def staged_files(directories: Sequence[str]) -> list[tuple[pafs.FileSystem, str]]:
    """The Parquet files staged in `directories`, in order (Spark's _SUCCESS and checksums left
    out); a missing directory is an error: a finished attempt always leaves one."""
    files = []
    for directory in directories:
        fs, path = datafs.filesystem(directory)
        if fs.get_file_info(path).type is not pafs.FileType.Directory:
            raise SinkCommitError(f"the Kafka sink's staged rows are not in {directory}: is the data directory shared "
                                  "by the JobManager and every TaskManager (same path or URI)?")
        infos = fs.get_file_info(pafs.FileSelector(path))
        names = sorted(i.path for i in infos if i.type is pafs.FileType.File and i.path.endswith(".parquet")
                       and not posixpath.basename(i.path).startswith((".", "_")))
        files += [(fs, name) for name in names]
    return files


def staged_rows(files: Sequence[tuple[pafs.FileSystem, str]]) -> int:
    """How many rows the staged files hold (from their footers)."""
    total = 0
    for fs, name in files:
        with fs.open_input_file(name) as f:
            total += pq.ParquetFile(f).metadata.num_rows
    return total


def staged_records(files: Sequence[tuple[pafs.FileSystem, str]]) -> Iterator[tuple[bytes | None, bytes | None]]:
    """(key, value) of every staged row, in the files' order: strings as UTF-8, nulls as None."""
    for fs, name in files:
        with fs.open_input_file(name) as f:
            parquet = pq.ParquetFile(f)
            columns = parquet.schema_arrow.names
            if rules.VALUE_COLUMN not in columns:
                raise SinkCommitError(f"{name} holds no {rules.VALUE_COLUMN!r} column: not a Kafka sink's staged rows")
            keyed = rules.KEY_COLUMN in columns
            for batch in parquet.iter_batches(batch_size=READ_BATCH_ROWS):
                values = batch.column(rules.VALUE_COLUMN).to_pylist()
                keys = batch.column(rules.KEY_COLUMN).to_pylist() if keyed else [None] * len(values)
                for key, value in zip(keys, values):
                    yield _bytes(key), _bytes(value)


def _bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return str(value).encode("utf-8")


def _left(deadline: float) -> float:
    return max(1.0, deadline - time.monotonic())


def _error_text(exc: BaseException) -> str:
    error = exc.args[0] if exc.args else None
    if error is not None and hasattr(error, "str") and hasattr(error, "name"):
        return f"{error.name()}: {error.str()}"
    return str(exc)
