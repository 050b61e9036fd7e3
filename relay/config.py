"""Configuration: one TOML file read by `load_config` into frozen dataclasses.

Every error is a ConfigError whose single line names the full TOML key path and the bad value, so
the operator can fix the file without reading code. Unknown keys are errors: a misspelt key must
fail loudly instead of silently leaving a default in force.

Each dataclass field read from TOML names its reader in its metadata (`_reads`), so a key's type,
default and checks sit on one line; `_build` reads a whole table that way.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import tomli

from relay.errors import ConfigError

SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
COMPRESSIONS = ("none", "gzip", "snappy", "lz4", "zstd")
LOG_LEVELS = ("debug", "info", "warning", "error")
ON_ERROR = ("stop", "skip")
ON_MISMATCH = ("stop", "continue")
TOP_LEVEL_KEYS = ("app", "spark", "topics", "sources", "source_pool", "target", "filters")

_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(us|ms|s|m|h)")
# Multiplier and divisor rather than 1e-3: 20 / 1000 is exactly the float 0.02, 20 * 1e-3 is not.
_UNITS = {"us": (1, 1_000_000), "ms": (1, 1000), "s": (1, 1), "m": (60, 1), "h": (3600, 1)}
_ENV_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ACKS = {"all": "all", "-1": "all", "1": "1", "0": "0"}
_SECRET_WORDS = ("password", "secret", "token")
_T = TypeVar("_T")


@dataclass(frozen=True)
class Secret:
    """A password: never shown by repr, str, logs, errors or `Config.redacted()`."""

    value: str = field(repr=False)

    def __repr__(self) -> str:
        return "***"

    __str__ = __repr__


def parse_duration(text: str | float) -> float:
    """Seconds in "500us", "20ms", "1.5s", "2m" or "1h"; a bare number is already seconds.

    Raises ValueError, with a message fit to follow a key path, for anything else or a negative.
    """
    seconds = math.nan
    if isinstance(text, int | float) and not isinstance(text, bool):
        seconds = float(text)
    elif isinstance(text, str) and (match := _DURATION.fullmatch(text)):
        multiplier, divisor = _UNITS[match.group(2)]
        seconds = float(match.group(1)) * multiplier / divisor
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f'expected a duration >= 0 such as "3s" or "100ms", got {_show(text)}')
    return seconds


class _Table:
    """One TOML table being read. Every key asked for is recorded, so that `finish()` can report
    the others as unknown and suggest the nearest known one."""

    def __init__(
        self, mapping: Mapping[str, Any], path: str, base_dir: str, quote: bool = False
    ) -> None:
        self.mapping, self.path, self.base_dir = mapping, path, base_dir
        self._quote = quote  # for keys that are names (topics, spark settings), not ours
        self.known: set[str] = set()  # keys asked for, or declared by `_build`

    def key(self, key: str) -> str:
        shown = json.dumps(key) if self._quote else _bare(key)
        return f"{self.path}.{shown}" if self.path else shown

    def get(self, key: str) -> Any:
        """The value with ${NAME} expanded, or None when absent."""
        self.known.add(key)
        return _expand(self.mapping[key], self.key(key)) if key in self.mapping else None

    def sub(self, key: str, *, required: bool = False, quote: bool = False) -> _Table:
        """The table under `key` ([app] in the document, [spark.conf] in [spark]); {} if absent."""
        self.known.add(key)
        value = self.mapping.get(key)
        path = f"{self.path[:-1]}.{_bare(key)}]" if self.path else f"[{key}]"
        if value is None and required:
            raise ConfigError(f"{path}: missing section")
        if not isinstance(value, dict | None):
            raise ConfigError(f"{path}: expected a table, got {_show(value)}")
        return _Table(value or {}, path, self.base_dir, quote)

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.key(key)}: {message}")

    def finish(self) -> None:
        for key in self.mapping:
            if key not in self.known:
                close = difflib.get_close_matches(key, sorted(self.known), n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise self.error(key, f"unknown key{hint}")


def _expand(value: Any, path: str) -> Any:
    """Replaces ${NAME} in strings, also inside arrays and inline tables, from os.environ."""
    if isinstance(value, list):
        return [_expand(item, path) for item in value]
    if isinstance(value, dict):
        return {key: _expand(item, path) for key, item in value.items()}
    if not isinstance(value, str):
        return value

    def lookup(match: re.Match[str]) -> str:
        if match.group(1) not in os.environ:
            raise ConfigError(f"{path}: environment variable {match.group(1)} is not set")
        return os.environ[match.group(1)]

    return _ENV_VAR.sub(lookup, value)


def _bare(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key)


def _show(value: Any) -> str:
    """A bad value as it would be written in TOML, shortened so that the error stays one line."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
    elif isinstance(value, list):
        text = "[" + ", ".join(_show(item) for item in value) + "]"
    else:
        text = "a table" if isinstance(value, dict) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _kind(value: Any) -> str:
    """`a string`, `an integer`...: all we may say about a value that must stay hidden."""
    names = {bool: "boolean", int: "integer", float: "float", list: "array", dict: "table"}
    name = names.get(type(value), type(value).__name__)
    return f"an {name}" if name[0] in "aeiou" else f"a {name}"


def _reads(read: Callable[..., Any], **options: Any) -> dict[str, Any]:
    """Field metadata: `_build` reads the field from the key of its name with read(table, key)."""
    return {"read": functools.partial(read, **options)}


# Readers: called by `_build` only for keys present in the table; each returns the checked value.


def _text(t: _Table, key: str) -> str:
    value = t.get(key)
    if not isinstance(value, str) or not value:
        raise t.error(key, f"expected a non-empty string, got {_show(value)}")
    return value


def _optional_text(t: _Table, key: str) -> str | None:
    # "" means "not set" too, so that an empty ${VAR} can switch an optional setting off.
    return None if t.get(key) == "" else _text(t, key)


def _bool(t: _Table, key: str) -> bool:
    value = t.get(key)
    if not isinstance(value, bool):
        raise t.error(key, f"expected true or false, got {_show(value)}")
    return value


def _int(t: _Table, key: str, *, minimum: int, maximum: int | None = None) -> int:
    value = t.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and minimum <= value:
        if maximum is None or value <= maximum:
            return value
    bounds = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
    raise t.error(key, f"expected an integer {bounds}, got {_show(value)}")


def _choice(t: _Table, key: str, *, choices: Sequence[str]) -> str:
    """One of `choices`, matched without regard to case, returned as spelt in `choices`."""
    value = t.get(key)
    found = {c.lower(): c for c in choices}.get(value.lower()) if isinstance(value, str) else None
    if found is None:
        raise t.error(key, f"expected one of {', '.join(choices)}, got {_show(value)}")
    return found


def _duration(
    t: _Table,
    key: str,
    *,
    positive: bool = False,
    minimum: float = 0.0,
    maximum: float = math.inf,
) -> float:
    value = t.get(key)
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise t.error(key, str(exc)) from None
    if (positive and seconds == 0) or seconds < minimum or seconds > maximum:
        low = f">= {minimum:g}s" if minimum else "> 0"
        bounds = low + (f" and <= {maximum:g}s" if maximum < math.inf else "")
        raise t.error(key, f"expected a duration {bounds}, got {_show(value)}")
    return seconds


def _host_port(text: str) -> tuple[str, int] | None:
    """("host", port) from "host:port" (the host may be empty), or None when malformed."""
    host, sep, port = text.rpartition(":")
    if not (sep and port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        return None
    return None if any(c.isspace() for c in host) else (host, int(port))


def _servers(t: _Table, key: str) -> tuple[str, ...]:
    value = t.get(key)
    if isinstance(value, list) and value and all(isinstance(s, str) for s in value):
        if all((_host_port(server) or ("", 0))[0] for server in value):
            return tuple(value)
    raise t.error(key, f'expected a non-empty list of "host:port" strings, got {_show(value)}')


def _mechanism(t: _Table, key: str) -> str | None:
    return None if t.get(key) == "" else _choice(t, key, choices=SASL_MECHANISMS)


def _password(t: _Table, key: str) -> Secret | None:
    value = t.get(key)
    if not isinstance(value, str):
        # Even a mistyped password may be a real one: name its type, never its value.
        raise t.error(key, f"expected a string, got {_kind(value)}")
    return Secret(value) if value else None


def _file(t: _Table, key: str) -> str:
    # Relative paths are relative to the config file, so that ktm works from any directory.
    path = os.path.normpath(os.path.join(t.base_dir, os.path.expanduser(_text(t, key))))
    if not os.path.isfile(path):
        raise t.error(key, f"file not found: {path}")
    return path


def _cert_path(t: _Table, key: str) -> str | None:
    if _optional_text(t, key) is None:
        return None
    if t.get("tls") is not True:
        raise t.error(key, "set tls = true to use certificates")
    return _file(t, key)


def _metrics_addr(t: _Table, key: str) -> tuple[str, int] | None:
    text = _optional_text(t, key)
    address = _host_port(text) if text else None
    if text and address is None:
        expected = 'expected "host:port" (port 1..65535), or "" to disable'
        raise t.error(key, f"{expected}, got {_show(text)}")
    if address is None:
        return None
    # ":7081" means every interface; "[::]:7081" is an IPv6 host, which binds without brackets.
    return address[0].removeprefix("[").removesuffix("]") or "0.0.0.0", address[1]


def _acks(t: _Table, key: str) -> str:
    # kafka-python spells "all" as -1 too, and TOML lets users write 1 or "1": store one string.
    value = t.get(key)
    text = (
        str(value).lower() if isinstance(value, str | int) and not isinstance(value, bool) else ""
    )
    if text not in _ACKS:
        raise t.error(key, f'expected "all" (or -1), 1 or 0, got {_show(value)}')
    return _ACKS[text]


def _spark_conf(t: _Table, key: str) -> tuple[tuple[str, str], ...]:
    table = t.sub(key, quote=True)
    conf: dict[str, str] = {}
    for name in table.mapping:
        value = table.get(name)
        if isinstance(value, bool):
            conf[name] = "true" if value else "false"
        elif isinstance(value, str | int | float):
            conf[name] = str(value)
        else:
            # Unquoted dotted keys (spark.a.b = 1) arrive as nested tables: say how to write them.
            expected = 'expected a string, number or boolean (quote dotted keys: "spark.x" = ...)'
            raise table.error(name, f"{expected}, got {_show(value)}")
    return tuple(sorted(conf.items()))


def _filter_config(t: _Table, key: str) -> tuple[tuple[str, Any], ...]:
    table = t.sub(key)
    return tuple((name, table.get(name)) for name in table.mapping)


@dataclass(frozen=True)
class ClusterConfig:
    """How to reach one cluster: a `[[sources]]` entry, or the connection keys of `[target]`."""

    name: str = field(metadata=_reads(_text))  # "target" for the target
    servers: tuple[str, ...] = field(metadata=_reads(_servers))
    sasl_mechanism: str | None = field(default=None, metadata=_reads(_mechanism))
    username: str | None = field(default=None, metadata=_reads(_optional_text))
    password: Secret | None = field(default=None, metadata=_reads(_password))
    tls: bool = field(default=False, metadata=_reads(_bool))
    ca_cert_path: str | None = field(default=None, metadata=_reads(_cert_path))
    client_cert_path: str | None = field(default=None, metadata=_reads(_cert_path))
    client_key_path: str | None = field(default=None, metadata=_reads(_cert_path))


@dataclass(frozen=True)
class TopicRoute:
    """One `[topics]` entry; partition None keeps each record's source partition number."""

    source: str
    target: str
    partition: int | None = None


@dataclass(frozen=True)
class AppConfig:
    log_level: str = field(default="info", metadata=_reads(_choice, choices=LOG_LEVELS))
    metrics_addr: tuple[str, int] | None = field(
        default=("127.0.0.1", 7081), metadata=_reads(_metrics_addr)
    )
    group_id: str = field(default="ktm", metadata=_reads(_text))  # source consumer group
    # /healthz answers 503 when nothing was relayed for this long while there is lag.
    stuck_after: float = field(default=120.0, metadata=_reads(_duration, positive=True))
    # Session timeout of the group ktm processes on one config coordinate through: a process
    # that dies hands its partitions over after about this long.
    session_timeout: float = field(
        default=6.0, metadata=_reads(_duration, minimum=1.0, maximum=300.0)
    )


@dataclass(frozen=True)
class SparkConfig:
    master: str | None = field(default=None, metadata=_reads(_optional_text))  # None: local[N]
    app_name: str = field(default="ktm", metadata=_reads(_text))
    slots: int = field(default=0, metadata=_reads(_int, minimum=0))  # 0: ask Spark
    # How often the driver checks whether re-planning the partition groups would pay off.
    rebalance_interval: float = field(default=30.0, metadata=_reads(_duration, positive=True))
    control_port: int = field(default=0, metadata=_reads(_int, minimum=0, maximum=65535))
    conf: tuple[tuple[str, str], ...] = field(default=(), metadata=_reads(_spark_conf))


@dataclass(frozen=True)
class SourcePoolConfig:
    healthcheck_interval: float = field(default=3.0, metadata=_reads(_duration, positive=True))
    request_timeout: float = field(default=1.0, metadata=_reads(_duration, positive=True))
    offset_lag_threshold: int = field(default=1000, metadata=_reads(_int, minimum=0))
    max_retries: int = field(default=-1, metadata=_reads(_int, minimum=-1))  # -1: forever
    backoff_min: float = field(default=1.0, metadata=_reads(_duration))
    backoff_max: float = field(default=10.0, metadata=_reads(_duration))
    randomize_initial: bool = field(default=False, metadata=_reads(_bool))
    # What to do when the record at the resume point on a new node differs from what was relayed.
    on_mismatch: str = field(default="stop", metadata=_reads(_choice, choices=ON_MISMATCH))


@dataclass(frozen=True)
class TargetConfig:
    cluster: ClusterConfig
    compression: str = field(default="none", metadata=_reads(_choice, choices=COMPRESSIONS))
    linger: float = field(default=0.005, metadata=_reads(_duration))
    batch_size: int = field(
        default=262144, metadata=_reads(_int, minimum=1024, maximum=64 * 1024 * 1024)
    )
    max_retries: int = field(default=5, metadata=_reads(_int, minimum=-1))  # -1: forever
    backoff_min: float = field(default=0.5, metadata=_reads(_duration))
    backoff_max: float = field(default=10.0, metadata=_reads(_duration))
    acks: str = field(default="all", metadata=_reads(_acks))
    request_timeout: float = field(default=30.0, metadata=_reads(_duration, positive=True))


@dataclass(frozen=True)
class FilterConfig:
    """A `[filters.<id>]` section, or a filter named only with `--filter PATH`."""

    id: str
    path: str = field(metadata=_reads(_file))  # absolute
    enabled: bool = field(default=True, metadata=_reads(_bool))
    on_error: str = field(default="stop", metadata=_reads(_choice, choices=ON_ERROR))
    config: tuple[tuple[str, Any], ...] = field(default=(), metadata=_reads(_filter_config))
    # False for a filter named only with --filter: no section, so its id is not checked.
    from_section: bool = True

    def config_dict(self) -> dict[str, Any]:
        # A deep copy: a filter that changes its config must not change ours.
        return copy.deepcopy(dict(self.config))


@dataclass(frozen=True)
class Config:
    path: str
    app: AppConfig
    spark: SparkConfig
    topics: tuple[TopicRoute, ...]
    sources: tuple[ClusterConfig, ...]
    source_pool: SourcePoolConfig
    target: TargetConfig
    filters: tuple[FilterConfig, ...]

    def redacted(self) -> dict[str, Any]:
        """Everything as plain dicts and lists, for `--debug`, with every secret shown as "***"."""
        dumped: dict[str, Any] = _dump(self)
        return dumped


def _dump(value: Any, name: str = "") -> Any:
    if isinstance(value, Secret) or (name and any(w in name.lower() for w in _SECRET_WORDS)):
        return None if value is None else "***"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        dumped = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            # conf/config hold (key, value) pairs: shown as tables so that their keys get redacted.
            dumped[f.name] = _dump(dict(item) if f.name in ("conf", "config") else item, f.name)
        return dumped
    if isinstance(value, Mapping):
        return {key: _dump(item, str(key)) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_dump(item) for item in value]
    return value


def _build(cls: type[_T], t: _Table, *, finish: bool = True, **given: Any) -> _T:
    """A `cls` whose fields with a reader are read from the keys of the same names in `t`."""
    values = dict(given)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in given or "read" not in f.metadata:
            continue
        t.known.add(f.name)
        if f.name in t.mapping:
            values[f.name] = f.metadata["read"](t, f.name)
        elif f.default is dataclasses.MISSING:
            raise t.error(f.name, "missing (required)")
    if finish:
        t.finish()
    return cls(**values)


def load_config(path: str | os.PathLike[str], *, cli_filters: Sequence[str] = ()) -> Config:
    """Reads and checks the whole file; `cli_filters` are the `--filter PATH` arguments."""
    doc = _Table(_read_toml(path), "", os.path.dirname(os.path.abspath(path)))
    # Unknown sections first: "[taget]" should say so, not that [target] is missing.
    doc.known.update(TOP_LEVEL_KEYS)
    doc.finish()
    return Config(
        path=os.fspath(path),
        app=_build(AppConfig, doc.sub("app")),
        spark=_spark(doc.sub("spark")),
        topics=_topics(doc.sub("topics", required=True, quote=True)),
        sources=_sources(doc),
        source_pool=_source_pool(doc.sub("source_pool")),
        target=_target(doc.sub("target", required=True)),
        filters=_filters(doc, cli_filters),
    )


def _read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
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
    return target


def _check_backoff(t: _Table, low: float, high: float) -> None:
    if high < low:
        raise t.error("backoff_max", f"expected >= backoff_min ({low:g}s), got {high:g}s")


def _cluster(t: _Table, **given: Any) -> ClusterConfig:
    """Reads the connection keys and checks the ones that go together; the caller finishes `t`."""
    cluster = _build(ClusterConfig, t, finish=False, **given)
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
        shown = _show(cert or key_file)
        raise t.error(missing, f"required when {given_key} is set ({shown})")
    return cluster


def _topics(t: _Table) -> tuple[TopicRoute, ...]:
    if not t.mapping:
        raise ConfigError(f"{t.path}: no topics to relay")
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


def _filters(doc: _Table, cli_filters: Sequence[str]) -> tuple[FilterConfig, ...]:
    table = doc.sub("filters")
    sections = [_build(FilterConfig, table.sub(id_), id=id_) for id_ in table.mapping]
    added: list[FilterConfig] = []
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


def _cli_filter(given: str, others: list[FilterConfig]) -> FilterConfig:
    """A filter named only on the command line: its id is the file's stem."""
    filter_id = Path(given).stem
    clash = [f.path for f in others if f.id == filter_id]
    if clash:
        raise ConfigError(
            f'--filter {given}: filter id "{filter_id}" is already used by {clash[0]}'
        )
    return FilterConfig(filter_id, os.path.abspath(given), from_section=False)
