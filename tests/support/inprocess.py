"""A relay run in-process, wired like the CLI does (without signal handlers and the metrics
server), on the test session's shared local SparkSession."""

from __future__ import annotations

import threading
from pathlib import Path

from relay.config import load_config
from relay.engine.metrics import Metrics
from relay.pipelines.jobs import Relay, RunSummary


def relay_once(config: Path) -> tuple[RunSummary, Metrics]:
    """One stop-at-end run, wired like the CLI does (without signal handlers and metrics server)."""
    metrics = Metrics()
    relay = Relay(
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
