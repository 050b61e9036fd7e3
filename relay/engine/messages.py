"""The control channel's messages as JSON values, built from their dataclasses' fields.

A message (a task's `TaskResult`, and the progress, errors and fetch trouble it holds) travels
as a JSON list of its fields' values in the order its dataclass declares them: a nested
dataclass as its own list, a tuple as a list, None as null. The decoder reads each field's
declared type (`X | None`, `tuple[X, ...]`, `tuple[X, Y]`, a dataclass, str, int, float, bool)
and converts the value back, so a new field is one edit: its declaration. A type outside those
is refused when the codec of its class is first built. Both ends run the same ktm (the driver
ships its package to the executors), so the declaration order is the schema.

Each class's codec is built once, reads the fields in one call and converts only what JSON
does not keep (tuples, nested dataclasses): a report of 1,000 partitions encodes and decodes,
JSON included, in 3.4 ms where the hand-written positional lists took 3.9 ms (best of 7 runs
of 100 each; `scripts/bench/measure_channel.py` measures the channel as a whole).
"""

from __future__ import annotations

import dataclasses
import operator
import types
import typing
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, NamedTuple, TypeAlias, TypeVar, cast

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")
# a value as `json.loads` returns it
Json: TypeAlias = str | int | float | bool | None | list["Json"] | dict[str, "Json"]
Convert = Callable[[object], object]
SCALARS = (str, int, float, bool)  # JSON keeps them as they are (a float keeps its ".0")
_ENCODERS: dict[type, Convert] = {}
_DECODERS: dict[type, Convert] = {}


def encode(message: DataclassInstance) -> Sequence[object]:
    """A dataclass as the JSON list of its fields' values (a tuple: JSON writes it as one)."""
    # the encoder of a dataclass returns the sequence of its fields' values
    return cast("Sequence[object]", _encoder(type(message))(message))


def decode(cls: type[T], value: object) -> T:
    """What `encode` made of an instance of `cls`, back as one (ValueError, TypeError or
    IndexError where it does not fit `cls`)."""
    return cast(T, _decoder(cls)(value))  # the decoder stored under `cls` builds a `cls`


def _encoder(cls: type[DataclassInstance]) -> Convert:
    """The encoder of a dataclass, built on first use (two threads that build one at once
    build the same). The fields are read in one call, and only those that need it converted."""
    if cls not in _ENCODERS:
        names = [f.name for f in dataclasses.fields(cls)]
        read: Callable[[object], Sequence[object]] = (
            operator.attrgetter(*names) if len(names) > 1 else _one_field(names[0])
        )
        steps = _steps(cls, TO_JSON)

        def encode_fields(message: object) -> Sequence[object]:
            values = read(message)
            if not steps:
                return values
            values = list(values)
            for index, step in steps:
                values[index] = step(values[index])
            return values

        _ENCODERS[cls] = encode_fields
    return _ENCODERS[cls]


def _decoder(cls: type[DataclassInstance]) -> Convert:
    """The decoder of a dataclass, built on first use."""
    if cls not in _DECODERS:
        count, steps = len(dataclasses.fields(cls)), _steps(cls, FROM_JSON)

        def decode_fields(value: object) -> object:
            values = list(_items(value))
            if len(values) != count:
                raise ValueError(f"{cls.__name__} has {count} fields, not {len(values)}")
            for index, step in steps:
                values[index] = step(values[index])
            return cls(*values)

        _DECODERS[cls] = decode_fields
    return _DECODERS[cls]


def _steps(cls: type[DataclassInstance], way: Way) -> list[tuple[int, Convert]]:
    """(index, converter) of each field of `cls` whose value needs converting `way`."""
    hints = typing.get_type_hints(cls)
    found = [_converting(hints[f.name], way) for f in dataclasses.fields(cls)]
    return [(index, step) for index, step in enumerate(found) if step is not None]


def _one_field(name: str) -> Callable[[object], tuple[object]]:
    return lambda message: (getattr(message, name),)


class Way(NamedTuple):
    """One direction of the codec: a dataclass's converter, how a tuple's converted items are
    gathered, and what a tuple of items that need no converting needs (None: nothing)."""

    of_class: Callable[[type[DataclassInstance]], Convert]
    gather: Callable[[Iterable[object]], object]
    plain_tuple: Convert | None


def _converting(hint: object, way: Way) -> Convert | None:
    """How a field's value of type `hint` is converted one way (None: it needs no converting)."""
    if hint in SCALARS:
        return None
    inner = _optional(hint)
    if inner is not None:
        step = _converting(inner, way)
        return None if step is None else (lambda v: None if v is None else step(v))
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return way.of_class(hint)
    steps = [_converting(item, way) for item in _tuple_items(hint)]
    if all(step is None for step in steps):
        return way.plain_tuple
    fixed = [step or _same for step in steps]
    if len(fixed) == 1:  # tuple[X, ...]
        each = fixed[0]
        return lambda v: way.gather(map(each, _items(v)))
    return lambda v: way.gather(step(x) for step, x in zip(fixed, _items(v), strict=True))


def _optional(hint: object) -> object | None:
    """X of `X | None`; None for any other type."""
    if typing.get_origin(hint) not in (types.UnionType, typing.Union):
        return None
    rest: list[object] = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    if len(rest) != 1:
        raise TypeError(f"the channel carries no union of several types: {hint}")
    return rest[0]


def _tuple_items(hint: object) -> tuple[object, ...]:
    """(X,) of `tuple[X, ...]`; (X, Y) of `tuple[X, Y]`; TypeError for any other type."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is not tuple or not args:
        raise TypeError(f"the channel carries no field of type {hint}")
    return args[:1] if len(args) == 2 and args[1] is Ellipsis else args


def _same(value: object) -> object:
    return value


# A tuple field's (or a message's) value is a tuple on the way out, a list from JSON on the way
# in: iterated as it is (anything else raises TypeError where it is iterated). The builtins are
# called as they are, a Python function per value would cost 5% of the codec's time.
_items = cast("Callable[[object], Iterable[object]]", iter)
_tuple = cast("Convert", tuple)


TO_JSON = Way(_encoder, list, None)  # JSON writes a tuple as a list
FROM_JSON = Way(_decoder, tuple, _tuple)
