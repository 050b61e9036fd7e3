"""The restore on an executor: stored segments read in chain order, their records written to
the destination with the same provenance a relay stamps (relay.pipelines.kafka_target)."""

from __future__ import annotations

from relay.batches import Origin, codecs
from relay.pipelines.kafka_target import KafkaTarget, KafkaWriter
from relay.pipelines.restore.spec import RestoreTask
from relay.pipelines.restore.store_reader import StoreReader
from relay.spec import PartitionWork
from relay.store.configured import cached_store


class RestoreSides(KafkaTarget):
    def __init__(self, task: RestoreTask):
        super().__init__(task.target, task.partitions, task.rules)
        self.task = task

    def reader(self) -> StoreReader:
        window = (self.task.from_time, self.task.until_time)
        return StoreReader(cached_store(self.task.store), self.task.store, self.task.follow, window)

    def writer(self, work: PartitionWork, latencies: list[float]) -> KafkaWriter:
        # Restored records carry the same provenance header as relayed ones, named after the
        # stored cluster: a relay into the same topic later resumes after the last one.
        origin = Origin(self.task.store.cluster, work.route.topic, work.route.partition)
        shape = (codecs.BY_NAME[self.target.compression], self.target.batch_size)
        return KafkaWriter(
            self.producer(), work.route, origin, latencies, shape, rules=self.rules_of(work)
        )
