"""Pipelines run in-process, wired like the CLI does (without signal handlers and the metrics
server), on the test session's shared local SparkSession."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from relay.config import load_config
from relay.engine.driver.runner import Runner
from relay.engine.metrics import Metrics
from relay.pipelines.jobs import RunSummary, backup_job, relay_job, restore_job
from relay.pipelines.restore.driver import RestoreOptions
from relay.pipelines.verify.driver import VerifyPipeline, verify_all
from relay.pipelines.verify.plan import parse_partitions, plan_verify
from relay.pipelines.verify.spec import PartitionReport, Scope

NEEDS = {"relay": {"sources", "target"}, "backup": {"sources", "store"},
         "restore": {"store", "target"}}  # fmt: skip


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


def backup(conf: Path, stop_at_end: bool = True) -> RunSummary:
    runner = backup_job(load_config(conf), stop_at_end=stop_at_end, stop_event=threading.Event(),
                        metrics=Metrics())  # fmt: skip
    with runner:
        runner.prepare()
        return runner.run()


def restore(conf: Path, **options: Any) -> tuple[RunSummary, Runner]:
    runner = restore_job(load_config(conf), stop_at_end=not options.get("follow", False),
                         stop_event=threading.Event(), metrics=Metrics(),
                         options=RestoreOptions(**options))  # fmt: skip
    with runner:
        runner.prepare()
        return runner.run(), runner


def verify_once(
    conf: Path, engine: Any, kind: str = "relay", partitions: tuple[str, ...] = (),
    scope: Scope | None = None, failover: bool = False,
) -> list[PartitionReport]:  # fmt: skip
    """`ktm verify` (`--store` for kind "backup", `--from-store` for "restore"), whole."""
    cfg = load_config(conf, needs=frozenset(NEEDS[kind]))
    plan = plan_verify(cfg, kind, failover, parse_partitions(partitions), scope)
    return verify_all(VerifyPipeline(plan, 30.0), engine, lambda progress: None)


def assert_verified(reports: list[PartitionReport], records: int) -> None:
    """Every partition exact, `records` compared in all."""
    assert [r for r in reports if not r.exact] == []
    assert sum(r.compared for r in reports) == records


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

    def produced(self) -> float:
        """Records acknowledged by the destination so far (ktm_messages_produced_total)."""
        return sum(self._samples("ktm_messages_produced_total").values())

    def rounds(self) -> dict[str, int]:
        """Rounds ended so far, by reason (ktm_rounds_total)."""
        found = self._samples("ktm_rounds_total", "reason")
        return {reason: int(count) for reason, count in sorted(found.items())}

    def _samples(self, name: str, label: str = "") -> dict[str, float]:
        found: dict[str, float] = {}
        for metric in self.metrics.registry.collect():
            for sample in metric.samples:
                if sample.name == name:
                    key = sample.labels.get(label, "")
                    found[key] = found.get(key, 0.0) + sample.value
        return found

    def active(self, node: str) -> float | None:
        return self.metrics.registry.get_sample_value("ktm_active_node", {"node": node})
