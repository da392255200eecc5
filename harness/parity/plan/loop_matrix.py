"""Rows of the training loop's features: ``clip_grad_norm_`` after ``unscale_`` at a chosen norm, and
gradient accumulation over microbatches, syncing every microbatch or only the last, and activation
checkpointing of the units.

Why apart from the precision matrices (``matrix.py``, ``workload_matrix.py``): a loop feature is
one more axis over a few engine layouts, in the default matrix (a few rows, so ``make parity``
keeps its wall time) and in a workload's own matrix (the user's feature under every layout); both
draw their rows from here.
"""

from __future__ import annotations

from harness.parity.plan import recipe as recipes
from harness.parity.plan.config import ParityConfig
from harness.parity.workload import registry

BITING_CLIP = 0.05
"""A max norm the MLP's gradients exceed (their total norm is 0.06 to 0.14 over six steps,
measured), so the clip scales them at every step: the default rows clip for real, where 1.0
(``unscale_clip``'s default) never bites on the MLP."""


DEFAULT_ACCUMULATE = 2
"""Microbatches per step in the loop rows when the user names none."""
SYNCS = ("every", "last")


def default_rows(*, world_size: int = 2, backend: str = "gloo") -> list[ParityConfig]:
    """The default matrix's loop rows: FSDP1 (flat, fp16) and FSDP2 (resharding, bf16) clipping
    at :data:`BITING_CLIP` after ``unscale_``; two microbatches per step under ``bf16-reduce32``
    syncing only the last (where FSDP1 and FSDP2 accumulate in different dtypes) under both, and
    syncing every microbatch under FSDP1 in fp16; the conv net (dropout in every unit) with its
    units checkpointed under FSDP1 (bf16) and FSDP2 (fp32). Not the row without RNG replay: it
    must fail, and ``make parity`` exits 1 on any failure, expected or not (its test runs it:
    ``suites/parity/test_checkpoint.py``)."""
    common: dict[str, object] = {"world_size": world_size, "backend": backend}
    clip = {**common, "path": "unscale_clip", "clip": BITING_CLIP}
    last = {
        **common,
        "recipe": "reduce32",
        "precision": "bf16",
        "accumulate": DEFAULT_ACCUMULATE,
        "sync": "last",
    }
    every = {**common, "precision": "fp16", "accumulate": DEFAULT_ACCUMULATE}
    fsdp1: dict[str, object] = {"engine": "fsdp1", "sharding": "full_shard", "use_orig_params": False}
    fsdp2: dict[str, object] = {"engine": "fsdp2", "reshard_after_forward": True}
    rows = [(fsdp1, {**clip, "precision": "fp16"}), (fsdp2, {**clip, "precision": "bf16"})]
    rows += [(fsdp1, last), (fsdp2, last), ({**fsdp1, "use_orig_params": True}, every)]
    convnet = {**common, "workload": "convnet", "checkpoint": "replay"}  # dropout in every unit
    rows += [({**fsdp1, "use_orig_params": True}, {**convnet, "precision": "bf16"}), (fsdp2, convnet)]
    return [ParityConfig(**layout, **fields) for layout, fields in rows]  # type: ignore[arg-type]


def _under_layouts(
    common: dict[str, object],
    layouts: list[dict[str, object]],
    optimizers: tuple[str, ...],
    recipe: str | None,
    loops: list[dict[str, object]],
) -> list[ParityConfig]:
    """Each of ``loops`` (a loop's fields) in the user's ``recipe`` (float32 when none), for each
    optimizer, under each of ``layouts``: every loop row of a workload's matrix."""
    kind, precision = recipes.parse(recipe) if recipe is not None else ("pure", "fp32")
    return [
        ParityConfig(
            recipe=kind,
            precision=precision,
            optimizer=opt,
            **loop,  # type: ignore[arg-type]
            **layout,  # type: ignore[arg-type]
            **common,  # type: ignore[arg-type]
        )
        for loop in loops
        for opt in optimizers
        for layout in layouts
    ]


def accumulation_rows(
    common: dict[str, object],
    layouts: list[dict[str, object]],
    optimizers: tuple[str, ...],
    recipe: str | None,
    accumulate: int | None,
    sync: str | None,
) -> list[ParityConfig]:
    """A workload's accumulation rows: ``accumulate`` microbatches (:data:`DEFAULT_ACCUMULATE`
    when the user named none) syncing as ``sync`` (both modes when ``None``), in the user's
    ``recipe`` (float32 when none), under each of ``layouts``."""
    count = DEFAULT_ACCUMULATE if accumulate is None else accumulate
    modes = (sync,) if sync is not None else SYNCS
    return _under_layouts(
        common, layouts, optimizers, recipe, [{"accumulate": count, "sync": mode} for mode in modes]
    )


def workload_rows(
    common: dict[str, object],
    layouts: list[dict[str, object]],
    optimizers: tuple[str, ...],
    recipe: str | None,
    clip: float | None,
) -> list[ParityConfig]:
    """A workload's clipping rows: clipping after ``unscale_`` at ``clip`` (1.0 when the user named
    none) in the user's ``recipe`` (float32 when none), under each of ``layouts``."""
    loop = {"path": "unscale_clip", "clip": 1.0 if clip is None else clip}
    return _under_layouts(common, layouts, optimizers, recipe, [loop])


def checkpoint_rows(
    common: dict[str, object],
    layouts: list[dict[str, object]],
    optimizers: tuple[str, ...],
    recipe: str | None,
) -> list[ParityConfig]:
    """A workload's checkpointing rows: its units checkpointed with RNG replay in the user's
    ``recipe`` (float32 when none), under each of ``layouts`` (none for a workload without units:
    nothing to checkpoint)."""
    if not registry.get(str(common["workload"])).units:
        return []
    return _under_layouts(common, layouts, optimizers, recipe, [{"checkpoint": "replay"}])


def describe(clip: float | None, accumulate: int | None, sync: str | None, checkpoint: bool) -> str | None:
    """The loop a user declared, in words (``None``: none): what ``--list`` and the report say."""
    words = []
    if clip is not None:
        words.append(f"clip_grad_norm_ at {clip:g} after unscale_")
    if accumulate is not None or sync is not None:
        count = DEFAULT_ACCUMULATE if accumulate is None else accumulate
        mode = {"last": ", syncing the last", "every": ", syncing every one"}.get(
            sync or "", ", both sync modes"
        )
        words.append(f"{count} microbatches per step{mode}")
    if checkpoint:
        words.append("units checkpointed")
    return "; ".join(words) or None


def combined_rows(
    common: dict[str, object],
    layouts: list[dict[str, object]],
    optimizers: tuple[str, ...],
    recipe: str | None,
    *,
    clip: float | None,
    accumulate: int | None,
    sync: str | None,
    checkpoint: bool,
) -> list[ParityConfig]:
    """The user's whole loop in one row, under each of ``layouts``, when they train with two or
    more of its features (clipping, accumulation, checkpointing): a user who clips *and*
    accumulates runs both in the same step, and the rows of one feature each would never show how
    they combine. None for a single feature (its own rows are the whole loop)."""
    declared = [clip is not None, accumulate is not None or sync is not None, checkpoint]
    if sum(declared) < 2:
        return []
    loop: dict[str, object] = {}
    if clip is not None:
        loop.update(path="unscale_clip", clip=clip)
    if declared[1]:
        loop.update(accumulate=DEFAULT_ACCUMULATE if accumulate is None else accumulate, sync=sync or "every")
    if checkpoint and registry.get(str(common["workload"])).units:
        loop.update(checkpoint="replay")
    return _under_layouts(common, layouts, optimizers, recipe, [loop])
