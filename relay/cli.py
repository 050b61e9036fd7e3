"""The `ktm` command line: parse flags, load config, build objects, call one run().

Every error the project knows ends as one readable line and an exit code (2 usage/config,
1 runtime); tracebacks only with --debug.
"""

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
from types import FrameType
from typing import TYPE_CHECKING, Any

import click

from relay import __version__
from relay.errors import ConfigError, KtmError

if TYPE_CHECKING:
    from relay.config import Config
    from relay.driver.runner import Relay

log = logging.getLogger("relay")

MODES = ("single", "failover")


@dataclass(frozen=True)
class Options:
    config_path: str
    mode: str
    filter_paths: Sequence[str]
    log_format: str
    debug: bool
    stop_at_end: bool = False
    master: str | None = None
    progress: bool = True
    summary_json: str | None = None


def _run_guarded(debug: bool, fn: Callable[[], int]) -> int:
    """Map the project's errors to an exit code and one line on stderr."""
    try:
        return fn()
    except KtmError as exc:
        if debug:
            log.exception("failed")
        click.echo(f"ktm: error: {exc}", err=True)
        return exc.exit_code
    except Exception as exc:  # noqa: BLE001 - the operator gets one line, --debug the rest
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


def _common(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The options `relay` and `check` share."""
    options = [
        click.option(
            "--config",
            "config_path",
            default="config.toml",
            show_default=True,
            type=click.Path(dir_okay=False),
            help="TOML config file.",
        ),
        click.option(
            "--mode",
            type=click.Choice(MODES),
            default="single",
            show_default=True,
            help="single: the first [[sources]] cluster; failover: all, switching on failure/lag.",
        ),
        click.option(
            "--filter",
            "filter_paths",
            multiple=True,
            type=click.Path(dir_okay=False),
            help="Filter plugin file (repeatable); see filters/README.md.",
        ),
        click.option(
            "--log-format",
            type=click.Choice(["text", "json"]),
            default="text",
            show_default=True,
            help="json: one JSON object per log line, for log shippers.",
        ),
        click.option(
            "--debug", is_flag=True, help="Debug logs, tracebacks, config dump, Spark log path."
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="ktm")
def main() -> None:
    """ktm (Kafka Topic Mirror): relay Kafka topics between clusters on Spark, losing nothing."""


@main.command("relay")
@_common
@click.option(
    "--stop-at-end", is_flag=True, help="Relay up to the end offsets seen at start-up, then exit 0."
)
@click.option("--master", default=None, help="Spark master URL; overrides [spark].master.")
@click.option("--no-progress", is_flag=True, help="Plain progress log lines even on a terminal.")
@click.option(
    "--summary-json",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the run's numbers (records, times, next offsets) to this JSON file at the end.",
)
def relay_command(no_progress: bool, **flags: Any) -> None:
    """Copy the configured topics from the source to the target."""
    opts = Options(progress=not no_progress, **flags)
    sys.exit(_run_guarded(opts.debug, lambda: _relay(opts)))


@main.command("check")
@_common
def check_command(**flags: Any) -> None:
    """Validate the config, connect to the clusters, check topics, print the plan; relay nothing."""
    opts = Options(**flags)
    sys.exit(_run_guarded(opts.debug, lambda: _check(opts)))


def _load(opts: Options, console: Any = None) -> Config:
    from relay.config import load_config
    from relay.logs import setup_logging

    setup_logging("info", debug=opts.debug, fmt=opts.log_format, console=console)
    cfg = load_config(opts.config_path, cli_filters=opts.filter_paths)
    setup_logging(cfg.app.log_level, debug=opts.debug, fmt=opts.log_format, console=console)
    if opts.debug:
        log.debug("config: %s", cfg.redacted())
    if opts.mode == "failover" and len(cfg.sources) < 2:
        raise ConfigError(
            f"--mode failover: needs at least two [[sources]] nodes, {opts.config_path} has "
            f"{len(cfg.sources)}"
        )
    return cfg


def _build(cfg: Config, opts: Options, stop: threading.Event) -> Relay:
    from relay.driver.metrics import Metrics
    from relay.driver.runner import Relay
    from relay.filters import specs_from_config, validate_filters

    specs = specs_from_config(cfg.filters)
    validate_filters(specs)
    return Relay(
        cfg,
        stop_at_end=opts.stop_at_end,
        stop_event=stop,
        metrics=Metrics(),
        filters=specs,
        master=opts.master,
        failover=opts.mode == "failover",
    )


def _relay(opts: Options) -> int:
    from rich.console import Console

    from relay.driver.metrics import MetricsServer
    from relay.driver.progress import Progress

    live = opts.progress and opts.log_format == "text" and sys.stdout.isatty()
    console = Console() if live else None
    cfg = _load(opts, console)
    stop = threading.Event()
    install_signal_handlers(stop)
    with ExitStack() as resources:
        relay = resources.enter_context(_build(cfg, opts, stop))
        if cfg.app.metrics_addr is not None:
            server = MetricsServer(relay.metrics, cfg.app.metrics_addr, relay.status.health)
            resources.callback(server.close)
        relay.prepare(start_spark=True)
        with Progress(relay.status.snapshot, console):
            summary = relay.run()
    if opts.debug and relay.log_path:
        log.debug("spark log: %s", relay.log_path)
    first = "-" if summary.first_record is None else f"{summary.first_record:.1f}s"
    log.info(
        "%s: %d records relayed, %d filtered, in %.1fs (spark start %.1fs, first record after "
        "%s, %d rounds, %d slots)",
        "stopped by signal" if summary.stopped_by_signal else "done",
        summary.relayed,
        summary.filtered,
        summary.elapsed,
        summary.spark_start,
        first,
        summary.rounds,
        summary.slots,
    )
    if opts.summary_json:
        _write_summary(opts.summary_json, summary)
    return 0


def _write_summary(path: str, summary: Any) -> None:
    """The run's numbers for programs (the benchmark reads them instead of log lines)."""
    data = dataclasses.asdict(summary)
    data["next_offsets"] = {f"{t}/{p}": o for (t, p), o in sorted(summary.next_offsets.items())}
    try:
        with open(path, "w", encoding="utf-8") as out:
            json.dump(data, out, indent=2, sort_keys=True)
    except OSError as exc:
        raise ConfigError(f"--summary-json {path}: cannot write: {exc.strerror}") from exc


def _check(opts: Options) -> int:
    cfg = _load(opts)
    with _build(cfg, opts, threading.Event()) as relay:
        relay.prepare()
    snap = relay.status.snapshot()
    click.echo(f"config {opts.config_path}: ok; source node: {snap.active_node}")
    for row in snap.rows:
        r = row.route
        click.echo(
            f"  {r.topic}[{r.partition}] -> {r.target_topic}[{r.target_partition}]: "
            f"from offset {row.next_offset}, end {row.end}, lag {row.lag}"
        )
    click.echo(f"{len(snap.rows)} partitions, {snap.lag} records to relay; nothing was relayed")
    click.echo(_members_line(cfg, "relay"))
    return 0


def _members_line(cfg: Config, kind: str) -> str:
    """How many ktm processes run on this config now (they share its partitions)."""
    from relay.clients.admin import group_members

    group = f"{cfg.app.group_id}.{kind}"
    try:
        members = group_members(cfg.need_target().cluster, group, cfg.need_target().request_timeout)
    except Exception as exc:  # noqa: BLE001 - informative only
        return f"group {group}: members unknown ({type(exc).__name__}: {exc})"
    running = "no ktm process runs" if not members else f"{members} ktm process(es) run"
    return f"group {group}: {running} on this config now"


if __name__ == "__main__":  # pragma: no cover
    main()
