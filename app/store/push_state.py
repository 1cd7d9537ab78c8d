"""What dispatchers learn of a push consumer's endpoint: disabled by a 410, and its circuit
breaker. Each change is one conditional statement, so dispatchers running side by side agree
(the database settles who opened, who probes, who closed).

The breaker: `failures` consecutive failed deliveries open it for `cooldown` seconds, doubled
for each time it opened again without closing in between (at most MAX_COOLDOWN_FACTOR times).
Once that has passed, one dispatcher wins the move to half_open and sends one probe; while
half_open, no other delivery goes out until the probe's lease would have ended. The probe's
success closes it; its failure opens it again, longer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, case, or_, select, update

from app.domain.models import Breaker, PushState
from app.store.db import Tx, now, plus_seconds, upsert
from app.store.schema import push_state

MAX_COOLDOWN_FACTOR = 32


def state_from_row(row: Any) -> PushState:
    return PushState(
        disabled_at=row.disabled_at,
        disabled_reason=row.disabled_reason,
        breaker=Breaker(row.breaker),
        failures=row.failures,
        trips=row.trips,
        open_until=row.open_until,
    )


COLUMNS = (
    push_state.c.consumer_pk,
    push_state.c.disabled_at,
    push_state.c.disabled_reason,
    push_state.c.breaker,
    push_state.c.failures,
    push_state.c.trips,
    push_state.c.open_until,
)


class PushStateStore:
    def __init__(self, tx: Tx) -> None:
        self._tx = tx
        self._now = now(tx.dialect)

    def _upsert(
        self,
        consumer_pk: int,
        first: dict[str, Any],
        then: dict[str, Any],
        where: ColumnElement[bool] | None = None,
    ) -> Any:
        """The row made with `first`, or the existing one changed by `then` (where `where`)."""
        return (
            upsert(self._tx.dialect, push_state)
            .values(consumer_pk=consumer_pk, changed_at=self._now, **first)
            .on_conflict_do_update(
                index_elements=[push_state.c.consumer_pk],
                set_={**then, "changed_at": self._now},
                where=where,
            )
            .returning(*COLUMNS)
        )

    async def of(self, consumer_pks: Sequence[int]) -> dict[int, PushState]:
        if not consumer_pks:
            return {}
        rows = await self._tx.conn.execute(
            select(*COLUMNS).where(push_state.c.consumer_pk.in_(list(consumer_pks)))
        )
        return {row.consumer_pk: state_from_row(row) for row in rows}

    async def disable(self, consumer_pk: int, reason: str) -> bool:
        """Push off (a 410); False when it already was."""
        values = {"disabled_at": self._now, "disabled_reason": reason}
        statement = self._upsert(consumer_pk, values, values, push_state.c.disabled_at.is_(None))
        return (await self._tx.conn.execute(statement)).first() is not None

    async def enable(self, consumer_pk: int) -> bool:
        """Push on again, the breaker closed (a PUT with enabled=true)."""
        result = await self._tx.conn.execute(
            update(push_state)
            .where(
                push_state.c.consumer_pk == consumer_pk,
                or_(push_state.c.disabled_at.is_not(None), push_state.c.breaker != Breaker.CLOSED),
            )
            .values(
                disabled_at=None,
                disabled_reason=None,
                breaker=Breaker.CLOSED.value,
                failures=0,
                trips=0,
                open_until=None,
                changed_at=self._now,
            )
        )
        return bool(result.rowcount)

    async def failed(self, consumer_pk: int, threshold: int, cooldown: int) -> PushState:
        """One more failed delivery: the breaker opens at `threshold` consecutive failures,
        and a failed probe opens it again at once."""
        failures = push_state.c.failures + 1
        opens = or_(push_state.c.breaker == Breaker.HALF_OPEN, failures >= threshold)
        factor = case(
            (push_state.c.trips >= 5, MAX_COOLDOWN_FACTOR), else_=_power_of_two(push_state.c.trips)
        )
        open_until = plus_seconds(self._tx.dialect, self._now, factor * cooldown)
        first_open = threshold <= 1
        first = {
            "failures": 1,
            "breaker": (Breaker.OPEN if first_open else Breaker.CLOSED).value,
            "trips": 1 if first_open else 0,
            "open_until": plus_seconds(self._tx.dialect, self._now, cooldown)
            if first_open
            else None,
        }
        then = {
            "failures": failures,
            "breaker": case((opens, Breaker.OPEN.value), else_=push_state.c.breaker),
            "trips": case((opens, push_state.c.trips + 1), else_=push_state.c.trips),
            "open_until": case((opens, open_until), else_=push_state.c.open_until),
        }
        row = (await self._tx.conn.execute(self._upsert(consumer_pk, first, then))).one()
        return state_from_row(row)

    async def succeeded(self, consumer_pks: Sequence[int]) -> list[int]:
        """Deliveries went through: the consumers whose breaker this closed (or whose count of
        failures it reset). Rows already clean are not written."""
        if not consumer_pks:
            return []
        rows = await self._tx.conn.execute(
            update(push_state)
            .where(
                push_state.c.consumer_pk.in_(list(consumer_pks)),
                or_(push_state.c.failures > 0, push_state.c.breaker != Breaker.CLOSED),
            )
            .values(
                failures=0,
                trips=0,
                breaker=Breaker.CLOSED.value,
                open_until=None,
                changed_at=self._now,
            )
            .returning(push_state.c.consumer_pk, push_state.c.breaker)
        )
        return [row.consumer_pk for row in rows]

    async def start_probe(self, consumer_pk: int, lease_seconds: int) -> bool:
        """An open breaker whose cool-down has passed (or a probe whose lease has): this
        dispatcher sends the one probe (False: not due, or another took it)."""
        result = await self._tx.conn.execute(
            update(push_state)
            .where(
                push_state.c.consumer_pk == consumer_pk,
                push_state.c.breaker != Breaker.CLOSED,
                push_state.c.open_until <= self._now,
            )
            .values(
                breaker=Breaker.HALF_OPEN.value,
                open_until=plus_seconds(self._tx.dialect, self._now, lease_seconds),
                changed_at=self._now,
            )
        )
        return bool(result.rowcount)


def _power_of_two(exponent: ColumnElement[int]) -> ColumnElement[int]:
    """2 ** exponent for 0..4 (both dialects; past 4 the caller caps the factor)."""
    return case(
        (exponent <= 0, 1),
        (exponent == 1, 2),
        (exponent == 2, 4),
        (exponent == 3, 8),
        else_=16,
    )
