"""Incremental fetch sessions (Kafka's KIP-227), one per broker: what the next fetch request
must name.

A consumer of thousands of partitions would otherwise name every one of them in every fetch,
and get every one back, data or not: a request and a response of tens of kilobytes, parsed in
Python, twenty times a second. With a session the broker remembers the partitions and their
fetch offsets; a request names only the partitions added or changed (a new fetch offset) and
those to forget, and the response holds only the partitions with data or news.

- session id 0, epoch 0: a full fetch asking for a new session;
- id N, epoch E > 0: an incremental fetch in session N (E goes up by one per request);
- an answer with session id 0 means no session (a broker without KIP-227, such as Tansu, or a
  full session cache): the next request is a full one again, which asks again;
- an error (FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH, or a request that failed)
  forgets the session: the next request is full.

Pure state, no client: `relay.clients.batch_fetch` sends what this says.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

TP = tuple[str, int]

# Fetch request entry of one partition: (fetch offset, partition max bytes, last fetched epoch)
Wanted = tuple[int, int, int]

FETCH_SESSION_ID_NOT_FOUND = 70
INVALID_FETCH_SESSION_EPOCH = 71


class NextFetch(NamedTuple):
    session_id: int
    epoch: int
    send: dict[TP, Wanted]  # partitions to name in the request
    forget: list[TP]  # partitions the session drops
    full: bool


class FetchSession:
    def __init__(self) -> None:
        self.session_id = 0
        self.epoch = 0  # the next request's
        self._partitions: dict[TP, Wanted] = {}  # what the broker holds for the session

    def next_fetch(self, wanted: Mapping[TP, Wanted]) -> NextFetch:
        """The request for `wanted` (every partition to fetch now, with its offset)."""
        if self.session_id == 0 or self.epoch == 0:
            self._partitions = dict(wanted)
            return NextFetch(self.session_id, 0, dict(wanted), [], True)
        send = {tp: w for tp, w in wanted.items() if self._partitions.get(tp) != w}
        forget = [tp for tp in self._partitions if tp not in wanted]
        self._partitions = dict(wanted)
        return NextFetch(self.session_id, self.epoch, send, forget, False)

    def answered(self, error_code: int, session_id: int) -> None:
        """The broker's answer to the last request (its top-level error and session id)."""
        if error_code in (FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH):
            self.forget()
        elif session_id == 0:  # no session: the next request is full (and asks again)
            self.session_id, self.epoch = 0, 0
        elif session_id != self.session_id:  # a new session, created by a full request
            self.session_id, self.epoch = session_id, 1
        else:
            self.epoch = self.epoch + 1 if self.epoch < 2**31 - 1 else 1

    def forget(self) -> None:
        """After a failed request the broker's state is unknown: start over with a full one."""
        self.session_id, self.epoch = 0, 0

    def partitions(self) -> dict[TP, Wanted]:
        """Every partition the last request covered, named in it or not."""
        return dict(self._partitions)
