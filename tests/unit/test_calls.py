"""Start-up calls: a cluster that answers "not now" is waited for; a silent one is given up on
after the configured tries, with an error naming it."""

from __future__ import annotations

import dataclasses
import threading

import pytest
from kafka.errors import CoordinatorLoadInProgressError, KafkaConnectionError

from relay.config import AppConfig, ClusterConfig, Config, SourcePoolConfig, SparkConfig, TopicRoute
from relay.engine.driver.retry import RetryPolicy
from relay.engine.metrics import Metrics
from relay.errors import KafkaSetupError
from relay.pipelines.calls import Calls

SOURCE = ClusterConfig(name="src", servers=("127.0.0.1:2",))


def calls() -> Calls:
    """The tests' own retry settings: one retry, 0.1 s apart."""
    pool = dataclasses.replace(SourcePoolConfig(), max_retries=1, backoff_min=0.1, backoff_max=0.2)
    route = TopicRoute("t", "t-copy")
    cfg = Config(path="c.toml", app=AppConfig(), spark=SparkConfig(), topics=(route,),
                 sources=(SOURCE,), source_pool=pool, target=None, filters=())  # fmt: skip
    return Calls(cfg, threading.Event(), Metrics(), lambda: "src (127.0.0.1:2)")


def answers(*outcomes: BaseException | str):
    """A request whose answers are `outcomes`, in order."""
    left = list(outcomes)

    def ask() -> str:
        outcome = left.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    return ask


def test_a_coordinator_still_loading_is_asked_again_beyond_the_configured_retries() -> None:
    """Seen in CI on a 3-node Kafka just started: the group's OffsetFetch answered
    COORDINATOR_LOAD_IN_PROGRESS twice, and a relay with 1 retry gave up at start-up."""
    loading = [CoordinatorLoadInProgressError("OffsetFetchResponse")] * 4
    assert calls().call("source", answers(*loading, "offsets")) == "offsets"


def test_a_cluster_that_never_answers_is_given_up_after_the_configured_tries() -> None:
    refused = [KafkaConnectionError("111 ECONNREFUSED")] * 3
    with pytest.raises(KafkaSetupError, match=r"^source src \(127.0.0.1:2\): unreachable after 2 "
                       r"attempts: .*ECONNREFUSED"):  # fmt: skip
        calls().call("source", answers(*refused, "never"))


def test_a_policy_without_backoff_still_waits_for_a_loading_coordinator() -> None:
    """backoff_min = 0 is allowed; the patient policy must still end and still wait."""
    patient = RetryPolicy(1, 0.0, 0.0).patient(10.0)
    waits = [patient.wait(attempt) for attempt in range(1, patient.max_retries + 1)]
    assert 10.0 <= sum(waits) <= 11.0 and max(waits) == 1.0 and min(waits) == 0.1
