"""A workload's model cut into pipeline stages (rank side): which modules each stage holds, which
stages each rank runs, and the tied parameters a cut separates.

Why one module for both sides: the candidate builds its stages from this cut, and its twin
reduces each stage's gradients in the stage's own buckets and sums tied copies as the candidate
does; both must read the same cut, so both compute it here from the same model.

The cut follows torchtitan's convention (``pipeline_parallel_split_points``): the model's
*items* are its top-level modules, a ``ModuleList``'s or ``ModuleDict``'s entries one by one
(``embed``, ``layers.0``, ``layers.1``, ``norm``, ``output``), in registration order; a stage is a
contiguous run of them, and the model with every other item set to ``None`` (dropped from its
``ModuleDict``) is that stage's module, so parameter names stay the whole model's. A
``ModuleList`` cannot lose entries without renaming the rest: a cut through one is refused,
naming the fix (a ``ModuleDict`` keyed ``"0"``, ``"1"``, ... as torchtitan's models use).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch
from torch import nn

from harness.parity.plan.config.mesh import DESCENDING, SCHEDULES, Mesh
from harness.parity.workload import hf_pipeline
from harness.parity.workload.spec import Workload


def items(model: nn.Module) -> list[str]:
    """The model's items in registration order (see the module docstring); a Hugging Face
    decoder's in its forward's order (``workload/hf_pipeline.py``)."""
    prefix = hf_pipeline.decoder(model)
    if prefix is not None:
        return hf_pipeline.items(model, prefix)
    found = []
    for name, child in model.named_children():
        if isinstance(child, (nn.ModuleList, nn.ModuleDict)):
            found += [f"{name}.{key}" for key, _ in child.named_children()]
        else:
            found.append(name)
    return found


def stage_count(mesh: Mesh) -> int:
    """How many stages the schedule runs: ``pp`` ranks times its stages per rank."""
    assert mesh.pp is not None, "a pipeline's mesh"
    return mesh.pp * SCHEDULES[mesh.schedule][1]


def stages_of(workload: Workload, model: nn.Module, count: int) -> list[list[str]]:
    """Each stage's items: cut where ``workload.pp_split`` names, or (``"auto"``) evenly by count,
    the larger stages last (the last stage also computes the loss)."""
    found = items(model)
    if workload.pp_split == "auto":
        if len(found) < count:
            raise ValueError(
                f"pp_split='auto' cannot cut {type(model).__name__}'s {len(found)} modules {found} into "
                f"{count} stages; use fewer stages (--pp, or a schedule with one stage per rank)"
            )
        base, extra = divmod(len(found), count)
        sizes = [base + (1 if index >= count - extra else 0) for index in range(count)]
        starts = [sum(sizes[:index]) for index in range(count)]
    else:
        points = list(workload.pp_split or ())
        unknown = [point for point in points if point not in found]
        if unknown:
            raise ValueError(f"pp_split names {unknown}, which are not among the model's modules {found}")
        starts = [0, *(found.index(point) for point in points)]
        if starts != sorted(set(starts)) or 0 in starts[1:]:
            raise ValueError(f"pp_split {points} must name modules in the model's order, after its first")
        if len(starts) != count:
            raise ValueError(
                f"pp_split {points} cuts {len(starts)} stages and the schedule runs {count}: name "
                f"{count - 1} split points, or pp_split='auto'"
            )
    bounds = [*starts[1:], len(found)]
    return [found[start:end] for start, end in zip(starts, bounds, strict=True)]


def describe(workload: Workload, model: nn.Module, pp: int, schedules: tuple[str, ...]) -> str:
    """The cut in words, per stage count the ``schedules`` run (for the report): ``2 stages
    (gpipe, 1f1b): embed, layers.0 | layers.1, norm, output``."""
    counts: dict[int, list[str]] = {}
    for schedule in schedules:
        counts.setdefault(pp * SCHEDULES[schedule][1], []).append(schedule)
    how = "auto, evenly" if workload.pp_split == "auto" else f"at {list(workload.pp_split or ())}"
    return (
        "; ".join(
            f"{count} stages ({', '.join(names)}): "
            + " | ".join(", ".join(kept) for kept in stages_of(workload, model, count))
            for count, names in counts.items()
        )
        + f" (cut {how})"
    )


def held_stages(mesh: Mesh, pp_rank: int) -> list[int]:
    """The stages ``pp_rank`` runs: its own, or two (looped: ``r`` and ``r + pp``; V: ``r`` and
    ``2 pp - 1 - r``)."""
    assert mesh.pp is not None, "a pipeline's mesh"
    if SCHEDULES[mesh.schedule][1] == 1:
        return [pp_rank]
    if mesh.schedule in ("zbv", "dualpipev"):
        return [pp_rank, 2 * mesh.pp - 1 - pp_rank]
    return [pp_rank, pp_rank + mesh.pp]


def untie(model: nn.Module) -> list[tuple[str, ...]]:
    """Give every name of a tied parameter but the first a copy of its own, and return the ties.
    A cut separates them anyway (each stage holds its own copy, the embedding on the first and
    the head on the last); untied before the cut, both sides hold the same copies by the same
    names, and the copies stay equal only if their gradients are summed across the stages
    (:func:`sum_ties`)."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    ties = [tuple(found) for found in names.values() if len(found) > 1]
    for tie in ties:
        for name in tie[1:]:
            owner, _, leaf = name.rpartition(".")
            module = model.get_submodule(owner)
            original = module.get_parameter(leaf)
            module.register_parameter(leaf, nn.Parameter(original.detach().clone(), original.requires_grad))
    return ties


def cut(model: nn.Module, kept: list[str], *, in_place: bool) -> nn.Module:
    """The stage holding ``kept``: the model (a copy unless ``in_place``) with every other item
    set to ``None`` or dropped from its ``ModuleDict``."""
    stage = model if in_place else copy.deepcopy(model)
    prefix = hf_pipeline.decoder(stage)
    if prefix is not None:
        return hf_pipeline.cut(stage, prefix, kept)
    for item in items(model):
        if item in kept:
            continue
        parent, _, key = item.rpartition(".")
        if not parent:
            stage.register_module(key, None)
            continue
        container = stage.get_submodule(parent)
        if isinstance(container, nn.ModuleList):
            raise ValueError(
                f"a stage boundary cuts through the nn.ModuleList {parent!r}: dropping its entries "
                f"would rename the rest; make it an nn.ModuleDict keyed '0', '1', ... (as torchtitan's "
                "models do) so that every stage keeps the whole model's names"
            )
        del container[key]
    return stage


@dataclasses.dataclass(frozen=True, slots=True)
class Cut:
    """What one rank holds of a pipeline: its stages' indices and items (both sides read it)."""

    stages: tuple[int, ...]
    count: int
    items: tuple[tuple[str, ...], ...]
    """The items of each held stage."""
    every: tuple[str, ...] = ()
    """Every item of the model."""

    def holds(self, name: str) -> bool:
        """Whether a parameter or buffer ``name`` lies in one of this rank's stages, or outside
        every item (a module every stage keeps: a Hugging Face decoder's rotary embedding)."""

        def under(items: Any) -> bool:
            return any(name == item or name.startswith(item + ".") for item in items)

        return any(under(kept) for kept in self.items) or not under(self.every)


def of_rank(workload: Workload, model: nn.Module, mesh: Mesh, pp_rank: int) -> Cut:
    count = stage_count(mesh)
    every = stages_of(workload, model, count)
    held = held_stages(mesh, pp_rank)
    return Cut(tuple(held), count, tuple(tuple(every[index]) for index in held), tuple(items(model)))


def backward_order(schedule: str, count: int) -> list[int]:
    """The order in which every stage of ``schedule`` adds its microbatches' weight gradients: the
    order the twin back-propagates them in (the candidate checks it against torch's own
    ``pipeline_order`` where the schedule has one: ``candidate.PipelineFSDP2``)."""
    order = list(range(count))
    return order[::-1] if schedule in DESCENDING else order


def weight_order(actions: list[Any], stage: int) -> list[int]:
    """The microbatches whose weight gradients ``stage`` computes, in ``actions``' order (a full
    backward ``B`` or a weight-only ``W``; an overlapped action's parts counted)."""
    found = []
    for action in actions:
        if action is None:
            continue
        for part in action.sub_actions or (action,):
            if part.stage_index == stage and str(part.computation_type.value) in ("B", "W"):
                found.append(part.microbatch_index)
    return found


def stage_of_params(config: Any, model: nn.Module) -> dict[int, int]:
    """For a pipeline row, each parameter's stage by its index in ``model.parameters()`` (``{}``
    otherwise): the twin reduces each stage's own parameters in a bucket of their own, as each
    stage's root ``fully_shard`` reduces them."""
    mesh = config.mesh
    if mesh.pp is None:
        return {}
    from harness.parity.workload import registry

    every = stages_of(registry.get(config.workload), model, stage_count(mesh))
    where = {item: index for index, kept in enumerate(every) for item in kept}
    found = {}
    for position, (name, _) in enumerate(model.named_parameters()):
        item = next(item for item in where if name == item or name.startswith(item + "."))
        found[position] = where[item]
    return found


def stage_groups(config: Any) -> tuple[tuple[tuple[str, int], ...], tuple[str, ...]] | None:
    """A pipeline's mesh and the dimension each stage's FSDP reduces over (``("dp",)``), as
    ``reduce_layout.Layout.groups_from`` takes them; ``None`` for any other row."""
    if config.mesh.pp is None:
        return None
    sizes, names = config.mesh.shape(config.world_size)
    return tuple(zip(names, sizes, strict=True)), ("dp",)


def io_and_loss(workload: Workload, model: nn.Module) -> tuple[Any, Any]:
    """``(pp_io, pp_loss)``: the workload's, or a Hugging Face causal LM's under
    ``pp_split="auto"`` (``hf_pipeline.io``, ``hf_pipeline.loss``); refused naming the fix when
    neither is there."""
    if workload.pp_io is not None and workload.pp_loss is not None:
        return workload.pp_io, workload.pp_loss
    if hf_pipeline.decoder(model) is not None:
        return hf_pipeline.io, hf_pipeline.loss
    raise ValueError(
        f"workload {workload.name!r}: pp_split='auto' on a {type(model).__name__}, which is not a Hugging Face "
        "causal LM, needs pp_io (batch -> (input, target)) and pp_loss ((output, target) -> loss)"
    )


def check_microbatches(workload: Workload, model: nn.Module, count: int) -> None:
    """Refuse ``count`` microbatches when they do not divide the workload's batch (rank 0's first,
    cut as its rows will cut it), naming the counts that do: before any rank runs, not as an error
    in every row."""
    from harness.parity.workload import registry
    from harness.parity.workload.spec import WorkloadError

    if workload.pp_split is None:
        return  # no pipeline rows: refused where they are listed, naming pp_split
    io, _ = io_and_loss(workload, model)
    rows = io(registry.make_batch(workload, 0, 0, 0))[0].shape[0]
    if rows % count:
        fits = [d for d in range(1, rows + 1) if rows % d == 0]
        raise WorkloadError(
            f"--microbatches {count} does not divide the batch of {workload.name!r} ({rows} rows): use one of {fits} "
            "(unequal microbatches weigh their items unequally in the mean)"
        )


def whole_output(model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """The whole model's output on a microbatch's input, as its stages compute it in turn (a
    Hugging Face decoder's logits: ``hf_pipeline.whole_logits``)."""
    if hf_pipeline.decoder(_unwrapped(model)) is not None:
        return hf_pipeline.whole_logits(model, inputs)
    return model(inputs)


def _unwrapped(model: nn.Module) -> nn.Module:
    return getattr(model, "module", model)  # DDP's


def tp_grid(config: Any) -> tuple[tuple[int, int], tuple[str, str]] | None:
    """A pipeline's ``(dp, tp)`` sizes under tensor parallelism (``reduce_layout.Layout.mesh``,
    whose TP buckets read the degree there), ``None`` without TP."""
    if config.mesh.pp is None or config.mesh.tp is None:
        return None
    sizes, _ = config.mesh.shape(config.world_size)
    return (sizes[1], sizes[2]), ("dp", "tp")


def split_microbatches(tensor: torch.Tensor, count: int) -> list[torch.Tensor]:
    """``tensor`` cut along dim 0 as the schedule cuts it (``torch.tensor_split``), refused when
    ``count`` does not divide it: unequal microbatches each averaged, then averaged again, weigh
    their items unequally, and the row would check that arithmetic, not the model."""
    if tensor.shape[0] % count:
        raise ValueError(
            f"microbatches={count} does not divide the batch's {tensor.shape[0]} rows: use a count "
            "that divides it (unequal microbatches weigh their items unequally in the mean)"
        )
    return list(torch.tensor_split(tensor, count))
