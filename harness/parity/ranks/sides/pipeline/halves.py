"""Where a schedule that splits the backward leaves a stage's weight gradients summed in the
parameters' dtype (rank side): what the twin needs to sum its microbatches as FSDP2 does.

Why: FSDP2, told not to sync, moves a unit's unsharded gradient into its reduce dtype in its
post-backward (``to_accumulated_grad_if_needed``, then ``accumulate_unsharded_grad_if_needed``
adds each later one). Under a full backward (``B``) that hook runs once per microbatch, after the
microbatch's weight gradients landed: every microbatch is cast and summed in the reduce dtype.
A schedule that cuts the backward in two fires the hook at the input half (``I``: the gradients
reach the unit's inputs) while the weight half (``W``, ``stage_backward_weight``) adds into the
parameter's ``.grad`` later, in the parameters' dtype. So the microbatches whose ``W`` runs between
two ``I`` of the same stage are summed in bfloat16 first, and only that sum is moved into float32
(measured on torch 2.13, gloo, by logging FSDP2's two calls under ``zbv``: stage 1's last two
microbatches summed in bfloat16). The first stage is the exception: its ``I`` computes nothing
and its ``W`` is a full backward, so it sums like ``B``. The last group is moved at the
reduction (``perform_reduce_grad``).

The order comes from torch's own plan (``pipeline_order``, every rank's actions): the candidate
reads its schedule's; the built-in twin builds the same schedule's plan over stand-in stages
(:func:`planned`, no process group needed) and the candidate checks the two agree, so a torch
whose schedules plan otherwise errs by name instead of failing rows by rounding.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import nn

from harness.parity.plan.config.mesh import SCHEDULES


class _StandIn:
    """What a schedule reads of its stages to plan its order (torch 2.13): their indices and the
    pipeline group's size and rank. Nothing runs on it."""

    def __init__(self, index: int, count: int, pp: int) -> None:
        self.stage_index, self.num_stages = index, count
        self.group_size, self.group_rank = pp, 0
        self.is_first, self.is_last = index == 0, index == count - 1
        self.has_backward = True
        self.submod = nn.Identity()


def planned(schedule: str, pp: int, microbatches: int, held: list[int]) -> dict[int, list[Any]] | None:
    """Every pipeline rank's actions under ``schedule`` (torch's ``pipeline_order``), planned over
    stand-in stages (``held``: the stages pipeline rank 0 runs); ``None`` where the schedule plans
    no order or cannot plan over stand-ins (the candidate's check then names what differs)."""
    from torch.distributed import pipelining

    cls = getattr(pipelining, SCHEDULES[schedule][0])
    count = pp * SCHEDULES[schedule][1]
    stages: Any = [_StandIn(index, count, pp) for index in held]
    try:
        built = cls(stages if len(stages) > 1 else stages[0], n_microbatches=microbatches, loss_fn=_no_loss)
    except Exception:  # a torch whose schedule reads more of its stages: the candidate's check says so
        return None
    order = getattr(built, "pipeline_order", None)
    return dict(order) if order else None


def _no_loss(*_: Any) -> Any:
    raise AssertionError("a stand-in schedule never runs")


def _parts(actions: Iterable[Any], stage: int) -> Iterable[tuple[str, int]]:
    for action in actions:
        if action is None:
            continue
        for part in action.sub_actions or (action,):
            if part.stage_index == stage:
                yield str(part.computation_type.value), part.microbatch_index


def moved_after(order: dict[int, list[Any]], stage: int) -> frozenset[int]:
    """The microbatches of ``stage`` after whose weight gradients FSDP2 moves the sum so far into
    its reduce dtype (before the next one is added); the last one's sum moves at the reduction."""
    moved: set[int] = set()
    waiting: int | None = None
    for kind, microbatch in (part for actions in order.values() for part in _parts(actions, stage)):
        if kind == "I" and stage != 0 and waiting is not None:
            moved.add(waiting)
            waiting = None
        elif kind == "W" and stage != 0:
            waiting = microbatch
        elif kind in ("B", "W"):  # a full backward: added, then the hook
            moved.add(microbatch)
            waiting = None
    return frozenset(moved)


def by_name(order: dict[int, list[Any]] | None, stage_of: dict[str, int]) -> dict[str, frozenset[int]] | None:
    """Each parameter's :func:`moved_after`, by name (``stage_of``: the stage holding each)."""
    if order is None:
        return None
    per_stage = {stage: moved_after(order, stage) for stage in set(stage_of.values())}
    return {name: per_stage[stage] for name, stage in stage_of.items()}


def built_in(config: Any, model: nn.Module) -> dict[str, frozenset[int]] | None:
    """:func:`by_name` for a built-in pipeline row's twin: the configuration's schedule planned
    over stand-ins, ``model``'s parameters placed by the cut (``stages.stage_of_params``)."""
    from harness.parity.ranks.sides import stages as split

    mesh = config.mesh
    order = planned(mesh.schedule, mesh.pp, mesh.microbatches, split.held_stages(mesh, 0))
    where = split.stage_of_params(config, model)
    names = [name for name, _ in model.named_parameters()]
    return by_name(order, {name: where[position] for position, name in enumerate(names)})
