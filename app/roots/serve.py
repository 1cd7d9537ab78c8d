"""The `serve` process: the API, the sweeper and the push dispatcher in one process."""

from __future__ import annotations

from app.config import Config
from app.services.push import PushService
from app.services.sweeping import SweepService

from .api import ApiRoot
from .dispatcher import push_service, start_dispatching
from .sweeper import start_sweeping, sweep_service


class ServeRoot(ApiRoot):
    """The API's services, with the sweeper's loops when `run_sweeper` and the dispatcher's
    when `run_dispatcher` (tests build one with either, both or neither: app.runtime.Runtime)."""

    run_sweeper: bool
    run_dispatcher: bool
    sweeps: SweepService
    push: PushService

    def __init__(
        self,
        config: Config,
        *,
        run_sweeper: bool = False,
        run_dispatcher: bool = False,
        listen: bool = True,
        nats_advisories: bool = False,
    ) -> None:
        super().__init__(config, listen=listen, nats_advisories=nats_advisories)
        self.run_sweeper = run_sweeper
        self.run_dispatcher = run_dispatcher
        self.sweeps = sweep_service(self)
        self.push = push_service(self)

    def _run(self) -> None:
        if self.run_sweeper:
            start_sweeping(self, self.sweeps, self.redrives)
        if self.run_dispatcher:
            start_dispatching(self, self.push)
