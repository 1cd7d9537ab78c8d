"""`Runtime`: the serve root under its old name, for code and tests that build one process with
every service (app/roots/ has one root per process kind)."""

from __future__ import annotations

from app.roots.serve import ServeRoot as Runtime

__all__ = ["Runtime"]
