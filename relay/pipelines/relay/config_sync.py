"""Topic configs kept in step while relaying (`[target].config_sync`): every
`[target].config_sync_interval` each destination topic takes the configs of its source topic
by the rules of a creation (relay.pipelines.relay.topic_configs: set on the source topic,
`config_include`, `config_exclude`, known to the target), with IncrementalAlterConfigs:

- a copied config set or changed on the source is set on the destination;
- one deleted on the source (back to its default) is deleted on the destination too, and so
  is any config `config_include`/`config_exclude` take that is set on the destination alone
  (a destination is the source's copy: MirrorMaker 2 does the same);
- configs the rules leave out are never touched.

Only destinations of topics ktm relays (a destination fed by several source topics follows
the first, as at creation). A config the target refuses is named once (topic, key, value) and
left as it is, not asked again until its value on the source changes; the others of that
topic are applied. Brokers that describe no topic configs
(Tansu) are left alone: nothing can be compared.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from relay.clients import admin
from relay.clients.topic_alter import alter_topic_configs
from relay.config import ClusterConfig, Config
from relay.engine.metrics import Metrics
from relay.pipelines.relay.relayed import Relayed
from relay.pipelines.relay.topic_configs import ConfigCopy
from relay.selection import matches

log = logging.getLogger(__name__)

Changes = dict[str, dict[str, str | None]]  # destination -> key -> value (None: delete)


def config_changes(
    copy: ConfigCopy,
    pairs: Mapping[str, str],
    on_source: Mapping[str, Mapping[str, str]],
    on_target: Mapping[str, Mapping[str, str]],
) -> Changes:
    """What each destination in `pairs` (destination -> source) must change to match its
    source; `on_source`/`on_target` hold the configs set on each topic (a topic missing: not
    described, left alone)."""
    changes: Changes = {}
    for dest, src in sorted(pairs.items()):
        if src not in on_source or dest not in on_target:
            continue
        want = copy.select(src, on_source[src])
        have = {n: v for n, v in on_target[dest].items() if matches(copy.include, copy.exclude, n)}
        change: dict[str, str | None] = {n: v for n, v in want.items() if have.get(n) != v}
        change.update({n: None for n in sorted(have) if n not in want})
        if change:
            changes[dest] = change
    return changes


class ConfigSync:
    def __init__(
        self,
        cfg: Config,
        relayed: Relayed,
        metrics: Metrics,
    ):
        target = cfg.need_target()
        self.target, self.timeout, self.metrics = target.cluster, target.request_timeout, metrics
        self.copy = ConfigCopy(target, self.timeout)
        self.relayed = relayed
        # (destination, key, value) the target refused: not asked again until the source's
        # value changes (or ktm restarts)
        self._refused: set[tuple[str, str, str | None]] = set()

    def plan(self) -> Changes:
        """The changes each destination needs now, read from both clusters."""
        pairs: dict[str, str] = {}
        for src, dest in sorted(set(self.relayed.topic_pairs())):
            pairs.setdefault(dest, src)  # the first source of a destination, as at creation
        if not pairs:
            return {}
        on_source = _described(self.relayed.source, set(pairs.values()), self.timeout)
        on_target = _described(self.target, set(pairs), self.timeout)
        return config_changes(self.copy, pairs, on_source, on_target)

    def sync_once(self) -> None:
        if not self.relayed.may_sync():
            return
        changes = {
            dest: kept
            for dest, change in self.plan().items()
            if (kept := {n: v for n, v in change.items() if (dest, n, v) not in self._refused})
        }
        refused = alter_topic_configs(self.target, changes, self.timeout)
        for dest in sorted(refused):  # one change at a time finds the refused ones
            applied: dict[str, str | None] = {}
            for name, value in sorted(changes[dest].items()):
                error = alter_topic_configs(self.target, {dest: {name: value}}, self.timeout)
                if error:
                    self._refuse(dest, name, value, error[dest])
                else:
                    applied[name] = value
            changes[dest] = applied
        for dest, change in sorted(changes.items()):
            if change:
                self.metrics.topic_configs_altered.inc(len(change))
                shown = ", ".join(
                    f"{n}={v}" if v is not None else f"{n} deleted (default)"
                    for n, v in sorted(change.items())
                )
                log.info(
                    "destination topic %s configs kept in step with its source: %s", dest, shown
                )

    def _refuse(self, dest: str, name: str, value: str | None, error: str) -> None:
        self._refused.add((dest, name, value))
        self.metrics.topic_config_failures.inc()
        log.warning(
            "destination topic %s refuses config %s = %s (copied from its source topic): "
            '%s; left as it is (leave it out with [target].config_exclude: add "%s")',
            dest,
            name,
            "(default)" if value is None else value,
            error,
            name,
        )


def _described(
    cluster: ClusterConfig, topics: set[str], timeout: float
) -> dict[str, dict[str, str]]:
    """The configs set on each topic the cluster describes anything of (a topic it describes
    nothing of, all defaults included, is left out: Tansu describes none)."""
    return admin.topic_configs(cluster, topics, timeout, set_only=True)
