"""The `ktm` command line: flags only. Each command parses its flags into options and calls its
module in relay.commands, which loads the config, builds the objects and runs.

Every error the project knows ends as one readable line and an exit code (2 usage/config,
1 runtime); tracebacks only with --debug.
"""

from __future__ import annotations

import atexit
import gc
import sys
from collections.abc import Callable
from typing import Required, TypedDict, Unpack

import click

from relay.commands.common import Options, TimeParam, run_guarded
from relay.config import parse_duration

MODES = ("single", "failover")


class OptionFlags(TypedDict, total=False):
    """The shared flags click hands a command, named as `Options` names them."""

    config_path: Required[str]
    log_format: Required[str]
    debug: Required[bool]
    mode: str
    filter_paths: tuple[str, ...]
    stop_at_end: bool
    master: str | None
    summary_json: str | None


class Flags(OptionFlags, total=False):
    """The shared flags as click names them (`--no-progress` is `Options.progress` negated)."""

    no_progress: bool


Command = Callable[..., None]


# The options several commands share, by name (each command picks its own, in order).
SHARED_OPTIONS = {
    "config": click.option(
        "--config",
        "config_path",
        default="config.toml",
        show_default=True,
        type=click.Path(dir_okay=False),
        help="TOML config file.",
    ),
    "mode": click.option(
        "--mode",
        type=click.Choice(MODES),
        default="single",
        show_default=True,
        help="single: the first [[sources]] cluster; failover: all, switching on failure/lag.",
    ),
    "filter": click.option(
        "--filter",
        "filter_paths",
        multiple=True,
        type=click.Path(dir_okay=False),
        help="Filter plugin file (repeatable); see filters/README.md.",
    ),
    "stop_at_end": click.option(
        "--stop-at-end",
        is_flag=True,
        help="Up to the end offsets seen at start-up, then exit 0.",
    ),
    "master": click.option(
        "--master", default=None, help="Spark master URL; overrides [spark].master."
    ),
    "progress": click.option(
        "--no-progress", is_flag=True, help="Plain progress log lines even on a terminal."
    ),
    "summary": click.option(
        "--summary-json",
        type=click.Path(dir_okay=False),
        default=None,
        help="Write the run's numbers (records, times, next offsets) to this JSON file.",
    ),
    "log_format": click.option(
        "--log-format",
        type=click.Choice(["text", "json"]),
        default="text",
        show_default=True,
        help="json: one JSON object per log line, for log shippers.",
    ),
    "debug": click.option(
        "--debug", is_flag=True, help="Debug logs, tracebacks, config dump, Spark log path."
    ),
}


def _options(*names: str) -> Callable[[Command], Command]:
    """The shared options a command takes, by name, in this order."""

    def apply(fn: Command) -> Command:
        for name in reversed((*names, "log_format", "debug")):
            fn = SHARED_OPTIONS[name](fn)
        return fn

    return apply


def _opts(no_progress: bool = False, **flags: Unpack[OptionFlags]) -> Options:
    return Options(progress=not no_progress, **flags)


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        from relay.commands.version import version_lines

        click.echo("\n".join(version_lines()))
        ctx.exit()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show ktm's version and those of Python, PySpark, kafka-python and Java, and exit.",
)
def main() -> None:
    """ktm (Kafka Topic Mirror): relay, back up and restore Kafka topics on Spark, losing
    nothing."""
    # The interpreter's last garbage collections walk every object still alive at exit: 0.17 s
    # after a relay of 2,000 partitions, 0.03 s with them frozen out (finalizers still run).
    atexit.register(gc.freeze)


@main.command("relay")
@_options("config", "mode", "filter", "stop_at_end", "master", "progress", "summary")
def relay_command(**flags: Unpack[Flags]) -> None:
    """Copy the configured topics from the source to the target."""
    from relay.commands.relay import relay

    opts = _opts(**flags)
    sys.exit(run_guarded(opts.debug, lambda: relay(opts)))


@main.command("check")
@_options("config", "mode", "filter")
def check_command(**flags: Unpack[Flags]) -> None:
    """Validate the config, reach the clusters and the store, print the plan; move nothing."""
    from relay.commands.check import check

    opts = _opts(**flags)
    sys.exit(run_guarded(opts.debug, lambda: check(opts)))


@main.command("backup")
@_options("config", "mode", "filter", "stop_at_end", "master", "progress", "summary")
def backup_command(**flags: Unpack[Flags]) -> None:
    """Back the configured topics up into segments in [store], exactly once."""
    from relay.commands.relay import backup

    opts = _opts(**flags)
    sys.exit(run_guarded(opts.debug, lambda: backup(opts)))


@main.command("restore")
@_options("config", "master", "progress", "summary")
@click.option(
    "--stop-at-end", is_flag=True, help="Restore the segments present at start-up, then exit 0."
)
@click.option("--follow", is_flag=True, help="Keep restoring new segments as they land.")
@click.option("--from-time", type=TimeParam(), default=None, help="Only records from this time.")
@click.option("--until-time", type=TimeParam(), default=None, help="Only records before it.")
@click.option("--create-topics", is_flag=True, help="Create missing destination topics.")
@click.option("--groups", is_flag=True, help="Carry consumer-group offsets over, translated.")
def restore_command(
    follow: bool,
    from_time: int | None,
    until_time: int | None,
    create_topics: bool,
    groups: bool,
    **flags: Unpack[Flags],
) -> None:
    """Restore the configured topics from [store] into [target], exactly once."""
    from relay.commands.restore import restore
    from relay.pipelines.restore.driver import RestoreOptions

    opts = _opts(**flags)
    if follow and opts.stop_at_end:
        raise click.UsageError("--stop-at-end and --follow exclude each other")
    options = RestoreOptions(follow, from_time, until_time, create_topics)
    sys.exit(run_guarded(opts.debug, lambda: restore(opts, options, groups)))


class DurationParam(click.ParamType[float, str | float]):
    name = "DURATION"

    def convert(
        self, value: str | float, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        try:
            return parse_duration(value)
        except ValueError as exc:
            self.fail(str(exc))


@main.command("compact")
@_options("config", "master")
@click.option(
    "--level",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Merge segments of this level into level + 1.",
)
@click.option(
    "--min-age",
    type=DurationParam(),
    default="1h",
    show_default=True,
    help="Leave segments younger than this alone.",
)
@click.option("--delete", is_flag=True, help="Delete merged inputs once the result is checked.")
def compact_command(level: int, min_age: float, delete: bool, **flags: Unpack[Flags]) -> None:
    """Merge small segments of [store] into bigger ones (a Spark job)."""
    from relay.commands.compact import compact
    from relay.pipelines.compact.driver import CompactOptions

    opts = _opts(**flags)
    options = CompactOptions(level, min_age, delete)
    sys.exit(run_guarded(opts.debug, lambda: compact(opts, options)))


@main.command("verify")
@_options("config", "mode", "filter", "master")
@click.option(
    "--store",
    "of_backup",
    is_flag=True,
    help="Verify a backup: [store]'s segments against their [[sources]] topics.",
)
@click.option(
    "--from-store",
    "of_restore",
    is_flag=True,
    help="Verify a restore: [target]'s topics against the [store] they came from.",
)
@click.option(
    "--partitions",
    "partitions",
    multiple=True,
    metavar="TOPIC[:N,M]",
    help="Only these source partitions (repeatable): topic, or topic:0,1.",
)
@click.option(
    "--from-time",
    type=TimeParam(),
    default=None,
    help="Only source records from this time (ISO 8601 or ms).",
)
@click.option(
    "--until-time", type=TimeParam(), default=None, help="Only source records before this time."
)
@click.option(
    "--sample",
    type=click.FloatRange(0.0, 1.0, min_open=True),
    default=1.0,
    help="Check this fraction of blocks of 1,000 offsets (the same on every run).",
)
@click.option(
    "--follow",
    is_flag=True,
    help="Keep verifying behind a running copy until stopped ([verify], /metrics).",
)
@click.option(
    "--report",
    "report_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write every partition's result to this JSON file.",
)
def verify_command(
    of_backup: bool,
    of_restore: bool,
    partitions: tuple[str, ...],
    from_time: int | None,
    until_time: int | None,
    sample: float,
    follow: bool,
    report_path: str | None,
    **flags: Unpack[Flags],
) -> None:
    """Prove a copy exact, record by record (exit 0 exact, 1 differs, 2 could not verify):
    a relay's destinations, a backup (--store) or a restore (--from-store). Writes nothing."""
    from pathlib import Path

    from relay.commands.verify import VerifyOptions, verify
    from relay.pipelines.verify.spec import Scope

    if of_backup and of_restore:
        raise click.UsageError("--store and --from-store exclude each other")
    kind = "backup" if of_backup else "restore" if of_restore else "relay"
    scope = Scope(sample, from_time, until_time)
    if follow and report_path:
        raise click.UsageError("--report is for one check; --follow exports metrics instead")
    path = Path(report_path) if report_path else None
    options = VerifyOptions(kind, partitions, path, scope, follow)
    opts = _opts(**flags)
    sys.exit(run_guarded(opts.debug, lambda: verify(opts, options)))


if __name__ == "__main__":  # pragma: no cover
    main()
