"""Reading TOML tables: the `_Table` that remembers which keys were asked for, and one small
reader per kind of value. Every error is a ConfigError whose single line names the full key path
and the bad value (never a secret's value)."""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import functools
import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeAlias, TypeVar

from relay.config.choices import SASL_MECHANISMS
from relay.errors import ConfigError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(us|ms|s|m|h)")
# Multiplier and divisor rather than 1e-3: 20 / 1000 is exactly the float 0.02, 20 * 1e-3 is not.
_UNITS = {"us": (1, 1_000_000), "ms": (1, 1000), "s": (1, 1), "m": (60, 1), "h": (3600, 1)}
_ENV_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ACKS = {"all": "all", "-1": "all", "1": "1", "0": "0"}
_SECRET_WORDS = ("password", "secret", "token")
_D = TypeVar("_D", bound="DataclassInstance")  # a config dataclass `_build` reads

# A value as a TOML parser reads it
_TomlTime: TypeAlias = datetime.datetime | datetime.date | datetime.time
_TomlScalar: TypeAlias = str | int | float | bool | _TomlTime
TomlValue: TypeAlias = _TomlScalar | list["TomlValue"] | dict[str, "TomlValue"]


@dataclass(frozen=True)
class Secret:
    """A password: never shown by repr, str, logs, errors or `Config.redacted()`."""

    value: str = field(repr=False)

    def __repr__(self) -> str:
        return "***"

    __str__ = __repr__


def parse_duration(text: object) -> float:
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


_SIZE = re.compile(r"(\d+(?:\.\d*)?)\s*(B|KB|MB|GB|KiB|MiB|GiB)?")
_SIZE_UNITS = {None: 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9}
_SIZE_UNITS.update({"KiB": 2**10, "MiB": 2**20, "GiB": 2**30})


def parse_size(text: object) -> int:
    """Bytes in "64MiB", "500KB", "1GiB" or a bare integer; ValueError for anything else."""
    if isinstance(text, int) and not isinstance(text, bool) and text >= 0:
        return text
    match = _SIZE.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f'expected a size such as "64MiB" or "500KB", got {_show(text)}')
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])


class _Table:
    """One TOML table being read. Every key asked for is recorded, so that `finish()` can report
    the others as unknown and suggest the nearest known one."""

    def __init__(
        self, mapping: Mapping[str, TomlValue], path: str, base_dir: str, quote: bool = False
    ) -> None:
        self.mapping, self.path, self.base_dir = mapping, path, base_dir
        self._quote = quote  # for keys that are names (topics, spark settings), not ours
        self.known: set[str] = set()  # keys asked for, or declared by `_build`

    def key(self, key: str) -> str:
        shown = json.dumps(key) if self._quote else _bare(key)
        return f"{self.path}.{shown}" if self.path else shown

    def get(self, key: str) -> TomlValue | None:
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


def _expand(value: TomlValue, path: str) -> TomlValue:
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


def _show(value: object, limit: int | None = 80) -> str:
    """A bad value as it would be written in TOML, shortened to `limit` characters so that the
    error stays one line (a path is shown whole: `limit=None`)."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
    elif isinstance(value, list):
        text = "[" + ", ".join(_show(item) for item in value) + "]"
    else:
        text = "a table" if isinstance(value, dict) else str(value)
    return text if limit is None or len(text) <= limit else text[: limit - 3] + "..."


def _kind(value: object) -> str:
    """`a string`, `an integer`...: all we may say about a value that must stay hidden."""
    names = {bool: "boolean", int: "integer", float: "float", list: "array", dict: "table"}
    name = names.get(type(value), type(value).__name__)
    return f"an {name}" if name[0] in "aeiou" else f"a {name}"


def _reads(read: Callable[..., object], **options: object) -> dict[str, Callable[..., object]]:
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


def _size(t: _Table, key: str, *, minimum: int = 0) -> int:
    value = t.get(key)
    try:
        size = parse_size(value)
    except ValueError as exc:
        raise t.error(key, str(exc)) from None
    if size < minimum:
        raise t.error(key, f"expected at least {minimum} bytes, got {_show(value)}")
    return size


def _names(t: _Table, key: str) -> tuple[str, ...]:
    value = t.get(key)
    if isinstance(value, list):
        names = tuple(v for v in value if isinstance(v, str) and v)
        if len(names) == len(value):
            return names
    raise t.error(key, f"expected a list of non-empty strings, got {_show(value)}")


def _optional_names(t: _Table, key: str) -> tuple[str, ...]:
    return () if t.get(key) == [] else _names(t, key)


def _patterns(t: _Table, key: str) -> tuple[str, ...]:
    """Regular expressions, each matched against a whole name (names are patterns too)."""
    patterns = _optional_names(t, key)
    for index, pattern in enumerate(patterns):
        try:
            re.compile(pattern)
        except re.error as exc:
            raise t.error(key, f"item {index + 1} {_show(pattern)} is not a regex: {exc}") from None
    return patterns


def _template(t: _Table, key: str) -> str:
    """A destination topic name with "{topic}" in it ("{topic}", "east.{topic}")."""
    value = _text(t, key)
    example = value.replace("{topic}", "orders", 1)
    if value.count("{topic}") != 1 or not _TOPIC_NAME.fullmatch(example):
        expected = 'expected a topic name holding "{topic}" once ("{topic}", "east.{topic}")'
        raise t.error(key, f"{expected}, got {_show(value)}")
    return value


def _prefix(t: _Table, key: str) -> str:
    value = t.get(key)
    if isinstance(value, str) and (value == "" or _TOPIC_NAME.fullmatch(value)):
        return value
    raise t.error(key, f'expected a topic name prefix such as "east.", got {_show(value)}')


def _url(t: _Table, key: str) -> str | None:
    text = _optional_text(t, key)
    if text is not None and not re.fullmatch(r"https?://[^\s/]+(/\S*)?", text):
        raise t.error(key, f'expected "http://host:port" or "https://host", got {_show(text)}')
    return text


def _host_port(text: str) -> tuple[str, int] | None:
    """("host", port) from "host:port" (the host may be empty), or None when malformed."""
    host, sep, port = text.rpartition(":")
    if not (sep and port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        return None
    return None if any(c.isspace() for c in host) else (host, int(port))


def _servers(t: _Table, key: str) -> tuple[str, ...]:
    value = t.get(key)
    if isinstance(value, list) and value:
        servers = tuple(server for server in value if isinstance(server, str))
        if len(servers) == len(value) and all((_host_port(s) or ("", 0))[0] for s in servers):
            return servers
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


def _filter_config(t: _Table, key: str) -> tuple[tuple[str, object], ...]:
    table = t.sub(key)
    return tuple((name, table.get(name)) for name in table.mapping)


def _build(cls: type[_D], t: _Table, *, finish: bool = True, **given: object) -> _D:
    """A `cls` whose fields with a reader are read from the keys of the same names in `t`."""
    values = dict(given)
    for f in dataclasses.fields(cls):
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
