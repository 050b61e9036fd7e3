"""Source topic IDs (Metadata v10+, KIP-516): a topic deleted and created again under its name
keeps the name and gets a new ID (relay.engine.driver.runner halts its partitions)."""

from __future__ import annotations

from collections.abc import Iterable

from relay.clients.admin import admin_client
from relay.config import ClusterConfig

NO_ID = "00000000-0000-0000-0000-000000000000"  # a broker without topic IDs (Tansu, Kafka < 2.8)


def topic_ids(cluster: ClusterConfig, topics: Iterable[str], timeout: float) -> dict[str, str]:
    """Each existing topic's ID; topics without one (or missing) are left out."""
    names = sorted(set(topics))
    if not names:
        return {}
    with admin_client(cluster, timeout) as admin:
        described = admin.describe_topics(names)
    found = {}
    for topic in described:
        name, ident = topic.get("name"), str(topic.get("topic_id") or NO_ID)
        if name and ident != NO_ID and not topic.get("error_code"):
            found[name] = ident
    return found
