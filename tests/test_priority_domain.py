"""The pure rules of priority groups: consumer settings and a pull request's terms, checked as
nats-server checks them (its error codes and status texts)."""

from __future__ import annotations

import pytest

from app.domain.errors import InvalidInput
from app.domain.priority import (
    GROUP_INVALID,
    GROUP_MISSING,
    NO_TERMS,
    NOT_OVERFLOW,
    NOT_PINNED,
    PRIORITY_RANGE,
    PriorityConfigError,
    PriorityPolicy,
    PrioritySettings,
    PullPriority,
    PullRefused,
    check_pull,
    parse_policy,
    priority_settings,
)

P = PriorityPolicy


@pytest.mark.parametrize(
    ("groups", "policy", "timeout", "pull", "err_code"),
    [
        (["jobs"], P.OVERFLOW, None, False, 10178),
        ([], P.OVERFLOW, None, True, 10159),
        ([""], P.PRIORITIZED, None, True, 10161),
        (["no spaces"], P.PRIORITIZED, None, True, 10162),
        (["x" * 17], P.PRIORITIZED, None, True, 10162),
        (["a", "b"], P.OVERFLOW, None, True, None),
        (["jobs"], P.NONE, None, True, 10196),
        ([], P.NONE, 30, True, 10197),
    ],
)
def test_settings_nats_server_refuses_are_refused_with_its_codes(
    groups: list[str], policy: PriorityPolicy, timeout: int | None, pull: bool, err_code: int | None
) -> None:
    with pytest.raises(PriorityConfigError) as caught:
        priority_settings(groups, policy, timeout, pull=pull)
    assert caught.value.err_code == err_code


def test_settings_that_hold() -> None:
    assert priority_settings([], P.NONE, None, pull=False) == PrioritySettings()
    pinned = priority_settings(["a/b_c=d-1"], P.PINNED_CLIENT, 30, pull=True)
    assert (pinned.group, pinned.policy, pinned.timeout()) == ("a/b_c=d-1", P.PINNED_CLIENT, 30)
    assert priority_settings(["g"], P.PINNED_CLIENT, None, pull=True).timeout() == 120
    with pytest.raises(InvalidInput, match="pinned_client policy only"):
        priority_settings(["g"], P.OVERFLOW, 30, pull=True)


def test_only_the_timeout_changes_after_creation() -> None:
    existing = PrioritySettings("g", P.PINNED_CLIENT, 30)
    assert (
        priority_settings(["g"], P.PINNED_CLIENT, 60, pull=True, existing=existing).timeout() == 60
    )
    for groups, policy in ((["h"], P.PINNED_CLIENT), (["g"], P.OVERFLOW), ([], P.NONE)):
        with pytest.raises(PriorityConfigError):
            priority_settings(groups, policy, None, pull=True, existing=existing)


def test_policy_names() -> None:
    assert parse_policy(None) is P.NONE
    assert parse_policy(" Overflow ") is P.OVERFLOW
    with pytest.raises(InvalidInput, match="priorityPolicy must be one of"):
        parse_policy("failover")


@pytest.mark.parametrize(
    ("policy", "terms", "refusal"),
    [
        (P.OVERFLOW, PullPriority(), GROUP_MISSING),
        (P.OVERFLOW, PullPriority(group="other"), GROUP_INVALID),
        (P.PRIORITIZED, PullPriority(group="g", priority=10), PRIORITY_RANGE),
        (P.PRIORITIZED, PullPriority(group="g", priority=-1), PRIORITY_RANGE),
        (P.OVERFLOW, PullPriority(group="g", pin_id="x"), NOT_PINNED),
        (P.NONE, PullPriority(group="g", pin_id="x"), NOT_PINNED),
        (P.NONE, PullPriority(min_pending=1), NOT_OVERFLOW),
        (P.PRIORITIZED, PullPriority(group="g", min_ack_pending=-1), NOT_OVERFLOW),
        (P.NONE, PullPriority(priority=10), PRIORITY_RANGE),
        # the server's order: the overflow fields before the pin id, both before the group
        (P.PINNED_CLIENT, PullPriority(min_pending=1, pin_id="x"), NOT_OVERFLOW),
        (P.OVERFLOW, PullPriority(pin_id="x"), NOT_PINNED),
    ],
)
def test_pull_terms_refused(policy: PriorityPolicy, terms: PullPriority, refusal: str) -> None:
    settings = PrioritySettings("g" if policy is not P.NONE else None, policy)
    with pytest.raises(PullRefused) as caught:
        check_pull(settings, terms)
    assert caught.value.description == refusal


def test_pull_terms_keep_what_the_policy_uses() -> None:
    overflow = PullPriority(group="g", min_pending=5, min_ack_pending=2, priority=3)
    assert check_pull(PrioritySettings(), PullPriority(group="g", priority=3)) == PullPriority()
    assert check_pull(PrioritySettings("g", P.OVERFLOW), overflow) == PullPriority(
        group="g", min_pending=5, min_ack_pending=2
    )
    assert check_pull(
        PrioritySettings("g", P.PRIORITIZED), PullPriority(group="g", priority=3)
    ) == PullPriority(group="g", priority=3)
    # A body that is not JSON passes every check, and comes last among prioritized requests.
    assert check_pull(PrioritySettings("g", P.OVERFLOW), NO_TERMS) is NO_TERMS
    assert NO_TERMS.rank > PullPriority(priority=9).rank


@pytest.mark.parametrize(
    ("min_pending", "min_ack_pending", "pending", "ack_pending", "served"),
    [
        (0, 0, 0, 0, True),
        (5, 0, 4, 100, False),
        (5, 0, 5, 0, True),
        (0, 2, 100, 1, False),
        (0, 2, 0, 2, True),
        (5, 2, 4, 2, True),
        (5, 2, 4, 1, False),
    ],
)
def test_overflow_condition(
    min_pending: int, min_ack_pending: int, pending: int, ack_pending: int, served: bool
) -> None:
    terms = PullPriority(group="g", min_pending=min_pending, min_ack_pending=min_ack_pending)
    assert terms.overflows(pending, ack_pending) is served
