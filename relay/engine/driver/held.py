"""The first round of a new group, planned while the broker holds the group's first join.

A broker holds the first join of a group that has no member for `group.initial.rebalance.
delay.ms` (3 s by default, Tansu too) in case others come. A process that joined such a group
(relay.engine.driver.membership: `first_join_of_empty_group`) plans its first round at once,
*held*: its tasks connect, fetch and wait with their first records under a hold instead of a
lease (relay.engine.channel), writing nothing. With the source across a long link their first
fetch (a round trip) is done before the join ends instead of after it.

When the assignment comes it is taken up as always (`Standing.owned`: the destination's tails
of the partitions read again), and the round is then either confirmed, its leases granted at
once, or stopped, having written nothing. Confirmed only when every partition of it is this
process's and none moved at the destination since it was planned: a process that joined at
the same moment may own some, or may have written some before this one's plan was made.
"""

from __future__ import annotations

import logging

from relay.engine.driver.ownership import Ownership
from relay.engine.driver.rounds import Round
from relay.engine.driver.seams import Channel
from relay.engine.driver.standing import Standing
from relay.engine.driver.status import Status

log = logging.getLogger(__name__)


def settle_hold(
    current: Round, standing: Standing, ownership: Ownership, status: Status, channel: Channel
) -> None:
    """Once the first assignment came: confirm the held round or stop it (either ends
    `current.held`); before that, nothing."""
    membership = ownership.membership
    if membership is not None and membership.current() is None:  # raises what the join met
        return  # still joining: nothing to settle yet
    before = status.next_offsets()
    owned = standing.owned()
    if owned is None:
        return
    after = status.next_offsets()
    keys = [key for task in current.tasks for key in task]
    current.held = False
    if all(key in owned and after[key] == before[key] for key in keys):
        ownership.confirm(current.round_id)
        channel.renew(current.round_id)  # the leases, now: not at the next renewal
        log.debug("round %d: confirmed by the group's first assignment", current.round_id)
        return
    mine = sum(1 for key in keys if key in owned)
    log.info(
        "round %d: planned before the group's first assignment, which gives this process %d of "
        "its %d partitions (or another process wrote some meanwhile); planning again",
        current.round_id,
        mine,
        len(keys),
    )
    current.ask_to_stop("membership", channel)
