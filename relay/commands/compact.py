"""`ktm compact`: merge small segments into big ones (a batch Spark job)."""

from __future__ import annotations

import logging

import click

from relay.commands.common import Options, load
from relay.pipelines.compact.driver import CompactOptions

log = logging.getLogger("relay")

NEEDS = frozenset({"store"})


def compact(opts: Options, options: CompactOptions) -> int:
    from relay.engine.batch import run_batch
    from relay.pipelines.compact.driver import CompactPipeline

    cfg = load(opts, NEEDS)
    result = run_batch(CompactPipeline(cfg, options), cfg.spark, opts.master)
    action = "deleted" if options.delete else "kept (run with --delete to remove them)"
    click.echo(
        f"compacted {result.inputs} level-{options.level} segments into {result.merged} "
        f"level-{options.level + 1} ones ({result.records} records); {result.deleted} "
        f"segments deleted" + ("" if options.delete else f"; inputs {action}")
    )
    return 0
