"""A clock a unit test moves by hand (`clock.now += 5`), for code that takes a `clock` callable."""

from __future__ import annotations


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
