"""The ground-truth stage (rank side): each step's gradient on the whole batch and as split.

For one split (a workload, its seed and steps, the data-parallel size and the microbatch count:
``judge/semantics.key``), build the model once in float64 and, at every step, compute the
gradient of the user's loss on the whole global batch (``pieces.whole_batch``) and as the
candidate's setup computes it: every piece's loss weighed as the engine weighs it (``1 /
microbatches``, ``1 / ranks``; a ``num_items`` loss as its share) and summed. The trajectory is
the whole batch's (the workload's optimizer, else SGD with momentum, stepping with the whole
batch's gradient), so a difference that starts at step 2 shows at step 2. At the first step whose
split lands farther than ``gradients.BOUND`` from the whole batch, what can explain it is measured too
(each piece's own gradient and the weights that fit the whole batch, the batch as served with its
repeats, the first module whose outputs differ) and the stage stops: the judge names the cause
(``judge/semantics.py``).

One process: the runner sends the same requests to every rank (``run_batch``) and each rank
computes its share (requests ``i`` with ``i % world_size == rank``); no collective runs, so no
rank can wait on another.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist

from harness.failure_text import prefix_lines
from harness.parity.plan.config import ParityConfig
from harness.parity.ranks.sides.optim.optimizers import make_optimizer
from harness.parity.ranks.truth import gradients, lockstep, pieces
from harness.parity.ranks.wire import TruthRun, TruthStep
from harness.parity.workload import registry
from harness.parity.workload.spec import Workload
from harness.rank import context

MAX_PARAMETERS = 50_000_000
"""Past this many parameters the stage is skipped: float64 on one process, and each piece's
gradient kept at a differing step (400 MB a piece at this size)."""


def split_of(config: ParityConfig, workload: Workload) -> pieces.Split:
    piped = config.mesh.pp is not None  # a pipeline's microbatches: cut from each rank's batch
    return pieces.Split(
        ranks=config.mesh.data_parallel_size(config.world_size),
        microbatches=config.mesh.microbatches if piped else config.loop.accumulate,
        num_items=workload.takes_num_items,
        cut=piped,
    )


def run_batch(requests: list[ParityConfig]) -> list[TruthRun | None]:
    """This rank's share of ``requests`` measured (``None`` for another rank's)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    warm_up()
    return [run_one(config) if index % world == rank else None for index, config in enumerate(requests)]


def warm_up() -> None:
    """One optimizer step on a scalar: a process's first step imports torch's optimizer machinery
    (measured: 2 to 4 s), which every training row pays too; kept out of a split's reported time."""
    param = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    param.grad = torch.zeros_like(param)
    make_optimizer("sgd", [param]).step()


def run_one(config: ParityConfig) -> TruthRun:
    """The ground truth of ``config``'s split (never raises: an error is recorded)."""
    started = time.perf_counter()
    split_words = ""
    try:
        workload = registry.get(config.workload)
        split = split_of(config, workload)
        split_words = split.words()
        steps, parameters = _measure(config, workload, split)
        return TruthRun(
            split=split_words, steps=steps, duration_s=time.perf_counter() - started, parameters=parameters
        )
    except pieces.Unsupported as why:
        return TruthRun(split=split_words, unsupported=str(why), duration_s=time.perf_counter() - started)
    except Exception:  # noqa: BLE001 - recorded; the judge makes it an error
        return TruthRun(
            split=split_words,
            error=prefix_lines(traceback.format_exc(), dist.get_rank() if dist.is_initialized() else 0),
            duration_s=time.perf_counter() - started,
        )


def _optimizer(workload: Workload, params: list[torch.Tensor]) -> Any:
    """What moves the float64 parameters from step to step: the workload's own optimizer, else
    the matrix's SGD with momentum. The trajectory only decides where the gradients are compared,
    so one split serves the rows of every optimizer (``judge/semantics.key``)."""
    if workload.optimizer is not None:
        return workload.optimizer(params)
    return make_optimizer("sgd", params)


def _measure(
    config: ParityConfig, workload: Workload, split: pieces.Split
) -> tuple[tuple[TruthStep, ...], int]:
    if workload.finish_batch is not None:
        raise pieces.Unsupported(
            "the workload's data depends on the loss scale (finish_batch): there is no scale in float64"
        )
    model = gradients.float64_model(workload, config.seed)
    named = gradients.trainable(model)
    parameters = sum(p.numel() for _, p in named)
    if parameters > MAX_PARAMETERS:
        raise pieces.Unsupported(
            f"{parameters:,} parameters: too large for float64 on one process (the stage stops at "
            f"{MAX_PARAMETERS:,})"
        )
    synced = lockstep.install(model)  # SyncBatchNorm: a microbatch's pieces share statistics
    optimizer = _optimizer(workload, [p for _, p in named])
    measured = []
    for step in range(config.steps):
        found, whole_gradient = _step(model, workload, config.seed, split, step, synced)
        measured.append(found)
        context.heartbeat()
        if found.distance > gradients.BOUND:
            break
        offset = 0
        for _, param in named:
            param.grad = whole_gradient[offset : offset + param.numel()].view_as(param).clone()
            offset += param.numel()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return tuple(measured), parameters


def _loss(workload: Workload, model: torch.nn.Module, batch: Any, num_items: int | None) -> Any:
    return lambda: workload.loss_of(model, batch, num_items)


def _count(workload: Workload, batch: Any) -> int:
    return int(workload.items(batch)) if workload.items is not None else pieces.samples(batch)


def _step(
    model: torch.nn.Module, workload: Workload, seed: int, split: pieces.Split, step: int, synced: bool
) -> tuple[TruthStep, torch.Tensor]:
    served = pieces.step_pieces(workload, seed, split, step)
    whole = pieces.whole_batch(served)
    counts = [_count(workload, piece.batch) for piece in served]
    num_items = sum(counts) if split.num_items else None
    whole_items = _count(workload, whole.batch) if split.num_items else None
    with pieces.as_process(0, 1):
        if step == 0 and gradients.draws_random(model, _loss(workload, model, whole.batch, whole_items)):
            raise pieces.Unsupported(
                "the forward draws random numbers outside nn.Dropout modules (which the stage turns "
                "off): no whole batch draws the masks its split would"
            )
        whole_gradient = gradients.gradient(model, _loss(workload, model, whole.batch, whole_items))
        reordered = gradients.gradient(
            model, _loss(workload, model, pieces.reversed_rows(whole.batch), whole_items)
        )
    if synced:
        losses = lockstep.losses(served, split, lambda piece: workload.loss_of(model, piece.batch, num_items))
        own = gradients.gradients_of(model, losses)
    else:
        own = []
        for piece in served:
            with pieces.as_process(piece.rank, split.ranks):
                own.append(gradients.gradient(model, _loss(workload, model, piece.batch, num_items)))
    split_gradient = _weighed(own, split.factor)
    found = TruthStep(
        step=step,
        distance=gradients.relative(split_gradient, whole_gradient),
        rounding=gradients.relative(reordered, whole_gradient),
        pieces=tuple(piece.name() for piece in served),
        counts=tuple(counts),
        counted="items" if workload.items is not None else "samples",
        repeats=whole.repeats,
        factor=split.factor,
    )
    if found.distance <= gradients.BOUND:
        return found, whole_gradient
    explained = _explained(
        found, model, workload, served, split, synced, own, split_gradient, whole_gradient, num_items
    )
    return explained, whole_gradient


def _weighed(own: list[torch.Tensor], factor: float) -> torch.Tensor:
    total = torch.zeros_like(own[0])
    for gradient in own:
        total += gradient * factor
    return total


def _explained(
    found: TruthStep,
    model: torch.nn.Module,
    workload: Workload,
    served: list[pieces.Piece],
    split: pieces.Split,
    synced: bool,
    own: list[torch.Tensor],
    split_gradient: torch.Tensor,
    whole_gradient: torch.Tensor,
    num_items: int | None,
) -> TruthStep:
    """``found`` with what can explain its difference: the weights of the pieces' gradients that
    fit the whole batch's, the batch as served (repeats kept), the first module that differs."""
    weights, residual = gradients.fitted_weights(own, whole_gradient)
    as_served = None
    if found.repeats:
        served_whole = pieces.whole_batch(served, drop_repeats=False)
        served_items = _count(workload, served_whole.batch) if num_items is not None else None
        with pieces.as_process(0, 1):
            as_batch = gradients.gradient(model, _loss(workload, model, served_whole.batch, served_items))
        as_served = gradients.relative(split_gradient, as_batch)
    return dataclasses.replace(
        found,
        weights=tuple(weights),
        weights_residual=residual,
        as_served=as_served,
        module=_first_module(model, workload, served, split, synced, num_items),
    )


def _first_module(
    model: torch.nn.Module,
    workload: Workload,
    served: list[pieces.Piece],
    split: pieces.Split,
    synced: bool,
    num_items: int | None,
) -> tuple[str, str, float] | None:
    """The first module whose outputs on the pieces, concatenated, differ from its outputs on the
    batch as served (repeats kept, so row for row). With a ``SyncBatchNorm`` a microbatch's pieces
    go through together (its statistics span the ranks), one microbatch after the other."""
    if synced:
        ordered = sorted(served, key=lambda piece: (piece.microbatch, piece.rank))
        units = [[p for p in ordered if p.microbatch == k] for k in range(split.microbatches)]
    else:
        ordered, units = served, [[piece] for piece in served]
    whole = pieces.whole_batch(ordered, drop_repeats=False)
    whole_items = _count(workload, whole.batch) if num_items is not None else None
    with torch.no_grad():
        with gradients.outputs(model) as on_whole, pieces.as_process(0, 1):
            workload.loss_of(model, whole.batch, whole_items)
        on_units = []
        for unit in units:
            batch = pieces.whole_batch(unit, drop_repeats=False).batch
            with gradients.outputs(model) as found, pieces.as_process(unit[0].rank, split.ranks):
                workload.loss_of(model, batch, num_items)
            on_units.append(list(found))
    return gradients.first_differing_module(model, list(on_whole), on_units)
