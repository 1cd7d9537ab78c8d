"""Prometheus metrics of one process (`GET /metrics`).

Built by each process's composition root (app/roots/process.py) with a registry of its own, so
two roots in one process (tests) never share series. Job counts come from the trigger-kept counters
(app/store/job_counts.py), read at most once per JOBS_FOR seconds however often Prometheus
scrapes: a scrape never counts job rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.domain.models import Breaker, LedgerEntry, StatusCount
from app.domain.pulls import PullEnd
from app.services.push import PushTarget

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
JOBS_FOR = 5.0  # seconds a read of the counters serves scrapes
# Seconds, for HTTP requests and push deliveries: from a loopback answer to a timeout.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Snapshot(Collector):
    """Series read from the database, as of the last refresh."""

    def __init__(self, waiting: Callable[[], int]) -> None:
        self.counts: Sequence[StatusCount] = ()
        self.targets: Sequence[PushTarget] = ()
        self.ledger: Sequence[LedgerEntry] = ()
        self.read_at = 0.0
        self.waiting = waiting

    def collect(self) -> Iterator[Metric]:
        jobs = GaugeMetricFamily(
            "webhook_broker_jobs",
            "Jobs by channel, consumer and status (from the trigger-kept counters).",
            labels=["channel", "consumer", "status"],
        )
        oldest = GaugeMetricFamily(
            "webhook_broker_oldest_queued_job_age_seconds",
            "Age of the consumer's oldest QUEUED job (scheduled ones included).",
            labels=["channel", "consumer"],
        )
        now = datetime.now(UTC)
        for c in self.counts:
            jobs.add_metric([c.channel_id, c.consumer_id, c.status], c.count)
            if c.status == "QUEUED" and c.oldest is not None:
                age = max(0.0, (now - c.oldest).total_seconds())
                oldest.add_metric([c.channel_id, c.consumer_id], age)
        yield jobs
        yield oldest
        breaker = GaugeMetricFamily(
            "webhook_broker_push_breaker_open",
            "1 while a push consumer's circuit breaker is open or probing, else 0.",
            labels=["channel", "consumer"],
        )
        disabled = GaugeMetricFamily(
            "webhook_broker_push_disabled",
            "1 while push is off for a consumer (a 410, or a PUT with enabled=false).",
            labels=["channel", "consumer"],
        )
        for t in self.targets:
            labels = [t.consumer.channel_id, t.consumer.id]
            breaker.add_metric(labels, 0 if t.state.breaker is Breaker.CLOSED else 1)
            disabled.add_metric(labels, 0 if t.state.disabled_at is None else 1)
        yield breaker
        yield disabled
        yield from self._ledger()
        waiting = GaugeMetricFamily(
            "webhook_broker_pulls_waiting",
            "Long polls and streaming pulls waiting for jobs in this process.",
        )
        waiting.add_metric([], self.waiting())
        yield waiting

    def _ledger(self) -> Iterator[Metric]:
        published = GaugeMetricFamily(
            "webhook_broker_ledger_published_jobs",
            "Jobs a consumer is owed: messages published to its channel since it was created"
            " (published x fan-out, per consumer), plus those it held when counting began.",
            labels=["channel", "consumer"],
        )
        removed = GaugeMetricFamily(
            "webhook_broker_ledger_removed_jobs",
            "A consumer's jobs deleted on purpose: DLQ purges and deletes, cancelled scheduled"
            " messages, archived jobs.",
            labels=["channel", "consumer"],
        )
        unaccounted = GaugeMetricFamily(
            "webhook_broker_ledger_unaccounted_jobs",
            "published - removed - (delivered + dead + inflight + queued, scheduled included),"
            " read in one snapshot: 0 when the ledger adds up; above 0, jobs lost; below 0, jobs"
            " made twice.",
            labels=["channel", "consumer"],
        )
        for entry in self.ledger:
            labels = [entry.channel_id, entry.consumer_id]
            published.add_metric(labels, entry.published)
            removed.add_metric(labels, entry.removed)
            unaccounted.add_metric(labels, entry.unaccounted)
        yield published
        yield removed
        yield unaccounted


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.snapshot = Snapshot(lambda: 0)
        self.registry.register(self.snapshot)
        self.requests = Counter(
            "webhook_broker_http_requests",
            "HTTP requests answered, by method, route and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.request_seconds = Histogram(
            "webhook_broker_http_request_duration_seconds",
            "Time to answer an HTTP request (a long poll's wait included), by route.",
            ["method", "route"],
            registry=self.registry,
            buckets=LATENCY_BUCKETS,
        )

        self.push_deliveries = Counter(
            "webhook_broker_push_deliveries",
            "Push deliveries by outcome: delivered, failed, deferred (429/503 with Retry-After),"
            " gone (410), refused (a link-local callback).",
            ["outcome"],
            registry=self.registry,
        )
        self._pushed_by_outcome: dict[str, Counter] = {}
        self.push_rounds = Counter(
            "webhook_broker_push_dispatch_rounds",
            "Rounds of the push dispatcher through the push consumers, each claiming what was"
            " due for them (it grows while a dispatcher runs, busy or idle).",
            registry=self.registry,
        )
        self.push_seconds = Histogram(
            "webhook_broker_push_delivery_duration_seconds",
            "Time from sending a push to its answer (or failure).",
            registry=self.registry,
            buckets=LATENCY_BUCKETS,
        )

        self.transitions = Counter(
            "webhook_broker_transitions",
            "Job transitions made by this process, by kind: publish (jobs made), claim, ack,"
            " nak, term, progress, lease_expiry_requeue, dead_letter, redrive.",
            ["kind"],
            registry=self.registry,
        )

        self.pull_waits = Histogram(
            "webhook_broker_pull_wait_seconds",
            "Time a pull request waited in this process, from its arrival to its end, by"
            " transport (http: long polls and streams; nats: the bridge's JetStream pull"
            " requests) and how it ended (filled, delivered, expired, no_messages,"
            " consumer_deleted, dropped, ...: for nats, the status the client was sent).",
            ["transport", "outcome"],
            registry=self.registry,
            buckets=(0.001, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
        )
        self.pull_jobs = Counter(
            "webhook_broker_pull_jobs",
            "Jobs handed to waiting pull requests, by transport.",
            ["transport"],
            registry=self.registry,
        )

        self.sweeps = Histogram(
            "webhook_broker_sweeper_run_duration_seconds",
            "Sweeper runs (requeue of expired leases) and how long each took; its _count is"
            " the runs (an alert fires when it stops growing).",
            registry=self.registry,
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30),
        )

        self.statements = Histogram(
            "webhook_broker_statement_duration_seconds",
            "The queue's hot statements (claim, ack, publish), as this process waited for them.",
            ["statement"],
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5),
        )

        self.replica_lag = Gauge(
            "webhook_broker_replica_lag_seconds",
            "How far the [rdbms] replica-url replica was behind the primary at its last check"
            " (NaN while it is unreachable or not a standby; a lower bound while beyond the"
            " samples kept).",
            registry=self.registry,
        )
        self.replica_lag.set(float("nan"))
        self.partitions = Gauge(
            "webhook_broker_partitions",
            "Partitions of the job and message tables (PostgreSQL) by state: ATTACHED (taking"
            " ids, or closed and kept), EXPORTED (archived), DETACHED, DROPPED; as of the"
            " sweeper's last partition round.",
            ["table", "state"],
            registry=self.registry,
        )
        self.reads = Counter(
            "webhook_broker_reads",
            "Reads that may go to the replica (status, lists, message reads, console pages), by"
            " where they were served: replica or primary.",
            ["source"],
            registry=self.registry,
        )
        self._reads_by_source: dict[str, Counter] = {}
        # Labelled children found once per label set, as in `pushed`: labels() takes a lock
        # and builds a key on every call, on every request's and statement's path. Each
        # cache holds no more than the metric's own series (the children are the same).
        self._request_series: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}
        self._transitions: dict[str, Counter] = {}
        self._statements: dict[str, Histogram] = {}
        self._pull_waits: dict[tuple[str, PullEnd], Histogram] = {}
        self._pull_jobs: dict[str, Counter] = {}

    def read_served(self, source: str) -> None:
        child = self._reads_by_source.get(source)
        if child is None:
            child = self._reads_by_source[source] = self.reads.labels(source)
        child.inc()

    def partitions_counted(self, table: str, states: dict[str, int]) -> None:
        for state, n in states.items():
            self.partitions.labels(table, state).set(n)

    def replica_lag_measured(self, seconds: float | None) -> None:
        self.replica_lag.set(float("nan") if seconds is None else seconds)

    def watch_waiting(self, waiting: Callable[[], int]) -> None:
        self.snapshot.waiting = waiting

    def transition(self, kind: str, count: int) -> None:
        if count:
            child = self._transitions.get(kind)
            if child is None:
                child = self._transitions[kind] = self.transitions.labels(kind)
            child.inc(count)

    def statement(self, name: str, seconds: float) -> None:
        child = self._statements.get(name)
        if child is None:
            child = self._statements[name] = self.statements.labels(name)
        child.observe(seconds)

    def pull_ended(self, transport: str, outcome: PullEnd, seconds: float, jobs: int) -> None:
        key = (transport, outcome)
        wait = self._pull_waits.get(key)
        if wait is None:
            wait = self._pull_waits[key] = self.pull_waits.labels(transport, outcome.name.lower())
        wait.observe(seconds)
        if jobs:
            child = self._pull_jobs.get(transport)
            if child is None:
                child = self._pull_jobs[transport] = self.pull_jobs.labels(transport)
            child.inc(jobs)

    def swept(self, seconds: float) -> None:
        self.sweeps.observe(seconds)

    def pushed(self, outcome: str, seconds: float) -> None:
        # The labelled child found once per outcome: labels() takes a lock and builds a key,
        # per delivery on the dispatcher's hottest path.
        child = self._pushed_by_outcome.get(outcome)
        if child is None:
            child = self._pushed_by_outcome[outcome] = self.push_deliveries.labels(outcome)
        child.inc()
        self.push_seconds.observe(seconds)

    def stale(self) -> bool:
        return time.monotonic() - self.snapshot.read_at >= JOBS_FOR

    def refreshed(
        self,
        counts: Sequence[StatusCount],
        targets: Sequence[PushTarget],
        ledger: Sequence[LedgerEntry],
    ) -> None:
        self.snapshot.counts = counts
        self.snapshot.targets = targets
        self.snapshot.ledger = ledger
        self.snapshot.read_at = time.monotonic()

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        key = (method, route, status)
        series = self._request_series.get(key)
        if series is None:
            series = self._request_series[key] = (
                self.requests.labels(method, route, str(status)),
                self.request_seconds.labels(method, route),
            )
        series[0].inc()
        series[1].observe(seconds)

    def serve(self, host: str, port: int) -> Callable[[], None]:
        """/metrics on its own port, in a thread (processes without an HTTP API); returns the
        function that stops it. The job series are the API processes' (they read the
        database); here: this process's own."""
        server, thread = start_http_server(port, addr=host, registry=self.registry)

        def stop() -> None:
            server.shutdown()
            thread.join(timeout=5)

        return stop

    def render(self) -> bytes:
        return generate_latest(self.registry)
