"""The configurations that check one workload: what ``python -m harness.parity --workload X`` runs.

Why a matrix per workload: a user asks "does *my* model train the same under FSDP as under DDP,
and does every rank skip the same steps?". The answer is the same grid the embedded matrix runs on
the toys, on their model: FSDP1 (every sharding strategy, flat and original parameters) and FSDP2
(``reshard_after_forward``, ``CPUOffloadPolicy``) in fp32, fp16 and bf16 against DDP, plus inf and
NaN planted into the user's own gradients on one rank and on every rank, for DDP, FSDP1 and FSDP2.
The optimizer is the workload's own when it has one, else SGD with momentum and fused Adam.

Recipes (``recipe.py``): the precisions above are the ``pure`` recipe. The user's own recipe (the
workload's ``recipe``, or the CLI's ``--recipe``) runs under every engine layout of that grid;
without one, every other recipe runs under FSDP1 FULL_SHARD (flat and original parameters) and
FSDP2 (resharding or not), so the matrix says which recipes the model survives.
"""

from __future__ import annotations

from harness.parity.plan import recipe as recipes
from harness.parity.plan.config import (
    FAULT_VALUES,
    FSDP1_SHARDING,
    PRECISIONS,
    Fault,
    Layout,
    ParityConfig,
    Precision,
    Scale,
    unique,
)
from harness.parity.plan.config.scale import DEFAULT_SCALE
from harness.parity.plan.matrices import loop as loop_matrix
from harness.parity.plan.matrices import resume as resume_matrix
from harness.parity.plan.matrices import user as user_matrix
from harness.parity.plan.matrices.declared import DEFAULT_STEPS, Declared, fault_steps
from harness.parity.workload import registry


def optimizers_of(workload: str) -> tuple[str, ...]:
    """``("own",)`` for a workload with its own optimizer, else SGD-momentum and fused Adam."""
    return ("own",) if registry.get(workload).optimizer is not None else ("sgd", "adam_fused")


def _layouts(full: bool) -> list[tuple[str, Layout]]:
    """The engine layouts a recipe runs under: every one of the precision grid's, or a compact four."""
    if full:
        fsdp1 = [(s, o) for s in FSDP1_SHARDING for o in (False, True)]
        fsdp2 = [(r, off) for r in (True, False) for off in (False, True)]
    else:
        fsdp1 = [("full_shard", False), ("full_shard", True)]
        fsdp2 = [(True, False), (False, False)]
    return [("fsdp1", Layout(sharding=s, use_orig_params=o)) for s, o in fsdp1] + [
        ("fsdp2", Layout(reshard_after_forward=r, offload=off)) for r, off in fsdp2
    ]


def recipe_rows(workload: str, common: dict[str, object], recipe: str | None) -> list[ParityConfig]:
    """The rows of the recipes beyond ``pure`` (whose rows are the precision grid's): the declared
    ``recipe`` under every engine layout, or, with none declared, every recipe under four."""
    names = [recipe] if recipe is not None else list(recipes.RECIPES)
    configs = []
    for name in names:
        kind, dtype = recipes.parse(name)
        if kind == "pure":
            continue
        configs += [
            ParityConfig(
                engine=engine,
                layout=layout,
                optimizer=opt,
                precision=Precision(dtype=dtype, recipe=kind),
                **common,  # type: ignore[arg-type]
            )
            for opt in optimizers_of(workload)
            for engine, layout in _layouts(full=recipe is not None)
        ]
    return configs


def for_workload(
    workload: str,
    *,
    world_size: int = 2,
    backend: str = "gloo",
    scale: Scale = DEFAULT_SCALE,
    declared: Declared | None = None,
    mesh: str | None = None,
    compile_twin: str = "compiled",
) -> list[ParityConfig]:
    """Every configuration that checks ``workload`` (a registered name or ``module:function``),
    with the candidate's ``scale`` and what the user trains with (``declared``, over the workload's
    own: :meth:`Declared.over`): the declared recipe under every engine layout (else every recipe
    under four); the declared clip, accumulation and checkpointing under every layout (else under
    four, clipping at 1.0, accumulating two microbatches in both sync modes), their combination
    when two or more are declared (``loop.py``), and resume rows at the declared step
    (``resume.py``; a workload with ``save``/``load`` has them halfway without one). A workload
    with its own ``parallelize`` function gets that function's rows instead (``user.py``, on
    ``mesh``; ``compile_twin="eager"``: with the plain row against an eager twin too)."""
    if registry.get(workload).parallelize is not None:
        return user_matrix.rows(
            workload,
            world_size=world_size,
            backend=backend,
            scale=scale,
            declared=declared,
            mesh=mesh,
            compile_twin=compile_twin,
        )
    declared = (declared or Declared()).over(workload)
    steps = registry.get(workload).steps or DEFAULT_STEPS
    common: dict[str, object] = {
        "workload": workload,
        "world_size": world_size,
        "backend": backend,
        "steps": steps,
        "scale": scale,
    }
    optimizers = optimizers_of(workload)
    configs = [
        ParityConfig(
            engine="fsdp1",
            optimizer=opt,
            layout=Layout(sharding=s, use_orig_params=o),
            precision=Precision(dtype=p),
            **common,  # type: ignore[arg-type]
        )
        for opt in optimizers
        for s in FSDP1_SHARDING
        for o in (False, True)
        for p in PRECISIONS
    ]
    configs += [
        ParityConfig(
            engine="fsdp2",
            optimizer=opt,
            layout=Layout(reshard_after_forward=r, offload=off),
            precision=Precision(dtype=p),
            **common,  # type: ignore[arg-type]
        )
        for opt in optimizers
        for r in (True, False)
        for p in PRECISIONS
        for off in (False, True)
    ]
    engines = [
        ("ddp", Layout()),
        ("fsdp1", Layout(sharding="full_shard", use_orig_params=True)),
        ("fsdp2", Layout(reshard_after_forward=True)),
    ]
    for engine, layout in engines:
        for opt in optimizers:
            for rank in (1, None):
                for value in FAULT_VALUES:
                    faults = tuple(Fault(step=s, rank=rank, value=value) for s in fault_steps(steps))
                    configs.append(
                        ParityConfig(
                            suite="forced_inf",
                            engine=engine,
                            layout=layout,
                            optimizer=opt,
                            faults=faults,
                            **common,  # type: ignore[arg-type]
                        )
                    )
    configs += recipe_rows(workload, common, declared.recipe)
    layouts = _layouts(full=declared.clip is not None)
    configs += loop_matrix.workload_rows(common, layouts, optimizers, declared)
    layouts = _layouts(full=declared.accumulates)
    configs += loop_matrix.accumulation_rows(common, layouts, optimizers, declared)
    configs += loop_matrix.checkpoint_rows(common, _layouts(full=declared.checkpoint), optimizers, declared)
    configs += loop_matrix.combined_rows(common, _layouts(full=True), optimizers, declared)
    configs += resume_matrix.workload_rows(
        workload, steps=steps, common=common, optimizers=optimizers, resume_at=declared.resume_at
    )
    return unique(configs)


SHOWCASE = ("llama", "convnet")
"""Built-in workloads that look like what users train; the default matrix runs a few rows of each."""


def _showcase_row(config: ParityConfig) -> bool:
    """The rows of a showcase workload in the default matrix (six, to keep ``make parity`` under a
    minute): FSDP1 FULL_SHARD with original parameters in fp32 and fp16, FSDP2 with resharding in
    fp32 and bf16; an inf on one rank under FSDP2 with SGD, and a NaN on every rank under FSDP1 with
    fused Adam. ``--workload llama`` runs the whole grid."""
    if (
        config.precision.recipe != "pure"
        or config.loop.path != "plain"
        or config.loop.accumulate > 1
        or config.loop.checkpoint
    ):
        return False
    if config.suite == "forced_inf":
        where = "one" if all(f.rank == 1 for f in config.faults) else "every"
        row = (config.engine, where, config.faults[0].value, config.optimizer)
        return row in {("fsdp2", "one", "inf", "sgd"), ("fsdp1", "every", "nan", "adam_fused")}
    if config.optimizer != "sgd" or config.layout.offload:
        return False
    if config.engine == "fsdp1":
        return (
            config.layout.sharding == "full_shard"
            and bool(config.layout.use_orig_params)
            and config.precision.dtype != "bf16"
        )
    return bool(config.layout.reshard_after_forward) and config.precision.dtype != "fp16"


def showcase(*, world_size: int = 2, backend: str = "gloo") -> list[ParityConfig]:
    """The default matrix's rows of the Llama-style decoder and the conv net."""
    return [
        config
        for name in SHOWCASE
        for config in for_workload(name, world_size=world_size, backend=backend)
        if _showcase_row(config)
    ]
