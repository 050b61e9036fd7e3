"""Which topics and consumer groups a relay takes: exact names from `[topics]`, and the source's
topics or groups matched by the patterns of `[discover]` and `[groups]`. Pure logic: the driver
lists the names, this decides.

Patterns match whole names. Some names are never matched, whatever the patterns say:
- internal topics: Kafka's (`__consumer_offsets`, `__transaction_state`, any `__*`) and what
  MirrorMaker 2 treats as internal (`*.internal`, `*-internal`, `*.replica`);
- names the rename template produces ("east.orders" under "east.{topic}"): a copy is not
  relayed again as "east.east.orders" (within one cluster that would never end);
- names with `[discover].from_target_prefix`: in an active/active pair those are the other
  relay's copies of the target's own topics, which must not go back where they came from;
- ktm's own consumer groups (`[app].group_id` and `<group_id>.*`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from relay.config import DiscoverConfig, TopicRoute

INTERNAL_TOPIC = re.compile(r"__.*|.*[-.]internal|.*\.replica")


def matches(include: Sequence[str], exclude: Sequence[str], name: str) -> bool:
    """Whether `name` matches a pattern of `include` and none of `exclude` (whole names)."""
    return any(re.fullmatch(p, name) for p in include) and not any(
        re.fullmatch(p, name) for p in exclude
    )


def destination_of(discover: DiscoverConfig, topic: str) -> str:
    return discover.rename.replace("{topic}", topic, 1)


def is_copy_name(discover: DiscoverConfig, topic: str) -> bool:
    """Whether `topic` is named like a copy: by the rename template (when it renames), or with
    the prefix the target's own topics carry on the source."""
    prefix, _, suffix = discover.rename.partition("{topic}")
    if (prefix or suffix) and len(topic) > len(prefix) + len(suffix):
        if topic.startswith(prefix) and topic.endswith(suffix):
            return True
    return bool(discover.from_target_prefix) and topic.startswith(discover.from_target_prefix)


def discovered(discover: DiscoverConfig, topic: str) -> bool:
    """Whether a source topic is taken by the patterns of `[discover]`."""
    if INTERNAL_TOPIC.fullmatch(topic) or is_copy_name(discover, topic):
        return False
    return matches(discover.include, discover.exclude, topic)


def select_routes(
    named: Sequence[TopicRoute], discover: DiscoverConfig, source_topics: Iterable[str]
) -> tuple[TopicRoute, ...]:
    """The `[topics]` routes, then one route per source topic the patterns take (in name
    order); a topic named in `[topics]` keeps its route there."""
    exact = {route.source for route in named}
    found = [
        TopicRoute(topic, destination_of(discover, topic), discovered=True)
        for topic in sorted(set(source_topics) - exact)
        if discovered(discover, topic)
    ]
    return tuple(named) + tuple(found)


def carried_groups(
    include: Sequence[str], exclude: Sequence[str], own_group: str, groups: Iterable[str]
) -> list[str]:
    """The source's consumer groups `[groups]` carries over, in name order (never ktm's own)."""
    return sorted(
        group
        for group in set(groups)
        if group != own_group
        and not group.startswith(own_group + ".")
        and matches(include, exclude, group)
    )
