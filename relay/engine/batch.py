"""Pipelines that run as one Spark job: tasks planned over the slots, each run on an executor
to its end, their results added up by the driver (ktm compact). The long-running pipelines
(relay, backup, restore) run in rounds instead (relay.engine.driver.runner)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Generic, TypeVar

from relay.config import SparkConfig

if TYPE_CHECKING:  # pyspark is imported when a job starts, not before
    from relay.engine.spark import Spark

T = TypeVar("T")  # a task's spec (picklable)
R = TypeVar("R")  # a task's result (picklable)
S = TypeVar("S")  # the job's sum of them


class BatchPipeline(Generic[T, R, S]):
    """What a batch job says: its tasks for the slots there are, the function each task runs
    (a function of an importable module: Spark ships it by reference, and it runs on an
    executor), and what the results add up to."""

    kind: str
    run: Callable[[T], R]

    def tasks(self, slots: int) -> Sequence[T]:
        raise NotImplementedError

    def total(self, results: list[R]) -> S:
        raise NotImplementedError

    def slots_wanted(self) -> int:
        """How many slots local Spark should get: as many as the machine has by default."""
        return 64


def run_batch(pipeline: BatchPipeline[T, R, S], spark: SparkConfig, master: str | None) -> S:
    """Start Spark (the embedded local one unless `master` or [spark].master says otherwise),
    run the job, stop Spark."""
    from relay.engine.spark import Spark, default_master, make_log_dir

    chosen = master or spark.master or default_master(pipeline.slots_wanted())
    engine = Spark(spark, chosen, make_log_dir())
    try:
        return run_on(pipeline, engine)
    finally:
        engine.stop()


def run_on(pipeline: BatchPipeline[T, R, S], engine: Spark) -> S:
    """The job on a running engine (an embedding program's, or the tests' shared one)."""
    results = engine.run_batch(pipeline.tasks(engine.slots), pipeline.run)
    return pipeline.total(list(results))
