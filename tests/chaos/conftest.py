"""`pytest tests/chaos --chaos-minutes 30 [--chaos-seed N]`: the large run through pytest."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--chaos-minutes", type=float, default=None, help="chaos run length")
    parser.addoption("--chaos-seed", type=int, default=None, help="chaos run seed")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    minutes = config.getoption("--chaos-minutes")
    if minutes is not None:  # the run, its drain and its set-up, past the default run's mark
        for item in items:
            # prepended: the closest mark wins over the test's own mark for the one-minute run
            item.add_marker(pytest.mark.timeout(minutes * 60 + 900), append=False)
