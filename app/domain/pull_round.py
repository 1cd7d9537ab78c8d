"""One round of a consumer's pull queue, planned without I/O: which claims to make and how
large, which job goes to which waiting request, which requests end and how, when the queue
must look again. It follows nats-server 2.15 (protocol doc section 4).

A round is a generator (`round_steps`): it yields commands (`Claim`, `Give`, `End`, ...) and
is sent each one's answer. The scheduler's `ConsumerQueue` carries them out against the
claim source and the sinks; `plan_round` answers them from plain inputs instead and returns
what the round did, which is how tests drive it. A command that hands a job to a request is
carried out before the round goes on, so a transport that stops taking jobs midway (its
buffer full) is seen at the next job, as the round asks `ready()` then.

What a round does, in order:

1. The sequence numbers once (numbered requests), the overflow counts when some request waits
   for a backlog (capped), and the pin under pinned_client: a request naming another pin ends.
2. Requests sharing the consumer's claim terms are served together: what the claim ahead
   found is kept (under round-robin, when it cannot fill them all, it fills whole requests
   first, in their order, before the claim below), then one claim for the rest of their
   budget (split in up to PARALLEL_CLAIMS statements of max_claim), handed out one job at a
   time to the request the `WaitPolicy` picks. A request ends when filled, with its first
   hand-out if it asked for that, or, no_wait, when the claim found the queue drained. For
   requesters pulling in a loop, the next requests' jobs are claimed ahead.
3. Requests with terms of their own (max_bytes, incremental_timeout) claim alone; a byte
   budget ends them when the next job does not fit, or fills them with bytes to spare.
4. Requests whose terms (the pin, overflow counts) keep them from jobs: a no_wait one ends;
   overflow counts are read again in OVERFLOW_RECHECK_SECONDS while jobs are pending.
5. When it found nothing, or took every job due, the round reads the consumer again: deleted,
   its requests end; changed, the next round claims with the new terms; and when nothing is
   due, the next job's due time is the next wake-up.
"""

from __future__ import annotations

import dataclasses
import enum
from collections import deque
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from app.domain.models import Consumer, ConsumerType
from app.domain.pull_policies import (
    FillWhole,
    Request,
    Terms,
    WaitPolicy,
    backlog_caps,
    pin_verdict,
    standby,
)
from app.domain.pulls import ClaimBatch, Delivery, PullEnd

# A queue whose next job falls due later re-checks no sooner than this (clock skew guard).
MIN_RECHECK_SECONDS = 0.02
# Claim statements one consumer's waiting requests may have running at once (each up to
# max_claim jobs): only demand beyond one statement is split.
PARALLEL_CLAIMS = 2
# While overflow requests wait for counts they do not meet and jobs are pending, the counts
# are read again this often (in-flight counts change with other processes' claims, which
# wake nobody).
OVERFLOW_RECHECK_SECONDS = 1.0

Sized = list[tuple[int, ClaimBatch]]  # each claim with the number of jobs it asked for


class Waiting(Request, Protocol):
    """A waiting request as a round sees it: its plan data and what its transport can do."""

    @property
    def numbered(self) -> bool:
        """Its deliveries need the consumer's delivery sequence numbers (JetStream's)."""

    @property
    def pulls_in_a_loop(self) -> bool:
        """Its requester sends the next request as this one fills: claim ahead for it."""

    def alive(self) -> bool:
        """False once nobody can receive the deliveries (the requester went away)."""

    def ready(self) -> bool:
        """The transport can take a delivery now."""


W = TypeVar("W", bound=Waiting)


class Phase(enum.Enum):
    """Where a consumer's queue is."""

    WAITING = "waiting"  # for a request, a wake-up, an expiry or a due time
    SERVING = "serving"  # running a round
    LINGERING = "lingering"  # no request left; the next may come soon
    FINISHED = "finished"  # stopped: it takes no request


@dataclass(slots=True)
class QueueState:
    """A consumer queue's state, between rounds and within one."""

    phase: Phase = Phase.WAITING
    dirty: bool = True  # a round is owed: a request came, a wake-up, a due time passed
    next_due: float | None = None  # loop time of a round nobody will announce
    loaded: bool = False  # the consumer's last delivery sequences were read
    due: int = 0  # due jobs left after the last claim
    last_seq: int = 0
    last_stream_seq: int = 0
    found: int = 0  # jobs this round's claims found
    terms: Terms = field(default_factory=lambda: Terms(pinning=False))

    def note(self, batch: ClaimBatch) -> None:
        self.due = batch.due
        self.found += len(batch.deliveries)
        if batch.deliveries:
            self.last_seq = max(self.last_seq, batch.last_seq)
            self.last_stream_seq = max(self.last_stream_seq, batch.last_stream_seq)


@dataclass(frozen=True, slots=True)
class Limits:
    max_claim: int  # jobs one claim statement may take
    parallel_claims: int = PARALLEL_CLAIMS

    @classmethod
    def of(cls, consumer: Consumer, max_claim: int) -> Limits:
        """An AckNone consumer's claims run one at a time. Claims side by side can overtake
        a job: the claim's walk (claimable_jobs, migration 0010) runs in a snapshot newer
        than its statement's, so it can lock a job committed in between (a publish, a history
        chunk) that its update cannot see; the other claim, whose statement began after that
        commit, skips it as locked and takes the jobs after it, and the job comes in the next
        round, after them, under consecutive delivery sequences. To an acked consumer that is
        one job out of stream order, as a redelivery is; an ordered consumer (AckNone,
        JetStream's way to read a stream in order) sees no gap, so nothing tells it."""
        if consumer.options.ack_policy == "none":
            return cls(max_claim, parallel_claims=1)
        return cls(max_claim)


# -- commands: what a round asks its runner to do, and what the answer is ---------------------


@dataclass(frozen=True, slots=True)
class LoadSequences:
    """-> (last delivery sequence, last stream sequence) of the consumer."""


@dataclass(frozen=True, slots=True)
class ReadBacklog:
    """-> the consumer's (pending, in flight) counts, each counted up to its cap."""

    pending_cap: int
    ack_cap: int


@dataclass(frozen=True, slots=True)
class ReadPin:
    """-> the pin id the group is pinned to now, or None."""


@dataclass(frozen=True, slots=True)
class TouchPin:
    """The pinned client asked again: its pin does not lapse. -> whether it still held it."""

    pin: str


@dataclass(frozen=True, slots=True)
class AssignPin:
    """Pin the group to a new pin id, unless another process pinned it first.
    -> (the pin now, whether it is the new one)."""


@dataclass(frozen=True, slots=True)
class FinishAhead:
    """-> what the claims running ahead found (waited for)."""


@dataclass(frozen=True, slots=True)
class KeepAhead:
    """Hold these deliveries ready, after those held. -> how many are ready now."""

    deliveries: list[Delivery]


@dataclass(frozen=True, slots=True)
class ReleaseStale:
    """Give back the ready deliveries held too long. -> how many are ready now."""


@dataclass(frozen=True, slots=True)
class TakeAhead:
    """-> every ready delivery, in order (none is held from here)."""


@dataclass(frozen=True, slots=True)
class GiveBack:
    """Give back everything held or being claimed ahead."""


@dataclass(frozen=True, slots=True)
class Claim:
    """Claims side by side for the shared requests, one per size. -> `Sized`."""

    sizes: list[int]
    numbered: bool


@dataclass(frozen=True, slots=True)
class StartAhead:
    """Start these claims for requests to come, without waiting for them."""

    sizes: list[int]
    numbered: bool


@dataclass(frozen=True, slots=True)
class ClaimAlone:
    """One claim on the request's own terms (its byte budget, incremental lease).
    -> `ClaimBatch`."""

    waiter: Any
    limit: int
    numbered: bool


@dataclass(frozen=True, slots=True)
class Give:
    """Hand the delivery to the request (budget already counted)."""

    waiter: Any
    delivery: Delivery


@dataclass(frozen=True, slots=True)
class GiveWithin:
    """Hand the delivery to a request with a byte budget. -> the bytes it counts, or None
    (nothing sent) when it exceeds what the request has left."""

    waiter: Any
    delivery: Delivery


@dataclass(frozen=True, slots=True)
class End:
    """The request is over (it has left the queue already)."""

    waiter: Any
    outcome: PullEnd


@dataclass(frozen=True, slots=True)
class Release:
    """Give these claimed jobs back unprocessed."""

    deliveries: list[Delivery]


@dataclass(frozen=True, slots=True)
class Recheck:
    """Read the consumer again, and when `next_due`, when its next queued job falls due.
    -> `Rechecked`."""

    next_due: bool


@dataclass(frozen=True, slots=True)
class Rechecked:
    fresh: Consumer | None  # None: deleted
    current: Consumer  # what the queue has held it as
    until: float | None  # seconds until the next job falls due
    now: float  # loop time


@dataclass(frozen=True, slots=True)
class Adopt:
    """The queue holds the consumer as read from now on."""

    consumer: Consumer


@dataclass(frozen=True, slots=True)
class Clock:
    """-> loop time now."""


Command = (
    LoadSequences
    | ReadBacklog
    | ReadPin
    | TouchPin
    | AssignPin
    | FinishAhead
    | KeepAhead
    | ReleaseStale
    | TakeAhead
    | GiveBack
    | Claim
    | StartAhead
    | ClaimAlone
    | Give
    | GiveWithin
    | End
    | Release
    | Recheck
    | Adopt
    | Clock
)
Round = Generator[Command, Any, None]


def claim_sizes(wanted: int, limits: Limits) -> list[int]:
    """Claims for `wanted` jobs: one statement, or up to `parallel_claims` of even size when
    it exceeds max_claim (beyond that, the next round claims again)."""
    max_claim = limits.max_claim
    limit = min(wanted, max_claim * limits.parallel_claims)
    parts = -(-limit // max_claim)
    return [limit // parts + (1 if i < limit % parts else 0) for i in range(parts)]


def in_stream_order(parts: list[list[Delivery]]) -> list[Delivery]:
    """Deliveries of claims that ran side by side, merged into queue order (priority, then
    oldest), with their sequence numbers handed out again in that order."""
    if len(parts) == 1:
        return parts[0]
    merged = sorted((d for part in parts for d in part), key=lambda d: (-d.job.priority, d.job.id))
    seqs = sorted(d.seq for d in merged)
    return [d._replace(seq=seq) for d, seq in zip(merged, seqs, strict=True)]


def _ending_now(waiter: Request) -> bool:
    """A no_wait request ends when nothing (more) is due once it got a job, or at once if it
    gave no expiry; one with an expiry that got nothing waits for it (JetStream's rule)."""
    return waiter.no_wait and (waiter.delivered > 0 or not waiter.expires_given)


def round_steps(
    state: QueueState,
    waiters: deque[W],
    policy: WaitPolicy[W],
    limits: Limits,
) -> Round:
    """One round over `waiters` (the queue, in its order; the round reorders it and takes
    out the requests that end)."""
    terms = state.terms
    ends: list[End] = []

    def end(waiter: W, outcome: PullEnd) -> End:
        if waiter in waiters:
            waiters.remove(waiter)
        return End(waiter, outcome)

    def alive(waiter: W) -> bool:
        if not waiter.alive():
            ends.append(end(waiter, PullEnd.DROPPED))
            return False
        return True

    def flush_ends() -> Generator[Command, Any, None]:
        while ends:
            yield ends.pop(0)

    numbered = any(w.numbered for w in waiters)
    if numbered and not state.loaded:
        state.loaded = True
        seq, stream_seq = yield LoadSequences()
        state.last_seq = max(state.last_seq, seq)
        state.last_stream_seq = max(state.last_stream_seq, stream_seq)
    state.next_due = None  # the claims below say when queued jobs fall due next
    state.found = 0
    caps = backlog_caps(waiters)
    terms.backlog = None if caps is None else (yield ReadBacklog(*caps))
    terms.handed = 0
    if terms.pinning:
        yield from _read_pin(waiters, terms, end)

    plain = [w for w in list(waiters) if not w.own_claim and alive(w)]
    yield from flush_ends()
    if not plain:
        yield GiveBack()
    else:
        # Whatever the claim ahead found is older than the wake-up that brought us here: a
        # queue it saw drained may have jobs again (a NAK'd job falling due, a publish), so
        # the requests still short claim afresh below.
        ahead: Sized = yield FinishAhead()
        yield from _keep(state, ahead)
        ready: int = yield ReleaseStale()
        wanted = short = terms.demand(plain)
        drained = False
        if 0 < ready < wanted and policy.fills_whole_first:
            # Too few ready for every request: they fill whole requests first, in the order
            # the requests wait, and those are sent while the rest is claimed. Shared out one
            # at a time after the claim, no request was filled before it, so all of a
            # consumer's pullers got their batches at once and came back at once: the client
            # and the bridge took turns, each idle while the other worked (docs/performance.md,
            # "The NATS bridge").
            whole: WaitPolicy[W] = FillWhole()
            early: list[Delivery] = yield TakeAhead()
            rest = yield from _hand_out(waiters, whole, terms, early, end, alive, ends)
            ready = yield KeepAhead(rest)
            short = terms.demand([w for w in plain if w in waiters])
        if ready < short:
            sized: Sized = yield Claim(claim_sizes(short - ready, limits), numbered)
            drained, ready = yield from _keep(state, sized)
        if terms.pinning and terms.pin is None and ready:
            chosen = standby(waiters)
            if chosen is not None:
                pin, won = yield AssignPin()
                if won:
                    chosen.terms = dataclasses.replace(chosen.terms, pin_id=pin)
                terms.pin = pin
        taken: list[Delivery] = yield TakeAhead()
        leftovers = yield from _hand_out(waiters, policy, terms, taken, end, alive, ends)
        # Jobs a request could not take yet (its transport is behind) are still there.
        drained = drained and not leftovers
        if numbered and policy.claims_ahead:
            ready = yield KeepAhead(leftovers)
        else:  # unnumbered jobs cannot wait for a request that wants numbers
            ready = 0
            if leftovers:
                yield Release(leftovers)
        still = terms.demand([w for w in waiters if not w.own_claim])
        if not drained and policy.claims_ahead and any(w.pulls_in_a_loop for w in plain):
            # While these are sent, the database claims what the requests still want or, when
            # they are filled, as much again for the next requests of a consumer pulling in a
            # loop. It is handed out after what is ready now.
            more = max(still, wanted) - ready
            if more > 0:
                yield StartAhead(claim_sizes(more, limits), numbered)
        if drained:
            for w in list(waiters):
                if not w.own_claim and _ending_now(w):
                    yield end(w, PullEnd.NO_MESSAGES)
        elif still > 0:
            state.dirty = True

    for w in [w for w in waiters if w.own_claim]:
        usable = w in waiters and alive(w) and terms.may_take(w)
        yield from flush_ends()
        if not usable:
            continue
        if terms.pinning and terms.pin is None:
            continue  # a request with a byte budget takes jobs under a pin only
        limit = min(terms.demand([w]), limits.max_claim)
        if limit <= 0:
            continue
        batch: ClaimBatch = yield ClaimAlone(w, limit, numbered)
        state.note(batch)
        leftovers = yield from _fill(waiters, terms, w, batch.deliveries, end)
        if w in waiters and batch.deliveries and batch.due > 0:
            # Its claim stopped at its byte budget with jobs left: the next one claimed ends
            # it (too large for what is left) or fills it further.
            state.dirty = True
        if w in waiters and _ending_now(w) and batch.due == 0:
            yield end(w, PullEnd.NO_MESSAGES)
        if leftovers:
            yield Release(leftovers)

    if terms.backlog is not None or terms.pinning:
        # Requests whose terms keep them from jobs: one that does not wait ends; the others
        # wait, and while jobs are pending overflow counts are read again soon, since other
        # processes' claims change them without waking anyone.
        unmet = [w for w in waiters if not terms.may_take(w)]
        for w in unmet:
            if _ending_now(w):
                yield end(w, PullEnd.NO_MESSAGES)
        if terms.unmet_backlog_waits() and any(w in waiters for w in unmet):
            now: float = yield Clock()
            state.next_due = now + OVERFLOW_RECHECK_SECONDS

    # Requests still waiting after a round that found nothing, or that took every job due so
    # far: no one announces a backoff running out, so the round reads when the next queued
    # job falls due.
    if waiters and (not state.found or state.due == 0):
        yield from _recheck(state, waiters, end)


def _read_pin(
    waiters: deque[W], terms: Terms, end: Callable[[W, PullEnd], End]
) -> Generator[Command, Any, None]:
    """The pin as it is now; a request that arrived naming another pin is told at once, and
    the pinned client's new requests keep its pin from lapsing."""
    terms.pin = yield ReadPin()
    touched = False
    for w in list(waiters):
        if w.terms.pin_id is None:
            continue
        arrived, outcome = pin_verdict(w, terms.pin)
        if outcome is not None:
            yield end(w, outcome)
        elif arrived and not touched:
            touched = yield TouchPin(w.terms.pin_id)


def _keep(state: QueueState, sized: Sized) -> Generator[Command, Any, tuple[bool, int]]:
    """Note what the claims found and hold it ready in queue order: whether they drained the
    queue (fewer jobs than asked, or nothing more due), and how many are ready now."""
    drained = False
    for size, batch in sized:
        state.note(batch)
        drained = drained or len(batch.deliveries) < size or batch.due == 0
    ready: int = yield KeepAhead(in_stream_order([b.deliveries for _, b in sized]))
    return drained, ready


def _hand_out(
    waiters: deque[W],
    policy: WaitPolicy[W],
    terms: Terms,
    deliveries: list[Delivery],
    end: Callable[[W, PullEnd], End],
    alive: Callable[[W], bool],
    ends: list[End],
) -> Generator[Command, Any, list[Delivery]]:
    """Each delivery goes to the request the policy picks (round-robin by default); what no
    request can take now is left over."""

    def takes_next(waiter: W) -> bool:
        if terms.pinning and waiter.terms.pin_id not in (None, terms.pin):
            ends.append(end(waiter, PullEnd.WRONG_PIN))  # pinned this round to another client
            return False
        return not waiter.own_claim and alive(waiter) and terms.may_take(waiter)

    leftovers: list[Delivery] = []
    for index, delivery in enumerate(deliveries):
        waiter = policy.pick(waiters, takes_next)
        while ends:
            yield ends.pop(0)
        if waiter is None or not waiter.ready():
            leftovers = deliveries[index:]
            break
        if terms.pin is not None:
            delivery = delivery._replace(pin=terms.pin)
        waiter.delivered += 1
        terms.handed += 1
        waiter.batch_left -= 1
        yield Give(waiter, delivery)
        policy.served(waiters, waiter)
        if waiter.batch_left == 0:
            yield end(waiter, PullEnd.FILLED)
    for waiter in [w for w in waiters if w.ends_on_delivery and w.delivered]:
        yield end(waiter, PullEnd.DELIVERED)
    return leftovers


def _fill(
    waiters: deque[W],
    terms: Terms,
    waiter: W,
    deliveries: list[Delivery],
    end: Callable[[W, PullEnd], End],
) -> Generator[Command, Any, list[Delivery]]:
    """A request with its own claim takes that claim's jobs while its budget lasts."""
    for index, delivery in enumerate(deliveries):
        if waiter not in waiters or not waiter.ready():
            return deliveries[index:]
        if terms.pin is not None:
            delivery = delivery._replace(pin=terms.pin)
        size: int | None = yield GiveWithin(waiter, delivery)
        if size is None:
            yield end(waiter, PullEnd.TOO_LARGE)
            return deliveries[index:]
        waiter.delivered += 1
        terms.handed += 1
        if waiter.bytes_left is not None:
            waiter.bytes_left -= size
        waiter.batch_left -= 1
        if waiter.batch_left == 0:
            yield end(waiter, PullEnd.BYTES_LEFT if waiter.bytes_left else PullEnd.FILLED)
    if waiter in waiters and waiter.ends_on_delivery and waiter.delivered:
        yield end(waiter, PullEnd.DELIVERED)
    return []


def _recheck(
    state: QueueState, waiters: deque[W], end: Callable[[W, PullEnd], End]
) -> Generator[Command, Any, None]:
    """The consumer may be gone or changed (nothing was claimed), and when nothing is due,
    when the next job falls due says how long to sleep."""
    answer: Rechecked = yield Recheck(next_due=state.due == 0)
    fresh = answer.fresh
    if fresh is None or fresh.type is not ConsumerType.PULL:
        # A request that comes later is told the same by its own round.
        for waiter in list(waiters):
            yield end(waiter, PullEnd.CONSUMER_DELETED)
        return
    current = answer.current
    if (fresh.max_ack_pending, fresh.ack_wait_seconds) != (
        current.max_ack_pending,
        current.ack_wait_seconds,
    ):
        state.dirty = True
    yield Adopt(fresh)
    if answer.until is not None:
        at = answer.now + max(answer.until, MIN_RECHECK_SECONDS)
        state.next_due = at if state.next_due is None else min(state.next_due, at)


# -- planning a round from plain inputs (what tests drive) ------------------------------------


@dataclass(slots=True)
class RoundPlan:
    """What one round did, in the order it did it."""

    commands: list[Command] = field(default_factory=list)
    answers: list[Any] = field(default_factory=list)  # what each command was answered

    def of(self, kind: type[Any]) -> list[Any]:
        return [c for c in self.commands if isinstance(c, kind)]

    @property
    def claims(self) -> list[list[int]]:
        """The sizes of each shared claim made."""
        return [c.sizes for c in self.of(Claim)]

    @property
    def claimed_alone(self) -> list[int]:
        return [c.limit for c in self.of(ClaimAlone)]

    @property
    def ahead(self) -> list[list[int]]:
        return [c.sizes for c in self.of(StartAhead)]

    @property
    def handed(self) -> list[tuple[Any, int]]:
        """(request, job id) of each hand-out, in order."""
        return [(c.waiter, c.delivery.job.id) for c in self._given()]

    @property
    def ended(self) -> list[tuple[Any, PullEnd]]:
        return [(c.waiter, c.outcome) for c in self.of(End)]

    @property
    def released(self) -> list[int]:
        return [d.job.id for c in self.of(Release) for d in c.deliveries]

    @property
    def pins(self) -> list[str | None]:
        """The pin each hand-out went out under."""
        return [c.delivery.pin for c in self._given()]

    def _given(self) -> list[Give | GiveWithin]:
        """Hand-outs carried out (a job over a request's byte budget is not sent)."""
        return [
            c
            for c, answer in zip(self.commands, self.answers, strict=True)
            if isinstance(c, Give) or (isinstance(c, GiveWithin) and answer is not None)
        ]


@dataclass(slots=True)
class Backlog:
    """The consumer's queue as plain data, claimed from in order (a claim takes the head)."""

    jobs: list[Delivery]
    inflight: int = 0
    max_ack_pending: int | None = None  # a claim leaves at most this many in flight
    sizes: dict[int, int] = field(default_factory=dict)  # job id -> bytes; default payload

    def claim(self, limit: int, max_bytes: int | None = None) -> ClaimBatch:
        if self.max_ack_pending is not None:
            limit = min(limit, max(self.max_ack_pending - self.inflight, 0))
        taken: list[Delivery] = []
        used = 0
        while self.jobs and len(taken) < limit:
            size = self.size(self.jobs[0])
            # A claim with a byte budget always takes its first job.
            if max_bytes is not None and taken and used + size > max_bytes:
                break
            used += size
            taken.append(self.jobs.pop(0))
        self.inflight += len(taken)
        due = len(self.jobs)
        return ClaimBatch(
            [d._replace(pending=due + len(taken) - 1 - i) for i, d in enumerate(taken)],
            due,
            max((d.seq for d in taken), default=0),
            max((d.job.id for d in taken), default=0),
        )

    def size(self, delivery: Delivery) -> int:
        return self.sizes.get(delivery.job.id, len(delivery.job.payload))


def plan_round(
    state: QueueState,
    waiters: deque[W],
    policy: WaitPolicy[W],
    limits: Limits,
    consumer: Consumer,
    backlog: Backlog,
    *,
    now: float = 0.0,
    ahead: Iterable[Delivery] = (),
    running_ahead: Sized | None = None,
    pin: str | None = None,
    new_pin: str = "NEWPIN",
    next_due_in: float | None = None,
    fresh: Consumer | None | bool = True,
) -> RoundPlan:
    """Run one round against plain data: `backlog` is the queue it claims from, `ahead` the
    deliveries held ready, `running_ahead` what claims started ahead found, `pin` the pin
    held, `next_due_in` the seconds until the next queued job falls due, `fresh` the consumer
    read again (True: unchanged, None: deleted). Requests and `state` change as the round
    changes them."""
    plan = RoundPlan()
    ready = list(ahead)
    reconsumer = consumer if fresh is True else fresh
    steps = round_steps(state, waiters, policy, limits)
    answer: Any = None
    while True:
        try:
            command = steps.send(answer)
        except StopIteration:
            return plan
        plan.commands.append(command)
        answer = _answer(command, backlog, ready, running_ahead, now)
        if isinstance(command, ReadPin):
            answer = pin
        elif isinstance(command, TouchPin):
            answer = command.pin == pin
        elif isinstance(command, AssignPin):
            won = pin is None
            pin = new_pin if won else pin
            answer = (pin, won)
        elif isinstance(command, GiveWithin):
            size = backlog.size(command.delivery)
            left = command.waiter.bytes_left
            answer = None if left is not None and size > left else size
        elif isinstance(command, Recheck):
            answer = Rechecked(
                None if reconsumer is False else reconsumer,
                consumer,
                next_due_in if command.next_due else None,
                now,
            )
        plan.answers.append(answer)
        running_ahead = None if isinstance(command, FinishAhead) else running_ahead


def _answer(
    command: Command, backlog: Backlog, ready: list[Delivery], running: Sized | None, now: float
) -> Any:
    match command:
        case LoadSequences():
            return (0, 0)
        case ReadBacklog(pending_cap=pending_cap, ack_cap=ack_cap):
            return (min(len(backlog.jobs), pending_cap), min(backlog.inflight, ack_cap))
        case FinishAhead():
            return running or []
        case KeepAhead(deliveries=deliveries):
            ready.extend(deliveries)
            return len(ready)
        case ReleaseStale():
            return len(ready)
        case TakeAhead():
            taken = list(ready)
            ready.clear()
            return taken
        case Claim(sizes=sizes):
            return [(n, backlog.claim(n)) for n in sizes]
        case ClaimAlone(waiter=waiter, limit=limit):
            return backlog.claim(limit, waiter.bytes_left)
        case Clock():
            return now
    return None
