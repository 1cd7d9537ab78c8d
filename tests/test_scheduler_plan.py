"""The pull round planner (app/domain/pull_round.py) driven by a table of cases: no database,
no event loop. Each case is a queue of waiting requests, the consumer's jobs and terms, and
what one round must do with them, as nats-server 2.15 does (protocol doc sections 4 and 10);
the conformance suites check the same behaviour end to end."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from app.domain.models import Consumer, ConsumerOptions, ConsumerType, PulledJob
from app.domain.priority import (
    NO_TERMS,
    PLAIN,
    PriorityPolicy,
    PrioritySettings,
    PullPriority,
)
from app.domain.pull_policies import Terms, WaitPolicy, policy_for
from app.domain.pull_round import (
    Backlog,
    Limits,
    QueueState,
    claim_sizes,
    plan_round,
)
from app.domain.pulls import Delivery, PullEnd

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(eq=False)
class Req:
    """A waiting request as the planner sees it, with its transport's answers fixed."""

    name: str
    batch_left: int
    bytes_left: int | None = None
    no_wait: bool = False
    expires_given: bool = True
    incremental_timeout: int = 0
    ends_on_delivery: bool = False
    terms: PullPriority = PLAIN
    pin_checked: bool = False
    delivered: int = 0
    numbered: bool = False
    pulls_in_a_loop: bool = False
    gone: bool = False
    behind: bool = False  # its transport takes no delivery now

    @property
    def own_claim(self) -> bool:
        return self.bytes_left is not None or self.incremental_timeout > 0

    def alive(self) -> bool:
        return not self.gone

    def ready(self) -> bool:
        return not self.behind

    def __repr__(self) -> str:
        return self.name


def job(job_id: int, payload: bytes = b"x") -> Delivery:
    pulled = PulledJob(
        id=job_id,
        attempt=1,
        priority=0,
        lease_expires_at=NOW,
        created_at=NOW,
        message_id=f"m{job_id}",
        payload=payload,
        content_type="text/plain",
        headers={},
    )
    return Delivery(pulled, job_id, 0)


def consumer(policy: PriorityPolicy = PriorityPolicy.NONE, **fields: Any) -> Consumer:
    settings = PrioritySettings("g" if policy is not PriorityPolicy.NONE else None, policy)
    values: dict[str, Any] = {"ack_wait_seconds": None, "max_ack_pending": None} | fields
    return Consumer(
        pk=1,
        id="k",
        channel_id="c",
        name="k",
        token="",
        callback_url="",
        type=ConsumerType.PULL,
        created_at=NOW,
        updated_at=NOW,
        priority=settings,
        **values,
    )


@dataclass
class Case:
    requests: list[Req]
    jobs: int | list[Delivery] = 0
    policy: PriorityPolicy = PriorityPolicy.NONE
    max_claim: int = 100
    inflight: int = 0
    max_ack_pending: int | None = None
    pin: str | None = None
    ahead: list[Delivery] = field(default_factory=list)
    next_due_in: float | None = None
    fresh: Consumer | None | bool = True
    # what the round must do (None: not looked at)
    handed: list[tuple[str, int]] | None = None
    ended: dict[str, PullEnd] | None = None
    claims: list[list[int]] | None = None
    alone: list[int] | None = None
    ahead_started: list[list[int]] | None = None
    released: list[int] | None = None
    pins: set[str | None] | None = None
    next_due: float | None | bool = False  # False: not looked at
    dirty: bool | None = None
    waiting: list[str] | None = None  # the queue's order after the round


def a(batch: int, **fields: Any) -> Req:
    return Req("a", batch, **fields)


def b(batch: int, **fields: Any) -> Req:
    return Req("b", batch, **fields)


def c(batch: int, **fields: Any) -> Req:
    return Req("c", batch, **fields)


def pinned(pin_id: str | None) -> PullPriority:
    return PullPriority(group="g", pin_id=pin_id)


def overflow(min_pending: int = 0, min_ack_pending: int = 0) -> PullPriority:
    return PullPriority(group="g", min_pending=min_pending, min_ack_pending=min_ack_pending)


def ranked(priority: int) -> PullPriority:
    return PullPriority(group="g", priority=priority)


FILLED, EXPIRED, NO_MESSAGES = PullEnd.FILLED, PullEnd.EXPIRED, PullEnd.NO_MESSAGES
OVERFLOW, PINNED, PRIORITIZED = (
    PriorityPolicy.OVERFLOW,
    PriorityPolicy.PINNED_CLIENT,
    PriorityPolicy.PRIORITIZED,
)

CASES: dict[str, Case] = {
    # -- batches, round-robin ------------------------------------------------------------------
    "batches filled round-robin, one job at a time": Case(
        [a(2), b(2), c(2)],
        jobs=6,
        claims=[[6]],
        handed=[("a", 1), ("b", 2), ("c", 3), ("a", 4), ("b", 5), ("c", 6)],
        ended={"a": FILLED, "b": FILLED, "c": FILLED},
        waiting=[],
    ),
    "a request short of its batch goes to the back and waits": Case(
        [a(3), b(1)],
        jobs=2,
        handed=[("a", 1), ("b", 2)],
        ended={"b": FILLED},
        waiting=["a"],
    ),
    "nothing due: the request waits for its expiry timer, the next job's due time wakes": Case(
        [a(5)],
        next_due_in=2.5,
        handed=[],
        ended={},
        next_due=102.5,
        waiting=["a"],
    ),
    "a due time closer than the clock-skew guard is rounded up": Case(
        [a(5)], next_due_in=0.001, next_due=100.02
    ),
    "nothing queued at all: no wake-up but the requests' own": Case(
        [a(5)], next_due_in=None, next_due=None, ended={}
    ),
    "took every job due: it reads when the next falls due": Case(
        [a(5)], jobs=1, next_due_in=3.0, handed=[("a", 1)], next_due=103.0, ended={}
    ),
    "the consumer was deleted": Case(
        [a(5), b(1)],
        fresh=None,
        ended={"a": PullEnd.CONSUMER_DELETED, "b": PullEnd.CONSUMER_DELETED},
    ),
    "the consumer's max_ack_pending changed: claim again with it": Case(
        [a(5)], fresh=consumer(max_ack_pending=7), dirty=True, ended={}
    ),
    "the requester went away": Case(
        [a(2, gone=True), b(2)],
        jobs=2,
        handed=[("b", 1), ("b", 2)],
        ended={"a": PullEnd.DROPPED, "b": FILLED},
    ),
    # -- no_wait ----------------------------------------------------------------------------------
    "no_wait without expiry on a drained queue: 404 at once": Case(
        [a(5, no_wait=True, expires_given=False)], ended={"a": NO_MESSAGES}, claims=[[5]]
    ),
    "no_wait with expiry that got nothing waits for its expiry": Case(
        [a(5, no_wait=True)], ended={}, waiting=["a"]
    ),
    "no_wait with expiry ends once it got a job and nothing more is due": Case(
        [a(5, no_wait=True)], jobs=1, handed=[("a", 1)], ended={"a": NO_MESSAGES}
    ),
    "no_wait behind a request that takes every pending job": Case(
        [a(3), b(2, no_wait=True, expires_given=False)],
        jobs=1,
        handed=[("a", 1)],
        ended={"b": NO_MESSAGES},
        waiting=["a"],
    ),
    "no_wait while jobs are still due waits for them": Case(
        [a(2, no_wait=True, expires_given=False)],
        jobs=5,
        handed=[("a", 1), ("a", 2)],
        ended={"a": FILLED},
    ),
    # -- byte budgets (own claims) ------------------------------------------------------------
    "max_bytes: the claim stops at the budget, the rest waits for the next round": Case(
        [a(5, bytes_left=10)],
        jobs=[job(1, b"1234"), job(2, b"1234"), job(3, b"1234")],
        alone=[5],
        handed=[("a", 1), ("a", 2)],
        ended={},
        dirty=True,
    ),
    "max_bytes: the next job exceeds what is left": Case(
        [a(5, bytes_left=3)],
        jobs=[job(1, b"1234")],
        handed=[],
        ended={"a": PullEnd.TOO_LARGE},
        released=[1],
    ),
    "max_bytes: filled with bytes to spare": Case(
        [a(2, bytes_left=100)],
        jobs=2,
        handed=[("a", 1), ("a", 2)],
        ended={"a": PullEnd.BYTES_LEFT},
    ),
    "max_bytes: filled to the byte": Case([a(2, bytes_left=2)], jobs=2, ended={"a": FILLED}),
    "max_bytes no_wait on a drained queue": Case(
        [a(5, bytes_left=100, no_wait=True, expires_given=False)],
        alone=[5],
        ended={"a": NO_MESSAGES},
    ),
    "a request with its own terms claims alone, after the shared claim": Case(
        [a(2, incremental_timeout=5), b(2)],
        jobs=4,
        claims=[[2]],
        alone=[2],
        handed=[("b", 1), ("b", 2), ("a", 3), ("a", 4)],
        ended={"a": FILLED, "b": FILLED},
    ),
    "an own claim is at most one statement": Case(
        [a(500, incremental_timeout=5)], max_claim=10, alone=[10]
    ),
    # -- first hand-out endings (HTTP long poll) ------------------------------------------------
    "a long poll ends with its first hand-out": Case(
        [a(3, ends_on_delivery=True), b(3)],
        jobs=3,
        handed=[("a", 1), ("b", 2), ("a", 3)],
        ended={"a": PullEnd.DELIVERED},
        waiting=["b"],
    ),
    "a long poll that got nothing keeps waiting": Case(
        [a(3, ends_on_delivery=True)], ended={}, waiting=["a"]
    ),
    # -- claim sizes, claim-ahead, transports behind ----------------------------------------------
    "demand beyond one statement is split in two side by side": Case(
        [a(15)], jobs=20, max_claim=10, claims=[[8, 7]]
    ),
    "demand beyond PARALLEL_CLAIMS statements waits for the next round": Case(
        [a(25), b(25)], jobs=60, max_claim=10, claims=[[10, 10]], dirty=True
    ),
    "jobs held ready are handed out first and not claimed again": Case(
        [a(3)],
        jobs=[job(5)],
        ahead=[job(1), job(2)],
        claims=[[1]],
        handed=[("a", 1), ("a", 2), ("a", 5)],
    ),
    "jobs held ready that cannot fill every request fill whole ones first, then a claim": Case(
        [a(2), b(2), c(2)],
        jobs=[job(n) for n in range(4, 14)],
        ahead=[job(1), job(2), job(3)],
        claims=[[3]],
        # Round-robin after the claim would give a1 b2 c3 a4 b5 c6: no request filled
        # before the claim ends.
        handed=[("a", 1), ("a", 2), ("b", 3), ("b", 4), ("c", 5), ("c", 6)],
        ended={"a": PullEnd.FILLED, "b": PullEnd.FILLED, "c": PullEnd.FILLED},
    ),
    "the claim ahead is sized for every request, those filled early included": Case(
        [a(2, numbered=True, pulls_in_a_loop=True), b(2, numbered=True, pulls_in_a_loop=True)],
        jobs=[job(n) for n in range(4, 14)],
        ahead=[job(1), job(2), job(3)],
        claims=[[1]],
        handed=[("a", 1), ("a", 2), ("b", 3), ("b", 4)],
        ahead_started=[[4]],
    ),
    "held jobs under priorities still go to the best request first": Case(
        [a(2, terms=ranked(1)), b(2, terms=ranked(0))],
        jobs=[job(n) for n in range(4, 14)],
        ahead=[job(1), job(2), job(3)],
        policy=PRIORITIZED,
        claims=[[1]],
        handed=[("b", 1), ("b", 2), ("a", 3), ("a", 4)],
    ),
    "a requester pulling in a loop gets its next batch claimed ahead": Case(
        [a(2, numbered=True, pulls_in_a_loop=True)], jobs=10, claims=[[2]], ahead_started=[[2]]
    ),
    "no claim ahead once the queue is drained": Case(
        [a(2, numbered=True, pulls_in_a_loop=True)], jobs=1, ahead_started=[]
    ),
    "a transport behind: unnumbered jobs go back": Case(
        [a(2, behind=True)], jobs=2, handed=[], released=[1, 2], ended={}
    ),
    "a transport behind: numbered jobs are held for it": Case(
        [a(2, behind=True, numbered=True)], jobs=2, handed=[], released=[], ended={}
    ),
    "max_ack_pending: the claim gets what the cap leaves and the request waits": Case(
        [a(5)],
        jobs=5,
        inflight=1,
        max_ack_pending=3,
        claims=[[5]],
        handed=[("a", 1), ("a", 2)],
        ended={},
    ),
    "max_ack_pending reached: nothing claimed, no_wait ends": Case(
        [a(5, no_wait=True, expires_given=False)],
        jobs=5,
        inflight=3,
        max_ack_pending=3,
        handed=[],
        ended={"a": NO_MESSAGES},
    ),
    # -- prioritized ------------------------------------------------------------------------------
    "prioritized: the lowest priority first, round-robin within one": Case(
        [
            Req("p5", 2, terms=ranked(5)),
            Req("p1", 2, terms=ranked(1)),
            Req("q1", 1, terms=ranked(1)),
        ],
        jobs=4,
        policy=PRIORITIZED,
        handed=[("p1", 1), ("q1", 2), ("p1", 3), ("p5", 4)],
        ended={"p1": FILLED, "q1": FILLED},
    ),
    "prioritized: a request whose body was not JSON comes last": Case(
        [Req("raw", 1, terms=NO_TERMS), Req("p9", 1, terms=ranked(9))],
        jobs=1,
        policy=PRIORITIZED,
        handed=[("p9", 1)],
        waiting=["raw"],
    ),
    # -- pinned_client ----------------------------------------------------------------------------
    "pinned: nobody holds the pin, the first request gets a new one and the jobs": Case(
        [a(2), b(2)],
        jobs=3,
        policy=PINNED,
        claims=[[2]],
        handed=[("a", 1), ("a", 2)],
        pins={"NEWPIN"},
        ended={"a": FILLED},
        waiting=["b"],
    ),
    "pinned: only the pinned client's requests take jobs": Case(
        [a(2), Req("mine", 2, terms=pinned("P1"), pin_checked=True)],
        jobs=3,
        policy=PINNED,
        pin="P1",
        claims=[[2]],
        handed=[("mine", 1), ("mine", 2)],
        pins={"P1"},
        waiting=["a"],
    ),
    "pinned: a request arriving with another pin id is told at once (423)": Case(
        [Req("other", 2, terms=pinned("P2"))],
        jobs=1,
        policy=PINNED,
        pin="P1",
        ended={"other": PullEnd.PIN_MISMATCH},
    ),
    "pinned: unpinned, a waiting request of the old pin ends and a new client is pinned": Case(
        [Req("old", 2, terms=pinned("P1"), pin_checked=True), b(1)],
        jobs=1,
        policy=PINNED,
        pin=None,
        ended={"old": PullEnd.WRONG_PIN, "b": FILLED},
        pins={"NEWPIN"},
    ),
    "pinned: a no_wait request of another client ends": Case(
        [
            Req("mine", 1, terms=pinned("P1"), pin_checked=True),
            b(1, no_wait=True, expires_given=False),
        ],
        jobs=1,
        policy=PINNED,
        pin="P1",
        handed=[("mine", 1)],
        ended={"mine": FILLED, "b": NO_MESSAGES},
    ),
    "pinned: a byte budget takes jobs under the pin only": Case(
        [a(2, bytes_left=100, terms=pinned(None))],
        jobs=1,
        policy=PINNED,
        pin=None,
        alone=[],
        handed=[],
    ),
    # -- overflow ---------------------------------------------------------------------------------
    "overflow: min_pending met while handing out, then it waits; the counts are read again": Case(
        [a(5, terms=overflow(min_pending=2))],
        jobs=3,
        policy=OVERFLOW,
        claims=[[2]],
        handed=[("a", 1), ("a", 2)],
        ended={},
        next_due=101.0,
    ),
    "overflow: min_pending not met, a request without terms takes the job": Case(
        [a(5, terms=overflow(min_pending=3)), b(1, terms=overflow())],
        jobs=2,
        policy=OVERFLOW,
        handed=[("b", 1)],
        ended={"b": FILLED},
        waiting=["a"],
    ),
    "overflow: min_ack_pending met by the jobs in flight": Case(
        [a(2, terms=overflow(min_ack_pending=2))],
        jobs=2,
        inflight=2,
        policy=OVERFLOW,
        handed=[("a", 1), ("a", 2)],
        ended={"a": FILLED},
    ),
    "overflow: terms unmet and no_wait ends": Case(
        [a(2, terms=overflow(min_pending=5), no_wait=True, expires_given=False)],
        jobs=2,
        policy=OVERFLOW,
        handed=[],
        ended={"a": NO_MESSAGES},
    ),
    "overflow: nothing is claimed ahead": Case(
        [a(1, terms=overflow(), numbered=True, pulls_in_a_loop=True)],
        jobs=5,
        policy=OVERFLOW,
        ahead_started=[],
    ),
}


def run(case: Case) -> tuple[Any, QueueState, deque[Req]]:
    jobs = case.jobs if isinstance(case.jobs, list) else [job(n) for n in range(1, case.jobs + 1)]
    backlog = Backlog(list(jobs), inflight=case.inflight, max_ack_pending=case.max_ack_pending)
    who = consumer(case.policy)
    policy: WaitPolicy[Req] = policy_for(who.priority)
    state = QueueState(dirty=False, terms=Terms(pinning=case.policy is PINNED))
    waiters = deque(case.requests)
    plan = plan_round(
        state,
        waiters,
        policy,
        Limits(max_claim=case.max_claim),
        who,
        backlog,
        now=100.0,
        ahead=case.ahead,
        pin=case.pin,
        next_due_in=case.next_due_in,
        fresh=case.fresh,
    )
    return plan, state, waiters


@pytest.mark.parametrize("name", list(CASES))
def test_round(name: str) -> None:
    case = CASES[name]
    plan, state, waiters = run(case)
    if case.handed is not None:
        assert [(w.name, job_id) for w, job_id in plan.handed] == case.handed
    if case.ended is not None:
        assert {w.name: outcome for w, outcome in plan.ended} == case.ended
    if case.claims is not None:
        assert plan.claims == case.claims
    if case.alone is not None:
        assert plan.claimed_alone == case.alone
    if case.ahead_started is not None:
        assert plan.ahead == case.ahead_started
    if case.released is not None:
        assert plan.released == case.released
    if case.pins is not None:
        assert set(plan.pins) == case.pins
    if case.next_due is not False:
        assert state.next_due == (pytest.approx(case.next_due) if case.next_due else case.next_due)
    if case.dirty is not None:
        assert state.dirty is case.dirty
    if case.waiting is not None:
        assert [w.name for w in waiters] == case.waiting
    # Whatever ended has left the queue; whatever was handed out was counted against it.
    ended = {w for w, _ in plan.ended}
    assert not ended & set(waiters)
    for request in case.requests:
        given = sum(1 for w, _ in plan.handed if w is request)
        assert request.delivered == given


@pytest.mark.parametrize(
    ("wanted", "max_claim", "sizes"),
    [(1, 10, [1]), (10, 10, [10]), (11, 10, [6, 5]), (20, 10, [10, 10]), (500, 10, [10, 10])],
)
def test_claim_sizes_split_beyond_one_statement(
    wanted: int, max_claim: int, sizes: list[int]
) -> None:
    assert claim_sizes(wanted, Limits(max_claim=max_claim)) == sizes


@pytest.mark.parametrize(
    ("ack_policy", "sizes"),
    [(None, [10, 10]), ("explicit", [10, 10]), ("all", [10, 10]), ("none", [10])],
)
def test_an_ack_none_consumer_claims_one_statement_at_a_time(
    ack_policy: str | None, sizes: list[int]
) -> None:
    # Its claims never run side by side: one could overtake a job the other locked and could
    # not see, and an ordered consumer would read out of order (tests/test_claim_overtaking).
    who = consumer(options=ConsumerOptions(ack_policy=ack_policy))
    assert claim_sizes(20, Limits.of(who, max_claim=10)) == sizes


def test_a_transport_that_fills_midway_leaves_the_rest_for_later() -> None:
    """Readiness is asked before each hand-out, after the previous one was carried out."""

    @dataclass(eq=False)
    class Filling(Req):
        room: int = 0

        def ready(self) -> bool:
            return self.delivered < self.room

    slow = Filling("slow", 5, room=2)
    plan, _, waiters = run(Case([slow], jobs=5))
    assert [job_id for _, job_id in plan.handed] == [1, 2]
    assert plan.released == [3, 4, 5]
    assert list(waiters) == [slow]
