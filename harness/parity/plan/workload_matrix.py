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

from harness.parity.plan import loop_matrix, resume_matrix
from harness.parity.plan import recipe as recipes
from harness.parity.plan.config import FAULT_VALUES, FSDP1_SHARDING, PRECISIONS, Fault, ParityConfig, unique
from harness.parity.workload import registry
from harness.parity.workload.spec import WorkloadError

DEFAULT_STEPS = 6


def optimizers_of(workload: str) -> tuple[str, ...]:
    """``("own",)`` for a workload with its own optimizer, else SGD-momentum and fused Adam."""
    return ("own",) if registry.get(workload).optimizer is not None else ("sgd", "adam_fused")


def fault_steps(steps: int) -> tuple[int, ...]:
    """Where faults go in a run of ``steps``: step 2 (after the scale settled) and the last step,
    as far as the run is long enough (the scale then backs off twice)."""
    first = min(2, steps - 1)
    return (first,) if steps - 1 <= first + 1 else (first, steps - 1)


def declared_recipe(workload: str, recipe: str | None = None) -> str | None:
    """The recipe the user runs: ``recipe`` (the CLI's ``--recipe``) or the workload's own; a
    :class:`WorkloadError` naming the recipes for an unknown one."""
    chosen = recipe or registry.get(workload).recipe
    if chosen is None:
        return None
    try:
        recipes.parse(chosen)
    except ValueError as error:
        raise WorkloadError(f"workload {registry.get(workload).name!r}: {error}") from None
    return chosen


def declared_loop(
    workload: str,
    clip: float | None = None,
    accumulate: int | None = None,
    sync: str | None = None,
    checkpoint: bool = False,
) -> str | None:
    """The loop the user runs, in words: the caller's choices over the workload's own
    (``loop_matrix.describe``); ``None`` when neither declares one."""
    spec = registry.get(workload)
    return loop_matrix.describe(
        spec.clip if clip is None else clip,
        spec.accumulate if accumulate is None else accumulate,
        spec.sync if sync is None else sync,
        checkpoint or spec.checkpoint,
    )


def _layouts(full: bool) -> list[dict[str, object]]:
    """The engine layouts a recipe runs under: every one of the precision grid's, or a compact four."""
    if full:
        fsdp1 = [(s, o) for s in FSDP1_SHARDING for o in (False, True)]
        fsdp2 = [(r, off) for r in (True, False) for off in (False, True)]
    else:
        fsdp1 = [("full_shard", False), ("full_shard", True)]
        fsdp2 = [(True, False), (False, False)]
    return [{"engine": "fsdp1", "sharding": s, "use_orig_params": o} for s, o in fsdp1] + [
        {"engine": "fsdp2", "reshard_after_forward": r, "offload": off} for r, off in fsdp2
    ]


def recipe_rows(workload: str, common: dict[str, object], recipe: str | None) -> list[ParityConfig]:
    """The rows of the recipes beyond ``pure`` (whose rows are the precision grid's): the declared
    ``recipe`` under every engine layout, or, with none declared, every recipe under four."""
    names = [recipe] if recipe is not None else list(recipes.RECIPES)
    configs = []
    for name in names:
        kind, precision = recipes.parse(name)
        if kind == "pure":
            continue
        configs += [
            ParityConfig(recipe=kind, precision=precision, optimizer=opt, **layout, **common)  # type: ignore[arg-type]
            for opt in optimizers_of(workload)
            for layout in _layouts(full=recipe is not None)
        ]
    return configs


def for_workload(
    workload: str,
    *,
    world_size: int = 2,
    backend: str = "gloo",
    scaler: str = "ours",
    recipe: str | None = None,
    clip: float | None = None,
    accumulate: int | None = None,
    sync: str | None = None,
    checkpoint: bool = False,
    resume_at: int | None = None,
) -> list[ParityConfig]:
    """Every configuration that checks ``workload`` (a registered name or ``module:function``);
    ``recipe`` (a name of ``recipe.RECIPES``) replaces the workload's declared one; ``clip``: the
    max norm the user clips at after ``unscale_`` (``loop_matrix.py``: under every engine layout,
    where without it the loop rows clip at 1.0 under four); ``accumulate``/``sync``: the user's
    microbatches per step and sync mode, likewise (without them, two microbatches in both modes);
    ``checkpoint``: the user checkpoints the units (with RNG replay), likewise (without it, under
    four layouts); ``resume_at``: resume rows saving at that step (``resume_matrix.py``; a
    workload that declares ``save``/``load`` has them at its halfway step without it)."""
    declared = declared_recipe(workload, recipe)
    spec = registry.get(workload)  # the loop the workload declares, unless the caller names its own
    clip = spec.clip if clip is None else clip
    accumulate = spec.accumulate if accumulate is None else accumulate
    sync = spec.sync if sync is None else sync
    checkpoint = checkpoint or spec.checkpoint
    steps = registry.get(workload).steps or DEFAULT_STEPS
    common = {
        "workload": workload,
        "world_size": world_size,
        "backend": backend,
        "steps": steps,
        "scaler": scaler,
    }
    optimizers = optimizers_of(workload)
    configs = [
        ParityConfig(engine="fsdp1", sharding=s, use_orig_params=o, precision=p, optimizer=opt, **common)
        for opt in optimizers
        for s in FSDP1_SHARDING
        for o in (False, True)
        for p in PRECISIONS
    ]
    configs += [
        ParityConfig(
            engine="fsdp2", reshard_after_forward=r, precision=p, offload=off, optimizer=opt, **common
        )
        for opt in optimizers
        for r in (True, False)
        for p in PRECISIONS
        for off in (False, True)
    ]
    engines = [
        {"engine": "ddp"},
        {"engine": "fsdp1", "sharding": "full_shard", "use_orig_params": True},
        {"engine": "fsdp2", "reshard_after_forward": True},
    ]
    for engine in engines:
        for opt in optimizers:
            for rank in (1, None):
                for value in FAULT_VALUES:
                    faults = tuple(Fault(step=s, rank=rank, value=value) for s in fault_steps(steps))
                    configs.append(
                        ParityConfig(
                            suite="forced_inf",
                            optimizer=opt,
                            faults=faults,
                            **engine,  # type: ignore[arg-type]
                            **common,  # type: ignore[arg-type]
                        )
                    )
    configs += recipe_rows(workload, common, declared)
    layouts = _layouts(full=clip is not None)
    configs += loop_matrix.workload_rows(common, layouts, optimizers, declared, clip)
    layouts = _layouts(full=accumulate is not None or sync is not None)
    configs += loop_matrix.accumulation_rows(common, layouts, optimizers, declared, accumulate, sync)
    configs += loop_matrix.checkpoint_rows(common, _layouts(full=checkpoint), optimizers, declared)
    configs += loop_matrix.combined_rows(
        common,
        _layouts(full=True),
        optimizers,
        declared,
        clip=clip,
        accumulate=accumulate,
        sync=sync,
        checkpoint=checkpoint,
    )
    configs += resume_matrix.workload_rows(common, optimizers, resume_at)
    return unique(configs)


SHOWCASE = ("llama", "convnet")
"""Built-in workloads that look like what users train; the default matrix runs a few rows of each."""


def _showcase_row(config: ParityConfig) -> bool:
    """The rows of a showcase workload in the default matrix (six, to keep ``make parity`` under a
    minute): FSDP1 FULL_SHARD with original parameters in fp32 and fp16, FSDP2 with resharding in
    fp32 and bf16; an inf on one rank under FSDP2 with SGD, and a NaN on every rank under FSDP1 with
    fused Adam. ``--workload llama`` runs the whole grid."""
    if config.recipe != "pure" or config.path != "plain" or config.accumulate > 1 or config.checkpoint:
        return False
    if config.suite == "forced_inf":
        where = "one" if all(f.rank == 1 for f in config.faults) else "every"
        row = (config.engine, where, config.faults[0].value, config.optimizer)
        return row in {("fsdp2", "one", "inf", "sgd"), ("fsdp1", "every", "nan", "adam_fused")}
    if config.optimizer != "sgd" or config.offload:
        return False
    if config.engine == "fsdp1":
        return config.sharding == "full_shard" and bool(config.use_orig_params) and config.precision != "bf16"
    return bool(config.reshard_after_forward) and config.precision != "fp16"


def showcase(*, world_size: int = 2, backend: str = "gloo") -> list[ParityConfig]:
    """The default matrix's rows of the Llama-style decoder and the conv net."""
    return [
        config
        for name in SHOWCASE
        for config in for_workload(name, world_size=world_size, backend=backend)
        if _showcase_row(config)
    ]
