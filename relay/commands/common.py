"""What every command shares: options, config loading, error mapping, signals, one run of a
pipeline with its metrics server, progress view and summary."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from types import FrameType
from typing import TYPE_CHECKING

import click

from relay.errors import ConfigError, KtmError, RelayError, StoppedWhileWaiting

if TYPE_CHECKING:
    from rich.console import Console

    from relay.config import ClusterConfig, Config
    from relay.engine.driver.runner import Runner, RunSummary

log = logging.getLogger("relay")


@dataclass(frozen=True)
class Options:
    config_path: str
    log_format: str
    debug: bool
    mode: str = "single"
    filter_paths: Sequence[str] = ()
    stop_at_end: bool = False
    master: str | None = None
    progress: bool = True
    summary_json: str | None = None


def run_guarded(debug: bool, fn: Callable[[], int]) -> int:
    """Map the project's errors to an exit code and one line on stderr."""
    try:
        return fn()
    except StoppedWhileWaiting as exc:
        log.info("%s", exc)
        return exc.exit_code
    except KtmError as exc:
        if debug:
            log.exception("failed")
        click.echo(f"ktm: error: {exc}", err=True)
        return exc.exit_code
    except Exception as exc:
        if debug:
            log.exception("unexpected failure")
        click.echo(f"ktm: internal error: {type(exc).__name__}: {exc}", err=True)
        if not debug:
            click.echo("ktm: run again with --debug for the traceback", err=True)
        return 1


def install_signal_handlers(stop: threading.Event) -> None:
    """First SIGINT/SIGTERM asks for a clean stop; a second one exits at once."""

    def handle(signum: int, _frame: FrameType | None) -> None:
        if stop.is_set():
            os._exit(130)
        stop.set()

    signal.signal(signal.SIGINT, handle)
    signal.signal(signal.SIGTERM, handle)


def load(opts: Options, needs: frozenset[str], console: Console | None = None) -> Config:
    from relay.config import load_config
    from relay.logs import setup_logging

    setup_logging("info", debug=opts.debug, fmt=opts.log_format, console=console)
    cfg = load_config(opts.config_path, cli_filters=opts.filter_paths, needs=needs)
    setup_logging(cfg.app.log_level, debug=opts.debug, fmt=opts.log_format, console=console)
    if opts.debug:
        log.debug("config: %s", cfg.redacted())
    if "store" in needs and not cfg.topics:
        raise ConfigError(
            f"[topics]: {opts.config_path} names no topic; ktm backup, restore and compact take "
            "the topics named there ([discover] patterns are for ktm relay)"
        )
    if opts.mode == "failover" and len(cfg.sources) < 2:
        raise ConfigError(
            f"--mode failover: needs at least two [[sources]] nodes, {opts.config_path} has "
            f"{len(cfg.sources)}"
        )
    from relay import internals

    internals.check()  # the libraries' private parts ktm relies on: one line if one moved
    return cfg


def run_pipeline(
    opts: Options,
    needs: frozenset[str],
    build: Callable[[Config, threading.Event], Runner],
    after: Callable[[Config, Runner], None] | None = None,
) -> int:
    """Load, build, serve metrics, show progress, run to the end (or a signal), summarize."""
    from rich.console import Console

    from relay.engine.driver.progress import Progress
    from relay.engine.metrics_server import MetricsServer

    live = opts.progress and opts.log_format == "text" and sys.stdout.isatty()
    console = Console() if live else None
    cfg = load(opts, needs, console)
    stop = threading.Event()
    install_signal_handlers(stop)
    with ExitStack() as resources:
        runner = resources.enter_context(build(cfg, stop))
        if cfg.app.metrics_addr is not None:
            server = MetricsServer(runner.metrics, cfg.app.metrics_addr, runner.status.health)
            resources.callback(server.close)
        runner.prepare(start_spark=True)
        with Progress(runner.status.snapshot, console, title=runner.pipeline.kind):
            summary = runner.run()
    if opts.debug and runner.log_path:
        log.debug("spark log: %s", runner.log_path)
    if after is not None and not summary.stopped_by_signal:
        after(cfg, runner)
    log_summary(summary, runner.pipeline.kind)
    if opts.summary_json:
        write_summary(opts.summary_json, summary)
    if summary.halted and not summary.stopped_by_signal:
        raise RelayError(halted_line(summary.halted))
    if summary.records_lost and runner.stop_at_end and not summary.stopped_by_signal:
        raise RelayError(lost_line(summary.lost))  # the copy is not the source's whole log
    return 0


def halted_line(halted: list[dict[str, object]]) -> str:
    """The run's end with halted partitions: each named, with what to do."""
    where = ", ".join(
        f"{h['source_topic']}[{h['source_partition']}] at offset {h['offset']} "
        f"(-> {h['target_topic']}[{h['target_partition']}])"
        for h in halted
    )  # Halt.where, from the summary
    return (
        f"{len(halted)} partition(s) halted: {where}; every other record was relayed. The log's "
        "'halted source partition' line says why: a destination config that refuses a record "
        "(change it, or drop the record with a filter), or source records lost before they "
        "were copied (see docs/troubleshooting.md); then run again"
    )


def lost_line(lost: dict[str, int]) -> str:
    """The end of a --stop-at-end run that went on past lost source records."""
    where = ", ".join(f"{key}: {count}" for key, count in sorted(lost.items()))
    return (
        f"{sum(lost.values())} source records were lost before they were copied ({where}); "
        "every other record was copied. The log's 'source records deleted' lines name the "
        "offsets (see docs/troubleshooting.md)"
    )


def log_summary(summary: RunSummary, kind: str) -> None:
    verb = {"relay": "relayed", "backup": "backed up", "restore": "restored"}[kind]
    first = "-" if summary.first_record is None else f"{summary.first_record:.1f}s"
    log.info(
        "%s: %d records %s, %d filtered, in %.1fs (spark start %.1fs, first record after "
        "%s, rounds %d, slots %d)",
        "stopped by signal" if summary.stopped_by_signal else "done",
        summary.relayed,
        verb,
        summary.filtered,
        summary.elapsed,
        summary.spark_start,
        first,
        summary.rounds,
        summary.slots,
    )


def write_summary(path: str, summary: RunSummary) -> None:
    """The run's numbers for programs (the benchmark reads them instead of log lines)."""
    data = dataclasses.asdict(summary)
    data["next_offsets"] = {f"{t}/{p}": o for (t, p), o in sorted(summary.next_offsets.items())}
    try:
        with open(path, "w", encoding="utf-8") as out:
            json.dump(data, out, indent=2, sort_keys=True)
    except OSError as exc:
        raise ConfigError(f"--summary-json {path}: cannot write: {exc.strerror}") from exc


class TimeParam(click.ParamType[int, str | int]):
    """A point in time: ISO 8601 ("2026-11-23T10:00:00Z", "2026-11-23"; no zone means UTC)
    or milliseconds since the epoch. Converted to milliseconds."""

    name = "TIME"

    def convert(
        self, value: str | int, param: click.Parameter | None, ctx: click.Context | None
    ) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip()
        if text.isdigit():
            return int(text)
        try:
            moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            self.fail(f"{text!r} is not an ISO 8601 time or milliseconds since the epoch")
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return int(moment.timestamp() * 1000)


def members_line(cluster: ClusterConfig, timeout: float, group: str) -> str:
    """How many ktm processes run on this config now (they share its partitions)."""
    from relay.clients.consumer_groups import group_members

    try:
        members = group_members(cluster, group, timeout)
    except Exception as exc:  # noqa: BLE001 - informative only
        return f"group {group}: members unknown ({type(exc).__name__}: {exc})"
    running = "no ktm process runs" if not members else f"{members} ktm process(es) run"
    return f"group {group}: {running} on this config now"
