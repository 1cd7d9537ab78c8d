"""Priority groups of pull consumers (NATS ADR-42, as nats-server 2.15 does them; protocol doc
section 10): a consumer's settings, the priority terms a pull request carries, and the checks
both transports run on them. Pure: no I/O.

- `overflow`: a request with `min_pending` / `min_ack_pending` is served only while the
  consumer has at least that many jobs pending (due, the one being handed out included) or
  in flight (not counting it); otherwise it waits. Requests are served in arrival order with
  the others (nats-server gives requests without conditions no precedence, which ADR-42
  asks for).
- `prioritized`: waiting requests with a lower `priority` (0-9) are served first.
- `pinned_client`: one client at a time takes the group's jobs.

Where nats-server and ADR-42 differ, the server wins, except that a consumer's group and
policy cannot change after it is created (the server lets an update change them; the ADR and
our issue do not), and a consumer has at most one group (the server takes several and uses
the first).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from app.domain.errors import InvalidInput

GROUP_NAME = re.compile(r"^[a-zA-Z0-9/_=-]{1,16}$")
DEFAULT_PRIORITY_TIMEOUT = 120  # seconds, as nats-server's default
MAX_PRIORITY = 9


class PriorityPolicy(enum.StrEnum):
    NONE = "none"
    OVERFLOW = "overflow"
    PINNED_CLIENT = "pinned_client"
    PRIORITIZED = "prioritized"


class PriorityConfigError(InvalidInput):
    """Priority settings refused, with nats-server's error code where it refuses them too
    (None: a rule of ours)."""

    def __init__(self, err_code: int | None, description: str) -> None:
        super().__init__(description)
        self.err_code = err_code
        self.description = description


class PullRefused(InvalidInput):
    """A pull request's priority terms do not fit the consumer; `description` is the text of
    nats-server's status line (`400 Bad Request - ...`)."""

    def __init__(self, description: str) -> None:
        super().__init__(description)
        self.description = description


GROUP_MISSING = "Bad Request - Priority Group missing"
GROUP_INVALID = "Bad Request - Invalid Priority Group"
PRIORITY_RANGE = f"Bad Request - Priority must be between 0 and {MAX_PRIORITY}"
NOT_PINNED = "Bad Request - Not a Pinned Client Priority consumer"
NOT_OVERFLOW = "Bad Request - Not a Overflow Priority consumer"  # sic, the server's text
GROUP_NAME_RULE = (
    "Valid priority group name must match A-Z, a-z, 0-9, -_/=)+ and may not exceed 16 characters"
)


@dataclass(frozen=True, slots=True)
class PrioritySettings:
    """A consumer's priority group, policy and pin timeout (None: the default)."""

    group: str | None = None
    policy: PriorityPolicy = PriorityPolicy.NONE
    timeout_seconds: int | None = None

    @property
    def active(self) -> bool:
        return self.policy is not PriorityPolicy.NONE

    @property
    def groups(self) -> list[str]:
        return [self.group] if self.group else []

    def timeout(self) -> int:
        return self.timeout_seconds or DEFAULT_PRIORITY_TIMEOUT


NO_PRIORITY = PrioritySettings()


def parse_policy(raw: str | None) -> PriorityPolicy:
    if raw is None or raw.strip() == "":
        return PriorityPolicy.NONE
    try:
        return PriorityPolicy(raw.strip().lower())
    except ValueError:
        names = ", ".join(p.value for p in PriorityPolicy)
        raise InvalidInput(f"priorityPolicy must be one of {names}, not {raw!r}") from None


def priority_settings(
    groups: list[str],
    policy: PriorityPolicy,
    timeout_seconds: int | None,
    *,
    pull: bool,
    existing: PrioritySettings | None = None,
) -> PrioritySettings:
    """Check a consumer's priority settings in nats-server's order (and its error codes);
    `existing` is what the consumer had, of which only the timeout may change."""
    if existing is not None and (existing.groups, existing.policy) != (groups, policy):
        raise PriorityConfigError(
            None,
            "priority policy and groups can not be changed after the consumer is created "
            "(only priorityTimeout can)",
        )
    if policy is not PriorityPolicy.NONE:
        if not pull:
            raise PriorityConfigError(10178, "priority groups can not be used with push consumers")
        if not groups:
            raise PriorityConfigError(
                10159, "Setting PriorityPolicy requires at least one PriorityGroup to be set"
            )
        for group in groups:
            if group == "":
                raise PriorityConfigError(10161, "Group name cannot be an empty string")
            if not GROUP_NAME.match(group):
                raise PriorityConfigError(10162, GROUP_NAME_RULE)
        if len(groups) > 1:
            raise PriorityConfigError(None, "a consumer can have only one priority group")
    else:
        if groups:
            raise PriorityConfigError(
                10196, "consumer can not have priority groups when policy is none"
            )
        if timeout_seconds:
            raise PriorityConfigError(10197, "PinnedTTL cannot be set when PriorityPolicy is none")
    if timeout_seconds and policy is not PriorityPolicy.PINNED_CLIENT:
        raise InvalidInput("priorityTimeout applies to the pinned_client policy only")
    return PrioritySettings(groups[0] if groups else None, policy, timeout_seconds)


def check_unpin(settings: PrioritySettings, group: str) -> None:
    """An unpin names the consumer's group (nats-server checks no policy)."""
    if not GROUP_NAME.match(group):
        raise PriorityConfigError(10162, GROUP_NAME_RULE)
    if group not in settings.groups:
        raise PriorityConfigError(10160, "Provided priority group does not exist for this consumer")


@dataclass(frozen=True, slots=True)
class PullPriority:
    """The priority terms of one pull request (absent fields are 0 / None). A NATS request
    whose body is not JSON has none at all (`json=False`): it passes every check, and a
    prioritized consumer serves it last."""

    group: str | None = None
    min_pending: int = 0
    min_ack_pending: int = 0
    pin_id: str | None = None
    priority: int = 0
    json: bool = True

    @property
    def conditional(self) -> bool:
        """An overflow request that waits for a backlog."""
        return self.min_pending > 0 or self.min_ack_pending > 0

    @property
    def rank(self) -> int:
        """Order among waiting requests of a prioritized consumer (lower first)."""
        return self.priority if self.json else LAST_RANK

    def overflows(self, pending: int, ack_pending: int) -> bool:
        """Whether an overflow request may take a job now: `pending` counts the job itself,
        `ack_pending` the jobs in flight before it."""
        if not self.conditional:
            return True
        return (0 < self.min_pending <= pending) or (0 < self.min_ack_pending <= ack_pending)


LAST_RANK = 2**31 - 1
PLAIN = PullPriority()  # a JSON request without priority fields
NO_TERMS = PullPriority(json=False)


def check_pull(settings: PrioritySettings, terms: PullPriority) -> PullPriority:
    """A pull request's terms checked against the consumer's settings in nats-server's order;
    what the consumer's policy does not use is dropped."""
    if not terms.json:
        return NO_TERMS
    policy = settings.policy
    if (terms.min_pending or terms.min_ack_pending) and policy is not PriorityPolicy.OVERFLOW:
        raise PullRefused(NOT_OVERFLOW)
    if terms.pin_id and policy is not PriorityPolicy.PINNED_CLIENT:
        raise PullRefused(NOT_PINNED)
    if not 0 <= terms.priority <= MAX_PRIORITY:
        raise PullRefused(PRIORITY_RANGE)
    if not settings.active:
        return PullPriority()
    if not terms.group:
        raise PullRefused(GROUP_MISSING)
    if terms.group != settings.group:
        raise PullRefused(GROUP_INVALID)
    if policy is PriorityPolicy.PRIORITIZED:
        return PullPriority(group=terms.group, priority=terms.priority)
    if policy is PriorityPolicy.OVERFLOW:
        return PullPriority(
            group=terms.group,
            min_pending=max(terms.min_pending, 0),
            min_ack_pending=max(terms.min_ack_pending, 0),
        )
    return PullPriority(group=terms.group, pin_id=terms.pin_id or None)
