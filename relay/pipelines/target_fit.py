"""The destination as the tasks write it: `[target]` fitted to the destination topics' configs,
what they refuse for good (relay.refusals) and their retention by time (relay.retention), from
one DescribeConfigs of the destination topics. Used by the pipelines that write to Kafka (relay,
restore) before their tasks start.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from relay.clients import admin
from relay.config import Config, TargetConfig
from relay.refusals import Rules, rules_of
from relay.retention import retention_ms

log = logging.getLogger(__name__)


class Fitted(NamedTuple):
    target: TargetConfig  # [target] with batch_size fitted to the destination topics
    rules: Rules  # what each destination topic refuses for good
    retention: Mapping[str, int | None]  # each destination topic's retention.ms (None: none)


def fit(cfg: Config, topics: Iterable[str], timeout: float) -> Fitted:
    """[target] as the tasks use it, what the destination topics refuse for good and their
    retention. Brokers that describe no configs (Tansu) leave the target as it is and no
    rules: a record refused then halts its partition at the first record of the refused
    batch."""
    target = cfg.need_target()
    try:
        configs = admin.topic_configs(target.cluster, topics, timeout)
    except Exception as exc:  # noqa: BLE001 - a check, not a requirement
        log.info("target does not describe topic configs (%s): batch_size not checked", exc)
        return Fitted(target, (), {})
    rules = tuple(rules_of(topic, found) for topic, found in sorted(configs.items()) if found)
    retention = {topic: retention_ms(found) for topic, found in configs.items()}
    return Fitted(_fitted_target(target, configs), rules, retention)


def _fitted_target(target: TargetConfig, configs: Mapping[str, Mapping[str, str]]) -> TargetConfig:
    """`batch_size` lowered to the smallest max.message.bytes the destination topics
    allow, with a warning. A broker refuses a bigger batch, and kafka-python would split it
    again and again; a single record over the limit still fails, naming itself."""
    limits = {
        topic: int(found["max.message.bytes"])
        for topic, found in configs.items()
        if found.get("max.message.bytes", "").isdigit()
    }
    if not limits:
        log.info("target describes no max.message.bytes: [target].batch_size not checked")
        return target
    topic, limit = min(limits.items(), key=lambda item: item[1])
    target = dataclasses.replace(target, max_batch_bytes=min(target.max_batch_bytes, limit))
    if target.batch_size <= limit:
        return target
    log.warning(
        "[target].batch_size %d exceeds max.message.bytes %d of destination topic %s: "
        "producing batches of at most %d bytes",
        target.batch_size,
        limit,
        topic,
        limit,
    )
    return dataclasses.replace(target, batch_size=limit)
