"""Full (unsharded) tensors of a sharded model, for the record (rank side; collective calls).

Why a module: FSDP1 and FSDP2 each hide the full tensors differently. FSDP2 parameters, gradients
and optimizer state are DTensors (``full_tensor()``). FSDP1 gives full parameters inside
``summon_full_params``; its gradients and optimizer state live on each unit's flat parameter (or
on views into it), so they are laid out like the flat parameter's local shard, all-gathered over
the unit's shard group and cut into the original parameters by the flat parameter's own layout
(``_fqns``, ``_shapes``, ``_numels_with_padding``, ``_is_padding_mask``, ``_shard_param_infos``). Every function here is collective: every rank
calls it, and every rank gets the full tensors back (rank 0 keeps them for the record).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

_FSDP_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")
_meshes: dict[tuple[Any, ...], Any] = {}


def clean_name(name: str) -> str:
    """A parameter name as in the unwrapped model (FSDP1 inserts ``_fsdp_wrapped_module.``)."""
    for prefix in _FSDP_PREFIXES:
        name = name.replace(prefix, "")
    return name


def to_cpu(value: Any) -> torch.Tensor:
    """A detached CPU copy; sparse tensors become dense (duplicates summed), numbers become tensors."""
    if not isinstance(value, torch.Tensor):
        return torch.tensor(value)
    tensor = value.detach()
    if tensor.is_sparse:
        tensor = tensor.to_dense()
    return tensor.to("cpu", copy=True)


def full_tensor(value: Any, device: torch.device) -> torch.Tensor:
    """The full tensor of a DTensor (moved to the collective's device first), else a CPU copy."""
    if not hasattr(value, "full_tensor"):
        return to_cpu(value)
    if value.device.type != device.type:  # CPU-offloaded state gathered over a GPU backend
        value = value.to(device)
    return to_cpu(value.full_tensor())


def mesh(device_type: str, shape: tuple[int, ...], names: tuple[str, ...] | None) -> Any:
    """A device mesh over the default group, made once per default group (each makes sub-groups)."""
    from torch.distributed.device_mesh import init_device_mesh

    key = (id(dist.distributed_c10d._get_default_group()), device_type, shape, names)
    if key not in _meshes:
        _meshes.clear()  # meshes of an earlier (destroyed) default group are of no use
        _meshes[key] = init_device_mesh(device_type, shape, mesh_dim_names=names)
    return _meshes[key]


def forget_meshes() -> None:
    """Drop cached meshes (after the default group was re-created)."""
    _meshes.clear()


def fsdp1_full_params(model: Any) -> dict[str, torch.Tensor]:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    with FSDP.summon_full_params(model, writeback=False):
        return {clean_name(n): to_cpu(p) for n, p in model.named_parameters()}


def _fsdp1_units(model: Any) -> list[tuple[str, Any, Any]]:
    """``(name prefix, FSDP module, flat parameter)`` of every FSDP1 unit that owns parameters."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    units = []
    for module_name, module in model.named_modules():
        if isinstance(module, FSDP) and module._handle is not None:
            prefix = clean_name(module_name)
            units.append((f"{prefix}." if prefix else "", module, module._handle.flat_param))
    return units


def _unflatten(module: Any, flat: Any, local: torch.Tensor, device: torch.device) -> dict[str, torch.Tensor]:
    """All-gather a unit's local flat shard (any per-element quantity laid out like the flat
    parameter) over the unit's shard group and cut it into the original parameters."""
    local = local.detach().to(device)
    if module._handle.uses_sharded_strategy:
        group = module.process_group
        full = local.new_empty(local.numel() * dist.get_world_size(group))
        dist.all_gather_into_tensor(full, local.contiguous(), group=group)
    else:
        full = local
    full = full[: flat._unpadded_unsharded_size.numel()]
    pieces = full.split(list(flat._numels_with_padding))
    padding = getattr(flat, "_is_padding_mask", None) or [False] * len(pieces)
    real = [piece for piece, is_padding in zip(pieces, padding, strict=True) if not is_padding]
    return {
        clean_name(fqn): to_cpu(piece.view(shape))
        for fqn, shape, piece in zip(flat._fqns, flat._shapes, real, strict=True)
    }


def fsdp1_full_grads(model: Any, device: torch.device) -> dict[str, torch.Tensor]:
    """Full unsharded gradients by original parameter name (see the module docstring)."""
    grads: dict[str, torch.Tensor] = {}
    for prefix, module, flat in _fsdp1_units(model):
        if flat.grad is not None:
            pieces = _unflatten(module, flat, flat.grad, device)
            grads.update({prefix + name: value for name, value in pieces.items()})
    return grads


def _local_flat_state(flat: Any, state: dict[int, dict[str, Any]], key: str) -> tuple[torch.Tensor, list[bool]]:
    """This rank's shard of one per-element state ``key`` of a unit, laid out like the flat
    parameter, and which original parameters have state here.

    With ``use_orig_params=False`` the optimizer owns the flat parameter itself; with ``True`` it
    owns the original parameters, each holding the part of the shard its ``_shard_param_infos``
    entry places at ``offset_in_shard``.
    """
    buffer = torch.zeros(flat.numel(), dtype=torch.float32, device=flat.device)
    count = len(flat._fqns)
    if getattr(flat, "_params", None) is None:
        values = state.get(id(flat), {})
        if key in values:
            buffer = values[key].detach().reshape(-1).to(flat.device).clone()
        return buffer, [key in values] * count
    present = []
    for param, info in zip(flat._params, flat._shard_param_infos, strict=True):
        values = state.get(id(param), {})
        present.append(key in values)
        if key in values and info.in_shard:
            offset = info.offset_in_shard
            buffer = buffer.to(values[key].dtype)
            buffer[offset : offset + info.numel_in_shard] = values[key].detach().reshape(-1)
    return buffer, present


def fsdp1_full_optim_state(
    model: Any, optimizers: list[torch.optim.Optimizer], device: torch.device
) -> dict[str, dict[str, torch.Tensor]]:
    """Full optimizer state by original parameter name, gathered like the gradients.

    Not ``FSDP.optim_state_dict``: with ``use_orig_params=True`` it returns ``exp_avg_sq`` in place
    of Adam's ``exp_avg`` (torch 2.13), and it costs dozens of object collectives per call. Per-
    element state (momentum, moments) is gathered over each unit's shard group; scalar state
    (Adam's ``step``) is the same for every element of a parameter, so the largest value any rank
    holds is taken (a rank whose shard of a parameter is empty holds none).
    """
    state = {id(p): values for opt in optimizers for p, values in opt.state.items()}
    local_keys = {(k, v.dim() == 0 if isinstance(v, torch.Tensor) else True) for s in state.values() for k, v in s.items()}
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, sorted(local_keys))
    keys = sorted({tuple(entry) for entries in gathered for entry in entries})
    full: dict[str, dict[str, torch.Tensor]] = {}
    for prefix, module, flat in _fsdp1_units(model):
        if not flat.requires_grad:
            continue
        names = [prefix + clean_name(fqn) for fqn in flat._fqns]
        for key, scalar in keys:
            if scalar:
                owners = flat._params if getattr(flat, "_params", None) is not None else [flat] * len(names)
                values = torch.tensor(
                    [float(state[id(o)][key]) if key in state.get(id(o), {}) else -math.inf for o in owners],
                    dtype=torch.float64,
                    device=device,
                )
                dist.all_reduce(values, op=dist.ReduceOp.MAX)
                for name, value in zip(names, values.tolist(), strict=True):
                    if value != -math.inf:
                        full.setdefault(name, {})[key] = torch.tensor(value, dtype=torch.float32)
                continue
            local, present = _local_flat_state(flat, state, key)
            flags = torch.tensor(present, dtype=torch.float32, device=device)
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
            pieces = _unflatten(module, flat, local, device)
            for name, flag in zip(names, flags.tolist(), strict=True):
                if flag:
                    full.setdefault(name, {})[key] = pieces[name[len(prefix) :]]
    return full
