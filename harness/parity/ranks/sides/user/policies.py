"""Each ``fully_shard`` unit's own precision policy, emulated on the twin (rank side).

Why per unit: a user's function may give its units different ``MixedPrecisionPolicy`` values
(blocks in bf16, the root keeping float32 outputs for the loss, a router left in float32), and the
twin keeps what may legitimately change the numbers, each module's policy included. FSDP2 applies a
unit's policy to that unit alone: its own parameters are all-gathered in its ``param_dtype``, its
inputs cast to it when ``cast_forward_inputs``, its outputs to ``output_dtype``, and its gradients
reduce-scattered in its ``reduce_dtype`` (torch 2.13 ``_fsdp_param_group``, ``_fsdp_state``). So
here: a working copy whose parameters are each in their unit's ``param_dtype``; casts installed
unit by unit; and one reduction per reduce dtype, each over the buckets of the units that reduce
in it (``reduce_layout``: a bucket is its own collective, so grouping changes no value).
"""

from __future__ import annotations

import copy
import dataclasses

import torch
from torch import nn

from harness.parity.plan.precision import PrecisionPolicy
from harness.parity.ranks.sides import reduce_layout, twin
from harness.parity.ranks.sides.user.found import Found, Unit


def unit_of(found: Found) -> dict[str, Unit]:
    """Each parameter name the units hold, to its unit (a name two units claim: the first's)."""
    owner: dict[str, Unit] = {}
    for unit in found.units:
        for name in unit.params:
            owner.setdefault(name, unit)
    return owner


def working_copy(module: nn.Module, found: Found) -> nn.Module:
    """A copy of ``module`` whose floating-point parameters are each in their unit's ``param``
    dtype (float32 under no policy or no unit); buffers as the model made them (FSDP2 never casts
    them)."""
    working = copy.deepcopy(module)
    owner = unit_of(found)
    with torch.no_grad():
        for name, param in working.named_parameters(remove_duplicate=False):
            unit = owner.get(name)
            if unit is not None and unit.policy is not None and param.is_floating_point():
                param.data = param.data.to(twin.DTYPES[unit.policy.param])
    return working


def install_casts(working: nn.Module, found: Found) -> None:
    """At every unit, its own input and output casts (``twin.install_casts`` for one module)."""
    for unit in found.units:
        if unit.policy is not None:
            module = working.get_submodule(unit.module) if unit.module else working
            twin.install_casts(module, [], unit.policy)


def reduce_by_dtype(
    layout: reduce_layout.Layout,
    named_lows: list[tuple[str, nn.Parameter]],
    masters: list[nn.Parameter],
    found: Found,
    data_parallel: int,
    *,
    in_reverse: bool = False,
) -> None:
    """The working copy's gradients (``named_lows``, in the layout's parameter order) averaged over
    the ranks, each bucket in its unit's reduce dtype with the divide factors FSDP2 uses for that
    dtype (``twin.divide_factors``), handed to the float32 masters."""
    lows = [low for _, low in named_lows]
    grads = [low.grad for low in lows]
    if all(grad is None for grad in grads):
        return
    owner = unit_of(found)
    dtypes = [reduce_dtype(owner.get(name)) for name, _ in named_lows]
    reduced: list[torch.Tensor | None] = [None] * len(lows)
    for dtype in dict.fromkeys(dtypes):
        buckets = tuple(b for b in layout.buckets if b.params and dtypes[b.params[0]] == dtype)
        part = reduce_layout.reduce(
            dataclasses.replace(layout, buckets=buckets),
            lows,
            grads,
            dtype,
            twin.divide_factors("user", dtype, data_parallel),
            in_reverse=in_reverse,
        )
        for index, grad in enumerate(part):
            if grad is not None:
                reduced[index] = grad
    for low, master, grad in zip(lows, masters, reduced, strict=True):
        low.grad = None
        master.grad = None if grad is None else grad.to(master.dtype)


def reduce_dtype(unit: Unit | None) -> torch.dtype:
    """The dtype ``unit`` reduce-scatters in (float32 outside every unit or under no policy)."""
    policy: PrecisionPolicy | None = unit.policy if unit is not None else None
    return torch.float32 if policy is None else twin.DTYPES[policy.reduce_dtype]
