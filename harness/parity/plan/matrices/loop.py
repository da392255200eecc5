"""Rows of the training loop's features: ``clip_grad_norm_`` after ``unscale_`` at a chosen norm, and
gradient accumulation over microbatches, syncing every microbatch or only the last, and activation
checkpointing of the units.

Why apart from the precision matrices (``default.py``, ``workload.py``): a loop feature is
one more axis over a few engine layouts, in the default matrix (a few rows, so ``make parity``
keeps its wall time) and in a workload's own matrix (the user's feature under every layout); both
draw their rows from here.
"""

from __future__ import annotations

import dataclasses

from harness.parity.plan import recipe as recipes
from harness.parity.plan.config import Layout, Loop, ParityConfig, Precision
from harness.parity.plan.matrices.declared import DEFAULT_ACCUMULATE, Declared
from harness.parity.workload import registry

EngineLayout = tuple[str, Layout]
"""An engine and its layout: what a loop row runs under."""

BITING_CLIP = 0.05
"""A max norm the MLP's gradients exceed (their total norm is 0.06 to 0.14 over six steps,
measured), so the clip scales them at every step: the default rows clip for real, where 1.0
(``unscale_clip``'s default) never bites on the MLP."""


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
    clip = Loop(path="unscale_clip", clip=BITING_CLIP)
    last = Loop(accumulate=DEFAULT_ACCUMULATE, sync="last")
    every = Loop(accumulate=DEFAULT_ACCUMULATE)
    flat = ("fsdp1", Layout(sharding="full_shard", use_orig_params=False))
    orig = ("fsdp1", Layout(sharding="full_shard", use_orig_params=True))
    fsdp2 = ("fsdp2", Layout(reshard_after_forward=True))
    bf16_reduce32 = Precision(dtype="bf16", recipe="reduce32")
    rows: list[tuple[EngineLayout, Loop, Precision, str]] = [
        (flat, clip, Precision(dtype="fp16"), "mlp"),
        (fsdp2, clip, Precision(dtype="bf16"), "mlp"),
        (flat, last, bf16_reduce32, "mlp"),
        (fsdp2, last, bf16_reduce32, "mlp"),
        (orig, every, Precision(dtype="fp16"), "mlp"),
    ]
    convnet = Loop(checkpoint="replay")  # dropout in every unit
    rows += [(orig, convnet, Precision(dtype="bf16"), "convnet"), (fsdp2, convnet, Precision(), "convnet")]
    return [
        ParityConfig(
            engine=engine, layout=layout, loop=loop, precision=precision, workload=workload, **common
        )  # type: ignore[arg-type]
        for (engine, layout), loop, precision, workload in rows
    ]


def _under_layouts(
    common: dict[str, object],
    layouts: list[EngineLayout],
    optimizers: tuple[str, ...],
    recipe: str | None,
    loops: list[Loop],
) -> list[ParityConfig]:
    """Each of ``loops`` in the user's ``recipe`` (float32 when none), for each optimizer, under
    each of ``layouts``: every loop row of a workload's matrix (``common``: the rows' core fields
    and scale)."""
    kind, dtype = recipes.parse(recipe) if recipe is not None else ("pure", "fp32")
    precision = Precision(dtype=dtype, recipe=kind)
    return [
        ParityConfig(engine=engine, layout=layout, optimizer=opt, loop=loop, precision=precision, **common)  # type: ignore[arg-type]
        for loop in loops
        for opt in optimizers
        for engine, layout in layouts
    ]


def accumulation_rows(
    common: dict[str, object], layouts: list[EngineLayout], optimizers: tuple[str, ...], declared: Declared
) -> list[ParityConfig]:
    """A workload's accumulation rows: the declared microbatches (:data:`DEFAULT_ACCUMULATE` when
    none are) syncing as declared (both modes when no mode is), in the declared recipe (float32
    when none), under each of ``layouts``."""
    count = DEFAULT_ACCUMULATE if declared.accumulate is None else declared.accumulate
    modes = (declared.sync,) if declared.sync is not None else SYNCS
    loops = [Loop(accumulate=count, sync=mode) for mode in modes]
    return _under_layouts(common, layouts, optimizers, declared.recipe, loops)


def workload_rows(
    common: dict[str, object], layouts: list[EngineLayout], optimizers: tuple[str, ...], declared: Declared
) -> list[ParityConfig]:
    """A workload's clipping rows: clipping after ``unscale_`` at the declared max norm (1.0 when
    none is) in the declared recipe (float32 when none), under each of ``layouts``."""
    loop = Loop(path="unscale_clip", clip=1.0 if declared.clip is None else declared.clip)
    return _under_layouts(common, layouts, optimizers, declared.recipe, [loop])


def checkpoint_rows(
    common: dict[str, object], layouts: list[EngineLayout], optimizers: tuple[str, ...], declared: Declared
) -> list[ParityConfig]:
    """A workload's checkpointing rows: its units checkpointed with RNG replay in the declared
    recipe (float32 when none), under each of ``layouts`` (none for a workload without units:
    nothing to checkpoint)."""
    if not registry.get(str(common["workload"])).units:
        return []
    return _under_layouts(common, layouts, optimizers, declared.recipe, [Loop(checkpoint="replay")])


def combined_rows(
    common: dict[str, object], layouts: list[EngineLayout], optimizers: tuple[str, ...], declared: Declared
) -> list[ParityConfig]:
    """The user's whole loop in one row, under each of ``layouts``, when they train with two or
    more of its features (clipping, accumulation, checkpointing): a user who clips *and*
    accumulates runs both in the same step, and the rows of one feature each would never show how
    they combine. None for a single feature (its own rows are the whole loop)."""
    if sum([declared.clip is not None, declared.accumulates, declared.checkpoint]) < 2:
        return []
    loop = Loop()
    if declared.clip is not None:
        loop = dataclasses.replace(loop, path="unscale_clip", clip=declared.clip)
    if declared.accumulates:
        count = DEFAULT_ACCUMULATE if declared.accumulate is None else declared.accumulate
        loop = dataclasses.replace(loop, accumulate=count, sync=declared.sync or "every")
    if declared.checkpoint and registry.get(str(common["workload"])).units:
        loop = dataclasses.replace(loop, checkpoint="replay")
    return _under_layouts(common, layouts, optimizers, declared.recipe, [loop])
