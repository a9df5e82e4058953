"""What a Kafka partition's log holds, read with the Kafka protocol itself, for exactly-once checks
in tests (funke's and its users': `funke.testing.committed_records`).

Neither test broker hides aborted records from a `read_committed` consumer in all cases (Tansu
delivers them; librdkafka's mock cluster also delivers records of open transactions), so a check
that trusts the consumer can pass while a sink wrote duplicates. This reader does what a Kafka
broker's read_committed fetch promises, from the log: it fetches the partition's record batches
(Fetch v4, read_uncommitted, over a plain socket), parses the RecordBatch v2 format (base offset,
the attributes' transactional and control bits, the producer id) and applies the control records
(COMMIT or ABORT of a producer's transaction) itself. Every data record comes back with the state
of its transaction: committed, aborted, or still open (no marker yet). A record written without a
transaction is committed.

Only what the checks need: no TLS, no SASL, no compression but gzip (a test producer sends
uncompressed batches by default); every request has a timeout.
"""

from __future__ import annotations

import gzip
import io
import socket
import struct
import time
from dataclasses import dataclass

COMMITTED, ABORTED, OPEN = "committed", "aborted", "open"

_FETCH, _LIST_OFFSETS, _METADATA = 1, 2, 3
_OFFSET_OUT_OF_RANGE = 1
_CONTROL_ABORT, _CONTROL_COMMIT = 0, 1
_TRANSACTIONAL_BIT, _CONTROL_BIT = 0x10, 0x20
_BATCH_HEADER = 61  # bytes of a RecordBatch v2 before its records
_MAX_FRAME = 256 * 1024 * 1024


class KafkaLogError(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class LogRecord:
    """A data record of the log, and the state of the transaction it was written in."""

    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int  # ms
    headers: tuple[tuple[str, bytes | None], ...]
    producer_id: int  # -1: no idempotent or transactional producer
    transactional: bool
    state: str  # COMMITTED, ABORTED or OPEN


def committed_records(bootstrap: str, topic: str, partition: int = 0, timeout: float = 30) -> list[LogRecord]:
    """Every data record of `topic`'s `partition` from the log's start to its end, in offset order,
    each with the state of its transaction (`LogRecord.state`). The records a read_committed
    consumer must see are those whose state is COMMITTED."""
    deadline = time.monotonic() + timeout
    host, port = _leader(bootstrap, topic, partition, deadline)
    with _Connection(host, port, deadline) as conn:
        offset, end = 0, None
        batches: list[_Batch] = []
        while end is None or offset < end:
            error, high_watermark, data = conn.fetch(topic, partition, offset)
            if error == _OFFSET_OUT_OF_RANGE and not batches:
                offset = conn.earliest(topic, partition)
                continue
            if error:
                raise KafkaLogError(f"fetching {topic!r} partition {partition} at offset {offset} failed: error {error}")
            end = high_watermark if end is None else end
            got = [b for b in _batches(data) if b.last_offset >= offset]
            if not got:
                if offset < end and time.monotonic() > deadline:
                    raise KafkaLogError(f"{topic!r} partition {partition}: no batch at offset {offset} (end {end})")
                if offset >= end:
                    break
                time.sleep(0.05)  # the broker has nothing for us yet (max_wait_ms is short)
                continue
            batches.extend(got)
            offset = got[-1].last_offset + 1
    return _apply_markers(batches)


@dataclass(frozen=True, slots=True)
class _Batch:
    base_offset: int
    last_offset: int
    producer_id: int
    transactional: bool
    control: bool
    records: tuple[tuple[int, bytes | None, bytes | None, int, tuple[tuple[str, bytes | None], ...]], ...]


def _apply_markers(batches: list[_Batch]) -> list[LogRecord]:
    """The data records with their transactions' states: a producer's transactional records wait
    for its next control record (COMMIT or ABORT); those still waiting at the end are OPEN."""
    out: list[LogRecord] = []
    waiting: dict[int, list[int]] = {}  # producer id -> indexes into out
    seen: set[int] = set()
    for batch in batches:
        for offset, key, value, timestamp, headers in batch.records:
            if offset in seen:
                continue  # a batch fetched twice (two fetches overlap)
            seen.add(offset)
            if batch.control:
                kind = struct.unpack(">hh", key[:4])[1] if key is not None and len(key) >= 4 else -1
                if kind in (_CONTROL_COMMIT, _CONTROL_ABORT):
                    state = COMMITTED if kind == _CONTROL_COMMIT else ABORTED
                    for i in waiting.pop(batch.producer_id, []):
                        out[i] = _with_state(out[i], state)
                continue
            record = LogRecord(offset, key, value, timestamp, headers, batch.producer_id, batch.transactional,
                               OPEN if batch.transactional else COMMITTED)
            if batch.transactional:
                waiting.setdefault(batch.producer_id, []).append(len(out))
            out.append(record)
    return out


def _with_state(r: LogRecord, state: str) -> LogRecord:
    return LogRecord(r.offset, r.key, r.value, r.timestamp, r.headers, r.producer_id, r.transactional, state)


# -- the RecordBatch v2 format -------------------------------------------------------------------


def _batches(data: bytes) -> list[_Batch]:
    """The complete record batches in a fetch's records (a fetch may end inside a batch)."""
    out = []
    pos = 0
    while pos + 12 <= len(data):
        base_offset, length = struct.unpack_from(">qi", data, pos)
        if length < _BATCH_HEADER - 12:
            raise KafkaLogError(f"a record batch at offset {base_offset} claims {length} bytes, fewer than its header")
        if pos + 12 + length > len(data):
            break  # cut by max_bytes: fetched again from its offset
        batch = data[pos:pos + 12 + length]
        pos += 12 + length
        magic = batch[16]
        if magic != 2:
            raise KafkaLogError(f"a record batch at offset {base_offset} has magic {magic}; only v2 batches are read")
        attributes, last_delta, base_ts = struct.unpack_from(">hiq", batch, 21)
        producer_id, = struct.unpack_from(">q", batch, 43)
        count, = struct.unpack_from(">i", batch, 57)
        body = batch[_BATCH_HEADER:]
        compression = attributes & 0x07
        if compression == 1:
            body = gzip.decompress(body)
        elif compression:
            raise KafkaLogError(f"the batch at offset {base_offset} is compressed with codec {compression}; this "
                                f"reader reads uncompressed and gzip batches (produce with compression.type none)")
        records = _records(io.BytesIO(body), count, base_offset, base_ts)
        out.append(_Batch(base_offset, base_offset + last_delta, producer_id,
                          bool(attributes & _TRANSACTIONAL_BIT), bool(attributes & _CONTROL_BIT), tuple(records)))
    return out


def _records(buf: io.BytesIO, count: int, base_offset: int, base_ts: int) -> list:
    out = []
    for _ in range(count):
        _varint(buf)  # the record's length
        buf.read(1)  # attributes (unused)
        ts_delta = _varint(buf)
        offset_delta = _varint(buf)
        key = _bytes(buf)
        value = _bytes(buf)
        headers = []
        for _ in range(_varint(buf)):
            name = _bytes(buf)
            headers.append(((name or b"").decode("utf-8", "replace"), _bytes(buf)))
        out.append((base_offset + offset_delta, key, value, base_ts + ts_delta, tuple(headers)))
    return out


def _varint(buf: io.BytesIO) -> int:
    shift = result = 0
    while True:
        byte = buf.read(1)
        if not byte:
            raise KafkaLogError("a record ends inside a varint")
        result |= (byte[0] & 0x7F) << shift
        if not byte[0] & 0x80:
            return (result >> 1) ^ -(result & 1)  # zigzag
        shift += 7
        if shift > 63:
            raise KafkaLogError("a varint longer than 10 bytes")


def _bytes(buf: io.BytesIO) -> bytes | None:
    n = _varint(buf)
    if n < 0:
        return None
    data = buf.read(n)
    if len(data) != n:
        raise KafkaLogError("a record ends inside its bytes")
    return data


# -- the requests ---------------------------------------------------------------------------------


def _leader(bootstrap: str, topic: str, partition: int, deadline: float) -> tuple[str, int]:
    """(host, port) of the partition's leader, asked of the first bootstrap server that answers."""
    problems = []
    for address in bootstrap.split(","):
        host, _, port = address.strip().rpartition(":")
        try:
            with _Connection(host.strip("[]"), int(port), deadline) as conn:
                return conn.leader(topic, partition)
        except (OSError, ValueError) as exc:
            problems.append(f"{address.strip()}: {exc}")
    raise KafkaLogError(f"no bootstrap server answered: {'; '.join(problems)}")


class _Connection:
    def __init__(self, host: str, port: int, deadline: float):
        self.deadline = deadline
        self.sock = socket.create_connection((host, port), timeout=self._left())
        self.correlation = 0

    def __enter__(self) -> "_Connection":
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def _left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the Kafka log was not read within the timeout")
        return left

    def request(self, api_key: int, version: int, body: bytes) -> io.BytesIO:
        self.correlation += 1
        header = struct.pack(">hhi", api_key, version, self.correlation) + _string("funke-kafkalog")
        frame = header + body
        self.sock.settimeout(self._left())
        self.sock.sendall(struct.pack(">i", len(frame)) + frame)
        size, = struct.unpack(">i", self._exactly(4))
        if not 4 <= size <= _MAX_FRAME:
            raise KafkaLogError(f"a response of {size} bytes")
        answer = io.BytesIO(self._exactly(size))
        correlation, = struct.unpack(">i", answer.read(4))
        if correlation != self.correlation:
            raise KafkaLogError(f"a response to request {correlation}, not {self.correlation}")
        return answer

    def _exactly(self, n: int) -> bytes:
        chunks, got = [], 0
        while got < n:
            self.sock.settimeout(self._left())
            chunk = self.sock.recv(min(n - got, 1 << 20))
            if not chunk:
                raise KafkaLogError("the broker closed the connection")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def leader(self, topic: str, partition: int) -> tuple[str, int]:
        r = self.request(_METADATA, 1, struct.pack(">i", 1) + _string(topic))
        brokers = {}
        for _ in range(_int32(r)):
            node, host, port = _int32(r), _read_string(r), _int32(r)
            _read_string(r)  # rack
            brokers[node] = (host, port)
        _int32(r)  # controller
        for _ in range(_int32(r)):
            error, name = _int16(r), _read_string(r)
            r.read(1)  # is_internal
            for _ in range(_int32(r)):
                p_error, index, leader = _int16(r), _int32(r), _int32(r)
                for _ in range(2):  # replicas, in-sync replicas
                    r.read(4 * _int32(r))
                if name == topic and index == partition:
                    if error or p_error or leader not in brokers:
                        raise KafkaLogError(f"no leader for {topic!r} partition {partition} "
                                            f"(error {error or p_error})")
                    return brokers[leader]
        raise KafkaLogError(f"the broker does not know {topic!r} partition {partition}")

    def fetch(self, topic: str, partition: int, offset: int, max_bytes: int = 8 * 1024 * 1024) -> tuple[int, int, bytes]:
        """(error code, high watermark, records) of Fetch v4, read_uncommitted (every record)."""
        body = struct.pack(">iiiib", -1, 100, 0, max_bytes, 0) + struct.pack(">i", 1) + _string(topic) + \
            struct.pack(">iiqi", 1, partition, offset, max_bytes)
        r = self.request(_FETCH, 4, body)
        _int32(r)  # throttle
        for _ in range(_int32(r)):
            name = _read_string(r)
            for _ in range(_int32(r)):
                index, error = _int32(r), _int16(r)
                high_watermark, = struct.unpack(">q", r.read(8))
                r.read(8)  # last stable offset
                aborted = _int32(r)
                r.read(16 * max(aborted, 0))
                size = _int32(r)
                data = r.read(size) if size > 0 else b""
                if name == topic and index == partition:
                    return error, high_watermark, data
        raise KafkaLogError(f"the fetch answer has no {topic!r} partition {partition}")

    def earliest(self, topic: str, partition: int) -> int:
        """The log's start offset (ListOffsets v1, timestamp -2)."""
        body = struct.pack(">ii", -1, 1) + _string(topic) + struct.pack(">iiq", 1, partition, -2)
        r = self.request(_LIST_OFFSETS, 1, body)
        for _ in range(_int32(r)):
            name = _read_string(r)
            for _ in range(_int32(r)):
                index, error = _int32(r), _int16(r)
                _, offset = struct.unpack(">qq", r.read(16))
                if name == topic and index == partition and not error:
                    return offset
        raise KafkaLogError(f"no start offset for {topic!r} partition {partition}")


def _string(s: str) -> bytes:
    data = s.encode()
    return struct.pack(">h", len(data)) + data


def _read_string(r: io.BytesIO) -> str:
    n = _int16(r)
    return r.read(n).decode("utf-8", "replace") if n >= 0 else ""


def _int16(r: io.BytesIO) -> int:
    return struct.unpack(">h", r.read(2))[0]


def _int32(r: io.BytesIO) -> int:
    return struct.unpack(">i", r.read(4))[0]
