"""The `sweeper` process: lapsed leases, retries, vacuums and redrives."""

from __future__ import annotations

from app.config import Config
from app.services.redrives import RedriveService
from app.services.retention import RetentionService
from app.services.sweeping import SweepService
from app.sweeper.partitions import PartitionRunner, period_for
from app.sweeper.redrives import RedriveRunner
from app.sweeper.runner import Sweeper

from .process import Process


def sweep_service(process: Process) -> SweepService:
    config = process.config
    return SweepService(
        process.db,
        config.broker.retry_policy,
        config.pull.sweep_batch_size,
        process.advisories,
        process.metrics.transition,
        tokens=process.tokens,
    )


def start_sweeping(process: Process, sweeps: SweepService, redrives: RedriveService) -> None:
    """The sweeper's and the redrive runner's loops, until the process stops."""
    config = process.config
    sweeper = Sweeper(
        sweeps,
        config.broker.rational_delay_seconds,
        vacuum_interval_seconds=config.pull.vacuum_interval_seconds,
        vacuum_min_dead_jobs=config.pull.vacuum_min_dead_jobs,
        observe_run=process.metrics.swept,
    )
    process.spawn(sweeper.run, "sweeper")
    process.spawn(RedriveRunner(redrives).run, "redrives")
    if process.db.dialect == "postgresql":
        interval = config.database.partition_interval_seconds
        period = period_for(interval)
        retention = RetentionService(
            process.db,
            interval,
            config.pipeline.retention_days,
            hold_seconds=2 * period,
            observe_states=process.metrics.partitions_counted,
        )
        process.spawn(PartitionRunner(retention, period).run, "partitions")


class SweeperRoot(Process):
    sweeps: SweepService
    redrives: RedriveService

    def __init__(self, config: Config) -> None:
        # Nothing waits here for a wake-up; lapsed leases are advised on a NATS link of its own.
        super().__init__(config, listen=False, nats_advisories=True)
        self.sweeps = sweep_service(self)
        self.redrives = RedriveService(self.db, self.metrics.transition)

    def _run(self) -> None:
        start_sweeping(self, self.sweeps, self.redrives)
