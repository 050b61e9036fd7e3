"""`ktm compact`: merge small segments into big ones (a batch Spark job)."""

from __future__ import annotations

import logging

import click

from relay.commands.common import Options, load
from relay.pipelines.compact.driver import CompactOptions

log = logging.getLogger("relay")

NEEDS = frozenset({"store"})


def compact(opts: Options, options: CompactOptions) -> int:
    from relay.engine.spark import Engine, default_master, make_log_dir
    from relay.pipelines.compact.driver import compact as run

    cfg = load(opts, NEEDS)
    master = opts.master or cfg.spark.master or default_master(64)
    engine = Engine(cfg.spark, master, make_log_dir())
    try:
        result = run(cfg, engine, options)
    finally:
        engine.stop()
    action = "deleted" if options.delete else "kept (run with --delete to remove them)"
    click.echo(
        f"compacted {result.inputs} level-{options.level} segments into {result.merged} "
        f"level-{options.level + 1} ones ({result.records} records); {result.deleted} "
        f"segments deleted" + ("" if options.delete else f"; inputs {action}")
    )
    return 0
