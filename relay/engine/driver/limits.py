"""`[limits]` shared out: the whole group of processes on a config reads at most the limit; each
process takes the share of the config's partitions it owns (the members' shares sum to the
limit), split evenly between its tasks (their partitions are balanced by expected work)."""

from __future__ import annotations

from relay.config import LimitsConfig
from relay.engine.metrics import Metrics
from relay.spec import Rates


class Shares:
    def __init__(self, limits: LimitsConfig, metrics: Metrics):
        self.limits, self.metrics = limits, metrics
        self.partitions = 1  # the config's (grows with partitions found while running)
        self.owned = 0

    def own(self, owned: int, partitions: int) -> None:
        """This process owns `owned` of the config's `partitions` now; shown in metrics."""
        self.owned, self.partitions = owned, max(1, partitions)
        rates = self.of_task(1)
        self.metrics.limit.labels("records").set(rates.records_per_second)
        self.metrics.limit.labels("bytes").set(rates.bytes_per_second)

    def of_task(self, tasks: int) -> Rates:
        """One task's rates when this process runs `tasks` of them."""
        share = self.owned / self.partitions / max(1, tasks)
        limits = self.limits
        return Rates(limits.records_per_second * share, limits.bytes_per_second * share)
