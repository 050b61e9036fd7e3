"""Topics on a Kafka-protocol cluster, through kafka-python's admin client (never the code
under test): unique names, creation that waits for leaders, listing and describing.

The admin client on purpose: kafka-python's consumer auto-creates any topic it touches ("The
test broker" in docs/development.md).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from kafka import KafkaAdminClient


def unique_topic(prefix: str = "ktm-test") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def wait_until(
    condition: Callable[[], bool], timeout: float, what: str, every: float = 0.05
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting until {what}")
        time.sleep(every)


def topic_names(bootstrap: str) -> set[str]:
    """Every topic of the cluster (from the all-topics metadata, which creates nothing)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return set(admin.list_topics())
    finally:
        admin.close()


def describe_topic(bootstrap: str, topic: str, **client_config: Any) -> dict[str, Any] | None:
    """The admin client's metadata for ``topic``, or None if it does not exist;
    ``client_config``: more kafka-python settings (TLS, say)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, **client_config)
    try:
        if topic not in admin.list_topics():
            return None
        (described,) = admin.describe_topics([topic])
        return described
    finally:
        admin.close()


def led_partitions(described: dict[str, Any] | None) -> int:
    """How many partitions of a described topic (`describe_topic`) have a leader; 0 for None."""
    if described is None:
        return 0
    return sum(1 for p in described["partitions"] if p["error_code"] == 0 and p["leader_id"] >= 0)


def create_topic(
    bootstrap: str,
    name: str,
    partitions: int = 4,
    *,
    timeout: float = 10.0,
    configs: dict[str, str] | None = None,
) -> str:
    """Create ``name`` (with topic ``configs``) and wait until metadata shows all its
    partitions with a leader."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        # replication_factor -1: the broker's default, so an external multi-broker cluster works.
        spec = {"num_partitions": partitions, "replication_factor": -1, "configs": configs or {}}
        admin.create_topics({name: spec})
    finally:
        admin.close()
    wait_until(
        lambda: led_partitions(describe_topic(bootstrap, name)) == partitions,
        timeout,
        f"topic {name!r} shows {partitions} partitions with a leader on {bootstrap}",
    )
    return name


def create_topics(
    bootstrap: str, names: Sequence[str], partitions: int = 4, *, timeout: float = 120.0
) -> list[str]:
    """Create many topics in a few requests and wait until every one shows all its partitions
    with a leader (hundreds of topics: one round trip each would cost minutes). A KRaft
    controller takes at most 10,000 metadata records a request."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        per_request = max(1, 5_000 // (partitions + 1))
        for first in range(0, len(names), per_request):
            chunk = names[first : first + per_request]
            admin.create_topics(
                {name: {"num_partitions": partitions, "replication_factor": -1} for name in chunk}
            )
        wanted = set(names)

        def ready() -> bool:
            described = admin.describe_topics()
            led = {
                t["name"]
                for t in described
                if t["name"] in wanted and led_partitions(t) == partitions
            }
            return led == wanted

        wait_until(ready, timeout, f"{len(names)} topics with leaders on {bootstrap}", every=0.5)
    finally:
        admin.close()
    return list(names)
