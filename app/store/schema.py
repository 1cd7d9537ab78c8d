"""Tables (SQLAlchemy Core) and the indexes that serve the hot paths; Alembic's target."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

from app.store.types import Timestamp

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

# SQLite only auto-increments INTEGER PRIMARY KEY; BIGINT stays BIGINT on PostgreSQL.
BigId = BigInteger().with_variant(Integer(), "sqlite")

channel = Table(
    "channel",
    metadata,
    Column("id", String(255), primary_key=True),
    Column("name", String(255), nullable=False),
    Column("token", String(255), nullable=False),
    Column("created_at", Timestamp(), nullable=False),
    Column("updated_at", Timestamp(), nullable=False),
    # Bumped by each consumer's creation (the delivery ledger, migration 0008).
    Column("generation", BigInteger(), nullable=False, server_default="0"),
)

# Secrets of the installation (migration 0011): the key channel and producer tokens are hashed
# with, unless [http] token-hash-key gives one.
broker_secret = Table(
    "broker_secret",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("value", String(255), nullable=False),
)

producer = Table(
    "producer",
    metadata,
    Column("id", String(255), primary_key=True),
    Column("name", String(255), nullable=False),
    Column("token", String(255), nullable=False),
    Column("created_at", Timestamp(), nullable=False),
    Column("updated_at", Timestamp(), nullable=False),
)

consumer = Table(
    "consumer",
    metadata,
    Column("pk", BigId, primary_key=True, autoincrement=True),
    Column("channel_id", String(255), ForeignKey("channel.id", ondelete="CASCADE"), nullable=False),
    Column("consumer_id", String(255), nullable=False),
    Column("name", String(255), nullable=False),
    Column("token", String(255), nullable=False),
    Column("callback_url", Text(), nullable=False, server_default=""),
    Column("type", String(8), nullable=False, server_default="push"),
    Column("ack_wait_seconds", Integer(), nullable=True),
    Column("max_ack_pending", Integer(), nullable=True),
    # Priority groups (app/domain/priority.py; migration 0004): one group, its policy, and the
    # pin timeout of a pinned_client consumer (NULL: the default).
    Column("priority_group", String(16), nullable=True),
    Column("priority_policy", String(16), nullable=False, server_default="none"),
    Column("priority_timeout_seconds", Integer(), nullable=True),
    Column("created_at", Timestamp(), nullable=False),
    Column("updated_at", Timestamp(), nullable=False),
    # Push (migration 0007): the Standard Webhooks secret, the one it replaced while the
    # rotation's overlap lasts, and the consumer's own limits (NULL: the config's default).
    Column("signing_secret", String(128), nullable=True),
    Column("previous_signing_secret", String(128), nullable=True),
    Column("previous_secret_until", Timestamp(), nullable=True),
    Column("max_in_flight", Integer(), nullable=True),
    Column("rate_limit", Float(), nullable=True),
    # The delivery ledger (migration 0008): the channel generation the consumer was created in
    # (it is owed every publish counted under it or later) and the jobs it held when counting
    # began.
    Column("ledger_from", BigInteger(), nullable=False, server_default="0"),
    Column("ledger_opening", BigInteger(), nullable=False, server_default="0"),
    # Set by consumer management over NATS (migration 0013; NULL: the broker's default):
    # deliveries before the dead letters (-1: no limit), waiting pulls allowed, the ack wait
    # of each delivery in seconds (JSON list), a description, metadata (JSON object) and the
    # deliver policy it was created with.
    Column("max_deliver", Integer(), nullable=True),
    Column("max_waiting", Integer(), nullable=True),
    Column("backoff", JSON(), nullable=True),
    Column("description", Text(), nullable=True),
    Column("metadata", JSON(), nullable=True),
    Column("deliver_policy", String(32), nullable=True),
    # Migration 0014: ephemeral (made without a durable name), 'none' to acknowledge nothing
    # (NULL: explicit), deleted by the sweeper `inactive_threshold` ns after `last_active_at`
    # (the bridge's last pull request, delivery or ack; NULL: never expires).
    Column("ephemeral", Boolean(), nullable=False, server_default=false()),
    Column("ack_policy", String(16), nullable=True),
    Column("inactive_threshold", BigInteger(), nullable=True),
    Column("last_active_at", Timestamp(), nullable=True),
    # Migration 0016: a push consumer over NATS (NULL deliver_subject: pulled).
    Column("deliver_subject", String(255), nullable=True),
    Column("deliver_group", String(255), nullable=True),
    Column("idle_heartbeat", BigInteger(), nullable=True),
    Column("flow_control", Boolean(), nullable=False, server_default=false()),
    # Migration 0015: claims and pushes stop until then (NULL or past: running).
    Column("paused_until", Timestamp(), nullable=True),
    # Migration 0017: the next message pk to copy while the consumer's history is being
    # backfilled (NULL: live, publishes fan out to it), its start options, mem_storage asked.
    Column("backfill_next", BigInteger(), nullable=True),
    Column("opt_start_seq", BigInteger(), nullable=True),
    Column("opt_start_time", Timestamp(), nullable=True),
    Column("mem_storage", Boolean(), nullable=False, server_default=false()),
    # Migration 0019: the switch to live whose racing publishes are still made up
    # (app/store/backfill.py; NULL switched_at: none): the lowest message pk such a publish
    # can hold, the publishes counted before ledger_from at the switch plus those made up.
    Column("switched_at", Timestamp(), nullable=True),
    Column("switch_from", BigInteger(), nullable=True),
    Column("switch_counted", BigInteger(), nullable=True),
    UniqueConstraint("channel_id", "consumer_id"),
    Index(
        "ix_consumer_inactive",
        "inactive_threshold",
        postgresql_where=text("inactive_threshold IS NOT NULL"),
        sqlite_where=text("inactive_threshold IS NOT NULL"),
    ),
    Index(
        "ix_consumer_backfill",
        "backfill_next",
        postgresql_where=text("backfill_next IS NOT NULL"),
        sqlite_where=text("backfill_next IS NOT NULL"),
    ),
    Index(
        "ix_consumer_switched_at",
        "switched_at",
        postgresql_where=text("switched_at IS NOT NULL"),
        sqlite_where=text("switched_at IS NOT NULL"),
    ),
)

# What dispatchers learn while pushing (migration 0007): disabled by a 410, and the circuit
# breaker (closed -> open after consecutive failures -> half_open for one probe). A row per
# consumer from its first failure; each change one conditional statement (app/store/push_state).
push_state = Table(
    "push_state",
    metadata,
    Column(
        "consumer_pk", BigInteger(), ForeignKey("consumer.pk", ondelete="CASCADE"), primary_key=True
    ),
    Column("disabled_at", Timestamp(), nullable=True),
    Column("disabled_reason", Text(), nullable=True),
    Column("breaker", String(16), nullable=False, server_default="closed"),
    Column("failures", Integer(), nullable=False, server_default="0"),
    Column("trips", Integer(), nullable=False, server_default="0"),
    Column("open_until", Timestamp(), nullable=True),
    Column("changed_at", Timestamp(), nullable=False),
    CheckConstraint("breaker IN ('closed', 'open', 'half_open')", name="breaker"),
)

# The pin of a pinned_client consumer's group (migration 0004): which client holds it, since
# when, and when it last pulled (the pin lapses priority_timeout_seconds after that). One row
# per consumer, made when it is first pinned; the database settles which process pins.
consumer_group_state = Table(
    "consumer_group_state",
    metadata,
    Column(
        "consumer_pk",
        BigInteger(),
        ForeignKey("consumer.pk", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("group_name", String(16), nullable=False),
    Column("pinned_id", String(32), nullable=True),
    Column("pinned_at", Timestamp(), nullable=True),
    Column("last_pull_at", Timestamp(), nullable=True),
)

message = Table(
    "message",
    metadata,
    Column("pk", BigId, primary_key=True, autoincrement=True),
    Column("channel_id", String(255), ForeignKey("channel.id", ondelete="CASCADE"), nullable=False),
    Column("message_id", String(255), nullable=False),
    Column("producer_id", String(255), ForeignKey("producer.id"), nullable=False),
    Column("payload", LargeBinary(), nullable=False),
    Column("content_type", String(255), nullable=False),
    Column("priority", Integer(), nullable=False, server_default="0"),
    Column("headers", JSON(), nullable=False),
    Column("received_at", Timestamp(), nullable=False),
    # A scheduled message's jobs fall due then (X-Broker-Scheduled-For); NULL: at once.
    Column("scheduled_for", Timestamp(), nullable=True),
    # The per-channel message id, the producer's idempotency key, is unique in message_key.
    Index("ix_message_channel_id_pk", "channel_id", "pk"),
    # Scheduled messages only (few): their listing and the SCHEDULED count.
    Index(
        "ix_message_scheduled",
        "channel_id",
        "scheduled_for",
        postgresql_where=text("scheduled_for IS NOT NULL"),
        sqlite_where=text("scheduled_for IS NOT NULL"),
    ),
    # PostgreSQL: ranges of pks, one [rdbms] partition-interval each, beside the job table's
    # (migration 0020_message_partitions; app/store/partitions.py).
    postgresql_partition_by="RANGE (pk)",
)

# The producer's message id per channel (migration 0020): the publish's duplicate check and the
# way from a message id to its message. Apart from message, whose unique keys would have to
# include its partition key: here it stays unique over every partition. No foreign key points
# at message (migration 0021, where the why is): a key and a message's jobs leave in the
# statement that deletes the message.
message_key = Table(
    "message_key",
    metadata,
    Column("channel_id", String(255), primary_key=True),
    Column("message_id", String(255), primary_key=True),
    Column("message_pk", BigInteger(), nullable=False),
    Index("ix_message_key_message_pk", "message_pk"),  # a partition's keys, before its detach
)

job = Table(
    "job",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("message_pk", BigInteger(), nullable=False),  # no foreign key: migration 0021
    Column(
        "consumer_pk", BigInteger(), ForeignKey("consumer.pk", ondelete="CASCADE"), nullable=False
    ),
    Column("status", String(16), nullable=False),
    Column("priority", Integer(), nullable=False, server_default="0"),
    Column("payload_size", Integer(), nullable=False, server_default="0"),
    Column("attempt", Integer(), nullable=False, server_default="0"),
    Column("retry_count", Integer(), nullable=False, server_default="0"),
    Column("timeout_count", Integer(), nullable=False, server_default="0"),
    Column("incremental_timeout", Integer(), nullable=False, server_default="0"),
    Column("lease_expires_at", Timestamp(), nullable=True),
    Column("earliest_next_attempt_at", Timestamp(), nullable=False),
    Column("claimed_at", Timestamp(), nullable=True),
    Column("status_changed_at", Timestamp(), nullable=False),
    Column("created_at", Timestamp(), nullable=False),
    Column("dead_reason", Text(), nullable=True),
    Column("last_error", Text(), nullable=True),
    # Migration 0015: the last attempts, oldest first (app/store/attempts.py).
    Column("attempts", JSON().with_variant(JSONB(), "postgresql"), nullable=True),
    # Sweep path: expired leases, smallest first.
    Index(
        "ix_job_sweep",
        "lease_expires_at",
        postgresql_where=text("status = 'INFLIGHT'"),
        sqlite_where=text("status = 'INFLIGHT'"),
    ),
    # Per-consumer listings by status (DLQ, in-flight counts) and a message's jobs.
    Index("ix_job_consumer_status", "consumer_pk", "status", "id"),
    Index("ix_job_message_pk", "message_pk"),
    # PostgreSQL: ranges of ids, one [rdbms] partition-interval each (migration
    # 0018_job_partitions; app/store/partitions.py). Each partition leaves half of each page
    # free for its rows' next versions (migration 0009_job_fillfactor).
    postgresql_partition_by="RANGE (id)",
)
JOB_PARTITION_WITH = {"fillfactor": "50"}  # each partition's storage parameters


def _partition_states(name: str) -> Table:
    """A partitioned table's partitions and where each is in its retention (PostgreSQL only,
    empty on SQLite): ATTACHED -> EXPORTED (archived and read back) -> DETACHED -> DROPPED.
    lower_id NULL: from the smallest id."""
    return Table(
        name,
        metadata,
        Column("name", String(63), primary_key=True),
        Column("lower_id", BigInteger(), nullable=True),
        Column("upper_id", BigInteger(), nullable=False),
        Column("opened_at", Timestamp(), nullable=True),
        Column("closed_at", Timestamp(), nullable=True),
        Column("status", String(16), nullable=False, server_default="ATTACHED"),
        Column("exported_rows", BigInteger(), nullable=True),
        Column("changed_at", Timestamp(), nullable=False),
        CheckConstraint("status IN ('ATTACHED', 'EXPORTED', 'DETACHED', 'DROPPED')", name="status"),
    )


job_partition = _partition_states("job_partition")  # migration 0018
message_partition = _partition_states("message_partition")  # migration 0020

# Jobs per (consumer, status): +1 / -1 added by triggers on job in the statement that inserts,
# moves or deletes a job (migration 0006_job_counts, where the why is), summed over `shard`.
# No foreign key: a consumer's deletion cascades to its jobs, whose triggers net its rows to 0.
job_count = Table(
    "job_count",
    metadata,
    Column("consumer_pk", BigInteger(), primary_key=True),
    Column("status", String(16), primary_key=True),
    Column("shard", Integer(), primary_key=True),
    Column("n", BigInteger(), nullable=False),
)

# The delivery ledger (migration 0008, where the why is; app/store/ledger.py): publishes per
# (channel, generation), and jobs deleted on purpose per consumer, each summed over `shard`.
# No foreign keys: a publish or a removal never waits on a lock of the row it counts for.
published_count = Table(
    "published_count",
    metadata,
    Column("channel_id", String(255), primary_key=True),
    Column("generation", BigInteger(), primary_key=True),
    Column("shard", Integer(), primary_key=True),
    Column("n", BigInteger(), nullable=False),
)
job_removed = Table(
    "job_removed",
    metadata,
    Column("consumer_pk", BigInteger(), primary_key=True),
    Column("shard", Integer(), primary_key=True),
    Column("n", BigInteger(), nullable=False),
)

# A redrive moves a consumer's DEAD (or DELIVERED, to replay) jobs back to QUEUED in the
# background, a chunk at a time at `per_second` (app/services/redrives.py). `cursor` is the last
# job id moved; jobs above `upper_id` (made after the redrive began) are not its business.
redrive = Table(
    "redrive",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column(
        "consumer_pk", BigInteger(), ForeignKey("consumer.pk", ondelete="CASCADE"), nullable=False
    ),
    Column("from_status", String(16), nullable=False),
    Column("changed_since", Timestamp(), nullable=True),
    Column("changed_until", Timestamp(), nullable=True),
    Column("per_second", Integer(), nullable=False),
    Column("status", String(16), nullable=False),
    Column("total", BigInteger(), nullable=False),
    Column("moved", BigInteger(), nullable=False, server_default="0"),
    Column("cursor", BigInteger(), nullable=False, server_default="0"),
    Column("upper_id", BigInteger(), nullable=False),
    Column("next_chunk_at", Timestamp(), nullable=False),
    Column("created_at", Timestamp(), nullable=False),
    Column("finished_at", Timestamp(), nullable=True),
    CheckConstraint("status IN ('RUNNING', 'COMPLETED', 'CANCELLED')", name="status"),
    Index("ix_redrive_consumer_pk_id", "consumer_pk", "id"),
    # The runner's look-up: running ones, soonest chunk first.
    Index(
        "ix_redrive_due",
        "next_chunk_at",
        postgresql_where=text("status = 'RUNNING'"),
        sqlite_where=text("status = 'RUNNING'"),
    ),
)

# The operator console's audit log (migration 0012_console_audit; app/ui): every action taken
# there, by which role and session, on what, and how many jobs it touched.
console_audit = Table(
    "console_audit",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("at", Timestamp(), nullable=False),
    Column("role", String(16), nullable=False),
    Column("session", String(32), nullable=False),
    Column("action", String(32), nullable=False),
    Column("target", Text(), nullable=False),
    Column("jobs", BigInteger(), nullable=True),
    Column("detail", Text(), nullable=False, server_default=""),
)

# Claim path: one range scan over a consumer's queued jobs in delivery order (priority
# descending, then oldest first), so the claim never sorts.
Index(
    "ix_job_claim",
    job.c.consumer_pk,
    job.c.priority.desc(),
    job.c.id,
    postgresql_where=text("status = 'QUEUED'"),
    sqlite_where=text("status = 'QUEUED'"),
)

# -- archive state of the Spark pipeline (app/pipeline; migration 0002_pipeline) -------------
# A batch moves PLANNED -> EXPORTED -> DELETED. Its member messages are frozen at planning,
# with a fingerprint of their jobs, so the delete only removes messages whose jobs did not move.
archive_batch = Table(
    "archive_batch",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("status", String(16), nullable=False),
    Column("cutoff", Timestamp(), nullable=False),
    Column("message_count", Integer(), nullable=False, server_default="0"),
    Column("job_count", Integer(), nullable=False, server_default="0"),
    Column("first_message_pk", BigInteger(), nullable=True),
    Column("last_message_pk", BigInteger(), nullable=True),
    Column("deleted_message_count", Integer(), nullable=False, server_default="0"),
    Column("deleted_job_count", Integer(), nullable=False, server_default="0"),
    Column("kept_message_count", Integer(), nullable=False, server_default="0"),
    # False while the Parquet files still hold kept (not deleted) messages.
    Column("finalized", Boolean(), nullable=False, server_default=false()),
    Column("planned_at", Timestamp(), nullable=False),
    Column("exported_at", Timestamp(), nullable=True),
    Column("deleted_at", Timestamp(), nullable=True),
    CheckConstraint("status IN ('PLANNED', 'EXPORTED', 'DELETED')", name="status"),
    Index("ix_archive_batch_status", "status"),
)

archive_batch_message = Table(
    "archive_batch_message",
    metadata,
    Column(
        "batch_id",
        BigInteger(),
        ForeignKey("archive_batch.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    # No foreign key: the point of a batch is to delete these messages.
    Column("message_pk", BigInteger(), primary_key=True),
    Column("job_count", Integer(), nullable=False),
    Column("jobs_hash", String(32), nullable=False),
    Column("kept", Boolean(), nullable=False, server_default=false()),
)

# -- NATS bridge (migration 0002_bridge) -- BEGIN bridge tables ---------------------------------
# Per pull consumer: the last delivery handed out (CONSUMER.INFO `delivered`, heartbeats);
# `last_delivery_seq` is also the counter the claim numbers deliveries from (migration 0003).
bridge_consumer = Table(
    "bridge_consumer",
    metadata,
    Column(
        "consumer_pk",
        BigInteger(),
        ForeignKey("consumer.pk", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("last_delivery_seq", BigInteger(), nullable=False, server_default="0"),
    Column("last_stream_seq", BigInteger(), nullable=False, server_default="0"),
    Column("last_delivered_at", Timestamp(), nullable=True),
)
# -- END bridge tables --------------------------------------------------------------------------
