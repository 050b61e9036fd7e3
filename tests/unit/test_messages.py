"""relay.engine.messages: every field of every channel message crosses the wire, and a new field
crosses it with no edit but its declaration."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass
from typing import Any

import pytest

from relay.engine import messages
from relay.spec import FetchTrouble, PartitionProgress, TaskError, TaskResult


def example(hint: Any, seed: int) -> Any:
    """A value of type `hint` that differs from every field's default (None, 0, False, ())."""
    if hint in (bool, int, float, str):
        return {bool: True, int: seed + 1, float: seed + 0.25, str: f"v{seed}"}[hint]
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        return example(next(a for a in args if a is not type(None)), seed)
    if dataclasses.is_dataclass(hint):
        return instance(hint, seed)
    assert typing.get_origin(hint) is tuple, f"the test builds no value of {hint}"
    if len(args) == 2 and args[1] is Ellipsis:
        return (example(args[0], seed), example(args[0], seed + 1))
    return tuple(example(arg, seed + i) for i, arg in enumerate(args))


def instance(cls: Any, seed: int = 0) -> Any:
    """An instance of a message class with every field set, each from its declared type."""
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    return cls(**{f.name: example(hints[f.name], seed + i) for i, f in enumerate(fields)})


def over_the_wire(message: Any) -> Any:
    line = json.dumps({"result": messages.encode(message)}, separators=(",", ":"))
    return messages.decode(type(message), json.loads(line)["result"])


@pytest.mark.parametrize("cls", [PartitionProgress, TaskError, FetchTrouble, TaskResult])
def test_every_field_of_a_message_round_trips(cls) -> None:
    message = instance(cls)
    for field in dataclasses.fields(cls):
        assert getattr(message, field.name) != field.default, field.name  # each field is set
    assert over_the_wire(message) == message  # a list would not equal the tuple it was


def test_a_report_carries_its_partitions_losses_and_its_error_where_it_halts() -> None:
    part = PartitionProgress(("t", 3), 10, lost=((4, 8, "retention"),), hole=True)
    error = TaskError("source", "lost", False, ("t", 3), halt_at=4, lost=(4, 8, "retention"))
    report = TaskResult(1, 2, 0, (part,), error=error, latencies=(0.5,))
    assert over_the_wire(report) == report


@dataclass(frozen=True)
class NewProgress(PartitionProgress):
    """PartitionProgress as it would be with fields added, of each kind a message holds."""

    paused: bool = False
    ratio: float = 0.0
    owner: str | None = None
    marks: tuple[tuple[str, int], ...] = ()
    trouble: tuple[FetchTrouble, ...] = ()
    last_error: TaskError | None = None


def test_a_new_field_needs_no_edit_but_its_declaration() -> None:
    message = instance(NewProgress)
    assert message.marks and message.trouble and message.last_error is not None
    assert over_the_wire(message) == message


def test_a_message_of_one_field_round_trips() -> None:
    @dataclass(frozen=True)
    class Ping:
        seconds: float

    assert over_the_wire(Ping(0.5)) == Ping(0.5)


def test_a_message_of_another_length_is_refused() -> None:
    with pytest.raises(ValueError, match="FetchTrouble has 4 fields, not 3"):
        messages.decode(FetchTrouble, ["b:9092", 1, ""])


def test_a_field_of_a_type_the_channel_cannot_carry_is_refused_by_name() -> None:
    @dataclass(frozen=True)
    class Odd:
        table: dict[str, int]

    with pytest.raises(TypeError, match=r"dict\[str, int\]"):
        messages.encode(Odd({"a": 1}))
