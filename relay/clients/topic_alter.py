"""Configs of existing topics changed in place (IncrementalAlterConfigs: only the named keys
change; a key given None is deleted back to the default).

Part of the Kafka seam (relay.clients): the only modules that import kafka-python.
"""

from __future__ import annotations

from collections.abc import Mapping

from kafka.admin import AlterConfigOp, ConfigResource

from relay.clients.admin import admin_client, supported
from relay.config import ClusterConfig


def alter_topic_configs(
    cluster: ClusterConfig,
    changes: Mapping[str, Mapping[str, str | None]],
    timeout: float,
) -> dict[str, str]:
    """Apply each topic's changes (a value, or None: back to the default), all topics in one
    request; the topics whose changes the cluster refused, with why (a topic's changes are
    applied whole or not at all)."""
    resources = [
        ConfigResource(
            "TOPIC",
            topic,
            configs={
                name: (AlterConfigOp.DELETE, None) if value is None else (AlterConfigOp.SET, value)
                for name, value in sorted(configs.items())
            },
        )
        for topic, configs in sorted(changes.items())
        if configs
    ]
    if not resources:
        return {}
    with admin_client(cluster, timeout) as admin, supported("IncrementalAlterConfigs"):
        # raise_on_unknown would refuse a key not set on the topic yet; incremental: never
        # the old AlterConfigs, which resets every key it is not given
        answer = admin.alter_configs(resources, raise_on_unknown=False, incremental=True)
    return {
        topic: str(result)
        for topic, result in (answer.get("topic") or {}).items()
        if result != "OK"
    }
