"""The sections of the configuration beside the clusters: `[discover]`, `[acls]`, `[groups]`,
`[verify]`, `[filters.<id>]` and `[store]`, as frozen dataclasses read the way relay.config.model
reads the others (each field names its reader in its metadata)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from relay.config.choices import (
    DISCOVER_STARTS,
    ON_ERROR,
    SEGMENT_COMPRESSIONS,
    SEGMENT_FORMATS,
)
from relay.config.readers import (
    Secret,
    _bool,
    _choice,
    _duration,
    _file,
    _filter_config,
    _int,
    _metrics_addr,
    _names,
    _password,
    _patterns,
    _prefix,
    _reads,
    _size,
    _template,
    _text,
    _url,
)


@dataclass(frozen=True)
class DiscoverConfig:
    """`[discover]`: topics chosen by pattern (ktm relay), found at start and while running."""

    include: tuple[str, ...] = field(default=(), metadata=_reads(_patterns))  # whole-name regexes
    exclude: tuple[str, ...] = field(default=(), metadata=_reads(_patterns))
    rename: str = field(default="{topic}", metadata=_reads(_template))  # destination name
    # Where a topic found while running starts (the end: only records written after it was seen).
    start: str = field(default="beginning", metadata=_reads(_choice, choices=DISCOVER_STARTS))
    # How often the source is listed for new topics and partitions (also without [discover]).
    interval: float = field(default=30.0, metadata=_reads(_duration, minimum=1.0))
    # Active/active: source topics named with this prefix are copies of the target's own topics
    # (the other relay of the pair names them so) and are never relayed back.
    from_target_prefix: str = field(default="", metadata=_reads(_prefix))


@dataclass(frozen=True)
class AclsConfig:
    """`[acls]`: the source's topic ACLs copied to the destination topics while relaying, as
    MirrorMaker 2 copies them (relay.pipelines.relay.acl_sync has the rules). Off by default:
    granting permissions on the target is the operator's decision."""

    sync: bool = field(default=False, metadata=_reads(_bool))
    interval: float = field(default=60.0, metadata=_reads(_duration, minimum=1.0))
    principals: tuple[str, ...] = field(default=(), metadata=_reads(_patterns))  # [] = all
    exclude: tuple[str, ...] = field(default=(), metadata=_reads(_patterns))  # principals


@dataclass(frozen=True)
class GroupsConfig:
    """`[groups]`: consumer groups whose source offsets ktm relay carries over to the target."""

    include: tuple[str, ...] = field(default=(), metadata=_reads(_patterns))  # whole-name regexes
    exclude: tuple[str, ...] = field(default=(), metadata=_reads(_patterns))
    interval: float = field(default=10.0, metadata=_reads(_duration, minimum=0.5))


@dataclass(frozen=True)
class VerifyConfig:
    """`[verify]`: `ktm verify --follow`, verifying behind a running copy."""

    # `ktm relay`, `backup` and `restore` verify their own copy as they go, on one task slot
    # (exported on [app].metrics_addr), instead of a `ktm verify --follow` beside them.
    follow: bool = field(default=False, metadata=_reads(_bool))
    # How long a follower rests between two passes over what the copy wrote since the last.
    interval: float = field(default=2.0, metadata=_reads(_duration, minimum=0.1))
    # Where `ktm verify --follow` serves /metrics and /healthz (beside a relay, which has
    # [app].metrics_addr: another port); "" turns it off.
    metrics_addr: tuple[str, int] | None = field(
        default=("127.0.0.1", 7082), metadata=_reads(_metrics_addr)
    )


@dataclass(frozen=True)
class FilterConfig:
    """A `[filters.<id>]` section, or a filter named only with `--filter PATH`."""

    id: str
    path: str = field(metadata=_reads(_file))  # absolute
    enabled: bool = field(default=True, metadata=_reads(_bool))
    on_error: str = field(default="stop", metadata=_reads(_choice, choices=ON_ERROR))
    config: tuple[tuple[str, object], ...] = field(default=(), metadata=_reads(_filter_config))
    # False for a filter named only with --filter: no section, so its id is not checked.
    from_section: bool = True

    def config_dict(self) -> dict[str, object]:
        # A deep copy: a filter that changes its config must not change ours.
        return copy.deepcopy(dict(self.config))


@dataclass(frozen=True)
class StoreConfig:
    """`[store]`: where ktm backup writes segments and ktm restore and compact read them."""

    url: str = field(metadata=_reads(_text))  # a directory or "s3://bucket/prefix"
    cluster: str = field(metadata=_reads(_text))  # path component; default: [[sources]][1].name
    s3_endpoint: str | None = field(default=None, metadata=_reads(_url))
    s3_region: str = field(default="us-east-1", metadata=_reads(_text))
    s3_access_key: Secret | None = field(default=None, metadata=_reads(_password))
    s3_secret_key: Secret | None = field(default=None, metadata=_reads(_password))
    max_segment_records: int = field(default=1_000_000, metadata=_reads(_int, minimum=1))
    max_segment_bytes: int = field(default=64 * 1024 * 1024, metadata=_reads(_size, minimum=1024))
    max_segment_age: float = field(default=300.0, metadata=_reads(_duration, positive=True))
    compression: str = field(default="zstd", metadata=_reads(_choice, choices=SEGMENT_COMPRESSIONS))
    format: str = field(default="parquet", metadata=_reads(_choice, choices=SEGMENT_FORMATS))
    groups: tuple[str, ...] = field(default=(), metadata=_reads(_names))
    # ktm compact merges level-N segments into level-N+1 ones of about this many times
    # max_segment_bytes.
    compact_factor: int = field(default=16, metadata=_reads(_int, minimum=2))
    # ktm restore --follow: how often to look for new segments, and how long to wait for a
    # missing one (a later one exists) before calling it lost.
    follow_interval: float = field(default=5.0, metadata=_reads(_duration, positive=True))
    late_segment_timeout: float = field(default=600.0, metadata=_reads(_duration, positive=True))
