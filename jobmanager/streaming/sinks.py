"""The JobManager side of the streaming sinks that commit: file sinks (a manifest per batch,
`funke.jobmanager.streamsinks`), the collect sink (the same, under the data directory, whose
directory exists from the query's start), Redis (one transaction per batch,
`funke.jobmanager.redissink`), Kafka (one transaction per batch, with a marker naming it,
`funke.jobmanager.kafkasink`) and Delta (one Delta transaction per batch, recording the query's
id and the batch id, `funke.jobmanager.deltatables`)."""

from __future__ import annotations

import functools
from typing import Callable

from funke.common import layout
from funke.common.graph.streamingjob import local_path
from funke.jobmanager import committer, deltatables, kafkasink, redissink, streamsinks
from funke.jobmanager.streaming.base import SinkContext, SinkSide


class FileSink(SinkSide):
    """Batches committed with a manifest each (`streamsinks`). The target is listed for an
    interrupted commit's files only by the first commit of each run and by the commit after one
    that failed: any other commit follows a successful one."""

    def __init__(self, context: SinkContext):
        super().__init__(context)
        self._leftovers = True

    def _target(self) -> str:
        return local_path(str(self.context.config["path"]))

    def prepare(self, query_id: str = "") -> None:
        self._leftovers = True

    def commit(self, batch_id: int, attempts: dict[int, int], query_id: str) -> None:
        self.commit_fenced(batch_id, attempts, query_id, streamsinks.no_fence)

    def commit_fenced(self, batch_id: int, attempts: dict[int, int], query_id: str, fence: Callable[[], None]) -> None:
        leftovers, self._leftovers = self._leftovers, True  # until this commit succeeded
        streamsinks.commit_batch(self._target(), self.context.job_id, batch_id, attempts, leftovers=leftovers,
                                 fence=fence)
        self._leftovers = False


class CollectSink(FileSink):
    def _target(self) -> str:
        return layout.collect_dir(self.context.data_dir, self.context.job_id, self.context.vertex_id)

    def prepare(self, query_id: str = "") -> None:
        """The directory exists before the first batch: a query that committed no batch has
        zero rows there (also once FINISHED), and a missing directory means rows that are gone
        (`committer.read_collected`)."""
        super().prepare(query_id)
        fs, path = committer.filesystem(self._target())
        fs.create_dir(path, recursive=True)


class RedisSink(SinkSide):
    def commit(self, batch_id: int, attempts: dict[int, int], query_id: str) -> None:
        c = self.context
        config = dict(c.config)
        redissink.commit_batch(functools.partial(redissink.connect, config), str(config["key"]), query_id,
                               c.vertex_id, layout.redis_sink_dir(c.data_dir, c.job_id, c.vertex_id), c.job_id,
                               batch_id, attempts)


class KafkaSink(SinkSide):
    """Each batch produced into the sink's topic (`kafkasink`): exactly once, in one transaction
    with its marker, by the run's producer, made (every earlier producer of the sink fenced and
    its open transaction aborted) when the run starts; or at least once. A run that ends aborts
    a transaction left open."""

    def __init__(self, context: SinkContext):
        super().__init__(context)
        self._producer: kafkasink.KafkaSinkProducer | None = None

    def prepare(self, query_id: str = "") -> None:
        self.close()
        if query_id:
            self._producer = kafkasink.KafkaSinkProducer.open(self.context.config, query_id, self.context.vertex_id)

    def commit(self, batch_id: int, attempts: dict[int, int], query_id: str) -> None:
        self.commit_fenced(batch_id, attempts, query_id, streamsinks.no_fence)

    def commit_fenced(self, batch_id: int, attempts: dict[int, int], query_id: str, fence: Callable[[], None]) -> None:
        if self._producer is None or self._producer.owner_id != query_id:
            self.prepare(query_id)
        assert self._producer is not None
        c = self.context
        kafkasink.commit_batch(self._producer, layout.kafka_sink_dir(c.data_dir, c.job_id, c.vertex_id), c.job_id,
                               batch_id, attempts, fence)

    def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.close()


class DeltaSink(SinkSide):
    def commit(self, batch_id: int, attempts: dict[int, int], query_id: str) -> None:
        config = self.context.config
        deltatables.commit_stream_batch(str(config["path"]), query_id, self.context.job_id, batch_id, attempts,
                                        str(config.get("mode", "append")))
