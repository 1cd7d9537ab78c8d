"""Applying the [initial-*] sections of the config file on every start."""

from __future__ import annotations

import logging
from collections.abc import Callable

from app.config import SeedConsumer, SeedData
from app.domain.errors import InvalidInput
from app.domain.models import ConsumerType
from app.domain.priority import priority_settings
from app.services.admin import utcnow
from app.store.db import Database, Tx
from app.store.stakeholders import ConsumerStore, StakeholderStore, channels, producers

log = logging.getLogger(__name__)


class SeedError(InvalidInput):
    """A seed entry cannot be applied; the message names the entry."""


async def apply_seed(db: Database, seed: SeedData, digest: Callable[[str], str]) -> None:
    """Upsert seeded channels, producers and consumers: changed names and tokens are applied,
    nothing is deleted, and instances starting together settle races on the unique keys.
    Channel and producer tokens are stored as `digest` makes them (app/domain/tokens.py)."""
    for reason in seed.skipped:
        log.error("seed: %s", reason)
    async with db.transaction() as tx:
        for item in seed.channels:
            await _seed_stakeholder(channels(tx), item.id, item.name, digest(item.token))
        for item in seed.producers:
            await _seed_stakeholder(producers(tx), item.id, item.name, digest(item.token))
        for consumer in seed.consumers:
            await _seed_consumer(tx, consumer)


async def _seed_stakeholder(store: StakeholderStore, id_: str, name: str, token: str) -> None:
    existing = await store.get(id_, for_update=True)
    if existing is None:
        if await store.insert(id_, name, token, utcnow()) is not None:
            return
        existing = await store.get(id_, for_update=True)
        assert existing is not None
    if (existing.name, existing.token) != (name, token):
        await store.update(id_, name, token, utcnow())


async def _seed_consumer(tx: Tx, seed: SeedConsumer) -> None:
    if await channels(tx).get(seed.channel_id) is None:
        raise SeedError(
            f"[initial-consumers] {seed.id}: channel {seed.channel_id!r} is neither seeded "
            "nor stored"
        )
    store = ConsumerStore(tx)
    values = {
        "name": seed.name,
        "token": seed.token,
        "callback_url": seed.callback_url,
        "type": seed.type.value,
        "ack_wait_seconds": seed.ack_wait_seconds,
        "max_ack_pending": seed.max_ack_pending,
        "priority_group": seed.priority.group,
        "priority_policy": seed.priority.policy.value,
        "priority_timeout_seconds": seed.priority.timeout_seconds,
    }
    existing = await store.get(seed.channel_id, seed.id, for_update=True)
    if existing is None:
        at = utcnow()
        created = await store.insert(
            {
                **values,
                "channel_id": seed.channel_id,
                "consumer_id": seed.id,
                "created_at": at,
                "updated_at": at,
            }
        )
        if created is not None:
            tx.announce_change([created.pk])
            return
        existing = await store.get(seed.channel_id, seed.id, for_update=True)
        assert existing is not None
    try:
        priority_settings(
            seed.priority.groups,
            seed.priority.policy,
            seed.priority.timeout_seconds,
            pull=seed.type is ConsumerType.PULL,
            existing=existing.priority,
        )
    except InvalidInput as exc:
        raise SeedError(f"[{seed.id}] priority-*: {exc.detail}") from None
    current = {
        "name": existing.name,
        "token": existing.token,
        "callback_url": existing.callback_url,
        "type": existing.type.value,
        "ack_wait_seconds": existing.ack_wait_seconds,
        "max_ack_pending": existing.max_ack_pending,
        "priority_group": existing.priority.group,
        "priority_policy": existing.priority.policy.value,
        "priority_timeout_seconds": existing.priority.timeout_seconds,
    }
    if current != values:
        await store.update(existing.pk, {**values, "updated_at": utcnow()})
        tx.announce_change([existing.pk])
