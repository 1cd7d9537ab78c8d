"""What the rest of the code gets: one frozen dataclass per section, and Config holding them.

Every field that a key fills defaults to that key's parsed default in the table (keys.default),
so tests and tools can build one from a few fields and no default is written twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from app.config.keys import default
from app.domain.jobs import RetryPolicy
from app.domain.models import ConsumerType
from app.domain.priority import NO_PRIORITY, PrioritySettings


def pool_sizes(idle: int, most: int) -> tuple[int, int]:
    """The Go original's idle/open connection pair, as SQLAlchemy's pool size and overflow."""
    return min(idle, most), max(0, most - idle)


_POOL = pool_sizes(default("rdbms", "max-idle-connxns"), default("rdbms", "max-open-connxns"))


@dataclass(frozen=True, slots=True)
class DatabaseConfig:
    dialect: str = default("rdbms", "dialect")
    connection_url: str = default("rdbms", "connection-url")
    # [rdbms] max-idle-connxns and max-open-connxns, as pool_sizes folds them.
    pool_size: int = _POOL[0]
    max_overflow: int = _POOL[1]
    pool_recycle_seconds: int = default("rdbms", "connxn-max-lifetime-seconds")
    pool_max_idle_seconds: int = default("rdbms", "connxn-max-idle-time-seconds")
    replica_url: str = default("rdbms", "replica-url")
    replica_max_lag_seconds: float = default("rdbms", "replica-max-lag")
    partition_interval_seconds: float = default("rdbms", "partition-interval")

    @property
    def replica(self) -> DatabaseConfig | None:
        """The replica as a database of its own (the primary's pool sizes), or None: none
        configured, or SQLite, which has no replicas."""
        if not self.replica_url or self.dialect != "postgresql":
            return None
        return replace(self, connection_url=self.replica_url, replica_url="")

    @property
    def sqlalchemy_url(self) -> str:
        if self.dialect == "sqlite":
            return f"sqlite+aiosqlite:///{self.connection_url}"
        rest = self.connection_url.split("://", 1)[1]
        return f"postgresql+psycopg://{rest}"

    def __repr__(self) -> str:
        # A PostgreSQL URL may hold a password (in its user part or as ?password=): never shown.
        where = repr(self.connection_url) if self.dialect == "sqlite" else "<redacted>"
        replica = "<redacted>" if self.replica_url else "none"
        return f"DatabaseConfig(dialect={self.dialect!r}, url={where}, replica={replica})"


_LISTENER: tuple[str, int] = default("http", "listener")


@dataclass(frozen=True, slots=True)
class HttpConfig:
    # [http] listener, split in two.
    host: str = _LISTENER[0]
    port: int = _LISTENER[1]
    read_timeout: int = default("http", "read-timeout")
    write_timeout: int = default("http", "write-timeout")
    admin_token: str = default("http", "admin-token")
    read_header_timeout: int = default("http", "read-header-timeout")
    max_concurrency: int = default("http", "max-concurrency")
    max_body_bytes: int = default("http", "max-body-bytes")
    reader_token: str = default("http", "reader-token")
    allow_anonymous_admin: bool = default("http", "allow-anonymous-admin")
    anonymous_reads: bool = default("http", "anonymous-reads")
    token_hash_key: str = default("http", "token-hash-key")

    @property
    def loopback(self) -> bool:
        """Whether the listener is reachable from this machine only."""
        return is_loopback_host(self.host)

    @property
    def guarded_reads(self) -> bool:
        """Whether reads (lists, messages, job counts) need a credential."""
        return bool(self.admin_token or self.reader_token) and not self.anonymous_reads

    def __repr__(self) -> str:
        return f"HttpConfig(host={self.host!r}, port={self.port}, tokens=<redacted>)"


def is_loopback_host(host: str) -> bool:
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class LogConfig:
    filename: str = default("log", "filename")
    level: str = default("log", "log-level")
    format: str = default("log", "log-format")


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    max_workers: int = default("broker", "max-workers")
    max_retry: int = default("broker", "max-retry")
    rational_delay_seconds: int = default("broker", "rational-delay-in-seconds")
    retry_backoff_delays: tuple[int, ...] = default("broker", "retry-backoff-delays-in-seconds")
    max_message_size_bytes: int = default("broker", "max-message-size-bytes")

    @property
    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(self.max_retry, self.retry_backoff_delays)


@dataclass(frozen=True, slots=True)
class ConsumerConnectionConfig:
    token_header_name: str = default("consumer-connection", "token-header-name")
    user_agent: str = default("consumer-connection", "user-agent")
    connection_timeout_seconds: int = default(
        "consumer-connection", "connection-timeout-in-seconds"
    )


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    listener: tuple[str, int] | None = default("metrics", "listener")


@dataclass(frozen=True, slots=True)
class PushConfig:
    max_in_flight: int = default("push", "max-in-flight")
    retry_after_max_seconds: int = default("push", "retry-after-max-seconds")
    breaker_failures: int = default("push", "breaker-failures")
    breaker_cooldown_seconds: int = default("push", "breaker-cooldown")
    signing_secret_overlap_seconds: int = default("push", "signing-secret-overlap")
    deny_callback_networks: tuple[str, ...] = default("push", "deny-callback-networks")
    deny_private_callbacks: bool = default("push", "deny-private-callbacks")
    allow_callback_networks: tuple[str, ...] = default("push", "allow-callback-networks")
    max_response_bytes: int = default("push", "max-response-bytes")


@dataclass(frozen=True, slots=True)
class PullConfig:
    max_batch: int = default("pull", "max-batch")
    max_stream_batch: int = default("pull", "max-stream-batch")
    max_expires_seconds: int = default("pull", "max-expires-seconds")
    max_waiting: int = default("pull", "max-waiting")
    sweep_batch_size: int = default("pull", "sweep-batch-size")
    # The sweeper looks this often (0: never) whether this many row versions of the job table
    # are dead, and vacuums it: claims walk the dead index entries their predecessors left
    # until a vacuum.
    vacuum_interval_seconds: int = default("pull", "vacuum-interval-seconds")
    vacuum_min_dead_jobs: int = default("pull", "vacuum-min-dead-jobs")
    max_waiting_total: int = default("pull", "max-waiting-total")
    max_stream_buffer_bytes: int = default("pull", "max-stream-buffer-bytes")


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    """[pipeline]: the Spark archive and report jobs (docs/pipeline.md)."""

    archive_root: str = default("pipeline", "archive-root")
    report_root: str = default("pipeline", "report-root")
    retention_days: int = default("pipeline", "retention-days")
    terminal_statuses: tuple[str, ...] = default("pipeline", "terminal-statuses")
    batch_size: int = default("pipeline", "batch-size")
    max_batches: int = default("pipeline", "max-batches")  # 0: until nothing is left
    jdbc_partitions: int = default("pipeline", "jdbc-partitions")
    jdbc_fetch_size: int = default("pipeline", "jdbc-fetch-size")
    jdbc_jar: str = default("pipeline", "jdbc-jar")
    master: str = default("pipeline", "master")  # empty: spark-submit's master, else local[*]
    shuffle_partitions: int = default("pipeline", "shuffle-partitions")
    niceness: int = default("pipeline", "niceness")
    replica_wait_seconds: float = default("pipeline", "replica-wait")


@dataclass(frozen=True, slots=True)
class UiConfig:
    enabled: bool = default("ui", "enabled")
    attempts_kept: int = default("ui", "attempts-kept")


@dataclass(frozen=True, slots=True)
class GatewayAuthConfig:
    mode: str = default("gateway-auth", "mode")
    hmac_shared_secret: bytes = default("gateway-auth", "hmac-shared-secret")
    hmac_timestamp_tolerance_seconds: int = default(
        "gateway-auth", "hmac-timestamp-tolerance-seconds"
    )
    auth_exempt_paths: tuple[str, ...] = default("gateway-auth", "auth-exempt-paths")
    require_v2: bool = default("gateway-auth", "require-v2")
    reject_replays: bool = default("gateway-auth", "reject-replays")

    @property
    def enabled(self) -> bool:
        return self.mode == "hmac"

    def __repr__(self) -> str:
        return f"GatewayAuthConfig(mode={self.mode!r}, secret=<redacted>)"


@dataclass(frozen=True, slots=True)
class NatsConfig:
    """mode=client: one client connection, acks under ack-prefix (any NATS server).
    mode=hybrid: the client connection answers the API; a leafnode connection to leaf-url
    delivers with `$JS.ACK.` replies (msg.metadata works) and receives the acks."""

    mode: str = default("nats", "mode")
    url: str = default("nats", "url")
    # A [nats] section was given (file or environment): API processes and sweepers then
    # publish their advisories (pins, lapsed leases) to `url` too.
    configured: bool = False
    leaf_url: str = default("nats", "leaf-url")
    api_prefix: str = default("nats", "api-prefix")
    ack_prefix: str = default("nats", "ack-prefix")
    queue_group: str = default("nats", "queue-group")
    allow_consumer_management: bool = default("nats", "allow-consumer-management")
    user: str = default("nats", "user")
    password: str = default("nats", "password")
    token: str = default("nats", "token")
    credentials: str = default("nats", "credentials")
    leaf_user: str = default("nats", "leaf-user")
    leaf_password: str = default("nats", "leaf-password")
    leaf_token: str = default("nats", "leaf-token")
    tls_ca_file: str = default("nats", "tls-ca-file")
    tls_cert_file: str = default("nats", "tls-cert-file")
    tls_key_file: str = default("nats", "tls-key-file")


@dataclass(frozen=True, slots=True)
class SeedConsumer:
    id: str
    channel_id: str
    name: str
    token: str
    callback_url: str
    type: ConsumerType
    ack_wait_seconds: int | None
    max_ack_pending: int | None
    priority: PrioritySettings = NO_PRIORITY


@dataclass(frozen=True, slots=True)
class SeedStakeholder:
    id: str
    name: str
    token: str


@dataclass(frozen=True, slots=True)
class SeedData:
    channels: tuple[SeedStakeholder, ...] = ()
    producers: tuple[SeedStakeholder, ...] = ()
    consumers: tuple[SeedConsumer, ...] = ()
    # Why each seeded consumer that is not created was left out (the pull consumer spec: an
    # invalid type= skips that consumer only); the seeding logs each as an error.
    skipped: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Config:
    # Config() is what an empty file loads: every section at the table's defaults.
    database: DatabaseConfig = field(default_factory=DatabaseConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    log: LogConfig = field(default_factory=LogConfig)
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    consumer_connection: ConsumerConnectionConfig = field(default_factory=ConsumerConnectionConfig)
    pull: PullConfig = field(default_factory=PullConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    push: PushConfig = field(default_factory=PushConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    nats: NatsConfig = field(default_factory=lambda: NatsConfig())
    gateway_auth: GatewayAuthConfig = field(default_factory=GatewayAuthConfig)
    ui: UiConfig = field(default_factory=UiConfig)
    min_schedule_delay_minutes: int = default("scheduler", "min-schedule-delay-minutes")
    seed: SeedData = field(default_factory=SeedData)
    sources: tuple[str, ...] = ()
    # "[section] key" of every key that was set but has no effect here (not implemented, or in
    # an ignored section of the Go original); the process entry point logs them as unused.
    ignored_keys: tuple[str, ...] = ()

    @property
    def default_ack_wait_seconds(self) -> int:
        """The seed spec's job timeout: stopTimeout (connection timeout) + rationalDelay."""
        return (
            self.consumer_connection.connection_timeout_seconds + self.broker.rational_delay_seconds
        )
