"""Which waiting pull request takes the next job, and the terms that keep a request from jobs:
the consumer's wait policy, the pin of a pinned_client group and the counts overflow requests
wait for (protocol doc sections 4 and 10). Pure: no I/O. The round planner
(`app/domain/pull_round.py`) decides by them; the scheduler's waiting requests are the
`Request`s.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from app.domain.priority import PriorityPolicy, PrioritySettings, PullPriority
from app.domain.pulls import PullEnd


class Request(Protocol):
    """What the planner reads and keeps of one waiting pull request (the scheduler's
    `Waiter`)."""

    batch_left: int
    bytes_left: int | None
    no_wait: bool
    expires_given: bool
    incremental_timeout: int
    ends_on_delivery: bool
    terms: PullPriority
    pin_checked: bool
    delivered: int

    @property
    def own_claim(self) -> bool:
        """Its claim terms differ from the consumer's: it cannot share a claim."""


R = TypeVar("R", bound=Request)


class WaitPolicy(Protocol[R]):
    """Which waiting request takes the next job (priority groups decide it their way)."""

    @property
    def claims_ahead(self) -> bool:
        """Jobs may be claimed for requests yet to come."""

    @property
    def fills_whole_first(self) -> bool:
        """Jobs claimed ahead too few for every waiting request fill whole requests first,
        in their order, before the claim for the rest (app/domain/pull_round.py)."""

    def pick(self, waiters: deque[R], eligible: Callable[[R], bool]) -> R | None:
        """The request the next delivery goes to, or None when no request can take one."""

    def served(self, waiters: deque[R], waiter: R) -> None:
        """`waiter` (the one picked) was handed a delivery."""


class RoundRobin:
    """nats-server's order: the head request takes one job and goes to the back; a request
    that cannot take it (an overflow request whose terms are not met) goes to the back."""

    claims_ahead = True
    fills_whole_first = True

    def pick(self, waiters: deque[R], eligible: Callable[[R], bool]) -> R | None:
        for _ in range(len(waiters)):
            head = waiters[0]
            if eligible(head):
                return head
            if waiters and waiters[0] is head:  # `eligible` may have removed it
                waiters.rotate(-1)
        return None

    def served(self, waiters: deque[R], waiter: R) -> None:
        if waiters and waiters[0] is waiter:
            waiters.popleft()
            if waiter.batch_left > 0:
                waiters.append(waiter)


class FillWhole:
    """Each request in its turn takes jobs until it is filled: how the round hands out jobs
    claimed ahead that cannot fill every waiting request (app/domain/pull_round.py)."""

    claims_ahead = True
    fills_whole_first = False

    def pick(self, waiters: deque[R], eligible: Callable[[R], bool]) -> R | None:
        for waiter in list(waiters):
            if eligible(waiter):
                return waiter
        return None

    def served(self, waiters: deque[R], waiter: R) -> None:
        pass


class Overflow(RoundRobin):
    """Round-robin, claiming nothing ahead: jobs held for requests to come would count as
    in flight and not as pending, which is what overflow requests decide by."""

    claims_ahead = False
    fills_whole_first = False


class Pinned(RoundRobin):
    """Round-robin among the requests of the pinned client; nothing is claimed ahead, since
    the client that gets the next jobs is settled only when they are handed out."""

    claims_ahead = False
    fills_whole_first = False


class Prioritized:
    """The request with the lowest priority value takes the next job (a request whose body
    was not JSON comes last), round-robin among requests of one priority."""

    claims_ahead = True
    fills_whole_first = False  # the best request takes the next job, held or claimed

    def pick(self, waiters: deque[R], eligible: Callable[[R], bool]) -> R | None:
        best: R | None = None
        for waiter in list(waiters):
            if (best is None or waiter.terms.rank < best.terms.rank) and eligible(waiter):
                best = waiter
        return best

    def served(self, waiters: deque[R], waiter: R) -> None:
        with contextlib.suppress(ValueError):
            waiters.remove(waiter)
        if waiter.batch_left > 0:
            waiters.append(waiter)


def policy_for(settings: PrioritySettings) -> RoundRobin | Prioritized:
    """The wait policy of a consumer with these priority settings."""
    if settings.policy is PriorityPolicy.PRIORITIZED:
        return Prioritized()
    if settings.policy is PriorityPolicy.OVERFLOW:
        return Overflow()
    if settings.policy is PriorityPolicy.PINNED_CLIENT:
        return Pinned()
    return RoundRobin()


@dataclass(slots=True)
class Terms:
    """What keeps requests from jobs in one round: under pinned_client the pin as read at the
    round's start (None: nobody holds it); under overflow terms the consumer's (pending, in
    flight) counts read at the round's start, when some request waits for a backlog, and the
    jobs handed out since."""

    pinning: bool
    pin: str | None = None
    backlog: tuple[int, int] | None = None
    handed: int = 0

    def may_take(self, waiter: Request) -> bool:
        """Whether the request may take the next job now: under a pin, only the pinned
        client's requests; under overflow terms, while the counts meet them (the job counts
        as pending; those handed out this round count as in flight)."""
        if self.pinning:
            return waiter.terms.pin_id == self.pin if self.pin else waiter.terms.pin_id is None
        if self.backlog is None or not waiter.terms.conditional:
            return True
        pending, inflight = self.backlog
        return waiter.terms.overflows(pending - self.handed, inflight + self.handed)

    def demand(self, waiters: list[R]) -> int:
        """Jobs these requests can take: their budgets, or, under overflow terms, as many as
        handing them out one by one would place (each leaves pending for in flight)."""
        if self.pinning:
            if self.pin is None:  # the first standby will be pinned
                first = next((w for w in waiters if w.terms.pin_id is None), None)
                return first.batch_left if first is not None else 0
            return sum(w.batch_left for w in waiters if w.terms.pin_id == self.pin)
        if self.backlog is None:
            return sum(w.batch_left for w in waiters)
        pending, inflight = self.backlog
        pending, inflight = pending - self.handed, inflight + self.handed
        budgets = {id(w): w.batch_left for w in waiters}
        placed = 0
        while pending - placed > 0:
            taker = next(
                (
                    w
                    for w in waiters
                    if budgets[id(w)] > 0 and w.terms.overflows(pending - placed, inflight + placed)
                ),
                None,
            )
            if taker is None:
                break
            budgets[id(taker)] -= 1
            placed += 1
        return placed

    def unmet_backlog_waits(self) -> bool:
        """Jobs are pending that overflow requests may yet meet their terms for."""
        return self.backlog is not None and self.backlog[0] - self.handed > 0


def backlog_caps(waiters: Iterable[Request]) -> tuple[int, int] | None:
    """How far to count the consumer's (pending, in flight) jobs when some request waits for a
    backlog: up to what the requests' terms and budgets can use, never the whole queue."""
    waiters = list(waiters)
    waiting = [w for w in waiters if w.terms.conditional]
    if not waiting:
        return None
    budget = sum(w.batch_left for w in waiters)
    pending_cap = max(w.terms.min_pending for w in waiting) + budget
    ack_cap = max(w.terms.min_ack_pending for w in waiting)
    return pending_cap, ack_cap


def pin_verdict(waiter: Request, pin: str | None) -> tuple[bool, PullEnd | None]:
    """A request naming a pin id, when the pin is read: whether it just arrived (its first
    check; the request is marked checked) and how it ends, None if it names the pin. One that
    arrived naming another client's pin is told so (423); one naming a pin that is gone
    (unpinned, lapsed, or another client's since) ends as nats-server ends it when a dispatch
    meets it, which a client takes the same way."""
    arrived, waiter.pin_checked = not waiter.pin_checked, True
    if waiter.terms.pin_id == pin:
        return arrived, None
    if arrived and pin is not None:
        return arrived, PullEnd.PIN_MISMATCH
    return arrived, PullEnd.WRONG_PIN


def standby(waiters: Iterable[R]) -> R | None:
    """The request that gets a new pin when jobs are here and nobody holds it: the first
    waiting one without a pin id that shares the consumer's claim."""
    return next((w for w in waiters if w.terms.pin_id is None and not w.own_claim), None)
