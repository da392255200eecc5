"""How the parity suites run: each module lists its configurations in ``CONFIGS``; every test that
takes ``parity_config`` is parametrized over them (ids are the configurations' ids, skips decided
at collection, torch's known failures marked ``xfail(strict=True)``), and the module-scoped
``parity_outcomes`` fixture runs the selected configurations once, on the warm pool, in a few rank
calls, for all of the module's tests to read.

A module may set ``SCALER_PINNED = True`` to keep each configuration's own scaler under
``--scaler torch`` (the side-by-side module runs both scalers on purpose), and ``KEEP_TENSORS =
True`` when its tests read the full tensors of every step (the records otherwise hold them only
for the steps the known causes read: ``ranks/measure/stepcheck.py``).

A module may define ``tier(config) -> str | None``: the marker of the tier that runs a row instead
of ``make test`` (``"world_sizes"``: ``make world-sizes``), or None for a row of ``make test``. Why:
a row that is slow on two cores and whose behaviour ``make test`` already holds through a fixed
sample of its kind moves to its tier whole, every test of it, so each row still runs in exactly
one CI job. It is asked of the module's own configuration (before ``--scaler`` rewrites it).
"""

from __future__ import annotations

import pytest

from harness.parity.doors import runner
from harness.parity.judge.result import expected_failure
from harness.parity.plan.config import ParityConfig, unsupported_reason
from suites.parity.support import junit_properties, ranks_executor

_BATCH = 16


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _configs(module, option: str) -> list[tuple[ParityConfig, ParityConfig]]:
    """``(the module's configuration, the one to run)`` pairs: the latter under ``--scaler``."""
    if option != "ours" and not getattr(module, "SCALER_PINNED", False):
        return [(c, c.with_(scaler=option)) for c in module.CONFIGS]
    return [(c, c) for c in module.CONFIGS]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "parity_config" not in metafunc.fixturenames:
        return
    gpus = _gpus()
    params = []
    tier = getattr(metafunc.module, "tier", None)
    for own, config in _configs(metafunc.module, metafunc.config.getoption("scaler")):
        marks = []
        moved_to = tier(own) if tier is not None else None
        if moved_to is not None:
            marks.append(getattr(pytest.mark, moved_to))
        if config.backend == "nccl":
            marks.append(pytest.mark.gpu)
        reason = unsupported_reason(config, gpus=gpus)
        if reason:
            marks.append(pytest.mark.skip(reason=reason))
        failure = expected_failure(config)
        if failure and not getattr(metafunc.function, "unaffected_by_expected_failures", False):
            marks.append(pytest.mark.xfail(strict=True, reason=failure))
        params.append(pytest.param(config, id=config.id, marks=marks))
    metafunc.parametrize("parity_config", params)


@pytest.fixture(scope="module")
def parity_outcomes(request: pytest.FixtureRequest, module_ranks) -> dict[str, runner.Outcome]:
    """``{config id: Outcome}`` for the configurations this module's selected tests use."""
    wanted: dict[str, ParityConfig] = {}
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if item.module is request.module and callspec is not None and "parity_config" in callspec.params:
            config = callspec.params["parity_config"]
            if item.get_closest_marker("skip") is None:
                wanted.setdefault(config.id, config)
    outcomes = runner.run(
        wanted.values(),
        ranks_executor(module_ranks),
        gpus=_gpus(),
        batch_size=_BATCH,
        keep_tensors=getattr(request.module, "KEEP_TENSORS", False),
    )
    return {outcome.result.config.id: outcome for outcome in outcomes}


@pytest.fixture
def outcome(request: pytest.FixtureRequest, parity_config: ParityConfig, parity_outcomes) -> runner.Outcome:
    """The outcome of this test's configuration; a configuration whose batch failed fails here.
    Its metrics become properties of the test in the JUnit XML (``--junitxml``; valid in the
    ``xunit1`` family, which the CI gate asks for)."""
    found = parity_outcomes[parity_config.id]
    request.node.user_properties.extend(junit_properties(found.result))
    if found.result.status == "error":
        pytest.fail(f"{parity_config.id}: {found.result.reason}", pytrace=False)
    return found
