"""A rejoin (partitions found while running) must end in an assignment, or fail loudly."""

from __future__ import annotations

import time

import pytest

from relay.config import ClusterConfig
from relay.engine.driver.membership import Membership
from relay.engine.metrics import Metrics
from relay.errors import KafkaSetupError


def test_a_rejoin_without_an_assignment_in_time_fails_naming_the_group():
    membership = Membership(ClusterConfig("target", ("t:1",)), "ktm.relay", ["d"], [("t", 0)],
                            2.0, Metrics())  # fmt: skip
    assert membership.current() is None  # rebalancing, no deadline: wait
    membership._rejoin_deadline = time.monotonic() - 1  # a rejoin that never completed
    with pytest.raises(KafkaSetupError, match=r"group ktm.relay on .*: no assignment within 18s"):
        membership.current()
