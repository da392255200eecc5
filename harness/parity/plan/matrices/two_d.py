"""The 2-D rows of a workload: FSDP2 + tensor parallelism and HSDP (``--tp N``, ``parity_test(tp=N)``).

Why a matrix of its own: a 2-D mesh needs at least four ranks, so these rows run where the world
size allows (``make two-d``, ``--world-size 4 --tp 2``), apart from the 2-rank matrix every
workload gets. The axes are the ones large runs use (torchtitan's Llama recipes): float32, bf16
and bf16 reducing in float32 (and fp16), SGD with momentum and AdamW, each under the scaler, plus an inf on
one rank so the skip is agreed across a 2-D mesh. HSDP comes twice: ``2 x world/2`` and
``world x 1`` (a sharding degree of 1, where pytorch/pytorch#167178 lost a divide factor).
"""

from __future__ import annotations

import dataclasses

from harness.parity.plan.config import Fault, Layout, Mesh, ParityConfig, Precision, Scale, unique
from harness.parity.plan.config.scale import DEFAULT_SCALE
from harness.parity.workload import registry

RECIPES = (("fp32", "pure"), ("bf16", "pure"), ("bf16", "reduce32"), ("fp16", "pure"))
"""``(precision, recipe)``: float32, pure bf16, bf16 reducing in float32, and fp16, where FSDP2
divides before and after its sums (HSDP: a power of two before the reduce-scatter, the rest after
the all-reduce) and the scaler skips what overflows."""
FP16_INIT_SCALE = 2.0**8
"""fp16 rows start at this loss scale: at the default 2**16 the built-in decoder's gradients
overflow for the first five steps (measured), and a row that skips every step trains nothing."""
OPTIMIZERS = ("sgd", "adamw")


def hsdp_degrees(world_size: int) -> tuple[int, ...]:
    """The replicate degrees of the HSDP rows: ``2`` (two replicas of ``world/2`` shards, when that
    is a mesh of two dimensions) and ``world`` (whole parameters on every rank)."""
    if world_size < 4 or world_size % 2:
        return ()
    return tuple(sorted({2, world_size}))


def rows(
    workload: str,
    *,
    world_size: int = 4,
    backend: str = "gloo",
    scale: Scale = DEFAULT_SCALE,
    tp: int | None = 2,
    steps: int | None = None,
) -> list[ParityConfig]:
    """``workload``'s 2-D rows at ``world_size``: HSDP at :func:`hsdp_degrees`, and FSDP2 + TP at
    degree ``tp`` when the workload has a ``tp_plan`` (``None``: HSDP only), through ``scale``'s
    scaler (fp16 rows from :data:`FP16_INIT_SCALE`). Empty below 4 ranks."""
    spec = registry.get(workload)
    common = {
        "engine": "fsdp2",
        "layout": Layout(reshard_after_forward=True),
        "workload": workload,
        "world_size": world_size,
        "backend": backend,
        "steps": steps or spec.steps or 4,
    }
    meshes = [Mesh(hsdp=degree) for degree in hsdp_degrees(world_size)]
    if tp is not None and spec.tp_plan is not None and world_size >= 4 and world_size % tp == 0:
        meshes.append(Mesh(tp=tp))
    optimizers = ("own",) if spec.optimizer is not None else OPTIMIZERS
    configs = [
        ParityConfig(
            optimizer=optimizer,
            mesh=mesh,
            precision=Precision(dtype=precision, recipe=recipe),
            scale=dataclasses.replace(scale, init_scale=FP16_INIT_SCALE if precision == "fp16" else 2.0**16),
            **common,  # type: ignore[arg-type]
        )
        for mesh in meshes
        for precision, recipe in RECIPES
        for optimizer in optimizers
    ]
    configs += [forced_inf(mesh, optimizers[0], scale, common) for mesh in meshes]
    return unique(configs)


def forced_inf(
    mesh: Mesh, optimizer: str, scale: Scale, common: dict[str, object], **parts: object
) -> ParityConfig:
    """The row that agrees a skip across a mesh: an inf on rank 1 at step 1, bf16 from 2**16."""
    return ParityConfig(
        suite="forced_inf",
        optimizer=optimizer,
        faults=(Fault(step=1, rank=1),),
        mesh=mesh,
        precision=Precision(dtype="bf16"),
        scale=dataclasses.replace(scale, init_scale=2.0**16),
        **parts,  # type: ignore[arg-type]
        **common,  # type: ignore[arg-type]
    )
