"""Counters kept as rows that several connections add to (job_count, published_count,
job_removed): on PostgreSQL each connection adds to its own row, one of COUNTER_SHARDS per key,
so concurrent writers never queue on one row lock, and readers sum the shards.

Migration 0006_job_counts wrote the same number into the job count triggers (a migration keeps
the values it was written with)."""

from __future__ import annotations

COUNTER_SHARDS = 64
