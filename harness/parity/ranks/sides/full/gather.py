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

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from harness.rank import context

_WRAPPER_PARTS = ("_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod", "_pp_stage")
_MESH = context.GroupKey[tuple[tuple[Any, ...], Any]]()
"""In the default group's stash: the last mesh made on it, with its ``(device type, shape, names)``."""


def clean_name(name: str) -> str:
    """A parameter or module name as in the unwrapped model: the parts wrappers insert dropped
    (FSDP1's ``_fsdp_wrapped_module``, a checkpoint wrapper's ``_checkpoint_wrapped_module``,
    ``torch.compile(module)``'s ``_orig_mod``, a Hugging Face pipeline stage's ``_pp_stage``), wherever they stand in the name."""
    return ".".join(part for part in name.split(".") if part not in _WRAPPER_PARTS)


def to_cpu(value: Any) -> torch.Tensor:
    """A detached CPU copy; sparse tensors become dense (duplicates summed), numbers become tensors."""
    if not isinstance(value, torch.Tensor):
        return torch.tensor(value)
    tensor = value.detach()
    if tensor.is_sparse:
        tensor = tensor.to_dense()
    return tensor.to("cpu", copy=True)


def whole(value: Any) -> torch.Tensor:
    """``value`` itself (detached) when it is a whole dense CPU tensor, else :func:`to_cpu`'s copy:
    for a record read before its run changes the tensor again (``Engine.full_after_step``)."""
    if (
        isinstance(value, torch.Tensor)
        and not hasattr(value, "full_tensor")
        and value.device.type == "cpu"
        and value.layout == torch.strided
    ):
        return value.detach()
    return to_cpu(value)


def full_tensor(value: Any, device: torch.device) -> torch.Tensor:
    """The full tensor of a DTensor (moved to the collective's device first), else a CPU copy."""
    if not hasattr(value, "full_tensor"):
        return to_cpu(value)
    if value.device.type != device.type:  # CPU-offloaded state gathered over a GPU backend
        value = value.to(device)
    return to_cpu(value.full_tensor())


def mesh(device_type: str, shape: tuple[int, ...], names: tuple[str, ...] | None) -> Any:
    """A device mesh over the default group (each makes sub-groups, a collective), kept in the
    group's stash (``context.group_stash``: every rank creates its groups together, so the mesh is
    reused or made on every rank alike, and a re-created group starts without one). One mesh is
    kept: asked for another shape, the group makes that one afresh and keeps it instead."""
    from torch.distributed.device_mesh import init_device_mesh

    stash = context.group_stash()
    key = (device_type, shape, names)
    held = stash.get(_MESH)
    if held is None or held[0] != key:
        held = (key, init_device_mesh(device_type, shape, mesh_dim_names=names))
        stash[_MESH] = held
    return held[1]


def forget_meshes() -> None:
    """Drop the mesh kept for the default group (a re-created group has none kept anyway)."""
    context.group_stash().pop(_MESH)


def zeros_like_shards(param: Any) -> torch.Tensor:
    """Zeros standing in for state or a gradient this rank lacks: a DTensor laid out like the
    parameter (each rank zeros its own shard), else plain zeros of the parameter's shape.

    The global shape and stride are stated, never inferred: ``DTensor.from_local`` without them
    takes local rows x world size, which differs between ranks as soon as the rows do not divide
    by the world size, and every size the gather computes would differ with it
    (docs/architecture.md, section 4.5)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(param, DTensor):
        return torch.zeros_like(param)
    return shard_like(torch.zeros_like(param.to_local()), param)


def shard_like(local: torch.Tensor, param: Any) -> Any:
    """``local`` as this rank's shard of a DTensor laid out like ``param`` (a DTensor), its global
    shape and stride stated, never inferred (see :func:`zeros_like_shards`)."""
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(
        local,
        param.device_mesh,
        param.placements,
        run_check=False,
        shape=param.shape,
        stride=param.stride(),
    )


def anywhere(flags: list[bool], device: torch.device) -> list[bool]:
    """Which of ``flags`` hold on any rank (one all-reduce). Why: whether a tensor joins a
    collective must not depend on what this rank happens to hold (a gradient, optimizer state),
    or the ranks' collectives differ in size."""
    if not dist.is_initialized() or dist.get_world_size() == 1 or not flags:
        return list(flags)
    present = torch.tensor([float(flag) for flag in flags], device=device)
    dist.all_reduce(present, op=dist.ReduceOp.MAX)
    return [bool(value) for value in present.tolist()]


def _rows_of_rank(dim0: int, world: int, rank: int) -> int:
    """Rows of a ``Shard(0)`` tensor on ``rank``: DTensor chunks dim 0 like ``torch.chunk``."""
    chunk = -(-dim0 // world)
    return max(0, min(chunk, dim0 - rank * chunk))


def _carrier(dtypes: set[torch.dtype]) -> torch.dtype:
    """The dtype one gather travels in: float32 when every tensor is float32 (half the bytes of a
    float64 gather, and no conversion), else float64, which holds every fp32/bf16/fp16 value
    exactly. Ranks agree on it before gathering (:func:`agree_on_layout`)."""
    return torch.float32 if dtypes == {torch.float32} else torch.float64


def full_tensors(values: dict[Any, Any], device: torch.device) -> dict[Any, torch.Tensor]:
    """Full CPU copies of many tensors at once: DTensors sharded on dim 0 of a 1-D mesh travel in
    *one* all-gather (each padded to its largest shard, in their common dtype, else float64:
    ``_carrier``); other DTensors through ``full_tensor()``; plain tensors are copied."""
    from torch.distributed.tensor import DTensor, Shard

    batched = {
        name: value
        for name, value in values.items()
        if isinstance(value, DTensor)
        and value.device_mesh.ndim == 1
        and tuple(value.placements) == (Shard(0),)
    }
    out = {name: full_tensor(value, device) for name, value in values.items() if name not in batched}
    if not batched:
        return out
    mesh = next(iter(batched.values())).device_mesh
    group = mesh.get_group()
    world = dist.get_world_size(group)
    layout = []
    for name, value in batched.items():
        shape = tuple(value.shape)
        row = int(torch.tensor(shape[1:]).prod().item()) if len(shape) > 1 else 1
        layout.append((name, shape, row, _rows_of_rank(shape[0], world, 0) * row, value.dtype))
    numel = sum(width for _, _, _, width, _ in layout)
    mine = _carrier({value.dtype for value in batched.values()})
    carrier = agree_on_layout(layout, numel, group, device, carrier=mine)
    pieces = []
    for (_, _, _, width, _), value in zip(layout, batched.values(), strict=True):
        local = value.to_local().detach().reshape(-1).to(device, carrier)
        pieces.append(torch.nn.functional.pad(local, (0, width - local.numel())))
    local = torch.cat(pieces)
    gathered = local.new_empty(world * local.numel())
    dist.all_gather_into_tensor(gathered, local, group=group)
    per_rank = gathered.view(world, -1)
    offset = 0
    for name, shape, row, width, dtype in layout:
        parts = [per_rank[r, offset : offset + _rows_of_rank(shape[0], world, r) * row] for r in range(world)]
        out[name] = to_cpu(torch.cat(parts).view(shape).to(dtype))
        offset += width
    return out


class CollectiveMismatch(RuntimeError):
    """The ranks were about to run collectives of different layouts (a desync, named)."""


def _layout_text(layout: list[Any], numel: int) -> str:
    """The gather's layout in words: its size and each entry's name and global shape."""
    entries = ", ".join(f"{name} {tuple(shape)}" for name, shape, *_ in layout)
    return f"gather.full_tensors all_gather of {numel} elements [{entries}]"


_CARRIERS = (torch.float64, torch.float32)


def agree_on_layout(
    layout: list[Any], numel: int, group: Any, device: torch.device, *, carrier: torch.dtype = torch.float64
) -> torch.dtype:
    """Check, before the big all-gather, that every rank is about to send the same layout.

    Why: a layout that differs between ranks (a global shape inferred from a local shard, a tensor
    one rank holds and another does not) makes gloo abort a rank ("Received data size doesn't
    match expected size") or silently cut tensors at the wrong rows. Here each rank sends two
    numbers, its element count and a CRC of its layout (one small all-gather, equal in size on
    every rank); when they differ, every rank sees it, and all of them raise the same error naming
    each rank's layout (one object all-gather, on the failing path only).

    The same all-gather agrees on the dtype the gather travels in: ``carrier`` where every rank
    proposed it, else float64 (a rank whose dtype differs must not send another byte count)."""
    import zlib

    text = _layout_text(layout, numel)
    code = _CARRIERS.index(carrier) if carrier in _CARRIERS else 0
    mine = torch.tensor([numel, zlib.crc32(text.encode()), code], dtype=torch.int64, device=device)
    world = dist.get_world_size(group)
    everyone = mine.new_empty(world * 3)
    dist.all_gather_into_tensor(everyone, mine, group=group)
    rows = everyone.view(world, 3).tolist()
    if len({tuple(row[:2]) for row in rows}) == 1:
        codes = {row[2] for row in rows}
        return _CARRIERS[codes.pop()] if len(codes) == 1 else torch.float64
    texts: list[Any] = [None] * world
    dist.all_gather_object(texts, text, group=group)
    ranks = ", ".join(f"rank {rank} in {t}" for rank, t in enumerate(texts))
    raise CollectiveMismatch(f"the ranks ran different collectives: {ranks}")


_STATE_KEYS: dict[type, tuple[tuple[str, ...], tuple[str, ...]]] = {
    torch.optim.SGD: (("momentum_buffer",), ()),
    torch.optim.Adam: (("exp_avg", "exp_avg_sq"), ("step",)),
    torch.optim.AdamW: (("exp_avg", "exp_avg_sq"), ("step",)),
}


def state_keys(optimizers: list[torch.optim.Optimizer]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(per-element keys, scalar keys) of the optimizers' state, the same on every rank.

    Known optimizers answer from their class (no collective); any other costs one object
    all-gather. Ranks must agree even when their states differ (one rank skipped a step the
    others took: the very bug the engine exists to show), or the gathers that follow mismatch."""
    kinds = {type(opt) for opt in optimizers}
    if all(kind in _STATE_KEYS for kind in kinds) and not any(
        group.get("amsgrad") for opt in optimizers for group in opt.param_groups
    ):
        element = sorted({k for kind in kinds for k in _STATE_KEYS[kind][0]})
        scalar = sorted({k for kind in kinds for k in _STATE_KEYS[kind][1]})
        momentum = any(group.get("momentum", 1) for opt in optimizers for group in opt.param_groups)
        return tuple(k for k in element if k != "momentum_buffer" or momentum), tuple(scalar)
    local = {
        (key, isinstance(value, torch.Tensor) and value.dim() > 0)
        for opt in optimizers
        for values in opt.state.values()
        for key, value in values.items()
    }
    everywhere: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everywhere, sorted(local))
    keys = {tuple(entry) for entries in everywhere for entry in entries}
    return tuple(sorted(k for k, per_element in keys if per_element)), tuple(
        sorted(k for k, e in keys if not e)
    )


_WRAPPERS = ("FullyShardedDataParallel", "DistributedDataParallel")


def module_names(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name as in the user's model, module)`` for every module below any wrapper; the model
    itself is ``""``."""
    named = []
    for name, module in model.named_modules():
        if type(module).__name__ in _WRAPPERS:
            continue
        clean = clean_name(name + ".").removesuffix(".") if name else ""
        named.append((clean, module))
    return named
