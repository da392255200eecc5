"""The pytest front door: one test per configuration of a user's workload, on the warm rank pool.

Usage (any test file of the user's; the plugin is loaded with the project)::

    from harness.parity import parity_test
    from my_workloads import resmlp

    @parity_test(resmlp, k="not hybrid_shard", declared=Declared(recipe="bf16-reduce32"))
    def test_resmlp_trains_like_ddp(parity):
        assert parity.passed, parity.explanation     # parity: runner.Outcome (result, records)

Why a decorator on the test and a ``parity`` fixture: the decorator marks the test with the
workload's spec (``parity_workload`` marker); ``pytest_generate_tests`` expands it into one test
per configuration (ids are the configuration ids, so ``pytest -k fsdp2`` selects as ``make parity
-k`` does; configurations that cannot run here are skipped with the reason); the configurations
of a module's selected tests run once, in a few rank calls on the session's pool, and each test
reads its own outcome. Each test carries the parity metrics as JUnit properties
(``parity.status``, ``parity.first_diverging_step``, ``parity.worst``, ...). A workload that
cannot be used fails collection with the checks' message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

MARKER = "parity_workload"
_SECONDS_PER_CONFIG = 60.0
_BATCH = 16


def parity_test(
    workload: str | Callable[..., Any],
    *,
    k: str = "",
    world_size: int = 2,
    backend: str = "gloo",
    declared: Any = None,
    scale: Any = None,
    mesh: Any = None,
    ground_truth: bool = False,
) -> Callable[[Any], Any]:
    """Expand the decorated test (which takes the ``parity`` fixture) over ``workload``'s matrix.

    ``workload``: a module-level factory, a ``module:function`` spec or a registered name; ``k``
    narrows the configurations (``-k`` grammar); ``declared``: what the user trains with beyond the
    workload's own declaration, a ``Declared`` (``harness.parity.plan.matrices.workload``: the
    precision recipe, the clip, accumulation and sync mode, checkpointing, the resume step; the
    CLI's ``--recipe``, ``--clip``, ``--accumulate``, ``--sync``, ``--checkpoint``,
    ``--resume-at``); ``scale``: the candidate's ``Scale`` (``--scaler``); ``mesh``: a ``Mesh`` with
    ``tp`` for the workload's 2-D matrix instead (``--tp``: FSDP2 + TP of that degree over its
    ``tp_plan``, and HSDP), which needs ``world_size=4`` or more, or a ``Mesh(dims=(("dp", 2),
    ("tp", 2)))`` for a workload with its own ``parallelize`` (``--mesh dp=2,tp=2``), or a
    ``Mesh(pp=2, schedule="1f1b", microbatches=4)`` for its pipeline rows under that schedule
    (``--pp 2 --schedule 1f1b``); ``ground_truth``: each test also
    fails when its split does not compute the whole batch's gradient (``--ground-truth``:
    ``parity.result.semantics``)."""
    import pytest

    from harness.parity.plan.config import Mesh, Scale
    from harness.parity.plan.matrices.declared import Declared
    from harness.parity.workload import registry

    for name, value, kind in (
        ("declared", declared, Declared),
        ("scale", scale, Scale),
        ("mesh", mesh, Mesh),
    ):
        if value is not None and not isinstance(value, kind):
            raise TypeError(f"parity_test({name}=...) takes a {kind.__name__}, got {value!r}")
    if not isinstance(ground_truth, bool):
        raise TypeError(f"parity_test(ground_truth=...) takes True or False, got {ground_truth!r}")
    tp = mesh.tp if mesh is not None else None
    dims = mesh.words() if mesh is not None and mesh.dims is not None else None
    pp = (mesh.pp, mesh.schedule, mesh.microbatches) if mesh is not None and mesh.pp is not None else None
    if pp is not None and (pp[0] < 2 or world_size % pp[0]):
        raise ValueError(
            f"parity_test(mesh=Mesh(pp={pp[0]})) runs a pipeline: it needs at least 2 stages and a world_size "
            f"they divide, got world_size={world_size}; e.g. parity_test(workload, mesh=Mesh(pp=2, "
            "schedule='1f1b'), world_size=2)"
        )
    if (
        mesh is not None
        and dims is None
        and pp is None
        and (tp is None or tp < 1 or world_size < 4 or world_size % tp)
    ):
        raise ValueError(
            f"parity_test(mesh=Mesh(tp={tp})) runs a 2-D mesh: it needs a TP degree and world_size=4 or "
            f"more that it divides, got world_size={world_size}; e.g. parity_test(workload, "
            "mesh=Mesh(tp=2), world_size=4)"
        )

    spec = registry.spec_of(workload)
    mark = pytest.mark.parity_workload(
        spec,
        k=k,
        world_size=world_size,
        backend=backend,
        declared=declared or Declared(),
        scale=scale or Scale(),
        tp=tp,
        pp=pp,
        mesh=dims,
        ground_truth=ground_truth,
    )
    return mark


# -- what a test reads --------------------------------------------------------------------------------
def junit_properties(result: Any) -> list[tuple[str, str]]:
    """A configuration's metrics as JUnit properties (``parity.status``, ``parity.profile``, ...):
    what CI dashboards show next to each parity test without opening parity.json."""
    from harness.parity.report import render

    worst = "-"
    if result.worst is not None:
        worst = f"step {result.worst.step}, {result.worst.describe()}"
    candidate = result.curves.get("candidate")
    properties = [
        ("parity.configuration", result.config.id),
        ("parity.status", render.label(result)),
        ("parity.profile", result.profile),
        ("parity.max_loss_diff", repr(result.max_loss_diff)),
        (
            "parity.first_diverging_step",
            "-" if result.first_diverging_step is None else str(result.first_diverging_step),
        ),
        ("parity.worst", worst),
        ("parity.skipped_steps", ",".join(map(str, result.skipped_steps)) or "-"),
        ("parity.measured", result.closeness or "-"),
        ("parity.localized", result.localization.describe() if result.localization is not None else "-"),
        ("parity.causes", ",".join(cause.name for cause in result.causes) or "-"),
        ("parity.time_s", f"{result.time_s:.3f}"),
    ]
    if candidate is not None and candidate.scale:
        properties += [
            ("parity.final_loss", repr(candidate.loss[-1][0])),
            ("parity.final_scale", repr(candidate.scale[-1])),
        ]
    return properties


def ranks_executor(ranks: Any) -> Any:
    """A runner executor on the session's warm pool (the ``ranks``/``module_ranks`` fixtures)."""
    from harness.outcome import RankFailure
    from harness.parity.doors import runner

    def execute(
        batch: list[Any], backend: str, world_size: int, target: str = runner.RANK_TARGET
    ) -> list[list[Any]]:
        deadline = 30.0 + _SECONDS_PER_CONFIG * len(batch)
        try:
            return ranks.run(
                runner.rank_function(target),
                batch,
                world_size=world_size,
                backend=backend,
                deadline=deadline,
                collective_timeout=_SECONDS_PER_CONFIG,
            )
        except RankFailure as failure:
            raise runner.BatchFailed(str(failure)) from failure

    return execute


def gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
