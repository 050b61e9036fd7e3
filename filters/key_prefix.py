"""Relay or drop records by the start of their key.

Config keys (the [filters.<id>].config table):
  id        str, default "key_prefix": the id this filter reports; it must equal the
            section name, so set it when the section is named otherwise.
  prefixes  non-empty list of str, required: key prefixes, compared with the key's
            bytes after UTF-8 encoding.
  mode      "allow" (default): relay only records whose key starts with a prefix;
            "deny": drop those records, relay the rest.
  missing   "allow" or "deny": what to do with a record whose key is null (an empty
            key is not missing). Default: such a record matches no prefix, so it is
            dropped in allow mode and relayed in deny mode.
"""

from typing import Any

KNOWN_KEYS = ("id", "prefixes", "mode", "missing")


class KeyPrefix:
    def __init__(
        self, filter_id: str, prefixes: tuple[bytes, ...], mode: str, missing: str
    ) -> None:
        self.id = filter_id
        self.prefixes = prefixes
        self.allow_on_match = mode == "allow"
        self.allow_missing = missing == "allow"

    def is_allowed(self, record: Any) -> bool:
        if record.key is None:
            return self.allow_missing
        return record.key.startswith(self.prefixes) == self.allow_on_match


def new(config: dict[str, Any]) -> KeyPrefix:
    unknown = sorted(set(config) - set(KNOWN_KEYS))
    if unknown:
        raise ValueError(f"unknown config keys {unknown}; known keys: {', '.join(KNOWN_KEYS)}")
    filter_id = config.get("id", "key_prefix")
    prefixes = config.get("prefixes")
    if not isinstance(filter_id, str) or not filter_id:
        raise ValueError(f'"id" must be a non-empty string, got {filter_id!r}')
    if not isinstance(prefixes, list | tuple) or not prefixes:
        raise ValueError(f'"prefixes" must be a non-empty list of strings, got {prefixes!r}')
    if not all(isinstance(p, str) for p in prefixes):
        raise ValueError(f'"prefixes" must be a non-empty list of strings, got {prefixes!r}')
    mode = _choice(config, "mode", "allow")
    missing = _choice(config, "missing", "deny" if mode == "allow" else "allow")
    return KeyPrefix(filter_id, tuple(p.encode("utf-8") for p in prefixes), mode, missing)


def _choice(config: dict[str, Any], key: str, default: str) -> str:
    value = config.get(key, default)
    if value not in ("allow", "deny"):
        raise ValueError(f'"{key}" must be "allow" or "deny", got {value!r}')
    return str(value)
