"""Relay or drop records by one field of their JSON value.

Config keys (the [filters.<id>].config table):
  id       str, default "json_field": the id this filter reports; it must equal the
           section name, so set it when the section is named otherwise.
  field    str, required: a dotted path into JSON objects, e.g. "user.country".
           Each step must be an object key; list indexes are not supported.
  values   non-empty list, required: the values to match, compared as JSON values:
           1 and "1" differ, true and 1 differ, 1 and 1.0 are the same number.
  mode     "allow" (default): relay only records whose field value is in values;
           "deny": drop those records, relay the rest.
  missing  "allow" or "deny": what to do with a record whose value is null, is not
           JSON, or lacks the field (a JSON null counts as lacking it, since TOML has
           no null to match on). Default: such a record matches no value, so it is
           dropped in allow mode and relayed in deny mode.
"""

import json
from typing import Any

KNOWN_KEYS = ("id", "field", "values", "mode", "missing")
_MISSING = object()


class JsonField:
    def __init__(
        self, filter_id: str, path: list[str], values: frozenset[str], mode: str, missing: str
    ) -> None:
        self.id = filter_id
        self.path = path
        self.values = values
        self.allow_on_match = mode == "allow"
        self.allow_missing = missing == "allow"

    def is_allowed(self, record: Any) -> bool:
        found = self._lookup(record.value)
        if found is _MISSING:
            return self.allow_missing
        return (_canonical(found) in self.values) == self.allow_on_match

    def _lookup(self, raw: bytes | None) -> Any:
        if raw is None:
            return _MISSING
        try:
            node = json.loads(raw)
        except ValueError:  # also covers UnicodeDecodeError
            return _MISSING
        for step in self.path:
            if not isinstance(node, dict) or step not in node:
                return _MISSING
            node = node[step]
        return _MISSING if node is None else node


def _canonical(value: Any) -> str:
    # One text per JSON value, so matching is a set lookup and Python's True == 1 and
    # 1 == "1" confusions cannot happen; 1.0 is folded into 1, as JSON has one number type.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def new(config: dict[str, Any]) -> JsonField:
    unknown = sorted(set(config) - set(KNOWN_KEYS))
    if unknown:
        raise ValueError(f"unknown config keys {unknown}; known keys: {', '.join(KNOWN_KEYS)}")
    filter_id = config.get("id", "json_field")
    field = config.get("field")
    values = config.get("values")
    if not isinstance(filter_id, str) or not filter_id:
        raise ValueError(f'"id" must be a non-empty string, got {filter_id!r}')
    if not isinstance(field, str) or not all(field.split(".")):
        raise ValueError(f'"field" must be a dotted path like "user.country", got {field!r}')
    if not isinstance(values, list | tuple) or not values:
        raise ValueError(f'"values" must be a non-empty list, got {values!r}')
    try:
        canonical = frozenset(_canonical(v) for v in values)
    except (TypeError, ValueError) as exc:
        raise ValueError(f'"values" must hold JSON values only: {exc}') from None
    mode = _choice(config, "mode", "allow")
    missing = _choice(config, "missing", "deny" if mode == "allow" else "allow")
    return JsonField(filter_id, field.split("."), canonical, mode, missing)


def _choice(config: dict[str, Any], key: str, default: str) -> str:
    value = config.get(key, default)
    if value not in ("allow", "deny"):
        raise ValueError(f'"{key}" must be "allow" or "deny", got {value!r}')
    return str(value)
