"""The relay on an executor: record batches read from the source node, rebuilt with their
provenance and written whole to the destination (relay.pipelines.kafka_target)."""

from __future__ import annotations

from collections.abc import Callable

from relay.batches import Origin, codecs
from relay.clients.consumer import SourceReader
from relay.clients.worker_cache import evict_reader, open_at_once, source_reader, warm_reader
from relay.engine.executor.failures import SourceFailure, opening
from relay.engine.executor.sides import topics_of
from relay.pipelines.kafka_target import KafkaTarget, KafkaWriter
from relay.pipelines.relay.spec import RelayTask
from relay.provenance.header import commit_mark
from relay.spec import PartitionWork


class RelaySides(KafkaTarget):
    """Relay reads record batches and writes them rebuilt (the batch path; filters see records
    decoded from the batches), unless kafka-python's internals are not the ones the batch path
    uses: then records are read, filtered and written one by one (the record path)."""

    def __init__(self, task: RelayTask):
        super().__init__(task.target, task.partitions, task.rules)
        self.task = task

    def reader(self) -> SourceReader:
        task = self.task
        batches = self.producer().takes_built
        with opening(SourceFailure):
            reader = source_reader(task.source, task.group_id, batches, task.fetch, seed=task.seed)
        routes = [work.route for work in task.partitions]
        reader.commit_marks = {r.key: commit_mark(r.incarnation) for r in routes if r.incarnation}
        return reader

    def writer(self, work: PartitionWork, latencies: list[float]) -> KafkaWriter:
        origin = Origin(self.task.source.name, *work.route.origin)
        target = self.target
        shape = (codecs.BY_NAME[target.compression], target.batch_size)
        return KafkaWriter(
            self.producer(),
            work.route,
            origin,
            latencies,
            shape,
            target.max_batch_bytes,
            self.rules_of(work),
        )

    def warm(self) -> None:
        """The producer and the source reader open side by side (the reader of record batches:
        the record path is a fallback the first round finds out about, and then opens its
        own)."""
        task = self.task
        open_at_once(
            super().warm,
            lambda: warm_reader(
                task.source, task.group_id, task.fetch, topics_of(self.partitions), task.seed
            ),
        )

    def evict(self, kind: str, waiting: Callable[[], object] | None = None) -> None:
        super().evict(kind, waiting)
        evict_reader(self.task.source, self.task.group_id, kind)
