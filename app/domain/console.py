"""The operator console's rules that need no database: what a job search may ask for, how a
payload matches it, and the records the console's overview and audit log are made of."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from app.domain.errors import InvalidInput
from app.domain.jobs import JobStatus
from app.domain.models import Breaker, ClaimedJob

PAGE_SIZE = 50
# A payload search reads at most this many jobs of the window per page: a search over a
# 10M-row table costs a bounded read, and the page says how far it got.
SCAN_ROWS = 5_000
# A field search parses payloads, so it reads at most this many bytes of them per page or bulk
# action, newest first (and the one that crosses it): the page says where it stopped.
PAYLOAD_BUDGET = 32 * 1024 * 1024
# A bulk action acts on at most this many jobs; the confirmation says so when there are more.
BULK_LIMIT = 10_000
DEFAULT_WINDOW = timedelta(hours=24)
# The longest window a payload search may read (job rows are not indexed by payload).
MAX_SEARCH_WINDOW = timedelta(days=31)
MAX_TEXT = 200


@dataclass(frozen=True, slots=True)
class PayloadQuery:
    """`field=value` (a JSON payload whose dotted field equals the value) or plain text the
    payload contains."""

    text: str
    field: tuple[str, ...] = ()

    @property
    def needle(self) -> bytes:
        """Bytes every matching payload holds: the database narrows the rows with it, and
        matches() settles a field query."""
        return self.text.encode()

    def matches(self, payload: bytes) -> bool:
        if self.needle not in payload:
            return False
        if not self.field:
            return True
        try:
            value: object = json.loads(payload)
        except (ValueError, RecursionError):
            # RecursionError: nesting deeper than the parser goes is not a match, not an error.
            return False
        for part in self.field:
            if isinstance(value, dict) and part in value:
                value = value[part]
            elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
                value = value[int(part)]
            else:
                return False
        if isinstance(value, str):
            return value == self.text
        return json.dumps(value, separators=(",", ":")) == self.text


def parse_payload_query(raw: str | None) -> PayloadQuery | None:
    text = (raw or "").strip()
    if not text:
        return None
    if len(text) > MAX_TEXT:
        raise InvalidInput(f"a payload search is at most {MAX_TEXT} characters")
    name, sep, value = text.partition("=")
    if sep and name.strip() and all(p.strip() for p in name.split(".")):
        if " " in name.strip():
            return PayloadQuery(text)
        field = tuple(p.strip() for p in name.strip().split("."))
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        if not value:
            raise InvalidInput("field=value needs a value")
        return PayloadQuery(value, field)
    return PayloadQuery(text)


@dataclass(frozen=True, slots=True)
class JobFilter:
    """Which of a consumer's jobs: `status`, reached its status in [since, until), by message
    id, with at least `min_attempts` attempts, and a payload search."""

    status: JobStatus | None = JobStatus.DEAD
    since: datetime | None = None
    until: datetime | None = None
    message_id: str | None = None
    min_attempts: int | None = None
    payload: PayloadQuery | None = None

    @property
    def redrivable(self) -> str | None:
        """Why a redrive cannot cover exactly this filter (None: it can). A redrive selects by
        status and time only (app/services/redrives.py)."""
        if self.status not in (JobStatus.DEAD, JobStatus.DELIVERED):
            return "a redrive moves DEAD or DELIVERED jobs: choose one of those statuses"
        if self.message_id or self.min_attempts or self.payload:
            return "a redrive selects by status and time only: clear the other fields"
        return None

    def query(self) -> dict[str, str]:
        """The filter as the job list's query parameters (links, forms)."""
        out: dict[str, str] = {"status": self.status.value if self.status else "ANY"}
        if self.since:
            out["since"] = self.since.isoformat()
        if self.until:
            out["until"] = self.until.isoformat()
        if self.message_id:
            out["message_id"] = self.message_id
        if self.min_attempts:
            out["min_attempts"] = str(self.min_attempts)
        if self.payload:
            if self.payload.field:
                out["payload"] = ".".join(self.payload.field) + "=" + self.payload.text
            else:
                out["payload"] = self.payload.text
        return out


def _moment(name: str, raw: str | None) -> datetime | None:
    text = (raw or "").strip()
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
        # <input type=datetime-local> sends no offset; the console shows times in UTC.
        return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    except ValueError:
        raise InvalidInput(f"{name} must be a date and time (2026-11-26T18:00)") from None
    except OverflowError:
        # An offset can carry a time at either end of the calendar past it (0001-01-01+01:00).
        raise InvalidInput(f"{name} is outside the years 1 to 9999 in UTC") from None


def parse_job_filter(
    status: str | None = None,
    since: str | None = None,
    until: str | None = None,
    message_id: str | None = None,
    min_attempts: str | None = None,
    payload: str | None = None,
    *,
    now: datetime | None = None,
) -> JobFilter:
    raw_status = (status or "DEAD").strip().upper()
    if raw_status == "ANY":
        parsed_status: JobStatus | None = None
    else:
        try:
            parsed_status = JobStatus(raw_status)
        except ValueError:
            names = ", ".join(s.value for s in JobStatus)
            raise InvalidInput(f"status must be ANY or one of {names}") from None
    start, end = _moment("since", since), _moment("until", until)
    if start is not None and end is not None and start >= end:
        raise InvalidInput("since must be before until")
    attempts: int | None = None
    if min_attempts and min_attempts.strip():
        try:
            attempts = int(min_attempts)
        except ValueError:
            raise InvalidInput("attempts must be a whole number") from None
        if not 0 <= attempts <= 2**31 - 1:
            raise InvalidInput("attempts must be zero or more")
    query = parse_payload_query(payload)
    if query is not None:
        # A payload search reads rows, so it is held to a window (the last day by default).
        moment = now or datetime.now(UTC)
        end_at = end or moment
        try:
            start = start or end_at - DEFAULT_WINDOW
        except OverflowError:
            raise InvalidInput("until is too early for a payload search's window") from None
        if end_at - start > MAX_SEARCH_WINDOW:
            raise InvalidInput(f"a payload search covers at most {MAX_SEARCH_WINDOW.days} days")
    text_id = (message_id or "").strip() or None
    if text_id is not None and len(text_id) > 255:
        raise InvalidInput("a message id is at most 255 characters")
    return JobFilter(parsed_status, start, end, text_id, attempts or None, query)


@dataclass(frozen=True, slots=True)
class ConsumerRow:
    """One consumer on the overview, read from the counters (job_count), its push state and
    its pin, in one statement."""

    pk: int
    channel_id: str
    consumer_id: str
    type: str
    queued: int
    due: int  # counted up to DUE_CAP
    inflight: int
    delivered: int
    dead: int
    oldest_due_at: datetime | None
    breaker: Breaker | None  # None: a pull consumer, or a push one that never failed
    disabled: bool
    open_until: datetime | None
    priority_group: str | None
    priority_policy: str
    pinned_id: str | None
    pinned_at: datetime | None
    paused_until: datetime | None = None  # claims and pushes stop until then (a pause)


DUE_CAP = 1000


@dataclass(frozen=True, slots=True)
class AuditEntry:
    id: int
    at: datetime
    role: str
    session: str
    action: str
    target: str
    jobs: int | None
    detail: str


@dataclass(frozen=True, slots=True)
class SearchPage:
    """A page of a job search: its jobs, newest first; `next_before` continues it (None: no
    more); `scanned` rows of the window were read for a payload search. Its messages carry no
    payload (b""): the list shows none, and the job page reads its own."""

    jobs: list[ClaimedJob]
    next_before: int | None
    scanned: int = 0


@dataclass(frozen=True, slots=True)
class Actor:
    """Who acts in the console: the role its session signed in as, and the session's id (never
    the token)."""

    role: str  # admin | reader
    session: str

    @property
    def can_act(self) -> bool:
        return self.role == "admin"
