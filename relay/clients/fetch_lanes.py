"""Which fetches a pipelined reader puts on the wire to each broker (relay.clients.batch_fetch).

A broker's partitions go in lanes (a partition keeps its lane), each lane with at most one
fetch out. `in_flight` fetches are out to a broker at a time: a broker that answers less than a
round trip's worth per fetch still fills a long link with two. A reader of thousands of
partitions (`lane_partitions`) has more lanes than that, taking turns, so that no fetch names
more than `lane_partitions` (LANE_PARTITIONS: a broker's time per fetch grows with the
partitions it names).

Lanes pay only while a broker's answers are full (at least `min_bytes`). Once every lane of a
broker had LIGHT_AFTER light answers in a row (the broker waited out `max_wait` for less), its
partitions go in one fetch, until an answer is full again. Apache Kafka serves a connection's
requests one at a time, so a second light lane's fetch waited behind the first's `max_wait`
(at 1,000 records/s: p50 46 ms with two lanes, 31 ms with one), and each answer costs the task
a round of its loop. A change of lanes waits until none of the broker's fetches is out, so no
partition is ever in two fetches at once.

Pure state, no client: the fetcher says what is out (`out`: its (node, lane) pairs with a fetch
on the wire) and what came back (`weigh`).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection

TP = tuple[str, int]
Where = tuple[int, int]  # (node, lane)

# Answers in a row with no record before a lane's fetches wait `idle_wait`: a lull of a few
# hundred milliseconds, not a gap between two batches of a steady flow.
IDLE_AFTER = 10
# Light answers in a row on every lane of a broker before its partitions go in one fetch: a
# lull between two bursts is no reason to give up the lanes (fewer than IDLE_AFTER: a broker
# goes down to one lane before its fetches wait idle_wait).
LIGHT_AFTER = 3
# Partitions in one fetch of the pipelined readers at most, while a broker's answers are full.
# Apache Kafka looks up every partition a fetch names in its offset index, even past the fetch's
# max_bytes, and an index it has not read for a while costs it ~3.5 ms of page faults (measured
# on the 2-core CI machine, 8 MB read-ahead over the sparse 10 MB index files): a first fetch of
# 2,500 partitions took it 10 s, and a task's 5,000 in two lanes 24 s, the second fetch timed out
# behind the first; in five fetches of 500 the answers came every ~1.5 s from 1.8 s on.
LANE_PARTITIONS = 500


class Lanes:
    def __init__(self, in_flight: int, lane_partitions: int | None, min_bytes: int):
        self._in_flight = max(1, in_flight)  # fetches on the wire to one broker at most
        self._lane_partitions = lane_partitions  # partitions in one lane at most
        self._min_bytes = min_bytes
        self._known: set[Where] = set()  # every (node, lane) sent to so far
        self._lane_of: dict[TP, int] = {}
        self._width: dict[int, int] = {}  # the lanes each broker's partitions go in now
        self._next: dict[int, int] = {}  # each broker's lane to send to first next time
        self._empty: dict[Where, int] = {}  # each lane's answers in a row with no data
        self._light: dict[Where, int] = {}  # ... with less than min_bytes
        self._light_nodes: set[int] = set()  # brokers whose partitions go in one lane
        # each broker's last `keys` (the same list while they stay the same), width and lanes
        self._grouped: dict[int, tuple[list[TP], int, dict[int, list[TP]]]] = {}

    def to_send(self, node: int, keys: list[TP], out: Collection[Where]) -> dict[int, list[TP]]:
        """The lanes of `node` to send a fetch to now, each with its partitions of `keys`:
        those with none out, in turn from where the last send left off, while the broker has
        fewer than `in_flight` fetches out (it serves a connection's requests one at a time: a
        fetch queued behind many waits for them all, and times out)."""
        width = self._width_of(node, len(keys), out)
        if width is None:
            return {}  # its lanes change once its fetches on the wire are answered
        lanes = self._lanes_of(node, keys, width)
        self._known.update((node, lane) for lane in lanes)
        room = self._in_flight - sum(1 for where in out if where[0] == node)
        first = self._next.get(node, 0)
        turn = sorted(lanes, key=lambda lane: (lane < first, lane))
        chosen = [lane for lane in turn if (node, lane) not in out][: max(0, room)]
        if chosen:
            self._next[node] = chosen[-1] + 1
        return {lane: lanes[lane] for lane in chosen}

    def busy(self, out: Collection[Where]) -> bool:
        """Every broker sent to so far has as many fetches on the wire as it may: `to_send`
        would choose nothing."""
        if not self._known:
            return False
        sent = Counter(node for node, _ in out)
        lanes = Counter(node for node, _ in self._known)
        return all(sent[node] >= min(self._in_flight, n) for node, n in lanes.items())

    def idle(self, where: Where) -> bool:
        """The lane's last IDLE_AFTER answers or more had no record."""
        return self._empty.get(where, 0) >= IDLE_AFTER

    def weigh(self, where: Where, size: int) -> None:
        """Counts an answer of `size` bytes of records for the lane's idle wait and for the
        node's lanes (light: under min_bytes)."""
        self._empty[where] = self._empty.get(where, 0) + 1 if size == 0 else 0
        node = where[0]
        if size >= self._min_bytes:
            self._light[where] = 0
            self._light_nodes.discard(node)
            return
        self._light[where] = self._light.get(where, 0) + 1
        lanes = [w for w in self._known if w[0] == node]
        if len(lanes) > 1 and all(self._light.get(w, 0) >= LIGHT_AFTER for w in lanes):
            self._light_nodes.add(node)

    def _lanes_of(self, node: int, keys: list[TP], width: int) -> dict[int, list[TP]]:
        """`_by_lane`, kept while the fetcher hands the same list of the node's partitions
        (its grouping by leader is kept too) and the width stays."""
        grouped = self._grouped.get(node)
        if grouped is not None and grouped[0] is keys and grouped[1] == width:
            return grouped[2]
        lanes = self._by_lane(keys, width)
        self._grouped[node] = (keys, width, lanes)
        return lanes

    def _by_lane(self, keys: list[TP], width: int) -> dict[int, list[TP]]:
        """A node's partitions in `width` groups: a partition keeps its lane (one fetch at a
        time covers it), new ones go round."""
        lanes: dict[int, list[TP]] = defaultdict(list)
        for key in keys:
            lane = self._lane_of.setdefault(key, len(self._lane_of))
            lanes[lane % width].append(key)
        return lanes

    def _width_of(self, node: int, count: int, out: Collection[Where]) -> int | None:
        """The lanes a node's `count` partitions go in now: one while it answers light, else
        `in_flight`, or more of `lane_partitions` each at most (never fewer while its answers
        stay full: partitions that reach their end leave some lanes light, rather than make a
        change that waits for every fetch out); None while a change waits for the node's
        fetches on the wire to be answered."""
        width = 1 if node in self._light_nodes else self._full_width(node, count)
        if self._width.get(node, width) != width:
            if any(where[0] == node for where in out):
                return None
            self._known -= {where for where in self._known if where[0] == node}
            self._next.pop(node, None)
            for where in [w for w in self._light if w[0] == node]:
                del self._light[where]  # counted anew in the new lanes
        self._width[node] = width
        return width

    def _full_width(self, node: int, count: int) -> int:
        width = self._in_flight
        if self._lane_partitions is not None:
            width = max(width, -(-count // self._lane_partitions), self._width.get(node, 1))
        return width
