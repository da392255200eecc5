"""Options of the project's own suites."""

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("shardscale").addoption(
        "--scaler",
        choices=("ours", "torch"),
        default="ours",
        help="the scaler the parity suites' candidates use: ours, or torch's ShardedGradScaler "
        "(its known failures are then expected failures)",
    )
