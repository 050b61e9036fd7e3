"""`ktm check`: validate the config, reach every cluster and the store, print what would happen;
move nothing and join no group."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

import click

from relay.commands.common import Options, load, members_line
from relay.config import ClusterConfig, Config
from relay.errors import ConfigError

if TYPE_CHECKING:  # the pipelines are imported only when a check runs: --help stays quick
    from relay.engine.driver.rows import PartitionRow
    from relay.pipelines.relay.acl_sync import AclPlan
    from relay.pipelines.relay.config_sync import Changes
    from relay.pipelines.relay.group_sync import GroupResult
    from relay.pipelines.relay.topics import TopicPlan


def check(opts: Options) -> int:
    cfg = load(opts, frozenset())
    if not (cfg.sources and cfg.target) and cfg.store is None:
        raise ConfigError(
            f"{opts.config_path}: nothing to check: give [[sources]] and [target] (relay), "
            "[[sources]] and [store] (backup), or [target] and [store] (restore)"
        )
    failed = False
    if cfg.sources and cfg.target:
        failed = _relay_plan(cfg, opts)
    if cfg.store is not None:
        _store_report(cfg)
    return 1 if failed else 0


def _relay_plan(cfg: Config, opts: Options) -> bool:
    """The relay's plan; True if the source could not be fetched from."""
    from relay.engine.metrics import Metrics
    from relay.pipelines.jobs import relay_job
    from relay.pipelines.relay.driver import RelayPipeline

    stop = threading.Event()
    relay = relay_job(
        cfg,
        stop_at_end=False,
        stop_event=stop,
        metrics=Metrics(),
        failover=opts.mode == "failover",
        dry_run=True,
    )
    pipeline = relay.pipeline
    assert isinstance(pipeline, RelayPipeline)
    with relay:
        relay.prepare()
        groups = pipeline.group_plan()
        acls, configs = pipeline.acl_plan(), pipeline.config_plan()
    snap = relay.status.snapshot()
    isolation = cfg.source_pool.isolation_level
    click.echo(f"config {opts.config_path}: ok; source node: {snap.active_node} ({isolation})")
    _topics_report(cfg, pipeline.topic_plan)
    _partitions_report(snap.rows)
    click.echo(f"{len(snap.rows)} partitions, {snap.lag} records to relay; nothing was relayed")
    for risk in pipeline.at_risk:  # relay.retention: copies the destination will delete
        click.echo(f"retention: {risk.line()}")
    failed = _fetch_report(cfg, pipeline.source_node, snap.rows)
    _groups_report(cfg, groups)
    _acls_report(acls)
    _configs_report(configs)
    target = cfg.need_target()
    group = f"{cfg.app.group_id}.relay"
    click.echo(members_line(target.cluster, target.request_timeout, group))
    return failed


def _partitions_report(rows: Sequence[PartitionRow]) -> None:
    for row in rows:
        r = row.route
        click.echo(
            f"  {r.topic}[{r.partition}] -> {r.target_topic}[{r.target_partition}]: "
            f"from offset {row.next_offset}, end {row.end}, lag {row.lag}"
        )


def _fetch_report(cfg: Config, node: ClusterConfig, rows: Sequence[PartitionRow]) -> bool:
    """One fetch of every partition from the source node, timed as a task would see it: a
    long link or a broker slow with many partitions shows here, not as a silent relay."""
    from relay.clients.admin import probe
    from relay.clients.batch_fetch import out_of_range
    from relay.clients.settings import describe

    positions = {row.route.key: row.next_offset for row in rows}
    if not positions:
        return False
    fetch = cfg.source_pool.fetch
    took, errors = probe(node, positions, fetch)
    where = f"source {describe(node)}"
    lost = sorted(key for key, error in errors.items() if out_of_range(error))
    if lost:  # answered: the relay counts what was deleted (relay.losses), or halts there
        first = lost[0]
        rest = f" (and {len(lost) - 1} more)" if len(lost) > 1 else ""
        click.echo(
            f"fetch from {where}: {first[0]}[{first[1]}]{rest} resumes outside the source's log "
            f"(from offset {positions[first]}): records deleted before they were copied, or a "
            "log truncated below the copy; the relay will count them as lost "
            f'([source_pool].on_loss = "{cfg.source_pool.on_loss}")'
        )
        errors = {key: error for key, error in errors.items() if key not in lost}
    if not errors:
        click.echo(f"fetch from {where}: {len(positions)} partitions answered in {took:.2f}s")
        return False
    (key, error), more = next(iter(errors.items())), len(errors) - 1
    others = f" (and {more} more)" if more else ""
    click.echo(
        f"fetch from {where}: {key[0]}[{key[1]}]{others} failed after {took:.2f}s: "
        f"{type(error).__name__}: {error} ([source_pool].fetch_timeout {fetch.timeout:g}s)"
    )
    return True


def _topics_report(cfg: Config, plan: TopicPlan | None) -> None:
    """What [discover] matches today, and the destinations ktm would create or grow."""
    if plan is None:
        return
    if cfg.discover.include:
        found = [r for r in (*plan.routes, *plan.held) if r.discovered]
        names = ", ".join(f"{r.source} -> {r.target}" for r in found) or "no topic"
        click.echo(f"[discover] matches {len(found)} topic(s) today: {names}")
    for creation in plan.created:
        configs = ", ".join(f"{k}={v}" for k, v in creation.configs) or "none copied"
        click.echo(
            f"  would create {creation.topic}: {creation.partitions} partitions, replication "
            f"factor {cfg.need_target().replication_factor} (-1: the broker's), configs: "
            f"{configs}"
        )
    for dest, has, wanted in plan.grown:
        click.echo(f"  would grow {dest} from {has} to {wanted} partitions")


def _groups_report(cfg: Config, groups: list[GroupResult]) -> None:
    """The groups [groups] carries, with each translated offset and whether the target has it."""
    if not cfg.groups.include:
        return
    click.echo(f"[groups] carries {len(groups)} group(s) today")
    for result in groups:
        active = f"; active on the target ({result.active}): left alone" if result.active else ""
        click.echo(f"  group {result.group}{active}")
        for part in result.partitions:
            sources = ", ".join(f"{t}[{p}]@{o}" for (t, p), o in part.sources)
            dest = f"{part.dest[0]}[{part.dest[1]}]"
            if part.offset is None:
                click.echo(f"    {sources} -> {dest}: not relayed that far yet")
                continue
            state = f"the target has {part.before}"
            if part.before == part.offset:
                state = "synced"
            elif part.before is None:
                state = "the target has no offset yet"
            click.echo(f"    {sources} -> {dest}@{part.offset} ({state}; end {part.end})")


def _acls_report(plan: AclPlan | None) -> None:
    """The topic ACLs [acls] would create on the target now."""
    if plan is None:
        return
    if plan.unavailable:
        click.echo(f"[acls] copies no ACL: {plan.unavailable}")
        return
    click.echo(
        f"[acls] would create {len(plan.create)} ACL(s) on the target "
        f"({plan.present} copied already)"
    )
    for acl, copy in plan.create:
        click.echo(f"  would create {copy} (source: {acl})")
    for principal in plan.unknown_principals:
        click.echo(f"  {principal} is a SCRAM user on the source, not on the target")


def _configs_report(changes: Changes | None) -> None:
    """The config changes [target].config_sync would make now."""
    if changes is None:
        return
    click.echo(f"[target].config_sync would change {len(changes)} destination topic(s)")
    for dest, change in sorted(changes.items()):
        shown = ", ".join(
            f"{n}={v}" if v is not None else f"{n} deleted (default)"
            for n, v in sorted(change.items())
        )
        click.echo(f"  would change {dest}: {shown}")


def _store_report(cfg: Config) -> None:
    """Reachable and writable, and what is there: per partition its segments, the offsets they
    cover, and any hole or overlap a restore would stop at."""
    from relay.store import ChainLink, plan_chain
    from relay.store.configured import store_of

    store_cfg = cfg.need_store()
    store = store_of(store_cfg)
    store.check()
    click.echo(f"store {store.describe()}: ok (reachable, writable); cluster {store_cfg.cluster}")
    for route in cfg.topics:
        partitions = store.list_partitions(store_cfg.cluster, route.source)
        if not partitions:
            known = store.partition_count(store_cfg.cluster, route.source)
            planned = f" ({known} partitions, backup started)" if known else ""
            click.echo(
                f"  {route.source}: no segments yet{planned}; ktm restore --follow waits for them"
            )
        for partition in partitions:
            refs = store.list_segments(store_cfg.cluster, route.source, partition)
            links = [ChainLink.of(ref, store.read_meta(ref)) for ref in refs]
            plan = plan_chain(links)
            covered = (
                f"offsets {plan.links[0].start}-{plan.links[-1].next_offset - 1}"
                if plan.links
                else "empty"
            )
            records = sum(link.count for link in plan.links)
            problems = "; ".join(str(p) for p in plan.problems) or "no gaps"
            click.echo(
                f"  {route.source}[{partition}]: {len(refs)} segments, {records} records, "
                f"{covered}, {problems}"
            )
    groups = store.list_groups(store_cfg.cluster)
    click.echo(f"consumer-group snapshots: {', '.join(groups) if groups else 'none'}")
    if cfg.sources:
        click.echo(members_line(cfg.sources[0], 10.0, f"{cfg.app.group_id}.backup"))
    if cfg.target is not None:
        group = f"{cfg.app.group_id}.restore"
        click.echo(members_line(cfg.target.cluster, cfg.target.request_timeout, group))
