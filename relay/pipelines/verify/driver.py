"""`ktm verify` on the driver: the plan's destination partitions spread over the slots, checked
in passes (each a batch job of relay.engine.batch); the plan itself is
relay.pipelines.verify.plan.

A pass reads for a few seconds and hands every partition's state back, so the driver can show
progress and the next pass goes on from there; once every partition reached its end, the
reports are final. Following a running copy (`--follow`), the passes never end: each reads up
to what is there, settles, and the driver exports what it verified.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from relay.engine.batch import BatchPipeline, run_on
from relay.pipelines.verify.executor import run
from relay.pipelines.verify.plan import VerifyPlan
from relay.pipelines.verify.spec import (
    DestWork,
    PartitionReport,
    VerifyResult,
    VerifyTask,
    WorkState,
)

PASS_SECONDS = 2.0  # how long a pass reads before it reports
# Following a running copy, a pass reads only what came since the last one: one task serves
# this many destination partitions (each task of a pass costs Spark's scheduling, every pass).
FOLLOW_PER_TASK = 64


@dataclass(frozen=True)
class Progress:
    read: int  # destination records read so far
    total: int  # destination records to read (0 when not known: --follow)
    done: bool


class VerifyPipeline(BatchPipeline[VerifyTask, VerifyResult, list[VerifyResult]]):
    """One pass per `run_on`; the states of every partition kept between passes."""

    kind = "verify"
    run = staticmethod(run)

    def __init__(
        self,
        plan: VerifyPlan,
        timeout: float,
        *,
        follow: bool = False,
        budget: float = PASS_SECONDS,
    ):
        self.plan, self.timeout, self.follow, self.budget = plan, timeout, follow, budget
        self.states: list[WorkState | None] = [None] * len(plan.works)
        self._bins: list[list[int]] | None = None  # work indexes per task, kept across passes
        self.read = 0

    def tasks(self, slots: int) -> Sequence[VerifyTask]:
        """The destination partitions spread over the slots once, biggest first, each to the
        least loaded task (a destination partition is read by one task, in order)."""
        if self._bins is None:
            wanted = -(-len(self.plan.works) // FOLLOW_PER_TASK) if self.follow else slots
            self._bins = spread(self.plan.works, min(slots, wanted))
        p = self.plan
        return [
            VerifyTask(
                p.source,
                p.target,
                p.clusters,
                tuple(p.works[i] for i in indexes),
                tuple(self.states[i] for i in indexes),
                p.filters,
                self.timeout,
                p.scope,
                self.budget,
                self.follow,
            )
            for indexes in self._bins
        ]

    def total(self, results: list[VerifyResult]) -> list[VerifyResult]:
        assert self._bins is not None
        for indexes, result in zip(self._bins, results, strict=True):
            for i, state in zip(indexes, result.states, strict=True):
                self.states[i] = state
            self.read += result.read
        return results

    def slots_wanted(self) -> int:
        return max(1, len(self.plan.works))

    def progress(self) -> Progress:
        total = 0 if self.follow else sum(_size(work) for work in self.plan.works)
        return Progress(self.read, total, self.done)

    @property
    def done(self) -> bool:
        return not self.follow and all(s is not None and s.done for s in self.states)

    def reports(self) -> list[PartitionReport]:
        out = [
            report
            for work, state in zip(self.plan.works, self.states, strict=True)
            if state is not None
            for report in state.reports(work)
        ]
        return sorted(out, key=lambda r: (r.key is None, r.key or ("", 0), r.dest))


def verify_all(
    pipeline: VerifyPipeline, engine: object, on_pass: Callable[[Progress], None]
) -> list[PartitionReport]:
    """Passes until every partition is checked to its end."""
    while not pipeline.done:
        run_on(pipeline, engine)  # type: ignore[arg-type]
        on_pass(pipeline.progress())
    return pipeline.reports()


def spread(works: Sequence[DestWork], slots: int) -> list[list[int]]:
    """Indexes of `works` in bins, biggest first into the least loaded, at most `slots`."""
    bins: list[list[int]] = [[] for _ in range(max(1, min(slots, len(works))))]
    loads = [0] * len(bins)
    for i in sorted(range(len(works)), key=lambda i: _size(works[i]), reverse=True):
        least = loads.index(min(loads))
        bins[least].append(i)
        loads[least] += _size(works[i])
    return [sorted(b) for b in bins if b]


def _size(work: DestWork) -> int:
    return work.end - work.start
