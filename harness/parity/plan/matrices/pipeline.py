"""The pipeline rows of a workload: FSDP2 + pipeline parallelism under each schedule torch offers
(``--pp N``, ``--schedule``, ``--microbatches``).

Why a matrix of its own: a pipeline needs a workload that can be cut into stages (``pp_split``)
and at least ``pp`` ranks; its axes are the schedules (each orders the microbatches otherwise,
and the zero-bubble ones split the backward in two), the two FSDP2 layouts (resharding after
forward, or keeping the parameters gathered across the microbatches, as torchtitan does under PP),
and the recipes and optimizers of the 2-D rows, plus an inf on one rank so that every stage skips
the step together.
"""

from __future__ import annotations

import dataclasses

from harness.parity.plan.config import Layout, Mesh, ParityConfig, Precision, Scale, unique
from harness.parity.plan.config.mesh import SCHEDULES
from harness.parity.plan.config.scale import DEFAULT_SCALE
from harness.parity.plan.matrices.two_d import FP16_INIT_SCALE, OPTIMIZERS, RECIPES, forced_inf
from harness.parity.workload import registry

LAYOUTS = (False, True)
"""``reshard_after_forward``: keep (torchtitan's choice under PP), then reshard."""


def rows(
    workload: str,
    *,
    world_size: int = 2,
    backend: str = "gloo",
    scale: Scale = DEFAULT_SCALE,
    pp: int = 2,
    schedules: tuple[str, ...] = tuple(SCHEDULES),
    microbatches: int = 4,
    tp: int | None = None,
    steps: int | None = None,
) -> list[ParityConfig]:
    """``workload``'s pipeline rows at ``world_size`` (``pp`` stages x ``world_size // pp`` dp):
    every schedule in ``schedules`` under both layouts, every recipe of the 2-D rows and both
    optimizers, fp16 rows from :data:`FP16_INIT_SCALE`, and per schedule an inf on rank 1 at
    step 1 (bf16, kept layout); with ``tp``, each stage tensor-parallel over ``tp`` ranks too (pp x
    dp x tp). Empty when ``pp`` (times ``tp``) does not divide ``world_size``."""
    spec = registry.get(workload)
    if world_size % (pp * (tp or 1)) or spec.pp_split is None:
        return []
    common = {"engine": "fsdp2", "workload": workload, "world_size": world_size, "backend": backend}
    common["steps"] = steps or spec.steps or 3
    optimizers = ("own",) if spec.optimizer is not None else OPTIMIZERS
    configs = [
        ParityConfig(
            optimizer=optimizer,
            mesh=Mesh(pp=pp, schedule=schedule, microbatches=microbatches, tp=tp),
            layout=Layout(reshard_after_forward=reshard),
            precision=Precision(dtype=precision, recipe=recipe),
            scale=dataclasses.replace(scale, init_scale=FP16_INIT_SCALE if precision == "fp16" else 2.0**16),
            **common,  # type: ignore[arg-type]
        )
        for schedule in schedules
        for reshard in LAYOUTS
        for precision, recipe in RECIPES
        for optimizer in optimizers
    ]
    configs += [
        forced_inf(
            Mesh(pp=pp, schedule=schedule, microbatches=microbatches, tp=tp),
            optimizers[0],
            scale,
            common,
            layout=Layout(reshard_after_forward=False),
        )
        for schedule in schedules
    ]
    return unique(configs)
