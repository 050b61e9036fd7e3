"""A relay run in-process, wired like the CLI does (without signal handlers and the metrics
server), on the test session's shared local SparkSession."""

from __future__ import annotations

import threading
from pathlib import Path

from relay.config import load_config
from relay.engine.metrics import Metrics
from relay.pipelines.jobs import RunSummary, relay_job


def relay_once(config: Path) -> tuple[RunSummary, Metrics]:
    """One stop-at-end run, wired like the CLI does (without signal handlers and metrics server)."""
    metrics = Metrics()
    relay = relay_job(
        load_config(config), stop_at_end=True, stop_event=threading.Event(), metrics=metrics
    )
    try:
        relay.prepare()
        summary = relay.run()
    finally:
        relay.close()
    return summary, metrics


def produced_metric(metrics: Metrics, src: str, p: int, dst: str, dst_p: int) -> float | None:
    labels = {
        "source_topic": src,
        "source_partition": str(p),
        "target_topic": dst,
        "target_partition": str(dst_p),
    }
    return metrics.registry.get_sample_value("ktm_messages_produced_total", labels)


class Background:
    """A relay on its own thread, stopped through its stop event like a signal would."""

    def __init__(self, config: Path, stop_at_end: bool = False, failover: bool = True):
        self.metrics = Metrics()
        self.stop = threading.Event()
        self.relay = relay_job(
            load_config(config),
            stop_at_end=stop_at_end,
            stop_event=self.stop,
            metrics=self.metrics,
            failover=failover,
        )
        self.summary: RunSummary | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.relay.prepare()
            self.summary = self.relay.run()
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            self.error = exc
        finally:
            self.relay.close()

    def finish(self, timeout: float = 30) -> None:
        self.stop.set()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "relay did not stop within its timeout"

    def failovers(self, reason: str | None = None) -> float:
        total = 0.0
        for metric in self.metrics.registry.collect():
            if metric.name != "ktm_failovers":
                continue
            for sample in metric.samples:
                if sample.name.endswith("_total") and reason in (None, sample.labels["reason"]):
                    total += sample.value
        return total

    def active(self, node: str) -> float | None:
        return self.metrics.registry.get_sample_value("ktm_active_node", {"node": node})
