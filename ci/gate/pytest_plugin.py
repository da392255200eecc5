"""``pytest -p ci.gate.pytest_plugin --parity-reports DIR``: the parity reports of a pytest session.

Why a plugin and not a second run: the parity suites (``suites/parity``) already train every
configuration of the tier, on the session's warm ranks, for their tests; running
``python -m harness.parity`` as well would train each one twice. This plugin collects what the
suites computed - each module's ``parity_outcomes`` fixture value - and, at the end of the
session, writes ``parity.json``, ``parity.md`` and (unless ``--parity-reports-no-plot``)
``parity.png`` with the parity engine's own renderers, for the configurations the session selected:
those skipped at collection become ``skip`` rows with their reason, those whose module run failed
become ``error`` rows.

Writers live on the controller only (as pytest's junitxml does): under pytest-xdist each worker
would hold part of the outcomes, so the option is refused there.
"""

from __future__ import annotations

import datetime
import json
import time
from pathlib import Path
from typing import Any

import pytest

from harness.parity.judge import result as results
from harness.parity.judge.result import ParityResult
from harness.parity.plan.config import ParityConfig, unsupported_reason
from harness.parity.report import markdown, render

_FIXTURE = "parity_outcomes"
_PARAM = "parity_config"
writer_key = pytest.StashKey["ParityReportWriter"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("shardscale")
    group.addoption(
        "--parity-reports",
        metavar="DIR",
        default=None,
        help="write parity.json, parity.md and parity.png for the parity configurations this session ran",
    )
    group.addoption(
        "--parity-reports-no-plot",
        action="store_true",
        default=False,
        help="with --parity-reports: do not draw parity.png",
    )


def pytest_configure(config: pytest.Config) -> None:
    folder = config.getoption("parity_reports")
    if folder is None:
        return
    if hasattr(config, "workerinput") or config.getoption("numprocesses", None):
        raise pytest.UsageError(
            "--parity-reports needs every parity outcome in one process; run without pytest-xdist (-n)"
        )
    writer = ParityReportWriter(Path(folder), plot=not config.getoption("parity_reports_no_plot"))
    config.stash[writer_key] = writer
    config.pluginmanager.register(writer, "shardscale-parity-reports")


def pytest_unconfigure(config: pytest.Config) -> None:
    writer = config.stash.get(writer_key, None)
    if writer is not None:
        del config.stash[writer_key]
        config.pluginmanager.unregister(writer)


class ParityReportWriter:
    """Collects parity results during the session and writes the reports at its end."""

    def __init__(self, folder: Path, *, plot: bool) -> None:
        self.folder = folder
        self.plot = plot
        self.selected: dict[str, ParityConfig] = {}
        self.skip_reasons: dict[str, str] = {}
        self.results: dict[str, ParityResult] = {}
        self.started = time.monotonic()

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        for item in session.items:
            callspec = getattr(item, "callspec", None)
            if callspec is None or _PARAM not in callspec.params:
                continue
            config = callspec.params[_PARAM]
            self.selected.setdefault(config.id, config)
            skip = item.get_closest_marker("skip")
            if skip is not None:
                self.skip_reasons.setdefault(config.id, skip.kwargs.get("reason", "skipped"))

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> Any:
        value = yield
        if fixturedef.argname == _FIXTURE and isinstance(value, dict):
            for config_id, outcome in value.items():
                self.results.setdefault(config_id, outcome.result)  # the verdict and curves, not the records
        return value

    def collected(self) -> list[ParityResult]:
        """One result per selected configuration, in collection order."""
        rows = []
        for config_id, config in self.selected.items():
            found = self.results.get(config_id)
            if found is None:
                reason = self.skip_reasons.get(config_id) or unsupported_reason(config)
                found = (
                    results.skipped(config, reason)
                    if reason
                    else results.failed_batch(
                        config, "its module's parity run did not finish (see its tests)"
                    )
                )
            rows.append(found)
        return rows

    def run_metadata(self, config: pytest.Config, rows: list[ParityResult]) -> dict[str, Any]:
        import torch

        backends = sorted({r.config.backend for r in rows})
        sizes = sorted({r.config.world_size for r in rows})
        return {
            "backend": backends[0] if len(backends) == 1 else backends,
            "world_size": sizes[0] if len(sizes) == 1 else sizes,
            "scaler": config.getoption("scaler", "ours"),
            "filter": config.getoption("keyword") or "",
            "torch": torch.__version__,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "wall_s": round(time.monotonic() - self.started, 2),
            "source": "pytest " + " ".join(str(arg) for arg in config.args),
        }

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        rows = self.collected()
        if not rows:
            return
        run = self.run_metadata(session.config, rows)
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "parity.json").write_text(json.dumps(render.to_json(rows, run), indent=1) + "\n")
        (self.folder / "parity.md").write_text(markdown.render_markdown(rows, run))
        if self.plot:
            try:
                from harness.parity.report.plot import render_png
            except ImportError:  # pragma: no cover - depends on the environment
                return
            render_png(rows, self.folder / "parity.png")
