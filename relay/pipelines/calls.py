"""Start-up calls to a cluster or a store: bounded retries, then one clear error.

Everything a pipeline asks before any record moves goes through `Calls.call`: a cluster that
never answered is most likely a wrong address, so even `max_retries = -1` gives up after a few
tries. Errors name the cluster by its name and addresses, never its credentials.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from relay.clients.settings import describe, is_retriable, not_ready
from relay.config import Config
from relay.engine.driver.retry import policy_for, retrying
from relay.engine.metrics import Metrics
from relay.errors import KafkaSetupError, KtmError

T = TypeVar("T")


def timeout_of(cfg: Config) -> float:
    """Time limit of one start-up request: generous, a cluster may be slow to answer (10 s
    with the default health-check timeout, which holds a 300 ms link)."""
    return max(10.0, cfg.source_pool.request_timeout * 5)


class Calls:
    def __init__(
        self,
        cfg: Config,
        stop: threading.Event,
        metrics: Metrics,
        source: Callable[[], str] | None = None,
    ):
        """`source` names the source side in errors (None: the pipeline reads no source
        cluster; restore reads a store)."""
        self.cfg, self.stop, self.metrics, self.source = cfg, stop, metrics, source
        self.timeout = timeout_of(cfg)

    def call(self, side: str, fn: Callable[[], T], where: str | None = None) -> T:
        """`fn` with start-up retries on retriable errors; one clear error at the end."""
        policy = policy_for(self.cfg, side).bounded()
        patient = policy.patient(self.timeout)
        if where is None and side == "source" and self.source is not None:
            where = "source " + self.source()
        elif where is None:
            where = describe(self.cfg.need_target().cluster)
        try:
            turns = retrying(
                lambda exc: patient if exc is not None and not_ready(exc) else policy,
                is_retriable,
                self.stop,
                self.metrics,
            )
            for attempt in turns:
                with attempt:
                    return fn()
        except KtmError:
            raise
        except Exception as exc:
            if not_ready(exc):
                tries = patient.max_retries + 1
                raise KafkaSetupError(f"{where}: not ready after {tries} attempts: {exc}") from exc
            if is_retriable(exc):
                tries = policy.max_retries + 1
                raise KafkaSetupError(
                    f"{where}: unreachable after {tries} attempt{'s' if tries > 1 else ''}: {exc}"
                ) from exc
            raise KafkaSetupError(f"{where}: {exc}") from exc
        raise AssertionError("unreachable")  # pragma: no cover - reraise=True
