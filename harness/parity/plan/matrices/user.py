"""The rows that check a workload's own ``parallelize`` function: the user's setup itself.

Why not a matrix: the function *is* the layout (its ``fully_shard`` calls, policies, checkpointing,
compiles, TP plan), so there is nothing to vary but what the user's training does with it: the
plain loop; a non-finite gradient on one rank and on every rank (every rank must skip the step
together); and what the workload declares (clipping at its max norm, accumulation in its sync
modes), and a resume row (saved after the declared step through DCP, and through the workload's own
``save``/``load`` when it has them); a function that builds a pipeline (a ``pp`` mesh dimension)
trains inside its schedule's step, so only the plain and non-finite rows. The optimizer is the workload's own, else AdamW (torchtitan's); ids read
``user-dp2xtp2-adamw-mymodel-w4``: the engine, the mesh, the optimizer, the workload.
"""

from __future__ import annotations

from harness.parity.plan.config import Compile, Fault, Loop, Mesh, ParityConfig, Resume, Scale, unique
from harness.parity.plan.config.scale import DEFAULT_SCALE
from harness.parity.plan.matrices import resume as resume_matrix
from harness.parity.plan.matrices.declared import DEFAULT_ACCUMULATE, DEFAULT_STEPS, Declared, fault_steps
from harness.parity.workload import registry


def mesh_of(world_size: int, mesh: str | None) -> Mesh:
    """The mesh handed to the function: ``--mesh dp=2,tp=2``, or one dimension ``dp`` over the world."""
    return Mesh(dims=Mesh.parse(mesh) if mesh else (("dp", world_size),))


def rows(
    workload: str,
    *,
    world_size: int = 2,
    backend: str = "gloo",
    scale: Scale = DEFAULT_SCALE,
    declared: Declared | None = None,
    mesh: str | None = None,
    compile_twin: str = "compiled",
) -> list[ParityConfig]:
    """Every row that checks ``workload``'s ``parallelize`` function at ``world_size`` (the module
    docstring says which); a ValueError naming ``--mesh`` for a mesh the world cannot hold.
    ``compile_twin="eager"`` (``--compile-twin eager``) adds the plain row against a twin that does
    not compile: compile's own difference, named ``compile_changes_numerics`` when it is one."""
    spec = registry.get(workload)
    declared = (declared or Declared()).over(workload)
    steps = spec.steps or DEFAULT_STEPS
    common = {
        "engine": "user",
        "workload": workload,
        "world_size": world_size,
        "backend": backend,
        "steps": steps,
        "scale": scale,
        "mesh": mesh_of(world_size, mesh),
        "optimizer": "own" if spec.optimizer is not None else "adamw",
    }
    configs = [ParityConfig(**common)]  # type: ignore[arg-type]
    for rank in (1, None):
        faults = tuple(Fault(step=s, rank=rank, value="inf") for s in fault_steps(steps))
        configs.append(ParityConfig(suite="forced_inf", faults=faults, **common))  # type: ignore[arg-type]
    if common["mesh"].user_stages is not None:  # type: ignore[attr-defined]
        return unique(configs + _eager_twin(compile_twin, common))  # its schedule's loop: plain rows
    if declared.clip is not None:
        configs.append(ParityConfig(loop=Loop(path="unscale_clip", clip=declared.clip), **common))  # type: ignore[arg-type]
    if declared.accumulates:
        count = declared.accumulate or DEFAULT_ACCUMULATE
        for sync in (declared.sync,) if declared.sync else ("every", "last"):
            configs.append(ParityConfig(loop=Loop(accumulate=count, sync=sync), **common))  # type: ignore[arg-type]
    if (
        declared.resume_at is not None or spec.save is not None
    ):  # saved after that step, loaded into a fresh run
        at = resume_matrix.default_step(steps) if declared.resume_at is None else declared.resume_at
        for method in ("dcp", "user") if spec.save is not None else ("dcp",):
            configs.append(ParityConfig(resume=Resume(at=at, method=method), **common))  # type: ignore[arg-type]
    return unique(configs + _eager_twin(compile_twin, common))


def _eager_twin(compile_twin: str, common: dict[str, object]) -> list[ParityConfig]:
    """Compile's own difference: the plain row against an eager twin, when asked for."""
    if compile_twin != "eager":
        return []
    return [ParityConfig(compile=Compile(mode="function", twin="eager"), **common)]  # type: ignore[arg-type]
