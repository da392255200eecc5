"""Full tensors of an FSDP1 model, gathered through its flat parameters (rank side; collective).

Why not FSDP's own APIs: ``summon_full_params`` gives full gradients only with
``use_orig_params=True``; ``FSDP.optim_state_dict`` returns Adam's ``exp_avg_sq`` in place of
``exp_avg`` with ``use_orig_params=True`` (torch 2.13) and costs dozens of object collectives per
call. Instead, everything a unit holds per element (parameter, gradient, each optimizer-state
tensor) is laid out like the unit's local flat shard, stacked into rows, all-gathered in *one*
collective per unit over the unit's shard group, and cut into the original parameters by the flat
parameter's own layout (``_fqns``, ``_shapes``, ``_numels_with_padding``, ``_is_padding_mask``;
with ``use_orig_params=True`` the optimizer holds the original parameters, each owning the part of
the shard that ``_shard_param_infos`` places at ``offset_in_shard``). Scalar state (Adam's
``step``) travels as a row holding each element's parameter's value, and a presence row says which
parameters have state at all. Rows travel in float64, which holds every fp32/bf16/fp16 value
exactly, and come back in their own dtype.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed as dist

from harness.parity.ranks.sides.full.gather import anywhere, clean_name, state_keys, to_cpu
from harness.torch_private import fsdp1


@dataclasses.dataclass(frozen=True, slots=True)
class _Unit:
    prefix: str
    module: Any
    flat: Any

    @property
    def layout(self) -> fsdp1.Layout:
        return fsdp1.layout(self.flat)

    @property
    def names(self) -> list[str]:
        return [self.prefix + clean_name(fqn) for fqn in self.layout.names]

    @property
    def owners(self) -> list[Any]:
        """What the optimizer holds for each original parameter: itself, or the flat parameter."""
        params = fsdp1.original_params(self.flat)
        return params if params is not None else [self.flat] * len(self.layout.names)


def units(model: Any) -> list[_Unit]:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    found = []
    for module_name, module in model.named_modules():
        if isinstance(module, FSDP) and (flat := fsdp1.flat_param_of(module)) is not None:
            prefix = clean_name(module_name)
            found.append(_Unit(f"{prefix}." if prefix else "", module, flat))
    return found


def _gather_rows(unit: _Unit, rows: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """``rows`` (each laid out like the local flat shard) gathered: ``[len(rows), unsharded numel]``."""
    local = torch.stack([row.detach().reshape(-1).to(device, torch.float64) for row in rows])
    if fsdp1.is_sharded(unit.module):
        group = unit.module.process_group
        world = dist.get_world_size(group)
        out = local.new_empty(world * local.numel())
        dist.all_gather_into_tensor(out, local.reshape(-1), group=group)
        full = out.view(world, len(rows), -1).transpose(0, 1).reshape(len(rows), -1)
    else:
        full = local
    return full[:, : unit.layout.unpadded_numel]


def _split(unit: _Unit, row: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    layout = unit.layout
    pieces = row.split(list(layout.numels_with_padding))
    real = [piece for piece, is_padding in zip(pieces, layout.is_padding, strict=True) if not is_padding]
    return {
        name: to_cpu(piece.view(shape).to(dtype))
        for name, shape, piece in zip(unit.names, layout.shapes, real, strict=True)
    }


def full_grads(model: Any, device: torch.device) -> dict[str, torch.Tensor]:
    """Full gradients by original name (units without a gradient on any rank are left out).

    Whether a unit's gather runs is agreed first (one all-reduce): a rank whose flat parameter
    has no gradient sends zeros rather than skipping a collective its peers run."""
    found = units(model)
    held = anywhere([unit.flat.grad is not None for unit in found], device)
    full: dict[str, torch.Tensor] = {}
    for unit, somewhere in zip(found, held, strict=True):
        if somewhere:
            grad = unit.flat.grad if unit.flat.grad is not None else torch.zeros_like(unit.flat)
            full.update(_split(unit, _gather_rows(unit, [grad], device)[0], grad.dtype))
    return full


def _state_rows(
    unit: _Unit, state: dict[int, dict[str, Any]], element_keys: tuple[str, ...], scalar_keys: tuple[str, ...]
) -> tuple[list[torch.Tensor], list[torch.dtype]]:
    """This rank's rows: one per element key, a presence row, one per scalar key."""
    flat = unit.flat
    count = len(element_keys) + 1 + len(scalar_keys)
    rows = torch.zeros(count, flat.numel(), dtype=torch.float64, device=flat.device)
    dtypes = [flat.dtype] * len(element_keys) + [torch.float32] * (1 + len(scalar_keys))
    originals = fsdp1.original_params(flat)
    if originals is None:
        places = [(flat, 0, flat.numel())]
    else:
        places = [
            (param, info.offset_in_shard, info.numel_in_shard)
            for param, info in zip(originals, fsdp1.shard_infos(flat), strict=True)
            if info.in_shard
        ]
    for owner, offset, numel in places:
        values = state.get(id(owner))
        if not values:
            continue
        span = slice(offset, offset + numel)
        for index, key in enumerate(element_keys):
            if key in values:
                rows[index, span] = values[key].detach().reshape(-1).to(rows)
                dtypes[index] = values[key].dtype
        rows[len(element_keys), span] = 1.0
        for index, key in enumerate(scalar_keys, start=len(element_keys) + 1):
            if key in values:
                rows[index, span] = float(values[key])
    return list(rows), dtypes


def full_params_and_state(
    model: Any, optimizers: list[torch.optim.Optimizer], device: torch.device
) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
    """Full parameters by original name (frozen ones included), and full optimizer state by name
    then state key, in one all-gather per unit (see the module docstring)."""
    state = {id(p): values for opt in optimizers for p, values in opt.state.items()}
    element_keys, scalar_keys = state_keys(optimizers)
    params: dict[str, torch.Tensor] = {}
    full: dict[str, dict[str, torch.Tensor]] = {}
    for unit in units(model):
        rows, dtypes = [unit.flat.data], [unit.flat.dtype]
        if unit.flat.requires_grad:
            state_rows, state_dtypes = _state_rows(unit, state, element_keys, scalar_keys)
            rows, dtypes = rows + state_rows, dtypes + state_dtypes
        gathered = _gather_rows(unit, rows, device)
        params.update(_split(unit, gathered[0], dtypes[0]))
        if not unit.flat.requires_grad:
            continue
        gathered, dtypes = gathered[1:], dtypes[1:]
        presence = _split(unit, gathered[len(element_keys)], torch.float64)
        per_key = {key: _split(unit, gathered[i], dtypes[i]) for i, key in enumerate(element_keys)}
        scalars = {
            key: _split(unit, gathered[i], torch.float64)
            for i, key in enumerate(scalar_keys, start=len(element_keys) + 1)
        }
        for name in unit.names:
            if not presence[name].any():
                continue
            entry = full.setdefault(name, {})
            for key, pieces in per_key.items():
                entry[key] = pieces[name]
            for key, pieces in scalars.items():
                entry[key] = torch.tensor(float(pieces[name].max()), dtype=torch.float32)
    return params, full
