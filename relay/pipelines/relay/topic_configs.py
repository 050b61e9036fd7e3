"""Which configs a destination topic ktm creates takes from its source topic, as MirrorMaker 2
copies them: only those set on the source topic (DescribeConfigs source DYNAMIC_TOPIC_CONFIG,
never defaults), named in `[target].config_include` ([] = all), not in `config_exclude`
(MirrorMaker 2's list and what a target refuses: relay.config.choices.CONFIG_EXCLUDE), and
known to the target. A key the target does not know (removed in Kafka 4.0, a vendor's) would
fail the creation: it is left out with a debug line. The target says which names it knows when
asked to validate a topic it would create (CreateTopics v5+, validate only); a target that does
not say (Tansu, Kafka before 2.4) gets every copied key.

A config the target still refuses (a value out of its range: Kafka 4.0 raised segment.bytes'
minimum to 1 MiB) stops the relay with one line naming the destination topic, the key and the
value, and `config_exclude` as the way out.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Mapping

from relay.clients import topic_create
from relay.clients.topic_create import ConfigRefused
from relay.config import TargetConfig
from relay.errors import ConfigError
from relay.selection import matches

log = logging.getLogger(__name__)


class ConfigCopy:
    """The copy policy of one run (the target's known names are asked for once)."""

    def __init__(self, target: TargetConfig, timeout: float):
        self.target, self.timeout = target, timeout
        self.include = [config_pattern(n) for n in target.config_include] or [".*"]
        self.exclude = [config_pattern(n) for n in target.config_exclude]
        self._known: frozenset[str] | None = None

    def select(self, topic: str, configs: Mapping[str, str]) -> dict[str, str]:
        """The configs set on source `topic` that its copy takes."""
        chosen = {n: v for n, v in configs.items() if matches(self.include, self.exclude, n)}
        known = self.known() if chosen else frozenset()
        if not known:  # the target does not say which names it knows
            return chosen
        for name in sorted(set(chosen) - known):
            log.debug(
                "config %s=%s of source topic %s is not copied: the target does not know it",
                name,
                chosen.pop(name),
                topic,
            )
        return chosen

    def known(self) -> frozenset[str]:
        """The topic config names the target knows (empty: it does not say)."""
        if self._known is None:
            probe = f"ktm-config-probe-{uuid.uuid4().hex[:12]}"
            try:
                self._known = topic_create.known_topic_configs(
                    self.target.cluster, probe, self.timeout
                )
            except Exception as exc:  # noqa: BLE001 - a check; the creation itself then tells
                log.debug("the target does not say which topic configs it knows: %s", exc)
                self._known = frozenset()
        return self._known

    def refused(
        self, refusal: ConfigRefused, partitions: int, configs: Mapping[str, str]
    ) -> ConfigError:
        """The one line for a creation the target refused: the key and value it refuses (named
        in its answer, else found by validating each config alone), and the way out."""
        topic = refusal.topic
        found = _named_in(refusal.error, configs) or self._validate_each(topic, partitions, configs)
        key = "[target].create_topics"
        if found is None:
            return ConfigError(
                f"{key}: destination topic {topic!r} refused its configs {dict(configs)}: "
                f"{refusal.error}; leave the refused one out with [target].config_exclude"
            )
        name, value, error = found
        return ConfigError(
            f"{key}: destination topic {topic!r} refuses config {name} = {value} (copied from "
            f"its source topic): {error or refusal.error}; leave it out with "
            f'[target].config_exclude (add "{name}"), or change it on the source topic'
        )

    def _validate_each(
        self, topic: str, partitions: int, configs: Mapping[str, str]
    ) -> tuple[str, str, str] | None:
        for name, value in sorted(configs.items()):
            try:
                error = topic_create.refused_config(
                    self.target.cluster,
                    topic,
                    partitions,
                    self.target.replication_factor,
                    {name: value},
                    self.timeout,
                )
            except Exception as exc:  # noqa: BLE001 - the line then names every config
                log.debug("validating config %s of topic %s: %s", name, topic, exc)
                return None
            if error is not None:
                return name, value, error
        return None


def _named_in(error: str, configs: Mapping[str, str]) -> tuple[str, str, str] | None:
    """The config a broker's message names (the longest name that appears in it: Kafka says
    "Invalid value 1024 for configuration segment.bytes: ...")."""
    for name in sorted(configs, key=len, reverse=True):
        if re.search(rf"(?<![\w.]){re.escape(name)}(?![\w.])", error):
            return name, configs[name], ""
    return None


def config_pattern(name: str) -> str:
    """config_include and config_exclude hold config names; one ending in "*" stands for every
    name it begins ("confluent.*")."""
    if name.endswith("*"):
        return re.escape(name[:-1]) + ".*"
    return re.escape(name)
