"""Destination topics created on a cluster (CreateTopics), and what a cluster would refuse of
a topic's configs (CreateTopics, validate only: nothing is created).

Part of the Kafka seam (relay.clients): the only modules that import kafka-python.
"""

from __future__ import annotations

import time
from typing import TypedDict

from kafka.errors import (
    InvalidConfigurationError,
    PolicyViolationError,
    TopicAlreadyExistsError,
    for_code,
)

from relay.clients.admin import admin_client, in_requests, partition_counts, supported
from relay.config import ClusterConfig


class ConfigRefused(Exception):
    """CreateTopics refused a topic's configs (INVALID_CONFIG, POLICY_VIOLATION): retrying the
    same request cannot help."""

    retriable = False

    def __init__(self, topic: str, error: str):
        super().__init__(f"{topic}: {error}")
        self.topic, self.error = topic, error


REFUSING_CONFIGS = (InvalidConfigurationError, PolicyViolationError)


class _NewTopic(TypedDict):
    """One topic of a CreateTopics request, as kafka-python's admin client takes it."""

    num_partitions: int
    replication_factor: int
    configs: dict[str, str]


class _CreatedTopic(TypedDict, total=False):
    """One topic of a CreateTopics answer, as kafka-python's admin client takes it apart."""

    name: str
    error_code: int
    error_message: str | None
    configs: dict[str, object]  # by config name (v5+, validate only: every config it would have)


class _CreateTopicsAnswer(TypedDict, total=False):
    topics: list[_CreatedTopic]


def _create_request(
    topics: dict[str, int], replication_factor: int, configs: dict[str, dict[str, str]] | None
) -> dict[str, _NewTopic]:
    return {
        name: {
            "num_partitions": count,
            "replication_factor": replication_factor,
            "configs": dict((configs or {}).get(name, {})),
        }
        for name, count in topics.items()
    }


def _topic_errors(answer: _CreateTopicsAnswer) -> dict[str, BaseException]:
    """Each topic's error in a CreateTopics answer (taken apart by kafka-python)."""
    errors = {}
    for topic in answer.get("topics") or ():
        if topic.get("error_code"):
            kind = for_code(topic["error_code"])
            errors[topic["name"]] = kind(topic.get("error_message") or kind.description)
    return errors


CREATE_SECONDS_PER_PARTITION = 0.01  # how much longer new partitions may take to show


def create_topics(
    cluster: ClusterConfig,
    topics: dict[str, int],
    timeout: float,
    replication_factor: int = -1,
    configs: dict[str, dict[str, str]] | None = None,
) -> None:
    """Create topics with the given partition counts, replication factor (-1: the broker's
    default) and configs, and wait until the cluster's metadata shows them. A topic that exists
    already is left as it is (another ktm process was first); ConfigRefused names the first
    topic whose configs the broker refused."""
    errors: dict[str, BaseException] = {}
    with admin_client(cluster, timeout) as admin, supported("CreateTopics"):
        for part in in_requests(topics):
            spec = _create_request(part, replication_factor, configs)
            answer = admin.create_topics(spec, raise_errors=False)
            errors.update(_topic_errors(answer))
    errors = {t: e for t, e in errors.items() if not isinstance(e, TopicAlreadyExistsError)}
    for topic, error in sorted(errors.items()):
        if isinstance(error, REFUSING_CONFIGS):
            raise ConfigRefused(topic, f"{type(error).__name__}: {error}") from error
    if errors:
        raise next(iter(errors.values()))
    # metadata shows new topics a moment later: 2,000 topics of 5 partitions took ~40 s on a
    # 2-core KRaft broker (the first two waits of 10 s each ended in a retry)
    limit = timeout + CREATE_SECONDS_PER_PARTITION * sum(topics.values())
    deadline = time.monotonic() + limit
    while True:
        missing = sorted(set(topics) - set(partition_counts(cluster, topics, timeout)))
        if not missing:
            return
        if time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
    raise TimeoutError(f"topics {shown} did not appear within {limit:g}s")


def refused_config(
    cluster: ClusterConfig,
    topic: str,
    partitions: int,
    replication_factor: int,
    configs: dict[str, str],
    timeout: float,
) -> str | None:
    """Why the broker would refuse to create `topic` with `configs` (CreateTopics, validate
    only: nothing is created), None if it would not refuse them."""
    spec = _create_request({topic: partitions}, replication_factor, {topic: configs})
    with admin_client(cluster, timeout) as admin, supported("CreateTopics"):
        answer = admin.create_topics(spec, validate_only=True, raise_errors=False)
    error = _topic_errors(answer).get(topic)
    if isinstance(error, REFUSING_CONFIGS):
        return f"{type(error).__name__}: {error}"
    return None


def known_topic_configs(cluster: ClusterConfig, probe: str, timeout: float) -> frozenset[str]:
    """The names of every topic config the cluster knows: those a topic created now would have
    (CreateTopics v5+, validate only: `probe` is not created). Empty where the broker does not
    say (Tansu, brokers before 2.4)."""
    spec = _create_request({probe: 1}, -1, None)
    with admin_client(cluster, timeout) as admin, supported("CreateTopics"):
        answer: _CreateTopicsAnswer = admin.create_topics(
            spec, validate_only=True, raise_errors=False
        )
    topics = answer.get("topics") or []
    nothing: _CreatedTopic = {}
    found = next((t for t in topics if t.get("name") == probe), nothing)
    return frozenset(found.get("configs") or ())
