"""`ktm verify`: prove a copy exact, record by record (Spark jobs that read both sides and write
nothing): a relay's destinations against their sources, a backup's store against its sources
(`--store`), a restore's destinations against the store (`--from-store`). Exit 0 exact, 1
something differs, 2 it could not verify (bad input, a cluster out of reach).

`--follow` keeps verifying behind a running copy (relay.pipelines.verify.follow)."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

from relay.commands.common import Options, install_signal_handlers, load
from relay.errors import ConfigError, KtmError
from relay.pipelines.verify.spec import Scope

if TYPE_CHECKING:
    from relay.config import Config
    from relay.engine.spark import Spark
    from relay.pipelines.verify.driver import Progress
    from relay.pipelines.verify.plan import VerifyPlan
    from relay.pipelines.verify.spec import PartitionReport

log = logging.getLogger(__name__)
NEEDS = {
    "relay": frozenset({"sources", "target"}),
    "backup": frozenset({"sources", "store"}),
    "restore": frozenset({"store", "target"}),
}


class VerifyError(KtmError):
    """ktm verify could not verify: it says nothing about the copy (exit 2, not 1)."""

    exit_code = 2


@dataclass(frozen=True)
class VerifyOptions:
    kind: str = "relay"  # "backup": --store; "restore": --from-store
    partitions: Sequence[str] = ()
    report_path: Path | None = None
    scope: Scope = Scope()
    follow: bool = False


def verify(opts: Options, options: VerifyOptions) -> int:
    from relay.pipelines.verify.driver import VerifyPipeline, verify_all

    cfg = load(opts, NEEDS[options.kind])
    began = time.monotonic()
    with _could_not_verify():
        plan = _plan(cfg, opts, options)
        pipeline = VerifyPipeline(plan, _timeout(cfg), follow=options.follow)
        with _engine(cfg, opts, pipeline.slots_wanted()) as engine:
            if options.follow:
                from relay.pipelines.verify.follow import follow

                stop = threading.Event()
                install_signal_handlers(stop)
                return follow(cfg, pipeline, engine, stop)
            ready = time.monotonic()
            with _bar(opts, pipeline.progress().total) as on_pass:
                reports = verify_all(pipeline, engine, on_pass)
            timing = {
                "start": round(ready - began, 2),
                "passes": round(time.monotonic() - ready, 2),
            }
    return _report(reports, timing, options)


def _report(
    reports: list[PartitionReport], timing: dict[str, float], options: VerifyOptions
) -> int:
    """The numbers logged, every partition not plainly exact and the summary printed, the
    report written if asked for; 1 if the copy differs."""
    from relay.pipelines.verify import report

    compared = sum(r.compared for r in reports)
    log.info(
        "verify: %d records compared in %.1fs (%.0f/s), after %.1fs to plan and start Spark",
        compared,
        timing["passes"],
        compared / max(timing["passes"], 1e-9),
        timing["start"],
    )
    scope = options.scope.describe()
    for one in reports:
        if not one.exact or one.notes or one.deleted:
            click.echo(report.line(one, scope))
    click.echo(report.summary(reports, scope))
    if options.report_path is not None:
        report.write_json(options.report_path, reports, scope, timing)
    fault = report.first_fault(reports)
    if fault is not None:
        click.echo(f"ktm: verify: {fault}", err=True)
        return 1
    return 0


def _plan(cfg: Config, opts: Options, options: VerifyOptions) -> VerifyPlan:
    from relay.pipelines.verify.plan import parse_partitions, plan_verify

    selection = parse_partitions(options.partitions)
    failover = opts.mode == "failover"
    return plan_verify(cfg, options.kind, failover, selection, options.scope, options.follow)


@contextmanager
def _could_not_verify() -> Iterator[None]:
    """Anything but a config error or a found difference: exit 2, it says nothing of the copy."""
    try:
        yield
    except ConfigError:
        raise
    except VerifyError:
        raise
    except KtmError as exc:
        raise VerifyError(str(exc)) from exc
    except Exception as exc:
        raise VerifyError(f"{type(exc).__name__}: {exc}") from exc


@contextmanager
def _engine(cfg: Config, opts: Options, slots: int) -> Iterator[Spark]:
    from relay.engine.spark import Spark, default_master, make_log_dir

    chosen = opts.master or cfg.spark.master or default_master(slots)
    engine = Spark(cfg.spark, chosen, make_log_dir())
    try:
        yield engine
    finally:
        engine.stop()


@contextmanager
def _bar(opts: Options, total: int) -> Iterator[Callable[[Progress], None]]:
    """A rich progress bar with an ETA on a terminal; nothing otherwise."""
    if not (opts.progress and opts.log_format == "text" and sys.stdout.isatty()):
        yield lambda progress: None
        return
    from rich import progress as rich

    columns = (
        rich.TextColumn("verify"),
        rich.BarColumn(),
        rich.TextColumn("{task.completed:,} / {task.total:,} records"),
        rich.TimeRemainingColumn(),
    )
    with rich.Progress(*columns, transient=True) as bar:
        task = bar.add_task("verify", total=max(total, 1))

        def on_pass(progress: Progress) -> None:
            bar.update(task, completed=progress.read, total=max(progress.total, progress.read))

        yield on_pass


def _timeout(cfg: Config) -> float:
    return cfg.source_pool.request_timeout * 5
