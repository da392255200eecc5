"""pytest hooks and fixtures of the parity front door (``testing.parity_test``); registered by the
harness plugin (``harness.frontends.plugin``) on the process that runs tests.

Kept apart from ``testing.py`` so that importing ``parity_test`` needs no hook machinery, and from
``harness.frontends.plugin`` so that a session without parity tests imports nothing of the engine.
"""

from __future__ import annotations

from typing import Any

import pytest

from harness.parity.doors.testing import _BATCH, MARKER, gpus, junit_properties, ranks_executor


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(spec, k='', world_size=2, backend='gloo', declared=Declared(), scale=Scale(), tp=None, pp=None): one test per parity "
        "configuration of the workload (use harness.parity.parity_test)",
    )


def _configs(spec: str, options: dict[str, Any]) -> list[Any]:
    """The workload's configurations the marker selects; a collection error naming the fix if the
    workload cannot be used."""
    from harness.parity.plan.config import Scale
    from harness.parity.plan.matrices import pipeline as pipeline_matrix
    from harness.parity.plan.matrices import two_d as two_d_matrix
    from harness.parity.plan.matrices import workload as workload_matrix
    from harness.parity.plan.matrices.declared import Declared
    from harness.parity.plan.select import ExpressionError, select
    from harness.parity.workload import checks, registry
    from harness.parity.workload.spec import WorkloadError

    k = options.get("k", "")
    problem = None
    try:
        checks.check(registry.get(spec))
        tp = options.get("tp")
        if tp is not None:  # the 2-D matrix (``--tp``): its plan checked against the model first
            from harness.parity.workload import tp_plan

            workload = registry.get(spec)
            tp_plan.resolve(workload, registry.build_model(workload, 0))
        scale = options.get("scale") or Scale()
        pipeline = options.get("pp")
        matrix = (
            pipeline_matrix.rows(
                spec,
                world_size=options.get("world_size", 2),
                backend=options.get("backend", "gloo"),
                scale=scale,
                pp=pipeline[0],
                schedules=(pipeline[1],),
                microbatches=pipeline[2],
            )
            if pipeline is not None
            else two_d_matrix.rows(
                spec,
                world_size=options.get("world_size", 4),
                backend=options.get("backend", "gloo"),
                scale=scale,
                tp=tp,
            )
            if tp is not None
            else workload_matrix.for_workload(
                spec,
                world_size=options.get("world_size", 2),
                backend=options.get("backend", "gloo"),
                scale=scale,
                declared=options.get("declared") or Declared(),
                mesh=options.get("mesh"),
            )
        )
        configs = select(matrix, k)
    except (WorkloadError, ExpressionError) as error:
        problem = f"parity_test({spec!r}): {error}"
    if problem is not None:  # failed outside the except block: no chained traceback in the report
        pytest.fail(problem, pytrace=False)
    if not configs:
        pytest.fail(f"parity_test({spec!r}, k={k!r}) selects no configuration", pytrace=False)
    return configs


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker(MARKER)
    if marker is None:
        return
    if "parity" not in metafunc.fixturenames:
        pytest.fail(
            f"{metafunc.function.__name__} is decorated with parity_test but takes no 'parity' argument; "
            f"write def {metafunc.function.__name__}(parity): ...",
            pytrace=False,
        )
    from harness.parity.judge.result import expected_failure
    from harness.parity.plan.config import unsupported_reason

    available = gpus()
    params = []
    for config in _configs(marker.args[0], marker.kwargs):
        marks = [pytest.mark.gpu] if config.backend == "nccl" else []
        reason = unsupported_reason(config, gpus=available)
        if reason:
            marks.append(pytest.mark.skip(reason=reason))
        failure = expected_failure(config)
        if failure:
            marks.append(pytest.mark.xfail(strict=True, reason=failure))
        params.append(pytest.param(config, id=config.id, marks=marks))
    metafunc.parametrize("parity", params, indirect=True)


@pytest.fixture(scope="module")
def _parity_workload_outcomes(request: pytest.FixtureRequest, module_ranks: Any) -> dict[str, Any]:
    """``{config id: Outcome}`` for every selected ``parity`` test of the module, run together."""
    from harness.parity.doors import runner

    wanted: dict[str, Any] = {}
    truth: set[str] = set()  # the configurations whose test asked for the ground truth
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if item.module is request.module and callspec is not None and "parity" in callspec.params:
            if item.get_closest_marker("skip") is None:
                config = callspec.params["parity"]
                wanted.setdefault(config.id, config)
                marker = item.get_closest_marker(MARKER)
                if marker is not None and marker.kwargs.get("ground_truth"):
                    truth.add(config.id)
    outcomes = (
        runner.run(
            [config for config in wanted.values() if config.id in truth],
            ranks_executor(module_ranks),
            gpus=gpus(),
            batch_size=_BATCH,
            ground_truth=True,
        )
        if truth
        else []
    )
    outcomes += runner.run(
        [config for config in wanted.values() if config.id not in truth],
        ranks_executor(module_ranks),
        gpus=gpus(),
        batch_size=_BATCH,
    )
    return {outcome.result.config.id: outcome for outcome in outcomes}


@pytest.fixture
def parity(request: pytest.FixtureRequest, _parity_workload_outcomes: dict[str, Any]) -> Any:
    """This test's configuration's ``runner.Outcome``: ``.passed``, ``.explanation``, ``.result``
    (``harness.parity.judge.result.ParityResult``), ``.reference`` and ``.candidate`` (the records)."""
    config = getattr(request, "param", None)
    if config is None:
        pytest.fail(
            "the parity fixture is for tests decorated with harness.parity.parity_test", pytrace=False
        )
    found = _parity_workload_outcomes[config.id]
    request.node.user_properties.extend(junit_properties(found.result))
    if found.result.status == "error":
        pytest.fail(f"{config.id}: {found.result.reason}", pytrace=False)
    return found
