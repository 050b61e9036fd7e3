"""Record filters: load user filter files, ship them to executors, judge records.

A filter file is a Python module defining ``new(config)``; the contract is in
filters/README.md. The driver reads each file into a FilterSpec that carries the file's
text, not just its path, so executors on a real cluster need no shared filesystem. Each
worker process compiles a spec once (cached_filters) and reuses the filter for every record.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import linecache
import re
import reprlib
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Protocol

from relay.config import ON_ERROR, Config, FilterConfig
from relay.errors import FilterError


class Filter(Protocol):
    """What a filter file's new(config) returns."""

    id: str

    def is_allowed(self, record: FilterRecord) -> bool: ...


class FilterRuntimeError(Exception):
    """A filter raised, or returned a non-bool, while judging a record.

    Not a KtmError: the relay loop catches it, adds topic/partition/offset, and stops or
    skips the record according to the spec's on_error.
    """

    def __init__(self, filter_id: str, error: BaseException | str) -> None:
        text = error if isinstance(error, str) else _describe(error)
        # Only strings in args, so the error pickles across the executor/driver boundary.
        super().__init__(filter_id, text)
        self.filter_id = filter_id
        self.error = text

    def __str__(self) -> str:
        return f"filter {self.filter_id!r} failed: {self.error}"


@dataclass(frozen=True)
class FilterSpec:
    """A picklable description of one filter, built on the driver, loaded on executors."""

    id: str
    path: str  # for messages and tracebacks only; executors never open it
    # Out of repr: the source is long, and config may hold credentials for a lookup service.
    source: str = field(repr=False)
    config: tuple[tuple[str, object], ...] = field(default=(), repr=False)
    on_error: str = "stop"
    check_id: bool = True
    section: str | None = None  # "pii" for [filters.pii]; None for --filter PATH

    def __post_init__(self) -> None:
        if self.on_error not in ON_ERROR:
            raise FilterError(
                f'{self.where}: on_error must be "stop" or "skip", got {self.on_error!r}'
            )

    @classmethod
    def from_file(
        cls,
        id: str,
        path: str | Path,
        config: Mapping[str, object] | None = None,
        on_error: str = "stop",
        check_id: bool = True,
        section: str | None = None,
    ) -> FilterSpec:
        """Read the filter file now, on the driver, so a missing file fails at startup."""
        where = _where(section, str(path))
        config = {} if config is None else config
        if not isinstance(config, Mapping) or not all(isinstance(k, str) for k in config):
            raise FilterError(f"{where}: config must be a table, got {reprlib.repr(config)}")
        try:
            source = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise FilterError(f"{where}: file not found: {path}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise FilterError(f"{where}: cannot read {path}: {_describe(exc)}") from exc
        return cls(id, str(path), source, tuple(config.items()), on_error, check_id, section)

    @property
    def where(self) -> str:
        """How error messages name this filter: its TOML section, else the flag."""
        return _where(self.section, self.path)

    @property
    def source_sha256(self) -> str:
        return hashlib.sha256(self.source.encode("utf-8")).hexdigest()

    def config_dict(self) -> dict[str, object]:
        # A deep copy, so a filter that mutates its config cannot change the spec.
        return copy.deepcopy(dict(self.config))


@dataclass(slots=True, repr=False)
class FilterRecord:
    """The record a filter sees; slots because one is built per relayed record."""

    topic: str
    partition: int
    offset: int
    timestamp: int  # milliseconds since the epoch
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)  # a value may be null

    def __repr__(self) -> str:
        # Position only: keys and values may be large or hold personal data.
        return f"FilterRecord(topic={self.topic!r} partition={self.partition} offset={self.offset})"


def specs_from_config(filters: Iterable[FilterConfig]) -> tuple[FilterSpec, ...]:
    """Specs for the config's filters (relay.config.FilterConfig: a `[filters.<id>]` section,
    whose id is checked, or a file named only with --filter, whose id is not)."""
    return tuple(
        FilterSpec.from_file(
            f.id,
            f.path,
            f.config_dict(),
            on_error=f.on_error,
            check_id=f.from_section,
            section=f.id if f.from_section else None,
        )
        for f in filters
    )


def load_filters(cfg: Config) -> tuple[FilterSpec, ...]:
    """The one path from a config (its `[filters.<id>]` sections and `--filter` files) to the
    specs every record-moving command ships to its tasks; each is loaded once here, on the
    driver, so a bad filter fails before any Spark work."""
    specs = specs_from_config(cfg.filters)
    validate_filters(specs)
    return specs


def load_filter(spec: FilterSpec) -> Filter:
    """Compile spec.source into a fresh module, call new(config), check the result."""
    global _load_count
    _load_count += 1
    module = _exec_module(spec)
    factory = getattr(module, "new", None)
    if not callable(factory):
        raise FilterError(f"{spec.where}: {spec.path} defines no new(config) function")
    try:
        made = factory(spec.config_dict())
    except Exception as exc:
        raise FilterError(f"{spec.where}: new(config) raised {_describe(exc)}") from exc
    _check_contract(spec, made)
    checked: Filter = made  # a plugin's object, its contract just checked
    return checked


def validate_filters(specs: Iterable[FilterSpec]) -> list[Filter]:
    """Load every spec on the driver, so a bad filter fails before any Spark work."""
    seen: dict[str, FilterSpec] = {}
    for spec in specs:
        if spec.id in seen:
            # apply_filters reports the rejecting id; two filters sharing one would be ambiguous.
            raise FilterError(f"{spec.where}: id {spec.id!r} is also used by {seen[spec.id].where}")
        seen[spec.id] = spec
    return [load_filter(spec) for spec in seen.values()]


def cached_filters(specs: Iterable[FilterSpec]) -> list[Filter]:
    """The filters for specs, each loaded at most once per worker process."""
    loaded = []
    # The lock keeps two task threads in one worker from loading the same filter twice.
    with _CACHE_LOCK:
        for spec in specs:
            key = (spec.id, spec.source_sha256, repr(spec.config))
            if key not in _CACHE:
                _CACHE[key] = load_filter(spec)
            loaded.append(_CACHE[key])
    return loaded


def load_count() -> int:
    """How many times this process has compiled a filter (lets tests prove the caching)."""
    return _load_count


def apply_filters(filters: Sequence[Filter], record: FilterRecord) -> str | None:
    """The id of the first filter that rejects record, or None if all allow it."""
    for flt in filters:
        try:
            allowed = flt.is_allowed(record)
        except Exception as exc:
            raise FilterRuntimeError(flt.id, exc) from exc
        if allowed is True:
            continue
        if allowed is False:
            return flt.id
        # A filter that forgets to return would otherwise silently drop every record.
        kind = type(allowed).__name__
        raise FilterRuntimeError(flt.id, f"is_allowed returned {kind}, expected bool")
    return None


_CACHE: dict[tuple[str, str, str], Filter] = {}
_CACHE_LOCK = threading.Lock()
_load_count = 0


def _where(section: str | None, path: str) -> str:
    return f"[filters.{section}]" if section is not None else f"--filter {path}"


def _describe(exc: BaseException) -> str:
    # One line: the CLI prints errors as a single readable line.
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _exec_module(spec: FilterSpec) -> ModuleType:
    try:
        code = compile(spec.source, spec.path, "exec")
    except SyntaxError as exc:
        msg = f"syntax error in {spec.path} line {exc.lineno}: {exc.msg}"
        raise FilterError(f"{spec.where}: {msg}") from exc
    except ValueError as exc:  # null bytes in the source
        raise FilterError(f"{spec.where}: cannot compile {spec.path}: {exc}") from exc
    safe_id = re.sub(r"\W", "_", spec.id)
    name = f"ktm_filter_{safe_id}_{spec.source_sha256[:8]}"
    module_spec = importlib.util.spec_from_loader(name, loader=None, origin=spec.path)
    assert module_spec is not None  # spec_from_loader returns None only for a bad loader
    module = importlib.util.module_from_spec(module_spec)
    module.__file__ = spec.path
    # Tracebacks show source lines even where the file does not exist (executors);
    # mtime None tells linecache.checkcache not to evict the entry.
    lines = spec.source.splitlines(keepends=True)
    linecache.cache[spec.path] = (len(spec.source), None, lines, spec.path)
    # Registered like a normal import: dataclasses and typing look modules up by name.
    sys.modules[name] = module
    try:
        exec(code, module.__dict__)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise FilterError(f"{spec.where}: running {spec.path} raised {_describe(exc)}") from exc
    return module


def _check_contract(spec: FilterSpec, made: object) -> None:
    where = spec.where
    if made is None:
        raise FilterError(f"{where}: new(config) returned None, not a filter object")
    kind = f"an object of type {type(made).__name__}"
    if not callable(getattr(made, "is_allowed", None)):
        raise FilterError(f"{where}: new(config) returned {kind} with no is_allowed(record)")
    reported = getattr(made, "id", None)
    if not isinstance(reported, str):
        shown = reprlib.repr(reported)
        raise FilterError(f"{where}: new(config) returned {kind} whose id is not a str: {shown}")
    if spec.check_id and reported != spec.id:
        if spec.section is not None:
            expected = f"the section is named {spec.section!r}"
        else:
            expected = f"{spec.id!r} was expected"
        raise FilterError(f"{where}: filter reports id {reported!r} but {expected}")
