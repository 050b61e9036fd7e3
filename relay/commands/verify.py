"""`ktm verify`: prove a relay's destination holds exactly the source's records (a Spark job
that reads both sides and writes nothing). Exit 0 exact, 1 something differs, 2 it could not
verify (bad input, a cluster out of reach)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import click

from relay.commands.common import Options, load
from relay.errors import ConfigError, KtmError


class VerifyError(KtmError):
    """ktm verify could not verify: it says nothing about the copy (exit 2, not 1)."""

    exit_code = 2


def verify(opts: Options, partitions: Sequence[str], report_path: Path | None) -> int:
    from relay.engine.batch import run_batch
    from relay.pipelines.verify import report
    from relay.pipelines.verify.driver import VerifyPipeline, parse_partitions, plan_verify

    cfg = load(opts, frozenset())
    if not (cfg.sources and cfg.target):
        raise ConfigError(f"{opts.config_path}: ktm verify checks a relay: give [[sources]] "
                          "and [target]")  # fmt: skip
    selection = parse_partitions(partitions)
    try:
        plan = plan_verify(cfg, opts.mode == "failover", selection)
        timeout = cfg.need_target().request_timeout * 5
        reports = run_batch(VerifyPipeline(plan, timeout), cfg.spark, opts.master)
    except ConfigError:
        raise
    except KtmError as exc:
        raise VerifyError(str(exc)) from exc
    except Exception as exc:
        raise VerifyError(f"{type(exc).__name__}: {exc}") from exc
    for one in reports:
        if not one.exact:
            click.echo(report.line(one))
    click.echo(report.summary(reports))
    if report_path is not None:
        report.write_json(report_path, reports)
    fault = report.first_fault(reports)
    if fault is not None:
        click.echo(f"ktm: verify: {fault}", err=True)
        return 1
    return 0
