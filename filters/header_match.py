"""Relay or drop records by the value of one header.

Config keys (the [filters.<id>].config table):
  id       str, default "header_match": the id this filter reports; it must equal the
           section name, so set it when the section is named otherwise.
  header   str, required: the header name, matched case-sensitively (as Kafka does).
  values   non-empty list of str, required: header values, compared with the header's
           bytes after UTF-8 encoding.
  mode     "allow" (default): relay only records whose header value is in values;
           "deny": drop those records, relay the rest.
  missing  "allow" or "deny": what to do with a record without the header (or whose
           header value is null). Default: such a record matches no value, so it is
           dropped in allow mode and relayed in deny mode.
A record that carries the header more than once matches if any of its values matches.
"""

from typing import Any

KNOWN_KEYS = ("id", "header", "values", "mode", "missing")


class HeaderMatch:
    def __init__(
        self, filter_id: str, header: str, values: frozenset[bytes], mode: str, missing: str
    ) -> None:
        self.id = filter_id
        self.header = header
        self.values = values
        self.allow_on_match = mode == "allow"
        self.allow_missing = missing == "allow"

    def is_allowed(self, record: Any) -> bool:
        found = [
            bytes(v) for name, v in record.headers or () if name == self.header and v is not None
        ]
        if not found:
            return self.allow_missing
        matched = any(v in self.values for v in found)
        return matched == self.allow_on_match


def new(config: dict[str, Any]) -> HeaderMatch:
    unknown = sorted(set(config) - set(KNOWN_KEYS))
    if unknown:
        raise ValueError(f"unknown config keys {unknown}; known keys: {', '.join(KNOWN_KEYS)}")
    filter_id = config.get("id", "header_match")
    header = config.get("header")
    values = config.get("values")
    if not isinstance(filter_id, str) or not filter_id:
        raise ValueError(f'"id" must be a non-empty string, got {filter_id!r}')
    if not isinstance(header, str) or not header:
        raise ValueError(f'"header" must be a non-empty string, got {header!r}')
    if not isinstance(values, list | tuple) or not values:
        raise ValueError(f'"values" must be a non-empty list of strings, got {values!r}')
    if not all(isinstance(v, str) for v in values):
        raise ValueError(f'"values" must be a non-empty list of strings, got {values!r}')
    mode = _choice(config, "mode", "allow")
    missing = _choice(config, "missing", "deny" if mode == "allow" else "allow")
    encoded = frozenset(v.encode("utf-8") for v in values)
    return HeaderMatch(filter_id, header, encoded, mode, missing)


def _choice(config: dict[str, Any], key: str, default: str) -> str:
    value = config.get(key, default)
    if value not in ("allow", "deny"):
        raise ValueError(f'"{key}" must be "allow" or "deny", got {value!r}')
    return str(value)
