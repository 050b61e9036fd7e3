"""The group sync's rules (relay.pipelines.relay.group_sync) behind the admin seam: exact
translation, waiting for the relay, filtered records, fan-in, never backwards, hands off groups
active on the target, classic or KIP-848 (from ListGroups' states; DescribeGroups where a
broker says none), and share groups are not carried."""

from __future__ import annotations

from typing import Any

import pytest

from relay.clients.consumer_groups import GroupHasMembers, ListedGroup
from relay.config import (
    AppConfig,
    ClusterConfig,
    Config,
    GroupsConfig,
    SourcePoolConfig,
    SparkConfig,
    TargetConfig,
    TopicRoute,
)
from relay.engine.metrics import Metrics
from relay.pipelines.relay import group_sync
from relay.pipelines.relay.group_sync import GroupSync
from relay.pipelines.relay.relayed import Relayed
from relay.spec import PartitionRoute

SOURCE, TARGET = ClusterConfig("src", ("s:1",)), ClusterConfig("target", ("t:1",))
Copy = tuple[int, tuple[str, int], int]  # (destination offset, source partition, source offset)


class FakeTranslator:
    """Destination partitions as lists of copies; searches by brute force."""

    def __init__(self, copies: dict[tuple[str, int], list[Copy]]):
        self.copies = copies
        self.searched = 0

    def bounds(self, dests: list[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
        return {d: (0, len(self.copies.get(d, []))) for d in dests}

    def first_copies(self, asks: list[Any]) -> list[int]:
        self.searched += len(asks)
        return [self.first_copy(*ask) for ask in asks]

    def first_copy(self, dest: Any, source: Any, offset: int, bounds: tuple[int, int]) -> int:
        later = [d for d, key, o in self.copies.get(dest, []) if key == source and o >= offset]
        return min(later, default=bounds[1])

    def close(self) -> None:
        pass


class FakeAdmin:
    GroupHasMembers = GroupHasMembers  # what group_sync catches

    def __init__(self, on_source: dict[str, dict], on_target: dict[str, dict], relay: dict,
                 members: int = 0, listed: dict[str, ListedGroup] | None = None,
                 source_types: dict[str, str] | None = None):  # fmt: skip
        self.on_source, self.on_target, self.relay = on_source, on_target, relay
        self.members = members  # what DescribeGroups counts
        self.listed = listed or {}  # the target's ListGroups
        self.source_types = source_types or {}
        self.refuse: set[str] = set()  # groups whose commits the broker refuses
        self.described: list[str] = []
        self.commits: list[tuple[str, dict]] = []

    def listed_groups(self, cluster: Any, timeout: float) -> dict[str, ListedGroup]:
        if cluster is TARGET:
            return dict(self.listed)
        names = sorted(self.on_source) + ["ktm"]
        return {g: ListedGroup(g, self.source_types.get(g, "classic"), "Empty") for g in names}

    def groups_committed(self, cluster: Any, groups: Any, timeout: float) -> dict:
        found = self.on_source if cluster is SOURCE else self.on_target
        return {g: dict(found.get(g, {})) for g in groups}

    def committed_offsets(
        self, cluster: Any, group: str, keys: Any, timeout: float, incarnations: Any = None
    ) -> dict:
        return {k: self.relay.get(k) for k in keys}

    def group_members(self, cluster: Any, group: str, timeout: float) -> int:
        self.described.append(group)
        return self.members

    def commit_group(self, cluster: Any, group: str, offsets: dict, timeout: float) -> None:
        if group in self.refuse:
            raise GroupHasMembers(f"committing group {group}: UnknownMemberIdError")
        self.commits.append((group, offsets))


def config(include: tuple[str, ...] = ("g",)) -> Config:
    return Config(
        path="x.toml", app=AppConfig(metrics_addr=None), spark=SparkConfig(),
        topics=(TopicRoute("t", "d"),), sources=(SOURCE,), source_pool=SourcePoolConfig(),
        target=TargetConfig(TARGET), filters=(), groups=GroupsConfig(include=include),
    )  # fmt: skip


def sync(monkeypatch: pytest.MonkeyPatch, fake: FakeAdmin, copies: dict, routes: list,
         progress: dict | None = None) -> list[Any]:  # fmt: skip
    monkeypatch.setattr(group_sync, "consumer_groups", fake)
    monkeypatch.setattr(group_sync, "Translator", lambda *a: FakeTranslator(copies))
    syncer = GroupSync(config(), Relayed.fixed(SOURCE, routes, progress), Metrics())
    return syncer.translate(commit=True)


ROUTES = [PartitionRoute("t", p, "d", p) for p in range(2)]
# t[0] offsets 0..9 copied to d[0] at 0..9 except 3 and 4 (filtered); t[1] 0..4 to d[1].
COPIES = {
    ("d", 0): [(i, ("t", 0), o) for i, o in enumerate([0, 1, 2, 5, 6, 7, 8, 9])],
    ("d", 1): [(o, ("t", 1), o) for o in range(5)],
}


def test_each_committed_offset_becomes_the_offset_of_its_first_copy(monkeypatch):
    fake = FakeAdmin({"g": {("t", 0): 5, ("t", 1): 2}}, {}, {("t", 0): 10, ("t", 1): 5})
    [result] = sync(monkeypatch, fake, COPIES, ROUTES)
    assert fake.commits == [("g", {("d", 0): 3, ("d", 1): 2})]
    assert result.complete and result.committed == 2


def test_a_commit_on_filtered_records_lands_on_the_next_copy_or_the_end(monkeypatch):
    fake = FakeAdmin({"g": {("t", 0): 3}}, {}, {("t", 0): 10})
    sync(monkeypatch, fake, COPIES, ROUTES)
    assert fake.commits == [("g", {("d", 0): 3})]  # offset 3 was dropped: the copy of 5
    fake = FakeAdmin({"g": {("t", 0): 10}}, {}, {("t", 0): 12})  # read all; 10, 11 dropped
    sync(monkeypatch, fake, COPIES, ROUTES)
    assert fake.commits == [("g", {("d", 0): 8})]  # the destination's end


def test_a_partition_waits_while_the_relay_is_behind_the_group(monkeypatch):
    fake = FakeAdmin({"g": {("t", 0): 12, ("t", 1): 2}}, {}, {("t", 0): 10, ("t", 1): 5})
    [result] = sync(monkeypatch, fake, COPIES, ROUTES)
    assert fake.commits == [("g", {("d", 1): 2})]
    assert not result.complete


def test_this_processs_acknowledged_offsets_count_as_the_relays_progress(monkeypatch):
    fake = FakeAdmin({"g": {("t", 0): 12}}, {}, {("t", 0): 10})
    sync(monkeypatch, fake, COPIES, ROUTES, progress={("t", 0): 12})
    assert fake.commits == [("g", {("d", 0): 8})]


def test_fan_in_takes_the_smallest_translation(monkeypatch):
    routes = [PartitionRoute("t", p, "d", 0) for p in range(2)]
    copies = {("d", 0): [(0, ("t", 0), 0), (1, ("t", 1), 0), (2, ("t", 0), 1), (3, ("t", 1), 1)]}
    fake = FakeAdmin({"g": {("t", 0): 1, ("t", 1): 2}}, {}, {("t", 0): 2, ("t", 1): 2})
    sync(monkeypatch, fake, copies, routes)
    assert fake.commits == [("g", {("d", 0): 2})]  # t[0]'s copy at 2; t[1] is at the end (4)


def test_a_target_group_is_never_moved_backwards(monkeypatch):
    fake = FakeAdmin({"g": {("t", 0): 5, ("t", 1): 2}}, {"g": {("d", 0): 6, ("d", 1): 1}},
                     {("t", 0): 10, ("t", 1): 5})  # fmt: skip
    sync(monkeypatch, fake, COPIES, ROUTES)
    assert fake.commits == [("g", {("d", 1): 2})]


def test_a_group_with_members_on_the_target_is_left_alone(monkeypatch):
    """A broker that lists no state (Tansu): DescribeGroups counts the members."""
    fake = FakeAdmin({"g": {("t", 0): 5}}, {}, {("t", 0): 10}, members=2,
                     listed={"g": ListedGroup("g", "classic", "Unknown")})  # fmt: skip
    [result] = sync(monkeypatch, fake, COPIES, ROUTES)
    assert fake.commits == [] and result.active == "2 member(s)" and not result.complete


@pytest.mark.parametrize(
    ("kind", "state"),
    [("consumer", "Stable"), ("consumer", "Reconciling"), ("consumer", "Assigning"),
     ("classic", "Stable"), ("classic", "PreparingRebalance")],
)  # fmt: skip
def test_a_group_listed_active_on_the_target_is_left_alone_whatever_its_protocol(
    monkeypatch, kind, state
):
    """KIP-848: DescribeGroups describes a consumer group as dead with no members; its state
    in ListGroups is what says it is active."""
    fake = FakeAdmin({"g": {("t", 0): 5}}, {}, {("t", 0): 10}, members=0,
                     listed={"g": ListedGroup("g", kind, state)})  # fmt: skip
    [result] = sync(monkeypatch, fake, COPIES, ROUTES)
    assert fake.commits == [] and not result.complete
    assert result.active == f"{state}, {kind} protocol"
    assert fake.described == []  # the listing said it: no DescribeGroups


def test_a_group_listed_empty_on_the_target_is_synced_without_describing_it(monkeypatch):
    fake = FakeAdmin({"g": {("t", 0): 5}}, {}, {("t", 0): 10}, members=3,
                     listed={"g": ListedGroup("g", "consumer", "Empty")})  # fmt: skip
    [result] = sync(monkeypatch, fake, COPIES, ROUTES)
    assert fake.commits == [("g", {("d", 0): 3})] and result.complete
    assert fake.described == []


def test_a_commit_refused_because_a_member_joined_leaves_the_group_alone(monkeypatch):
    """Between the listing and the commit a consumer joined: the broker refuses the commit
    (UNKNOWN_MEMBER_ID); the group counts as active, and the other groups still sync."""
    fake = FakeAdmin({"g": {("t", 0): 5}, "h": {("t", 1): 2}}, {}, {("t", 0): 10, ("t", 1): 5})
    fake.refuse = {"g"}
    config_h = config(include=("g", "h"))
    monkeypatch.setattr(group_sync, "consumer_groups", fake)
    monkeypatch.setattr(group_sync, "Translator", lambda *a: FakeTranslator(COPIES))
    syncer = GroupSync(config_h, Relayed.fixed(SOURCE, ROUTES), Metrics())
    g, h = syncer.translate(commit=True)
    assert "UnknownMemberIdError" in g.active and not g.complete
    assert fake.commits == [("h", {("d", 1): 2})] and h.complete


def test_the_active_line_is_said_once_while_the_group_stays_active(monkeypatch, caplog):
    fake = FakeAdmin({"g": {("t", 0): 5}}, {}, {("t", 0): 10},
                     listed={"g": ListedGroup("g", "consumer", "Stable")})  # fmt: skip
    monkeypatch.setattr(group_sync, "consumer_groups", fake)
    monkeypatch.setattr(group_sync, "Translator", lambda *a: FakeTranslator(COPIES))
    syncer = GroupSync(config(), Relayed.fixed(SOURCE, ROUTES), Metrics())
    for _ in range(3):
        syncer._sync_once()
    lines = [r.getMessage() for r in caplog.records if "active on the target" in r.getMessage()]
    assert lines == [
        "group g is active on the target (Stable, consumer protocol): ktm does not commit its "
        "offsets there while it is (its consumers moved; they commit for themselves)"
    ]
    fake.listed = {"g": ListedGroup("g", "consumer", "Empty")}  # the member left
    syncer._sync_once()
    assert fake.commits == [("g", {("d", 0): 3})]
    labels = {"group": "g"}
    assert syncer.metrics.registry.get_sample_value("ktm_group_active_on_target", labels) == 0


def test_share_groups_are_not_carried(monkeypatch):
    fake = FakeAdmin({"g": {("t", 0): 5}}, {}, {("t", 0): 10}, source_types={"g": "share"})
    assert sync(monkeypatch, fake, COPIES, ROUTES) == []


def test_only_the_groups_asked_for_are_read(monkeypatch):
    fake = FakeAdmin({"g": {("t", 0): 5}, "other": {("t", 0): 1}}, {}, {("t", 0): 10})
    assert [r.group for r in sync(monkeypatch, fake, COPIES, ROUTES)] == ["g"]


def test_a_group_that_did_not_move_costs_no_search(monkeypatch):
    translator = FakeTranslator(COPIES)
    searches: list[Any] = []
    search = translator.first_copy
    translator.first_copy = lambda *a: searches.append(a) or search(*a)
    fake = FakeAdmin({"g": {("t", 0): 5, ("t", 1): 2}}, {}, {("t", 0): 10, ("t", 1): 5})
    monkeypatch.setattr(group_sync, "consumer_groups", fake)
    monkeypatch.setattr(group_sync, "Translator", lambda *a: translator)
    syncer = GroupSync(config(), Relayed.fixed(SOURCE, ROUTES), Metrics())
    first = syncer.translate(commit=False)
    assert len(searches) == 2
    fake.on_source["g"][("t", 1)] = 3  # the group moved on t[1] only
    second = syncer.translate(commit=False)
    assert len(searches) == 3 and searches[-1][2] == 3
    assert [p.offset for p in first[0].partitions] == [3, 2]
    assert [p.offset for p in second[0].partitions] == [3, 3]
