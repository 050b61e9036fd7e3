"""The `ktm` command line: parse flags, load config, build objects, call one run().

Every error the project knows ends as one readable line and an exit code (2 usage/config,
1 runtime); tracebacks only with --debug.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

import click

from relay import __version__
from relay.errors import ConfigError, KtmError

log = logging.getLogger("relay")

MODES = ("single", "failover")


def _run_guarded(debug: bool, fn: Callable[[], int]) -> int:
    """Map the project's errors to an exit code and one line on stderr."""
    try:
        return fn()
    except KtmError as exc:
        if debug:
            logging.getLogger("relay").exception("failed")
        click.echo(f"ktm: error: {exc}", err=True)
        return exc.exit_code
    except Exception as exc:  # noqa: BLE001 - the operator gets one line, --debug the rest
        if debug:
            logging.getLogger("relay").exception("unexpected failure")
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


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="ktm")
def main() -> None:
    """ktm (Kafka Topic Mirror): relay Kafka topics between clusters on Spark, losing nothing."""


@main.command("relay")
@click.option(
    "--config",
    "config_path",
    default="config.toml",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="TOML config file.",
)
@click.option(
    "--mode",
    type=click.Choice(MODES),
    default="single",
    show_default=True,
    help="single: the first [[sources]] cluster; failover: all, switching on failure or lag.",
)
@click.option(
    "--stop-at-end", is_flag=True, help="Relay up to the end offsets seen at start-up, then exit 0."
)
@click.option(
    "--filter",
    "filter_paths",
    multiple=True,
    type=click.Path(dir_okay=False),
    help="Filter plugin file (repeatable); see filters/README.md.",
)
@click.option("--master", default=None, help="Spark master URL; overrides [spark].master.")
@click.option(
    "--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True
)
@click.option("--debug", is_flag=True, help="Debug logs, tracebacks, config dump, Spark log path.")
def relay_command(
    config_path: str,
    mode: str,
    stop_at_end: bool,
    filter_paths: Sequence[str],
    master: str | None,
    log_format: str,
    debug: bool,
) -> None:
    """Copy the configured topics from the source to the target."""
    code = _run_guarded(
        debug,
        lambda: _relay(config_path, mode, stop_at_end, filter_paths, master, log_format, debug),
    )
    sys.exit(code)


def _relay(
    config_path: str,
    mode: str,
    stop_at_end: bool,
    filter_paths: Sequence[str],
    master: str | None,
    log_format: str,
    debug: bool,
) -> int:
    from relay.config import load_config
    from relay.logs import setup_logging

    setup_logging("info", debug=debug, fmt=log_format)
    cfg = load_config(config_path, cli_filters=filter_paths)
    setup_logging(cfg.app.log_level, debug=debug, fmt=log_format)
    if debug:
        log.debug("config: %s", cfg.redacted())
    if mode == "failover" and len(cfg.sources) < 2:
        raise ConfigError(
            f"--mode failover: needs at least two [[sources]] nodes, {config_path} has "
            f"{len(cfg.sources)}"
        )
    return _run_relay(cfg, mode == "failover", stop_at_end, master, debug)


def _run_relay(cfg: Any, failover: bool, stop_at_end: bool, master: str | None, debug: bool) -> int:
    from relay.driver import Relay
    from relay.filters import FilterSpec, validate_filters
    from relay.metrics import Metrics, MetricsServer

    specs = tuple(
        FilterSpec.from_file(
            f.id,
            f.path,
            f.config_dict(),
            on_error=f.on_error,
            check_id=f.from_section,
            section=f.id if f.from_section else None,
        )
        for f in cfg.filters
    )
    validate_filters(specs)
    stop = threading.Event()
    install_signal_handlers(stop)
    metrics = Metrics()
    relay = Relay(
        cfg,
        stop_at_end=stop_at_end,
        stop_event=stop,
        metrics=metrics,
        filters=specs,
        master=master,
        failover=failover,
    )
    server = None
    if cfg.app.metrics_addr is not None:
        server = MetricsServer(metrics, cfg.app.metrics_addr, lambda: (True, {}))
    try:
        relay.prepare()
        summary = relay.run()
    finally:
        relay.close()
        if server is not None:
            server.close()
    if debug and relay.log_path:
        log.debug("spark log: %s", relay.log_path)
    how = "stopped by signal" if summary.stopped_by_signal else "done"
    log.info(
        "%s: %d records relayed, %d filtered, in %.1fs (spark start %.1fs, %d epochs, "
        "epoch overhead %.1fs)",
        how,
        summary.relayed,
        summary.filtered,
        summary.elapsed,
        summary.spark_start,
        summary.epochs,
        summary.epoch_overhead,
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    main()
