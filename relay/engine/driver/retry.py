"""Retry loops (tenacity) with bounds from the config side that failed.

Only retriable errors are retried; every retry is logged and counted; a stop request (signal)
ends a backoff at once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from tenacity import RetryCallState, Retrying, retry_if_exception

from relay.config import ClusterConfig, Config, TargetConfig
from relay.engine.metrics import Metrics
from relay.errors import RelayError

log = logging.getLogger(__name__)

STARTUP_ATTEMPTS_WHEN_FOREVER = 5  # "-1 = forever" applies once the relay has started
NOT_READY_WAIT = 1.0  # seconds: the longest wait between asks of a coordinator that is loading
NOT_READY_FIRST = 0.1  # ... and the shortest


class RetriableRoundError(RelayError):
    """Something failed with a retriable error; `side` ("source"/"target") picks the policy."""

    def __init__(self, message: str, side: str):
        super().__init__(message)
        self.side = side


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int  # -1 = forever
    backoff_min: float
    backoff_max: float

    def wait(self, attempt: int) -> float:
        return float(min(self.backoff_max, self.backoff_min * 2 ** max(0, attempt - 1)))

    def bounded(self) -> RetryPolicy:
        """The policy for start-up: nothing runs yet, so an endless wait helps no one."""
        if self.max_retries >= 0:
            return self
        return RetryPolicy(STARTUP_ATTEMPTS_WHEN_FOREVER, self.backoff_min, self.backoff_max)

    def patient(self, budget: float) -> RetryPolicy:
        """For a cluster that answered "not now" (relay.clients.settings.not_ready): waits of
        at most NOT_READY_WAIT over at least `budget` seconds, however few retries the policy
        for a silent cluster allows (a test's 1 retry of 0.1 s gave up on a coordinator that
        was still loading after a broker's start)."""
        # a floor: backoff_min may be 0, and asking a loading coordinator 10 times a second
        # is already more than it needs
        low = min(max(self.backoff_min, NOT_READY_FIRST), NOT_READY_WAIT)
        patient = RetryPolicy(0, low, NOT_READY_WAIT)
        tries, waited = 0, 0.0
        while waited < budget:
            tries += 1
            waited += patient.wait(tries)
        return replace(patient, max_retries=max(self.max_retries, tries))


def policy_for(cfg: Config, side: str) -> RetryPolicy:
    if side == "source":
        pool = cfg.source_pool
        return RetryPolicy(pool.max_retries, pool.backoff_min, pool.backoff_max)
    # The writing side: the target cluster, or for a backup (no [target]) the store, which
    # gets the target's default policy.
    target = cfg.target or TargetConfig(ClusterConfig("store", ("-:1",)))
    return RetryPolicy(target.max_retries, target.backoff_min, target.backoff_max)


def retrying(
    policy_of: Callable[[BaseException | None], RetryPolicy],
    retriable: Callable[[BaseException], bool],
    stop_event: threading.Event,
    metrics: Metrics,
) -> Retrying:
    """A tenacity loop: `for attempt in retrying(...): with attempt: ...`; re-raises at the end."""
    turns = _Turns(policy_of, stop_event, metrics)
    return Retrying(
        retry=retry_if_exception(retriable),
        stop=turns.exhausted,
        wait=turns.wait,
        sleep=turns.sleep,
        before_sleep=turns.before_sleep,
        reraise=True,
    )


class _Turns:
    """How `retrying` goes on: the policy of the error met decides how often and how long."""

    def __init__(
        self,
        policy_of: Callable[[BaseException | None], RetryPolicy],
        stop_event: threading.Event,
        metrics: Metrics,
    ):
        self.policy_of, self.stop_event, self.metrics = policy_of, stop_event, metrics

    def exhausted(self, state: RetryCallState) -> bool:
        policy = self.policy_of(_outcome(state))
        if self.stop_event.is_set():
            return True
        return policy.max_retries >= 0 and state.attempt_number > policy.max_retries

    def wait(self, state: RetryCallState) -> float:
        return self.policy_of(_outcome(state)).wait(state.attempt_number)

    def before_sleep(self, state: RetryCallState) -> None:
        exc = _outcome(state)
        side = getattr(exc, "side", "startup")
        self.metrics.retries.labels(side).inc()
        if side == "target":
            self.metrics.produce_retries.inc()
        policy = self.policy_of(exc)
        limit = "forever" if policy.max_retries < 0 else f"of {policy.max_retries + 1}"
        wait = self.wait(state)
        log.warning(
            "attempt %d %s failed, retrying in %.1fs: %s", state.attempt_number, limit, wait, exc
        )

    def sleep(self, seconds: float) -> None:
        self.stop_event.wait(seconds)  # a signal ends a backoff at once


def _outcome(state: RetryCallState) -> BaseException | None:
    return state.outcome.exception() if state.outcome else None
