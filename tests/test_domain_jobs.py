"""The pure job state machine and retry policy (app/domain/jobs.py)."""

from __future__ import annotations

import pytest

from app.domain.errors import InvalidInput, InvalidTransition
from app.domain.jobs import (
    JobStatus,
    RetryPolicy,
    backoff_seconds,
    check_seed_transition,
    parse_next_state,
)

Q, IN, DL, DD = JobStatus.QUEUED, JobStatus.INFLIGHT, JobStatus.DELIVERED, JobStatus.DEAD


# -- backoff -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("retry", "expected"),
    [(1, 5), (2, 30), (3, 60), (4, 120), (5, 180), (6, 240), (10, 480)],
)
def test_backoff_follows_the_design_example(retry: int, expected: int) -> None:
    # DESIGN.md: 5,30,60 gives 5,30,60,120,180...
    assert backoff_seconds((5, 30, 60), retry) == expected


def test_backoff_formula_for_every_retry_and_shape() -> None:
    for delays in [(7,), (1, 2), (5, 30, 60), (3, 3, 3, 10), (2, 4, 8, 16, 32)]:
        length = len(delays)
        for k in range(1, 20):
            expected = delays[k - 1] if k < length else (k - length + 1) * delays[-1]
            assert backoff_seconds(delays, k) == expected, (delays, k)


def test_backoff_with_one_delay_grows_linearly() -> None:
    assert [backoff_seconds((4,), k) for k in range(1, 5)] == [4, 8, 12, 16]


def test_last_listed_delay_is_used_once_before_growing() -> None:
    # k = len(D) is the first "linear" step and must equal D[-1] (1 * D[-1]).
    assert backoff_seconds((1, 2, 9), 3) == 9
    assert backoff_seconds((1, 2, 9), 4) == 18


def test_no_backoff_before_the_first_retry() -> None:
    assert backoff_seconds((5, 30, 60), 0) == 0


def test_retry_policy_delegates_and_counts_retries() -> None:
    policy = RetryPolicy(max_retry=2, backoff_delays=(1, 10))
    assert [policy.backoff(k) for k in (1, 2, 3)] == [1, 10, 20]
    assert not policy.exhausted(0)
    assert not policy.exhausted(1)
    assert policy.exhausted(2)
    assert policy.exhausted(3)
    assert RetryPolicy(max_retry=0, backoff_delays=(1,)).exhausted(0)


# -- the seed API state machine ----------------------------------------------------------------

# The Go original's table (controllers/job_test.go): same state is a no-op, four real moves.
VALID = [(Q, Q), (Q, IN), (IN, IN), (IN, DD), (DD, DD), (DD, IN), (IN, DL), (DL, DL)]
INVALID = [(Q, DL), (Q, DD), (IN, Q), (DD, Q), (DD, DL), (DL, Q), (DL, IN), (DL, DD)]


@pytest.mark.parametrize(("current", "target"), VALID)
def test_valid_seed_transitions(current: JobStatus, target: JobStatus) -> None:
    assert check_seed_transition(current, target, None) is (current is not target)


@pytest.mark.parametrize(("current", "target"), INVALID)
def test_invalid_seed_transitions(current: JobStatus, target: JobStatus) -> None:
    with pytest.raises(InvalidTransition):
        check_seed_transition(current, target, None)


def test_every_pair_is_classified() -> None:
    assert set(VALID) | set(INVALID) == {(a, b) for a in JobStatus for b in JobStatus}
    assert not set(VALID) & set(INVALID)


@pytest.mark.parametrize("current", [Q, DD])
def test_incremental_timeout_allowed_into_inflight_from_queued_or_dead(current: JobStatus) -> None:
    assert check_seed_transition(current, IN, 10) is True


@pytest.mark.parametrize(
    ("current", "target"),
    [(Q, Q), (IN, IN), (IN, DL), (IN, DD), (DD, DD), (DD, DL), (DL, DL), (DL, IN), (Q, DL)],
)
def test_incremental_timeout_refused_elsewhere(current: JobStatus, target: JobStatus) -> None:
    with pytest.raises(InvalidInput, match="IncrementalTimeout"):
        check_seed_transition(current, target, 10)


@pytest.mark.parametrize(("current", "target"), [(IN, IN), (IN, DD), (Q, IN)])
def test_zero_incremental_timeout_counts_as_none(current: JobStatus, target: JobStatus) -> None:
    # The Go original reads it into a uint, so 0 is indistinguishable from "not sent".
    assert check_seed_transition(current, target, 0) is (current is not target)


@pytest.mark.parametrize("name", ["QUEUED", "INFLIGHT", "DELIVERED", "DEAD"])
def test_parse_next_state_accepts_the_status_names(name: str) -> None:
    assert parse_next_state(name) is JobStatus(name)


@pytest.mark.parametrize("value", ["inflight", "invalid-state", "", None, 3, ["DEAD"]])
def test_parse_next_state_refuses_anything_else(value: object) -> None:
    with pytest.raises(InvalidInput):
        parse_next_state(value)
