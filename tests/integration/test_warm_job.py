"""The workers' warm job on the test session's real SparkContext: Spark has it before
Spark.warm returns, so the first round's tasks queue behind it on the slots instead of taking
them first (then the round's tasks opened their clients themselves and the warm job ran after
them for nothing: seen across a 240 ms link, 0.7-1.3 s later)."""

from __future__ import annotations

import operator
import time
from typing import Any, cast

import pytest

from relay.engine.spark import SUBMIT_WAIT, RoundJob

pytestmark = pytest.mark.timeout(60)

HOLD = 1.0  # seconds each warm task holds its slot


def test_a_job_submitted_right_after_the_warm_job_runs_behind_it(spark) -> None:
    context = spark._context
    slots = spark.slots
    # entry(sides, task) = operator.call(time.sleep, HOLD): a task that holds its slot, made
    # of functions Spark pickles by reference
    began = time.time()
    tasks: Any = [HOLD] * slots
    warm = RoundJob(context, 0, tasks, cast(Any, time.sleep), cast(Any, operator.call))
    warm.await_submitted(SUBMIT_WAIT)
    assert context.statusTracker().getJobIdsForGroup(warm.group)
    after = context.parallelize(range(slots), slots).map(lambda _: time.time()).collect()
    assert warm.wait(30) and warm.results() == []
    assert min(after) >= began + HOLD  # every slot was the warm job's first
