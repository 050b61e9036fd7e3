"""`load_config`: the whole file, every section, checked in one place."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from relay.config import sections as part
from relay.config.choices import (
    SASL_MECHANISMS,
    TOP_LEVEL_KEYS,
)
from relay.config.model import (
    AppConfig,
    ClusterConfig,
    Config,
    LimitsConfig,
    SourcePoolConfig,
    SparkConfig,
    TargetConfig,
    TopicRoute,
)
from relay.config.readers import (
    _TOPIC_NAME,
    TomlValue,
    _build,
    _show,
    _Table,
)
from relay.errors import ConfigError

if TYPE_CHECKING:
    import tomli

# What each command needs besides [topics] (the rest, when present, is checked all the same).
RELAY_NEEDS = frozenset({"sources", "target"})
WHY = {
    "sources": "the clusters to read",
    "target": "the cluster to write to",
    "store": 'where segments live: url = "./backup" or "s3://bucket/prefix"',
}


def load_config(
    path: str | os.PathLike[str],
    *,
    cli_filters: Sequence[str] = (),
    needs: frozenset[str] = RELAY_NEEDS,
) -> Config:
    """Reads and checks the whole file; `cli_filters` are the `--filter PATH` arguments, `needs`
    the sections the command cannot do without ("sources", "target", "store")."""
    doc = _Table(_read_toml(path), "", os.path.dirname(os.path.abspath(path)))
    # Unknown sections first: "[taget]" should say so, not that [target] is missing.
    doc.known.update(TOP_LEVEL_KEYS)
    doc.finish()
    for section in sorted(needs):
        if section not in doc.mapping:
            name = "[[sources]]" if section == "sources" else f"[{section}]"
            raise ConfigError(f"{name}: missing section ({WHY[section]})")
    source_pool = _source_pool(doc.sub("source_pool"))
    sources = tuple(
        dataclasses.replace(source, isolation_level=source_pool.isolation_level)
        for source in (_sources(doc) if "sources" in doc.mapping else ())
    )
    discover = _build(part.DiscoverConfig, doc.sub("discover"))
    return Config(
        path=os.fspath(path),
        app=_build(AppConfig, doc.sub("app")),
        spark=_spark(doc.sub("spark")),
        topics=_topics(doc, discover),
        discover=discover,
        groups=_build(part.GroupsConfig, doc.sub("groups")),
        acls=_build(part.AclsConfig, doc.sub("acls")),
        sources=sources,
        source_pool=source_pool,
        target=_target(doc.sub("target")) if "target" in doc.mapping else None,
        filters=_filters(doc, cli_filters),
        store=_store(doc.sub("store"), sources) if "store" in doc.mapping else None,
        limits=_build(LimitsConfig, doc.sub("limits")),
        verify=_build(part.VerifyConfig, doc.sub("verify")),
    )


def _store(t: _Table, sources: tuple[ClusterConfig, ...]) -> part.StoreConfig:
    if "cluster" in t.mapping:
        store = _build(part.StoreConfig, t)
    elif sources:
        store = _build(part.StoreConfig, t, cluster=sources[0].name)
    else:
        raise t.error("cluster", "required when the config has no [[sources]]")
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,249}", store.cluster):
        expected = "expected a name of letters, digits, '.', '_', '-'"
        raise t.error("cluster", f"{expected}, got {_show(store.cluster)}")
    if store.url.startswith("s3://"):
        if not re.fullmatch(r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/\S*)?", store.url):
            expected = 'expected "s3://bucket" or "s3://bucket/prefix"'
            raise t.error("url", f"{expected}, got {_show(store.url)}")
    else:
        for key in ("s3_endpoint", "s3_access_key", "s3_secret_key"):
            if key in t.mapping:
                raise t.error(key, f"only for s3:// URLs; url is {_show(store.url)}")
        # A relative directory is relative to the config file, like every path in it.
        url = store.url.removeprefix("file://")
        path = os.path.normpath(os.path.join(t.base_dir, os.path.expanduser(url)))
        store = dataclasses.replace(store, url=path)
    if (store.s3_access_key is None) != (store.s3_secret_key is None):
        key = "s3_secret_key" if store.s3_access_key else "s3_access_key"
        raise t.error(key, "set s3_access_key and s3_secret_key together, or neither")
    return _store_compression(t, store)


def _store_compression(t: _Table, store: part.StoreConfig) -> part.StoreConfig:
    """JSON lines segments are plain text: no compression, so "none" is their default."""
    if store.format != "jsonl":
        return store
    if "compression" not in t.mapping:
        return dataclasses.replace(store, compression="none")
    if store.compression != "none":
        expected = 'the jsonl format is not compressed; use "none"'
        raise t.error("compression", f"{expected}, got {_show(store.compression)}")
    return store


def _read_toml(path: str | os.PathLike[str]) -> dict[str, TomlValue]:
    # Imported here: executors import relay.config for the specs' dataclasses, and a worker
    # needs no TOML parser ("Scaling out" lists what executors need).
    import tomli

    name = os.fspath(path)
    try:
        with open(path, "rb") as file:
            return tomli.load(file)
    except FileNotFoundError:
        raise ConfigError(f"{name}: file not found") from None
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read: {exc.strerror}") from None
    except tomli.TOMLDecodeError as exc:
        raise ConfigError(f"{name}: {_toml_problem(exc)}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{name}: invalid TOML: not UTF-8 text") from None


def _toml_problem(exc: tomli.TOMLDecodeError) -> str:
    lineno, colno, reason = (getattr(exc, name, None) for name in ("lineno", "colno", "msg"))
    if lineno is None or reason is None:
        # tomli before 2.1 only puts the position in the message: "reason (at line 3, column 7)".
        match = re.fullmatch(r"(.*) \(at line (\d+), column (\d+)\)", str(exc), re.DOTALL)
        if match is None:
            return f"invalid TOML: {exc}"
        reason, lineno, colno = match.groups()
    return f"invalid TOML at line {lineno}, column {colno}: {reason}"


def _spark(t: _Table) -> SparkConfig:
    if "epoch_duration" in t.mapping:
        # Removed, not ignored: a key that silently stopped working would mislead.
        raise t.error(
            "epoch_duration",
            "removed in ktm 0.2: tasks now run until the driver stops them (no epochs); "
            "delete the key (see rebalance_interval)",
        )
    return _build(SparkConfig, t)


def _source_pool(t: _Table) -> SourcePoolConfig:
    pool = _build(SourcePoolConfig, t)
    _check_backoff(t, pool.backoff_min, pool.backoff_max)
    return pool


def _target(t: _Table) -> TargetConfig:
    target = _build(TargetConfig, t, cluster=_cluster(t, name="target"))
    _check_backoff(t, target.backoff_min, target.backoff_max)
    if target.replication_factor == 0:
        raise t.error(
            "replication_factor", "expected -1 (the broker's default) or 1 to 32767, got 0"
        )
    return target


def _check_backoff(t: _Table, low: float, high: float) -> None:
    if high < low:
        raise t.error("backoff_max", f"expected >= backoff_min ({low:g}s), got {high:g}s")


def _cluster(t: _Table, **given: object) -> ClusterConfig:
    """Reads the connection keys and checks the ones that go together; the caller finishes `t`."""
    cluster = _build(ClusterConfig, t, finish=False, section=t.path, **given)
    if cluster.sasl_mechanism:
        for key in ("username", "password"):
            if getattr(cluster, key) is None:
                raise t.error(key, f'required when sasl_mechanism = "{cluster.sasl_mechanism}"')
    elif cluster.username or cluster.password:
        key = "username" if cluster.username else "password"
        shown = f", got {_show(cluster.username)}" if cluster.username else ""
        mechanisms = ", ".join(SASL_MECHANISMS)
        raise t.error(key, f"set sasl_mechanism ({mechanisms}) to use a {key}{shown}")
    cert, key_file = cluster.client_cert_path, cluster.client_key_path
    if (cert is None) != (key_file is None):
        given_key, missing = ("client_cert_path", "client_key_path")[:: 1 if cert else -1]
        shown = _show(cert or key_file, limit=None)  # a file is named whole
        raise t.error(missing, f"required when {given_key} is set ({shown})")
    return cluster


def _topics(doc: _Table, discover: part.DiscoverConfig) -> tuple[TopicRoute, ...]:
    """[topics]; it may be empty (or absent) when [discover] chooses topics by pattern."""
    t = doc.sub("topics", required=not discover.include, quote=True)
    if not t.mapping and not discover.include:
        raise ConfigError(f"{t.path}: no topics to relay (name some, or set [discover].include)")
    return tuple(_route(t, source) for source in t.mapping)


def _route(t: _Table, source: str) -> TopicRoute:
    if not _TOPIC_NAME.fullmatch(source):
        raise t.error(source, 'not a valid Kafka topic name (letters, digits, ".", "_", "-")')
    value = t.get(source)
    text = value if isinstance(value, str) else ""
    target, sep, number = text.rpartition(":") if ":" in text else (text, "", "")
    partition = int(number) if number.isascii() and number.isdigit() else None
    if not _TOPIC_NAME.fullmatch(target) or (sep and partition is None):
        expected = 'expected "target-topic" or "target-topic:partition"'
        raise t.error(source, f"{expected}, got {_show(value)}")
    return TopicRoute(source, target, partition)


def _sources(doc: _Table) -> tuple[ClusterConfig, ...]:
    value = doc.mapping.get("sources")
    doc.known.add("sources")
    if isinstance(value, dict):
        raise ConfigError("[sources]: write [[sources]] (an array of tables), not [sources]")
    if not value:
        raise ConfigError("[[sources]]: missing; add at least one [[sources]] section")
    if not isinstance(value, list):
        raise ConfigError(f"sources: expected [[sources]] tables, got {_show(value)}")
    sources: list[ClusterConfig] = []
    for index, entry in enumerate(value, start=1):
        path = f"[[sources]][{index}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{path}: expected a table, got {_show(entry)}")
        t = _Table(entry, path, doc.base_dir)
        source = _cluster(t)
        t.finish()
        earlier = [i for i, other in enumerate(sources, start=1) if other.name == source.name]
        if earlier:
            raise t.error(
                "name", f"{_show(source.name)} is already used by [[sources]][{earlier[0]}]"
            )
        sources.append(source)
    return tuple(sources)


def _filters(doc: _Table, cli_filters: Sequence[str]) -> tuple[part.FilterConfig, ...]:
    table = doc.sub("filters")
    sections = [_build(part.FilterConfig, table.sub(id_), id=id_) for id_ in table.mapping]
    added: list[part.FilterConfig] = []
    for given in cli_filters:
        real = os.path.realpath(given)
        if not os.path.isfile(real):
            raise ConfigError(f"--filter {given}: file not found")
        same = [i for i, s in enumerate(sections) if os.path.realpath(s.path) == real]
        if same:
            # Naming a section's file on the command line enables it, whatever the file says.
            sections[same[0]] = dataclasses.replace(sections[same[0]], enabled=True)
        elif all(os.path.realpath(f.path) != real for f in added):
            added.append(_cli_filter(given, sections + added))
    return tuple(s for s in sections if s.enabled) + tuple(added)


def _cli_filter(given: str, others: list[part.FilterConfig]) -> part.FilterConfig:
    """A filter named only on the command line: its id is the file's stem."""
    filter_id = Path(given).stem
    clash = [f.path for f in others if f.id == filter_id]
    if clash:
        raise ConfigError(
            f'--filter {given}: filter id "{filter_id}" is already used by {clash[0]}'
        )
    return part.FilterConfig(filter_id, os.path.abspath(given), from_section=False)
